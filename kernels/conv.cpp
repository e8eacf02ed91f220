// conv_layer / deconv_layer / fprop_conv / bprop_conv / update_conv: the layer's geometry and
// the operand checks, then im2col (or its transpose, col2im, for the gradient with respect to
// the input), the product through compound_dot, and the epilogue (the GEMM's, or one JIT
// expression); on CUDA contexts the implicit-GEMM kernels first, where they take the layer (a
// strided gradient with respect to the input as one stride-1 convolution per phase, a strided
// first layer with its stride folded into its channels). CPU contexts build the patch matrix
// with host loops over float32 copies, CUDA contexts in the operands' dtype. See kiln/conv.hpp for
// the semantics.
#include <kiln/conv.hpp>

#include "kernels/conv_views.hpp"
#include "compiler/log.hpp"
#include "ir/error.hpp"
#include "ir/storage.hpp"
#include "kernels/hist_named.hpp"
#include "runtime/bench.hpp"
#include <kiln/context.hpp>
#include <kiln/gemm.hpp>

#ifdef KILN_HAVE_GEMM_KERNELS
#include "kernels/cuda/conv_cuda.hpp"
#include "kernels/cuda/conv_params.hpp"   // kAfterSibling, kBeforeSibling
#include "kernels/cuda/conv_select.hpp"
#endif

#include <algorithm>
#include <cstring>

