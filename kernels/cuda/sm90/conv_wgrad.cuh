// Implicit-GEMM weight gradient (update) on sm_90a: the GEMM's ring, mainloop and general
// epilogue with a producer of its own. The gradient of a KTRSC filter is the product
//
//   grad_F^T (taps x K) = patches(I)^T (taps x rows) . E (rows x K)
//
// over the N M P Q output positions (rows), which are many (10^5-10^6) against a small output,
// so the rows are split into k_splits slices, each block adding one slice of one 128 x BN tile.
// Both operands are M/N-major in shared memory (their contiguous axis is the output's, not the
// reduction's), which wgmma reads with its transpose bits: A, 64 taps of 64 pixels per consumer,
// comes by TMA in im2col mode (64 channels of one tap of 64 consecutive output positions, the
// tap's offset fixed for the whole tile: C is a multiple of 64); B, 64 rows of E by BN
// channels, by tiled TMA boxes 64 channels wide. With k_splits > 1 each block stores its raw
// float32 sums as its slice's plane, and the GEMM's reduction kernel adds the planes in order
// and applies the epilogue (deterministic); with one slice the block applies it itself.
#pragma once
#include "kernels/cuda/sm90/conv_fprop.cuh"

namespace kiln::gemm {

// Issuing thread `issuer` of `issuers` (as conv_produce_tma): its share of k-tiles [kt_begin,
// kt_begin + ktiles) (of 64 output positions) of the tile at (m0 taps, n0 channels of E).
template <class T, int BN, int STAGES>
__device__ __forceinline__ void wgrad_produce(const ConvParams& p, unsigned char* smem, Ring<STAGES>& ring,
                                              const CUtensorMap* map_i, const CUtensorMap* map_e, int m0, int n0,
                                              int kt_begin, int ktiles, int issuer, int issuers) {
    using Cfg = WgConfig<T, BN, 2, STAGES>;
    const ConvShape& g = p.shape;
    // Each consumer's 64 taps: channels ch of filter tap (t, r, s), at offsets (s, r, t) x dilation.
    int ch[2];
    uint16_t ow[2], oh[2], od[2];
    bool live[2];
    uint32_t bytes = Cfg::kBBytes;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const int col = m0 + 64 * c;
        live[c] = col < p.gemm.m;
        const int tap = col / g.C;
        ch[c] = col - tap * g.C;
        ow[c] = uint16_t(tap % g.S * g.dil_w);
        oh[c] = uint16_t(tap / g.S % g.R * g.dil_h);
        od[c] = uint16_t(tap / (g.S * g.R) * g.dil_d);
        if (live[c]) bytes += 8192;   // (past the taps A's rows stay unset: the epilogue drops them)
    }
    for (int kt = issuer; kt < ktiles; kt += issuers) {
        const int st = kt % STAGES;
        if (kt >= STAGES) mbar_wait(&ring.empty[st], ((kt / STAGES) - 1) & 1);
        unsigned char* stage = smem + st * Cfg::kStageBytes;
        mbar_expect_tx(&ring.full[st], bytes);
        const int row = (kt_begin + kt) * Cfg::BK;
        const RowOrigin o = row_origin(g, row);
#pragma unroll
        for (int c = 0; c < 2; ++c)
            if (live[c])
                tma_load_im2col(p.im2col_rank, stage + c * 8192, map_i, &ring.full[st], ch[c], o.w0, o.h0, o.d0, o.n, ow[c],
                                oh[c], od[c]);
#pragma unroll
        for (int j = 0; j < BN / 64; ++j) tma_load(stage + Cfg::kABytes + j * 8192, map_e, &ring.full[st], n0 + 64 * j, row, 0);
    }
}

// One 128 x BN tile of grad_F^T, one slice of the rows: blockIdx.x = tile_m * tiles_n + tile_n,
// blockIdx.y the slice (work_of).
template <class T, int BN, int STAGES>
__device__ __forceinline__ void conv_wgrad(const ConvParams& p, const CUtensorMap* map_e, const CUtensorMap* map_i) {
    using Cfg = WgConfig<T, BN, 2, STAGES>;
    constexpr int BM = Cfg::BM;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem(smem_raw);
    __shared__ __align__(8) Ring<STAGES> ring;
    const GemmParams& g = p.gemm;
    const int tid = threadIdx.x;
    const int tile_n = int(blockIdx.x) % g.tiles_n, tile_m = int(blockIdx.x) / g.tiles_n;
    const int m0 = tile_m * BM, n0 = tile_n * BN;
    const Work w = work_of(g, Cfg::BK);
    const int ktiles = w.kt_end - w.kt_begin;
    conv_block_start(ring, 1, map_e, map_i);   // (each stage's issuing thread)

    const int wg = tid / 128;
    if (wg == 0) {
        if (tid % 32 == 0 && tid / 32 < kIssuers<STAGES>)
            wgrad_produce<T, BN, STAGES>(p, smem, ring, map_i, map_e, m0, n0, w.kt_begin, ktiles, tid / 32, kIssuers<STAGES>);
        return;
    }
    const int c = wg - 1;
    const int ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32;
    float acc[BN / 2];
    consume_only_tile<T, BN, 2, STAGES, 1, 1>(acc, smem, ring, c, lane, ktiles);
    asm volatile("bar.sync 1, 256;" ::: "memory");   // both consumers are done with the stages
    const int row0 = 64 * c + 16 * warp + lane / 4;
    float* tile = reinterpret_cast<float*>(smem);
    stage_accumulators<BN>(tile, acc, row0, lane % 4);
    asm volatile("bar.sync 1, 256;" ::: "memory");
    finish_tile<BM, BN, 256>(g, tile, m0, n0, tile_n, w.zc, tid - 128, nullptr);
}

} // namespace kiln::gemm
