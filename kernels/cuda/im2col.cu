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
    const ConvShape& g = p.shape;
    const char* image = static_cast<const char*>(p.image);
    for (int row = blockIdx.x; row < p.rows; row += gridDim.x) {
        const RowOrigin o = row_origin(g, row);
        const char* img = image + int64_t(o.n) * g.D * g.H * g.W * g.C * p.elem;
        V* out = reinterpret_cast<V*>(static_cast<char*>(p.cols) + int64_t(row) * p.ld * p.elem);
        for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
            const int k = v * per;
            const int tap = k / g.C, c = k - tap * g.C;
            const int s = tap % g.S, rt = tap / g.S;
            const int r = rt % g.R, t = rt / g.R;
            const int d = o.d0 + t * g.dil_d, h = o.h0 + r * g.dil_h, w = o.w0 + s * g.dil_w;
            V value{};
            if (unsigned(d) < unsigned(g.D) && unsigned(h) < unsigned(g.H) && unsigned(w) < unsigned(g.W))
                value = __ldg(reinterpret_cast<const V*>(img + ((int64_t(d * g.H + h) * g.W + w) * g.C + c) * p.elem));
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
