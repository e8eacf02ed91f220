// Device code shared by every GEMM kernel: the tile raster, C's loads and stores in its dtype,
// stochastic rounding, and the fused epilogue. Included by the .cu files only (nvcc).
#pragma once
#include "kernels/cuda/gemm_params.hpp"
#include "kernels/cuda/hist_bin.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace kiln::gemm {

// The activation of every GEMM epilogue, as the CPU's (kernels/gemm.cpp): ReLU (slope 0)
// takes negatives and -inf to zero and keeps NaN; leaky ReLU scales negatives by the slope.
__device__ __forceinline__ float activation(float v, float slope) {
    const float below = slope == 0.f ? 0.f : v * slope;   // not -inf * 0
    return v < 0.f ? below : v;
}

// Block -> (tile_m, tile_n). Consecutive blocks walk down a group of `group_m` rows of tiles
// before moving right, so the blocks resident at one time share A's rows and B's columns in L2.
struct Tile { int m, n; };
__device__ __forceinline__ Tile tile_of(const GemmParams& p, int pid) {
    const int width = p.group_m * p.tiles_n;
    const int group = pid / width;
    const int first_m = group * p.group_m;
    const int rows = min(p.tiles_m - first_m, p.group_m);
    const int in_group = pid - group * width;
    return {first_m + in_group % rows, in_group / rows};
}

// Programmatic dependent launch. On sm_90 the host launches the one-tile wgmma kernels and
// (where the sm_90 code of the sm_80 image runs) the FMA, mma.sync and split-reduction kernels
// with programmatic stream serialization (gemm_launch.cpp; KILN_PDL=0 turns it off): the launch
// may start its blocks before the kernel before it in the stream has finished, so that their
// setup overlaps that kernel's end instead of following it. Such a kernel waits here before it
// touches global memory that an earlier kernel may write (operands, bias, C, bsum, scratch):
// until then only shared memory and its parameters (the tensor maps among them). Code for
// GPUs before sm_90 has neither instruction (and is never launched so); without the attribute
// the wait returns at once.
__device__ __forceinline__ void wait_for_prior_grids() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");   // every thread: each one's accesses come after
#endif
}
// Lets the next kernel in the stream start its blocks once every block of this grid has said
// so (one thread of a block suffices) or exited; that kernel still waits for this one to end
// before it reads anything. Only the one-tile wgmma kernels say it: the 16-wide tile at its
// start, the others once a short main loop is done (sm90/one_tile.cuh). The FMA kernels do
// not: said at their start, it slowed them, the next kernel's blocks waiting beside theirs;
// without it their exit says it.
__device__ __forceinline__ void allow_next_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The block's batch entry, split and range of k-tiles (of `bk` elements).
struct Work {
    int z;        // batch entry (operands)
    int zc;       // C entry written: the batch entry, or the split with split-K
    int kt_begin, kt_end;
};
__device__ __forceinline__ Work work_of(const GemmParams& p, int bk) {
    const int split = (p.k_cluster ? blockIdx.x : blockIdx.y) % p.k_splits;
    const int total = (p.k + bk - 1) / bk, per = (total + p.k_splits - 1) / p.k_splits;
    const int z = p.k_cluster ? int(blockIdx.y) : int(blockIdx.y) / p.k_splits;
    return {z, p.k_cluster ? z : int(blockIdx.y), min(split * per, total), min((split + 1) * per, total)};
}
// The block's tile number (blocks of a split-K cluster share one).
__device__ __forceinline__ int tile_index(const GemmParams& p) {
    return p.k_cluster ? int(blockIdx.x) / p.k_splits : int(blockIdx.x);
}

__device__ __forceinline__ float load_c(const GemmParams& p, const char* c, int64_t off) {
    switch (p.c_dtype) {
        case kF16: return __half2float(reinterpret_cast<const __half*>(c)[off]);
        case kBF16: return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(c)[off]);
        default: return reinterpret_cast<const float*>(c)[off];
    }
}

// 32 random bits for element `index` of this launch: a counter-based hash (no state), so
// every element's bits depend only on the seed, the launch counter and the element.
__device__ __forceinline__ uint32_t random_bits(uint32_t seed, uint32_t counter, uint64_t index) {
    uint64_t x = index * 0x9E3779B97F4A7C15ull ^ (uint64_t(seed) << 32 | counter);
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27; x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return uint32_t(x);
}

