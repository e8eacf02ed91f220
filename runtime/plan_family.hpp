// New shapes of an elementwise assignment without the passes. A plan cache miss runs every pass
// and the lowering (tens of microseconds), yet an elementwise assignment over contiguous
// tensors that differs from one already planned only in its sizes lowers to the same kernel:
// with every operand of the destination's shape (or rank 0) and every view contiguous, the
// lowering merges the dims into one and reads the sizes nowhere else. Such assignments form a
// family, keyed by the signature with the sizes left out (which dims are 1 stays in: those
// dims are dropped); the family's first plan is its template, and a later shape's plan is the
// template with the merged size and the views' shapes replaced (resize). The passes also plan
// the family's second shape, and that plan must equal the resized template, field by field,
// before the family makes plans: a lowering that read the sizes elsewhere would show there, and
// the family is then refused for good. Only elementwise ops, leaves, scalars and rand() are
// admitted (no reduction, reshape, take or iota, whose lowering reads sizes).
#pragma once
#include "runtime/plan_cache.hpp"

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace kiln {

// The family signature of `dst = root` into `out` (as assignment_signature's, the sizes left
// out), or false where the assignment belongs to no family. Call it after
// assignment_signature, which checks the operands.
bool family_signature(const NodePtr& root, const View& dst, uint64_t options, AssignmentSignature& out);

class PlanFamilies {
public:
    explicit PlanFamilies(size_t capacity = 1024) : capacity_(capacity) {}
    // The plan of the family `fam` for a destination of shape `shape`, or nothing where the
    // family is unknown, not yet checked, or refused.
    std::optional<CachedPlan> resize(const AssignmentSignature& fam, const Shape& shape) const;
    // `plan`, made by the passes for `shape`: a new family's template, or the check of the
    // family's second shape.
    void learn(const AssignmentSignature& fam, const Shape& shape, const CachedPlan& plan);
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
        Shape shape;       // its destination's
        State state = State::Unchecked;
    };
    struct Hash {
        size_t operator()(const std::vector<uint64_t>& w) const;
    };
    size_t capacity_;
    std::unordered_map<std::vector<uint64_t>, Family, Hash> families_;
};

} // namespace kiln
