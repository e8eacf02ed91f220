// The memory kernel cache of a backend: loaded kernels by key, the least recently used evicted
// past a capacity (ContextOptions::kernel_cache_capacity, else KILN_KERNEL_CACHE, else 1024), so
// a program that builds ever new expression structures does not grow without bound. An
// evicted kernel is retired, not freed: cached plans may still point at it, so the context
// first drops the plans that do, then lets the backend free the rest
// (Context::Impl::release_retired).
#pragma once
#include <algorithm>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace kiln {

inline constexpr size_t kDefaultKernelCacheCapacity = 1024;

// The capacity a context uses when its options leave it at 0: KILN_KERNEL_CACHE (a count of
// kernels, at least 1; other values are warned about once and ignored), else the default.
size_t kernel_cache_capacity_from_env();

template <class K>
class KernelCache {
public:
    explicit KernelCache(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

    // The kernel, now the most recently used, or null.
    const K* find(const std::string& key) {
        auto it = index_.find(key);
        if (it == index_.end()) return nullptr;
        lru_.splice(lru_.begin(), lru_, it->second);
        return lru_.front().second.get();
    }

    // Adds a kernel as the most recently used; those past the capacity are retired.
    const K* insert(const std::string& key, std::unique_ptr<K> k) {
        lru_.emplace_front(key, std::move(k));
        index_[key] = lru_.begin();
        while (lru_.size() > capacity_) {
            index_.erase(lru_.back().first);
            retired_.splice(retired_.end(), lru_, std::prev(lru_.end()));
        }
        return lru_.front().second.get();
    }

    bool has_retired() const { return !retired_.empty(); }
    template <class F>
    void for_each_retired(F&& f) const {
        for (auto& e : retired_) f(static_cast<const void*>(e.second.get()));
    }

    // Frees the retired kernels with `free(K&)`, but for those in `keep` (still used), which
    // return to the cache as the most recently used, past the capacity until the next insert.
    template <class Free>
    void release_retired(const std::unordered_set<const void*>& keep, Free&& free) {
        while (!retired_.empty()) {
            auto it = retired_.begin();
            if (keep.count(it->second.get())) {
                index_[it->first] = it;
                lru_.splice(lru_.begin(), retired_, it);
            } else {
                free(*it->second);
                retired_.erase(it);
            }
        }
    }

    template <class F>
    void for_each(F&& f) {
        for (auto& e : lru_) f(*e.second);
        for (auto& e : retired_) f(*e.second);
    }

    size_t size() const { return lru_.size(); }
    size_t capacity() const { return capacity_; }
    void set_capacity(size_t capacity) { capacity_ = std::max<size_t>(capacity, 1); }  // applies from the next insert

private:
    using Entry = std::pair<std::string, std::unique_ptr<K>>;
    size_t capacity_;
    std::list<Entry> lru_;  // most recent first
    std::list<Entry> retired_;
    std::unordered_map<std::string, typename std::list<Entry>::iterator> index_;
};

} // namespace kiln
