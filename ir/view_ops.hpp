// View arithmetic: slicing with steps, transposition and reshaping without copying.
#pragma once
#include "ir/node.hpp"
#include <kiln/view.hpp>

#include <optional>
#include <vector>

namespace kiln {

// Fewer slices than dims leave the trailing dims whole. Throws kiln::Error for a step of 0,
// an index out of range or too many slices.
View slice_view(const View& v, const std::vector<Slice>& slices);
View transpose_view(const View& v, const std::vector<int>& perm);  // empty perm reverses the dims
// Resolves one -1 and checks the element count; `op` names the caller in errors.
Shape resolve_reshape(const Shape& from, const Shape& to, const char* op);
// The view with the new shape over the same memory, or nullopt when that needs a copy.
std::optional<View> reshape_view(const View& v, const Shape& to);

} // namespace kiln
