// The consumers' mainloop: a warpgroup's wgmma multiplies of the ring's stages into its
// accumulators in registers, and the releases that hand each stage back to the producer
// (consume_tile for the persistent kernels' walk, consume_only_tile for the one-tile kernels,
// with tf32 A through registers). It reads stages in the ring's layout (ring.cuh) and does not
// depend on how they were filled, so any producer that fills that layout can drive it.
#pragma once
#include "kernels/cuda/sm90/ptx.cuh"
#include "kernels/cuda/sm90/ring.cuh"

#include <type_traits>

namespace kiln::gemm {

// Consumer c's descriptors of stage 0 at k-step 0, A's and B's. A stage s and a k-step kk
// add their byte offsets (>> 4) to the start address field: the stages lie under 256 KB, so
// the 14-bit field never carries into the next.
struct StageDescs {
    uint64_t a, b;
};
template <class T, int BN, int CONSUMERS, int STAGES>
__device__ __forceinline__ StageDescs stage0_descs(const unsigned char* smem, int c, int ta, int tb) {
    using Cfg = WgConfig<T, BN, CONSUMERS, STAGES>;
    const unsigned char* sa = smem + c * 8192;
    const unsigned char* sb = smem + Cfg::kABytes;
    return {ta == 0 ? smem_desc(sa, 16) : ta == kKHalves ? smem_desc_k64(smem + c * 4096) : smem_desc(sa, 8192),
            tb == 0 ? smem_desc(sb, 16) : BN == 16 ? smem_desc_mn32(sb) : smem_desc(sb, 8192)};
}

// Consumer c: multiplies stage s into its accumulators (rows [64c, 64c + 64) of the tile) and
// commits the wgmma group. `d`: stage0_descs.
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB>
__device__ __forceinline__ void consume_stage(float (&acc)[BN / 2], StageDescs d, unsigned s) {
    using Cfg = WgConfig<T, BN, CONSUMERS, STAGES>;
    // The offsets move the start address field (the low 14 bits) alone: 32-bit adds under the
    // descriptors' fixed high words.
    const uint32_t stage = uint32_t(s * Cfg::kStageBytes) >> 4;
    const uint64_t a_hi = d.a & ~0xFFFFFFFFull, b_hi = d.b & ~0xFFFFFFFFull;
    const uint32_t a_lo = uint32_t(d.a) + stage, b_lo = uint32_t(d.b) + stage;
    fence_regs(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kSteps; ++kk) {
        // K-major: the next 32 bytes of each swizzled row (in halves: of the half's rows, the
        // second half BM rows of 64 bytes after the first); M/N-major: the next 16 (or 8) rows of k.
        const int a_step = TA == 0 ? 32 * kk : TA == kKHalves ? Cfg::BM * 64 * (kk / 2) + 32 * (kk % 2) : 2048 * kk;
        const uint64_t da = a_hi | (a_lo + a_step / 16);
        const uint64_t db = b_hi | (b_lo + (TB == 0 ? 32 * kk : BN == 16 ? 512 * kk : 2048 * kk) / 16);
        Wgmma<BN, T, TA == 1 ? 1 : 0, TB>::run(acc, da, db);
    }
    wgmma_commit();
    fence_regs(acc);
}

// Consumer c (lane `lane` of one of its warps) of a persistent kernel: one tile's product into
// `acc`, zeroed first (a block's only tile: consume_only_tile, below). Each stage is released
// once the multiplies after it are in flight (at most one group outstanding), the last one
// when all are done. `after_issue(kt)` runs for kt < PEEL once k-tile kt's multiplies are
// issued (or where the tile has no k-tile kt): work that overlaps them, such as storing the
// previous tile's results.
struct NothingAfterIssue {
    __device__ void operator()(int) const {}
};
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB, int PEEL = 0, class AfterIssue = NothingAfterIssue>
__device__ __forceinline__ void consume_tile(float (&acc)[BN / 2], const unsigned char* smem, Ring<STAGES>& ring, int c,
                                             int lane, int ktiles, int& it, AfterIssue&& after_issue = {}) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    // Every address the loop needs, as 32-bit shared addresses computed once: derived in the
    // loop from generic pointers, they were rebuilt from the shared window's base (S2R) after
    // each stage's wait, and an unrelated change to the epilogue (more live registers) made
    // the unsplit 64 x 64 tile slower that way.
    const StageDescs descs = stage0_descs<T, BN, CONSUMERS, STAGES>(smem, c, TA, TB);
    const uint32_t full = smem_u32(&ring.full[0]), empty = smem_u32(&ring.empty[0]);
    // The warp known converged here: after the bsum twin's epilogue (lanes storing row sums
    // alone) the compiler could not tell, and reconverged the warp (WARPSYNC) after every
    // stage's wait, building the stage's descriptors there in vector registers: a longer
    // loop than the plain twin's, and a slower bsum twin.
    __syncwarp();
#pragma unroll
    for (int kt = 0; kt < PEEL; ++kt) {
        if (kt < ktiles) {
            mbar_wait(full + 8 * (unsigned(it) % STAGES), (unsigned(it) / STAGES) & 1);
            consume_stage<T, BN, CONSUMERS, STAGES, TA, TB>(acc, descs, unsigned(it) % STAGES);
        }
        after_issue(kt);
        if (kt < ktiles) {
            wgmma_wait<1>();
            fence_regs(acc);
            if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * (unsigned(it - 1) % STAGES));
            ++it;
        }
    }
    // (Following the stage and its phase from one k-tile to the next instead held the
    // persistent kernels' plain product level and slowed their bsum twin. consume_only_tile's
    // unrolled loop needs the ring at stage 0.)
    for (int kt = PEEL; kt < ktiles; ++kt, ++it) {
        const unsigned s = unsigned(it) % STAGES;   // (unsigned: no sign fix-ups in the loop)
        mbar_wait(full + 8 * s, (unsigned(it) / STAGES) & 1);
        consume_stage<T, BN, CONSUMERS, STAGES, TA, TB>(acc, descs, s);
        wgmma_wait<1>();
        fence_regs(acc);
        if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * (unsigned(it - 1) % STAGES));
    }
    wgmma_wait<0>();
    fence_regs(acc);
    if (ktiles > 0 && lane == 0) mbar_arrive(empty + 8 * (unsigned(it - 1) % STAGES));
}

