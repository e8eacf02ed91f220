// The portable GEMM kernels: tensor cores through mma.sync (float16, bfloat16, tf32; sm_80 and
// every later GPU, shipped as sm_80 code plus compute_80 PTX) and float32 on the FMA units.
// They accept any operand layout (strides along both dimensions, any alignment): operands are
// read through registers with 16-byte loads where a dimension is contiguous and aligned, else
// element by element, and written to shared memory in the layout the fragments are read in.
// On sm_90 the wgmma kernels (gemm_sm90.cu) take over where TMA can address the operands.
//
// The kernels' pieces are in sm80/: ptx.cuh (mma.sync, cp.async), operands.cuh (operand tiles
// through registers), mma_gemm.cuh, fma_gemm.cuh and fma_async_gemm.cuh (one kernel family
// each). This file holds the entry points and the helper kernels (the split-K reduction, the
// operand copies): one translation unit, so that the module image stays as it is.
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm80/fma_async_gemm.cuh"
#include "kernels/cuda/sm80/fma_gemm.cuh"
#include "kernels/cuda/sm80/mma_gemm.cuh"

using namespace kiln::gemm;

// Entry points: kiln_gemm_<path>_<dtype>_<BM>x<BN>. The host (gemm_select.cpp) lists the same names.
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
// the same speed on large shapes and slower on small ones.)
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

// acc[j] += s[k * plane + j] over the slices k in order, for the first min(valid, 4) j: one
// float4 a slice where the 4 elements are 16-byte aligned (vec), else one element at a time.
__device__ __forceinline__ void sum_slices4(float (&acc)[4], const float* s, int64_t plane, int splits, bool vec,
                                            int64_t valid) {
    if (vec && valid >= 4) {
#pragma unroll 4
        for (int k = 0; k < splits; ++k) {
            const float4 v = *reinterpret_cast<const float4*>(s + k * plane);
            acc[0] += v.x, acc[1] += v.y, acc[2] += v.z, acc[3] += v.w;
        }
        return;
    }
#pragma unroll 4
    for (int k = 0; k < splits; ++k)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (j < valid) acc[j] += s[k * plane + j];
}

// Split-K's second step: C = epilogue(the slices' sum, added in slice order). With bsum 1-8
// warps take a row (reduce_warps_per_row; its sum is reduced in each warp, then across them);
// into C by columns, a block takes 32 x 32 (c_by_columns); otherwise each thread takes 4
// consecutive elements of the flattened M x N plane (16-byte loads when N is a multiple of 4),
// so the slices are read in full coalesced lines whatever N is. kHist: the block counts the
// values it stores into hist_bins words of its dynamic shared memory (from byte hist_smem),
// then adds them to p.hist.
__device__ __forceinline__ void reduce_splits(const GemmParams& p, const float* slices, uint32_t* hist) {
    char* C = c_of(p, 0);
    const int64_t plane = int64_t(p.m) * p.n;
    const auto count = [&](float stored) {
        if (hist) atomicAdd(hist + kiln_hist_bin(stored, p.hist_bins, p.hist_offset), 1u);
    };
    if (c_by_columns(p)) {   // 32 x 32 blocks: summed along the slices' rows, stored along C's columns
        __shared__ float turned[32][33];
        const int tiles_n = (p.n + 31) / 32, t = threadIdx.x;
        const int m0 = int(blockIdx.x) / tiles_n * 32, n0 = int(blockIdx.x) % tiles_n * 32;
        const int r = t / 8, c = 4 * (t % 8), m = m0 + r, n = n0 + c;   // 4 consecutive elements a thread, as below
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (m < p.m) sum_slices4(acc, slices + int64_t(m) * p.n + n, plane, p.k_splits, p.n % 4 == 0, p.n - n);
#pragma unroll
        for (int j = 0; j < 4; ++j) turned[c + j][r] = acc[j];
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int col = t / 32 + 8 * i, mm = m0 + t % 32, nn = n0 + col;
            if (mm < p.m && nn < p.n) count(finish_element(p, C, 0, turned[col][t % 32], mm, nn));
        }
        return;
    }
    if (!(p.flags & kBsum)) {
        const int64_t i = (int64_t(blockIdx.x) * 256 + threadIdx.x) * 4;
        if (i >= plane) return;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        sum_slices4(acc, slices + i, plane, p.k_splits, p.n % 4 == 0, plane - i);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (i + j < plane) count(finish_element(p, C, 0, acc[j], int((i + j) / p.n), int((i + j) % p.n)));
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
            const float stored = finish_element(p, C, 0, acc, m, n);
            s += stored;
            count(stored);
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
extern "C" __global__ void __launch_bounds__(256) kiln_gemm_reduce_splits(const GemmParams p, const float* slices) {
    extern __shared__ __align__(16) unsigned char kiln_gemm_dynamic_smem[];
    uint32_t* const hist = (p.flags & kHist) ? reinterpret_cast<uint32_t*>(kiln_gemm_dynamic_smem + p.hist_smem) : nullptr;
    if (hist) {
        for (int i = threadIdx.x; i < p.hist_bins; i += 256) hist[i] = 0;
        __syncthreads();
    }
    wait_for_prior_grids();
    reduce_splits(p, slices, hist);
    if (hist) {
        __syncthreads();
        for (int i = threadIdx.x; i < p.hist_bins; i += 256)
            if (hist[i]) atomicAdd(p.hist + i, hist[i]);
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
// few bytes in flight, and its copies ran well below the DRAM's bandwidth. In shared memory a
// row is 64 elements plus 4 bytes, so that a warp's writes of its rows and its reads down the
// columns meet at most 2 per bank.
// (Float32 only: 16-bit operands are never transposed, the wgmma kernels read them in either
// layout; staged_operand in gemm_operands.cpp.)
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
// the row is read. The JIT's elementwise assignment did this at a fraction of the DRAM's
// bandwidth, a large part of the product's time.
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
// 2^32 - 16. (The JIT's elementwise assignment did this at a fraction of the DRAM's
// bandwidth.)
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
