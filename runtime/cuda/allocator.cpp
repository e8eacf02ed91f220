#include "runtime/cuda/allocator.hpp"

#include "ir/error.hpp"

namespace kiln::cuda {

size_t Allocator::bucket_size(size_t n) {
    constexpr size_t small = 512, large = 2u << 20, threshold = 1u << 20;
    if (n == 0) return small;
    if (n <= threshold) return (n + small - 1) / small * small;
    return (n + large - 1) / large * large;
}

Allocator::~Allocator() {
    std::lock_guard<std::mutex> lock(mu_);
    free_cached_locked();
}

CUdeviceptr Allocator::allocate(size_t nbytes, const char* op) {
    const size_t size = bucket_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.allocations;
    if (auto it = free_.find(size); it != free_.end()) {
        CUdeviceptr p = it->second;
        free_.erase(it);
        stats_.cached -= size;
        stats_.in_use += size;
        return p;
    }
    const Driver& d = driver();
    d.cuCtxSetCurrent(ctx_);
    CUdeviceptr p = 0;
    CUresult r = d.cuMemAlloc(&p, size);
    size_t cached_before = stats_.cached;
    if (r == CUDA_ERROR_OUT_OF_MEMORY && stats_.cached > 0) {
        free_cached_locked();
        ++stats_.cache_releases;
        r = d.cuMemAlloc(&p, size);
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        size_t free_b = 0, total_b = 0;
        d.cuMemGetInfo(&free_b, &total_b);
        throw OutOfMemory(fmt::format("{}: out of memory on cuda:{}: requested {} bytes ({} reserved); {} bytes free of "
                                      "{}; the allocator's cache held {} bytes and released them before retrying",
                                      op, device_, nbytes, size, free_b, total_b, cached_before),
                          nbytes, free_b, cached_before);
    }
    check(r, "cuMemAlloc");
    ++stats_.driver_allocations;
    stats_.in_use += size;
    return p;
}

void Allocator::release(CUdeviceptr p, size_t nbytes) {
    const size_t size = bucket_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(size, p);
    stats_.in_use -= size;
    stats_.cached += size;
}

void Allocator::empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    free_cached_locked();
}

void Allocator::free_cached_locked() {
    if (free_.empty()) return;
    const Driver& d = driver();
    d.cuCtxSetCurrent(ctx_);
    for (auto& [size, p] : free_) d.cuMemFree(p);  // cuMemFree waits for work using the block
    free_.clear();
    stats_.cached = 0;
}

AllocatorStats Allocator::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

} // namespace kiln::cuda
