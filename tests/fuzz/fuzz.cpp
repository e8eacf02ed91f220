#include "tests/fuzz/fuzz.hpp"

#include "ir/error.hpp"
#include "tests/support/catch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sys/resource.h>
#include <unistd.h>

namespace kiln::fuzz {

namespace {

constexpr uint64_t kDefaultSeed = 0x6b696c6e66757a7aull;   // "kilnfuzz"
constexpr size_t kMaxInputLength = 1 << 16;
constexpr unsigned kSecondsPerInput = 10;                   // SIGALRM after that: a hang
constexpr size_t kAddressSpace = size_t(8) << 30;           // RLIMIT_AS of the test process

struct Settings {
    uint64_t seed = kDefaultSeed;
    int64_t inputs = -1;   // -1: the target's default
    bool verbose = false;
};

std::optional<long long> env_number(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) return std::nullopt;
    long long n = 0;
    auto [p, ec] = std::from_chars(v, v + std::strlen(v), n);
    if (ec != std::errc() || *p != '\0') FAIL(fmt::format("{}={} is not a number", name, v));
    return n;
}

Settings settings() {
    Settings s;
    if (auto v = env_number("KILN_FUZZ_SEED")) s.seed = (uint64_t)*v;
    if (auto v = env_number("KILN_FUZZ_INPUTS")) s.inputs = *v;
    if (auto v = env_number("KILN_FUZZ_VERBOSE")) s.verbose = *v != 0;
    return s;
}

// What the signal handler prints: which input was running, formatted before it ran.
char g_running[512];

extern "C" void on_fatal_signal(int sig) {
    const char* what = sig == SIGALRM ? "ran for too long" : "crashed";
    (void)!::write(2, "\n", 1);
    (void)!::write(2, g_running, std::strlen(g_running));
    (void)!::write(2, what, std::strlen(what));
    (void)!::write(2, "\n", 1);
    ::_exit(70);
}

void install_guards() {
    static bool done = false;
    if (done) return;
    done = true;
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) std::signal(sig, on_fatal_signal);
#if !defined(__SANITIZE_ADDRESS__)  // AddressSanitizer reserves terabytes of shadow address space
    rlimit r{};
    if (::getrlimit(RLIMIT_AS, &r) == 0 && (r.rlim_cur == RLIM_INFINITY || r.rlim_cur > kAddressSpace)) {
        r.rlim_cur = kAddressSpace;
        ::setrlimit(RLIMIT_AS, &r);
    }
#endif
}

// Numbers a count, an index or a length field could hold at its edges.
const char* const kNumbers[] = {"0",     "1",     "-1",     "2",     "7",          "46",         "47",
                                "63",    "64",    "65",     "255",   "1024",       "1025",       "4096",
                                "4097",  "65536", "65537",  "2147483647", "-2147483648", "2147483648",
                                "4294967295", "18446744073709551615", "99999999999999999999999"};

std::string mutate_once(Rng& r, std::string s, const std::vector<std::string>& seeds, const std::string& alphabet) {
    auto pos = [&](bool end_ok) { return (size_t)r.below(s.size() + (end_ok ? 1 : 0)); };
    auto any_char = [&]() -> char {
        if (!alphabet.empty() && r.chance(70)) return alphabet[r.below(alphabet.size())];
        return (char)r.below(256);
    };
    switch (r.below(10)) {
    case 0:   // flip a bit
        if (!s.empty()) s[pos(false)] ^= (char)(1u << r.below(8));
        break;
    case 1:   // overwrite a byte
        if (!s.empty()) s[pos(false)] = any_char();
        break;
    case 2: {  // delete a range
        if (s.empty()) break;
        const size_t at = pos(false);
        s.erase(at, 1 + r.below(16));
        break;
    }
    case 3: {  // insert bytes
        const size_t at = pos(true), n = 1 + r.below(8);
        for (size_t i = 0; i < n; ++i) s.insert(s.begin() + (std::ptrdiff_t)at, any_char());
        break;
    }
    case 4: {  // copy a range elsewhere, sometimes many times (counts grow)
        if (s.empty()) break;
        const size_t from = pos(false), len = 1 + r.below(std::min<size_t>(64, s.size() - from));
        const std::string chunk = s.substr(from, len);
        const size_t times = r.chance(20) ? 1 + r.below(200) : 1;
        const size_t at = pos(true);
        std::string rep;
        for (size_t i = 0; i < times; ++i) rep += chunk;
        s.insert(at, rep);
        break;
    }
    case 5:
    case 6: {  // replace a number with one at an edge
        std::vector<std::pair<size_t, size_t>> numbers;
        for (size_t i = 0; i < s.size();) {
            if (std::isdigit((unsigned char)s[i])) {
                size_t j = i;
                while (j < s.size() && std::isdigit((unsigned char)s[j])) ++j;
                numbers.emplace_back(i, j - i);
                i = j;
            } else {
                ++i;
            }
        }
        if (numbers.empty()) break;
        const auto [at, len] = numbers[r.below(numbers.size())];
        s.replace(at, len, kNumbers[r.below(std::size(kNumbers))]);
        break;
    }
    case 7:   // truncate
        s.resize(pos(true));
        break;
    case 8: {  // splice with another valid input
        const std::string& other = seeds[r.below(seeds.size())];
        s = s.substr(0, pos(true)) + other.substr(r.below(other.size() + 1));
        break;
    }
    default: {  // swap two bytes
        if (s.size() < 2) break;
        std::swap(s[pos(false)], s[pos(false)]);
        break;
    }
    }
    if (s.size() > kMaxInputLength) s.resize(kMaxInputLength);
    return s;
}

