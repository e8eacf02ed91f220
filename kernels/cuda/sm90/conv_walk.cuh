// The implicit-GEMM fprop as a walk: a block per SM takes tiles blockIdx.x, + gridDim.x, ...
// (raster order), its producer running ahead across them by TMA in im2col mode, so that the
// next tile's stages load while the consumers finish this one. The one-tile kernel
// (conv_fprop.cuh) pays each tile's pipeline fill and epilogue with the tensor cores idle,
// which dominates where a tile has few k-tiles (a 1x1 layer, 3x3 over 64 channels).
//
// A tile's results wait in registers, rounded to C's 16-bit dtype, until the next tile's first
// multiplies are issued; each warp then stages its 16 rows in a slice of shared memory of its
// own and stores them while those run (the last tile's after its own). Where C's rows are plain
// (p.c_by_tma: not a phase's grouped rows) one lane hands the slice to TMA in boxes of 16 rows
// x 128 bytes; otherwise each of 16 lanes hands one row to the bulk-copy engine (cp.async.bulk,
// where the tile's part of a row is whole 16-byte chunks), or, failing that, the warp stores
// them, a lane per 16-byte chunk. (The consumer warps' own stores, 8 warps an SM, moved a 1x1
// layer's output at about a third of the bandwidth that TMA's do.) Nothing in the store path
// waits for the other warps. The channel sums (kColSums) stay in each warp's registers across
// the block's tiles of one column of tiles (WarpColSums), so they take no shared memory and no
// barrier a tile. The 256-wide tile here serves a strided gradient's grouped rows and C of another
// 16-bit dtype (plain rows of the layer's dtype walk on the GEMM's persistent kernel,
// conv_persistent.cuh, with 4 stages). It (3 stages) rounds its results straight into the slice and
// stores them at once: its 128 accumulators and 64 rounded registers, held across the next
// tile's first multiplies, spilled. Its channel sums (the entry ending _bsum) take each group of
// 16 columns' pairs as the rounding hands them out (WarpColSums::add_pair); it counts no
// histogram (the host does not take it for that). The 192-wide tile (4 stages; 192 output
// channels in one tile rather than a 128-wide and a half-empty one, or a 256-wide one a quarter
// past the channels) holds its results as the narrower ones do and counts no histogram either.
// 16-bit output whose rows are 16 bytes apart, without beta or stochastic rounding (the host
// checks). Chosen by the host's cost model (conv_cuda.cpp, fprop_plan), KILN_CONV_KERNEL=walk
// or the tuner.
#pragma once
#include "kernels/cuda/sm90/conv_fprop.cuh"

