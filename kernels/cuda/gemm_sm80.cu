// The portable GEMM kernels: tensor cores through mma.sync (float16, bfloat16, tf32; sm_80 and
// every later GPU, shipped as sm_80 code plus compute_80 PTX) and float32 on the FMA units.
// They accept any operand layout (strides along both dimensions, any alignment): operands are
// read through registers with 16-byte loads where a dimension is contiguous and aligned, else
// element by element, and written to shared memory in the layout the fragments are read in.
// On sm_90 the wgmma kernels (gemm_sm90.cu) take over where TMA can address the operands.
#include "kernels/cuda/gemm_common.cuh"

namespace kiln::gemm {

// ---- element types ------------------------------------------------------------------------

struct F16 {
    using T = __half;
    static constexpr int kStep = 16;     // mma k per instruction
    static constexpr int kPad = 8;       // shared rows of 40 halves: conflict-free fragment reads
};
struct BF16 {
    using T = __nv_bfloat16;
    static constexpr int kStep = 16;
    static constexpr int kPad = 8;
};
struct TF32 {
    using T = float;
    static constexpr int kStep = 8;
    static constexpr int kPad = 4;       // rows of 36 words
};

template <class E>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma<F16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma<BF16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma<TF32>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// ---- operand tiles: global -> registers -> shared ----------------------------------------
//
// A tile is ROWS x BK elements of an operand seen as (row, k) with strides (s_row, s_k); rows
// are m for A and n for B. Shared memory holds it as [ROWS][BK + pad], k contiguous.

enum LoadMode : int { kAlongK = 0, kAlongRows = 1, kScalar = 2 };

template <class T>
__device__ __forceinline__ int load_mode(const T* base, int64_t s_row, int64_t s_k, int64_t batch_stride) {
    constexpr int vec = 16 / sizeof(T);
    const bool aligned = (reinterpret_cast<uintptr_t>(base) % 16 == 0) && batch_stride % vec == 0;
    if (s_k == 1 && s_row % vec == 0 && aligned) return kAlongK;
    if (s_row == 1 && s_k % vec == 0 && aligned) return kAlongRows;
    return kScalar;
}

template <class T, int ROWS, int BK, int THREADS>
struct TileLoader {
    static constexpr int kVec = 16 / sizeof(T);
    static constexpr int kPerThread = ROWS * BK / THREADS;   // elements
    static_assert(kPerThread % kVec == 0, "tile not divisible into 16-byte vectors");
    T reg[kPerThread];

    // Element e of this thread's share, as (row, k) of the tile, for each mode; vectors are
    // kVec consecutive elements along the contiguous dimension.
    __device__ __forceinline__ void fetch(const T* base, int64_t s_row, int64_t s_k, int rows, int ks, int row0, int k0,
                                          int mode, int tid) {
        if (mode == kScalar) {
#pragma unroll
            for (int i = 0; i < kPerThread; ++i) {
                const int e = tid + i * THREADS;
                const int r = e / BK, kk = e % BK;
                const int gr = row0 + r, gk = k0 + kk;
                reg[i] = (gr < rows && gk < ks) ? base[gr * s_row + gk * s_k] : T(0.f);
            }
            return;
        }
#pragma unroll
        for (int v = 0; v < kPerThread / kVec; ++v) {
            const int e = (tid + v * THREADS) * kVec;
            const bool along_k = mode == kAlongK;
            const int r = along_k ? e / BK : e % ROWS, kk = along_k ? e % BK : e / ROWS;
            const int gr = row0 + r, gk = k0 + kk;
            const int64_t off = gr * s_row + gk * s_k;
            const bool full = along_k ? (gr < rows && gk + kVec <= ks) : (gk < ks && gr + kVec <= rows);
            if (full) {
                const uint4 x = *reinterpret_cast<const uint4*>(base + off);
                const T* xs = reinterpret_cast<const T*>(&x);
#pragma unroll
                for (int j = 0; j < kVec; ++j) reg[v * kVec + j] = xs[j];
            } else {
#pragma unroll
                for (int j = 0; j < kVec; ++j) {
                    const int jr = along_k ? gr : gr + j, jk = along_k ? gk + j : gk;
                    reg[v * kVec + j] = (jr < rows && jk < ks) ? base[jr * s_row + jk * s_k] : T(0.f);
                }
            }
        }
    }

