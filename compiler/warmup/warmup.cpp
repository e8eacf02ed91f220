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
// Exit status: 0 when every kernel is (or was already) cached, 1 when any failed or, with --check,
// is missing, stale or damaged; 2 for bad arguments or manifests.
#include "compiler/kernel_text.hpp"
#include "compiler/key.hpp"
#include "ir/error.hpp"
#include "runtime/cache/disk_cache.hpp"
#include "runtime/cache/entry_format.hpp"
#include "runtime/cache/file_io.hpp"
#include "runtime/manifest.hpp"
#ifdef KILN_HAVE_NVRTC
#include "codegen/cuda/cuda_codegen.hpp"
#include "runtime/cuda/driver.hpp"
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
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#ifndef KILN_VERSION
#define KILN_VERSION "dev"
#endif

namespace fs = std::filesystem;
using namespace kiln;

namespace {

const char* kUsage =
    "usage: kiln-warmup MANIFEST... [--arch sm_80,sm_90,cpu,native] [--cache-dir DIR] [--jobs N] [--check] [--prune SIZE]\n"
    "  MANIFEST      JSON-lines manifests recorded with KILN_RECORD=path (or Context::record_to)\n"
    "  --arch        what to compile every kernel for: CUDA architectures (sm_80, sm_90, ...), cpu (this host's\n"
    "                CPU), native (this host's CPU and the architecture of each CUDA device it has)\n"
    "                (default: what each kernel was recorded on: its sm_XX, or cpu)\n"
    "  --cache-dir   the kernel cache (default: KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)\n"
    "  --jobs N      parallel compiles (default: the number of CPUs)\n"
    "  --check       verify the cache holds every kernel for every arch (missing, stale, damaged); write nothing\n"
    "  --prune SIZE  then delete least-recently-used entries until the cache is at most SIZE (e.g. 500M, 2G)\n";

constexpr const char* kCpu = "cpu";

#ifdef KILN_HAVE_NVRTC
constexpr bool kHaveCuda = true;
#else
constexpr bool kHaveCuda = false;
#endif
#ifdef KILN_HAVE_LLVM
constexpr bool kHaveCpu = true;
#else
constexpr bool kHaveCpu = false;
#endif

struct Options {
    std::vector<std::string> manifests;
    std::vector<std::string> archs;  // "sm_90", "cpu"
    std::string cache_dir;
    int jobs = 0;
    bool check = false;
    long long prune = -1;
};

[[noreturn]] void usage_error(const std::string& msg) {
    std::fprintf(stderr, "kiln-warmup: %s\n%s", msg.c_str(), kUsage);
    std::exit(2);
}

long long parse_size(const std::string& s) {
    size_t used = 0;
    double v = 0;
    try {
        v = std::stod(s, &used);
    } catch (...) {
        usage_error(fmt::format("--prune {}: not a size (e.g. 500M, 2G)", s));
    }
    std::string unit = s.substr(used);
    double mult = unit.empty() || unit == "B" ? 1 : unit == "K" || unit == "KB" ? 1e3 : unit == "KiB" ? 1024
                : unit == "M" || unit == "MB" ? 1e6 : unit == "MiB" ? 1048576.0 : unit == "G" || unit == "GB" ? 1e9
                : unit == "GiB" ? 1073741824.0 : -1;
    if (mult < 0 || v < 0) usage_error(fmt::format("--prune {}: not a size (units B, K, M, G, KiB, MiB, GiB)", s));
    return (long long)(v * mult);
}

// --arch native: what this machine runs — its CPU (when the tool has the CPU backend) and the
// architecture of each CUDA device the driver reports (none when there is no driver or device).
std::vector<std::string> native_archs() {
    std::vector<std::string> out;
    if (kHaveCpu) out.push_back(kCpu);
#ifdef KILN_HAVE_NVRTC
    const cuda::Driver& d = cuda::driver();
    int count = 0;
    if (d.loaded && d.cuDeviceGetCount(&count) == CUDA_SUCCESS) {
        for (int i = 0; i < count; ++i) {
            CUdevice dev = 0;
            int major = 0, minor = 0;
            if (d.cuDeviceGet(&dev, i) != CUDA_SUCCESS ||
                d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != CUDA_SUCCESS ||
                d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) != CUDA_SUCCESS)
                continue;
            const std::string sm = fmt::format("sm_{}", major * 10 + minor);
            if (std::find(out.begin(), out.end(), sm) == out.end()) out.push_back(sm);
        }
    }
#endif
    if (out.empty()) usage_error("--arch native: this kiln-warmup has no CPU backend and found no CUDA device; name the "
                                 "architectures (sm_80,sm_90)");
    return out;
}

