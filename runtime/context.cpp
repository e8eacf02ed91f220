#include "runtime/context_impl.hpp"
#include "runtime/bench.hpp"

#include "compiler/log.hpp"
#include "ir/error.hpp"
#include "runtime/host_convert.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

namespace kiln {

namespace {

// Memory owned by someone else, released through their callback.
struct ExternalStorage : OwnedStorage {
    std::function<void()> release;
    ~ExternalStorage() override {
        if (release) release();
    }
};

std::string device_str(const Device& d) {
    return d.kind == DeviceKind::CUDA ? fmt::format("cuda:{}", d.index) : std::string("cpu");
}

// "cuda" -> 0, "cuda:3" -> 3; -1 when malformed.
int cuda_index(const std::string& dev) {
    if (dev == "cuda") return 0;
    if (dev.rfind("cuda:", 0) != 0 || dev.size() == 5 || dev.size() > 9) return -1;
    int i = 0;
    for (char c : dev.substr(5)) {
        if (c < '0' || c > '9') return -1;
        i = i * 10 + (c - '0');
    }
    return i;
}

void check_readable(const NodePtr& root, const char* op) {
    for (const Node* n : postorder(root))
        if (n->op == OpKind::Leaf && !n->view.storage->written)
            fail(Error::Kind::Value,
                 "{}: reads a {} tensor of shape {} that was never written (created by empty() and not assigned); "
                 "assign it, or create it with zeros()/array()",
                 op, dtype_name(n->dtype), shape_str(n->shape));
}

void check_stochastic_round(int bits) {
    if (bits < 0 || bits > 10)
        fail(Error::Kind::Value,
             "Context: stochastic_round = {} is not a number of mantissa bits to keep; valid: 1 to 10 (true = 10, "
             "float16's whole mantissa; bfloat16 keeps at most 7), or 0 / false for round to nearest",
             bits);
}

} // namespace

Context::Context(ContextOptions opts) : impl_(std::make_unique<Impl>()) {
    Impl& m = *impl_;
    m.self = this;
    m.default_dtype = opts.default_dtype;
    m.seed = m.seeded = (uint32_t)(opts.seed ^ (opts.seed >> 32));
    check_stochastic_round(opts.stochastic_round);
    m.stochastic_round_bits = opts.stochastic_round;
    m.allow_tf32 = opts.allow_tf32;
    m.bench = opts.bench;
    std::string dev = opts.device;
    const bool from_env = dev.empty();
    if (from_env) {
        const char* e = std::getenv("KILN_BACKEND");
        dev = e ? e : "";
    }
    if (!dev.empty() && dev != "cpu" && cuda_index(dev) < 0)
        fail(Error::Kind::Value, "Context: unknown device '{}'{}; valid: 'cpu', 'cuda', 'cuda:N' (KILN_BACKEND=cpu|cuda)",
             dev, from_env ? " (from KILN_BACKEND)" : "");
    bool validate = false;  // KILN_VALIDATE=cpu: every CUDA kernel also runs on the host backend, compared
    const char* v = std::getenv("KILN_VALIDATE");
    if (v && *v && std::strcmp(v, "0") != 0) {
        if (std::strcmp(v, "cpu") != 0)
            fail(Error::Kind::Value, "Context: KILN_VALIDATE='{}' is not understood; valid: 'cpu' (run every CUDA kernel "
                                     "on the CPU backend too and compare) or unset",
                 v);
        validate = true;
    }
    if (dev != "cpu") {
        std::unique_ptr<DeviceBackend> reference = validate ? make_host_backend() : nullptr;
        try {
            m.backend = make_cuda_backend(dev.empty() ? 0 : cuda_index(dev), std::move(reference));
        } catch (const Error& e) {
            if (!dev.empty())
                fail(Error::Kind::Runtime, "Context: device '{}' requested{}, but it cannot be used: {}; use device 'cpu'{}",
                     dev, from_env ? " by KILN_BACKEND" : "", e.what(), from_env ? " (KILN_BACKEND=cpu)" : "");
            log_info("Context: no CUDA device ({}); running on the CPU", e.what());
        }
    }
    if (!m.backend) m.backend = make_host_backend();
    m.target = m.backend->target();
    if (opts.kernel_cache_capacity > 0) m.backend->set_kernel_cache_capacity(opts.kernel_cache_capacity);
    if (compile_forbidden_by_env()) m.backend->forbid_compiles(true);
    if (const char* r = std::getenv("KILN_RECORD"); r && *r) record_to(r);
}

void Context::record_to(const std::string& path) {
    if (const size_t nul = path.find('\0'); nul != std::string::npos)
        fail(Error::Kind::Value, "record_to: the path holds a NUL character (at offset {}); a file path cannot", nul);
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->record = path.empty() ? nullptr : std::make_unique<ManifestWriter>(path);
}

Context::~Context() {
    if (log_level() >= LogLevel::Info) {
        auto c = counters();
        log_info("counters ({}): {} compiles ({:.1f} ms), {} memory hits, {} disk hits, {} launches, {} assignments "
                 "({} plan cache hits, {} plans resized)",
                 device_name(), c.compiles, c.compile_ms, c.memory_hits, c.disk_hits, c.launches, c.assignments,
                 c.plan_hits, c.plan_resizes);
    }
    // Plans and temporaries go while the backend that owns their kernels and memory is alive.
    impl_->plans.clear();
    impl_->families.clear();
    impl_->temps.clear();
}

Context& Context::default_context() {
    static Context* ctx = new Context();  // lives until exit: tensors may outlive static teardown
    return *ctx;
}

Backend Context::backend() const { return impl_->device().kind == DeviceKind::CUDA ? Backend::CUDA : Backend::CPU; }
std::string Context::device_name() const { return impl_->backend->name(); }
std::string Context::device_description() const { return impl_->backend->description(); }

DType Context::default_dtype() const { return impl_->default_dtype; }

Device Context::device() const { return impl_->device(); }

uintptr_t Context::stream_handle() const { return impl_->backend->stream(); }

Tensor Context::wrap(void* data, DType dtype, const Shape& shape, const Strides& strides, Device dev,
                     std::function<void()> release) {
    // Release on every failure path too: the caller handed ownership over.
    auto s = std::make_shared<ExternalStorage>();
    s->release = std::move(release);
    if (dev != device())
        fail(Error::Kind::Value, "wrap: the memory is on {}, but this context runs on {}; copy it to {} first",
             device_str(dev), device_str(device()), device_str(device()));
    check_shape(shape, "wrap");
    if (!strides.empty() && strides.size() != shape.size())
        fail(Error::Kind::Value, "wrap: {} strides given for shape {} (rank {})", strides.size(), shape_str(shape),
             shape.size());
    View v;
    v.dtype = dtype;
    v.shape = shape;
    v.strides = strides.empty() ? contiguous_strides(shape) : strides;
    // The storage starts at the lowest address any element has, so negative strides work.
    // Spans are bounded like shapes (kMaxElements), so no address or byte size computed from them wraps.
    int64_t lo = 0, hi = 0;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == 0) { lo = hi = 0; break; }
        int64_t span = 0;
        if (__builtin_mul_overflow(shape[i] - 1, v.strides[i], &span) || span > kMaxElements || span < -kMaxElements ||
            __builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi) || hi - lo > kMaxElements)
            fail(Error::Kind::Value, "wrap: strides {} for shape {} span more than 2^60 elements", shape_str(v.strides),
                 shape_str(shape));
    }
    const size_t es = dtype_size(dtype);
    if (!data && numel(shape) > 0) fail(Error::Kind::Value, "wrap: null data pointer for shape {}", shape_str(shape));
    if ((uintptr_t)data % es != 0)
        fail(Error::Kind::Value, "wrap: the {} data at {} is not aligned to its element size ({} bytes)",
             dtype_name(dtype), data, es);
    s->owner = this;
    s->data = static_cast<char*>(data) + lo * (int64_t)es;
    s->nbytes = (size_t)(hi - lo + 1) * es;
    s->device = dev;
    s->written = true;
    v.offset = -lo;
    v.storage = std::move(s);
    return Tensor(this, v);
}

