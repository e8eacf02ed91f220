// What a Context asks of the machine its expressions run on: one interface, implemented by the
// CPU JIT (runtime/cpu), the CUDA backend (runtime/cuda) and the kernel-IR interpreter (the
// CPU backend of a build without LLVM).
//
// Why it exists: the Context (plans, caches of plans, RNG, counters, errors) is the same for
// every backend; only compiling, launching and memory differ. With them behind one interface the
// Context has no backend conditionals, a new backend is one new implementation, and which
// backends a build has is decided by meson (each implementation's factory is compiled, or a
// stub that says why it is missing), not by #if in the code that uses them.
#pragma once
#include "compiler/kernel_ir.hpp"
#include "ir/storage.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>

namespace kiln {

struct BackendCounters {
    uint64_t compiles = 0;         // kernels compiled
    uint64_t memory_hits = 0;      // compile() calls answered by the memory cache
    uint64_t disk_hits = 0;        // kernels loaded from the disk cache
    double compile_ms = 0;         // time spent compiling
    uint64_t cached_kernels = 0;   // kernels in the memory cache now
};

// A compiled kernel as the backend that made it knows it; valid until release_retired frees it.
using KernelHandle = const void*;

class DeviceBackend {
public:
    virtual ~DeviceBackend() = default;

    virtual Device device() const = 0;
    virtual std::string name() const = 0;          // "cpu", "cuda:0"
    virtual std::string description() const = 0;   // with the device's model and memory
    // What kernels are compiled for: part of every kernel key and manifest line ("sm_90",
    // "cpu-x86_64-avx2").
    virtual std::string target() const = 0;

    // ---- kernels
    // The kernel for `key`: from the memory cache, else loaded from the disk cache, else compiled
    // (and stored). Throws when compiles are refused and neither cache has it.
    virtual KernelHandle compile(const kir::Kernel& kernel, const std::string& key) = 0;
    // Runs a kernel of this backend over `args` (buffers in this backend's memory), ordered after
    // everything launched before it.
    virtual void launch(KernelHandle kernel, const kir::LaunchArgs& args) = 0;
    // KILN_ASSERT_NO_COMPILE: a kernel found in neither cache is an error (where there is a
    // compiler: the interpreter has none).
    virtual void forbid_compiles(bool on) = 0;
    // The memory cache keeps at most this many kernels (at least 1); those it evicts are
    // retired: the caller drops what points at them, then releases them.
    virtual void set_kernel_cache_capacity(size_t kernels) = 0;
    virtual void retired_kernels(std::unordered_set<KernelHandle>& out) const = 0;
    // Frees the retired kernels but those in `keep`, which return to the cache.
    virtual void release_retired(const std::unordered_set<KernelHandle>& keep) = 0;

    // ---- memory and ordering
    // Memory for `nbytes` (at least), as an OwnedStorage (runtime/owned_storage.hpp) whose owner
    // the Context sets; `op` names the user call in an out-of-memory error.
    virtual std::shared_ptr<Storage> allocate(size_t nbytes, const char* op) = 0;
    // Contiguous bytes between host memory and `s` (memory of this backend); they return when the
    // data has arrived where the caller can see it.
    virtual void write(Storage& s, size_t byte_offset, const void* src, size_t n) = 0;
    virtual void read(const Storage& s, size_t byte_offset, void* dst, size_t n) = 0;
    virtual void synchronize() = 0;
    // The CUstream work is ordered on (CUDA), 0 where launches complete before they return.
    virtual uintptr_t stream() const = 0;
    // Work given to `stream` from now on waits for everything given to this backend so far, and
    // the reverse. Nothing to do where launches complete before they return.
    virtual void order_before(uintptr_t stream) = 0;
    virtual void wait_for(uintptr_t stream) = 0;

    // ---- timing marks (neon's init_mark / record_mark / synchronize_mark / get_time): a point
    // in the order of this backend's work. record_mark places it after everything given so far,
    // wait_mark returns once the work before it has finished, mark_elapsed_ms is the time
    // between two recorded marks (CUDA events on a GPU, the host clock where launches complete
    // before they return).
    virtual std::shared_ptr<void> new_mark() = 0;
    virtual void record_mark(void* mark) = 0;
    virtual void wait_mark(void* mark) = 0;
    virtual double mark_elapsed_ms(void* start, void* end) = 0;

    // ---- counters
    virtual BackendCounters counters() const = 0;
    virtual void reset_counters() = 0;
};

// The host's backend: the CPU JIT, or the kernel-IR interpreter in a build without LLVM.
std::unique_ptr<DeviceBackend> make_host_backend();
// CUDA device `index`. With `reference`, every launch also runs the kernel on it over host
// copies of the buffers and compares the results (KILN_VALIDATE=cpu). Throws kiln::Error
// (Runtime) saying why the device cannot be used, or that this build has no CUDA backend.
std::unique_ptr<DeviceBackend> make_cuda_backend(int index, std::unique_ptr<DeviceBackend> reference);

} // namespace kiln
