#include "runtime/cpu/cpu_jit.hpp"
#include "runtime/kernel_cache.hpp"

#include "codegen/llvm/llvm_codegen.hpp"
#include "compiler/kernel_text.hpp"
#include "compiler/log.hpp"
#include "ir/error.hpp"
#include "runtime/cache/disk_cache.hpp"
#include "runtime/cpu/host_machine.hpp"
#include "runtime/cpu/thread_pool.hpp"
#include "runtime/manifest.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"  // LLVM's headers
#pragma GCC diagnostic ignored "-Wredundant-move"
#include <llvm/Analysis/TargetLibraryInfo.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/Module.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Triple.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#ifndef KILN_VERSION
#define KILN_VERSION "dev"
#endif

namespace kiln::cpu {

namespace {

// Below this many points (P points times R points) a launch runs on the calling thread: waking
// the pool costs more than the work.
constexpr int64_t kMinParallelWork = 32768;
// Work per task when a launch is split, and tasks per thread (for load balance).
constexpr int64_t kTaskWork = 16384;
constexpr int64_t kTasksPerThread = 4;
// Full reductions: R points per chunk, and a cap on the chunk count. Both are constants so that
// the chunking, and with it the rounding of float sums, depends only on the sizes.
constexpr int64_t kChunkWork = 32768;
constexpr int64_t kMaxChunks = 1024;

[[noreturn]] void fail_llvm(const std::string& what, llvm::Error err) {
    throw InternalError("cpu jit: " + what + ": " + llvm::toString(std::move(err)));
}

template <typename T>
T take(llvm::Expected<T> v, const std::string& what) {
    if (!v) fail_llvm(what, v.takeError());
    return std::move(*v);
}

std::string module_text(const llvm::Module& m) {
    std::string s;
    llvm::raw_string_ostream os(s);
    m.print(os, nullptr);
    return os.str();
}

void prepare_module(llvm::Module& m, llvm::TargetMachine& tm) {
    m.setDataLayout(tm.createDataLayout());
    m.setTargetTriple(tm.getTargetTriple().str());
}

// The O3 pipeline of the new pass manager, tuned for the target (vector width, costs). With
// `vector_math`, loops calling exp/log/pow/sin/cos vectorise through glibc's libmvec.
void optimise(llvm::Module& m, llvm::TargetMachine& tm, bool vector_math) {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PipelineTuningOptions pto;
    pto.LoopVectorization = true;
    pto.SLPVectorization = true;
    pto.LoopUnrolling = true;
    pto.LoopInterleaving = true;
    llvm::PassBuilder pb(&tm, pto);
    llvm::TargetLibraryInfoImpl tlii(tm.getTargetTriple());
    if (vector_math) tlii.addVectorizableFunctionsFromVecLib(llvm::TargetLibraryInfoImpl::LIBMVEC_X86, tm.getTargetTriple());
    fam.registerPass([&] { return llvm::TargetLibraryAnalysis(tlii); });
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(m, mam);
}

// Start of task t of `tasks` over [0, n): even shares, rounded to whole cache lines of float32
// where n allows, so that tasks start aligned and inner loops have fewer remainders.
int64_t split_point(int64_t n, int64_t t, int64_t tasks) {
    constexpr int64_t kAlign = 16;
    if (t == tasks) return n;
    const int64_t at = n * t / tasks;
    return n >= tasks * kAlign * 4 ? at / kAlign * kAlign : at;
}

int64_t product(const std::vector<int64_t>& sizes, const std::vector<int>& dims) {
    int64_t n = 1;
    for (int d : dims) n *= sizes[d];
    return n;
}

} // namespace

struct CpuJit::Impl {
    int threads;
    std::once_flag pool_once;
    std::unique_ptr<ThreadPool> pool;

    std::unique_ptr<llvm::TargetMachine> tm;  // optimisation and code generation (under compile_mu)
    std::unique_ptr<llvm::orc::LLJIT> jit;
    bool vector_math = false;
    MachineDescription machine;               // what the machine code depends on: part of the disk key
    std::unique_ptr<cache::DiskCache> disk;   // null: memory only

    std::mutex compile_mu;  // one compile or load at a time: the TargetMachine, the JIT's dylibs
    uint64_t dylibs = 0;

    bool forbid = false;   // KILN_ASSERT_NO_COMPILE
    std::string target;

    mutable std::mutex cache_mu;
    KernelCache<CpuKernel> cache{kernel_cache_capacity_from_env()};
    CpuJitCounters counters;