namespace kiln::gemm {

// Shared memory past the stages: the staged results (BM rows of BN + 8 16-bit values, 16 rows
// a warp; by TMA a warp's BN / 64 boxes of 16 rows x 128 bytes in the 128-byte swizzle, 2 KB
// each, in the same space), then each consumer's bias for two tiles in turn (2 x 2 x BN floats).
template <int BN>
constexpr int kWalkStagedBytes = 128 * (BN + 8) * 2;

// Where a warp's staged row r, 16-byte chunk j (columns 8j .. 8j + 7) lies, in 16-bit elements
// from its slice: rows BN + 8 apart, or by TMA in box j / 8, chunk j % 8 of row r at
// (j % 8) ^ (r % 8) (the swizzle; boxes 1024-byte aligned).
template <int BN>
__device__ __forceinline__ int walk_staged_at(bool by_tma, int r, int j) {
    return by_tma ? (j / 8) * 1024 + r * 64 + (((j % 8) ^ (r % 8)) * 8) : r * (BN + 8) + 8 * j;
}

// Warp warp8's 16 rows of the finished tile at (m0, n0) (rows 16 warp8 + g and + 8) from
// registers to C: staged in the warp's slice of shared memory, stage(put) handing each packed
// pair to put(j, h, pair) (row g + 8h, columns 8j + 2q, + 1), then by TMA, by a bulk copy a row
// or a lane per 16-byte chunk of a row. c_at: where the rows start in C, from p.c (a phase's of a
// phased launch; C by TMA: 0).
template <int BN, class Stage>
__device__ __forceinline__ void walk_store_rows(const ConvParams& cp, const CUtensorMap* map_c, Stage&& stage,
                                                uint16_t* slice, int m0, int n0, int warp8, int lane, int64_t c_at) {
    constexpr int kChunks = BN / 8, kRowsPerPass = 32 / kChunks;   // (the 192-wide tile: lanes 24-31 idle)
    const GemmParams& p = cp.gemm;
    const bool by_tma = cp.c_by_tma;
    const int g = lane / 4, q = lane % 4;
    const int cols = p.n - n0 < BN ? p.n - n0 : BN;   // the tile's part of a row
    const bool by_rows = !by_tma && cols % 8 == 0;     // a bulk copy a row, whole 16-byte chunks
    // The warp's previous tile's rows are read: by its lanes, or (each waits for its own) by TMA
    // or the bulk copies.
    if ((by_tma && lane == 0) || (!by_tma && lane < 16)) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    __syncwarp();
    stage([&](int j, int h, uint32_t pair) {
        *reinterpret_cast<uint32_t*>(slice + walk_staged_at<BN>(by_tma, g + 8 * h, j) + 2 * q) = pair;
    });
    if (by_tma || by_rows) fence_to_tma();
    __syncwarp();
    if (by_tma && lane == 0) {
#pragma unroll
        for (int b = 0; b < BN / 64; ++b) tma_store(map_c, slice + b * 1024, n0 + 64 * b, m0 + 16 * warp8, 0);
        tma_store_commit();
    }
    const int row0 = m0 + 16 * warp8;   // the warp's first row (consumer c's warps are 4c .. 4c + 3)
    uint16_t* C = static_cast<uint16_t*>(p.c) + c_at;
    if (by_rows && lane < 16 && row0 + lane < p.m) {
        bulk_store(C + c_row(p, row0 + lane) + n0, slice + walk_staged_at<BN>(false, lane, 0), cols * 2);
        tma_store_commit();
    }
    uint32_t* const hist = BN <= 128 && (p.flags & kHist) ? hist_begin(p, warp8, lane) : nullptr;
    if (((by_tma || by_rows) && !hist) || lane >= kRowsPerPass * kChunks) return;
    const int r_in = lane / kChunks, chunk = lane % kChunks, n = n0 + 8 * chunk;
#pragma unroll
    for (int r = r_in; r < 16; r += kRowsPerPass) {
        const int m = row0 + r;
        if (m >= p.m) break;
        const uint4 v = *reinterpret_cast<const uint4*>(slice + walk_staged_at<BN>(by_tma, r, chunk));
        if (!by_tma && !by_rows) store_chunk_16bit(p, C + c_row(p, m), n, v);
        if (hist) hist_count_words<4>(p, hist, &v.x, p.n - n);
    }
    if (hist) hist_flush(p, hist, lane);
}

// SUMS: the 256-wide tile's channel sums (kColSums), in an entry of their own so that the plain
// tile carries none of their code (a test at run time in the rounding's sink slows it, two
// copies of the epilogue in one kernel spill). The narrower tiles test kColSums at run time.
// PHASED: a strided gradient's phases in one launch (`phases`, conv_params.hpp; C's rows
// grouped, never by TMA): the walk's items are the tiles of one phase's output, and a block
// takes each item's tile of every phase in turn, so that all of them multiply the same rows of
// E, from L2 after the first, and every item costs the same (all the filter's taps).
template <class T, int BN, int STAGES, bool SUMS = false, bool PHASED = false>
__device__ __forceinline__ void conv_fprop_walk(const ConvParams& p, const CUtensorMap* map_b, const CUtensorMap* map_a,
                                                const CUtensorMap* map_c, const ConvPhases* phases = nullptr) {
    using Cfg = WgConfig<T, BN, 2, STAGES>;
    constexpr int BM = Cfg::BM;
    // The 256-wide tile stores its results as soon as they are rounded (held across the next
    // tile's multiplies, they and its accumulators outgrow the registers; the 192-wide tile's
    // 96 accumulators and 48 rounded registers fit).
    constexpr bool kStoreNow = BN > 192;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem(smem_raw);
    __shared__ __align__(8) Ring<STAGES> ring;
    const GemmParams& g = p.gemm;
    const int tid = threadIdx.x;
    const int tiles = g.tiles_m * g.tiles_n;   // items: each a tile of every phase
    const int count = PHASED ? phases->count : 1;
    // Phase f's k-tiles.
    const int whole_ktiles = (g.k + Cfg::BK - 1) / Cfg::BK;
    const auto ktiles_of = [&](int f) { return PHASED ? (phases->phase[f].k + Cfg::BK - 1) / Cfg::BK : whole_ktiles; };
    conv_block_start(ring, 1, map_b, map_a, p.siblings);
    if (tid == 0 && p.c_by_tma) tma_prefetch_descriptor(map_c);

    const int wg = tid / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");   // the consumers' registers: 128 x 40 + 256 x 232 <= 64K
        if (tid == 0) {
            int it = 0;   // stage uses across the block's tiles
            for (int t = int(blockIdx.x); t < tiles; t += int(gridDim.x))
                for (int f = 0; f < count; ++f)
                    conv_produce_tma<T, BN, STAGES>(p, smem, ring, map_a, map_b, t / g.tiles_n * BM, t % g.tiles_n * BN,
                                                    ktiles_of(f), it,
                                                    PHASED ? phase_window(phases->phase[f]) : whole_window(p.shape));
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1;
    const int ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32, q = lane % 4;
    const int warp8 = 4 * c + warp;
    uint16_t* const slice = reinterpret_cast<uint16_t*>(smem + STAGES * Cfg::kStageBytes) +
                            (p.c_by_tma ? warp8 * (BN / 64) * 1024 : 16 * warp8 * (BN + 8));
    float* const bias_c = reinterpret_cast<float*>(smem + STAGES * Cfg::kStageBytes + kWalkStagedBytes<BN>) + c * 2 * BN;
    // kColSums: the warp's running channel sums, in its row of col_partials ([gridDim.x x 8]
    // [tiles_n x BN], tiles_n <= 64), at the end added into the block's first row.
    const bool col_sums = !kStoreNow ? (g.flags & kColSums) != 0 : SUMS;
    WarpColSums<BN> sums;
    sums.row = g.col_partials + (int64_t(blockIdx.x) * 8 + warp8) * (int64_t(g.tiles_n) * BN);
    const bool bias = g.flags & kBias;
    const auto consumer_sync = [c] { asm volatile("bar.sync %0, 128;" ::"r"(2 + c) : "memory"); };
    constexpr int kBiasPerThread = (BN + 127) / 128;   // a consumer's thread loads this many values a tile
    uint32_t results[BN / 4];   // the previous tile's, rounded
    int pending = -1;           // that tile (item x count + phase), or none
    // Where phase f's rows start in C.
    const auto c_at = [&](int f) { return PHASED ? phases->phase[f].c_at : int64_t(0); };
    const auto store_pending = [&] {
        if (pending < 0) return;
        const int item = pending / count;
        const int m0 = item / g.tiles_n * BM, tile_n = item % g.tiles_n;
        const auto staged = [&](auto put) {
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) put(j, h, results[2 * j + h]);
        };
        walk_store_rows<BN>(p, map_c, staged, slice, m0, tile_n * BN, warp8, lane, c_at(pending - item * count));
        if (col_sums) sums.add(g, results, g.m - (m0 + 16 * warp8), lane / 4, q, tile_n);
    };
    int it = 0;
    // The block's u-th tile: item t's of phase f.
    const auto next = [&](int& t, int& f) {
        if (++f == count) f = 0, t += int(gridDim.x);
    };
    for (int t = int(blockIdx.x), f = 0, u = 0; t < tiles; ++u, next(t, f)) {
        const int n0 = t % g.tiles_n * BN, ktiles = ktiles_of(f);
        // This thread's values of the tile's bias, loaded before the main loop, which hides the loads.
        float bias_next[kBiasPerThread];
#pragma unroll
        for (int i = 0; i < kBiasPerThread; ++i) {
            const int col = ctid + 128 * i;
            bias_next[i] = bias && col < BN && n0 + col < g.n ? __ldg(g.bias + n0 + col) : 0.f;
        }
        float acc[BN / 2];
        if constexpr (kStoreNow) consume_tile<T, BN, 2, STAGES, 0, 0, 0>(acc, smem, ring, c, lane, ktiles, it);
        else consume_tile<T, BN, 2, STAGES, 0, 0, 1>(acc, smem, ring, c, lane, ktiles, it, [&](int) { store_pending(); });
        // bias_c[u % 2] was last read two tiles ago, before this consumer's barrier of the last one.
        float* const bias_s = bias_c + (u % 2) * BN;
#pragma unroll
        for (int i = 0; i < kBiasPerThread; ++i)
            if (ctid + 128 * i < BN) bias_s[ctid + 128 * i] = bias_next[i];
        consumer_sync();
        if constexpr (kStoreNow) {
            // Rounded straight into the warp's slice (no results held), and stored; the channel
            // sums taken from the pairs as they go by.
            const int m0 = t / g.tiles_n * BM, rows_left = g.m - (m0 + 16 * warp8);
            if (col_sums) sums.begin(t % g.tiles_n, lane / 4, q);
            with_rounding_choices(g, [&](auto bf16, auto act) {
                walk_store_rows<BN>(
                    p, map_c,
                    [&](auto put) {
                        round_pairs<bf16.value, act.value, BN>(g, acc, bias_s, q, [&](int j, int h, uint32_t v) {
                            put(j, h, v);
                            if (col_sums) sums.add_pair(g, j, h, v, rows_left, lane / 4, q);
                        });
                    },
                    slice, m0, n0, warp8, lane, c_at(f));
            });
            continue;
        }
        float row_sum[2];   // (no row sums here)
        with_rounding_choices(g, [&](auto bf16, auto act) {
            round_results<bf16.value, act.value, false, BN>(g, acc, bias_s, q, results, row_sum);
        });
        pending = t * count + f;
    }
    store_pending();   // the last tile's, with nothing left to hide behind
    if (col_sums) {
        sums.finish(g.tiles_n, lane / 4, q);
        add_block_col_rows<BN>(g, 128 * c + ctid);
    }
    // (The block's shared memory stays until TMA or the bulk copies have read it.)
    if ((p.c_by_tma && lane == 0) || (!p.c_by_tma && lane < 16)) tma_store_wait_all();
    conv_block_end(p.siblings);
}

} // namespace kiln::gemm
