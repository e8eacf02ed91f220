// The persistent kernels' tile scheduling: the walk (block b takes tiles b, b + gridDim.x, ...,
// batch entries folded in), the barriers it keeps in shared memory, and bsum over a row of
// tiles along that walk (tagged partials, added by the block that runs the row's last tile).
// The one-tile kernels' raster (tile_of, work_of) is shared with the sm_80 kernels, in
// gemm_common.cuh. A piece of its own so that another kernel (a convolution's, with its own
// producer) can walk its tiles and add its row sums the same way.
#pragma once
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm90/ptx.cuh"
#include "kernels/cuda/sm90/ring.cuh"

namespace kiln::gemm {

// bsum in the persistent kernels. A row of tiles is added up by the block that runs its last
// tile in the walk (column tiles_n - 1: the walk visits a row's columns in order), the row's
// adder; every other tile of the row stores its row sums as tagged partials (one 64-bit word:
// this launch's tag above the float's bits, a single-copy-atomic store). The adder's bsum
// warps (warps 1-3 of the producer's warpgroup) start on the row as soon as they reach that
// tile, while its consumers are still multiplying it: they read the row's partials, the tile's
// own too (stored tagged like the others), re-reading those whose tag is not yet this
// launch's, add them in tile order and store bsum. Where the tile is the block's last, its
// consumers add the row themselves (add_row_last), their own sums from shared memory. The
// sums' order, and so their bits, are those of the design before: the last tile of a row to
// finish counted itself on a turn counter (an acquire-release atomic) and then loaded the
// row's partials, so an acquire-release fence and three round trips to L2 came after the
// grid's last tiles, while their C stores fill the memory system. Here nothing waits on an
// atomic or a fence.
// An adder waits only for tiles earlier in the walk, which are running or done as long as
// every block of the grid is resident: the launch is cooperative.
template <int STAGES, int BM>
struct PersistentBarriers {
    Ring<STAGES> ring;
    int pending_box[2][3];   // per consumer: where the results waiting in registers go (n0, m0, z)
    float own_sums[BM];      // the row sums of the block's last tile, where it adds its row (the
                             // tf32 B-in-registers kernel: also consumer 1's share of each tile's)
};

// A persistent kernel's walk: tiles per batch entry, tiles in all, k-tiles per tile, and
// whether bsum adds rows over several tiles.
struct PersistentWalk {
    int per_entry, total, ktiles;
    bool rows_span_tiles;
};
__device__ __forceinline__ PersistentWalk persistent_walk(const GemmParams& p, int bk) {
    const int per_entry = p.tiles_m * p.tiles_n;
    return {per_entry, per_entry * p.batch, (p.k + bk - 1) / bk, (p.flags & kBsum) && p.tiles_n > 1};
}

template <int STAGES, int BM>
__device__ __forceinline__ void init_persistent_barriers(PersistentBarriers<STAGES, BM>& bars, const unsigned char* smem) {
    if (threadIdx.x == 0 && smem_u32(smem) % 1024 != 0) __trap();   // the 128-byte swizzle's tiles need it
    init_ring<STAGES, 2>(bars.ring);
}

__device__ __forceinline__ bool is_row_adder(const GemmParams& p, const Tile& at) { return at.n == p.tiles_n - 1; }

// A tile's partial row sum s of row m, tagged with this launch (st.relaxed of one 64-bit word:
// the tag and the value arrive together or not at all).
__device__ __forceinline__ void store_tagged(const GemmParams& p, int tile_n, int z, int m, float s) {
    const uint64_t w = uint64_t(p.bsum_epoch) << 32 | __float_as_uint(s);
    uint64_t* at = p.bsum_tagged + (int64_t(tile_n) * p.batch + z) * p.m + m;
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(at), "l"(w) : "memory");
}
__device__ __forceinline__ uint64_t load_tagged(const uint64_t* at) {
    uint64_t w;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(at) : "memory");
    return w;
}

