#include "compiler/partition.hpp"

#include "ir/error.hpp"

#include <fmt/format.h>

#include <unordered_set>

namespace kiln {

const char* stage_kind_name(StageKind k) {
    switch (k) {
    case StageKind::Elementwise: return "elementwise";
    case StageKind::RowReduction: return "row reduction";
    case StageKind::ColumnReduction: return "column reduction";
    case StageKind::FullReduction: return "full reduction";
    }
    return "?";
}

std::string Plan::str() const {
    std::string s;
    for (size_t i = 0; i < stages.size(); ++i) {
        const Stage& st = stages[i];
        std::string more;
        for (const Stage::Sibling& sib : st.siblings) more += fmt::format(", destination (root %{})", sib.root->id);
        s += fmt::format("  stage {}: {} over {} -> {} (root %{}){}{}\n", i, stage_kind_name(st.kind), shape_str(st.domain),
                         st.out.is_temp ? fmt::format("temp{}", st.out.temp) : std::string("destination"), st.root->id,
                         more, st.why.empty() ? "" : ": " + st.why);
    }
    return s;
}

namespace {

StageKind classify(const StageContext& c) {
    if (!c.any_reduced()) return StageKind::Elementwise;
    if (c.full()) return StageKind::FullReduction;
    // Row: nothing but size-1 dims after the reduced axis, so the reduced elements are adjacent.
    int last = -1;
    for (size_t i = 0; i < c.reduced.size(); ++i)
        if (c.reduced[i]) last = (int)i;
    for (size_t i = last + 1; i < c.domain.size(); ++i)
        if (c.domain[i] != 1) return StageKind::ColumnReduction;
    return StageKind::RowReduction;
}

// Leaves of the stage rooted at `root` (stopping at nodes computed by earlier stages).
void stage_leaves(const Node* root, const std::unordered_map<const Node*, int>& temps, std::unordered_set<const Node*>& seen,
                  std::vector<const Node*>& out) {
    std::vector<const Node*> stack{root};  // operands pushed in reverse: met first to last
    while (!stack.empty()) {
        const Node* n = stack.back();
        stack.pop_back();
        if (!seen.insert(n).second || temps.count(n)) continue;
        if (n->op == OpKind::Leaf) { out.push_back(n); continue; }
        for (size_t i = n->inputs.size(); i-- > 0;) stack.push_back(n->inputs[i].get());
    }
}

// The temporaries a stage rooted at `root` reads: those met walking down from it, stopping at
// each (its own root, when the stage only copies a temporary). Only these, not every temporary
// made so far, so that a chain of N materialised nodes plans in O(N) memory rather than O(N^2).
std::unordered_map<const Node*, int> temps_read(const Node* root, const std::unordered_map<const Node*, int>& temps) {
    std::unordered_map<const Node*, int> read;
    std::unordered_set<const Node*> seen;
    std::vector<const Node*> stack{root};
    while (!stack.empty()) {
        const Node* n = stack.back();
        stack.pop_back();
        if (!seen.insert(n).second) continue;
        if (auto t = temps.find(n); t != temps.end()) {
            read.emplace(n, t->second);
            continue;
        }
        for (const NodePtr& in : n->inputs) stack.push_back(in.get());
    }
    return read;
}

} // namespace

Plan partition(const NodePtr& root, const View& dst, const LegalityResult& legal) {
    Plan plan;
    std::unordered_map<const Node*, int> temp_of;  // materialized node -> temp

    auto add_stage = [&](const NodePtr& stage_root, StageOutput out, std::string why) {
        Stage st;
        // A stage whose root was computed earlier only copies it.
        StageContext c = temp_of.count(stage_root.get())
                             ? StageContext{out.shape, std::vector<bool>(out.shape.size(), false)}
                             : choose_context(stage_root, out.shape, legal.cuts);
        st.kind = classify(c);
        st.root = stage_root;
        st.domain = c.domain;
        st.reduced = c.reduced;
        st.out = std::move(out);
        st.inputs_from_temps = temps_read(stage_root.get(), temp_of);
        st.why = std::move(why);
        plan.stages.push_back(std::move(st));
    };

    for (const NodePtr& m : legal.materialized) {
        const NodePtr& computed = m->op == OpKind::Reshape ? m->inputs[0] : m;
        int t = (int)plan.temps.size();
        plan.temps.push_back({computed->shape, computed->dtype});
        StageOutput out;
        out.is_temp = true;
        out.temp = t;
        out.shape = computed->shape;
        out.dtype = computed->dtype;
        auto it = legal.reasons.find(m.get());
        add_stage(computed, out, it == legal.reasons.end() ? "" : it->second);
        temp_of[computed.get()] = t;
        temp_of[m.get()] = t;  // a Reshape reads the same contiguous memory under its own shape
    }

    // Overlap: the destination's storage read through another view than the destination.
    std::vector<const Node*> leaves;
    std::unordered_set<const Node*> seen;
    stage_leaves(root.get(), temp_of, seen, leaves);
    bool overlap = false;
    for (const Node* l : leaves)
        if (l->view.storage == dst.storage && !l->view.same_layout(dst)) overlap = true;
    // take() reads its source at other positions than the one being written, whatever the view.
    for (const Node* n : postorder(root))
        if (n->op == OpKind::Take && !temp_of.count(n->inputs[0].get()) && n->inputs[0]->op == OpKind::Leaf &&
            n->inputs[0]->view.storage == dst.storage)
            overlap = true;

    StageOutput final_out;
    final_out.view = dst;
    final_out.shape = dst.shape;
    final_out.dtype = dst.dtype;
    if (!overlap) {
        add_stage(root, final_out, "");
        return plan;
    }
    int t = (int)plan.temps.size();
    plan.temps.push_back({root->shape, root->dtype});
    StageOutput tmp;
    tmp.is_temp = true;
    tmp.temp = t;
    tmp.shape = root->shape;
    tmp.dtype = root->dtype;
    add_stage(root, tmp, "the destination's memory is also read through another view: computed into a temporary");
    temp_of[root.get()] = t;
    add_stage(root, final_out, "copy of the temporary into the destination");
    return plan;
}

} // namespace kiln