namespace kiln {

namespace {

std::string desc(const Tensor& t) { return fmt::format("{} {}", dtype_name(t.dtype()), shape_str(t.shape())); }

std::string dims_str(const Dims3& d) { return fmt::format("{}x{}x{}", d[0], d[1], d[2]); }

// Output size along one axis, or a clear error.
int64_t out_size(int64_t in, int64_t f, int64_t pad, int64_t str, int64_t dil, const char* axis, const char* op) {
    const int64_t span = dil * (f - 1) + 1, padded = in + 2 * pad;
    if (padded < span)
        fail(Error::Kind::Value,
             "{}: along {} the padded input ({} + 2 x {} = {}) is smaller than the dilated filter ({} x ({} - 1) + 1 = {}): "
             "no output position fits",
             op, axis, in, pad, padded, dil, f, span);
    return (padded - span) / str + 1;
}

constexpr const char* kAxes[3] = {"depth", "height", "width"};

// A layer's dtype and geometry (conv_layer, deconv_layer).
void check_geometry(DType dtype, int64_t N, int64_t C, int64_t K, const Dims3& image, const Dims3& filter, const Dims3& pad,
                    const Dims3& stride, const Dims3& dilation, const char* image_name, const char* op) {
    if (!is_float(dtype) || dtype == DType::Float64)
        fail(Error::Kind::Type, "{}: dtype {}; convolution runs in float32, float16 or bfloat16", op, dtype_name(dtype));
    if (N < 1 || C < 1 || K < 1)
        fail(Error::Kind::Value, "{}: N={}, C={}, K={}: the batch and both channel counts must be at least 1", op, N, C, K);
    if (N > kMaxLayerDim || C > kMaxLayerDim || K > kMaxLayerDim)
        fail(Error::Kind::Value, "{}: N={}, C={}, K={}: the batch and the channel counts are at most 2^31 - 1 ({})", op, N,
             C, K, kMaxLayerDim);
    for (int a = 0; a < 3; ++a) {
        if (image[a] < 1 || filter[a] < 1)
            fail(Error::Kind::Value, "{}: {} {} and filter {} (depth x height x width): every size must be at least 1", op,
                 image_name, dims_str(image), dims_str(filter));
        if (pad[a] < 0 || stride[a] < 1 || dilation[a] < 1)
            fail(Error::Kind::Value,
                 "{}: along {} pad={}, stride={}, dilation={}: padding must be >= 0, stride and dilation >= 1", op, kAxes[a],
                 pad[a], stride[a], dilation[a]);
        if (image[a] > kMaxLayerDim || filter[a] > kMaxLayerDim || pad[a] > kMaxLayerDim || stride[a] > kMaxLayerDim ||
            dilation[a] > kMaxLayerDim)
            fail(Error::Kind::Value,
                 "{}: along {} {} size={}, filter={}, pad={}, stride={}, dilation={}: each is at most 2^31 - 1 ({})", op,
                 kAxes[a], image_name, image[a], filter[a], pad[a], stride[a], dilation[a], kMaxLayerDim);
    }
}

// The layer's tensors (input, filter, output) within kiln's element limit (check_shape).
void check_layer_shapes(const ConvLayer& L, const char* op) {
    check_shape(L.input_shape(), op);
    check_shape(L.filter_shape(), op);
    check_shape(L.output_shape(), op);
}

// The layout of a conv-space activation (N, D, H, W, channels) as the tensor gives it: the
// full 5-D shape, or without depth for a layer of spatial rank <= 2, or without depth and height
// for rank 1.
Shape activation_shape(int rank, int64_t n, const Dims3& sp, int64_t ch) {
    if (rank == 1) return {n, sp[2], ch};
    if (rank == 2) return {n, sp[1], sp[2], ch};
    return {n, sp[0], sp[1], sp[2], ch};
}

bool matches(const Tensor& t, int rank, int64_t n, const Dims3& sp, int64_t ch) {
    if (t.shape() == Shape{n, sp[0], sp[1], sp[2], ch}) return true;
    return t.rank() < 5 && t.rank() >= rank + 2 && t.shape() == activation_shape(t.rank() - 2, n, sp, ch);
}

void check_tensor(const Tensor& t, const ConvLayer& L, const Tensor& ref, int64_t n, const Dims3& sp, int64_t ch,
                  const char* name, bool operand, const char* op) {
    if (!t.defined()) fail(Error::Kind::Value, "{}: {} is an empty kiln::Tensor", op, name);
    if (!ref.context().can_use(t))
        fail(Error::Kind::Value, "{}: {} lives on {} of another context, but the operation runs on {}", op, name,
             t.context().device_name(), ref.context().device_name());
    if (!is_float(t.dtype()) || t.dtype() == DType::Float64)
        fail(Error::Kind::Type, "{}: {} is {}; convolution tensors are float32, float16 or bfloat16", op, name, desc(t));
    if (operand && t.dtype() != L.dtype)
        fail(Error::Kind::Type, "{}: {} is {}, but the layer was made for {}: operands must have the layer's dtype", op, name,
             desc(t), dtype_name(L.dtype));
    if (!matches(t, L.spatial_rank(), n, sp, ch)) {
        std::string ok = shape_str(Shape{n, sp[0], sp[1], sp[2], ch});
        for (int r = L.spatial_rank(); r < 3; ++r) ok += " or " + shape_str(activation_shape(r, n, sp, ch));
        fail(Error::Kind::Value, "{}: {} is {}; for layer {} it must be {}", op, name, desc(t), L.str(), ok);
    }
}

void check_filter(const Tensor& F, const ConvLayer& L, const Tensor& ref, const char* op) {
    // The filter has the activations' form with K in place of N and C as channels.
    check_tensor(F, L, ref, L.K, L.filter, L.C, "F (the filter, K x T x R x S x C)", true, op);
}

void check_vector(const Tensor& v, const Tensor& ref, int64_t ch, const char* name, const char* op) {
    if (!v.defined()) fail(Error::Kind::Value, "{}: {} is an empty kiln::Tensor", op, name);
    if (!ref.context().can_use(v))
        fail(Error::Kind::Value, "{}: {} lives on {} of another context, but the operation runs on {}", op, name,
             v.context().device_name(), ref.context().device_name());
    if (!is_float(v.dtype())) fail(Error::Kind::Type, "{}: {} is {}; it must be a float tensor", op, name, desc(v));
    if (v.shape() != Shape{ch} && v.shape() != Shape{ch, 1})
        fail(Error::Kind::Value, "{}: {} is {}; it holds one value per output channel: ({},) or ({}, 1)", op, name, desc(v),
             ch, ch);
}

void check_options(const ConvOptions& o, const Tensor& out, int64_t ch, const char* op) {
    if (o.slope != 0 && !o.relu && !o.brelu)
        fail(Error::Kind::Value, "{}: slope={} is the (backward) leaky ReLU's slope and needs relu or brelu", op, o.slope);
    if (o.X) {
        if (!o.X->defined()) fail(Error::Kind::Value, "{}: X is an empty kiln::Tensor", op);
        if (!out.context().can_use(*o.X) || o.X->shape() != out.shape() || !is_float(o.X->dtype()))
            fail(Error::Kind::Value, "{}: X is {}; it must be a float tensor of the output's shape {} and context", op,
                 desc(*o.X), shape_str(out.shape()));
    }
    if (o.bias) check_vector(*o.bias, out, ch, "bias", op);
    if (o.bsum) check_vector(*o.bsum, out, ch, "bsum", op);
}

// A float32, contiguous copy of t (t itself when it is one already), and its first element.
struct HostF32 {
    Tensor t;
    const float* p = nullptr;
};
HostF32 host_f32(const Tensor& x) {
    Context& ctx = x.context();
    Tensor y = x;
    if (y.dtype() != DType::Float32) y = ctx.eval(cast(y.expr(), DType::Float32));
    if (!y.is_contiguous()) y = ctx.eval(y.expr());
    return {y, static_cast<const float*>(y.view().storage->data) + y.offset()};
}

float* data_of(Tensor& t) { return static_cast<float*>(t.view().storage->data) + t.offset(); }

// The convolution's geometry in plain numbers (conv space: D, H, W in; M, P, Q out).
struct Geo {
    int64_t N, C, K, D, H, W, T, R, S, M, P, Q;
    int64_t pd, ph, pw, sd, sh, sw, dd, dh, dw;
    int64_t rows() const { return N * M * P * Q; }   // output positions
    int64_t taps() const { return T * R * S * C; }   // a column of the filter
};
Geo geo(const ConvLayer& L) {
    return {L.N, L.C, L.K, L.image[0], L.image[1], L.image[2], L.filter[0], L.filter[1], L.filter[2], L.output[0],
            L.output[1], L.output[2], L.pad[0], L.pad[1], L.pad[2], L.stride[0], L.stride[1], L.stride[2],
            L.dilation[0], L.dilation[1], L.dilation[2]};
}

// Calls f(row - first, tap, input offset) for every output position `row` in [first, end) and
// filter tap that lands inside the image (the padding reads zeros); offsets are of the first
// channel.
template <class F>
void each_tap(const Geo& g, int64_t first, int64_t end, F&& f) {
    for (int64_t row = first; row < end; ++row) {
        const int64_t q = row % g.Q, p = row / g.Q % g.P, m = row / (g.Q * g.P) % g.M, n = row / (g.Q * g.P * g.M);
        for (int64_t t = 0; t < g.T; ++t) {
            const int64_t d = m * g.sd - g.pd + t * g.dd;
            if (d < 0 || d >= g.D) continue;
            for (int64_t r = 0; r < g.R; ++r) {
                const int64_t h = p * g.sh - g.ph + r * g.dh;
                if (h < 0 || h >= g.H) continue;
                for (int64_t s = 0; s < g.S; ++s) {
                    const int64_t w = q * g.sw - g.pw + s * g.dw;
                    if (w < 0 || w >= g.W) continue;
                    f(row - first, ((t * g.R + r) * g.S + s) * g.C, (((n * g.D + d) * g.H + h) * g.W + w) * g.C);
                }
            }
        }
    }
}

// The CPU's patch matrix is made and multiplied at most this many bytes at a time (a block of
// output positions): with a long filter it is many times the image (a 32768-tap 1-D filter over
// 65536 samples: 4.3 GB at once).
constexpr int64_t kCpuColumnsBytes = int64_t(64) << 20;
int64_t rows_per_block(const Geo& g) { return std::max<int64_t>(1, kCpuColumnsBytes / (4 * g.taps())); }

// cols (end - first x taps): row i holds the image patch output position first + i reads.
Tensor im2col(const Geo& g, const HostF32& in, Context& ctx, int64_t first, int64_t end) {
    Tensor cols = ctx.zeros({end - first, g.taps()}, DType::Float32);
    float* c = data_of(cols);
    const size_t bytes = sizeof(float) * (size_t)g.C;
    each_tap(g, first, end, [&](int64_t row, int64_t tap, int64_t at) { std::memcpy(c + row * g.taps() + tap, in.p + at, bytes); });
    return cols;
}

// Adds every entry of cols (the patch matrix's rows first..end) into `image` (float32, N D H W
// C) at the position it was read from.
void col2im_add(const Geo& g, const Tensor& cols, int64_t first, int64_t end, float* image) {
    const float* c = static_cast<const float*>(cols.view().storage->data) + cols.offset();
    each_tap(g, first, end, [&](int64_t row, int64_t tap, int64_t at) {
        const float* src = c + row * g.taps() + tap;
        for (int64_t k = 0; k < g.C; ++k) image[at + k] += src[k];
    });
}

// t's elements in shape s: a view where one exists, else a copy.
Tensor reshaped(const Tensor& t, const Shape& s) {
    auto v = t.reshape_view(s);
    return v ? *v : t.reshape(s);
}
Tensor as_matrix(const Tensor& t, int64_t rows, int64_t cols) { return reshaped(t, {rows, cols}); }

// The product's operands on a CUDA context: the tensors' own dtype (the GEMM kernels compute
// 16-bit operands with float32 accumulation); im2col and col2im by the precompiled kernels
// (kernels/cuda/im2col.cu), or in a build without them as strided JIT copies, one per filter
// tap. Every tap's copy moves a whole (N, M, P, Q, C) block, so the number of kernels is the
// filter's size, not the image's.

// A layer whose filter is one tap that reads every input position once, in order: im2col is
// the input itself, col2im the identity.
bool pointwise(const Geo& g) {
    return g.T * g.R * g.S == 1 && g.pd + g.ph + g.pw == 0 && g.sd * g.sh * g.sw == 1;
}

// t (an accepted activation layout of n x sp x ch) as (n, d, h, w, ch): a view when it can be.
Tensor as5(const Tensor& t, int64_t n, const Dims3& sp, int64_t ch) { return reshaped(t, {n, sp[0], sp[1], sp[2], ch}); }

// The positions tap (t, r, s) of every output position reads, in a padded (N, D', H', W', C)
// tensor: an (N, M, P, Q, C) view.
Tensor tap_view(const Tensor& padded, const Geo& g, int64_t t, int64_t r, int64_t s) {
    auto along = [](int64_t first, int64_t count, int64_t step) {
        return Slice::range(first, first + step * (count - 1) + 1, step);
    };
    return padded.slice({Slice::all(), along(t * g.dd, g.M, g.sd), along(r * g.dh, g.P, g.sh), along(s * g.dw, g.Q, g.sw),
                         Slice::all()});
}

Tensor inner_view(const Tensor& padded, const Geo& g) {
    return padded.slice({Slice::all(), Slice::range(g.pd, g.pd + g.D), Slice::range(g.ph, g.ph + g.H),
                         Slice::range(g.pw, g.pw + g.W), Slice::all()});
}

} // namespace

namespace detail {

Tensor im2col_views(const ConvLayer& L, const Tensor& I5) {
    const Geo g = geo(L);
    Context& ctx = I5.context();
    if (pointwise(g)) {
        const Tensor x = I5.is_contiguous() ? I5 : ctx.eval(I5.expr());
        return as_matrix(x, g.rows(), g.C);
    }
    Tensor padded = I5;
    if (g.pd + g.ph + g.pw > 0) {
        padded = ctx.zeros({g.N, g.D + 2 * g.pd, g.H + 2 * g.ph, g.W + 2 * g.pw, g.C}, I5.dtype());
        inner_view(padded, g).assign(I5.expr());
    }
    Tensor cols = ctx.empty({g.N, g.M, g.P, g.Q, g.taps()}, I5.dtype());
    for (int64_t t = 0, tap = 0; t < g.T; ++t)
        for (int64_t r = 0; r < g.R; ++r)
            for (int64_t s = 0; s < g.S; ++s, tap += g.C)
                cols.slice({Slice::all(), Slice::all(), Slice::all(), Slice::all(), Slice::range(tap, tap + g.C)})
                    .assign(tap_view(padded, g, t, r, s).expr());
    return as_matrix(cols, g.rows(), g.taps());
}

Tensor col2im_views(const ConvLayer& L, const Tensor& dcols) {
    const Geo g = geo(L);
    Context& ctx = dcols.context();
    const Tensor d5 = as5(dcols, g.N, {g.M, g.P, g.Q}, g.taps());
    if (pointwise(g)) return d5;
    // Taps whose windows overlap add into the same positions: one accumulating copy per tap.
    Tensor padded = ctx.zeros({g.N, g.D + 2 * g.pd, g.H + 2 * g.ph, g.W + 2 * g.pw, g.C}, DType::Float32);
    for (int64_t t = 0, tap = 0; t < g.T; ++t)
        for (int64_t r = 0; r < g.R; ++r)
            for (int64_t s = 0; s < g.S; ++s, tap += g.C) {
                Tensor v = tap_view(padded, g, t, r, s);
                v.assign(v.expr() +
                         d5.slice({Slice::all(), Slice::all(), Slice::all(), Slice::all(), Slice::range(tap, tap + g.C)})
                             .expr());
            }
    return inner_view(padded, g);
}

} // namespace detail

namespace {

bool on_gpu(const Tensor& t) { return t.context().backend() == Backend::CUDA; }

// With stride 1 on every axis, the gradient of L with respect to its input is the convolution of
// the output's gradient (K channels, size M x P x Q) with the filter flipped in space and K and C
// exchanged, padded by dil (f - 1) - pad per axis, which gives back D x H x W. Where the
// padding would be negative (pad beyond the dilated filter) it is not.
std::optional<ConvLayer> dgrad_as_conv(const ConvLayer& L) {
    Dims3 pad;
    for (int a = 0; a < 3; ++a) {
        if (L.stride[a] != 1) return std::nullopt;
        pad[a] = L.dilation[a] * (L.filter[a] - 1) - L.pad[a];
        if (pad[a] < 0) return std::nullopt;
    }
    return conv_layer(L.dtype, L.N, L.K, L.C, L.output, L.filter, pad, {1, 1, 1}, L.dilation);
}

// The gradient with respect to the input through the implicit-GEMM kernel: dgrad_as_conv's
// convolution, where its C output channels fill at least half of the kernel's narrowest tile
// (64 channels wide). A 3-channel first layer would leave 61 of each tile's 64 columns idle;
// the product E . F (as wide as the filter's taps) and col2im do its work without that (VGG-A's
// conv1 bprop: 3.1 ms through the kernel, cuDNN 0.55 ms).
constexpr int64_t kImplicitDgradMinChannels = 32;
std::optional<ConvLayer> implicit_dgrad(const ConvLayer& L) {
    if (L.C < kImplicitDgradMinChannels) return std::nullopt;
    return dgrad_as_conv(L);
}

#ifdef KILN_HAVE_GEMM_KERNELS
// A layer whose channels are not a multiple of 8 (a first layer's 3), which the implicit-GEMM
// kernel cannot take (its producer gathers 16-byte chunks of 8 channels of one tap), as the
// same layer over its channels padded with zeros to the next multiple of 8, where the kernel
// takes that and the padding at most multiplies the taps by 8/3 (3 channels up). The padded
// image costs one copy (8/3 of the image written); the patch matrix it replaces is T x R x S
// times the image, written and read back (ResNet-50's 7x7 first layer: 49 times). Where the
// padded filter is long the multiplies it adds cost more than that traffic: up to 4 k-tiles of
// 64 taps (VGG-A's 3x3 first layer, 2: 0.54 ms against im2col's 0.64 on the H200; AlexNet's
// 11x11, 16: 0.54 against 0.40; ResNet-50's 7x7, 7: 1.76 against 1.48).
constexpr int64_t kPaddedMaxTaps = 256;
std::optional<ConvLayer> channels_padded(Context& ctx, const ConvLayer& L) {
    const int64_t c8 = (L.C + 7) / 8 * 8;
    if (c8 == L.C || 3 * c8 > 8 * L.C || geo(L).taps() / L.C * c8 > kPaddedMaxTaps ||
        !gemm::fold_fits(L.N, L.image, L.C, {0, 0, 0}, L.image, c8))
        return std::nullopt;
    ConvLayer P = L;   // (the convolution forward() runs: a deconvolution's is its bprop)
    P.C = c8;
    P.deconv = false;
    if (gemm::conv_fprop_kernel(ctx, P).empty()) return std::nullopt;
    return P;
}

// A layer whose channels are a multiple of 8 but not of 64 as the same layer over its channels
// padded to the next multiple of 64, whose patches TMA brings (conv_select.hpp's
// tma_padded_channels): for the update wherever the weight-gradient kernel then takes it, for
// fprop where the cost model puts the padded layer and its copy under the layer itself, and never
// where TMA brings the patches in halves (the padding only adds taps and a copy there).
std::optional<ConvLayer> channels_for_tma(Context& ctx, const ConvLayer& L, bool forward) {
    const int64_t c64 = gemm::tma_padded_channels(L);
    if (c64 == 0 || !gemm::fold_fits(L.N, L.image, L.C, {0, 0, 0}, L.image, c64)) return std::nullopt;
    if (forward && gemm::channel_halves(L)) return std::nullopt;
    ConvLayer P = L;
    P.C = c64;
    P.deconv = false;
    if (!forward) return gemm::conv_wgrad_kernel(ctx, P).empty() ? std::nullopt : std::optional<ConvLayer>(P);
    const std::optional<double> padded = gemm::conv_fprop_estimate_us(ctx, P), gathered = gemm::conv_fprop_estimate_us(ctx, L);
    if (!padded || !gathered || *padded + gemm::pad_copy_us(L, c64) >= *gathered || gemm::conv_fprop_kernel(ctx, P).empty())
        return std::nullopt;
    return P;
}

// x (n, D, H, W, C) with its channels padded with zeros to c: the fold of stride 1, one pass.
Tensor with_channels(const Tensor& x, int64_t c) {
    const Shape& s = x.shape();
    return gemm::fold_cuda(x, {1, 1, 1}, {0, 0, 0}, {s[1], s[2], s[3]}, c);
}

// A strided layer whose channels the kernels cannot take (not a multiple of 8: a first layer's
// 3) as a stride-1 convolution over its image folded into `channels` channels (space-to-depth,
// gemm::fold_cuda): along an axis of stride s each folded position holds s of the image's, and
// the folded filter ceil(f / s) taps of s phases each, zeros past f. Its taps stay near the
// layer's (AlexNet's 11x11 over 3 channels, stride 4: 3x3 over 48, 432 for 363) where padding
// the channels to 8 would multiply them by 8/3, its output is the layer's, and the kernels
// read its channels whole: fprop gathers them (AlexNet's conv1 on the H200: 0.17 ms, cuDNN
// 0.44), the update's and bprop's kernels want 64 and 32 (fold_channels). Dilation 1, a filter
// of more than one tap (a 1x1 filter's fold only adds channels), and a folded position's used
// channels at most kFoldPositionMaxBytes (the fold stages them in shared memory). (The zero taps past f meet
// image positions outside each window: an infinite input gives NaN where the layer's own
// windows would not read it.)
std::optional<ConvLayer> folded(const ConvLayer& L, int64_t channels) {
    const int64_t phases = L.stride[0] * L.stride[1] * L.stride[2];
    if (phases == 1 || L.C % 8 == 0 || phases * L.C > channels || geo(L).taps() == L.C ||
        phases * L.C * int64_t(dtype_size(L.dtype)) > gemm::kFoldPositionMaxBytes)
        return std::nullopt;
    Dims3 taps, positions;
    for (int a = 0; a < 3; ++a) {
        if (L.dilation[a] != 1) return std::nullopt;
        taps[a] = (L.filter[a] + L.stride[a] - 1) / L.stride[a];
        positions[a] = L.output[a] + taps[a] - 1;
    }
    if (!gemm::fold_fits(L.N, L.image, L.C, L.pad, positions, channels)) return std::nullopt;
    return conv_layer(L.dtype, L.N, channels, L.K, positions, taps, {0, 0, 0}, {1, 1, 1});
}

// The folded channels for an op: fprop's gather takes multiples of 8; the update's kernel reads
// its patches by TMA, 64 channels at a time; bprop's (the folded layer's gradient, whose output
// channels are these) fills its narrowest tile at 32 (implicit_dgrad).
enum class FoldFor { fprop, bprop, update };
int64_t fold_channels(const ConvLayer& L, FoldFor op) {
    const int64_t used = L.stride[0] * L.stride[1] * L.stride[2] * L.C;
    const int64_t m = op == FoldFor::update ? 64 : 8;
    return std::max<int64_t>((used + m - 1) / m * m, op == FoldFor::bprop ? kImplicitDgradMinChannels : 0);
}

// fprop's folded layer where the kernel takes it and it has no more taps than `padded`, the
// layer over its channels padded (channels_padded; a 1x1 filter of stride 2 folds into 4 times
// the channels).
std::optional<ConvLayer> fprop_folded(Context& ctx, const ConvLayer& L, const std::optional<ConvLayer>& padded) {
    const std::optional<ConvLayer> F = folded(L, fold_channels(L, FoldFor::fprop));
    if (!F || gemm::conv_fprop_kernel(ctx, *F).empty()) return std::nullopt;
    if (padded && geo(*padded).taps() < geo(*F).taps()) return std::nullopt;
    return F;
}

// A layer of stride 1 without padding or dilation along W whose C channels (a multiple of 8,
// under 64) times its S taps along W fill whole k-tiles of 64 (ResNet-50's folded first layer:
// 4x4 over 16 channels), as the layer over S C channels at each of its image's W - S + 1
// positions, position w's channels being pixels w..w+S-1's: a view of the image whose pixels
// overlap (gemm::ImageLayout), so that TMA brings its patches a tap of 64 channels at a time
// where the kernels would gather 16 bytes at a time (fprop) or need the channels padded to 64
// (the update). Its filter (K, T, R, 1, S C) is the layer's, KRSC.
struct TapsAsChannels {
    ConvLayer layer;
    gemm::ImageLayout layout;
};
std::optional<TapsAsChannels> taps_as_channels(Context& ctx, const ConvLayer& L) {
    const int64_t s = L.filter[2];
    if (L.deconv || s == 1 || L.stride[2] != 1 || L.dilation[2] != 1 || L.pad[2] != 0 || L.C % 8 != 0 || L.C >= 64 ||
        s * L.C % 64 != 0)
        return std::nullopt;
    const ConvLayer V = conv_layer(L.dtype, L.N, s * L.C, L.K, {L.image[0], L.image[1], L.image[2] - s + 1},
                                   {L.filter[0], L.filter[1], 1}, {L.pad[0], L.pad[1], 0}, {L.stride[0], L.stride[1], 1},
                                   {L.dilation[0], L.dilation[1], 1});
    if (!gemm::patches_by_tma(ctx, V)) return std::nullopt;   // (the gather reads dense pixels)
    return TapsAsChannels{V, {L.C, L.image[2] * L.C}};
}

// A layer of stride 1 along W whose channels the kernels cannot take (not a multiple of 8: a
// first layer's 3), as the same layer over its image with the W padding written out and the
// channels padded with zeros to C' (8, 16 or 32), and its filter with S' >= S taps of C'
// channels (zeros past S and C) so that S' C' fills k-tiles, read with its W taps as channels
// (taps_as_channels): the copy it needs replaces channels_padded's, and TMA brings whole
// k-tiles where the kernel would gather 16 bytes at a time. Of the C', S' that fill a k-tile
// row, the one with the smallest image; where its k-tiles are at most 3/2 of the gathered
// layer's, TMA's k-tile measured at about 0.57 of a gathered one (ResNet-50's first layer, 4
// k-tiles each way: 0.578 ms against 1.019 on the H200). VGG-A's 3x3 over 3: 3 k-tiles, not 2.
// The update takes it wherever it applies (ahead of im2col, or of the fold where the layer is
// strided along H or D); either only where op's kernel takes the view. As in folded(), the zero
// taps past S meet image positions outside each window: an infinite input gives NaN where the
// layer's windows would not read it.
struct PaddedTaps {
    ConvLayer padded;       // the layer over the written-out image (no W padding)
    TapsAsChannels taps;    // and how the kernels read it
};
std::optional<PaddedTaps> padded_taps(Context& ctx, const ConvLayer& L, FoldFor op) {
    const int64_t s = L.filter[2], pw = L.pad[2];
    if (L.deconv || dtype_size(L.dtype) != 2 || L.C % 8 == 0 || s == 1 || L.stride[2] != 1 || L.dilation[2] != 1)
        return std::nullopt;
    int64_t best_c = 0, best_s = 0;
    for (int64_t c : {8, 16, 32}) {
        if (c < L.C) continue;
        const int64_t taps = (s * c + 63) / 64 * 64 / c;   // S': the fewest taps of c channels >= S filling k-tiles
        if (!best_c || (L.image[2] + 2 * pw + taps - s) * c < (L.image[2] + 2 * pw + best_s - s) * best_c)
            best_c = c, best_s = taps;
    }
    if (!best_c) return std::nullopt;
    const int64_t rows = L.filter[0] * L.filter[1];
    const int64_t gathered = (rows * s * ((L.C + 7) / 8 * 8) + 63) / 64, view = rows * best_s * best_c / 64;
    if (op == FoldFor::fprop && 2 * view > 3 * gathered) return std::nullopt;
    const ConvLayer P = conv_layer(L.dtype, L.N, best_c, L.K, {L.image[0], L.image[1], L.image[2] + 2 * pw + best_s - s},
                                   {L.filter[0], L.filter[1], best_s}, {L.pad[0], L.pad[1], 0}, {L.stride[0], L.stride[1], 1},
                                   {L.dilation[0], L.dilation[1], 1});
    if (!gemm::fold_fits(L.N, L.image, L.C, {0, 0, pw}, P.image, best_c)) return std::nullopt;
    std::optional<TapsAsChannels> V = taps_as_channels(ctx, P);
    if (!V || (op == FoldFor::update ? gemm::conv_wgrad_kernel(ctx, V->layer) : gemm::conv_fprop_kernel(ctx, V->layer)).empty())
        return std::nullopt;
    return PaddedTaps{P, *V};
}
// L's image and filter as padded_taps' layer P wants them: the image's W padding written out and
// both padded with zeros to P's channels, the filter also to P's taps.
Tensor padded_taps_image(const ConvLayer& L, const ConvLayer& P, const Tensor& I5) {
    return gemm::fold_cuda(I5, {1, 1, 1}, {0, 0, L.pad[2]}, P.image, P.C);
}
Tensor padded_taps_filter(const Geo& g, const ConvLayer& P, const Tensor& filter) {
    return gemm::fold_cuda(as5(filter, g.K, {g.T, g.R, g.S}, g.C), {1, 1, 1}, {0, 0, 0}, P.filter, P.C);
}

// The image I5 (N, D, H, W, C) and the filter of L folded as the folded layer F wants them.
Tensor fold_image(const ConvLayer& L, const ConvLayer& F, const Tensor& I5) {
    return gemm::fold_cuda(I5, L.stride, L.pad, F.image, F.C);
}
Tensor fold_filter(const Geo& g, const ConvLayer& L, const ConvLayer& F, const Tensor& filter) {
    return gemm::fold_cuda(as5(filter, g.K, {g.T, g.R, g.S}, g.C), L.stride, {0, 0, 0}, F.filter, F.C);
}
#endif

// out = epilogue(A . B): the GEMM's own epilogue (alpha, bias, ReLU, beta) when it is the
// convolution's, else the product in float32 and the JIT epilogue. bsum sums the output's
// columns (its channels), which the GEMM's per-row sums are not: a JIT reduction after it.
// cols (rows x taps) and the filter as (K x taps), as the context's product wants them.
Tensor columns(const Geo& g, const ConvLayer& L, const Tensor& image5) {
    if (!on_gpu(image5)) return im2col(g, host_f32(image5), image5.context(), 0, g.rows());
#ifdef KILN_HAVE_GEMM_KERNELS
    if (!pointwise(g)) return gemm::im2col_cuda(L, image5);   // one kernel instead of a copy per tap
#endif
    return detail::im2col_views(L, image5);
}
// The image's gradient from the patch matrix's (float32) on a CUDA context: the precompiled
// kernel's one gathering pass where the library has it, else a JIT copy per tap. A one-tap
// filter (a strided 1x1) is one strided copy into zeros, which touches only the positions its
// tap reaches: ResNet-50's projections' bprop took 0.29-0.82 ms that way against 0.47-2.07 ms
// through the gathering kernel (every image element) or by phase (H200, 2026-11-30).
Tensor col2im_gpu(const ConvLayer& L, const Tensor& dcols) {
#ifdef KILN_HAVE_GEMM_KERNELS
    const Geo g = geo(L);
    if (!pointwise(g) && g.T * g.R * g.S > 1) return gemm::col2im_cuda(L, dcols);
#endif
    return detail::col2im_views(L, dcols);
}
Tensor matrix_of(const Tensor& t, int64_t rows, int64_t cols) {
    if (on_gpu(t)) return as_matrix(t.is_contiguous() ? t : t.context().eval(t.expr()), rows, cols);
    return as_matrix(host_f32(t).t, rows, cols);
}

// out = relu_slope(alpha * T + bias) [* brelu(X)] + beta * X: one JIT kernel. T is float32 in
// conv space; out any of the accepted shapes.
void epilogue(const Tensor& T, Tensor& out, const ConvOptions& o, int64_t ch) {
    const int r = out.rank();
    Expr e = reshape(T.expr(), out.shape());
    if (o.alpha != 1) e = Expr(o.alpha) * e;
    Shape per_channel(r, 1);
    per_channel[r - 1] = ch;
    if (o.bias) e = e + reshape(o.bias->expr(), per_channel);
    // ReLU keeps NaN (e < 0 is false for it) and takes -inf to zero; leaky ReLU keeps both.
    if (o.relu) e = o.slope == 0 ? where(less(e, 0.0), Expr(0.0), e) : where(greater(e, 0.0), e, e * o.slope);
    const Expr X = o.X ? o.X->expr() : out.expr();
    if (o.brelu) e = where(greater(X, 0.0), e, where(less(X, 0.0), e * o.slope, Expr(0.0)));
    if (o.beta != 0) e = e + Expr(o.beta) * X;
    out.assign(e);
}

// Whether the options map a zero gradient to zero and read nothing but the computed value
// (alpha, ReLU or leaky ReLU; no beta, bias or brelu): a gradient computed only where it is not
// zero can be finished there and the rest of the output set to zeros. (bsum is taken from the
// output afterwards.)
bool scattered(const ConvOptions& o) { return o.beta == 0 && !o.bias && !o.brelu; }

// into = t's sum over every axis but the channel (the last), added in float32.
void add_channels(const Tensor& t, Tensor into) {
    const int64_t ch = t.shape().back();
    into.assign(reshape(sum(cast(reshape(t.expr(), {t.size() / ch, ch}), DType::Float32), 0), into.shape()));
}

// bsum = the output's sum over every axis but the channel: its values as stored.
void channel_sums(const Tensor& out, const ConvOptions& o) {
    if (o.bsum) add_channels(out, *o.bsum);
}

bool same_view(const Tensor& a, const Tensor& b) {
    return a.view().storage == b.view().storage && a.offset() == b.offset() && a.shape() == b.shape() &&
           a.strides() == b.strides();
}

// The output as the (rows x ch) matrix the GEMM's epilogue writes, where that epilogue is the
// convolution's (no brelu, X the output itself).
std::optional<Tensor> fused_target(Tensor& out, const ConvOptions& o, int64_t rows, int64_t ch) {
    if (o.brelu || (o.X && !same_view(*o.X, out))) return std::nullopt;
    return out.reshape_view({rows, ch});
}

DotOptions dot_options(const ConvOptions& o, int64_t ch) {
    DotOptions d;
    d.alpha = o.alpha;
    d.beta = o.beta;
    d.relu = o.relu;
    d.slope = o.slope;
    if (o.bias) d.bias = reshaped(*o.bias, {ch});
    return d;
}

// out = epilogue(a product into the matrix C with the GEMM's epilogue d): `multiply(C, d,
// extras)` straight into the output where its epilogue is the convolution's (counting the
// output as it stores it, where the call counts it: `named`; bsum in its store path where it
// can), else into a float32 matrix with the JIT epilogue after it; then bsum where the store
// path did not add it up. multiply returns false where it declines.
template <class Multiply>
bool product_with(Tensor& out, const ConvOptions& o, int64_t rows, int64_t ch, NamedCount& named, Multiply&& multiply) {
    StoreExtras extras;
    if (auto c = fused_target(out, o, rows, ch)) {
        extras.count = named.store();
        extras.column_sums = o.bsum ? &*o.bsum : nullptr;
        if (!multiply(*c, dot_options(o, ch), extras)) return false;
        if (extras.counted) named.counted();
    } else {
        Tensor T = out.context().empty({rows, ch}, DType::Float32);
        if (!multiply(T, DotOptions{}, extras)) return false;
        epilogue(T, out, o, ch);
    }
    if (!extras.summed) channel_sums(out, o);
    return true;
}

void product(const Tensor& A, const Tensor& B, Tensor& out, const ConvOptions& o, int64_t ch, NamedCount& named) {
    product_with(out, o, A.shape()[0], ch, named, [&](Tensor& C, const DotOptions& d, StoreExtras& x) {
        compound_dot_extras(A, B, C, d, x);
        return true;
    });
}

// fprop of a convolution: out = epilogue(conv(I, F)).
void forward(const Geo& g, const ConvLayer& L, const Tensor& I5, const Tensor& F, Tensor& out, const ConvOptions& o,
             NamedCount& named) {
#ifdef KILN_HAVE_GEMM_KERNELS
    // The implicit-GEMM kernel where it takes the layer, or the layer with its stride folded into
    // its channels (fprop_folded), or over its channels padded with zeros to a multiple of 8
    // (channels_padded); the pointwise layers, whose matrix is the activations already, only
    // where pointwise_implicit prefers the kernel to the GEMM's tiles.
    auto implicit = [&](const ConvLayer& layer, const Tensor& I, const Tensor& W, gemm::ImageLayout layout = {}) {
        return product_with(out, o, g.rows(), g.K, named,
                            [&](Tensor& C, const DotOptions& d, StoreExtras& x) {
                                return gemm::conv_fprop_implicit(layer, I, W, C, d, &x, layout);
                            });
    };
    // Layer D over image I and filter W, read with its W taps as channels where the kernel takes that.
    auto with_taps = [&](const ConvLayer& D, const Tensor& I, const Tensor& W) {
        const std::optional<TapsAsChannels> V = taps_as_channels(I5.context(), D);
        return (V && implicit(V->layer, I, W, V->layout)) || implicit(D, I, W);
    };
    // The layer P over the image and filter with their channels padded with zeros to P's.
    auto padded = [&](const ConvLayer& P) {
        return implicit(P, with_channels(I5, P.C), with_channels(as5(F, g.K, {g.T, g.R, g.S}, g.C), P.C));
    };
    if (on_gpu(I5) && (!pointwise(g) || gemm::pointwise_implicit(I5.context(), L))) {
        if (auto V = taps_as_channels(I5.context(), L); V && implicit(V->layer, I5, F, V->layout)) return;
        if (auto T = !pointwise(g) ? channels_for_tma(I5.context(), L, true) : std::nullopt; T && padded(*T)) return;
        if (implicit(L, I5, F)) return;
        const std::optional<ConvLayer> P = channels_padded(I5.context(), L);
        if (auto D = fprop_folded(I5.context(), L, P); D && with_taps(*D, fold_image(L, *D, I5), fold_filter(g, L, *D, F)))
            return;
        if (auto T = P ? padded_taps(I5.context(), L, FoldFor::fprop) : std::nullopt;
            T && implicit(T->taps.layer, padded_taps_image(L, T->padded, I5), padded_taps_filter(g, T->padded, F), T->taps.layout))
            return;
        if (P && padded(*P)) return;
    }
#endif
    if (const int64_t block = rows_per_block(g); !on_gpu(I5) && !pointwise(g) && g.rows() > block) {
        log_debug("conv: fprop {} -> im2col+gemm, {} positions a block", L.str(), block);
        Context& ctx = I5.context();
        const HostF32 in = host_f32(I5);
        const Tensor Ft = matrix_of(F, g.K, g.taps()).T();
        Tensor T = ctx.empty({g.rows(), g.K}, DType::Float32);
        for (int64_t first = 0; first < g.rows(); first += block) {
            const int64_t end = std::min(g.rows(), first + block);
            Tensor rows = T.slice({Slice::range(first, end), Slice::all()});
            compound_dot(im2col(g, in, ctx, first, end), Ft, rows);
        }
        epilogue(T, out, o, g.K);
        channel_sums(out, o);
        return;
    }
    log_debug("conv: fprop {} -> {}", L.str(), pointwise(g) ? "gemm" : "im2col+gemm");
    product(columns(g, L, I5), matrix_of(F, g.K, g.taps()).T(), out, o, g.K, named);
}

#ifdef KILN_HAVE_GEMM_KERNELS
// The gradient with respect to the input of a strided layer as one stride-1 convolution per
// phase, the input positions congruent modulo the stride. Along an axis of stride s (dilation
// 1), input position s x' + phi receives the filter taps k0 + s j (j < J, k0 = (phi + pad) mod s)
// from output positions x' + a - j, a = (phi + pad - k0) / s: the convolution of E with those
// taps flipped, padded by J - 1 - a, cut to the phase's ceil((I - phi) / s) positions. An axis of
// stride 1 is one phase with the whole flipped filter and its dilation, as in dgrad_as_conv. A
// phase with no taps along some axis (k0 >= f) receives nothing. Strided axes with a dilation
// other than 1 are not split (none: the product and col2im take the layer).
struct DgradPhase {
    Dims3 phase{}, positions{}, first{}, taps{};
    std::optional<ConvLayer> layer;   // none where some axis has no taps
};
std::optional<std::vector<DgradPhase>> dgrad_phases(const ConvLayer& L) {
    // (A one-tap filter: strided_pointwise_dgrad, else the product and one strided copy.)
    if (L.C < kImplicitDgradMinChannels || L.filter[0] * L.filter[1] * L.filter[2] == 1) return std::nullopt;
    for (int a = 0; a < 3; ++a)
        if (L.stride[a] > 1 && L.dilation[a] != 1) return std::nullopt;
    std::vector<DgradPhase> out;
    for (int64_t pd = 0; pd < L.stride[0]; ++pd)
        for (int64_t ph = 0; ph < L.stride[1]; ++ph)
            for (int64_t pw = 0; pw < L.stride[2]; ++pw) {
                DgradPhase P;
                P.phase = {pd, ph, pw};
                Dims3 pad{}, dil{}, image_pad{};
                bool empty = false;
                for (int a = 0; a < 3; ++a) {
                    const int64_t s = L.stride[a], p = L.pad[a], f = L.filter[a], phi = P.phase[a];
                    P.positions[a] = L.image[a] > phi ? (L.image[a] - phi + s - 1) / s : 0;
                    if (P.positions[a] == 0) empty = true;
                    if (s == 1) {
                        P.first[a] = 0, P.taps[a] = f, dil[a] = L.dilation[a];
                        pad[a] = L.dilation[a] * (f - 1) - p;
                    } else {
                        P.first[a] = (phi + p) % s;
                        P.taps[a] = P.first[a] < f ? (f - P.first[a] + s - 1) / s : 0;
                        dil[a] = 1;
                        pad[a] = P.taps[a] - 1 - (phi + p - P.first[a]) / s;
                    }
                    image_pad[a] = dil[a] * std::max<int64_t>(P.taps[a] - 1, 0);
                }
                if (empty) continue;
                if (P.taps[0] > 0 && P.taps[1] > 0 && P.taps[2] > 0) {
                    // Built with a padding that makes its geometry valid, then given the phase's.
                    ConvLayer D = conv_layer(L.dtype, L.N, L.K, L.C, L.output, P.taps, image_pad, {1, 1, 1}, dil);
                    D.pad = pad;
                    D.output = P.positions;
                    P.layer = D;
                }
                out.push_back(P);
            }
    return out;
}

// dgrad_phases(L) where ctx's implicit-GEMM kernel takes every phase with taps, and some phase
// has taps (a gradient of no taps at all is zero: the product's path gives it); none otherwise.
std::optional<std::vector<DgradPhase>> implicit_phases(Context& ctx, const ConvLayer& L) {
    if (L.stride[0] * L.stride[1] * L.stride[2] == 1) return std::nullopt;
    std::optional<std::vector<DgradPhase>> phases = dgrad_phases(L);
    if (!phases || std::none_of(phases->begin(), phases->end(), [](const DgradPhase& P) { return P.layer.has_value(); }))
        return std::nullopt;
    for (const DgradPhase& P : *phases)
        if (P.layer && gemm::conv_fprop_kernel(ctx, *P.layer).empty()) return std::nullopt;
    return phases;
}

// The layers of the phases that have taps, in order (what the implicit kernel launches).
std::vector<ConvLayer> tap_layers(const std::vector<DgradPhase>& phases) {
    std::vector<ConvLayer> out;
    for (const DgradPhase& P : phases)
        if (P.layer) out.push_back(*P.layer);
    return out;
}

// For each set, F5's (K, T, R, S, C) taps base + step j (j < taps) along each axis, K and C
// exchanged: (C, taps, K). The precompiled transpose (filter_taps_cuda), every set in one launch,
// where F5 is 16-bit and contiguous with channels in multiples of 8, else a JIT copy each (whose
// reads along K are 2 bytes apart: a 512 x 3 x 3 x 512 filter took 18 us that way on the H100,
// the transpose 4.4 us). side_by_side: the transpose's sets side by side in one buffer
// (filter_taps_cuda), where it runs.
std::vector<Tensor> filter_taps(const Tensor& F5, const std::vector<gemm::TapSet>& sets, bool side_by_side = false) {
    const Shape& s = F5.shape();
    if (dtype_size(F5.dtype()) == 2 && F5.is_contiguous() && s[0] % 8 == 0 && s[4] % 8 == 0)
        return gemm::filter_taps_cuda(F5, sets, side_by_side);
    std::vector<Tensor> out;
    for (const gemm::TapSet& t : sets) {
        auto along = [&](int a) {
            const int64_t stop = t.base[a] + t.step[a] * t.taps[a];
            return Slice::range(t.base[a], stop >= 0 ? stop : Slice::kNone, t.step[a]);
        };
        out.push_back(F5.context().eval(
            F5.slice({Slice::all(), along(0), along(1), along(2), Slice::all()}).transpose({4, 1, 2, 3, 0}).expr()));
    }
    return out;
}

// The filter of dgrad_as_conv's convolution from F5 (K, T, R, S, C): flipped in space, K and C
// exchanged.
Tensor dgrad_filter(const Tensor& F5) {
    const Shape& s = F5.shape();
    return filter_taps(F5, {{{s[1], s[2], s[3]}, {s[1] - 1, s[2] - 1, s[3] - 1}, {-1, -1, -1}}}).front();
}

// The gradient of a stride-1 layer of at most 8 channels (a first layer's 3) as the convolution
// of E into those channels (dgrad_as_conv), where the narrow kernel (conv_narrow.cu) takes it:
// the implicit kernel would leave most of a 64-wide tile idle, the product and col2im write and
// read back the patch matrix's gradient.
std::optional<ConvLayer> narrow_dgrad(Context& ctx, const ConvLayer& L) {
    const std::optional<ConvLayer> D = L.C <= 8 ? dgrad_as_conv(L) : std::nullopt;
    if (!D || !gemm::narrow_takes(ctx, *D)) return std::nullopt;
    return D;
}

// bprop's folded layer (folded) and its gradient as a convolution, where the kernel takes that.
struct FoldedDgrad {
    ConvLayer folded, dgrad;
};
std::optional<FoldedDgrad> bprop_folded(Context& ctx, const ConvLayer& L) {
    const std::optional<ConvLayer> F = folded(L, fold_channels(L, FoldFor::bprop));
    const std::optional<ConvLayer> D = F ? implicit_dgrad(*F) : std::nullopt;
    if (!D || gemm::conv_fprop_kernel(ctx, *D).empty()) return std::nullopt;
    return FoldedDgrad{*F, *D};
}

// The gradient of a strided 1x1 layer without padding at the positions its taps reach, as the
// stride-1 1x1 convolution of E into C channels, where pointwise_implicit prefers the implicit
// kernel into a strided view: its rows are groups of one stride in the gradient (c_row), so it
// stores there directly, where the product wrote its rows and a copy moved them. (The rows
// group where the image's depth is whole strides and a depth stride covers whole strides of
// height, as with depth stride 1 and an even height under stride 2; an odd height leaves the
// product.)
std::optional<ConvLayer> strided_pointwise_dgrad(Context& ctx, const ConvLayer& L) {
    if (L.C < kImplicitDgradMinChannels || L.filter != Dims3{1, 1, 1} || L.pad != Dims3{0, 0, 0} ||
        L.stride == Dims3{1, 1, 1} || L.image[0] != L.output[0] * L.stride[0] ||
        L.stride[0] * L.image[1] != L.output[1] * L.stride[1])
        return std::nullopt;
    const ConvLayer D = conv_layer(L.dtype, L.N, L.K, L.C, L.output, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}, {1, 1, 1});
    if (!gemm::pointwise_implicit(ctx, D, true)) return std::nullopt;
    return D;
}

// The update's folded layer, where the weight-gradient kernel takes it: folded into fprop's
// channels and read with its W taps as channels (taps_as_channels: the kernel multiplies the
// channels used, not those padded to 64) where that fills k-tiles, else into 64 channels.
struct UpdateFolded {
    ConvLayer folded;                       // the layer whose filter's gradient is unfolded
    std::optional<TapsAsChannels> taps;     // how the kernel reads it, where not as itself
    const ConvLayer& kernel_layer() const { return taps ? taps->layer : folded; }
};
std::optional<UpdateFolded> update_folded(Context& ctx, const ConvLayer& L) {
    if (const std::optional<ConvLayer> F = folded(L, fold_channels(L, FoldFor::fprop))) {
        if (auto V = taps_as_channels(ctx, *F); V && !gemm::conv_wgrad_kernel(ctx, V->layer).empty())
            return UpdateFolded{*F, V};
    }
    const std::optional<ConvLayer> F = folded(L, fold_channels(L, FoldFor::update));
    if (!F || gemm::conv_wgrad_kernel(ctx, *F).empty()) return std::nullopt;
    return UpdateFolded{*F, std::nullopt};
}
#endif

// out = epilogue(the gradient of conv(I, F) with respect to I, from E).
void backward_data(const Geo& g, const ConvLayer& L, const Tensor& F, const Tensor& E5, Tensor& out,
                   const ConvOptions& o, NamedCount& named) {
#ifdef KILN_HAVE_GEMM_KERNELS
    // With stride 1 the gradient is itself a convolution (implicit_dgrad): the implicit-GEMM
    // kernel's, over the filter flipped in space with K and C exchanged (a small JIT copy); a
    // pointwise layer's where pointwise_implicit prefers it to the product E . F below.
    if (auto D = on_gpu(E5) ? implicit_dgrad(L) : std::nullopt;
        D && (pointwise(g) ? gemm::pointwise_implicit(E5.context(), *D) : !gemm::conv_fprop_kernel(E5.context(), *D).empty())) {
        const Tensor Fd = dgrad_filter(as5(F, g.K, {g.T, g.R, g.S}, g.C));
        if (product_with(out, o, g.N * g.D * g.H * g.W, g.C, named,
                         [&](Tensor& C, const DotOptions& d, StoreExtras& x) {
                             return gemm::conv_fprop_implicit(*D, E5, Fd, C, d, &x);
                         }))
            return;
    }
    if (auto D = on_gpu(E5) && !pointwise(g) ? narrow_dgrad(E5.context(), L) : std::nullopt) {
        const Tensor Fd = dgrad_filter(as5(F, g.K, {g.T, g.R, g.S}, g.C));
        if (product_with(out, o, g.N * g.D * g.H * g.W, g.C, named,
                         [&](Tensor& C, const DotOptions& d, StoreExtras&) {
                             return gemm::conv_narrow(*D, E5, Fd, C, d);
                         }))
            return;
    }
    // Strided: a stride-1 convolution per phase (implicit_phases) into a float32 gradient, each
    // into its strided view, then the epilogue; or, where the options touch only what the
    // phases compute (scattered), each phase's kernel applies them and rounds into out's dtype
    // in out's view. The kernel stores into the view itself where its rows are groups of one
    // stride (c_row), which saves writing the phase and copying it (ResNet-50's strided 3x3
    // layers: every phase).
    if (auto phases = on_gpu(E5) ? implicit_phases(E5.context(), L) : std::nullopt) {
        Context& ctx = E5.context();
        const Tensor E = E5.is_contiguous() ? E5 : ctx.eval(E5.expr());   // once, not once per phase
        const Tensor F5 = as5(F, g.K, {g.T, g.R, g.S}, g.C);
        // (A phase writes out before the next reads E and F: not where out shares their memory.)
        const bool apart = out.view().storage != E5.view().storage && out.view().storage != F.view().storage;
        const std::optional<Tensor> direct =
            scattered(o) && apart ? out.reshape_view({g.N, g.D, g.H, g.W, g.C}) : std::nullopt;
        Tensor grad = direct ? *direct : ctx.empty({g.N, g.D, g.H, g.W, g.C}, DType::Float32);
        DotOptions d;
        if (direct) d.alpha = o.alpha, d.relu = o.relu, d.slope = o.slope;
        auto view_of = [&](const DgradPhase& P) {
            auto along = [&](int a) {
                return Slice::range(P.phase[a], P.phase[a] + L.stride[a] * (P.positions[a] - 1) + 1, L.stride[a]);
            };
            return grad.slice({Slice::all(), along(0), along(1), along(2), Slice::all()});
        };
        // Straight into its view where the view's rows are groups of one stride (an even
        // image's phases: (N D' H') groups of W' rows), else through a copy.
        auto rows_of = [&](const DgradPhase& P) {
            const ConvLayer& D = *P.layer;
            return view_of(P).reshape_view({D.N * D.output[0] * D.output[1], D.output[2], g.C});
        };
        // The phases without taps get zeros first; where every other phase goes straight into
        // its view, they run in one launch (the phased walk) where it takes them, else their
        // launches follow one another, each started beside the one before (gemm::kAfterSibling,
        // kBeforeSibling).
        std::vector<std::pair<const DgradPhase*, std::optional<Tensor>>> launched;   // and its rows
        bool straight = true;
        for (const DgradPhase& P : *phases) {
            if (!P.layer) view_of(P).assign(Expr(0.0));
            else launched.emplace_back(&P, rows_of(P)), straight = straight && launched.back().second.has_value();
        }
        const std::vector<ConvLayer> layers = tap_layers(*phases);
        const bool one_launch = direct && straight && !gemm::conv_phased_kernel(ctx, layers).empty();
        // Each phase's taps, last first, with K and C exchanged: (C, taps, K), all in one launch
        // (for one launch of the phases, side by side).
        std::vector<gemm::TapSet> sets;
        for (const auto& [P, rows] : launched)
            sets.push_back({P->taps,
                            {P->first[0] + L.stride[0] * (P->taps[0] - 1), P->first[1] + L.stride[1] * (P->taps[1] - 1),
                             P->first[2] + L.stride[2] * (P->taps[2] - 1)},
                            {-L.stride[0], -L.stride[1], -L.stride[2]}});
        const std::vector<Tensor> phase_taps = filter_taps(F5, sets, one_launch);
        if (one_launch) {
            std::vector<Tensor> rows;
            for (const auto& [P, r] : launched) rows.push_back(*r);
            if (gemm::conv_dgrad_phased(layers, E, phase_taps, rows, d)) {
                channel_sums(out, o);
                return;
            }
        }
        for (size_t i = 0; i < launched.size(); ++i) {
            const DgradPhase& P = *launched[i].first;
            const Tensor& Fp = phase_taps[i];
            const ConvLayer& D = *P.layer;
            if (std::optional<Tensor>& rows = launched[i].second) {
                const uint32_t siblings = !straight ? 0u
                                                    : (i > 0 ? gemm::kAfterSibling : 0u) |
                                                          (i + 1 < launched.size() ? gemm::kBeforeSibling : 0u);
                KILN_CHECK_INTERNAL(gemm::conv_fprop_implicit(D, E, Fp, *rows, d, nullptr, {}, siblings),
                                    "bprop_conv: the implicit-GEMM kernel declined phase {} of {}", dims_str(P.phase), L.str());
                continue;
            }
            Tensor view = view_of(P);
            const int64_t groups = D.N * D.output[0] * D.output[1], per_group = D.output[2];
            Tensor T = ctx.empty({groups * per_group, g.C}, direct ? out.dtype() : DType::Float32);
            KILN_CHECK_INTERNAL(gemm::conv_fprop_implicit(D, E, Fp, T, d),
                                "bprop_conv: the implicit-GEMM kernel declined phase {} of {}", dims_str(P.phase), L.str());
            view.assign(reshape(T.expr(), view.shape()));
        }
        if (!direct) epilogue(grad, out, o, g.C);
        channel_sums(out, o);
        return;
    }
    // A strided first layer: the gradient of its folded layer (bprop_folded) with respect to the
    // folded image, a stride-1 convolution, unfolded into the image's shape; where the options
    // touch only what the kernel computes (scattered) it applies them in out's dtype and the
    // unfold writes out, else a float32 gradient and the epilogue.
    if (auto D = on_gpu(E5) && !pointwise(g) ? bprop_folded(E5.context(), L) : std::nullopt) {
        Context& ctx = E5.context();
        const ConvLayer& Fl = D->folded;
        const Tensor Fd = dgrad_filter(fold_filter(g, L, Fl, F));
        const bool direct = scattered(o) && out.is_contiguous();
        DotOptions d;
        if (direct) d.alpha = o.alpha, d.relu = o.relu, d.slope = o.slope;
        Tensor T = ctx.empty({Fl.N, Fl.image[0], Fl.image[1], Fl.image[2], Fl.C}, direct ? out.dtype() : DType::Float32);
        Tensor Tm = *T.reshape_view({Fl.N * Fl.image[0] * Fl.image[1] * Fl.image[2], Fl.C});
        KILN_CHECK_INTERNAL(gemm::conv_fprop_implicit(D->dgrad, E5, Fd, Tm, d),
                            "bprop_conv: the implicit-GEMM kernel declined the folded {}", Fl.str());
        Tensor grad = direct ? *out.reshape_view({g.N, g.D, g.H, g.W, g.C}) : ctx.empty({g.N, g.D, g.H, g.W, g.C}, DType::Float32);
        gemm::unfold_cuda(T, grad, L.stride, L.pad);
        if (!direct) epilogue(grad, out, o, g.C);
        channel_sums(out, o);
        return;
    }
#endif
    const Tensor Em = matrix_of(E5, g.rows(), g.K), Fm = matrix_of(F, g.K, g.taps());
    if (pointwise(g)) {
        log_debug("conv: bprop {} -> gemm", L.str());
        return product(Em, Fm, out, o, g.C, named);
    }
    Context& ctx = E5.context();
    // A strided 1x1 without padding on a GPU: the product's rows are the gradient at every
    // stride-th position, the rest zeros. Where the options touch only those (scattered), the
    // GEMM applies them and rounds into out's dtype, and its result goes into out's view.
    // The implicit kernel (strided_pointwise_dgrad) stores straight into the view where its rows
    // group (an even image) and out shares no memory with E and F, the other positions zeroed
    // first.
    if (on_gpu(E5) && g.T * g.R * g.S == 1 && L.pad == Dims3{0, 0, 0} && scattered(o))
        if (auto out5 = out.reshape_view({g.N, g.D, g.H, g.W, g.C})) {
            DotOptions d;
            d.alpha = o.alpha, d.relu = o.relu, d.slope = o.slope;
            auto along = [&](int a) { return Slice::range(0, L.stride[a] * (L.output[a] - 1) + 1, L.stride[a]); };
            Tensor view = out5->slice({Slice::all(), along(0), along(1), along(2), Slice::all()});
#ifdef KILN_HAVE_GEMM_KERNELS
            const bool apart = out.view().storage != E5.view().storage && out.view().storage != F.view().storage;
            const std::optional<ConvLayer> D = apart ? strided_pointwise_dgrad(ctx, L) : std::nullopt;
            if (auto rows = D ? view.reshape_view({g.N * L.output[0] * L.output[1], L.output[2], g.C}) : std::nullopt) {
                for (int64_t pd = 0; pd < L.stride[0]; ++pd)   // the positions no tap reaches
                    for (int64_t ph = 0; ph < L.stride[1]; ++ph)
                        for (int64_t pw = 0; pw < L.stride[2]; ++pw) {
                            const Dims3 phi{pd, ph, pw};
                            if (phi == Dims3{0, 0, 0} || pd >= g.D || ph >= g.H || pw >= g.W) continue;
                            auto from = [&](int a) { return Slice::range(phi[a], Slice::kNone, L.stride[a]); };
                            out5->slice({Slice::all(), from(0), from(1), from(2), Slice::all()}).assign(Expr(0.0));
                        }
                const Tensor E = E5.is_contiguous() ? E5 : ctx.eval(E5.expr());
                const Tensor Fp = dgrad_filter(as5(F, g.K, {1, 1, 1}, g.C));
                KILN_CHECK_INTERNAL(gemm::conv_fprop_implicit(*D, E, Fp, *rows, d),
                                    "bprop_conv: the implicit-GEMM kernel declined {}", D->str());
                channel_sums(out, o);
                return;
            }
#endif
            log_debug("conv: bprop {} -> gemm (into the strided view)", L.str());
            Tensor G = ctx.empty({g.rows(), g.C}, out.dtype());
            compound_dot(Em, Fm, G, d);
            out5->assign(Expr(0.0));
            view.assign(reshape(G.expr(), view.shape()));
            channel_sums(out, o);
            return;
        }
    log_debug("conv: bprop {} -> im2col+gemm", L.str());
    if (on_gpu(E5)) {
        // (Rows 16 bytes apart, so that the GEMM's epilogue stores whole vectors: a first layer's
        // 147 taps made it store one float at a time.)
        const int64_t ld = (g.taps() + 3) / 4 * 4;
        Tensor dcols = ctx.empty({g.rows(), ld}, DType::Float32).slice({Slice::all(), Slice::range(0, g.taps())});
        compound_dot(Em, Fm, dcols);
        epilogue(col2im_gpu(L, dcols), out, o, g.C);
    } else {
        Tensor image = ctx.zeros({g.N, g.D, g.H, g.W, g.C}, DType::Float32);
        const int64_t block = rows_per_block(g);
        for (int64_t first = 0; first < g.rows(); first += block) {
            const int64_t end = std::min(g.rows(), first + block);
            Tensor dcols = ctx.empty({end - first, g.taps()}, DType::Float32);
            compound_dot(Em.slice({Slice::range(first, end), Slice::all()}), Fm, dcols);
            col2im_add(g, dcols, first, end, data_of(image));
        }
        epilogue(image, out, o, g.C);
    }
    channel_sums(out, o);
}

// grad_F = alpha * (gradient of conv(I, F) with respect to F, from E) + beta * grad_F.
void backward_filter(const Geo& g, const ConvLayer& L, const Tensor& I5, const Tensor& E5, Tensor& grad_F, double alpha,
                     double beta, NamedCount& named) {
    Context& ctx = I5.context();
    DotOptions o;
    o.alpha = alpha;
    o.beta = beta;
    // grad_F = alpha * grad + beta * grad_F, grad a float32 gradient (K x taps, or of another
    // layer's kernel).
    auto finish = [&](const Tensor& grad) {
        const Expr e = reshape(grad.expr(), grad_F.shape());
        grad_F.assign(cast(beta == 0 ? e * alpha : e * alpha + grad_F.expr() * beta, grad_F.dtype()));
    };
#ifdef KILN_HAVE_GEMM_KERNELS
    // The implicit-GEMM weight gradient where it takes the layer (the pointwise layers' matrix
    // is the activations themselves: the GEMM below).
    if (on_gpu(I5) && !pointwise(g)) {
        bool counted = false;
        const std::optional<TapsAsChannels> V = taps_as_channels(ctx, L);   // (the same gradient, K x taps)
        if (auto v = grad_F.reshape_view({g.K, g.taps()});
            v && ((V && gemm::conv_wgrad_implicit(V->layer, I5, E5, *v, o, named.store(), &counted, V->layout)) ||
                  gemm::conv_wgrad_implicit(L, I5, E5, *v, o, named.store(), &counted))) {
            if (counted) named.counted();
            return;
        }
        // The float32 filter gradient (K, T', R', S', C') of another layer P, by the kernel reading
        // P as layer `as` over image I (`layout`: where I holds its pixels), or nothing where the
        // kernel declines.
        auto gradient_of = [&](const ConvLayer& P, const ConvLayer& as, const Tensor& I,
                               gemm::ImageLayout layout = {}) -> std::optional<Tensor> {
            Tensor G = ctx.empty({g.K, P.filter[0], P.filter[1], P.filter[2], P.C}, DType::Float32);
            Tensor Gm = *G.reshape_view({g.K, geo(P).taps()});
            if (!gemm::conv_wgrad_implicit(as, I, E5, Gm, DotOptions{}, nullptr, nullptr, layout)) return std::nullopt;
            return G;
        };
        // Channels a multiple of 8 but not of 64: the layer's over its channels padded to 64
        // (channels_for_tma), the gradient's first C channels taken.
        if (auto P = channels_for_tma(ctx, L, false)) {
            if (auto G = gradient_of(*P, *P, with_channels(I5, P->C))) {
                finish(G->slice({Slice::all(), Slice::all(), Slice::all(), Slice::all(), Slice::range(0, g.C)}));
                return;
            }
        }
        // A first layer of stride 1 along W: the filter gradient of padded_taps' layer, its first S
        // taps of C channels taken.
        if (auto T = padded_taps(ctx, L, FoldFor::update)) {
            if (auto G = gradient_of(T->padded, T->taps.layer, padded_taps_image(L, T->padded, I5), T->taps.layout)) {
                finish(G->slice({Slice::all(), Slice::all(), Slice::all(), Slice::range(0, g.S), Slice::range(0, g.C)}));
                return;
            }
        }
        // A strided first layer: its folded layer's filter gradient (update_folded), unfolded;
        // the product below where the kernel declines E (not 16-byte aligned).
        if (auto U = update_folded(ctx, L)) {
            if (auto G = gradient_of(U->folded, U->kernel_layer(), fold_image(L, U->folded, I5),
                                     U->taps ? U->taps->layout : gemm::ImageLayout{})) {
                Tensor unfolded = ctx.empty({g.K, g.T, g.R, g.S, g.C}, DType::Float32);
                gemm::unfold_cuda(*G, unfolded, L.stride, {0, 0, 0});
                finish(unfolded);
                return;
            }
        }
    }
#endif
    if (const int64_t block = rows_per_block(g); !on_gpu(I5) && !pointwise(g) && g.rows() > block) {
        log_debug("conv: update {} -> im2col+gemm, {} positions a block", L.str(), block);
        const HostF32 in = host_f32(I5);
        const Tensor Em = matrix_of(E5, g.rows(), g.K);
        Tensor G = ctx.empty({g.K, g.taps()}, DType::Float32);
        for (int64_t first = 0; first < g.rows(); first += block) {
            const int64_t end = std::min(g.rows(), first + block);
            DotOptions sum;
            sum.beta = first == 0 ? 0.0 : 1.0;   // each block's product added to the ones before
            compound_dot(Em.slice({Slice::range(first, end), Slice::all()}).T(), im2col(g, in, ctx, first, end), G, sum);
        }
        finish(G);
        return;
    }
    log_debug("conv: update {} -> {}", L.str(), pointwise(g) ? "gemm" : "im2col+gemm");
    const Tensor cols = columns(g, L, I5), Em = matrix_of(E5, g.rows(), g.K);
    if (auto v = grad_F.reshape_view({g.K, g.taps()})) {
        StoreExtras x{named.store()};
        compound_dot_extras(Em.T(), cols, *v, o, x);
        if (x.counted) named.counted();
        return;
    }
    Tensor tmp = ctx.empty({g.K, g.taps()}, grad_F.dtype());
    if (beta != 0) tmp.assign(reshape(grad_F.expr(), {g.K, g.taps()}));
    compound_dot(Em.T(), cols, tmp, o);
    grad_F.assign(reshape(tmp.expr(), grad_F.shape()));
}

} // namespace

