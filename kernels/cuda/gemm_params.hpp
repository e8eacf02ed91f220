// The parameter block of kiln's precompiled GEMM kernels, shared by the device code (nvcc) and
// the host launcher (g++): one plain struct, passed by value, so both sides agree on the layout
// by construction. Every kernel computes, for each batch entry z,
//
//   C[m, n] = store(act(alpha * sum_k A[m, k] * B[k, n] + bias[n]) + beta * C[m, n])
//
// with A, B and C addressed through element strides (any view), act = identity, ReLU or leaky
// ReLU, store = round to C's dtype (stochastically when sr_bits > 0). With bsum set, each block
// also writes the row sums of its tile of the result to bsum_partials[tile_n][z][m] and counts
// itself in bsum_turns[z][tile_m]; the last of a row of tiles to finish adds the row's tiles
// in tile order (deterministic sums, no second launch) and stores them in bsum. The persistent
// kernels store their partials tagged with the launch in bsum_tagged instead, and the tile
// last in their walk of each row adds them, in the same order (sm90/scheduler.cuh). With one tile
// per row the block stores its sums in bsum directly. With bsum_cluster (wgmma one-tile
// kernels, at most 8 tiles per row) a row of tiles is one cluster: each block sends its sums of
// the other blocks' rows into their shared memory (st.async, counted on the receiver's
// mbarrier), and adds its own rows in the same tile order. With k_splits > 1 (batch 1 only) each
// block multiplies a slice of k and stores its raw float32 sums; a second kernel
// (kiln_gemm_reduce_splits) adds the slices in order and applies the epilogue and the sums.
// With k_cluster set (wgmma kernels, any batch) the k_splits blocks of a tile are one thread
// block cluster instead: they add their sums through distributed shared memory, each block
// finishing a share of the tile's rows, in one launch.
#pragma once
#include <stdint.h>

// What the kernels and the launcher must decide alike is written once, here, for both.
#ifdef __CUDACC__
#define KILN_GEMM_HOST_DEVICE __host__ __device__
#else
#define KILN_GEMM_HOST_DEVICE
#endif

