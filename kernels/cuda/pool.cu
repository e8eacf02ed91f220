// kiln's precompiled pooling kernels for CUDA contexts (any GPU kiln runs on): max, average and
// L2 pooling forward and backward over (N, D, H, W, C) activations, windows across channels,
// depth, height and width with padding and stride. Pooling as JIT expressions needs a padded
// float32 copy of the input and, backward, a pass over a float32 gradient per window tap; here
// each value is read and written once from the kernel's point of view (overlapping windows'
// re-reads come from the caches).
//
// Forward: a thread per output position and `V` consecutive channels (16 bytes of them where
// the window holds one channel, else one), over the window's taps in order (channel, depth,
// height, width). Max keeps the first tap's value, then every strictly greater one and its tap
// (padding is -inf); average divides the sum of the taps inside the input by their number; L2
// takes the square root of the sum of squares.
// Backward: a thread per input element and `V` channels (for vectors of channels, per square of
// kPoolBpropBlock^2 input positions: the windows covering them loaded once for all) gathers,
// from every output position whose window covers each, in ascending tap order, that window's
// share: E where the window's argmax is this tap (max), E times the reciprocal of the window's
// count (average), E x / Y where Y > 0 (L2).
// No atomics: the result is deterministic, and the same sums in the same order as the CPU path.
// Both end with alpha * result + beta * destination, rounded once into the dtype, and where the
// call counts its output (PoolHist), each block counts the values it stores.
// LRN (below) sums squares, and backward E O / denom, over windows of channels the same way;
// backward takes the channels beside a thread's own from the neighbouring lanes.
// Entries: kiln_pool_{fprop,bprop}_{max,avg,l2}_{f32,f16,bf16}_v<V> (vectors: forward also
// _staged; backward also _tiled for max and average, _planar for 16-bit max),
// kiln_lrn_{fprop,bprop}_{f32,f16,bf16}_h<J / 2>, each also as NAME_counted (KILN_ENTRY).
#include "kernels/cuda/hist_bin.cuh"
#include "kernels/cuda/pool_params.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

using namespace kiln::gemm;

