// The main() of every Catch2 test program. Each run gets a kernel cache of its own: a fresh
// KILN_CACHE_DIR, removed at the end, so that what one run stores (CUDA cubins, CPU objects)
// never turns the next run's compiles into disk hits, and the user's cache is neither read nor
// written. Tests that need a cache state of their own set KILN_CACHE_DIR themselves.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include "tests/support/cache_dir.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

int main(int argc, char* argv[]) {
    std::string dir;
    try {
        dir = kiln::test::make_temp_dir("kiln-test-cache");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kiln tests: cannot create a kernel cache directory (%s)\n", e.what());
        return 2;
    }
    ::setenv("KILN_CACHE_DIR", dir.c_str(), 1);
    const int result = Catch::Session().run(argc, argv);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return result;
}
