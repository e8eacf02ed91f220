// The graph part of an assignment's signature, shared by the plan cache's exact signature
// (plan_cache.cpp) and the plan families' signatures with sizes left out (plan_family.cpp):
// each node in postorder as its word (op, dtype, weak, arity, axis), its shape, its operands'
// places, and a leaf's view, a scalar's bits or a rand()'s place among those met. The callers
// differ only in how a shape and a view are written and which nodes they admit, so those are
// the walk's arguments. A template, inlined into both: it runs on every assignment.
#pragma once
#include "ir/error.hpp"
#include "ir/node.hpp"
#include "runtime/plan_cache.hpp"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace kiln {

// Position of `n` in `order` (its postorder index). Graphs are usually small, and a short scan
// from the back (operands are usually close to their users) beats a hash map; past that the
// map, so a graph of many thousands of nodes does not cost their square.
struct OrderIndex {
    const std::vector<const Node*>& order;
    std::unordered_map<const Node*, uint64_t> map;
    explicit OrderIndex(const std::vector<const Node*>& o) : order(o) {
        if (o.size() > 64)
            for (size_t i = 0; i < o.size(); ++i) map.emplace(o[i], i);
    }
    uint64_t operator()(size_t before, const Node* n) const {
        if (map.empty()) {
            for (size_t i = before; i-- > 0;)
                if (order[i] == n) return i;
        } else if (auto it = map.find(n); it != map.end() && it->second < before) {
            return it->second;
        }
        throw InternalError("assignment_signature: operand not visited before its user");
    }
};

// Appends the words of root's graph to out. rand() nodes are numbered in the order first met
// across every graph walked with the same `rands`, so that sharing one between expressions is
// part of the structure. admit(node) is asked before a node's words (it may throw); put_shape
// and put_view write a shape and a leaf's view. False, as soon as any of them says so.
template <class Admit, class PutShape, class PutView>
bool walk_signature(const NodePtr& root, AssignmentSignature& out, std::vector<const Node*>& rands, Admit&& admit,
                    PutShape&& put_shape, PutView&& put_view) {
    auto& w = out.words;
    const std::vector<const Node*> order = postorder(root);
    const OrderIndex index_in(order);
    for (size_t i = 0; i < order.size(); ++i) {
        const Node& n = *order[i];
        if (!admit(n)) return false;
        w.push_back((uint64_t)n.op | (uint64_t)n.dtype << 8 | (uint64_t)n.weak << 16 | (uint64_t)n.inputs.size() << 24 |
                    (uint64_t)(uint32_t)n.axis << 32);
        if (!put_shape(n.shape)) return false;
        for (const NodePtr& in : n.inputs) w.push_back(index_in(i, in.get()));
        switch (n.op) {
        case OpKind::Leaf:
            if (!put_view(n.view)) return false;
            break;
        case OpKind::Scalar:
            w.push_back(double_bits(n.value));
            w.push_back((uint64_t)n.ivalue);   // integers past 2^53 share a double
            break;
        case OpKind::Rand: {   // its serial differs on every call: its first place stands for it
            const auto it = std::find(rands.begin(), rands.end(), &n);
            w.push_back((uint64_t)(it - rands.begin()));
            if (it == rands.end()) rands.push_back(&n);
            break;
        }
        default: break;
        }
    }
    return true;
}

} // namespace kiln