namespace {

enum { kMax = 0, kAvg = 1, kL2 = 2 };
constexpr int kBatch = 5;    // forward: taps whose loads a thread keeps in flight (a 3x3 window in two rounds)
constexpr int kStaged = 9;   // forward, staged: taps a thread copies to shared memory at once (36 KiB a block)

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T narrow(float v);
template <> __device__ __forceinline__ float narrow<float>(float v) { return v; }
template <> __device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// V elements of T as loaded: one T, or a 16-byte word (aligned) holding V of them.
template <class T, int V> struct Raw {
    uint4 w;
};
template <class T> struct Raw<T, 1> {
    T w;
};
template <class T, int V>
__device__ __forceinline__ Raw<T, V> fetch(const void* base, int64_t i) {
    const T* p = static_cast<const T*>(base) + i;
    if constexpr (V == 1) {
        return {*p};
    } else {
        static_assert(V * sizeof(T) == 16, "a vector is 16 bytes");
        return {__ldg(reinterpret_cast<const uint4*>(p))};
    }
}
template <class T, int V>
__device__ __forceinline__ void widen(const Raw<T, V>& r, float (&v)[V]) {
    if constexpr (V == 1) {
        v[0] = widen(r.w);
    } else {
        union {
            uint4 w;
            T e[V];
        } u;
        u.w = r.w;
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = widen(u.e[k]);
    }
}
// V elements from element i on, widened to float.
template <class T, int V>
__device__ __forceinline__ void load(const void* base, int64_t i, float (&v)[V]) {
    widen<T, V>(fetch<T, V>(base, i), v);
}
template <class T, int V>
__device__ __forceinline__ void store(void* base, int64_t i, const float (&v)[V]) {
    T* p = static_cast<T*>(base) + i;
    if constexpr (V == 1) {
        *p = narrow<T>(v[0]);
    } else {
        union {
            uint4 w;
            T e[V];
        } u;
#pragma unroll
        for (int k = 0; k < V; ++k) u.e[k] = narrow<T>(v[k]);
        *reinterpret_cast<uint4*>(p) = u.w;
    }
}
// V int32 from element i on (16-byte aligned where V > 1).
template <int V>
__device__ __forceinline__ void load_index(const int32_t* base, int64_t i, int (&a)[V]) {
    if constexpr (V == 1) {
        a[0] = base[i];
    } else {
#pragma unroll
        for (int k = 0; k < V; k += 4) {
            const int4 w = __ldg(reinterpret_cast<const int4*>(base + i + k));
            a[k] = w.x, a[k + 1] = w.y, a[k + 2] = w.z, a[k + 3] = w.w;
        }
    }
}
template <int V>
__device__ __forceinline__ void store_index(int32_t* base, int64_t i, const int (&a)[V]) {
    if constexpr (V == 1) {
        base[i] = a[0];
    } else {
#pragma unroll
        for (int k = 0; k < V; k += 4) *reinterpret_cast<int4*>(base + i + k) = make_int4(a[k], a[k + 1], a[k + 2], a[k + 3]);
    }
}

// The output's histogram (PoolHist): the block's counters, zeroed, or null where the call does
// not count; count_stored adds the values as stored (rounded to T); hist_end adds the block's
// counters to the call's. Every thread of the block calls hist_begin and hist_end.
__device__ __forceinline__ uint32_t* hist_begin(const PoolHist& h) {
    extern __shared__ uint32_t block_counts[];
    if (!h.counts) return nullptr;
    for (int i = threadIdx.x; i < h.bins; i += blockDim.x) block_counts[i] = 0;
    __syncthreads();
    return block_counts;
}
template <class T, int V>
__device__ __forceinline__ void count_stored(const PoolHist& h, uint32_t* local, const float (&r)[V]) {
#pragma unroll
    for (int k = 0; k < V; ++k) atomicAdd(local + kiln_hist_bin(widen(narrow<T>(r[k])), h.bins, h.offset), 1u);
}
__device__ __forceinline__ void hist_end(const PoolHist& h, const uint32_t* local) {
    if (!local) return;
    __syncthreads();
    for (int i = threadIdx.x; i < h.bins; i += blockDim.x)
        if (local[i]) atomicAdd(h.counts + i, local[i]);
}

// dst[at..] = alpha * r + beta * dst[at..] (its value before), unfused, as the expression path
// computes it, rounded once into T; counted into `local` (hist_begin) where not null.
template <class T, int V>
__device__ __forceinline__ void finish(float alpha, float beta, void* dst, int64_t at, float (&r)[V], const PoolHist& h,
                                       uint32_t* local) {
#pragma unroll
    for (int k = 0; k < V; ++k) r[k] = __fmul_rn(alpha, r[k]);
    if (beta != 0.f) {
        float old[V];
        load<T, V>(dst, at, old);
#pragma unroll
        for (int k = 0; k < V; ++k) r[k] = __fadd_rn(r[k], __fmul_rn(beta, old[k]));
    }
    store<T, V>(dst, at, r);
    if (local) count_stored<T, V>(h, local, r);
}

// Max pooling's state over 16-bit vectors, two channels a word: the largest value so far as
// stored (16-bit) and its tap (16 bits; vector_width in pool_cuda.cpp keeps such windows below
// 2^16 taps). A tap replaces the state where it is strictly greater, or where it is the window's
// first (as the float path: a NaN is kept only as the first tap), by a mask from one paired
// comparison, so a tap costs three instructions a pair of channels rather than converting and
// comparing each: the forward kernel is bound by instruction issue. Unused (`used` false) for
// float32 and single channels.
template <class T, int V> struct MaxPairs {
    static constexpr bool used = false;
    __device__ __forceinline__ void add(const uint4&, int, bool) {}
    __device__ __forceinline__ void result(float (&)[V], int (&)[V]) const {}
};
template <class T> struct MaxPairs<T, 8> {
    static_assert(sizeof(T) == 2, "vectors of 8 channels are 16-bit");
    using T2 = typename std::conditional<std::is_same<T, __half>::value, __half2, __nv_bfloat162>::type;
    static constexpr bool used = true;
    static constexpr uint32_t kNegInf = std::is_same<T, __half>::value ? 0xfc00fc00u : 0xff80ff80u;
    uint32_t value[4] = {kNegInf, kNegInf, kNegInf, kNegInf}, tap[4] = {0, 0, 0, 0};
    static __device__ __forceinline__ uint32_t greater(uint32_t a, uint32_t b) {
        T2 x, y;
        memcpy(&x, &a, 4);
        memcpy(&y, &b, 4);
        return __hgt2_mask(x, y);
    }
    __device__ __forceinline__ void add(const uint4& w, int at_tap, bool first) {
        const uint32_t words[4] = {w.x, w.y, w.z, w.w}, taps = uint32_t(at_tap) * 0x10001u;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint32_t m = first ? ~0u : greater(words[j], value[j]);
            value[j] = (words[j] & m) | (value[j] & ~m);
            tap[j] = (taps & m) | (tap[j] & ~m);
        }
    }
    __device__ __forceinline__ void result(float (&acc)[8], int (&arg)[8]) const {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            T lo, hi;
            const uint16_t l = uint16_t(value[j]), h = uint16_t(value[j] >> 16);
            memcpy(&lo, &l, 2);
            memcpy(&hi, &h, 2);
            acc[2 * j] = widen(lo), acc[2 * j + 1] = widen(hi);
            arg[2 * j] = int(tap[j] & 0xffffu), arg[2 * j + 1] = int(tap[j] >> 16);
        }
    }
};

