// partition: cuts the graph of one assignment into kernel stages, in execution order, using
// the legality pass's decisions: one stage per materialized node (into a temporary), then the
// stage that writes the destination. Classifies each stage (elementwise, row, column or full
// reduction). When the destination's memory is also read through a different view (A[:] = A.T),
// the result goes to a temporary and a copy stage follows, as NumPy does for overlapping
// operands. Runs after legality.
#pragma once
#include "compiler/legality.hpp"
#include "compiler/stage.hpp"

namespace kiln {

Plan partition(const NodePtr& root, const View& dst, const LegalityResult& legal);

} // namespace kiln
