// kiln-warmup: compiles the kernels of recorded manifests (KILN_RECORD) into the disk kernel
// cache — for the CUDA architectures asked for, with NVRTC and without a GPU, and for this host's
// CPU with the CPU backend's LLVM — checks a cache against manifests without writing; evicts
// least-recently-used entries down to a size.
//
//   kiln-warmup MANIFEST... [--arch sm_80,sm_90,cpu,native] [--cache-dir DIR] [--jobs N] [--check] [--prune SIZE]
//
// A cache entry is keyed exactly as the runtime keys it: a CUDA entry by cache::cuda_kernel_key
// (the kernel's key for the arch, its CUDA source, the arch, the NVRTC version, kiln's version),
// a CPU entry by the CPU backend itself (CpuJit::disk_key: the kernel's key for this host's CPU
// label, the exact CPU model and features, LLVM's version, kiln's), so a warmed entry is a disk
// hit for the program that recorded the manifest. The kernel text of a manifest line does not
// depend on the backend that recorded it (the lowering is the same for every target; only the
// key names the target), so any line can be warmed for any arch, `cpu` included.
// Exit status: 0 when every kernel is (or was already) cached, 1 when any failed (a compile, or
// a store the cache did not keep) or, with --check, is missing, stale or damaged; 2, before any
// work, for bad arguments (options.hpp), manifests (manifests.hpp) or cache directories.
#include "compiler/env.hpp"
#include "compiler/key.hpp"
#include "runtime/warmup/manifests.hpp"
#include "runtime/warmup/options.hpp"
#include "runtime/cache/disk_cache.hpp"
#include "runtime/cache/entry_format.hpp"
#include "runtime/cache/file_io.hpp"
#ifdef KILN_HAVE_NVRTC
#include "codegen/cuda/cuda_codegen.hpp"
#include "runtime/cuda/nvrtc.hpp"
#endif
#ifdef KILN_HAVE_LLVM
#include "runtime/cpu/cpu_jit.hpp"
#include "runtime/host_target.hpp"
#endif

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#ifndef KILN_VERSION
#define KILN_VERSION "dev"
#endif

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::warmup;

namespace {

struct Job {
    const Entry* entry;
    std::string arch;
};

enum class Outcome { Compiled, Cached, Failed, Missing, Stale, Damaged };

struct Result {
    Outcome outcome;
    std::string detail;
};

// --check of one entry: reads the file at the key's path and compares every field, writing nothing.
Result check_entry(const cache::DiskCache& disk, const cache::DiskCacheKey& dkey) {
    using C = cache::EntryCheck;
    C head = C::Ok;
    const cache::ReadResult r = cache::read_entry_file(disk.path_for(dkey), head);
    if (r.status == cache::ReadStatus::NotFound) return {Outcome::Missing, ""};
    if (r.status == cache::ReadStatus::TooLarge) return {Outcome::Damaged, "larger than any entry"};
    if (r.status != cache::ReadStatus::Ok && r.status != cache::ReadStatus::Refused) return {Outcome::Damaged, "unreadable"};
    const C check = r.status == cache::ReadStatus::Refused
                        ? head
                        : cache::verify_entry(r.data, {KILN_VERSION, dkey.toolchain, dkey.arch, dkey.material}).check;
    if (check == C::Ok) return {Outcome::Cached, ""};
    const bool stale = check == C::KilnVersionMismatch || check == C::ToolchainMismatch || check == C::ArchMismatch ||
                       check == C::MaterialMismatch || check == C::BadFormatVersion;
    return {stale ? Outcome::Stale : Outcome::Damaged, cache::describe(check)};
}

// A kernel counts as compiled only once its entry is on disk and reads back: a cache whose
// writes failed (the disk cache then keeps kernels in memory, with a warning) fails the kernel.
Result stored(const cache::DiskCache& disk, const cache::DiskCacheKey& dkey, Result compiled) {
    const Result on_disk = check_entry(disk, dkey);
    if (on_disk.outcome == Outcome::Cached) return compiled;
    return {Outcome::Failed, fmt::format("compiled, but not stored in the cache: {} is {}{}", disk.path_for(dkey),
                                         on_disk.outcome == Outcome::Missing ? "missing" : "damaged",
                                         on_disk.detail.empty() ? "" : " (" + on_disk.detail + ")")};
}

#ifdef KILN_HAVE_NVRTC
// Every module of the kernel (codegen::cuda_modules: a row kernel's entries for each reach), so
// that no launch finds one missing. The kernel's outcome is its worst module's.
Result warm_cuda(cache::DiskCache& disk, kir::Kernel& k, const std::string& arch, bool check, bool dump_source) {
    const std::string key = key_material(k, arch);
    k.name = kernel_name_for(key);
    Result all{Outcome::Cached, ""};
    double ms = 0;
    for (const codegen::CudaModuleId& id : codegen::cuda_modules(k)) {
        const codegen::CudaSource src = codegen::emit_cuda_module(k, id);
        const std::string label = codegen::cuda_module_label(k, id);
        const cache::DiskCacheKey dkey = cache::cuda_kernel_key(key, src.code, arch, cuda::nvrtc_toolchain(src.fast_compile));
        Result r{Outcome::Cached, ""};
        if (check) {
            r = check_entry(disk, dkey);
        } else {
            if (dump_source) disk.save_source(label, src.code);
            if (!disk.load(dkey)) {
                cuda::NvrtcResult c =
                    cuda::nvrtc_compile(src.code, label + ".cu", std::atoi(arch.c_str() + 3), true, src.fast_compile);
                if (!c.ok) return {Outcome::Failed, fmt::format("NVRTC ({}), module {}:\n{}", c.options, label, c.log)};
                disk.store(dkey, c.binary);
                ms += c.milliseconds;
                r = stored(disk, dkey, {Outcome::Compiled, ""});
            }
        }
        if (r.outcome == Outcome::Cached) continue;
        if (r.outcome != Outcome::Compiled) return {r.outcome, r.detail.empty() ? "module " + label : label + ": " + r.detail};
        all.outcome = Outcome::Compiled;
    }
    if (all.outcome == Outcome::Compiled) all.detail = fmt::format("({:.0f} ms)", ms);
    return all;
}
#endif

#ifdef KILN_HAVE_LLVM
// For this host's CPU, through the CPU backend itself: its key is the runtime's, and a kernel it
// finds on disk is linked, so "cached" means the object loads here.
Result warm_cpu(cpu::CpuJit& jit, const cache::DiskCache& disk, kir::Kernel& k, bool check) {
    const std::string key = key_material(k, host_target_label());
    k.name = kernel_name_for(key);
    const cache::DiskCacheKey dkey = jit.disk_key(k, key);
    if (check) return check_entry(disk, dkey);
    const cpu::CpuJitCounters before = jit.counters();
    jit.compile(k, key);
    const cpu::CpuJitCounters after = jit.counters();
    if (after.compiles == before.compiles) return {Outcome::Cached, ""};
    return stored(disk, dkey, {Outcome::Compiled, fmt::format("({:.0f} ms)", after.compile_ms - before.compile_ms)});
}
#endif

} // namespace

