#include "runtime/kernel_cache.hpp"

#include "compiler/env.hpp"

namespace kiln {

size_t kernel_cache_capacity_from_env() {
    return (size_t)env::integer("KILN_KERNEL_CACHE", 1, 1ll << 40).value_or((long long)kDefaultKernelCacheCapacity);
}

} // namespace kiln
