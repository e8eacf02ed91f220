// Implicit-GEMM weight gradient (update) on sm_90a: the GEMM's ring, mainloop and general
// epilogue with a producer of its own. The gradient of a KTRSC filter is the product
//
//   grad_F^T (taps x K) = patches(I)^T (taps x rows) . E (rows x K)
//
// over the N M P Q output positions (rows), which are many (10^5-10^6) against a small output,
// so the rows are split into k_splits slices, each block adding one slice of one 128 x BN tile.
// Both operands are M/N-major in shared memory (their contiguous axis is the output's, not the
// reduction's), which wgmma reads with its transpose bits: A, 64 taps of 64 pixels per consumer,
// comes by TMA in im2col mode (64 channels of one tap of 64 consecutive output positions, the
// tap's offset fixed for the whole tile: C is a multiple of 64); B, 64 rows of E by BN
// channels, by tiled TMA boxes 64 channels wide. With k_splits > 1 each block stores its raw
// float32 sums as its slice's plane, and the GEMM's reduction kernel adds the planes in order
// and applies the epilogue (deterministic); with one slice the block applies it itself.
#pragma once
#include "kernels/cuda/sm90/conv_fprop.cuh"

namespace kiln::gemm {

// Issuing thread `issuer` of `issuers` (as conv_produce_tma): its share of k-tiles [kt_begin,
// kt_begin + ktiles) (of 64 output positions) of the tile at (m0 taps, n0 channels of E), into
// the ring's uses it0, it0 + 1, ... (stage use / STAGES of stage use % STAGES): the uses
// it with it % issuers == issuer.
template <class T, int BN, int STAGES>
__device__ __forceinline__ void wgrad_produce(const ConvParams& p, unsigned char* smem, Ring<STAGES>& ring,
                                              const CUtensorMap* map_i, const CUtensorMap* map_e, int m0, int n0,
                                              int kt_begin, int ktiles, int issuer, int issuers, int it0 = 0) {
    using Cfg = WgConfig<T, BN, 2, STAGES>;
    const ConvShape& g = p.shape;
    // Each consumer's 64 taps: channels ch of filter tap (t, r, s), at offsets (s, r, t) x dilation.
    int ch[2];
    uint16_t ow[2], oh[2], od[2];
    bool live[2];
    uint32_t bytes = Cfg::kBBytes;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const int col = m0 + 64 * c;
        live[c] = col < p.gemm.m;
        const int tap = col / g.C;
        ch[c] = col - tap * g.C;
        ow[c] = uint16_t(tap % g.S * g.dil_w);
        oh[c] = uint16_t(tap / g.S % g.R * g.dil_h);
        od[c] = uint16_t(tap / (g.S * g.R) * g.dil_d);
        if (live[c]) bytes += 8192;   // (past the taps A's rows stay unset: the epilogue drops them)
    }
    // (Use it by issuer it % issuers, whatever it0: issuers divides STAGES, so a stage is filled
    // by one issuer only, never a phase ahead of its own previous use of it. Shared by turns
    // between issuers, a stage's empty barrier could be waited on two phases behind, where its
    // parity passes the wait.)
    for (int kt = (issuer - it0 % issuers + issuers) % issuers; kt < ktiles; kt += issuers) {
        const int it = it0 + kt, st = it % STAGES;
        if (it >= STAGES) mbar_wait(&ring.empty[st], ((it / STAGES) - 1) & 1);
        unsigned char* stage = smem + st * Cfg::kStageBytes;
        mbar_expect_tx(&ring.full[st], bytes);
        const int row = (kt_begin + kt) * Cfg::BK;
        const RowOrigin o = row_origin(g, row);
#pragma unroll
        for (int c = 0; c < 2; ++c)
            if (live[c])
                tma_load_im2col(p.im2col_rank, stage + c * 8192, map_i, &ring.full[st], ch[c], o.w0, o.h0, o.d0, o.n, ow[c],
                                oh[c], od[c]);
#pragma unroll
        for (int j = 0; j < BN / 64; ++j) tma_load(stage + Cfg::kABytes + j * 8192, map_e, &ring.full[st], n0 + 64 * j, row, 0);
    }
}

