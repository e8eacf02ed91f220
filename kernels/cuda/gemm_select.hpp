// The GEMM kernel selector: which precompiled kernel, and which tile, runs a problem.
//
// Rules, in order (each a consequence of what the kernels can address and how fast they run;
// docs/gemm.md's design rules give each one's measured effect):
//  1. Paths. On sm_90 with the sm_90a image built, 16-bit operands (and float32 when the context
//     allows tf32) run the wgmma kernels when TMA can address both operands: a contiguous
//     dimension, 16-byte aligned base, other strides multiples of 16 bytes. tf32 there also needs
//     both operands K-major, except in two cases: with A K-major and B N-major (the plain
//     row-major product) the persistent kernel that loads B's tile into registers (wgmma's
//     register operand takes any layout) runs products of more than one wave of its 256 x 128
//     tiles into float32 C; with A M-major and B K-major the one-tile kernels 64 x 64, 128 x 64
//     and 64 x 16 that load A's fragments into registers (the tk kernels) run it; otherwise the
//     operand is copied to K-major first (rule 5; the launcher lets A M-major through
//     registers on products up to 256 wide, copying B K-major where it is not). Otherwise 16-bit and tf32 run the portable mma.sync kernels (any
//     layout), and exact float32 runs the FMA kernels (128x128 tiles; 256x16 for narrow N):
//     through cp.async where fma_async_ok accepts the operands (rows contiguous: A M-major, B
//     N-major; rule 5 copies them so where that pays), otherwise staged through registers.
//     Where tf32 is allowed but wgmma cannot run, products at most 16 columns wide run the
//     exact narrow FMA kernel before mma.sync tf32 (faster there: mma.sync's tiles are mostly
//     empty at that width).
//  2. Tile. Among a path's tiles, the one with the best estimated time: each tile has a relative
//     per-SM rate (bigger tiles reuse more data per byte loaded), scaled by how evenly its blocks
//     fill the waves over the SMs and by the fraction of each block that lies inside C. This is
//     neon's "min(M, N) mod tile and SM count" rule made quantitative, and it is what makes small
//     N (16..128) shapes pick narrow tiles that keep every SM streaming A: 64 x 16 and 64 x 64
//     tiles with one consumer warpgroup, and 128 x 64 with two where the 64 x 64 tiles would
//     take twice the waves. The 64-wide tiles' pace is the bytes their SM receives, so each of
//     several waves costs a whole block's time: their rate drops by a factor with more blocks
//     than SMs, which hands such products to the 128 x 128 tile where it fills one wave.
//     The persistent wgmma kernel (one block per SM walking the tiles; the next tile's loads
//     and this one's TMA stores overlap the consumers' work) runs products of more than one
//     wave of 128x256 tiles into C that TMA can store (16-bit operands; tf32 into float32 C),
//     with alpha, bias, ReLU and bsum (no beta, no stochastic rounding). Its rate is 1.02 of
//     the one-tile-per-block kernel's: its tensor cores do not stop for each tile's epilogue
//     and the next tile's first loads.
//     The estimate is a time: the product's flops (k in whole k-tiles on wgmma) at the tile's rate
//     times fill times the inside fraction (peak 700 TFLOP/s for 16-bit operands, 350 for float32),
//     plus, on k-loops of at most 8 k-tiles (the rates were fitted on long ones, which fold these
//     in), the wgmma kernels' fixed costs: a one-tile kernel's per wave (pipeline fill, epilogue, a
//     block's start; more through the general epilogue), the persistent kernel's per tile (smaller:
//     its producer runs ahead across tiles), which send products of a k-tile or two over many waves
//     (a first convolution layer's, a 1x1 convolution's over 64 channels) to the persistent kernel
//     despite its 256-wide tile; plus the fixed cost of a split (rule 3).
//  3. Split-K. When a tile's blocks would leave more than half of the SMs idle (small M and N,
//     long K: 1760x16x1760, 512x8x500000), k is cut into slices that run as separate blocks,
//     in one of two ways, each a candidate beside the unsplit tile:
//     - in a cluster (wgmma one-tile kernels but the 128 x 64 tile, any batch): the 2, 3 or 4
//       blocks of a tile form a thread block cluster and add their sums through distributed
//       shared memory, each finishing a share of the tile's rows; at most one block per SM,
//       at least 2 k-tiles per slice, 3 only where the sums cross in registers (tiles up to
//       64 wide, 16-bit C without beta or stochastic rounding). Fixed cost: cluster_split_us,
//       growing with the tile's size.
//     - as global slices (every path, unbatched products): up to one block per SM and 64
//       slices, at least 4 k-tiles per slice; the slices' float32 sums are added by a
//       precompiled reduction kernel that applies the epilogue. Fixed cost: a second launch
//       and the slices' bytes written and read.
//  4. KILN_GEMM_KERNEL=<entry name> forces a kernel (benchmarks, tests); it must fit rule 1.
//     KILN_GEMM_SPLITS=<n> forces the number of global k slices (1: none), <n>c a cluster
//     split of n = 2, 3, 4 or 8 blocks (only the wgmma one-tile kernels then split, and by 3
//     only where rule 3 allows it; elsewhere they run unsplit).
//  5. Operand copies: copy_pays, below; for exact float32, fma_copy_pays.
//  6. Raster. Consecutive blocks walk down groups of 8 rows of tiles (L2 reuse across waves),
//     except in one wave of the wgmma one-tile kernels that no cluster launch groups:
//     one_wave_raster_group, below. The persistent kernels' grid keeps those groups aligned
//     with the SMs' groups of 8 in every round of tiles: persistent_grid, below.
//  7. Lean twins. The wgmma one-tile kernels up to 128 wide run a twin built for the plain
//     epilogue alone (entry + "_lean", or "_lean_bsum" with bsum; gemm_sm90.cu) where the
//     product allows it: 16-bit C of the operands' dtype, rows 16-byte aligned, no beta or
//     stochastic rounding, and no split but one in a cluster whose sums cross in registers;
//     the persistent kernels into 16-bit C of the operands' dtype likewise.
//     Same arithmetic, same bits; a tenth of the code, which a one-wave product fetches from
//     L2 as it runs, so the twin is faster (the persistent kernels' twins too, by less).
//     KILN_GEMM_LEAN=0 turns it off.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::gemm {

