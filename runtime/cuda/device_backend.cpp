#include "runtime/cuda/device_backend.hpp"

#include "ir/error.hpp"
#include "runtime/context_impl.hpp"
#include "runtime/cuda/validate.hpp"
#include "runtime/owned_storage.hpp"

#include <fmt/format.h>

#include <unordered_map>

namespace kiln {

namespace cuda {

namespace {

// Device memory from the caching allocator; returned to its cache when the last view dies.
struct DeviceStorage : OwnedStorage {
    std::shared_ptr<Allocator> allocator;
    ~DeviceStorage() override { allocator->release((CUdeviceptr)data, nbytes); }
};

class CudaDeviceBackend final : public DeviceBackend {
public:
    CudaDeviceBackend(int index, std::unique_ptr<DeviceBackend> reference)
        : gpu_(index), reference_(std::move(reference)) {}

    CudaBackend& gpu() { return gpu_; }

    Device device() const override { return Device{DeviceKind::CUDA, gpu_.info().index}; }
    std::string name() const override { return fmt::format("cuda:{}", gpu_.info().index); }
    std::string description() const override {
        const DeviceInfo& i = gpu_.info();
        return fmt::format("cuda:{} {} (sm_{}, {} SMs, {:.1f} GiB)", i.index, i.name, i.sm, i.multiprocessors,
                           i.total_memory / double(1u << 30));
    }
    std::string target() const override { return gpu_.target(); }

    KernelHandle compile(const kir::Kernel& kernel, const std::string& key) override {
        const CudaKernel* k = gpu_.compile(kernel, key);
        if (reference_) reference_of_[k] = reference_->compile(kernel, key + "\nvalidate-on " + reference_->target());
        return k;
    }
    void launch(KernelHandle kernel, const kir::LaunchArgs& args) override {
        auto* k = static_cast<const CudaKernel*>(kernel);
        if (!reference_) return gpu_.launch(k, args);
        KernelHandle ref = reference_of_.at(k);
        validate_launch(gpu_, k, args, [&](const kir::LaunchArgs& host_args) { reference_->launch(ref, host_args); });
    }
    void forbid_compiles(bool on) override {
        gpu_.forbid_compiles(on);
        if (reference_) reference_->forbid_compiles(on);
    }
    void set_kernel_cache_capacity(size_t kernels) override {
        gpu_.set_kernel_cache_capacity(kernels);
        if (reference_) reference_->set_kernel_cache_capacity(kernels);
    }
    // A kernel is retired when its reference is: the plans that use it must go with it.
    void retired_kernels(std::unordered_set<KernelHandle>& out) const override {
        gpu_.for_each_retired([&](const void* k) { out.insert(k); });
        if (!reference_) return;
        std::unordered_set<KernelHandle> refs;
        reference_->retired_kernels(refs);
        if (refs.empty()) return;
        for (auto& [k, r] : reference_of_)
            if (refs.count(r)) out.insert(k);
    }
    void release_retired(const std::unordered_set<KernelHandle>& keep) override {
        if (reference_) {
            std::unordered_set<KernelHandle> kept;
            for (KernelHandle k : keep)
                if (auto it = reference_of_.find(static_cast<const CudaKernel*>(k)); it != reference_of_.end())
                    kept.insert(it->second);
            reference_->release_retired(kept);
            std::unordered_set<KernelHandle> gone;
            gpu_.for_each_retired([&](const void* k) {
                if (!keep.count(k)) gone.insert(k);
            });
            for (KernelHandle k : gone) reference_of_.erase(static_cast<const CudaKernel*>(k));
        }
        gpu_.release_retired(keep);
    }

    std::shared_ptr<Storage> allocate(size_t nbytes, const char* op) override {
        auto s = std::make_shared<DeviceStorage>();
        s->allocator = gpu_.allocator();
        s->data = (void*)s->allocator->allocate(nbytes, op);
        s->nbytes = nbytes;
        s->device = device();
        return s;
    }
    void write(Storage& s, size_t off, const void* src, size_t n) override {
        if (n) gpu_.upload((CUdeviceptr)s.data + off, src, n);
    }
    void read(const Storage& s, size_t off, void* dst, size_t n) override {
        if (n) gpu_.download(dst, (CUdeviceptr)s.data + off, n);
    }
    void synchronize() override { gpu_.synchronize(); }
    uintptr_t stream() const override { return (uintptr_t)gpu_.stream(); }
    void order_before(uintptr_t stream) override { gpu_.order_before((CUstream)stream); }
    void wait_for(uintptr_t stream) override { gpu_.wait_for((CUstream)stream); }
    std::shared_ptr<void> new_mark() override {
        gpu_.make_current();
        CUevent ev = nullptr;
        check(driver().cuEventCreate(&ev, CU_EVENT_DEFAULT), "cuEventCreate");
        return std::shared_ptr<void>(ev, [](void* e) { driver().cuEventDestroy(static_cast<CUevent>(e)); });
    }
    void record_mark(void* mark) override {
        gpu_.make_current();
        check(driver().cuEventRecord(static_cast<CUevent>(mark), gpu_.stream()), "cuEventRecord");
    }
    void wait_mark(void* mark) override {
        gpu_.make_current();
        check(driver().cuEventSynchronize(static_cast<CUevent>(mark)), "cuEventSynchronize");
    }
    double mark_elapsed_ms(void* start, void* end) override {
        gpu_.make_current();
        float ms = 0;
        check(driver().cuEventElapsedTime(&ms, static_cast<CUevent>(start), static_cast<CUevent>(end)),
              "cuEventElapsedTime");
        return ms;
    }

    BackendCounters counters() const override {
        CudaCounters g = gpu_.counters();
        return BackendCounters{g.compiles, g.memory_hits, g.disk_hits, g.compile_ms, gpu_.cached_kernels()};
    }
    void reset_counters() override { gpu_.reset_counters(); }

private:
    CudaBackend gpu_;
    std::unique_ptr<DeviceBackend> reference_;   // KILN_VALIDATE=cpu
    std::unordered_map<const CudaKernel*, KernelHandle> reference_of_;
};

} // namespace

CudaBackend& cuda_backend(Context& ctx) {
    auto* b = dynamic_cast<CudaDeviceBackend*>(context_impl(ctx).backend.get());
    if (!b) throw InternalError("cuda_backend: the context runs on " + ctx.device_name() + ", not on a CUDA device");
    return b->gpu();
}

} // namespace cuda

std::unique_ptr<DeviceBackend> make_cuda_backend(int index, std::unique_ptr<DeviceBackend> reference) {
    return std::make_unique<cuda::CudaDeviceBackend>(index, std::move(reference));
}

} // namespace kiln
