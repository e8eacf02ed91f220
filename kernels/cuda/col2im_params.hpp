// The parameter block of im2col.cu's col2im, shared by the device code (nvcc) and the host
// launcher (conv_cuda.cpp): image (N, D, H, W, C, float32, contiguous) = the gradient with
// respect to the image from the patch matrix's gradient cols (rows x taps, float32, rows ld
// elements apart).
#pragma once
#include "kernels/cuda/conv_params.hpp"

namespace kiln::gemm {

struct Col2imParams {
    const float* cols;
    float* image;
    int64_t ld;
    ConvShape shape;
};

} // namespace kiln::gemm
