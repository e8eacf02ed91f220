// Batch norm, softmax, cross-entropy, pooling, LRN and the activation helpers (kiln/nn.hpp):
// operand checks, then expressions, except pooling and LRN on CUDA contexts (kernels/cuda/pool.cu).
// Batch norm views x as (n, C) so that each statistic is one column reduction and y one
// elementwise kernel.
#include <kiln/nn.hpp>

#include "ir/error.hpp"
#include "kernels/hist_named.hpp"
#include "runtime/bench.hpp"
#include <kiln/context.hpp>

#ifdef KILN_HAVE_GEMM_KERNELS
#include "kernels/cuda/pool_cuda.hpp"
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace kiln {

namespace {

std::string desc(const Tensor& t) { return fmt::format("{} {}", dtype_name(t.dtype()), shape_str(t.shape())); }

void check_defined(const Tensor& t, const char* name, const char* op) {
    if (!t.defined()) fail(Error::Kind::Value, "{}: {} is an empty kiln::Tensor", op, name);
}

void check_float(const Tensor& t, const char* name, const char* op) {
    if (!is_float(t.dtype())) fail(Error::Kind::Type, "{}: {} is {}; it must be a float tensor", op, name, desc(t));
}

// A per-channel tensor: (C,) or (C, 1), float, usable with x's context.
void check_channels(const Tensor& v, const Tensor& x, int64_t C, const char* name, const char* op) {
    check_defined(v, name, op);
    if (!x.context().can_use(v))
        fail(Error::Kind::Value, "{}: {} lives on {} of another context, but x runs on {}", op, name,
             v.context().device_name(), x.context().device_name());
    check_float(v, name, op);
    if (v.shape() != Shape{C} && v.shape() != Shape{C, 1})
        fail(Error::Kind::Value, "{}: {} is {}; x has {} channels (its last axis), so it must be ({},) or ({}, 1)", op, name,
             desc(v), C, C, C);
}

// x (..., C): C and the batch size n (every other axis).
std::pair<int64_t, int64_t> channels_of(const Tensor& x, const char* op) {
    check_defined(x, "x", op);
    check_float(x, "x", op);
    if (x.rank() < 1 || x.shape().back() < 1 || x.size() == 0)
        fail(Error::Kind::Value, "{}: x is {}; it needs a last (channel) axis and at least one element per channel", op,
             desc(x));
    return {x.shape().back(), x.size() / x.shape().back()};
}

// Each tensor defined and of a float dtype.
void check_float_tensors(std::initializer_list<std::pair<const Tensor*, const char*>> ts, const char* op) {
    for (auto [t, name] : ts) {
        check_defined(*t, name, op);
        check_float(*t, name, op);
    }
}

void check_like(const Tensor& t, const Tensor& x, const char* name, const char* op) {
    check_defined(t, name, op);
    if (!x.context().can_use(t) || t.shape() != x.shape())
        fail(Error::Kind::Value, "{}: {} is {}; it must have x's shape {} and context", op, name, desc(t),
             shape_str(x.shape()));
    check_float(t, name, op);
}

Expr per_channel(const Tensor& v, int64_t C) { return reshape(v.expr(), {1, C}); }
void store(Tensor& v, const Expr& e) { v.assign(reshape(e, v.shape())); }

Expr relu_keep_nan(const Expr& e) { return where(less(e, 0.0), Expr(0.0), e); }

// e (a per-channel (1, C) expression) computed once per channel into a float32 tensor: a square
// root and a division per element would make the normalisation of 16-bit activations bound by
// instruction issue rather than memory.
Expr f32(const Expr& e) { return cast(e, DType::Float32); }
Expr per_channel_once(Context& ctx, const Expr& e) { return ctx.eval(f32(e)).expr(); }
// xsum / n per channel, correctly rounded in float32 (a constant channel's mean is then exact,
// and with it the normalisation of a channel of variance 0, whose scale is 1 / sqrt(eps)).
Expr batch_mean(Context& ctx, const Tensor& xsum, int64_t C, int64_t n) {
    return per_channel_once(ctx, f32(per_channel(xsum, C)) / Expr((double)n));
}

} // namespace

namespace {
// Bench mode's line for a layer call (runtime/bench.hpp): the input's dtype and shape, and the
// bytes of the tensors it reads and writes.
void bench_layer(BenchTimer& bench, const Tensor& in, std::initializer_list<const Tensor*> moved) {
    if (!bench.on()) return;
    double bytes = 0;
    for (const Tensor* t : moved) bytes += view_bytes(t->view());
    bench.set(fmt::format("{} {}", dtype_name(in.dtype()), shape_str(in.shape())), bytes);
}
} // namespace

void compound_fprop_bn(const Tensor& x, Tensor& xsum, Tensor& xvar, Tensor& gmean, Tensor& gvar, const Tensor& gamma,
                       const Tensor& beta, Tensor& y, double eps, double rho, bool compute_batch_sum, double accumbeta,
                       bool relu, bool inference, const Tensor& residual) {
    const char* op = "compound_fprop_bn";
    const auto [C, n] = channels_of(x, op);
    if (residual.defined()) check_like(residual, x, "residual", op);
    for (auto [t, name] : {std::pair{&xsum, "xsum"}, {&xvar, "xvar"}, {&gmean, "gmean"}, {&gvar, "gvar"}})
        check_channels(*t, x, C, name, op);
    check_channels(gamma, x, C, "gamma", op);
    check_channels(beta, x, C, "beta", op);
    check_like(y, x, "y", op);
    if (!(eps >= 0)) fail(Error::Kind::Value, "{}: eps={}; it must be >= 0", op, eps);
    NamedCount named(y.context(), y);
    BenchTimer bench(context_impl(x.context()), op);
    if (residual.defined()) bench_layer(bench, x, {&x, &residual, &y});
    else bench_layer(bench, x, {&x, &y});
    if (!(rho >= 0 && rho <= 1)) fail(Error::Kind::Value, "{}: rho={}; the running averages' weight is in [0, 1]", op, rho);
    Context& ctx = x.context();
    const Expr x2 = reshape(x.expr(), {n, C});
    Expr mean_e, var_e;
    if (inference) {
        mean_e = per_channel(gmean, C);
        var_e = per_channel(gvar, C);
    } else {
        std::optional<Tensor> rows = x.reshape_view({n, C});
        if (compute_batch_sum && rows && (x.dtype() == DType::Float16 || x.dtype() == DType::BFloat16)) {
            // One read of x for its sum and its variance, the latter from sums about a shift K
            // per channel: s = sum(x - K), q = sum((x - K)^2), var = q / n - (s / n)^2, which
            // loses about (K - mean)^2 / var of float32's precision to the subtraction. K is
            // the mean of up to 64 rows spread over the batch, within a few spreads of the mean
            // whatever the data: far below a 16-bit output's rounding, not below float32's,
            // whose variance keeps the two-pass form below.
            const Tensor sample = rows->slice({Slice::range(0, n, std::max<int64_t>(1, n / 64))});
            const Expr K = per_channel_once(ctx, mean(f32(sample.expr()), 0, true)), d = f32(x2) - K;
            Tensor shifted = ctx.empty({1, C}, DType::Float32), squares = ctx.empty({1, C}, DType::Float32);
            ctx.assign_together({{&xsum, reshape(sum(x2, 0, true), xsum.shape())},
                                 {&shifted, sum(d, 0, true)},
                                 {&squares, sum(square(d), 0, true)}});
            mean_e = batch_mean(ctx, xsum, C, n);
            const Expr m = shifted.expr() / Expr((double)n);
            store(xvar, maximum(squares.expr() / Expr((double)n) - square(m), Expr(0.0)));
        } else if (compute_batch_sum) {
            // The sums and the variance about their mean in one kernel: on CUDA one read of x,
            // the variance's pass folded into the sums' as moments (codegen's column_folds:
            // Chan's merges, as stable as two passes); on the CPU two passes.
            const Expr total = sum(f32(x2), 0, true);
            ctx.assign_together({{&xsum, reshape(total, xsum.shape())},
                                 {&xvar, reshape(mean(square(f32(x2) - total / Expr((double)n)), 0, true), xvar.shape())}});
            mean_e = batch_mean(ctx, xsum, C, n);
        } else {
            // The variance about the mean of the given sums (a convolution's bsum): one read of x.
            mean_e = batch_mean(ctx, xsum, C, n);
            store(xvar, mean(square(x2 - mean_e), 0, true));
        }
        var_e = per_channel(xvar, C);
        store(gmean, per_channel(gmean, C) * rho + mean_e * (1.0 - rho));
        store(gvar, per_channel(gvar, C) * rho + var_e * (1.0 - rho));
    }
    const Expr scale_e = f32(per_channel(gamma, C)) * reciprocal(sqrt(f32(var_e) + eps));
    Expr out;
    if (inference && dtype_size(y.dtype()) == 2) {
        // x * scale + (beta - mean * scale): two float32 vectors a channel beside x, as a third
        // vector's loads per 16-byte group hold 16-bit outputs below the bandwidth. The fold adds
        // about 2^-24 |mean * scale| to a value the output then rounds to 2^-11 of itself
        // (float16) or 2^-8 (bfloat16). float32 outputs keep (x - mean) * scale + beta.
        Tensor scale = ctx.empty({1, C}, DType::Float32), shift = ctx.empty({1, C}, DType::Float32);
        ctx.assign_together({{&scale, scale_e}, {&shift, f32(per_channel(beta, C)) - f32(mean_e) * scale_e}});
        out = x2 * scale.expr() + shift.expr();
    } else {
        out = (x2 - mean_e) * per_channel_once(ctx, scale_e) + per_channel(beta, C);
    }
    if (accumbeta != 0) out = out + Expr(accumbeta) * reshape(y.expr(), {n, C});
    if (residual.defined()) out = out + reshape(residual.expr(), {n, C});
    if (relu) out = relu_keep_nan(out);
    store(y, out);
}

void compound_bprop_bn(Tensor& delta_out, Tensor& grad_gamma, Tensor& grad_beta, const Tensor& delta_in, const Tensor& x,
                       const Tensor& xsum, const Tensor& xvar, const Tensor& gamma, double eps) {
    const char* op = "compound_bprop_bn";
    const auto [C, n] = channels_of(x, op);
    check_like(delta_in, x, "delta_in", op);
    check_like(delta_out, x, "delta_out", op);
    NamedCount named(delta_out.context(), delta_out);
    BenchTimer bench(context_impl(x.context()), op);
    bench_layer(bench, x, {&x, &delta_in, &delta_out});
    for (auto [t, name] : {std::pair{&xsum, "xsum"}, {&xvar, "xvar"}, {&gamma, "gamma"}})
        check_channels(*t, x, C, name, op);
    check_channels(grad_gamma, x, C, "grad_gamma", op);
    check_channels(grad_beta, x, C, "grad_beta", op);
    if (!(eps >= 0)) fail(Error::Kind::Value, "{}: eps={}; it must be >= 0", op, eps);
    const Expr x2 = reshape(x.expr(), {n, C}), d2 = reshape(delta_in.expr(), {n, C});
    Context& ctx = x.context();
    const Expr rstd = per_channel_once(ctx, reciprocal(sqrt(f32(per_channel(xvar, C)) + eps)));
    const Expr mean = batch_mean(ctx, xsum, C, n);
    const Expr xhat = (x2 - mean) * rstd;
    // Both sums in one read of delta_in and x.
    ctx.assign_together({{&grad_gamma, reshape(sum(d2 * xhat, 0, true), grad_gamma.shape())},
                         {&grad_beta, reshape(sum(d2, 0, true), grad_beta.shape())}});
    const Expr g = per_channel(grad_gamma, C), b = per_channel(grad_beta, C);
    store(delta_out, per_channel(gamma, C) * (d2 - (xhat * g + b) * (1.0 / (double)n)) * rstd);
}

Expr softmax(const Expr& x, int axis) {
    const int a = normalize_axis(axis, x.rank(), "softmax");
    const Expr e = exp(x - max(x, a, true));
    return e * reciprocal(sum(e, a, true));
}

Expr cross_entropy(const Expr& p, const Expr& t, int axis, bool mean_over_rows) {
    const char* op = "cross_entropy";
    if (p.shape() != t.shape())
        fail(Error::Kind::Value, "{}: p is {} and the targets {}: one target per probability (same shapes)", op,
             shape_str(p.shape()), shape_str(t.shape()));
    const int a = normalize_axis(axis, p.rank(), op);
    const Expr pf = is_float(p.dtype()) && p.dtype() != DType::Float32 ? cast(p, DType::Float32) : p;
    const Expr rows = -sum(t * safelog(pf), a, true);
    const Expr total = sum(rows, kAllAxes, false);
    const int64_t count = p.size() / std::max<int64_t>(p.shape()[a], 1);
    return mean_over_rows ? total * (1.0 / (double)std::max<int64_t>(count, 1)) : total;
}

Expr cross_entropy_labels(const Expr& p, const Tensor& labels, bool mean_over_rows) {
    const char* op = "cross_entropy_labels";
    check_defined(labels, "labels", op);
    if (p.rank() != 2)
        fail(Error::Kind::Value, "{}: p is {}; it must be (rows, classes)", op, shape_str(p.shape()));
    const int64_t rows = p.shape()[0], classes = p.shape()[1];
    if (is_float(labels.dtype()) || labels.dtype() == DType::Bool)
        fail(Error::Kind::Type, "{}: labels are {}; class indices are an integer tensor", op, desc(labels));
    if (labels.shape() != Shape{rows} && labels.shape() != Shape{rows, 1})
        fail(Error::Kind::Value, "{}: labels are {}; p has {} rows, so they must be ({},) or ({}, 1)", op, desc(labels),
             rows, rows, rows);
    const Tensor classes_t = labels.context().arange(classes, DType::Int32);
    const Expr one_hot = cast(equal(reshape(classes_t.expr(), {1, classes}),
                                    reshape(cast(labels.expr(), DType::Int32), {rows, 1})),
                              DType::Float32);
    // A label outside [0, classes) makes the loss NaN rather than a row of zero loss (the check
    // stays in the expression: no read back of the labels). Compared as int64, so that no label
    // of a wider or unsigned dtype passes as another class.
    const Expr label = cast(labels.expr(), DType::Int64);
    const Expr unknown = sum(where(bitwise_and(greater_equal(label, Expr(0.0)), less(label, Expr((double)classes))),
                                   Expr(0.0), Expr(std::numeric_limits<double>::quiet_NaN())),
                             kAllAxes, false);
    const Expr total = cross_entropy(p, one_hot, 1, false) + cast(unknown, DType::Float32);
    return mean_over_rows ? total * (1.0 / (double)std::max<int64_t>(rows, 1)) : total;
}

Expr fprop_relu(const Expr& x, double slope) {
    return slope == 0 ? relu_keep_nan(x) : where(greater(x, 0.0), x, x * slope);
}

Expr bprop_relu(const Expr& x, const Expr& error, double slope) {
    return where(greater(x, 0.0), error, slope == 0 ? Expr(0.0) : where(less(x, 0.0), error * slope, Expr(0.0)));
}

Expr sigmoid_grad(const Expr& y) { return y * (1.0 - y); }
Expr tanh_grad(const Expr& y) { return 1.0 - y * y; }

// ---- pooling

namespace {

const char* pool_name(PoolOp op) {
    return op == PoolOp::Max ? "max" : op == PoolOp::Avg ? "avg" : op == PoolOp::L2 ? "l2" : "lrn";
}

// The tensor forms of an (N, D, H, W, C) activation: 5-D, or without the unit leading spatial
// axes the layer's spatial rank allows.
Shape act_shape(int rank, int64_t n, const Dims3& sp, int64_t ch) {
    if (rank == 1) return {n, sp[2], ch};
    if (rank == 2) return {n, sp[1], sp[2], ch};
    return {n, sp[0], sp[1], sp[2], ch};
}

// t as a 5-D (N, D, H, W, C) view, after checking its shape against the layer.
Tensor as5(const Tensor& t, const PoolLayer& L, const Dims3& sp, int64_t ch, const char* name, bool out, const char* op) {
    check_defined(t, name, op);
    if (t.dtype() != DType::Int32) check_float(t, name, op);   // int32: argmax, whose dtype its callers check
    const Shape five{L.N, sp[0], sp[1], sp[2], ch};
    bool ok = t.shape() == five;
    for (int r = L.spatial_rank(); r < 3 && !ok; ++r) ok = t.shape() == act_shape(r, L.N, sp, ch);
    if (!ok) {
        std::string forms = shape_str(five);
        for (int r = L.spatial_rank(); r < 3; ++r) forms += " or " + shape_str(act_shape(r, L.N, sp, ch));
        fail(Error::Kind::Value, "{}: {} is {}; for layer {} it must be {}", op, name, desc(t), L.str(), forms);
    }
    if (auto v = t.reshape_view(five)) return *v;
    if (out) fail(Error::Kind::Value, "{}: {} is a view that cannot be seen as {}: pass a contiguous tensor", op, name, shape_str(five));
    return t.reshape(five);
}

// e (5-D, shape s) inside a padded copy filled with `fill`, float32.
Tensor padded(Context& ctx, const Expr& e, const Shape& s, const PoolLayer& L, double fill) {
    Tensor p = ctx.full({s[0], s[1] + 2 * L.pad[0], s[2] + 2 * L.pad[1], s[3] + 2 * L.pad[2], s[4] + 2 * L.pad_c},
                                fill, DType::Float32);
    Tensor inner = p.slice({Slice::all(), Slice::range(L.pad[0], L.pad[0] + s[1]), Slice::range(L.pad[1], L.pad[1] + s[2]),
                            Slice::range(L.pad[2], L.pad[2] + s[3]), Slice::range(L.pad_c, L.pad_c + s[4])});
    inner.assign(e);
    return p;
}
Tensor padded(const Tensor& x, const PoolLayer& L, double fill) { return padded(x.context(), x.expr(), x.shape(), L, fill); }

// A window's taps go into one expression at most this many at a time: at every such tap (but the
// last) the result so far is evaluated and the next taps build on the tensor, so that a window of
// any size compiles a few kernels of bounded size, not one of a term per tap (whose compile time
// grows faster than the taps: 16000 took minutes). The order of the operations is unchanged.
constexpr int64_t kTapsPerKernel = 32;
Expr bounded(Context& ctx, const Expr& e, int64_t k, int64_t taps) {
    return (k + 1) % kTapsPerKernel == 0 && k + 1 < taps ? ctx.eval(e).expr() : e;
}

// The elements of a padded tensor that tap `tap` of every window reads: an output-shaped view.
Tensor tap_view(const Tensor& p, const PoolLayer& L, int64_t tap) {
    const int64_t s = tap % L.window[2], r = tap / L.window[2] % L.window[1], t = tap / (L.window[2] * L.window[1]) % L.window[0],
                  j = tap / (L.window[2] * L.window[1] * L.window[0]);
    auto along = [](int64_t first, int64_t count, int64_t step) { return Slice::range(first, first + step * (count - 1) + 1, step); };
    return p.slice({Slice::all(), along(t, L.output[0], L.stride[0]), along(r, L.output[1], L.stride[1]),
                    along(s, L.output[2], L.stride[2]), along(j, L.K, L.str_c)});
}

// The taps of L's window that read the input at some output position, in tap order. Any other
// tap reads padding alone: it adds nothing to a sum or a count, never wins a max (the padding
// is -inf there), and its share of a gradient lands in the padding, which is dropped. So a
// window far larger than its input (mostly padding: an LRN of J channels over fewer) costs a
// pass per tap that reads the input rather than one per tap. Each axis (channels, depth,
// height, width) keeps its offsets as ranges; an offset inside them may still read padding
// only (a stride past the input's size) where there would be too many ranges.
class InputTaps {
public:
    explicit InputTaps(const PoolLayer& L) : L_(L) {
        axes_[0] = offsets(L.J, L.C, L.pad_c, L.str_c, L.K);
        for (int a = 0; a < 3; ++a) axes_[a + 1] = offsets(L.window[a], L.image[a], L.pad[a], L.stride[a], L.output[a]);
        for (const auto& ranges : axes_) {
            int64_t n = 0;
            for (auto [lo, hi] : ranges) n += hi - lo;
            count_ = count_ > INT64_MAX / std::max<int64_t>(n, 1) ? INT64_MAX : count_ * n;
        }
        // (Output 0 reads the input at offset pad along every axis: make_pool_layer keeps pad < window.)
        KILN_CHECK_INTERNAL(count_ >= 1, "pooling: no tap of {} reads the input", L.str());
    }
    int64_t count() const { return count_; }
    // f(tap, n): the n-th of them, tap as tap_view numbers it.
    template <class F>
    void each(F&& f) const {
        int64_t n = 0;
        for (auto [j0, j1] : axes_[0])
            for (int64_t j = j0; j < j1; ++j)
                for (auto [t0, t1] : axes_[1])
                    for (int64_t t = t0; t < t1; ++t)
                        for (auto [r0, r1] : axes_[2])
                            for (int64_t r = r0; r < r1; ++r)
                                for (auto [s0, s1] : axes_[3])
                                    for (int64_t s = s0; s < s1; ++s)
                                        f(((j * L_.window[0] + t) * L_.window[1] + r) * L_.window[2] + s, n++);
    }

private:
    using Ranges = std::vector<std::pair<int64_t, int64_t>>;
    // Output o's window reads the input at offsets [pad - o st, pad + in - o st), within [0, w):
    // the outputs from o_lo to o_hi read some. Windows a stride of at most the input's size
    // apart read one range together; otherwise each its own, merged where they touch.
    static Ranges offsets(int64_t w, int64_t in, int64_t pad, int64_t st, int64_t out) {
        const int64_t o_hi = std::min(out - 1, (pad + in - 1) / st), o_lo = pad < w ? 0 : (pad - w) / st + 1;
        if (o_lo > o_hi) return {};
        if (in >= st || o_hi - o_lo >= kMaxRanges) return {{std::max<int64_t>(0, pad - o_hi * st), std::min(w, pad + in - o_lo * st)}};
        Ranges r;
        for (int64_t o = o_hi; o >= o_lo; --o) {
            const int64_t lo = std::max<int64_t>(0, pad - o * st), hi = std::min(w, pad + in - o * st);
            if (!r.empty() && lo <= r.back().second) r.back().second = std::max(r.back().second, hi);
            else r.emplace_back(lo, hi);
        }
        return r;
    }
    static constexpr int64_t kMaxRanges = 4096;
    const PoolLayer& L_;
    std::array<Ranges, 4> axes_;
    int64_t count_ = 1;
};

// The sum over each channel's window of e (an expression of the 5-D input's shape, zeros
// past it): pooling's count of a window's elements inside the input (e ones), LRN's sums.
Expr window_sum(Context& ctx, const Expr& e, const Shape& s, const PoolLayer& L) {
    const Tensor p = padded(ctx, e, s, L, 0.0);
    const InputTaps taps(L);
    Expr acc;
    taps.each([&](int64_t k, int64_t n) {
        acc = n == 0 ? tap_view(p, L, k).expr() : bounded(ctx, acc + tap_view(p, L, k).expr(), n, taps.count());
    });
    return acc;
}

} // namespace

int PoolLayer::spatial_rank() const {
    if (image[0] > 1 || window[0] > 1 || pad[0] > 0) return 3;
    if (image[1] > 1 || window[1] > 1 || pad[1] > 0) return 2;
    return 1;
}
Shape PoolLayer::input_shape() const { return act_shape(spatial_rank(), N, image, C); }
Shape PoolLayer::output_shape() const { return act_shape(spatial_rank(), N, output, K); }
std::string PoolLayer::str() const {
    return fmt::format("pool_layer({} {} N={} C={} image {}x{}x{} J={} window {}x{}x{} pad_c={} pad {}x{}x{} str_c={} stride "
                       "{}x{}x{} -> K={} output {}x{}x{})",
                       dtype_name(dtype), pool_name(op), N, C, image[0], image[1], image[2], J, window[0], window[1],
                       window[2], pad_c, pad[0], pad[1], pad[2], str_c, stride[0], stride[1], stride[2], K, output[0],
                       output[1], output[2]);
}

namespace {
// pool_layer for `name` (pool_layer, lrn_layer).
PoolLayer make_pool_layer(DType dtype, PoolOp op, int64_t N, int64_t C, Dims3 image, int64_t J, Dims3 window, int64_t pad_c,
                          Dims3 pad, int64_t str_c, Dims3 stride, const char* name) {
    if (!is_float(dtype))
        fail(Error::Kind::Type, "{}: dtype {}; pooling runs in float32, float16 or bfloat16", name, dtype_name(dtype));
    if (N < 1 || C < 1 || J < 1) fail(Error::Kind::Value, "{}: N={}, C={}, J={}: each must be at least 1", name, N, C, J);
    if (N > kMaxLayerDim || C > kMaxLayerDim || J > kMaxLayerDim || pad_c > kMaxLayerDim || str_c > kMaxLayerDim)
        fail(Error::Kind::Value, "{}: N={}, C={}, J={}, pad_c={}, str_c={}: each is at most 2^31 - 1 ({})", name, N, C, J,
             pad_c, str_c, kMaxLayerDim);
    if (str_c < 0 || stride[0] < 0 || stride[1] < 0 || stride[2] < 0)
        fail(Error::Kind::Value, "{}: str_c={}, stride {}x{}x{}: strides are at least 1 (0: the window's size along that axis)",
             name, str_c, stride[0], stride[1], stride[2]);
    PoolLayer L;
    L.op = op, L.dtype = dtype, L.N = N, L.C = C, L.J = J, L.pad_c = pad_c, L.image = image, L.window = window, L.pad = pad;
    L.str_c = str_c < 1 ? J : str_c;
    static const char* axes[3] = {"depth", "height", "width"};
    auto size = [&](int64_t in, int64_t w, int64_t p, int64_t st, const char* axis) {
        if (in < 1 || w < 1 || p < 0)
            fail(Error::Kind::Value, "{}: along {} size {}, window {}, pad {}: sizes must be at least 1 and padding >= 0", name,
                 axis, in, w, p);
        if (in > kMaxLayerDim || w > kMaxLayerDim || p > kMaxLayerDim || st > kMaxLayerDim)
            fail(Error::Kind::Value, "{}: along {} size {}, window {}, pad {}, stride {}: each is at most 2^31 - 1 ({})", name,
                 axis, in, w, p, st, kMaxLayerDim);
        if (p >= w)
            fail(Error::Kind::Value, "{}: along {} pad={} is not smaller than the window ({}): a window would hold padding only",
                 name, axis, p, w);
        if (in + 2 * p < w)
            fail(Error::Kind::Value, "{}: along {} the padded input ({} + 2 x {}) is smaller than the window ({})", name, axis,
                 in, p, w);
        return (in + 2 * p - w) / st + 1;
    };
    for (int a = 0; a < 3; ++a) {
        L.stride[a] = stride[a] < 1 ? window[a] : stride[a];
        L.output[a] = size(image[a], window[a], pad[a], L.stride[a], axes[a]);
    }
    L.K = size(C, J, pad_c, L.str_c, "channels");
    check_shape(L.input_shape(), name);
    check_shape(L.output_shape(), name);
    return L;
}
} // namespace

PoolLayer pool_layer(DType dtype, PoolOp op, int64_t N, int64_t C, Dims3 image, int64_t J, Dims3 window, int64_t pad_c,
                     Dims3 pad, int64_t str_c, Dims3 stride) {
    return make_pool_layer(dtype, op, N, C, image, J, window, pad_c, pad, str_c, stride, "pool_layer");
}

Tensor& fprop_pool(const PoolLayer& L, const Tensor& I, Tensor& O, const std::optional<Tensor>& argmax, double alpha,
                   double beta) {
    const char* op = "fprop_pool";
    if (L.op == PoolOp::Lrn) fail(Error::Kind::Value, "{}: the layer is an LRN layer (lrn_layer): use fprop_lrn", op);
    check_float_tensors({{&I, "I"}, {&O, "O"}}, op);
    const Tensor I5 = as5(I, L, L.image, L.C, "I (the input)", false, op);
    if (!I.context().can_use(O)) fail(Error::Kind::Value, "{}: O lives on another context than I", op);
    Tensor O5 = as5(O, L, L.output, L.K, "O (the output)", true, op);
    std::optional<Tensor> A5;
    if (argmax) {
        if (L.op != PoolOp::Max) fail(Error::Kind::Value, "{}: argmax is given, but the layer pools by {}, not max", op, pool_name(L.op));
        check_defined(*argmax, "argmax", op);
        if (argmax->dtype() != DType::Int32 || !I.context().can_use(*argmax))
            fail(Error::Kind::Type, "{}: argmax is {}; it must be an int32 tensor of O's shape and context", op, desc(*argmax));
        A5 = as5(*argmax, L, L.output, L.K, "argmax", true, op);
    }
    NamedCount named(O.context(), O);
    BenchTimer bench(context_impl(I.context()), op);
    bench_layer(bench, I, {&I, &O});
#ifdef KILN_HAVE_GEMM_KERNELS
    if (gemm::pool_fprop_cuda(L, I5, O5, A5 ? &*A5 : nullptr, alpha, beta, named.store())) {
        if (named.store()) named.counted();
        return O;
    }
#endif
    Context& ctx = I.context();
    const Tensor P = padded(I5, L, L.op == PoolOp::Max ? -INFINITY : 0.0);
    Expr r;
    if (L.op == PoolOp::Max) {
        // Tap 0 first, whether or not it reads the input (then -inf, as the kernels start).
        Expr best = tap_view(P, L, 0).expr(), idx = scalar(0, DType::Int32);
        const InputTaps taps(L);
        taps.each([&](int64_t k, int64_t n) {
            if (k == 0) return;
            const Expr v = tap_view(P, L, k).expr(), up = greater(v, best);
            if (A5) idx = bounded(ctx, where(up, scalar((double)k, DType::Int32), idx), n, taps.count());
            best = bounded(ctx, where(up, v, best), n, taps.count());   // (idx read the previous best)
        });
        if (A5) {
            Tensor a = *A5;
            a.assign(idx);   // a scalar 0 for a one-tap window: broadcast
        }
        r = best;
    } else {
        Expr acc = Expr(0.0);
        const InputTaps taps(L);
        taps.each([&](int64_t k, int64_t n) {
            const Expr v = tap_view(P, L, k).expr();
            acc = bounded(ctx, acc + (L.op == PoolOp::L2 ? v * v : v), n, taps.count());
        });
        if (L.op == PoolOp::L2) {
            r = sqrt(acc);
        } else {
            r = acc / window_sum(ctx, ctx.ones(I5.shape(), DType::Float32).expr(), I5.shape(), L);
        }
    }
    if (alpha != 1) r = Expr(alpha) * r;
    if (beta != 0) r = r + Expr(beta) * O5.expr();
    O5.assign(r);
    return O;
}

Tensor& bprop_pool(const PoolLayer& L, const Tensor& E, Tensor& grad_I, const std::optional<Tensor>& argmax, double alpha,
                   double beta, const std::optional<Tensor>& X, const std::optional<Tensor>& Y) {
    const char* op = "bprop_pool";
    if (L.op == PoolOp::Lrn) fail(Error::Kind::Value, "{}: the layer is an LRN layer (lrn_layer): use bprop_lrn", op);
    check_float_tensors({{&E, "E"}, {&grad_I, "grad_I"}}, op);
    const Tensor E5 = as5(E, L, L.output, L.K, "E (the output's gradient)", false, op);
    if (!E.context().can_use(grad_I)) fail(Error::Kind::Value, "{}: grad_I lives on another context than E", op);
    Tensor G5 = as5(grad_I, L, L.image, L.C, "grad_I (the input's gradient)", true, op);
    NamedCount named(grad_I.context(), grad_I);
    BenchTimer bench(context_impl(E.context()), op);
    bench_layer(bench, E, {&E, &grad_I});
    std::optional<Tensor> A5, X5, Y5;
    if (L.op == PoolOp::Max) {
        if (!argmax) fail(Error::Kind::Value, "{}: max pooling's gradient needs fprop_pool's argmax", op);
        if (argmax->dtype() != DType::Int32) fail(Error::Kind::Type, "{}: argmax is {}; it is int32 (from fprop_pool)", op, desc(*argmax));
        A5 = as5(*argmax, L, L.output, L.K, "argmax", false, op);
    }
    if (L.op == PoolOp::L2) {
        if (!X || !Y) fail(Error::Kind::Value, "{}: L2 pooling's gradient needs the forward input X and output Y", op);
        X5 = as5(*X, L, L.image, L.C, "X (the forward input)", false, op);
        Y5 = as5(*Y, L, L.output, L.K, "Y (the forward output)", false, op);
    }
#ifdef KILN_HAVE_GEMM_KERNELS
    if (gemm::pool_bprop_cuda(L, E5, G5, A5 ? &*A5 : nullptr, X5 ? &*X5 : nullptr, Y5 ? &*Y5 : nullptr, alpha, beta,
                              named.store())) {
        if (named.store()) named.counted();
        return grad_I;
    }
#endif
    Context& ctx = E.context();
    // Each tap adds its share into a padded float32 gradient: overlapping windows accumulate.
    Tensor Gp = padded(ctx.zeros(G5.shape(), DType::Float32), L, 0.0);
    std::optional<Tensor> Xp, count;
    if (X5) Xp = padded(*X5, L, 0.0);
    if (L.op == PoolOp::Avg) {
        count = ctx.eval(window_sum(ctx, ctx.ones(G5.shape(), DType::Float32).expr(), G5.shape(), L));
    }
    InputTaps(L).each([&](int64_t k, int64_t) {
        Tensor g = tap_view(Gp, L, k);
        Expr share;
        if (L.op == PoolOp::Max) share = where(equal(A5->expr(), scalar((double)k, DType::Int32)), E5.expr(), Expr(0.0));
        else if (L.op == PoolOp::Avg) share = E5.expr() * (Expr(1.0) / count->expr());   // as the kernels
        else share = where(greater(Y5->expr(), 0.0), E5.expr() * tap_view(*Xp, L, k).expr() / Y5->expr(), Expr(0.0));
        g.assign(g.expr() + share);
    });
    const Tensor inner = Gp.slice({Slice::all(), Slice::range(L.pad[0], L.pad[0] + L.image[0]),
                                   Slice::range(L.pad[1], L.pad[1] + L.image[1]), Slice::range(L.pad[2], L.pad[2] + L.image[2]),
                                   Slice::range(L.pad_c, L.pad_c + L.C)});
    Expr r = inner.expr();
    if (alpha != 1) r = Expr(alpha) * r;
    if (beta != 0) r = r + Expr(beta) * G5.expr();
    G5.assign(r);
    return grad_I;
}

// ---- local response normalisation

PoolLayer lrn_layer(DType dtype, int64_t N, int64_t C, Dims3 image, int64_t J) {
    if (J < 1 || J % 2 == 0)
        fail(Error::Kind::Value, "lrn_layer: J={}; the window of channels is centred on each channel, so J is odd", J);
    PoolLayer L = make_pool_layer(dtype, PoolOp::Avg, N, C, image, J, {1, 1, 1}, J / 2, {0, 0, 0}, 1, {1, 1, 1}, "lrn_layer");
    L.op = PoolOp::Lrn;
    return L;
}

namespace {
void check_lrn(const PoolLayer& L, const char* op) {
    if (L.op != PoolOp::Lrn)
        fail(Error::Kind::Value, "{}: the layer pools by {}; make an LRN layer with lrn_layer", op, pool_name(L.op));
}
} // namespace

Tensor& fprop_lrn(const PoolLayer& L, const Tensor& I, Tensor& O, Tensor& denom, double alpha, double beta, double ascale,
                  double bpower) {
    const char* op = "fprop_lrn";
    check_lrn(L, op);
    const Tensor I5 = as5(I, L, L.image, L.C, "I (the input)", false, op);
    Tensor O5 = as5(O, L, L.image, L.C, "O (the output)", true, op);
    Tensor D5 = as5(denom, L, L.image, L.C, "denom", true, op);
    for (const Tensor* t : {&O, &denom})
        if (!I.context().can_use(*t)) fail(Error::Kind::Value, "{}: O and denom must be usable by I's context", op);
    NamedCount named(O.context(), O);
    BenchTimer bench(context_impl(I.context()), op);
    bench_layer(bench, I, {&I, &O, &denom});
#ifdef KILN_HAVE_GEMM_KERNELS
    if (gemm::lrn_fprop_cuda(L, I5, O5, D5, alpha, beta, ascale, bpower, named.store())) {
        if (named.store()) named.counted();
        return O;
    }
#endif
    D5.assign(1.0 + Expr(ascale) * window_sum(I.context(), square(cast(I5.expr(), DType::Float32)), I5.shape(), L));
    Expr r = I5.expr() * power(D5.expr(), Expr(-bpower));
    if (alpha != 1) r = Expr(alpha) * r;
    if (beta != 0) r = r + Expr(beta) * O5.expr();
    O5.assign(r);
    return O;
}

Tensor& bprop_lrn(const PoolLayer& L, const Tensor& I, const Tensor& O, const Tensor& E, Tensor& delta, const Tensor& denom,
                  double alpha, double beta, double ascale, double bpower) {
    const char* op = "bprop_lrn";
    check_lrn(L, op);
    const Tensor I5 = as5(I, L, L.image, L.C, "I (the input)", false, op), O5 = as5(O, L, L.image, L.C, "O (the output)", false, op),
                 E5 = as5(E, L, L.image, L.C, "E (the output's gradient)", false, op),
                 D5 = as5(denom, L, L.image, L.C, "denom", false, op);
    Tensor G5 = as5(delta, L, L.image, L.C, "delta (the input's gradient)", true, op);
    for (const Tensor* t : {&O, &E, (const Tensor*)&delta, &denom})
        if (!I.context().can_use(*t)) fail(Error::Kind::Value, "{}: every tensor must be usable by I's context", op);
    NamedCount named(delta.context(), delta);
    BenchTimer bench(context_impl(I.context()), op);
    bench_layer(bench, I, {&I, &O, &E, &delta, &denom});
#ifdef KILN_HAVE_GEMM_KERNELS
    if (gemm::lrn_bprop_cuda(L, I5, O5, E5, G5, D5, alpha, beta, ascale, bpower, named.store())) {
        if (named.store()) named.counted();
        return delta;
    }
#endif
    const Expr s = window_sum(I.context(), cast(E5.expr() * O5.expr() / D5.expr(), DType::Float32), I5.shape(), L);
    Expr r = E5.expr() * power(D5.expr(), Expr(-bpower)) - Expr(2.0 * ascale * bpower) * I5.expr() * s;
    if (alpha != 1) r = Expr(alpha) * r;
    if (beta != 0) r = r + Expr(beta) * G5.expr();
    G5.assign(r);
    return delta;
}

} // namespace kiln
