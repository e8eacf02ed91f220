// The DeviceBackend interface (runtime/backend.hpp) as the Context uses it, for each host
// backend (the CPU JIT and the kernel-IR interpreter): memory round trips, compile + launch of a
// lowered stage, memory-cache hits and counters, refused compiles, retirement past the cache's
// capacity; the interpreter compiles nothing, so KILN_ASSERT_NO_COMPILE does not apply to it.
#include "tests/support/cache_dir.hpp"
#include "tests/support/catch.hpp"
#include "tests/support/error_message.hpp"

#include <kiln/kiln.hpp>

#include "compiler/pipeline.hpp"
#include "ir/error.hpp"
#include "ir/node.hpp"
#include "runtime/backend.hpp"
#include "runtime/host_backend.hpp"

#include <cstring>
#include <random>
#include <vector>

using namespace kiln;

namespace {

View backend_view(DeviceBackend& be, Shape shape) {
    View v;
    v.storage = be.allocate((size_t)numel(shape) * sizeof(float), "test");
    v.dtype = DType::Float32;
    v.shape = shape;
    v.strides = contiguous_strides(shape);
    return v;
}

// dst = e through the passes, then compiled and launched by `be`; the stage's handle.
KernelHandle run(DeviceBackend& be, const Expr& e, const View& dst) {
    CompiledAssignment ca = compile_assignment(e.node(), dst, be.target());
    REQUIRE(ca.stages.size() == 1);
    LoweredStage& st = ca.stages[0];
    KernelHandle k = be.compile(st.kernel, st.key);
    for (size_t b = 0; b < st.sources.size(); ++b) {
        const View& v = st.sources[b].view;
        st.args.buffers[b] = static_cast<char*>(v.storage->data) + v.offset * (int64_t)dtype_size(v.dtype);
    }
    be.launch(k, st.args);
    be.synchronize();
    return k;
}

} // namespace

TEST_CASE("each host backend compiles, caches, launches and retires through the one interface") {
    test::ScopedCacheDir cache;
    for (bool interpreter : {false, true}) {
        INFO((interpreter ? "interpreter" : "host backend"));
        std::unique_ptr<DeviceBackend> be = interpreter ? make_interpreter_backend() : make_host_backend();
        CHECK(be->device() == Device{DeviceKind::CPU, 0});
        CHECK(be->name() == "cpu");
        CHECK(be->stream() == 0);

        std::vector<float> host(64 * 32);
        std::mt19937 rng(3);
        std::uniform_real_distribution<float> dist(-4, 4);
        for (float& x : host) x = dist(rng);
        View A = backend_view(*be, {64, 32}), B = backend_view(*be, {64, 32}), S = backend_view(*be, {64, 1});
        be->write(*A.storage, 0, host.data(), host.size() * sizeof(float));
        std::vector<float> back(host.size());
        be->read(*A.storage, 0, back.data(), back.size() * sizeof(float));
        CHECK(std::memcmp(back.data(), host.data(), host.size() * sizeof(float)) == 0);

        const Expr a = leaf(A);
        KernelHandle k1 = run(*be, a * 2.0 + 1.0, B);
        be->read(*B.storage, 0, back.data(), back.size() * sizeof(float));
        for (size_t i = 0; i < host.size(); ++i) REQUIRE(back[i] == host[i] * 2.0f + 1.0f);
        BackendCounters c = be->counters();
        CHECK(c.compiles + c.disk_hits == 1);
        CHECK(c.memory_hits == 0);
        CHECK(c.cached_kernels == 1);

        CHECK(run(*be, a * 2.0 + 1.0, B) == k1);   // the same key: the memory cache's kernel
        CHECK(be->counters().memory_hits == 1);
        be->reset_counters();
        CHECK(be->counters().memory_hits == 0);

        // A second kernel past a capacity of one retires the first; released, it is gone.
        be->set_kernel_cache_capacity(1);
        KernelHandle k2 = run(*be, sum(a, 1), S);
        std::vector<float> sums(64);
        be->read(*S.storage, 0, sums.data(), sums.size() * sizeof(float));
        for (int r = 0; r < 64; ++r) {
            double want = 0;
            for (int j = 0; j < 32; ++j) want += host[r * 32 + j];
            REQUIRE(sums[r] == Approx(want).margin(1e-4));
        }
        std::unordered_set<KernelHandle> retired;
        be->retired_kernels(retired);
        CHECK(retired == std::unordered_set<KernelHandle>{k1});
        be->release_retired({k2});
        retired.clear();
        be->retired_kernels(retired);
        CHECK(retired.empty());
        CHECK(be->counters().cached_kernels == 1);

        // Refused compiles name the switch; cached kernels still run. The interpreter compiles
        // nothing, so it has nothing to refuse.
        be->forbid_compiles(true);
        CHECK(run(*be, sum(a, 1), S) == k2);
        if (interpreter) {
            run(*be, a - 3.0, B);
            be->read(*B.storage, 0, back.data(), back.size() * sizeof(float));
            CHECK(back[5] == host[5] - 3.0f);
            continue;
        }
        try {
            run(*be, a - 3.0, B);
            FAIL("compiled although compiles were refused");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("KILN_ASSERT_NO_COMPILE is set, but kernel kiln_") != std::string::npos);
        }
    }
}

