// The Hopper kernels' epilogues on the accumulators in registers: the 16-bit register epilogue
// (alpha, bias, activation, rounding and bsum's row sums in registers, then 16-byte row
// stores), the accumulators staged for the general epilogue (finish_tile, gemm_common.cuh),
// split-K in a cluster (float32 through shared memory, or the slices' sums pushed from
// registers) and bsum over a row of tiles in one cluster. A piece of its own because it depends
// on the wgmma accumulator layout alone, not on how the operands arrived: any kernel built on
// mainloop.cuh can finish its tiles with it.
#pragma once
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm90/ptx.cuh"

#include <type_traits>

namespace kiln::gemm {

// Which epilogues a one-tile kernel's code holds: every one (kGeneral), or, in its lean twins
// (the entry points, gemm_sm90.cu), the 16-bit register epilogue into C of the operands' dtype alone, without
// bsum (kLeanPlain) or with it (kLeanBsum); the persistent kernels' kLeanCols: without bsum, with
// C's column sums (kColSums), a twin of its own so that the other kernels keep their registers.
enum { kGeneral, kLeanPlain, kLeanBsum, kLeanCols };
// Whether an epilogue of kind LEAN holds bsum's code.
__host__ __device__ constexpr bool lean_has_bsum(int lean) { return lean == kGeneral || lean == kLeanBsum; }

// The epilogue into 16-bit C whose rows are 16-byte aligned, without beta or stochastic
// rounding (rows_of_16_bytes, gemm_params.hpp): alpha, bias and ReLU are applied in the
// accumulators' registers, the row sums for bsum added there (each row's share in 4 lanes,
// then 2 shuffles), and the results rounded to C's dtype, so the tile crosses shared memory as
// 16-bit values (half the bytes of the float32 staging that the general epilogue, finish_tile,
// needs for beta and stochastic rounding), and each warp then stores whole rows with 16-byte
// writes: the product loses a fraction of what the general epilogue costs it. The bias comes
// from shared memory (`bias_s`, filled before the main loop, which hides its loads' latency):
// read from global memory here, each thread's 2 * BN / 8 columns were loads waited on in the
// epilogue, and filled here, behind a barrier, it still cost that barrier's wait.
// (store_tile_16bit's rows_begin and rows_end: the rows of the tile it stores, and whose bsum
// it counts; a block of a split tile stores only its own.)

// The register epilogue of two neighbouring columns: alpha * accumulator + bias, then the
// activation (ReLU, or leaky with the slope).
__device__ __forceinline__ float2 epilogue_pair(const GemmParams& p, float a0, float a1, float2 bias, bool relu) {
    float v0 = p.alpha * a0 + bias.x, v1 = p.alpha * a1 + bias.y;
    if (relu) {
        v0 = activation(v0, p.slope);
        v1 = activation(v1, p.slope);
    }
    return make_float2(v0, v1);
}

// A thread's shares of its two rows (g and g + 8: r0, r1) added over the 4 lanes of its quad
// (a row's columns are spread over them in the accumulator layout) in two shuffles and a fixed
// order: lanes with q even end with row g's sum, q odd with row g + 8's. (Each row over the
// quad apart, the same adds in four shuffles, and one lane storing both sums, made bsum cost
// more.)
__device__ __forceinline__ float quad_sum_pair(float r0, float r1, int q) {
    const bool odd = q & 1;
    const float s = (odd ? r1 : r0) + __shfl_xor_sync(0xffffffffu, odd ? r0 : r1, 1);
    return s + __shfl_xor_sync(0xffffffffu, s, 2);
}

// Two values rounded to C's 16-bit dtype, in one 32-bit word.
__device__ __forceinline__ uint32_t pack2(float a, float b, int dtype) {
    if (dtype == kBF16) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<const uint32_t*>(&v);
    }
    const __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
}
// The two values of a pack2 word, as floats.
__device__ __forceinline__ float2 unpack2(uint32_t w, int dtype) {
    if (dtype == kBF16) return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// kHist in the persistent kernels: the block's counters (hist_bins words at byte hist_smem of
// its dynamic shared memory `smem`), zeroed by the 256 consumer threads (ctid: 0..255) behind
// barrier 1; hist_flush_block adds them to p.hist once every consumer is done counting. Both
// do nothing without kHist.
__device__ __forceinline__ void hist_begin_block(const GemmParams& p, unsigned char* smem, int ctid) {
    if (!(p.flags & kHist)) return;
    uint32_t* h = reinterpret_cast<uint32_t*>(smem + p.hist_smem);
    for (int i = ctid; i < p.hist_bins; i += 256) h[i] = 0;
    asm volatile("bar.sync 1, 256;" ::: "memory");
}
__device__ __forceinline__ void hist_flush_block(const GemmParams& p, unsigned char* smem, int ctid) {
    if (!(p.flags & kHist)) return;
    const uint32_t* h = reinterpret_cast<const uint32_t*>(smem + p.hist_smem);
    asm volatile("bar.sync 1, 256;" ::: "memory");
    for (int i = ctid; i < p.hist_bins; i += 256)
        if (h[i]) atomicAdd(p.hist + i, h[i]);
}

// kHist: counts the 16-bit values of `words` (pack2 order) into the warp's counters h, the
// first `left` of them (the columns inside C).
template <int NWORDS>
__device__ __forceinline__ void hist_count_words(const GemmParams& p, uint32_t* h, const uint32_t* words, int left) {
#pragma unroll
    for (int i = 0; i < NWORDS; ++i) {
        const float2 v = unpack2(words[i], p.c_dtype);
        if (2 * i < left) atomicAdd(h + kiln_hist_bin(v.x, p.hist_bins, p.hist_offset), 1u);
        if (2 * i + 1 < left) atomicAdd(h + kiln_hist_bin(v.y, p.hist_bins, p.hist_offset), 1u);
    }
}

// Zeroes the accumulators of this thread's columns at or past N (the tile's first `cols_left`
// columns are inside C). TMA fills B's columns past N with zeros, so these hold A . 0: zero,
// or NaN where a row of A holds an infinity, which the register epilogues' row sums (bsum)
// must not see. Register 4j + r: column 8j + 2q + r % 2.
template <int BN>
__device__ __forceinline__ void zero_columns_past_n(float (&acc)[BN / 2], int cols_left, int q) {
    if (cols_left >= BN) return;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r)
            if (8 * j + 2 * q + r % 2 >= cols_left) acc[4 * j + r] = 0.f;
}

