// Convolution, the seeds' conv_layer / fprop_conv / bprop_conv / update_conv / deconv_layer:
// 1D, 2D and 3D, with zero padding, stride and dilation, channels innermost.
//
//   layout       conv_layer                       deconv_layer
//   input        I  (N, D, H, W, C)   NDHWC       (N, M, P, Q, K)
//   filter       F  (K, T, R, S, C)   KTRSC       (K, T, R, S, C)
//   output       O  (N, M, P, Q, K)               (N, D, H, W, C)
//
// A 2D layer (D = T = 1, no depth padding or stride) also takes its tensors without the depth
// axis, (N, H, W, C), and a 1D one (also H = R = 1) without height: (N, W, C). Output sizes:
// M = (D + 2 pad_d - dil_d (T - 1) - 1) / str_d + 1, and so for P and Q.
//
//   fprop_conv:  O      = relu_slope(alpha * conv(I, F) + bias) [* brelu(X)] + beta * X
//   bprop_conv:  grad_I = the same epilogue over conv's gradient with respect to I, from E
//   update_conv: grad_F = alpha * conv's gradient with respect to F + beta * grad_F;
//                grad_bias (where given) = E's sum over every axis but the channel, the
//                gradient of fprop's bias (alpha and beta do not apply to it)
//
// X defaults to the output itself (beta accumulates into it); bias holds one value per output
// channel; relu_slope(x) = x > 0 ? x : slope * x when relu is set; brelu multiplies by
// (X > 0) + slope * (X < 0), the backward ReLU of a forward output X; bsum receives the sum over
// every axis but the channel of the output as stored. A deconvolution's fprop is the
// convolution's bprop and its bprop the convolution's fprop (with the same filter); its update
// takes its own input and error. float32 computes in float32; float16 and bfloat16 operands
// compute in float32 and are stored in the output's dtype.
//
// Both backends run im2col and a GEMM (compound_dot: the system BLAS on the CPU, kiln's kernels
// on the GPU, in the operands' dtype there), the epilogue fused into the GEMM where it is the
// GEMM's, else one JIT kernel; a 1x1x1 layer with stride 1 and no padding skips im2col. On an
// sm_90 GPU, 16-bit fprop with C a multiple of 8 (and bprop with stride 1 and K a multiple of 8,
// as the convolution of E with the flipped filter) runs kiln's implicit-GEMM kernel, which
// gathers the patches into shared memory instead; a strided layer with C not a multiple of 8 (a
// first layer) runs it with the stride folded into the channels (space-to-depth), or its fprop
// over its channels padded with zeros to a multiple of 8 where that gives fewer taps (an unstrided
// layer's always), and the bprop of a stride-1 layer into at most 8 channels runs a kernel of its
// own (any GPU from sm_80); conv_kernel says which path an op takes.
#pragma once
#include <kiln/export.hpp>
#include <kiln/context.hpp>
#include <kiln/tensor.hpp>

#include <array>
#include <optional>
#include <string>

namespace kiln {

using Dims3 = std::array<int64_t, 3>;   // {depth, height, width}

// The largest batch, channel count, size, window, padding, stride or dilation a layer takes
// (conv_layer, deconv_layer, pool_layer, lrn_layer): with each at most 2^31 - 1 the geometry's
// arithmetic stays inside int64. A layer's tensors must also hold at most kMaxElements.
inline constexpr int64_t kMaxLayerDim = (int64_t(1) << 31) - 1;

struct KILN_API ConvLayer {
    DType dtype = DType::Float32;
    int64_t N = 1, C = 1, K = 1;
    Dims3 image{1, 1, 1};      // D, H, W: the convolution's input
    Dims3 filter{1, 1, 1};     // T, R, S
    Dims3 output{1, 1, 1};     // M, P, Q: the convolution's output
    Dims3 pad{0, 0, 0}, stride{1, 1, 1}, dilation{1, 1, 1};
    bool deconv = false;       // made by deconv_layer: fprop and bprop exchanged

