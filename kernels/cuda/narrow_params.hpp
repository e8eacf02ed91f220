// The parameter block of conv_narrow.cu, shared by the device code (nvcc) and the host launcher
// (narrow_cuda.cpp).
#pragma once
#include "kernels/cuda/gemm_params.hpp"   // KILN_GEMM_HOST_DEVICE

#include <stdint.h>

namespace kiln::gemm {

// out (N x P x Q rows of K, rows ld elements apart, `out_dtype`) = act(alpha * conv(image, filter) + bias)
// + beta * out, act: ReLU where relu (leaky below zero with `slope`); a 2D or 1D
// convolution of stride 1. image (N, H, W, C) and filter (K, R, S, C) 16-bit (`bf16`) and
// contiguous; K <= 8, C a multiple of 8. The blocks: N x tiles_h x tiles_w output tiles of
// kNarrowTileH rows x kNarrowTileW positions. out_dtype: 0 float32, 1 float16, 2 bfloat16.
struct NarrowParams {
    const void* image;
    const void* filter;
    void* out;
    const float* bias;   // K values, or null
    int64_t ld;
    float alpha, beta, slope;
    int32_t relu, bf16, out_dtype;
    int32_t N, H, W, C, K, R, S, P, Q;
    int32_t pad_h, pad_w, dil_h, dil_w;
    int32_t tiles_h, tiles_w;
};

constexpr int kNarrowTileH = 8;    // output rows a block: a warp each
constexpr int kNarrowTileW = 32;   // output positions a row: two m16 tiles of the mma
constexpr int kNarrowChunk = 64;   // channels staged at a time: 128 bytes a position

// The shared memory a block of a layer of filter R x S (dilation dh, dw) stages: its input
// window's positions x 128 bytes, then the filter's B fragments (R S taps x 4 k16 steps x 32
// lanes x 8 bytes).
KILN_GEMM_HOST_DEVICE constexpr int narrow_window_h(int R, int dh) { return kNarrowTileH + (R - 1) * dh; }
KILN_GEMM_HOST_DEVICE constexpr int narrow_window_w(int S, int dw) { return kNarrowTileW + (S - 1) * dw; }
KILN_GEMM_HOST_DEVICE constexpr int narrow_smem(int R, int S, int dh, int dw) {
    return narrow_window_h(R, dh) * narrow_window_w(S, dw) * 128 + R * S * 4 * 256;
}

} // namespace kiln::gemm
