// kiln's precompiled convolution of few output channels (narrow_params.hpp): K <= 8 outputs
// from C (a multiple of 8) 16-bit inputs, stride 1, 2D or 1D, any padding and dilation. It is
// the gradient of a first layer of stride 1 with respect to its image (VGG's 3x3 over 3
// channels: E's 64 channels into 3), which the implicit-GEMM kernels would run on a 64-wide
// tile of 3 used columns and the patch matrix would write and read back 9 x 64 values a
// position of. Here the work is reading the input once: a block stages the input window of its
// 8 x 32 output positions, 64 channels at a time, in shared memory by cp.async (zeros outside
// the image), each position's 128 bytes with its 16-byte chunks swizzled (chunk c at c ^ (pos
// % 8)) so that ldmatrix's eight rows of consecutive positions meet eight bank groups; each
// warp multiplies one output row, two m16 tiles, tap by tap and 16 channels at a time, with
// mma.sync m16n8k16 (float32 accumulators), the filter's B fragments staged beside the window
// in the lanes' order. The results take the GEMM's epilogue in registers (alpha, bias, the
// activation, then beta) and are stored per element (K values a position: a few bytes). Every
// GPU from sm_80.
#include "kernels/cuda/narrow_params.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

using namespace kiln::gemm;

namespace {

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 16 bytes from global to shared memory, or zeros where !valid (nothing is read then).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint2 b) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

__device__ __forceinline__ float load_out(const void* out, int64_t i, int dtype) {
    if (dtype == 0) return static_cast<const float*>(out)[i];
    if (dtype == 1) return __half2float(static_cast<const __half*>(out)[i]);
    return __bfloat162float(static_cast<const __nv_bfloat16*>(out)[i]);
}
__device__ __forceinline__ void store_out(void* out, int64_t i, int dtype, float v) {
    if (dtype == 0) static_cast<float*>(out)[i] = v;
    else if (dtype == 1) static_cast<__half*>(out)[i] = __float2half_rn(v);
    else static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
}

template <class T>
__device__ __forceinline__ void conv_narrow(const NarrowParams& p) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int WH = narrow_window_h(p.R, p.dil_h), WW = narrow_window_w(p.S, p.dil_w), taps = p.R * p.S;
    uint2* frags = reinterpret_cast<uint2*>(smem + WH * WW * 128);   // [tap][k16 step][lane]
    const uint32_t window = smem_addr(smem);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int b = int(blockIdx.x);
    const int tw = b % p.tiles_w;
    b /= p.tiles_w;
    const int th = b % p.tiles_h, n = b / p.tiles_h;
    const int y0 = th * kNarrowTileH, x0 = tw * kNarrowTileW;
    const int iy0 = y0 - p.pad_h, ix0 = x0 - p.pad_w;
    const uint16_t* image = static_cast<const uint16_t*>(p.image);
    const uint16_t* filter = static_cast<const uint16_t*>(p.filter);

    float acc[2][4] = {};
    for (int c0 = 0; c0 < p.C; c0 += kNarrowChunk) {
        __syncthreads();   // the previous chunk's window and fragments are read
        for (int i = tid; i < WH * WW * 8; i += blockDim.x) {
            const int pos = i >> 3, ch = i & 7;
            const int wy = pos / WW, wx = pos - wy * WW, iy = iy0 + wy, ix = ix0 + wx, c = c0 + 8 * ch;
            const bool valid = unsigned(iy) < unsigned(p.H) && unsigned(ix) < unsigned(p.W) && c < p.C;
            const uint16_t* src = valid ? image + ((int64_t(n) * p.H + iy) * p.W + ix) * p.C + c : image;
            cp_async16(window + pos * 128 + ((ch ^ (pos & 7)) << 4), src, valid);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        // B fragment of tap t, step j: lane l holds output channel l / 4, channels 2 (l % 4) + {0,
        // 1} (x) and + 8 (y) of the step's 16.
        for (int i = tid; i < taps * 4 * 32; i += blockDim.x) {
            const int l = i & 31, j = (i >> 5) & 3, t = i >> 7;
            const int k = l >> 2, c = c0 + 16 * j + 2 * (l & 3);
            const uint16_t* w = filter + (int64_t(k) * taps + t) * p.C;
            uint2 f{0u, 0u};
            if (k < p.K && c < p.C) f.x = uint32_t(w[c]) | uint32_t(w[c + 1]) << 16;
            if (k < p.K && c + 8 < p.C) f.y = uint32_t(w[c + 8]) | uint32_t(w[c + 9]) << 16;
            frags[i] = f;
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncthreads();
        const int steps = min(4, (p.C - c0 + 15) / 16);
        // ldmatrix.x4: lane l addresses row l % 16 (a position) at 16-byte chunk l / 16 of the step.
        const int m = lane & 15, half = lane >> 4;
        for (int r = 0; r < p.R; ++r)
            for (int s = 0; s < p.S; ++s) {
                const int t = r * p.S + s;
                const int row = (warp + r * p.dil_h) * WW + s * p.dil_w + m;
                for (int j = 0; j < steps; ++j) {
                    const uint2 bf = frags[(t * 4 + j) * 32 + lane];
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        const int pos = row + 16 * mt, chunk = 2 * j + half;
                        uint32_t a[4];
                        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                     : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                                     : "r"(window + pos * 128 + ((chunk ^ (pos & 7)) << 4)));
                        mma16816<T>(acc[mt], a, bf);
                    }
                }
            }
    }

    // Accumulator r of tile mt: position x0 + 16 mt + g + 8 (r / 2), output channel 2 q + r % 2.
    const int g = lane >> 2, q = lane & 3, y = y0 + warp;
    if (y >= p.P) return;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int x = x0 + 16 * mt + g + 8 * (r >> 1), k = 2 * q + (r & 1);
            if (x >= p.Q || k >= p.K) continue;
            const int64_t i = ((int64_t(n) * p.P + y) * p.Q + x) * p.ld + k;
            float v = p.alpha * acc[mt][r];
            if (p.bias) v += p.bias[k];
            if (p.relu && v < 0.f) v = p.slope == 0.f ? 0.f : v * p.slope;
            if (p.beta != 0.f) v += p.beta * load_out(p.out, i, p.out_dtype);
            store_out(p.out, i, p.out_dtype, v);
        }
}

} // namespace

extern "C" __global__ void __launch_bounds__(256) kiln_conv_narrow_f16(const __grid_constant__ NarrowParams p) {
    conv_narrow<__half>(p);
}
extern "C" __global__ void __launch_bounds__(256) kiln_conv_narrow_bf16(const __grid_constant__ NarrowParams p) {
    conv_narrow<__nv_bfloat16>(p);
}