std::shared_ptr<Storage> Context::Impl::alloc(size_t nbytes, const char* op) {
    std::shared_ptr<Storage> s = backend->allocate(nbytes, op);
    static_cast<OwnedStorage&>(*s).owner = self;
    return s;
}

Tensor Context::empty(const Shape& shape) { return empty(shape, impl_->default_dtype); }

Tensor Context::empty(const Shape& shape, DType dtype) {
    check_shape(shape, "empty");
    View v;
    v.dtype = dtype;
    v.shape = shape;
    v.strides = contiguous_strides(shape);
    v.storage = impl_->alloc((size_t)numel(shape) * dtype_size(dtype), "empty");
    if (numel(shape) == 0) v.storage->written = true;
    return Tensor(this, v);
}

Tensor Context::full(const Shape& shape, double value, DType dtype) {
    Tensor t = empty(shape, dtype);
    t.assign(scalar(value, dtype));
    return t;
}
Tensor Context::zeros(const Shape& shape, DType dtype) { return full(shape, 0, dtype); }
Tensor Context::ones(const Shape& shape, DType dtype) { return full(shape, 1, dtype); }

Tensor Context::arange(int64_t n, DType dtype) {
    if (n < 0) fail(Error::Kind::Value, "arange: negative length {}", n);
    Tensor t = empty({n}, dtype);
    t.assign(iota({n}, 0));
    return t;
}