    template <int LD>
    __device__ __forceinline__ void stash(T* smem, int mode, int tid) const {
        if (mode == kScalar) {
#pragma unroll
            for (int i = 0; i < kPerThread; ++i) {
                const int e = tid + i * THREADS;
                smem[(e / BK) * LD + e % BK] = reg[i];
            }
            return;
        }
#pragma unroll
        for (int v = 0; v < kPerThread / kVec; ++v) {
            const int e = (tid + v * THREADS) * kVec;
            if (mode == kAlongK) {
                *reinterpret_cast<uint4*>(smem + (e / BK) * LD + e % BK) = *reinterpret_cast<const uint4*>(&reg[v * kVec]);
            } else {
#pragma unroll
                for (int j = 0; j < kVec; ++j) smem[(e % ROWS + j) * LD + e / ROWS] = reg[v * kVec + j];
            }
        }
    }
};

// What a block of the portable kernels works on: its tile, batch entry and k-tiles, and its
// operands' base pointers and load modes.
template <class T, int BM, int BN, int BK>
struct BlockWork {
    Tile tile;
    Work w;
    int m0, n0;
    const T* A;
    const T* B;
    int mode_a, mode_b;
    __device__ __forceinline__ explicit BlockWork(const GemmParams& p)
        : tile(tile_of(p, blockIdx.x)), w(work_of(p, BK)), m0(tile.m * BM), n0(tile.n * BN),
          A(static_cast<const T*>(p.a) + w.z * p.a_batch), B(static_cast<const T*>(p.b) + w.z * p.b_batch),
          mode_a(load_mode(A, p.a_sm, p.a_sk, p.a_batch)), mode_b(load_mode(B, p.b_sn, p.b_sk, p.b_batch)) {}
};

// ---- tensor-core kernel -------------------------------------------------------------------

template <class E, int BM, int BN, int WARPS_M, int WARPS_N>
struct MmaConfig {
    using T = typename E::T;
    static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
    static constexpr int BK = 32;
    static constexpr int LD = BK + E::kPad;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
    static constexpr int MT = WM / 16, NT = WN / 8;
    static constexpr int kStageElems = (BM + BN) * LD;
    // The pipeline's two stages, or the accumulator tile of the epilogue, whichever is larger.
    static constexpr int kSmemBytes = 2 * kStageElems * int(sizeof(T)) > BM * tile_ld(BN) * 4
                                          ? 2 * kStageElems * int(sizeof(T))
                                          : BM * tile_ld(BN) * 4;
};

template <class E, int BM, int BN, int WARPS_M, int WARPS_N>
__device__ __forceinline__ void mma_gemm(const GemmParams& p) {
    using Cfg = MmaConfig<E, BM, BN, WARPS_M, WARPS_N>;
    using T = typename Cfg::T;
    constexpr int BK = Cfg::BK, LD = Cfg::LD, MT = Cfg::MT, NT = Cfg::NT;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* smem = reinterpret_cast<T*>(smem_raw);

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = (warp / WARPS_N) * Cfg::WM, wn = (warp % WARPS_N) * Cfg::WN;
    const int g = lane / 4, q = lane % 4;
    const BlockWork<T, BM, BN, BK> bw(p);
    const Tile tile_pos = bw.tile;
    const Work w = bw.w;
    const int m0 = bw.m0, n0 = bw.n0;
    const T *A = bw.A, *B = bw.B;
    const int mode_a = bw.mode_a, mode_b = bw.mode_b;

    TileLoader<T, BM, BK, Cfg::kThreads> la;
    TileLoader<T, BN, BK, Cfg::kThreads> lb;
    float acc[MT][NT][4] = {};

    const int ktiles = w.kt_end - w.kt_begin, kbase = w.kt_begin * BK;
    if (ktiles > 0) {
        la.fetch(A, p.a_sm, p.a_sk, p.m, p.k, m0, kbase, mode_a, tid);
        lb.fetch(B, p.b_sn, p.b_sk, p.n, p.k, n0, kbase, mode_b, tid);
        la.template stash<LD>(smem, mode_a, tid);
        lb.template stash<LD>(smem + BM * LD, mode_b, tid);
    }
    __syncthreads();
    for (int kt = 0; kt < ktiles; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < ktiles;
        if (more) {
            la.fetch(A, p.a_sm, p.a_sk, p.m, p.k, m0, kbase + (kt + 1) * BK, mode_a, tid);
            lb.fetch(B, p.b_sn, p.b_sk, p.n, p.k, n0, kbase + (kt + 1) * BK, mode_b, tid);
        }
        const T* As = smem + cur * Cfg::kStageElems;
        const T* Bs = As + BM * LD;
#pragma unroll
        for (int ks = 0; ks < BK; ks += E::kStep) {
            uint32_t af[MT][4], bf[NT][2];
            if constexpr (E::kStep == 16) {
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    const T* r0 = As + (wm + 16 * i + g) * LD + ks + 2 * q;
                    af[i][0] = *reinterpret_cast<const uint32_t*>(r0);
                    af[i][1] = *reinterpret_cast<const uint32_t*>(r0 + 8 * LD);
                    af[i][2] = *reinterpret_cast<const uint32_t*>(r0 + 8);
                    af[i][3] = *reinterpret_cast<const uint32_t*>(r0 + 8 * LD + 8);
                }
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const T* r0 = Bs + (wn + 8 * j + g) * LD + ks + 2 * q;
                    bf[j][0] = *reinterpret_cast<const uint32_t*>(r0);
                    bf[j][1] = *reinterpret_cast<const uint32_t*>(r0 + 8);
                }
            } else {
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    const float* r0 = reinterpret_cast<const float*>(As) + (wm + 16 * i + g) * LD + ks + q;
                    af[i][0] = to_tf32(r0[0]);
                    af[i][1] = to_tf32(r0[8 * LD]);
                    af[i][2] = to_tf32(r0[4]);
                    af[i][3] = to_tf32(r0[8 * LD + 4]);
                }
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const float* r0 = reinterpret_cast<const float*>(Bs) + (wn + 8 * j + g) * LD + ks + q;
                    bf[j][0] = to_tf32(r0[0]);
                    bf[j][1] = to_tf32(r0[4]);
                }
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j) mma<E>(acc[i][j], af[i], bf[j]);
        }
        if (more) {
            T* next = smem + (cur ^ 1) * Cfg::kStageElems;
            la.template stash<LD>(next, mode_a, tid);
            lb.template stash<LD>(next + BM * LD, mode_b, tid);
        }
        __syncthreads();
    }

    // Epilogue: element (i, j, r) is row wm + 16i + g + 8(r / 2), column wn + 8j + 2q + r % 2;
    // staged in shared memory (the loop above ended on a barrier), then finish_tile.
    float* tile = reinterpret_cast<float*>(smem_raw);
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float2*>(tile + (wm + 16 * i + g + 8 * h) * tile_ld(BN) + wn + 8 * j + 2 * q) =
                    make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
    __syncthreads();
    finish_tile<BM, BN, Cfg::kThreads>(p, tile, m0, n0, tile_pos.n, w.zc, tid);
    bsum_across_tiles<BM>(p, m0, tile_pos.m, w.zc, tid, Cfg::kThreads, [] { __syncthreads(); });
}

