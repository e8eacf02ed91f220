#include "runtime/context.hpp"

#include "compiler/log.hpp"
#include "compiler/pipeline.hpp"
#include "ir/error.hpp"
#include "runtime/host_convert.hpp"

#include "runtime/kir_interpreter.hpp"
#ifdef KILN_HAVE_LLVM
#include "runtime/cpu/cpu_jit.hpp"
#define KILN_CPU_JIT 1
#endif

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace kiln {

namespace {

// Host memory of the CPU backend, 64-byte aligned so vector loads of contiguous data align.
struct HostStorage : Storage {
    Context* owner = nullptr;
    ~HostStorage() override { std::free(data); }
};

std::shared_ptr<Storage> host_alloc(Context* owner, size_t nbytes) {
    auto s = std::make_shared<HostStorage>();
    s->owner = owner;
    size_t padded = (nbytes + 63) / 64 * 64;
    s->data = padded ? std::aligned_alloc(64, padded) : nullptr;
    if (padded && !s->data)
        fail(Error::Kind::Memory, "empty: out of host memory allocating {} bytes", nbytes);
    s->nbytes = nbytes;
    s->device = Device{DeviceKind::CPU, 0};
    return s;
}

std::string host_target() {
    std::string t = "cpu-x86_64";
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) t += "-avx512";
    else if (__builtin_cpu_supports("avx2")) t += "-avx2";
#endif
    return t;
}

} // namespace

struct Context::Impl {
    Context* self;
    Backend backend = Backend::CPU;
    DType default_dtype = DType::Float32;
    uint32_t seed = 0;
    uint32_t rng_counter = 0;
    Counters counters;
    std::mutex mu;
    std::string target;
#ifdef KILN_CPU_JIT
    cpu::CpuJit jit;
#endif

    void run(const View& dst, const NodePtr& expr);
};

Context::Context(ContextOptions opts) : impl_(std::make_unique<Impl>()) {
    impl_->self = this;
    impl_->default_dtype = opts.default_dtype;
    impl_->seed = (uint32_t)(opts.seed ^ (opts.seed >> 32));
    std::string dev = opts.device;
    if (dev.empty()) {
        const char* e = std::getenv("KILN_BACKEND");
        dev = e ? e : "";
    }
    if (!dev.empty() && dev != "cpu" && dev.rfind("cuda", 0) != 0)
        fail(Error::Kind::Value, "Context: unknown device '{}'; valid: 'cpu', 'cuda', 'cuda:N' (KILN_BACKEND=cpu|cuda)", dev);
    if (dev.rfind("cuda", 0) == 0)
        fail(Error::Kind::Runtime,
             "Context: device '{}' requested, but this build of kiln runs expressions on the CPU only (the CUDA runtime "
             "is not part of it yet); use device 'cpu' or unset KILN_BACKEND",
             dev);
    impl_->target = host_target();
}

Context::~Context() {
    if (log_level() >= LogLevel::Info) {
        auto c = counters();
        log_info("counters: {} compiles ({:.1f} ms), {} memory hits, {} launches, {} assignments", c.compiles,
                 c.compile_ms, c.memory_hits, c.launches, c.assignments);
    }
}

Context& Context::default_context() {
    static Context* ctx = new Context();  // lives until exit: tensors may outlive static teardown
    return *ctx;
}

Backend Context::backend() const { return impl_->backend; }
std::string Context::device_name() const { return "cpu"; }
DType Context::default_dtype() const { return impl_->default_dtype; }

Tensor Context::empty(const Shape& shape) { return empty(shape, impl_->default_dtype); }

