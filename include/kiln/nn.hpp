// A network's other layers that are expressions, with the seeds' (neon's) names: batch norm,
// softmax, cross-entropy, and the activations' forward and backward helpers. They build kiln
// expressions, so every one of them runs through the JIT on either backend, fused: batch norm's
// statistics are column reductions, its normalisation one elementwise kernel.
//
// Layout: channels innermost, as kiln's convolution writes them (NHWC): batch norm's x is
// (..., C) and its statistics and parameters (C,) or (C, 1); the batch is every other axis.
#pragma once
#include <kiln/export.hpp>
#include <kiln/tensor.hpp>

namespace kiln {

// Batch normalisation, forward (neon's compound_fprop_bn). Training (inference = false):
//   xsum  = the per-channel sums of x (computed when compute_batch_sum, else given, e.g. by
//           fprop_conv's bsum); mean = xsum / n
//   xvar  = the per-channel population variance of x
//   gmean = rho * gmean + (1 - rho) * mean;  gvar = rho * gvar + (1 - rho) * xvar
//   y     = relu?((x - mean) / sqrt(xvar + eps) * gamma + beta + accumbeta * y)
// Inference: y from gmean and gvar; xsum, xvar, gmean and gvar are left as they are.
KILN_API void compound_fprop_bn(const Tensor& x, Tensor& xsum, Tensor& xvar, Tensor& gmean, Tensor& gvar,
                                const Tensor& gamma, const Tensor& beta, Tensor& y, double eps, double rho,
                                bool compute_batch_sum, double accumbeta = 0.0, bool relu = false,
                                bool inference = false);

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
// the true class (an integer tensor of shape (rows,) or (rows, 1)).
KILN_API Expr cross_entropy_labels(const Expr& p, const Tensor& labels, bool mean = true);

// neon's fprop_relu / bprop_relu: max(x, 0) + slope * min(x, 0), and the error times the
// derivative at x: (x > 0) + slope * (x < 0).
KILN_API Expr fprop_relu(const Expr& x, double slope = 0.0);
KILN_API Expr bprop_relu(const Expr& x, const Expr& error, double slope = 0.0);
// Derivatives expressed through the forward output y: sigmoid's y (1 - y), tanh's 1 - y^2.
KILN_API Expr sigmoid_grad(const Expr& y);
KILN_API Expr tanh_grad(const Expr& y);

} // namespace kiln
