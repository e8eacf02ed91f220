// Device code shared by every GEMM kernel: the tile raster, C's loads and stores in its dtype,
// stochastic rounding, and the fused epilogue. Included by the .cu files only (nvcc).
#pragma once
#include "kernels/cuda/gemm_params.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace kiln::gemm {

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

__device__ __forceinline__ void store_c(const GemmParams& p, char* c, int64_t off, float v, uint64_t index) {
    if (p.c_dtype != kF32 && p.sr_bits > 0)
        v = stochastic_round(v, p.c_dtype, p.sr_bits, random_bits(p.seed, p.counter, index));
    switch (p.c_dtype) {
        case kF16: reinterpret_cast<__half*>(c)[off] = __float2half_rn(v); break;
        case kBF16: reinterpret_cast<__nv_bfloat16*>(c)[off] = __float2bfloat16_rn(v); break;
        default: reinterpret_cast<float*>(c)[off] = v;
    }
}

// alpha * acc, + bias[n], activation, + beta * C[m, n]: the value C[m, n] receives.
__device__ __forceinline__ float epilogue_value(const GemmParams& p, const char* c, float acc, int m, int n) {
    float v = p.alpha * acc;
    if (p.flags & kBias) v += __ldg(p.bias + n);
    if (p.flags & kRelu) v = v > 0.f ? v : v * p.slope;
    if (p.flags & kBeta) v += p.beta * load_c(p, c, m * p.c_sm + n * p.c_sn);
    return v;
}

// Finishes one element: computes, stores, and returns the value for the row sums.
__device__ __forceinline__ float finish_element(const GemmParams& p, char* c, int z, float acc, int m, int n) {
    const float v = epilogue_value(p, c, acc, m, n);
    store_c(p, c, m * p.c_sm + n * p.c_sn, v, (uint64_t(z) * p.m + m) * uint64_t(p.n) + n);
    return v;
}

__device__ __forceinline__ char* c_of(const GemmParams& p, int z) {
    const int esize = p.c_dtype == kF32 ? 4 : 2;
    return static_cast<char*>(p.c) + z * p.c_batch * esize;
}

} // namespace kiln::gemm
