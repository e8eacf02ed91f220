// The float32 kernels on the FMA units whose operands pass through registers (fma_gemm, the
// narrow fma_narrow_gemm) and the epilogue of the FMA kernels' 16 x 8 results per thread
// (fma_epilogue, which the cp.async kernel shares).
#pragma once
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm80/operands.cuh"

namespace kiln::gemm {

// Each warp computes a 64 x 64 piece of the tile, each thread 16 x 8 results: four 4-row groups
// 16 apart times two 4-column groups 32 apart. Per k a thread reads 6 16-byte vectors from
// shared memory for 128 FMAs. (With 8 x 8 results per thread, 4 vectors fed 64 FMAs and the
// shared-memory reads took as many cycles as the FMAs.) A warp's 32 lanes are 4 rows x 8
// columns of threads, so each A read is 4 distinct vectors (64 bytes) and each B read 8
// consecutive ones (128 bytes): one shared-memory wavefront each. A and B are held as
// [BK][rows + 4] (m or n contiguous); the padding puts the two k-halves of the transposing
// stores (A or B read along k) in different banks.
// B's columns are stored with each even/odd pair swapped, so the register holding column n of
// a B fragment has the opposite parity of the accumulator it feeds. The A operand is reused
// across a row's 8 FMAs; with B and the accumulators both in aligned quads in column order,
// the other two operands of every FMA had the same register parity (bank), which stalled
// the FMAs' dispatch.

constexpr int kFmaBK = 8;

// PAIRS: rows are stored with each even/odd pair swapped (row r at r ^ 1); used for B, see
// fma_gemm.
template <int ROWS, int THREADS, bool PAIRS>
struct FmaLoader {
    // float4s per thread and stage; with fewer float4s than threads (narrow B tiles) the first
    // ROWS * BK / 4 threads load one each.
    static constexpr int kVecs = (ROWS * kFmaBK / 4 + THREADS - 1) / THREADS;
    static constexpr bool kEvery = ROWS * kFmaBK == kVecs * 4 * THREADS;
    static constexpr int LD = ROWS + 4;
    static_assert(kEvery || kVecs == 1, "tile not divisible into float4s");
    float reg[kVecs][4];
    __device__ __forceinline__ static bool active(int v, int tid) {
        return kEvery || (tid + v * THREADS) * 4 < ROWS * kFmaBK;
    }
    // Vector v of this thread: (row, k) of its first element. kAlongK: 4 consecutive k of one
    // row; otherwise 4 consecutive rows of one k (kScalar reads the same elements one by one).
    __device__ __forceinline__ static void place(int v, int mode, int tid, int& r, int& kk) {
        const int e = (tid + v * THREADS) * 4;
        if (mode == kAlongK) r = e / kFmaBK, kk = e % kFmaBK;
        else r = e % ROWS, kk = e / ROWS;
    }
    // Where each vector of the next k-tile is read from: kept as pointers that advance by one
    // k-tile per fetch, so a k-tile whose vectors are all inside the operand (`inside`: the
    // caller's test, the same for every thread) costs one 16-byte load per vector.
    const float* next_ptr[kVecs];
    int64_t step;
    __device__ __forceinline__ void start(const float* base, int64_t s_row, int64_t s_k, int row0, int k0, int mode,
                                          int tid) {
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
            int r, kk;
            place(v, mode, tid, r, kk);
            next_ptr[v] = active(v, tid) ? base + (row0 + r) * s_row + (k0 + kk) * s_k : base;
        }
        step = kFmaBK * s_k;
    }
    __device__ __forceinline__ void fetch(bool inside, const float* base, int64_t s_row, int64_t s_k, int rows, int ks,
                                          int row0, int k0, int mode, int tid) {
        if (inside) {
#pragma unroll
            for (int v = 0; v < kVecs; ++v) {
                if (!active(v, tid)) continue;
                const float4 x = *reinterpret_cast<const float4*>(next_ptr[v]);
                reg[v][0] = x.x, reg[v][1] = x.y, reg[v][2] = x.z, reg[v][3] = x.w;
                next_ptr[v] += step;
            }
            return;
        }
        const bool along_k = mode == kAlongK;
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
            if (!active(v, tid)) continue;
            next_ptr[v] += step;
            int r, kk;
            place(v, mode, tid, r, kk);
            const int gr = row0 + r, gk = k0 + kk;
            const bool full = along_k ? (gr < rows && gk + 4 <= ks) : (gk < ks && gr + 4 <= rows);
            if (mode != kScalar && full) {
                const float4 x = *reinterpret_cast<const float4*>(base + gr * s_row + gk * s_k);
                reg[v][0] = x.x, reg[v][1] = x.y, reg[v][2] = x.z, reg[v][3] = x.w;
                continue;
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int jr = along_k ? gr : gr + j, jk = along_k ? gk + j : gk;
                reg[v][j] = (jr < rows && jk < ks) ? base[jr * s_row + jk * s_k] : 0.f;
            }
        }
    }
    __device__ __forceinline__ void stash(float* smem, int mode, int tid) const {
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
            if (!active(v, tid)) continue;
            int r, kk;
            place(v, mode, tid, r, kk);
            if (mode == kAlongK) {
#pragma unroll
                for (int j = 0; j < 4; ++j) smem[(kk + j) * LD + (PAIRS ? r ^ 1 : r)] = reg[v][j];
            } else if (PAIRS) {
                *reinterpret_cast<float4*>(smem + kk * LD + r) = make_float4(reg[v][1], reg[v][0], reg[v][3], reg[v][2]);
            } else {
                *reinterpret_cast<float4*>(smem + kk * LD + r) = make_float4(reg[v][0], reg[v][1], reg[v][2], reg[v][3]);
            }
        }
    }
};

