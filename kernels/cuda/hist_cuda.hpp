// The numerics histogram on CUDA contexts (kernels/hist.cpp) by the precompiled kernel hist.cu.
#pragma once
#include <kiln/tensor.hpp>

namespace kiln::gemm {

// Adds the counts of contiguous x's values (float32, float16 or bfloat16) to slot, a (1, bins)
// int32 tensor, by the rule of kiln::hist.
void hist_cuda(const Tensor& x, Tensor& slot, int bins, int offset);

} // namespace kiln::gemm
