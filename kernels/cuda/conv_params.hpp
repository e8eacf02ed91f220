// The parameter blocks of kiln's precompiled convolution kernels (conv_sm90.cu, im2col.cu),
// shared by the device code (nvcc) and the host launcher (conv_cuda.cpp). The kernels compute
// fprop as the GEMM  O (rows x K) = patches(I) (rows x taps) . F^T (taps x K)  without the patch
// matrix: rows = N M P Q output positions, taps = T R S C filter entries, channels innermost
// (NDHWC activations, KTRSC filters). `gemm` carries the product's epilogue and C (the output as
// a rows x K matrix), exactly as the GEMM kernels read it.
#pragma once
#include "kernels/cuda/gemm_params.hpp"

namespace kiln::gemm {

struct ConvParams {
    GemmParams gemm;     // m = rows, n = K, k = taps; c, strides, bias, flags, alpha, beta, rounding
    const void* image;   // I: (N, D, H, W, C), contiguous
    int32_t N, D, H, W, C;
    int32_t M, P, Q;     // output positions per image
    int32_t T, R, S;
    int32_t pad_d, pad_h, pad_w, str_d, str_h, str_w, dil_d, dil_h, dil_w;
};

// im2col.cu: cols (rows x taps, rows ld elements apart) = the patch matrix of the image, every
// element `elem` bytes.
struct Im2colParams {
    const void* image;
    void* cols;
    int64_t ld;
    int32_t elem, rows, taps;
    int32_t N, D, H, W, C;
    int32_t M, P, Q;
    int32_t T, R, S;
    int32_t pad_d, pad_h, pad_w, str_d, str_h, str_w, dil_d, dil_h, dil_w;
};

} // namespace kiln::gemm
