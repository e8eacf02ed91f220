// Bench mode's timer (bench.hpp).
#include "runtime/bench.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <exception>

namespace kiln {

namespace {
constexpr size_t kBenchLogMax = 4096;
}

BenchTimer::BenchTimer(Context::Impl& ctx, const char* op) : ctx_(ctx), op_(op) {
    rec_.depth = ctx.call_depth++;
    if (!ctx.bench) return;
    timing_ = true;
    unwinding_ = std::uncaught_exceptions();
    start_ = ctx.backend->new_mark();
    ctx.backend->record_mark(start_.get());
}

void BenchTimer::set(std::string detail, double bytes, double flops) {
    if (!timing_) return;
    rec_.detail = std::move(detail);
    rec_.bytes = bytes;
    rec_.flops = flops;
}

BenchTimer::~BenchTimer() {
    --ctx_.call_depth;
    if (!timing_ || std::uncaught_exceptions() > unwinding_) return;
    try {
        DeviceBackend& be = *ctx_.backend;
        std::shared_ptr<void> end = be.new_mark();
        be.record_mark(end.get());
        be.wait_mark(end.get());
        rec_.op = op_;
        rec_.ms = be.mark_elapsed_ms(start_.get(), end.get());
        std::string rate;
        const double s = rec_.ms * 1e-3;
        if (rec_.flops > 0 && s > 0) rate = fmt::format(", {:.1f} TFLOP/s", rec_.flops / s * 1e-12);
        else if (rec_.bytes > 0 && s > 0) rate = fmt::format(", {:.1f} GB/s", rec_.bytes / s * 1e-9);
        std::fprintf(stderr, "kiln bench: %*s%s %s: %.4f ms%s (%s)\n", 2 * rec_.depth, "", op_, rec_.detail.c_str(),
                     rec_.ms, rate.c_str(), be.name().c_str());
        ctx_.bench_log.push_back(std::move(rec_));
        if (ctx_.bench_log.size() > kBenchLogMax) ctx_.bench_log.pop_front();
    } catch (...) {
        // A failure to time (the device lost, say) surfaces at the context's next call.
    }
}

double view_bytes(const View& v) {
    double n = (double)dtype_size(v.dtype);
    for (size_t d = 0; d < v.shape.size(); ++d)
        if (v.strides[d] != 0 || v.shape[d] == 0) n *= (double)v.shape[d];
    return n;
}

} // namespace kiln
