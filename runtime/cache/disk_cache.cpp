#include "runtime/cache/disk_cache.hpp"

#include "compiler/log.hpp"
#include "runtime/cache/entry_format.hpp"
#include "runtime/cache/file_io.hpp"

#include <fmt/format.h>

#include <cstdlib>

#include <unistd.h>

namespace kiln::cache {

namespace {

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
}

} // namespace

std::string default_cache_dir() {
    if (std::string d = env("KILN_CACHE_DIR"); !d.empty()) return d;
    if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return d + "/kiln";
    if (std::string d = env("HOME"); !d.empty()) return d + "/.cache/kiln";
    return {};
}

DiskCache::DiskCache(DiskCacheOptions opts) : dir_(opts.dir.empty() ? default_cache_dir() : opts.dir), kiln_version_(opts.kiln_version) {
    if (dir_.empty()) disable("no cache directory: none of KILN_CACHE_DIR, XDG_CACHE_HOME, HOME is set");
}

std::string DiskCache::path_for(const DiskCacheKey& key) const {
    uint64_t h = fnv1a(key.material);
    for (const std::string* s : {&key.arch, &key.toolchain, &kiln_version_}) h = fnv1a(*s, fnv1a("\n", h));
    const std::string hex = fmt::format("{:016x}", h);
    return fmt::format("{}/{}/{}.bin", dir_, hex.substr(0, 2), hex);
}

std::optional<std::vector<char>> DiskCache::load(const DiskCacheKey& key) {
    if (dir_.empty()) return std::nullopt;
    const std::string path = path_for(key);
    std::optional<std::vector<char>> file = read_file(path);
    if (!file) {
        ++misses_;
        return std::nullopt;
    }
    std::vector<char> binary;
    std::string why;
    if (!decode_entry(*file, EntryFields{kiln_version_, key.toolchain, key.arch, key.material}, &binary, &why)) {
        ++rejected_;
        log_info("kernel cache: ignoring {}: {}", path, why);
        if (enabled()) ::unlink(path.c_str());
        return std::nullopt;
    }
    ++hits_;
    return binary;
}

void DiskCache::store(const DiskCacheKey& key, const std::vector<char>& binary) {
    if (!enabled()) return;
    try {
        const std::vector<char> bytes = encode_entry(EntryFields{kiln_version_, key.toolchain, key.arch, key.material}, binary);
        std::string why;
        if (write_file_atomic(path_for(key), bytes.data(), bytes.size(), &why)) {
            ++writes_;
            return;
        }
        disable(why);
    } catch (const std::exception& e) {
        disable(e.what());
    }
}

std::string DiskCache::save_source(const std::string& name, const std::string& source) {
    if (dir_.empty()) return {};
    const std::string path = fmt::format("{}/sources/{}.cu", dir_, name);
    std::string why;
    return write_file_atomic(path, source.data(), source.size(), &why) ? path : std::string();
}

void DiskCache::disable(const std::string& why) {
    ++write_failures_;
    if (writable_.exchange(false))
        log_warn("kernel cache: cannot write to '{}' ({}); compiled kernels are kept in memory only", dir_, why);
}

DiskCacheStats DiskCache::stats() const {
    return DiskCacheStats{hits_.load(), misses_.load(), rejected_.load(), writes_.load(), write_failures_.load()};
}

} // namespace kiln::cache
