// cse: structurally equal subtrees become one node. Nodes are hash-consed at construction, so
// rebuilding the graph bottom-up through the interning table merges everything that earlier
// passes made equal (canonicalise turns b*a into a*b). The pass reports which subtrees are
// shared — above all reductions, which are the expensive part: the two mean(A, axis=1) of the
// seeds' batch normalisation are computed once. Runs after canonicalise.
#pragma once
#include "ir/node.hpp"

#include <string>
#include <unordered_map>
#include <vector>

namespace kiln {

struct CseStats {
    int nodes = 0;
    int64_t written = 0;               // operations in the expression as written (shared subtrees counted per use)
    int merged = 0;                    // nodes that were distinct objects before and one after
    std::vector<std::string> shared;   // "sum(...) axis=1 used 2 times: computed once"
    bool changed() const { return merged > 0; }
};

NodePtr cse(const NodePtr& root, CseStats* stats = nullptr);

// Number of users of each node within the graph of `root`.
std::unordered_map<const Node*, int> use_counts(const NodePtr& root);

} // namespace kiln
