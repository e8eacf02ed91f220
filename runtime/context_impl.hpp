// Context's private state, shared by context.cpp (evaluation) and tensor.cpp (tensor data).
#pragma once
#include "runtime/backend.hpp"
#include <kiln/context.hpp>
#include "runtime/manifest.hpp"
#include "runtime/owned_storage.hpp"
#include "runtime/plan_cache.hpp"
#include "runtime/plan_family.hpp"

#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

struct [[gnu::visibility("hidden")]] Context::Impl {
    Context* self = nullptr;
    std::unique_ptr<DeviceBackend> backend;   // compiles, launches, owns the memory
    DType default_dtype = DType::Float32;
    uint32_t seed = 0;
    uint32_t rng_counter = 0;
    uint32_t seeded = 0;   // the seed of the last seeding (construction or seed()): rng_reset's
    int stochastic_round_bits = 0;
    bool allow_tf32 = false;
    bool bench = false;                 // ContextOptions::bench
    std::deque<BenchRecord> bench_log;  // runtime/bench.hpp
    int call_depth = 0;                 // library calls under way (BenchTimer): 1 inside one, ...
    // Numerics histograms (include/kiln/hist.hpp): the bins, their offset and the slots taken
    // since the last dump, with their tags.
    int hist_bins = 64, hist_offset = -48;
    std::vector<std::pair<std::string, Tensor>> hist_slots;
    bool hist_named = false;   // count tagged outputs as they are written (set_hist_named)
    // Installed by kernels/hist.cpp with set_hist_named: counts a tagged destination after an
    // assignment where its kernels cannot count it as they store it (the CPU; the runtime cannot
    // call the kernels layer itself).
    void (*count_named)(Context&, const Tensor&) = nullptr;
    Counters counters;
    std::mutex mu;
    std::string target;  // backend->target(): part of every kernel key
    std::unique_ptr<ManifestWriter> record;  // KILN_RECORD / Context::record_to
    PlanCache plans;
    AssignmentSignature signature;  // reused by every assignment
    // The last assign()'s statement and the plan it found (signature still holds its storages):
    // the same statement again, as a loop repeats it (a rebuilt expression is its interned node
    // again), takes that plan without the signature while the node lives and no plan has been
    // added or dropped. It holds no reference to the graph or the destination.
    struct LastAssign {
        std::weak_ptr<const Node> root;
        const Node* node = nullptr;
        const Storage* dst_storage = nullptr;
        View dst;   // the destination's layout (storage left empty)
        uint64_t options = 0, generation = 0;
        CachedPlan* plan = nullptr;
    } last;
    PlanFamilies families;          // new shapes of planned assignments
    AssignmentSignature family;     // reused by every plan cache miss
    Shape family_at;
    std::vector<std::shared_ptr<Storage>> temps;

    Device device() const { return backend->device(); }
    // Memory for a tensor or a temporary of this context's backend. `op` names the user call.
    std::shared_ptr<Storage> alloc(size_t nbytes, const char* op);
    // hist: count the values stored to dst into `counters` (bins int32) in the kernels' store
    // path (CUDA); bins == 0: no histogram.
    void run(const View& dst, const NodePtr& expr, const kir::Hist& hist = {}, void* counters = nullptr);
    bool usable(const Storage* s) const;  // Context::can_use
    // Every storage of the current signature is usable here, else a Value error naming it as a
    // destination (one of dsts) or as an operand (a leaf of one of exprs) of `op`.
    void check_devices(const char* op, std::span<const NodePtr> exprs, std::span<const Storage* const> dsts);
    CachedPlan* plan_for(const View& dst, const NodePtr& expr, const kir::Hist& hist);
    CachedPlan* plan_for_together(const std::vector<std::pair<NodePtr, View>>& list);
    CachedPlan* cache_plan(CompiledAssignment&& ca);
    void release_retired(const CachedPlan& fresh);
    void execute(CachedPlan& plan, void* hist_counters);
};

// A context's state, for the library's own code (the public Context has no accessor).
inline Context::Impl& context_impl(Context& c) { return *c.impl_; }

} // namespace kiln
