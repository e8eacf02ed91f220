#include "runtime/host_backend.hpp"

#include "ir/error.hpp"
#include "runtime/host_target.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/kir_interpreter.hpp"
#include "runtime/owned_storage.hpp"

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace kiln {

namespace {

struct HostStorage : OwnedStorage {
    ~HostStorage() override { std::free(data); }
};

class InterpreterBackend final : public HostBackend {
public:
    KernelHandle compile(const kir::Kernel& kernel, const std::string& key) override {
        std::lock_guard<std::mutex> lock(mu_);
        if (const kir::Kernel* k = kernels_.find(key)) {
            ++counters_.memory_hits;
            return k;
        }
        ++counters_.compiles;
        return kernels_.insert(key, std::make_unique<kir::Kernel>(kernel));
    }
    void launch(KernelHandle kernel, const kir::LaunchArgs& args) override {
        interpret(*static_cast<const kir::Kernel*>(kernel), args);
    }
    void forbid_compiles(bool) override {}   // it keeps the kernel IR: nothing is compiled
    void set_kernel_cache_capacity(size_t kernels) override {
        std::lock_guard<std::mutex> lock(mu_);
        kernels_.set_capacity(kernels);
    }
    void retired_kernels(std::unordered_set<KernelHandle>& out) const override {
        std::lock_guard<std::mutex> lock(mu_);
        kernels_.for_each_retired([&](const void* k) { out.insert(k); });
    }
    void release_retired(const std::unordered_set<KernelHandle>& keep) override {
        std::lock_guard<std::mutex> lock(mu_);
        kernels_.release_retired(keep, [](kir::Kernel&) {});
    }
    BackendCounters counters() const override {
        std::lock_guard<std::mutex> lock(mu_);
        BackendCounters c = counters_;
        c.cached_kernels = kernels_.size();
        return c;
    }
    void reset_counters() override {
        std::lock_guard<std::mutex> lock(mu_);
        counters_ = {};
    }

private:
    mutable std::mutex mu_;   // counters() may be read from any thread, as the CPU JIT's
    KernelCache<kir::Kernel> kernels_{kernel_cache_capacity_from_env()};
    BackendCounters counters_;
};

} // namespace

std::string HostBackend::target() const { return host_target_label(); }

std::shared_ptr<Storage> HostBackend::allocate(size_t nbytes, const char* op) {
    auto s = std::make_shared<HostStorage>();
    size_t padded = (nbytes + 63) / 64 * 64;
    s->data = padded ? std::aligned_alloc(64, padded) : nullptr;
    if (padded && !s->data) fail(Error::Kind::Memory, "{}: out of host memory allocating {} bytes", op, nbytes);
    s->nbytes = nbytes;
    s->device = device();
    return s;
}

void HostBackend::write(Storage& s, size_t off, const void* src, size_t n) {
    if (n) std::memcpy(static_cast<char*>(s.data) + off, src, n);
}

void HostBackend::read(const Storage& s, size_t off, void* dst, size_t n) {
    if (n) std::memcpy(dst, static_cast<const char*>(s.data) + off, n);
}

std::unique_ptr<DeviceBackend> make_interpreter_backend() { return std::make_unique<InterpreterBackend>(); }

} // namespace kiln
