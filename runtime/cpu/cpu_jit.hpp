// The CPU backend's compiler and launcher: kernel IR -> LLVM IR (codegen/llvm) -> optimised
// host machine code in an ORC LLJIT, cached in memory by key and on disk (runtime/cache), launched
// over a thread pool. compile() asks the memory cache, then the disk cache, then compiles.
//
// Disk cache: the relocatable object file of each kernel is stored under cache::cpu_kernel_key —
// the kernel's key, its symbol name and the full description of the machine code's target (CPU
// model, every feature, triple, optimisation levels, LLVM version: host_machine.hpp) — so an
// object is only ever loaded on the CPU and LLVM it was made for. A disk hit adds the object to
// the JIT with no LLVM optimisation or code generation.
//
// Why the object is produced here rather than through an llvm::ObjectCache on LLJIT's compile
// layer: the choice between a disk hit and a compile has to be made before the O3 IR pipeline,
// which runs here, outside the compile layer (an ObjectCache is asked only after the module was
// emitted and optimised); an ObjectCache is also consulted lazily, during materialisation at the
// first lookup, where KILN_ASSERT_NO_COMPILE could not refuse the compile before it happens. So a
// compile runs orc::SimpleCompiler — the compiler IRCompileLayer itself runs — on the optimised
// module, stores the object, and adds it with LLJIT::addObjectFile exactly as a disk hit adds
// the object it read: every compile goes through the load path too.
//
// Symbols: each kernel is linked into a JITDylib of its own (whose link order continues into the
// main JITDylib: libm, libmvec, the process), so its entry points keep the kernel's name —
// derived from its key, and part of the disk key — and two keys with one name never clash. No
// process-local name enters an object, so an object stored by one process links in any other.
//
// No LLVM header is included here: users of the runtime headers need not have LLVM's.
#pragma once
#include "compiler/kernel_ir.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_set>
#include <optional>
#include <string>

namespace kiln::cache { class DiskCache; struct DiskCacheKey; }

namespace kiln::cpu {

struct CpuJitCounters {
    uint64_t compiles = 0;     // kernels compiled
    uint64_t memory_hits = 0;  // compile() calls answered from the memory cache
    uint64_t disk_hits = 0;    // kernels whose object was loaded from the disk cache
    double compile_ms = 0;     // time spent compiling (emit, optimise, machine code)
};

// A CPU to generate code for instead of the host: an LLVM CPU name ("x86-64", "skylake") and
// feature string ("+avx2,-avx512f"; "" for the CPU's defaults). For tests, and for code this
// host can run (a baseline CPU): the code is not checked against the host.
struct CpuTarget {
    std::string cpu;
    std::string features;
};

struct CpuJitOptions {
    int num_threads = 0;              // <= 0: $KILN_NUM_THREADS, else the hardware concurrency
    bool disk_cache = true;           // false: compiled kernels live in memory only
    std::string cache_dir;            // empty: cache::default_cache_dir() (KILN_CACHE_DIR, ...)
    std::optional<CpuTarget> target;  // unset: the host as LLVM detects it
};

// Entry points of a compiled kernel; the ABI is described in codegen/llvm/llvm_codegen.hpp.
using KernelFn = void (*)(const int64_t* sizes, void* const* buffers, const int64_t* strides, const float* fparams,
                          const int32_t* iparams, int64_t begin, int64_t end);
using PartialFn = void (*)(const int64_t* sizes, void* const* buffers, const int64_t* strides, const float* fparams,
                           const int32_t* iparams, int64_t begin, int64_t end, void* partial);
using FinalFn = void (*)(const int64_t* sizes, void* const* buffers, const int64_t* strides, const float* fparams,
                         const int32_t* iparams, const void* partials, int64_t nchunks);

// A compiled kernel. It lives in the CpuJit's memory cache until evicted and released
// (release_retired), at the latest as long as the CpuJit.
struct CpuKernel {
    kir::Kernel kernel;
    KernelFn run = nullptr;          // kernels without full_reduce
    PartialFn partial = nullptr;     // full_reduce: one chunk of R dim 0
    FinalFn final_combine = nullptr; // full_reduce: combine the chunks, then the Point block
    void* dylib = nullptr;           // its llvm::orc::JITDylib, removed when the kernel is released
};

class CpuJit {
public:
    // num_threads <= 0: $KILN_NUM_THREADS, else the hardware concurrency. The disk cache is the
    // default directory's.
    explicit CpuJit(int num_threads = 0);
    explicit CpuJit(CpuJitOptions options);
    ~CpuJit();
    CpuJit(const CpuJit&) = delete;
    CpuJit& operator=(const CpuJit&) = delete;

    // The compiled kernel for `key`: from memory, else loaded from the disk cache, else compiled
    // (and stored). Thread-safe. Throws std::logic_error (kiln::InternalError) if the generated
    // code fails to verify or to link. An object from disk that does not link is compiled afresh.
    const CpuKernel* compile(const kir::Kernel& kernel, const std::string& key);

    // The disk cache entry compile() uses for this kernel and key (kiln-warmup --check reads it).
    cache::DiskCacheKey disk_key(const kir::Kernel& kernel, const std::string& key) const;
    // Null when the disk cache is off (CpuJitOptions::disk_cache).
    const cache::DiskCache* disk_cache() const;
    // LLVM's name of the CPU the code is generated for ("znver3").
    const std::string& cpu_name() const;

    // Runs the kernel once over `args` (in the kernel's numbering), using the thread pool when
    // there is enough work. Full reductions are split into a number of chunks that depends only
    // on the sizes, so their results do not depend on the thread count.
    void launch(const CpuKernel* kernel, const kir::LaunchArgs& args);

    // With it set, compile() throws (KILN_ASSERT_NO_COMPILE) instead of compiling a kernel it
    // does not have; `target` names the CPU in the message.
    void forbid_compiles(bool on, std::string target);

    // The memory cache keeps at most this many kernels (at least 1), evicting the least
    // recently used into a retired list: the caller drops what points at them, then releases.
    void set_kernel_cache_capacity(size_t kernels);
    size_t cached_kernels() const;
    bool has_retired() const;
    void for_each_retired(const std::function<void(const void*)>& f) const;
    // Frees the retired kernels (their code leaves the JIT) but those in `keep`, which return.
    void release_retired(const std::unordered_set<const void*>& keep);

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
