// The plan cache: what makes a repeated assignment cost microseconds. Running the passes and
// the lowering takes tens of microseconds, so each Context remembers, per *assignment
// signature*, the lowered stages and the backend's compiled kernels. The signature is the
// graph's structure — ops, dtypes, shapes, attributes, scalar values, views' strides and
// offsets — with tensors replaced by the order in which their storages first appear (the
// destination's first). Two assignments with equal signatures compile to identical plans, so
// a hit only rebinds the buffers of the cached stages to this call's storages. Storage
// identity classes are part of the signature because aliasing (an operand overlapping the
// destination) changes the plan. A new shape is a new signature: it runs the passes again,
// and its kernels are found in the kernel cache (kernel keys do not contain sizes), unless
// its plan family resizes another shape's plan (plan_family.hpp).
#pragma once
#include "compiler/pipeline.hpp"

#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

namespace kiln {

struct AssignmentSignature {
    std::vector<uint64_t> words;
    uint64_t hash = 0;
    std::vector<Storage*> storages;  // storage class -> this call's storage (0: the destination's)
};

// The hash of a signature's words.
uint64_t signature_hash(const std::vector<uint64_t>& words);
// A signature's pieces: the storage class of `s` (its place in sig.storages, added where new),
// and a scalar's bits.
uint64_t storage_class_of(AssignmentSignature& sig, Storage* s);
uint64_t double_bits(double v);

// Builds the signature of `dst = root` into `out` (reusing its memory). Throws kiln::Error when
// an operand was never written (`op` names the user call in the message). `options` folds in
// context settings that change the lowering.
void assignment_signature(const NodePtr& root, const View& dst, uint64_t options, const char* op,
                          AssignmentSignature& out);

// The same for several assignments run together (compile_together): their storages share one
// numbering, the first destination's first.
void together_signature(const std::vector<std::pair<NodePtr, View>>& list, uint64_t options, const char* op,
                        AssignmentSignature& out);

// A stage's kernel IR and key, which never change once lowered: shared by the plans a family
// resizes from one another (plan_family.cpp), which copy only what a new shape changes.
struct StageCode {
    kir::Kernel kernel;
    std::string key;
};

// A lowered stage as a cached plan holds it: its code shared, what a launch reads its own.
struct CachedStage {
    std::shared_ptr<const StageCode> code;
    kir::LaunchArgs args;               // buffer pointers resolved from `sources` at each run
    std::vector<BufferSource> sources;  // per kernel buffer; views hold no storage, see storage_class
    std::vector<RandSlot> rands;
    std::vector<int> storage_class;  // per kernel buffer: its storage class, or -1 for a temp
    const void* kernel = nullptr;    // the backend's compiled kernel
    Shape domain;                    // the stage's iteration space (plan_family.cpp resizes it)
};

struct CachedPlan {
    std::vector<TempBuffer> temps;
    std::vector<CachedStage> stages;
    // assign_together's plan for assignments that are not siblings: none of its own (no stages);
    // each assignment runs as assign() runs it.
    bool in_order = false;
};

// Detaches a compiled assignment from the tensors it was compiled for (a cached plan must not
// keep them alive) and records which storage class each buffer reads.
CachedPlan make_cached_plan(CompiledAssignment&& ca, const AssignmentSignature& sig);

class PlanCache {
public:
    explicit PlanCache(size_t capacity = 4096) : capacity_(capacity) {}
    CachedPlan* find(const AssignmentSignature& sig);
    CachedPlan* insert(const AssignmentSignature& sig, CachedPlan plan);  // evicts the least recently used
    size_t size() const { return lru_.size(); }
    void clear();
    // Drops every plan for which `pred` is true.
    template <class Pred>
    void erase_if(Pred&& pred) {
        for (auto it = lru_.begin(); it != lru_.end();) {
            if (!pred(it->plan)) { ++it; continue; }
            erase_index(it);
            it = lru_.erase(it);
            ++generation_;
        }
    }
    // Changes whenever a plan is added or dropped: a plan pointer taken at one generation is
    // valid while it lasts.
    uint64_t generation() const { return generation_; }

private:
    struct Entry {
        std::vector<uint64_t> words;
        CachedPlan plan;
    };
    void erase_index(std::list<Entry>::iterator victim);
    size_t capacity_;
    uint64_t generation_ = 0;
    std::list<Entry> lru_;  // most recent first
    std::unordered_multimap<uint64_t, std::list<Entry>::iterator> index_;
};

} // namespace kiln
