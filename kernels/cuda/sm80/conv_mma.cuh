// Implicit-GEMM convolution (fprop) with mma.sync, for every GPU from sm_80: the portable
// counterpart of sm90/conv_fprop.cuh, whose wgmma and TMA only sm_90a has. It computes
// O (rows x K) = patches(I) . F^T as conv_params.hpp defines it, the patch matrix never in
// memory. A block takes 128 output positions x BN output channels and walks the taps in
// k-tiles of 32 (four 16-byte chunks of 8 channels of one filter tap: C is a multiple of 8):
// each thread gathers its position's chunks with cp.async (zeros where a tap falls in the
// padding or past the filter) and the filter rows' chunks beside them, STAGES - 1 k-tiles ahead
// of the multiplies. Rows are padded to 40 elements (80 bytes), so the fragments' 32-bit reads
// of eight rows meet eight different bank groups. 8 warps, 4 along the positions and 2 along the
// channels, multiply m16n8k16 fragments with float32 accumulators, which go through shared
// memory into the GEMM's epilogue (finish_tile: alpha, bias, activation, beta, rounding or
// stochastic rounding into C's dtype, the histogram; a strided gradient's phase through C's
// grouped rows).
#pragma once
#include "kernels/cuda/conv_params.hpp"
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm80/fragments.cuh"
#include "kernels/cuda/sm80/ptx.cuh"

