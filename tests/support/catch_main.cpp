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

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

int main(int argc, char* argv[]) {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln-test-cache-XXXXXX";
    if (!::mkdtemp(dir.data())) {
        std::perror("kiln tests: cannot create a kernel cache directory (mkdtemp)");
        return 2;
    }
    ::setenv("KILN_CACHE_DIR", dir.c_str(), 1);
    const int result = Catch::Session().run(argc, argv);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return result;
}