// The same rounding as the JIT's stores (compiler/lower.cpp, stochastic_round): a uniform
// random integer below 2^drop is added to the float32 bits, then the bits below the kept
// mantissa are cut. float16's subnormal grid widens `drop`; NaN, inf and values below the
// grid are left to round-to-nearest.
__device__ __forceinline__ float stochastic_round(float v, int dtype, int keep_bits, uint32_t bits) {
    const int keep = dtype == kBF16 ? min(keep_bits, 7) : keep_bits;
    const uint32_t u = __float_as_uint(v);
    const int e = int(u >> 23) & 0xff;
    int drop = 23 - keep;
    if (dtype == kF16) drop += max(0, 113 - e);
    if (e == 0xff || drop > 23) return v;
    const uint32_t mask = (1u << drop) - 1u;
    return __uint_as_float((u + (bits & mask)) & ~mask);
}

// Stores v as C[off] in C's dtype and returns the value stored (as rounded): bsum adds those.
__device__ __forceinline__ float store_c(const GemmParams& p, char* c, int64_t off, float v, uint64_t index) {
    if (p.c_dtype != kF32 && p.sr_bits > 0)
        v = stochastic_round(v, p.c_dtype, p.sr_bits, random_bits(p.seed, p.counter, index));
    switch (p.c_dtype) {
        case kF16: {
            const __half h = __float2half_rn(v);
            reinterpret_cast<__half*>(c)[off] = h;
            return __half2float(h);
        }
        case kBF16: {
            const __nv_bfloat16 h = __float2bfloat16_rn(v);
            reinterpret_cast<__nv_bfloat16*>(c)[off] = h;
            return __bfloat162float(h);
        }
        default: reinterpret_cast<float*>(c)[off] = v; return v;
    }
}

// C's row m, in elements from C's start: m * c_sm, or in groups (c_group > 0).
__device__ __forceinline__ int64_t c_row(const GemmParams& p, int m) {
    if (p.c_group == 0) return int64_t(m) * p.c_sm;
    const int g = m / p.c_group;
    return int64_t(g) * p.c_sg + int64_t(m - g * p.c_group) * p.c_sm;
}

// alpha * acc, + bias[n], activation, + beta * C[m, n]: the value C[m, n] receives.
__device__ __forceinline__ float epilogue_value(const GemmParams& p, const char* c, float acc, int m, int n) {
    float v = p.alpha * acc;
    if (p.flags & kBias) v += __ldg(p.bias + n);
    if (p.flags & kRelu) v = activation(v, p.slope);
    if (p.flags & kBeta) v += p.beta * load_c(p, c, c_row(p, m) + n * p.c_sn);
    return v;
}

// Finishes one element: computes and stores it, and returns the value stored (for the row sums).
__device__ __forceinline__ float finish_element(const GemmParams& p, char* c, int z, float acc, int m, int n) {
    const float v = epilogue_value(p, c, acc, m, n);
    return store_c(p, c, c_row(p, m) + n * p.c_sn, v, (uint64_t(z) * p.m + m) * uint64_t(p.n) + n);
}

__device__ __forceinline__ char* c_of(const GemmParams& p, int z) {
    const int esize = p.c_dtype == kF32 ? 4 : 2;
    return static_cast<char*>(p.c) + z * p.c_batch * esize;
}

__device__ __forceinline__ void store_bsum(const GemmParams& p, int z, int m, float s) {
    const int64_t off = z * p.bsum_sb + m * p.bsum_sm;
    switch (p.bsum_dtype) {
        case kF16: reinterpret_cast<__half*>(p.bsum)[off] = __float2half_rn(s); break;
        case kBF16: reinterpret_cast<__nv_bfloat16*>(p.bsum)[off] = __float2bfloat16_rn(s); break;
        default: reinterpret_cast<float*>(p.bsum)[off] = s;
    }
}

