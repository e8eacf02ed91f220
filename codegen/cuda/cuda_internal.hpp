// Pieces the CUDA C renderer's files share; not part of codegen's interface.
#pragma once
#include "codegen/cuda/cuda_codegen.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::codegen::detail {

// Device helpers every generated kernel starts with: 16-bit float conversions written out as
// bit manipulation (bit-for-bit those of ir/half.hpp) and NaN-propagating min/max.
extern const char* const kCudaPrelude;
// Each part below only where a kernel's module calls it, since NVRTC's front end parses all of
// it (a small row entry's module: 44 KB with every reduction part, 28 KB with its own).
// The accumulator kinds, the warp and block reductions and a block's arrival at a grid-wide
// counter, for kernels with accumulators (every reduction shape; an elementwise kernel's
// single-point Loop blocks).
extern const char* const kCudaReducePrelude;
// A step's values of a max, min or arg kind at once, for row kernels' grouped steps.
extern const char* const kCudaStepPrelude;
// The slices of a block's columns combined, for column kernels.
extern const char* const kCudaColumnPrelude;
// Moments (count, mean, M2) merged by Chan's update, across a column kernel's slices and a
// warp's lanes: for kernels with Moments folds.
extern const char* const kCudaMomentsPrelude;
// The row kernels' shared-memory and global words and the row groups' reductions (warp
// segments, blocks, clusters), for row kernels.
extern const char* const kCudaRowPrelude;
// A row group's moments combined, for row kernels with Moments folds.
extern const char* const kCudaRowMomentsPrelude;
// Sums of exponentials about a running max, for row kernels with an ExpSum fold (softmax).
extern const char* const kCudaLsePrelude;
// The histogram's bin rule, for kernels with a kir::Hist.
extern const char* const kCudaHistPrelude;
// 64-bit parameters, conversions and min/max, for kernels with 64-bit values (has_wide).
extern const char* const kCudaWidePrelude;
// The accumulator kinds on 64-bit states, for wide kernels with the reductions' part.
extern const char* const kCudaWideReducePrelude;

// Whether `k` has a 64-bit value (f64, i64) or a buffer of a dtype the vector paths do not move
// (8-byte dtypes, 16-bit integers, uint32): such kernels move one element at a time (no vector
// path, no register-held rows).
bool has_wide(const kir::Kernel& k);
// Bytes per accumulator in a partial-reduction record (full reductions, split columns): 8 (a
// 32-bit value and its position), 16 when some accumulator holds a 64-bit value.
int acc_record_slot(const kir::Kernel& k);

// Whether buffer `buf` of `k` varies along some reduced dim (is not broadcast along all of them).
bool varies_along_reduced(const kir::Kernel& k, size_t buf);
// The innermost parallel dim of `k` (the last dim not reduced), or -1 when every dim is reduced.
int innermost_parallel_dim(const kir::Kernel& k);

// Column kernels: blocks of kColumnThreads threads, column_width(k) parallel points side by side
// (128 bytes of the narrowest loaded dtype: a row of the block's columns is then whole 128-byte
// lines, which DRAM serves at full rate, where half lines read at different times are not) and
// kColumnThreads / column_width(k) slices of the reduced points.
inline constexpr int kColumnThreads = 256;
int column_width(const kir::Kernel& k);
// Column kernels whose only Loop block comes first may split their reduced points into chunks; the
// plan splits until about kColumnTargetBlocks blocks run (none where that many column blocks run
// already), a number independent of the device so that results are too. About 1.3 waves of the
// vector entry's 3 blocks an SM on 132 SMs: fewer, longer chunks measured faster than more blocks,
// whose ends (the slices' merge, a record each) and the combine's reads cost more than a second
// wave's tail. Few chunks mean many column blocks, whose records a second launch would take a warp
// per column to combine: up to kColumnCombineChunks chunks, the last block of a column block to
// finish combines them itself, a column's threads side by side, one round of reads, so that the
// vector entry keeps the blocks an SM it has without it (a float16 sum's 4 blocks of 256 threads:
// at most 64 registers). With more, the combine's rounds of reads at the end of the kernel cost as
// much as the entry NAME_final, a warp per column across the GPU, which then combines them.
bool column_splittable(const kir::Kernel& k);
inline constexpr int kColumnCombineChunks = 4;
// Column kernels' vector entry NAME_v: V adjacent points of the innermost parallel dim q per
// thread, every buffer contiguous along q read V elements at a time (V * the widest of those
// loaded along the reduced points = 16 bytes, V at most 8: the slices' shared-memory states
// grow with it), so that a thread moves 16 bytes per load
// where one point per thread moves 2 (16-bit) and too few bytes are in flight to reach the
// copy bandwidth. The kernel qualifies when every buffer is contiguous or broadcast along q,
// no Loop block stores, nothing reads a coordinate, the linear index or a gather and nothing is
// has_wide: V, or 0.
int column_vector_width(const kir::Kernel& k);
// The vector entry is compiled for kColumnVectorBlocks resident blocks (85 registers a thread):
// with no such bound, ptxas interleaved a step's 16-byte loads with the arithmetic of the ones
// before (batch norm's statistics in float16: three sums of eight columns a thread), keeping
// one or two in flight instead of the step's four.
inline constexpr int kColumnVectorBlocks = 3;
inline constexpr int64_t kColumnTargetBlocks = 512;
inline constexpr int64_t kColumnMinChunk = 256;   // reduced points per chunk, at least

