// The implicit-GEMM fprop as a walk: a block per SM takes tiles blockIdx.x, + gridDim.x, ...
// (raster order), its producer running ahead across them by TMA in im2col mode, so that the
// next tile's stages load while the consumers finish this one and store its results. The
// one-tile kernel (conv_fprop.cuh) pays each tile's pipeline fill and epilogue with the tensor
// cores idle, which dominates where a tile has few k-tiles (a 1x1 layer, 3x3 over 64 channels).
// The results are staged for their stores in a buffer of their own past the stages (the
// register epilogue, store_tile_16bit), since the stages are being refilled meanwhile: 16-bit
// output whose rows are 16 bytes apart, without beta or stochastic rounding (the host checks).
// Chosen by the host's cost model (conv_cuda.cpp, fprop_plan), KILN_CONV_KERNEL=walk or the tuner.
#pragma once
#include "kernels/cuda/sm90/conv_fprop.cuh"

namespace kiln::gemm {

// Shared memory past the stages: the staged results (BM rows of BN + 8 16-bit values), then the
// tile's bias (BN floats), then with kColSums the warps' column sums (8 x BN floats, which the
// epilogue adds into its row of tiles' partials: conv_col_sum_bytes).
template <int BN>
constexpr int kWalkStagedBytes = 128 * (BN + 8) * 2;

template <class T, int BN, int STAGES>
__device__ __forceinline__ void conv_fprop_walk(const ConvParams& p, const CUtensorMap* map_b, const CUtensorMap* map_a) {
    using Cfg = WgConfig<T, BN, 2, STAGES>;
    constexpr int BM = Cfg::BM;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem(smem_raw);
    __shared__ __align__(8) Ring<STAGES> ring;
    const GemmParams& g = p.gemm;
    const int tid = threadIdx.x;
    const int tiles = g.tiles_m * g.tiles_n;
    const int ktiles = (g.k + Cfg::BK - 1) / Cfg::BK;
    conv_block_start(ring, 1, map_b, map_a);

    const int wg = tid / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");   // the consumers' registers: 128 x 40 + 256 x 232 <= 64K
        if (tid == 0) {
            int it = 0;   // stage uses across the block's tiles
            for (int t = int(blockIdx.x); t < tiles; t += int(gridDim.x))
                conv_produce_tma<T, BN, STAGES>(p, smem, ring, map_a, map_b, t / g.tiles_n * BM, t % g.tiles_n * BN,
                                                ktiles, it);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1;
    const int ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32;
    unsigned char* staged = smem + STAGES * Cfg::kStageBytes;
    float* bias_s = reinterpret_cast<float*>(staged + kWalkStagedBytes<BN>);
    const bool bias = g.flags & kBias;
    const int q = lane % 4;
    const int row0 = 64 * c + 16 * warp + lane / 4;
    static_assert(BN <= 256, "a consumer thread loads one bias value a tile");
    const int bias_col = ctid + 128 * c;
    int it = 0;
    for (int t = int(blockIdx.x); t < tiles; t += int(gridDim.x)) {
        const int tile_n = t % g.tiles_n, m0 = t / g.tiles_n * BM, n0 = tile_n * BN;
        // This thread's value of the tile's bias, loaded before the main loop, which hides the load.
        const float bias_next = bias && bias_col < BN && n0 + bias_col < g.n ? __ldg(g.bias + n0 + bias_col) : 0.f;
        float acc[BN / 2];
        consume_tile<T, BN, 2, STAGES, 0, 0>(acc, smem, ring, c, lane, ktiles, it);
        // Both consumers are done with the previous tile's staged results and bias.
        asm volatile("bar.sync 1, 256;" ::: "memory");
        if (bias_col < BN) bias_s[bias_col] = bias_next;
        asm volatile("bar.sync 1, 256;" ::: "memory");
        store_tile_16bit<T, BM, BN, 256>(g, acc, staged, bias_s, m0, n0, tile_n, 0, row0, q, ctid + 128 * c, nullptr,
                                         nullptr, 0, BM, bias_s + BN);
    }
}

} // namespace kiln::gemm
