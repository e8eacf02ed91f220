// legality: decides which reductions can be computed inside the kernel that consumes them and
// which must be split into a stage of their own. Runs after cse, before partition.
//
// The seeds' rule: a reduction may be broadcast back into the same kernel only if it comes
// before the broadcast in the postfix order of the expression, i.e. it is fully reduced before
// any element that uses it is computed. kiln's row and column kernels honour this by
// construction: a kernel makes one pass over the reduced dims per reduction level (the level
// is the reduction's position in postfix order among the reductions it depends on), so every
// reduction is finished before the pass that broadcasts it. What remains illegal inside one
// kernel, and is split here instead of being an error as it was in nervanagpu:
//   - a reduction over other axes, or over a domain of another shape, than the stage reduces;
//   - a reduction whose result is broadcast back into an elementwise stage;
//   - a full reduction consumed by anything but its own final step (its two-step kernel has
//     no later pass), including one full reduction feeding another;
//   - the computed input of a reshape, and the computed source of a take, which are read at
//     positions other than the current point and so must be in memory;
//   - and, not for legality but for compile time, an expression longer than
//     kMaxStageOperations, cut into stages.
#pragma once
#include "ir/node.hpp"

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace kiln {

// The iteration space chosen for a stage rooted at `root` that writes `dst_shape`.
struct StageContext {
    Shape domain;
    std::vector<bool> reduced;  // empty set: elementwise
    bool full() const;
    bool any_reduced() const;
};

// The context is taken from the reductions reachable from `root` through elementwise nodes,
// not through the `cuts` below it (a long chain's cut points: each is a stage of its own, and
// walking through them made planning quadratic in the chain's length).
StageContext choose_context(const NodePtr& root, const Shape& dst_shape, const std::unordered_set<const Node*>& cuts);

struct LegalityResult {
    // Nodes to compute in a stage of their own, dependencies first. A Reshape node listed
    // here means: its input is computed into memory and the Reshape reads that memory.
    std::vector<NodePtr> materialized;
    std::unordered_map<const Node*, std::string> reasons;
    std::unordered_set<const Node*> cuts;   // where a long chain is cut (kMaxStageOperations)
};

// A stage computes about this many distinct operations at most (one recomputing values that an
// earlier stage's count took, up to about twice it): a longer expression is cut into stages
// (every node where the count of operations since the last cut passes it is materialised). A
// kernel's compile time grows faster than its length in LLVM's and NVRTC's schedulers, and a
// stage this long is compute-bound already, so the extra pass through memory costs little;
// the cut pieces of a long repetitive chain are often one kernel, compiled once.
inline constexpr int64_t kMaxStageOperations = 1024;

LegalityResult legality(const NodePtr& root, const Shape& dst_shape);

} // namespace kiln
