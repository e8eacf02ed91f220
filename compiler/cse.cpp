#include "compiler/cse.hpp"

#include <fmt/format.h>

#include <unordered_map>
#include <unordered_set>

namespace kiln {

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
            for (auto& i : n->inputs) t += tree[i.get()];
            tree[n] = t;
        }
        stats->written = tree[out.get()];
        auto uses = use_counts(out);
        for (const Node* n : postorder(out)) {
            int count = uses.count(n) ? uses[n] : 0;
            if (count < 2 || n->inputs.empty()) continue;
            // Name the reduction inside the shared subtree: that is the work saved.
            std::string red;
            for (const Node* m : postorder(NodePtr(NodePtr{}, n)))
                if (is_reduction(m->op)) { red = fmt::format(" (contains {} over {})", opkind_name(m->op), m->axis == kAllAxes ? std::string("all axes") : fmt::format("axis {}", m->axis)); break; }
            stats->shared.push_back(fmt::format("{}  used {} times: computed once{}", node_str(*n), count, red));
        }
    }
    return out;
}

} // namespace kiln
