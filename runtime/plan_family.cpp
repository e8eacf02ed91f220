#include "runtime/plan_family.hpp"

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace kiln {

namespace {

uint64_t double_bits(double v) {
    uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}

// The template's plan with its destination's shape `from` replaced by `to`: the merged dim's
// size and the views of that shape (resizable said that is all there is).
CachedPlan resized(const CachedPlan& t, const Shape& from, const Shape& to) {
    CachedPlan p = t;
    LoweredStage& ls = p.stages[0].lowered;
    ls.args.sizes[0] = numel(to);
    const Strides strides = contiguous_strides(to);
    for (BufferSource& s : ls.sources)
        if (!s.is_temp && s.view.shape == from) s.view.shape = to, s.view.strides = strides;
    return p;
}

// Whether `p`, planned for a destination of shape `shape`, has the form resized assumes: one
// stage, no temporaries, one merged dim of the destination's size, every buffer read along it
// (stride 1) or broadcast (0), every view of that shape, contiguous, or of rank 0.
bool resizable(const CachedPlan& p, const Shape& shape) {
    if (p.in_order || !p.temps.empty() || p.stages.size() != 1) return false;
    const LoweredStage& ls = p.stages[0].lowered;
    if (ls.kernel.rank != 1 || ls.args.sizes != std::vector<int64_t>{numel(shape)}) return false;
    for (int64_t s : ls.args.strides)
        if (s != 0 && s != 1) return false;
    const Strides strides = contiguous_strides(shape);
    for (const BufferSource& s : ls.sources)
        if (s.is_temp || !(s.view.shape.empty() || (s.view.shape == shape && s.view.strides == strides))) return false;
    return true;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Field by field: what execute() and the backends read of a plan.
bool same_plan(const CachedPlan& a, const CachedPlan& b) {
    if (a.in_order != b.in_order || a.temps.size() != b.temps.size() || a.stages.size() != b.stages.size()) return false;
    for (size_t i = 0; i < a.stages.size(); ++i) {
        const CachedStage &x = a.stages[i], &y = b.stages[i];
        const LoweredStage &p = x.lowered, &q = y.lowered;
        if (x.kernel != y.kernel || x.storage_class != y.storage_class || p.key != q.key || p.kernel.name != q.kernel.name ||
            p.args.sizes != q.args.sizes || p.args.strides != q.args.strides || !same_bits(p.args.fparams, q.args.fparams) ||
            p.args.iparams != q.args.iparams || p.args.buffers.size() != q.args.buffers.size() ||
            p.sources.size() != q.sources.size() || p.rands.size() != q.rands.size())
            return false;
        for (size_t s = 0; s < p.sources.size(); ++s) {
            const BufferSource &u = p.sources[s], &v = q.sources[s];
            if (u.is_temp != v.is_temp || u.temp != v.temp || u.view.dtype != v.view.dtype || u.view.shape != v.view.shape ||
                u.view.strides != v.view.strides || u.view.offset != v.view.offset)
                return false;
        }
        // A rand() node's serial is new with every call (it only tells draws apart within the
        // assignment): compared by its first place; stochastic rounding's serials by value.
        auto place = [](const std::vector<RandSlot>& rs, size_t r) -> uint64_t {
            if (rs[r].serial >= kRoundingSerial) return rs[r].serial;
            size_t first = 0;
            while (rs[first].serial != rs[r].serial) ++first;
            return first;
        };
        for (size_t r = 0; r < p.rands.size(); ++r)
            if (place(p.rands, r) != place(q.rands, r) || p.rands[r].seed_slot != q.rands[r].seed_slot ||
                p.rands[r].counter_slot != q.rands[r].counter_slot)
                return false;
    }
    return true;
}

} // namespace

bool family_signature(const NodePtr& root, const View& dst, uint64_t options, AssignmentSignature& out) {
    out.words.clear();
    out.storages.clear();
    if (dst.shape.empty() || !dst.is_contiguous()) return false;
    auto& w = out.words;
    auto storage_class = [&](Storage* s) -> uint64_t {
        for (size_t i = 0; i < out.storages.size(); ++i)
            if (out.storages[i] == s) return i;
        out.storages.push_back(s);
        return out.storages.size() - 1;
    };
    // Every shape is the destination's (1) or rank 0 (0); the destination's rank and its dims
    // of size 1 are written once.
    auto put_shape = [&](const Shape& s) {
        if (!s.empty() && s != dst.shape) return false;
        w.push_back(s.empty() ? 0 : 1);
        return true;
    };
    w.push_back(options);
    w.push_back((uint64_t)dst.dtype);
    w.push_back(dst.shape.size());
    for (int64_t d : dst.shape) w.push_back(d == 1);
    w.push_back(storage_class(dst.storage.get()));
    w.push_back((uint64_t)dst.offset);
    const std::vector<const Node*> order = postorder(root);
    std::unordered_map<const Node*, uint64_t> index;
    std::vector<const Node*> rands;
    for (size_t i = 0; i < order.size(); ++i) {
        const Node& n = *order[i];
        if (!is_elementwise(n.op) && n.op != OpKind::Leaf && n.op != OpKind::Scalar && n.op != OpKind::Rand) return false;
        w.push_back((uint64_t)n.op | (uint64_t)n.dtype << 8 | (uint64_t)n.weak << 16 | (uint64_t)n.inputs.size() << 24);
        if (!put_shape(n.shape)) return false;
        for (const NodePtr& in : n.inputs) w.push_back(index.at(in.get()));
        index.emplace(&n, i);
        switch (n.op) {
        case OpKind::Leaf:
            if (!n.view.is_contiguous()) return false;
            w.push_back(storage_class(n.view.storage.get()));
            w.push_back((uint64_t)n.view.offset);
            break;
        case OpKind::Scalar:
            w.push_back(double_bits(n.value));
            w.push_back((uint64_t)n.ivalue);
            break;
        case OpKind::Rand: {
            const auto it = std::find(rands.begin(), rands.end(), &n);
            w.push_back((uint64_t)(it - rands.begin()));
            if (it == rands.end()) rands.push_back(&n);
            break;
        }
        default: break;
        }
    }
    out.hash = signature_hash(out.words);
    return true;
}

size_t PlanFamilies::Hash::operator()(const std::vector<uint64_t>& w) const { return signature_hash(w); }

std::optional<CachedPlan> PlanFamilies::resize(const AssignmentSignature& fam, const Shape& shape) const {
    const auto it = families_.find(fam.words);
    if (it == families_.end() || it->second.state != State::Checked) return std::nullopt;
    return resized(it->second.plan, it->second.shape, shape);
}

void PlanFamilies::learn(const AssignmentSignature& fam, const Shape& shape, const CachedPlan& plan) {
    const auto it = families_.find(fam.words);
    if (it == families_.end()) {
        if (families_.size() >= capacity_) families_.clear();
        Family f;
        f.shape = shape;
        if (resizable(plan, shape)) f.plan = plan;
        else f.state = State::Refused;
        families_.emplace(fam.words, std::move(f));
        return;
    }
    Family& f = it->second;
    if (f.state != State::Unchecked || shape == f.shape) return;
    f.state = same_plan(resized(f.plan, f.shape, shape), plan) ? State::Checked : State::Refused;
    if (f.state == State::Refused) f.plan = CachedPlan{};
}

} // namespace kiln