// ---- float32 on the FMA units -------------------------------------------------------------
//
// Each warp computes a 64 x 64 piece of the tile, each thread 16 x 8 results: four 4-row groups
// 16 apart times two 4-column groups 32 apart. Per k a thread reads 6 16-byte vectors from
// shared memory for 128 FMAs. (With 8 x 8 results per thread, 4 vectors fed 64 FMAs and the
// shared-memory reads took as many cycles as the FMAs: measured 35 TFLOP/s on the H100, 52%
// of the FMA peak.) A warp's 32 lanes are 4 rows x 8 columns of threads, so each A read is 4
// distinct vectors (64 bytes) and each B read 8 consecutive ones (128 bytes): one shared-memory
// wavefront each. A and B are held as [BK][rows + 4] (m or n contiguous); the padding puts the
// two k-halves of the transposing stores (A or B read along k) in different banks.
// B's columns are stored with each even/odd pair swapped, so the register holding column n of
// a B fragment has the opposite parity of the accumulator it feeds. The A operand is reused
// across a row's 8 FMAs; with B and the accumulators both in aligned quads in column order,
// the other two operands of every FMA had the same register parity (bank). Swapped, ncu's
// dispatch stalls fell from 0.30 to 0.23 per instruction (H100, 128 x 256 tile).

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

