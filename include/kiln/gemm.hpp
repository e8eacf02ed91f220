// GEMM with fused epilogues, the seeds' compound_dot:
//
//   C = relu_slope(alpha * op(A) . op(B) + bias) + beta * C      bsum = per-row sums of C
//
// op() is whatever view the caller passes (A.T() for a transposed operand: nn, nt, tn, tt all
// work, as do views into larger buffers). relu_slope(x) is x where x > 0, else slope * x when
// relu is set (slope 0: ReLU, else leaky); the bias (N values, one per column) is added
// before it. float32 operands compute in float32; float16/bfloat16 operands compute with float32
// accumulation. The result is stored in C's dtype, stochastically rounded when the context asks.
//
// CPU contexts run the product through the system BLAS (cblas_sgemm, loaded at run time) and the
// epilogue through the JIT: one fused kernel. CUDA contexts run kiln's precompiled kernels
// (kernels/cuda, docs/gemm.md); a build without nvcc raises kiln::Error (Runtime) there.
#pragma once
#include <kiln/export.hpp>
#include <kiln/tensor.hpp>

#include <optional>

namespace kiln {

struct DotOptions {
    double alpha = 1.0;
    double beta = 0.0;
    bool relu = false;
    double slope = 0.0;               // with relu: the slope below zero (leaky ReLU)
    std::optional<Tensor> bias;       // (N,) or (1, N): added per column before the ReLU
    std::optional<Tensor> bsum;       // (M,) or (M, 1): receives the per-row sums of C as stored
};

// C (M x N) = epilogue(A (M x K) . B (K x N)); returns C.
KILN_API Tensor& compound_dot(const Tensor& A, const Tensor& B, Tensor& C, const DotOptions& opts = {});
// C = A . B, into a new float32 (or A's 16-bit dtype) tensor of A's context.
KILN_API Tensor dot(const Tensor& A, const Tensor& B);
// C[b] = epilogue(A[b] . B[b]) over a leading batch dimension (A or B may be 2-D: shared).
KILN_API Tensor& batched_dot(const Tensor& A, const Tensor& B, Tensor& C, const DotOptions& opts = {});

} // namespace kiln
