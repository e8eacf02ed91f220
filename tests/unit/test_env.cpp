// Environment variables (compiler/env.hpp): the parsers accept exactly the valid values and name
// the variable, the value and the valid values otherwise; a reader warns once per variable and
// then treats the value as unset.
#include "tests/support/catch.hpp"

#include "compiler/env.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

using namespace kiln;

namespace {

// What `f` writes to stderr.
template <class F>
std::string captured_stderr(F f) {
    std::fflush(stderr);
    FILE* tmp = std::tmpfile();
    REQUIRE(tmp != nullptr);
    const int saved = ::dup(2);
    ::dup2(::fileno(tmp), 2);
    f();
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    std::string out;
    std::rewind(tmp);
    for (int c; (c = std::fgetc(tmp)) != EOF;) out += (char)c;
    std::fclose(tmp);
    return out;
}

} // namespace

TEST_CASE("env: a choice is one of its values exactly") {
    auto p = env::parse_choice("KILN_LOG", "info", {"error", "warn", "info", "debug"});
    CHECK(p.value == 2);
    CHECK(p.problem.empty());
    for (const char* bad : {"INFO", "info ", "", "verbose", "in"}) {
        p = env::parse_choice("KILN_LOG", bad, {"error", "warn", "info", "debug"});
        CHECK(!p.value);
        CHECK(p.problem == fmt::format("KILN_LOG='{}' is not understood; valid: error, warn, info, debug", bad));
    }
    // Control and non-ASCII bytes are escaped, long values cut.
    p = env::parse_choice("KILN_X", "a\nb\xff", {"y"});
    CHECK(p.problem == "KILN_X='a\\x0ab\\xff' is not understood; valid: y");
    p = env::parse_choice("KILN_X", std::string(100, 'z'), {"y"});
    CHECK(p.problem == "KILN_X='" + std::string(64, 'z') + "...' is not understood; valid: y");
}

TEST_CASE("env: an integer is decimal digits in its range and nothing else") {
    CHECK(env::parse_integer("KILN_NUM_THREADS", "8", 1, 4096).value == 8);
    CHECK(env::parse_integer("KILN_NUM_THREADS", "4096", 1, 4096).value == 4096);
    for (const char* bad : {"0", "4097", "-1", "+2", " 2", "2 ", "2x", "0x10", "", "99999999999999999999999", "1e3"}) {
        INFO(bad);
        const auto p = env::parse_integer("KILN_NUM_THREADS", bad, 1, 4096);
        CHECK(!p.value);
        CHECK(p.problem ==
              fmt::format("KILN_NUM_THREADS='{}' is not understood; valid: an integer from 1 to 4096", bad));
    }
}

TEST_CASE("env: a flag is 1/true/yes/on or 0/false/no/off") {
    for (const char* on : {"1", "true", "yes", "on"}) CHECK(env::parse_flag("KILN_PDL", on).value == true);
    for (const char* off : {"0", "false", "no", "off"}) CHECK(env::parse_flag("KILN_PDL", off).value == false);
    const auto p = env::parse_flag("KILN_PDL", "2");
    CHECK(!p.value);
    CHECK(p.problem == "KILN_PDL='2' is not understood; valid: 0, 1, false, true, no, yes, off, on");
}

TEST_CASE("env: a value that is not valid is warned about once per variable, then counts as unset") {
    ::setenv("KILN_TEST_ENV_FLAG", "maybe", 1);
    ::setenv("KILN_TEST_ENV_COUNT", "lots", 1);
    std::optional<bool> f1, f2;
    std::optional<long long> n;
    const std::string err = captured_stderr([&] {
        f1 = env::flag("KILN_TEST_ENV_FLAG");
        f2 = env::flag("KILN_TEST_ENV_FLAG");
        n = env::integer("KILN_TEST_ENV_COUNT", 1, 8);
    });
    CHECK(!f1);
    CHECK(!f2);
    CHECK(!n);
    CHECK(err == "kiln[warn] KILN_TEST_ENV_FLAG='maybe' is not understood; valid: 0, 1, false, true, no, yes, off, on; it "
                 "is ignored\n"
                 "kiln[warn] KILN_TEST_ENV_COUNT='lots' is not understood; valid: an integer from 1 to 8; it is ignored\n");
    // Valid, empty and unset values say nothing.
    ::setenv("KILN_TEST_ENV_FLAG", "on", 1);
    ::setenv("KILN_TEST_ENV_COUNT", "", 1);
    const std::string quiet = captured_stderr([&] {
        f1 = env::flag("KILN_TEST_ENV_FLAG");
        n = env::integer("KILN_TEST_ENV_COUNT", 1, 8);
        CHECK(!env::choice("KILN_TEST_ENV_UNSET", {"a"}));
    });
    CHECK(f1 == true);
    CHECK(!n);
    CHECK(quiet.empty());
    ::unsetenv("KILN_TEST_ENV_FLAG");
    ::unsetenv("KILN_TEST_ENV_COUNT");
}