int ConvLayer::spatial_rank() const {
    if (image[0] > 1 || filter[0] > 1 || pad[0] > 0 || output[0] > 1) return 3;
    if (image[1] > 1 || filter[1] > 1 || pad[1] > 0 || output[1] > 1) return 2;
    return 1;
}

Shape ConvLayer::input_shape() const {
    return deconv ? activation_shape(spatial_rank(), N, output, K) : activation_shape(spatial_rank(), N, image, C);
}
Shape ConvLayer::filter_shape() const { return activation_shape(spatial_rank(), K, filter, C); }
Shape ConvLayer::output_shape() const {
    return deconv ? activation_shape(spatial_rank(), N, image, C) : activation_shape(spatial_rank(), N, output, K);
}

double ConvLayer::flops() const {
    return 2.0 * (double)N * (double)K * (double)C * (double)(output[0] * output[1] * output[2]) *
           (double)(filter[0] * filter[1] * filter[2]);
}

std::string ConvLayer::str() const {
    return fmt::format("{}({} N={} C={} K={} image {} filter {} output {} pad {} stride {} dilation {})",
                       deconv ? "deconv_layer" : "conv_layer", dtype_name(dtype), N, C, K, dims_str(image),
                       dims_str(filter), dims_str(output), dims_str(pad), dims_str(stride), dims_str(dilation));
}

