// The Hopper GEMM kernels (sm_90a): wgmma tensor-core instructions fed by the TMA copy engine
// through a ring of shared-memory stages, one producer warpgroup and one or two consumer
// warpgroups per block (warp specialisation).
//
// Why this shape: on Hopper the tensor cores outrun everything else; the kernel's job is to keep
// them fed. The producer warpgroup (one issuing thread, up to four in the one-tile kernels)
// issues the TMA copies of the next stages while the consumers multiply the current one: loads, address arithmetic and bounds checks (TMA
// fills out-of-range elements with zeros) leave the consumers' instruction stream entirely.
// The producer gives its registers to the consumers (setmaxnreg), whose accumulators live in
// registers: a 64 x BN tile per consumer.
//
// Operands: 16-bit ones may be K-major (k contiguous) or M/N-major (the transposed view; wgmma
// reads it transposed); tf32 needs K-major operands in shared memory (one kernel takes B
// N-major through registers: sm90/persistent_bregs.cuh). Shared-memory tiles use the 128-byte
// swizzle that TMA writes and wgmma reads. Each stage is BK = 128 bytes of k (64 16-bit or 32
// float elements). The epilogue (sm90/epilogue.cuh, gemm_common.cuh) runs on the accumulators
// in registers.
//
// The kernels are composed of pieces by role, in sm90/: ptx.cuh (the instructions), ring.cuh
// (the stages between producer and consumers), producer.cuh (TMA loads), mainloop.cuh (the
// consumers' wgmma loop), epilogue.cuh, scheduler.cuh (the persistent kernels' walk), and the
// kernels composed of them, one_tile.cuh, persistent.cuh and persistent_bregs.cuh; so that
// another kernel (a convolution's, with a producer of its own) can reuse the mainloop, the
// epilogues and the scheduler. This file holds the entry points. It is compiled twice, each
// time into its own module image: KILN_SM90_PART 1 the float16 entries, 2 the bfloat16 and tf32
// ones, so that the two halves (most of the library's build time) compile in parallel; the host
// picks the image by the entry's dtype (gemm_launch.cpp).
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm90/one_tile.cuh"
#include "kernels/cuda/sm90/persistent.cuh"
#include "kernels/cuda/sm90/persistent_bregs.cuh"

#include <cuda.h>

using namespace kiln::gemm;

// Entry points: kiln_gemm_wg_<dtype>_<a major><b major>_<BM>x<BN>_s<stages>, k = K-major,
// t = transposed (M- or N-major). The host (gemm_select.cpp) builds the same names.
#define KILN_WG_KERNEL(T, tn, BN, CONS, ST, TA, TB, ta, tb)                                                      \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                                            \
        kiln_gemm_wg_##tn##_##ta##tb##_##BN##_c##CONS##_s##ST(const __grid_constant__ GemmParams p,             \
                                                               const __grid_constant__ CUtensorMap map_a,        \
                                                               const __grid_constant__ CUtensorMap map_b) {      \
        wgmma_gemm<T, BN, CONS, ST, TA, TB>(p, &map_a, &map_b);                                                  \
    }
// The same kernel for the plain epilogue alone, entry name + "_lean": 16-bit C of the operands'
// dtype in rows of 16 bytes, no beta, stochastic rounding or bsum, splits in a cluster only
// through registers (split_k_push_epilogue); + "_lean_bsum": the same with bsum. Its code is
// a tenth of the general kernel's, which matters because a block runs its epilogue once, each
// instruction line fetched from L2 as it goes, so a one-wave product runs faster on the twin.
#define KILN_WG_LEAN_KERNEL(T, tn, BN, CONS, ST, TA, TB, ta, tb)                                                 \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                                            \
        kiln_gemm_wg_##tn##_##ta##tb##_##BN##_c##CONS##_s##ST##_lean(const __grid_constant__ GemmParams p,      \
                                                                      const __grid_constant__ CUtensorMap map_a, \
                                                                      const __grid_constant__ CUtensorMap map_b) { \
        wgmma_gemm<T, BN, CONS, ST, TA, TB, kLeanPlain>(p, &map_a, &map_b);                                      \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                                            \
        kiln_gemm_wg_##tn##_##ta##tb##_##BN##_c##CONS##_s##ST##_lean_bsum(const __grid_constant__ GemmParams p, \
                                                                           const __grid_constant__ CUtensorMap map_a, \
                                                                           const __grid_constant__ CUtensorMap map_b) { \
        wgmma_gemm<T, BN, CONS, ST, TA, TB, kLeanBsum>(p, &map_a, &map_b);                                       \
    }
// The 16-wide tile with B shared along m (SHARE): entry name + "_shb", and its lean twins
// "_shb_lean" and "_shb_lean_bsum".
#define KILN_WG_SHARED_KERNEL(T, tn, TA, TB, ta, tb, LEAN, suffix)                                               \
    extern "C" __global__ void __launch_bounds__(256, 1)                                                         \
        kiln_gemm_wg_##tn##_##ta##tb##_16_c1_s8_shb##suffix(const __grid_constant__ GemmParams p,               \
                                                            const __grid_constant__ CUtensorMap map_a,           \
                                                            const __grid_constant__ CUtensorMap map_b) {         \
        wgmma_gemm<T, 16, 1, 8, TA, TB, LEAN, true>(p, &map_a, &map_b);                                          \
    }
#define KILN_WG_SHARED_KERNELS(T, tn, TA, TB, ta, tb)             \
    KILN_WG_SHARED_KERNEL(T, tn, TA, TB, ta, tb, kGeneral, )      \
    KILN_WG_SHARED_KERNEL(T, tn, TA, TB, ta, tb, kLeanPlain, _lean) \
    KILN_WG_SHARED_KERNEL(T, tn, TA, TB, ta, tb, kLeanBsum, _lean_bsum)