// Tile tile_n's sum s of its row r (row m of C): into shared memory where the block adds the
// row itself (add_row_last), else as a tagged partial where rows span tiles, else to bsum.
__device__ __forceinline__ void deliver_row_sum(const GemmParams& p, float* own_sums, bool add_here, bool spans, int tile_n,
                                                int z, int r, int m, float s) {
    if (add_here) own_sums[r] = s;
    else if (m < p.m && spans) store_tagged(p, tile_n, z, m, s);
    else if (m < p.m) store_bsum(p, z, m, s);
}

// Row m's sum over its first `tiles` tiles, in tile order, from the tagged partials: GROUP
// words in flight per round trip to L2; the words not yet tagged with this launch are read
// again, all at once, until every one is, `backoff_ns` apart. (Read again one after another,
// each word that was not there at the first read cost a round trip of its own: where a row's
// tiles end together in the grid's last wave, those round trips came after them.)
template <int GROUP>
__device__ __forceinline__ float tagged_row_sum(const GemmParams& p, int z, int m, int tiles, unsigned backoff_ns) {
    const uint64_t* col = p.bsum_tagged + int64_t(z) * p.m + m;
    const int64_t tile_stride = int64_t(p.batch) * p.m;
    const uint32_t tag = p.bsum_epoch;
    float s = 0.f;
    for (int t0 = 0; t0 < tiles; t0 += GROUP) {
        uint64_t w[GROUP];
#pragma unroll
        for (int j = 0; j < GROUP; ++j) w[j] = t0 + j < tiles ? load_tagged(col + (t0 + j) * tile_stride) : uint64_t(tag) << 32;
        for (;;) {
            bool missing = false;
#pragma unroll
            for (int j = 0; j < GROUP; ++j) missing |= uint32_t(w[j] >> 32) != tag;
            if (!missing) break;
            if (backoff_ns) __nanosleep(backoff_ns);
#pragma unroll
            for (int j = 0; j < GROUP; ++j)
                if (uint32_t(w[j] >> 32) != tag) w[j] = load_tagged(col + (t0 + j) * tile_stride);
        }
#pragma unroll
        for (int j = 0; j < GROUP; ++j) s += __uint_as_float(uint32_t(w[j]));
    }
    return s;
}

// Whether tile t is this block's last in the walk.
__device__ __forceinline__ bool last_of_block(int t, int total) { return t + int(gridDim.x) >= total; }

// The bsum warps (96 threads, this one `bt`): each tile of this block that adds its row, but
// the block's last (which its consumers add themselves, add_row_last), rows bt, bt + 96, ...
// of the tile over all the row's tiles (GROUP words in flight). They reach the tile while its
// consumers multiply it, or earlier, and wait for the partials sleeping 1 us between reads:
// these sums are needed by the kernel's end only.
template <int BM, int GROUP>
__device__ __forceinline__ void add_bsum_rows(const GemmParams& p, int per_entry, int total, int bt) {
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const int z = t / per_entry;
        const Tile at = tile_of(p, t - z * per_entry);
        if (!is_row_adder(p, at) || last_of_block(t, total)) continue;
        for (int m = at.m * BM + bt; m < at.m * BM + BM && m < p.m; m += 96)
            store_bsum(p, z, m, tagged_row_sum<GROUP>(p, z, m, p.tiles_n, 1000));
    }
}

// The block's last tile, where it adds its row: the consumers, idle after its epilogue, take a
// row each (`i` of `nthreads`), with GROUP of the row's other partials in flight at once.
// Where the grid's last wave holds most of a row's tiles, their partials land as that wave
// ends; the bsum warps, with their few registers (a few words in flight per round trip),
// ended the kernel well after the consumers there.
template <int BM, int GROUP>
__device__ __forceinline__ void add_row_last(const GemmParams& p, const float* own_sums, int m0, int z, int i,
                                             int nthreads) {
    for (int r = i; r < BM && m0 + r < p.m; r += nthreads)
        store_bsum(p, z, m0 + r, tagged_row_sum<GROUP>(p, z, m0 + r, p.tiles_n - 1, 0) + own_sums[r]);
}

} // namespace kiln::gemm
