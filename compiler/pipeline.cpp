#include "compiler/pipeline.hpp"

#include "compiler/canonicalise.hpp"
#include "compiler/cse.hpp"
#include "compiler/legality.hpp"
#include "compiler/log.hpp"
#include "compiler/partition.hpp"
#include "ir/node.hpp"
#include "ir/view_ops.hpp"

namespace kiln {

CompiledAssignment compile_assignment(const NodePtr& expr, const View& dst_in, const std::string& target,
                                      const LowerOptions& opts) {
    const bool debug = log_level() >= LogLevel::Debug;
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
            log_debug("after canonicalise ({} folded, {} identities, {} operand orders):\n{}", cs.folded, cs.identities,
                      cs.reordered, graph_str(root));
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

    CompiledAssignment ca;
    ca.plan = partition(root, dst, legal);
    if (debug) log_debug("partition: {} stage(s)\n{}", ca.plan.stages.size(), ca.plan.str());

    for (auto& st : ca.plan.stages) {
        ca.stages.push_back(lower(st, target, opts));
        if (debug) log_debug("lowered {}:\n{}", ca.stages.back().kernel.name, kir::to_string(ca.stages.back().kernel));
    }
    return ca;
}

} // namespace kiln
