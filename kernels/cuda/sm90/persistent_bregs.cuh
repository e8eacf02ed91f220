// The tf32 persistent kernel that reads B N-major through registers
// (wgmma_gemm_persistent_bregs). It swaps the operands' roles (C^T = B^T A^T, below), so it
// has its own producer, k-step loop and transposed epilogue, and shares the instructions
// (ptx.cuh), the ring, the walk and bsum's row adding (scheduler.cuh) with the other kernels.
#pragma once
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm90/ptx.cuh"
#include "kernels/cuda/sm90/ring.cuh"
#include "kernels/cuda/sm90/epilogue.cuh"
#include "kernels/cuda/sm90/scheduler.cuh"

#include <cuda.h>

namespace kiln::gemm {

// tf32 wgmma reads only K-major operands from shared memory, but its A operand may come from
// registers, which the threads load in whatever layout shared memory holds. With B N-major (B
// stored K x N: the plain row-major product) this kernel computes C^T = B^T A^T: B's tile is the
// register operand, loaded from its N-major stage with 64-bit shared-memory loads, A's K-major
// tile the shared-memory one, and the epilogue writes the transposed accumulators. It replaces
// a transposing copy of B into K-major order, which read and wrote all of B before each
// product.
//
// The tile is 256 rows of C (M) by 128 columns (N); consumer c multiplies columns
// [64c, 64c + 64): its m64n256k8 multiplies take 64 columns of B as wgmma's M and the 256 rows
// of A as wgmma's N. A stage is A's 256 x 32 K-major box (32 KB) and B's four 32 x 32 N-major
// boxes (4 KB each), all in the 128-byte swizzle.
//
// Which wgmma row (16 warp + g + 8 h; g = lane / 4) stands for which column of B is free (the
// epilogue undoes it), and it is chosen so that both the fragment loads and the epilogue's
// staging writes hit every bank once per half-warp. The row pair (g, g + 8) is a column pair
// (n, n + 1): registers a0, a1 (and a2, a3, four k later) are one 8-byte load. Its 16-byte
// chunk (of 8 per 128-byte row of a box) is t or t ^ 5 for half-warp t = 2 (warp % 2) + g / 4:
// in a half-warp the loads' rows are 4 consecutive k (chunk XOR k % 8 in 0..3 or 4..7) and
// the staging writes' rows 4 rows of C two apart (XOR 2q + r): either way the 16 lanes
// cover 8 chunks x 2 halves.
struct BRegsConfig {
    static constexpr int BM = 256, BN = 128, BK = 32;
    static constexpr int kABytes = BM * 128, kBBytes = BN * 128, kStageBytes = kABytes + kBBytes;
    static constexpr int kParts = 8;                    // a consumer's 256 x 64 results in 32-row parts
    static constexpr int kPartBytes = 32 * 64 * 4;      // two 32 x 32 float32 boxes
};

// One k-step (8 k) of a stage into the accumulators, committed as its own group: this thread's
// B fragment (two 8-byte loads at `stage` + `off0` / `off1`), then the multiply with the
// stage's A tile (at `stage`). `frag` must not be written again before that group is waited for.
__device__ __forceinline__ void consume_kstep_bregs(float (&acc)[128], uint32_t (&frag)[4], const unsigned char* stage,
                                                    int off0, int off1, int kk) {
    const uint2 lo = *reinterpret_cast<const uint2*>(stage + off0 + 1024 * kk);
    const uint2 hi = *reinterpret_cast<const uint2*>(stage + off1 + 1024 * kk);
    frag[0] = lo.x, frag[1] = lo.y, frag[2] = hi.x, frag[3] = hi.y;
    fence_fragments(frag);
    fence_regs(acc);
    wgmma_fence();
    wgmma_tf32_regs(acc, frag, smem_desc(stage + 32 * kk, 16));
    wgmma_commit();
    fence_regs(acc);
}

// bsum in the B-in-registers kernel: a thread holds, of a 32-row part, rows 8 jj + 2 q + r
// (value 2 jj + r, the sum of its two columns); the 8 lanes of a warp that share q hold the
// same rows over different columns. Three exchange-and-add steps (lanes 16, 8 and 4 apart)
// halve the values each time, so that lane (g, q) ends with row 8 (g / 2) + 2 q + g % 2 of
// the part summed over the warp's 16 columns: 7 shuffles, in a fixed order. (Reading each
// part's values back from the staged buffer instead put those reads on the consumers' path
// between parts, where they were most of bsum's cost.)
__device__ __forceinline__ float sum_over_columns_scattered(const float (&v)[8], int g) {
    const bool hi4 = g & 4, hi2 = g & 2, hi1 = g & 1;
    float h4[4], h2[2];
#pragma unroll
    for (int k = 0; k < 4; ++k) h4[k] = (hi4 ? v[k + 4] : v[k]) + __shfl_xor_sync(0xffffffffu, hi4 ? v[k] : v[k + 4], 16);
#pragma unroll
    for (int k = 0; k < 2; ++k) h2[k] = (hi2 ? h4[k + 2] : h4[k]) + __shfl_xor_sync(0xffffffffu, hi2 ? h4[k] : h4[k + 2], 8);
    return (hi1 ? h2[1] : h2[0]) + __shfl_xor_sync(0xffffffffu, hi1 ? h2[0] : h2[1], 4);
}

// A persistent kernel (the walk, the producer, bsum's counting warps and the parts' double
// buffering as in wgmma_gemm_persistent) for tf32 into float32 C with A K-major and B
// N-major. Shared memory: 4 stages of 48 KB, four 8 KB staging buffers, 1 KB of row sums and
// the barriers, 225 KB.
template <int STAGES>
__device__ __forceinline__ void wgmma_gemm_persistent_bregs(const GemmParams& p, const CUtensorMap* map_a,
                                                            const CUtensorMap* map_b, const CUtensorMap* map_c) {
    using Cfg = BRegsConfig;
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kPartBytes = Cfg::kPartBytes;
    using Barriers = PersistentBarriers<STAGES, BM>;
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char* staged_base = smem + STAGES * Cfg::kStageBytes;
    float* other_sums = reinterpret_cast<float*>(staged_base + 4 * kPartBytes);   // bsum: consumer 0's share of the tile's row sums [BM]
    Barriers& bars = *reinterpret_cast<Barriers*>(other_sums + BM);
    Ring<STAGES>& ring = bars.ring;
    const int tid = threadIdx.x;
    const PersistentWalk walk = persistent_walk(p, BK);
    const int per_entry = walk.per_entry, total = walk.total, ktiles = walk.ktiles;
    const bool spans = walk.rows_span_tiles;
    init_persistent_barriers(bars, smem);

    const int wg = tid / 128;
    if (wg == 0) {
        // Room for the bsum warps' 8 words in flight; the consumers need no more than the 168
        // registers the kernel is compiled for (128 x 88 + 256 x 200 <= 64K).
        asm volatile("setmaxnreg.dec.sync.aligned.u32 88;\n");
        if (tid == 0) {
            int it = 0;
            for (int t = blockIdx.x; t < total; t += gridDim.x) {
                const int z = t / per_entry;
                const Tile at = tile_of(p, t - z * per_entry);
                const int m0 = at.m * BM, n0 = at.n * BN, za = p.a_batch ? z : 0, zb = p.b_batch ? z : 0;
                for (int kt = 0; kt < ktiles; ++kt, ++it) {
                    const int s = it % STAGES;
                    if (it >= STAGES) mbar_wait(&ring.empty[s], ((it / STAGES) - 1) & 1);
                    unsigned char* sa = smem + s * Cfg::kStageBytes;
                    mbar_expect_tx(&ring.full[s], Cfg::kStageBytes);
                    tma_load(sa, map_a, &ring.full[s], kt * BK, m0, za);
#pragma unroll
                    for (int j = 0; j < BN / 32; ++j)
                        tma_load(sa + Cfg::kABytes + 4096 * j, map_b, &ring.full[s], n0 + 32 * j, kt * BK, zb);
                }
            }
        } else if (spans && tid >= 32) {
            add_bsum_rows<BM, 8>(p, per_entry, total, tid - 32);
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 200;\n");
    const int c = wg - 1;
    const int ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32;
    const int g = lane / 4, q = lane % 4;
    // This thread's wgmma rows (g, g + 8) are B's columns (n, n + 1) of box `box` (32 columns)
    // of the stage, chunk `chunk`, half `half` (see the section's comment).
    const int box = 2 * c + warp / 2, chunk = (2 * (warp % 2) + g / 4) ^ (5 * ((g / 2) % 2)), half = g % 2;
    const int n_in_tile = 32 * box + 4 * chunk + 2 * half;
    // Fragment loads: rows k = q and q + 4 of each 8 k (the swizzle XORs the chunk with k % 8).
    const int b_off = Cfg::kABytes + 4096 * box + 8 * half;
    const int off0 = b_off + 128 * q + 16 * (chunk ^ q), off1 = b_off + 128 * (q + 4) + 16 * (chunk ^ (q + 4));
    unsigned char* staged_bufs = staged_base + c * 2 * kPartBytes;   // this consumer's two buffers
    const bool bias = p.flags & kBias, relu = p.flags & kRelu, bsum = p.flags & kBsum;
    const auto consumer_sync = [c] { asm volatile("bar.sync %0, 128;" ::"r"(2 + c) : "memory"); };
    int part = 0, it = 0;
    uint32_t frag[2][4];
    hist_begin_block(p, smem, ctid + 128 * c);   // kHist: the block's counters
    for (int t = blockIdx.x, u = 0; t < total; t += gridDim.x, ++u) {
        const int z = t / per_entry;
        const Tile at = tile_of(p, t - z * per_entry);
        const int m0 = at.m * BM, n = at.n * BN + n_in_tile;
        const float2 b = bias ? make_float2(n < p.n ? __ldg(p.bias + n) : 0.f, n + 1 < p.n ? __ldg(p.bias + n + 1) : 0.f)
                              : make_float2(0.f, 0.f);
        float acc[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) acc[i] = 0.f;
        // Each k-step is a group of its own, with one of two fragment sets (4 registers each):
        // k-step i loads set i % 2 while the group of k-step i - 1 may still run, then waits
        // for that group, which frees the other set. (A fragment set per stage, 16 registers,
        // twice, would not fit beside the 128 accumulators in the 168 registers a thread has
        // at 384 threads per block: it spilled.)
        // The warp known converged, and the stage index unsigned, as in consume_tile: fewer
        // instructions a k-tile, without a reconvergence after each wait.
        __syncwarp();
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
            const unsigned s = unsigned(it) % STAGES;
            mbar_wait(&ring.full[s], (unsigned(it) / STAGES) & 1);
            const unsigned char* stage = smem + s * Cfg::kStageBytes;
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                consume_kstep_bregs(acc, frag[kk % 2], stage, off0, off1, kk);
                wgmma_wait<1>();
                fence_fragments(frag[(kk + 1) % 2]);
                fence_regs(acc);
                // The previous stage's last k-step is done: its shared memory is free.
                if (kk == 0 && kt > 0 && lane == 0) mbar_arrive(&ring.empty[unsigned(it - 1) % STAGES]);
            }
        }
        wgmma_wait<0>();
        fence_regs(acc);
        fence_fragments(frag[0]);
        fence_fragments(frag[1]);
        if (ktiles > 0 && lane == 0) mbar_arrive(&ring.empty[(it - 1) % STAGES]);

        // Register 4j + 2h + r: C row 8j + 2q + r of the tile, column n + h (zeroed past N for
        // bsum, as zero_columns_past_n does for the other layout). Part hf holds rows
        // [32 hf, 32 hf + 32) of this consumer's 64 columns, as two 32 x 32 boxes (box % 2);
        // row r's chunk x sits at x ^ (r % 8).
        // bsum: part hf's row 8 (g / 2) + 2 q + g % 2 over this warp's 16 columns.
        float sums[Cfg::kParts];
        if (bsum && n + 1 >= p.n)
#pragma unroll
            for (int i = 0; i < 128; ++i)
                if (n + (i / 2) % 2 >= p.n) acc[i] = 0.f;
#pragma unroll
        for (int hf = 0; hf < Cfg::kParts; ++hf, ++part) {
            unsigned char* staged = staged_bufs + (part % 2) * kPartBytes;
            if (ctid == 0) tma_store_wait_read_but_one();   // the store of two parts ago is out
            consumer_sync();
            float pair_sums[8];   // bsum: rows 8 jj + 2 q + r (index 2 jj + r), this thread's 2 columns
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int j = 4 * hf + jj;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float2 v = epilogue_pair(p, acc[4 * j + r], acc[4 * j + 2 + r], b, relu);
                    const int row = 8 * jj + 2 * q + r;
                    *reinterpret_cast<float2*>(staged + 4096 * (box % 2) + 128 * row + 16 * (chunk ^ (row % 8)) + 8 * half) = v;
                    pair_sums[2 * jj + r] = v.x + v.y;   // columns past N hold zeros (zeroed above)
                    if ((p.flags & kHist) && m0 + 32 * hf + row < p.m) {
                        uint32_t* const h = reinterpret_cast<uint32_t*>(smem + p.hist_smem);
                        if (n < p.n) atomicAdd(h + kiln_hist_bin(v.x, p.hist_bins, p.hist_offset), 1u);
                        if (n + 1 < p.n) atomicAdd(h + kiln_hist_bin(v.y, p.hist_bins, p.hist_offset), 1u);
                    }
                }
            }
            if (bsum) sums[hf] = sum_over_columns_scattered(pair_sums, g);
            fence_to_tma();
            consumer_sync();
            if (ctid == 0) {
                tma_store(map_c, staged, at.n * BN + 64 * c, m0 + 32 * hf, z);
                tma_store(map_c, staged + 4096, at.n * BN + 64 * c + 32, m0 + 32 * hf, z);
                tma_store_commit();
            }
        }
        if (bsum) {
            // The tile's row sums over the 8 warps' columns: each consumer adds its 4 warps'
            // in turn (warp 0 to 3) into an array of its own in shared memory, the two at once,
            // one barrier per turn; then each row is consumer 0's sum plus consumer 1's. Lane
            // (g, q) of each warp holds, per part, the row 8 (g / 2) + 2 q + g % 2 of the part.
            // Consumer 1's array is own_sums, which only the block's last tile uses otherwise,
            // after these reads (each thread writes there only the row it has read). (The 8
            // warps in turn into one array took 9 barriers a tile, not 5, and made bsum cost
            // more.)
            float* row_sums = c == 0 ? other_sums : bars.own_sums;
            asm volatile("bar.sync 1, 256;" ::: "memory");   // the last tile's rows are delivered
#pragma unroll 1
            for (int turn = 0; turn < 4; ++turn) {
                if (warp == turn)
#pragma unroll
                    for (int hf = 0; hf < Cfg::kParts; ++hf) {
                        const int r = 32 * hf + 8 * (g / 2) + 2 * q + g % 2;
                        row_sums[r] = turn == 0 ? sums[hf] : row_sums[r] + sums[hf];
                    }
                asm volatile("bar.sync 1, 256;" ::: "memory");
            }
            // The tile's row sums: to bsum (one tile per row), as tagged partials, or, where the
            // block's last tile adds its row, to its consumers through shared memory.
            const bool add_here = spans && is_row_adder(p, at) && last_of_block(t, total);
            const int r = ctid + 128 * c;
            const float row_sum = other_sums[r] + bars.own_sums[r];
            deliver_row_sum(p, bars.own_sums, add_here, spans, at.n, z, r, m0 + r, row_sum);
            if (add_here) {
                asm volatile("bar.sync 1, 256;" ::: "memory");   // own_sums is complete
                add_row_last<BM, 24>(p, bars.own_sums, m0, z, r, 256);
            }
        }
    }
    hist_flush_block(p, smem, ctid + 128 * c);
    if (ctid == 0) tma_store_wait_all();
}

} // namespace kiln::gemm
