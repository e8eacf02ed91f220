// The parameter blocks of pool.cu (pooling's and LRN's forward and backward kernels), shared by the device
// code (nvcc) and the host launcher (pool_cuda.cpp).
#pragma once
#include "kernels/cuda/fast_div.hpp"

namespace kiln::gemm {

// A numerics histogram of the values a kernel stores to its output (include/kiln/hist.hpp):
// each block counts into `bins` words of its dynamic shared memory, then adds them to counts.
// counts null: nothing is counted.
struct PoolHist {
    uint32_t* counts;
    int32_t bins, offset;
};

// Input (N, D, H, W, C) and output (N, M, P, Q, K), channels innermost and contiguous; the
// window J channels x T x R x S, with padding and stride per axis (channels first).
struct PoolShape {
    int32_t N, D, H, W, C;
    int32_t M, P, Q, K;
    int32_t J, T, R, S;
    int32_t pad_c, pad_d, pad_h, pad_w;
    int32_t str_c, str_d, str_h, str_w;
};

// Threads a block of the pooling and LRN kernels (the forward's staged taps are indexed by it).
constexpr int kPoolThreads = 256;
// Backward over vectors of channels: a thread takes a square of kPoolBpropBlock^2 input positions
// (height x width), loading each window that covers any of them once for all.
constexpr int kPoolBpropBlock = 2;

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
    PoolHist hist;   // of y
};

// Local response normalisation across a window of 2 half + 1 channels (kiln::fprop_lrn /
// bprop_lrn) over activations of C channels innermost, contiguous, a thread per position and 16
// bytes of channels (`items` of them; `lanes` divides by C / vec). fprop: denom = 1 + ascale *
// window sum of in^2, result = alpha * in * denom^-bpower + beta * result. bprop (out: fprop's
// output, err: E): result = alpha * (err * denom^-bpower - scale2 * in * window sum of
// err * out / denom) + beta * result, scale2 = 2 ascale bpower.
struct LrnParams {
    const void* in;
    const void* out;
    const void* err;
    void* denom;
    void* result;
    float alpha, beta, ascale, bpower, scale2;
    int32_t C;
    int64_t items;
    FastDiv lanes;
    PoolHist hist;   // of result
};

} // namespace kiln::gemm