Tensor Context::array(const void* data, size_t count, DType src, const Shape& shape, DType dtype) {
    if ((int64_t)count != numel(shape))
        fail(Error::Kind::Value, "array: {} host values given for shape {} ({} elements)", count, shape_str(shape),
             numel(shape));
    Tensor t = empty(shape, dtype);
    t.copy_from_host(data, src);
    return t;
}

Tensor Context::array(const std::vector<double>& data, const Shape& shape, DType dtype) {
    return array(data.data(), data.size(), DType::Float64, shape, dtype);
}

void Context::set_stochastic_round(int bits) {
    check_stochastic_round(bits);
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stochastic_round_bits = bits;
}

int Context::stochastic_round() const { return impl_->stochastic_round_bits; }
void Context::set_allow_tf32(bool on) { impl_->allow_tf32 = on; }
bool Context::allow_tf32() const { return impl_->allow_tf32; }

void Context::seed(uint64_t s) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->seed = impl_->seeded = (uint32_t)(s ^ (s >> 32));
    impl_->rng_counter = 0;
}

RngState Context::rng_state() const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    return {impl_->seed, impl_->rng_counter};
}

void Context::set_rng_state(const RngState& s) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->seed = s.seed;
    impl_->rng_counter = s.counter;
}

void Context::rng_reset() {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->seed = impl_->seeded;
    impl_->rng_counter = 0;
}

Counters Context::counters() const {
    Counters c = impl_->counters;
    BackendCounters b = impl_->backend->counters();
    c.compiles = b.compiles;
    c.memory_hits = b.memory_hits;
    c.disk_hits = b.disk_hits;
    c.compile_ms = b.compile_ms;
    c.cached_kernels = b.cached_kernels;
    return c;
}

void Context::reset_counters() {
    impl_->counters = {};
    impl_->backend->reset_counters();
}

void Context::synchronize() { impl_->backend->synchronize(); }
void Context::order_before(uintptr_t stream) { impl_->backend->order_before(stream); }
void Context::wait_for(uintptr_t stream) { impl_->backend->wait_for(stream); }

