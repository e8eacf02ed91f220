// View arithmetic: slicing with steps, transposition and reshaping without copying.
#pragma once
#include "ir/node.hpp"

#include <optional>
#include <vector>

namespace kiln {

// One index expression per dimension, Python-style. `index` selects a single position and
// drops the dimension; otherwise [start:stop:step] with negative values counting from the end.
struct Slice {
    static constexpr int64_t kNone = INT64_MIN;
    int64_t start = kNone, stop = kNone, step = 1;
    bool is_index = false;

    static Slice all() { return {}; }
    static Slice at(int64_t i) { Slice s; s.start = i; s.is_index = true; return s; }
    static Slice range(int64_t start, int64_t stop, int64_t step = 1) { return {start, stop, step, false}; }
};

// Fewer slices than dims leave the trailing dims whole. Throws kiln::Error for a step of 0,
// an index out of range or too many slices.
View slice_view(const View& v, const std::vector<Slice>& slices);
View transpose_view(const View& v, const std::vector<int>& perm);  // empty perm reverses the dims
// Resolves one -1 and checks the element count; `op` names the caller in errors.
Shape resolve_reshape(const Shape& from, const Shape& to, const char* op);
// The view with the new shape over the same memory, or nullopt when that needs a copy.
std::optional<View> reshape_view(const View& v, const Shape& to);

} // namespace kiln
