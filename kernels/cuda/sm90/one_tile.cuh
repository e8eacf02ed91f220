// The one-tile kernels (wgmma_gemm): a block per tile, or per k slice of a tile, composed of
// the producer (producer.cuh), the mainloop (mainloop.cuh) and the epilogues (epilogue.cuh),
// with the programmatic launch, cluster and B-sharing setup around them. The entry points
// (gemm_sm90.cu) instantiate it per dtype, layout, tile and epilogue.
#pragma once
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm90/ptx.cuh"
#include "kernels/cuda/sm90/ring.cuh"
#include "kernels/cuda/sm90/producer.cuh"
#include "kernels/cuda/sm90/mainloop.cuh"
#include "kernels/cuda/sm90/epilogue.cuh"

#include <cuda.h>

namespace kiln::gemm {

// SHARE (the 16-wide tile's `_shb` entries): B shared along m (b_multicast > 1), a kernel of its
// own so that the kernels without it keep their code (with both in one kernel the 16-wide
// tile's unshared loop was slower, and in two copies it still ran an instruction a stage
// more).
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB, int LEAN = kGeneral, bool SHARE = false>
__device__ __forceinline__ void wgmma_gemm(const GemmParams& p, const CUtensorMap* map_a, const CUtensorMap* map_b) {
    using Cfg = WgConfig<T, BN, CONSUMERS, STAGES>;
    constexpr int BM = Cfg::BM, BK = Cfg::BK;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem(smem_raw);
    __shared__ __align__(8) Ring<STAGES> ring;

    const int tid = threadIdx.x;
    const Tile at = tile_of(p, tile_index(p));
    const Work w = work_of(p, BK);
    const int z = w.z;
    const int m0 = at.m * BM, n0 = at.n * BN;
    const int ktiles = w.kt_end - w.kt_begin;
    if (tid == 0) {
        tma_prefetch_descriptor(map_a);
        tma_prefetch_descriptor(map_b);
    }
    // Split-K in a cluster through the blocks' registers (split_k_push_epilogue), where the
    // receive buffer fits beside the stages (the host sizes shared memory by the same rule).
    // (The lean twins' splits are all of this kind; see the entry points, gemm_sm90.cu.)
    constexpr bool lean = LEAN != kGeneral;
    const bool push_split = p.k_cluster && (lean ? BN <= kSplitPushMaxBn : split_sums_pushed(p, BN));
    const bool bsum_cluster = LEAN != kLeanPlain && p.bsum_cluster, k_cluster = p.k_cluster;
    if (k_cluster && !push_split && (lean || p.k_splits == 3)) __trap();   // the host's choice of kernel is wrong
    // Completes when the other blocks' sums of this block's rows have landed: their row sums
    // (bsum_cluster) or their slices' sums (push_split).
    __shared__ __align__(8) uint64_t sums_in;
    if ((bsum_cluster || push_split) && tid == 0) {
        mbar_init(&sums_in, 1);
        mbar_expect_tx(&sums_in, bsum_cluster ? bsum_cluster_bytes<BM>(p) : split_incoming_bytes<BM, BN>(p.k_splits));
    }
    // B shared along m (b_multicast): the blocks of a cluster share n0 and their k-tiles.
    static_assert(!SHARE || BN == 16, "only the 16-wide tile shares B");
    BShare share;
    if constexpr (SHARE) {
        share.blocks = p.b_multicast;
        asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(share.rank));
    }
    init_ring<STAGES, CONSUMERS>(ring, share.blocks);   // (its fence publishes sums_in's initialisation to the cluster)
    // Waited for before sums cross blocks, or, with B shared, before the first multicast copy
    // (every block's barriers initialised).
    if (bsum_cluster || push_split || SHARE) cluster_arrive_relaxed();
    // Launched programmatically (gemm_launch.cpp): the setup above overlapped the end of the kernel
    // before this one. The next kernel's blocks may start once every block of this grid allows
    // it (or has exited): the 16-wide tile allows it now (its blocks, two to an SM, share SMs
    // with the next grid's, which do their setup meanwhile); the others once their main loop is
    // done where it is short (under 32 k-tiles), else not at all, so that the next grid's blocks
    // start as this grid's exit. The next grid's blocks waiting on the SMs this grid left idle
    // made the one-block-per-SM kernels slower, the more the longer they streamed; products
    // with short main loops gained from the earlier start, and the 16-wide tile lost when it
    // allowed it only after its main loop or at its exit.
    wait_for_prior_grids();
    if constexpr (BN == 16) allow_next_grid();

