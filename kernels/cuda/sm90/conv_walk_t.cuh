// The narrow walk with the product's roles exchanged: O^T = F . patches^T. With at most 64 output
// channels the usual tile (128 positions x 64 channels, conv_walk.cuh) multiplies m64n64k16 on each
// consumer, reading 4 KB of shared memory per 32 tensor cycles, and with the stages' TMA writes beside
// it asks more of shared memory than its 128 bytes a cycle give: the tensor cores wait on it. Here the
// filter's 64 rows are wgmma's M (8 KB a stage) and 256 output positions its N (their patches, two
// im2col boxes of 128, 32 KB): one consumer multiplies m64n256k16, 10 KB read per 128 cycles. Up to 128
// channels two consumers take 64 each (the GEMM's 128 x 256 tile, 3 stages). A block per SM takes tiles
// blockIdx.x, + gridDim.x, ...; its producer runs ahead across them by TMA as in the walk; a consumer's
// 128 accumulators are a tile of O^T (channel rows, position columns), rounded with the bias and
// activation and written transposed by stmatrix into its 256-row x 128-byte slice (the 128-byte
// swizzle, as O's rows in NHWC), which one lane hands to TMA while the next tile multiplies. The
// channel sums (kColSums) are row sums here: each thread's two channels over its positions, added in
// registers across the block's tiles, then over the quad, into the block's row of col_partials (64
// floats a consumer): deterministic. For 16-bit output of the layer's dtype in plain rows, 16 bytes
// apart, without beta, stochastic rounding or a histogram (the host checks: conv_cuda.cpp, walk_t_runs;
// fprop_plan's `transposed`).
#pragma once
#include "kernels/cuda/sm90/conv_fprop.cuh"

