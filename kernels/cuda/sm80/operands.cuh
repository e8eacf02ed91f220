// The portable kernels' operand tiles: how an operand is read (16-byte vectors along whichever
// dimension is contiguous and aligned, else element by element), its tile through registers
// into shared memory, and what a block works on (BlockWork: its tile, k-tiles and operands).
// Shared by the tensor-core and FMA kernels, which accept any operand layout through it.
#pragma once
#include "kernels/cuda/gemm_common.cuh"

#include <stdint.h>

namespace kiln::gemm {

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

} // namespace kiln::gemm