    // 1, 2 or 3: the spatial axes the layer's tensors may leave out (see above).
    int spatial_rank() const;
    // The shapes fprop reads and writes, in the layer's spatial rank (deconv: exchanged).
    Shape input_shape() const;
    Shape filter_shape() const;
    Shape output_shape() const;
    // Multiply-adds times two of one fprop (bprop and update do as many).
    double flops() const;
    std::string str() const;
};

// N images of C channels to K channels; image {D, H, W}, filter {T, R, S}.
KILN_API ConvLayer conv_layer(DType dtype, int64_t N, int64_t C, int64_t K, Dims3 image = {1, 1, 1},
                              Dims3 filter = {1, 1, 1}, Dims3 pad = {0, 0, 0}, Dims3 stride = {1, 1, 1},
                              Dims3 dilation = {1, 1, 1});
// The transposed layer: input {M, P, Q} of K channels to an output of C channels, whose size
// {D, H, W} = (M - 1) str - 2 pad + dil (T - 1) + 1 per axis.
KILN_API ConvLayer deconv_layer(DType dtype, int64_t N, int64_t C, int64_t K, Dims3 input = {1, 1, 1},
                                Dims3 filter = {1, 1, 1}, Dims3 pad = {0, 0, 0}, Dims3 stride = {1, 1, 1},
                                Dims3 dilation = {1, 1, 1});

struct ConvOptions {
    std::optional<Tensor> X;      // the tensor beta and brelu read (default: the output)
    std::optional<Tensor> bias;   // one value per output channel: (channels,) or (channels, 1)
    std::optional<Tensor> bsum;   // receives per-channel sums of the output: (channels,) or (channels, 1)
    double alpha = 1.0;
    double beta = 0.0;
    bool relu = false;
    bool brelu = false;
    double slope = 0.0;
};

KILN_API Tensor& fprop_conv(const ConvLayer& layer, const Tensor& I, const Tensor& F, Tensor& O,
                            const ConvOptions& opts = {});
KILN_API Tensor& bprop_conv(const ConvLayer& layer, const Tensor& F, const Tensor& E, Tensor& grad_I,
                            const ConvOptions& opts = {});
KILN_API Tensor& update_conv(const ConvLayer& layer, const Tensor& I, const Tensor& E, Tensor& grad_F,
                             double alpha = 1.0, double beta = 0.0,
                             const std::optional<Tensor>& grad_bias = std::nullopt);

// How `op` ("fprop"; "fprop+bsum", a fprop that also sums the output's channels, which may take
// another kernel entry; "bprop" or "update") of layer L runs on ctx: "implicit-gemm <kernel entry>"
// (the implicit-GEMM kernel), "implicit-gemm by phase <kernel entry>" (a strided bprop as one
// stride-1 implicit-GEMM convolution per phase of the stride; the entry of the phase with the
// most taps), "implicit-gemm <kernel entry> (stride folded into <c> channels)" (a strided layer
// over its image folded into c channels, space-to-depth, as a stride-1 one), "implicit-gemm
// <kernel entry> (channels padded to <c>)" (the kernel over channels padded with zeros to a
// multiple of 8, or of 64 for TMA), "implicit-gemm <kernel entry> (into the strided view)" (a
// strided 1x1 bprop as the stride-1 1x1 over E, stored at every stride-th position), "narrow
// <kernel entry>" (a stride-1 bprop into at most 8 channels), "gemm" (a pointwise layer: the
// activations are the matrix) or "im2col+gemm".
// What benchmarks print.
KILN_API std::string conv_kernel(Context& ctx, const ConvLayer& layer, const std::string& op = "fprop");

// neon's layouts to kiln's and back: neon keeps activations as (C, [D,] H, W, N) and filters as
// (C, [T,] R, S, K); kiln as (N, [D,] H, W, C) and (K, [T,] R, S, C). Both directions exchange
// the first and the last axis; the result is a new contiguous tensor of x's dtype and context.
KILN_API Tensor from_chwn(const Tensor& x);
KILN_API Tensor to_chwn(const Tensor& x);

} // namespace kiln
