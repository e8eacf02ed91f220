// The device helpers every generated kernel starts with (see cuda_internal.hpp).
#include "codegen/cuda/cuda_internal.hpp"

namespace kiln::codegen::detail {

// Device helpers shared by every kernel. The 16-bit float conversions are bit-for-bit those of
// ir/half.hpp, so the CPU and CUDA backends store identical bits. A kernel's source holds only
// the parts its shape calls (NVRTC's time grows with the source it parses, not only with what a
// kernel uses).
const char* const kCudaPrelude = R"(// ---- kiln prelude
#define KILN_NO_POS 2147483647

// Programmatic dependent launch: on sm_90 and later the runtime may start this kernel's blocks
// before the kernel before it in the stream has ended (their setup overlapping its tail), so
// every kernel waits for the earlier grids before it touches global memory. A kernel does not
// trigger the next one early: its blocks then took the free slots of the multiprocessors while
// this grid ran, unevenly, and a grid of less than a wave ran up to 1.5x slower back to back.
__device__ __forceinline__ void kiln_after_prior_grids() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Exact; a NaN keeps its payload, as in ir/half.hpp (the hardware conversion does the rest).
// Branch-free, so that a thread's loads are not serialised behind the conversions.
__device__ __forceinline__ float kiln_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    const unsigned nan = ((unsigned)(h & 0x8000u) << 16) | 0x7f800000u | ((unsigned)(h & 0x3ffu) << 13);
    return ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) ? __uint_as_float(nan) : f;
}