// Row kernels keep every buffer that several Loop blocks load (not gather) and that varies
// along the row in shared memory, in its storage dtype: per buffer, its slot in the row cache,
// or -1.
std::vector<int> row_cache_slots(const kir::Kernel& k);

// Whether Loop blocks after the first (not folded away) wait on memory: they load buffers that
// vary along the row and are not cached, and either one of them also varies from row to row (a
// residual: read from DRAM each time) or together those shared by every row (a norm's weights)
// span 32 KiB or more of a row of `nr` elements, too many to stay in L1 beside the row cache.
bool row_later_reads_memory(const kir::Kernel& k, const std::vector<int>& slot, int64_t nr);

// Row kernels: a later Loop block whose only work is sums that the first pass can keep as it
// goes is no pass of its own: one round over the row instead of two. Two kinds, each a sum over
// the row of f(v - k) with v read from the row (the first Loop block reads its buffers too) and
// k the same along the row (an earlier result):
//   - Moments, f(d) = d^2 (a variance about a mean): the first pass also folds v into a count,
//     mean and sum of squared deviations from that mean (Chan et al.'s pairwise update), and the
//     sum is M2 + n (mean - k)^2 once k is known. When the first pass also sums the same v
//     (shared: that accumulator, the mean's sum), the sum goes through the moments' round. When
//     a later pass reads the row again (then the row is cached, and the fold only saves a
//     round) only for that shared sum and rows of values of at most 16 bits: on float32 rows of
//     5000-16384 elements the first pass's extra arithmetic cost 5-15% more than the round saved.
//   - ExpSum, f(d) = exp(d) with k the max of the same v that the first pass reduces (softmax's
//     denominator; shared: that accumulator): the first pass keeps a running max m and s = sum
//     of exp(v - m), rescaled when m grows (online softmax); m after the row's merge is the max,
//     whose own round is skipped, and the sum is s exp(m - k) = s. Always: besides a pass over
//     the row it saves a round of the row's threads, whether or not the row is cached.
// Per folded accumulator: its kind, its block, the instruction of v, the instruction of k, v's
// instructions (block-local, in order) and the first pass's accumulator it shares, or -1.
struct RowFold {
    enum Kind : uint8_t { Moments, ExpSum };
    Kind kind = Moments;
    int block = -1, accum = -1, value = -1, shift = -1;
    std::vector<int> chain;
    int shared = -1;
};
std::vector<RowFold> row_folds(const kir::Kernel& k);
// A column kernel's Moments folds (the same pattern: a column's variance about its mean), where
// they leave the first block the only Loop block, so that the kernel splits its reduced points:
// the first pass keeps each column's moments (count, mean, M2) per thread, merged a step's
// values at a time, then across the block's slices and the chunks in a fixed order
// (kiln_column_reduce_moments; a chunk's record holds the mean and M2 in the folded
// accumulator's slot, its count is its rows). Without them a variance of columns is two Loop
// blocks, which do not split, and reads the columns twice.
std::vector<RowFold> column_folds(const kir::Kernel& k);
// Which of k's blocks the folds fold away.
std::vector<bool> folded_blocks(const kir::Kernel& k, const std::vector<RowFold>& folds);
// The instructions k's value `shift` depends on, itself included, in order.
std::vector<int> shift_chain(const kir::Kernel& k, int shift);
// The same questions given k's folds (row_folds(k)), which the launch plan computes once.
std::vector<int> row_cache_slots(const kir::Kernel& k, const std::vector<RowFold>& folds);
bool row_later_reads_memory(const kir::Kernel& k, const std::vector<int>& slot, const std::vector<RowFold>& folds,
                            int64_t nr);