// The register epilogue of the persistent kernel into 16-bit C: a consumer's 64 x BN results
// as alpha * accumulator + bias, the activation (kActRelu: ReLU; kActLeaky: with the slope),
// rounded to C's dtype in pairs (results[2j + h]: row g + 8h, columns 8j + 2q and + 1), and
// where SUMS the whole sums of its two rows' rounded values (rounded_row_sums: on the tensor
// cores, cheaper than a max and an add a value plus the quad's shuffles in float32). What
// holds for the whole product (C's dtype, the activation, bsum) is a template argument:
// tested per pair, the tests lengthened the pass, during which the tensor cores idle.
enum { kActNone, kActRelu, kActLeaky };
// activation(v, 0) in one instruction: max(v, 0), NaN staying NaN (fmaxf would return 0).
__device__ __forceinline__ float relu_keep_nan(float v) {
    float r;
    asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(v));
    return r;
}
// The row sums of a consumer's rounded results on the tensor cores: the packed results are, four
// words at a time, the A fragment of an m16n8k16 multiply (words 4s .. 4s + 3: rows g and g + 8,
// columns 16s + 2q, + 1, + 8, + 9), B a 16 x 8 matrix of ones, so that every column of the float32
// product is a row's sum over the 16 columns. row_sum[h]: the whole sum of row g + 8h, in every
// lane of the quad. Columns past N hold zeros (zero_columns_past_n, the bias past N is zero).
template <bool BF16, int BN>
__device__ __forceinline__ void rounded_row_sums(const uint32_t (&results)[BN / 4], float (&row_sum)[2]) {
    constexpr uint32_t kOnes = BF16 ? 0x3F803F80u : 0x3C003C00u;
    constexpr int kChains = BN / 16 < 4 ? BN / 16 : 4;   // of multiplies, each one's results the next one's C
    float d[kChains][4] = {};
#pragma unroll
    for (int s = 0; s < BN / 16; ++s) {
        float(&e)[4] = d[s % kChains];
        const uint32_t* a = results + 4 * s;
        if constexpr (BF16)
            asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%8}, {%0,%1,%2,%3};"
                : "+f"(e[0]), "+f"(e[1]), "+f"(e[2]), "+f"(e[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(kOnes));
        else
            asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%8}, {%0,%1,%2,%3};"
                : "+f"(e[0]), "+f"(e[1]), "+f"(e[2]), "+f"(e[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(kOnes));
    }
    row_sum[0] = d[0][0], row_sum[1] = d[0][2];
#pragma unroll
    for (int c = 1; c < kChains; ++c) row_sum[0] += d[c][0], row_sum[1] += d[c][2];
}
// The activation ACT of a value: none, ReLU, or leaky ReLU with the slope.
template <int ACT>
__device__ __forceinline__ float activate(float v, float slope) {
    if constexpr (ACT == kActRelu) return relu_keep_nan(v);
    else if constexpr (ACT == kActLeaky) return v > 0.f ? v : v * slope;
    else return v;
}
// The register epilogue's rounding: alpha, the tile's bias (bias_s), the activation, then C's
// 16-bit dtype, each pair handed to put(j, h, packed) (row g + 8h, columns 8j + 2q, + 1).
template <bool BF16, int ACT, int BN, class Put>
__device__ __forceinline__ void round_pairs(const GemmParams& p, const float (&acc)[BN / 2], const float* bias_s, int q,
                                            Put&& put) {
    const float alpha = p.alpha, slope = p.slope;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const float2 b = *reinterpret_cast<const float2*>(bias_s + 8 * j + 2 * q);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float v0 = alpha * acc[4 * j + 2 * h] + b.x, v1 = alpha * acc[4 * j + 2 * h + 1] + b.y;
            put(j, h, pack2(activate<ACT>(v0, slope), activate<ACT>(v1, slope), BF16 ? kBF16 : kF16));
        }
    }
}
template <bool BF16, int ACT, bool SUMS, int BN>
__device__ __forceinline__ void round_results(const GemmParams& p, const float (&acc)[BN / 2], const float* bias_s, int q,
                                              uint32_t (&results)[BN / 4], float (&row_sum)[2]) {
    round_pairs<BF16, ACT, BN>(p, acc, bias_s, q, [&](int j, int h, uint32_t v) { results[2 * j + h] = v; });
    if constexpr (SUMS) rounded_row_sums<BF16, BN>(results, row_sum);
}
// Calls f(splits) with a cluster split's count (2, 3, 4 or 8: the host's choices) as a
// std::integral_constant value.
template <class F>
__device__ __forceinline__ void with_split_count(int splits, F&& f) {
    if (splits == 2) f(std::integral_constant<int, 2>{});
    else if (splits == 3) f(std::integral_constant<int, 3>{});
    else if (splits == 4) f(std::integral_constant<int, 4>{});
    else f(std::integral_constant<int, 8>{});
}
// Calls f(act) with the product's activation as a std::integral_constant value.
template <class F>
__device__ __forceinline__ void with_activation(const GemmParams& p, F&& f) {
    if (!(p.flags & kRelu)) f(std::integral_constant<int, kActNone>{});
    else if (p.slope == 0.f) f(std::integral_constant<int, kActRelu>{});
    else f(std::integral_constant<int, kActLeaky>{});
}
// Calls f(bf16, act) with C's 16-bit dtype and the activation as std::integral_constant values.
template <class F>
__device__ __forceinline__ void with_rounding_choices(const GemmParams& p, F&& f) {
    const auto by_act = [&](auto bf16) { with_activation(p, [&](auto act) { f(bf16, act); }); };
    if (p.c_dtype == kBF16) by_act(std::true_type{});
    else by_act(std::false_type{});
}
// Calls f(bf16, act, sums) with the product's choices as std::integral_constant values.
template <class F>
__device__ __forceinline__ void with_epilogue_choices(const GemmParams& p, F&& f) {
    const auto by_sums = [&](auto bf16) {
        const auto by_act = [&](auto sums) { with_activation(p, [&](auto act) { f(bf16, act, sums); }); };
        if (p.flags & kBsum) by_act(std::true_type{});
        else by_act(std::false_type{});
    };
    if (p.c_dtype == kBF16) by_sums(std::true_type{});
    else by_sums(std::false_type{});
}

