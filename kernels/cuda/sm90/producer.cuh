// The GEMM's producer: TMA loads of A's and B's k-tiles into the ring's stages (ring.cuh), by
// one or several issuing threads, B multicast to the blocks of a cluster that share it. Apart
// from the consumer side so that a kernel whose operands arrive otherwise (a convolution's
// im2col loads) supplies its own producer and keeps the mainloop, epilogues and scheduler.
#pragma once
#include "kernels/cuda/sm90/ptx.cuh"
#include "kernels/cuda/sm90/ring.cuh"

#include <cuda.h>

namespace kiln::gemm {

// Producer: loads k-tile `k0` of the block's tile into stage s (TMA, completing on full[s]).
// With B shared (SHARED, share.blocks > 1) the block loads its share of B's boxes (TB == 0:
// BN / blocks rows of n; TB == 1: BK / blocks rows of k), multicast to every block of the
// cluster: the host's B map has boxes of that size.
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB, bool SHARED = false>
__device__ __forceinline__ void produce_stage(unsigned char* smem, Ring<STAGES>& ring, int s, const CUtensorMap* map_a,
                                              const CUtensorMap* map_b, int k0, int m0, int n0, int za, int zb,
                                              BShare share = {}) {
    using Cfg = WgConfig<T, BN, CONSUMERS, STAGES>;
    unsigned char* sa = smem + s * Cfg::kStageBytes;
    unsigned char* sb = sa + Cfg::kABytes;
    mbar_expect_tx(&ring.full[s], Cfg::kStageBytes);
    if constexpr (TA == 0) {
        tma_load(sa, map_a, &ring.full[s], k0, m0, za);
    } else {
        // M-major: boxes 128 bytes wide along m (64 16-bit rows, 32 tf32 ones), BK k deep.
        constexpr int kBoxM = 128 / int(sizeof(T)), kBoxBytes = 128 * Cfg::BK;
#pragma unroll
        for (int c = 0; c < CONSUMERS; ++c)
#pragma unroll
            for (int h = 0; h < 64 / kBoxM; ++h)
                tma_load(sa + c * 8192 + h * kBoxBytes, map_a, &ring.full[s], m0 + 64 * c + kBoxM * h, k0, za);
    }
    if constexpr (SHARED) {
        const uint16_t all = uint16_t((1u << share.blocks) - 1);
        if constexpr (TB == 0) {
            const int rows = BN / share.blocks;
            tma_load_multicast(sb + share.rank * rows * 128, map_b, &ring.full[s], k0, n0 + share.rank * rows, zb, all);
        } else {
            const int rows = Cfg::BK / share.blocks;
            constexpr int kRowBytes = BN == 16 ? 32 : 128;
#pragma unroll
            for (int j = 0; j < (BN + 63) / 64; ++j)
                tma_load_multicast(sb + j * 8192 + share.rank * rows * kRowBytes, map_b, &ring.full[s], n0 + 64 * j,
                                   k0 + share.rank * rows, zb, all);
        }
        return;
    }
    if constexpr (TB == 0) {
        tma_load(sb, map_b, &ring.full[s], k0, n0, zb);
    } else {
#pragma unroll
        for (int j = 0; j < (BN + 63) / 64; ++j) tma_load(sb + j * 8192, map_b, &ring.full[s], n0 + 64 * j, k0, zb);
    }
}

// Producer: k-tiles [kt_begin, kt_begin + ktiles) of one tile into the ring. `it` counts stage
// uses across the tiles a block walks (stage it % STAGES, use it / STAGES). Several threads
// (`issuers`, a divisor of STAGES; this one `issuer`) may share the work, each taking the
// stages s with s % issuers == issuer, so that each waits on its own stages' barriers in
// order.
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB, bool SHARED = false>
__device__ __forceinline__ void produce_tile(unsigned char* smem, Ring<STAGES>& ring, const CUtensorMap* map_a,
                                             const CUtensorMap* map_b, int kt_begin, int ktiles, int m0, int n0, int za,
                                             int zb, int& it, int issuer = 0, int issuers = 1, BShare share = {}) {
    constexpr int BK = WgConfig<T, BN, CONSUMERS, STAGES>::BK;
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
        if (it % issuers != issuer) continue;
        const int s = it % STAGES;
        if (it >= STAGES) mbar_wait(&ring.empty[s], ((it / STAGES) - 1) & 1);
        produce_stage<T, BN, CONSUMERS, STAGES, TA, TB, SHARED>(smem, ring, s, map_a, map_b, (kt_begin + kt) * BK, m0, n0,
                                                                za, zb, share);
    }
}

// The one-tile kernels' issuing threads (lane 0 of the producer warpgroup's warps 0, 1, ...)
// for a ring of STAGES. One thread's loop spends hundreds of cycles on each stage and on each
// further TMA copy, and threads of different warps issue in parallel, so the narrow products
// run as fast or faster with 4 issuers than with one. (The persistent kernels keep one: two
// changed nothing there.)
template <int STAGES>
constexpr int kIssuers = STAGES % 4 == 0 ? 4 : STAGES % 2 == 0 ? 2 : 1;

} // namespace kiln::gemm