ConvLayer conv_layer(DType dtype, int64_t N, int64_t C, int64_t K, Dims3 image, Dims3 filter, Dims3 pad, Dims3 stride,
                     Dims3 dilation) {
    const char* op = "conv_layer";
    check_geometry(dtype, N, C, K, image, filter, pad, stride, dilation, "image", op);
    ConvLayer L;
    L.dtype = dtype;
    L.N = N, L.C = C, L.K = K;
    L.image = image, L.filter = filter, L.pad = pad, L.stride = stride, L.dilation = dilation;
    for (int a = 0; a < 3; ++a) L.output[a] = out_size(image[a], filter[a], pad[a], stride[a], dilation[a], kAxes[a], op);
    check_layer_shapes(L, op);
    return L;
}

ConvLayer deconv_layer(DType dtype, int64_t N, int64_t C, int64_t K, Dims3 input, Dims3 filter, Dims3 pad, Dims3 stride,
                       Dims3 dilation) {
    const char* op = "deconv_layer";
    check_geometry(dtype, N, C, K, input, filter, pad, stride, dilation, "input", op);
    ConvLayer L;
    L.dtype = dtype;
    L.N = N, L.C = C, L.K = K;
    L.output = input, L.filter = filter, L.pad = pad, L.stride = stride, L.dilation = dilation;
    L.deconv = true;
    for (int a = 0; a < 3; ++a) {
        // (At most 2^62 + 2^62: check_geometry's bounds keep it inside int64.)
        const int64_t size = (input[a] - 1) * stride[a] - 2 * pad[a] + dilation[a] * (filter[a] - 1) + 1;
        if (size < 1)
            fail(Error::Kind::Value, "{}: along {} the output size ({} - 1) x {} - 2 x {} + {} x ({} - 1) + 1 = {} is below 1",
                 op, kAxes[a], input[a], stride[a], pad[a], dilation[a], filter[a], size);
        L.image[a] = size;
    }
    check_layer_shapes(L, op);
    return L;
}