namespace kiln::gemm {

enum GemmDType : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

enum GemmFlags : int32_t {
    kRelu = 1,      // apply act (slope 0: ReLU, else leaky ReLU)
    kBias = 2,      // add bias[n] (float32, contiguous)
    kBeta = 4,      // add beta * C (C read before it is written)
    kBsum = 8,      // write row-sum partials
    kHist = 16,     // count the values stored into hist (set where the counters fit: gemm_launch.cpp)
    kColSums = 32,  // the register epilogue's column sums per row of tiles into col_partials
};

// Split-K in a cluster on tiles at most kSplitPushMaxBn wide, into 16-bit C without beta or
// stochastic rounding: each block sends its sums of the other blocks' rows straight from its
// registers into their shared memory (sm90/epilogue.cuh, split_k_push_epilogue), into a receive
// buffer after the stages and the bias, which the host adds to the launch's shared memory.
// (Wider tiles have no room for it beside their stages.)
// The tile's 8-row groups are owned in rank order, block `rank` the groups from
// split_first_group(rank) on (counts differing by at most one: 3, 3, 2 for 8 groups in 3), and
// its receive buffer holds the other blocks' sums of the most groups a block owns.
constexpr int kSplitPushMaxBn = 64;
KILN_GEMM_HOST_DEVICE constexpr int split_first_group(int groups, int splits, int rank) {
    return (rank * groups + splits - 1) / splits;
}
KILN_GEMM_HOST_DEVICE constexpr int split_receive_bytes(int bm, int bn, int splits) {
    return 4 * (splits - 1) * 8 * split_first_group(bm / 8, splits, 1) * bn;
}

struct GemmParams {
    const void* a;
    const void* b;
    void* c;
    const float* bias;        // kBias: N float32 values
    float* bsum_partials;     // kBsum with tiles_n > 1: [tiles_n][batch][M] float32
    uint32_t* bsum_turns;     // kBsum with tiles_n > 1: [batch][tiles_m], zero before and after
    uint64_t* bsum_tagged;    // kBsum in the persistent kernels with tiles_n > 1: [tiles_n][batch][M]
                              // words, bsum_epoch << 32 | the float's bits (sm90/scheduler.cuh)
    void* bsum;               // kBsum: the sums, element (z, m) at z * bsum_sb + m * bsum_sm
    float* col_partials;      // kColSums: [tiles_m][N] float32, row of tiles tm's sums of C's
                              // columns as stored (a convolution's per-channel bsum)
    int64_t bsum_sb, bsum_sm;
    int32_t bsum_dtype;       // GemmDType of bsum
    uint32_t bsum_epoch;      // this launch's tag for bsum_tagged (never 0: the words start zeroed)
    int64_t a_sm, a_sk;       // A's strides along m and k, in elements
    int64_t b_sk, b_sn;       // B's strides along k and n
    int64_t c_sm, c_sn;       // C's strides along m and n
    int64_t c_sg;             // c_group > 0: C's rows in groups of c_group, group g from g * c_sg
    int32_t c_group;          // on (c_row): a view's rows over two axes (a strided convolution
                              // gradient's phase, every s-th row of every s-th image row); 0: none
    int64_t a_batch, b_batch, c_batch;  // strides between batch entries (0: shared)
    int32_t m, n, k, batch;
    float alpha, beta, slope;
    int32_t flags;
    int32_t c_dtype;          // GemmDType of C
    int32_t sr_bits;          // stochastic rounding of 16-bit C: mantissa bits kept, 0 = nearest
    uint32_t seed, counter;   // stochastic rounding's random stream
    int32_t tiles_m;          // blocks along m (the grid's raster: see gemm_common.cuh)
    int32_t tiles_n;
    int32_t group_m;          // raster: tiles_m is walked in groups of this many rows of tiles
    int32_t k_splits;         // split-K (batch 1): blockIdx.y is the split, which adds up its share
                              // of k and stores the raw float32 sums as C entry `split`
    int32_t k_cluster;        // split-K in a cluster: blockIdx.x = tile * k_splits + split (the
                              // block's rank in its cluster), blockIdx.y the batch entry
    int32_t bsum_cluster;     // bsum over a row of tiles in one cluster (tiles_n blocks, raster
                              // group_m = 1): the blocks add their row sums through distributed
                              // shared memory instead of bsum_partials and bsum_turns
    int32_t b_multicast;      // one-tile wgmma kernels: clusters of this many blocks along m (2 or
                              // 4; 0 or 1: none) share B's stages, each block loading its share
                              // of them into all (TMA multicast); the B map's boxes are that share
    // kHist: the numerics histogram of the values stored to C, as rounded (include/kiln/hist.hpp):
    // each epilogue warp (the persistent kernels: the block) counts into hist_bins words of its
    // own in the dynamic shared memory from byte hist_smem on (past the kernel's own), then adds
    // them to hist.
    uint32_t* hist;
    int32_t hist_bins, hist_offset, hist_smem;
};

// The 16-bit register epilogue's condition (sm90/epilogue.cuh, store_tile_16bit): 16-bit C whose
// rows and batch entries start 16 bytes apart, without beta or stochastic rounding.
KILN_GEMM_HOST_DEVICE inline bool rows_of_16_bytes(const GemmParams& p) {
    return !(p.flags & kBeta) && p.sr_bits == 0 && p.c_dtype != kF32 && p.c_sn == 1 && p.c_sm % 8 == 0 &&
           p.c_sg % 8 == 0 && p.c_batch % 8 == 0 && reinterpret_cast<uintptr_t>(p.c) % 16 == 0;
}
// Whether a split in a cluster on tiles `bn` wide sends its sums from registers
// (split_k_push_epilogue) rather than through the general epilogue's float32 staging.
KILN_GEMM_HOST_DEVICE inline bool split_sums_pushed(const GemmParams& p, int bn) {
    return bn <= kSplitPushMaxBn && rows_of_16_bytes(p);
}

// C stored by columns: its columns contiguous (its m stride 1, as a weight gradient written as
// its transpose), without bsum. The general epilogue (finish_tile) then gives a warp columns
// and its lanes rows, and split-K's second step (kiln_gemm_reduce_splits) adds 32 x 32 blocks
// of the slices along their rows and stores C along its columns through shared memory, so that
// the stores are coalesced (stored along C's rows, every 2-byte store of a warp fell in a line
// of its own).
KILN_GEMM_HOST_DEVICE inline bool c_by_columns(const GemmParams& p) {
    return !(p.flags & kBsum) && p.c_sm == 1 && p.c_sn != 1;
}

// Split-K's second step with bsum (kiln_gemm_reduce_splits): the warps of a 256-thread block
// that share a row, 1 to 8 (a power of two, about 256 columns a warp), so that a product of
// few long rows is not left to a few warps, each adding a whole row alone; the block takes
// 8 / that many rows.
KILN_GEMM_HOST_DEVICE constexpr int reduce_warps_per_row(int n) {
    return n > 1024 ? 8 : n > 512 ? 4 : n > 256 ? 2 : 1;
}

} // namespace kiln::gemm