// The hardware's conversion alone, for a value known not to be a NaN.
__device__ __forceinline__ float kiln_f16_to_f32_hw(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
// Round to nearest even; overflow gives inf; NaN keeps its sign and top payload bits (quieted),
// as ir/half.hpp does (the hardware conversion would give a canonical NaN).
__device__ __forceinline__ unsigned short kiln_f32_to_f16(float f) {
    const unsigned u = __float_as_uint(f);
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    const unsigned short nan = (unsigned short)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : h;
}

__device__ __forceinline__ float kiln_bf16_to_f32(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

__device__ __forceinline__ unsigned short kiln_f32_to_bf16(float f) {
    const unsigned u = __float_as_uint(f);
    const unsigned short nan = (unsigned short)((u >> 16) | 0x40u);
    const unsigned short rounded = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

// Two 16-bit floats of one 32-bit word (the lower one first) at once: the hardware's paired
// conversions, which give the rules above except for NaNs (the hardware makes them canonical).
// kiln_*x2_nan says whether a word holds a NaN, so that the vector paths test a whole group's
// words with one branch and take the exact conversions above only then (rarely).
__device__ __forceinline__ unsigned kiln_f16x2_nan(unsigned w) { return ((w & 0x7fff7fffu) + 0x03ff03ffu) & 0x80008000u; }
__device__ __forceinline__ unsigned kiln_bf16x2_nan(unsigned w) { return ((w & 0x7fff7fffu) + 0x007f007fu) & 0x80008000u; }

__device__ __forceinline__ void kiln_f16x2_cvt(unsigned w, float& lo, float& hi) {
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }" : "=f"(lo), "=f"(hi) : "r"(w));
}

__device__ __forceinline__ void kiln_bf16x2_cvt(unsigned w, float& lo, float& hi) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ unsigned kiln_f32x2_to_f16x2_cvt(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    unsigned w;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    return w;
#else
    return (unsigned)kiln_f32_to_f16(lo) | ((unsigned)kiln_f32_to_f16(hi) << 16);
#endif
}

__device__ __forceinline__ unsigned kiln_f32x2_to_bf16x2_cvt(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    unsigned w;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    return w;
#else
    return (unsigned)kiln_f32_to_bf16(lo) | ((unsigned)kiln_f32_to_bf16(hi) << 16);
#endif
}

// exp for kernels whose every stored value is a 16-bit float (the emitter picks it; other
// kernels call expf): ex2.approx of x * log2(e), as CUDA's __expf, off by at most 2 + 1.2|x|
// units in the last place of a float (about 2^-16 relative at the ends of exp's range),
// against float16's rounding step of 2^-11 and bfloat16's of 2^-8; subnormal results kept.
__device__ __forceinline__ float kiln_exp_fast(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}
// The same for the terms of a sum of exponentials about the values' max (softmax's), which
// holds exp(0) = 1: a term below float's normal range cannot move such a sum, so it flushes to
// zero (ex2's .ftz form, without the fix-up that keeps subnormal results).
__device__ __forceinline__ float kiln_exp_sum_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}

// Truncation toward zero, saturating, NaN -> 0 (PTX cvt.rzi.sat).
__device__ __forceinline__ int kiln_f32_to_i32(float x) {
    if (x != x) return 0;
    if (x >= 2147483648.0f) return 2147483647;
    if (x <= -2147483648.0f) return -2147483647 - 1;
    return (int)x;
}

// NumPy's maximum/minimum: a NaN operand gives NaN.
__device__ __forceinline__ float kiln_maxf(float x, float y) { return (x > y || x != x) ? x : y; }
__device__ __forceinline__ float kiln_minf(float x, float y) { return (x < y || x != x) ? x : y; }
// The same in one instruction from sm_80 (max.NaN: a NaN operand gives the canonical NaN).
__device__ __forceinline__ float kiln_max_nan(float x, float y) {
#if __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    return r;
#else
    return kiln_maxf(x, y);
#endif
}
__device__ __forceinline__ float kiln_min_nan(float x, float y) {
#if __CUDA_ARCH__ >= 800
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    return r;
#else
    return kiln_minf(x, y);
#endif
}
// The same on two pairs of 16-bit floats at once (max.NaN where Max, else min.NaN; float16, or
// bfloat16 where BF), sm_80 on.
template <bool Max, bool BF>
__device__ __forceinline__ unsigned kiln_ext_nan_x2(unsigned a, unsigned b) {
    unsigned r = a;
#if __CUDA_ARCH__ >= 800
    if (Max && BF) asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    if (Max && !BF) asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    if (!Max && BF) asm("min.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    if (!Max && !BF) asm("min.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
#endif
    return r;
}
)";

// Reductions: the accumulator kinds, and the warp, block and column reductions.
const char* const kCudaReducePrelude = R"(
// Accumulators: a state is (v, p); `add` folds in (x, q) and is also the combine of two states;
// `add_next` the same for a q after every position the state has seen (a thread's elements in
// order), which arg kinds decide with fewer tests.
// Arg kinds keep the extreme value with the smallest position, a NaN counting as the extreme;
// an empty state has position KILN_NO_POS, so it loses every tie.
// The kinds are templates over a value type's traits K (kiln_f: float, kiln_i: int wrapping;
// kiln_d and kiln_l, for 64-bit values, in the wide part); the NaN tests only where K::real.
struct kiln_f {
    typedef float T;
    enum { real = 1 };
    static __device__ __forceinline__ T add(T a, T b) { return a + b; }
    static __device__ __forceinline__ T mul(T a, T b) { return a * b; }
    static __device__ __forceinline__ T lowest() { return __uint_as_float(0xff800000u); }
    static __device__ __forceinline__ T highest() { return __uint_as_float(0x7f800000u); }
};
struct kiln_i {
    typedef int T;
    enum { real = 0 };
    static __device__ __forceinline__ T add(T a, T b) { return (int)((unsigned)a + (unsigned)b); }
    static __device__ __forceinline__ T mul(T a, T b) { return (int)((unsigned)a * (unsigned)b); }
    static __device__ __forceinline__ T lowest() { return -2147483647 - 1; }
    static __device__ __forceinline__ T highest() { return 2147483647; }
};
template <class K> struct kiln_sum {
    typedef typename K::T T;
    enum { positional = 0, lower_first = 0 };
    static __device__ __forceinline__ T init() { return T(0); }
    static __device__ __forceinline__ void add(T& v, int&, T x, int) { v = K::add(v, x); }
    static __device__ __forceinline__ void add_next(T& v, int& p, T x, int q) { add(v, p, x, q); }
};
template <class K> struct kiln_prod {
    typedef typename K::T T;
    enum { positional = 0, lower_first = 0 };
    static __device__ __forceinline__ T init() { return T(1); }
    static __device__ __forceinline__ void add(T& v, int&, T x, int) { v = K::mul(v, x); }
    static __device__ __forceinline__ void add_next(T& v, int& p, T x, int q) { add(v, p, x, q); }
};
template <class K> struct kiln_max {
    typedef typename K::T T;
    enum { positional = 0, lower_first = 1 };
    static __device__ __forceinline__ T init() { return K::lowest(); }
    static __device__ __forceinline__ void add(T& v, int&, T x, int) {
        if constexpr (K::real) { if (x > v || x != x) v = x; } else { if (x > v) v = x; }
    }
    static __device__ __forceinline__ void add_next(T& v, int& p, T x, int q) { add(v, p, x, q); }
    enum { is_max = 1 };   // (kiln_ext_step's: its extreme)
    static __device__ __forceinline__ float extreme(float a, float b) { return kiln_max_nan(a, b); }
};
template <class K> struct kiln_min {
    typedef typename K::T T;
    enum { positional = 0, lower_first = 1 };
    static __device__ __forceinline__ T init() { return K::highest(); }
    static __device__ __forceinline__ void add(T& v, int&, T x, int) {
        if constexpr (K::real) { if (x < v || x != x) v = x; } else { if (x < v) v = x; }
    }
    static __device__ __forceinline__ void add_next(T& v, int& p, T x, int q) { add(v, p, x, q); }
    enum { is_max = 0 };
    static __device__ __forceinline__ float extreme(float a, float b) { return kiln_min_nan(a, b); }
};
template <class K> struct kiln_argmax {
    typedef typename K::T T;
    enum { positional = 1, lower_first = 0 };
    static __device__ __forceinline__ T init() { return K::lowest(); }
    static __device__ __forceinline__ void add(T& v, int& p, T x, int q) {
        if constexpr (K::real) {
            const bool take = (x != x) ? (v == v || q < p) : (v == v && (x > v || (x == v && q < p)));
            if (take) { v = x; p = q; }
        } else if (x > v || (x == v && q < p)) {
            v = x; p = q;
        }
    }
    static __device__ __forceinline__ void add_next(T& v, int& p, T x, int q) {
        if constexpr (K::real) {
            if (v == v && (x > v || x != x || p == KILN_NO_POS)) { v = x; p = q; }
        } else if (x > v || p == KILN_NO_POS) {
            v = x; p = q;
        }
    }
    // (kiln_arg_step's: the extreme of two floats, a NaN taken; whether e leaves v as it is.)
    enum { is_max = 1 };
    static __device__ __forceinline__ float extreme(float a, float b) { return kiln_max_nan(a, b); }
    static __device__ __forceinline__ bool within(float e, float v) { return e <= v; }
};
template <class K> struct kiln_argmin {
    typedef typename K::T T;
    enum { positional = 1, lower_first = 0 };
    static __device__ __forceinline__ T init() { return K::highest(); }
    static __device__ __forceinline__ void add(T& v, int& p, T x, int q) {
        if constexpr (K::real) {
            const bool take = (x != x) ? (v == v || q < p) : (v == v && (x < v || (x == v && q < p)));
            if (take) { v = x; p = q; }
        } else if (x < v || (x == v && q < p)) {
            v = x; p = q;
        }
    }
    static __device__ __forceinline__ void add_next(T& v, int& p, T x, int q) {
        if constexpr (K::real) {
            if (v == v && (x < v || x != x || p == KILN_NO_POS)) { v = x; p = q; }
        } else if (x < v || p == KILN_NO_POS) {
            v = x; p = q;
        }
    }
    enum { is_max = 0 };
    static __device__ __forceinline__ float extreme(float a, float b) { return kiln_min_nan(a, b); }
    static __device__ __forceinline__ bool within(float e, float v) { return e >= v; }
};
#define KILN_ACC_KINDS(S, K)                                                                        \
    typedef kiln_sum<K> kiln_sum_##S; typedef kiln_prod<K> kiln_prod_##S; typedef kiln_max<K> kiln_max_##S; \
    typedef kiln_min<K> kiln_min_##S; typedef kiln_argmax<K> kiln_argmax_##S; typedef kiln_argmin<K> kiln_argmin_##S;
KILN_ACC_KINDS(f, kiln_f)
KILN_ACC_KINDS(i, kiln_i)

// A block's arrival at a grid-wide counter, by one thread after a barrier: release (the block's
// writes before the barrier are visible to whoever sees the count) and acquire (so are those of
// every block counted before it). Lighter than __threadfence()'s sequentially consistent fence,
// which every block of a full reduction would wait on before it ends.
__device__ __forceinline__ unsigned kiln_arrive(unsigned* counter) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
    return before;
}