// bsum over a row of tiles in one cluster (bsum_cluster). Row r of the tile is added up by the
// row's block of rank r % tiles_n, from slots gathered[t * BM + r] (t: the tile the sum comes
// from). Each block leaves its sums of its own rows in its slot and sends those of the other
// blocks' rows straight into their slots with st.async, which counts the bytes on the owner's
// `sums_in` mbarrier; an owner waits on that barrier alone, adds the slots in tile order (the
// same bits in every run) and stores bsum. Every row is sent, rows past M too, so that the
// owner's barrier expects a fixed count. Sending needs the owner running with its barrier
// initialised: the cluster barrier arrived at the kernel's start (`cluster_arrive_relaxed`) is
// waited for before the epilogue. No block is written to after it exits: it exits only once
// its barrier has counted every byte sent to it.
// (Each block writing the others' shared memory, then one cluster barrier for all, spent much
// of the exchange in that barrier. Through global memory, the row's last tile waited for a
// count and a load round trip after all others, which made bsum a large part of the one-wave
// products' time.)
template <int BM>
__device__ __forceinline__ uint32_t bsum_cluster_bytes(const GemmParams& p) {
    const int tiles = p.tiles_n, rank = int(blockIdx.x) % tiles;
    return 4u * uint32_t((BM - rank + tiles - 1) / tiles) * uint32_t(tiles - 1);
}
// The owner's adds: every consumer thread waits, whether it adds rows or not, so that the
// block stays until every byte sent to it has landed.
template <int BM>
__device__ __forceinline__ void add_owned_rows(const GemmParams& p, const float* gathered, uint64_t* sums_in, int m0, int z,
                                               int ctid, int nthreads) {
    const int tiles = p.tiles_n, rank = int(blockIdx.x) % tiles;
    mbar_wait_cluster(sums_in, 0);
    for (int r = rank + tiles * ctid; r < BM && m0 + r < p.m; r += tiles * nthreads) {
        float s = 0.f;
        for (int t = 0; t < tiles; ++t) s += gathered[t * BM + r];
        store_bsum(p, z, m0 + r, s);
    }
}
// This tile's sum of its row r into the slot of r's owner (row_sums: this tile's slot).
__device__ __forceinline__ void share_row_sum(const GemmParams& p, float* row_sums, uint64_t* sums_in, int r, float s) {
    const int owner = r % p.tiles_n;
    if (owner == int(blockIdx.x) % p.tiles_n) row_sums[r] = s;
    else store_to_peer(row_sums + r, sums_in, owner, s);
}