    explicit Impl(const CpuJitOptions& o) : threads(o.num_threads > 0 ? o.num_threads : default_num_threads()) {
        llvm::orc::JITTargetMachineBuilder jtmb = machine_builder(o.target);
        tm = take(jtmb.createTargetMachine(), "creating the target machine");
        jit = take(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(jtmb).create(), "creating the JIT");
        const char prefix = jit->getDataLayout().getGlobalPrefix();
        // libm (tanhf, expf, ...) and anything else the process has loaded.
        jit->getMainJITDylib().addGenerator(
            take(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(prefix), "opening the process symbols"));
        // libmvec's AVX2 entry points, when the target and the C library have them.
        if (has_avx2(jtmb)) {
            auto mvec = llvm::orc::DynamicLibrarySearchGenerator::Load("libmvec.so.1", prefix);
            if (mvec) {
                jit->getMainJITDylib().addGenerator(std::move(*mvec));
                vector_math = true;
            } else {
                llvm::consumeError(mvec.takeError());
            }
        }
        machine = describe_machine(jtmb, *tm, vector_math);
        if (o.disk_cache) disk = std::make_unique<cache::DiskCache>(cache::DiskCacheOptions{o.cache_dir, KILN_VERSION});
    }

    ThreadPool& thread_pool() {
        std::call_once(pool_once, [&] { pool = std::make_unique<ThreadPool>(threads); });
        return *pool;
    }

    // The name of the kernel's entry points (codegen/llvm_codegen.hpp): the kernel's own, which
    // the lowering derives from the key.
    static std::string symbol_of(const kir::Kernel& k) { return k.name.empty() ? std::string("kiln_kernel") : k.name; }

    cache::DiskCacheKey disk_key(const kir::Kernel& k, const std::string& key) const {
        return cache::cpu_kernel_key(key, kernel_text(k), symbol_of(k), machine.cpu, machine.text,
                                     machine.llvm_version + " abi " + std::to_string(codegen::kObjectAbi));
    }

    // The kernel's optimised module compiled to a relocatable object, as IRCompileLayer would.
    std::vector<char> build_object(const kir::Kernel& kernel) {
        kir::Kernel k = kernel;
        k.name = symbol_of(kernel);
        auto ctx = std::make_unique<llvm::LLVMContext>();
        std::unique_ptr<llvm::Module> m = codegen::emit_llvm(k, *ctx);
        prepare_module(*m, *tm);
        const bool debug = log_level() >= LogLevel::Debug;
        if (debug) log_debug("cpu jit: LLVM IR of {}:\n{}", k.name, module_text(*m));
        optimise(*m, *tm, vector_math);
        if (debug) log_debug("cpu jit: optimised LLVM IR of {}:\n{}", k.name, module_text(*m));
        llvm::orc::SimpleCompiler compiler(*tm);
        std::unique_ptr<llvm::MemoryBuffer> obj = take(compiler(*m), "generating machine code for " + k.name);
        return std::vector<char>(obj->getBufferStart(), obj->getBufferEnd());
    }

    // Links `object` into a JITDylib of its own and resolves the kernel's entry points. On
    // failure the dylib is removed and the reason returned in *error (out is then unusable).
    bool link(const kir::Kernel& kernel, const std::vector<char>& object, CpuKernel& out, std::string* error) {
        const std::string sym = symbol_of(kernel);
        auto created = jit->createJITDylib("kiln_kernel_" + std::to_string(++dylibs));
        if (!created) fail_llvm("creating a JITDylib for " + sym, created.takeError());
        llvm::orc::JITDylib& jd = *created;
        jd.addToLinkOrder(jit->getMainJITDylib());
        auto fail = [&](llvm::Error err) {
            *error = llvm::toString(std::move(err));
            if (llvm::Error e = jit->getExecutionSession().removeJITDylib(jd)) llvm::consumeError(std::move(e));
            return false;
        };
        // A copy: the buffer must be aligned for the object parser and must outlive the link.
        auto buffer = llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()), sym);
        if (llvm::Error err = jit->addObjectFile(jd, std::move(buffer))) return fail(std::move(err));
        auto find = [&](const std::string& name) -> llvm::Expected<llvm::orc::ExecutorAddr> { return jit->lookup(jd, name); };
        out.kernel = kernel;
        out.dylib = &jd;
        if (kernel.full_reduce) {
            auto partial = find(codegen::partial_entry_name(sym));
            if (!partial) return fail(partial.takeError());
            auto final_combine = find(codegen::final_entry_name(sym));
            if (!final_combine) return fail(final_combine.takeError());
            out.partial = partial->toPtr<PartialFn>();
            out.final_combine = final_combine->toPtr<FinalFn>();
        } else {
            auto run = find(sym);
            if (!run) return fail(run.takeError());
            out.run = run->toPtr<KernelFn>();
        }
        return true;
    }

    // The kernel from the disk cache, or null on a miss or an object that does not link.
    std::unique_ptr<CpuKernel> load(const kir::Kernel& kernel, const cache::DiskCacheKey& dkey) {
        if (!disk) return nullptr;
        std::optional<std::vector<char>> object = disk->load(dkey);
        if (!object) return nullptr;
        auto out = std::make_unique<CpuKernel>();
        std::string error;
        if (link(kernel, *object, *out, &error)) return out;
        // It passed the entry's checks yet does not link (a symbol this process cannot
        // resolve, say): compile afresh, which also replaces the file.
        log_warn("cpu jit: the cached object of kernel {} did not link ({}); compiling it again", kernel.name, error);
        return nullptr;
    }

    const CpuKernel* cached(const std::string& key) {
        std::lock_guard<std::mutex> lock(cache_mu);
        const CpuKernel* k = cache.find(key);
        if (k) ++counters.memory_hits;
        return k;
    }

    const CpuKernel* insert(const std::string& key, std::unique_ptr<CpuKernel> k) {
        std::lock_guard<std::mutex> lock(cache_mu);
        return cache.insert(key, std::move(k));
    }

    void remove_code(CpuKernel& k) {  // under compile_mu: the JIT's dylibs
        if (llvm::Error e = jit->getExecutionSession().removeJITDylib(*static_cast<llvm::orc::JITDylib*>(k.dylib)))
            log_warn("cpu jit: releasing kernel {}: {}", k.kernel.name, llvm::toString(std::move(e)));
    }
};

