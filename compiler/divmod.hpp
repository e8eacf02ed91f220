// NumPy's floor division, remainder and fmod on host values of kiln's two compute types. These
// are the specification of what the lowering (compiler/lower.cpp) builds out of kernel
// instructions, step for step, and what canonicalise folds scalar subtrees with, so that a folded
// constant equals the value a kernel computes.
//
// Floats follow NumPy's npy_floor_divide / npy_remainder / npy_divmod (CPython's float divmod):
// the remainder is fmod(a, b) moved to the divisor's side, the quotient (a - fmod) / b rounded to
// the integer below and snapped to the nearest integer. A zero divisor gives a / b for the
// quotient (inf, -inf or nan) and fmod's nan for the remainder. Integers: the quotient rounds
// toward -inf, the remainder has the divisor's sign, a zero divisor gives 0 for both, and
// INT32_MIN // -1 wraps to INT32_MIN (remainder 0), as NumPy's integer loops do.
#pragma once
#include <cmath>
#include <cstdint>

namespace kiln {

inline float floor_divide_f32(float a, float b) {
    if (b == 0) return a / b;
    float mod = std::fmod(a, b);
    float div = (a - mod) / b;
    if (mod != 0 && (b < 0) != (mod < 0)) div -= 1.0f;  // the remainder moves to b's side
    if (div != 0) {
        float fl = std::floor(div);
        return div - fl > 0.5f ? fl + 1.0f : fl;
    }
    return std::copysign(0.0f, a / b);
}

inline float remainder_f32(float a, float b) {
    float mod = std::fmod(a, b);  // nan for b == 0
    if (mod != 0) return (b < 0) != (mod < 0) ? mod + b : mod;
    return std::copysign(0.0f, b);
}

inline int32_t floor_divide_i32(int32_t a, int32_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int32_t)(0u - (uint32_t)a);  // INT32_MIN stays INT32_MIN
    int32_t q = a / b, r = a % b;
    return r != 0 && (r < 0) != (b < 0) ? q - 1 : q;
}

inline int32_t remainder_i32(int32_t a, int32_t b) {
    if (b == 0 || b == -1) return 0;
    int32_t r = a % b;
    return r != 0 && (r < 0) != (b < 0) ? r + b : r;
}

inline int32_t fmod_i32(int32_t a, int32_t b) { return b == 0 || b == -1 ? 0 : a % b; }

} // namespace kiln