std::string make_input(Rng& r, const Target& t) {
    const unsigned kind = (unsigned)r.below(100);
    if (kind < 5) {   // random bytes
        std::string s(r.below(256), '\0');
        for (char& c : s) c = (char)r.below(256);
        return s;
    }
    if (kind < 10) {   // random characters of the format
        std::string s(r.below(256), '\0');
        for (char& c : s) c = t.alphabet.empty() ? (char)r.below(256) : t.alphabet[r.below(t.alphabet.size())];
        return s;
    }
    std::string s = t.seeds[r.below(t.seeds.size())];
    if (kind < 13) return s;   // unchanged: must be accepted
    for (uint64_t i = 0, n = 1 + r.below(4); i < n; ++i) s = mutate_once(r, std::move(s), t.seeds, t.alphabet);
    return s;
}

} // namespace

std::string shown(std::string_view input) {
    std::string out = "\"";
    for (char c : input) {
        if (c == '"' || c == '\\') out += fmt::format("\\{}", c);
        else if (c >= 0x20 && c < 0x7f) out += c;
        else out += fmt::format("\\x{:02x}", (unsigned char)c);
    }
    return out + "\"";
}

void run_target(const Target& t) {
    install_guards();
    const Settings s = settings();
    const int64_t inputs = s.inputs >= 0 ? s.inputs : t.default_inputs;
    REQUIRE(!t.seeds.empty());
    for (const std::string& seed : t.seeds) {   // every valid input is accepted
        INFO(t.name << ": valid input " << shown(seed));
        CHECK(t.run(seed));
    }
    uint64_t target_hash = 1469598103934665603ull;
    for (const char* p = t.name; *p; ++p) target_hash = (target_hash ^ (unsigned char)*p) * 1099511628211ull;
    int64_t accepted = 0, refused = 0;
    size_t worst_alloc = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < inputs; ++i) {
        Rng r{s.seed ^ target_hash ^ ((uint64_t)i * 0xd1342543de82ef95ull)};
        const std::string input = make_input(r, t);
        std::snprintf(g_running, sizeof g_running,
                      "fuzz: %s: input %lld of seed %llu (replay: KILN_FUZZ_SEED=%llu KILN_FUZZ_INPUTS=%lld "
                      "KILN_FUZZ_VERBOSE=1, the last input printed) ",
                      t.name, (long long)i, (unsigned long long)s.seed, (unsigned long long)s.seed, (long long)i + 1);
        if (s.verbose) {
            std::printf("fuzz: %s: input %lld: %s\n", t.name, (long long)i, shown(input).c_str());
            std::fflush(stdout);
        }
        auto failure = [&](const std::string& what) {
            ::alarm(0);
            FAIL(fmt::format("{}{}\ninput: {}", g_running, what, shown(input)));
        };
        const size_t before = live_bytes();
        reset_peak_bytes();
        ::alarm(kSecondsPerInput);
        const auto start = std::chrono::steady_clock::now();
        try {
            (t.run(input) ? accepted : refused) += 1;
        } catch (const Error& e) {
            ++refused;
            const std::string m = e.what();
            if (m.rfind(t.error_prefix, 0) != 0 || m.size() <= t.error_prefix.size())
                failure(fmt::format("refused with a kiln::Error that does not start \"{}\": {}", t.error_prefix, m));
        } catch (const std::exception& e) {
            failure(fmt::format("threw something other than a kiln::Error: {}", e.what()));
        } catch (...) {
            failure("threw something other than a std::exception");
        }
        ::alarm(0);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (secs > 5.0) failure(fmt::format("took {:.1f} s", secs));
        const size_t peak = peak_bytes_since_reset() - std::min(before, peak_bytes_since_reset());
        worst_alloc = std::max(worst_alloc, peak);
        if (peak > t.max_alloc_bytes) failure(fmt::format("allocated {} bytes at once (bound {})", peak, t.max_alloc_bytes));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("fuzz: %s: %lld inputs (seed %llu): %lld accepted, %lld refused; at most %zu KiB allocated by one; "
                "%.1f s\n",
                t.name, (long long)inputs, (unsigned long long)s.seed, (long long)accepted, (long long)refused,
                worst_alloc / 1024, secs);
    std::fflush(stdout);
}

} // namespace kiln::fuzz
