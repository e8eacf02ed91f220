// Named-tensor counting (include/kiln/hist.hpp, set_hist_named) for the library's own calls:
// each call that writes a tensor passes it here after its work.
#pragma once
#include <kiln/gemm.hpp>
#include <kiln/tensor.hpp>

#include <exception>

namespace kiln {

// hist(written, its memory's tag) when the context counts named tensors and the memory has a
// tag and a float dtype; otherwise nothing (one flag test).
void count_named(Context& ctx, const Tensor& written);

// Where a kernel counts the values it stores (GemmParams::hist): bins int32 counters.
struct StoreCount {
    void* counters;
    int bins;
    int offset;
};

// What a caller asks of a kernel's store path beyond storing C, and what the kernel did of it:
// counting the values stored into `count` (counted), and adding up C's columns as stored into
// `column_sums` (summed; a convolution's bsum per channel).
struct StoreExtras {
    const StoreCount* count = nullptr;
    bool counted = false;
    const Tensor* column_sums = nullptr;
    bool summed = false;
};

// Counts `out` when it goes out of scope, if the call holding it is not inside another (declare
// it before the call's BenchTimer, so that it runs after the timer has closed) and did not fail:
// by the slot its kernels counted into as they stored it (store(), then counted()), else by a
// pass over it.
class NamedCount {
public:
    NamedCount(Context& ctx, const Tensor& out);
    ~NamedCount();
    NamedCount(const NamedCount&) = delete;
    NamedCount& operator=(const NamedCount&) = delete;
    // A zeroed slot for the call's kernels to count `out` into as they store it, when `out` is
    // to be counted and the context runs on CUDA; else null.
    const StoreCount* store();
    // The kernels counted all of `out` into store()'s slot.
    void counted() { counted_ = true; }

private:
    Context& ctx_;
    const Tensor& out_;
    int unwinding_;
    bool outer_;
    bool counted_ = false;
    Tensor slot_;
    StoreCount store_{};
};

// compound_dot for a caller that asks more of C's store path (a convolution writing its output
// through the GEMM): the kernel counts the values it stores into x.count (x.counted) and adds
// up C's columns as stored into x.column_sums (x.summed) where it can.
void compound_dot_extras(const Tensor& A, const Tensor& B, Tensor& C, const DotOptions& opts, StoreExtras& x);

} // namespace kiln
