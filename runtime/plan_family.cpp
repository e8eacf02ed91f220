#include "runtime/plan_family.hpp"

#include "runtime/signature_walk.hpp"

#include <algorithm>

namespace kiln {

namespace {

// The two kinds of family, the key's first word.
enum : uint64_t { kElementwise = 1, kOuter = 2 };
constexpr uint64_t kAnyExtent = ~uint64_t(0);   // the outer family's first dim, left out

// The signature's walk with the sizes left out: `put_shape` writes a node's shape (false: the
// assignment is in no family of this kind), `put_view` a view's layout.
template <class PutShape, class PutView>
bool family_words(const NodePtr& root, const View& dst, uint64_t options, uint64_t kind, AssignmentSignature& out,
                  PutShape&& put_shape, PutView&& put_view) {
    // (The caller wrote the kind first: out.words[0].)
    out.words.push_back(options);
    out.words.push_back((uint64_t)dst.dtype);
    if (!put_shape(dst.shape) || !put_view(dst)) return false;
    std::vector<const Node*> rands;
    auto admit = [&](const Node& n) {
        return is_elementwise(n.op) || (kind == kOuter && is_reduction(n.op)) || n.op == OpKind::Leaf ||
               n.op == OpKind::Scalar || n.op == OpKind::Rand;
    };
    if (!walk_signature(root, out, rands, admit, put_shape, put_view)) return false;
    out.hash = signature_hash(out.words);
    return true;
}

bool elementwise_signature(const NodePtr& root, const View& dst, uint64_t options, AssignmentSignature& out) {
    if (dst.shape.empty()) return false;
    // Every shape is the destination's (1) or rank 0 (0); the destination's rank and its dims of
    // size 1 are written first.
    out.words.push_back(kElementwise);
    out.words.push_back(dst.shape.size());
    for (int64_t d : dst.shape) out.words.push_back(d == 1);
    auto put_shape = [&](const Shape& s) {
        if (!s.empty() && s != dst.shape) return false;
        out.words.push_back(s.empty() ? 0 : 1);
        return true;
    };
    // Dense strides exactly, size-1 dims' too: the partition tells a destination read in place
    // from another view of it by their layouts.
    auto put_view = [&](const View& v) {
        if (v.strides != contiguous_strides(v.shape)) return false;
        out.words.push_back(storage_class_of(out, v.storage.get()));
        out.words.push_back((uint64_t)v.offset);
        return true;
    };
    return family_words(root, dst, options, kElementwise, out, put_shape, put_view);
}

// The greatest rank of the assignment's shapes, and the extent of their first dim there (every
// shape of that rank has it or 1); 0 where there is none past 1.
std::pair<size_t, int64_t> outer_extent(const NodePtr& root, const View& dst) {
    size_t rank = dst.shape.size();
    const std::vector<const Node*> order = postorder(root);
    for (const Node* n : order) rank = std::max(rank, n->shape.size());
    int64_t extent = 0;
    auto take = [&](const Shape& s) {
        if (s.size() != rank || s[0] == 1) return true;
        if (extent && s[0] != extent) return false;
        extent = s[0];
        return true;
    };
    if (rank == 0 || !take(dst.shape)) return {0, 0};
    for (const Node* n : order)
        if (!take(n->shape)) return {0, 0};
    return {rank, extent};
}

bool outer_signature(const NodePtr& root, const View& dst, uint64_t options, AssignmentSignature& out, Shape& at) {
    const auto [rank, extent] = outer_extent(root, dst);
    if (extent == 0) return false;
    at.assign(rank, 1);
    at[0] = extent;
    out.words.push_back(kOuter);
    // Every size as it is, but the first dim's of the shapes of the greatest rank where it is
    // not 1; views' strides and offsets as they are (a view whose strides depend on that
    // extent is then another family at every extent).
    auto put_shape = [&, rank = rank](const Shape& s) {
        out.words.push_back(s.size());
        for (size_t j = 0; j < s.size(); ++j)
            out.words.push_back(j == 0 && s.size() == rank && s[0] != 1 ? kAnyExtent : (uint64_t)s[j]);
        return true;
    };
    auto put_view = [&](const View& v) {
        out.words.push_back(storage_class_of(out, v.storage.get()));
        out.words.push_back((uint64_t)v.offset);
        for (int64_t s : v.strides) out.words.push_back((uint64_t)s);
        return true;
    };
    return family_words(root, dst, options, kOuter, out, put_shape, put_view);
}

// The template's plan at `to` (from `from`: PlanFamilies::signature's `at`). Elementwise: the merged
// dim's size, and the views and domain of that shape. Outer (the first dim's extent `from[0]`
// -> `to[0]`, the rank from.size()): in every shape of that rank whose first dim has it, it;
// in each stage over such a domain, the merged dim that holds it (the first, or the second
// behind the lone leading dim a full reduction of several passes gets). Nothing else changes:
// no stride of a dense view depends on its first dim's extent.
std::optional<CachedPlan> resized(uint64_t kind, const CachedPlan& t, const Shape& from, const Shape& to) {
    CachedPlan p = t;
    if (kind == kElementwise) {
        CachedStage& st = p.stages[0];
        st.args.sizes[0] = numel(to);
        st.domain = to;
        const Strides strides = contiguous_strides(to);
        for (BufferSource& s : st.sources)
            if (!s.is_temp && s.view.shape == from) s.view.shape = to, s.view.strides = strides;
        return p;
    }
    const size_t rank = from.size();
    const int64_t a = from[0], b = to[0];
    auto resize = [&](Shape& s) {
        if (s.size() == rank && s[0] == a) s[0] = b;
    };
    for (TempBuffer& temp : p.temps) resize(temp.shape);
    for (CachedStage& st : p.stages) {
        if (st.domain.size() == rank && st.domain[0] == a) {
            std::vector<int64_t>& sizes = st.args.sizes;
            const size_t k = !sizes.empty() && sizes[0] % a == 0 ? 0 : sizes.size() > 1 && sizes[0] == 1 && sizes[1] % a == 0 ? 1 : sizes.size();
            if (k == sizes.size()) return std::nullopt;
            sizes[k] = sizes[k] / a * b;
        }
        resize(st.domain);
        for (BufferSource& s : st.sources)
            if (!s.is_temp) resize(s.view.shape);
    }
    return p;
}

// Whether `p`, planned for a destination of shape `shape`, has the form the elementwise resize
// assumes: one stage, no temporaries, one merged dim of the destination's size, every buffer
// read along it (stride 1) or broadcast (0), every view of that shape, contiguous, or of rank 0.
bool elementwise_form(const CachedPlan& p, const Shape& shape) {
    if (p.in_order || !p.temps.empty() || p.stages.size() != 1) return false;
    const CachedStage& st = p.stages[0];
    if (st.code->kernel.rank != 1 || st.args.sizes != std::vector<int64_t>{numel(shape)} || st.domain != shape)
        return false;
    for (int64_t s : st.args.strides)
        if (s != 0 && s != 1) return false;
    const Strides strides = contiguous_strides(shape);
    for (const BufferSource& s : st.sources)
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
    for (size_t i = 0; i < a.temps.size(); ++i)
        if (a.temps[i].shape != b.temps[i].shape || a.temps[i].dtype != b.temps[i].dtype) return false;
    for (size_t i = 0; i < a.stages.size(); ++i) {
        const CachedStage &x = a.stages[i], &y = b.stages[i];
        if (x.kernel != y.kernel || x.storage_class != y.storage_class || x.domain != y.domain ||
            (x.code != y.code && (x.code->key != y.code->key || x.code->kernel.name != y.code->kernel.name)) ||
            x.args.sizes != y.args.sizes || x.args.strides != y.args.strides ||
            !same_bits(x.args.fparams, y.args.fparams) || x.args.iparams != y.args.iparams ||
            x.args.buffers.size() != y.args.buffers.size() || x.sources.size() != y.sources.size() ||
            x.rands.size() != y.rands.size())
            return false;
        for (size_t s = 0; s < x.sources.size(); ++s) {
            const BufferSource &u = x.sources[s], &v = y.sources[s];
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
        for (size_t r = 0; r < x.rands.size(); ++r)
            if (place(x.rands, r) != place(y.rands, r) || x.rands[r].seed_slot != y.rands[r].seed_slot ||
                x.rands[r].counter_slot != y.rands[r].counter_slot)
                return false;
    }
    return true;
}

} // namespace

bool PlanFamilies::signature(const NodePtr& root, const View& dst, uint64_t options, AssignmentSignature& out,
                             Shape& at) const {
    out.words.clear();
    out.storages.clear();
    if (elementwise_signature(root, dst, options, out)) {
        // (An elementwise family refused, its plans of several stages, leaves the outer kind.)
        const auto it = families_.find(out.words);
        if (it == families_.end() || it->second.state != State::Refused) {
            at = dst.shape;
            return true;
        }
    }
    out.words.clear();
    out.storages.clear();
    return outer_signature(root, dst, options, out, at);
}

size_t PlanFamilies::Hash::operator()(const std::vector<uint64_t>& w) const { return signature_hash(w); }

std::optional<CachedPlan> PlanFamilies::resize(const AssignmentSignature& fam, const Shape& shape) const {
    const auto it = families_.find(fam.words);
    if (it == families_.end() || it->second.state != State::Checked) return std::nullopt;
    return resized(fam.words[0], it->second.plan, it->second.shape, shape);
}

void PlanFamilies::learn(const AssignmentSignature& fam, const Shape& shape, const CachedPlan& plan) {
    const uint64_t kind = fam.words[0];
    const auto it = families_.find(fam.words);
    if (it == families_.end()) {
        if (families_.size() >= capacity_) families_.clear();
        Family f;
        f.shape = shape;
        if (kind == kOuter || elementwise_form(plan, shape)) f.plan = plan;
        else f.state = State::Refused;
        families_.emplace(fam.words, std::move(f));
        return;
    }
    // A second shape of the template's element count shows nothing of the sizes: the check
    // waits for one that differs.
    Family& f = it->second;
    if (f.state != State::Unchecked || numel(shape) == numel(f.shape)) return;
    const std::optional<CachedPlan> r = resized(kind, f.plan, f.shape, shape);
    f.state = r && same_plan(*r, plan) ? State::Checked : State::Refused;
    if (f.state == State::Refused) f.plan = CachedPlan{};
}

} // namespace kiln
