// Element conversion between host buffers of any two dtypes (uploads, downloads, casts on
// the host), with the same rules as kernel stores: round to nearest even for 16-bit floats,
// truncation with wrap-around for integers (saturating at int32, NaN -> 0), bool = (x != 0).
// Values pass through a double: int64 values beyond 2^53 round (same-dtype copies do not come
// here).
#pragma once
#include "ir/dtype.hpp"

#include <cstdint>

namespace kiln {

double load_element(DType t, const void* p);
void store_element(DType t, void* p, double v);

} // namespace kiln
