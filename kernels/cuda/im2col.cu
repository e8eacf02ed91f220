// kiln's precompiled im2col for CUDA contexts (any GPU kiln runs on): the patch matrix of a
// convolution, one row per output position and one column per filter tap and channel, written
// in one pass for the convolutions the implicit-GEMM kernels do not take (update, 3-channel
// first layers, float32, GPUs other than sm_90). The work is the matrix's 16-byte
// chunks, rows ld elements apart (ld * elem a multiple of 16), in order: consecutive threads
// store consecutive chunks, so the whole buffer is written front to back whatever the row's
// length (a block per row would leave most of its threads idle on rows of fewer than 256 chunks). A
// chunk is 16 / VB loads of VB bytes of the image (16 where a tap's channels are whole 16-byte
// chunks, else 8, 4 or one element), each within one filter tap, zeros in the padding and past
// the row's last tap. Entry names: kiln_im2col_v<VB>, and kiln_im2col_rows_e<ES> for layers of few
// channels (below). Its transpose, col2im (kiln_col2im_f32),
// gathers the gradient with respect to the image from the patch matrix's gradient: a thread per
// image element sums the entries of the taps that read it. kiln_fold_e2 and kiln_unfold_e<ES>
// fold a first layer's stride into its channels and back (FoldParams); kiln_filter_taps_e2 gives
// a gradient with respect to the input its filter (FilterTapsParams).
#include "kernels/cuda/im2col_params.hpp"

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
    constexpr int kLoads = 16 / VB;              // a chunk's loads
    const int per = VB / p.elem;                 // elements a load
    const int64_t chunks_per_row = p.chunks_per_row.d;
    const int64_t chunks = chunks_per_row * p.rows;
    const ConvShape& g = p.shape;
    const char* image = static_cast<const char*>(p.image);
    uint4* out = static_cast<uint4*>(p.cols);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks; i += int64_t(gridDim.x) * blockDim.x) {
        const int row = int(quotient(i, p.chunks_per_row));
        // The output position (n, z, y, x) and its window's first image coordinates.
        int n = row;
        const int x = split(n, p.q), y = split(n, p.p), z = split(n, p.m);
        const int d0 = z * g.str_d - g.pad_d, h0 = y * g.str_h - g.pad_h, w0 = x * g.str_w - g.pad_w;
        const char* img = image + int64_t(n) * g.D * g.H * g.W * g.C * p.elem;
        // The chunk's first element: its tap (t, r, s) and channel c, then stepped along.
        int t = int(i - int64_t(row) * chunks_per_row) * (16 / p.elem);
        int c = split(t, p.c);
        int s = split(t, p.s);
        int r = split(t, p.r);
        union {
            uint4 whole;
            V part[kLoads];
        } chunk;
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
            const int d = d0 + t * g.dil_d, h = h0 + r * g.dil_h, w = w0 + s * g.dil_w;
            V value{};
            if (t < g.T && unsigned(d) < unsigned(g.D) && unsigned(h) < unsigned(g.H) && unsigned(w) < unsigned(g.W))
                value = __ldg(reinterpret_cast<const V*>(img + ((int64_t(d * g.H + h) * g.W + w) * g.C + c) * p.elem));
            chunk.part[j] = value;
            c += per;
            if (c == g.C) {
                c = 0;
                if (++s == g.S) {
                    s = 0;
                    if (++r == g.R) r = 0, ++t;
                }
            }
        }
        out[i] = chunk.whole;
    }
}

