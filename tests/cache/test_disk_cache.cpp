// The on-disk kernel cache never crashes and never returns a wrong binary: every damaged,
// foreign or stale file is a miss that is then replaced, an unwritable directory degrades to
// memory-only with one warning, and processes writing and reading the same keys at once see
// either nothing or exactly the right bytes.
#include "tests/support/catch.hpp"

#include "runtime/cache/disk_cache.hpp"
#include "runtime/cache/entry_format.hpp"
#include "runtime/cache/file_io.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

using namespace kiln::cache;
namespace fs = std::filesystem;

namespace {

struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/kiln-cache-test-XXXXXX";
        path = ::mkdtemp(tmpl);
    }
    ~TempDir() {
        std::error_code ec;
        fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
        fs::remove_all(path, ec);
    }
};

DiskCacheKey key(int i, const std::string& arch = "sm_90") {
    return DiskCacheKey{fmt::format("kernel {} structure\nlayout x1\ntarget {}", i, arch), arch, "nvrtc 13.0"};
}

std::vector<char> binary(int i, size_t n = 3000) {
    std::vector<char> b(n);
    std::mt19937 gen(i);
    for (char& c : b) c = (char)gen();
    return b;
}

void write_raw(const std::string& path, const std::vector<char>& bytes) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), (std::streamsize)bytes.size());
}

std::vector<char> read_raw(const std::string& path) { return read_file(path).value(); }

// Stores k, damages its file with `damage`, and checks that load misses (rejected), then that a
// recompile-and-store makes the next load return the right bytes again.
void require_rejected_then_replaced(DiskCache& c, const DiskCacheKey& k, const std::vector<char>& bin,
                                    const std::function<void(std::vector<char>&)>& damage) {
    c.store(k, bin);
    std::vector<char> file = read_raw(c.path_for(k));
    damage(file);
    write_raw(c.path_for(k), file);
    const uint64_t before = c.stats().rejected;
    CHECK_FALSE(c.load(k).has_value());
    CHECK(c.stats().rejected == before + 1);
    c.store(k, bin);
    auto again = c.load(k);
    REQUIRE(again.has_value());
    CHECK(*again == bin);
}

} // namespace

TEST_CASE("disk cache: store then load returns the same bytes; unknown keys miss") {
    TempDir d;
    DiskCache c({d.path, "0.1.0"});
    CHECK(c.enabled());
    CHECK_FALSE(c.load(key(1)).has_value());
    CHECK(c.stats().misses == 1);
    c.store(key(1), binary(1));
    auto got = c.load(key(1));
    REQUIRE(got.has_value());
    CHECK(*got == binary(1));
    CHECK(c.stats().hits == 1);
    CHECK(c.stats().writes == 1);
    // Subdirectory by hash prefix; no temporary file left behind.
    const fs::path p = c.path_for(key(1));
    CHECK(p.parent_path().filename().string() == p.stem().string().substr(0, 2));
    CHECK(p.parent_path().parent_path() == fs::path(d.path));
    int files = 0;
    for (auto& e : fs::recursive_directory_iterator(d.path)) files += e.is_regular_file();
    CHECK(files == 1);
    // An empty binary is an entry too.
    c.store(key(2), {});
    REQUIRE(c.load(key(2)).has_value());
    CHECK(c.load(key(2))->empty());
}

TEST_CASE("disk cache: a corrupted binary fails its checksum and is recompiled") {
    TempDir d;
    DiskCache c({d.path, "0.1.0"});
    require_rejected_then_replaced(c, key(3), binary(3), [](std::vector<char>& f) { f[f.size() - 100] ^= 0x20; });
    require_rejected_then_replaced(c, key(3), binary(3), [](std::vector<char>& f) { f.back() ^= 1; });
}

