// Numerics histograms (include/kiln/hist.hpp): the context's slots, and the counting itself on
// the host or, on a CUDA context, by the precompiled kernel (cuda/hist.cu).
#include <kiln/hist.hpp>

#include "ir/error.hpp"
#include "runtime/bench.hpp"
#include "runtime/context_impl.hpp"
#include "kernels/hist_named.hpp"

#ifdef KILN_HAVE_GEMM_KERNELS
#include "kernels/cuda/hist_cuda.hpp"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kiln {

namespace {
constexpr int kMaxHistBins = 4096;

// The bin of x: round(log2|x|) - offset, clamped; 0 and NaN in the first bin, infinities in
// the last. round(log2|x|) from the bits: the exponent, plus one when the significand is past
// sqrt(2) (0x3504f4 is the first significand above it), so that hist.cu, which does the same,
// counts exactly as here whatever either's log2 would round to.
int hist_bin(float x, int bins, int offset) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u &= 0x7fffffffu;
    if (u == 0 || u > 0x7f800000u) return 0;
    int64_t e;
    if (u >= 0x7f800000u) {
        e = INT32_MAX;
    } else {
        int shift = 0;
        if (u < 0x00800000u) {   // subnormal: scale by 2^24, exactly
            float y = std::fabs(x) * 16777216.0f;
            std::memcpy(&u, &y, 4);
            shift = 24;
        }
        e = (int64_t)(u >> 23) - 127 - shift + ((u & 0x7fffffu) >= 0x3504f4u ? 1 : 0);
    }
    const int64_t l = e - offset;
    return l >= bins - 1 ? bins - 1 : l <= 0 ? 0 : (int)l;
}
} // namespace

void set_hist_buffers(Context& ctx, int64_t bins, int64_t offset) {
    if (bins < 1 || bins > kMaxHistBins)
        fail(Error::Kind::Value, "set_hist_buffers: hist_bins={}; valid: 1 to {}", bins, kMaxHistBins);
    if (offset < -1000 || offset > 1000)
        fail(Error::Kind::Value, "set_hist_buffers: hist_offset={}; valid: -1000 to 1000 (a power of two)", offset);
    Context::Impl& m = context_impl(ctx);
    m.hist_bins = (int)bins;   // (in range: checked above)
    m.hist_offset = (int)offset;
    m.hist_slots.clear();
}

int hist_bins(Context& ctx) { return context_impl(ctx).hist_bins; }
int hist_offset(Context& ctx) { return context_impl(ctx).hist_offset; }

Tensor hist(const Tensor& x, const std::string& tag) {
    const char* op = "hist";
    if (!x.defined()) fail(Error::Kind::Value, "{}: x is an empty kiln::Tensor", op);
    const DType t = x.dtype();
    if (t != DType::Float32 && t != DType::Float16 && t != DType::BFloat16)
        fail(Error::Kind::Type, "{}: x is {} {}; histograms count float32, float16 or bfloat16 values", op, dtype_name(t),
             shape_str(x.shape()));
    Context& ctx = x.context();
    Context::Impl& m = context_impl(ctx);
    const int bins = m.hist_bins, offset = m.hist_offset;
    BenchTimer bench(m, op);
    if (bench.on()) bench.set(fmt::format("{} {} as '{}'", dtype_name(t), shape_str(x.shape()), tag), view_bytes(x.view()));
    // The slot is made by an assignment on either backend (a count after an assignment runs
    // outside that assignment's lock: the CPU's tests see it too).
    Tensor slot = ctx.zeros({1, bins}, DType::Int32);
    if (ctx.backend() == Backend::CUDA) {
#ifdef KILN_HAVE_GEMM_KERNELS
        gemm::hist_cuda(x.is_contiguous() ? x : ctx.eval(x.expr()), slot, bins, offset);
#else
        fail(Error::Kind::Runtime, "{}: this libkiln was built without its precompiled CUDA kernels (no nvcc at build "
                                   "time); histograms of CUDA tensors need them", op);
#endif
    } else {
        std::vector<int32_t> counts((size_t)bins, 0);
        for (float v : x.to_vector<float>()) ++counts[(size_t)hist_bin(v, bins, offset)];
        slot.assign(ctx.array(counts, {1, bins}, DType::Int32).expr());
    }
    m.hist_slots.emplace_back(tag, slot);
    return slot;
}

void set_hist_tag(const Tensor& x, const std::string& tag) {
    if (!x.defined()) fail(Error::Kind::Value, "set_hist_tag: x is an empty kiln::Tensor");
    x.view().storage->hist_tag = tag;
}

std::string hist_tag(const Tensor& x) { return x.defined() ? x.view().storage->hist_tag : std::string(); }

void set_hist_named(Context& ctx, bool on) {
    Context::Impl& m = context_impl(ctx);
    m.hist_named = on;
    m.count_named = &count_named;
}
bool hist_named(Context& ctx) { return context_impl(ctx).hist_named; }

NamedCount::NamedCount(Context& ctx, const Tensor& out)
    : ctx_(ctx), out_(out), unwinding_(std::uncaught_exceptions()), outer_(context_impl(ctx).call_depth == 0) {}

const StoreCount* NamedCount::store() {
    Context::Impl& m = context_impl(ctx_);
    if (!outer_ || !m.hist_named || !out_.defined() || out_.view().storage->hist_tag.empty() || !is_float(out_.dtype()) ||
        ctx_.backend() != Backend::CUDA)
        return nullptr;
    if (!slot_.defined()) {
        slot_ = ctx_.zeros({1, m.hist_bins}, DType::Int32);
        store_ = {slot_.data(), m.hist_bins, m.hist_offset};
    }
    return &store_;
}

NamedCount::~NamedCount() {
    if (std::uncaught_exceptions() > unwinding_ || !outer_) return;
    try {
        if (counted_) context_impl(ctx_).hist_slots.emplace_back(out_.view().storage->hist_tag, slot_);
        else count_named(ctx_, out_);
    } catch (...) {
        // A failure to count surfaces at the context's next call.
    }
}

void count_named(Context& ctx, const Tensor& written) {
    if (!context_impl(ctx).hist_named || !written.defined()) return;
    const std::string& tag = written.view().storage->hist_tag;
    if (tag.empty()) return;
    const DType t = written.dtype();
    if (t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16) hist(written, tag);
}

HistData dump_hist_data(Context& ctx) {
    Context::Impl& m = context_impl(ctx);
    HistData d;
    d.counts = ctx.zeros({(int64_t)m.hist_slots.size(), m.hist_bins}, DType::Int32);
    for (size_t i = 0; i < m.hist_slots.size(); ++i) {
        Tensor row = d.counts[(int64_t)i];
        row.assign(m.hist_slots[i].second.reshape({m.hist_bins}).expr());
        d.tags.push_back(m.hist_slots[i].first);
    }
    m.hist_slots.clear();
    return d;
}

} // namespace kiln