int main(int argc, char** argv) {
    const Options opt = parse_args(argc, argv);
    const auto t0 = std::chrono::steady_clock::now();
    const std::map<std::string, Entry> entries = read_manifests(opt.manifests);
    if (!opt.manifests.empty() && entries.empty())
        std::fprintf(stderr, "kiln-warmup: note: the manifests name no kernels\n");

    cache::DiskCacheOptions copts;
    copts.dir = cache_directory(opt.cache_dir, opt.check && opt.prune < 0);
    cache::DiskCache disk(copts);

    // Jobs. Recorded archs this build cannot compile for are skipped with a note; recorded CUDA
    // archs its NVRTC does not compile for fail, each arch named once.
    std::vector<Job> jobs;
    size_t skipped_cpu = 0, skipped_cuda = 0;
    std::map<std::string, size_t> unsupported;   // arch -> kernels
    for (const auto& [text, e] : entries) {
        const std::vector<std::string> archs =
            opt.archs.empty() ? std::vector<std::string>(e.recorded_archs.begin(), e.recorded_archs.end()) : opt.archs;
        for (const std::string& a : archs) {
            const bool is_cpu = a == kCpu;
            if (is_cpu && !kHaveCpu) ++skipped_cpu;
            else if (!is_cpu && !kHaveCuda) ++skipped_cuda;
            else if (!is_cpu && !cuda_arch_supported(a)) ++unsupported[a];
            else jobs.push_back({&e, a});
        }
    }
    if (skipped_cpu)
        std::fprintf(stderr, "kiln-warmup: %zu CPU kernels skipped (this kiln-warmup was built without LLVM)\n", skipped_cpu);
    if (skipped_cuda)
        std::fprintf(stderr, "kiln-warmup: %zu CUDA kernels skipped (this kiln-warmup was built without NVRTC)\n",
                     skipped_cuda);
    std::vector<std::string> failures;
    size_t unsupported_total = 0;
    for (const auto& [arch, n] : unsupported) {
        failures.push_back(fmt::format("{} kernels recorded for {}: NVRTC {} cannot compile for {} (it compiles for {}); "
                                       "--arch names the architectures to warm instead",
                                       n, arch, nvrtc_label(), arch, supported_cuda_archs()));
        unsupported_total += n;
    }
    const bool any_cpu = std::any_of(jobs.begin(), jobs.end(), [](const Job& j) { return j.arch == kCpu; });
    const int jobs_n = std::max(1, std::min(opt.jobs > 0 ? opt.jobs : (int)std::max(1u, std::thread::hardware_concurrency()),
                                            (int)jobs.size()));

#ifdef KILN_HAVE_LLVM
    // One CPU backend per worker: each compiles one kernel at a time.
    std::vector<std::unique_ptr<cpu::CpuJit>> jits(jobs_n);
    auto jit_for = [&](int worker) -> cpu::CpuJit& {
        if (!jits[worker]) {
            cpu::CpuJitOptions o;
            o.num_threads = 1;
            o.cache_dir = disk.dir();
            jits[worker] = std::make_unique<cpu::CpuJit>(o);
        }
        return *jits[worker];
    };
    if (any_cpu)
        std::fprintf(stderr, "kiln-warmup: CPU kernels are compiled for this host: %s (%s)\n", jit_for(0).cpu_name().c_str(),
                     host_target_label().c_str());
#else
    (void)any_cpu;
#endif
#ifdef KILN_HAVE_NVRTC
    const bool dump_source = env::flag("KILN_DUMP_SOURCE").value_or(false);   // as the runtime: <dir>/sources/
#endif

    // ---- compile (or check) every (kernel, arch), in parallel
    const bool tty = isatty(2);
    std::atomic<size_t> next{0}, done{0};
    std::mutex out_mu;
    std::map<Outcome, size_t> counts;
    auto report = [&](const Job& j, const std::string& name, Outcome o, const std::string& detail) {
        std::lock_guard<std::mutex> lock(out_mu);
        ++counts[o];
        const size_t k = ++done;
        static const char* words[] = {"compiled", "cached", "FAILED", "missing", "stale", "damaged"};
        if (o == Outcome::Failed) failures.push_back(fmt::format("{} for {}: {}", name, j.arch, detail));
        if (tty) {
            std::fprintf(stderr, "\r[%zu/%zu] %-8s %s %s%s", k, jobs.size(), words[(int)o], name.c_str(), j.arch.c_str(),
                         k == jobs.size() ? "\n" : "          ");
        } else {
            std::fprintf(stderr, "kiln-warmup: [%zu/%zu] %s %s for %s%s\n", k, jobs.size(), words[(int)o], name.c_str(),
                         j.arch.c_str(), detail.empty() || o == Outcome::Failed ? "" : (" " + detail).c_str());
        }
        std::fflush(stderr);
    };
    auto work = [&](int worker) {
        (void)worker;
        for (size_t i; (i = next++) < jobs.size();) {
            const Job& j = jobs[i];
            kir::Kernel k = j.entry->kernel;
            try {
                Result r{Outcome::Failed, "no backend for " + j.arch};
#ifdef KILN_HAVE_LLVM
                if (j.arch == kCpu) r = warm_cpu(jit_for(worker), disk, k, opt.check);
#endif
#ifdef KILN_HAVE_NVRTC
                if (j.arch != kCpu) r = warm_cuda(disk, k, j.arch, opt.check, dump_source);
#endif
                report(j, k.name, r.outcome, r.detail);
            } catch (const std::exception& e) {
                report(j, k.name, Outcome::Failed, e.what());
            }
        }
    };
    std::vector<std::thread> pool;
    for (int t = 0; t < jobs_n && t < (int)jobs.size(); ++t) pool.emplace_back(work, t);
    for (auto& t : pool) t.join();
    for (const std::string& f : failures) std::fprintf(stderr, "kiln-warmup: failed: %s\n", f.c_str());

    // ---- prune: least recently used first (file access time, else modification time)
    size_t pruned = 0;
    if (opt.prune >= 0) {
        struct File { fs::path p; uintmax_t size; fs::file_time_type t; };
        std::vector<File> files;
        uintmax_t total = 0;
        std::error_code ec;
        // Only kiln's entries: whatever else the directory holds stays (DiskCache::entry_files).
        for (const cache::DiskCache::EntryFile& e : disk.entry_files()) {
            files.push_back({e.path, e.size, fs::last_write_time(e.path, ec)});
            total += files.back().size;
        }
        std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.t < b.t; });
        for (const File& f : files) {
            if ((long long)total <= opt.prune) break;
            if (fs::remove(f.p, ec)) {
                total -= f.size;
                ++pruned;
            }
        }
        std::fprintf(stderr, "kiln-warmup: pruned %zu entries; the cache holds %ju bytes\n", pruned, (uintmax_t)total);
    }

    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const size_t total = jobs.size() + unsupported_total;
    const size_t failed = counts[Outcome::Failed] + unsupported_total;
    if (opt.check) {
        std::printf("kiln-warmup --check: %zu kernels x archs: %zu cached, %zu missing, %zu stale, %zu damaged%s (%s, %.1f s)\n",
                    total, counts[Outcome::Cached], counts[Outcome::Missing], counts[Outcome::Stale],
                    counts[Outcome::Damaged], failed ? fmt::format(", {} failed", failed).c_str() : "", disk.dir().c_str(),
                    secs);
        return counts[Outcome::Missing] + counts[Outcome::Stale] + counts[Outcome::Damaged] + failed ? 1 : 0;
    }
    std::printf("kiln-warmup: %zu kernels x archs: %zu compiled, %zu already cached, %zu failed (%s, %.1f s)\n", total,
                counts[Outcome::Compiled], counts[Outcome::Cached], failed, disk.dir().c_str(), secs);
    return failed ? 1 : 0;
}