// im2col for a 2D or 1D layer of few channels (a tap's channels under 16 bytes, as a first
// layer's 3), dilation 1 along the width: a block per row of output positions (n, y) stages the
// R image rows its windows read, across the span its Q positions cover ((Q - 1) stride + S
// pixels from -pad), in shared memory, zeros outside the image, with consecutive threads
// reading consecutive elements; then its threads write the Q rows of the patch matrix in
// 16-byte chunks, consecutive threads consecutive chunks. Element e of a row is tap (r, s)
// channel c with s C + c = e mod S C, r = e / S C: shared element (r span + x stride) C +
// e mod S C. (The general kernel's loads of one element each, with a tap's bounds checked per
// load, took 1.3 ms for ResNet-50's first layer at N = 256.) Entry: kiln_im2col_rows_e<ES>.
template <int ES>
__device__ __forceinline__ void im2col_rows(const Im2colParams& p) {
    using E = typename Vec<ES>::type;
    extern __shared__ __align__(16) unsigned char staged_raw[];
    E* staged = reinterpret_cast<E*>(staged_raw);
    const ConvShape& g = p.shape;
    const int span = (g.Q - 1) * g.str_w + g.S, row_elems = span * g.C, sc = g.S * g.C;
    int n = int(blockIdx.x);
    const int y = split(n, p.p);
    const E* img = static_cast<const E*>(p.image) + int64_t(n) * g.H * g.W * g.C;
    const int w0 = -g.pad_w;
    for (int i = threadIdx.x; i < g.R * row_elems; i += blockDim.x) {
        const int r = i / row_elems, k = i - r * row_elems;
        const int h = y * g.str_h - g.pad_h + r * g.dil_h, w = w0 + k / g.C;
        E v{};
        if (unsigned(h) < unsigned(g.H) && unsigned(w) < unsigned(g.W)) v = img[(int64_t(h) * g.W + w) * g.C + k % g.C];
        staged[i] = v;
    }
    __syncthreads();
    constexpr int kPer = 16 / ES;   // elements a chunk
    const int chunks_per_row = int(p.chunks_per_row.d), chunks = g.Q * chunks_per_row;
    uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(p.cols) + int64_t(blockIdx.x) * g.Q * p.ld * ES);
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
        int x = i;
        const int chunk = split(x, p.chunks_per_row);
        int e = chunk * kPer, r = e / sc, rem = e - r * sc;
        const int base = x * g.str_w * g.C;
        union {
            uint4 whole;
            E part[kPer];
        } v;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            v.part[j] = e + j < p.taps ? staged[r * row_elems + base + rem] : E{};
            if (++rem == sc) rem = 0, ++r;
        }
        out[int64_t(x) * (p.ld * ES / 16) + chunk] = v.whole;
    }
}

// The output positions along one axis whose window covers image coordinate x with a filter tap:
// position o covers x with tap f when o * stride - pad + f * dil == x. With dilation 1 those taps
// are every stride-th from (x + pad) % stride; otherwise every tap, each checked.
struct TapWalk {
    int first, step;
};
__device__ __forceinline__ TapWalk tap_walk(int x, int pad, const FastDiv& stride, int dil) {
    if (dil != 1) return TapWalk{0, 1};
    int q = x + pad;
    return TapWalk{split(q, stride), int(stride.d)};
}
// The output position tap f of coordinate x belongs to, or -1 where none does.
__device__ __forceinline__ int covering(int x, int f, int pad, const FastDiv& stride, int dil, int positions) {
    int o = x + pad - f * dil;
    if (o < 0 || split(o, stride) != 0) return -1;
    return o < positions ? o : -1;
}

// One thread per image element (grid-stride): the sum, in tap order, of the entries of cols that
// tap the element from the output positions whose windows cover it. Deterministic: no atomics.
__device__ __forceinline__ void col2im(const Col2imParams& p) {
    const ConvShape& g = p.shape;
    const int64_t total = int64_t(g.N) * g.D * g.H * g.W * g.C;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        int n = int(quotient(i, p.c));
        const int c = int(i - int64_t(n) * g.C);
        const int w = split(n, p.w), h = split(n, p.h), d = split(n, p.d);
        const TapWalk wt = tap_walk(d, g.pad_d, p.str_d, g.dil_d), wr = tap_walk(h, g.pad_h, p.str_h, g.dil_h),
                      ws = tap_walk(w, g.pad_w, p.str_w, g.dil_w);
        float acc = 0.f;
        for (int t = wt.first; t < g.T; t += wt.step) {
            const int z = covering(d, t, g.pad_d, p.str_d, g.dil_d, g.M);
            if (z < 0) continue;
            for (int r = wr.first; r < g.R; r += wr.step) {
                const int y = covering(h, r, g.pad_h, p.str_h, g.dil_h, g.P);
                if (y < 0) continue;
                const int64_t row0 = (int64_t(n * g.M + z) * g.P + y) * g.Q;
                for (int s = ws.first; s < g.S; s += ws.step) {
                    const int x = covering(w, s, g.pad_w, p.str_w, g.dil_w, g.Q);
                    if (x < 0) continue;
                    acc += __ldg(p.cols + (row0 + x) * p.ld + ((t * g.R + r) * g.S + s) * g.C + c);
                }
            }
        }
        p.image[i] = acc;
    }
}

