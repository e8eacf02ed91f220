// Context::assign_together: sibling reductions (same domain, destinations nobody reads) are one
// kernel that stores every destination, against float64 on the CPU JIT and the kernel-IR
// interpreter; everything else runs one assignment after another with assign()'s semantics; the
// CUDA C of sibling kernels (column, full) compiles with NVRTC for sm_80 and sm_90.
#include "tests/support/catch.hpp"
#include "tests/support/error_message.hpp"
#include "tests/support/random_values.hpp"

#include <kiln/kiln.hpp>

#include "codegen/cuda/cuda_codegen.hpp"
#include "compiler/pipeline.hpp"
#include "ir/node.hpp"
#include "runtime/backend.hpp"
#include "runtime/host_backend.hpp"
#ifdef KILN_HAVE_NVRTC
#include "runtime/cuda/nvrtc.hpp"
#endif

#include <fmt/format.h>

#include <cmath>
#include <vector>

using namespace kiln;
using kiln::test::make;
using kiln::test::random_values;

namespace {

double rel(double got, double want) { return std::fabs(got - want) / (1 + std::fabs(want)); }

} // namespace

TEST_CASE("assign_together: a column's sum and sum of squares are one kernel, as assign() computes them") {
    {
        Context ctx(ContextOptions{"cpu"});
        for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16}) {
            INFO(dtype_name(dt));
            const int64_t n = 301, C = 37;
            std::vector<double> x = random_values((size_t)(n * C), 7, -2, 3);
            Tensor X = make(ctx, x, {n, C}, dt);
            Tensor S = ctx.empty({1, C}), Q = ctx.empty({C}), K = ctx.empty({1, C}, dt);
            const Expr shifted = cast(X.expr(), DType::Float32) - 0.5;
            const uint64_t launches = ctx.counters().launches;
            ctx.assign_together({{&S, sum(X.expr(), 0, true)},
                                 {&Q, reshape(sum(square(shifted), 0, true), {C})},
                                 {&K, max(X.expr(), 0, true)}});
            CHECK(ctx.counters().launches - launches == 1);
            const std::vector<float> s = S.to_vector<float>(), q = Q.to_vector<float>(), k = K.to_vector<float>();
            for (int64_t c = 0; c < C; ++c) {
                double ws = 0, wq = 0, wk = -INFINITY;
                for (int64_t i = 0; i < n; ++i) {
                    const double v = x[(size_t)(i * C + c)];
                    ws += v, wq += (v - 0.5) * (v - 0.5), wk = std::max(wk, v);
                }
                CHECK(rel(s[c], ws) < 1e-5);
                CHECK(rel(q[c], wq) < 1e-5);
                CHECK(k[c] == (float)wk);
            }
        }
    }
}

