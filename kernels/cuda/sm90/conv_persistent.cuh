// The implicit-GEMM fprop on the GEMM's persistent kernel (sm90/persistent.cuh): its walk of a
// block per SM, 4 stages, its consumers' results held in registers and stored a 64-column part
// per k-tile of the next tile through two 8 KB buffers each, with the convolution's producer
// (conv_produce_tma: the patches by TMA in im2col mode, the KTRSC filter by TMA) filling its
// ring. For the 256-wide tile where C's rows are plain and C has the operands' dtype: the
// conv walk's 256-wide tile (conv_walk.cuh) has 3 stages, as its results' staging for any row
// layout (a strided gradient's phases) takes 66 KB, and stores each tile's results before the
// next tile's first multiplies. The raster is the GEMM's (tile_of, group_m rows of tiles at a
// time; the host gives 1: a row of tiles after another, neighbours reading the same patches).
// LEAN kLeanPlain, or kLeanCols with the channel sums (kColSums: each warp's running sums in a
// row of its own of col_partials, [gridDim.x x 8][tiles_n x 256], tiles_n <= 64, the block's
// added into its first at the end). HALVES: A in halves (conv_produce_tma's).
#pragma once
#include "kernels/cuda/sm90/conv_fprop.cuh"
#include "kernels/cuda/sm90/persistent.cuh"

namespace kiln::gemm {

template <class T, int LEAN, bool HALVES = false>
__device__ __forceinline__ void conv_fprop_persistent(const ConvParams& p, const CUtensorMap* map_b,
                                                      const CUtensorMap* map_a, const CUtensorMap* map_c) {
    constexpr int STAGES = 4;
    using Cfg = WgConfig<T, 256, 2, STAGES>;
    if (threadIdx.x == 0) {
        tma_prefetch_descriptor(map_a);
        tma_prefetch_descriptor(map_b);
        tma_prefetch_descriptor(map_c);
    }
    persistent_body<T, STAGES, HALVES ? kKHalves : 0, 0, false, LEAN>(
        p.gemm, map_c, [&](unsigned char* smem, Ring<STAGES>& ring, const Tile& at, int, int ktiles, int& it) {
            conv_produce_tma<T, 256, STAGES, HALVES>(p, smem, ring, map_a, map_b, at.m * Cfg::BM, at.n * 256, ktiles, it);
        });
}

} // namespace kiln::gemm