TEST_CASE("disk cache: truncated files are misses, wherever they end") {
    TempDir d;
    DiskCache c({d.path, "0.1.0"});
    const std::vector<char> bin = binary(4);
    c.store(key(4), bin);
    const size_t full = read_raw(c.path_for(key(4))).size();
    for (size_t len : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(20), size_t(47), size_t(48), size_t(60), full / 2,
                       full - 1}) {
        INFO("truncated to " << len << " of " << full);
        require_rejected_then_replaced(c, key(4), bin, [&](std::vector<char>& f) { f.resize(len); });
    }
    // Trailing garbage: the lengths no longer add up.
    require_rejected_then_replaced(c, key(4), bin, [](std::vector<char>& f) { f.push_back('x'); });
    // Absurd lengths in the header are refused before anything is read through them.
    require_rejected_then_replaced(c, key(4), bin, [](std::vector<char>& f) {
        for (int i = 0; i < 8; ++i) f[24 + i] = (char)0xff;   // material length
    });
}

TEST_CASE("disk cache: bad magic, other format, kiln version, toolchain or arch are misses") {
    TempDir d;
    DiskCache c({d.path, "0.1.0"});
    require_rejected_then_replaced(c, key(5), binary(5), [](std::vector<char>& f) { f[0] = 'X'; });
    require_rejected_then_replaced(c, key(5), binary(5), [](std::vector<char>& f) { f[8] = 9; });   // format 9
    // Same key written by another kiln version, another NVRTC, or for another arch.
    const DiskCacheKey k = key(6);
    auto foreign = [&](EntryFields f) {
        write_raw(c.path_for(k), encode_entry(f, binary(99)));
        const uint64_t before = c.stats().rejected;
        CHECK_FALSE(c.load(k).has_value());
        CHECK(c.stats().rejected == before + 1);
    };
    foreign(EntryFields{"0.0.9", k.toolchain, k.arch, k.material});
    foreign(EntryFields{"0.1.0", "nvrtc 12.4", k.arch, k.material});
    foreign(EntryFields{"0.1.0", k.toolchain, "sm_80", k.material});
    // A reader of another version sees the writer's file as foreign, and vice versa.
    c.store(k, binary(6));
    DiskCache older({d.path, "0.0.9"});
    CHECK(older.path_for(k) != c.path_for(k));   // the version is part of the hash
    write_raw(older.path_for(k), read_raw(c.path_for(k)));
    CHECK_FALSE(older.load(k).has_value());
    // The arch is part of both the hash and the header: the sm_80 entry is a different file.
    CHECK(c.path_for(key(6, "sm_80")) != c.path_for(key(6, "sm_90")));
}

TEST_CASE("disk cache: a hash collision (same file, different key material) is a miss") {
    TempDir d;
    DiskCache c({d.path, "0.1.0"});
    const DiskCacheKey k1 = key(7), k2 = key(8);
    write_raw(c.path_for(k1), encode_entry(EntryFields{"0.1.0", k2.toolchain, k2.arch, k2.material}, binary(8)));
    CHECK_FALSE(c.load(k1).has_value());
    CHECK(c.stats().rejected == 1);
}

TEST_CASE("disk cache: an unwritable directory degrades to memory-only; existing entries still load") {
    TempDir d;
    {
        DiskCache c({d.path, "0.1.0"});
        c.store(key(9), binary(9));
    }
    // A cache directory below a regular file can never be created, whoever runs the test (root
    // ignores permission bits, so a chmod-based read-only directory would not be read-only).
    const std::string blocker = d.path + "/not-a-directory";
    write_raw(blocker, {'x'});
    DiskCache broken({blocker + "/cache", "0.1.0"});
    CHECK(broken.enabled());
    broken.store(key(10), binary(10));
    CHECK_FALSE(broken.enabled());
    broken.store(key(11), binary(11));   // no second attempt, no second warning
    CHECK(broken.stats().write_failures == 1);
    CHECK(broken.stats().writes == 0);
    CHECK_FALSE(broken.load(key(10)).has_value());
    CHECK(broken.save_source("k", "int x;").empty());

    // Read-only directory: when not root, chmod makes writes fail while loads keep working.
    if (::geteuid() != 0) {
        fs::permissions(d.path, fs::perms::owner_read | fs::perms::owner_exec, fs::perm_options::replace);
        for (auto& e : fs::directory_iterator(d.path))
            if (e.is_directory()) fs::permissions(e.path(), fs::perms::owner_read | fs::perms::owner_exec, fs::perm_options::replace);
        DiskCache ro({d.path, "0.1.0"});
        auto got = ro.load(key(9));
        REQUIRE(got.has_value());
        CHECK(*got == binary(9));
        ro.store(key(12), binary(12));
        CHECK_FALSE(ro.enabled());
    } else {
        // Root: a disabled cache must still serve loads from the directory it was given.
        DiskCache c({d.path, "0.1.0"});
        c.store(key(9), binary(9));
        DiskCache ro({d.path, "0.1.0"});
        write_raw(d.path + "/zz", {'x'});
        std::string why;
        CHECK_FALSE(write_file_atomic(d.path + "/zz/entry.bin", "y", 1, &why));
        CHECK_FALSE(why.empty());
        auto got = ro.load(key(9));
        REQUIRE(got.has_value());
        CHECK(*got == binary(9));
    }
}