void Context::set_bench(bool on) { impl_->bench = on; }
bool Context::bench() const { return impl_->bench; }
std::vector<BenchRecord> Context::bench_log() const { return {impl_->bench_log.begin(), impl_->bench_log.end()}; }
void Context::clear_bench_log() { impl_->bench_log.clear(); }

Mark Context::init_mark() {
    Mark m;
    m.handle_ = impl_->backend->new_mark();
    m.owner_ = this;
    return m;
}

namespace {

// A mark `ctx` made (and, for `recorded`, placed).
void check_mark(const Mark& m, const Context& ctx, bool recorded, const char* op, const char* which) {
    if (!m.made_by(ctx))
        fail(Error::Kind::Value, "{}: the {}mark is empty or of another context; make it with this context's init_mark()",
             op, which);
    if (recorded && !m.recorded())
        fail(Error::Kind::Value, "{}: the {}mark was never recorded (record_mark(mark) places it)", op, which);
}

} // namespace

void Context::record_mark(Mark& m) {
    check_mark(m, *this, false, "record_mark", "");
    impl_->backend->record_mark(m.handle_.get());
    m.recorded_ = true;
}

void Context::synchronize_mark(const Mark& m) {
    check_mark(m, *this, true, "synchronize_mark", "");
    impl_->backend->wait_mark(m.handle_.get());
}

double Context::elapsed_ms(const Mark& start, const Mark& end) {
    check_mark(start, *this, true, "get_time", "start ");
    check_mark(end, *this, true, "get_time", "end ");
    impl_->backend->wait_mark(end.handle_.get());
    return impl_->backend->mark_elapsed_ms(start.handle_.get(), end.handle_.get());
}

// ---- evaluation

CachedPlan* Context::Impl::plan_for(const View& dst, const NodePtr& expr, const kir::Hist& hist) {
    // Everything besides the graph that changes the generated code goes into `options`.
    const uint64_t options = (uint64_t)stochastic_round_bits | (uint64_t)hist.bins << 8 |
                             (uint64_t)(hist.offset + kir::kMaxHistOffset) << 24;
    // (A live node at the remembered address is the remembered node.)
    if (last.plan && last.node == expr.get() && last.generation == plans.generation() && last.options == options &&
        last.dst_storage == dst.storage.get() && last.dst.dtype == dst.dtype && last.dst.offset == dst.offset &&
        last.dst.shape == dst.shape && last.dst.strides == dst.strides && !last.root.expired()) {
        ++counters.plan_hits;
        return last.plan;
    }
    last.plan = nullptr;
    assignment_signature(expr, dst, options, "assign", signature);
    const Storage* const destination = dst.storage.get();
    check_devices("assign", {&expr, 1}, {&destination, 1});
    CachedPlan* p = plans.find(signature);
    if (p) {
        ++counters.plan_hits;
    } else {
        const bool in_family = families.signature(expr, dst, options, family, family_at);
        std::optional<CachedPlan> resized = in_family ? families.resize(family, family_at) : std::nullopt;
        if (resized) {
            ++counters.plan_resizes;
            p = plans.insert(signature, std::move(*resized));
        } else {
            p = cache_plan(compile_assignment(expr, dst, target, LowerOptions{stochastic_round_bits, hist}));
            if (in_family) families.learn(family, family_at, *p);
        }
    }
    last.root = expr, last.node = expr.get(), last.dst_storage = destination;
    last.dst.dtype = dst.dtype, last.dst.offset = dst.offset, last.dst.shape = dst.shape, last.dst.strides = dst.strides;
    last.options = options, last.generation = plans.generation(), last.plan = p;
    return p;
}

// The backend's kernels for a compiled assignment's stages (recorded when recording), and the
// plan cached under the current signature.
CachedPlan* Context::Impl::cache_plan(CompiledAssignment&& ca) {
    CachedPlan plan = make_cached_plan(std::move(ca), signature);
    for (CachedStage& st : plan.stages) {
        const std::string& key = st.code->key;
        if (record) record->add(st.code->kernel, key, device().kind == DeviceKind::CUDA ? "cuda" : "cpu", target);
        st.kernel = backend->compile(st.code->kernel, key);
    }
    release_retired(plan);
    return plans.insert(signature, std::move(plan));
}

