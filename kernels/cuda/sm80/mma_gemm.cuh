// The portable tensor-core kernel (mma_gemm): mma.sync on float16, bfloat16 and tf32, for
// sm_80 and every later GPU, operands through registers into two shared-memory stages
// (operands.cuh), the accumulators finished by the shared epilogue (finish_tile).
#pragma once
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm80/fragments.cuh"
#include "kernels/cuda/sm80/operands.cuh"
#include "kernels/cuda/sm80/ptx.cuh"

namespace kiln::gemm {

template <class E, int BM, int BN, int WARPS_M, int WARPS_N>
struct MmaConfig {
    using T = typename E::T;
    static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
    static constexpr int BK = 32;
    static constexpr int LD = BK + E::kPad;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
    static constexpr int MT = WM / 16, NT = WN / 8;
    static constexpr int kStageElems = (BM + BN) * LD;
    // The pipeline's two stages, or the accumulator tile of the epilogue, whichever is larger.
    static constexpr int kSmemBytes = 2 * kStageElems * int(sizeof(T)) > BM * tile_ld(BN) * 4
                                          ? 2 * kStageElems * int(sizeof(T))
                                          : BM * tile_ld(BN) * 4;
};

template <class E, int BM, int BN, int WARPS_M, int WARPS_N>
__device__ __forceinline__ void mma_gemm(const GemmParams& p) {
    using Cfg = MmaConfig<E, BM, BN, WARPS_M, WARPS_N>;
    using T = typename Cfg::T;
    constexpr int BK = Cfg::BK, LD = Cfg::LD, MT = Cfg::MT, NT = Cfg::NT;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* smem = reinterpret_cast<T*>(smem_raw);

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = (warp / WARPS_N) * Cfg::WM, wn = (warp % WARPS_N) * Cfg::WN;
    const int g = lane / 4, q = lane % 4;
    const BlockWork<T, BM, BN, BK> bw(p);
    const Tile tile_pos = bw.tile;
    const Work w = bw.w;
    const int m0 = bw.m0, n0 = bw.n0;
    const T *A = bw.A, *B = bw.B;
    const int mode_a = bw.mode_a, mode_b = bw.mode_b;

    TileLoader<T, BM, BK, Cfg::kThreads> la;
    TileLoader<T, BN, BK, Cfg::kThreads> lb;
    float acc[MT][NT][4] = {};

    const int ktiles = w.kt_end - w.kt_begin, kbase = w.kt_begin * BK;
    if (ktiles > 0) {
        la.fetch(A, p.a_sm, p.a_sk, p.m, p.k, m0, kbase, mode_a, tid);
        lb.fetch(B, p.b_sn, p.b_sk, p.n, p.k, n0, kbase, mode_b, tid);
        la.template stash<LD>(smem, mode_a, tid);
        lb.template stash<LD>(smem + BM * LD, mode_b, tid);
    }
    __syncthreads();
    for (int kt = 0; kt < ktiles; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < ktiles;
        if (more) {
            la.fetch(A, p.a_sm, p.a_sk, p.m, p.k, m0, kbase + (kt + 1) * BK, mode_a, tid);
            lb.fetch(B, p.b_sn, p.b_sk, p.n, p.k, n0, kbase + (kt + 1) * BK, mode_b, tid);
        }
        const T* As = smem + cur * Cfg::kStageElems;
        const T* Bs = As + BM * LD;
#pragma unroll
        for (int ks = 0; ks < BK; ks += E::kStep) {
            if constexpr (E::kStep == 16) {
                mma_step16<E, MT, NT, LD>(acc, As, Bs, wm, wn, g, q, ks);
            } else {
                uint32_t af[MT][4], bf[NT][2];
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    const float* r0 = reinterpret_cast<const float*>(As) + (wm + 16 * i + g) * LD + ks + q;
                    af[i][0] = to_tf32(r0[0]);
                    af[i][1] = to_tf32(r0[8 * LD]);
                    af[i][2] = to_tf32(r0[4]);
                    af[i][3] = to_tf32(r0[8 * LD + 4]);
                }
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const float* r0 = reinterpret_cast<const float*>(Bs) + (wn + 8 * j + g) * LD + ks + q;
                    bf[j][0] = to_tf32(r0[0]);
                    bf[j][1] = to_tf32(r0[4]);
                }
#pragma unroll
                for (int i = 0; i < MT; ++i)
#pragma unroll
                    for (int j = 0; j < NT; ++j) mma<E>(acc[i][j], af[i], bf[j]);
            }
        }
        if (more) {
            T* next = smem + (cur ^ 1) * Cfg::kStageElems;
            la.template stash<LD>(next, mode_a, tid);
            lb.template stash<LD>(next + BM * LD, mode_b, tid);
        }
        __syncthreads();
    }

    // Epilogue: the accumulators staged in shared memory (the loop above ended on a barrier), then
    // finish_tile.
    float* tile = reinterpret_cast<float*>(smem_raw);
    store_accumulators<MT, NT, tile_ld(BN)>(tile, acc, wm, wn, g, q);
    __syncthreads();
    finish_tile<BM, BN, Cfg::kThreads>(p, tile, m0, n0, tile_pos.n, w.zc, tid);
    bsum_across_tiles<BM>(p, m0, tile_pos.m, w.zc, tid, Cfg::kThreads, [] { __syncthreads(); });
}

} // namespace kiln::gemm