// A group of N lanes (a power of two, aligned within the warp): the group's first lane ends with
// the group's state, the lower lanes' states first in a fixed tree. Called by every lane.
template <class A, int N>
__device__ __forceinline__ void kiln_group_reduce(typename A::T& v, int& p) {
#pragma unroll
    for (int o = N / 2; o > 0; o >>= 1) {
        const typename A::T x = __shfl_down_sync(0xffffffffu, v, o);
        const int q = __shfl_down_sync(0xffffffffu, p, o);
        A::add(v, p, x, q);
    }
}
// Lane 0 ends with the warp's combined state.
template <class A>
__device__ __forceinline__ void kiln_warp_reduce(typename A::T& v, int& p) {
    kiln_group_reduce<A, 32>(v, p);
}

// Every thread ends with the block's combined state, always combined in the same order.
// sv/sp: shared scratch of 33 entries; blockDim.x is a multiple of 32. Called by all threads.
template <class A>
__device__ __forceinline__ void kiln_block_reduce(typename A::T& v, int& p, typename A::T* sv, int* sp) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    kiln_warp_reduce<A>(v, p);
    if (lane == 0) { sv[warp] = v; sp[warp] = p; }
    __syncthreads();
    if (warp == 0) {
        const int nwarps = blockDim.x >> 5;
        v = lane < nwarps ? sv[lane] : A::init();
        p = lane < nwarps ? sp[lane] : KILN_NO_POS;
        kiln_warp_reduce<A>(v, p);
        if (lane == 0) { sv[32] = v; sp[32] = p; }
    }
    __syncthreads();
    v = sv[32];
    p = sp[32];
    __syncthreads();
}
)";

// Grouped steps of row kernels' max, min and arg kinds: a step's values at once.
const char* const kCudaStepPrelude = R"(
// The extreme of a step's N float values: A's (max.NaN or min.NaN) over four running partials,
// an instruction a value; a NaN among them gives NaN.
template <class A, int N>
__device__ __forceinline__ float kiln_extreme(const float* x) {
    static_assert(N % 4 == 0, "a step holds whole groups of at least 4 elements");
    float m0 = x[0], m1 = x[1], m2 = x[2], m3 = x[3];
#pragma unroll
    for (int u = 4; u < N; u += 4) {
        m0 = A::extreme(m0, x[u]);
        m1 = A::extreme(m1, x[u + 1]);
        m2 = A::extreme(m2, x[u + 2]);
        m3 = A::extreme(m3, x[u + 3]);
    }
    return A::extreme(A::extreme(m0, m1), A::extreme(m2, m3));
}
// The same extreme from the step's 16-bit floats as loaded, two to a word (bfloat16 where BF):
// max.NaN or min.NaN on the pairs, then the last pair widened, so that the values need no
// conversion where the state does not move (a NaN among them gives NaN).
template <class A, bool BF, int W>
__device__ __forceinline__ float kiln_extreme16(const unsigned (&w)[W]) {
#if __CUDA_ARCH__ < 800   // (no paired max.NaN: the values widened)
    float x[2 * W];
#pragma unroll
    for (int i = 0; i < W; ++i) {
        if (BF) kiln_bf16x2_cvt(w[i], x[2 * i], x[2 * i + 1]);
        else kiln_f16x2_cvt(w[i], x[2 * i], x[2 * i + 1]);
    }
    return kiln_extreme<A, 2 * W>(x);
#else
    unsigned m[W < 4 ? W : 4];
#pragma unroll
    for (int i = 0; i < (W < 4 ? W : 4); ++i) m[i] = w[i];
#pragma unroll
    for (int i = 4; i < W; ++i) m[i % 4] = kiln_ext_nan_x2<A::is_max, BF>(m[i % 4], w[i]);
#pragma unroll
    for (int i = 1; i < (W < 4 ? W : 4); ++i) m[0] = kiln_ext_nan_x2<A::is_max, BF>(m[0], m[i]);
    float lo, hi;
    if (BF) kiln_bf16x2_cvt(m[0], lo, hi);
    else kiln_f16x2_cvt(m[0], lo, hi);
    return A::extreme(lo, hi);
#endif
}
// State (v, p) after a step whose extreme is e: only when e moves it (an empty state, a larger
// value for argmax, a NaN) the first element equal to it, or the first NaN.
template <class A, int N, int V>
__device__ __forceinline__ void kiln_arg_take(float& v, int& p, float e, const float (&x)[N], long long q, long long stride) {
    if (p != KILN_NO_POS && (v != v || A::within(e, v))) return;
    int f = N - 1;
    if (e == e) {
#pragma unroll
        for (int u = N - 2; u >= 0; --u) f = x[u] == e ? u : f;
    } else {
#pragma unroll
        for (int u = N - 2; u >= 0; --u) f = x[u] != x[u] ? u : f;
    }
    v = e;
    p = (int)(q + (long long)(f / V) * stride + f % V);
}
// A row's grouped step into an arg kind's float state: N values in position order (element u
// at position q + (u / V) * stride + u % V), as add_next would take them one by one. The step's
// extreme first (kiln_extreme); only when it moves the state (an empty state, a larger value
// for argmax, a NaN) the first element equal to it, or the first NaN. A state moves in few of a
// thread's steps, so an element costs about one instruction instead of the five of add_next's
// tests and selects.
template <class A, int N, int V>
__device__ __forceinline__ void kiln_arg_step(float& v, int& p, const float (&x)[N], long long q, long long stride) {
    kiln_arg_take<A, N, V>(v, p, kiln_extreme<A, N>(x), x, q, stride);
}
// The arg step from the step's 16-bit words alone (N = 2 W values): they are widened only when
// the extreme moves the state (the hardware's conversions: a NaN's payload makes no position).
template <class A, int N, int V, bool BF, int W>
__device__ __forceinline__ void kiln_arg_step16(float& v, int& p, const unsigned (&w)[W], long long q, long long stride) {
    static_assert(N == 2 * W, "two values a word");
    const float e = kiln_extreme16<A, BF, W>(w);
    if (p != KILN_NO_POS && (v != v || A::within(e, v))) return;
    float x[N];
#pragma unroll
    for (int i = 0; i < W; ++i) {
        if (BF) kiln_bf16x2_cvt(w[i], x[2 * i], x[2 * i + 1]);
        else kiln_f16x2_cvt(w[i], x[2 * i], x[2 * i + 1]);
    }
    kiln_arg_take<A, N, V>(v, p, e, x, q, stride);
}

