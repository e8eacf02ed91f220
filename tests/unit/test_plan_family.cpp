// New shapes of an elementwise assignment planned without the passes (runtime/plan_family.hpp):
// which assignments qualify, that the family is checked before it makes plans, and that its
// plans compute what the passes' plans compute, bit for bit.
#include "tests/support/catch.hpp"

#include "runtime/plan_family.hpp"
#include "tests/support/views.hpp"

#include <kiln/context.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

using namespace kiln;

namespace {

std::vector<float> ramp(int64_t n, float scale) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * float((i * 7919) % 113) - 40.0f;
    return v;
}

// `run(ctx, M, N)` in one context over the shapes in order, and each shape alone in a fresh
// context: the same values, bit for bit. Returns the first context's plan_resizes.
uint64_t same_as_fresh(const std::vector<std::pair<int64_t, int64_t>>& shapes,
                       const std::function<std::vector<float>(Context&, int64_t, int64_t)>& run,
                       ContextOptions options = ContextOptions{"cpu"}) {
    Context ctx(options);
    for (auto [M, N] : shapes) {
        const std::vector<float> got = run(ctx, M, N);
        Context fresh(options);
        const std::vector<float> want = run(fresh, M, N);
        CHECK(fresh.counters().plan_resizes == 0);
        REQUIRE(got.size() == want.size());
        CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    }
    return ctx.counters().plan_resizes;
}

} // namespace

TEST_CASE("plan families: a third shape of an elementwise assignment is planned without the passes") {
    Context ctx(ContextOptions{"cpu"});
    auto assign = [&](int64_t M, int64_t N) {
        Tensor X = ctx.array(ramp(M * N, 0.25f), {M, N}), Y = ctx.empty({M, N});
        Y.assign(tanh(X) * X + 0.5f);
        return Y.to_vector<float>();
    };
    assign(8, 16);   // the template
    CHECK(ctx.counters().plan_resizes == 0);
    assign(9, 16);   // planned by the passes and compared with the resized template
    CHECK(ctx.counters().plan_resizes == 0);
    const auto c0 = ctx.counters();
    const std::vector<float> y = assign(5, 33);
    const auto c1 = ctx.counters();
    CHECK(c1.plan_resizes == c0.plan_resizes + 1);
    CHECK(c1.compiles == c0.compiles);
    CHECK(c1.memory_hits == c0.memory_hits);   // the plan holds the kernel already
    const std::vector<float> x = ramp(5 * 33, 0.25f);
    for (size_t i = 0; i < x.size(); ++i) CHECK(y[i] == Approx(std::tanh(x[i]) * x[i] + 0.5f).epsilon(1e-6));
    // The resized plan is cached like any other: the same shape again is a plan hit.
    assign(5, 33);
    CHECK(ctx.counters().plan_hits == c1.plan_hits + 1);
    CHECK(ctx.counters().plan_resizes == c1.plan_resizes);
}

TEST_CASE("plan families: resized plans compute the passes' values bit for bit") {
    const std::vector<std::pair<int64_t, int64_t>> shapes{{4, 6}, {7, 6}, {3, 129}, {64, 64}, {1, 5}, {2, 5}, {3, 5}};
    SECTION("float32 arithmetic, scalars and a rank-0 operand") {
        const uint64_t resized = same_as_fresh(shapes, [](Context& c, int64_t M, int64_t N) {
            Tensor X = c.array(ramp(M * N, 0.5f), {M, N}), s = c.array(std::vector<float>{3.0f}, {}), Y = c.empty({M, N});
            Y.assign(where(greater(X, 0.0f), sqrt(X) * s, exp(X * 0.1f)) - 1.0f);
            return Y.to_vector<float>();
        });
        CHECK(resized >= 2);   // {3, 129}, {64, 64} (and {3, 5} after {1, 5} and {2, 5}: dims of size 1 are part of the family)
    }
    SECTION("a float16 destination and casts") {
        const uint64_t resized = same_as_fresh(shapes, [](Context& c, int64_t M, int64_t N) {
            Tensor X = c.array(ramp(M * N, 0.125f), {M, N}), Y = c.empty({M, N}, DType::Float16);
            Y.assign(cast(X * X, DType::Float16) + cast(X, DType::Float16));
            return c.eval(cast(Y.expr(), DType::Float32)).to_vector<float>();
        });
        CHECK(resized >= 2);
    }
    SECTION("the destination read by its own expression") {
        const uint64_t resized = same_as_fresh(shapes, [](Context& c, int64_t M, int64_t N) {
            Tensor X = c.array(ramp(M * N, 0.5f), {M, N}), Y = c.array(ramp(M * N, -0.25f), {M, N});
            Y.assign(Y * 2.0f + X);
            return Y.to_vector<float>();
        });
        CHECK(resized >= 2);
    }
    SECTION("float16 stored with stochastic rounding, the counter reset before each") {
        ContextOptions sr{"cpu"};
        sr.stochastic_round = 3;
        const uint64_t resized = same_as_fresh(
            shapes,
            [](Context& c, int64_t M, int64_t N) {
                Tensor X = c.array(ramp(M * N, 0.3f), {M, N}), Y = c.empty({M, N}, DType::Float16);
                c.rng_reset();
                Y.assign(X * 1.7f);
                return c.eval(cast(Y.expr(), DType::Float32)).to_vector<float>();
            },
            sr);
        CHECK(resized >= 2);
    }
    SECTION("random draws, the counter reset before each") {
        const uint64_t resized = same_as_fresh(shapes, [](Context& c, int64_t M, int64_t N) {
            Tensor X = c.array(ramp(M * N, 0.5f), {M, N}), Y = c.empty({M, N});
            c.rng_reset();
            Y.assign(rand({}) * X + rand({M, N}));
            return Y.to_vector<float>();
        });
        CHECK(resized >= 2);
    }
}

