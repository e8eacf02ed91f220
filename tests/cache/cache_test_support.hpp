// Helpers shared by the kernel-cache tests: a scratch directory, capturing what kiln logs to
// stderr, setting environment variables for one test, and reading/writing raw files.
#pragma once
#include "runtime/cache/disk_cache.hpp"
#include "runtime/cache/file_io.hpp"
#include "tests/support/cache_dir.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace kiln::cache::test {

namespace fs = std::filesystem;

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at the end, even
// after a test made parts of it read-only.
class TempDir {
public:
    TempDir() : path_(kiln::test::make_temp_dir("kiln-cache-test")) {}
    ~TempDir() {
        std::error_code ec;
        for (auto it = fs::recursive_directory_iterator(path_, ec); !ec && it != fs::recursive_directory_iterator();
             it.increment(ec))
            if (it->is_directory(ec)) fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
        fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
        fs::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }
    std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

private:
    std::string path_;
};

// Redirects file descriptor 2 to a file until text() is called (or the object dies), so a
// test can count the warnings kiln printed.
class StderrCapture {
public:
    StderrCapture() {
        std::fflush(stderr);
        file_ = dir_ / "stderr.txt";
        int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) throw std::runtime_error("cannot create the stderr capture file");
        saved_ = ::dup(2);
        ::dup2(fd, 2);
        ::close(fd);
    }
    ~StderrCapture() { restore(); }
    std::string text() {
        restore();
        std::ifstream f(file_, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }

private:
    void restore() {
        if (saved_ < 0) return;
        std::fflush(stderr);
        ::dup2(saved_, 2);
        ::close(saved_);
        saved_ = -1;
    }
    TempDir dir_;
    std::string file_;
    int saved_ = -1;
};

inline int count_lines_with(const std::string& text, const std::string& needle) {
    int n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
    return n;
}
inline int count_warnings(const std::string& text) { return count_lines_with(text, "kiln[warn]"); }

// Sets (or, with nullopt, unsets) an environment variable for the object's lifetime.
class EnvVar {
public:
    EnvVar(const char* name, std::optional<std::string> value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        if (value)
            ::setenv(name, value->c_str(), 1);
        else
            ::unsetenv(name);
    }
    ~EnvVar() {
        if (old_)
            ::setenv(name_, old_->c_str(), 1);
        else
            ::unsetenv(name_);
    }
    EnvVar(const EnvVar&) = delete;
    EnvVar& operator=(const EnvVar&) = delete;

private:
    const char* name_;
    std::optional<std::string> old_;
};

inline std::vector<char> read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::vector<char>& bytes) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) throw std::runtime_error("cannot write " + path);
}

inline int count_temp_files(const std::string& dir) {
    int n = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
        if (is_temp_name(it->path().filename().string())) ++n;
    return n;
}

inline DiskCacheKey make_key(int i, const std::string& arch = "sm_90", const std::string& toolchain = "nvrtc 12.4") {
    return DiskCacheKey{fmt::format("kiln test|stage {}|add f32 f32 -> f32|rank 1|stride 1", i), arch, toolchain};
}

// A deterministic pseudo-random binary for (key, variant). The first 8 bytes say which, so a
// reader can check that what it got is one complete binary that some writer stored.
inline std::vector<char> make_binary(int key, int variant, size_t size = 0) {
    if (size == 0) size = 64 + static_cast<size_t>((key * 7919 + variant * 104729) % 20000);
    std::vector<char> b(size < 8 ? 8 : size);
    uint64_t s = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(key + 1) ^ static_cast<uint64_t>(variant + 17) * 0xbf58476d1ce4e5b9ull;
    for (char& c : b) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        c = static_cast<char>(s & 0xff);
    }
    for (int i = 0; i < 4; ++i) {
        b[static_cast<size_t>(i)] = static_cast<char>((key >> (8 * i)) & 0xff);
        b[static_cast<size_t>(4 + i)] = static_cast<char>((variant >> (8 * i)) & 0xff);
    }
    return b;
}

// True when `b` is exactly make_binary(key, v) for some v < variants.
inline bool is_binary_of(const std::vector<char>& b, int key, int variants) {
    if (b.size() < 8) return false;
    int k = 0, v = 0;
    for (int i = 0; i < 4; ++i) {
        k |= static_cast<int>(static_cast<unsigned char>(b[static_cast<size_t>(i)])) << (8 * i);
        v |= static_cast<int>(static_cast<unsigned char>(b[static_cast<size_t>(4 + i)])) << (8 * i);
    }
    return k == key && v >= 0 && v < variants && b == make_binary(key, v);
}

} // namespace kiln::cache::test
