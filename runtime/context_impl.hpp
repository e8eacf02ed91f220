// Context's private state, shared by context.cpp (evaluation) and tensor.cpp (tensor data).
#pragma once
#include "runtime/context.hpp"
#include "runtime/manifest.hpp"
#include "runtime/owned_storage.hpp"
#include "runtime/plan_cache.hpp"

#ifdef KILN_HAVE_LLVM
#include "runtime/cpu/cpu_jit.hpp"
#define KILN_CPU_JIT 1
#endif
#ifdef KILN_HAVE_NVRTC
#include "runtime/cuda/cuda_backend.hpp"
#define KILN_CUDA 1
#endif

#include <memory>
#include <mutex>
#include <string>

namespace kiln {

struct Context::Impl {
    Context* self = nullptr;
    Backend backend = Backend::CPU;
    DType default_dtype = DType::Float32;
    uint32_t seed = 0;
    uint32_t rng_counter = 0;
    int stochastic_round_bits = 0;
    bool allow_tf32 = false;
    Counters counters;
    std::mutex mu;
    std::string target;  // what kernels are compiled for: part of every kernel key
#ifdef KILN_CPU_JIT
    std::unique_ptr<cpu::CpuJit> jit;  // the CPU backend, or the reference of KILN_VALIDATE=cpu
#endif
#ifdef KILN_CUDA
    std::unique_ptr<cuda::CudaBackend> cuda;
#endif
    bool validate = false;  // KILN_VALIDATE=cpu: every CUDA kernel is also run on the CPU and compared
    std::unique_ptr<ManifestWriter> record;  // KILN_RECORD / Context::record_to
    PlanCache plans;
    AssignmentSignature signature;  // reused by every assignment
    std::vector<std::shared_ptr<Storage>> temps;

    Device device() const {
#ifdef KILN_CUDA
        if (cuda) return Device{DeviceKind::CUDA, cuda->info().index};
#endif
        return Device{DeviceKind::CPU, 0};
    }
    // Memory for a tensor or a temporary of this context's backend. `op` names the user call.
    std::shared_ptr<Storage> alloc(size_t nbytes, const char* op);
    void run(const View& dst, const NodePtr& expr);
    bool usable(const Storage* s) const;  // Context::can_use
    void check_devices(const NodePtr& expr);
    CachedPlan* plan_for(const View& dst, const NodePtr& expr);
    void release_retired(const CachedPlan& fresh);
    void execute(CachedPlan& plan);
    void launch(CachedStage& st);

    // Contiguous bytes between host memory and a storage (device or host) of this context.
    void write_bytes(Storage& s, size_t byte_offset, const void* src, size_t n);
    void read_bytes(const Storage& s, size_t byte_offset, void* dst, size_t n);
};

// A context's state, for the library's own code (the public Context has no accessor).
inline Context::Impl& context_impl(Context& c) { return *c.impl_; }

} // namespace kiln