CpuJit::CpuJit(int num_threads) : CpuJit(CpuJitOptions{num_threads, true, {}, std::nullopt}) {}
CpuJit::CpuJit(CpuJitOptions options) : impl_(std::make_unique<Impl>(options)) {}
CpuJit::~CpuJit() = default;

const CpuKernel* CpuJit::compile(const kir::Kernel& kernel, const std::string& key) {
    Impl& m = *impl_;
    if (const CpuKernel* hit = m.cached(key)) return hit;
    std::lock_guard<std::mutex> compiling(m.compile_mu);
    if (const CpuKernel* hit = m.cached(key)) return hit;  // compiled while we waited

    auto t0 = std::chrono::steady_clock::now();
    auto since = [&] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
    const cache::DiskCacheKey dkey = m.disk_key(kernel, key);
    if (std::unique_ptr<CpuKernel> loaded = m.load(kernel, dkey)) {
        log_debug("cpu jit: loaded {} from the disk cache in {:.2f} ms", kernel.name, since());
        {
            std::lock_guard<std::mutex> lock(m.cache_mu);
            ++m.counters.disk_hits;
        }
        return m.insert(key, std::move(loaded));
    }
    if (m.forbid) refuse_compile(kernel, m.target, m.disk ? m.disk->dir() : std::string("(memory only)"));

    t0 = std::chrono::steady_clock::now();
    const std::vector<char> object = m.build_object(kernel);
    auto built = std::make_unique<CpuKernel>();
    std::string error;
    if (!m.link(kernel, object, *built, &error)) throw InternalError("cpu jit: linking " + kernel.name + ": " + error);
    const double ms = since();
    log_debug("cpu jit: compiled {} in {:.1f} ms ({} bytes of object code)", kernel.name, ms, object.size());
    if (m.disk) m.disk->store(dkey, object);
    {
        std::lock_guard<std::mutex> lock(m.cache_mu);
        ++m.counters.compiles;
        m.counters.compile_ms += ms;
    }
    return m.insert(key, std::move(built));
}

cache::DiskCacheKey CpuJit::disk_key(const kir::Kernel& kernel, const std::string& key) const {
    return impl_->disk_key(kernel, key);
}

const cache::DiskCache* CpuJit::disk_cache() const { return impl_->disk.get(); }

const std::string& CpuJit::cpu_name() const { return impl_->machine.cpu; }

void CpuJit::set_kernel_cache_capacity(size_t kernels) {
    std::lock_guard<std::mutex> lock(impl_->cache_mu);
    impl_->cache.set_capacity(kernels);
}

size_t CpuJit::cached_kernels() const {
    std::lock_guard<std::mutex> lock(impl_->cache_mu);
    return impl_->cache.size();
}

bool CpuJit::has_retired() const {
    std::lock_guard<std::mutex> lock(impl_->cache_mu);
    return impl_->cache.has_retired();
}

void CpuJit::for_each_retired(const std::function<void(const void*)>& f) const {
    std::lock_guard<std::mutex> lock(impl_->cache_mu);
    impl_->cache.for_each_retired(f);
}

void CpuJit::release_retired(const std::unordered_set<const void*>& keep) {
    std::lock_guard<std::mutex> compiling(impl_->compile_mu);  // compile()'s order: compile_mu, then cache_mu
    std::lock_guard<std::mutex> lock(impl_->cache_mu);
    impl_->cache.release_retired(keep, [&](CpuKernel& k) { impl_->remove_code(k); });
}