// Both operands of an FMA kernel's block: their loaders and the block's k-tiles. fetch reads
// k-tile kt from global memory into registers, stash writes the registers to a stage of
// shared memory ([BK][BM + 4] of A, then [BK][BN + 4] of B).
template <int BM, int BN, int THREADS, bool PAIRS_B>
struct FmaPipe {
    using LoadA = FmaLoader<BM, THREADS, false>;
    using LoadB = FmaLoader<BN, THREADS, PAIRS_B>;
    static constexpr int kBOffset = kFmaBK * LoadA::LD, kStage = kFmaBK * (LoadA::LD + LoadB::LD);   // floats
    LoadA la;
    LoadB lb;
    int ktiles, kbase;
    bool interior;   // both operands vectorisable and the tile inside C: no bounds tests
    __device__ __forceinline__ FmaPipe(const GemmParams& p, const BlockWork<float, BM, BN, kFmaBK>& bw, int tid)
        : ktiles(bw.w.kt_end - bw.w.kt_begin), kbase(bw.w.kt_begin * kFmaBK),
          interior(bw.mode_a != kScalar && bw.mode_b != kScalar && bw.m0 + BM <= p.m && bw.n0 + BN <= p.n) {
        la.start(bw.A, p.a_sm, p.a_sk, bw.m0, kbase, bw.mode_a, tid);
        lb.start(bw.B, p.b_sn, p.b_sk, bw.n0, kbase, bw.mode_b, tid);
    }
    __device__ __forceinline__ void fetch(const GemmParams& p, const BlockWork<float, BM, BN, kFmaBK>& bw, int kt, int tid) {
        const int k0 = kbase + kt * kFmaBK;
        const bool inside = interior && k0 + kFmaBK <= p.k;   // a k-tile inside: ends at or before k
        la.fetch(inside, bw.A, p.a_sm, p.a_sk, p.m, p.k, bw.m0, k0, bw.mode_a, tid);
        lb.fetch(inside, bw.B, p.b_sn, p.b_sk, p.n, p.k, bw.n0, k0, bw.mode_b, tid);
    }
    __device__ __forceinline__ void stash(float* stage, const BlockWork<float, BM, BN, kFmaBK>& bw, int tid) const {
        la.stash(stage, bw.mode_a, tid);
        lb.stash(stage + kBOffset, bw.mode_b, tid);
    }
};

// The 128 x 128 FMA kernels' epilogue, once the stages are free: the thread's 16 x 8 results
// (rows r0 + 16 (i / 4) + i % 4, columns c0 + 32 j + (0..3) in acc[i][4 j .. 4 j + 3], each
// pair of columns swapped with PAIRS_SWAPPED) staged as the tile, then finish_tile and bsum.
template <int BM, int BN, int THREADS, bool PAIRS_SWAPPED, class Work>
__device__ __forceinline__ void fma_epilogue(const GemmParams& p, const Work& bw, float* tile, const float (&acc)[16][8],
                                             int r0, int c0, int tid) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            *reinterpret_cast<float4*>(tile + (r0 + 16 * (i / 4) + i % 4) * tile_ld(BN) + c0 + 32 * j) =
                make_float4(acc[i][4 * j], acc[i][4 * j + 1], acc[i][4 * j + 2], acc[i][4 * j + 3]);
    __syncthreads();
    finish_tile<BM, BN, THREADS, PAIRS_SWAPPED>(p, tile, bw.m0, bw.n0, bw.tile.n, bw.w.zc, tid);
    bsum_across_tiles<BM>(p, bw.m0, bw.tile.m, bw.w.zc, tid, THREADS, [] { __syncthreads(); });
}

