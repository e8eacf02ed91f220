// A kernel cache directory of one test: created empty (or given), made KILN_CACHE_DIR (which
// every backend's disk cache reads when it is created), and on destruction removed (when created
// here) with the previous KILN_CACHE_DIR restored — the test program's own (tests/support/catch_main.cpp), not unset,
// so later tests keep their hermetic cache.
#pragma once
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace kiln::test {

// A fresh, empty directory $TMPDIR/<prefix>-XXXXXX (/tmp without TMPDIR); the caller removes it.
inline std::string make_temp_dir(const std::string& prefix) {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
    if (!::mkdtemp(dir.data())) throw std::runtime_error("mkdtemp " + dir + ": " + std::strerror(errno));
    return dir;
}

class ScopedCacheDir {
public:
    ScopedCacheDir() : path_(make_temp_dir("kiln-test-dir")), owned_(true) { point_at_path(); }
    // An existing directory (another part of the test owns it and removes it).
    explicit ScopedCacheDir(std::string existing) : path_(std::move(existing)) { point_at_path(); }
    ~ScopedCacheDir() {
        if (old_)
            ::setenv("KILN_CACHE_DIR", old_->c_str(), 1);
        else
            ::unsetenv("KILN_CACHE_DIR");
        std::error_code ec;
        if (owned_) std::filesystem::remove_all(path_, ec);
    }
    ScopedCacheDir(const ScopedCacheDir&) = delete;
    ScopedCacheDir& operator=(const ScopedCacheDir&) = delete;
    const std::string& path() const { return path_; }

private:
    void point_at_path() {
        if (const char* old = std::getenv("KILN_CACHE_DIR")) old_ = old;
        ::setenv("KILN_CACHE_DIR", path_.c_str(), 1);
    }
    std::string path_;
    bool owned_ = false;
    std::optional<std::string> old_;
};

// The files under dir (recursively) whose bytes contain text: a disk cache's entries whose key
// material names, say, an autotuner.
inline int files_containing(const std::string& dir, const std::string& text) {
    int n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
        if (!e.is_regular_file()) continue;
        std::ifstream f(e.path(), std::ios::binary);
        const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        n += bytes.find(text) != std::string::npos;
    }
    return n;
}

// An environment variable set (or unset, value nullptr) for a scope, its previous state restored
// on destruction, also when the test throws.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        if (value)
            ::setenv(name, value, 1);
        else
            ::unsetenv(name);
    }
    ~ScopedEnv() {
        if (old_)
            ::setenv(name_.c_str(), old_->c_str(), 1);
        else
            ::unsetenv(name_.c_str());
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    std::string name_;
    std::optional<std::string> old_;
};

} // namespace kiln::test
