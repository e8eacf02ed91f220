// The persistent kernels (wgmma_gemm_persistent): a block per SM walking its tiles
// (scheduler.cuh), the producer running ahead across them (producer.cuh), the consumers'
// mainloop (mainloop.cuh) overlapping the previous tile's TMA stores, and the register
// epilogue (epilogue.cuh).
#pragma once
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm90/ptx.cuh"
#include "kernels/cuda/sm90/ring.cuh"
#include "kernels/cuda/sm90/producer.cuh"
#include "kernels/cuda/sm90/mainloop.cuh"
#include "kernels/cuda/sm90/epilogue.cuh"
#include "kernels/cuda/sm90/scheduler.cuh"

#include <cuda.h>
#include <type_traits>

namespace kiln::gemm {

// The persistent variant, for products of several waves of tiles into C whose rows TMA can
// address, with alpha, bias, ReLU and bsum (no beta or stochastic rounding): one block per
// SM walks the tiles blockIdx.x, + gridDim.x, ... (batches folded in). The producer runs ahead
// across tiles, so the next tile's stages load while the consumers finish this one, and the
// consumers hardly wait for their stores: each applies the epilogue in registers, writes a
// part of its 64 x 256 results (64 x 64 16-bit or 64 x 32 float32 values, one box of 64 rows x
// 128 bytes in the 128-byte swizzle) into one of two buffers of its own, and one thread hands
// the box to TMA; the next part but one waits for TMA to have read it out of the buffer. (In
// the one-tile-per-block kernel the epilogue and a new block's first loads stop the tensor
// cores each tile.) Shared memory holds 4 stages (with 3 the tensor pipe waited on loads more
// often), the four 8 KB buffers, the tile's bias twice (tiles alternate, the consumers share
// it) and the barriers: 227 KB, all there is, so the block's dynamic shared memory must start
// 1024-byte aligned (checked). bsum
// over several tiles per row: the consumers store the tile's row sums as tagged partials and
// the bsum warps of the block that adds the row read them (add_bsum_rows). Column sums
// (kColSums): each warp's running sums in registers, into a row of its own (WarpColSums), the
// block's 8 rows added into its first at the end.
//
// The body takes its producer as `produce(smem, ring, at, z, ktiles, it)`, called by thread 0 for
// each of the block's tiles in order (tile `at` of batch entry z, its k-tiles; `it` counts stage
// uses across them):
// the GEMM's TMA loads of A and B (wgmma_gemm_persistent), or a convolution's patches by TMA
// im2col (sm90/conv_persistent.cuh), with the same ring, mainloop, epilogue and walk.
template <class T, int STAGES, int TA, int TB, bool C32, int LEAN, class Produce>
__device__ __forceinline__ void persistent_body(const GemmParams& p, const CUtensorMap* map_c, Produce&& produce) {
    static_assert(!(LEAN != kGeneral && C32), "the persistent kernels' twins: 16-bit C");
    using Cfg = WgConfig<T, 256, 2, STAGES>;
    constexpr int BM = Cfg::BM, BN = 256, BK = Cfg::BK;
    // A consumer stages its 64 x BN results a part at a time, in two 8 KB buffers used in turn:
    // a part is one box of 64 rows x 128 bytes (64 16-bit or 32 float32 columns), and before a
    // buffer is written again only the store of two parts ago must have read it out. (With
    // one 16 KB buffer and two parts per tile, waiting for the first part's store to leave
    // the buffer took a large share of a tile's epilogue.)
    constexpr int kPartCols = C32 ? 32 : 64, kParts = BN / kPartCols;
    constexpr int kPartBytes = 64 * kPartCols * (C32 ? 4 : 2);
    using Barriers = PersistentBarriers<STAGES, BM>;
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char* staged_base = smem + STAGES * Cfg::kStageBytes;
    float* bias_base = reinterpret_cast<float*>(staged_base + 4 * kPartBytes);   // [2][BN], after 2 x 2 buffers
    Barriers& bars = *reinterpret_cast<Barriers*>(bias_base + 2 * BN);
    Ring<STAGES>& ring = bars.ring;
    const int tid = threadIdx.x;
    const PersistentWalk walk = persistent_walk(p, BK);
    const int per_entry = walk.per_entry, total = walk.total, ktiles = walk.ktiles;
    const bool spans = lean_has_bsum(LEAN) && walk.rows_span_tiles;
    init_persistent_barriers(bars, smem);

    const int wg = tid / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");   // room for the bsum warps' 4 words in flight
        if (tid == 0) {
            int it = 0;
            for (int t = blockIdx.x; t < total; t += gridDim.x) {
                const int z = t / per_entry;
                produce(smem, ring, tile_of(p, t - z * per_entry), z, ktiles, it);
            }
        } else if (spans && tid >= 32) {
            add_bsum_rows<BM, 4>(p, per_entry, total, tid - 32);
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");   // 128 x 56 + 256 x 224 <= 64K
    const int c = wg - 1;
    const int ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32;
    const int g = lane / 4, q = lane % 4;
    unsigned char* staged_bufs = staged_base + c * 2 * kPartBytes;   // this consumer's two buffers
    int part = 0;                                                     // parts staged so far
    const bool bias = p.flags & kBias, relu = p.flags & kRelu;
    const auto consumer_sync = [c] { asm volatile("bar.sync %0, 128;" ::"r"(2 + c) : "memory"); };
    // Part hf of the tile at box = (n0, m0, z) from staged to C: this consumer's 64 rows x
    // kPartCols columns, one TMA box, after every thread of the consumer has written it. Only
    // thread 0 reads the box.
    const auto send_part = [&](unsigned char* staged, const int* box, int hf) {
        fence_to_tma();
        consumer_sync();
        if (ctid == 0) {
            tma_store(map_c, staged, box[0] + kPartCols * hf, box[1], box[2]);
            tma_store_commit();
        }
    };
    // The next staging buffer, once the store of two parts ago has read it out.
    const auto next_buffer = [&] {
        unsigned char* staged = staged_bufs + (part++ % 2) * kPartBytes;
        if (ctid == 0) tma_store_wait_read_but_one();
        consumer_sync();
        return staged;
    };
    // 16-bit C: a tile's results wait in registers, rounded to C's dtype, until the next tile's
    // first multiplies are issued; its parts are stored one per k-tile while those run. (Staged
    // right after their tile's last multiply, the tensor cores idled through every part's
    // barriers and waits.) The block's
    // tiles before tile t wait this way; only the thread that hands parts to TMA needs to know
    // where they go (bars.pending_box: registers are short here).
    uint32_t results[C32 ? 1 : BN / 4];   // register 2j + h: row g + 8h, columns 8j + 2q, + 1
    // kColSums (the kLeanCols twin; a convolution's bsum per channel): each warp's running sums
    // over the block's tiles (WarpColSums) in its row of col_partials ([gridDim.x x 8][tiles_n x
    // BN], tiles_n <= 64), added once the tile's results are rounded. (Added part by part while
    // the next tile multiplies, the callback grew past inlining and took the results array to
    // local memory.)
    WarpColSums<BN> col_sums;
    col_sums.row = p.col_partials + (int64_t(blockIdx.x) * 8 + 4 * c + warp) * (int64_t(p.tiles_n) * BN);
    int* const pending_box = bars.pending_box[c];   // n0, m0, z
    const auto store_pending_part = [&](int hf, int t) {
        if constexpr (!C32) {
            if (t == int(blockIdx.x)) return;
            unsigned char* staged = next_buffer();
#pragma unroll
            for (int jj = 0; jj < kPartCols / 8; ++jj)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *reinterpret_cast<uint32_t*>(staged + (16 * warp + g + 8 * h) * 128 + (jj ^ g) * 16 + 4 * q) =
                        results[2 * (hf * (kPartCols / 8) + jj) + h];
            send_part(staged, pending_box, hf);
            // kHist: the part's values, counted as the part is stored (while the next tile's
            // first multiplies run). Rows and columns past C are not counted.
            if (p.flags & kHist) {
                uint32_t* const h = reinterpret_cast<uint32_t*>(smem + p.hist_smem);
                const int row = pending_box[1] + 16 * warp + g, col = pending_box[0] + kPartCols * hf + 2 * q;
#pragma unroll
                for (int jj = 0; jj < kPartCols / 8; ++jj)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh)
                        if (row + 8 * hh < p.m)
                            hist_count_words<1>(p, h, &results[2 * (hf * (kPartCols / 8) + jj) + hh],
                                                p.n - (col + 8 * jj));
            }
        }
    };
    // kHist: the block's counters past its shared memory (a warp's each would not fit).
    hist_begin_block(p, smem, ctid + 128 * c);
    int it = 0;
    for (int t = blockIdx.x, u = 0; t < total; t += gridDim.x, ++u) {
        const int z = t / per_entry;
        const Tile at = tile_of(p, t - z * per_entry);
        const int m0 = at.m * BM + 64 * c, n0 = at.n * BN;
        // This consumer's half of the tile's bias, loaded now (the main loop hides the loads)
        // and staged after it.
        const int bias_col = 128 * c + ctid;
        const float bias_next = bias && n0 + bias_col < p.n ? __ldg(p.bias + n0 + bias_col) : 0.f;
        float acc[BN / 2];
        consume_tile<T, BN, 2, STAGES, TA, TB, C32 ? 0 : kParts>(acc, smem, ring, c, lane, ktiles, it,
                                                                 [&](int hf) { store_pending_part(hf, t); });

        // bias_s[u % 2] was last read in tile u - 2's epilogue, before both consumers passed
        // tile u - 1's barrier 1.
        float* bias_s = bias_base + (u % 2) * BN;
        bias_s[bias_col] = bias_next;
        asm volatile("bar.sync 1, 256;" ::: "memory");   // both halves of bias_s are in
        // Register 4j + r: row 16 warp + g + 8 (r / 2), column 8j + 2q + r % 2 of this
        // consumer's 64 x BN block. Part hf holds columns [kPartCols hf, kPartCols (hf + 1)),
        // register group jj of it the part's columns 8jj..8jj + 7: 16-bit, 16-byte chunk jj of
        // the row, 4 bytes each; float32, chunk 2 jj + q / 2, 8 bytes each. Row r's chunk c
        // sits at c ^ (r % 8) (the 128-byte swizzle; r % 8 = g).
        float row_sum[2] = {0.f, 0.f};   // bsum: its two rows, whole (16-bit C) or this thread's share (C32)
        if (lean_has_bsum(LEAN) && (p.flags & kBsum)) zero_columns_past_n<BN>(acc, p.n - at.n * BN, q);
        if constexpr (LEAN != kGeneral) {   // C of the operands' dtype, bsum known
            constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>, kSums = LEAN == kLeanBsum;
            if (!relu) round_results<kBf16, kActNone, kSums, BN>(p, acc, bias_s, q, results, row_sum);
            else if (p.slope == 0.f) round_results<kBf16, kActRelu, kSums, BN>(p, acc, bias_s, q, results, row_sum);
            else round_results<kBf16, kActLeaky, kSums, BN>(p, acc, bias_s, q, results, row_sum);
        } else if constexpr (!C32) {
            with_epilogue_choices(p, [&](auto bf16, auto act, auto sums) {
                round_results<bf16.value, act.value, sums.value, BN>(p, acc, bias_s, q, results, row_sum);
            });
        }
        if constexpr (LEAN == kLeanCols) {
            if (p.flags & kColSums) col_sums.add(p, results, p.m - (m0 + 16 * warp), g, q, at.n);
        }
#pragma unroll
        for (int hf = 0; hf < (C32 ? kParts : 0); ++hf) {
            unsigned char* staged = next_buffer();
#pragma unroll
            for (int jj = 0; jj < kPartCols / 8; ++jj) {
                const int j = hf * (kPartCols / 8) + jj;
                const float2 b = *reinterpret_cast<const float2*>(bias_s + 8 * j + 2 * q);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float2 v = epilogue_pair(p, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], b, relu);
                    const int r = 16 * warp + g + 8 * h;
                    *reinterpret_cast<float2*>(staged + r * 128 + ((2 * jj + q / 2) ^ g) * 16 + 8 * (q % 2)) = v;
                    row_sum[h] += v.x + v.y;   // columns past N hold zeros (zero_columns_past_n)
                    if ((p.flags & kHist) && m0 + r < p.m) {
                        uint32_t* const h = reinterpret_cast<uint32_t*>(smem + p.hist_smem);
                        const int n = n0 + 8 * j + 2 * q;
                        if (n < p.n) atomicAdd(h + kiln_hist_bin(v.x, p.hist_bins, p.hist_offset), 1u);
                        if (n + 1 < p.n) atomicAdd(h + kiln_hist_bin(v.y, p.hist_bins, p.hist_offset), 1u);
                    }
                }
            }
            const int box[3] = {n0, m0, z};
            send_part(staged, box, hf);
        }
        if constexpr (!C32) {
            if (ctid == 0) pending_box[0] = n0, pending_box[1] = m0, pending_box[2] = z;
            if (last_of_block(t, total))   // no next tile to hide the stores behind
#pragma unroll
                for (int hf = 0; hf < kParts; ++hf) store_pending_part(hf, t + int(gridDim.x));
        }
        if (lean_has_bsum(LEAN) && (p.flags & kBsum)) {
            // The tile's row sums: to bsum (one tile per row), as tagged partials, or, where the
            // block's last tile adds its row, to its consumers through shared memory.
            const bool add_here = spans && is_row_adder(p, at) && last_of_block(t, total);
            // lane q < 2 delivers row g + 8q
            const float s = C32 ? quad_sum_pair(row_sum[0], row_sum[1], q) : (q & 1) ? row_sum[1] : row_sum[0];
            const int r = 64 * c + 16 * warp + g + 8 * (q & 1), m = at.m * BM + r;
            if (q < 2) deliver_row_sum(p, bars.own_sums, add_here, spans, at.n, z, r, m, s);
            if (add_here) {
                asm volatile("bar.sync 1, 256;" ::: "memory");   // own_sums written by both consumers
                add_row_last<BM, 16>(p, bars.own_sums, at.m * BM, z, ctid + 128 * c, 256);
            }
        }
    }
    if constexpr (LEAN == kLeanCols) {
        if (p.flags & kColSums) {
            col_sums.finish(p.tiles_n, g, q);
            add_block_col_rows<BN>(p, ctid + 128 * c);
        }
    }
    hist_flush_block(p, smem, ctid + 128 * c);
    if (ctid == 0) tma_store_wait_all();
}

// The GEMM: A's and B's k-tiles by TMA (producer.cuh).
template <class T, int STAGES, int TA, int TB, bool C32, int LEAN = kGeneral>
__device__ __forceinline__ void wgmma_gemm_persistent(const GemmParams& p, const CUtensorMap* map_a,
                                                      const CUtensorMap* map_b, const CUtensorMap* map_c) {
    persistent_body<T, STAGES, TA, TB, C32, LEAN>(
        p, map_c, [&](unsigned char* smem, Ring<STAGES>& ring, const Tile& at, int z, int ktiles, int& it) {
            produce_tile<T, 256, 2, STAGES, TA, TB>(smem, ring, map_a, map_b, 0, ktiles, at.m * 128, at.n * 256,
                                                    p.a_batch ? z : 0, p.b_batch ? z : 0, it);
        });
}

} // namespace kiln::gemm
