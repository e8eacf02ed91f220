#include "compiler/cse.hpp"

#include <fmt/format.h>

#include <unordered_map>
#include <unordered_set>

namespace kiln {

namespace {

// Counts of operations as written grow exponentially with a DAG's depth (x = x + x): they
// saturate instead of wrapping.
int64_t sat_add(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

} // namespace

std::unordered_map<const Node*, int> use_counts(const NodePtr& root) {
    std::unordered_map<const Node*, int> uses;
    for (const Node* n : postorder(root))
        for (auto& in : n->inputs) ++uses[in.get()];
    return uses;
}

NodePtr cse(const NodePtr& root, CseStats* stats) {
    std::unordered_map<const Node*, NodePtr> memo;
    std::unordered_set<const Node*> results;
    int before = 0;
    for (const Node* n : postorder(root)) {
        ++before;
        Node p = *n;
        for (auto& in : p.inputs) in = memo.at(in.get());
        NodePtr out = intern(std::move(p));
        results.insert(out.get());
        memo[n] = out;
    }
    NodePtr out = memo.at(root.get());
    if (stats) {
        stats->nodes = (int)results.size();
        stats->merged = before - (int)results.size();
        std::unordered_map<const Node*, int64_t> tree;
        for (const Node* n : postorder(out)) {
            int64_t t = 1;
            for (auto& i : n->inputs) t = sat_add(t, tree[i.get()]);
            tree[n] = t;
        }
        stats->written = tree[out.get()];
        // Occurrences as written: the number of paths from the root to each node. A reduction
        // written twice (the two mean(A, axis=1) of batch normalisation) is one node here.
        std::vector<const Node*> order = postorder(out);
        std::unordered_map<const Node*, int64_t> paths{{out.get(), 1}};
        for (auto it = order.rbegin(); it != order.rend(); ++it)
            for (auto& in : (*it)->inputs) paths[in.get()] = sat_add(paths[in.get()], paths[*it]);
        for (const Node* n : order) {
            if (!is_reduction(n->op) || paths[n] < 2) continue;
            stats->shared.push_back(fmt::format("{}(%{}, {}) appears {} times as written: computed once", opkind_name(n->op),
                                                n->inputs[0]->id,
                                                n->axis == kAllAxes ? std::string("all axes") : fmt::format("axis={}", n->axis),
                                                paths[n]));
        }
    }
    return out;
}

} // namespace kiln