// kiln_maxf over N values in order, for N a multiple of 4, by kiln_extreme. Which NaN and which
// of +0 and -0 the ordered fold keeps depend on the order, so a NaN or zero result takes the
// values one by one instead.
template <int N>
__device__ __forceinline__ float kiln_max_in_order(const float* x) {
    float g = kiln_extreme<kiln_max_f, N>(x);
    if (g != g || g == 0.0f) {
        g = x[0];
#pragma unroll
        for (int u = 1; u < N; ++u) g = kiln_maxf(g, x[u]);
    }
    return g;
}

// A row's grouped step into a max or min float state: N values in position order, as add_next
// would take them one by one. Their extreme (kiln_extreme, or kiln_extreme16 from 16-bit
// words), then one add; a NaN or zero extreme adds the values one by one, since which NaN and
// which zero the state keeps depend on their order.
template <class A, int N>
__device__ __forceinline__ void kiln_ext_take(float& v, int& p, float e, const float (&x)[N]) {
    if (e != e || e == 0.0f) {
#pragma unroll
        for (int u = 0; u < N; ++u) A::add(v, p, x[u], 0);
    } else {
        A::add(v, p, e, 0);
    }
}
template <class A, int N>
__device__ __forceinline__ void kiln_ext_step(float& v, int& p, const float (&x)[N]) {
    kiln_ext_take<A, N>(v, p, kiln_extreme<A, N>(x), x);
}
template <class A, int N, bool BF, int W>
__device__ __forceinline__ void kiln_ext_step16(float& v, int& p, const float (&x)[N], const unsigned (&w)[W]) {
    kiln_ext_take<A, N>(v, p, kiln_extreme16<A, BF, W>(w), x);
}

)";

// Column kernels: the slices of a block's columns combined.
const char* const kCudaColumnPrelude = R"(
// Column kernels: a block is W columns (threadIdx.x & (W - 1)) x 256 / W slices. The slices of a
// column combine in slice order; every thread ends with its column's state.
// sv/sp: 256 entries. Called by every thread of the block.
template <class A, int W>
__device__ __forceinline__ void kiln_column_reduce(typename A::T& v, int& p, typename A::T* sv, int* sp) {
    sv[threadIdx.x] = v;
    sp[threadIdx.x] = p;
    __syncthreads();
    const int column = (int)(threadIdx.x & (W - 1));
    v = A::init();
    p = KILN_NO_POS;
    for (int s = 0; s < 256 / W; ++s) A::add(v, p, sv[s * W + column], sp[s * W + column]);
    __syncthreads();
}
// The vector entry's form: a block is W threads across, each with the states of V adjacent
// columns, x 256 / W slices. sv/sp: 256 * V entries. The slices of a column combine in slice
// order in groups of V (each of 256 / (W * V) threads per column folds one group), then the
// groups in order: a fixed order, and each thread reads V entries per stage, where folding
// every slice in every thread would read 256 / W per column.
// Positions (arg kinds only: Arg) pass through sp; the other kinds leave it alone.
template <class A, int W, int V, bool Arg>
__device__ __forceinline__ void kiln_column_reduce_v(typename A::T (&v)[V], int (&p)[V], typename A::T* sv, int* sp) {
    const int column = (int)(threadIdx.x & (W - 1)), slice = (int)(threadIdx.x / W);
    const int width = W * V, point = (int)threadIdx.x % width, part = (int)threadIdx.x / width;
#pragma unroll
    for (int c = 0; c < V; ++c) {
        sv[(slice * W + column) * V + c] = v[c];
        if (Arg) sp[(slice * W + column) * V + c] = p[c];
    }
    __syncthreads();
    typename A::T x = A::init();
    int q = KILN_NO_POS;
#pragma unroll
    for (int s = part * V; s < part * V + V; ++s) A::add(x, q, sv[s * width + point], Arg ? sp[s * width + point] : 0);
    __syncthreads();
    sv[threadIdx.x] = x;
    if (Arg) sp[threadIdx.x] = q;
    __syncthreads();
    if ((int)threadIdx.x < width) {
        x = A::init();
        q = KILN_NO_POS;
#pragma unroll
        for (int g = 0; g < 256 / width; ++g) A::add(x, q, sv[g * width + point], Arg ? sp[g * width + point] : 0);
        sv[256 + point] = x;
        if (Arg) sp[256 + point] = q;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < V; ++c) {
        v[c] = sv[256 + column * V + c];
        if (Arg) p[c] = sp[256 + column * V + c];
    }
    __syncthreads();
}
)";

