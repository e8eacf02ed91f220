// Kernel manifests (KILN_RECORD, Context::record_to) and KILN_ASSERT_NO_COMPILE on the CPU backend,
// with the kernel cache on disk empty and warm.
#include "tests/support/catch.hpp"

#include <fmt/format.h>
#include <kiln/kiln.hpp>

#include "compiler/kernel_text.hpp"
#include "compiler/key.hpp"
#include "runtime/manifest_line.hpp"
#include "tests/support/cache_dir.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace kiln;

namespace {

std::string temp_path(const char* tag) {
    return fmt::format("/tmp/kiln-manifest-{}-{}.jsonl", tag, (long)getpid());
}

std::vector<std::string> lines_of(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

void run_some_expressions(Context& ctx) {
    Tensor A = ctx.array(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
    Tensor C = ctx.empty({2, 1}), B = ctx.empty({2, 4});
    C[all] = mean(square(A - mean(A, 1)), 1);
    B[all] = reciprocal(sqrt(var(A, 1) + 0.001)) * (A - mean(A, 1));
    B[all] = A * 2.0 + 1.0;
    B[all] = A * 2.0 + 1.0;  // a plan-cache hit: nothing new to record
}

} // namespace

TEST_CASE("record_to appends each kernel once, as text that regenerates it") {
    const std::string path = temp_path("api");
    std::remove(path.c_str());
    Context ctx(ContextOptions{"cpu"});
    ctx.record_to(path);
    run_some_expressions(ctx);
    auto lines = lines_of(path);
    REQUIRE(lines.size() >= 3);
    std::set<std::string> names;
    for (const std::string& l : lines) {
        INFO(l);
        const ManifestLine ml = parse_manifest_line(l, path, 1);
        CHECK(ml.format == 1);
        CHECK(ml.kiln == KILN_VERSION);
        CHECK(ml.backend == "cpu");
        CHECK(ml.target.rfind("cpu-", 0) == 0);
        kir::Kernel k = parse_kernel_text(ml.kernel);
        CHECK(kernel_name_for(key_material(k, ml.target)) == ml.name);
        CHECK(names.insert(ml.name).second);  // each kernel once
    }
    // A second context appends; "" stops recording.
    Context other(ContextOptions{"cpu"});
    Tensor x = other.ones({3});
    other.record_to(path);
    x[all] = exp(x) * 3.0;
    other.record_to("");
    x[all] = log(x) * 3.0;
    CHECK(lines_of(path).size() == lines.size() + 1);
    std::remove(path.c_str());
}

TEST_CASE("KILN_RECORD records every context's kernels; an unwritable path, a FIFO nobody reads, a NUL are errors") {
    const std::string path = temp_path("env");
    std::remove(path.c_str());
    setenv("KILN_RECORD", path.c_str(), 1);
    {
        Context ctx(ContextOptions{"cpu"});
        run_some_expressions(ctx);
    }
    unsetenv("KILN_RECORD");
    CHECK(lines_of(path).size() >= 3);
    std::remove(path.c_str());
    Context ctx(ContextOptions{"cpu"});
    try {
        ctx.record_to("/nonexistent-dir/m.jsonl");
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("/nonexistent-dir/m.jsonl") != std::string::npos);
    }
    // A FIFO that no process reads: an error, not a wait for a reader that never comes.
    const std::string fifo = temp_path("fifo");
    std::remove(fifo.c_str());
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    try {
        ctx.record_to(fifo);
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("FIFO that no process reads") != std::string::npos);
    }
    // A FIFO whose reader goes away: the next line's write is an error (EPIPE), not SIGPIPE
    // ending the process, and no SIGPIPE is left pending.
    {
        const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
        REQUIRE(reader >= 0);
        Context rec(ContextOptions{"cpu"});
        rec.record_to(fifo);
        ::close(reader);
        try {
            run_some_expressions(rec);
            FAIL("no error");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("Broken pipe") != std::string::npos);
        }
        sigset_t pending;
        sigpending(&pending);
        CHECK(sigismember(&pending, SIGPIPE) == 0);
    }
    std::remove(fifo.c_str());
    // A path holding a NUL: an error, not a shorter path.
    try {
        ctx.record_to(std::string("m\0.jsonl", 8));
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(e.kind() == Error::Kind::Value);
        CHECK(std::string(e.what()).find("NUL") != std::string::npos);
    }
}

TEST_CASE("KILN_ASSERT_NO_COMPILE turns a compile into an error naming the kernel") {
    test::ScopedCacheDir cache_dir;   // empty: the kernel is nowhere
    setenv("KILN_ASSERT_NO_COMPILE", "1", 1);
    Context ctx(ContextOptions{"cpu"});
    unsetenv("KILN_ASSERT_NO_COMPILE");
    Tensor A = ctx.array(std::vector<float>(16, 1.0f), {4, 4});  // an upload: no kernel
    try {
        A[all] = A * 3.0 + 1.0;
        FAIL("compiled although KILN_ASSERT_NO_COMPILE was set");
    } catch (const Error& e) {
        const std::string m = e.what();
        CHECK(m.find("KILN_ASSERT_NO_COMPILE") != std::string::npos);
        CHECK(m.find("kernel kiln_") != std::string::npos);
        CHECK(m.find("KILN_RECORD") != std::string::npos);
    }
    CHECK(ctx.counters().compiles == 0);
    // Without the variable a context compiles as usual, and stores the object on disk...
    Context free_ctx(ContextOptions{"cpu"});
    Tensor B = free_ctx.array(std::vector<float>(16, 1.0f), {4, 4});
    B[all] = B * 3.0 + 1.0;
    CHECK(B.to_vector<float>()[0] == 4.0f);
    CHECK(free_ctx.counters().compiles == 1);
    // ...where a context that may not compile finds it.
    setenv("KILN_ASSERT_NO_COMPILE", "1", 1);
    Context warm_ctx(ContextOptions{"cpu"});
    unsetenv("KILN_ASSERT_NO_COMPILE");
    Tensor W = warm_ctx.array(std::vector<float>(16, 2.0f), {4, 4});
    W[all] = W * 3.0 + 1.0;
    CHECK(W.to_vector<float>()[5] == 7.0f);
    CHECK(warm_ctx.counters().compiles == 0);
    CHECK(warm_ctx.counters().disk_hits == 1);
}

TEST_CASE("KILN_RECORD records the kernels a context loads from the disk cache too") {
    test::ScopedCacheDir cache_dir;
    {
        Context ctx(ContextOptions{"cpu"});
        run_some_expressions(ctx);
        CHECK(ctx.counters().compiles >= 3);
    }
    const std::string path = temp_path("disk");
    std::remove(path.c_str());
    Context ctx(ContextOptions{"cpu"});
    ctx.record_to(path);
    run_some_expressions(ctx);
    CHECK(ctx.counters().compiles == 0);
    CHECK(ctx.counters().disk_hits >= 3);
    CHECK(lines_of(path).size() == ctx.counters().disk_hits);
    std::remove(path.c_str());
}
