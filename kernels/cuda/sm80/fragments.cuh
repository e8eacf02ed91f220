// The warp's part of the mma.sync kernels (mma_gemm.cuh, conv_mma.cuh): one 16-deep k step of
// 16-bit operands, A's MT 16-row and B's NT 8-row fragments read from shared rows of LD
// elements, k contiguous (lane g = lane / 4 reads rows g and g + 8, q = lane % 4 the element
// pairs at 2q and 2q + 8), then the MT x NT products; and the accumulators' store into the
// epilogue's float32 tile (element (i, j, r) at row 16i + g + 8(r / 2), column 8j + 2q + r % 2
// of the warp's).
#pragma once
#include "kernels/cuda/sm80/ptx.cuh"

#include <stdint.h>

namespace kiln::gemm {

template <class E, int MT, int NT, int LD>
__device__ __forceinline__ void mma_step16(float (&acc)[MT][NT][4], const typename E::T* As, const typename E::T* Bs,
                                           int wm, int wn, int g, int q, int ks) {
    using T = typename E::T;
    uint32_t af[MT][4], bf[NT][2];
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
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) mma<E>(acc[i][j], af[i], bf[j]);
}

template <int MT, int NT, int TILE_LD>
__device__ __forceinline__ void store_accumulators(float* tile, const float (&acc)[MT][NT][4], int wm, int wn, int g,
                                                   int q) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float2*>(tile + (wm + 16 * i + g + 8 * h) * TILE_LD + wn + 8 * j + 2 * q) =
                    make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
}

} // namespace kiln::gemm