// Space-to-depth (FoldParams): a block per row of folded positions (n, j0, j1) and a tile of
// p.tile positions along the last axis stages the s0 s1 image rows they hold, each a contiguous
// run of tile x s2 pixels (zeros outside the image), with consecutive threads loading
// consecutive elements; then its threads store the folded positions in 16-byte chunks (the
// channels are a multiple of a chunk), consecutive threads consecutive chunks. Staged row r
// (= b0 s1 + b1) holds, at j s2 C + b2 C + ch, what folded channel r s2 C + b2 C + ch of the
// tile's position j takes. (A thread per chunk loading from the image itself read 2 bytes from
// a different row in each lane.)
template <class E>
__device__ __forceinline__ void fold(const FoldParams& p) {
    extern __shared__ __align__(16) unsigned char staged_raw[];
    E* staged = reinterpret_cast<E*>(staged_raw);
    constexpr int kPer = 16 / sizeof(E);
    const int sc = p.s[2] * p.c, rows = p.s[0] * p.s[1];
    int block = int(blockIdx.x);
    const int tile = split(block, p.div_tiles), j1 = split(block, p.div_j1), j0 = split(block, p.div_j0), n = block;
    const int first = tile * p.tile, count = min(p.tile, p.j[2] - first), span = count * sc;
    const int64_t row_len = int64_t(p.x[2]) * p.c, start = (int64_t(first) * p.s[2] - p.pad[2]) * p.c;
    const E* x = static_cast<const E*>(p.src);
    for (int r = 0; r < rows; ++r) {
        const int b0 = r / p.s[1], b1 = r - b0 * p.s[1];
        const int x0 = j0 * p.s[0] + b0 - p.pad[0], x1 = j1 * p.s[1] + b1 - p.pad[1];
        const bool inside = unsigned(x0) < unsigned(p.x[0]) && unsigned(x1) < unsigned(p.x[1]);
        const E* row = x + ((int64_t(n) * p.x[0] + x0) * p.x[1] + x1) * row_len;
        for (int k = threadIdx.x; k < span; k += blockDim.x) {
            const int64_t e = start + k;
            staged[r * span + k] = inside && e >= 0 && e < row_len ? __ldg(row + e) : E{};
        }
    }
    __syncthreads();
    uint4* out = static_cast<uint4*>(p.dst) + (((int64_t(n) * p.j[0] + j0) * p.j[1] + j1) * p.j[2] + first) * (p.cf / kPer);
    for (int q = threadIdx.x; q < count * (p.cf / kPer); q += blockDim.x) {
        int j = q;
        int r = split(j, p.div_chunks) * kPer;   // the chunk's position j and first channel,
        int rem = split(r, p.div_sc);            // as r s2 C + rem
        union {
            uint4 whole;
            E part[kPer];
        } v;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            v.part[k] = r < rows ? staged[r * span + j * sc + rem] : E{};
            if (++rem == sc) rem = 0, ++r;
        }
        out[q] = v.whole;
    }
}

// Its transpose over x: a block per image row (n, x0, x1), which is folded row (n, j0, j1)'s
// phase (b0, b1); its element e (pixel x2, channel ch) is, with u = e + pad2 C, folded position
// u / (s2 C)'s channel (b0 s1 + b1) s2 C + u % (s2 C): runs of s2 C consecutive elements.
template <class E>
__device__ __forceinline__ void unfold(const FoldParams& p) {
    const int sc = p.s[2] * p.c;
    int block = int(blockIdx.x);
    const int x1 = split(block, p.div_x1), x0 = split(block, p.div_x0), n = block;
    int j0 = x0 + p.pad[0], j1 = x1 + p.pad[1];
    const int b0 = split(j0, p.div_s0), b1 = split(j1, p.div_s1);
    const bool inside = j0 < p.j[0] && j1 < p.j[1];
    const E* folded = static_cast<const E*>(p.src) + ((int64_t(n) * p.j[0] + j0) * p.j[1] + j1) * int64_t(p.j[2]) * p.cf +
                      (b0 * p.s[1] + b1) * sc;
    E* row = static_cast<E*>(p.dst) + ((int64_t(n) * p.x[0] + x0) * p.x[1] + x1) * int64_t(p.x[2]) * p.c;
    for (int e = threadIdx.x; e < p.x[2] * p.c; e += blockDim.x) {
        int j2 = e + p.pad[2] * p.c;
        const int rem = split(j2, p.div_sc);
        row[e] = inside && j2 < p.j[2] ? __ldg(folded + int64_t(j2) * p.cf + rem) : E{};
    }
}