// One 128 x BN tile of grad_F^T, one slice of the rows: blockIdx.x = tile_m * tiles_n + tile_n,
// blockIdx.y the slice (work_of).
template <class T, int BN, int STAGES>
__device__ __forceinline__ void conv_wgrad(const ConvParams& p, const CUtensorMap* map_e, const CUtensorMap* map_i) {
    using Cfg = WgConfig<T, BN, 2, STAGES>;
    constexpr int BM = Cfg::BM;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem(smem_raw);
    __shared__ __align__(8) Ring<STAGES> ring;
    const GemmParams& g = p.gemm;
    const int tid = threadIdx.x;
    const int tile_n = int(blockIdx.x) % g.tiles_n, tile_m = int(blockIdx.x) / g.tiles_n;
    const int m0 = tile_m * BM, n0 = tile_n * BN;
    const Work w = work_of(g, Cfg::BK);
    const int ktiles = w.kt_end - w.kt_begin;
    conv_block_start(ring, 1, map_e, map_i);   // (each stage's issuing thread)

    const int wg = tid / 128;
    if (wg == 0) {
        if (tid % 32 == 0 && tid / 32 < kIssuers<STAGES>)
            wgrad_produce<T, BN, STAGES>(p, smem, ring, map_i, map_e, m0, n0, w.kt_begin, ktiles, tid / 32, kIssuers<STAGES>);
        return;
    }
    const int c = wg - 1;
    const int ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32;
    float acc[BN / 2];
    consume_only_tile<T, BN, 2, STAGES, 1, 1>(acc, smem, ring, c, lane, ktiles);
    asm volatile("bar.sync 1, 256;" ::: "memory");   // both consumers are done with the stages
    const int row0 = 64 * c + 16 * warp + lane / 4;
    float* tile = reinterpret_cast<float*>(smem);
    stage_accumulators<BN>(tile, acc, row0, lane % 4);
    asm volatile("bar.sync 1, 256;" ::: "memory");
    finish_tile<BM, BN, 256>(g, tile, m0, n0, tile_n, w.zc, tid - 128, nullptr);
}

