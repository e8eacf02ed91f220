// Implicit-GEMM convolution (fprop) on sm_90a: the GEMM's ring, mainloop and epilogues with a
// producer of its own. The tile's A operand is 128 output positions x one 128-byte k-tile of
// their image patches; B, the KTRSC filter as a K x taps K-major matrix, comes by TMA like the
// GEMM's. The patch matrix never exists in memory: each image element is read once per tap
// that covers it, from L2 after the first. A comes one of two ways:
//
// - TMA in im2col mode (conv_produce_tma), where C is a multiple of 64 so that a k-tile is 64
//   channels of one tap: one copy per stage brings the 128 positions' pixels at that tap, the
//   hardware walking the output positions (strides, padding, image boundaries) from the tile's
//   first one. One thread issues them.
// - A gather (conv_produce_gather) for the rest (C a multiple of 8, or a geometry the im2col
//   descriptor cannot hold): the producer warpgroup copies with cp.async, one thread per output
//   position and one 16-byte chunk (8 channels of one filter tap) per copy, zeros where the tap
//   falls in the padding or past the filter. The chunks land in the 128-byte swizzle the
//   mainloop's descriptors expect (chunk j of row r at r * 128 + 16 (j ^ r % 8)). A stage is
//   full when thread 0's TMA bytes and all 128 threads have arrived; each thread arrives for a
//   stage once its copies into it are complete and fenced for the tensor cores' (async proxy)
//   reads, STAGES - 2 stages behind its issue, so that several stages' copies are in flight.
//
// Where C is a multiple of 32 but not of 64 (Overfeat's 96 channels), HALVES kernels take A in
// halves (kKHalves, ring.cuh): each half of a k-tile is 32 channels of one tap, so a k-tile may
// span two taps, and no k-tile multiplies padding channels (a k-tile of 64 channels of one tap
// would multiply 128 for 96). TMA brings a half in boxes of 128 positions x 32 channels in the
// 64-byte swizzle (conv_produce_tma); the gather writes the same layout.
#pragma once
#include "kernels/cuda/conv_params.hpp"
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm90/epilogue.cuh"
#include "kernels/cuda/sm90/mainloop.cuh"
#include "kernels/cuda/sm90/producer.cuh"
#include "kernels/cuda/sm90/ptx.cuh"
#include "kernels/cuda/sm90/ring.cuh"

#include <cuda.h>

namespace kiln::gemm {

__device__ __forceinline__ void conv_cp_async16(uint32_t dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

// A TMA copy in im2col mode: the pixels that the descriptor's traversal reaches from the image
// coordinates (c, w, h, d, n) (innermost first; rank 3 has no h or d, rank 4 no d), each moved
// by the filter offsets (ow, oh, od), channelsPerPixel channels each.
__device__ __forceinline__ void tma_load_im2col(int rank, void* dst, const CUtensorMap* map, uint64_t* bar, int c, int w,
                                                int h, int d, int n, uint16_t ow, uint16_t oh, uint16_t od) {
    const uint64_t m = reinterpret_cast<uint64_t>(map);
    if (rank == 3) {
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
                     "%4, %5}], [%2], {%6};" ::"r"(smem_u32(dst)),
                     "l"(m), "r"(smem_u32(bar)), "r"(c), "r"(w), "r"(n), "h"(ow)
                     : "memory");
    } else if (rank == 4) {
        asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
                     "%4, %5, %6}], [%2], {%7, %8};" ::"r"(smem_u32(dst)),
                     "l"(m), "r"(smem_u32(bar)), "r"(c), "r"(w), "r"(h), "r"(n), "h"(ow), "h"(oh)
                     : "memory");
    } else {
        asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
                     "%4, %5, %6, %7}], [%2], {%8, %9, %10};" ::"r"(smem_u32(dst)),
                     "l"(m), "r"(smem_u32(bar)), "r"(c), "r"(w), "r"(h), "r"(d), "r"(n), "h"(ow), "h"(oh), "h"(od)
                     : "memory");
    }
}