// Moments (row kernels, and column kernels with Moments folds): Chan et al.'s merge, the
// column slices' and a warp's combines.
const char* const kCudaMomentsPrelude = R"(
// Moments of values: count c, mean m and sum q of squared deviations from m. merge(a, b) folds
// b into a by Chan et al.'s update; an empty b leaves a as it is. Not symmetric in its bits,
// so every combine below puts the lower-numbered part first, and all threads of a row end
// with the same state.
__device__ __forceinline__ void kiln_moments_merge(float& c, float& m, float& q, float c2, float m2, float q2) {
    const float n = c + c2;
    float r;   // 1 / n within an ulp (exact for a power of two), without division's slow path
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(n));
    const float f = c2 > 0.0f ? (c > 0.0f ? c2 * r : 1.0f) : 0.0f;   // an empty a takes b as it is
    const float d = c2 > 0.0f ? m2 - m : 0.0f;
    m = m + d * f;
    q = q + q2 + d * d * c * f;
    c = n;
}
// kiln_column_reduce_v for the moments (count, mean, M2) of a column kernel's Moments folds
// (V = 1: the scalar entry): the same fixed order, merged by kiln_moments_merge. sc/sm/sq:
// 256 * V + 256 floats each.
template <int W, int V>
__device__ __forceinline__ void kiln_column_reduce_moments(float (&c)[V], float (&m)[V], float (&q)[V], float* sc,
                                                           float* sm, float* sq) {
    const int column = (int)(threadIdx.x & (W - 1)), slice = (int)(threadIdx.x / W);
    const int width = W * V, point = (int)threadIdx.x % width, part = (int)threadIdx.x / width;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int at = (slice * W + column) * V + k;
        sc[at] = c[k], sm[at] = m[k], sq[at] = q[k];
    }
    __syncthreads();
    float xc = 0.0f, xm = 0.0f, xq = 0.0f;
#pragma unroll
    for (int s = part * V; s < part * V + V; ++s)
        kiln_moments_merge(xc, xm, xq, sc[s * width + point], sm[s * width + point], sq[s * width + point]);
    __syncthreads();
    sc[threadIdx.x] = xc, sm[threadIdx.x] = xm, sq[threadIdx.x] = xq;
    __syncthreads();
    if ((int)threadIdx.x < width) {
        xc = 0.0f, xm = 0.0f, xq = 0.0f;
        for (int g = 0; g < 256 / width; ++g)
            kiln_moments_merge(xc, xm, xq, sc[g * width + point], sm[g * width + point], sq[g * width + point]);
        sc[256 + point] = xc, sm[256 + point] = xm, sq[256 + point] = xq;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < V; ++k) c[k] = sc[256 + column * V + k], m[k] = sm[256 + column * V + k], q[k] = sq[256 + column * V + k];
    __syncthreads();
}
// A warp's (or its segments' of n lanes) moments combined in a butterfly, lower lanes first;
// S: the same rounds also sum x.
template <bool S>
__device__ __forceinline__ void kiln_moments_butterfly(float& c, float& m, float& q, float& x, const int n) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        if (o < n) {
            const float c2 = __shfl_xor_sync(0xffffffffu, c, o), m2 = __shfl_xor_sync(0xffffffffu, m, o),
                        q2 = __shfl_xor_sync(0xffffffffu, q, o);
            if (S) x += __shfl_xor_sync(0xffffffffu, x, o);
            const bool upper = (threadIdx.x & o) != 0;
            float ca = upper ? c2 : c, ma = upper ? m2 : m, qa = upper ? q2 : q;
            kiln_moments_merge(ca, ma, qa, upper ? c : c2, upper ? m : m2, upper ? q : q2);
            c = ca, m = ma, q = qa;
        }
}
)";

// Row kernels: the row cache's shared-memory and global words, and the row groups' reductions
// (warp segments, blocks, clusters), moments and sums of exponentials.
const char* const kCudaRowPrelude = R"(
// The row cache's words by 32-bit shared-memory address, computed once per thread (through a
// pointer, the compiler rebuilds the cache's generic address at every access). Volatile and
// clobbering memory: they stay ordered with the cache's element-wise accesses.
__device__ __forceinline__ void kiln_sts(unsigned a, uint4 w) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w) : "memory");
}
__device__ __forceinline__ void kiln_sts(unsigned a, uint2 w) {
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(a), "r"(w.x), "r"(w.y) : "memory");
}
__device__ __forceinline__ void kiln_sts(unsigned a, unsigned w) {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(a), "r"(w) : "memory");
}
template <class W> __device__ W kiln_lds(unsigned a);
template <> __device__ __forceinline__ uint4 kiln_lds<uint4>(unsigned a) {
    uint4 w;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w) : "r"(a) : "memory");
    return w;
}
template <> __device__ __forceinline__ uint2 kiln_lds<uint2>(unsigned a) {
    uint2 w;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(w.x), "=r"(w.y) : "r"(a) : "memory");
    return w;
}
template <> __device__ __forceinline__ unsigned kiln_lds<unsigned>(unsigned a) {
    unsigned w;
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w) : "r"(a) : "memory");
    return w;
}
// A word of global memory `s` bytes past an aligned boundary (a group out of its row's phase):
// the aligned words holding it, shifted (the second is read only when s > 0; it holds the
// group's last element, so it lies in the allocation's granule).
template <class W> __device__ W kiln_ldg_shift(const void* at, unsigned s);
template <> __device__ __forceinline__ unsigned kiln_ldg_shift<unsigned>(const void* at, unsigned s) {
    const unsigned* p = (const unsigned*)((const unsigned char*)at - s);
    const unsigned a = p[0], b = s ? p[1] : a;
    return __funnelshift_r(a, b, s * 8);
}
template <> __device__ __forceinline__ uint2 kiln_ldg_shift<uint2>(const void* at, unsigned s) {
    const uint2* p = (const uint2*)((const unsigned char*)at - s);
    const uint2 a = p[0], b = s ? p[1] : a;
    const bool q = s & 4;
    const unsigned r = (s & 3) * 8, w0 = q ? a.y : a.x, w1 = q ? b.x : a.y, w2 = q ? b.y : b.x;
    return make_uint2(__funnelshift_r(w0, w1, r), __funnelshift_r(w1, w2, r));
}
template <> __device__ __forceinline__ uint4 kiln_ldg_shift<uint4>(const void* at, unsigned s) {
    const uint4* p = (const uint4*)((const unsigned char*)at - s);
    const uint4 a = p[0], b = s ? p[1] : a;
    const bool q2 = s & 8, q1 = s & 4;
    const unsigned r = (s & 3) * 8;
    const unsigned x0 = q2 ? a.z : a.x, x1 = q2 ? a.w : a.y, x2 = q2 ? b.x : a.z, x3 = q2 ? b.y : a.w,
                   x4 = q2 ? b.z : b.x, x5 = q2 ? b.w : b.y;
    const unsigned y0 = q1 ? x1 : x0, y1 = q1 ? x2 : x1, y2 = q1 ? x3 : x2, y3 = q1 ? x4 : x3, y4 = q1 ? x5 : x4;
    return make_uint4(__funnelshift_r(y0, y1, r), __funnelshift_r(y1, y2, r), __funnelshift_r(y2, y3, r),
                      __funnelshift_r(y3, y4, r));
}
// The same word where the buffer's elements are 4 bytes: each element read on its own boundary,
// without the second word and the selects the shift takes. (Only the 16-byte word: a row with
// 4-byte elements moves groups of 4, and one with wider ones takes no groups.)
template <class W> __device__ W kiln_ldg_words(const void* at);
template <> __device__ __forceinline__ uint4 kiln_ldg_words<uint4>(const void* at) {
    const unsigned* p = (const unsigned*)at;
    return make_uint4(p[0], p[1], p[2], p[3]);
}
// A group's word to global memory in one store. Written as plain C++, the compiler may split
// it into 4-byte stores where it cannot prove the address 16-byte aligned (a row's phase is
// known only at run time); the row kernels check the alignment themselves.
__device__ __forceinline__ void kiln_stg(void* p, uint4 w) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w) : "memory");
}
__device__ __forceinline__ void kiln_stg(void* p, uint2 w) {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w.x), "r"(w.y) : "memory");
}
__device__ __forceinline__ void kiln_stg(void* p, unsigned w) {
    asm volatile("st.global.b32 [%0], %1;" ::"l"(p), "r"(w) : "memory");
}
// ---- row groups: G threads (a power of two) reduce one row: a segment of a warp, a group of
// warps of one block, or every block of a cluster (sm_90).
// Bytes of dynamic shared memory this launch has.
__device__ __forceinline__ unsigned kiln_dynamic_smem_size() {
    unsigned n;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    return n;
}

