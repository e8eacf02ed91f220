// The CPU backend's compiler and launcher: kernel IR -> LLVM IR (codegen/llvm) -> optimised
// host machine code in an ORC LLJIT, cached in memory by key, launched over a thread pool.
// No LLVM header is included here: users of the runtime headers need not have LLVM's.
#pragma once
#include "compiler/kernel_ir.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace kiln::cpu {

struct CpuJitCounters {
    uint64_t compiles = 0;     // kernels compiled
    uint64_t memory_hits = 0;  // compile() calls answered from the memory cache
    double compile_ms = 0;     // time spent compiling (emit, optimise, machine code)
};

// Entry points of a compiled kernel; the ABI is described in codegen/llvm/llvm_codegen.hpp.
using KernelFn = void (*)(const int64_t* sizes, void* const* buffers, const int64_t* strides, const float* fparams,
                          const int32_t* iparams, int64_t begin, int64_t end);
using PartialFn = void (*)(const int64_t* sizes, void* const* buffers, const int64_t* strides, const float* fparams,
                           const int32_t* iparams, int64_t begin, int64_t end, void* partial);
using FinalFn = void (*)(const int64_t* sizes, void* const* buffers, const int64_t* strides, const float* fparams,
                         const int32_t* iparams, const void* partials, int64_t nchunks);

// A compiled kernel. It lives as long as the CpuJit that made it.
struct CpuKernel {
    kir::Kernel kernel;
    KernelFn run = nullptr;          // kernels without full_reduce
    PartialFn partial = nullptr;     // full_reduce: one chunk of R dim 0
    FinalFn final_combine = nullptr; // full_reduce: combine the chunks, then the Point block
};

class CpuJit {
public:
    // num_threads <= 0: $KILN_NUM_THREADS, else the hardware concurrency.
    explicit CpuJit(int num_threads = 0);
    ~CpuJit();
    CpuJit(const CpuJit&) = delete;
    CpuJit& operator=(const CpuJit&) = delete;

    // The compiled kernel for `key`, compiled on first use. Thread-safe. Throws std::logic_error
    // (kiln::InternalError) if the generated code fails to verify or to link.
    const CpuKernel* compile(const kir::Kernel& kernel, const std::string& key);

    // Runs the kernel once over `args` (in the kernel's numbering), using the thread pool when
    // there is enough work. Full reductions are split into a number of chunks that depends only
    // on the sizes, so their results do not depend on the thread count.
    void launch(const CpuKernel* kernel, const kir::LaunchArgs& args);

    // With it set, compile() throws (KILN_ASSERT_NO_COMPILE) instead of compiling a kernel it
    // does not have; `target` names the CPU in the message.
    void forbid_compiles(bool on, std::string target);

    CpuJitCounters counters() const;
    void reset_counters();
    int num_threads() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// The LLVM IR generated for a kernel, before optimisation (or after, with the host's optimisation
// pipeline), for debugging. KILN_LOG=debug prints both for every kernel compiled.
std::string llvm_ir_text(const kir::Kernel& kernel, bool optimised = false);

} // namespace kiln::cpu
