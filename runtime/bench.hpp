// Bench mode (ContextOptions::bench, the seeds' bench=True): a call that runs kernels holds a
// BenchTimer for its duration. When the context is in bench mode, the timer places a mark on
// the context's stream when made and another when it ends, waits for the second, and prints
// and logs the time between them with the rate of the bytes and flops the call states, so
// what is timed is the call's work on the device (CUDA events), not the host's part of it.
// Otherwise it only keeps count of the calls under way (Context::Impl::call_depth), by which a
// call made inside another knows it is nested.
#pragma once
#include "runtime/context_impl.hpp"

#include <memory>
#include <string>

namespace kiln {

class BenchTimer {
public:
    BenchTimer(Context::Impl& ctx, const char* op);
    ~BenchTimer();   // not when the call is unwinding from an error: there is nothing to time
    BenchTimer(const BenchTimer&) = delete;
    BenchTimer& operator=(const BenchTimer&) = delete;

    bool on() const { return timing_; }
    // What the call moved and computed; detail names its dtypes and shapes.
    void set(std::string detail, double bytes, double flops = 0);

private:
    Context::Impl& ctx_;
    bool timing_ = false;
    const char* op_;
    std::shared_ptr<void> start_;
    int unwinding_ = 0;
    BenchRecord rec_;
};

// Bytes of the elements a view addresses (a broadcast dim counts once).
double view_bytes(const View& v);

} // namespace kiln
