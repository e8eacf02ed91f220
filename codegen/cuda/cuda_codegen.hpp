// CUDA C for one kernel stage, rendered from the kernel IR (compiler/kernel_ir.hpp).
//
// The source is self-contained: it includes no header at all (16-bit float conversions are
// written out as bit manipulation), so that NVRTC spends its time on the kernel, not on parsing
// the CUDA headers. Every entry point is `extern "C"`, so its name is the kernel's name.
//
// ---- Kernel parameters
//
// Each entry point takes one struct `Args` by value, followed by `scratch` and
// `param` (below). With R = max(rank, 1), B = number of buffers, S = max(B * rank, 1),
// NF = max(num_fparams, 1), NI = max(num_iparams, 1):
//
//     struct Args {                      // byte offset
//         long long sizes[R];            // 0                      domain sizes
//         void*     buf[B];              // 8*R                    base pointers (view offset applied)
//         long long strides[S];          // 8*(R+B)                [buffer * rank + dim], in elements
//         float     fp[NF];              // 8*(R+B+S)              fparams
//         int       ip[NI];              // 8*(R+B+S) + 4*NF       iparams
//         unsigned* hist;                // the end of ip rounded  with a kir::Hist only: its
//                                        // up to 8                counters (LaunchArgs::hist)
//     };                                 // sizeof: the end of the last member rounded up to 8
//
// Unused padding slots (rank 0, no params) are zero. `pack_cuda_args` writes exactly these
// bytes; `cuda_args_layout` gives the offsets. With cuLaunchKernel, kernelParams[0] points at
// the packed bytes. Every stride is passed, even those the layout marks 0 or 1 (the code
// uses the constant instead), so the struct depends only on rank, buffers and param counts.
//
// ---- Entry points and launch configuration (`plan_cuda_launch` computes it)
//
// Every entry point has the signature NAME(const Args a, unsigned char* scratch, int param):
// `scratch` is device memory of CudaLaunchPlan::scratch_bytes (null when 0) and `param` is
// CudaLaunch::param. Blocks are 1-D. Every kernel loops grid-stride over its work, so any grid
// size >= 1 is correct; the plan's grid sizes are only for speed (mostly one trip per thread,
// so the grid-stride loops are not unrolled: their copies cost compile time and nothing
// else). The kernel shape follows from
// the kernel IR (never from sizes, so one compiled module serves every size):
//   - elementwise (no reduced dim), one entry NAME: one thread per point of the flattened
//     domain. A rank-1 kernel whose buffers are all contiguous or broadcast scalars also has a
//     vector path, taken at run time when every contiguous buffer is 16-byte aligned: each
//     thread moves V elements (16 bytes of the widest contiguous buffer) with one load/store
//     per buffer, and the grid has a thread per V elements.
//   - row reduction (reduced dims contiguous in memory, or no buffer contiguous along a
//     parallel dim), one entry NAME, param = G, the threads per row (a power of two): a row is
//     reduced by a segment of a warp (G < 32), a group of warps (G <= block size) or a whole
//     cluster of blocks (G > block size, sm_90: the block's partial results meet through
//     distributed shared memory: each block sends its partial to every block with st.async,
//     counted by the receiver's mbarrier, so a reduction costs no cluster-wide barrier; two
//     buffers used in turn, one cluster barrier after the mbarriers' initialisation and one at
//     the end). A buffer that several passes load (the mean, then the
//     variance, then the normalised output) is kept in dynamic shared memory, in its storage
//     dtype, by the first pass when the launch provides enough (shared_bytes: the planner
//     grows the cluster until a block's part leaves room for a second block), so the row is
//     read from memory once; without it every pass re-reads the row.
//     Every pass moves a row in groups of V consecutive elements per thread (V * the widest
//     loaded element = 16 bytes), one load or store per buffer and group, several groups per
//     step, then single groups: thread slot r holds element r + h (wrapped past the row's
//     end), h being the elements before the row's first group boundary, so that the groups
//     of a misaligned row are aligned too; a pass whose buffers are not all in that phase
//     goes element by element. What does not vary along the row (parameters, earlier
//     results, loads broadcast along it) is computed once per row, before the pass's loop.
//     Row entries are compiled for two blocks of kCudaMaxRowBlock per multiprocessor (64
//     registers a thread; NAME_r past a warp for detail::row_register_blocks of them). A
//     later pass that only sums squared deviations from a value known before it (a variance)
//     is folded into the first pass (detail::row_folds says when): the first pass also keeps
//     each thread's count, mean and sum of squared deviations (a step's values as one group,
//     merged by Chan et al.'s update), the row's threads merge them in a fixed order,
//     together with the first pass's sum of the same values if it has one, and the sum is
//     M2 + n (mean - k)^2. A later pass that only sums exp(v - max(v)) with the
//     max the first pass's (softmax's denominator) is folded likewise: a running max m and s =
//     sum of exp(v - m), rescaled as m grows, merged in the first pass's round, which then also
//     gives the max.
//     Kernels that qualify (detail::row_register_entry: cached buffers read in groups, at most 32
//     bytes a group of them) also have an entry NAME_r (no folds: each folded sum takes a round
//     there; with a folded sum of exponentials, only planned for rows of up to 32 threads), taken when
//     cuda_launch_aligned holds, with the launch's aligned_param as G, its aligned_grid and
//     aligned_block and no dynamic shared memory: a thread's groups of the cached buffers
//     (detail::kRowRegisterGroups at most) live in registers, the first pass that reads one
//     loads all of its groups before it works through them, the later passes read the
//     registers, a group at a time; no folds (a variance takes its own round).
//     Every row kernel also has an entry NAME_s, taken instead of NAME by launches of at most
//     kCudaSmallRowElements elements (G at most a block): thread t of a row takes elements t,
//     t + G, ... one at a time; no row cache (later passes read the row again) and no folds.
//   - column reduction (some buffer contiguous along a parallel dim and none along a reduced
//     one), entry NAME: a block is detail::column_width parallel points (128 bytes of the narrowest
//     loaded dtype) x the slices of the reduced points that make 256 threads; the
//     slices meet in shared memory in a fixed order. When the kernel's only Loop block is its
//     first (detail::column_splittable), param = S, the chunks the reduced points are split
//     into: block b reduces chunk b % S of column block b / S. S = 1 runs the Point blocks at
//     once; S > 1 writes record (column * S + chunk) of `scratch` (the full reduction's record
//     layout, below). Up to detail::kColumnCombineChunks chunks the block then counts the
//     chunk in word (column block) of the fourth parameter, `counters`; the block that counts
//     a column block's last chunk sets the word back to zero, combines its columns' records
//     (256 / column_width threads a column: thread s those of chunks s, s + 256 / width, ... in
//     order, then the column's threads in a fixed tree) and runs the Point blocks. With more
//     chunks a second entry NAME_final, param = S, a warp per column, combines a column's
//     records (lane l those of chunks l, l + 32, ... in order, then the lanes in a fixed tree)
//     and runs the Point blocks. S follows from the sizes alone (enough chunks for about
//     kColumnTargetBlocks blocks), never from the device. Otherwise param is unused; a
//     splittable kernel's entries take the fourth parameter all the same.
//     Kernels that qualify (detail::column_vector_width: V > 1) also have an entry NAME_v with
//     the same blocks, grid and param, whose threads each take V adjacent points of the
//     innermost parallel dim (a block: column_width / V threads across x 256 / that slices),
//     reading a buffer contiguous along it V elements at a time; a launch takes it when
//     cuda_launch_aligned holds. It combines the slices of a column in the same fixed way, over
//     more slices, so a column's bits follow from the sizes and the buffers' alignment.
//   - full reduction (Kernel::full_reduce), entry NAME, param = num_partials, grid =
//       num_partials: block b reduces the b-th contiguous chunk of ceil(points / num_partials)
//       points of the flattened R space into record b of `scratch` and counts itself in word 0
//       of its fourth parameter, `counters`; the block that counts the last sets the word back
//       to zero, combines the records in a fixed order (deterministic) and runs the Point block.
//       A record is S * accums.size() bytes; accumulator i sits at byte S*i: its value at +0,
//       its i32 position at +S/2; S = 8, or 16 when some accumulator holds a 64-bit value. num_partials = clamp(ceil(points /
//       kCudaPointsPerPartial), 1, kCudaMaxPartials), independent of the device, so a result
//       does not depend on which GPU computed it.
// Every reduction combines in an order fixed by the sizes, the plan and (rows, columns) the
// buffers' alignment alone: the same inputs at the same addresses give the same bits on every run. A grid of 0 (an empty domain) means: launch nothing.
//
// Runtime contract: launch the plan's launches in order on one stream, with exactly their
// block, their dynamic shared memory (raise CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES of
// row entries to CudaDeviceCaps::max_shared first) and, when cluster > 1, a cluster of that
// many blocks (cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION); a launch whose
// aligned_entry cuda_launch_aligned admits for the call runs that entry instead, with the
// launch's aligned_grid, aligned_block and aligned_param, no cluster and no dynamic shared memory.
//
// ---- Modules (what the runtime compiles and loads together)
//
// A row kernel's entries are compiled one at a time, when a launch first takes one, each
// specialised for the reach of that launch's G (CudaReach, set by the plan): a row entry's
// code for clusters (the exchange, its barriers) and for blocks (the warps' barriers) is half
// its compile time or more, and most launches need neither. The reductions' template argument
// leaves out the steps past the reach; nothing else differs, so every reach gives the same
// bits. NAME_s's module is compiled for compile time (CudaSource::fast_compile). Every other
// kernel is one module: its plans launch all of its entries together.
#pragma once
#include "compiler/kernel_ir.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::codegen {