Tensor Context::empty(const Shape& shape, DType dtype) {
    for (int64_t d : shape)
        if (d < 0) fail(Error::Kind::Value, "empty: negative dimension in shape {}", shape_str(shape));
    View v;
    v.dtype = dtype;
    v.shape = shape;
    v.strides = contiguous_strides(shape);
    v.storage = host_alloc(this, (size_t)numel(shape) * dtype_size(dtype));
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
    std::vector<float> f(data.begin(), data.end());
    if (dtype == DType::Int32) {  // int32 values above 2^24 do not survive float
        std::vector<int32_t> i(data.size());
        for (size_t k = 0; k < data.size(); ++k) store_element(DType::Int32, &i[k], data[k]);
        return array(i.data(), i.size(), DType::Int32, shape, dtype);
    }
    return array(f.data(), f.size(), DType::Float32, shape, dtype);
}

void Context::seed(uint64_t s) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->seed = (uint32_t)(s ^ (s >> 32));
    impl_->rng_counter = 0;
}

Counters Context::counters() const {
    Counters c = impl_->counters;
#ifdef KILN_CPU_JIT
    auto j = impl_->jit.counters();
    c.compiles = j.compiles;
    c.memory_hits = j.memory_hits;
    c.compile_ms = j.compile_ms;
#endif
    return c;
}

void Context::reset_counters() {
    impl_->counters = {};
#ifdef KILN_CPU_JIT
    impl_->jit.reset_counters();
#endif
}

void Context::synchronize() {}

namespace {

void check_readable(const NodePtr& root, const char* op) {
    for (const Node* n : postorder(root)) {
        if (n->op != OpKind::Leaf) continue;
        if (!n->view.storage->written)
            fail(Error::Kind::Value,
                 "{}: reads a {} tensor of shape {} that was never written (created by empty() and not assigned); "
                 "assign it, or create it with zeros()/array()",
                 op, dtype_name(n->dtype), shape_str(n->shape));
    }
}

} // namespace

void Context::Impl::run(const View& dst, const NodePtr& expr) {
    CompiledAssignment ca = compile_assignment(expr, dst, target);
    std::vector<std::shared_ptr<Storage>> temps;
    for (auto& t : ca.plan.temps) temps.push_back(host_alloc(self, (size_t)numel(t.shape) * dtype_size(t.dtype)));
    // One counter per rand() node per assignment, so a node read by two stages draws once.
    std::unordered_map<uint64_t, uint32_t> draw;
    for (auto& ls : ca.stages)
        for (auto& r : ls.rands)
            if (!draw.count(r.serial)) draw[r.serial] = rng_counter++;
    for (auto& ls : ca.stages) {
        for (size_t b = 0; b < ls.sources.size(); ++b) {
            auto& src = ls.sources[b];
            if (src.is_temp) {
                ls.args.buffers[b] = temps[src.temp]->data;
            } else {
                auto* base = static_cast<char*>(src.view.storage->data);
                ls.args.buffers[b] = base + src.view.offset * (int64_t)dtype_size(src.view.dtype);
            }
        }
        for (auto& r : ls.rands) {
            ls.args.iparams[r.seed_slot] = (int32_t)seed;
            ls.args.iparams[r.counter_slot] = (int32_t)draw[r.serial];
        }
#ifdef KILN_CPU_JIT
        auto handle = jit.compile(ls.kernel, ls.key);
        jit.launch(handle, ls.args);
#else
        interpret(ls.kernel, ls.args);  // built without LLVM: the kernel IR is executed directly
#endif
        ++counters.launches;
    }
    ++counters.assignments;
}

void Context::assign(Tensor& dst, const Expr& e) {
    if (!dst.defined()) throw Error("assign: the destination is an empty kiln::Tensor (default-constructed)");
    if (!e.valid()) throw Error("assign: the expression is empty (a default-constructed kiln::Expr)");
    if (!broadcastable_to(e.shape(), dst.shape()))
        fail(Error::Kind::Value,
             "assign: cannot assign a {} expression of shape {} to a destination of shape {}: the expression must "
             "broadcast to the destination's shape",
             dtype_name(e.dtype()), shape_str(e.shape()), shape_str(dst.shape()));
    check_readable(e.node(), "assign");
    if (dst.size() == 0) return;
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->run(dst.view(), e.node());
    dst.view().storage->written = true;
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
            if (auto* hs = dynamic_cast<HostStorage*>(n->view.storage.get()); hs && hs->owner) return hs->owner->eval(e);
    return Context::default_context().eval(e);
}