// A barrier over every thread of the cluster, ordering shared-memory writes before it with
// reads after it (release/acquire).
__device__ __forceinline__ void kiln_cluster_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// The blocks of a cluster exchange a row's partial results without a cluster-wide barrier:
// threads 0..csize-1 send the block's N words to its slot in every block's buffer (st.async,
// counted in bytes by the receiver's mbarrier), and every thread waits on its own block's
// mbarrier. The two buffers are used in turn: a block sends into a buffer again two rounds
// later, after every block has sent the round in between, which each does only after all its
// threads have read the buffer (the block-level barrier of every reduction comes first).
// kiln_cx_init once before the first exchange, a cluster barrier after the last.
struct kiln_cx {
    unsigned long long bar[2];
    unsigned data[2][16][4];   // [buffer][sending block (kCudaMaxCluster)][word]
};
__device__ __forceinline__ void kiln_cx_init(kiln_cx* x) {
#if __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((unsigned)__cvta_generic_to_shared(&x->bar[0])) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((unsigned)__cvta_generic_to_shared(&x->bar[1])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    kiln_cluster_sync();
#endif
}
// Sends w (the same in every thread) and returns the buffer that then holds every block's words.
template <int N>
__device__ __forceinline__ int kiln_cx_exchange(kiln_cx* x, unsigned& round, const unsigned (&w)[N], int csize) {
    const int b = (int)(round & 1u);
#if __CUDA_ARCH__ >= 900
    const unsigned bar = (unsigned)__cvta_generic_to_shared(&x->bar[b]);
    if (threadIdx.x == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"((unsigned)(csize * N * 4))
                     : "memory");
    if ((int)threadIdx.x < csize) {
        unsigned rank, dst, rbar;
        asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
        asm("mapa.shared::cluster.u32 %0, %1, %2;"
            : "=r"(dst)
            : "r"((unsigned)__cvta_generic_to_shared(&x->data[b][rank][0])), "r"((unsigned)threadIdx.x));
        asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rbar) : "r"(bar), "r"((unsigned)threadIdx.x));
#pragma unroll
        for (int i = 0; i < N; ++i)
            asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(dst + 4u * i),
                         "r"(w[i]), "r"(rbar)
                         : "memory");
    }
    unsigned done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(bar), "r"((round >> 1) & 1u)
                     : "memory");
    } while (!done);
#endif
    ++round;
    return b;
}

// Every thread of a row group of G threads ends with the group's state. The combining order
// depends only on G (a butterfly within the warp, then one over the group's warps' states, then
// blocks in index order), so a result never depends on timing. The butterflies are unrolled
// (each level guarded by the uniform G): a level costs its shuffles and one combine, no loop.
// sv/sp: 32 per-warp entries; x/round: the cluster's exchange. Called by every thread of the
// block (barriers when G > 32). Reach: how far the entry's launches' G goes (0: a warp, 1: a
// block, 2: a cluster); the steps past it are left out of the entry (x may then be null).
// A kind whose combine is not symmetric in its bits (max and min keep their first operand of
// +0 and -0, or of two NaNs) takes the lower lane's state first in both lanes, so that every
// lane ends with the same bits.
template <class A>
__device__ __forceinline__ void kiln_butterfly(typename A::T& v, int& p, const int n) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        if (o < n) {
            const typename A::T y = __shfl_xor_sync(0xffffffffu, v, o);
            const int q = A::positional ? __shfl_xor_sync(0xffffffffu, p, o) : KILN_NO_POS;
            if (A::lower_first && (threadIdx.x & o) != 0) {
                typename A::T a = y;
                int pa = q;
                A::add(a, pa, v, p);
                v = a, p = pa;
            } else {
                A::add(v, p, y, q);
            }
        }
}
template <class A, int Reach>
__device__ __forceinline__ void kiln_row_reduce(typename A::T& v, int& p, const int G, typename A::T* sv, int* sp,
                                                kiln_cx* x, unsigned& round) {
    kiln_butterfly<A>(v, p, G);
    if constexpr (Reach > 0) {   // (a warp's entry instantiates nothing past its butterfly)
        if (G <= 32) return;
        const int nthreads = (int)blockDim.x, warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
        const int per_group = (G < nthreads ? G : nthreads) >> 5, first = warp & -per_group;
        if (lane == 0) {
            sv[warp] = v;
            if (A::positional) sp[warp] = p;
        }
        __syncthreads();
        // Lane i of every warp of the group takes warp i % per_group's state, then a butterfly over
        // each per_group lanes: every lane ends with the group's state. (Kinds without positions
        // leave sp alone, so that a kernel without them has no such array.)
        const int from = first + (lane & (per_group - 1));
        v = sv[from];
        if (A::positional) p = sp[from];
        kiln_butterfly<A>(v, p, per_group);
        __syncthreads();
        if constexpr (Reach > 1) {
            if (G <= nthreads) return;
            // The state as words: the value's (one or two), then the position.
            constexpr int N = (int)(sizeof(typename A::T) / 4) + 1;
            unsigned w[N];
            memcpy(w, &v, sizeof(v));
            w[N - 1] = (unsigned)p;
            const int b = kiln_cx_exchange<N>(x, round, w, G / nthreads);
            v = A::init();
            p = KILN_NO_POS;
#pragma unroll 1
            for (int r = 0; r < G / nthreads; ++r) {
                typename A::T y;
                memcpy(&y, x->data[b][r], sizeof(y));
                A::add(v, p, y, (int)x->data[b][r][N - 1]);
            }
        }
    }
}
)";