template <class T, int OP, int V, bool kStagedTaps>
__device__ __forceinline__ void pool_fprop(const PoolParams& p, uint32_t* local) {
    const PoolShape& g = p.g;
    const int64_t plane = int64_t(g.D) * g.H * g.W * g.C;
    // Bytes from a tap to the next along a window's row, and from a row's last tap to the next row's first.
    const int64_t next_tap = int64_t(g.C) * int64_t(sizeof(T)), next_row = (int64_t(g.W) - g.S + 1) * next_tap;
    const bool small_span = int64_t(g.R) * g.W * next_tap < (int64_t(1) << 31);   // a window's offsets in 32 bits
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.items; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t pos = quotient(i, p.lanes);   // (n, m, p, q) in row-major order; below 2^31
        const int k0 = int(i - pos * p.lanes.d) * V;
        int n = int(pos);
        const int q = split(n, p.d3), y = split(n, p.d2), m = split(n, p.d1);
        const int c0 = k0 * g.str_c - g.pad_c, d0 = m * g.str_d - g.pad_d, h0 = y * g.str_h - g.pad_h, w0 = q * g.str_w - g.pad_w;
        const char* img = static_cast<const char*>(p.x) + int64_t(n) * plane * int64_t(sizeof(T));
        float acc[V];
        int arg[V];
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = OP == kMax ? -__int_as_float(0x7f800000) : 0.f, arg[k] = 0;
        MaxPairs<T, V> pairs;   // (16-bit max over vectors: in place of acc and arg until the end)
        int inside = 0, tap = 0;
        const int RS = g.R * g.S;
        for (int j = 0; j < g.J; ++j) {
            const bool c_in = unsigned(c0 + j) < unsigned(g.C);
            for (int t = 0; t < g.T; ++t, tap += RS) {
                if (!(c_in && unsigned(d0 + t) < unsigned(g.D))) continue;   // padding: -inf for max, nothing for sums
                // The window's first tap (outside the tensor where the window is padded: only taps
                // inside are read), walked by a step a tap.
                const char* corner = img + (((int64_t(d0 + t) * g.H + h0) * g.W + w0) * g.C + c0 + j) * int64_t(sizeof(T));
                // A tap's values into the window's state, in tap order.
                const auto take = [&](const Raw<T, V>& raw, int at_tap, bool first) {
                    if constexpr (MaxPairs<T, V>::used && OP == kMax) {
                        pairs.add(raw.w, at_tap, first);
                    } else {
                        float v[V];
                        widen<T, V>(raw, v);
#pragma unroll
                        for (int k = 0; k < V; ++k) {
                            if (OP == kMax) {
                                if (first || v[k] > acc[k]) acc[k] = v[k], arg[k] = at_tap;
                            } else if (OP == kAvg) {
                                acc[k] = __fadd_rn(acc[k], v[k]);
                            } else {
                                acc[k] = __fadd_rn(acc[k], __fmul_rn(v[k], v[k]));
                            }
                        }
                    }
                };
                if constexpr (V > 1 && kStagedTaps) {
                    // 16-byte vectors in windows sharing taps: a thread copies kStaged taps at a time,
                    // those inside the input, to its slots in shared memory (cp.async, through L1: in
                    // flight together without holding registers), then combines them from there in
                    // order.
                    __shared__ uint4 stage[kStaged][kPoolThreads];
                    int r = 0, s = 0;
                    int64_t off = 0;   // bytes from the corner
                    for (int rs = 0; rs < RS; rs += kStaged) {
                        const int n = min(kStaged, RS - rs);
                        uint32_t in = 0;
                        for (int u = 0; u < n; ++u) {
                            if (unsigned(h0 + r) < unsigned(g.H) && unsigned(w0 + s) < unsigned(g.W)) {
                                const uint32_t slot = uint32_t(__cvta_generic_to_shared(&stage[u][threadIdx.x]));
                                asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(slot), "l"(corner + off) : "memory");
                                in |= 1u << u;
                            }
                            if (++s == g.S) s = 0, ++r, off += next_row;
                            else off += next_tap;
                        }
                        asm volatile("cp.async.wait_all;" ::: "memory");
                        for (int u = 0; u < n; ++u)
                            if (in >> u & 1) ++inside, take(Raw<T, V>{stage[u][threadIdx.x]}, tap + rs + u, u == 0 && tap + rs == 0);
                    }
                } else {
                    // kBatch taps at a time: their loads in flight together, then combined in order.
                    // Windows wholly inside (most) test no tap and step by 32-bit offsets (for vectors
                    // of channels: a single channel's kernel spills registers with both walks).
                    const auto walk = [&](auto padded) {
                        constexpr bool kPadded = decltype(padded)::value;
                        using Off = typename std::conditional<kPadded, int64_t, int32_t>::type;   // bytes from the corner
                        int r = 0, s = 0;
                        Off off = 0;
                        for (int rs = 0; rs < RS; rs += kBatch) {
                            Raw<T, V> raw[kBatch];
                            bool in[kBatch];
#pragma unroll
                            for (int u = 0; u < kBatch; ++u) {
                                in[u] = rs + u < RS;
                                if constexpr (kPadded) in[u] = in[u] && unsigned(h0 + r) < unsigned(g.H) && unsigned(w0 + s) < unsigned(g.W);
                                if (in[u]) raw[u] = fetch<T, V>(corner + off, 0);
                                if (++s == g.S) s = 0, ++r, off += Off(next_row);
                                else off += Off(next_tap);
                            }
#pragma unroll
                            for (int u = 0; u < kBatch; ++u) {
                                if (!in[u]) continue;
                                if constexpr (kPadded) ++inside;
                                take(raw[u], tap + rs + u, u == 0 && tap + rs == 0);   // (first: the window's tap 0)
                            }
                        }
                        if constexpr (!kPadded) inside += RS;
                    };
                    if (V > 1 && small_span && h0 >= 0 && w0 >= 0 && h0 + g.R <= g.H && w0 + g.S <= g.W) walk(std::false_type{});
                    else walk(std::true_type{});
                }
            }
        }
        const int64_t at = pos * g.K + k0;
        if constexpr (MaxPairs<T, V>::used && OP == kMax) pairs.result(acc, arg);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            if (OP == kAvg) acc[k] = __fdiv_rn(acc[k], float(inside));
            if (OP == kL2) acc[k] = __fsqrt_rn(acc[k]);
        }
        if (OP == kMax && p.argmax) store_index<V>(p.argmax, at, arg);
        finish<T, V>(p.alpha, p.beta, p.y, at, acc, p.hist, local);
    }
}

