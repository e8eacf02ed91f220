// kiln-warmup's command line: every argument is checked here, before any work, and a bad one
// ends the tool with exit status 2 and a message naming it and what is valid — an arch NVRTC
// cannot compile for, a --jobs or --prune value that is not one, a manifest that is missing or
// a directory, a cache directory that is a file or cannot be written.
#pragma once
#include <string>
#include <vector>

namespace kiln::warmup {

inline constexpr const char* kCpu = "cpu";
inline constexpr int kMaxJobs = 1024;

#ifdef KILN_HAVE_NVRTC
inline constexpr bool kHaveCuda = true;
#else
inline constexpr bool kHaveCuda = false;
#endif
#ifdef KILN_HAVE_LLVM
inline constexpr bool kHaveCpu = true;
#else
inline constexpr bool kHaveCpu = false;
#endif

struct Options {
    std::vector<std::string> manifests;   // each an existing file that is not a directory
    std::vector<std::string> archs;       // "sm_90" (one NVRTC compiles for), "cpu"; no repeats
    std::string cache_dir;                // as given ("" for the default)
    int jobs = 0;                         // 0: the number of CPUs
    bool check = false;
    long long prune = -1;                 // bytes; -1 without --prune
};

// Parses and checks the arguments; prints the message and the usage and exits with status 2
// on a bad one (0 after --help).
Options parse_args(int argc, char** argv);

// Prints "kiln-warmup: <msg>" and exits with status 2.
[[noreturn]] void bad_input(const std::string& msg);

// The NVRTC version ("13.0"), and the CUDA architectures it compiles for, "sm_75, sm_80, ...".
std::string nvrtc_label();
std::string supported_cuda_archs();
// Whether NVRTC compiles for `arch` ("sm_90").
bool cuda_arch_supported(const std::string& arch);

// The cache directory to use: `given`, else the default. Exits with status 2, naming it and
// where it came from (--cache-dir, KILN_CACHE_DIR, the default), when none is known or it exists
// and is not a directory; unless `read_only`, also when it cannot be created or a file cannot
// be written in it.
std::string cache_directory(const std::string& given, bool read_only);

} // namespace kiln::warmup