// The balanced split: the k-tiles of every tile, tile after tile, form one sequence cut into
// gridDim.x equal runs, one per block, all resident at once (a cooperative launch, one block
// an SM), so that every SM multiplies the same number of k-tiles whatever the tile count (the
// k_splits slices leave a last wave part empty, and a slice's plane crosses memory whole). A
// run covers the end of one tile, whole tiles, then the start of another; where a tile is
// split between runs, each run past its first k-tile stores its float32 partial
// (part_sums[block]) and tags its flag, and the run that holds the tile's first k-tile (it takes
// that tile last) adds the later runs' partials to its own in run order (deterministic sums,
// the same in every run) and applies the epilogue. A run ends a tile's main loop and stores
// at most one partial; the producer waits for the epilogue of a tile that is not the run's last
// before it refills the stages, which that epilogue's staging overwrites.
template <class T, int BN, int STAGES>
__device__ __forceinline__ void conv_wgrad_balanced(const ConvParams& p, const CUtensorMap* map_e, const CUtensorMap* map_i) {
    using Cfg = WgConfig<T, BN, 2, STAGES>;
    constexpr int BM = Cfg::BM;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem(smem_raw);
    __shared__ __align__(8) Ring<STAGES> ring;
    __shared__ __align__(8) uint64_t staged_free;   // completes a phase per epilogue before the run's last
    const GemmParams& g = p.gemm;
    const int tid = threadIdx.x;
    const int64_t ktiles = (int64_t(g.k) + Cfg::BK - 1) / Cfg::BK;
    const int64_t total = int64_t(g.tiles_m) * g.tiles_n * ktiles, runs = gridDim.x;
    const auto run_begin = [&](int64_t b) { return b * total / runs; };
    const int64_t begin = run_begin(blockIdx.x), end = run_begin(int64_t(blockIdx.x) + 1);
    if (tid == 0) mbar_init(&staged_free, 1);
    conv_block_start(ring, 1, map_e, map_i);   // (its barrier publishes staged_free's initialisation)

    // Segment: the run's share [k0, k1) of tile `tile`, from k-tile i of the sequence on.
    struct Segment {
        int tile, k0, k1;
    };
    const auto segment_at = [&](int64_t i) {
        const int tile = int(i / ktiles);
        const int64_t first = int64_t(tile) * ktiles;
        return Segment{tile, int(i - first), int(min(ktiles, end - first))};
    };
    const int wg = tid / 128;
    if (wg == 0) {
        if (tid % 32 == 0 && tid / 32 < kIssuers<STAGES>) {
            int it = 0;
            unsigned waits = 0;
            for (int64_t i = begin; i < end;) {
                const Segment sg = segment_at(i);
                const int m0 = sg.tile / g.tiles_n * BM, n0 = sg.tile % g.tiles_n * BN;
                wgrad_produce<T, BN, STAGES>(p, smem, ring, map_i, map_e, m0, n0, sg.k0, sg.k1 - sg.k0, tid / 32,
                                             kIssuers<STAGES>, it);
                it += sg.k1 - sg.k0;
                i += sg.k1 - sg.k0;
                // A tile this run finishes (its first k-tile is in the run) is staged in the
                // stages' memory: the next tile's loads wait for that epilogue.
                if (sg.k0 == 0 && i < end) mbar_wait(&staged_free, waits++ & 1);
            }
        }
        return;
    }
    const int c = wg - 1;
    const int ctid = tid - 128, warp = ctid % 128 / 32, lane = ctid % 32;   // (ctid: both consumers')
    const int row0 = 64 * c + 16 * warp + lane / 4;
    const auto consumers_sync = [] { asm volatile("bar.sync 1, 256;" ::: "memory"); };
    float acc[BN / 2];
    int it = 0;
    for (int64_t i = begin; i < end;) {
        const Segment sg = segment_at(i);
        i += sg.k1 - sg.k0;
        consume_tile<T, BN, 2, STAGES, 1, 1>(acc, smem, ring, c, lane, sg.k1 - sg.k0, it);
        float4* const mine = reinterpret_cast<float4*>(p.part_sums + int64_t(blockIdx.x) * (BM * BN));
        if (sg.k0 > 0) {
            // Another run finishes this tile: the partial goes out in a layout of this
            // thread's own (float4 j at j * 256 + ctid: each warp's stores contiguous).
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
                __stcg(mine + j * 256 + ctid, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
            __threadfence();
            consumers_sync();
            if (ctid == 0)
                asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p.part_flags + blockIdx.x),
                             "l"(uint64_t(p.part_tag) << 32 | 1u)
                             : "memory");
            continue;
        }
        // Its own sums staged, then the later runs that share this tile added into them, in run
        // order, each one's partial once tagged: each thread adds its own elements (the layout
        // it staged and the later runs stored), all of a partial's loads in flight at once (the
        // accumulators' registers are free by then).
        consumers_sync();   // both consumers are done with the stages
        float* tile = reinterpret_cast<float*>(smem);
        stage_accumulators<BN>(tile, acc, row0, lane % 4);
        constexpr int ld = tile_ld(BN);
        const int64_t tile_end = int64_t(sg.tile + 1) * ktiles;
        for (int64_t b = int64_t(blockIdx.x) + 1; b < runs && run_begin(b) < tile_end; ++b) {
            if (ctid == 0) {
                const uint64_t* flag = p.part_flags + b;
                for (unsigned ns = 32;; ns = min(ns * 2, 1024u)) {
                    uint64_t v;
                    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
                    if (uint32_t(v >> 32) == p.part_tag) break;
                    __nanosleep(ns);
                }
            }
            consumers_sync();
            const float4* theirs = reinterpret_cast<const float4*>(p.part_sums + b * (BM * BN));
            float4 v[BN / 8];
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) v[j] = __ldcg(theirs + j * 256 + ctid);
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                float2* const lo = reinterpret_cast<float2*>(tile + row0 * ld + 8 * j + 2 * (lane % 4));
                float2* const hi = reinterpret_cast<float2*>(tile + (row0 + 8) * ld + 8 * j + 2 * (lane % 4));
                const float2 a = *lo, h = *hi;
                *lo = make_float2(a.x + v[j].x, a.y + v[j].y);
                *hi = make_float2(h.x + v[j].z, h.y + v[j].w);
            }
        }
        consumers_sync();
        const int tile_n = sg.tile % g.tiles_n;
        finish_tile<BM, BN, 256>(g, tile, sg.tile / g.tiles_n * BM, tile_n * BN, tile_n, 0, ctid, nullptr);
        if (i < end) {
            consumers_sync();   // the staged tile is read: the producer may refill the stages
            if (ctid == 0) mbar_arrive(&staged_free);
        }
    }
}

} // namespace kiln::gemm
