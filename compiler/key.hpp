// key: the cache key of a lowered kernel. It is the kernel's full structure — instructions,
// operands numbered by first use, storage dtypes, rank after merging, which strides are 0, 1
// or other, accumulators, blocks — plus the target and kiln's version. Concrete sizes, strides
// and scalar values are launch arguments and are not part of it, so a new batch size reuses
// the compiled kernel. The full material is kept (not only its hash) so a cache can compare it
// on load. Runs after lower.
#pragma once
#include "compiler/kernel_ir.hpp"

#include <cstdint>
#include <string>

namespace kiln {

std::string key_material(const kir::Kernel& k, const std::string& target);
// "kiln_" + 16 hex digits of the material's FNV-1a hash: a stable C identifier.
std::string kernel_name_for(const std::string& key_material);
uint64_t fnv1a64(const void* data, size_t n);

} // namespace kiln