Options parse_args(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&](const char* name) -> std::string {
            if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", name));
            return argv[++i];
        };
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            std::exit(0);
        } else if (a == "--arch") {
            std::string list = value("--arch");
            size_t start = 0;
            while (start <= list.size()) {
                size_t comma = list.find(',', start);
                std::string arch = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
                if (arch == "native") {
                    for (const std::string& a : native_archs())
                        if (std::find(o.archs.begin(), o.archs.end(), a) == o.archs.end()) o.archs.push_back(a);
                } else if (arch == kCpu) {
                    if (!kHaveCpu)
                        usage_error("--arch cpu: this kiln-warmup was built without LLVM (kiln's CPU backend); it warms "
                                    "CUDA kernels only");
                    o.archs.push_back(arch);
                } else {
                    if (arch.rfind("sm_", 0) != 0 || arch.size() < 5 ||
                        arch.find_first_not_of("0123456789", 3) != std::string::npos)
                        usage_error(fmt::format("--arch: '{}' is not an architecture like sm_80, sm_90, cpu or native", arch));
                    if (!kHaveCuda)
                        usage_error(fmt::format("--arch {}: this kiln-warmup was built without the CUDA toolkit's NVRTC; "
                                                "it warms CPU kernels only (--arch cpu)",
                                                arch));
                    o.archs.push_back(arch);
                }
                if (comma == std::string::npos) break;
                start = comma + 1;
            }
        } else if (a == "--cache-dir") {
            o.cache_dir = value("--cache-dir");
        } else if (a == "--jobs" || a == "-j") {
            std::string v = value("--jobs");
            o.jobs = std::atoi(v.c_str());
            if (o.jobs <= 0) usage_error(fmt::format("--jobs {}: a positive number", v));
        } else if (a == "--check") {
            o.check = true;
        } else if (a == "--prune") {
            o.prune = parse_size(value("--prune"));
        } else if (!a.empty() && a[0] == '-') {
            usage_error(fmt::format("unknown option {}", a));
        } else {
            o.manifests.push_back(a);
        }
    }
    if (o.manifests.empty() && o.prune < 0) usage_error("no manifest given");
    return o;
}

// The string or number value of "name" in one manifest line (the writer's flat layout).
std::string json_field(const std::string& line, const std::string& name) {
    const std::string tag = "\"" + name + "\":";
    size_t at = line.find(tag);
    if (at == std::string::npos) return {};
    at += tag.size();
    if (at < line.size() && line[at] == '"') {
        size_t end = line.find('"', at + 1);
        return end == std::string::npos ? std::string() : line.substr(at + 1, end - at - 1);
    }
    size_t end = line.find_first_of(",}", at);
    return line.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

struct Entry {
    std::string text;   // kernel text
    kir::Kernel kernel;
    std::set<std::string> recorded_archs;   // "sm_90", or "cpu" for lines recorded on the CPU backend
};

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
    cache::ReadResult r = cache::read_file(disk.path_for(dkey), size_t(1) << 31);
    if (r.status == cache::ReadStatus::NotFound) return {Outcome::Missing, ""};
    if (r.status != cache::ReadStatus::Ok) return {Outcome::Damaged, "unreadable"};
    cache::ParsedEntry e = cache::verify_entry(r.data, {KILN_VERSION, dkey.toolchain, dkey.arch, dkey.material});
    using C = cache::EntryCheck;
    if (e.check == C::Ok) return {Outcome::Cached, ""};
    const bool stale = e.check == C::KilnVersionMismatch || e.check == C::ToolchainMismatch || e.check == C::ArchMismatch ||
                       e.check == C::MaterialMismatch || e.check == C::BadFormatVersion;
    return {stale ? Outcome::Stale : Outcome::Damaged, cache::describe(e.check)};
}

