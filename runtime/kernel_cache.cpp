#include "runtime/kernel_cache.hpp"

#include "compiler/log.hpp"

#include <cerrno>
#include <cstdlib>
#include <mutex>

namespace kiln {

size_t kernel_cache_capacity_from_env() {
    const char* v = std::getenv("KILN_KERNEL_CACHE");
    if (!v || !*v) return kDefaultKernelCacheCapacity;
    char* end = nullptr;
    errno = 0;
    unsigned long long n = std::strtoull(v, &end, 10);
    if (*v != '-' && *end == '\0' && errno == 0 && n >= 1 && n <= (1ull << 40)) return (size_t)n;
    static std::once_flag warned;
    std::call_once(warned, [&] {
        log_warn("KILN_KERNEL_CACHE='{}' is not a number of kernels; valid: an integer from 1 to 2^40 (using {})", v,
                 kDefaultKernelCacheCapacity);
    });
    return kDefaultKernelCacheCapacity;
}

} // namespace kiln