// A staged 16-byte chunk v of a 16-bit row (`row`: C's row, columns n .. n + 7) stored, its
// columns at or past N left out.
__device__ __forceinline__ void store_chunk_16bit(const GemmParams& p, uint16_t* row, int n, uint4 v) {
    uint16_t* dst = row + n;
    if (n + 8 <= p.n) {
        *reinterpret_cast<uint4*>(dst) = v;
    } else {
        const uint16_t* e = reinterpret_cast<const uint16_t*>(&v);
        for (int i = 0; i < 8 && n + i < p.n; ++i) dst[i] = e[i];
    }
}
// kColSums: a chunk's 8 values added into its columns' sums cs.
__device__ __forceinline__ void add_chunk(const GemmParams& p, uint4 v, float (&cs)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = unpack2(w[i], p.c_dtype);
        cs[2 * i] += f.x, cs[2 * i + 1] += f.y;
    }
}
// kColSums: a warp's sums of its BN / 8 chunks (each lane's cs, lanes BN / 8 apart sharing a
// chunk) added over the lanes and written to row `warp` of col_s (BN floats a row). Where BN / 8
// does not divide 32 (the 96-wide tile: 12 chunks, two rows a pass, lanes 24-31 idle with zeros)
// the second row's lanes add into the first's.
template <int BN>
__device__ __forceinline__ void warp_col_sums(float (&cs)[8], float* col_s, int warp, int lane) {
    constexpr int kChunks = BN / 8;
    if constexpr (32 % kChunks == 0) {
#pragma unroll
        for (int off = kChunks; off < 32; off *= 2)
#pragma unroll
            for (int i = 0; i < 8; ++i) cs[i] += __shfl_xor_sync(0xffffffffu, cs[i], off);
    } else {
        static_assert(32 / kChunks == 2, "two rows a pass");
#pragma unroll
        for (int i = 0; i < 8; ++i) cs[i] += __shfl_down_sync(0xffffffffu, cs[i], kChunks);
    }
    if (lane < kChunks) {
        float4* at = reinterpret_cast<float4*>(col_s + warp * BN + 8 * lane);
        at[0] = make_float4(cs[0], cs[1], cs[2], cs[3]);
        at[1] = make_float4(cs[4], cs[5], cs[6], cs[7]);
    }
}

// kColSums in the persistent kernels and the convolution's walk, from the rounded results in
// registers (register 2j + h: row g + 8h of the warp's 16, columns 8j + 2q, + 1; rows from
// rows_left on lie past M and count as zeros), on the tensor cores: each 8 x 8 block of C
// transposed within the warp (movmatrix), so that 16 columns x the 16 rows are an m16n8k16 A
// operand, times a B of ones: D's row m is column m's sum over the rows, added in float32 by
// the mma (the same bits in every run). Of the BN / 16 products lane 4g + q keeps those of
// column groups i = q, q + 4, ...: cs[2k + e] += the sum of column 16 (4k + q) + 8e + g (k <
// BN / 64). About 6 instructions a column group, where adding the columns' floats over the
// lanes took about 20 (ncu on the persistent GEMM's twin: 56% more instructions than plain).
__device__ __forceinline__ uint32_t transpose_8x8(uint32_t v) {
    uint32_t t;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(t) : "r"(v));
    return t;
}
// One group of 16 columns: its two 8-column chunks' pairs of row g (w0, w1) and of row g + 8
// (w2, w3), zeros for rows past M; lane (g, q) gets the sums of columns 16 i + g and 16 i + 8 + g.
__device__ __forceinline__ float2 group_col_sums(bool bf16, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
    const uint32_t ones = bf16 ? 0x3f803f80u : 0x3c003c00u;
    const uint32_t a0 = transpose_8x8(w0), a1 = transpose_8x8(w1), a2 = transpose_8x8(w2), a3 = transpose_8x8(w3);
    float d[4];
    if (bf16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%8}, "
                     "{%9,%9,%9,%9};"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(ones), "f"(0.f));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%8}, "
                     "{%9,%9,%9,%9};"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(ones), "f"(0.f));
    return make_float2(d[0], d[2]);
}
template <int BN>
__device__ __forceinline__ void add_warp_col_sums(const GemmParams& p, const uint32_t (&results)[BN / 4], int rows_left,
                                                  int g, int q, float (&cs)[BN / 32]) {
    static_assert(BN % 64 == 0, "whole groups of 4 x 16 columns");
    const bool bf16 = p.c_dtype == kBF16;
    const bool low_row = rows_left > g, high_row = rows_left > g + 8;   // rows g, g + 8 within M
#pragma unroll
    for (int k = 0; k < BN / 64; ++k) {   // columns 64k .. 64k + 63: four groups of 16
        float sum[2] = {0.f, 0.f};
#pragma unroll
        for (int i4 = 0; i4 < 4; ++i4) {
            const int j0 = 2 * (4 * k + i4), j1 = j0 + 1;   // the group's two 8-column chunks
            const float2 d = group_col_sums(bf16, low_row ? results[2 * j0] : 0u, low_row ? results[2 * j1] : 0u,
                                            high_row ? results[2 * j0 + 1] : 0u, high_row ? results[2 * j1 + 1] : 0u);
            if (q == i4) sum[0] = d.x, sum[1] = d.y;   // columns 16 i + g and 16 i + 8 + g
        }
        cs[2 * k] += sum[0];
        cs[2 * k + 1] += sum[1];
    }
}
// The column of tile lane (g, q)'s cs[2k + e] sums (add_warp_col_sums).
__device__ __forceinline__ int col_sum_column(int k, int e, int g, int q) { return 16 * (4 * k + q) + 8 * e + g; }

