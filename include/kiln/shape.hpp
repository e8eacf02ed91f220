// Shapes and strides (in elements, row-major by default) and NumPy broadcasting.
#pragma once
#include <kiln/export.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

// The most elements a tensor or expression may have: 2^60, so that its byte size (at most
// 8 bytes an element) and every element offset fit int64 with room to spare. Every shape a
// node, view or tensor is made with is checked against it, so counts never wrap.
inline constexpr int64_t kMaxElements = int64_t(1) << 60;

// Throws kiln::Error naming `op` when a dimension is negative or the shape has more than
// kMaxElements elements (counting only its non-zero dims, so its strides fit too).
KILN_API void check_shape(const Shape& s, const char* op);
// The element count. Shapes are checked when made; a shape past kMaxElements throws here too.
KILN_API int64_t numel(const Shape& s);
KILN_API Strides contiguous_strides(const Shape& s);
KILN_API std::string shape_str(const Shape& s);  // "(128, 32)", "()" for a scalar, "(5,)" for rank 1

// NumPy's rule: align on the right; sizes must match or one of them be 1. `op` names the
// operation in the error message.
KILN_API Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
KILN_API bool broadcastable_to(const Shape& from, const Shape& to);

// Normalises a possibly negative axis for a tensor of rank `rank`; throws naming `op`.
KILN_API int normalize_axis(int64_t axis, int rank, const char* op);

} // namespace kiln
