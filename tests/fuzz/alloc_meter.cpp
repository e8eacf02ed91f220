// Global operator new/delete that count the bytes alive, for the fuzz suite's allocation bound
// (fuzz.hpp). Replacing them in the test program covers libkiln too: its calls bind to these.
#include "tests/fuzz/fuzz.hpp"

#include <atomic>
#include <cstdlib>
#include <malloc.h>
#include <new>

namespace {

std::atomic<size_t> live{0}, peak{0};

void* counted(void* p) {
    if (!p) throw std::bad_alloc();
    const size_t now = live.fetch_add(malloc_usable_size(p), std::memory_order_relaxed) + malloc_usable_size(p);
    for (size_t top = peak.load(std::memory_order_relaxed); now > top;)
        if (peak.compare_exchange_weak(top, now, std::memory_order_relaxed)) break;
    return p;
}

void release(void* p) noexcept {
    if (!p) return;
    live.fetch_sub(malloc_usable_size(p), std::memory_order_relaxed);
    std::free(p);
}

void* aligned(size_t n, std::align_val_t a) {
    const size_t align = static_cast<size_t>(a);
    return std::aligned_alloc(align, (n + align - 1) / align * align);
}

} // namespace

namespace kiln::fuzz {

size_t peak_bytes_since_reset() { return peak.load(std::memory_order_relaxed); }
void reset_peak_bytes() { peak.store(live.load(std::memory_order_relaxed), std::memory_order_relaxed); }
size_t live_bytes() { return live.load(std::memory_order_relaxed); }

} // namespace kiln::fuzz

void* operator new(size_t n) { return counted(std::malloc(n ? n : 1)); }
void* operator new[](size_t n) { return counted(std::malloc(n ? n : 1)); }
void* operator new(size_t n, std::align_val_t a) { return counted(aligned(n ? n : 1, a)); }
void* operator new[](size_t n, std::align_val_t a) { return counted(aligned(n ? n : 1, a)); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
    try {
        return operator new(n);
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
    try {
        return operator new[](n);
    } catch (...) {
        return nullptr;
    }
}
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, size_t) noexcept { release(p); }
void operator delete[](void* p, size_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }
