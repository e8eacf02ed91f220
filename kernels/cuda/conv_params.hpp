// The parameter block of kiln's precompiled convolution kernels (conv_sm90.cu, conv_sm80.cu),
// shared by the device code (nvcc) and the host launcher (conv_cuda.cpp). The kernels compute
// fprop as the GEMM  O (rows x K) = patches(I) (rows x taps) . F^T (taps x K)  without the patch
// matrix: rows = N M P Q output positions, taps = T R S C filter entries, channels innermost
// (NDHWC activations, KTRSC filters). `gemm` carries the product's epilogue and C (the output as
// a rows x K matrix), exactly as the GEMM kernels read it.
#pragma once
#include "kernels/cuda/gemm_params.hpp"

namespace kiln::gemm {

// The convolution's geometry: image (N, D, H, W, C), output positions M x P x Q per image,
// filter T x R x S, zero padding, stride and dilation per axis.
struct ConvShape {
    int32_t N, D, H, W, C;
    int32_t M, P, Q;
    int32_t T, R, S;
    int32_t pad_d, pad_h, pad_w, str_d, str_h, str_w, dil_d, dil_h, dil_w;
};

// Output position `row` (n, z, y, x in row-major order): its image and the image coordinates of
// its window's first tap (negative or past the end in the padding).
struct RowOrigin {
    int32_t n, d0, h0, w0;
};
KILN_GEMM_HOST_DEVICE inline RowOrigin row_origin(const ConvShape& s, int32_t row) {
    const int32_t x = row % s.Q;
    row /= s.Q;
    const int32_t y = row % s.P;
    row /= s.P;
    const int32_t z = row % s.M;
    return {row / s.M, z * s.str_d - s.pad_d, y * s.str_h - s.pad_h, x * s.str_w - s.pad_w};
}

// The filter tap (t, r, s) and channel c of a patch column, walked forward n columns at a time
// (the channel innermost, then S, R, T): t == T once past the filter's last tap. The gathering
// kernels step their 16-byte chunks so, without a division.
struct PatchColumn {
    int32_t c = 0, s = 0, r = 0, t = 0;
    KILN_GEMM_HOST_DEVICE void advance(const ConvShape& g, int32_t n) {
        c += n;
        while (c >= g.C) {
            c -= g.C;
            if (++s == g.S) {
                s = 0;
                if (++r == g.R) r = 0, ++t;
            }
        }
    }
};

// The one-tile fprop kernel's shared memory past the tile's bias for kColSums (a per-channel bsum
// in the register epilogue): the 8 consumer warps' column sums of a BN-wide tile, which the
// epilogue adds into the row of tiles' partials (the host adds the rows of tiles).
constexpr int conv_col_sum_bytes(int bn) { return 8 * bn * 4; }

// The mma.sync fprop (sm80/conv_mma.cuh, every GPU from sm_80): 128 output positions x BN
// channels a block of 256 threads, shared rows of 40 16-bit elements (a 32-element k-tile and
// its padding), STAGES stages of both operands, or the float32 accumulator tile for the
// epilogue, whichever is larger.
constexpr int kConvMmaRows = 128, kConvMmaThreads = 256, kConvMmaLd = 40;
KILN_GEMM_HOST_DEVICE constexpr int conv_mma_smem(int bn, int stages) {
    const int pipeline = stages * (kConvMmaRows + bn) * kConvMmaLd * 2, tile = kConvMmaRows * (bn + 4) * 4;
    return pipeline > tile ? pipeline : tile;
}

struct ConvParams {
    GemmParams gemm;     // m = rows, n = K, k = taps; c, strides, bias, flags, alpha, beta, rounding;
                         // b the KTRSC filter (the mma.sync kernel: the others take it by TMA)
    const void* image;   // I: (N, D, H, W, C), contiguous
    ConvShape shape;
    int32_t im2col_rank;   // 3, 4 or 5: the patches come by TMA through an im2col descriptor of that rank; 0: gathered
    int32_t c_by_tma;      // the fprop walk: C's rows (plain, not grouped) stored by TMA through its descriptor
    // The weight gradient's balanced split (sm90/conv_wgrad.cuh, conv_wgrad_balanced): block b's
    // float32 partial tile at part_sums + b * 128 * BN, and its flag part_flags[b], a word whose
    // upper half becomes part_tag (this launch's, never 0) once that partial is written.
    float* part_sums;
    uint64_t* part_flags;
    uint32_t part_tag;
    uint32_t siblings;   // kAfterSibling, kBeforeSibling: a strided gradient's phases in a row
};

// A strided gradient's phases (conv.cpp, bprop by phase) write apart and read only what was
// there before the first of them, so each may run beside the phase before it in the stream.
// kBeforeSibling: the kernel lets the next grid start at once (allow_next_grid), so that its
// blocks take the SMs this one's last blocks leave; kAfterSibling: the kernel does not wait for
// the grid before it (a sibling) to start, but waits for it before it exits, so that its own end
// still implies every earlier grid's for what follows. Every phase starts only after the first
// has waited for the grids before it (where E, the taps and the zeroed views were made) and let
// the next start; phases read E and their taps through L2 only (TMA, cp.async.cg).
// (Programmatic launches; without them both do nothing.)
constexpr uint32_t kAfterSibling = 1, kBeforeSibling = 2;

// A strided gradient's phases in one launch (the walk's phased entries, sm90/conv_walk.cuh): the
// phases share the output positions, E's patch descriptor and C's row layout, and differ in
// their taps, where those start in the taps matrix B, and where their rows start in C. The
// descriptor is made with the largest of the phases' paddings, each phase's window starting
// (od, oh, ow) further in, so that one descriptor walks every phase's positions alike.
constexpr int kMaxPhases = 8;
struct ConvPhase {
    int64_t c_at;        // the phase's rows of C from element c_at of gemm.c (c_row's layout)
    int32_t k;           // its taps x channels: B's columns k_first .. k_first + k - 1
    int32_t k_first;
    int32_t R, S;        // its taps along H and W (and T, up to k / (R S C))
    uint16_t od, oh, ow, unused;
};
struct ConvPhases {
    int32_t count;
    ConvPhase phase[kMaxPhases];
};

// The taps a tile multiplies, walked by the producer: R x S a step of T (the whole filter of
// ConvShape, or a phase's), from column k_first of B, each tap's offsets moved by (od, oh, ow).
struct TapWindow {
    int32_t R, S, k_first, od, oh, ow;
};
KILN_GEMM_HOST_DEVICE inline TapWindow whole_window(const ConvShape& g) { return {g.R, g.S, 0, 0, 0, 0}; }
KILN_GEMM_HOST_DEVICE inline TapWindow phase_window(const ConvPhase& f) {
    return {f.R, f.S, f.k_first, f.od, f.oh, f.ow};
}

} // namespace kiln::gemm