#ifdef KILN_HAVE_NVRTC
Result warm_cuda(cache::DiskCache& disk, kir::Kernel& k, const std::string& arch, const std::string& nvrtc, bool check) {
    const std::string key = key_material(k, arch);
    k.name = kernel_name_for(key);
    const codegen::CudaSource src = codegen::emit_cuda(k);
    const cache::DiskCacheKey dkey = cache::cuda_kernel_key(key, src.code, arch, nvrtc);
    if (check) return check_entry(disk, dkey);
    if (disk.load(dkey)) return {Outcome::Cached, ""};
    cuda::NvrtcResult r = cuda::nvrtc_compile(src.code, k.name + ".cu", std::atoi(arch.c_str() + 3));
    if (!r.ok) return {Outcome::Failed, fmt::format("NVRTC ({}):\n{}", r.options, r.log)};
    disk.store(dkey, r.binary);
    return {Outcome::Compiled, fmt::format("({:.0f} ms)", r.milliseconds)};
}
#endif

#ifdef KILN_HAVE_LLVM
// For this host's CPU, through the CPU backend itself: its key is the runtime's, and a kernel it
// finds on disk is linked, so "cached" means the object loads here.
Result warm_cpu(cpu::CpuJit& jit, const cache::DiskCache& disk, kir::Kernel& k, bool check) {
    const std::string key = key_material(k, host_target_label());
    k.name = kernel_name_for(key);
    if (check) return check_entry(disk, jit.disk_key(k, key));
    const cpu::CpuJitCounters before = jit.counters();
    jit.compile(k, key);
    const cpu::CpuJitCounters after = jit.counters();
    if (after.compiles == before.compiles) return {Outcome::Cached, ""};
    return {Outcome::Compiled, fmt::format("({:.0f} ms)", after.compile_ms - before.compile_ms)};
}
#endif

} // namespace

