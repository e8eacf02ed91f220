#include "runtime/warmup/options.hpp"

#include "runtime/cache/disk_cache.hpp"
#include "runtime/cache/file_io.hpp"
#ifdef KILN_HAVE_NVRTC
#include "runtime/cuda/driver.hpp"
#include "runtime/cuda/nvrtc.hpp"
#endif

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unistd.h>

namespace fs = std::filesystem;

namespace kiln::warmup {

namespace {

const char* kUsage =
    "usage: kiln-warmup MANIFEST... [--arch sm_80,sm_90,cpu,native] [--cache-dir DIR] [--jobs N] [--check] [--prune SIZE]\n"
    "  MANIFEST      JSON-lines manifests recorded with KILN_RECORD=path (or Context::record_to)\n"
    "  --arch        what to compile every kernel for: CUDA architectures (sm_80, sm_90, ...), cpu (this host's\n"
    "                CPU), native (this host's CPU and the architecture of each CUDA device it has)\n"
    "                (default: what each kernel was recorded on: its sm_XX, or cpu)\n"
    "  --cache-dir   the kernel cache (default: KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)\n"
    "  --jobs N      parallel compiles, 1 to 1024 (default: the number of CPUs)\n"
    "  --check       verify the cache holds every kernel for every arch (missing, stale, damaged); write nothing\n"
    "  --prune SIZE  then delete least-recently-used entries until the cache is at most SIZE (e.g. 500M, 2G)\n";

[[noreturn]] void usage_error(const std::string& msg) {
    std::fprintf(stderr, "kiln-warmup: %s\n%s", msg.c_str(), kUsage);
    std::exit(2);
}

// "500M", "2G", "1.5GiB", "0": a decimal number and a unit, at most 2^62 bytes.
long long parse_size(const std::string& s) {
    auto bad = [&] {
        usage_error(fmt::format("--prune {}: not a size; valid: a number and a unit B, K, KB, KiB, M, MB, MiB, G, GB, GiB, "
                                "T, TB, TiB (500M, 2G, 1.5GiB; no unit: bytes)",
                                s));
    };
    const size_t digits_end = s.find_first_not_of("0123456789.");
    const std::string number = s.substr(0, digits_end), unit = digits_end == std::string::npos ? "" : s.substr(digits_end);
    if (number.empty() || number.front() == '.' || number.back() == '.' || std::count(number.begin(), number.end(), '.') > 1)
        bad();
    static const std::pair<const char*, double> units[] = {
        {"", 1}, {"B", 1}, {"K", 1e3}, {"KB", 1e3}, {"KiB", 1024.0}, {"M", 1e6}, {"MB", 1e6}, {"MiB", 1048576.0},
        {"G", 1e9}, {"GB", 1e9}, {"GiB", 1073741824.0}, {"T", 1e12}, {"TB", 1e12}, {"TiB", 1099511627776.0}};
    double mult = -1;
    for (const auto& [name, m] : units)
        if (unit == name) mult = m;
    if (mult < 0) bad();
    const double bytes = std::strtod(number.c_str(), nullptr) * mult;
    if (!(bytes <= double(1ll << 62)))
        usage_error(fmt::format("--prune {}: more than 2^62 bytes; valid: a size up to 4EiB", s));
    return (long long)bytes;
}

int parse_jobs(const std::string& s) {
    int n = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    if (s.empty() || ec != std::errc() || p != s.data() + s.size() || n < 1 || n > kMaxJobs)
        usage_error(fmt::format("--jobs {}: not a number of parallel compiles; valid: an integer from 1 to {}", s, kMaxJobs));
    return n;
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
            out.push_back(fmt::format("sm_{}", major * 10 + minor));
        }
    }
#endif
    if (out.empty()) usage_error("--arch native: this kiln-warmup has no CPU backend and found no CUDA device; name the "
                                 "architectures (sm_80,sm_90)");
    return out;
}

// One entry of --arch, checked.
void add_arch(std::vector<std::string>& archs, const std::string& arch) {
    auto add = [&](const std::string& a) {
        if (std::find(archs.begin(), archs.end(), a) == archs.end()) archs.push_back(a);
    };
    if (arch == "native") {
        for (const std::string& a : native_archs()) {
            if (a != kCpu && !cuda_arch_supported(a))
                usage_error(fmt::format("--arch native: this machine's GPU is {}, which NVRTC {} cannot compile for (it "
                                        "compiles for {})",
                                        a, nvrtc_label(), supported_cuda_archs()));
            add(a);
        }
    } else if (arch == kCpu) {
        if (!kHaveCpu)
            usage_error("--arch cpu: this kiln-warmup was built without LLVM (kiln's CPU backend); it warms CUDA kernels "
                        "only");
        add(arch);
    } else {
        if (arch.rfind("sm_", 0) != 0 || arch.size() < 5 || arch.size() > 7 ||
            arch.find_first_not_of("0123456789", 3) != std::string::npos)
            usage_error(fmt::format("--arch: '{}' is not an architecture like sm_80, sm_90, cpu or native", arch));
        if (!kHaveCuda)
            usage_error(fmt::format("--arch {}: this kiln-warmup was built without the CUDA toolkit's NVRTC; it warms CPU "
                                    "kernels only (--arch cpu)",
                                    arch));
        if (!cuda_arch_supported(arch))
            usage_error(fmt::format("--arch {}: NVRTC {} cannot compile for it; valid: {}, cpu, native", arch, nvrtc_label(),
                                    supported_cuda_archs()));
        add(arch);
    }
}

