#include "runtime/cuda/nvrtc.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string_view>

#ifdef KILN_HAVE_NVRTC
#include <nvrtc.h>
#endif

namespace kiln::cuda {

std::string numbered_source(const std::string& source) {
    std::string out;
    int line = 1;
    size_t start = 0;
    while (start < source.size()) {
        size_t end = source.find('\n', start);
        if (end == std::string::npos) end = source.size();
        out += fmt::format("{:5} | {}\n", line++, std::string_view(source).substr(start, end - start));
        start = end + 1;
    }
    return out;
}

#ifdef KILN_HAVE_NVRTC

namespace {

// Whether the NVRTC in use is major.minor or later.
bool nvrtc_at_least(int major, int minor) {
    int have_major = 0, have_minor = 0;
    return nvrtcVersion(&have_major, &have_minor) == NVRTC_SUCCESS &&
           (have_major > major || (have_major == major && have_minor >= minor));
}

// Every option but the architecture. -minimal (NVRTC 12.4 and later) leaves out the
// declarations of texture, surface and device-runtime functions, which generated kernels never
// use: NVRTC then parses less of its built-in header, 20-35 ms less a kernel on an H200
// machine's host.
const std::vector<const char*>& base_options() {
    static const std::vector<const char*> options = [] {
        std::vector<const char*> o = {"-default-device", "--std=c++17", "-fmad=true"};
        if (nvrtc_at_least(12, 4)) o.push_back("-minimal");
        return o;
    }();
    return options;
}

// What `fast` adds: -Ofc=mid (NVRTC 12.8 and later) has NVVM and ptxas spend less effort (a
// small row entry's compile: 10-30% shorter), its code a little slower; nothing on an NVRTC
// without it.
const std::vector<const char*>& fast_options() {
    static const std::vector<const char*> options = [] {
        std::vector<const char*> o;
        if (nvrtc_at_least(12, 8)) o.push_back("-Ofc=mid");
        return o;
    }();
    return options;
}

// Destroys the program on every path out of nvrtc_compile.
struct Program {
    nvrtcProgram p = nullptr;
    ~Program() {
        if (p) nvrtcDestroyProgram(&p);
    }
};

std::string program_log(nvrtcProgram p) {
    size_t n = 0;
    if (nvrtcGetProgramLogSize(p, &n) != NVRTC_SUCCESS || n <= 1) return {};
    std::string log(n, '\0');
    if (nvrtcGetProgramLog(p, log.data()) != NVRTC_SUCCESS) return {};
    log.resize(n - 1);  // drop the terminating NUL
    return log;
}

} // namespace

NvrtcResult nvrtc_compile(const std::string& source, const std::string& name, int sm, bool want_cubin, bool fast) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    NvrtcResult r;
    auto finish = [&](bool ok) {
        r.ok = ok;
        r.milliseconds = std::chrono::duration<double, std::milli>(clock::now() - start).count();
        return r;
    };
    Program prog;
    nvrtcResult st = nvrtcCreateProgram(&prog.p, source.c_str(), name.c_str(), 0, nullptr, nullptr);
    if (st != NVRTC_SUCCESS) {
        r.log = fmt::format("nvrtcCreateProgram({}): {}", name, nvrtcGetErrorString(st));
        return finish(false);
    }
    const std::string arch = fmt::format("--gpu-architecture={}_{}", want_cubin ? "sm" : "compute", sm);
    std::vector<const char*> opts = {arch.c_str()};
    opts.insert(opts.end(), base_options().begin(), base_options().end());
    if (fast) opts.insert(opts.end(), fast_options().begin(), fast_options().end());
    for (const char* o : opts) r.options += (r.options.empty() ? "" : " ") + std::string(o);
    st = nvrtcCompileProgram(prog.p, (int)opts.size(), opts.data());
    r.log = program_log(prog.p);
    if (st != NVRTC_SUCCESS) {
        if (r.log.empty()) r.log = fmt::format("nvrtcCompileProgram({}, {}): {}", name, arch, nvrtcGetErrorString(st));
        return finish(false);
    }
    size_t n = 0;
    st = want_cubin ? nvrtcGetCUBINSize(prog.p, &n) : nvrtcGetPTXSize(prog.p, &n);
    if (st == NVRTC_SUCCESS) {
        r.binary.resize(n);
        st = want_cubin ? nvrtcGetCUBIN(prog.p, r.binary.data()) : nvrtcGetPTX(prog.p, r.binary.data());
    }
    if (st != NVRTC_SUCCESS) {
        r.log += fmt::format("{}reading the {} of {}: {}", r.log.empty() ? "" : "\n", want_cubin ? "cubin" : "PTX", name,
                             nvrtcGetErrorString(st));
        r.binary.clear();
        return finish(false);
    }
    return finish(true);
}

std::string nvrtc_version() {
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
    return fmt::format("{}.{}", major, minor);
}

std::string nvrtc_toolchain(bool fast) {
    std::string s = "nvrtc " + nvrtc_version();
    for (const char* o : base_options()) s += std::string(" ") + o;
    if (fast)
        for (const char* o : fast_options()) s += std::string(" ") + o;
    return s;
}

std::vector<int> nvrtc_supported_archs() {
    int n = 0;
    if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return {};
    std::vector<int> archs((size_t)n);
    if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) return {};
    std::sort(archs.begin(), archs.end());
    return archs;
}

#else

NvrtcResult nvrtc_compile(const std::string&, const std::string& name, int sm, bool, bool) {
    NvrtcResult r;
    r.log = fmt::format("cannot compile {} for sm_{}: kiln was built without NVRTC (no CUDA toolkit found at build time)",
                        name, sm);
    return r;
}

std::string nvrtc_version() { return "none"; }

std::string nvrtc_toolchain(bool) { return "nvrtc none"; }

std::vector<int> nvrtc_supported_archs() { return {}; }

#endif

} // namespace kiln::cuda