TEST_CASE("disk cache: 8 processes storing and loading the same keys at once") {
    TempDir d;
    constexpr int kProcs = 8, kKeys = 50, kRounds = 6;
    std::vector<pid_t> kids;
    for (int p = 0; p < kProcs; ++p) {
        const pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            int bad = 0;
            DiskCache c({d.path, "0.1.0"});
            for (int r = 0; r < kRounds; ++r)
                for (int i = 0; i < kKeys; ++i) {
                    const int k = (i * 7 + p * 13 + r) % kKeys;
                    if (auto got = c.load(key(k))) bad += *got != binary(k, 3000 + 97 * k);
                    else c.store(key(k), binary(k, 3000 + 97 * k));
                    if ((i + p) % 5 == 0) c.store(key(k), binary(k, 3000 + 97 * k));   // rewrite a present key
                }
            ::_exit(bad == 0 && c.enabled() ? 0 : 1);
        }
        kids.push_back(pid);
    }
    for (pid_t pid : kids) {
        int status = 0;
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
    }
    DiskCache c({d.path, "0.1.0"});
    for (int k = 0; k < kKeys; ++k) {
        auto got = c.load(key(k));
        REQUIRE(got.has_value());
        CHECK(*got == binary(k, 3000 + 97 * k));
    }
    int leftovers = 0;
    for (auto& e : fs::recursive_directory_iterator(d.path))
        leftovers += e.path().string().find(".tmp.") != std::string::npos;
    CHECK(leftovers == 0);
}

TEST_CASE("disk cache: directory from KILN_CACHE_DIR, XDG_CACHE_HOME or HOME") {
    auto saved = [](const char* n) { const char* v = std::getenv(n); return v ? std::optional<std::string>(v) : std::nullopt; };
    auto restore = [](const char* n, const std::optional<std::string>& v) {
        if (v) ::setenv(n, v->c_str(), 1);
        else ::unsetenv(n);
    };
    const auto kd = saved("KILN_CACHE_DIR"), xdg = saved("XDG_CACHE_HOME"), home = saved("HOME");
    ::setenv("KILN_CACHE_DIR", "/a/kiln-dir", 1);
    ::setenv("XDG_CACHE_HOME", "/b/xdg", 1);
    ::setenv("HOME", "/c/home", 1);
    CHECK(default_cache_dir() == "/a/kiln-dir");
    ::unsetenv("KILN_CACHE_DIR");
    CHECK(default_cache_dir() == "/b/xdg/kiln");
    ::unsetenv("XDG_CACHE_HOME");
    CHECK(default_cache_dir() == "/c/home/.cache/kiln");
    ::unsetenv("HOME");
    CHECK(default_cache_dir().empty());
    DiskCache none({"", "0.1.0"});
    CHECK_FALSE(none.enabled());
    CHECK_FALSE(none.load(key(1)).has_value());
    restore("KILN_CACHE_DIR", kd);
    restore("XDG_CACHE_HOME", xdg);
    restore("HOME", home);
}

TEST_CASE("disk cache: sources are saved under <dir>/sources") {
    TempDir d;
    DiskCache c({d.path, "0.1.0"});
    const std::string p = c.save_source("kiln_abc", "extern \"C\" __global__ void kiln_abc() {}\n");
    CHECK(p == d.path + "/sources/kiln_abc.cu");
    auto text = read_file(p);
    REQUIRE(text.has_value());
    CHECK(std::string(text->begin(), text->end()) == "extern \"C\" __global__ void kiln_abc() {}\n");
}