inline constexpr int kCudaBlockSize = 256;        // elementwise, column and full-reduction kernels
inline constexpr int kCudaMaxRowBlock = 512;      // row kernels: the largest block
// Row kernels: a row takes at most a portable cluster (8 blocks), and up to kCudaMaxCluster
// (sm_90's non-portable limit) only where that lets its blocks cache it in shared memory.
inline constexpr int kCudaPortableCluster = 8;
inline constexpr int kCudaMaxCluster = 16;
// Row kernels: a launch of at most this many elements (rows x row length) takes the small entry
// NAME_s. Such a launch lasts a few microseconds however its rows are walked (its start and its
// reduction's steps dominate), so what matters is the first call's compile: NAME_s goes element
// by element, without row cache or folds, in 32-bit index arithmetic (a launch whose offsets
// do not fit takes NAME), and compiles in 40% of NAME's time or less.
inline constexpr int64_t kCudaSmallRowElements = int64_t(1) << 16;
// The small entry's threads of a row stay within a warp while each walks at most this many
// elements of it.
inline constexpr int64_t kCudaSmallLaneElements = 4;
inline constexpr int64_t kCudaMaxGrid = 65536;
inline constexpr int64_t kCudaPointsPerPartial = 4096;
inline constexpr int64_t kCudaMaxPartials = 1024;
// Grid-stride kernels (elementwise here; pooling, LRN and im2col among the precompiled ones)
// launch at most kGridStrideWaves waves of the blocks the GPU holds at once and loop over the
// rest. A block per 256 vectors makes every block load, then compute, then store in step with
// the blocks that started beside it, so that the memory system idles while they compute
// (16-bit kernels with a transcendental or per-channel vectors stay far from the copy rate
// so); blocks that loop fall out of step and overlap the two. Several waves rather than one
// keep the pure-bandwidth kernels, which a single resident wave slows by its loop, near their
// best, and leave any partial last wave a small share.
inline constexpr uint32_t kGridStrideWaves = 8;

