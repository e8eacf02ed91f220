#include "compiler/legality.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <unordered_map>
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

// Reductions reachable from `root` through elementwise operations only, not through a cut
// below it, in postfix order.
std::vector<const Node*> frontier_reductions(const NodePtr& root, const std::unordered_set<const Node*>& cuts) {
    std::vector<const Node*> out;
    std::unordered_set<const Node*> seen;
    std::vector<const Node*> stack{root.get()};  // operands pushed in reverse: visited first to last
    while (!stack.empty()) {
        const Node* n = stack.back();
        stack.pop_back();
        if (!seen.insert(n).second) continue;
        if (is_reduction(n->op)) { out.push_back(n); continue; }
        if (!is_elementwise(n->op) || (n != root.get() && cuts.count(n))) continue;
        for (size_t i = n->inputs.size(); i-- > 0;) stack.push_back(n->inputs[i].get());
    }
    return out;
}

// Where a long expression is cut (kMaxStageOperations): counted in postorder, each node once,
// charged to the first user met (a kernel computes a shared operand once, so counting it for
// each user grew a gradient's count, where forward values feed several backward nodes,
// quadratically and cut it every few operations: one new kernel each). Reset after each cut. A
// stage can recompute nodes charged to an earlier one (only cuts are stored): a gradient's
// stage recomputes the forward values since the forward chain's last cut, up to about twice
// the count in all. A tensor read counts as an operation too (it is a buffer of the kernel), so
// a sum of thousands of tensors is cut as well.
std::unordered_set<const Node*> long_chain_cuts(const NodePtr& root) {
    std::unordered_map<const Node*, int64_t> ops;
    std::unordered_set<const Node*> charged;
    std::unordered_set<const Node*> cuts;
    for (const Node* n : postorder(root)) {
        int64_t c = n->op == OpKind::Leaf ? 1 : 0;
        if (is_elementwise(n->op) || is_reduction(n->op)) {
            c = 1;
            for (auto& i : n->inputs)
                if (charged.insert(i.get()).second) c += ops[i.get()];
        }
        if (c > kMaxStageOperations && is_elementwise(n->op)) {
            cuts.insert(n);
            c = 0;
        }
        ops[n] = c;
    }
    return cuts;
}

std::string ctx_str(const StageContext& c) {
    if (!c.any_reduced()) return fmt::format("elementwise stage over {}", shape_str(c.domain));
    std::vector<int> axes;
    for (size_t i = 0; i < c.reduced.size(); ++i)
        if (c.reduced[i]) axes.push_back((int)i);
    return fmt::format("stage over {} reducing axes ({})", shape_str(c.domain), fmt::join(axes, ", "));
}

// The walk is depth-first over the operands, in order; materialising a node walks its subtree
// in a stage context of its own and then records it, so a stage's inputs are recorded before
// the stage. It runs on an explicit stack: an expression's depth costs memory, not call stack.
struct Legality {
    LegalityResult res;
    std::unordered_set<const Node*> done;  // materialized already
    const std::unordered_set<const Node*>& cuts = res.cuts;  // long_chain_cuts

    struct Walk {  // one stage's context and the nodes its walk has met
        StageContext ctx;
        std::unordered_set<const Node*> seen;
    };
    struct Task {
        const NodePtr* node;
        size_t walk;
        bool in_full;   // inside the operand of a full reduction fused into this stage
        bool is_root;   // the node this stage computes (already marked done when materialized)
        bool record;    // record `node` as materialized, its subtree walked
        std::string why;
    };
    std::deque<Walk> walks;
    std::vector<Task> stack;

    void materialize(const NodePtr& n, std::string why) {
        if (done.count(n.get())) return;
        done.insert(n.get());
        stack.push_back({&n, 0, false, false, true, std::move(why)});
        process(n->op == OpKind::Reshape ? n->inputs[0] : n, n->op == OpKind::Reshape ? n->inputs[0]->shape : n->shape);
    }

    void process(const NodePtr& root, const Shape& dst_shape) {
        walks.push_back({choose_context(root, dst_shape, cuts), {}});
        stack.push_back({&root, walks.size() - 1, false, true, false, {}});
    }

    void run() {
        while (!stack.empty()) {
            Task t = std::move(stack.back());
            stack.pop_back();
            if (t.record) {
                res.reasons[t.node->get()] = std::move(t.why);
                res.materialized.push_back(*t.node);
            } else {
                visit(*t.node, t.walk, t.in_full, t.is_root);
            }
        }
    }

    void push_visit(const NodePtr& n, size_t walk, bool in_full) { stack.push_back({&n, walk, in_full, false, false, {}}); }

    void visit(const NodePtr& np, size_t walk, bool in_full, bool is_root) {
        const Node& n = *np;
        if ((done.count(&n) && !is_root) || !walks[walk].seen.insert(&n).second) return;
        const StageContext& ctx = walks[walk].ctx;
        if (!is_root && cuts.count(&n)) {
            materialize(np, fmt::format("%{} ends a chain of more than {} operations: it is computed in a stage of its own",
                                        n.id, kMaxStageOperations));
            return;
        }
        switch (n.op) {
        case OpKind::Leaf: case OpKind::Scalar: case OpKind::Rand: case OpKind::Iota: return;
        case OpKind::Reshape:
            materialize(np, fmt::format("%{} reshapes a computed expression: its operand %{} is written to memory first",
                                        n.id, n.inputs[0]->id));
            return;
        case OpKind::Take:
            push_visit(n.inputs[1], walk, in_full);  // after the source's stage, which is pushed above it
            if (n.inputs[0]->op != OpKind::Leaf)
                materialize(n.inputs[0], fmt::format("%{} is gathered from by take %{}: it must be in memory",
                                                     n.inputs[0]->id, n.id));
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
            push_visit(n.inputs[0], walk, ctx.full());
            return;
        }
        for (size_t i = n.inputs.size(); i-- > 0;) push_visit(n.inputs[i], walk, in_full);
    }
};

} // namespace

StageContext choose_context(const NodePtr& root, const Shape& dst_shape, const std::unordered_set<const Node*>& cuts) {
    for (const Node* r : frontier_reductions(root, cuts)) {
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
    l.res.cuts = long_chain_cuts(root);
    l.process(root, dst_shape);
    l.run();
    return std::move(l.res);
}

} // namespace kiln