void CpuJit::forbid_compiles(bool on, std::string target) {
    impl_->forbid = on;
    impl_->target = std::move(target);
}

void CpuJit::launch(const CpuKernel* ck, const kir::LaunchArgs& a) {
    if (!ck) throw InternalError("cpu jit: launch of a null kernel");
    const kir::Kernel& k = ck->kernel;
    const size_t nbuf = k.buffers.size();
    if ((int)a.sizes.size() != k.rank || a.buffers.size() != nbuf || a.strides.size() != nbuf * k.rank ||
        (int)a.fparams.size() < k.num_fparams || (int)a.iparams.size() < k.num_iparams)
        throw InternalError(fmt::format("cpu jit: launch arguments of {} do not match the kernel ({} sizes, {} buffers, "
                                        "{} strides, {} fparams, {} iparams)",
                                        k.name, a.sizes.size(), a.buffers.size(), a.strides.size(), a.fparams.size(),
                                        a.iparams.size()));
    std::vector<int> pdims, rdims;
    for (int d = 0; d < k.rank; ++d) (k.reduced[d] ? rdims : pdims).push_back(d);
    const int64_t* sizes = a.sizes.data();
    void* const* buffers = a.buffers.data();
    const int64_t* strides = a.strides.data();
    const float* fparams = a.fparams.data();
    const int32_t* iparams = a.iparams.data();
    const int threads = impl_->threads;

    if (!k.full_reduce) {
        if (pdims.empty()) {
            ck->run(sizes, buffers, strides, fparams, iparams, 0, 1);
            return;
        }
        const int64_t n = a.sizes[pdims[0]];
        const int64_t points = product(a.sizes, pdims);
        if (points <= 0) return;
        const int64_t work = points * std::max<int64_t>(1, product(a.sizes, rdims));
        if (threads <= 1 || n <= 1 || work < kMinParallelWork) {
            ck->run(sizes, buffers, strides, fparams, iparams, 0, n);
            return;
        }
        const int64_t tasks = std::clamp<int64_t>(work / kTaskWork, 2, std::min<int64_t>(n, threads * kTasksPerThread));
        impl_->thread_pool().parallel_for(tasks, [&](int64_t t) {
            ck->run(sizes, buffers, strides, fparams, iparams, split_point(n, t, tasks), split_point(n, t + 1, tasks));
        });
        return;
    }

    // Full reduction: chunks of R dim 0, partial states in chunk order, then one combine.
    const int64_t n0 = rdims.empty() ? 0 : a.sizes[rdims[0]];
    const int64_t total = product(a.sizes, rdims);
    int64_t chunks = 0;
    if (total > 0) chunks = std::clamp<int64_t>((total + kChunkWork - 1) / kChunkWork, 1, std::min(n0, kMaxChunks));
    static_assert(codegen::kAccStateBytes % sizeof(uint64_t) == 0);
    const size_t record = k.accums.size() * (codegen::kAccStateBytes / sizeof(uint64_t));  // in 8-byte units
    std::vector<uint64_t> partials(std::max<size_t>(1, (size_t)chunks * record));
    auto run_chunk = [&](int64_t c) {
        ck->partial(sizes, buffers, strides, fparams, iparams, n0 * c / chunks, n0 * (c + 1) / chunks,
                    partials.data() + c * record);
    };
    if (threads <= 1 || chunks <= 1) {
        for (int64_t c = 0; c < chunks; ++c) run_chunk(c);
    } else {
        impl_->thread_pool().parallel_for(chunks, run_chunk);
    }
    ck->final_combine(sizes, buffers, strides, fparams, iparams, partials.data(), chunks);
}

CpuJitCounters CpuJit::counters() const {
    std::lock_guard<std::mutex> lock(impl_->cache_mu);
    return impl_->counters;
}

void CpuJit::reset_counters() {
    std::lock_guard<std::mutex> lock(impl_->cache_mu);
    impl_->counters = {};
}

int CpuJit::num_threads() const { return impl_->threads; }

std::string llvm_ir_text(const kir::Kernel& kernel, bool optimised) {
    init_llvm();
    llvm::LLVMContext ctx;
    std::unique_ptr<llvm::Module> m = codegen::emit_llvm(kernel, ctx);
    if (optimised) {
        llvm::orc::JITTargetMachineBuilder jtmb = machine_builder(std::nullopt);
        auto tm = take(jtmb.createTargetMachine(), "creating the host target machine");
        prepare_module(*m, *tm);
        optimise(*m, *tm, has_avx2(jtmb));
    }
    return module_text(*m);
}

} // namespace kiln::cpu
