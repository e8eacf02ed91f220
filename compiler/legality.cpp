#include "compiler/legality.hpp"

#include <fmt/format.h>

#include <functional>
#include <unordered_set>

namespace kiln {

bool StageContext::full() const {
    if (reduced.empty()) return false;
    for (bool r : reduced)
        if (!r) return false;
    return true;
}

bool StageContext::any_reduced() const {
    for (bool r : reduced)
        if (r) return true;
    return false;
}

namespace {

std::vector<bool> reduced_axes(const Node& r) {
    const Shape& s = r.inputs[0]->shape;
    std::vector<bool> a(s.size(), r.axis == kAllAxes);
    if (r.axis != kAllAxes) a[r.axis] = true;
    return a;
}

// Reductions reachable from `root` through elementwise operations only, in postfix order.
std::vector<const Node*> frontier_reductions(const NodePtr& root) {
    std::vector<const Node*> out;
    std::unordered_set<const Node*> seen;
    std::function<void(const Node*)> walk = [&](const Node* n) {
        if (!seen.insert(n).second) return;
        if (is_reduction(n->op)) { out.push_back(n); return; }
        if (!is_elementwise(n->op)) return;
        for (auto& i : n->inputs) walk(i.get());
    };
    walk(root.get());
    return out;
}

std::string ctx_str(const StageContext& c) {
    if (!c.any_reduced()) return fmt::format("elementwise stage over {}", shape_str(c.domain));
    std::vector<int> axes;
    for (size_t i = 0; i < c.reduced.size(); ++i)
        if (c.reduced[i]) axes.push_back((int)i);
    return fmt::format("stage over {} reducing axes ({})", shape_str(c.domain), fmt::join(axes, ", "));
}

struct Legality {
    LegalityResult res;
    std::unordered_set<const Node*> done;  // materialized already

    void materialize(const NodePtr& n, std::string why) {
        if (done.count(n.get())) return;
        done.insert(n.get());
        if (n->op == OpKind::Reshape) process(n->inputs[0], n->inputs[0]->shape);
        else process(n, n->shape);
        res.reasons[n.get()] = std::move(why);
        res.materialized.push_back(n);
    }

    void process(const NodePtr& root, const Shape& dst_shape) {
        StageContext ctx = choose_context(root, dst_shape);
        std::unordered_set<const Node*> seen;
        visit(root, ctx, seen, false, true);
    }

    // `in_full_reduction`: inside the operand of a full reduction fused into this stage.
    // `is_root`: the node this stage computes (already marked done when it is materialized).
    void visit(const NodePtr& np, const StageContext& ctx, std::unordered_set<const Node*>& seen, bool in_full,
               bool is_root = false) {
        const Node& n = *np;
        if ((done.count(&n) && !is_root) || !seen.insert(&n).second) return;
        switch (n.op) {
        case OpKind::Leaf: case OpKind::Scalar: case OpKind::Rand: case OpKind::Iota: return;
        case OpKind::Reshape:
            materialize(np, fmt::format("%{} reshapes a computed expression: its operand %{} is written to memory first",
                                        n.id, n.inputs[0]->id));
            return;
        case OpKind::Take:
            if (n.inputs[0]->op != OpKind::Leaf)
                materialize(n.inputs[0], fmt::format("%{} is gathered from by take %{}: it must be in memory",
                                                     n.inputs[0]->id, n.id));
            visit(n.inputs[1], ctx, seen, in_full);
            return;
        default: break;
        }
        if (is_reduction(n.op)) {
            const Shape& s = n.inputs[0]->shape;
            std::vector<bool> axes = reduced_axes(n);
            std::string why;
            if (!ctx.any_reduced())
                why = fmt::format("%{} = {} is broadcast into an {}; it is reduced in a stage of its own", n.id,
                                  opkind_name(n.op), ctx_str(ctx));
            else if (s != ctx.domain || axes != ctx.reduced)
                why = fmt::format("%{} = {} over {} (axis {}) does not match the {}", n.id, opkind_name(n.op),
                                  shape_str(s), n.axis == kAllAxes ? std::string("all") : std::to_string(n.axis),
                                  ctx_str(ctx));
            else if (in_full)
                why = fmt::format("%{} = {} feeds another full reduction: a full reduction's kernel has a single pass",
                                  n.id, opkind_name(n.op));
            if (!why.empty()) {
                materialize(np, why);
                return;
            }
            visit(n.inputs[0], ctx, seen, ctx.full());
            return;
        }
        for (auto& i : n.inputs) visit(i, ctx, seen, in_full);
    }
};

} // namespace

StageContext choose_context(const NodePtr& root, const Shape& dst_shape) {
    for (const Node* r : frontier_reductions(root)) {
        const Shape& s = r->inputs[0]->shape;
        std::vector<bool> axes = reduced_axes(*r);
        StageContext c{s, axes};
        if (dst_shape == r->shape) return c;           // the reduced value is stored (Point block)
        if (dst_shape == s && !c.full()) return c;     // broadcast back over the reduced dims
    }
    return StageContext{dst_shape, std::vector<bool>(dst_shape.size(), false)};
}

LegalityResult legality(const NodePtr& root, const Shape& dst_shape) {
    Legality l;
    l.process(root, dst_shape);
    return std::move(l.res);
}

} // namespace kiln