CachedPlan* Context::Impl::plan_for_together(const std::vector<std::pair<NodePtr, View>>& list) {
    const uint64_t options = (uint64_t)stochastic_round_bits;
    last.plan = nullptr;   // (signature is about to hold another statement's storages)
    together_signature(list, options, "assign_together", signature);
    std::vector<NodePtr> exprs;
    std::vector<const Storage*> dsts;
    for (const auto& [e, dst] : list) exprs.push_back(e), dsts.push_back(dst.storage.get());
    check_devices("assign_together", exprs, dsts);
    if (CachedPlan* p = plans.find(signature)) {
        ++counters.plan_hits;
        return p;
    }
    CompiledAssignment ca = compile_together(list, target, LowerOptions{stochastic_round_bits, {}});
    if (ca.stages.empty()) {
        CachedPlan in_order;
        in_order.in_order = true;
        return plans.insert(signature, std::move(in_order));
    }
    return cache_plan(std::move(ca));
}

// Kernels the memory caches evicted while compiling `fresh` are freed once no cached plan
// points at them: the plans that do are dropped (they recompile from the kernel cache, or the
// disk cache, when met again); those `fresh` uses stay.
void Context::Impl::release_retired(const CachedPlan& fresh) {
    std::unordered_set<KernelHandle> gone, keep;
    backend->retired_kernels(gone);
    if (gone.empty()) return;
    auto retired = [&](const CachedPlan& p) {
        for (const CachedStage& st : p.stages)
            if (gone.count(st.kernel)) return true;
        return false;
    };
    plans.erase_if(retired);
    families.erase_if(retired);
    for (const CachedStage& st : fresh.stages) keep.insert(st.kernel);
    backend->release_retired(keep);
}

void Context::Impl::execute(CachedPlan& plan, void* hist_counters) {
    temps.clear();
    for (auto& t : plan.temps) temps.push_back(alloc((size_t)numel(t.shape) * dtype_size(t.dtype), "assign (temporary)"));
    // One counter per rand() node per assignment, so a node read by two stages draws once.
    std::vector<std::pair<uint64_t, uint32_t>> draws;   // (serial, counter); allocates only when a stage draws
    auto draw_for = [&](uint64_t serial) -> uint32_t {
        for (auto& [s, c] : draws)
            if (s == serial) return c;
        draws.emplace_back(serial, rng_counter++);
        return draws.back().second;
    };
    for (CachedStage& st : plan.stages) {
        for (size_t b = 0; b < st.sources.size(); ++b) {
            const BufferSource& src = st.sources[b];
            int cls = st.storage_class[b];
            if (cls < 0) {
                st.args.buffers[b] = temps[src.temp]->data;
            } else {
                auto* base = static_cast<char*>(signature.storages[cls]->data);
                st.args.buffers[b] = base + src.view.offset * (int64_t)dtype_size(src.view.dtype);
            }
        }
        for (auto& r : st.rands) {
            st.args.iparams[r.seed_slot] = (int32_t)seed;
            st.args.iparams[r.counter_slot] = (int32_t)draw_for(r.serial);
        }
        st.args.hist = st.code->kernel.hist.bins > 0 ? hist_counters : nullptr;
        backend->launch(st.kernel, st.args);
        ++counters.launches;
    }
    temps.clear();  // device temporaries return to the allocator; stream order keeps them valid
}

// Every storage the assignment touches must be memory of this context's device: the signature
// lists each distinct storage once (the destination's first), so this costs a few compares.
bool Context::Impl::usable(const Storage* s) const {
    const Device here = device();
    if (s->device.kind != here.kind) return false;
    auto* owned = dynamic_cast<const OwnedStorage*>(s);
    return here.kind != DeviceKind::CUDA || !owned || owned->owner == self;
}