// The output positions along one axis whose windows cover coordinate x: lo..hi (empty when
// lo > hi). Position o covers x when o * stride - pad <= x < o * stride - pad + window.
struct Span {
    int lo, hi;
};
__device__ __forceinline__ Span covering(int x, int pad, int window, const FastDiv& stride, int positions) {
    const int a = x + pad, b = a - window + 1;
    const int hi = min(int(divide(uint32_t(a), stride)), positions - 1);
    const int lo = b <= 0 ? 0 : int(divide(uint32_t(b + int(stride.d) - 1), stride));
    return {lo, hi};
}
// The taps of window o inside an axis of `size`.
__device__ __forceinline__ int inside(int o, int pad, int window, int stride, int size) {
    const int first = o * stride - pad;
    return min(first + window, size) - max(first, 0);
}

// A thread's inputs: a square of U x U positions (height x width); kGather windows' loads in flight.
template <class T, int OP, int V, int U, int kGather>
__device__ __forceinline__ void pool_bprop(const PoolParams& p, uint32_t* local) {
    const PoolShape& g = p.g;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.items; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t pos = quotient(i, p.lanes);   // (n, d, h / U, w / U); below 2^31
        const int c0 = int(i - pos * p.lanes.d) * V;
        int n = int(pos);
        const int w0 = split(n, p.d3) * U, h0 = split(n, p.d2) * U, d = split(n, p.d1);
        const int live_h = min(U, g.H - h0), live_w = min(U, g.W - w0);   // the inputs inside the image
        const int64_t at = ((int64_t(n) * g.D + d) * g.H + h0) * int64_t(g.W) * g.C + int64_t(w0) * g.C + c0;
        const int64_t row = int64_t(g.W) * g.C;
        Raw<T, V> x[U * U];   // L2: the forward's inputs, as loaded
        float acc[U * U][V];
#pragma unroll
        for (int u = 0; u < U * U; ++u) {
            if (OP == kL2 && u / U < live_h && u % U < live_w) x[u] = fetch<T, V>(p.x2, at + (u / U) * row + (u % U) * g.C);
#pragma unroll
            for (int k = 0; k < V; ++k) acc[u][k] = 0.f;
        }
        // Ascending taps: descending positions along each axis (channel windows first). Along the
        // height and width, the windows covering any of the thread's inputs; each input takes
        // those that cover it, in the same order as alone.
        const Span sc = V == 1 ? covering(c0, g.pad_c, g.J, p.str_c, g.K) : Span{c0, c0};
        const Span sd = covering(d, g.pad_d, g.T, p.str_d, g.M);
        const Span sh = {covering(h0, g.pad_h, g.R, p.str_h, g.P).lo, covering(h0 + live_h - 1, g.pad_h, g.R, p.str_h, g.P).hi};
        const Span sw = {covering(w0, g.pad_w, g.S, p.str_w, g.Q).lo, covering(w0 + live_w - 1, g.pad_w, g.S, p.str_w, g.Q).hi};
        const int nyq = sh.hi >= sh.lo && sw.hi >= sw.lo ? (sh.hi - sh.lo + 1) * (sw.hi - sw.lo + 1) : 0;
        for (int kk = sc.hi; kk >= sc.lo; --kk) {
            const int j = c0 + g.pad_c - kk * g.str_c;
            for (int m = sd.hi; m >= sd.lo; --m) {
                const int t = d + g.pad_d - m * g.str_d;
                const int cd = inside(kk, g.pad_c, g.J, g.str_c, g.C) * inside(m, g.pad_d, g.T, g.str_d, g.D);
                // The (y, q) windows, descending, kGather at a time: their loads in flight together.
                const int64_t plane = (int64_t(n) * g.M + m) * g.P;
                int y = sh.hi, q = sw.hi;
                for (int b = 0; b < nyq; b += kGather) {
                    Raw<T, V> e[kGather], out[kGather];
                    int a[kGather][V];
                    int tap[kGather], off_h[kGather], off_w[kGather];
                    float share[kGather];   // average: 1 / the window's count
                    bool in[kGather];
#pragma unroll
                    for (int u = 0; u < kGather; ++u) {
                        in[u] = b + u < nyq;
                        const int64_t o = ((plane + y) * g.Q + q) * g.K + kk;
                        if (in[u]) {
                            e[u] = fetch<T, V>(p.x, o);
                            if (OP == kMax) load_index<V>(p.argmax, o, a[u]);
                            if (OP == kL2) out[u] = fetch<T, V>(p.y2, o);
                        }
                        off_h[u] = h0 + g.pad_h - y * g.str_h, off_w[u] = w0 + g.pad_w - q * g.str_w;   // input (h0, w0)'s tap
                        tap[u] = ((j * g.T + t) * g.R + off_h[u]) * g.S + off_w[u];
                        if (OP == kAvg)
                            share[u] = __frcp_rn(float(cd * inside(y, g.pad_h, g.R, g.str_h, g.H) * inside(q, g.pad_w, g.S, g.str_w, g.W)));
                        if (--q < sw.lo) q = sw.hi, --y;
                    }
#pragma unroll
                    for (int u = 0; u < kGather; ++u) {
                        if (!in[u]) continue;
                        float ev[V], yv[V];
                        widen<T, V>(e[u], ev);
                        if (OP == kL2) widen<T, V>(out[u], yv);
#pragma unroll
                        for (int r = 0; r < U * U; ++r) {
                            // input (h0 + r / U, w0 + r % U) outside the window: no share
                            if (unsigned(off_h[u] + r / U) >= unsigned(g.R) || unsigned(off_w[u] + r % U) >= unsigned(g.S)) continue;
                            const int tap_r = tap[u] + (r / U) * g.S + r % U;
                            float xv[V];
                            if (OP == kL2) widen<T, V>(x[r], xv);
#pragma unroll
                            for (int k = 0; k < V; ++k) {
                                if (OP == kMax) {
                                    if (a[u][k] == tap_r) acc[r][k] = __fadd_rn(acc[r][k], ev[k]);
                                } else if (OP == kAvg) {
                                    acc[r][k] = __fadd_rn(acc[r][k], __fmul_rn(ev[k], share[u]));
                                } else if (yv[k] > 0.f) {
                                    acc[r][k] = __fadd_rn(acc[r][k], __fdiv_rn(__fmul_rn(ev[k], xv[k]), yv[k]));
                                }
                            }
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U * U; ++u)
            if (u / U < live_h && u % U < live_w)
                finish<T, V>(p.alpha, p.beta, p.y, at + (u / U) * row + (u % U) * g.C, acc[u], p.hist, local);
    }
}

// pool_bprop where the windows tile the input (pool_cuda.cpp's tiled_bprop): one channel a
// window, window = stride and no padding along each axis, every size a whole number of strides,
// so every input lies in exactly one window. A thread per window and V channels loads its
// gradient (and winners) once and stores each of its inputs once: the share the general gather
// adds to zero, the same sum rounded alike, with none of its search for covering windows (a
// third fewer instructions issued than the gather's for 16-bit average 2x2/2).
template <class T, int OP, int V>
__device__ __forceinline__ void pool_bprop_tiled(const PoolParams& p, uint32_t* local) {
    static_assert(OP == kMax || OP == kAvg, "max or average pooling");
    const PoolShape& g = p.g;
    const float share = __frcp_rn(float(g.T * g.R * g.S));   // average: 1 / the window's count
    const int64_t row = int64_t(g.W) * g.C, plane = int64_t(g.H) * row;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.items; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t pos = quotient(i, p.lanes);   // (n, m, y, q): the window
        const int c0 = int(i - pos * p.lanes.d) * V;
        int n = int(pos);
        const int q = split(n, p.d3), y = split(n, p.d2), m = split(n, p.d1);
        float ev[V];
        int a[V];
        load<T, V>(p.x, pos * g.K + c0, ev);
        if (OP == kMax) load_index<V>(p.argmax, pos * g.K + c0, a);
        const int64_t first = (int64_t(n) * g.D + int64_t(m) * g.T) * plane + int64_t(y) * g.R * row + int64_t(q) * g.S * g.C + c0;
        for (int t = 0; t < g.T; ++t)
            for (int r = 0; r < g.R; ++r)
                for (int s = 0; s < g.S; ++s) {
                    const int tap = (t * g.R + r) * g.S + s;
                    float acc[V];
#pragma unroll
                    for (int k = 0; k < V; ++k)
                        acc[k] = OP == kMax ? (a[k] == tap ? __fadd_rn(0.f, ev[k]) : 0.f) : __fadd_rn(0.f, __fmul_rn(ev[k], share));
                    finish<T, V>(p.alpha, p.beta, p.y, first + t * plane + r * row + int64_t(s) * g.C, acc, p.hist, local);
                }
    }
}

// pool_bprop of max pooling over 16-bit vectors of channels in planar windows (pool_cuda.cpp's
// planar_bprop): one channel and one depth a window, and windows shorter than twice their
// stride along the height and the width, so that at most 2 x 2 windows cover a thread's square of
// 2 x 2 inputs. A thread copies their values and winners (3 x 16 bytes a window, at 32-bit offsets
// from the square's last window) to its slots in shared memory at once (cp.async: all in flight
// without holding registers, 3 blocks resident), then each input takes its shares in pool_bprop's
// order (the same sums, rounded alike). pool_bprop walks the windows one at a time, a 64-bit
// index and a load round trip each, which left 16-bit max bound by instruction issue; held in
// registers instead of staged, the windows left 2 blocks resident, bound by latency. float32 and
// average run no faster planar.
template <class T>
__device__ __forceinline__ void pool_bprop_max_planar(const PoolParams& p, uint32_t* local) {
    constexpr int V = 8, U = kPoolBpropBlock;
    static_assert(U == 2, "a square of 2 x 2 inputs: 2 x 2 windows at most");
    __shared__ uint4 staged[4 * 3][kPoolThreads];   // window u's values in slot 3 u, its winners in the next two
    const auto stage = [](int slot, const void* from) {
        const uint32_t to = uint32_t(__cvta_generic_to_shared(&staged[slot][threadIdx.x]));
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(to), "l"(from) : "memory");
    };
    const PoolShape& g = p.g;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.items; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t pos = quotient(i, p.lanes);   // (n, d, h / U, w / U); below 2^31
        const int c0 = int(i - pos * p.lanes.d) * V;
        int n = int(pos);
        const int w0 = split(n, p.d3) * U, h0 = split(n, p.d2) * U;
        const int64_t image = n;   // n * D + d: the depth maps one to one (M == D)
        const int live_h = min(U, g.H - h0), live_w = min(U, g.W - w0);
        const int64_t at = (image * g.H + h0) * int64_t(g.W) * g.C + int64_t(w0) * g.C + c0;
        const int64_t row = int64_t(g.W) * g.C;
        const Span sh = {covering(h0, g.pad_h, g.R, p.str_h, g.P).lo, covering(h0 + live_h - 1, g.pad_h, g.R, p.str_h, g.P).hi};
        const Span sw = {covering(w0, g.pad_w, g.S, p.str_w, g.Q).lo, covering(w0 + live_w - 1, g.pad_w, g.S, p.str_w, g.Q).hi};
        // Window (sh.hi - u / 2, sw.hi - u % 2) as u: descending, as pool_bprop walks them.
        const int64_t last = ((image * g.P + sh.hi) * g.Q + sw.hi) * int64_t(g.K) + c0;
        const int e_row = g.Q * g.K, e_col = g.K;   // elements between windows (below 2^31: pool_cuda.cpp)
        bool in[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            in[u] = sh.hi - u / 2 >= sh.lo && sw.hi - u % 2 >= sw.lo;
            const int64_t o = last - (u / 2) * e_row - (u % 2) * e_col;
            if (in[u]) {
                stage(3 * u, static_cast<const T*>(p.x) + o);
                stage(3 * u + 1, p.argmax + o);
                stage(3 * u + 2, p.argmax + o + 4);
            }
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        float acc[U * U][V];
#pragma unroll
        for (int r = 0; r < U * U; ++r)
#pragma unroll
            for (int k = 0; k < V; ++k) acc[r][k] = 0.f;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (!in[u]) continue;
            const int y = sh.hi - u / 2, q = sw.hi - u % 2;
            const int off_h = h0 + g.pad_h - y * g.str_h, off_w = w0 + g.pad_w - q * g.str_w;   // input (h0, w0)'s tap
            const int tap = off_h * g.S + off_w;
            float ev[V];
            widen<T, V>(Raw<T, V>{staged[3 * u][threadIdx.x]}, ev);
            int a[V];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint4 w = staged[3 * u + 1 + h][threadIdx.x];
                a[4 * h] = int(w.x), a[4 * h + 1] = int(w.y), a[4 * h + 2] = int(w.z), a[4 * h + 3] = int(w.w);
            }
#pragma unroll
            for (int r = 0; r < U * U; ++r) {
                if (unsigned(off_h + r / U) >= unsigned(g.R) || unsigned(off_w + r % U) >= unsigned(g.S)) continue;
                const int tap_r = tap + (r / U) * g.S + r % U;
#pragma unroll
                for (int k = 0; k < V; ++k)
                    if (a[k] == tap_r) acc[r][k] = __fadd_rn(acc[r][k], ev[k]);
            }
        }
#pragma unroll
        for (int u = 0; u < U * U; ++u)
            if (u / U < live_h && u % U < live_w)
                finish<T, V>(p.alpha, p.beta, p.y, at + (u / U) * row + (u % U) * g.C, acc[u], p.hist, local);
    }
}

