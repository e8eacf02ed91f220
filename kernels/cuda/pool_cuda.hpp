// Pooling and LRN on CUDA contexts by kiln's precompiled kernels (pool.cu). kernels/nn.cpp asks
// first and keeps the expression path (padded copies and a kernel per tap) where they decline.
#pragma once

#include <string>
#include <kiln/nn.hpp>

#include "kernels/hist_named.hpp"

namespace kiln::gemm {

// O5 = alpha * pool(I5) + beta * O5 for layer L, the winning taps into A5 when given (max):
// true when it ran, false where the kernels do not take the problem (not a CUDA context, I5 and
// O5 of different dtypes, O5 or A5 not contiguous or sharing memory with I5, a tensor read that
// was never written, more than 2^31 positions or a size past 2^31). I5 (N, D, H, W, C) and O5
// (N, M, P, Q, K) as fprop_pool sees them. Each of these functions, given `count`, counts the
// values its kernel stores to the output into it when it runs (a named output's store path).
bool pool_fprop_cuda(const PoolLayer& L, const Tensor& I5, Tensor& O5, Tensor* A5, double alpha, double beta,
                     const StoreCount* count = nullptr);

// G5 = alpha * (pool's gradient from E5) + beta * G5 for layer L, with fprop's argmax A5 (max) or
// the forward input X5 and output Y5 (L2): true when it ran, false as above (G5 not contiguous,
// E5, X5 or Y5 of another dtype than G5).
bool pool_bprop_cuda(const PoolLayer& L, const Tensor& E5, Tensor& G5, const Tensor* A5, const Tensor* X5, const Tensor* Y5,
                     double alpha, double beta, const StoreCount* count = nullptr);

// LRN of layer L (kiln::fprop_lrn's arguments, 5-D views): true when it ran, false where the
// kernels do not take it (not a CUDA context, not a layer as lrn_layer makes it, tensors of
// different dtypes, an output not contiguous or sharing memory with another operand, channels
// not whole 16-byte vectors, a window wider than 9 channels, more than 2^31 positions).
bool lrn_fprop_cuda(const PoolLayer& L, const Tensor& I5, Tensor& O5, Tensor& D5, double alpha, double beta, double ascale,
                    double bpower, const StoreCount* count = nullptr);
// bprop_lrn's counterpart: G5 = alpha * (LRN's gradient from E5) + beta * G5.
bool lrn_bprop_cuda(const PoolLayer& L, const Tensor& I5, const Tensor& O5, const Tensor& E5, Tensor& G5, const Tensor& D5,
                    double alpha, double beta, double ascale, double bpower, const StoreCount* count = nullptr);

// Whether the last pooling or LRN kernel launched on this thread counted its output (tests).
bool last_pool_counted();
// The entry point of the last pooling or LRN kernel launched on this thread (tests).
const std::string& last_pool_entry();

} // namespace kiln::gemm