// A warp's running column sums over its block's tiles (kColSums where a block walks several
// tiles: a convolution's bsum per channel), kept in registers while the block stays in one
// column of tiles and moved to the warp's row of col_partials (`row`: tiles_n x BN floats,
// tiles_n <= 64) when it goes to another and at the end: stored the first time, added to after
// that by atomic reductions the warp does not wait for. Each entry has one writer, this thread,
// whose operations on one address keep their order: the same bits in every run. At the end the
// columns of tiles never visited get zeros, so that the host need not clear the rows. (A tile's
// sums over the warps would need shared memory and a barrier a tile; a row a warp and tile
// would write an eighth of C again.)
template <int BN>
struct WarpColSums {
    float cs[BN / 32] = {};
    int n = -1;   // the column of tiles in cs, or none
    uint64_t visited = 0;
    float* row;
    __device__ __forceinline__ void flush(int g, int q) {
        if (n < 0) return;
        const bool again = (visited >> n) & 1u;
        visited |= uint64_t(1) << n;
#pragma unroll
        for (int i = 0; i < BN / 32; ++i) {
            float* const slot = row + int64_t(n) * BN + col_sum_column(i / 2, i % 2, g, q);
            if (again) atomicAdd(slot, cs[i]);   // (a reduction without a result: the warp does not wait)
            else *slot = cs[i];
            cs[i] = 0.f;
        }
    }
    // The tile in column of tiles tile_n: its results' column sums (add_warp_col_sums), after
    // the sums so far are moved out if they are another column's.
    __device__ __forceinline__ void add(const GemmParams& p, const uint32_t (&results)[BN / 4], int rows_left, int g,
                                        int q, int tile_n) {
        begin(tile_n, g, q);
        add_warp_col_sums<BN>(p, results, rows_left, g, q, cs);
    }
    __device__ __forceinline__ void begin(int tile_n, int g, int q) {
        if (tile_n != n) flush(g, q);
        n = tile_n;
    }
    // Or pair by pair as round_pairs hands them out (after begin; the tile's results are not
    // held): pair (j, h) of column group j / 2, the group's sums added once its four are in.
    uint32_t group[4];
    __device__ __forceinline__ void add_pair(const GemmParams& p, int j, int h, uint32_t v, int rows_left, int g, int q) {
        group[2 * h + j % 2] = v;
        if (j % 2 == 0 || h == 0) return;
        const bool low_row = rows_left > g, high_row = rows_left > g + 8;
        const float2 d = group_col_sums(p.c_dtype == kBF16, low_row ? group[0] : 0u, low_row ? group[1] : 0u,
                                        high_row ? group[2] : 0u, high_row ? group[3] : 0u);
        const int i = j / 2;
        if (q == i % 4) cs[2 * (i / 4)] += d.x, cs[2 * (i / 4) + 1] += d.y;
    }
    __device__ __forceinline__ void finish(int tiles_n, int g, int q) {
        flush(g, q);
        for (int t = 0; t < tiles_n; ++t)
            if (!((visited >> t) & 1u))
#pragma unroll
                for (int i = 0; i < BN / 32; ++i) row[int64_t(t) * BN + col_sum_column(i / 2, i % 2, g, q)] = 0.f;
    }
};

// The block's 8 warp rows of col_partials (WarpColSums, each finished) added into its first, in
// warp order (the same bits in every run), so that the host adds a row a block rather than eight:
// by the two consumers' 256 threads, this one `i`.
template <int BN>
__device__ __forceinline__ void add_block_col_rows(const GemmParams& p, int i) {
    const int64_t width = int64_t(p.tiles_n) * BN;
    float* const rows = p.col_partials + int64_t(blockIdx.x) * 8 * width;
    __threadfence_block();
    asm volatile("bar.sync 1, 256;" ::: "memory");   // every warp's row is in
    for (int64_t col = i; col < width; col += 256) {
        float s = rows[col];
#pragma unroll
        for (int w = 1; w < 8; ++w) s += rows[w * width + col];
        rows[col] = s;
    }
}