// A k-tile's channel block cb and tap (t, r, s) within a window of taps, stepped along from the
// first (divisions on the issuing thread's path per k-tile made it slower than the multiplies).
struct TapStep {
    int cb = 0, s = 0, r = 0, t = 0;
    __device__ __forceinline__ void next(int cblocks, const TapWindow& w) {
        if (++cb == cblocks) {
            cb = 0;
            if (++s == w.S) {
                s = 0;
                if (++r == w.R) r = 0, ++t;
            }
        }
    }
};

// The producer by TMA in im2col mode (one thread: two copies a stage; several issuers measured
// slower here): the tile at (m0, n0), k-tile kt being channels 64 cb .. 64 cb + 63 of tap
// (t, r, s), kt = tap * C / 64 + cb, as in the filter's KTRSC order. `it` counts stage uses
// across the tiles a block takes (stage it % STAGES, use it / STAGES). The descriptor map_a was
// made for the image with this layer's padding, strides and output size (conv_cuda.cpp).
// `w`: the taps (a strided gradient's phase: its own, conv_params.hpp), the whole filter by default.
// HALVES (the whole filter; map_a: boxes of 32 channels in the 64-byte swizzle): a k-tile is two
// halves of 32 channels, each its own copy of its own tap's window; where the taps hold an odd
// number of halves, the last k-tile's second half reads channels C .. C + 31, past the image's,
// which TMA fills with zeros (B's columns past the taps are zeros too).
template <class T, int BN, int STAGES, bool HALVES = false>
__device__ __forceinline__ void conv_produce_tma(const ConvParams& p, unsigned char* smem, Ring<STAGES>& ring,
                                                 const CUtensorMap* map_a, const CUtensorMap* map_b, int m0, int n0,
                                                 int ktiles, int& it, const TapWindow& w) {
    using Cfg = WgConfig<T, BN, 2, STAGES>;
    constexpr int kParts = HALVES ? 2 : 1, kPartK = Cfg::BK / kParts;
    const ConvShape& g = p.shape;
    const RowOrigin o = row_origin(g, m0);
    const int cblocks = g.C / kPartK, parts = HALVES ? p.gemm.k / kPartK : 0;
    TapStep step;
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int st = it % STAGES;
        if (it >= STAGES) mbar_wait(&ring.empty[st], ((it / STAGES) - 1) & 1);
        unsigned char* stage = smem + st * Cfg::kStageBytes;
        mbar_expect_tx(&ring.full[st], Cfg::kABytes + Cfg::kBBytes);
#pragma unroll
        for (int h = 0; h < kParts; ++h) {
            const int part = kParts * kt + h;
            tma_load_im2col(p.im2col_rank, stage + h * (Cfg::kABytes / kParts), map_a, &ring.full[st],
                            !HALVES || part < parts ? step.cb * kPartK : g.C, o.w0, o.h0, o.d0, o.n,
                            uint16_t(w.ow + step.s * g.dil_w), uint16_t(w.oh + step.r * g.dil_h),
                            uint16_t(w.od + step.t * g.dil_d));
            if (!HALVES || part + 1 < parts) step.next(cblocks, w);
        }
        tma_load(stage + Cfg::kABytes, map_b, &ring.full[st], w.k_first + kt * Cfg::BK, n0, 0);
    }
}
template <class T, int BN, int STAGES, bool HALVES = false>
__device__ __forceinline__ void conv_produce_tma(const ConvParams& p, unsigned char* smem, Ring<STAGES>& ring,
                                                 const CUtensorMap* map_a, const CUtensorMap* map_b, int m0, int n0,
                                                 int ktiles, int& it) {
    conv_produce_tma<T, BN, STAGES, HALVES>(p, smem, ring, map_a, map_b, m0, n0, ktiles, it, whole_window(p.shape));
}