// ---- float32 on the FMA units, operands copied by cp.async --------------------------------
//
// The 128 x 128 FMA tile for rows-contiguous operands (A M-major, B N-major) with 16-byte
// aligned rows, the selector's fma_async_ok; rule 5 copies operands in other layouts so when
// that pays. cp.async fills a ring of 4 stages of 16 k: the operands pass through no
// registers, the loop has no per-k-tile address arithmetic beyond a pointer step, and one
// barrier serves 16 k (fma_gemm stages through registers and passes a barrier every 8 k; its
// 254 registers left the compiler recomputing addresses inside the loop). Both operands sit
// in shared memory as [16 k][128 rows + 4], as they lie in global memory; per k, 4 + 2
// 16-byte reads feed 128 FMAs, 16 x 8 results per thread as in fma_gemm, the fragments of
// step k + 1 read during step k's FMAs. Measured on the H100: 4096^3
// with A^T 2.88 ms against 3.19 for fma_gemm on the nn product, before the last two points
// below; K-major operands read in place (as [128][16], or transposed on the way by 4-byte
// copies) ran no faster than fma_gemm, which is why they are copied instead. Further:
//  - B is not swapped in pairs (a 16-byte copy cannot permute). The accumulator of column n
//    is slot n ^ 1 of its quad instead, which keeps each FMA's B register and accumulator in
//    different register banks as B's swap did; finish_tile un-swaps the staged tile.
//  - Each row's FMAs run over the columns in a serpentine (even rows left to right, odd rows
//    right to left), so consecutive FMAs share a register at the row changes too: the
//    compiler's code had 1.3-1.4x as many FMAs with two sources in one register bank without it.
//  - The lanes' row group g comes from lane bits 0 and 2, the column group h from bits 1, 3
//    and 4: the lanes that read one A vector are pairs (lane, lane ^ 2) and those that read
//    one B vector pairs (lane, lane ^ 1), the pattern for which shared memory returns a
//    16-byte load in 2 wavefronts instead of 4 (ncu: 1.94 wavefronts per load).

constexpr int kAsyncBK = 16, kAsyncStages = 4, kAsyncLD = 128 + 4;

// 16 bytes into shared memory, of which the first `bytes` are read from `src`, the rest zeros.
__device__ __forceinline__ void cp_async16(uint32_t dst, const float* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// One operand's 128 rows x 16 k of a k-tile (rows contiguous), into [16][kAsyncLD] floats of a
// stage: 4 vectors per thread (128 threads). Vector v of thread t is k t / 32 + 4 v, rows
// 4 (t % 32) .. + 3. The rows past the operand's end and the k past its end are written as
// zeros: a copy reads only the bytes inside the operand (none: its source is then the
// operand's first element).
struct AsyncTileLoader {
    const float* base;
    const float* src;     // the thread's vector 0 of the next k-tile
    int64_t s_k;
    uint32_t dst;         // its byte offset in the operand's part of a stage
    int k_at;             // its k within a k-tile
    int row_bytes;        // bytes of its 4 rows inside the operand: 16, or fewer at the end
    __device__ __forceinline__ AsyncTileLoader(const float* x, int64_t sk, int rows, int row0, int k0, int tid)
        : base(x), s_k(sk) {
        const int k = tid / 32, r = 4 * (tid % 32);
        src = x + int64_t(row0 + r) + int64_t(k0 + k) * s_k;
        dst = uint32_t(k * kAsyncLD + r) * 4;
        k_at = k;
        row_bytes = 4 * max(0, min(4, rows - row0 - r));
    }
    // Issues the copies of the next k-tile into the operand's part of a stage (shared-memory
    // address `part`); `k_left`: the operand's k from this k-tile's start on.
    __device__ __forceinline__ void load(uint32_t part, int k_left) {
        const bool all = row_bytes == 16 && k_left >= kAsyncBK;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            const int bytes = all ? 16 : k_at + 4 * v < k_left ? row_bytes : 0;
            cp_async16(part + dst + uint32_t(4 * v * kAsyncLD * 4), bytes ? src + 4 * v * s_k : base, bytes);
        }
        src += kAsyncBK * s_k;
    }
};