TEST_CASE("plan families: a new batch size of reductions and broadcasts is resized, bit for bit") {
    // The first dim's extent changes; the others stay (N = 37, an odd row).
    const std::vector<std::pair<int64_t, int64_t>> batches{{4, 37}, {7, 37}, {33, 37}, {130, 37}, {1, 37}, {2, 37}, {65, 37}};
    auto check = [&](const std::function<std::vector<float>(Context&, int64_t, int64_t)>& run) {
        CHECK(same_as_fresh(batches, run) >= 3);   // 33, 130, 2 and 65 after the check at 7 (1 is in no family)
    };
    SECTION("layer norm over rows, its gain and shift rows broadcast, into float16") {
        check([](Context& c, int64_t M, int64_t N) {
            Tensor X = c.array(ramp(M * N, 0.5f), {M, N}), g = c.array(ramp(N, 0.01f), {1, N}),
                   b = c.array(ramp(N, -0.02f), {1, N}), Y = c.empty({M, N}, DType::Float16);
            Expr mu = mean(X, 1), d = X - mu;
            Y.assign(cast(d * reciprocal(sqrt(mean(d * d, 1) + 1e-5f)) * g + b, DType::Float16));
            return c.eval(cast(Y.expr(), DType::Float32)).to_vector<float>();
        });
    }
    SECTION("softmax over rows") {
        check([](Context& c, int64_t M, int64_t N) {
            Tensor X = c.array(ramp(M * N, 0.1f), {M, N}), Y = c.empty({M, N});
            Expr e = exp(X - max(X, 1));
            Y.assign(e / sum(e, 1));
            return Y.to_vector<float>();
        });
    }
    SECTION("a column sum (the batch reduced) and a full sum") {
        check([](Context& c, int64_t M, int64_t N) {
            Tensor X = c.array(ramp(M * N, 0.25f), {M, N}), Y = c.empty({1, N}), Z = c.empty({1, 1});
            Y.assign(sum(X * X, 0));
            Z.assign(sum(X));
            std::vector<float> v = Y.to_vector<float>();
            v.push_back(Z.to_vector<float>()[0]);
            return v;
        });
    }
    SECTION("argmax along rows, and a row of a larger tensor's slice") {
        check([](Context& c, int64_t M, int64_t N) {
            Tensor big = c.array(ramp((M + 2) * N, 0.7f), {M + 2, N});
            Tensor X = big.slice({Slice::range(1, M + 1), Slice::all()});   // offset N, rows N apart
            Tensor A = c.empty({M, 1}, DType::Int32), Y = c.empty({M, N});
            A.assign(argmax(X, 1));
            Y.assign(X * 2.0f + 1.0f);
            std::vector<float> v = Y.to_vector<float>();
            for (int32_t a : A.to_vector<int32_t>()) v.push_back(float(a));
            return v;
        });
    }
    SECTION("a destination read through another view (a temporary, then a copy)") {
        check([](Context& c, int64_t M, int64_t N) {
            Tensor B = c.array(ramp((M + 3) * N, 0.5f), {M + 3, N});
            Tensor D = B.slice({Slice::range(2, M + 2), Slice::all()}), S = B.slice({Slice::range(0, M), Slice::all()});
            D.assign(S * 2.0f + 1.0f);
            return B.to_vector<float>();
        });
    }
    SECTION("three dims, a reduction over the last, with random draws") {
        check([](Context& c, int64_t M, int64_t) {
            Tensor X = c.array(ramp(M * 5 * 6, 0.3f), {M, 5, 6}), Y = c.empty({M, 5, 1});
            c.rng_reset();
            Y.assign(sum(X * rand({M, 5, 6}), 2) + rand({}));
            return Y.to_vector<float>();
        });
    }
}

