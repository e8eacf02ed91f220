// kiln's precompiled convolution kernels for sm_90a: implicit-GEMM fprop (sm90/conv_fprop.cuh)
// and weight gradient (sm90/conv_wgrad.cuh) per 16-bit dtype and tile width. Entry names:
// kiln_conv_fprop_<dtype>_<64|96|128|256>_s<stages>, kiln_conv_fprop_walk_<dtype>_<BN>_s<stages>[_bsum] (sm90/conv_walk.cuh),
// kiln_conv_fprop_pers_<dtype>_256_s4[_cols] (sm90/conv_persistent.cuh),
// kiln_conv_fprop_h_<dtype>_<BN>_s<stages>, kiln_conv_fprop_pers_h_<dtype>_256_s4[_cols] (A in halves: C a
// multiple of 32 but not of 64),
// kiln_conv_fprop_walkt_<dtype>_<64_s4|128_s3> (the roles exchanged: sm90/conv_walk_t.cuh),
// kiln_conv_dgrad_phases_<dtype>_<BN>_s<stages> (a strided gradient's phases in one walk, conv_walk.cuh),
// kiln_conv_wgrad_<dtype>_<BN>_s<stages>, kiln_conv_wgrad_bal_<dtype>_<BN>_s<stages> (the balanced split).
#include "kernels/cuda/sm90/conv_fprop.cuh"
#include "kernels/cuda/sm90/conv_persistent.cuh"
#include "kernels/cuda/sm90/conv_walk.cuh"
#include "kernels/cuda/sm90/conv_walk_t.cuh"
#include "kernels/cuda/sm90/conv_wgrad.cuh"

using namespace kiln::gemm;

// One entry: kiln_conv_<KIND>_<dtype>_<BN>_s<stages> runs FN<T, BN, stages>(p, &map0, &map1).
// BLOCKS: blocks per SM the registers must allow (the 64-wide fprop tile runs two, one's
// epilogue and pipeline fill beside the other's multiplies).
#define KILN_CONV_ENTRY(KIND, FN, T, tn, BN, ST, BLOCKS)                                                        \
    extern "C" __global__ void __launch_bounds__(384, BLOCKS)                                                  \
        kiln_conv_##KIND##_##tn##_##BN##_s##ST(const __grid_constant__ ConvParams p,                           \
                                               const __grid_constant__ CUtensorMap map0,                       \
                                               const __grid_constant__ CUtensorMap map1) {                     \
        FN<T, BN, ST>(p, &map0, &map1);                                                                        \
    }
#define KILN_CONV_DTYPES(KIND, FN, BN, ST, BLOCKS)                                                              \
    KILN_CONV_ENTRY(KIND, FN, __half, f16, BN, ST, BLOCKS)                                                     \
    KILN_CONV_ENTRY(KIND, FN, __nv_bfloat16, bf16, BN, ST, BLOCKS)

// fprop: map0 the filter, map1 the image's im2col descriptor (unused where the patches are gathered).
KILN_CONV_DTYPES(fprop, conv_fprop, 64, 4, 2)
KILN_CONV_DTYPES(fprop, conv_fprop, 128, 6, 1)
KILN_CONV_DTYPES(fprop, conv_fprop, 256, 4, 1)
// 65-96 output channels, where a 128-wide tile would multiply a quarter of its columns for nothing.
KILN_CONV_DTYPES(fprop, conv_fprop, 96, 6, 1)
// The same over A in halves.
template <class T, int BN, int ST>
__device__ __forceinline__ void conv_fprop_halves(const ConvParams& p, const CUtensorMap* map_b, const CUtensorMap* map_a) {
    conv_fprop<T, BN, ST, true>(p, map_b, map_a);
}
KILN_CONV_DTYPES(fprop_h, conv_fprop_halves, 64, 4, 2)
KILN_CONV_DTYPES(fprop_h, conv_fprop_halves, 128, 6, 1)
KILN_CONV_DTYPES(fprop_h, conv_fprop_halves, 256, 4, 1)
// The walk: a third map, C in boxes of 16 rows x 128 bytes (with p.c_by_tma).
#define KILN_CONV_WALK(tn, T, BN, ST)                                                                            \
    extern "C" __global__ void __launch_bounds__(384, 1) kiln_conv_fprop_walk_##tn##_##BN##_s##ST(              \
        const __grid_constant__ ConvParams p, const __grid_constant__ CUtensorMap map0,                         \
        const __grid_constant__ CUtensorMap map1, const __grid_constant__ CUtensorMap map_c) {                  \
        conv_fprop_walk<T, BN, ST>(p, &map0, &map1, &map_c);                                                    \
    }