// ---- LRN: windows of 2 H + 1 channels around each channel, zero past the edges. A thread takes
// one position's V channels (16 bytes) and the vectors either side of them (H <= V), so each
// window sum is formed in registers, in channel order, as the CPU path forms it.

// d^e: where d and the result are normal floats (d = 1 + a window's scaled squares, about 1),
// the hardware's approximation, its two steps bare (lg2 and ex2: within a few float32 ulps, the
// float32 results' rounding error of a handful of operations; the accurate powf made LRN bound by
// instruction issue in every dtype); else __powf for d > 0 (it scales subnormal inputs and
// results) and powf (the approximation gives NaN for d <= 0, where powf is finite for integral e).
// A thread's V powers at once, with one branch on whether every element takes the
// approximation: a branch an element around the exact forms' code costs the 16-bit kernels issue
// slots.
template <int V>
__device__ __forceinline__ void powers(const float (&d)[V], float e, float (&r)[V]) {
    float l[V];
    bool approx = true;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(l[k]) : "f"(d[k]));
        l[k] *= e;
        approx = approx && d[k] >= 1.17549435e-38f && l[k] >= -126.f && l[k] <= 128.f;
    }
    if (approx) {
#pragma unroll
        for (int k = 0; k < V; ++k) asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r[k]) : "f"(l[k]));
    } else {
#pragma unroll
        for (int k = 0; k < V; ++k) {
            if (d[k] >= 1.17549435e-38f && l[k] >= -126.f && l[k] <= 128.f)
                asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r[k]) : "f"(l[k]));
            else
                r[k] = d[k] > 0.f ? __powf(d[k], e) : powf(d[k], e);
        }
    }
}