// A manifest path must name something readable that is not a directory.
void check_manifest_path(const std::string& path) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (ec || !fs::exists(st))
        bad_input(fmt::format("cannot read manifest {}: {}", path, ec ? ec.message() : std::strerror(ENOENT)));
    if (fs::is_directory(st))
        bad_input(fmt::format("cannot read manifest {}: it is a directory; a manifest is a JSON-lines file that "
                              "KILN_RECORD=path writes",
                              path));
    // A device, FIFO or socket never ends (/dev/zero, /dev/urandom) or blocks until a writer comes.
    if (!fs::is_regular_file(st))
        bad_input(fmt::format("cannot read manifest {}: it is a {}, not a regular file; a manifest is a JSON-lines file "
                              "that KILN_RECORD=path writes",
                              path,
                              fs::is_character_file(st) ? "character device"
                              : fs::is_block_file(st)   ? "block device"
                              : fs::is_fifo(st)         ? "FIFO"
                              : fs::is_socket(st)       ? "socket"
                                                        : "special file"));
    if (::access(path.c_str(), R_OK) != 0) bad_input(fmt::format("cannot read manifest {}: {}", path, std::strerror(errno)));
}

} // namespace

std::string nvrtc_label() {
#ifdef KILN_HAVE_NVRTC
    return cuda::nvrtc_version();
#else
    return "(none)";
#endif
}

std::string supported_cuda_archs() {
    std::string out;
#ifdef KILN_HAVE_NVRTC
    for (int sm : cuda::nvrtc_supported_archs()) out += fmt::format("{}sm_{}", out.empty() ? "" : ", ", sm);
#endif
    return out.empty() ? std::string("none") : out;
}

bool cuda_arch_supported(const std::string& arch) {
#ifdef KILN_HAVE_NVRTC
    static const std::vector<int> supported = cuda::nvrtc_supported_archs();
    int sm = 0;
    auto [p, ec] = std::from_chars(arch.data() + std::min<size_t>(3, arch.size()), arch.data() + arch.size(), sm);
    return arch.rfind("sm_", 0) == 0 && ec == std::errc() && p == arch.data() + arch.size() &&
           std::find(supported.begin(), supported.end(), sm) != supported.end();
#else
    (void)arch;
    return false;
#endif
}

void bad_input(const std::string& msg) {
    std::fprintf(stderr, "kiln-warmup: %s\n", msg.c_str());
    std::exit(2);
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
            const std::string list = value("--arch");
            size_t start = 0;
            for (;;) {
                const size_t comma = list.find(',', start);
                add_arch(o.archs, list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
                if (comma == std::string::npos) break;
                start = comma + 1;
            }
        } else if (a == "--cache-dir") {
            o.cache_dir = value("--cache-dir");
            if (o.cache_dir.empty()) usage_error("--cache-dir: an empty path; name a directory (or leave --cache-dir out "
                                                 "for the default)");
        } else if (a == "--jobs" || a == "-j") {
            o.jobs = parse_jobs(value("--jobs"));
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
    for (const std::string& m : o.manifests) check_manifest_path(m);
    return o;
}

std::string cache_directory(const std::string& given, bool read_only) {
    const std::string dir = given.empty() ? cache::default_cache_dir() : given;
    const std::string from = !given.empty() ? "--cache-dir"
                             : std::getenv("KILN_CACHE_DIR") && *std::getenv("KILN_CACHE_DIR") ? "KILN_CACHE_DIR"
                                                                                                 : "the default";
    if (dir.empty()) bad_input("no cache directory (set KILN_CACHE_DIR or pass --cache-dir)");
    std::error_code ec;
    const fs::file_status st = fs::status(dir, ec);
    if (fs::exists(st) && !fs::is_directory(st))
        bad_input(fmt::format("the cache directory {} ({}) is not a directory; name a directory (it is created when "
                              "missing)",
                              dir, from));
    if (read_only) return dir;
    int error = 0;
    if (!cache::make_directories(dir, &error))
        bad_input(fmt::format("cannot create the cache directory {} ({}): {}", dir, from, std::strerror(error)));
    // A file written as entries are (a temporary file renamed into place), then removed.
    const std::string probe = fmt::format("{}/.kiln-warmup-probe-{}", dir, (long)::getpid());
    const cache::WriteResult w = cache::write_file_atomic(probe, {}, false);
    std::remove(probe.c_str());
    if (!w.ok)
        bad_input(fmt::format("cannot write into the cache directory {} ({}): {} failed: {}", dir, from, w.step,
                              std::strerror(w.error)));
    return dir;
}

} // namespace kiln::warmup
