// kiln's precompiled histogram kernel (kiln::hist, the seeds' numerics histograms): counts the
// values of a contiguous float tensor by round(log2|x|), clamped into `bins` bins from `offset`
// (include/kiln/hist.hpp), by the same bit rule as the CPU path (hist_bin.cuh), reading 16
// bytes at a time. Each block counts into shared memory, then adds its counts to the slot with
// one atomic per bin. Entry names: kiln_hist_<dtype>.
#include "kernels/cuda/hist_bin.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

struct HistParams {
    const void* x;
    unsigned int* counts;   // bins entries, added to
    long long n;
    int bins;
    int offset;
};

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ void histogram(const HistParams& p) {
    extern __shared__ unsigned int local[];
    for (int b = threadIdx.x; b < p.bins; b += blockDim.x) local[b] = 0;
    __syncthreads();
    const T* x = static_cast<const T*>(p.x);
    const auto count = [&](T v) { atomicAdd(&local[kiln_hist_bin(widen(v), p.bins, p.offset)], 1u); };
    // The body in 16-byte loads from the first 16-byte boundary; the elements before it (head)
    // and after its last whole vector one at a time.
    constexpr int kVec = 16 / sizeof(T);
    const long long head = min(p.n, (long long)((16 - reinterpret_cast<uintptr_t>(x) % 16) % 16 / sizeof(T)));
    const long long vectors = (p.n - head) / kVec;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    const uint4* body = reinterpret_cast<const uint4*>(x + head);
    for (long long i = first; i < vectors; i += stride) {
        const uint4 v = body[i];
        const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
        for (int j = 0; j < kVec; ++j) count(e[j]);
    }
    for (long long i = first; i < head; i += stride) count(x[i]);
    for (long long i = head + vectors * kVec + first; i < p.n; i += stride) count(x[i]);
    __syncthreads();
    for (int b = threadIdx.x; b < p.bins; b += blockDim.x)
        if (local[b]) atomicAdd(&p.counts[b], local[b]);
}

extern "C" __global__ void __launch_bounds__(256) kiln_hist_float32(const __grid_constant__ HistParams p) {
    histogram<float>(p);
}
extern "C" __global__ void __launch_bounds__(256) kiln_hist_float16(const __grid_constant__ HistParams p) {
    histogram<__half>(p);
}
extern "C" __global__ void __launch_bounds__(256) kiln_hist_bfloat16(const __grid_constant__ HistParams p) {
    histogram<__nv_bfloat16>(p);
}
