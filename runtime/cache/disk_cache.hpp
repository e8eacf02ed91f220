// The on-disk kernel cache (DESIGN.md, "kernel caches"): compiled binaries keyed by everything
// that changes them, so a process that has compiled a kernel once never compiles it again, on
// this machine or on any machine that shares the directory (kiln-warmup fills one offline).
//
// Directory: KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln; entries live in
// <dir>/<first two hex digits>/<16 hex digits>.bin (a hash of the key), with the format of
// entry_format.hpp. Files are written by temporary file + rename (file_io.hpp); every load is
// verified in full and a file that fails is a miss (and is removed, so the recompiled kernel
// replaces it). A directory that cannot be written (read-only, full, missing permissions)
// turns the cache memory-only for writes, with one warning; loads keep working, so a read-only
// pre-warmed cache still serves. Thread-safe; safe across processes.
#pragma once
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::cache {

struct DiskCacheOptions {
    std::string dir;            // empty: default_cache_dir()
    std::string kiln_version;
};

struct DiskCacheKey {
    std::string material;       // full key material: every byte that changes the binary
    std::string arch;           // "sm_90"
    std::string toolchain;      // "nvrtc 13.0"
};

struct DiskCacheStats {
    uint64_t hits = 0, misses = 0, rejected = 0, writes = 0, write_failures = 0;
};

class DiskCache {
public:
    explicit DiskCache(DiskCacheOptions opts);

    // The binary stored for `key`; nullopt on a miss or when the file fails a check (counted as
    // rejected, logged at KILN_LOG=info with the reason).
    std::optional<std::vector<char>> load(const DiskCacheKey& key);
    // Never throws. A failure disables further writes, with one warning.
    void store(const DiskCacheKey& key, const std::vector<char>& binary);
    // Writes <dir>/sources/<name>.cu; returns its path, or "" when it cannot.
    std::string save_source(const std::string& name, const std::string& source);

    std::string path_for(const DiskCacheKey& key) const;
    bool enabled() const { return writable_.load(); }
    const std::string& dir() const { return dir_; }
    DiskCacheStats stats() const;

private:
    void disable(const std::string& why);

    std::string dir_;
    std::string kiln_version_;
    std::atomic<bool> writable_{true};
    std::atomic<uint64_t> hits_{0}, misses_{0}, rejected_{0}, writes_{0}, write_failures_{0};
};

// KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; "" when none is set.
std::string default_cache_dir();

} // namespace kiln::cache
