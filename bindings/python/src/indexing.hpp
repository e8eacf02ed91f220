// Python indexing (t[key]) of tensors: see indexing.cpp.
#pragma once
#include "binding.hpp"

namespace kiln::py {

struct Index {
    Tensor view;             // the basic-indexing view (ints, slices, ..., None applied)
    int gather_axis = -1;    // >= 0: then gather `gather` along this axis of `view`
    nb::object gather;
};

Index parse_index(const Tensor& t, nb::handle key);
bool is_whole(nb::handle key);  // `:`, `...`: the whole tensor
// A bool tensor or expression as the whole key: a mask (kiln/_host_functions.py selects with it).
bool is_mask(nb::handle key);
// A tuple with two or more array indices (NumPy's advanced indexing; kiln/_host_functions.py).
bool several_array_indices(nb::handle key);
// A NumPy bool array as the whole key: uploaded into ctx as a bool tensor, so that it indexes
// as a mask, as in NumPy; any other key unchanged.
nb::object host_mask_uploaded(nb::handle key, nb::handle ctx);

} // namespace kiln::py