enum class GemmPath { Wgmma, Mma, Fma };

struct GemmProblem {
    int64_t m = 0, n = 0, k = 0, batch = 1;
    int dtype = 0;          // GemmDType of the operands
    bool tf32 = false;      // float32 operands may use tf32 tensor cores
    bool a_kmajor = false;  // A's k stride is 1
    bool b_kmajor = false;  // B's k stride is 1
    bool a_tma = false;     // TMA can address A (either majorness)
    bool b_tma = false;
    int sm = 0;             // compute capability * 10
    int sms = 0;            // multiprocessors
    bool have_sm90a = false;
    bool may_split = false; // split-K allowed (unbatched, rank-2 C)
    bool plain_epilogue = false;  // C that TMA can store; no beta, no stochastic rounding
    bool c_f32 = false;           // C is float32
    bool bsum = false;            // the row sums are asked for
};

struct GemmKernel {
    GemmPath path = GemmPath::Fma;
    std::string entry;      // the kernel's symbol
    int bm = 0, bn = 0;     // tile
    int threads = 0;
    int smem = 0;           // dynamic shared memory, bytes
    bool a_trans = false, b_trans = false;   // wgmma: the operand is M/N-major
    int bk = 0;             // k per pipeline stage
    int splits = 1;         // split-K slices
    bool cluster_k = false;   // the slices of a tile are one cluster (rule 3), not global slices
    bool persistent = false;  // one block per SM walks the tiles (grid: min(tiles, SMs))
    bool b_in_registers = false;  // tf32 with B N-major: B's tile is wgmma's register operand (rule 1)
    double lone_block_rate = 1;  // rule 2: its rate's factor below two blocks per SM
    double waves_rate = 1;       // rule 2: its rate's factor with more blocks than SMs
    double score = 0;       // the selector's estimate: 1 / estimated microseconds (relative)
};

// "<entry>", "<entry> k/<n>" (global slices) or "<entry> k/<n> cluster": logs, the autotuner's
// disk cache, the benchmark's "kernel chosen".
std::string describe(const GemmKernel& k);

