// Compiling CUDA C to a cubin (or PTX) with NVRTC. NVRTC needs no GPU, so this also runs on
// machines without one (the offline cache warm-up, the tests). Safe to call from several
// threads at once: every call uses its own NVRTC program.
#pragma once
#include <string>
#include <vector>

namespace kiln::cuda {

struct NvrtcResult {
    bool ok = false;
    std::string log;              // NVRTC's compile log, or why nothing was compiled
    std::vector<char> binary;     // cubin, or PTX text (with its terminating NUL) when !want_cubin
    double milliseconds = 0;      // wall time of the whole compile
    std::string options;          // the options NVRTC was given, space-separated
};

// `name` is the program name that NVRTC's messages show (e.g. "kiln_1234abcd.cu").
// `sm` is the compute capability times ten (80, 90). Options: --gpu-architecture=sm_XX (or
// compute_XX for PTX), then those nvrtc_toolchain(fast) names; `fast` compiles for compile time
// (CudaSource::fast_compile).
NvrtcResult nvrtc_compile(const std::string& source, const std::string& name, int sm, bool want_cubin = true,
                          bool fast = false);

// The source with each line prefixed by its number, as compile errors show it.
std::string numbered_source(const std::string& source);

// "major.minor" of the NVRTC library in use, or "none" when kiln was built without it.
std::string nvrtc_version();

// What besides the source and the architecture decides the binary: "nvrtc <version> <options>"
// (the disk cache keys kernels on it); `fast`: with the options nvrtc_compile's `fast` adds.
std::string nvrtc_toolchain(bool fast = false);

// The architectures the NVRTC in use compiles for, as compute capability times ten (75, 80,
// 90, ...), ascending; empty when kiln was built without NVRTC.
std::vector<int> nvrtc_supported_archs();

} // namespace kiln::cuda