TEST_CASE("assign_together: whole-tensor siblings, and where one kernel cannot: rows, other domains, a destination read") {
    Context ctx(ContextOptions{"cpu"});
    const int64_t n = 64, C = 48;
    std::vector<double> x = random_values((size_t)(n * C), 3);
    Tensor X = make(ctx, x, {n, C});
    double total = 0, squares = 0;
    for (double v : x) total += v, squares += v * v;

    SECTION("full reductions of the same tensor: one kernel") {
        Tensor A = ctx.empty({1, 1}), B = ctx.empty({1});
        const uint64_t l0 = ctx.counters().launches;
        ctx.assign_together({{&A, sum(X.expr())}, {&B, reshape(sum(X.expr() * X.expr()), {1})}});
        CHECK(ctx.counters().launches - l0 == 1);
        CHECK(rel(A.to_vector<float>()[0], total) < 1e-5);
        CHECK(rel(B.to_vector<float>()[0], squares) < 1e-5);
    }
    SECTION("row reductions and reductions over other axes run one after another") {
        Tensor R = ctx.empty({n, 1}), Ccol = ctx.empty({1, C});
        const uint64_t l0 = ctx.counters().launches;
        ctx.assign_together({{&R, sum(X.expr(), 1, true)}, {&Ccol, sum(X.expr(), 0, true)}});
        CHECK(ctx.counters().launches - l0 == 2);
        std::vector<float> r = R.to_vector<float>(), c = Ccol.to_vector<float>();
        double rs = 0, cs = 0;
        for (float v : r) rs += v;
        for (float v : c) cs += v;
        CHECK(rel(rs, total) < 1e-4);
        CHECK(rel(cs, total) < 1e-4);
    }
    SECTION("an expression that reads an earlier destination sees its new value") {
        Tensor A = ctx.zeros({1, C}), B = ctx.empty({1, C});
        ctx.assign_together({{&A, sum(X.expr(), 0, true)}, {&B, sum(X.expr(), 0, true) - A.expr()}});
        for (float v : B.to_vector<float>()) CHECK(v == 0.0f);
    }
    SECTION("random draws keep assign()'s semantics: each assignment draws its own") {
        const Expr R = rand({n, C});
        Tensor A = ctx.empty({1, C}), B = ctx.empty({1, C});
        const uint64_t l0 = ctx.counters().launches;
        ctx.assign_together({{&A, sum(R, 0, true)}, {&B, sum(R, 0, true)}});
        CHECK(ctx.counters().launches - l0 == 2);
        CHECK(A.to_vector<float>() != B.to_vector<float>());
    }
    SECTION("a reduction beside a value broadcast back over the reduced axis: one after the other") {
        Tensor A = ctx.empty({1, C}), Y = ctx.empty({n, C});
        const uint64_t l0 = ctx.counters().launches;
        ctx.assign_together({{&A, sum(X.expr(), 0, true)}, {&Y, X.expr() - mean(X.expr(), 0, true)}});
        CHECK(ctx.counters().launches - l0 == 2);
        const std::vector<float> y = Y.to_vector<float>();
        double col0 = 0;
        for (int64_t i = 0; i < n; ++i) col0 += y[(size_t)(i * C)];
        CHECK(std::fabs(col0) < 1e-4);
        CHECK(rel(A.to_vector<float>()[0], [&] { double t = 0; for (int64_t i = 0; i < n; ++i) t += x[(size_t)(i * C)]; return t; }()) < 1e-5);
    }
    SECTION("the same destination twice: the later value stays") {
        Tensor A = ctx.empty({1, C});
        ctx.assign_together({{&A, sum(X.expr(), 0, true)}, {&A, max(X.expr(), 0, true)}});
        std::vector<float> a = A.to_vector<float>();
        for (int64_t c = 0; c < C; ++c) {
            double m = -INFINITY;
            for (int64_t i = 0; i < n; ++i) m = std::max(m, x[(size_t)(i * C + c)]);
            CHECK(a[c] == (float)m);
        }
    }
    SECTION("a cached plan is reused, with this call's tensors") {
        Tensor A = ctx.empty({1, C}), B = ctx.empty({1, C});
        ctx.assign_together({{&A, sum(X.expr(), 0, true)}, {&B, max(X.expr(), 0, true)}});
        std::vector<double> y = random_values((size_t)(n * C), 4);
        Tensor Y = make(ctx, y, {n, C});
        const uint64_t hits = ctx.counters().plan_hits;
        ctx.assign_together({{&A, sum(Y.expr(), 0, true)}, {&B, max(Y.expr(), 0, true)}});
        CHECK(ctx.counters().plan_hits == hits + 1);
        double c0 = 0;
        for (int64_t i = 0; i < n; ++i) c0 += y[(size_t)(i * C)];
        CHECK(rel(A.to_vector<float>()[0], c0) < 1e-5);
    }
    SECTION("misuse: what assign() says, and a missing destination") {
        Tensor A = ctx.empty({1, C}), B = ctx.empty({3});
        const std::string shape = test::error_message(
            [&] { ctx.assign_together({{&A, sum(X.expr(), 0, true)}, {&B, sum(X.expr(), 0, true)}}); });
        CHECK_THAT(shape, Catch::Matchers::Contains("assign: cannot assign a float32 expression of shape (1, 48) to a "
                                                    "destination of shape (3,)"));
        const std::string missing = test::error_message(
            [&] { ctx.assign_together({{&A, sum(X.expr(), 0, true)}, {nullptr, sum(X.expr(), 0, true)}}); });
        CHECK_THAT(missing, Catch::Matchers::Contains("assign_together: a destination is missing"));
    }
}