int main(int argc, char** argv) {
    Options opt = parse_args(argc, argv);
    const auto t0 = std::chrono::steady_clock::now();

    // ---- manifests
    std::map<std::string, Entry> entries;  // by kernel text
    for (const std::string& path : opt.manifests) {
        std::ifstream in(path);
        if (!in) {
            std::fprintf(stderr, "kiln-warmup: cannot read manifest %s\n", path.c_str());
            return 2;
        }
        size_t lineno = 0;
        for (std::string line; std::getline(in, line);) {
            ++lineno;
            if (line.empty()) continue;
            auto bad = [&](const std::string& why) {
                std::fprintf(stderr, "kiln-warmup: %s:%zu: %s\n", path.c_str(), lineno, why.c_str());
                std::exit(2);
            };
            if (json_field(line, "format") != std::to_string(kManifestFormat))
                bad(fmt::format("manifest format '{}' is not one this kiln reads ({})", json_field(line, "format"),
                                kManifestFormat));
            const std::string backend = json_field(line, "backend"), target = json_field(line, "target");
            if (backend != "cuda" && backend != "cpu") bad(fmt::format("unknown backend '{}'", backend));
            const std::string text = json_field(line, "kernel");
            Entry& e = entries[text];
            if (e.text.empty()) {
                try {
                    e.kernel = parse_kernel_text(text);
                } catch (const Error& err) {
                    bad(err.what());
                }
                e.text = text;
            }
            // A CPU line's target names the recording host's CPU; it is warmed for this one.
            e.recorded_archs.insert(backend == "cpu" ? std::string(kCpu) : target);
        }
    }

    cache::DiskCacheOptions copts;
    copts.dir = opt.cache_dir;
    cache::DiskCache disk(copts);
    if (disk.dir().empty()) {
        std::fprintf(stderr, "kiln-warmup: no cache directory (set KILN_CACHE_DIR or pass --cache-dir)\n");
        return 2;
    }

    // Jobs; recorded archs this build cannot compile for are skipped with a note.
    std::vector<Job> jobs;
    size_t skipped_cpu = 0, skipped_cuda = 0;
    for (auto& [text, e] : entries) {
        const std::vector<std::string> archs =
            opt.archs.empty() ? std::vector<std::string>(e.recorded_archs.begin(), e.recorded_archs.end()) : opt.archs;
        for (const std::string& a : archs) {
            const bool is_cpu = a == kCpu;
            if (is_cpu && !kHaveCpu) ++skipped_cpu;
            else if (!is_cpu && !kHaveCuda) ++skipped_cuda;
            else jobs.push_back({&e, a});
        }
    }
    if (skipped_cpu)
        std::fprintf(stderr, "kiln-warmup: %zu CPU kernels skipped (this kiln-warmup was built without LLVM)\n", skipped_cpu);
    if (skipped_cuda)
        std::fprintf(stderr, "kiln-warmup: %zu CUDA kernels skipped (this kiln-warmup was built without NVRTC)\n",
                     skipped_cuda);
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
    const std::string nvrtc = cuda::nvrtc_version();
#endif

    // ---- compile (or check) every (kernel, arch), in parallel
    const bool tty = isatty(2);
    std::atomic<size_t> next{0}, done{0};
    std::mutex out_mu;
    std::map<Outcome, size_t> counts;
    std::vector<std::string> failures;
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
                if (j.arch != kCpu) r = warm_cuda(disk, k, j.arch, nvrtc, opt.check);
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
    uint64_t write_failures = disk.stats().write_failures;
#ifdef KILN_HAVE_LLVM
    for (const auto& jit : jits)
        if (jit && jit->disk_cache()) write_failures += jit->disk_cache()->stats().write_failures;
#endif
    if (!opt.check && write_failures > 0) {
        failures.push_back(fmt::format("the cache directory {} could not be written", disk.dir()));
    }
    for (const std::string& f : failures) std::fprintf(stderr, "kiln-warmup: failed: %s\n", f.c_str());

    // ---- prune: least recently used first (file access time, else modification time)
    size_t pruned = 0;
    if (opt.prune >= 0) {
        struct File { fs::path p; uintmax_t size; fs::file_time_type t; };
        std::vector<File> files;
        uintmax_t total = 0;
        std::error_code ec;
        for (auto it = fs::recursive_directory_iterator(disk.dir(), ec); !ec && it != fs::recursive_directory_iterator();
             it.increment(ec)) {
            if (!it->is_regular_file(ec) || it->path().extension() != ".bin") continue;
            files.push_back({it->path(), it->file_size(ec), fs::last_write_time(it->path(), ec)});
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
    if (opt.check) {
        std::printf("kiln-warmup --check: %zu kernels x archs: %zu cached, %zu missing, %zu stale, %zu damaged (%s, %.1f s)\n",
                    jobs.size(), counts[Outcome::Cached], counts[Outcome::Missing], counts[Outcome::Stale],
                    counts[Outcome::Damaged], disk.dir().c_str(), secs);
        return counts[Outcome::Missing] + counts[Outcome::Stale] + counts[Outcome::Damaged] ? 1 : 0;
    }
    std::printf("kiln-warmup: %zu kernels x archs: %zu compiled, %zu already cached, %zu failed (%s, %.1f s)\n",
                jobs.size(), counts[Outcome::Compiled], counts[Outcome::Cached], failures.size(), disk.dir().c_str(), secs);
    return failures.empty() ? 0 : 1;
}