// kHist: the calling warp's counters (hist_bins words in the dynamic shared memory past the
// kernel's own, GemmParams::hist), zeroed; after the tile, hist_flush adds them to p.hist.
__device__ __forceinline__ uint32_t* hist_begin(const GemmParams& p, int warp, int lane) {
    extern __shared__ __align__(16) unsigned char kiln_gemm_dynamic_smem[];
    uint32_t* h = reinterpret_cast<uint32_t*>(kiln_gemm_dynamic_smem + p.hist_smem) + warp * p.hist_bins;
    for (int i = lane; i < p.hist_bins; i += 32) h[i] = 0;
    __syncwarp();
    return h;
}
__device__ __forceinline__ void hist_flush(const GemmParams& p, const uint32_t* h, int lane) {
    __syncwarp();
    for (int i = lane; i < p.hist_bins; i += 32)
        if (h[i]) atomicAdd(p.hist + i, h[i]);
}
// v as C's dtype rounds it to nearest (the 4-wide stores' rounding).
__device__ __forceinline__ float rounded_as_c(const GemmParams& p, float v) {
    return p.c_dtype == kF16 ? __half2float(__float2half_rn(v))
           : p.c_dtype == kBF16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

// Row stride (floats) of a block's accumulator tile staged in shared memory for the epilogue;
// the padding spreads the fragment layouts' rows over the banks.
__host__ __device__ constexpr int tile_ld(int bn) { return bn + 4; }

// Stores v as C[off .. off + 3] (C contiguous along n, aligned, round to nearest) and returns
// the sum of the values stored (as rounded).
__device__ __forceinline__ float store4(const GemmParams& p, char* c, int64_t off, float4 v) {
    switch (p.c_dtype) {
        case kF16: {
            const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
            *reinterpret_cast<uint2*>(reinterpret_cast<__half*>(c) + off) =
                make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
            const float2 x = __half22float2(a), y = __half22float2(b);
            return (x.x + x.y) + (y.x + y.y);
        }
        case kBF16: {
            const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
            *reinterpret_cast<uint2*>(reinterpret_cast<__nv_bfloat16*>(c) + off) =
                make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
            const float2 x = __bfloat1622float2(a), y = __bfloat1622float2(b);
            return (x.x + x.y) + (y.x + y.y);
        }
        default: *reinterpret_cast<float4*>(reinterpret_cast<float*>(c) + off) = v; return (v.x + v.y) + (v.z + v.w);
    }
}

// The epilogue's second half. The kernels write their accumulators to shared memory as
// float[ROWS][tile_ld(COLS)] (fragment layouts differ per kernel); NTHREADS threads then
// finish the tile here, a warp per row and 4 columns per lane, so C is read and written in
// coalesced runs (whole 4-element vectors when C's rows are contiguous and aligned). Every load
// a row needs is issued before its values are used, and the bias is read once per tile: with a
// warp per row and few warps per block, an epilogue that waits on each load in turn
// serialises. For bsum (the sums of the values as stored, rounded to C's dtype) each lane
// leaves its share of a row in the row's first 32 words once the row is in registers, and
// after the last row each lane adds up one row's shares: a chain of 5 shuffles per row, row
// after row, put every row's adds on the epilogue's path. The order of the additions is
// fixed: the sums are deterministic.
// `row_sums`: with bsum_cluster, where the tile's row sums go (shared memory, ROWS floats).
// PAIRS_SWAPPED: the tile holds each even/odd pair of columns swapped (column c at c ^ 1).
template <int ROWS, int COLS, int NTHREADS, bool PAIRS_SWAPPED = false>
__device__ __forceinline__ void finish_tile(const GemmParams& p, float* tile, int m0, int n0, int tile_n, int z,
                                            int tid, float* row_sums = nullptr) {
    constexpr int kChunks = (COLS + 127) / 128;   // 4-column chunks per lane
    constexpr int ld = tile_ld(COLS);
    constexpr int kWarps = NTHREADS / 32, kRowsPerWarp = ROWS / kWarps;
    static_assert(ROWS % kWarps == 0 && kRowsPerWarp <= 32, "rows not divisible among the warps, or too many per warp");
    // Lanes holding columns of a row (all 32 from 128 columns on); a tile row (COLS + 4 words)
    // has room for their bsum shares.
    constexpr int kShareLanes = COLS >= 128 ? 32 : (COLS + 3) / 4;
    const int warp = tid / 32, lane = tid % 32;
    char* C = c_of(p, z);
    const int esize = p.c_dtype == kF32 ? 4 : 2;
    const bool vec = p.c_sn == 1 && (p.sr_bits == 0 || p.c_dtype == kF32) && p.c_sm % 4 == 0 && p.c_sg % 4 == 0 && n0 % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(C) % (4 * esize) == 0;
    const bool bias = p.flags & kBias, relu = p.flags & kRelu, beta = p.flags & kBeta;
    uint32_t* const hist = (p.flags & kHist) ? hist_begin(p, warp, lane) : nullptr;
    // C by columns (c_by_columns): a warp takes columns and its lanes the rows, so that a warp's
    // stores run along C's contiguous axis.
    if (c_by_columns(p)) {
        constexpr int kRowSteps = (ROWS + 31) / 32;
        for (int c = warp; c < COLS; c += kWarps) {
            const int n = n0 + c;
            if (n >= p.n) break;
            const float b = bias ? __ldg(p.bias + n) : 0.f;
            float o[kRowSteps];
#pragma unroll
            for (int i = 0; i < kRowSteps; ++i) {
                const int r = lane + 32 * i, m = m0 + r;
                o[i] = beta && r < ROWS && m < p.m ? load_c(p, C, int64_t(m) + int64_t(n) * p.c_sn) : 0.f;
            }
#pragma unroll
            for (int i = 0; i < kRowSteps; ++i) {
                const int r = lane + 32 * i, m = m0 + r;
                if (r >= ROWS || m >= p.m) break;
                float v = p.alpha * tile[r * ld + (PAIRS_SWAPPED ? c ^ 1 : c)] + b;
                if (relu) v = activation(v, p.slope);
                v += p.beta * o[i];   // o is 0 without beta
                const float stored =
                    store_c(p, C, int64_t(m) + int64_t(n) * p.c_sn, v, (uint64_t(z) * p.m + m) * uint64_t(p.n) + n);
                if (hist) atomicAdd(hist + kiln_hist_bin(stored, p.hist_bins, p.hist_offset), 1u);
            }
        }
        if (hist) hist_flush(p, hist, lane);
        return;
    }
    float4 bv[kChunks];
#pragma unroll
    for (int h = 0; h < kChunks; ++h) {
        const int c = 4 * lane + 128 * h, n = n0 + c;
        float b[4] = {0.f, 0.f, 0.f, 0.f};
        if (bias && c < COLS)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (n + j < p.n) b[j] = __ldg(p.bias + n + j);
        bv[h] = make_float4(b[0], b[1], b[2], b[3]);
    }
    for (int r = warp; r < ROWS; r += kWarps) {
        const int m = m0 + r;
        if (m >= p.m) break;
        float4 a[kChunks], cv[kChunks];
#pragma unroll
        for (int h = 0; h < kChunks; ++h) {
            const int c = 4 * lane + 128 * h, n = n0 + c;
            a[h] = c < COLS ? *reinterpret_cast<const float4*>(tile + r * ld + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            if (PAIRS_SWAPPED) a[h] = make_float4(a[h].y, a[h].x, a[h].w, a[h].z);
            float o[4] = {0.f, 0.f, 0.f, 0.f};
            if (beta && c < COLS)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (n + j < p.n) o[j] = load_c(p, C, c_row(p, m) + int64_t(n + j) * p.c_sn);
            cv[h] = make_float4(o[0], o[1], o[2], o[3]);
        }
        float s = 0.f;
#pragma unroll
        for (int h = 0; h < kChunks; ++h) {
            const int c = 4 * lane + 128 * h, n = n0 + c;
            if (c >= COLS || n >= p.n) continue;
            float v[4] = {a[h].x, a[h].y, a[h].z, a[h].w};
            const float b[4] = {bv[h].x, bv[h].y, bv[h].z, bv[h].w}, o[4] = {cv[h].x, cv[h].y, cv[h].z, cv[h].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                v[j] = p.alpha * v[j] + b[j];
                if (relu) v[j] = activation(v[j], p.slope);
                v[j] += p.beta * o[j];   // o is 0 without beta
            }
            if (vec && n + 3 < p.n) {
                s += store4(p, C, c_row(p, m) + n, make_float4(v[0], v[1], v[2], v[3]));
                if (hist)
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        atomicAdd(hist + kiln_hist_bin(rounded_as_c(p, v[j]), p.hist_bins, p.hist_offset), 1u);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (n + j < p.n) {
                        const float stored = store_c(p, C, c_row(p, m) + int64_t(n + j) * p.c_sn, v[j],
                                                     (uint64_t(z) * p.m + m) * uint64_t(p.n) + n + j);
                        s += stored;
                        if (hist) atomicAdd(hist + kiln_hist_bin(stored, p.hist_bins, p.hist_offset), 1u);
                    }
            }
        }
        if (p.flags & kBsum) {
            // The row's values are in registers: its first words take the lanes' shares.
            __syncwarp();
            if (lane < kShareLanes) tile[r * ld + lane] = s;
        }
    }
    if (hist) hist_flush(p, hist, lane);
    if (!(p.flags & kBsum)) return;
    // Lane i adds up the shares of the warp's row i, in a fixed order (rotated by the lane so
    // the lanes read different banks).
    __syncwarp();
    const int r = warp + lane * kWarps, m = m0 + r;
    if (lane >= kRowsPerWarp || m >= p.m) return;
    float s = 0.f;
#pragma unroll 8
    for (int j = 0; j < kShareLanes; ++j) s += tile[r * ld + (j + lane) % kShareLanes];
    if (p.tiles_n == 1) store_bsum(p, z, m, s);
    else if (row_sums) row_sums[r] = s;
    else p.bsum_partials[(int64_t(tile_n) * p.batch + z) * p.m + m] = s;
}

// bsum across a row of tiles. Each tile stores its row sums in bsum_partials, then one thread
// counts the tile on the row's turn counter (bsum_count_tile); the last of the row's tiles_n
// tiles adds the row's partial sums in tile order and stores them (bsum_add_tiles), and the
// counter goes back to zero for the next launch. (The fence-and-count handshake of a grid
// barrier: the tile's partial-sum stores are ordered before the count, which is a release;
// the last tile's count is an acquire, so it sees every other tile's sums.)

// One thread, once its block's stores are ordered before it (a barrier after them): counts the
// block on `counter`, zero before the launch; true for the last of `arrivals`, which sets the
// counter back to zero for the next launch.
__device__ __forceinline__ bool count_arrival(uint32_t* counter, uint32_t arrivals) {
    uint32_t before;
    asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
    const bool last = before == arrivals - 1;
    if (last) atomicExch(counter, 0u);
    return last;
}

// One thread, once the tile's partial sums are stored and ordered before it: true for the
// row's last tile.
__device__ __forceinline__ bool bsum_count_tile(const GemmParams& p, int tile_m, int z) {
    // With split-K in a cluster each block of a tile counts its own share of the rows.
    return count_arrival(p.bsum_turns + int64_t(z) * p.tiles_m + tile_m,
                         uint32_t(p.tiles_n * (p.k_cluster ? p.k_splits : 1)));
}

// The row's last tile: the sums of rows [m0, m0 + ROWS) over the row's tiles, by `nthreads`
// threads (this one is `tid`), GROUP tiles' loads in flight per round trip to L2 (one
// dependent load per tile would put a round trip per tile after the row's last tile).
template <int ROWS, int GROUP = 8>
__device__ __forceinline__ void bsum_add_rows(const GemmParams& p, int m0, int z, int tid, int nthreads) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    const float* col = p.bsum_partials + int64_t(z) * p.m + m0;
    const int64_t tile_stride = int64_t(p.batch) * p.m;
    for (int r = tid; r < ROWS && m0 + r < p.m; r += nthreads) {
        float s = 0.f;
        for (int t0 = 0; t0 < p.tiles_n; t0 += GROUP) {
            float v[GROUP];
#pragma unroll
            for (int j = 0; j < GROUP; ++j) v[j] = t0 + j < p.tiles_n ? __ldcg(col + (t0 + j) * tile_stride + r) : 0.f;
#pragma unroll
            for (int j = 0; j < GROUP; ++j) s += v[j];
        }
        store_bsum(p, z, m0 + r, s);
    }
}

// Both steps, after finish_tile stored this tile's row sums (and its C). `sync` is a barrier
// over the `nthreads` epilogue threads. Out of line: it runs once a tile, and inlined into
// every epilogue it would cost registers everywhere.
template <int ROWS, class Sync>
__device__ __noinline__ void count_tile_and_add_rows(const GemmParams& p, int m0, int tile_m, int z, int tid, int nthreads,
                                                     Sync sync) {
    __shared__ int last_of_row;
    sync();
    if (tid == 0) last_of_row = bsum_count_tile(p, tile_m, z);
    sync();
    if (last_of_row) bsum_add_rows<ROWS>(p, m0, z, tid, nthreads);
}
// Whether there is anything to add is decided inline, where `p` is still the kernel's
// parameter: inside the out-of-line call every field is a load through a generic pointer, and
// with one tile per row (nothing to add) the call and that load were all that bsum cost on the
// 16-wide tiles.
template <int ROWS, class Sync>
__device__ __forceinline__ void bsum_across_tiles(const GemmParams& p, int m0, int tile_m, int z, int tid, int nthreads,
                                                  Sync sync) {
    if ((p.flags & kBsum) && p.tiles_n > 1) count_tile_and_add_rows<ROWS>(p, m0, tile_m, z, tid, nthreads, sync);
}

} // namespace kiln::gemm
