// kiln-warmup: compiles the kernels of recorded manifests (KILN_RECORD) into the disk kernel
// cache for the CUDA architectures asked for, with NVRTC, without a GPU; checks a cache against
// manifests without writing; evicts least-recently-used entries down to a size.
//
//   kiln-warmup MANIFEST... [--arch sm_80,sm_90,...] [--cache-dir DIR] [--jobs N] [--check] [--prune SIZE]
//
// A cache entry is keyed exactly as the CUDA backend keys it at run time (the kernel's key for
// the arch, its CUDA source, the arch, the NVRTC version, kiln's version), so a warmed entry is a
// disk hit for the program that recorded the manifest. Exit status: 0 when every kernel is (or
// was already) cached, 1 when any failed or, with --check, is missing, stale or damaged; 2 for
// bad arguments or manifests.
#include "codegen/cuda/cuda_codegen.hpp"
#include "compiler/kernel_text.hpp"
#include "compiler/key.hpp"
#include "ir/error.hpp"
#include "runtime/cache/disk_cache.hpp"
#include "runtime/cache/entry_format.hpp"
#include "runtime/cache/file_io.hpp"
#include "runtime/cuda/nvrtc.hpp"
#include "runtime/manifest.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
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
    "usage: kiln-warmup MANIFEST... [--arch sm_80,sm_90,...] [--cache-dir DIR] [--jobs N] [--check] [--prune SIZE]\n"
    "  MANIFEST      JSON-lines manifests recorded with KILN_RECORD=path (or Context::record_to)\n"
    "  --arch        CUDA architectures to compile for (default: those recorded in the manifests)\n"
    "  --cache-dir   the kernel cache (default: KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)\n"
    "  --jobs N      parallel NVRTC compiles (default: the number of CPUs)\n"
    "  --check       verify the cache holds every kernel for every arch (missing, stale, damaged); write nothing\n"
    "  --prune SIZE  then delete least-recently-used entries until the cache is at most SIZE (e.g. 500M, 2G)\n";

struct Options {
    std::vector<std::string> manifests;
    std::vector<std::string> archs;  // "sm_90"
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
                if (arch == "native") usage_error("--arch native needs a GPU to ask; name the architectures (sm_80,sm_90)");
                if (arch.rfind("sm_", 0) != 0 || arch.size() < 5 || arch.find_first_not_of("0123456789", 3) != std::string::npos)
                    usage_error(fmt::format("--arch: '{}' is not an architecture like sm_80 or sm_90", arch));
                o.archs.push_back(arch);
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
    std::set<std::string> recorded_archs;
};

struct Job {
    const Entry* entry;
    std::string arch;
};

enum class Outcome { Compiled, Cached, Failed, Missing, Stale, Damaged };

} // namespace

int main(int argc, char** argv) {
    Options opt = parse_args(argc, argv);
    const auto t0 = std::chrono::steady_clock::now();

    // ---- manifests
    std::map<std::string, Entry> entries;  // by kernel text
    size_t cpu_entries = 0;
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
            if (backend == "cpu") {
                ++cpu_entries;
                continue;
            }
            if (backend != "cuda") bad(fmt::format("unknown backend '{}'", backend));
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
            e.recorded_archs.insert(target);
        }
    }
    if (cpu_entries)
        std::fprintf(stderr, "kiln-warmup: %zu CPU kernels skipped (the CPU backend keeps its kernels in memory only)\n",
                     cpu_entries);

    cache::DiskCacheOptions copts;
    copts.dir = opt.cache_dir;
    cache::DiskCache disk(copts);
    if (disk.dir().empty()) {
        std::fprintf(stderr, "kiln-warmup: no cache directory (set KILN_CACHE_DIR or pass --cache-dir)\n");
        return 2;
    }
    const std::string nvrtc = cuda::nvrtc_version();

    std::vector<Job> jobs;
    for (auto& [text, e] : entries) {
        const std::vector<std::string> archs =
            opt.archs.empty() ? std::vector<std::string>(e.recorded_archs.begin(), e.recorded_archs.end()) : opt.archs;
        for (const std::string& a : archs) jobs.push_back({&e, a});
    }

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
    auto work = [&] {
        for (size_t i; (i = next++) < jobs.size();) {
            const Job& j = jobs[i];
            kir::Kernel k = j.entry->kernel;
            const std::string key = key_material(k, j.arch);
            k.name = kernel_name_for(key);
            try {
                const codegen::CudaSource src = codegen::emit_cuda(k);
                const cache::DiskCacheKey dkey = cache::cuda_kernel_key(key, src.code, j.arch, nvrtc);
                if (opt.check) {
                    cache::ReadResult r = cache::read_file(disk.path_for(dkey), size_t(1) << 31);
                    if (r.status == cache::ReadStatus::NotFound) {
                        report(j, k.name, Outcome::Missing, "");
                        continue;
                    }
                    if (r.status != cache::ReadStatus::Ok) {
                        report(j, k.name, Outcome::Damaged, "unreadable");
                        continue;
                    }
                    cache::ParsedEntry e = cache::verify_entry(r.data, {KILN_VERSION, dkey.toolchain, dkey.arch, dkey.material});
                    using C = cache::EntryCheck;
                    const bool stale = e.check == C::KilnVersionMismatch || e.check == C::ToolchainMismatch ||
                                       e.check == C::ArchMismatch || e.check == C::MaterialMismatch ||
                                       e.check == C::BadFormatVersion;
                    report(j, k.name, e.check == C::Ok ? Outcome::Cached : stale ? Outcome::Stale : Outcome::Damaged,
                           e.check == C::Ok ? "" : cache::describe(e.check));
                    continue;
                }
                if (disk.load(dkey)) {
                    report(j, k.name, Outcome::Cached, "");
                    continue;
                }
                cuda::NvrtcResult r = cuda::nvrtc_compile(src.code, k.name + ".cu", std::atoi(j.arch.c_str() + 3));
                if (!r.ok) {
                    report(j, k.name, Outcome::Failed, fmt::format("NVRTC ({}):\n{}", r.options, r.log));
                    continue;
                }
                disk.store(dkey, r.binary);
                report(j, k.name, Outcome::Compiled, fmt::format("({:.0f} ms)", r.milliseconds));
            } catch (const std::exception& e) {
                report(j, k.name, Outcome::Failed, e.what());
            }
        }
    };
    int jobs_n = opt.jobs > 0 ? opt.jobs : std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (int t = 0; t < jobs_n && t < (int)jobs.size(); ++t) pool.emplace_back(work);
    for (auto& t : pool) t.join();
    if (!opt.check && disk.stats().write_failures > 0) {
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
