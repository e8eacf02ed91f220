// kiln's precompiled im2col for CUDA contexts (any GPU kiln runs on): the patch matrix of a
// convolution, one row per output position and one column per filter tap and channel, written
// in one pass for the convolutions the implicit-GEMM kernels do not take (update, strided bprop,
// 3-channel first layers, float32, GPUs other than sm_90). A block walks rows; its threads walk a
// row's columns in vectors of VB bytes (16 where a tap's channels are whole 16-byte chunks, else
// 8, 4 or one element), each loading one vector of the image, or zeros in the padding, and
// storing it. Entry names: kiln_im2col_v<VB>.
#include "kernels/cuda/conv_params.hpp"

#include <stdint.h>

using namespace kiln::gemm;

template <int VB> struct Vec;
template <> struct Vec<16> { using type = uint4; };
template <> struct Vec<8> { using type = uint2; };
template <> struct Vec<4> { using type = uint32_t; };
template <> struct Vec<2> { using type = uint16_t; };

template <int VB>
__device__ __forceinline__ void im2col(const Im2colParams& p) {
    using V = typename Vec<VB>::type;
    const int per = VB / p.elem;                 // elements a vector
    const int vectors = p.taps / per;            // a row's vectors
    const char* image = static_cast<const char*>(p.image);
    for (int row = blockIdx.x; row < p.rows; row += gridDim.x) {
        int rest = row;
        const int x = rest % p.Q;
        rest /= p.Q;
        const int y = rest % p.P;
        rest /= p.P;
        const int z = rest % p.M;
        const int n = rest / p.M;
        const int d0 = z * p.str_d - p.pad_d, h0 = y * p.str_h - p.pad_h, w0 = x * p.str_w - p.pad_w;
        const char* img = image + int64_t(n) * p.D * p.H * p.W * p.C * p.elem;
        V* out = reinterpret_cast<V*>(static_cast<char*>(p.cols) + int64_t(row) * p.ld * p.elem);
        for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
            const int k = v * per;
            const int tap = k / p.C, c = k - tap * p.C;
            const int s = tap % p.S, rt = tap / p.S;
            const int r = rt % p.R, t = rt / p.R;
            const int d = d0 + t * p.dil_d, h = h0 + r * p.dil_h, w = w0 + s * p.dil_w;
            V value{};
            if (unsigned(d) < unsigned(p.D) && unsigned(h) < unsigned(p.H) && unsigned(w) < unsigned(p.W))
                value = __ldg(reinterpret_cast<const V*>(img + ((int64_t(d * p.H + h) * p.W + w) * p.C + c) * p.elem));
            out[v] = value;
        }
    }
}

#define KILN_IM2COL(VB) \
    extern "C" __global__ void __launch_bounds__(256) kiln_im2col_v##VB(const __grid_constant__ Im2colParams p) { im2col<VB>(p); }
KILN_IM2COL(16)
KILN_IM2COL(8)
KILN_IM2COL(4)
KILN_IM2COL(2)
