// The numerics histograms' bin rule on the GPU (include/kiln/hist.hpp), shared by the histogram
// kernel (hist.cu) and the GEMM epilogue's store-path counting (gemm_common.cuh): the same bits
// as the CPU's rule (kernels/hist.cpp), so that every path counts alike whatever log2 would
// round to. 0 and NaN in bin 0, infinities in the last; the exponent, plus one past a
// significand of sqrt(2) (0x3504f4 is the first significand above it), less the offset, clamped.
// Where the bins lie within the normal exponents (kiln_hist_fast), adding 2^23 - 0x3504f4 carries
// that one into the exponent field, and zero, subnormals and infinities clamp to the bins they
// belong in: a few integer instructions (binning, more than the shared-memory atomics, is what
// counting costs).
#pragma once

__device__ __forceinline__ bool kiln_hist_fast(int bins, int offset) { return offset >= -126 && offset + bins <= 129; }

__device__ __forceinline__ int kiln_hist_bin(float x, int bins, int offset) {
    unsigned u = __float_as_uint(x) & 0x7fffffffu;
    if (kiln_hist_fast(bins, offset)) {
        const int l = (int)((u + 0x4afb0cu) >> 23) - 127 - offset;
        return u > 0x7f800000u ? 0 : min(max(l, 0), bins - 1);
    }
    if (u == 0 || u > 0x7f800000u) return 0;
    if (u == 0x7f800000u) return bins - 1;
    int shift = 0;
    if (u < 0x00800000u) {   // subnormal: scale by 2^24, exactly
        u = __float_as_uint(__uint_as_float(u) * 16777216.0f);
        shift = 24;
    }
    const int l = (int)(u >> 23) - 127 - shift + ((u & 0x7fffffu) >= 0x3504f4u ? 1 : 0) - offset;
    return l >= bins - 1 ? bins - 1 : l <= 0 ? 0 : l;
}
