// kiln's precompiled mma.sync convolution kernels (sm80/conv_mma.cuh): implicit-GEMM fprop per
// 16-bit dtype and tile width, for every GPU from sm_80 (sm_90 runs the wgmma kernels of
// conv_sm90.cu, and these where KILN_CONV_KERNEL=mma says so). Entry names:
// kiln_conv_mma_<dtype>_<BN>_s<stages>.
#include "kernels/cuda/sm80/conv_mma.cuh"

using namespace kiln::gemm;

#define KILN_CONV_MMA_ENTRY(E, tn, BN, ST)                                                                    \
    extern "C" __global__ void __launch_bounds__(kConvMmaThreads)                                             \
        kiln_conv_mma_##tn##_##BN##_s##ST(const __grid_constant__ ConvParams p) {                             \
        conv_mma<E, BN, ST>(p);                                                                               \
    }

KILN_CONV_MMA_ENTRY(F16, f16, 64, 4)
KILN_CONV_MMA_ENTRY(BF16, bf16, 64, 4)
KILN_CONV_MMA_ENTRY(F16, f16, 128, 4)
KILN_CONV_MMA_ENTRY(BF16, bf16, 128, 4)