bool row_register_entry(const kir::Kernel& k, const std::vector<int>& slot);

// Row kernels with one reduced dim read it in groups of V consecutive elements per thread
// (V * the widest loaded element = 16 bytes), so the first pass can load a group with one
// 16-byte load when the row is aligned; V = 1 when no loaded buffer is contiguous along it, or
// the kernel has_wide.
// Element j of a thread is R index ((j / V) * G + t) * V + j % V.
int row_vector_width(const kir::Kernel& k);

// A row group of `vw` elements of dtype `t` as words of at most 16 bytes: how many words and
// elements per word; {0, 0} when the group cannot move in whole words (then element by element).
struct GroupWords {
    int words = 1;       // words per group
    int per_word = 1;    // elements per word
};
inline GroupWords group_words(DType t, int vw) {
    const int bytes = (int)dtype_size(t) * vw;
    if (bytes < 4 || (bytes > 16 && bytes % 16)) return {0, 0};
    const int words = bytes > 16 ? bytes / 16 : 1;
    return {words, vw / words};
}

// Row kernels whose cached buffers are all read along the row in groups (row_vector_width V > 1,
// contiguous along the one reduced dim) also have an entry NAME_r that holds a thread's groups of
// them in registers, kRowRegisterGroups groups a thread at most, instead of in shared memory: the
// pass that reads a cached buffer first loads all of the thread's groups of it at once, the later
// passes read registers, and no row cache limits the blocks a multiprocessor runs. Its loops are
// unrolled over the groups, so it serves aligned rows only (cuda_launch_aligned: every group of V
// elements whole and on a boundary of its size in every buffer moved in groups). Whether k has
// that entry: the cached buffers' groups must fit 8 registers (32 of the entry's 64 for 4 groups).
// The entry takes no folds (each folded sum is a round over the registers); the launch plan
// gives a kernel with a folded sum of exponentials (softmax) the entry only for rows of at most
// a warp's threads.
inline constexpr int kRowRegisterGroups = 4;
bool row_register_entry(const kir::Kernel& k);

// The register entry's blocks of kCudaMaxRowBlock threads a multiprocessor when its rows span
// more than a warp (the second bound of its launch bounds at block reach): 3, so 40 registers a
// thread, when the cached buffers' group is one 16-byte word and one pass at most reads one
// more buffer along the row from memory (a norm's weights): such a kernel fits 40 registers
// without spilling, and a third row in flight hides more of each pass's latency; otherwise 2
// (64 registers: a second streamed buffer's groups in flight do not fit 40). The launch gives
// an entry of 3 rows of up to kCudaMaxRowBlock threads (a block each); one of 2, rows of up to
// kCudaBlockSize threads.
int row_register_blocks(const kir::Kernel& k, const std::vector<int>& slot);

// Bytes of the row cache (slots: row_cache_slots(k)) when each cached buffer holds `elements`
// of its dtype (the block's threads times the elements per thread): the buffers' regions one
// after another in slot order, each rounded up to 16 bytes. 0 when nothing is cached.
size_t row_cache_bytes(const kir::Kernel& k, const std::vector<int>& slot, int64_t elements);

// Elementwise kernels: the elements per thread of the vector path (16 bytes of the widest
// contiguous buffer), or 1 when the kernel has no vector path (rank above 1, a strided buffer,
// a gather or a coordinate read).
int elementwise_vector_width(const kir::Kernel& k);

} // namespace kiln::codegen::detail