// BODY_K: k-steps per copy of the loop's code. A k-tile's 2048 FMAs in one body (37 KB of
// code) ran 3-4% faster with two blocks per SM, but left a lone warp per scheduler (one block
// per SM: narrow products split along k) waiting on instruction fetch: ncu 0.74 cycles per
// instruction, 4096x128x4096 A^T in 4 slices at 23.5 TFLOP/s against 36.0 with 8 steps.
template <int BODY_K>
__device__ __forceinline__ void fma_async_gemm(const GemmParams& p) {
    constexpr int BM = 128, BN = 128, BK = kAsyncBK, S = kAsyncStages, LD = kAsyncLD, THREADS = 128;
    constexpr int kStage = 2 * BK * LD;   // floats: A's part, then B's
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* smem = reinterpret_cast<float*>(smem_raw);
    const uint32_t smem_at = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = (lane & 1) | ((lane >> 1) & 2), h = ((lane >> 1) & 1) | ((lane >> 2) & 6);
    // This thread's rows: wm + 16 (i / 4) + tm + i % 4; columns: wn + 32 (j / 4) + tn + j % 4,
    // column j accumulated in acc[i][j ^ 1].
    const int wm = (warp / 2) * 64, wn = (warp % 2) * 64, tm = 4 * g, tn = 4 * h;
    const BlockWork<float, BM, BN, BK> bw(p);
    const int ktiles = bw.w.kt_end - bw.w.kt_begin, kbase = bw.w.kt_begin * BK;
    AsyncTileLoader la(bw.A, p.a_sk, p.m, bw.m0, kbase, tid);
    AsyncTileLoader lb(bw.B, p.b_sk, p.n, bw.n0, kbase, tid);
    const auto load = [&](int kt) {
        const uint32_t stage = smem_at + uint32_t((kt % S) * kStage) * 4;
        la.load(stage, p.k - kbase - kt * BK);
        lb.load(stage + BK * LD * 4, p.k - kbase - kt * BK);
    };
    float acc[16][8];
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (s < ktiles) load(s);
        cp_async_commit();
    }
    // The fragments of step kk + 1 are read while step kk's FMAs run; the last step of a
    // k-tile first waits for the next k-tile and passes the barrier, so that the next
    // k-tile's first fragments load behind its FMAs too. The barrier also frees the stage
    // just read, which the next iteration's copies overwrite.
    float a[2][16], b[2][8];
    const auto frags = [&](float (&fa)[16], float (&fb)[8], int kt, int kk) {
        const float* As = smem + (kt % S) * kStage + kk * LD;
        const float* Bs = As + BK * LD;
#pragma unroll
        for (int c = 0; c < 4; ++c) *reinterpret_cast<float4*>(&fa[4 * c]) = *reinterpret_cast<const float4*>(As + wm + 16 * c + tm);
#pragma unroll
        for (int c = 0; c < 2; ++c) *reinterpret_cast<float4*>(&fb[4 * c]) = *reinterpret_cast<const float4*>(Bs + wn + 32 * c + tn);
    };
    cp_async_wait<S - 2>();
    __syncthreads();
    if (ktiles > 0) frags(a[0], b[0], 0, 0);
    for (int kt = 0; kt < ktiles; ++kt) {
        if (kt + S - 1 < ktiles) load(kt + S - 1);
        cp_async_commit();
        // BODY_K steps per copy of the code, the loop over the copies not unrolled.
#pragma unroll 1
        for (int part = 0; part < BK / BODY_K; ++part)
#pragma unroll
            for (int k8 = 0; k8 < BODY_K; ++k8) {
                const int kk = part * BODY_K + k8;
                if (kk + 1 < BK) {
                    frags(a[(k8 + 1) % 2], b[(k8 + 1) % 2], kt, kk + 1);
                } else if (kt + 1 < ktiles) {
                    cp_async_wait<S - 2>();
                    __syncthreads();
                    frags(a[0], b[0], kt + 1, 0);
                }
#pragma unroll
                for (int i = 0; i < 16; ++i)
#pragma unroll
                    for (int jj = 0; jj < 8; ++jj) {
                        const int j = i % 2 ? 7 - jj : jj;   // serpentine: each row's first B is the last one's
                        acc[i][j ^ 1] = fmaf(a[k8 % 2][i], b[k8 % 2][j], acc[i][j ^ 1]);
                    }
            }
    }
    cp_async_wait<0>();
    __syncthreads();   // the epilogue's tile overlays the stages

    // Slot p of a quad holds column p ^ 1: the staged tile has its columns swapped in pairs.
    fma_epilogue<BM, BN, THREADS, true>(p, bw, smem, acc, wm + tm, wn + tn, tid);
}

} // namespace kiln::gemm

using namespace kiln::gemm;

// Entry points: kiln_gemm_<path>_<dtype>_<BM>x<BN>. The host (gemm_cuda.cpp) lists the same names.
#define KILN_MMA_KERNEL(E, name, BM, BN, WM, WN)                                                        \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN) kiln_gemm_mma_##name##_##BM##x##BN(     \
        const GemmParams p) {                                                                         \
        wait_for_prior_grids();                                                                       \
        mma_gemm<E, BM, BN, WM, WN>(p);                                                               \
    }