// The three vectors of channels around c0 (none past the edges: zeros) as `f` of each element.
template <class T, int V, class F>
__device__ __forceinline__ void around(const void* base, int64_t at, int c0, int C, float (&v)[3 * V], F&& f) {
#pragma unroll
    for (int b = 0; b < 3; ++b) {
        const int c = c0 + (b - 1) * V;
        if (c >= 0 && c < C) {
            float e[V];
            load<T, V>(base, at + (b - 1) * V, e);
#pragma unroll
            for (int k = 0; k < V; ++k) v[b * V + k] = f(e[k], b * V + k);
        } else {
#pragma unroll
            for (int k = 0; k < V; ++k) v[b * V + k] = 0.f;
        }
    }
}
// The window sum of channel k of the middle vector: its first tap, then the others added.
template <int V, int H>
__device__ __forceinline__ float window_sum(const float (&v)[3 * V], int k) {
    float s = v[V + k - H];
#pragma unroll
    for (int i = -H + 1; i <= H; ++i) s = __fadd_rn(s, v[V + k + i]);
    return s;
}

// f(at, c0) for each of the thread's items: a position's channels c0 .. c0 + V - 1 from element at.
template <int V, class F>
__device__ __forceinline__ void each_lrn_item(const LrnParams& p, F&& f) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.items; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t pos = quotient(i, p.lanes);
        const int c0 = int(i - pos * p.lanes.d) * V;
        f(pos * p.C + c0, c0);
    }
}
// The same with the lanes of a warp together (for beside's shuffles): lanes past the last item
// run with live false and must not touch memory.
template <int V, class F>
__device__ __forceinline__ void each_lrn_item_warp(const LrnParams& p, F&& f) {
    const int lane = int(threadIdx.x & 31);
    for (int64_t i0 = int64_t(blockIdx.x) * blockDim.x + (threadIdx.x & ~31u); i0 < p.items; i0 += int64_t(gridDim.x) * blockDim.x) {
        const bool live = i0 + lane < p.items;
        const int64_t i = live ? i0 + lane : i0, pos = quotient(i, p.lanes);
        const int c0 = int(i - pos * p.lanes.d) * V;
        f(pos * p.C + c0, c0, live);
    }
}
// v[V .. 2V) holds the thread's V values; fills the H either side (v[V - H .. V) and
// v[2V .. 2V + H), zeros past the edges of the channels) from the neighbouring lanes, which hold
// the vectors beside this one (a warp's items are consecutive); only the first and last lanes of
// a warp compute their neighbour's vector, through f(element, values). Every lane of the warp
// calls it.
template <int V, int H, class F>
__device__ __forceinline__ void beside(int64_t at, int c0, int C, bool live, float (&v)[3 * V], F&& f) {
    const int lane = int(threadIdx.x & 31);
#pragma unroll
    for (int j = 0; j < H; ++j) {
        v[V - H + j] = __shfl_up_sync(0xffffffffu, v[2 * V - H + j], 1);
        v[2 * V + j] = __shfl_down_sync(0xffffffffu, v[V + j], 1);
    }
    float e[V];
    if (c0 == 0) {
#pragma unroll
        for (int j = 0; j < H; ++j) v[V - H + j] = 0.f;
    } else if (lane == 0) {
        f(at - V, e);
#pragma unroll
        for (int j = 0; j < H; ++j) v[V - H + j] = e[V - H + j];
    }
    if (c0 + V >= C) {
#pragma unroll
        for (int j = 0; j < H; ++j) v[2 * V + j] = 0.f;
    } else if (lane == 31 && live) {
        f(at + V, e);
#pragma unroll
        for (int j = 0; j < H; ++j) v[2 * V + j] = e[j];
    }
}