bool Context::can_use(const Tensor& t) const { return t.defined() && impl_->usable(t.view().storage.get()); }

void Context::Impl::check_devices(const char* op, std::span<const NodePtr> exprs, std::span<const Storage* const> dsts) {
    for (const Storage* s : signature.storages) {
        if (usable(s)) continue;
        if (std::find(dsts.begin(), dsts.end(), s) != dsts.end())
            fail(Error::Kind::Value, "{}: the destination lives on {} of another context, but this context runs on {}; "
                                     "create it with this context",
                 op, device_str(s->device), self->device_name());
        for (const NodePtr& e : exprs)
            for (const Node* n : postorder(e))
                if (n->op == OpKind::Leaf && n->view.storage.get() == s)
                    fail(Error::Kind::Value,
                         "{}: an operand ({} {}) lives on {} of another context, but the expression runs on {}; copy it "
                         "through the host (to_vector/array) or create it with the destination's context",
                         op, dtype_name(n->dtype), shape_str(n->shape), device_str(s->device), self->device_name());
    }
}

namespace {

// Bench mode's bytes of an assignment: each distinct view its kernels read or write, once
// (temporaries not counted). A cached plan's views hold no storage and name it by its class in
// the assignment's signature, so a view is the same as another of the same class and layout.
double plan_bytes(const CachedPlan& plan) {
    double bytes = 0;
    std::vector<std::pair<int, const View*>> seen;
    for (const CachedStage& st : plan.stages)
        for (size_t b = 0; b < st.sources.size(); ++b) {
            const View& v = st.sources[b].view;
            const int cls = st.storage_class[b];
            if (cls < 0 || std::any_of(seen.begin(), seen.end(), [&](const auto& s) {
                    return s.first == cls && s.second->same_layout(v);
                }))
                continue;
            seen.emplace_back(cls, &v);
            bytes += view_bytes(v);
        }
    return bytes;
}

} // namespace

void Context::Impl::run(const View& dst, const NodePtr& expr, const kir::Hist& hist, void* counters) {
    CachedPlan& plan = *plan_for(dst, expr, hist);
    {
        BenchTimer timer(*this, "assign");
        if (timer.on())
            timer.set(fmt::format("{} {}: {} kernel{}", dtype_name(dst.dtype), shape_str(dst.shape), plan.stages.size(),
                                  plan.stages.size() == 1 ? "" : "s"),
                      plan_bytes(plan));
        execute(plan, counters);
    }
}

void Context::assign(Tensor& dst, const Expr& e) {
    if (!dst.defined()) throw Error("assign: the destination is an empty kiln::Tensor (default-constructed)");
    if (!e.valid()) throw Error("assign: the expression is empty (a default-constructed kiln::Expr)");
    if (!broadcastable_to(e.shape(), dst.shape()))
        fail(Error::Kind::Value,
             "assign: cannot assign a {} expression of shape {} to a destination of shape {}: the expression must "
             "broadcast to the destination's shape",
             dtype_name(e.dtype()), shape_str(e.shape()), shape_str(dst.shape()));
    // NumPy 2: a Python integer stored to an integer tensor must fit it (t[...] = -1 into uint8 is an error).
    // An int64 or uint64 destination takes any literal its integer value holds exactly.
    if (const Node& n = *e.node(); n.op == OpKind::Scalar && n.weak && n.dtype == DType::Int32)
        check_literal_fits(e, dst.dtype(), "assign");
    // As NumPy: a float literal that is not finite has no integer to become (t[...] = nan into int8).
    if (const Node& n = *e.node(); n.op == OpKind::Scalar && is_float(n.dtype) && is_integer(dst.dtype()) &&
                                   !std::isfinite(n.value))
        fail(Error::Kind::Value, "assign: cannot store {} in a tensor of {}: an integer has no {}",
             std::isnan(n.value) ? "nan" : n.value > 0 ? "inf" : "-inf", dtype_name(dst.dtype()),
             std::isnan(n.value) ? "NaN" : "infinity");
    if (dst.size() == 0) {
        check_readable(e.node(), "assign");
        return;
    }
    // Named tensors (include/kiln/hist.hpp): counted once, by the outermost call that wrote them.
    // On CUDA the kernels count the values as they store them, into a slot made first (outside
    // the lock: zeros is an assignment); elsewhere the written tensor is counted afterwards.
    const std::string& tag = dst.view().storage->hist_tag;
    const bool named = impl_->hist_named && impl_->call_depth == 0 && !tag.empty() && impl_->count_named;
    const bool in_store = named && is_float(dst.dtype()) && device().kind == DeviceKind::CUDA;
    Tensor slot;
    kir::Hist hist;
    if (in_store) {
        slot = zeros({1, impl_->hist_bins}, DType::Int32);
        hist = {impl_->hist_bins, impl_->hist_offset};
    }
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        impl_->run(dst.view(), e.node(), hist, in_store ? slot.data() : nullptr);
        ++impl_->counters.assignments;
        dst.view().storage->written = true;
    }
    if (in_store) impl_->hist_slots.emplace_back(tag, slot);
    else if (named) impl_->count_named(*this, dst);
}

