// host_target_label (see host_target.hpp).
#include "runtime/host_target.hpp"

namespace kiln {

std::string host_target_label() {
    std::string t = "cpu-x86_64";
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) t += "-avx512";
    else if (__builtin_cpu_supports("avx2")) t += "-avx2";
#endif
    return t;
}

} // namespace kiln