// Persistent: kiln_gemm_wg_<dtype>_<a><b>_256_c2_s4_p (16-bit C), ..._pf (float32 C), and the
// twins of the 16-bit kernel for C of the operands' dtype only (rule 7), ..._p_lean without bsum
// and ..._p_lean_bsum with it; the first is faster than the general kernel on large products
// too.
#define KILN_WG_PERSISTENT_C(T, tn, TA, TB, ta, tb, C32, LEAN, suffix)                                           \
    extern "C" __global__ void __launch_bounds__(384, 1)                                                        \
        kiln_gemm_wg_##tn##_##ta##tb##_256_c2_s4_##suffix(const __grid_constant__ GemmParams p,                  \
                                                          const __grid_constant__ CUtensorMap map_a,             \
                                                          const __grid_constant__ CUtensorMap map_b,             \
                                                          const __grid_constant__ CUtensorMap map_c) {           \
        wgmma_gemm_persistent<T, 4, TA, TB, C32, LEAN>(p, &map_a, &map_b, &map_c);                               \
    }
#define KILN_WG_PERSISTENT(T, tn, TA, TB, ta, tb)                                     \
    KILN_WG_PERSISTENT_C(T, tn, TA, TB, ta, tb, false, kGeneral, p)                   \
    KILN_WG_PERSISTENT_C(T, tn, TA, TB, ta, tb, true, kGeneral, pf)                   \
    KILN_WG_PERSISTENT_C(T, tn, TA, TB, ta, tb, false, kLeanPlain, p_lean)            \
    KILN_WG_PERSISTENT_C(T, tn, TA, TB, ta, tb, false, kLeanBsum, p_lean_bsum)
#define KILN_WG_CONFIGS(T, tn, TA, TB, ta, tb)         \
    KILN_WG_KERNEL(T, tn, 256, 2, 4, TA, TB, ta, tb)   \
    KILN_WG_KERNEL(T, tn, 128, 2, 6, TA, TB, ta, tb)   \
    KILN_WG_KERNEL(T, tn, 64, 1, 8, TA, TB, ta, tb)    \
    KILN_WG_KERNEL(T, tn, 16, 1, 8, TA, TB, ta, tb)    \
    KILN_WG_KERNEL(T, tn, 64, 2, 8, TA, TB, ta, tb)    \
    KILN_WG_LEAN_KERNEL(T, tn, 128, 2, 6, TA, TB, ta, tb) \
    KILN_WG_LEAN_KERNEL(T, tn, 64, 1, 8, TA, TB, ta, tb) \
    KILN_WG_LEAN_KERNEL(T, tn, 16, 1, 8, TA, TB, ta, tb) \
    KILN_WG_LEAN_KERNEL(T, tn, 64, 2, 8, TA, TB, ta, tb) \
    KILN_WG_SHARED_KERNELS(T, tn, TA, TB, ta, tb)      \
    KILN_WG_PERSISTENT(T, tn, TA, TB, ta, tb)
#define KILN_WG_LAYOUTS(T, tn)                \
    KILN_WG_CONFIGS(T, tn, 0, 0, k, k)        \
    KILN_WG_CONFIGS(T, tn, 0, 1, k, t)        \
    KILN_WG_CONFIGS(T, tn, 1, 0, t, k)        \
    KILN_WG_CONFIGS(T, tn, 1, 1, t, t)
// ..._kk_256_c2_s4_p_lean_cols: the persistent twin that also adds C's column sums (a
// convolution's bsum per channel, whose product is K-major on both sides).
#if !defined(KILN_SM90_PART) || KILN_SM90_PART == 1
KILN_WG_LAYOUTS(__half, f16)
KILN_WG_PERSISTENT_C(__half, f16, 0, 0, k, k, false, kLeanCols, p_lean_cols)
#endif
#if !defined(KILN_SM90_PART) || KILN_SM90_PART == 2
KILN_WG_LAYOUTS(__nv_bfloat16, bf16)
KILN_WG_PERSISTENT_C(__nv_bfloat16, bf16, 0, 0, k, k, false, kLeanCols, p_lean_cols)
KILN_WG_KERNEL(float, tf32, 256, 2, 4, 0, 0, k, k)
KILN_WG_KERNEL(float, tf32, 128, 2, 6, 0, 0, k, k)
KILN_WG_KERNEL(float, tf32, 64, 1, 8, 0, 0, k, k)
KILN_WG_KERNEL(float, tf32, 64, 2, 8, 0, 0, k, k)
KILN_WG_KERNEL(float, tf32, 16, 1, 8, 0, 0, k, k)
// tf32 with A M-major, A through registers (consume_only_tile_tf32_rega).
KILN_WG_KERNEL(float, tf32, 64, 1, 8, 1, 0, t, k)
KILN_WG_KERNEL(float, tf32, 64, 2, 8, 1, 0, t, k)
KILN_WG_KERNEL(float, tf32, 16, 1, 8, 1, 0, t, k)
KILN_WG_PERSISTENT_C(float, tf32, 0, 0, k, k, true, kGeneral, pf)
// tf32 with B N-major, B through registers: 256 x 128 tiles.
extern "C" __global__ void __launch_bounds__(384, 1)
    kiln_gemm_wg_tf32_kt_256x128_c2_s4_pf(const __grid_constant__ GemmParams p, const __grid_constant__ CUtensorMap map_a,
                                          const __grid_constant__ CUtensorMap map_b,
                                          const __grid_constant__ CUtensorMap map_c) {
    wgmma_gemm_persistent_bregs<4>(p, &map_a, &map_b, &map_c);
}
#endif