void Context::assign_together(const std::vector<std::pair<Tensor*, Expr>>& list) {
    // What assign() checks and does besides the kernels (empty destinations, named tensors)
    // takes the one-by-one path: it is assign() itself.
    bool alone = false;
    for (const auto& [dst, e] : list) {
        if (!dst || !dst->defined()) throw Error("assign_together: a destination is missing or an empty kiln::Tensor");
        alone = alone || dst->size() == 0 || !dst->view().storage->hist_tag.empty() || !e.valid() ||
                (e.node()->op == OpKind::Scalar) || !broadcastable_to(e.shape(), dst->shape());
    }
    // (So does an expression that reads a destination: it must see the value written before it.)
    for (size_t i = 0; i < list.size() && !alone; ++i)
        for (const Node* n : postorder(list[i].second.node()))
            for (const auto& [dst, e] : list)
                if (n->op == OpKind::Leaf && n->view.storage == dst->view().storage) alone = true;
    if (!alone && list.size() > 1) {
        std::vector<std::pair<NodePtr, View>> work;
        for (const auto& [dst, e] : list) work.emplace_back(e.node(), dst->view());
        std::lock_guard<std::mutex> lock(impl_->mu);
        CachedPlan& plan = *impl_->plan_for_together(work);
        if (!plan.in_order) {
            BenchTimer timer(*impl_, "assign_together");
            if (timer.on())
                timer.set(fmt::format("{} destinations of shape {}: {} kernel{}", list.size(), shape_str(list[0].first->shape()),
                                      plan.stages.size(), plan.stages.size() == 1 ? "" : "s"),
                          plan_bytes(plan));
            impl_->execute(plan, nullptr);
            for (const auto& [dst, e] : list) {
                ++impl_->counters.assignments;
                dst->view().storage->written = true;
            }
            return;
        }
    }
    for (const auto& [dst, e] : list) assign(*dst, e);
}

Tensor Context::eval(const Expr& e) {
    if (!e.valid()) throw Error("eval: the expression is empty (a default-constructed kiln::Expr)");
    Tensor t = empty(e.shape(), e.dtype());
    t.assign(e);
    return t;
}

Tensor eval(const Expr& e) {
    if (!e.valid()) throw Error("eval: the expression is empty (a default-constructed kiln::Expr)");
    for (const Node* n : postorder(e.node()))
        if (n->op == OpKind::Leaf)
            if (auto* s = dynamic_cast<const OwnedStorage*>(n->view.storage.get()); s && s->owner) return s->owner->eval(e);
    return Context::default_context().eval(e);
}

} // namespace kiln
