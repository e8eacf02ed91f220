// CPU backend, the JIT itself: memory cache and counters, concurrent compiles, malformed
// kernels, and that the optimised code of the common shapes is vectorised.
#include "tests/support/catch.hpp"
#include "tests/unit/llvm/cpu_support.hpp"

#include "runtime/cpu/thread_pool.hpp"

#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <thread>

#include <csignal>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace kiln;
using namespace kiln::test;

namespace {

kir::Kernel axpy_kernel(const std::string& name) {
    KernelBuilder kb(name, "P");
    int o = kb.buffer(DType::Float32, {SK::One}, true);
    int x = kb.buffer(DType::Float32, {SK::One});
    int y = kb.buffer(DType::Float32, {SK::One});
    kb.loop();
    kb.store(o, kb.op(Op::Add, CT::F32, kb.op(Op::Mul, CT::F32, kb.paramf(0), kb.load(x)), kb.load(y)));
    return kb.kernel();
}

bool has_float_vectors(const std::string& ir) { return ir.find(" x float>") != std::string::npos; }

} // namespace

TEST_CASE("cpu jit: the memory cache answers a second compile of a key") {
    cpu::CpuJit jit(1);
    kir::Kernel k = axpy_kernel("cache_axpy");
    const cpu::CpuKernel* first = jit.compile(k, "key-a");
    CHECK(jit.counters().compiles == 1);
    CHECK(jit.counters().memory_hits == 0);
    CHECK(jit.counters().compile_ms > 0);
    CHECK(jit.compile(k, "key-a") == first);
    CHECK(jit.counters().compiles == 1);
    CHECK(jit.counters().memory_hits == 1);

    // Another key with the same kernel name compiles to a separate symbol; both still run.
    const cpu::CpuKernel* second = jit.compile(k, "key-b");
    CHECK(second != first);
    CHECK(jit.counters().compiles == 2);
    std::vector<float> x = {1, 2, 3}, y = {10, 20, 30}, o(3);
    Launch l({3});
    l.buffer(o.data(), {1}).buffer(x.data(), {1}).buffer(y.data(), {1}).fparam(2);
    jit.launch(second, l.args);
    CHECK(o == std::vector<float>{12, 24, 36});
    jit.launch(first, l.args);
    CHECK(o == std::vector<float>{12, 24, 36});

    jit.reset_counters();
    CHECK(jit.counters().compiles == 0);
    CHECK(jit.counters().memory_hits == 0);
    CHECK(jit.counters().compile_ms == 0);
}

TEST_CASE("cpu jit: concurrent compiles of one key compile once") {
    cpu::CpuJit jit(2);
    kir::Kernel k = axpy_kernel("concurrent_axpy");
    std::vector<const cpu::CpuKernel*> got(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = jit.compile(k, "same-key"); });
    for (auto& t : threads) t.join();
    for (auto* g : got) CHECK(g == got[0]);
    CHECK(jit.counters().compiles == 1);
    CHECK(jit.counters().memory_hits == 3);
}

TEST_CASE("cpu jit: a malformed kernel is an internal error") {
    // A Loop block's value read by a later block is out of scope.
    KernelBuilder kb("bad_scope", "PR");
    int o = kb.buffer(DType::Float32, {SK::One, SK::Zero}, true);
    int x = kb.buffer(DType::Float32, {SK::Any, SK::One});
    kb.loop();
    int lx = kb.load(x);
    kb.accum(AccKind::Sum, lx);
    kb.point();
    kb.store(o, lx);
    cpu::CpuJit jit(1);
    CHECK_THROWS_AS(jit.compile(kb.kernel(), "bad"), std::logic_error);
    CHECK_THROWS_AS(cpu::llvm_ir_text(kb.kernel()), std::logic_error);
    CHECK(jit.counters().compiles == 0);
}

TEST_CASE("cpu jit: launch arguments must match the kernel") {
    kir::Kernel k = axpy_kernel("args_axpy");
    float o = 0;
    Launch l({1});
    l.buffer(&o, {1});  // two buffers missing
    CHECK_THROWS_AS(shared_jit().launch(shared_jit().compile(k, k.name), l.args), std::logic_error);
}