// kColSums (LEAN == kGeneral only; a convolution's bsum per channel): col_s, (NTHREADS / 32) x BN
// floats of shared memory, collects each warp's column sums of the values as stored; their sum
// in warp order (the same bits in every run) goes to col_partials' row m0 / BM.
template <class T, int BM, int BN, int NTHREADS, int LEAN = kGeneral>
__device__ __forceinline__ void store_tile_16bit(const GemmParams& p, const float (&acc)[BN / 2], unsigned char* smem,
                                                 const float* bias_s, int m0, int n0, int tile_n, int z, int row0, int q,
                                                 int tid, float* row_sums, uint64_t* sums_in, int rows_begin = 0,
                                                 int rows_end = BM, float* col_s = nullptr) {
    constexpr int LD = BN + 8;   // 16-bit elements per staged row: rows 16 bytes apart in bank terms
    uint16_t* tile = reinterpret_cast<uint16_t*>(smem);
    // bsum: rows row0 and row0 + 8, whole (round_results) or this thread's share (BN > 128)
    float row_sum[2] = {0.f, 0.f};
    // C's dtype, the activation and bsum as template arguments (round_results): with them
    // tested per pair the executed code was several times longer, and this code runs once a
    // block, each instruction fetched from L2, where the warps stalled for instructions.
    // (The 256-wide tile keeps the per-pair tests: its 128 accumulators and the results beside
    // them would spill, and it runs the large products, where this is a small part.)
    if constexpr (BN <= 128) {
        uint32_t results[BN / 4];
        if constexpr (LEAN != kGeneral) {   // C of the operands' dtype, bsum known: only the activation varies
            constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>, kSums = LEAN == kLeanBsum;
            if (!(p.flags & kRelu)) round_results<kBf16, kActNone, kSums, BN>(p, acc, bias_s, q, results, row_sum);
            else if (p.slope == 0.f) round_results<kBf16, kActRelu, kSums, BN>(p, acc, bias_s, q, results, row_sum);
            else round_results<kBf16, kActLeaky, kSums, BN>(p, acc, bias_s, q, results, row_sum);
        } else {
            with_epilogue_choices(p, [&](auto bf16, auto act, auto sums) {
                round_results<bf16.value, act.value, sums.value, BN>(p, acc, bias_s, q, results, row_sum);
            });
        }
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<uint32_t*>(tile + (row0 + 8 * h) * LD + 8 * j + 2 * q) = results[2 * j + h];
    } else {
        const bool relu = p.flags & kRelu;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int col = 8 * j + 2 * q;
            const float2 b = *reinterpret_cast<const float2*>(bias_s + col);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float2 v = epilogue_pair(p, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], b, relu);
                const uint32_t w = pack2(v.x, v.y, p.c_dtype);
                *reinterpret_cast<uint32_t*>(tile + (row0 + 8 * h) * LD + col) = w;
                if (p.flags & kBsum) {   // the values as rounded; columns past N hold zeros (zero_columns_past_n)
                    const float2 r = unpack2(w, p.c_dtype);
                    row_sum[h] += r.x + r.y;
                }
            }
        }
    }
    // bsum: each row's sum from its quad's shares. With bsum_cluster they cross blocks before
    // the C stores below; otherwise they are added and stored after those, so that the
    // shuffles' latency hides behind the stores'.
    const auto finish_row_sums = [&] {
        // lane q < 2: row row0 + 8q
        const float s = BN > 128 ? quad_sum_pair(row_sum[0], row_sum[1], q) : (q & 1) ? row_sum[1] : row_sum[0];
        const int r = row0 + 8 * (q & 1), m = m0 + r;
        if (q < 2 && p.bsum_cluster) share_row_sum(p, row_sums, sums_in, r, s);
        else if (q < 2 && m < p.m && r >= rows_begin && r < rows_end) {
            if (p.tiles_n == 1) store_bsum(p, z, m, s);
            else p.bsum_partials[(int64_t(tile_n) * p.batch + z) * p.m + m] = s;
        }
    };
    if (LEAN != kLeanPlain && (p.flags & kBsum) && p.bsum_cluster) finish_row_sums();
    asm volatile("bar.sync 1, %0;" ::"n"(NTHREADS) : "memory");
    // bsum_cluster: this block's rows added (and their bsum stored) before its C stores, which
    // then overlap the last stores' latency (faster than after them on one-wave products).
    if (LEAN != kLeanPlain && p.bsum_cluster)
        add_owned_rows<BM>(p, row_sums - (int(blockIdx.x) % p.tiles_n) * BM, sums_in, m0, z, tid, NTHREADS);
    // Each row: BN / 8 chunks of 16 bytes, a lane per chunk (lanes past whole rows idle: 24-31
    // of the 96-wide tile's 12 chunks a row).
    constexpr int kChunks = BN / 8, kRowsPerPass = 32 / kChunks;
    const int warp = tid / 32, lane = tid % 32;
    // kHist: each warp counts the values it stores (the lean twins hold no counting code).
    uint32_t* const hist = LEAN == kGeneral && (p.flags & kHist) ? hist_begin(p, warp, lane) : nullptr;
    const int r_in = lane / kChunks, chunk = lane % kChunks;
    uint16_t* C = static_cast<uint16_t*>(p.c) + int64_t(z) * p.c_batch;
    const int n = n0 + 8 * chunk;
    // kColSums: this thread's rows' sums of its chunk's 8 columns
    const bool col_sums = LEAN == kGeneral && (p.flags & kColSums);
    float cs[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const int r_first = r_in < kRowsPerPass ? rows_begin + warp * kRowsPerPass + r_in : rows_end;
    for (int r = r_first; r < rows_end; r += (NTHREADS / 32) * kRowsPerPass) {
        const int m = m0 + r;
        if (m >= p.m) break;
        const uint4 v = *reinterpret_cast<const uint4*>(tile + r * LD + 8 * chunk);
        store_chunk_16bit(p, C + c_row(p, m), n, v);
        if (hist) hist_count_words<4>(p, hist, &v.x, p.n - n);
        if (col_sums) add_chunk(p, v, cs);
    }
    if (hist) hist_flush(p, hist, lane);
    if (col_sums) {
        // The lanes of a chunk added in the warp, then the warps' sums in warp order.
        warp_col_sums<BN>(cs, col_s, warp, lane);
        asm volatile("bar.sync 1, %0;" ::"n"(NTHREADS) : "memory");
        for (int col = tid; col < BN && n0 + col < p.n; col += NTHREADS) {
            float s = 0.f;
#pragma unroll
            for (int w = 0; w < NTHREADS / 32; ++w) s += col_s[w * BN + col];
            p.col_partials[int64_t(m0 / BM) * p.n + n0 + col] = s;
        }
    }
    if (LEAN != kLeanPlain && (p.flags & kBsum) && !p.bsum_cluster) finish_row_sums();
}

