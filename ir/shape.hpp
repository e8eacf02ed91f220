// Shapes and strides (in elements, row-major by default) and NumPy broadcasting.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t numel(const Shape& s);
Strides contiguous_strides(const Shape& s);
std::string shape_str(const Shape& s);  // "(128, 32)", "()" for a scalar, "(5,)" for rank 1

// NumPy's rule: align on the right; sizes must match or one of them be 1. `op` names the
// operation in the error message.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
bool broadcastable_to(const Shape& from, const Shape& to);

// Normalises a possibly negative axis for a tensor of rank `rank`; throws naming `op`.
int normalize_axis(int axis, int rank, const char* op);

} // namespace kiln
