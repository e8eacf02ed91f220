// DiskCache: paths, the load/store policy and memory-only mode (see disk_cache.hpp).
#include "runtime/cache/disk_cache.hpp"

#include "compiler/env.hpp"
#include "compiler/log.hpp"
#include "runtime/cache/entry_format.hpp"
#include "runtime/cache/file_io.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string_view>
#include <system_error>

#include <pwd.h>
#include <unistd.h>

#ifndef KILN_VERSION
#define KILN_VERSION "dev"
#endif

namespace kiln::cache {

namespace {

std::string env_string(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
}

std::string strip_trailing_slashes(std::string p) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    return p;
}

std::string join(const std::string& base, const char* rel) {
    std::string b = strip_trailing_slashes(base);
    return b.ends_with('/') ? b + rel : b + "/" + rel;
}

std::string home_directory() {
    std::string home = env_string("HOME");
    if (!home.empty()) return home;
    long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
    std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
    struct passwd pw;
    struct passwd* found = nullptr;
    if (::getpwuid_r(::getuid(), &pw, buf.data(), buf.size(), &found) == 0 && found && found->pw_dir)
        return found->pw_dir;
    return {};
}

std::string error_text(int error) { return std::error_code(error, std::generic_category()).message(); }

EntryIdentity identity(const std::string& kiln_version, const DiskCacheKey& key) {
    return EntryIdentity{kiln_version, key.toolchain, key.arch, key.material};
}

// Directories whose memory-only warning this process has printed: several caches (one per
// device or context) on the same unusable directory say so once.
bool first_warning_for(const std::string& dir) {
    static std::mutex mu;
    static auto* warned = new std::set<std::string>();   // never destroyed: usable during exit
    std::lock_guard<std::mutex> lock(mu);
    return warned->insert(dir).second;
}

} // namespace

std::string default_cache_dir() {
    if (std::string d = env_string("KILN_CACHE_DIR"); !d.empty()) return d;
    // The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    if (std::string x = env_string("XDG_CACHE_HOME"); !x.empty() && x.front() == '/') return join(x, "kiln");
    std::string home = home_directory();
    if (home.empty()) return {};
    return join(home, ".cache/kiln");
}

DiskCache::DiskCache(DiskCacheOptions options)
    : dir_(strip_trailing_slashes(options.dir.empty() ? default_cache_dir() : std::move(options.dir))),
      kiln_version_(options.kiln_version.empty() ? std::string(KILN_VERSION) : std::move(options.kiln_version)) {
    sync_ = env::flag("KILN_CACHE_FSYNC").value_or(false);
    if (dir_.empty()) {
        disable("no cache directory is known (set KILN_CACHE_DIR, XDG_CACHE_HOME or HOME)");
        return;
    }
    int error = 0;
    if (!make_directories(dir_, &error))
        disable(fmt::format("cannot create the cache directory {}: {}", dir_, error_text(error)));
    else
        log_debug("kernel cache: {}", dir_);
}

void DiskCache::disable(const std::string& why) {
    if (!enabled_.exchange(false)) return;
    if (first_warning_for(dir_))
        log_warn("kernel cache: {}; compiled kernels are kept in memory only, for this process "
                 "(set KILN_CACHE_DIR to a writable directory to keep them)", why);
}

std::string DiskCache::path_for(const DiskCacheKey& key) const {
    if (dir_.empty()) return {};
    // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
    Fnv1a64 h;
    for (const std::string* s : {&key.material, &key.arch, &key.toolchain, &kiln_version_}) {
        h.add_u64(s->size());
        h.add(*s);
    }
    const std::string hex = fmt::format("{:016x}", h.value());
    return fmt::format("{}/{}/{}.bin", dir_ == "/" ? "" : dir_, hex.substr(0, 2), hex);
}

namespace {
bool lower_hex(std::string_view s, size_t n) {
    if (s.size() != n) return false;
    for (char c : s)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    return true;
}
} // namespace