TEST_CASE("timing marks: recorded in order, timed, and every misuse named") {
    Context ctx(ContextOptions{"cpu"}), other(ContextOptions{"cpu"});
    Mark start = ctx.init_mark(), end = ctx.init_mark();
    CHECK(!start.recorded());
    CHECK_THROWS_WITH(ctx.elapsed_ms(start, end), Catch::Matchers::Contains("get_time: the start mark was never recorded"));
    ctx.record_mark(start);
    Tensor a = ctx.zeros({512, 512}, DType::Float32);
    for (int i = 0; i < 20; ++i) a = a + 1.0f;
    ctx.record_mark(end);
    ctx.synchronize_mark(end);
    double ms = ctx.elapsed_ms(start, end);
    CHECK(ms > 0);
    CHECK(ms < 60000);
    CHECK(a.to_vector<float>()[7] == 20.0f);
    Mark foreign = other.init_mark();
    CHECK_THAT(kiln::test::error_message([&] { ctx.record_mark(foreign); }),
               Catch::Matchers::Contains("record_mark: the mark is empty or of another context"));
    Mark empty;
    CHECK_THAT(kiln::test::error_message([&] { ctx.synchronize_mark(empty); }),
               Catch::Matchers::Contains("synchronize_mark: the mark is empty or of another context"));
    CHECK_THAT(kiln::test::error_message([&] { ctx.elapsed_ms(start, ctx.init_mark()); }),
               Catch::Matchers::Contains("get_time: the end mark was never recorded"));
}

TEST_CASE("bench mode times each call that runs kernels, with its bytes or flops, nested calls one level down") {
    Context ctx(ContextOptions{"cpu"});
    Tensor a = ctx.array(std::vector<float>(12 * 16, 1.5f), {12, 16}), b = ctx.empty({12, 16});
    b.assign(a * 2.0f);
    CHECK(ctx.bench_log().empty());   // off by default: nothing timed
    ctx.set_bench(true);
    CHECK(ctx.bench());
    b.assign(a * 2.0f + 1.0f);
    std::vector<BenchRecord> log = ctx.bench_log();
    REQUIRE(log.size() == 1);
    CHECK(log[0].op == "assign");
    CHECK(log[0].detail.find("float32 (12, 16)") != std::string::npos);
    CHECK(log[0].bytes == 2.0 * 12 * 16 * 4);   // a read, b written
    CHECK(log[0].flops == 0);
    CHECK(log[0].ms >= 0);
    CHECK(log[0].depth == 0);
    // A row vector broadcast over the rows counts its own 16 elements.
    Tensor v = ctx.array(std::vector<float>(16, 2.0f), {1, 16});
    b.assign(a * v);
    CHECK(ctx.bench_log().back().bytes == (2.0 * 12 * 16 + 16) * 4);

    ctx.clear_bench_log();
    Tensor A = ctx.array(std::vector<float>(8 * 5, 0.5f), {8, 5}), B = ctx.array(std::vector<float>(5 * 3, 2.0f), {5, 3}),
           C = ctx.empty({8, 3});
    compound_dot(A, B, C);
    log = ctx.bench_log();
    REQUIRE(!log.empty());
    CHECK(log.back().op == "compound_dot");
    CHECK(log.back().flops == 2.0 * 8 * 3 * 5);
    CHECK(log.back().depth == 0);
    for (size_t i = 0; i + 1 < log.size(); ++i) CHECK(log[i].depth == 1);   // the product's own steps, if any
    CHECK(C.to_vector<float>()[0] == 5.0f);

    // A call that fails leaves no record and the nesting where it was.
    ctx.clear_bench_log();
    Tensor bad = ctx.empty({7, 3});
    CHECK_THROWS(compound_dot(A, B, bad));
    CHECK(ctx.bench_log().empty());
    b.assign(a + 1.0f);
    REQUIRE(ctx.bench_log().size() == 1);
    CHECK(ctx.bench_log()[0].depth == 0);

    ctx.set_bench(false);
    ctx.clear_bench_log();
    b.assign(a + 2.0f);
    CHECK(ctx.bench_log().empty());
    Context on(ContextOptions{"cpu", 0, DType::Float32, 0, false, 0, true});
    CHECK(on.bench());
}
