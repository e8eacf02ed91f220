// A network's other layers that are expressions, with the seeds' (neon's) names: batch norm,
// softmax, cross-entropy, and the activations' forward and backward helpers. They build kiln
// expressions, so every one of them runs through the JIT on either backend, fused: batch norm's
// statistics are column reductions, its normalisation one elementwise kernel.
//
// Layout: channels innermost, as kiln's convolution writes them (NHWC): batch norm's x is
// (..., C) and its statistics and parameters (C,) or (C, 1); the batch is every other axis.
#pragma once
#include <kiln/conv.hpp>
#include <kiln/export.hpp>
#include <kiln/tensor.hpp>

#include <optional>

namespace kiln {

// Batch normalisation, forward (neon's compound_fprop_bn). Training (inference = false):
//   xsum  = the per-channel sums of x (computed when compute_batch_sum, else given, e.g. by
//           fprop_conv's bsum); mean = xsum / n
//   xvar  = the per-channel population variance of x
//   gmean = rho * gmean + (1 - rho) * mean;  gvar = rho * gvar + (1 - rho) * xvar
//   y     = relu?((x - mean) / sqrt(xvar + eps) * gamma + beta + accumbeta * y + residual)
// Inference: y from gmean and gvar; xsum, xvar, gmean and gvar are left as they are.
// residual (x's shape; none when undefined) is added in the same kernel: a residual block's
// relu(bn(branch) + shortcut) without a pass of its own over the activations.
KILN_API void compound_fprop_bn(const Tensor& x, Tensor& xsum, Tensor& xvar, Tensor& gmean, Tensor& gvar,
                                const Tensor& gamma, const Tensor& beta, Tensor& y, double eps, double rho,
                                bool compute_batch_sum, double accumbeta = 0.0, bool relu = false,
                                bool inference = false, const Tensor& residual = Tensor());

// Batch normalisation, backward (neon's compound_bprop_bn), from the forward pass's xsum and xvar:
//   xhat = (x - xsum / n) / sqrt(xvar + eps)
//   grad_gamma = sum(delta_in * xhat);  grad_beta = sum(delta_in)      (per channel)
//   delta_out  = gamma * (delta_in - (xhat * grad_gamma + grad_beta) / n) / sqrt(xvar + eps)
KILN_API void compound_bprop_bn(Tensor& delta_out, Tensor& grad_gamma, Tensor& grad_beta, const Tensor& delta_in,
                                const Tensor& x, const Tensor& xsum, const Tensor& xvar, const Tensor& gamma,
                                double eps);

// exp(x - max(x)) / sum(exp(x - max(x))) along `axis` (numerically stable).
KILN_API Expr softmax(const Expr& x, int axis = -1);
// Cross-entropy of probabilities p against targets t of p's shape (one-hot or any distribution):
// -sum(t * log(max(p, tiny))) over `axis`, then the mean (or the sum) over the rest: a scalar.
KILN_API Expr cross_entropy(const Expr& p, const Expr& t, int axis = -1, bool mean = true);
// The same from class indices: `labels` holds, per row of p (p is (rows, classes)), the index of
// the true class (an integer tensor of shape (rows,) or (rows, 1)); a label outside
// [0, classes) makes the result NaN.
KILN_API Expr cross_entropy_labels(const Expr& p, const Tensor& labels, bool mean = true);

// neon's fprop_relu / bprop_relu: max(x, 0) + slope * min(x, 0), and the error times the
// derivative at x: (x > 0) + slope * (x < 0).
KILN_API Expr fprop_relu(const Expr& x, double slope = 0.0);
KILN_API Expr bprop_relu(const Expr& x, const Expr& error, double slope = 0.0);
// Derivatives expressed through the forward output y: sigmoid's y (1 - y), tanh's 1 - y^2.
KILN_API Expr sigmoid_grad(const Expr& y);
KILN_API Expr tanh_grad(const Expr& y);

// Pooling (neon's pool_layer / fprop_pool / bprop_pool): max, average or L2 over windows of
// J channels x T x R x S positions of an NDHWC input (also without depth, or depth and height,
// as the convolution's tensors), with padding and strides (default: the window, so windows do
// not overlap; smaller strides overlap them). Average divides by the window's elements inside
// the input; max ignores the padding. On CUDA contexts precompiled kernels pool (one pass
// forward, and backward a gather per input element); on the CPU, and where those decline (a
// strided or in-place output, mixed dtypes), windows are expressions over strided views of a
// padded copy.
enum class PoolOp { Max, Avg, L2, Lrn };

struct KILN_API PoolLayer {
    PoolOp op = PoolOp::Max;
    DType dtype = DType::Float32;
    int64_t N = 1, C = 1, J = 1, pad_c = 0, str_c = 1, K = 1;   // K: output channels
    Dims3 image{1, 1, 1}, window{1, 1, 1}, pad{0, 0, 0}, stride{1, 1, 1}, output{1, 1, 1};
    int spatial_rank() const;
    Shape input_shape() const;
    Shape output_shape() const;
    int64_t taps() const { return J * window[0] * window[1] * window[2]; }
    std::string str() const;
};

// str_c, stride entries 0: the window's size along that axis (negative ones are an error).
KILN_API PoolLayer pool_layer(DType dtype, PoolOp op, int64_t N, int64_t C, Dims3 image = {1, 1, 1}, int64_t J = 1,
                              Dims3 window = {1, 1, 1}, int64_t pad_c = 0, Dims3 pad = {0, 0, 0}, int64_t str_c = 0,
                              Dims3 stride = {0, 0, 0});
// O = alpha * pool(I) + beta * O. For max pooling, argmax (an int32 tensor of O's shape), when
// given, receives the index of the winning tap ((j * T + t) * R + r) * S + s of each window.
KILN_API Tensor& fprop_pool(const PoolLayer& layer, const Tensor& I, Tensor& O, const std::optional<Tensor>& argmax = {},
                            double alpha = 1.0, double beta = 0.0);
// grad_I = alpha * (the gradient of pool with respect to its input, from E) + beta * grad_I; a
// position in several windows gathers from each. Max pooling needs fprop's argmax; L2 pooling
// needs the forward input X and output Y.
KILN_API Tensor& bprop_pool(const PoolLayer& layer, const Tensor& E, Tensor& grad_I, const std::optional<Tensor>& argmax = {},
                            double alpha = 1.0, double beta = 0.0, const std::optional<Tensor>& X = {},
                            const std::optional<Tensor>& Y = {});

// Local response normalisation across channels (neon's lrn_layer / fprop_lrn / bprop_lrn): a
// window of J channels (J odd) centred on each channel, zero beyond the edges:
//   denom = 1 + ascale * sum over the window of I^2;  O = alpha * I * denom^-bpower + beta * O
//   delta = alpha * (E denom^-bpower - 2 ascale bpower I * sum over the window of E O / denom)
//           + beta * delta            (O: fprop's output with alpha = 1, beta = 0)
// On CUDA contexts a precompiled kernel computes each position's windows in registers (windows
// of up to 9 channels, channels in whole 16-byte vectors); otherwise they are expressions.
KILN_API PoolLayer lrn_layer(DType dtype, int64_t N, int64_t C, Dims3 image = {1, 1, 1}, int64_t J = 1);
KILN_API Tensor& fprop_lrn(const PoolLayer& layer, const Tensor& I, Tensor& O, Tensor& denom, double alpha = 1.0,
                           double beta = 0.0, double ascale = 1.0, double bpower = 1.0);
KILN_API Tensor& bprop_lrn(const PoolLayer& layer, const Tensor& I, const Tensor& O, const Tensor& E, Tensor& delta,
                           const Tensor& denom, double alpha = 1.0, double beta = 0.0, double ascale = 1.0,
                           double bpower = 1.0);

} // namespace kiln