TEST_CASE("assign_together: sibling kernels run on both host backends and compile for sm_80 and sm_90 (column, full)") {
    const int64_t n = 4096, C = 40;
    Context ctx(ContextOptions{"cpu"});
    std::vector<double> x = random_values((size_t)(n * C), 11);
    for (bool full : {false, true}) {
        for (DType dt : {DType::Float32, DType::Float16}) {
            INFO((full ? "full " : "column ") << dtype_name(dt));
            Tensor X = make(ctx, x, {n, C}, dt), A = ctx.empty(full ? Shape{1, 1} : Shape{1, C}),
                   B = ctx.empty(full ? Shape{1, 1} : Shape{1, C}, dt);
            const Expr e = X.expr();
            const Expr e1 = full ? sum(cast(e, DType::Float32)) : sum(cast(e, DType::Float32), 0, true);
            const Expr e2 = full ? max(e) : max(e * e, 0, true);
            for (bool interpreter : {false, true}) {
                INFO((interpreter ? "interpreter" : "CPU JIT"));
                std::unique_ptr<DeviceBackend> be = interpreter ? make_interpreter_backend() : make_host_backend();
                CompiledAssignment ca = compile_together({{e1.node(), A.view()}, {e2.node(), B.view()}}, be->target());
                REQUIRE(ca.stages.size() == 1);
                LoweredStage& st = ca.stages[0];
                CHECK(st.kernel.buffers[0].output);
                CHECK(st.kernel.buffers[1].output);
                CHECK(st.kernel.blocks.back().stores.size() == 2);
                KernelHandle k = be->compile(st.kernel, st.key);
                for (size_t b = 0; b < st.sources.size(); ++b) {
                    const View& v = st.sources[b].view;
                    st.args.buffers[b] = static_cast<char*>(v.storage->data) + v.offset * (int64_t)dtype_size(v.dtype);
                }
                be->launch(k, st.args);
                be->synchronize();
                A.view().storage->written = B.view().storage->written = true;
                const std::vector<float> a = A.to_vector<float>(), b = B.to_vector<float>();
                for (int64_t c = 0; c < (full ? 1 : C); ++c) {
                    double ws = 0, wm = -INFINITY;
                    for (int64_t i = 0; i < n * C; ++i) {
                        if (!full && i % C != c) continue;
                        const double v = x[(size_t)i];
                        ws += v, wm = std::max(wm, full ? v : v * v);
                    }
                    CHECK(rel(a[c], ws) < 1e-4);
                    CHECK(rel(b[c], wm) < (dt == DType::Float32 ? 1e-6 : 1e-3));
                }
            }
            CompiledAssignment ca = compile_together({{e1.node(), A.view()}, {e2.node(), B.view()}}, "sm_90");
            REQUIRE(ca.stages.size() == 1);
            const codegen::CudaSource src = codegen::emit_cuda(ca.stages[0].kernel);
#ifdef KILN_HAVE_NVRTC
            for (int sm : {80, 90}) {
                cuda::NvrtcResult r = cuda::nvrtc_compile(src.code, ca.stages[0].kernel.name + ".cu", sm);
                if (!r.ok) FAIL(fmt::format("sm_{}:\n{}\n---- source ----\n{}", sm, r.log, src.code));
            }
#endif
        }
    }
}