enum class CudaShape : uint8_t { Elementwise, Row, Column, Full };
CudaShape cuda_shape(const kir::Kernel& k);
const char* cuda_shape_name(CudaShape s);

struct CudaSource {
    std::string code;
    std::vector<std::string> entry_points;   // every entry; a plan launches some of them, in this order
    // Compile for compile time (NVRTC's -Ofc=mid where it has it): the small row entry's
    // module, whose launches are a few microseconds however the code is optimised.
    bool fast_compile = false;
};

// How far a row kernel's threads of one row reach (its launches' G): a segment of a warp, a
// block, or a cluster of blocks. A row entry compiled for a reach keeps only the reduction
// steps that reach needs (no block barriers within a warp, no cluster exchange within a
// block); Cluster is the general entry, correct for every G. The value is the prelude's
// template argument for it (0 a warp, 1 a block, 2 a cluster).
enum class CudaReach : uint8_t { Warp, Block, Cluster };
const char* cuda_reach_name(CudaReach r);

// A module: the entries the runtime compiles and loads together. Row kernels have one per
// entry and reach (a call compiles only the entry its launch takes, specialised for its G);
// every other kernel has one holding all of its entries (entry empty), all of which its plans
// launch together.
struct CudaModuleId {
    std::string entry;
    CudaReach reach = CudaReach::Cluster;
    bool operator==(const CudaModuleId&) const = default;
};
// Every module a kernel's plans may ask for (what kiln-warmup compiles), the general first.
std::vector<CudaModuleId> cuda_modules(const kir::Kernel& k);
// The module that holds `entry` for a launch of reach `reach`.
CudaModuleId cuda_module_of(const kir::Kernel& k, const std::string& entry, CudaReach reach);
// A label for logs and saved sources (also a file name), e.g. "kiln_0123_r.warp" or "kiln_0123".
std::string cuda_module_label(const kir::Kernel& k, const CudaModuleId& m);

// Throws InternalError for a Kernel that breaks the rules of kernel_ir.hpp. The source is the
// same for every architecture (sm_90-only paths are guarded by __CUDA_ARCH__). emit_cuda gives
// every entry, general (what CI compiles); emit_cuda_module one module's.
CudaSource emit_cuda(const kir::Kernel& k);
CudaSource emit_cuda_module(const kir::Kernel& k, const CudaModuleId& m);