TEST_CASE("cpu jit: inner loops vectorise") {
    SECTION("elementwise") {
        std::string ir = cpu::llvm_ir_text(axpy_kernel("vec_axpy"), true);
        CHECK(has_float_vectors(ir));
        CHECK(cpu::llvm_ir_text(axpy_kernel("vec_axpy")).find("define void @vec_axpy(") != std::string::npos);
    }
    SECTION("row sum (reassociated)") {
        KernelBuilder kb("vec_rowsum", "PR");
        int o = kb.buffer(DType::Float32, {SK::One, SK::Zero}, true);
        int x = kb.buffer(DType::Float32, {SK::Any, SK::One});
        kb.loop();
        int s = kb.accum(AccKind::Sum, kb.load(x));
        kb.point();
        kb.store(o, kb.acc_result(s));
        CHECK(has_float_vectors(cpu::llvm_ir_text(kb.kernel(), true)));
    }
    SECTION("row max (NaN-propagating)") {
        KernelBuilder kb("vec_rowmax", "PR");
        int o = kb.buffer(DType::Float32, {SK::One, SK::Zero}, true);
        int x = kb.buffer(DType::Float32, {SK::Any, SK::One});
        kb.loop();
        int s = kb.accum(AccKind::Max, kb.load(x));
        kb.point();
        kb.store(o, kb.acc_result(s));
        std::string ir = cpu::llvm_ir_text(kb.kernel(), true);
        CHECK((ir.find(" x i32>") != std::string::npos || has_float_vectors(ir)));
    }
    SECTION("column sum (tiled)") {
        KernelBuilder kb("vec_colsum", "RP");
        int o = kb.buffer(DType::Float32, {SK::Zero, SK::One}, true);
        int x = kb.buffer(DType::Float32, {SK::Any, SK::One});
        kb.loop();
        int s = kb.accum(AccKind::Sum, kb.load(x));
        kb.point();
        kb.store(o, kb.acc_result(s));
        CHECK(has_float_vectors(cpu::llvm_ir_text(kb.kernel(), true)));
    }
    SECTION("float16 to float32") {
        KernelBuilder kb("vec_f16", "P");
        int o = kb.buffer(DType::Float16, {SK::One}, true);
        int x = kb.buffer(DType::Float16, {SK::One});
        kb.loop();
        kb.store(o, kb.op(Op::Mul, CT::F32, kb.load(x), kb.constf(3)));
        CHECK(cpu::llvm_ir_text(kb.kernel(), true).find(" x i16>") != std::string::npos);
    }
}

TEST_CASE("cpu jit: launches from several threads share the pool") {
    cpu::CpuJit jit(3);
    const cpu::CpuKernel* k = jit.compile(axpy_kernel("threads_axpy"), "threads_axpy");
    const int64_t n = 200003;  // large enough to be split into tasks
    auto x = random_floats(n, -1, 1, 81), y = random_floats(n, -1, 1, 82);
    std::vector<std::vector<float>> out(4, std::vector<float>(n));
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int rep = 0; rep < 5; ++rep) {
                Launch l({n});
                l.buffer(out[t].data(), {1}).buffer(x.data(), {1}).buffer(y.data(), {1}).fparam((float)(t + 1));
                jit.launch(k, l.args);
            }
        });
    for (auto& t : threads) t.join();
    int bad = 0;
    for (int t = 0; t < 4; ++t)
        for (int64_t i = 0; i < n; ++i) bad += out[t][i] != (float)(t + 1) * x[i] + y[i];
    CHECK(bad == 0);
}

TEST_CASE("cpu thread pool: a system that starts fewer threads than asked leaves a smaller pool that works") {
    // In a child process whose address space has room for few thread stacks: the pool keeps the
    // workers the system started (it used to end the process with std::terminate), and a job
    // still covers every index.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        long pages = 0;
        if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
            if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
            std::fclose(f);
        }
        const rlim_t room = (rlim_t)pages * (rlim_t)::sysconf(_SC_PAGESIZE) + (rlim_t(256) << 20);
        const rlimit limit{room, room};
        if (pages == 0 || ::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(3);
        int code = 0;
        try {
            cpu::ThreadPool pool(cpu::kMaxThreads);
            if (pool.size() >= cpu::kMaxThreads || pool.size() < 1) code = 4;
            std::atomic<int64_t> sum{0};
            pool.parallel_for(1000, [&](int64_t i) { sum += i; });
            if (sum != 999 * 1000 / 2) code = 5;
        } catch (...) {
            code = 6;
        }
        ::_exit(code);
    }
    // (A child stuck for a minute fails the case rather than hanging the suite.)
    int status = 0;
    pid_t got = 0;
    for (int waited = 0; (got = ::waitpid(child, &status, WNOHANG)) == 0 && waited < 600; ++waited) ::usleep(100000);
    if (got == 0) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
        FAIL("the child did not end within 60 s");
    }
    REQUIRE(got == child);
    INFO("status " << status);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}