namespace {
// fprop and bprop move data through the layer one way or the other: the convolution itself
// (conv's fprop, deconv's bprop) or its gradient with respect to its input (conv's bprop,
// deconv's fprop), then the epilogue into `out`.
Tensor& data_pass(const ConvLayer& L, const Tensor& F, const Tensor& in, Tensor& out, const ConvOptions& opts,
                  bool convolve, const char* in_short, const char* in_name, const char* out_name, const char* op) {
    if (!in.defined()) fail(Error::Kind::Value, "{}: {} is an empty kiln::Tensor", op, in_short);
    const Dims3& in_sp = convolve ? L.image : L.output;
    const Dims3& out_sp = convolve ? L.output : L.image;
    const int64_t in_ch = convolve ? L.C : L.K, out_ch = convolve ? L.K : L.C;
    check_tensor(in, L, in, L.N, in_sp, in_ch, in_name, true, op);
    check_filter(F, L, in, op);
    check_tensor(out, L, in, L.N, out_sp, out_ch, out_name, false, op);
    check_options(opts, out, out_ch, op);
    NamedCount named(out.context(), out);
    BenchTimer bench(context_impl(in.context()), op);
    if (bench.on())
        bench.set(fmt::format("{} {}", dtype_name(in.dtype()), L.str()),
                  view_bytes(in.view()) + view_bytes(F.view()) + view_bytes(out.view()), L.flops());
    const Geo g = geo(L);
    const Tensor in5 = as5(in, L.N, in_sp, in_ch);
    if (convolve) forward(g, L, in5, F, out, opts, named);
    else backward_data(g, L, F, in5, out, opts, named);
    return out;
}
} // namespace

