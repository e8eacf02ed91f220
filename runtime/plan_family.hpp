// New shapes of an assignment without the passes. A plan cache miss runs every pass and the
// lowering (tens of microseconds), yet many assignments lower to the same kernel at every
// shape and differ in nothing but sizes the plan holds as numbers. Two kinds of family, each
// keyed by the signature with some sizes left out:
//  - elementwise: elementwise ops over dense tensors (strides as contiguous_strides gives
//    them), every one of the destination's shape or rank 0 (the sizes left out, its dims of
//    size 1 kept: those are dropped). The lowering merges the dims into one; a new shape
//    changes its size and the views' shapes.
//  - outer: elementwise ops and reductions over any views, the extent of the first dim of the
//    shapes of the greatest rank left out (a batch size). No stride of a dense view depends on
//    it; a new extent changes the merged dim that holds it in each stage over it, and the
//    shapes of that rank that have it (temporaries, views, domains).
// The family's first plan is its template, and a later shape's plan is the template resized.
// The passes also plan the family's second element count, and that plan must equal the
// resized template, field by field, before the family makes plans: a lowering that read those
// sizes elsewhere would show there, and the family is then refused for good. Reshape, take and
// iota (whose lowering reads sizes) are in no family.
#pragma once
#include "runtime/plan_cache.hpp"

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace kiln {

class PlanFamilies {
public:
    explicit PlanFamilies(size_t capacity = 1024) : capacity_(capacity) {}
    // The family signature of `dst = root` into `out` (as assignment_signature's, sizes left
    // out) and into `at` what its plans are resized by (elementwise: the destination's shape;
    // outer: a shape of the greatest rank, its first dim the extent, the others 1), or false
    // where the assignment is in no family. The elementwise kind where it applies, unless its
    // family was refused. Call it after assignment_signature, which checks the operands.
    bool signature(const NodePtr& root, const View& dst, uint64_t options, AssignmentSignature& out, Shape& at) const;
    // The plan of the family `fam` at `at` (signature's), or nothing where the family is
    // unknown, not yet checked, or refused.
    std::optional<CachedPlan> resize(const AssignmentSignature& fam, const Shape& at) const;
    // `plan`, made by the passes at `at`: a new family's template, or the check of the family's
    // second shape.
    void learn(const AssignmentSignature& fam, const Shape& at, const CachedPlan& plan);
    size_t size() const { return families_.size(); }
    void clear() { families_.clear(); }
    // Drops every family whose template `pred` is true of.
    template <class Pred>
    void erase_if(Pred&& pred) {
        for (auto it = families_.begin(); it != families_.end();) it = pred(it->second.plan) ? families_.erase(it) : std::next(it);
    }

private:
    enum class State { Unchecked, Checked, Refused };
    struct Family {
        CachedPlan plan;   // the template
        Shape shape;       // its `at`
        State state = State::Unchecked;
    };
    struct Hash {
        size_t operator()(const std::vector<uint64_t>& w) const;
    };
    size_t capacity_;
    std::unordered_map<std::vector<uint64_t>, Family, Hash> families_;
};

} // namespace kiln
