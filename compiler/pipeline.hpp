// The lowering script: one assignment `dst = expr` through every pass, in order, flat:
//   canonicalise -> cse -> legality -> partition -> lower (+ key) for each stage.
// With KILN_LOG=debug the graph is printed after each pass, and a pass that changed nothing
// says so.
#pragma once
#include "compiler/lower.hpp"
#include "compiler/stage.hpp"

#include <vector>

namespace kiln {

struct CompiledAssignment {
    Plan plan;
    std::vector<LoweredStage> stages;
};

// `expr` must broadcast to dst's shape (the runtime checks that and reports user errors).
CompiledAssignment compile_assignment(const NodePtr& expr, const View& dst, const std::string& target,
                                      const LowerOptions& opts = {});

// Several assignments as one stage, when each is one column or full reduction over the same
// domain into a destination of one value per parallel point that no expression reads (a
// tensor's sums of x and of x^2), and none draws random numbers: the stage stores them all
// (Stage::siblings), so the operands they share are read once. Otherwise no stage at all: the
// caller runs them one by one.
CompiledAssignment compile_together(const std::vector<std::pair<NodePtr, View>>& list, const std::string& target,
                                    const LowerOptions& opts = {});

} // namespace kiln