Tensor& fprop_conv(const ConvLayer& L, const Tensor& I, const Tensor& F, Tensor& O, const ConvOptions& opts) {
    return data_pass(L, F, I, O, opts, !L.deconv, "I", "I (the input)", "O (the output)", "fprop_conv");
}

Tensor& bprop_conv(const ConvLayer& L, const Tensor& F, const Tensor& E, Tensor& grad_I, const ConvOptions& opts) {
    return data_pass(L, F, E, grad_I, opts, L.deconv, "E", "E (the output's gradient)", "grad_I (the input's gradient)",
                     "bprop_conv");
}

// conv: grad_F from the input I and the output's gradient E; deconv: the same with the
// convolution's roles (its input is the deconvolution's E).
Tensor& update_conv(const ConvLayer& L, const Tensor& I, const Tensor& E, Tensor& grad_F, double alpha, double beta,
                    const std::optional<Tensor>& grad_bias) {
    const char* op = "update_conv";
    if (!I.defined()) fail(Error::Kind::Value, "{}: I is an empty kiln::Tensor", op);
    const Dims3& in_sp = L.deconv ? L.output : L.image;
    const Dims3& e_sp = L.deconv ? L.image : L.output;
    const int64_t in_ch = L.deconv ? L.K : L.C, e_ch = L.deconv ? L.C : L.K;
    check_tensor(I, L, I, L.N, in_sp, in_ch, "I (the input)", true, op);
    check_tensor(E, L, I, L.N, e_sp, e_ch, "E (the output's gradient)", true, op);
    check_tensor(grad_F, L, I, L.K, L.filter, L.C, "grad_F (the filter's gradient, K x T x R x S x C)", false, op);
    if (grad_bias) check_vector(*grad_bias, E, e_ch, "grad_bias", op);
    NamedCount named(grad_F.context(), grad_F);
    BenchTimer bench(context_impl(I.context()), op);
    if (bench.on())
        bench.set(fmt::format("{} {}", dtype_name(I.dtype()), L.str()),
                  view_bytes(I.view()) + view_bytes(E.view()) + view_bytes(grad_F.view()), L.flops());
    const Geo g = geo(L);
    const Tensor I5 = as5(I, L.N, in_sp, in_ch), E5 = as5(E, L.N, e_sp, e_ch);
    if (L.deconv) backward_filter(g, L, E5, I5, grad_F, alpha, beta, named);
    else backward_filter(g, L, I5, E5, grad_F, alpha, beta, named);
    if (grad_bias) add_channels(E, *grad_bias);
    return grad_F;
}

