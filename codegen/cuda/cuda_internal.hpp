// Pieces the CUDA C renderer's files share; not part of codegen's interface.
#pragma once
#include "codegen/cuda/cuda_codegen.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::codegen::detail {

// Device helpers every generated kernel starts with: 16-bit float conversions written out as
// bit manipulation (bit-for-bit those of ir/half.hpp), NaN-propagating min/max, the
// accumulator kinds, and the warp, row-group, cluster and column reductions.
extern const char* const kCudaPrelude;

// Column kernels: parallel points per block and slices of the reduced points per block.
inline constexpr int kColumnWidth = 32;
inline constexpr int kColumnSlices = 8;
// Column kernels whose only Loop block comes first may split their reduced points into chunks
// (an entry NAME_final then combines them); the plan splits until about this many blocks run,
// a number independent of the device so that results are too.
bool column_splittable(const kir::Kernel& k);
inline constexpr int64_t kColumnTargetBlocks = 2048;
inline constexpr int64_t kColumnMinChunk = 256;   // reduced points per chunk, at least
inline constexpr int64_t kColumnMaxChunks = 1024;

// Row kernels keep every buffer that several Loop blocks load (not gather) and that varies
// along the row in shared memory, in its storage dtype: per buffer, its slot in the row cache,
// or -1.
std::vector<int> row_cache_slots(const kir::Kernel& k);

// Row kernels with one reduced dim read it in groups of V consecutive elements per thread
// (V * the widest loaded element = 16 bytes), so the first pass can load a group with one
// 16-byte load when the row is aligned; V = 1 when no loaded buffer is contiguous along it.
// Element j of a thread is R index ((j / V) * G + t) * V + j % V.
int row_vector_width(const kir::Kernel& k);

// Bytes of the row cache when each cached buffer holds `elements` of its dtype (the block's
// threads times the elements per thread): the buffers' regions one after another in slot
// order, each rounded up to 16 bytes. 0 when nothing is cached.
size_t row_cache_bytes(const kir::Kernel& k, int64_t elements);

// Elementwise kernels: the elements per thread of the vector path (16 bytes of the widest
// contiguous buffer), or 1 when the kernel has no vector path (rank above 1, a strided buffer,
// a gather or a coordinate read).
int elementwise_vector_width(const kir::Kernel& k);

} // namespace kiln::codegen::detail