template <class T, int V, int H>
__device__ __forceinline__ void lrn_fprop(const LrnParams& p, uint32_t* local) {
    each_lrn_item<V>(p, [&](int64_t at, int c0) {
        float sq[3 * V], x[V], d[V], r[V];
        around<T, V>(p.in, at, c0, p.C, sq, [](float e, int) { return __fmul_rn(e, e); });
        load<T, V>(p.in, at, x);
#pragma unroll
        for (int k = 0; k < V; ++k) d[k] = __fadd_rn(1.f, __fmul_rn(p.ascale, window_sum<V, H>(sq, k)));
        store<T, V>(p.denom, at, d);
#pragma unroll
        for (int k = 0; k < V; ++k) d[k] = widen(narrow<T>(d[k]));   // the stored denominator
        powers<V>(d, -p.bpower, r);
#pragma unroll
        for (int k = 0; k < V; ++k) r[k] = __fmul_rn(x[k], r[k]);
        finish<T, V>(p.alpha, p.beta, p.result, at, r, p.hist, local);
    });
}

// err * out / denom as err * out times the hardware's reciprocal of denom (within an ulp of the
// quotient, subnormals kept; the same infinities and NaNs): division's exact sequence made the
// 16-bit backward bound by instruction issue.
__device__ __forceinline__ float ratio_of(float e, float o, float d) {
    float r;
    asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(d));
    return __fmul_rn(__fmul_rn(e, o), r);
}

// Backward reads the window's err * out / denom from three tensors: its neighbours' come from
// the lanes beside (beside), 3 vector loads an item instead of 9.
template <class T, int V, int H>
__device__ __forceinline__ void lrn_bprop(const LrnParams& p, uint32_t* local) {
    auto ratios = [&](int64_t a, float (&q)[V]) {
        float o[V], e[V], d[V];
        load<T, V>(p.out, a, o);
        load<T, V>(p.err, a, e);
        load<T, V>(p.denom, a, d);
#pragma unroll
        for (int k = 0; k < V; ++k) q[k] = ratio_of(e[k], o[k], d[k]);
    };
    each_lrn_item_warp<V>(p, [&](int64_t at, int c0, bool live) {
        float o[V], e[V], d[V], ratio[3 * V], x[V], r[V];
#pragma unroll
        for (int k = 0; k < V; ++k) o[k] = 0.f, e[k] = 0.f, d[k] = 1.f;
        if (live) {
            load<T, V>(p.out, at, o);
            load<T, V>(p.err, at, e);
            load<T, V>(p.denom, at, d);
        }
#pragma unroll
        for (int k = 0; k < V; ++k) ratio[V + k] = ratio_of(e[k], o[k], d[k]);
        beside<V, H>(at, c0, p.C, live, ratio, ratios);
        if (!live) return;
        load<T, V>(p.in, at, x);
        float pw[V];
        powers<V>(d, -p.bpower, pw);
#pragma unroll
        for (int k = 0; k < V; ++k)
            r[k] = __fsub_rn(__fmul_rn(e[k], pw[k]), __fmul_rn(__fmul_rn(p.scale2, x[k]), window_sum<V, H>(ratio, k)));
        finish<T, V>(p.alpha, p.beta, p.result, at, r, p.hist, local);
    });
}

} // namespace

