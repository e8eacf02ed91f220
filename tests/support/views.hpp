// Views over storage that is never read: enough for tests of the graph and the passes.
#pragma once
#include "ir/node.hpp"

#include <memory>

namespace kiln::test {

inline View host_view(Shape shape, DType t = DType::Float32) {
    View v;
    v.storage = std::make_shared<Storage>();
    v.dtype = t;
    v.shape = shape;
    v.strides = contiguous_strides(shape);
    return v;
}

} // namespace kiln::test
