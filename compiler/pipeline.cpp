#include "compiler/pipeline.hpp"

#include "compiler/canonicalise.hpp"
#include "compiler/cse.hpp"
#include "compiler/legality.hpp"
#include "compiler/log.hpp"
#include "compiler/partition.hpp"
#include "ir/node.hpp"
#include "ir/view_ops.hpp"

#include <fmt/format.h>

#include <unordered_set>

namespace kiln {

namespace {

// The passes before lowering: canonicalise, cse, legality, partition.
Plan plan_assignment(const NodePtr& expr, const View& dst_in, bool debug) {
    View dst = dst_in;
    NodePtr root = expr;
    // A reshape at the root (sum(..., keepdims=false)) is a reshape of the destination instead.
    while (root->op == OpKind::Reshape && root->shape == dst.shape) {
        auto v = reshape_view(dst, root->inputs[0]->shape);
        if (!v) break;
        dst = *v;
        root = root->inputs[0];
    }
    // A literal stored alone takes the destination's dtype when that holds more than float32 or
    // int32 does (a Python float into a float64 tensor stays the double it is).
    // (A float literal into a 64-bit integer goes through float64, then the cast.)
    // An integer literal into a 64-bit integer keeps its exact value (cast of a scalar, ir/expr.cpp).
    if (root->op == OpKind::Scalar && root->weak && is_wide(dst.dtype) && (is_float(root->dtype) || is_float(dst.dtype)))
        root = scalar(root->value, is_float(root->dtype) && !is_float(dst.dtype) ? DType::Float64 : dst.dtype).node();
    if (root->dtype != dst.dtype) root = cast(Expr(root), dst.dtype).node();
    if (debug) log_debug("lowering assignment to {} {}:\n{}", dtype_name(dst.dtype), shape_str(dst.shape), graph_str(root));

    CanonicaliseStats cs;
    root = canonicalise(root, &cs);
    if (debug) {
        if (cs.changed())
            log_debug("after canonicalise ({} folded, {} identities, {} squares, {} operand orders):\n{}", cs.folded,
                      cs.identities, cs.squares, cs.reordered, graph_str(root));
        else
            log_debug("canonicalise: no change");
    }

    CseStats es;
    root = cse(root, debug ? &es : nullptr);   // the statistics walk the graph three more times
    if (debug) {
        std::string shared;
        for (auto& s : es.shared) shared += "  cse: " + s + "\n";
        // Nodes are hash-consed when built, so the merging shows as the difference between the
        // expression as written and the graph.
        if (es.changed())
            log_debug("after cse ({} operations as written, {} nodes merged now, {} distinct):\n{}{}", es.written, es.merged,
                      es.nodes, shared, graph_str(root));
        else if (es.written > es.nodes)
            log_debug("cse: {} operations as written, {} distinct (merged when built; the pass changed nothing more)\n{}",
                      es.written, es.nodes, shared);
        else
            log_debug("cse: no change ({} nodes, no shared subtree)", es.nodes);
    }

    LegalityResult legal = legality(root, dst.shape);
    if (debug) {
        if (legal.materialized.empty()) log_debug("legality: no change (every reduction fuses into its consumer)");
        else
            for (auto& m : legal.materialized) log_debug("legality: split: {}", legal.reasons[m.get()]);
    }

    Plan plan = partition(root, dst, legal);
    if (debug) log_debug("partition: {} stage(s)\n{}", plan.stages.size(), plan.str());
    return plan;
}

void lower_stages(CompiledAssignment& ca, const std::string& target, const LowerOptions& opts, bool debug) {
    for (auto& st : ca.plan.stages) {
        ca.stages.push_back(lower(st, target, opts));
        if (debug) log_debug("lowered {}:\n{}", ca.stages.back().kernel.name, kir::to_string(ca.stages.back().kernel));
    }
}

// Sibling reductions share one kernel when each is a single column or full reduction stage
// over the same domain, straight into a destination that holds one value per parallel point
// (stored once, after the loop), and no destination is memory that an expression reads or
// another destination holds (a kernel's outputs are never read by it). Expressions that draw
// random numbers are left apart: separate assignments draw separately.
bool siblings(const std::vector<Plan>& plans, const std::vector<std::pair<NodePtr, View>>& list) {
    if (plans.size() < 2) return false;
    const Stage& first = plans[0].stages[0];
    for (const Plan& p : plans) {
        if (!p.temps.empty() || p.stages.size() != 1) return false;
        const Stage& st = p.stages[0];
        if ((st.kind != StageKind::ColumnReduction && st.kind != StageKind::FullReduction) || st.out.is_temp ||
            st.domain != first.domain || st.reduced != first.reduced)
            return false;
        const Shape& o = st.out.shape;
        for (size_t d = 0; d < st.domain.size(); ++d) {
            const size_t back = st.domain.size() - d;   // right-aligned
            if (st.reduced[d] && st.domain[d] != 1 && back <= o.size() && o[o.size() - back] != 1) return false;
        }
    }
    std::unordered_set<const Storage*> written;
    for (const auto& [e, dst] : list)
        if (!written.insert(dst.storage.get()).second) return false;
    for (const auto& [e, dst] : list)
        for (const Node* n : postorder(e))
            if ((n->op == OpKind::Leaf && written.count(n->view.storage.get())) || n->op == OpKind::Rand) return false;
    return true;
}

} // namespace

CompiledAssignment compile_assignment(const NodePtr& expr, const View& dst, const std::string& target,
                                      const LowerOptions& opts) {
    const bool debug = log_level() >= LogLevel::Debug;
    CompiledAssignment ca;
    ca.plan = plan_assignment(expr, dst, debug);
    lower_stages(ca, target, opts, debug);
    return ca;
}

CompiledAssignment compile_together(const std::vector<std::pair<NodePtr, View>>& list, const std::string& target,
                                    const LowerOptions& opts) {
    const bool debug = log_level() >= LogLevel::Debug;
    std::vector<Plan> plans;
    for (const auto& [e, dst] : list) plans.push_back(plan_assignment(e, dst, debug));
    CompiledAssignment ca;
    if (!siblings(plans, list)) {
        if (debug) log_debug("together: not siblings; each assignment runs on its own");
        return ca;
    }
    Stage st = std::move(plans[0].stages[0]);
    for (size_t i = 1; i < plans.size(); ++i) st.siblings.push_back({plans[i].stages[0].root, plans[i].stages[0].out});
    st.why = fmt::format("{} sibling reductions stored by one kernel", plans.size());
    ca.plan.stages.push_back(std::move(st));
    if (debug) log_debug("together: one stage\n{}", ca.plan.str());
    lower_stages(ca, target, opts, debug);
    return ca;
}

} // namespace kiln
