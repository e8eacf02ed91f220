// Convolution on CUDA contexts through kiln's precompiled implicit-GEMM kernels
// (conv_sm90.cu, sm90/conv_fprop.cuh), embedded in the library like the GEMM's. kernels/conv.cpp
// asks first and falls back to im2col and the GEMM where they decline.
#pragma once
#include <kiln/conv.hpp>
#include <kiln/gemm.hpp>

#include "kernels/hist_named.hpp"

#include <optional>
#include <string>
#include <vector>

namespace kiln::gemm {

// Where the pixels of a layer's image lie in the tensor passed as its image, in elements: pixel
// (n, d, h, w) of L's image at ((n D + d) H + h) row + w pixel, its C channels contiguous.
// {0, 0}: the image dense (pixel C, row W C). Otherwise a view of another image's contiguous
// storage (the tensor passed) whose pixels may overlap: taps_as_channels in kernels/conv.cpp.
// Both a multiple of 16 bytes; the kernels take such an image only where TMA brings its patches
// (patches_by_tma). A non-contiguous image is made dense first.
struct ImageLayout {
    int64_t pixel = 0, row = 0;
};

// C (rows x K, the output as a matrix) = epilogue(conv(I5, F)) of layer L with the implicit-GEMM
// kernel (sm_90: wgmma; other GPUs from sm_80, or KILN_CONV_KERNEL=mma: mma.sync): true when it
// ran, false where it does not take the problem (a GPU before sm_80, not a 16-bit dtype, C not a
// multiple of 8, sizes past 32 bits, KILN_CONV_KERNEL=im2col, or for mma.sync a `layout`; an image
// or filter not on a 16-byte boundary is copied first). The epilogue is the GEMM's (alpha, beta, bias, relu,
// slope). I5 is (N, D, H, W, C). C may also be (groups, rows / groups, K): rows in groups of a
// stride of their own (c_row), as a strided gradient's phase is in the image's gradient.
// `extras` (kernels/hist_named.hpp): the values stored counted where the counters fit beside the
// kernel's shared memory; C's column sums where the wgmma kernels' 16-bit register epilogue
// stores (16-bit C, no beta or stochastic rounding), the kernel's partial sums (a row of tiles'
// or, walking, a warp's) added up by a JIT reduction after it. `layout`: where I5 holds the
// image's pixels (declines where TMA cannot bring them). `siblings`: how the launch sits among a
// strided gradient's phases (ConvParams::siblings; the mma.sync kernel and the tuner's timed
// launches ignore it).
bool conv_fprop_implicit(const ConvLayer& L, const Tensor& I5, const Tensor& F, Tensor& C, const DotOptions& o,
                         StoreExtras* extras = nullptr, ImageLayout layout = {}, uint32_t siblings = 0);

// A strided gradient's phases, each a stride-1 layer of E5 as conv_fprop_implicit takes them
// (grouped rows), in one launch of the phased walk (conv_walk.cuh): every phase's taps a view of
// one buffer (filter_taps_cuda side by side), its rows a view of one gradient, alike but for
// where they start. conv_phased_kernel: the entry it would launch for `phases` on ctx, or ""
// where it does not take them (not sm_90's wgmma kernels, KILN_CONV_KERNEL=tile or im2col,
// fewer than 2 or more than kMaxPhases phases, phases that differ in more than their taps and
// padding, 64 or fewer channels out, patches TMA cannot bring); conv_dgrad_phased: true when it
// ran (it also declines 16-bit rows not 16 bytes apart, stochastic rounding, beta). o: alpha,
// ReLU and its slope.
std::string conv_phased_kernel(Context& ctx, const std::vector<ConvLayer>& phases);
bool conv_dgrad_phased(const std::vector<ConvLayer>& phases, const Tensor& E5, const std::vector<Tensor>& taps,
                       const std::vector<Tensor>& rows, const DotOptions& o);
// The patch matrix of the image I5 (N, D, H, W, C) of layer L on a CUDA context, in I5's dtype,
// by the precompiled im2col kernel: a (rows x taps) view of a buffer whose rows are 16 bytes
// apart.
Tensor im2col_cuda(const ConvLayer& L, const Tensor& I5);

// The gradient with respect to the image of layer L from the patch matrix's gradient dcols
// (rows x taps, float32, contiguous rows) on a CUDA context, by the precompiled col2im kernel: a
// new (N, D, H, W, C) float32 tensor. Each element sums the entries that tap it in tap order.
Tensor col2im_cuda(const ConvLayer& L, const Tensor& dcols);

// The most bytes a folded position's s0 s1 s2 c channels may take: the fold stages its positions'
// image rows in shared memory, this much a position at least.
constexpr int64_t kFoldPositionMaxBytes = 12 * 1024;

// Space-to-depth (im2col.cu's FoldParams): x5 (n, X, c) of a convolution of stride s and padding
// pad as `channels` (at least s0 s1 s2 c) channels at `positions` J, where folded position j,
// phase b < s holds x's s j + b - pad, its channels ((b0 s1 + b1) s2 + b2) c + ch, zeros
// elsewhere: a new (n, J0, J1, J2, channels) tensor of x5's dtype (16-bit; channels a multiple
// of 8, a position's s0 s1 s2 c channels at most kFoldPositionMaxBytes).
Tensor fold_cuda(const Tensor& x5, const Dims3& stride, const Dims3& pad, const Dims3& positions, int64_t channels);

// Whether fold_cuda and unfold_cuda index x (n, X, c; padded by pad) and its fold (n, J, cf) in 32
// bits; where not they fail with a Value error.
bool fold_fits(int64_t n, const Dims3& x, int64_t c, const Dims3& pad, const Dims3& j, int64_t cf);

// Its transpose over x: x (n, X, c; contiguous, folded's dtype) = folded (n, J, cf), zero at the
// positions no folded one holds.
void unfold_cuda(const Tensor& folded, Tensor& x, const Dims3& stride, const Dims3& pad);

// The taps a gradient with respect to the input multiplies, of F5 (K, T, R, S, C; 16-bit,
// contiguous, K and C multiples of 8; FilterTapsParams): a new (C, taps, K) tensor holding
// F5[k][base + step j][c] for j < taps along each axis (every such tap within the filter).
Tensor filter_taps_cuda(const Tensor& F5, const Dims3& taps, const Dims3& base, const Dims3& step);
// Several such sets (a strided gradient's phases) in one launch (kMaxTapSets a launch), each a
// (C, taps, K) view of one new buffer: one after another, each contiguous, or side_by_side (at
// most kMaxTapSets sets): a buffer (C, all sets' taps, K) whose channel rows hold every set's
// taps in turn, set i's a view of its own taps.
struct TapSet {
    Dims3 taps, base, step;
};
std::vector<Tensor> filter_taps_cuda(const Tensor& F5, const std::vector<TapSet>& sets, bool side_by_side = false);

// The kernel conv_fprop_implicit would launch for L on ctx (with column_sums: adding a bsum's
// sums; plain_rows false: into a strided gradient's grouped rows), or "" where it declines:
// what the benchmark prints.
std::string conv_fprop_kernel(Context& ctx, const ConvLayer& L, bool column_sums = false, bool plain_rows = true);

// C (the N P Q x K row-major output, float32 or 16-bit) = epilogue(conv(I5, F)) by the kernel of
// few output channels (conv_narrow.cu, narrow_cuda.cpp; o's alpha, beta, bias and activation):
// true when it ran, false where it does not take the problem (narrow_takes; a bsum, C's columns
// not adjacent or C sharing memory with an operand, I5 not 16-byte aligned, 16-bit C under
// stochastic rounding).
bool conv_narrow(const ConvLayer& L, const Tensor& I5, const Tensor& F, Tensor& C, const DotOptions& o);
// Whether conv_narrow takes layer L on ctx: sm_80 or later, 16-bit, K <= 8 output channels, C a
// multiple of 8, a 2D or 1D convolution of stride 1 (not a deconvolution) whose input window
// and filter fit in shared memory, sizes in 32 bits; not under KILN_CONV_KERNEL=im2col.
bool narrow_takes(Context& ctx, const ConvLayer& L);

// fprop's cost model (conv_select.cpp, fprop_plan): the microseconds of the plan the kernel would
// take for L on ctx's GPU (its patches by TMA or gathered, walking or not, as it would launch);
// nothing where it has no estimate (not a CUDA context, a layer the kernel does not take, K <=
// 64: the 64-wide tile).
std::optional<double> conv_fprop_estimate_us(Context& ctx, const ConvLayer& L);

// Whether KILN_CONV_KERNEL=im2col asks for the patch matrix and the GEMM on every convolution.
bool conv_im2col_forced();

// Whether the implicit-GEMM kernel, rather than the GEMM, multiplies L, a pointwise layer (1x1,
// stride 1, no padding; a fprop, or a pointwise layer's gradient as a convolution): where the
// kernel takes it and conv_select.hpp's pointwise_prefers_implicit says so (into_view: L's
// output goes to a strided gradient's view).
bool pointwise_implicit(Context& ctx, const ConvLayer& L, bool into_view = false);

// grad_F (a K x taps matrix view of the filter's gradient) = alpha * (the gradient of conv(I5,
// F) of layer L with respect to F, from E5 (N, M, P, Q, K)) + beta * grad_F, by the implicit-GEMM
// weight-gradient kernel (conv_sm90.cu, sm90/conv_wgrad.cuh): true when it ran, false where it
// does not take the problem (the fprop kernel's conditions on sm_90, plus C a multiple of 64 with a
// window TMA's im2col descriptor holds, and K a multiple of 8). Deterministic. With `count`,
// the epilogue (or split, the slices' reduction) counts the values it stores into it; *counted
// says whether it did. `layout`: where I5 holds the image's pixels.
bool conv_wgrad_implicit(const ConvLayer& L, const Tensor& I5, const Tensor& E5, Tensor& grad_F, const DotOptions& o,
                         const StoreCount* count = nullptr, bool* counted = nullptr, ImageLayout layout = {});

// Whether the last conv_fprop_implicit or conv_wgrad_implicit on this thread counted its output
// in its store path, and whether the last conv_fprop_implicit added up its channels there; the
// layout of the image the last of them ran on ({0, 0} where it declined or read a dense image)
// (tests).
bool last_conv_counted();
bool last_conv_summed();
ImageLayout last_conv_layout();

// Whether TMA's im2col descriptor can bring L's patches on ctx's GPU (the wgmma kernels', its
// channels a multiple of 64 and its window within the descriptor's ranges): where the kernels
// read an ImageLayout.
bool patches_by_tma(Context& ctx, const ConvLayer& L);

// The kernel (and split) conv_wgrad_implicit would launch for L on ctx, or "".
std::string conv_wgrad_kernel(Context& ctx, const ConvLayer& L);

// KILN_AUTOTUNE=1: forgets the choices tuned in this process (tests: the next call reads the
// disk cache, or times the candidates again where it holds none).
void conv_autotune_forget();

} // namespace kiln::gemm