// How a one-tile kernel's consumer warp releases a stage: on this block's empty barrier, or,
// where the cluster's blocks share B (SHARED, BShare), on the empty barriers of every block of
// the cluster, whose producers all write into this block's stages. Those skip the releases
// that no producer waits for (the last STAGES k-tiles'), so that no arrival reaches a block
// after it has exited.
template <int STAGES, bool SHARED>
struct StageRelease {
    uint32_t empty;        // this block's empty[0], a shared::cta address
    uint32_t peer[8];      // SHARED: empty[0] in cluster block r, shared::cluster addresses
    int blocks;
    __device__ __forceinline__ StageRelease(uint32_t empty_cta, const Ring<STAGES>& ring, BShare share)
        : empty(empty_cta), blocks(share.blocks) {
        if constexpr (SHARED) {
#pragma unroll
            for (int r = 0; r < 8; ++r) peer[r] = r < blocks ? cluster_peer_addr(&ring.empty[0], r) : 0;
        }
    }
    // Stage s, which held k-tile kt of ktiles, is read.
    __device__ __forceinline__ void arrive(unsigned s, int kt, int ktiles) const {
        if constexpr (!SHARED) {
            mbar_arrive(empty + 8 * s);
        } else if (kt + STAGES < ktiles) {
#pragma unroll
            for (int r = 0; r < 8; ++r)
                if (r < blocks) mbar_arrive_cluster(peer[r] + 8 * s);
        }
    }
};