// Static shared memory an entry point of k keeps for its histogram (kir::Hist), beside the 1 KiB
// below CudaDeviceCaps::max_shared that the other static arrays stay within.
size_t cuda_hist_shared_bytes(const kir::Kernel& k);

// Byte offsets of the Args struct's members (see above) and its size.
struct CudaArgsLayout {
    size_t sizes = 0, buffers = 0, strides = 0, fparams = 0, iparams = 0, total = 0;
    size_t hist = 0;   // with a kir::Hist only
};
CudaArgsLayout cuda_args_layout(const kir::Kernel& k);

// The Args struct's bytes for one launch. Throws InternalError when `a` does not match `k`.
std::vector<uint8_t> pack_cuda_args(const kir::Kernel& k, const kir::LaunchArgs& a);
// The same into `out`, reusing its memory (the launch path calls it on every launch).
void pack_cuda_args(const kir::Kernel& k, const kir::LaunchArgs& a, std::vector<uint8_t>& out);

// What the plan needs to know about the device.
struct CudaDeviceCaps {
    int sm = 80;                 // compute capability * 10; clusters need >= 90
    int multiprocessors = 108;
    size_t max_shared = 48 * 1024;   // dynamic shared memory a row kernel may be given
    int max_cluster = kCudaMaxCluster;   // blocks a row kernel's cluster may have (sm_90 on)
    // Small row launches take NAME_s (kCudaSmallRowElements); KILN_SMALL_ROWS=0 turns that off, so
    // that small tests reach the general entries.
    bool small_rows = true;
};

struct CudaLaunch {
    std::string entry;
    uint32_t grid = 0;     // blocks (gridDim.x), a multiple of `cluster`; 0: nothing to launch
    uint32_t block = kCudaBlockSize;
    uint32_t cluster = 1;  // blocks per cluster
    int param = 0;         // the entry's `param`
    size_t shared_bytes = 0;   // dynamic shared memory
    // When nonzero, the grid is at most this many waves of the blocks the GPU holds at once (the
    // backend asks the driver's occupancy for the entry; of a cluster launch, how many clusters
    // fit at once); the kernel's grid-stride loop does the rest.
    uint32_t max_waves = 0;
    // When set, the entry launched instead of `entry` when cuda_launch_aligned holds for the
    // call's arguments (a plan follows from the sizes, the alignment of the buffers from each
    // call), with its own grid, block and param, no cluster and no dynamic shared memory.
    std::string aligned_entry;
    int aligned_width = 0;
    uint32_t aligned_grid = 0, aligned_block = 0;
    int aligned_param = 0;
    // Row kernels: the reach of `entry`'s and `aligned_entry`'s G (the module each is loaded from).
    CudaReach reach = CudaReach::Cluster, aligned_reach = CudaReach::Cluster;
};

struct CudaLaunchPlan {
    std::vector<CudaLaunch> launches;   // in order, same entries as CudaSource::entry_points
    size_t scratch_bytes = 0;           // device scratch the entries share (full reductions)
    // Words of zeroed device memory the entries count in, passed as their fourth parameter
    // (full reductions, column reductions of few chunks): zero before the launch, and set back
    // to zero by it.
    size_t counters = 0;
    int num_partials = 0;               // full reductions
    int threads_per_row = 0;            // row reductions: G
    // The small row entry, whose offsets are 32-bit: the plan holds for other arguments of the
    // same sizes only where cuda_offsets_fit_32 holds for them too (a view of the same sizes may
    // reach further).
    bool offsets_32 = false;
};
CudaLaunchPlan plan_cuda_launch(const kir::Kernel& k, const kir::LaunchArgs& a, const CudaDeviceCaps& dev);
// Whether every element offset launch `a` of `k` forms fits in 32 bits, as the small row entry's
// index arithmetic needs: per buffer, the sum over dimensions of (size - 1) x |stride| (broadcast
// dimensions left out) below 2^31; false where a's strides are not given.
bool cuda_offsets_fit_32(const kir::Kernel& k, const kir::LaunchArgs& a);
// One line per launch of the plan, for KILN_LOG=debug.
std::string describe(const CudaLaunchPlan& plan);
// Whether launch `l` may take its aligned_entry for arguments `a`: groups of aligned_width
// points along the innermost parallel dim (row kernels: the reduced dim) lie whole inside it,
// and every buffer contiguous along it starts each group on a boundary of aligned_width
// elements; for a row kernel, also that the row fits its register entry at aligned_param
// threads.
bool cuda_launch_aligned(const kir::Kernel& k, const kir::LaunchArgs& a, const CudaLaunch& l);

} // namespace kiln::codegen
