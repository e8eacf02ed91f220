// A kernel cache directory of one test: created empty (or given), made KILN_CACHE_DIR (which
// every backend's disk cache reads when it is created), and on destruction removed (when created
// here) with the previous KILN_CACHE_DIR restored — the test program's own (tests/support/catch_main.cpp), not unset,
// so later tests keep their hermetic cache.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace kiln::test {

class ScopedCacheDir {
public:
    ScopedCacheDir() {
        const char* tmp = std::getenv("TMPDIR");
        std::string t = std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln-test-dir-XXXXXX";
        if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
        path_ = t;
        owned_ = true;
        point_at_path();
    }
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

} // namespace kiln::test
