// Pieces the CUDA C renderer's files share; not part of codegen's interface.
#pragma once
#include "codegen/cuda/cuda_codegen.hpp"

#include <vector>

namespace kiln::codegen::detail {

// Device helpers every generated kernel starts with: 16-bit float conversions written out as
// bit manipulation (bit-for-bit those of ir/half.hpp), NaN-propagating min/max, the
// accumulator kinds, and the warp, row-group, cluster and column reductions.
extern const char* const kCudaPrelude;

// Column kernels: parallel points per block and slices of the reduced points per block.
inline constexpr int kColumnWidth = 32;
inline constexpr int kColumnSlices = 8;

// Row kernels keep every buffer a Loop block loads (not gathers) in shared memory when a later
// pass loads it again. Per buffer: its slot in the row cache, or -1.
std::vector<int> row_cache_slots(const kir::Kernel& k);

// Row kernels with one reduced dim read it in groups of V consecutive elements per thread
// (V * the widest loaded element = 16 bytes), so the first pass can load a group with one
// 16-byte load when the row is aligned; V = 1 when no loaded buffer is contiguous along it.
// Element j of a thread is R index ((j / V) * G + t) * V + j % V.
int row_vector_width(const kir::Kernel& k);
int row_cache_slot_count(const kir::Kernel& k);

} // namespace kiln::codegen::detail
