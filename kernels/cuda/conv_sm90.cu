// kiln's precompiled convolution kernels for sm_90a (sm90/conv_fprop.cuh): implicit-GEMM fprop
// per 16-bit dtype and tile width. Entry names: kiln_conv_fprop_<dtype>_<BN>_s<stages>.
#include "kernels/cuda/sm90/conv_fprop.cuh"

using namespace kiln::gemm;

#define KILN_CONV_FPROP(T, tn, BN, ST)                                                                          \
    extern "C" __global__ void __launch_bounds__(384, 1)                                                       \
        kiln_conv_fprop_##tn##_##BN##_s##ST(const __grid_constant__ ConvParams p,                              \
                                            const __grid_constant__ CUtensorMap map_b,                         \
                                            const __grid_constant__ CUtensorMap map_a) {                       \
        conv_fprop<T, BN, ST>(p, &map_b, &map_a);                                                              \
    }
KILN_CONV_FPROP(__half, f16, 64, 8)
KILN_CONV_FPROP(__half, f16, 128, 6)
KILN_CONV_FPROP(__half, f16, 256, 4)
KILN_CONV_FPROP(__nv_bfloat16, bf16, 64, 8)
KILN_CONV_FPROP(__nv_bfloat16, bf16, 128, 6)
KILN_CONV_FPROP(__nv_bfloat16, bf16, 256, 4)
