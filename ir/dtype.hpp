// The two compute types kernels do arithmetic in: float32 for every floating dtype, int32 for
// the integer dtypes and bool (the dtypes themselves are public: kiln/dtype.hpp).
#pragma once
#include <kiln/dtype.hpp>

namespace kiln {

enum class ComputeType : uint8_t { F32, I32 };

constexpr ComputeType compute_type(DType t) { return is_float(t) ? ComputeType::F32 : ComputeType::I32; }

} // namespace kiln