// Row kernels with Moments folds: their rows' moments combined.
const char* const kCudaRowMomentsPrelude = R"(
// kiln_row_reduce for moments: sc/sm/sq 32 entries. S: the same round also sums x (a sum of
// the same values kept by kiln_sum_f; sx its entries), so that the mean and the moments cost
// one round.
template <bool S, int Reach>
__device__ __forceinline__ void kiln_row_reduce_moments(float& c, float& m, float& q, float& x, const int G, float* sc,
                                                        float* sm, float* sq, float* sx, kiln_cx* cx, unsigned& round) {
    kiln_moments_butterfly<S>(c, m, q, x, G);
    if constexpr (Reach > 0) {   // (a warp's entry instantiates nothing past its butterfly)
        if (G <= 32) return;
        const int nthreads = (int)blockDim.x, warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
        const int per_group = (G < nthreads ? G : nthreads) >> 5, first = warp & -per_group;
        if (lane == 0) {
            sc[warp] = c; sm[warp] = m; sq[warp] = q;
            if (S) sx[warp] = x;
        }
        __syncthreads();
        const int from = first + (lane & (per_group - 1));   // as in kiln_row_reduce
        c = sc[from], m = sm[from], q = sq[from];
        if (S) x = sx[from];
        kiln_moments_butterfly<S>(c, m, q, x, per_group);
        __syncthreads();
        if constexpr (Reach > 1) {
            if (G <= nthreads) return;
            const unsigned w[4] = {__float_as_uint(c), __float_as_uint(m), __float_as_uint(q), __float_as_uint(x)};
            const int b = kiln_cx_exchange<4>(cx, round, w, G / nthreads);
            const unsigned(*e)[4] = cx->data[b];
            c = __uint_as_float(e[0][0]), m = __uint_as_float(e[0][1]), q = __uint_as_float(e[0][2]);
            if (S) x = __uint_as_float(e[0][3]);
#pragma unroll 1
            for (int r = 1; r < G / nthreads; ++r) {
                kiln_moments_merge(c, m, q, __uint_as_float(e[r][0]), __uint_as_float(e[r][1]), __uint_as_float(e[r][2]));
                if (S) x += __uint_as_float(e[r][3]);
            }
        }
    }
}
)";

// Row kernels with an ExpSum fold (softmax's denominator): sums of exponentials about a running max.
const char* const kCudaLsePrelude = R"(
// Sums of exponentials about a running max (online softmax): m the max of the values so far
// (NaN-propagating, as kiln_max_f) and s the sum of exp(x - m) over them. A state with m = -inf
// has s = 0 (or NaN); exponentials are taken about 0 then, so that -inf - -inf never appears.
// F: where the kernel's Op::Exp is kiln_exp_fast, these sums' exps are kiln_exp_sum_fast.
template <bool F>
__device__ __forceinline__ float kiln_exp_sel(float x) { return F ? kiln_exp_sum_fast(x) : expf(x); }
template <bool F>
__device__ __forceinline__ void kiln_lse_merge(float& m, float& s, float m2, float s2) {
    const float mn = kiln_maxf(m, m2);
    const float ms = mn == __uint_as_float(0xff800000u) ? 0.0f : mn;
    s = s * kiln_exp_sel<F>(m - ms) + s2 * kiln_exp_sel<F>(m2 - ms);
    m = mn;
}
// One value: a new max rescales s, any other value adds its exponential.
template <bool F>
__device__ __forceinline__ void kiln_lse_add(float& m, float& s, float x) {
    if (x > m || x != x) {
        s = s * kiln_exp_sel<F>(m - x) + 1.0f;
        m = x;
    } else {
        s += kiln_exp_sel<F>(x - (m == __uint_as_float(0xff800000u) ? 0.0f : m));
    }
}
// N values at once: their max first, then one rescale and N exponentials.
template <bool F, int N>
__device__ __forceinline__ void kiln_lse_step(float& m, float& s, const float* x) {
    const float g = kiln_max_in_order<N>(x);
    const float mn = kiln_maxf(m, g);
    const float ms = mn == __uint_as_float(0xff800000u) ? 0.0f : mn;
    float t = 0.0f;
#pragma unroll
    for (int u = 0; u < N; ++u) t += kiln_exp_sel<F>(x[u] - ms);
    s = s * kiln_exp_sel<F>(m - ms) + t;
    m = mn;
}
// kiln_row_reduce for (m, s): sm/ss 32 entries; every thread of a row ends with the same
// state, combined in a fixed order.
template <bool F>
__device__ __forceinline__ void kiln_lse_butterfly(float& m, float& s, const int n) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        if (o < n) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            // The lower lane's state first in both lanes: the merge contracts to an fma, not symmetric.
            const bool upper = (threadIdx.x & o) != 0;
            float ma = upper ? m2 : m, sa = upper ? s2 : s;
            kiln_lse_merge<F>(ma, sa, upper ? m : m2, upper ? s : s2);
            m = ma, s = sa;
        }
}
template <bool F, int Reach>
__device__ __forceinline__ void kiln_row_reduce_lse(float& m, float& s, const int G, float* sm, float* ss, kiln_cx* x,
                                                    unsigned& round) {
    kiln_lse_butterfly<F>(m, s, G);
    if constexpr (Reach > 0) {   // (a warp's entry instantiates nothing past its butterfly)
        if (G <= 32) return;
        const int nthreads = (int)blockDim.x, warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
        const int per_group = (G < nthreads ? G : nthreads) >> 5, first = warp & -per_group;
        if (lane == 0) { sm[warp] = m; ss[warp] = s; }
        __syncthreads();
        const int from = first + (lane & (per_group - 1));   // as in kiln_row_reduce
        m = sm[from], s = ss[from];
        kiln_lse_butterfly<F>(m, s, per_group);
        __syncthreads();
        if constexpr (Reach > 1) {
            if (G <= nthreads) return;
            const unsigned w[2] = {__float_as_uint(m), __float_as_uint(s)};
            const int b = kiln_cx_exchange<2>(x, round, w, G / nthreads);
            m = __uint_as_float(x->data[b][0][0]), s = __uint_as_float(x->data[b][0][1]);
#pragma unroll 1
            for (int r = 1; r < G / nthreads; ++r) kiln_lse_merge<F>(m, s, __uint_as_float(x->data[b][r][0]), __uint_as_float(x->data[b][r][1]));
        }
    }
}
)";