std::vector<DiskCache::EntryFile> DiskCache::entry_files() const {
    namespace fs = std::filesystem;
    std::vector<EntryFile> out;
    if (dir_.empty()) return out;
    std::error_code ec;
    // Neither walk follows a link to a directory: a subdirectory is a real one of this directory.
    for (auto sub = fs::directory_iterator(dir_, ec); !ec && sub != fs::directory_iterator(); sub.increment(ec)) {
        const std::string two = sub->path().filename().string();
        if (!lower_hex(two, 2) || !sub->is_directory(ec) || sub->is_symlink(ec)) continue;
        std::error_code ec2;
        for (auto f = fs::directory_iterator(sub->path(), ec2); !ec2 && f != fs::directory_iterator(); f.increment(ec2)) {
            const fs::path& p = f->path();
            const std::string stem = p.stem().string();
            if (p.extension() != ".bin" || !lower_hex(stem, 16) || stem.compare(0, 2, two) != 0) continue;
            std::error_code ec3;
            if (!f->is_regular_file(ec3) || f->is_symlink(ec3)) continue;
            char magic[sizeof kMagic] = {};
            std::ifstream in(p, std::ios::binary);
            if (!in.read(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof kMagic) != 0) continue;
            const uintmax_t size = f->file_size(ec3);
            if (!ec3) out.push_back({p.string(), (uint64_t)size});
        }
    }
    return out;
}

ReadResult read_entry_file(const std::string& path, EntryCheck& head) {
    head = EntryCheck::Ok;
    return read_file(path, kMaxEntrySize, kFixedHeaderSize,
                     [&](std::span<const char> h, uint64_t size) { return (head = check_head(h, size)) == EntryCheck::Ok; });
}

DiskCacheKey cuda_kernel_key(const std::string& kernel_key, const std::string& source, const std::string& arch,
                             const std::string& toolchain) {
    return DiskCacheKey{kernel_key + "\n" + source, arch, toolchain};
}

DiskCacheKey cpu_kernel_key(const std::string& kernel_key, const std::string& kernel_text, const std::string& symbol,
                            const std::string& cpu_name, const std::string& machine, const std::string& llvm_version) {
    return DiskCacheKey{kernel_key + "\nkernel " + kernel_text + "\nsymbol " + symbol + "\n" + machine, "cpu-" + cpu_name,
                        "llvm " + llvm_version};
}

std::optional<std::vector<char>> DiskCache::load(const DiskCacheKey& key) {
    if (dir_.empty()) {
        misses_.fetch_add(1, std::memory_order_relaxed);
        return std::nullopt;
    }
    const std::string path = path_for(key);
    auto reject = [&](FileId id, const char* why) {
        rejected_.fetch_add(1, std::memory_order_relaxed);
        const bool removed = remove_if_unchanged(path, id);
        log_info("kernel cache: ignoring {}: {}{}; the kernel will be compiled again", path, why,
                 removed ? " (removed)" : "");
    };
    try {
        EntryCheck head = EntryCheck::Ok;
        ReadResult r = read_entry_file(path, head);
        switch (r.status) {
        case ReadStatus::NotFound:
            misses_.fetch_add(1, std::memory_order_relaxed);
            return std::nullopt;
        case ReadStatus::Error:
            misses_.fetch_add(1, std::memory_order_relaxed);
            log_debug("kernel cache: cannot read {}: {}", path, error_text(r.error));
            return std::nullopt;
        case ReadStatus::NotRegular: reject(r.id, "not a regular file"); return std::nullopt;
        case ReadStatus::TooLarge: reject(r.id, "larger than any entry"); return std::nullopt;
        case ReadStatus::Refused: reject(r.id, describe(head)); return std::nullopt;
        case ReadStatus::Ok: break;
        }
        const ParsedEntry e = verify_entry(r.data, identity(kiln_version_, key));
        if (e.check != EntryCheck::Ok) {
            reject(r.id, describe(e.check));
            return std::nullopt;
        }
        // The binary is the file's tail: move it to the front instead of copying it out.
        r.data.erase(r.data.begin(), r.data.begin() + static_cast<std::ptrdiff_t>(e.binary_offset));
        hits_.fetch_add(1, std::memory_order_relaxed);
        return std::optional<std::vector<char>>(std::move(r.data));
    } catch (const std::exception& ex) {   // only allocation can throw here
        misses_.fetch_add(1, std::memory_order_relaxed);
        log_debug("kernel cache: cannot load {}: {}", path, ex.what());
        return std::nullopt;
    }
}