// FilterTapsParams: 64 k rows x 64 channels of the output tap's input tap, by 16-byte loads,
// into shared memory (rows 33 words apart: a warp's stores and reads spread over the banks),
// then 64 channel rows x 64 k out, 16 bytes a thread.
__device__ __forceinline__ void filter_taps(const FilterTapsParams& p) {
    __shared__ uint32_t tile[64 * 33];   // [k][c], 16-bit elements, 66 a row
    const uint16_t* const half = reinterpret_cast<const uint16_t*>(tile);
    const int c0 = int(blockIdx.x) * 64, k0 = int(blockIdx.y) * 64;
    int set = 0;
    while (set + 1 < p.sets && int(blockIdx.z) >= p.z_end[set]) ++set;
    const int z = int(blockIdx.z) - (set ? p.z_end[set - 1] : 0);   // the output tap within its set
    const int32_t *taps = p.taps[set], *base = p.base[set], *step = p.step[set];
    const int js = z % taps[2], jr = z / taps[2] % taps[1], jt = z / (taps[2] * taps[1]);
    const int64_t tap = (int64_t(base[0] + step[0] * jt) * p.R + base[1] + step[1] * jr) * p.S + base[2] + step[2] * js;
    const int64_t taps_in = int64_t(p.T) * p.R * p.S, taps_out = int64_t(taps[0]) * taps[1] * taps[2];
    const uint16_t* const F = static_cast<const uint16_t*>(p.filter);
    const int chunk = int(threadIdx.x) % 8, row = int(threadIdx.x) / 8;   // 32 rows a pass
#if __CUDA_ARCH__ >= 900
    // Launched with programmatic stream serialization on sm_90 (as the GEMM's wait_for_prior_grids):
    // nothing global is touched before the kernel before it has ended.
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int k = k0 + row + 32 * h, c = c0 + 8 * chunk;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (k < p.K && c < p.C) v = __ldg(reinterpret_cast<const uint4*>(F + (int64_t(k) * taps_in + tap) * p.C + c));
        uint32_t* const at = tile + (row + 32 * h) * 33 + 4 * chunk;
        at[0] = v.x, at[1] = v.y, at[2] = v.z, at[3] = v.w;
    }
    __syncthreads();
    uint16_t* const out = static_cast<uint16_t*>(p.out) + p.out_at[set];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int cr = row + 32 * h, c = c0 + cr, k = k0 + 8 * chunk;
        if (c >= p.C || k >= p.K) continue;
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            w[i] = uint32_t(half[(8 * chunk + 2 * i) * 66 + cr]) | uint32_t(half[(8 * chunk + 2 * i + 1) * 66 + cr]) << 16;
        const int64_t row = p.row_taps ? p.row_taps : taps_out;
        *reinterpret_cast<uint4*>(out + (int64_t(c) * row + z) * p.K + k) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

extern "C" __global__ void __launch_bounds__(256) kiln_filter_taps_e2(const __grid_constant__ FilterTapsParams p) {
    filter_taps(p);
}
extern "C" __global__ void __launch_bounds__(256) kiln_fold_e2(const __grid_constant__ FoldParams p) { fold<uint16_t>(p); }
extern "C" __global__ void __launch_bounds__(256) kiln_unfold_e2(const __grid_constant__ FoldParams p) { unfold<uint16_t>(p); }
extern "C" __global__ void __launch_bounds__(256) kiln_unfold_e4(const __grid_constant__ FoldParams p) { unfold<uint32_t>(p); }

extern "C" __global__ void __launch_bounds__(256) kiln_col2im_f32(const __grid_constant__ Col2imParams p) { col2im(p); }

#define KILN_IM2COL(VB) \
    extern "C" __global__ void __launch_bounds__(256) kiln_im2col_v##VB(const __grid_constant__ Im2colParams p) { im2col<VB>(p); }
KILN_IM2COL(16)
KILN_IM2COL(8)
KILN_IM2COL(4)
KILN_IM2COL(2)

#define KILN_IM2COL_ROWS(ES)                                                                                         \
    extern "C" __global__ void __launch_bounds__(256) kiln_im2col_rows_e##ES(const __grid_constant__ Im2colParams p) { \
        im2col_rows<ES>(p);                                                                                          \
    }
KILN_IM2COL_ROWS(2)
KILN_IM2COL_ROWS(4)
