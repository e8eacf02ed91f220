// The on-disk kernel cache: compiled binaries (CUDA cubins, CPU object files) kept across
// processes, so a program that ran before — or a cache warmed offline by kiln-warmup — never
// waits for NVRTC or LLVM.
//
// Why it exists: compiling a kernel costs tens to hundreds of milliseconds; reading it back
// costs microseconds. The backend asks its memory cache first, then this, then compiles and
// stores here. This class owns the policy — where files go, what makes an entry trustworthy,
// what happens when the directory cannot be written — and knows nothing about CUDA or LLVM.
//
// Files: <dir>/<2 hex>/<16 hex>.bin, the hex being the 64-bit FNV-1a of (material, arch,
// toolchain, kiln version), each length-prefixed. A file holds a header (entry_format.hpp) with
// the FULL key material, compared on load, so a hash collision is a miss, never a wrong kernel.
// A file that fails any check is counted as rejected, removed when the directory allows, and
// load() returns nullopt: the caller compiles again and store() replaces the file.
//
// Concurrency: every method may be called from any thread; several processes may share a
// directory. Writes go to a uniquely named temporary file renamed into place (file_io.hpp), so
// readers see the old complete file or the new complete one. Identical keys racing to store
// write identical entries; the last rename wins.
//
// Failure: store() never throws. The first write that fails (read-only or full directory,
// missing permissions) turns the object into memory-only mode — stores become no-ops — with one
// log_warn, printed once per directory per process. A directory standing at one entry's path
// fails that entry alone, with a warning once per path. load() keeps reading, so a read-only,
// pre-warmed cache keeps working. KILN_CACHE_FSYNC=1 adds fsync before each rename.
#pragma once
#include "runtime/cache/entry_format.hpp"
#include "runtime/cache/file_io.hpp"

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::cache {

struct DiskCacheOptions {
    std::string dir;            // empty: default_cache_dir()
    std::string kiln_version;   // empty: this library's version (KILN_VERSION)
};

struct DiskCacheKey {
    std::string material;       // full key material: every byte that changes the binary
    std::string arch;           // "sm_90", "cpu-znver3"
    std::string toolchain;      // "nvrtc 13.0 <its options>" (cuda::nvrtc_toolchain), "llvm 16.0.6"
};

// Each load() counts exactly one of hits, misses (no file or an unreadable one) and rejected
// (a file that failed a check). writes and write_failures count store() calls that reached
// the disk; stores skipped in memory-only mode count in neither.
struct DiskCacheStats {
    uint64_t hits = 0, misses = 0, rejected = 0, writes = 0, write_failures = 0;
};

class DiskCache {
public:
    explicit DiskCache(DiskCacheOptions options);
    DiskCache(const DiskCache&) = delete;
    DiskCache& operator=(const DiskCache&) = delete;

    // The binary stored for `key`, or nullopt on a miss or on a file that failed a check.
    std::optional<std::vector<char>> load(const DiskCacheKey& key);

    // Writes (or replaces) the entry for `key`. Never throws; see "Failure" above.
    void store(const DiskCacheKey& key, const std::vector<char>& binary);

    // Writes `source` to <dir>/sources/<name>.cu (temporary file + rename) so an error message
    // can point at it. Characters of `name` outside [A-Za-z0-9_.-] become '_'. Returns the
    // path, or "" when it cannot be written. Independent of memory-only mode, never throws.
    std::string save_source(const std::string& name, const std::string& source);

    // Where the entry for `key` lives (whether or not it exists).
    std::string path_for(const DiskCacheKey& key) const;

    // The entries in the directory: regular files at <2 hex>/<16 hex>.bin (the hex's first two
    // digits naming the subdirectory) that begin with the entry magic. Anything else in the
    // directory is not kiln's, so that eviction (kiln-warmup --prune) never removes it.
    struct EntryFile {
        std::string path;
        uint64_t size = 0;
    };
    std::vector<EntryFile> entry_files() const;

    bool enabled() const { return enabled_.load(std::memory_order_relaxed); }   // false once writes failed
    const std::string& dir() const { return dir_; }
    DiskCacheStats stats() const;

private:
    void disable(const std::string& why);

    std::string dir_;
    std::string kiln_version_;
    bool sync_ = false;
    std::atomic<bool> enabled_{true};
    std::atomic<uint64_t> hits_{0}, misses_{0}, rejected_{0}, writes_{0}, write_failures_{0};
};

// The key of a CUDA kernel's cubin: the kernel's cache key (compiler/key.hpp, which names the
// arch), its CUDA source, the arch and the toolchain (cuda::nvrtc_toolchain(): NVRTC's version
// and options). The CUDA backend and kiln-warmup both use it, so an entry warmed offline is the
// one the runtime looks up.
DiskCacheKey cuda_kernel_key(const std::string& kernel_key, const std::string& source, const std::string& arch,
                             const std::string& toolchain);

// The key of a CPU kernel's object file: the kernel's cache key (compiler/key.hpp, which names
// the coarse CPU label), the kernel itself as text (what the CUDA key's source is to a cubin: two
// kernels given one key by a caller still get two entries), the symbol its entry points are
// named after (the object defines them), and `machine`, the full description of the code
// generator's target — triple, CPU model, every feature, optimisation levels, code and
// relocation models, vector math library (runtime/cpu/host_machine.hpp). arch is
// "cpu-<CPU model>", toolchain "llvm <version>". The CPU backend and kiln-warmup both use it
// (through CpuJit::disk_key), so an object from another CPU or LLVM is never loaded.
DiskCacheKey cpu_kernel_key(const std::string& kernel_key, const std::string& kernel_text, const std::string& symbol,
                            const std::string& cpu_name, const std::string& machine, const std::string& llvm_version);

// The file at `path` read as an entry is: its fixed header first, its verdict (check_head) into
// `head`, and the rest only where that is Ok (else ReadStatus::Refused); at most kMaxEntrySize.
// DiskCache::load and kiln-warmup --check read entries through it.
ReadResult read_entry_file(const std::string& path, EntryCheck& head);

// KILN_CACHE_DIR if set and non-empty, else $XDG_CACHE_HOME/kiln if XDG_CACHE_HOME is an
// absolute path, else $HOME/.cache/kiln (HOME, else the password database). "" if none is known.
std::string default_cache_dir();

} // namespace kiln::cache