KILN_CONV_WALK(f16, __half, 64, 6)
KILN_CONV_WALK(bf16, __nv_bfloat16, 64, 6)
KILN_CONV_WALK(f16, __half, 128, 5)
KILN_CONV_WALK(bf16, __nv_bfloat16, 128, 5)
KILN_CONV_WALK(f16, __half, 192, 4)
KILN_CONV_WALK(bf16, __nv_bfloat16, 192, 4)
KILN_CONV_WALK(f16, __half, 256, 3)
KILN_CONV_WALK(bf16, __nv_bfloat16, 256, 3)
// The 256-wide walk with the channel sums (kColSums), an entry of its own.
#define KILN_CONV_WALK_BSUM(tn, T, BN, ST)                                                                       \
    extern "C" __global__ void __launch_bounds__(384, 1) kiln_conv_fprop_walk_##tn##_##BN##_s##ST##_bsum(       \
        const __grid_constant__ ConvParams p, const __grid_constant__ CUtensorMap map0,                         \
        const __grid_constant__ CUtensorMap map1, const __grid_constant__ CUtensorMap map_c) {                  \
        conv_fprop_walk<T, BN, ST, true>(p, &map0, &map1, &map_c);                                              \
    }
KILN_CONV_WALK_BSUM(f16, __half, 256, 3)
KILN_CONV_WALK_BSUM(bf16, __nv_bfloat16, 256, 3)
// A strided gradient's phases in one launch (PHASED): map0 the phases' taps side by side, map1
// E's patch descriptor, then the phases.
#define KILN_CONV_PHASES(tn, T, BN, ST)                                                                          \
    extern "C" __global__ void __launch_bounds__(384, 1) kiln_conv_dgrad_phases_##tn##_##BN##_s##ST(            \
        const __grid_constant__ ConvParams p, const __grid_constant__ CUtensorMap map0,                         \
        const __grid_constant__ CUtensorMap map1, const __grid_constant__ ConvPhases phases) {                  \
        conv_fprop_walk<T, BN, ST, false, true>(p, &map0, &map1, nullptr, &phases);                             \
    }
KILN_CONV_PHASES(f16, __half, 128, 5)
KILN_CONV_PHASES(bf16, __nv_bfloat16, 128, 5)
KILN_CONV_PHASES(f16, __half, 256, 3)
KILN_CONV_PHASES(bf16, __nv_bfloat16, 256, 3)
// The narrow walk with the roles exchanged (conv_walk_t.cuh): map0 the filter, map1 the image's
// im2col descriptor, map_c C in boxes of 256 rows x 128 bytes; a producer and a consumer per 64
// channels (BN = 64 CONSUMERS).
#define KILN_CONV_WALK_T(tn, T, BN, ST, CONSUMERS)                                                               \
    extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1) kiln_conv_fprop_walkt_##tn##_##BN##_s##ST( \
        const __grid_constant__ ConvParams p, const __grid_constant__ CUtensorMap map0,                         \
        const __grid_constant__ CUtensorMap map1, const __grid_constant__ CUtensorMap map_c) {                  \
        conv_fprop_walk_t<T, ST, CONSUMERS>(p, &map0, &map1, &map_c);                                           \
    }
KILN_CONV_WALK_T(f16, __half, 64, 4, 1)
KILN_CONV_WALK_T(bf16, __nv_bfloat16, 64, 4, 1)
KILN_CONV_WALK_T(f16, __half, 128, 3, 2)
KILN_CONV_WALK_T(bf16, __nv_bfloat16, 128, 3, 2)
// On the GEMM's persistent kernel: the same three maps; _cols with the channel sums (kColSums).
#define KILN_CONV_PERSISTENT(tn, T, LEAN, HALVES, h, suffix)                                                    \
    extern "C" __global__ void __launch_bounds__(384, 1) kiln_conv_fprop_pers_##h##tn##_256_s4##suffix(         \
        const __grid_constant__ ConvParams p, const __grid_constant__ CUtensorMap map0,                         \
        const __grid_constant__ CUtensorMap map1, const __grid_constant__ CUtensorMap map_c) {                  \
        conv_fprop_persistent<T, LEAN, HALVES>(p, &map0, &map1, &map_c);                                        \
    }
KILN_CONV_PERSISTENT(f16, __half, kLeanPlain, false, , )
KILN_CONV_PERSISTENT(bf16, __nv_bfloat16, kLeanPlain, false, , )
KILN_CONV_PERSISTENT(f16, __half, kLeanCols, false, , _cols)
KILN_CONV_PERSISTENT(bf16, __nv_bfloat16, kLeanCols, false, , _cols)
KILN_CONV_PERSISTENT(f16, __half, kLeanPlain, true, h_, )
KILN_CONV_PERSISTENT(bf16, __nv_bfloat16, kLeanPlain, true, h_, )
KILN_CONV_PERSISTENT(f16, __half, kLeanCols, true, h_, _cols)
KILN_CONV_PERSISTENT(bf16, __nv_bfloat16, kLeanCols, true, h_, _cols)
// The weight gradient: map0 E, map1 the image's im2col descriptor.
KILN_CONV_DTYPES(wgrad, conv_wgrad, 64, 8, 1)
KILN_CONV_DTYPES(wgrad, conv_wgrad, 128, 6, 1)
KILN_CONV_DTYPES(wgrad, conv_wgrad, 256, 4, 1)
// The weight gradient's balanced split: the same maps, one block an SM.
KILN_CONV_DTYPES(wgrad_bal, conv_wgrad_balanced, 128, 6, 1)
KILN_CONV_DTYPES(wgrad_bal, conv_wgrad_balanced, 256, 4, 1)
