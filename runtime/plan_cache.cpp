#include "runtime/plan_cache.hpp"

#include "compiler/key.hpp"
#include "ir/error.hpp"
#include "runtime/signature_walk.hpp"

#include <cstring>

namespace kiln {

uint64_t double_bits(double v) {
    uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}

uint64_t storage_class_of(AssignmentSignature& sig, Storage* s) {
    for (size_t i = 0; i < sig.storages.size(); ++i)
        if (sig.storages[i] == s) return i;
    sig.storages.push_back(s);
    return sig.storages.size() - 1;
}

// A word at a time: it runs on every assignment, and byte-wise FNV over a few hundred bytes
// costs more than the rest of the lookup. In memory only, never persisted.
uint64_t signature_hash(const std::vector<uint64_t>& w) {
    uint64_t h = 0x243f6a8885a308d3ull ^ w.size();
    for (uint64_t x : w) {
        h = (h ^ x) * 0x9e3779b97f4a7c15ull;
        h ^= h >> 29;
    }
    return h;
}

namespace {

// Appends one assignment's words: the destination, then the graph in postorder (rands: as
// walk_signature's).
void append_assignment(const NodePtr& root, const View& dst, const char* op, AssignmentSignature& out,
                       std::vector<const Node*>& rands) {
    auto& w = out.words;
    auto put_view = [&](const View& v) {
        w.push_back(storage_class_of(out, v.storage.get()));
        w.push_back((uint64_t)v.offset);
        for (int64_t s : v.strides) w.push_back((uint64_t)s);
        return true;
    };
    auto put_shape = [&](const Shape& s) {
        w.push_back(s.size());
        for (int64_t d : s) w.push_back((uint64_t)d);
        return true;
    };
    auto written = [&](const Node& n) {
        if (n.op == OpKind::Leaf && !n.view.storage->written)
            fail(Error::Kind::Value,
                 "{}: reads a {} tensor of shape {} that was never written (created by empty() and not assigned); "
                 "assign it, or create it with zeros()/array()",
                 op, dtype_name(n.dtype), shape_str(n.shape));
        return true;
    };
    w.push_back((uint64_t)dst.dtype);
    put_shape(dst.shape);
    put_view(dst);
    walk_signature(root, out, rands, written, put_shape, put_view);
}

} // namespace

void assignment_signature(const NodePtr& root, const View& dst, uint64_t options, const char* op,
                          AssignmentSignature& out) {
    out.words.clear();
    out.storages.clear();
    out.words.push_back(options);
    std::vector<const Node*> rands;
    append_assignment(root, dst, op, out, rands);
    out.hash = signature_hash(out.words);
}

void together_signature(const std::vector<std::pair<NodePtr, View>>& list, uint64_t options, const char* op,
                        AssignmentSignature& out) {
    out.words.clear();
    out.storages.clear();
    out.words.push_back(options);
    out.words.push_back(~(uint64_t)list.size());   // apart from any single assignment's words
    std::vector<const Node*> rands;
    for (const auto& [root, dst] : list) append_assignment(root, dst, op, out, rands);
    out.hash = signature_hash(out.words);
}

CachedPlan make_cached_plan(CompiledAssignment&& ca, const AssignmentSignature& sig) {
    CachedPlan cp;
    cp.temps = std::move(ca.plan.temps);
    for (size_t i = 0; i < ca.stages.size(); ++i) {
        LoweredStage& ls = ca.stages[i];
        CachedStage cs;
        cs.domain = ca.plan.stages[i].domain;
        for (BufferSource& src : ls.sources) {
            if (src.is_temp) {
                cs.storage_class.push_back(-1);
                continue;
            }
            int cls = -1;
            for (size_t i = 0; i < sig.storages.size(); ++i)
                if (sig.storages[i] == src.view.storage.get()) cls = (int)i;
            KILN_CHECK_INTERNAL(cls >= 0, "make_cached_plan: a kernel buffer reads a storage the expression does not");
            cs.storage_class.push_back(cls);
            src.view.storage.reset();
        }
        cs.code = std::make_shared<const StageCode>(StageCode{std::move(ls.kernel), std::move(ls.key)});
        cs.args = std::move(ls.args);
        cs.sources = std::move(ls.sources);
        cs.rands = std::move(ls.rands);
        cp.stages.push_back(std::move(cs));
    }
    return cp;  // ca.plan's stages (which hold the graph, and so the tensors) die with ca
}

CachedPlan* PlanCache::find(const AssignmentSignature& sig) {
    auto [lo, hi] = index_.equal_range(sig.hash);
    for (auto it = lo; it != hi; ++it) {
        if (it->second->words != sig.words) continue;
        lru_.splice(lru_.begin(), lru_, it->second);  // iterators stay valid
        return &lru_.front().plan;
    }
    return nullptr;
}

CachedPlan* PlanCache::insert(const AssignmentSignature& sig, CachedPlan plan) {
    ++generation_;
    if (lru_.size() >= capacity_) {
        auto victim = std::prev(lru_.end());
        erase_index(victim);
        lru_.erase(victim);
    }
    lru_.push_front(Entry{sig.words, std::move(plan)});
    index_.emplace(sig.hash, lru_.begin());
    return &lru_.front().plan;
}

void PlanCache::erase_index(std::list<Entry>::iterator victim) {
    auto [lo, hi] = index_.equal_range(signature_hash(victim->words));
    for (auto it = lo; it != hi; ++it)
        if (it->second == victim) {
            index_.erase(it);
            return;
        }
}

void PlanCache::clear() {
    ++generation_;
    lru_.clear();
    index_.clear();
}

} // namespace kiln
