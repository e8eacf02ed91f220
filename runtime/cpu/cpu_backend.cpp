// The CPU JIT behind the DeviceBackend interface (runtime/backend.hpp); the host backend of a
// build with LLVM.
#include "runtime/backend.hpp"

#include "runtime/cpu/cpu_jit.hpp"
#include "runtime/host_backend.hpp"

namespace kiln {

namespace {

class CpuJitBackend final : public HostBackend {
public:
    KernelHandle compile(const kir::Kernel& kernel, const std::string& key) override { return jit_.compile(kernel, key); }
    void launch(KernelHandle kernel, const kir::LaunchArgs& args) override {
        jit_.launch(static_cast<const cpu::CpuKernel*>(kernel), args);
    }
    void forbid_compiles(bool on) override { jit_.forbid_compiles(on, target()); }
    void set_kernel_cache_capacity(size_t kernels) override { jit_.set_kernel_cache_capacity(kernels); }
    void retired_kernels(std::unordered_set<KernelHandle>& out) const override {
        if (jit_.has_retired()) jit_.for_each_retired([&](const void* k) { out.insert(k); });
    }
    void release_retired(const std::unordered_set<KernelHandle>& keep) override { jit_.release_retired(keep); }
    BackendCounters counters() const override {
        cpu::CpuJitCounters j = jit_.counters();
        return BackendCounters{j.compiles, j.memory_hits, j.disk_hits, j.compile_ms, jit_.cached_kernels()};
    }
    void reset_counters() override { jit_.reset_counters(); }

private:
    cpu::CpuJit jit_;
};

} // namespace

std::unique_ptr<DeviceBackend> make_host_backend() { return std::make_unique<CpuJitBackend>(); }

} // namespace kiln