// consume_only_tile for tf32 with A M-major (the tk kernels): tf32's shared-memory operands
// must be K-major, so A comes from registers, each thread loading its fragment (a0-a3 of a
// k-step) from the stage's 128-byte swizzled boxes (32 rows of m by BK k each; row k of m's box
// at 128 k, m's 16-byte chunk XOR k % 8). In a warp the loads of one register cover 8 rows of
// m in 4 rows of k: 2 lanes a bank. Each k-step is a group of its own with one of two fragment
// sets, waited for (wgmma_wait<1>) before its set is reloaded, as in the B-in-registers
// kernel: with the four k-steps of a stage in one group and a set per stage, ptxas serialised
// every multiply (C7513: fragment registers written while a group that reads others is in
// flight), which this form avoids (SASS: HGMMA, then WARPGROUP.DEPBAR.LE gsb0, 0x1).
template <int BN, int CONSUMERS, int STAGES>
__device__ __forceinline__ void consume_only_tile_tf32_rega(float (&acc)[BN / 2], const unsigned char* smem, uint64_t b0,
                                                           uint32_t full, uint32_t empty, int c, int lane, int ktiles) {
    using Cfg = WgConfig<float, BN, CONSUMERS, STAGES>;
    const int warp = int(threadIdx.x % 128) / 32, g = lane / 4, q = lane % 4;
    // The shared address in stage 0 of A's element (row m of the consumer's 64, k % 8 = kq) at k-step 0.
    const uint32_t base = smem_u32(smem);
    const auto address = [c, base](int m, int kq) {
        return base + uint32_t(c * 8192 + 4096 * (m / 32) + 128 * kq + 16 * (((m % 32) / 4) ^ kq) + 4 * (m % 4));
    };
    const uint32_t lo_q = address(16 * warp + g, q), hi_q = address(16 * warp + g + 8, q);
    const uint32_t lo_q4 = address(16 * warp + g, q + 4), hi_q4 = address(16 * warp + g + 8, q + 4);
    const uint64_t b_hi = b0 & ~0xFFFFFFFFull;
    uint32_t frag[2][4];
    unsigned phase = 0;   // (consume_only_tile has reconverged the warp)
    for (int kt0 = 0; kt0 < ktiles; kt0 += STAGES, phase ^= 1) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            if (kt0 + s >= ktiles) break;
            mbar_wait(full + 8 * s, phase);
            const uint32_t stage = uint32_t(s * Cfg::kStageBytes);
            const uint32_t b_lo = uint32_t(b0) + (stage >> 4);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                uint32_t(&f)[4] = frag[kk % 2];
                const uint32_t at = stage + 1024 * kk;
                asm volatile("ld.shared.b32 %0, [%1];" : "=r"(f[0]) : "r"(lo_q + at));
                asm volatile("ld.shared.b32 %0, [%1];" : "=r"(f[1]) : "r"(hi_q + at));
                asm volatile("ld.shared.b32 %0, [%1];" : "=r"(f[2]) : "r"(lo_q4 + at));
                asm volatile("ld.shared.b32 %0, [%1];" : "=r"(f[3]) : "r"(hi_q4 + at));
                fence_fragments(f);
                fence_regs(acc);
                wgmma_fence();
                WgmmaTf32RegA<BN>::run(acc, f, b_hi | (b_lo + 2 * kk));
                wgmma_commit();
                fence_regs(acc);
                wgmma_wait<1>();
                fence_fragments(frag[(kk + 1) % 2]);
                fence_regs(acc);
                // The previous stage's last k-step is done: its shared memory is free.
                if (kk == 0 && lane == 0 && kt0 + s > 0) mbar_arrive(empty + 8 * ((s + STAGES - 1) % STAGES));
            }
        }
    }
    wgmma_wait<0>();
    fence_regs(acc);
    fence_fragments(frag[0]);
    fence_fragments(frag[1]);
    if (ktiles > 0 && lane == 0) mbar_arrive(empty + 8 * ((ktiles - 1) % STAGES));
}

// consume_tile for a block's only tile (the one-tile kernels; stage uses from 0): the loop
// unrolled by STAGES, so that each copy's stage, barriers and descriptors are constants and
// only the phase changes from one round of the ring to the next. In the narrow tiles the
// instructions between a stage's arrival and its multiplies set the pace, and the unrolled
// loop issues fewer instructions a k-tile than consume_tile's.
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB, bool SHARED = false>
__device__ __forceinline__ void consume_only_tile(float (&acc)[BN / 2], const unsigned char* smem, Ring<STAGES>& ring,
                                                  int c, int lane, int ktiles, BShare share = {}) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    const StageDescs descs = stage0_descs<T, BN, CONSUMERS, STAGES>(smem, c, TA, TB);
    uint32_t full = smem_u32(&ring.full[0]), empty = smem_u32(&ring.empty[0]);
    // Held in registers: otherwise the compiler rebuilt them from the block's cluster id (S2R,
    // a long-latency read) at the top of each k-tile, between one stage's multiplies and the
    // next stage's wait.
    asm volatile("" : "+r"(full), "+r"(empty));
    __syncwarp();   // (see consume_tile: here it moves the first k-tile's WARPSYNC out of the loop)
    if constexpr (std::is_same_v<T, float> && TA == 1) {
        // (B is never shared here: the host does not share it with these kernels.)
        consume_only_tile_tf32_rega<BN, CONSUMERS, STAGES>(acc, smem, descs.b, full, empty, c, lane, ktiles);
    } else {
        const StageRelease<STAGES, SHARED> release(empty, ring, share);
        unsigned phase = 0;
        for (int kt0 = 0; kt0 < ktiles; kt0 += STAGES, phase ^= 1) {
#pragma unroll
            for (int s = 0; s < STAGES; ++s) {
                if (kt0 + s >= ktiles) break;
                mbar_wait(full + 8 * s, phase);
                consume_stage<T, BN, CONSUMERS, STAGES, TA, TB>(acc, descs, s);
                wgmma_wait<1>();
                fence_regs(acc);
                // The stage before this one is read: released (none before the first k-tile).
                if (lane == 0 && kt0 + s > 0) release.arrive((s + STAGES - 1) % STAGES, kt0 + s - 1, ktiles);
            }
        }
        wgmma_wait<0>();
        fence_regs(acc);
        if (ktiles > 0 && lane == 0) release.arrive((ktiles - 1) % STAGES, ktiles - 1, ktiles);
    }
}

} // namespace kiln::gemm
