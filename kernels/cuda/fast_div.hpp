// Division by a divisor fixed for a launch, as a multiply-high and a shift (Granlund and
// Montgomery's division by invariant integers): the im2col and col2im kernels split every
// index into coordinates with several divisions by runtime sizes, and a hardware-less 32-bit
// division costs about twenty instructions where this costs two. Exact for dividends below 2^31.
#pragma once
#include "kernels/cuda/gemm_params.hpp"

namespace kiln::gemm {

struct FastDiv {
    uint32_t d = 1, mul = 0, shift = 0;   // mul 0: d is 1
};

// The multiplier and shift for d >= 1 (the callers' divisors are sizes and strides, checked to be
// at least 1; 0 would divide by 1): with l = ceil(log2 d), mul = ceil(2^(31+l) / d), which is
// below 2^32, and n / d = (n * mul) >> (31 + l) for 0 <= n < 2^31.
inline FastDiv fast_div(uint32_t d) {
    FastDiv f;
    f.d = d;
    if (d > 1) {
        uint32_t l = 0;
        while ((uint64_t(1) << l) < d) ++l;
        f.mul = uint32_t(((uint64_t(1) << (31 + l)) + d - 1) / d);
        f.shift = l - 1;
    }
    return f;
}

// n / f.d for 0 <= n < 2^31.
KILN_GEMM_HOST_DEVICE inline uint32_t divide(uint32_t n, const FastDiv& f) {
    if (f.mul == 0) return n;
#ifdef __CUDA_ARCH__
    return __umulhi(n, f.mul) >> f.shift;
#else
    return uint32_t((uint64_t(n) * f.mul) >> 32) >> f.shift;
#endif
}

// q / f and q % f at once, for 0 <= q < 2^31: q becomes the quotient, the remainder is returned
// (an index split into its coordinates, innermost first).
KILN_GEMM_HOST_DEVICE inline int split(int& q, const FastDiv& f) {
    const int quotient = int(divide(uint32_t(q), f));
    const int rem = q - quotient * int(f.d);
    q = quotient;
    return rem;
}

// i / f for an index that may pass 2^31: the fast division below it.
KILN_GEMM_HOST_DEVICE inline int64_t quotient(int64_t i, const FastDiv& f) {
    return i < (int64_t(1) << 31) ? int64_t(divide(uint32_t(i), f)) : i / f.d;
}

} // namespace kiln::gemm