// The gathering producer, thread `tid` (0..127): row tid of the tile (output position m0 + tid),
// every k-tile; HALVES: into A's halves (chunk j of row r in half j / 4, at r * 64 + 16 (j % 4 ^
// r / 2 % 4) in it).
template <class T, int BN, int STAGES, bool HALVES = false>
__device__ __forceinline__ void conv_produce_gather(const ConvParams& p, unsigned char* smem, Ring<STAGES>& ring,
                                                    const CUtensorMap* map_b, int m0, int n0, int ktiles, int tid) {
    using Cfg = WgConfig<T, BN, 2, STAGES>;
    constexpr int kLag = STAGES - 2;
    const ConvShape& g = p.shape;
    const int m = m0 + tid;
    const bool row_ok = m < p.gemm.m;
    const RowOrigin o = row_origin(g, row_ok ? m : 0);
    const T* img = static_cast<const T*>(p.image) + int64_t(o.n) * g.D * g.H * g.W * g.C;
    int c = 0, s = 0, r = 0, t = 0;   // the next chunk's filter tap and channel
    const uint32_t row = smem_u32(smem) + uint32_t(tid) * (HALVES ? 64 : 128);
    const int swz = HALVES ? (tid >> 1) & 3 : tid & 7;
    for (int kt = 0; kt < ktiles; ++kt) {
        const int st = kt % STAGES;
        if (kt >= STAGES) mbar_wait(&ring.empty[st], ((kt / STAGES) - 1) & 1);
        if (tid == 0) {
            mbar_expect_tx(&ring.full[st], Cfg::kBBytes);
            tma_load(smem + st * Cfg::kStageBytes + Cfg::kABytes, map_b, &ring.full[st], kt * Cfg::BK, n0, 0);
        }
        const uint32_t dst = row + uint32_t(st * Cfg::kStageBytes);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int d = o.d0 + t * g.dil_d, h = o.h0 + r * g.dil_h, w = o.w0 + s * g.dil_w;
            const bool ok = row_ok && t < g.T && unsigned(d) < unsigned(g.D) && unsigned(h) < unsigned(g.H) &&
                            unsigned(w) < unsigned(g.W);
            const T* src = ok ? img + (int64_t(d * g.H + h) * g.W + w) * g.C + c : static_cast<const T*>(p.image);
            const uint32_t at = HALVES ? uint32_t(j / 4 * (Cfg::kABytes / 2) + (((j % 4) ^ swz) << 4)) : uint32_t((j ^ swz) << 4);
            conv_cp_async16(dst + at, src, ok ? 16 : 0);
            c += 8;
            if (c == g.C) {
                c = 0;
                if (++s == g.S) {
                    s = 0;
                    if (++r == g.R) r = 0, ++t;
                }
            }
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        if (kt >= kLag) {
            asm volatile("cp.async.wait_group %0;\n" ::"n"(kLag) : "memory");
            fence_to_tma();
            mbar_arrive(&ring.full[(kt - kLag) % STAGES]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    fence_to_tma();
    for (int a = ktiles > kLag ? ktiles - kLag : 0; a < ktiles; ++a) mbar_arrive(&ring.full[a % STAGES]);
}

// The start of a convolution kernel's block (thread 0 prefetches the descriptors and sets up the
// ring; everyone waits, then for the grids before unless the one before is a sibling phase,
// siblings as ConvParams::siblings): each stage full after `full_arrivals` arrivals with the TMA
// bytes, empty once lane 0 of each of the consumers' warps is done (`consumers` warpgroups).
template <int STAGES>
__device__ __forceinline__ void conv_block_start(Ring<STAGES>& ring, int full_arrivals, const CUtensorMap* map0,
                                                 const CUtensorMap* map1, uint32_t siblings = 0, int consumers = 2) {
    if (threadIdx.x == 0) {
        tma_prefetch_descriptor(map0);
        if (map1) tma_prefetch_descriptor(map1);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&ring.full[s], full_arrivals);
            mbar_init(&ring.empty[s], 4 * consumers);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (!(siblings & kAfterSibling)) wait_for_prior_grids();
    if (siblings & kBeforeSibling) allow_next_grid();
}
// The end of a consumer of a kernel that started beside the sibling phase before it.
__device__ __forceinline__ void conv_block_end(uint32_t siblings) {
    if (siblings & kAfterSibling) wait_for_prior_grids();
}

// One 128 x BN tile of O per block: blockIdx.x = tile_m * tiles_n + tile_n (the blocks of one
// row of tiles, which read the same patches, run side by side). p.im2col_rank 0 gathers A; 3, 4
// or 5 loads it by TMA through map_a, an im2col descriptor of that rank. HALVES: A in halves.
template <class T, int BN, int STAGES, bool HALVES = false>
__device__ __forceinline__ void conv_fprop(const ConvParams& p, const CUtensorMap* map_b, const CUtensorMap* map_a) {
    using Cfg = WgConfig<T, BN, 2, STAGES>;
    constexpr int BM = Cfg::BM;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem(smem_raw);
    __shared__ __align__(8) Ring<STAGES> ring;
    const GemmParams& g = p.gemm;
    const int tid = threadIdx.x;
    const int tile_n = int(blockIdx.x) % g.tiles_n, tile_m = int(blockIdx.x) / g.tiles_n;
    const int m0 = tile_m * BM, n0 = tile_n * BN;
    const int ktiles = (g.k + Cfg::BK - 1) / Cfg::BK;
    const bool tma_a = p.im2col_rank != 0;
    // (The issuing thread's TMA bytes, and with the gather every producer thread.)
    conv_block_start(ring, tma_a ? 1 : 128 + 1, map_b, tma_a ? map_a : nullptr, p.siblings);

    const int wg = tid / 128;
    if (wg == 0) {
        if (tma_a) {
            int it = 0;
            if (tid == 0) conv_produce_tma<T, BN, STAGES, HALVES>(p, smem, ring, map_a, map_b, m0, n0, ktiles, it);
        } else {
            conv_produce_gather<T, BN, STAGES, HALVES>(p, smem, ring, map_b, m0, n0, ktiles, tid);
        }
        return;
    }
    const int c = wg - 1;
    const int ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32;
    float* bias_s = reinterpret_cast<float*>(smem + STAGES * Cfg::kStageBytes);
    const bool reg_epilogue = rows_of_16_bytes(g);
    if (reg_epilogue) {
        const bool bias = g.flags & kBias;
        for (int i = tid - 128; i < BN; i += 256) bias_s[i] = bias && n0 + i < g.n ? __ldg(g.bias + n0 + i) : 0.f;
    }
    float acc[BN / 2];
    consume_only_tile<T, BN, 2, STAGES, HALVES ? kKHalves : 0, 0>(acc, smem, ring, c, lane, ktiles);
    asm volatile("bar.sync 1, 256;" ::: "memory");   // both consumers are done with the stages
    const int q = lane % 4;
    const int row0 = 64 * c + 16 * warp + lane / 4;
    if (reg_epilogue) {
        store_tile_16bit<T, BM, BN, 256>(g, acc, smem, bias_s, m0, n0, tile_n, 0, row0, q, tid - 128, nullptr, nullptr, 0,
                                         BM, bias_s + BN);
    } else {
        float* tile = reinterpret_cast<float*>(smem);
        stage_accumulators<BN>(tile, acc, row0, q);
        asm volatile("bar.sync 1, 256;" ::: "memory");
        finish_tile<BM, BN, 256>(g, tile, m0, n0, tile_n, 0, tid - 128, nullptr);
    }
    conv_block_end(p.siblings);
}

} // namespace kiln::gemm
