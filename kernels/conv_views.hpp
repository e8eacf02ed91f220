// im2col and col2im as strided JIT copies (kernels/conv.cpp): col2im on CUDA contexts, and im2col
// where the precompiled im2col kernel is not built. Declared apart so that the unit tests run them on a CPU context against the
// host loops the CPU path uses.
#pragma once
#include <kiln/conv.hpp>

namespace kiln::detail {

// The image I5 (N, D, H, W, C) of layer L as its (N M P Q) x (T R S C) patch matrix, in I5's
// dtype; for a pointwise layer (1 x 1 x 1 filter, stride 1, no padding) I5 itself as a matrix.
Tensor im2col_views(const ConvLayer& L, const Tensor& I5);
// The image-shaped (N, D, H, W, C) float32 sum of every entry of dcols ((N M P Q) x (T R S C))
// at the input position it came from.
Tensor col2im_views(const ConvLayer& L, const Tensor& dcols);

} // namespace kiln::detail