// ---- Tensor

Context& Tensor::context() const {
    if (!ctx_) throw Error("tensor: an empty kiln::Tensor has no context");
    return *ctx_;
}

Tensor Tensor::slice(const std::vector<Slice>& s) const { return Tensor(ctx_, slice_view(view_, s)); }
Tensor Tensor::transpose(const std::vector<int>& perm) const { return Tensor(ctx_, transpose_view(view_, perm)); }

Tensor Tensor::reshape(const Shape& s) const {
    Shape to = resolve_reshape(view_.shape, s, "reshape");
    if (auto v = reshape_view(view_, to)) return Tensor(ctx_, *v);
    Tensor out = context().empty(to, view_.dtype);
    out.assign(kiln::reshape(expr(), to));
    return out;
}

Tensor& Tensor::assign(const Expr& e) {
    if (!defined()) throw Error("assign: the destination is an empty kiln::Tensor (default-constructed)");
    context().assign(*this, e);
    return *this;
}

Assignable& Assignable::operator=(const Expr& e) {
    t_.assign(e);
    return *this;
}

namespace {

// Calls f(element offset, row-major index) for every element of the view.
template <typename F>
void for_each_element(const View& v, F f) {
    int64_t n = numel(v.shape);
    if (n == 0) return;
    int r = (int)v.shape.size();
    std::vector<int64_t> idx(r, 0);
    int64_t off = v.offset;
    for (int64_t i = 0; i < n; ++i) {
        f(off, i);
        for (int d = r - 1; d >= 0; --d) {
            if (++idx[d] < v.shape[d]) { off += v.strides[d]; break; }
            off -= v.strides[d] * (v.shape[d] - 1);
            idx[d] = 0;
        }
    }
}

} // namespace

void Tensor::copy_to_host(void* dst, DType as) const {
    if (!defined()) throw Error("copy_to_host: the tensor is empty (default-constructed)");
    if (!view_.storage->written)
        fail(Error::Kind::Value,
             "copy_to_host: the {} tensor of shape {} was never written (created by empty() and not assigned)",
             dtype_name(view_.dtype), shape_str(view_.shape));
    auto* base = static_cast<const char*>(view_.storage->data);
    auto* out = static_cast<char*>(dst);
    size_t is = dtype_size(view_.dtype), os = dtype_size(as);
    if (as == view_.dtype && view_.is_contiguous()) {
        std::memcpy(out, base + view_.offset * is, (size_t)size() * is);
        return;
    }
    for_each_element(view_, [&](int64_t off, int64_t i) {
        const void* p = base + off * (int64_t)is;
        if (as == view_.dtype) std::memcpy(out + i * os, p, is);
        else store_element(as, out + i * os, load_element(view_.dtype, p));
    });
}

void Tensor::copy_from_host(const void* src, DType as) {
    if (!defined()) throw Error("copy_from_host: the tensor is empty (default-constructed)");
    auto* base = static_cast<char*>(view_.storage->data);
    auto* in = static_cast<const char*>(src);
    size_t is = dtype_size(view_.dtype), ss = dtype_size(as);
    if (as == view_.dtype && view_.is_contiguous()) {
        if (size()) std::memcpy(base + view_.offset * is, in, (size_t)size() * is);
    } else {
        for_each_element(view_, [&](int64_t off, int64_t i) {
            void* p = base + off * (int64_t)is;
            if (as == view_.dtype) std::memcpy(p, in + i * ss, is);
            else store_element(view_.dtype, p, load_element(as, in + i * ss));
        });
    }
    view_.storage->written = true;
}

} // namespace kiln