TEST_CASE("plan families: shapes that change past the first dim, strides that follow the batch, gathers and reshapes run the passes") {
    Context ctx(ContextOptions{"cpu"});
    for (int64_t M : {3, 4, 5, 6}) {
        const int64_t N = M + 2;
        Tensor X = ctx.array(ramp(M * N, 0.5f), {M, N}), row = ctx.array(ramp(N, 1.0f), {1, N});
        Tensor Y = ctx.empty({M, N}), Z = ctx.empty({M, 1}), S = ctx.empty({});
        Y.assign(X + row);                 // an operand broadcast along a dim, N changing
        Z.assign(sum(X, 1));               // a reduction, N changing
        S.assign(Expr(float(M)) * 2.0f);   // a rank-0 destination
        CHECK(Y.to_vector<float>()[size_t(N)] == ramp(M * N, 0.5f)[size_t(N)] + ramp(N, 1.0f)[0]);
    }
    for (int64_t M : {3, 4, 5, 6}) {
        Tensor X = ctx.array(ramp(7 * M, 0.5f), {7, M}), T = ctx.empty({M, 7}), R = ctx.empty({M * 7});
        Tensor i = ctx.array(std::vector<int32_t>{2, 0}, {2}), G = ctx.empty({2, 7});
        T.assign(X.T() * 2.0f);                       // a transposed view: its row stride is the batch
        R.assign(reshape(X.T() * 1.0f, {M * 7}));     // a reshape
        G.assign(take(X.T(), i.expr(), 0));           // a gather along the batch
        CHECK(T.to_vector<float>()[1] == ramp(7 * M, 0.5f)[size_t(M)] * 2.0f);
    }
    CHECK(ctx.counters().plan_resizes == 0);
}

TEST_CASE("plan families: a template whose kernel the cache evicted is dropped with it") {
    ContextOptions o{"cpu"};
    o.kernel_cache_capacity = 1;
    Context ctx(o);
    // Two structures taking turns evict each other's kernel at every call; their families go
    // with it, so no plan is made from a kernel that is gone.
    for (int64_t n = 2; n < 10; ++n) {
        Tensor X = ctx.array(ramp(n, 1.0f), {n}), Y = ctx.empty({n});
        Y.assign(X * 3.0f);
        CHECK(Y.to_vector<float>()[1] == ramp(n, 1.0f)[1] * 3.0f);
        Y.assign(X - 1.0f);
        CHECK(Y.to_vector<float>()[1] == ramp(n, 1.0f)[1] - 1.0f);
    }
    CHECK(ctx.counters().plan_resizes == 0);
    CHECK(ctx.counters().cached_kernels == 1);
}

TEST_CASE("plan families: a resized plan shares its template's kernel IR and key, and copies what it resizes") {
    PlanFamilies families;
    // The plan the passes make for y = x * 3 + 1 over (rows, 16), as the context caches it.
    auto planned = [](int64_t rows, AssignmentSignature& fam, Shape& at) {
        const View x = test::host_view({rows, 16}), y = test::host_view({rows, 16});
        x.storage->written = true;
        const NodePtr root = (leaf(x) * 3.0f + 1.0f).node();
        AssignmentSignature sig;
        assignment_signature(root, y, 0, "test", sig);
        REQUIRE(PlanFamilies{}.signature(root, y, 0, fam, at));
        return make_cached_plan(compile_assignment(root, y, "cpu-test", {}), sig);
    };
    AssignmentSignature fam, fam2, fam3;
    Shape at, at2, at3;
    const CachedPlan first = planned(8, fam, at);
    REQUIRE(first.stages.size() == 1);
    REQUIRE(first.stages[0].code);
    CHECK(!first.stages[0].code->kernel.instrs.empty());
    families.learn(fam, at, first);
    families.learn(fam2, at2, planned(9, fam2, at2));   // the check of the family's second shape
    planned(5, fam3, at3);
    const std::optional<CachedPlan> r = families.resize(fam3, at3);
    REQUIRE(r.has_value());
    CHECK(r->stages[0].code == first.stages[0].code);
    CHECK(r->stages[0].args.sizes == std::vector<int64_t>{5 * 16});
    CHECK(first.stages[0].args.sizes == std::vector<int64_t>{8 * 16});
}