void DiskCache::store(const DiskCacheKey& key, const std::vector<char>& binary) {
    if (!enabled()) return;
    try {
        const EntryIdentity id = identity(kiln_version_, key);
        if (!entry_fits(id, binary.size())) {
            log_debug("kernel cache: not storing a {}-byte binary with {}-byte key material: over the format's limits",
                      binary.size(), key.material.size());
            return;
        }
        const std::string path = path_for(key);
        const std::string sub = path.substr(0, path.rfind('/'));
        int error = 0;
        if (!make_directories(sub, &error)) {
            write_failures_.fetch_add(1, std::memory_order_relaxed);
            disable(fmt::format("cannot create {}: {}", sub, error_text(error)));
            return;
        }
        const std::vector<char> header = serialize_header(id, binary);
        const WriteResult w = write_file_atomic(path, {header, binary}, sync_);
        if (!w.ok) {
            write_failures_.fetch_add(1, std::memory_order_relaxed);
            // A directory standing at the entry's path blocks that entry alone (load() leaves it:
            // it is not kiln's to delete); every other failure says the directory cannot be written.
            const bool path_taken = std::strcmp(w.step, "rename") == 0 &&
                                    (w.error == EISDIR || w.error == ENOTEMPTY || w.error == EEXIST);
            if (!path_taken) {
                disable(fmt::format("cannot write {} ({} failed: {})", path, w.step, error_text(w.error)));
            } else if (first_warning_for(path)) {
                log_warn("kernel cache: cannot store {}: a directory is in its place; this kernel is kept in memory "
                         "only (the other entries are stored)",
                         path);
            }
            return;
        }
        writes_.fetch_add(1, std::memory_order_relaxed);
    } catch (const std::exception& ex) {
        write_failures_.fetch_add(1, std::memory_order_relaxed);
        disable(fmt::format("cannot store an entry: {}", ex.what()));
    }
}

std::string DiskCache::save_source(const std::string& name, const std::string& source) {
    if (dir_.empty()) return {};
    try {
        std::string clean = name.empty() ? std::string("_") : name;
        for (char& c : clean) {
            const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                            c == '-' || c == '.';
            if (!ok) c = '_';
        }
        if (clean.front() == '.') clean.insert(clean.begin(), '_');   // no hidden, temporary or ".." names
        const std::string sub = join(dir_, "sources");
        int error = 0;
        if (!make_directories(sub, &error)) {
            log_debug("kernel cache: cannot create {}: {}", sub, error_text(error));
            return {};
        }
        const std::string path = sub + "/" + clean + ".cu";
        const WriteResult w = write_file_atomic(path, {std::span<const char>(source.data(), source.size())}, false);
        if (!w.ok) {
            log_debug("kernel cache: cannot write {} ({} failed: {})", path, w.step, error_text(w.error));
            return {};
        }
        return path;
    } catch (const std::exception&) {
        return {};
    }
}

DiskCacheStats DiskCache::stats() const {
    DiskCacheStats s;
    s.hits = hits_.load(std::memory_order_relaxed);
    s.misses = misses_.load(std::memory_order_relaxed);
    s.rejected = rejected_.load(std::memory_order_relaxed);
    s.writes = writes_.load(std::memory_order_relaxed);
    s.write_failures = write_failures_.load(std::memory_order_relaxed);
    return s;
}

} // namespace kiln::cache