const char* const kCudaWidePrelude = R"(
// 64-bit parameters: two 32-bit words of Args, low word first.
__device__ __forceinline__ double kiln_param_f64(const float* fp, int i) {
    return __hiloint2double(__float_as_int(fp[i + 1]), __float_as_int(fp[i]));
}
__device__ __forceinline__ long long kiln_param_i64(const int* ip, int i) {
    return (long long)(((unsigned long long)(unsigned)ip[i + 1] << 32) | (unsigned)ip[i]);
}
// Truncation toward zero, saturating, NaN -> 0 (as kiln_f32_to_i32).
__device__ __forceinline__ long long kiln_f64_to_i64(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775808.0) return 9223372036854775807LL;
    if (x <= -9223372036854775808.0) return -9223372036854775807LL - 1;
    return (long long)x;
}
__device__ __forceinline__ long long kiln_f32_to_i64(float x) { return kiln_f64_to_i64((double)x); }
__device__ __forceinline__ int kiln_f64_to_i32(double x) {
    if (x != x) return 0;
    if (x >= 2147483648.0) return 2147483647;
    if (x <= -2147483648.0) return -2147483647 - 1;
    return (int)x;
}
__device__ __forceinline__ double kiln_maxd(double x, double y) { return (x > y || x != x) ? x : y; }
__device__ __forceinline__ double kiln_mind(double x, double y) { return (x < y || x != x) ? x : y; }
)";

// The accumulator kinds on 64-bit states, for wide kernels with accumulators: float64 sums and
// products rounded per step (never contracted into an FMA, as the CPU backend does them),
// int64 ones wrapping.
const char* const kCudaWideReducePrelude = R"(
struct kiln_d {
    typedef double T;
    enum { real = 1 };
    static __device__ __forceinline__ T add(T a, T b) { return __dadd_rn(a, b); }
    static __device__ __forceinline__ T mul(T a, T b) { return __dmul_rn(a, b); }
    static __device__ __forceinline__ T lowest() { return __longlong_as_double(0xfff0000000000000LL); }
    static __device__ __forceinline__ T highest() { return __longlong_as_double(0x7ff0000000000000LL); }
};
struct kiln_l {
    typedef long long T;
    enum { real = 0 };
    static __device__ __forceinline__ T add(T a, T b) { return (long long)((unsigned long long)a + (unsigned long long)b); }
    static __device__ __forceinline__ T mul(T a, T b) { return (long long)((unsigned long long)a * (unsigned long long)b); }
    static __device__ __forceinline__ T lowest() { return -9223372036854775807LL - 1; }
    static __device__ __forceinline__ T highest() { return 9223372036854775807LL; }
};
KILN_ACC_KINDS(d, kiln_d)
KILN_ACC_KINDS(l, kiln_l)
)";

const char* const kCudaHistPrelude = R"(
// Numerics histogram (include/kiln/hist.hpp): x's bin among B from 2^O by round(log2|x|), from
// the bits as kernels/hist.cpp counts (0 and NaN in bin 0, infinities in the last; the
// exponent, plus one past a significand of sqrt(2)), added to the block's counts h. Bins within
// the normal exponents take the carry form (kernels/cuda/hist_bin.cuh says why it is exact).
template <int B, int O>
__device__ __forceinline__ void kiln_hist_count(unsigned* h, float x) {
    unsigned u = __float_as_uint(x) & 0x7fffffffu;
    int bin = 0;
    if (O >= -126 && O + B <= 129) {
        const int l = (int)((u + 0x4afb0cu) >> 23) - 127 - O;
        bin = u > 0x7f800000u ? 0 : min(max(l, 0), B - 1);
    } else if (u == 0x7f800000u) {
        bin = B - 1;
    } else if (u != 0 && u < 0x7f800000u) {
        int shift = 0;
        if (u < 0x00800000u) {   // subnormal: scale by 2^24, exactly
            u = __float_as_uint(__uint_as_float(u) * 16777216.0f);
            shift = 24;
        }
        const int l = (int)(u >> 23) - 127 - shift + ((u & 0x7fffffu) >= 0x3504f4u ? 1 : 0) - O;
        bin = l >= B - 1 ? B - 1 : l <= 0 ? 0 : l;
    }
    atomicAdd(h + bin, 1u);
}
// ---- end of histogram prelude
)";

} // namespace kiln::codegen::detail