namespace kiln::gemm {

// CONSUMERS (1 or 2) of 64 channels each: the stage's A, the filter's 64 CONSUMERS rows x one
// 128-byte k-tile (consumer c multiplies rows 64c ..); B, 256 positions x the same k-tile.
template <class T, int STAGES, int CONSUMERS>
using WalkTConfig = WgConfig<T, 256, CONSUMERS, STAGES>;
// A consumer's staged part of the tile of O past the stages: 256 rows of its 64 channels (128
// bytes), 1024-byte aligned, one TMA box.
constexpr int kWalkTStagedBytes = 256 * 128;

// The producer (one thread): tile m0's k-tiles, the filter's box and the two boxes of patches
// (positions m0 and m0 + 128) a stage, the taps stepped as conv_produce_tma does.
template <class T, int STAGES, int CONSUMERS>
__device__ __forceinline__ void conv_produce_t(const ConvParams& p, unsigned char* smem, Ring<STAGES>& ring,
                                               const CUtensorMap* map_a, const CUtensorMap* map_f, int m0, int ktiles,
                                               int& it) {
    using Cfg = WalkTConfig<T, STAGES, CONSUMERS>;
    const ConvShape& g = p.shape;
    const RowOrigin o[2] = {row_origin(g, m0), row_origin(g, m0 + 128)};
    TapStep step;
    const TapWindow w = whole_window(g);
    for (int kt = 0; kt < ktiles; ++kt, ++it, step.next(g.C / Cfg::BK, w)) {
        const int st = it % STAGES;
        if (it >= STAGES) mbar_wait(&ring.empty[st], ((it / STAGES) - 1) & 1);
        unsigned char* stage = smem + st * Cfg::kStageBytes;
        mbar_expect_tx(&ring.full[st], Cfg::kABytes + Cfg::kBBytes);
        tma_load(stage, map_f, &ring.full[st], kt * Cfg::BK, 0, 0);
#pragma unroll
        for (int b = 0; b < 2; ++b)
            tma_load_im2col(p.im2col_rank, stage + Cfg::kABytes + b * 16384, map_a, &ring.full[st], step.cb * Cfg::BK,
                            o[b].w0, o[b].h0, o[b].d0, o[b].n, uint16_t(w.ow + step.s * g.dil_w),
                            uint16_t(w.oh + step.r * g.dil_h), uint16_t(w.od + step.t * g.dil_d));
    }
}

// Four 8 x 8 blocks of 16-bit values from registers to shared memory, each transposed: lane l
// gives the address of row l % 8 of block l / 8.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}

template <class T, int STAGES, int CONSUMERS>
__device__ __forceinline__ void conv_fprop_walk_t(const ConvParams& p, const CUtensorMap* map_f, const CUtensorMap* map_a,
                                                  const CUtensorMap* map_c) {
    using Cfg = WalkTConfig<T, STAGES, CONSUMERS>;
    constexpr int kChannels = 64 * CONSUMERS;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem(smem_raw);
    __shared__ __align__(8) Ring<STAGES> ring;
    const GemmParams& g = p.gemm;
    const int tid = threadIdx.x;
    const int tiles = (g.m + 255) / 256, ktiles = (g.k + Cfg::BK - 1) / Cfg::BK;
    conv_block_start(ring, 1, map_f, map_a, p.siblings, CONSUMERS);
    if (tid == 0) tma_prefetch_descriptor(map_c);
    if (tid < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) {
            int it = 0;
            for (int t = int(blockIdx.x); t < tiles; t += int(gridDim.x))
                conv_produce_t<T, STAGES, CONSUMERS>(p, smem, ring, map_a, map_f, t * 256, ktiles, it);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = CONSUMERS == 1 ? 0 : tid / 128 - 1, ctid = tid - 128 * (c + 1), warp = ctid / 32, lane = ctid % 32, gr = lane / 4, q = lane % 4;
    unsigned char* const staged = smem + STAGES * Cfg::kStageBytes + c * kWalkTStagedBytes;
    const auto consumer_sync = [c] {
        if constexpr (CONSUMERS == 1) asm volatile("bar.sync 2, 128;" ::: "memory");
        else asm volatile("bar.sync %0, 128;" ::"r"(2 + c) : "memory");
    };
    // This thread's channels: rows 64 c + 16 warp + gr and + 8 of O^T.
    const int ch0 = 64 * c + 16 * warp + gr;
    float bias[2], sums[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) bias[h] = (g.flags & kBias) && ch0 + 8 * h < g.n ? __ldg(g.bias + ch0 + 8 * h) : 0.f;
    const bool col_sums = g.flags & kColSums;
    // Lane l stores row l % 8 of block l / 8 of each four: blocks (j, 0), (j, 1), (j + 1, 0), (j + 1, 1)
    // (positions 8j .. 8j + 7 of channels 8 (2 warp + h) ..): that row is position 8 (j + l / 16) + l % 8, its
    // 16-byte chunk 2 warp + (l / 8) % 2, at (chunk ^ row % 8) in the swizzle.
    const int r_in = lane % 8, chunk = 2 * warp + (lane / 8) % 2;
    const uint32_t lane_at = smem_u32(staged) + uint32_t((8 * (lane / 16) + r_in) * 128 + ((chunk ^ r_in) * 16));
    int it = 0;
    for (int t = int(blockIdx.x); t < tiles; t += int(gridDim.x)) {
        float acc[128];
        consume_tile<T, 256, CONSUMERS, STAGES, 0, 0>(acc, smem, ring, c, lane, ktiles, it);
        // The previous tile's rows are read out of the slice before it is written again.
        if (ctid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        consumer_sync();
        const int m_left = g.m - t * 256;   // positions of the tile inside O
        with_rounding_choices(g, [&](auto bf16, auto act) {
#pragma unroll
            for (int j = 0; j < 32; j += 2) {
                uint32_t v[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int jj = j + i / 2, h = i % 2;
                    const float v0 = activate<act.value>(g.alpha * acc[4 * jj + 2 * h] + bias[h], g.slope),
                                v1 = activate<act.value>(g.alpha * acc[4 * jj + 2 * h + 1] + bias[h], g.slope);
                    v[i] = pack2(v0, v1, bf16.value ? kBF16 : kF16);
                    if (col_sums) {
                        const int pos = 8 * jj + 2 * q;   // (columns past the channels hold zeros: no bias, A's rows zero)
                        const float2 r = unpack2(v[i], bf16.value ? kBF16 : kF16);
                        sums[h] += (pos < m_left ? r.x : 0.f) + (pos + 1 < m_left ? r.y : 0.f);
                    }
                }
                stmatrix_x4_trans(lane_at + uint32_t(j * 8 * 128), v[0], v[1], v[2], v[3]);
            }
        });
        fence_to_tma();
        consumer_sync();
        if (ctid == 0) {
            tma_store(map_c, staged, 64 * c, t * 256, 0);
            tma_store_commit();
        }
    }
    if (col_sums) {
        // Over the quad (positions 2q, 2q + 1 of each block), in a fixed order.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            sums[h] += __shfl_xor_sync(0xffffffffu, sums[h], 1);
            sums[h] += __shfl_xor_sync(0xffffffffu, sums[h], 2);
            if (q == 0) g.col_partials[int64_t(blockIdx.x) * kChannels + ch0 + 8 * h] = sums[h];
        }
    }
    // (The block's shared memory stays until TMA has read the last slice.)
    if (ctid == 0) tma_store_wait_all();
    conv_block_end(p.siblings);
}

} // namespace kiln::gemm