// A consumer's accumulators into the block's float32 tile in shared memory (rows tile_ld(BN)
// floats apart). Register 4j + r holds row row0 + 8 (r / 2), column 8j + 2q + r % 2.
template <int BN>
__device__ __forceinline__ void stage_accumulators(float* tile, const float (&acc)[BN / 2], int row0, int q) {
    constexpr int ld = tile_ld(BN);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        *reinterpret_cast<float2*>(tile + row0 * ld + 8 * j + 2 * q) = make_float2(acc[4 * j], acc[4 * j + 1]);
        *reinterpret_cast<float2*>(tile + (row0 + 8) * ld + 8 * j + 2 * q) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
}

// The epilogue of split-K in a cluster: the k_splits blocks of a tile (a cluster, one k slice
// each) stage their float32 sums in shared memory; block `rank` adds rows [rank R, rank R + R)
// of the tile (R = BM / k_splits) over the cluster's blocks in rank order (deterministic sums,
// the same in every run), reading the others' shared memory, and finishes those rows like the
// general epilogue (finish_tile: alpha, bias, activation, beta, stochastic rounding, bsum).
// No float32 slices cross global memory and no second kernel runs: with a separate reduction
// kernel, a split product ran well below an unsplit one of the same occupancy on the small-N
// shapes. k_splits is 2, 4 or 8 (the host's choice; splits of 3 run split_k_push_epilogue
// only).
// Used where split_k_push_epilogue (below) is not: tiles wider than kSplitPushMaxBn, beta,
// stochastic rounding, float32 C.
template <int BM, int BN, int NTHREADS, class Sync>
__device__ __forceinline__ void split_k_epilogue(const GemmParams& p, const float (&acc)[BN / 2], float* tile, int m0,
                                                 int n0, Tile at, int z, int row0, int q, int ctid, Sync sync) {
    constexpr int ld = tile_ld(BN);
    stage_accumulators<BN>(tile, acc, row0, q);
    cluster_sync();   // every block's sums are staged
    const int splits = p.k_splits, rank = int(blockIdx.x) % splits, rows = BM / splits;
    float* mine = tile + rank * rows * ld;
    const int base = split_rank_base(splits);
    uint32_t peers[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) peers[r] = cluster_peer_addr(mine, base + (r < splits ? r : 0));
    constexpr int kVecs = BN / 4;   // float4 columns per row
    for (int i = ctid; i < rows * kVecs; i += NTHREADS) {
        const int off = (i / kVecs) * ld + 4 * (i % kVecs);
        float4 v[8];
#pragma unroll
        for (int r = 0; r < 8; ++r)
            if (r < splits) v[r] = load_cluster_f4(peers[r] + 4 * uint32_t(off));
        float4 s = v[0];
#pragma unroll
        for (int r = 1; r < 8; ++r)
            if (r < splits) s.x += v[r].x, s.y += v[r].y, s.z += v[r].z, s.w += v[r].w;
        // Only this block adds these rows: the others read rows of their own here.
        *reinterpret_cast<float4*>(mine + off) = s;
    }
    sync();
    const int m_rows = m0 + rank * rows;
    switch (splits) {
        case 2: finish_tile<BM / 2, BN, NTHREADS>(p, mine, m_rows, n0, at.n, z, ctid); break;
        case 4: finish_tile<BM / 4, BN, NTHREADS>(p, mine, m_rows, n0, at.n, z, ctid); break;
        default: finish_tile<BM / 8, BN, NTHREADS>(p, mine, m_rows, n0, at.n, z, ctid); break;
    }
    // bsum over several tiles per row: each block of the cluster counts its share of the rows.
    bsum_across_tiles<BM>(p, m0, at.m, z, ctid, NTHREADS, sync);
    cluster_sync();   // the other blocks are done reading this one's shared memory
}

