// A caching device allocator. cuMemAlloc/cuMemFree synchronise the device and cost tens of
// microseconds, far more than a fused kernel on a small tensor, so freed blocks are kept in
// size buckets and reused. All work runs on one stream, so a block freed by the host while a
// kernel that used it is still queued can be handed to the next kernel of that stream safely
// (stream order). When the driver is out of memory the cache is released and the allocation
// retried once; if that fails too, kiln::OutOfMemory names the request, the free memory and
// what the cache held — and the allocator stays usable.
#pragma once
#include "runtime/cuda/driver.hpp"

#include <cstddef>
#include <map>
#include <mutex>

namespace kiln::cuda {

struct AllocatorStats {
    size_t in_use = 0;        // bytes handed out (bucket sizes)
    size_t cached = 0;        // bytes held for reuse
    uint64_t allocations = 0; // allocate() calls
    uint64_t driver_allocations = 0;  // of which reached cuMemAlloc
    uint64_t cache_releases = 0;      // times the cache was emptied to satisfy a request
};

class Allocator {
public:
    Allocator(int device_index, CUcontext ctx) : device_(device_index), ctx_(ctx) {}
    ~Allocator();
    Allocator(const Allocator&) = delete;
    Allocator& operator=(const Allocator&) = delete;

    // The size actually reserved for a request: 512-byte granules up to 1 MiB, then 2 MiB
    // granules, so that tensors of nearby sizes share buckets.
    static size_t bucket_size(size_t nbytes);

    // A block of at least `nbytes` (never 0 bytes: an empty request gets one granule).
    // `op` names the user operation for the OutOfMemory message.
    CUdeviceptr allocate(size_t nbytes, const char* op);
    void release(CUdeviceptr p, size_t nbytes);  // back to the cache
    void empty_cache();                          // cuMemFree every cached block
    AllocatorStats stats() const;

private:
    void free_cached_locked();
    int device_;
    CUcontext ctx_;  // made current before driver calls: storages may be freed on any thread
    mutable std::mutex mu_;
    std::multimap<size_t, CUdeviceptr> free_;  // bucket size -> block
    AllocatorStats stats_;
};

} // namespace kiln::cuda
