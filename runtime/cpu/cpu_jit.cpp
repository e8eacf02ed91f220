#include "runtime/cpu/cpu_jit.hpp"

#include "codegen/llvm/llvm_codegen.hpp"
#include "compiler/log.hpp"
#include "ir/error.hpp"
#include "runtime/cpu/thread_pool.hpp"
#include "runtime/manifest.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"  // LLVM's headers
#pragma GCC diagnostic ignored "-Wredundant-move"
#include <llvm/ADT/StringMap.h>
#include <llvm/Analysis/TargetLibraryInfo.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/Module.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/TargetParser/Triple.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <chrono>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

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

void init_llvm() {
    static std::once_flag once;
    std::call_once(once, [] {
        llvm::InitializeNativeTarget();
        llvm::InitializeNativeTargetAsmPrinter();
        llvm::InitializeNativeTargetAsmParser();
    });
}

[[noreturn]] void fail_llvm(const std::string& what, llvm::Error err) {
    throw InternalError("cpu jit: " + what + ": " + llvm::toString(std::move(err)));
}

template <typename T>
T take(llvm::Expected<T> v, const std::string& what) {
    if (!v) fail_llvm(what, v.takeError());
    return std::move(*v);
}

llvm::orc::JITTargetMachineBuilder host_machine() {
    auto jtmb = take(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host target");
    jtmb.setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
    return jtmb;
}

bool host_has_avx2() {
    llvm::StringMap<bool> features;
    return llvm::sys::getHostCPUFeatures(features) && features.lookup("avx2");
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

// The O3 pipeline of the new pass manager, tuned for the host (vector width, costs). With
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

    std::unique_ptr<llvm::TargetMachine> tm;  // for the optimisation pipeline
    std::unique_ptr<llvm::orc::LLJIT> jit;
    bool vector_math = false;

    std::mutex compile_mu;  // one compile at a time: LLVM state, symbol names
    std::unordered_set<std::string> symbols;

    bool forbid = false;   // KILN_ASSERT_NO_COMPILE
    std::string target;

    mutable std::mutex cache_mu;
    std::unordered_map<std::string, std::unique_ptr<CpuKernel>> cache;
    CpuJitCounters counters;

    explicit Impl(int n) : threads(n > 0 ? n : default_num_threads()) {
        init_llvm();
        auto jtmb = host_machine();
        tm = take(jtmb.createTargetMachine(), "creating the host target machine");
        jit = take(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(jtmb).create(), "creating the JIT");
        const char prefix = jit->getDataLayout().getGlobalPrefix();
        // libm (tanhf, expf, ...) and anything else the process has loaded.
        jit->getMainJITDylib().addGenerator(
            take(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(prefix), "opening the process symbols"));
        // libmvec's AVX2 entry points, when the machine and the C library have them.
        if (host_has_avx2()) {
            auto mvec = llvm::orc::DynamicLibrarySearchGenerator::Load("libmvec.so.1", prefix);
            if (mvec) {
                jit->getMainJITDylib().addGenerator(std::move(*mvec));
                vector_math = true;
            } else {
                llvm::consumeError(mvec.takeError());
            }
        }
    }

    ThreadPool& thread_pool() {
        std::call_once(pool_once, [&] { pool = std::make_unique<ThreadPool>(threads); });
        return *pool;
    }

    // A symbol name not used before in this JIT: kernel names are unique per key, but two keys
    // could in principle map to one name.
    std::string unique_symbol(const std::string& name) {
        std::string base = name.empty() ? "kiln_kernel" : name;
        std::string s = base;
        for (int i = 1; symbols.count(s) || symbols.count(codegen::partial_entry_name(s)); ++i)
            s = base + "_" + std::to_string(i);
        return s;
    }

    std::unique_ptr<CpuKernel> build(const kir::Kernel& kernel) {
        kir::Kernel k = kernel;
        k.name = unique_symbol(kernel.name);
        auto ctx = std::make_unique<llvm::LLVMContext>();
        std::unique_ptr<llvm::Module> m = codegen::emit_llvm(k, *ctx);
        prepare_module(*m, *tm);
        const bool debug = log_level() >= LogLevel::Debug;
        if (debug) log_debug("cpu jit: LLVM IR of {}:\n{}", k.name, module_text(*m));
        optimise(*m, *tm, vector_math);
        if (debug) log_debug("cpu jit: optimised LLVM IR of {}:\n{}", k.name, module_text(*m));

        if (auto err = jit->addIRModule(llvm::orc::ThreadSafeModule(std::move(m), std::move(ctx))))
            fail_llvm("adding the module of " + k.name, std::move(err));
        auto out = std::make_unique<CpuKernel>();
        out->kernel = kernel;
        auto find = [&](const std::string& sym) {
            symbols.insert(sym);
            return take(jit->lookup(sym), "linking " + sym);
        };
        if (k.full_reduce) {
            out->partial = find(codegen::partial_entry_name(k.name)).toPtr<PartialFn>();
            out->final_combine = find(codegen::final_entry_name(k.name)).toPtr<FinalFn>();
        } else {
            out->run = find(k.name).toPtr<KernelFn>();
        }
        return out;
    }

    const CpuKernel* cached(const std::string& key) {
        std::lock_guard<std::mutex> lock(cache_mu);
        auto it = cache.find(key);
        if (it == cache.end()) return nullptr;
        ++counters.memory_hits;
        return it->second.get();
    }
};

CpuJit::CpuJit(int num_threads) : impl_(std::make_unique<Impl>(num_threads)) {}
CpuJit::~CpuJit() = default;

const CpuKernel* CpuJit::compile(const kir::Kernel& kernel, const std::string& key) {
    if (const CpuKernel* hit = impl_->cached(key)) return hit;
    std::lock_guard<std::mutex> compiling(impl_->compile_mu);
    if (const CpuKernel* hit = impl_->cached(key)) return hit;  // compiled while we waited
    if (impl_->forbid) refuse_compile(kernel, impl_->target, "");

    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<CpuKernel> built = impl_->build(kernel);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    log_debug("cpu jit: compiled {} in {:.1f} ms", kernel.name, ms);

    std::lock_guard<std::mutex> lock(impl_->cache_mu);
    ++impl_->counters.compiles;
    impl_->counters.compile_ms += ms;
    const CpuKernel* out = built.get();
    impl_->cache.emplace(key, std::move(built));
    return out;
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
    const size_t record = k.accums.size();  // in 8-byte units
    std::vector<uint64_t> partials(std::max<size_t>(1, (size_t)chunks * record));
    static_assert(codegen::kAccStateBytes == sizeof(uint64_t));
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
        auto tm = take(host_machine().createTargetMachine(), "creating the host target machine");
        prepare_module(*m, *tm);
        optimise(*m, *tm, host_has_avx2());
    }
    return module_text(*m);
}

} // namespace kiln::cpu