// Split-K in a cluster into 16-bit C without beta or stochastic rounding (kSplitPushMaxBn,
// gemm_params.hpp): the slices' sums cross blocks from registers. Block `rank` owns the 8-row
// groups [split_first_group(rank), split_first_group(rank + 1)) of the tile. A thread's
// accumulators are two row groups of 8 rows (rows row0 and row0 + 8, BN / 16 float4 values
// each); a group owned by another block is sent with st.async into that block's receive
// buffer, in a layout that mirrors the registers (slot [source][group][float4][lane], so that
// a warp's 16-byte stores and the owner's loads are 512 contiguous bytes), counted on the
// owner's `split_in` mbarrier. The owner waits on that barrier alone, adds its groups over the
// slices in rank order (the same bits in every run) in its registers and finishes its rows
// with the 16-bit register epilogue. No block waits for another to be done reading, and the
// receive buffer is not part of the stages, so a block sends as soon as its main loop ends.
// (The general split epilogue above, staging in float32, a cluster barrier, the others' rows
// read through distributed shared memory, finish_tile and a second barrier, took much longer
// than the unsplit 64 x 64 tile's epilogue.)
// The bytes block `rank` of a split receives: the other blocks' sums of its row groups.
template <int BM, int BN>
__device__ __forceinline__ uint32_t split_incoming_bytes(int splits) {
    const int rank = int(blockIdx.x) % splits;
    const int owned = split_first_group(BM / 8, splits, rank + 1) - split_first_group(BM / 8, splits, rank);
    return uint32_t(4 * (splits - 1) * 8 * owned * BN);
}
template <class T, int BM, int BN, int NTHREADS, int SPLITS, int LEAN, class Sync>
__device__ __forceinline__ void split_k_push_epilogue(const GemmParams& p, float (&acc)[BN / 2], unsigned char* smem,
                                                      const float* bias_s, float4* receive, uint64_t* split_in, int m0,
                                                      int n0, Tile at, int z, int c, int warp, int lane, int tid,
                                                      Sync sync) {
    constexpr int kVecs = BN / 16;                   // float4 values per row group per thread
    constexpr int kGroups = BM / 8;
    constexpr int kSlotGroups = split_first_group(kGroups, SPLITS, 1);   // the most groups a block owns
    constexpr uint32_t kSourceBytes = kSlotGroups * kVecs * 512;        // one source's slots
    const int rank = int(blockIdx.x) % SPLITS;
    const auto owner_of = [](int group) { return group * SPLITS / kGroups; };
    const auto slot_of = [&](int group) { return group - split_first_group(kGroups, SPLITS, owner_of(group)); };
    // The group's float4 v: columns 16v + 2q, + 1, 16v + 8 + 2q, + 1 of row row0 + 8h.
    const auto vec = [&](int v, int h) {
        return make_float4(acc[8 * v + 2 * h], acc[8 * v + 2 * h + 1], acc[8 * v + 4 + 2 * h], acc[8 * v + 5 + 2 * h]);
    };
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int group = 8 * c + 2 * warp + h, owner = owner_of(group);
        if (owner == rank) continue;
        const int source = rank < owner ? rank : rank - 1;
        const float4* slot = receive + ((source * kSlotGroups + slot_of(group)) * kVecs) * 32 + lane;
        const int peer = split_rank_base(SPLITS) + owner;
        const uint32_t to = cluster_peer_addr(slot, peer), bar = cluster_peer_addr(split_in, peer);
#pragma unroll
        for (int v = 0; v < kVecs; ++v) store_to_peer_f4(to + 512u * v, bar, vec(v, h));
    }
    // Every thread waits, whether it owns rows or not: the block stays until every byte sent
    // to it has landed.
    mbar_wait_cluster(split_in, 0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int group = 8 * c + 2 * warp + h;
        if (owner_of(group) != rank) continue;
        const uint32_t slots = smem_u32(receive + (slot_of(group) * kVecs) * 32 + lane);
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
            // The other blocks' sums (source i: block i, or i + 1 from this block's rank on),
            // then all of them added in rank order.
            float4 in[SPLITS - 1];
#pragma unroll
            for (int i = 0; i < SPLITS - 1; ++i) in[i] = load_shared_f4(slots + kSourceBytes * i + 512u * v);
            const float4 own = vec(v, h);
            const auto term = [&](int r) { return r < rank ? in[r] : r == rank ? own : in[r - 1]; };
            float4 sum = term(0);
#pragma unroll
            for (int r = 1; r < SPLITS; ++r) {
                const float4 t = term(r);
                sum.x += t.x, sum.y += t.y, sum.z += t.z, sum.w += t.w;
            }
            acc[8 * v + 2 * h] = sum.x, acc[8 * v + 2 * h + 1] = sum.y;
            acc[8 * v + 4 + 2 * h] = sum.z, acc[8 * v + 5 + 2 * h] = sum.w;
        }
    }
    const int g = lane / 4, q = lane % 4;
    if (LEAN != kLeanPlain && (p.flags & kBsum)) zero_columns_past_n<BN>(acc, p.n - n0, q);
    store_tile_16bit<T, BM, BN, NTHREADS, LEAN>(p, acc, smem, bias_s, m0, n0, at.n, z, 64 * c + 16 * warp + g, q, tid,
                                                nullptr, nullptr, 8 * split_first_group(kGroups, SPLITS, rank),
                                                8 * split_first_group(kGroups, SPLITS, rank + 1));
    if constexpr (LEAN != kLeanPlain) bsum_across_tiles<BM>(p, m0, at.m, z, tid, NTHREADS, sync);
}

// bsum_cluster (above) after the general epilogue: finish_tile left the tile's row sums in
// this tile's slot; they are sent from there. (The 16-bit epilogue sends them from registers
// and adds its own rows itself.)
template <int BM, class Sync>
__device__ __forceinline__ void bsum_across_cluster(const GemmParams& p, float* gathered, uint64_t* sums_in, int m0, int z,
                                                    int ctid, int nthreads, Sync consumers_sync) {
    const int tiles = p.tiles_n, rank = int(blockIdx.x) % tiles;
    consumers_sync();   // this tile's row sums are in gathered[rank]
    for (int r = ctid; r < BM; r += nthreads)
        if (r % tiles != rank) store_to_peer(gathered + rank * BM + r, sums_in, r % tiles, gathered[rank * BM + r]);
    add_owned_rows<BM>(p, gathered, sums_in, m0, z, ctid, nthreads);
}

} // namespace kiln::gemm
