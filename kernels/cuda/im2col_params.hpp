// The parameter blocks of im2col.cu, shared by the device code (nvcc) and the host launcher
// (conv_cuda.cpp). Besides the geometry, each carries the fast divisions (fast_div.hpp) its
// kernel splits indices with.
#pragma once
#include "kernels/cuda/conv_params.hpp"
#include "kernels/cuda/fast_div.hpp"

namespace kiln::gemm {

// cols (rows x taps, rows ld elements apart) = the patch matrix of the image, every element
// `elem` bytes. Divisions: a row's 16-byte chunks (row of a chunk), Q, P, M (an output
// position's coordinates), C, S, R (a column's tap and channel).
struct Im2colParams {
    const void* image;
    void* cols;
    int64_t ld;
    int32_t elem, rows, taps;
    ConvShape shape;
    FastDiv chunks_per_row, q, p, m, c, s, r;
};

// image (N, D, H, W, C, float32, contiguous) = the gradient with respect to the image from the
// patch matrix's gradient cols (rows x taps, float32, rows ld elements apart). Divisions: C, W,
// H, D (an element's coordinates) and the strides.
struct Col2imParams {
    const float* cols;
    float* image;
    int64_t ld;
    ConvShape shape;
    FastDiv c, w, h, d, str_d, str_h, str_w;
};

} // namespace kiln::gemm
