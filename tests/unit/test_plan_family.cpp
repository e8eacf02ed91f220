// New shapes of an elementwise assignment planned without the passes (runtime/plan_family.hpp):
// which assignments qualify, that the family is checked before it makes plans, and that its
// plans compute what the passes' plans compute, bit for bit.
#include "tests/support/catch.hpp"

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

TEST_CASE("plan families: broadcasts, reductions, strided views and rank 0 run the passes every time") {
    Context ctx(ContextOptions{"cpu"});
    for (int64_t M : {3, 4, 5, 6}) {
        const int64_t N = M + 2;
        Tensor X = ctx.array(ramp(M * N, 0.5f), {M, N}), row = ctx.array(ramp(N, 1.0f), {1, N});
        Tensor Y = ctx.empty({M, N}), Z = ctx.empty({M, 1}), T = ctx.empty({N, M}), S = ctx.empty({});
        Y.assign(X + row);                 // an operand broadcast along a dim
        Z.assign(sum(X, 1));               // a reduction
        T.assign(X.T() * 2.0f);            // a transposed (strided) view
        S.assign(Expr(float(M)) * 2.0f);   // a rank-0 destination
        CHECK(Y.to_vector<float>()[size_t(N)] == ramp(M * N, 0.5f)[size_t(N)] + ramp(N, 1.0f)[0]);
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