KILN_MMA_KERNEL(F16, f16, 128, 128, 2, 4)
KILN_MMA_KERNEL(F16, f16, 64, 64, 2, 2)
KILN_MMA_KERNEL(BF16, bf16, 128, 128, 2, 4)
KILN_MMA_KERNEL(BF16, bf16, 64, 64, 2, 2)
KILN_MMA_KERNEL(TF32, tf32, 128, 128, 2, 4)
KILN_MMA_KERNEL(TF32, tf32, 64, 64, 2, 2)

// 128 threads, two blocks per SM. (A 128 x 256 tile with 256 threads, one block per SM, ran at
// the same speed on the large H100 shapes and slower on the small ones.)
extern "C" __global__ void __launch_bounds__(128, 2) kiln_gemm_fma_f32_128x128(const GemmParams p) {
    wait_for_prior_grids();
    fma_gemm<128, 128>(p);
}
// The cp.async tile (fma_async_gemm): A M-major, B N-major; its code in bodies of 16 k-steps
// (two blocks per SM) or of 8 (_u8: one block per SM).
extern "C" __global__ void __launch_bounds__(128, 2) kiln_gemm_fma_f32_tt_128x128(const GemmParams p) {
    wait_for_prior_grids();
    fma_async_gemm<kAsyncBK>(p);
}
extern "C" __global__ void __launch_bounds__(128, 2) kiln_gemm_fma_f32_tt_128x128_u8(const GemmParams p) {
    wait_for_prior_grids();
    fma_async_gemm<8>(p);
}
extern "C" __global__ void __launch_bounds__(256) kiln_gemm_fma_f32_256x16(const GemmParams p) {
    wait_for_prior_grids();
    fma_narrow_gemm<256, 16>(p);
}