namespace kiln::gemm {

template <class E, int BN, int STAGES>
struct ConvMmaConfig {
    using T = typename E::T;
    static constexpr int BM = kConvMmaRows, BK = 32, kThreads = kConvMmaThreads;
    static constexpr int LD = BK + E::kPad;   // elements per shared row
    static constexpr int WARPS_M = 4, WARPS_N = 2, WM = BM / WARPS_M, WN = BN / WARPS_N;
    static constexpr int MT = WM / 16, NT = WN / 8;
    static constexpr int kChunks = BK / 8;                       // 16-byte chunks per row and k-tile
    static constexpr int kAChunks = BM * kChunks / kThreads;     // per thread and k-tile
    static constexpr int kBChunks = BN * kChunks / kThreads;
    static constexpr int kStageElems = (BM + BN) * LD;
    static_assert(LD == kConvMmaLd && conv_mma_smem(BN, STAGES) >= STAGES * kStageElems * 2 &&
                      conv_mma_smem(BN, STAGES) >= BM * tile_ld(BN) * 4,
                  "conv_mma_smem disagrees with the kernel");
    static_assert(kAChunks >= 1 && kBChunks >= 1 && BM * kChunks % kThreads == 0 && BN * kChunks % kThreads == 0 &&
                      kChunks % kAChunks == 0 && kChunks % kBChunks == 0,
                  "chunks not divisible among the threads");
};

template <class E, int BN, int STAGES>
__device__ __forceinline__ void conv_mma(const ConvParams& p) {
    using Cfg = ConvMmaConfig<E, BN, STAGES>;
    using T = typename Cfg::T;
    constexpr int BM = Cfg::BM, BK = Cfg::BK, LD = Cfg::LD, MT = Cfg::MT, NT = Cfg::NT;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* const smem = reinterpret_cast<T*>(smem_raw);
    const uint32_t smem_base = uint32_t(__cvta_generic_to_shared(smem_raw));

    const GemmParams& gp = p.gemm;
    const ConvShape& g = p.shape;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = (warp / Cfg::WARPS_N) * Cfg::WM, wn = (warp % Cfg::WARPS_N) * Cfg::WN;
    const int gr = lane / 4, q = lane % 4;
    const int tile_m = int(blockIdx.x) / gp.tiles_n, tile_n = int(blockIdx.x) % gp.tiles_n;
    const int m0 = tile_m * BM, n0 = tile_n * BN;
    const int ktiles = (gp.k + BK - 1) / BK;

    // This thread's gathers: A, output position m0 + a_row, chunks a_chunk.. of each k-tile; B,
    // filter row (output channel) n0 + b_row, chunks b_chunk.. . A row's chunks go to adjacent
    // threads, so that a warp reads whole 64-byte runs.
    constexpr int kAThreads = Cfg::kChunks / Cfg::kAChunks, kBThreads = Cfg::kChunks / Cfg::kBChunks;   // per row
    const int a_row = tid / kAThreads, a_chunk = (tid % kAThreads) * Cfg::kAChunks;
    const int b_row = tid / kBThreads, b_chunk = (tid % kBThreads) * Cfg::kBChunks;
    const int m = m0 + a_row, n = n0 + b_row;
    const bool row_ok = m < gp.m, col_ok = n < gp.n;
    const RowOrigin o = row_origin(g, row_ok ? m : 0);
    const T* const image = static_cast<const T*>(p.image);
    const T* const img = image + int64_t(o.n) * g.D * g.H * g.W * g.C;
    const T* const filt = static_cast<const T*>(gp.b) + int64_t(col_ok ? n : 0) * gp.k;
    PatchColumn at;
    at.advance(g, a_chunk * 8);

    wait_for_prior_grids();

    // Issues k-tile kt's copies into stage st (A's taps walked by `at`, which ends on the next
    // k-tile's first chunk).
    auto load = [&](int kt, int st) {
        const uint32_t a_dst = smem_base + uint32_t((st * Cfg::kStageElems + a_row * LD + a_chunk * 8) * 2);
#pragma unroll
        for (int j = 0; j < Cfg::kAChunks; ++j) {
            const int d = o.d0 + at.t * g.dil_d, h = o.h0 + at.r * g.dil_h, w = o.w0 + at.s * g.dil_w;
            const bool ok = row_ok && at.t < g.T && unsigned(d) < unsigned(g.D) && unsigned(h) < unsigned(g.H) &&
                            unsigned(w) < unsigned(g.W);
            const T* src = ok ? img + (int64_t(d * g.H + h) * g.W + w) * g.C + at.c : image;
            cp_async16(a_dst + uint32_t(j * 16), src, ok ? 16 : 0);
            at.advance(g, 8);
        }
        at.advance(g, (Cfg::kChunks - Cfg::kAChunks) * 8);
        const uint32_t b_dst = smem_base + uint32_t((st * Cfg::kStageElems + (BM + b_row) * LD + b_chunk * 8) * 2);
#pragma unroll
        for (int j = 0; j < Cfg::kBChunks; ++j) {
            const int k = kt * BK + (b_chunk + j) * 8;
            const bool ok = col_ok && k < gp.k;
            cp_async16(b_dst + uint32_t(j * 16), ok ? filt + k : filt, ok ? 16 : 0);
        }
    };

    float acc[MT][NT][4] = {};
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) load(s, s);
        cp_async_commit();   // (empty groups keep the count: k-tile kt is group kt)
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait<STAGES - 2>();   // k-tile kt has landed (this thread's copies)
        __syncthreads();               // everyone's; and stage (kt - 1) % STAGES is free again
        if (kt + STAGES - 1 < ktiles) load(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
        cp_async_commit();
        const T* As = smem + (kt % STAGES) * Cfg::kStageElems;
        const T* Bs = As + BM * LD;
#pragma unroll
        for (int ks = 0; ks < BK; ks += 16) mma_step16<E, MT, NT, LD>(acc, As, Bs, wm, wn, gr, q, ks);
    }
    cp_async_wait<0>();
    __syncthreads();   // every warp is done with the stages: the tile takes their memory

    float* tile = reinterpret_cast<float*>(smem_raw);
    store_accumulators<MT, NT, tile_ld(BN)>(tile, acc, wm, wn, gr, q);
    __syncthreads();
    finish_tile<BM, BN, Cfg::kThreads>(gp, tile, m0, n0, tile_n, 0, tid);
}

} // namespace kiln::gemm