template <int BM, int BN>
__device__ __forceinline__ void fma_gemm(const GemmParams& p) {
    constexpr int BK = kFmaBK, THREADS = (BM / 64) * (BN / 64) * 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* smem = reinterpret_cast<float*>(smem_raw);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    // This thread's rows: wm + 16 i + tm + (0..3); columns: wn + 32 j + tn + (0..3).
    const int wm = (warp / (BN / 64)) * 64, wn = (warp % (BN / 64)) * 64;
    const int tm = (lane / 8) * 4, tn = (lane % 8) * 4;
    const BlockWork<float, BM, BN, BK> bw(p);
    using Pipe = FmaPipe<BM, BN, THREADS, true>;
    Pipe pipe(p, bw, tid);
    float acc[16][8];
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
    const int ktiles = pipe.ktiles;
    if (ktiles > 0) {
        pipe.fetch(p, bw, 0, tid);
        pipe.stash(smem, bw, tid);
    }
    __syncthreads();
    // The fragments of step kk + 1 are read while step kk's FMAs run; the last step of a k-tile
    // first stores the next k-tile (fetched from global memory during this one) and passes the
    // barrier, so the first fragments of the next k-tile load behind its FMAs too. One barrier
    // per k-tile: a buffer is written only after every thread has passed the barrier that
    // followed its last read.
    float frag[2][24];   // [parity][16 of A, 8 of B]
    const auto load_frag = [&](float (&f)[24], const float* stage, int kk) {
        const float* As = stage + kk * Pipe::LoadA::LD + wm + tm;
        const float* Bs = stage + Pipe::kBOffset + kk * Pipe::LoadB::LD + wn + tn;
#pragma unroll
        for (int i = 0; i < 4; ++i) *reinterpret_cast<float4*>(f + 4 * i) = *reinterpret_cast<const float4*>(As + 16 * i);
#pragma unroll
        for (int j = 0; j < 2; ++j) *reinterpret_cast<float4*>(f + 16 + 4 * j) = *reinterpret_cast<const float4*>(Bs + 32 * j);
    };
    if (ktiles > 0) load_frag(frag[0], smem, 0);
    for (int kt = 0; kt < ktiles; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < ktiles;
        if (more) pipe.fetch(p, bw, kt + 1, tid);
        const float* stage = smem + cur * Pipe::kStage;
        float* next = smem + (cur ^ 1) * Pipe::kStage;
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            if (kk + 1 < BK) {
                load_frag(frag[(kk + 1) % 2], stage, kk + 1);
            } else if (more) {
                pipe.stash(next, bw, tid);
                __syncthreads();
                load_frag(frag[0], next, 0);
            }
            const float* f = frag[kk % 2];
#pragma unroll
            for (int i = 0; i < 16; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(f[i], f[16 + (j ^ 1)], acc[i][j]);
        }
    }
    __syncthreads();   // the epilogue's tile overlays the stages

    fma_epilogue<BM, BN, THREADS, false>(p, bw, reinterpret_cast<float*>(smem_raw), acc, wm + tm, wn + tn, tid);
}

// Narrow products (N of 8 to 32: GEMV-like, bound by reading A): 256 x 16 tiles, each thread
// 4 x 4 results, so a block computes no more than twice the useful columns for N = 8 where the
// 128 x 128 tile computed 16 times as many and ran out of FMA throughput before bandwidth. The
// same loaders, double buffering and epilogue as fma_gemm.
template <int BM, int BN>
__device__ __forceinline__ void fma_narrow_gemm(const GemmParams& p) {
    constexpr int BK = kFmaBK, THREADS = 256;
    constexpr int kColGroups = BN / 4, kRowGroups = THREADS / kColGroups;
    static_assert(kRowGroups * 4 == BM, "a 4 x 4 block per thread covers the tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* smem = reinterpret_cast<float*>(smem_raw);
    const int tid = threadIdx.x;
    const int tm = (tid / kColGroups) * 4, tn = (tid % kColGroups) * 4;
    const BlockWork<float, BM, BN, BK> bw(p);
    using Pipe = FmaPipe<BM, BN, THREADS, false>;
    Pipe pipe(p, bw, tid);
    float acc[4][4] = {};
    const int ktiles = pipe.ktiles;
    if (ktiles > 0) {
        pipe.fetch(p, bw, 0, tid);
        pipe.stash(smem, bw, tid);
    }
    __syncthreads();
    for (int kt = 0; kt < ktiles; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < ktiles;
        if (more) pipe.fetch(p, bw, kt + 1, tid);
        const float* As = smem + cur * Pipe::kStage + tm;
        const float* Bs = smem + cur * Pipe::kStage + Pipe::kBOffset + tn;
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float4 a = *reinterpret_cast<const float4*>(As + kk * Pipe::LoadA::LD);
            const float4 b = *reinterpret_cast<const float4*>(Bs + kk * Pipe::LoadB::LD);
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if (more) pipe.stash(smem + (cur ^ 1) * Pipe::kStage, bw, tid);
        __syncthreads();
    }

    float* tile = reinterpret_cast<float*>(smem_raw);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        *reinterpret_cast<float4*>(tile + (tm + i) * tile_ld(BN) + tn) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    __syncthreads();
    finish_tile<BM, BN, THREADS>(p, tile, bw.m0, bw.n0, bw.tile.n, bw.w.zc, tid);
    bsum_across_tiles<BM>(p, bw.m0, bw.tile.m, bw.w.zc, tid, THREADS, [] { __syncthreads(); });
}

} // namespace kiln::gemm