// Split-K's second step: C = epilogue(the slices' sum, added in slice order). With bsum 1-8
// warps take a row (reduce_warps_per_row; its sum is reduced in each warp, then across them);
// without, each thread takes 4 consecutive elements of the flattened M x N plane (16-byte loads
// when N is a multiple of 4), so the slices are read in full coalesced lines whatever N is.
extern "C" __global__ void __launch_bounds__(256) kiln_gemm_reduce_splits(const GemmParams p, const float* slices) {
    wait_for_prior_grids();
    char* C = c_of(p, 0);
    const int64_t plane = int64_t(p.m) * p.n;
    if (!(p.flags & kBsum)) {
        const int64_t i = (int64_t(blockIdx.x) * 256 + threadIdx.x) * 4;
        if (i >= plane) return;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (p.n % 4 == 0) {
#pragma unroll 4
            for (int k = 0; k < p.k_splits; ++k) {
                const float4 v = *reinterpret_cast<const float4*>(slices + k * plane + i);
                acc[0] += v.x, acc[1] += v.y, acc[2] += v.z, acc[3] += v.w;
            }
        } else {
#pragma unroll 4
            for (int k = 0; k < p.k_splits; ++k)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (i + j < plane) acc[j] += slices[k * plane + i + j];
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (i + j < plane) finish_element(p, C, 0, acc[j], int((i + j) / p.n), int((i + j) % p.n));
        return;
    }
    // A row to warps_per_row warps, their columns interleaved 32 at a time (each warp's loads
    // coalesced), its sums added in the warp and then in warp order.
    const int warps_per_row = reduce_warps_per_row(p.n);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % warps_per_row;
    const int m = blockIdx.x * (8 / warps_per_row) + warp / warps_per_row;
    __shared__ float row_parts[8];
    float s = 0.f;
    if (m < p.m) {
        for (int n = 32 * part + lane; n < p.n; n += 32 * warps_per_row) {
            float acc = 0.f;
#pragma unroll 4
            for (int k = 0; k < p.k_splits; ++k) acc += slices[k * plane + int64_t(m) * p.n + n];
            s += finish_element(p, C, 0, acc, m, n);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (warps_per_row == 1) {
        if (lane == 0 && m < p.m) store_bsum(p, 0, m, s);
        return;
    }
    if (lane == 0) row_parts[warp] = s;
    __syncthreads();
    if (part == 0 && lane == 0 && m < p.m) {
        float t = row_parts[warp];
        for (int w = 1; w < warps_per_row; ++w) t += row_parts[warp + w];
        store_bsum(p, 0, m, t);
    }
}

// dst[z][j][i] = src[z][i][j]: the transposing copy that puts an operand into the layout the
// wgmma kernels need (tf32 takes K-major operands only), through 32 x 32 shared-memory tiles
// so that both the reads and the writes are coalesced. Elements are 2 or 4 bytes; src is
// addressed by strides (its j stride is 1 for coalesced reads), dst is (rows_j, ld_dst).
template <class T>
__device__ __forceinline__ void transpose_tile(const T* src, int64_t s_i, int64_t s_j, int64_t s_z, int ni, int nj,
                                               T* dst, int64_t ld_dst, int64_t d_z) {
    __shared__ T tile[32][33];
    const int z = blockIdx.z;
    const int i0 = blockIdx.y * 32, j0 = blockIdx.x * 32;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;   // 32 x 8 threads
    src += z * s_z;
    dst += z * d_z;
#pragma unroll
    for (int r = ty; r < 32; r += 8) {
        const int i = i0 + r, j = j0 + tx;
        if (i < ni && j < nj) tile[r][tx] = src[i * s_i + j * s_j];
    }
    __syncthreads();
#pragma unroll
    for (int r = ty; r < 32; r += 8) {
        const int j = j0 + r, i = i0 + tx;
        if (i < ni && j < nj) dst[j * ld_dst + i] = tile[tx][r];
    }
}

// transpose_tile of float32 on 64 x 64 tiles with 16-byte loads and stores: for a source
// contiguous along j with rows (and batch entries) 16 bytes apart, and a destination likewise
// along i. Each thread moves 16-byte vectors: the 32 x 32 kernel's 4-byte accesses kept too
// few bytes in flight, and the copy of A before a float32 8192^3 product ran at 2.1 TB/s
// (62% of the H100's DRAM peak). In shared memory a row is 64 elements plus 4 bytes, so that
// a warp's writes of its rows and its reads down the columns meet at most 2 per bank.
// (Float32 only: 16-bit operands are never transposed, the wgmma kernels read them in either
// layout; staged_operand in gemm_cuda.cpp.)
__device__ __forceinline__ void transpose_tile_64(const float* src, int64_t s_i, int64_t s_z, int ni, int nj,
                                                  float* dst, int64_t ld_dst, int64_t d_z) {
    using T = float;
    constexpr int V = 16 / sizeof(T);          // elements per vector
    constexpr int P = 64 + 4 / sizeof(T);      // shared row stride, elements
    constexpr int kChunks = 64 / V;            // vectors per 64-element row
    union Vec {
        uint4 u;
        T e[V];
    };
    __shared__ T tile[64 * P];
    const int z = blockIdx.z, i0 = blockIdx.y * 64, j0 = blockIdx.x * 64, t = threadIdx.x;
    src += z * s_z;
    dst += z * d_z;
    // Rows i0.. of the source, vector c of each (kChunks threads a row).
    for (int r = t / kChunks; r < 64; r += 256 / kChunks) {
        const int i = i0 + r, j = j0 + V * (t % kChunks);
        Vec v;
        if (i < ni && j + V <= nj) {
            v.u = *reinterpret_cast<const uint4*>(src + i * s_i + j);
        } else {
#pragma unroll
            for (int e = 0; e < V; ++e) v.e[e] = i < ni && j + e < nj ? src[i * s_i + j + e] : T(0);
        }
#pragma unroll
        for (int e = 0; e < V; ++e) tile[r * P + V * (t % kChunks) + e] = v.e[e];
    }
    __syncthreads();
    // Rows j0.. of the destination: a warp takes 8 vectors (32 elements) of 4 rows: its column
    // reads fall in distinct banks.
    const int lane = t % 32, w = t / 32, warps_a_row = kChunks / 8;
    const int c = lane % 8 + 8 * (w % warps_a_row);
    for (int r = lane / 8 + 4 * (w / warps_a_row); r < 64; r += 4 * (8 / warps_a_row)) {
        const int j = j0 + r, i = i0 + V * c;
        if (j >= nj) break;
        Vec v;
#pragma unroll
        for (int e = 0; e < V; ++e) v.e[e] = tile[(V * c + e) * P + r];
        if (i + V <= ni) {
            *reinterpret_cast<uint4*>(dst + j * ld_dst + i) = v.u;
        } else {
            for (int e = 0; e < V && i + e < ni; ++e) dst[j * ld_dst + i + e] = v.e[e];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) kiln_gemm_transpose_64(const float* src, int64_t s_i, int64_t s_z,
                                                                         int ni, int nj, float* dst, int64_t ld_dst,
                                                                         int64_t d_z) {
    transpose_tile_64(src, s_i, s_z, ni, nj, dst, ld_dst, d_z);
}

// The copy that moves an operand's rows to 128 bytes apart: each row's first row_bytes bytes,
// in 16-byte vectors, one a thread (rows, batch entries and both bases 16-byte aligned; strides
// in vectors; `total` = rows x vecs < 2^31, vecs = row_bytes / 16 rounded up). A row's last
// vector, where `tail` (row_bytes % 16) is not 0, goes 2 bytes at a time, so that nothing past
// the row is read. The JIT's elementwise assignment did this at ~1 TB/s (fp16 4096x7000 B:
// 120 us before a 360 us product on the H100).
extern "C" __global__ void __launch_bounds__(256) kiln_gemm_copy_rows(const uint4* src, int64_t s_row, int64_t s_z,
                                                                      uint32_t vecs, uint32_t tail, uint32_t total,
                                                                      uint4* dst, int64_t ld, int64_t d_z) {
    const uint32_t idx = blockIdx.x * 256u + threadIdx.x;
    if (idx >= total) return;
    const uint32_t row = idx / vecs, v = idx - row * vecs;
    const int64_t z = blockIdx.y;
    const uint4* from = src + z * s_z + int64_t(row) * s_row + v;
    uint4* to = dst + z * d_z + int64_t(row) * ld + v;
    if (tail == 0 || v + 1 < vecs) {
        *to = *from;
    } else {
        for (uint32_t b = 0; b < tail; b += 2)
            reinterpret_cast<uint16_t*>(to)[b / 2] = reinterpret_cast<const uint16_t*>(from)[b / 2];
    }
}

// kiln_gemm_copy_rows for sources whose rows are contiguous but whose rows, batch entries or
// base are only element-aligned (2 bytes for 16-bit dtypes, 4 for float32: rows a number of
// elements apart that is not a multiple of 16 bytes, views that start mid-row): each thread
// still writes one 16-byte vector, assembled from the aligned 4-byte words that cover its 16
// source bytes (five where they start 2 bytes into a word). Such a word holds a byte of the
// row, so it lies inside the row's allocation. `src`, `s_row` and `s_z` in bytes, row_bytes <
// 2^32 - 16. (The JIT's elementwise assignment did this at ~1 TB/s.)
extern "C" __global__ void __launch_bounds__(256) kiln_gemm_copy_rows_unaligned(const unsigned char* src, int64_t s_row,
                                                                                int64_t s_z, uint32_t row_bytes,
                                                                                uint32_t vecs, uint32_t total, uint4* dst,
                                                                                int64_t ld, int64_t d_z) {
    const uint32_t idx = blockIdx.x * 256u + threadIdx.x;
    if (idx >= total) return;
    const uint32_t row = idx / vecs, v = idx - row * vecs;
    const int64_t z = blockIdx.y;
    const unsigned char* from = src + z * s_z + int64_t(row) * s_row + 16 * int64_t(v);
    uint4* to = dst + z * d_z + int64_t(row) * ld + v;
    if (16 * (v + 1) <= row_bytes) {
        const uint32_t shift = uint32_t(reinterpret_cast<uintptr_t>(from) & 3);
        const uint32_t* w = reinterpret_cast<const uint32_t*>(from - shift);
        uint32_t x[5] = {w[0], w[1], w[2], w[3], shift ? w[4] : 0u};
        uint4 out;
        out.x = __funnelshift_r(x[0], x[1], 8 * shift);
        out.y = __funnelshift_r(x[1], x[2], 8 * shift);
        out.z = __funnelshift_r(x[2], x[3], 8 * shift);
        out.w = __funnelshift_r(x[3], x[4], 8 * shift);
        *to = out;
    } else {
        for (uint32_t b = 16 * v; b < row_bytes; b += 2)
            reinterpret_cast<uint16_t*>(to)[(b - 16 * v) / 2] = *reinterpret_cast<const uint16_t*>(from + (b - 16 * v));
    }
}

extern "C" __global__ void __launch_bounds__(256) kiln_gemm_transpose(const void* src, int64_t s_i, int64_t s_j,
                                                                      int64_t s_z, int ni, int nj, void* dst,
                                                                      int64_t ld_dst, int64_t d_z, int esize) {
    if (esize == 4)
        transpose_tile(static_cast<const float*>(src), s_i, s_j, s_z, ni, nj, static_cast<float*>(dst), ld_dst, d_z);
    else
        transpose_tile(static_cast<const uint16_t*>(src), s_i, s_j, s_z, ni, nj, static_cast<uint16_t*>(dst), ld_dst, d_z);
}

