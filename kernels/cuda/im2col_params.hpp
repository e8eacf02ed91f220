// The parameter blocks of im2col.cu, shared by the device code (nvcc) and the host launcher
// (conv_cuda.cpp). Besides the geometry, each carries the fast divisions (fast_div.hpp) its
// kernel splits indices with.
#pragma once
#include "kernels/cuda/conv_params.hpp"
#include "kernels/cuda/fast_div.hpp"

namespace kiln::gemm {

// cols (rows x taps, rows ld elements apart) = the patch matrix of the image, every element
// `elem` bytes. Divisions: a row's 16-byte chunks (row of a chunk), Q, P, M (an output
// position's coordinates), C, S, R (a column's tap and channel).
struct Im2colParams {
    const void* image;
    void* cols;
    int64_t ld;
    int32_t elem, rows, taps;
    ConvShape shape;
    FastDiv chunks_per_row, q, p, m, c, s, r;
};

// image (N, D, H, W, C, float32, contiguous) = the gradient with respect to the image from the
// patch matrix's gradient cols (rows x taps, float32, rows ld elements apart). Divisions: C, W,
// H, D (an element's coordinates) and the strides.
struct Col2imParams {
    const float* cols;
    float* image;
    int64_t ld;
    ConvShape shape;
    FastDiv c, w, h, d, str_d, str_h, str_w;
};

// Space-to-depth, which folds a strided convolution into a stride-1 one over few channels: `folded`
// (n, J0, J1, J2, cf) from x (n, X0, X1, X2, c). Along each axis, folded position j and phase b < s
// hold x's position s j + b - pad; the folded channel ((b0 s1 + b1) s2 + b2) c + ch holds channel
// ch of it (zero outside x, and in the channels from s0 s1 s2 c to cf). unfold is its transpose
// over x: x's position i takes the folded element of j = (i + pad) / s, b = (i + pad) % s, zero
// where j passes J. fold's blocks take `tile` folded positions along the last axis. Divisions: the
// tiles of a row, J1, J0 (a block's row), cf's 16-byte chunks, s2 c (a chunk's channel); X1, X0,
// s0, s1 (an image row's phase), s2 c.
struct FoldParams {
    const void* src;
    void* dst;
    int32_t n, c, cf, tile;
    int32_t x[3], j[3], s[3], pad[3];
    FastDiv div_tiles, div_j1, div_j0, div_chunks, div_sc, div_x1, div_x0, div_s0, div_s1;
};

// The taps of a filter F (K, T, R, S, C; 16-bit, contiguous) that a gradient with respect to
// the input multiplies, K and C exchanged: out (C, T', R', S', K), out[c][j][k] = F[k][base +
// step j][c] along each axis (step -1 from the last tap: the filter flipped in space; -s from a
// phase's last tap: one phase of stride s). Channels C and K multiples of 8. Up to kMaxTapSets
// such sets in one launch (a strided gradient's phases), set i into out + out_at[i] elements;
// the output taps of all sets are numbered in turn, set i's ending before z_end[i]; row_taps > 0:
// a channel's row holds that many taps (the sets side by side: out (C, row_taps, K), set i from
// its first tap on), else its set's. A block transposes 64 k x 64 c of one output tap
// (blockIdx.z) through shared memory.
constexpr int kMaxTapSets = 16;
struct FilterTapsParams {
    const void* filter;
    void* out;
    int32_t K, C, T, R, S;
    int32_t sets, row_taps;
    int32_t z_end[kMaxTapSets];
    int64_t out_at[kMaxTapSets];
    int32_t taps[kMaxTapSets][3], base[kMaxTapSets][3], step[kMaxTapSets][3];
};

} // namespace kiln::gemm