// Rule 5, operand copies (the launcher makes them): whether copying an operand of `bytes`
// bytes into a buffer with rows 128 bytes apart pays, for a product of `flops`. An operand the
// wgmma kernels cannot read (`readable` false: TMA cannot address it, or tf32 needs it
// K-major) is copied when the copy and the wgmma product (700 TFLOP/s) take less than the
// product on the portable kernels (kPortableRate: mma.sync and the narrow FMA tile run far
// below the wgmma kernels, so the copy pays on all but small products).
// A readable one whose rows along M or N do not start on 32-byte sectors (`mn_unaligned`: each
// 128-byte row of a TMA box then spans five sectors, and the product slows) when the copy
// costs less than kUnalignedRowsCost of the product. The copy reads and writes the operand at
// 3 TB/s after a launch of about 3 us.
// KILN_GEMM_COPY=always|never overrides.
inline constexpr double kUnalignedRowsCost = 0.35;
inline constexpr double kPortableRate = 15e12;
bool copy_pays(bool readable, bool mn_unaligned, double bytes, double flops);
// Whether rows `row_stride` bytes apart from `base`, in batch entries `batch_stride` bytes
// apart, do not all start on 32-byte sectors (rule 5's `mn_unaligned` for an M- or N-major
// operand).
bool rows_off_sectors(uintptr_t base, int64_t row_stride, int64_t batch_stride);

// Rule 1's condition for the FMA kernel that copies operands with cp.async
// (kiln_gemm_fma_f32_tt_128x128): A M-major and B N-major (rows contiguous), both with TMA's
// alignment (16-byte aligned base and strides), so that its 16-byte copies are aligned.
bool fma_async_ok(const GemmProblem& pr);

// Rule 5 for exact float32: whether copying operands of `bytes` bytes in all into the layout
// fma_async_ok asks for pays, for a product of `flops`: when the copies (read and written at
// 3 TB/s after ~3 us of launch) take under 5% of the product at 45 TFLOP/s. The cp.async
// kernel is faster than the register-staged one on large products, where a copy costs a
// small part of the product; on small products the copies cost more than they gain.
// `element_loads`: the register-staged kernel would read an operand element by element (not
// 16-byte aligned), which is far slower; then the copies pay when they take less than the
// product at 10 TFLOP/s.
// KILN_GEMM_COPY=always|never overrides.
bool fma_copy_pays(double bytes, double flops, bool element_loads = false);

// Rule 6: the raster's group height (gemm_common.cuh, tile_of: consecutive blocks walk down
// groups of this many rows of tiles) for a grid of tiles_m x tiles_n tiles of bm x bn that runs
// in one wave. The block scheduler places consecutive blocks of such a grid on neighbouring
// SMs (blocks 8j .. 8j + 7 on 8 SMs of one GPC), and 8 blocks there stream faster the fewer
// distinct rows of A and columns of B they read together: on a grid of 128 x 64 tiles 4 wide,
// groups of 2 (8 blocks: 2 rows of A, 4 columns of B) beat groups of 8 (8 rows of A, one
// column of B). The group, of 8, 4, 2 and 1 (ties to the larger), is the one whose
// windows of 8 consecutive blocks read the fewest bytes per k: distinct rows of tiles x bm +
// distinct columns x bn, over every window of the grid.
int one_wave_raster_group(int bm, int bn, int64_t tiles_m, int64_t tiles_n);

// Rule 6 for the persistent kernels: their grid for `tiles` tiles (batches folded in) on `sms`
// SMs. One block per SM, but a multiple of 8 blocks where that takes as many rounds of tiles
// (ceil(tiles / grid)). A plain launch puts each 8 consecutive blocks on one group of 8 SMs of
// a GPC, and the walk (tile t, t + grid, ...) through raster groups of
// 8 rows then keeps a group's blocks on one column of tiles, reading the same k-tiles of B
// together, in every round; with 132 blocks only the first round does, so the aligned grid
// is the faster one.
int64_t persistent_grid(int64_t tiles, int64_t sms);
// A persistent kernel's dynamic shared memory (sm90/persistent.cuh) for BM x BN tiles of 16-bit
// operands: 4 stages, each consumer's two buffers of staged results (2 x 8 KB), the bias twice,
// the barriers (256 bytes at most) and the adder's row sums (BM floats); no alignment slack:
// 227 KB would not hold it (the kernel checks that its shared memory starts 1024-byte aligned).
constexpr int persistent_smem(int bm, int bn) { return 4 * (bm + bn) * 128 + 2 * (64 * 128 * 2) + 2 * 256 * 4 + 256 + bm * 4; }

// Rule 7: whether the lean twins may run (KILN_GEMM_LEAN is not "0").
bool lean_kernels_allowed();

// Every kernel that can run `pr`, best first by the rule-2 estimate.
std::vector<GemmKernel> gemm_candidates(const GemmProblem& pr);
// The kernel that runs `pr` (the first candidate, or KILN_GEMM_KERNEL's).
GemmKernel select_gemm(const GemmProblem& pr);

} // namespace kiln::gemm
