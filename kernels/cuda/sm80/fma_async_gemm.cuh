// The float32 FMA kernel whose operands are copied by cp.async (fma_async_gemm), for
// rows-contiguous, aligned operands: apart from fma_gemm because it has its own loader and
// ring of stages, and shares only its epilogue (fma_gemm.cuh).
#pragma once
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm80/fma_gemm.cuh"
#include "kernels/cuda/sm80/operands.cuh"
#include "kernels/cuda/sm80/ptx.cuh"

#include <stdint.h>

namespace kiln::gemm {

// The 128 x 128 FMA tile for rows-contiguous operands (A M-major, B N-major) with 16-byte
// aligned rows, the selector's fma_async_ok; rule 5 copies operands in other layouts so when
// that pays. cp.async fills a ring of 4 stages of 16 k: the operands pass through no
// registers, the loop has no per-k-tile address arithmetic beyond a pointer step, and one
// barrier serves 16 k (fma_gemm stages through registers and passes a barrier every 8 k; its
// 254 registers left the compiler recomputing addresses inside the loop). Both operands sit
// in shared memory as [16 k][128 rows + 4], as they lie in global memory; per k, 4 + 2
// 16-byte reads feed 128 FMAs, 16 x 8 results per thread as in fma_gemm, the fragments of
// step k + 1 read during step k's FMAs. It runs faster than fma_gemm; K-major operands read
// in place (as [128][16], or transposed on the way by 4-byte copies) ran no faster than
// fma_gemm, which is why they are copied instead. Further:
//  - B is not swapped in pairs (a 16-byte copy cannot permute). The accumulator of column n
//    is slot n ^ 1 of its quad instead, which keeps each FMA's B register and accumulator in
//    different register banks as B's swap did; finish_tile un-swaps the staged tile.
//  - Each row's FMAs run over the columns in a serpentine (even rows left to right, odd rows
//    right to left), so consecutive FMAs share a register at the row changes too, which
//    leaves the compiler's code fewer FMAs with two sources in one register bank.
//  - The lanes' row group g comes from lane bits 0 and 2, the column group h from bits 1, 3
//    and 4: the lanes that read one A vector are pairs (lane, lane ^ 2) and those that read
//    one B vector pairs (lane, lane ^ 1), the pattern for which shared memory returns a
//    16-byte load in 2 wavefronts instead of 4.

constexpr int kAsyncBK = 16, kAsyncStages = 4, kAsyncLD = 128 + 4;

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
// code) run a little faster with two blocks per SM, but leave a lone warp per scheduler (one
// block per SM: narrow products split along k) waiting on instruction fetch, where bodies of
// 8 k-steps run much faster.
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
