// Many writers and readers on one cache directory: threads sharing a DiskCache, and processes
// each with their own. A reader must only ever see nothing or one writer's complete binary.
#include "tests/support/catch.hpp"

#include "runtime/cache/disk_cache.hpp"
#include "tests/cache/cache_test_support.hpp"

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

using namespace kiln::cache;
using namespace kiln::cache::test;

namespace {

constexpr int kKeys = 50;
constexpr int kVariants = 4;   // writers store different (valid) binaries for the same key

int count_entries(const std::string& dir) {
    int n = 0;
    for (auto& e : fs::recursive_directory_iterator(dir))
        if (e.is_regular_file() && e.path().extension() == ".bin") ++n;
    return n;
}

} // namespace

TEST_CASE("threads sharing one cache see only complete entries") {
    TempDir t;
    DiskCache c(DiskCacheOptions{t.path(), "0.1.0-test"});
    constexpr int kThreads = 4, kRounds = 20;
    std::atomic<int> bad{0}, missing{0}, loads{0};
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th)
        threads.emplace_back([&, th] {
            std::mt19937 rng(static_cast<unsigned>(th));
            for (int round = 0; round < kRounds; ++round)
                for (int i = 0; i < kKeys; ++i) {
                    const int k = (i + th * 13) % kKeys;
                    c.store(make_key(k), make_binary(k, (th + round) % kVariants));
                    auto got = c.load(make_key(k));
                    ++loads;
                    if (!got) ++missing;   // nothing ever deletes an entry here
                    else if (!is_binary_of(*got, k, kVariants)) ++bad;
                    const int other = static_cast<int>(rng() % kKeys);
                    auto o = c.load(make_key(other));
                    ++loads;
                    if (o && !is_binary_of(*o, other, kVariants)) ++bad;
                }
        });
    for (auto& th : threads) th.join();
    CHECK(bad == 0);
    CHECK(missing == 0);
    const DiskCacheStats s = c.stats();
    CHECK(s.rejected == 0);
    CHECK(s.write_failures == 0);
    CHECK(s.writes == uint64_t(kThreads * kRounds * kKeys));
    CHECK(s.hits + s.misses + s.rejected == uint64_t(loads.load()));
    CHECK(count_temp_files(t.path()) == 0);
    CHECK(count_entries(t.path()) == kKeys);
}

TEST_CASE("8 processes storing and loading the same keys see only complete entries") {
    TempDir t;
    const std::string dir = t / "cache";
    constexpr int kProcs = 8, kRounds = 40;
    int gate[2];
    REQUIRE(::pipe(gate) == 0);
    std::fflush(nullptr);
    std::vector<pid_t> children;
    for (int p = 0; p < kProcs; ++p) {
        pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            // Child: no Catch2 here; the exit code says what went wrong.
            ::close(gate[1]);
            char byte;
            while (::read(gate[0], &byte, 1) < 0) {}   // released all at once when the parent closes the pipe
            int code = 0;
            try {
                DiskCache c(DiskCacheOptions{dir, "0.1.0-test"});
                std::mt19937 rng(static_cast<unsigned>(1000 + p));
                std::vector<int> order(kKeys);
                for (int i = 0; i < kKeys; ++i) order[static_cast<size_t>(i)] = i;
                for (int round = 0; round < kRounds; ++round) {
                    std::shuffle(order.begin(), order.end(), rng);
                    for (int k : order) {
                        auto before = c.load(make_key(k));
                        if (before && !is_binary_of(*before, k, kVariants)) code |= 1;
                        c.store(make_key(k), make_binary(k, (p + round + k) % kVariants));
                        auto after = c.load(make_key(k));
                        if (!after) code |= 2;   // stored just now; only replaced since, never removed
                        else if (!is_binary_of(*after, k, kVariants)) code |= 1;
                    }
                }
                const DiskCacheStats s = c.stats();
                if (s.rejected != 0) code |= 4;
                if (s.write_failures != 0 || s.writes != uint64_t(kRounds * kKeys)) code |= 8;
            } catch (...) {
                code |= 16;
            }
            ::_exit(code);
        }
        children.push_back(pid);
    }
    ::close(gate[0]);
    ::close(gate[1]);
    for (pid_t pid : children) {
        int status = 0;
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        REQUIRE(WIFEXITED(status));
        INFO("child " << pid << " exit code " << WEXITSTATUS(status)
                      << " (1: wrong bytes, 2: missing after store, 4: rejected entries, 8: write failures, 16: exception)");
        CHECK(WEXITSTATUS(status) == 0);
    }
    CHECK(count_temp_files(dir) == 0);
    CHECK(count_entries(dir) == kKeys);
    DiskCache c(DiskCacheOptions{dir, "0.1.0-test"});
    int good = 0;
    for (int k = 0; k < kKeys; ++k) {
        auto got = c.load(make_key(k));
        if (got && is_binary_of(*got, k, kVariants)) ++good;
    }
    CHECK(good == kKeys);
}
