// kiln's precompiled convolution kernels for sm_90a: implicit-GEMM fprop (sm90/conv_fprop.cuh)
// and weight gradient (sm90/conv_wgrad.cuh) per 16-bit dtype and tile width. Entry names:
// kiln_conv_fprop_<dtype>_<BN>_s<stages>, kiln_conv_fprop_walk_<dtype>_<BN>_s<stages> (sm90/conv_walk.cuh),
// kiln_conv_wgrad_<dtype>_<BN>_s<stages>.
#include "kernels/cuda/sm90/conv_fprop.cuh"
#include "kernels/cuda/sm90/conv_walk.cuh"
#include "kernels/cuda/sm90/conv_wgrad.cuh"

using namespace kiln::gemm;

// BLOCKS: blocks per SM the registers must allow (the 64-wide tile runs two, one's epilogue and
// pipeline fill beside the other's multiplies).
#define KILN_CONV_FPROP(T, tn, BN, ST, BLOCKS)                                                                  \
    extern "C" __global__ void __launch_bounds__(384, BLOCKS)                                                  \
        kiln_conv_fprop_##tn##_##BN##_s##ST(const __grid_constant__ ConvParams p,                              \
                                            const __grid_constant__ CUtensorMap map_b,                         \
                                            const __grid_constant__ CUtensorMap map_a) {                       \
        conv_fprop<T, BN, ST>(p, &map_b, &map_a);                                                              \
    }
KILN_CONV_FPROP(__half, f16, 64, 4, 2)
KILN_CONV_FPROP(__half, f16, 128, 6, 1)
KILN_CONV_FPROP(__half, f16, 256, 4, 1)
KILN_CONV_FPROP(__nv_bfloat16, bf16, 64, 4, 2)
KILN_CONV_FPROP(__nv_bfloat16, bf16, 128, 6, 1)
KILN_CONV_FPROP(__nv_bfloat16, bf16, 256, 4, 1)

#define KILN_CONV_WGRAD(T, tn, BN, ST)                                                                          \
    extern "C" __global__ void __launch_bounds__(384, 1)                                                       \
        kiln_conv_wgrad_##tn##_##BN##_s##ST(const __grid_constant__ ConvParams p,                              \
                                            const __grid_constant__ CUtensorMap map_e,                         \
                                            const __grid_constant__ CUtensorMap map_i) {                       \
        conv_wgrad<T, BN, ST>(p, &map_e, &map_i);                                                              \
    }
KILN_CONV_WGRAD(__half, f16, 64, 8)
KILN_CONV_WGRAD(__half, f16, 128, 6)
KILN_CONV_WGRAD(__half, f16, 256, 4)
KILN_CONV_WGRAD(__nv_bfloat16, bf16, 64, 8)
KILN_CONV_WGRAD(__nv_bfloat16, bf16, 128, 6)
KILN_CONV_WGRAD(__nv_bfloat16, bf16, 256, 4)

#define KILN_CONV_WALK(T, tn, BN, ST)                                                                           \
    extern "C" __global__ void __launch_bounds__(384, 1)                                                       \
        kiln_conv_fprop_walk_##tn##_##BN##_s##ST(const __grid_constant__ ConvParams p,                         \
                                                 const __grid_constant__ CUtensorMap map_b,                    \
                                                 const __grid_constant__ CUtensorMap map_a) {                  \
        conv_fprop_walk<T, BN, ST>(p, &map_b, &map_a);                                                         \
    }
KILN_CONV_WALK(__half, f16, 64, 6)
KILN_CONV_WALK(__half, f16, 128, 5)
KILN_CONV_WALK(__nv_bfloat16, bf16, 64, 6)
KILN_CONV_WALK(__nv_bfloat16, bf16, 128, 5)