    const int wg = tid / 128;
    if (wg == 0) {
        // Producer: lane 0 of the first kIssuers warps keep the ring full.
        if constexpr (CONSUMERS == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if constexpr (SHARE) cluster_wait();
        if (tid % 32 == 0 && tid / 32 < kIssuers<STAGES>) {
            int it = 0;
            const int za = p.a_batch ? z : 0, zb = p.b_batch ? z : 0;
            produce_tile<T, BN, CONSUMERS, STAGES, TA, TB, SHARE>(smem, ring, map_a, map_b, w.kt_begin, ktiles, m0, n0, za, zb,
                                                                  it, tid / 32, kIssuers<STAGES>, share);
        }
        if (k_cluster && !push_split) {   // the consumers' two cluster barriers
            cluster_sync();
            cluster_sync();
        } else if (bsum_cluster || push_split) {   // the barrier arrived at the start
            cluster_wait();
        }
        return;
    }

    // Consumers: warpgroup c multiplies rows [64c, 64c + 64) of the tile.
    if constexpr (CONSUMERS == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1;
    const int ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32;
    // The tile's bias, for the 16-bit epilogue: loaded now, its latency hidden by the main loop
    // (the barrier that opens the epilogue makes it visible).
    float* bias_s = reinterpret_cast<float*>(smem + STAGES * Cfg::kStageBytes);
    if (lean || rows_of_16_bytes(p)) {   // (zeros without a bias: the register epilogue adds it unconditionally)
        const bool bias = p.flags & kBias;
        for (int i = tid - 128; i < BN; i += 128 * CONSUMERS) bias_s[i] = bias && n0 + i < p.n ? __ldg(p.bias + n0 + i) : 0.f;
    }
    float acc[BN / 2];
    consume_only_tile<T, BN, CONSUMERS, STAGES, TA, TB, SHARE>(acc, smem, ring, c, lane, ktiles, share);
    if (BN != 16 && ktiles < 32 && tid == 128) allow_next_grid();   // (one thread a block suffices)

    // Epilogue. Register 4j + r holds row 16 warp + g + 8 (r / 2), column 8j + 2q + r % 2 of
    // this consumer's 64 x BN block. Once both consumers are done with the stages (no TMA is
    // in flight: every stage issued was waited for), the blocks go to shared memory and are
    // written to C row by row.
    constexpr int kConsumerThreads = 128 * CONSUMERS;
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
    const int g = lane / 4, q = lane % 4;
    const int row0 = 64 * c + 16 * warp + g;
    const auto consumers_sync = [] { asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory"); };
    if (bsum_cluster || push_split) cluster_wait();   // the other blocks run, their sums_in initialised
    if (push_split) {
        float4* receive = reinterpret_cast<float4*>(smem + STAGES * Cfg::kStageBytes + BN * 4);   // after the bias
        // The split count as a template argument: the adds and the row groups' owners in
        // straight-line code (with the count at run time the adds were several times slower).
        with_split_count(p.k_splits, [&](auto splits) {
            split_k_push_epilogue<T, BM, BN, kConsumerThreads, splits.value, LEAN>(
                p, acc, smem, bias_s, receive, &sums_in, m0, n0, at, w.zc, c, warp, lane, tid - 128, consumers_sync);
        });
        return;
    }
    if (!lean && k_cluster) {
        split_k_epilogue<BM, BN, kConsumerThreads>(p, acc, reinterpret_cast<float*>(smem), m0, n0, at, w.zc, row0, q,
                                                   tid - 128, consumers_sync);
        return;
    }
    if constexpr (LEAN == kLeanPlain) {
        store_tile_16bit<T, BM, BN, kConsumerThreads, LEAN>(p, acc, smem, bias_s, m0, n0, at.n, w.zc, row0, q, tid - 128,
                                                            nullptr, nullptr);
    } else {
        // bsum_cluster: the row sums of the cluster's tiles (up to 8), this tile's in its slot.
        __shared__ float gathered[8 * BM];
        float* row_sums = gathered + (p.bsum_cluster ? int(blockIdx.x) % p.tiles_n : 0) * BM;
        if (lean || rows_of_16_bytes(p)) {
            if (p.flags & kBsum) zero_columns_past_n<BN>(acc, p.n - n0, q);
            // kColSums: the warps' column sums past the tile's bias (the host adds their bytes).
            store_tile_16bit<T, BM, BN, kConsumerThreads, LEAN>(p, acc, smem, bias_s, m0, n0, at.n, w.zc, row0, q,
                                                                tid - 128, row_sums, &sums_in, 0, BM, bias_s + BN);
        } else if constexpr (!lean) {
            float* tile = reinterpret_cast<float*>(smem);
            stage_accumulators<BN>(tile, acc, row0, q);
            asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
            finish_tile<BM, BN, kConsumerThreads>(p, tile, m0, n0, at.n, w.zc, tid - 128, p.bsum_cluster ? row_sums : nullptr);
        }
        if (p.bsum_cluster) {
            if constexpr (!lean)
                if (!rows_of_16_bytes(p))   // (the 16-bit epilogue added its rows before its C stores)
                    bsum_across_cluster<BM>(p, gathered, &sums_in, m0, w.zc, tid - 128, kConsumerThreads, consumers_sync);
        }
        else bsum_across_tiles<BM>(p, m0, at.m, w.zc, tid - 128, kConsumerThreads, consumers_sync);
    }
}

} // namespace kiln::gemm