// Each entry comes twice: as named, which counts nothing (the count's code, absent, takes no
// registers from the walk: the backward gathers then keep 3 blocks an SM), and NAME_counted,
// which counts what it stores into the block's shared memory, then the call's counters.
#define KILN_ENTRY(BLOCKS, NAME, PARAMS, ...)                                                                         \
    extern "C" __global__ void __launch_bounds__(kPoolThreads, BLOCKS) NAME(const __grid_constant__ PARAMS p) {      \
        __VA_ARGS__(p, nullptr);                                                                                      \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(kPoolThreads, BLOCKS) NAME##_counted(const __grid_constant__ PARAMS p) { \
        uint32_t* local = hist_begin(p.hist);                                                                         \
        __VA_ARGS__(p, local);                                                                                        \
        hist_end(p.hist, local);                                                                                      \
    }

// Forward: 4 resident blocks (at most 64 registers) hold more loads in flight than 2; at that
// limit the 16-bit avg and l2 vector kernels and float32 max over vectors keep one word on the
// stack, stored and reloaded once an output position, outside the taps' loop. Backward over
// vectors of channels: a window's loads at a time, 3 blocks (16-bit: 80 registers) or 4 (float32:
// 64) resident, more than 2 windows in flight in fewer threads; L2 (which holds its inputs too)
// and single channels keep 2 blocks, as they spill under a tighter limit, single channels with
// 2 windows in flight.
#define KILN_POOL_OP(NAME, OPV, T, TN, V)                                                                             \
    KILN_ENTRY(4, kiln_pool_fprop_##NAME##_##TN##_v##V, PoolParams, pool_fprop<T, OPV, V, false>)                    \
    KILN_ENTRY((V == 1 || OPV == kL2 ? 2 : V == 4 ? 4 : 3), kiln_pool_bprop_##NAME##_##TN##_v##V, PoolParams,                      \
               pool_bprop<T, OPV, V, (V > 1 ? kPoolBpropBlock : 1), (V > 1 ? 1 : 2)>)
#define KILN_POOL_TYPE(T, TN, V) \
    KILN_POOL_OP(max, kMax, T, TN, 1) KILN_POOL_OP(avg, kAvg, T, TN, 1) KILN_POOL_OP(l2, kL2, T, TN, 1) \
    KILN_POOL_OP(max, kMax, T, TN, V) KILN_POOL_OP(avg, kAvg, T, TN, V) KILN_POOL_OP(l2, kL2, T, TN, V)
KILN_POOL_TYPE(float, f32, 4)
KILN_POOL_TYPE(__half, f16, 8)
KILN_POOL_TYPE(__nv_bfloat16, bf16, 8)
// Backward over tiling windows (max and average over vectors of channels): a window's loads and
// its inputs' stores, 4 blocks resident.
#define KILN_POOL_TILED(T, TN, V)                                                                       \
    KILN_ENTRY(4, kiln_pool_bprop_max_##TN##_v##V##_tiled, PoolParams, pool_bprop_tiled<T, kMax, V>) \
    KILN_ENTRY(4, kiln_pool_bprop_avg_##TN##_v##V##_tiled, PoolParams, pool_bprop_tiled<T, kAvg, V>)
KILN_POOL_TILED(float, f32, 4)
KILN_POOL_TILED(__half, f16, 8)
KILN_POOL_TILED(__nv_bfloat16, bf16, 8)
// 16-bit max backward over planar windows: 48 KiB of staged windows and 76 registers a thread, 3
// blocks resident.
KILN_ENTRY(3, kiln_pool_bprop_max_f16_v8_planar, PoolParams, pool_bprop_max_planar<__half>)
KILN_ENTRY(3, kiln_pool_bprop_max_bf16_v8_planar, PoolParams, pool_bprop_max_planar<__nv_bfloat16>)
// Forward with staged taps (pool_cuda.cpp: 16-bit vectors of channels, windows sharing taps).
#define KILN_POOL_STAGED(NAME, OPV, T, TN) \
    KILN_ENTRY(4, kiln_pool_fprop_##NAME##_##TN##_v8_staged, PoolParams, pool_fprop<T, OPV, 8, true>)
KILN_POOL_STAGED(max, kMax, __half, f16) KILN_POOL_STAGED(avg, kAvg, __half, f16) KILN_POOL_STAGED(l2, kL2, __half, f16)
KILN_POOL_STAGED(max, kMax, __nv_bfloat16, bf16) KILN_POOL_STAGED(avg, kAvg, __nv_bfloat16, bf16) KILN_POOL_STAGED(l2, kL2, __nv_bfloat16, bf16)

// LRN's backward at 4 blocks (64 registers; 16-bit spills none at windows of up to 7 channels):
// at 3 its warps wait on its loads.
#define KILN_LRN(T, TN, V, H)                                                        \
    KILN_ENTRY(2, kiln_lrn_fprop_##TN##_h##H, LrnParams, lrn_fprop<T, V, H>) \
    KILN_ENTRY(4, kiln_lrn_bprop_##TN##_h##H, LrnParams, lrn_bprop<T, V, H>)
#define KILN_LRN_TYPE(T, TN, V) KILN_LRN(T, TN, V, 1) KILN_LRN(T, TN, V, 2) KILN_LRN(T, TN, V, 3) KILN_LRN(T, TN, V, 4)
KILN_LRN_TYPE(float, f32, 4)
KILN_LRN_TYPE(__half, f16, 8)
KILN_LRN_TYPE(__nv_bfloat16, bf16, 8)