std::string conv_kernel(Context& ctx, const ConvLayer& L, const std::string& op) {
    if (op != "fprop" && op != "fprop+bsum" && op != "bprop" && op != "update")
        fail(Error::Kind::Value, "conv_kernel: op '{}'; it is 'fprop', 'fprop+bsum', 'bprop' or 'update'", op);
    const Geo g = geo(L);
#ifdef KILN_HAVE_GEMM_KERNELS
    // The kernel conv_fprop_implicit launches for layer X on this op's forward path ("fprop+bsum":
    // adding the channel sums, which the 256-wide walk does in an entry of its own).
    // (plain_rows false: into a strided gradient's view, rows in groups.)
    auto fprop_kernel = [&](const ConvLayer& X, bool plain_rows = true) {
        return gemm::conv_fprop_kernel(ctx, X, op == "fprop+bsum", plain_rows);
    };
    if (pointwise(g)) {   // the GEMM, or where pointwise_implicit says so the implicit kernel
        const std::optional<ConvLayer> D = op == "update" ? std::nullopt
                                           : (op != "bprop") != L.deconv ? std::optional<ConvLayer>(L)
                                                                         : implicit_dgrad(L);
        return D && gemm::pointwise_implicit(ctx, *D) ? "implicit-gemm " + fprop_kernel(*D) : "gemm";
    }
    auto folded_name = [](const std::string& kernel, const ConvLayer& F, bool taps) {
        return fmt::format("implicit-gemm {} (stride folded into {} channels{})", kernel, F.C,
                           taps ? ", W taps as channels" : "");
    };
    auto taps_name = [](const std::string& kernel, const ConvLayer& P) {
        return fmt::format("implicit-gemm {} (W padding written out, {} taps of {} channels, W taps as channels)", kernel,
                           P.filter[2], P.C);
    };
    auto padded_name = [](const std::string& kernel, const ConvLayer& P) {
        return fmt::format("implicit-gemm {} (channels padded to {})", kernel, P.C);
    };
    // The kernel of layer D read with its W taps as channels (taps_as_channels), or "".
    auto taps_kernel = [&](const ConvLayer& D, bool update) {
        const std::optional<TapsAsChannels> V = taps_as_channels(ctx, D);
        return !V ? std::string() : update ? gemm::conv_wgrad_kernel(ctx, V->layer) : fprop_kernel(V->layer);
    };
    if (op == "update") {
        if (std::string k = taps_kernel(L, true); !k.empty()) return "implicit-gemm " + k + " (W taps as channels)";
        if (std::string k = gemm::conv_wgrad_kernel(ctx, L); !k.empty()) return "implicit-gemm " + k;
        if (auto P = channels_for_tma(ctx, L, false)) return padded_name(gemm::conv_wgrad_kernel(ctx, *P), *P);
        if (auto T = padded_taps(ctx, L, FoldFor::update)) return taps_name(gemm::conv_wgrad_kernel(ctx, T->taps.layer), T->padded);
        if (auto U = update_folded(ctx, L)) return folded_name(gemm::conv_wgrad_kernel(ctx, U->kernel_layer()), U->folded, U->taps.has_value());
    } else {
        // (A deconvolution's fprop is the convolution's bprop, and the other way round.)
        const bool forward = (op != "bprop") != L.deconv;
        const std::optional<ConvLayer> D = forward ? std::optional<ConvLayer>(L) : implicit_dgrad(L);
        if (std::string k = forward ? taps_kernel(L, false) : ""; !k.empty()) return "implicit-gemm " + k + " (W taps as channels)";
        if (auto P = forward ? channels_for_tma(ctx, L, true) : std::nullopt) return padded_name(fprop_kernel(*P), *P);
        if (std::string k = D ? fprop_kernel(*D) : ""; !k.empty()) return "implicit-gemm " + k;
        if (!forward && narrow_dgrad(ctx, L))
            return L.dtype == DType::BFloat16 ? "narrow kiln_conv_narrow_bf16" : "narrow kiln_conv_narrow_f16";
        const std::optional<ConvLayer> P = forward ? channels_padded(ctx, L) : std::nullopt;
        if (auto F = forward ? fprop_folded(ctx, L, P) : std::nullopt) {
            if (std::string k = taps_kernel(*F, false); !k.empty()) return folded_name(k, *F, true);
            return folded_name(fprop_kernel(*F), *F, false);
        }
        if (auto T = P ? padded_taps(ctx, L, FoldFor::fprop) : std::nullopt)
            return taps_name(fprop_kernel(T->taps.layer), T->padded);
        if (P) return padded_name(fprop_kernel(*P), *P);
        // A strided gradient by phase: the phased walk, or the kernel of its largest phase.
        if (auto phases = !forward ? implicit_phases(ctx, L) : std::nullopt) {
            if (std::string k = gemm::conv_phased_kernel(ctx, tap_layers(*phases)); !k.empty())
                return "implicit-gemm, phases in one launch, " + k;
            const DgradPhase* largest = nullptr;
            for (const DgradPhase& P : *phases)
                if (P.layer && (!largest || P.taps[0] * P.taps[1] * P.taps[2] > largest->taps[0] * largest->taps[1] * largest->taps[2]))
                    largest = &P;
            return "implicit-gemm by phase " + fprop_kernel(*largest->layer, false);
        }
        if (auto F = !forward ? bprop_folded(ctx, L) : std::nullopt)
            return folded_name(fprop_kernel(F->dgrad), F->folded, false);
        if (auto S = !forward ? strided_pointwise_dgrad(ctx, L) : std::nullopt)
            return "implicit-gemm " + fprop_kernel(*S, false) + " (into the strided view)";
    }
#else
    (void)ctx;
    if (pointwise(g)) return "gemm";
#endif
    return "im2col+gemm";
}

namespace {
Tensor swap_first_last(const Tensor& x, const char* op) {
    if (!x.defined()) fail(Error::Kind::Value, "{}: x is an empty kiln::Tensor", op);
    if (x.rank() < 2)
        fail(Error::Kind::Value, "{}: x is {}; it needs a channel and a batch axis (rank 2 or more)", op, desc(x));
    std::vector<int> perm(x.rank());
    for (int i = 0; i < x.rank(); ++i) perm[i] = i;
    std::swap(perm.front(), perm.back());
    return x.context().eval(x.transpose(perm).expr());
}
} // namespace

Tensor from_chwn(const Tensor& x) { return swap_first_last(x, "from_chwn"); }
Tensor to_chwn(const Tensor& x) { return swap_first_last(x, "to_chwn"); }

} // namespace kiln
