// The parameter block of pool.cu (pooling's forward and backward kernels), shared by the device
// code (nvcc) and the host launcher (pool_cuda.cpp).
#pragma once
#include "kernels/cuda/fast_div.hpp"

namespace kiln::gemm {

// Input (N, D, H, W, C) and output (N, M, P, Q, K), channels innermost and contiguous; the
// window J channels x T x R x S, with padding and stride per axis (channels first).
struct PoolShape {
    int32_t N, D, H, W, C;
    int32_t M, P, Q, K;
    int32_t J, T, R, S;
    int32_t pad_c, pad_d, pad_h, pad_w;
    int32_t str_c, str_d, str_h, str_w;
};

// fprop: y (the output) = alpha * pool(x) + beta * y; argmax (int32, output-shaped, max only)
// written where not null. bprop: y (the input's gradient) = alpha * grad + beta * y from x (the
// output's gradient E), with argmax (max), or x2/y2 the forward input and output (l2).
// A thread handles `vec` consecutive channels of one position per item (vec > 1 only for
// windows of one channel). The divisions split an item into its coordinates: fprop by K / vec,
// Q, P, M; bprop by C / vec, W, H, D, then the strides.
struct PoolParams {
    const void* x;
    void* y;
    int32_t* argmax;
    const void* x2;
    const void* y2;
    float alpha, beta;
    int64_t items;
    PoolShape g;
    FastDiv lanes, d3, d2, d1;
    FastDiv str_c, str_d, str_h, str_w;
};

} // namespace kiln::gemm
