// The plan cache's shortcut for the last statement (Context::Impl::plan_for): the same interned
// expression into the same destination layout with the same options takes the last plan
// without its signature, and anything else takes the signature's path. Each case would write a
// wrong value if the shortcut took a stale plan.
#include "tests/support/catch.hpp"

#include <kiln/kiln.hpp>

#include <vector>

using namespace kiln;

namespace {

std::vector<float> times(const std::vector<float>& v, float k, float add = 0) {
    std::vector<float> r;
    for (float x : v) r.push_back(x * k + add);
    return r;
}

} // namespace

TEST_CASE("plan cache: a repeated statement runs its plan on the current values, counted as a hit") {
    Context ctx(ContextOptions{"cpu"});
    std::vector<float> v{1, 2, 3, 4, 5, 6};
    Tensor A = ctx.array(v, {2, 3}), B = ctx.empty({2, 3});
    B.assign(Expr(A) * 2.0f + 1.0f);
    const uint64_t hits = ctx.counters().plan_hits;
    for (int i = 0; i < 5; ++i) {
        A.assign(Expr(A) + 1.0f);                   // another statement between the repeats,
        B.assign(Expr(A) * 2.0f + 1.0f);            // and A's values change
        for (float& x : v) x += 1;
        CHECK(B.to_vector<float>() == times(v, 2, 1));
    }
    CHECK(ctx.counters().plan_hits == hits + 9);   // (A's statement is new the first time)
    // Back to back, as a loop repeats it.
    const Expr e = Expr(A) * 3.0f;
    for (int i = 0; i < 3; ++i) B.assign(e);
    CHECK(B.to_vector<float>() == times(v, 3));
}

TEST_CASE("plan cache: the last expression into another destination, view or dtype is planned for it") {
    Context ctx(ContextOptions{"cpu"});
    const std::vector<float> v{1, 2, 3, 4, 5, 6};
    Tensor A = ctx.array(v, {2, 3}), B = ctx.zeros({2, 3}), C = ctx.zeros({2, 3}), W = ctx.zeros({2, 6});
    const Expr e = Expr(A) * 2.0f;
    B.assign(e);
    C.assign(e);   // another storage
    CHECK(B.to_vector<float>() == times(v, 2));
    CHECK(C.to_vector<float>() == times(v, 2));
    // Views of one storage: other offsets and strides.
    Tensor left = W.slice({Slice::all(), Slice::range(0, 3)}), right = W.slice({Slice::all(), Slice::range(3, 6)});
    Tensor odd = W.slice({Slice::all(), Slice::range(1, 6, 2)});
    left.assign(e);
    right.assign(e);
    CHECK(W.to_vector<float>() == std::vector<float>{2, 4, 6, 2, 4, 6, 8, 10, 12, 8, 10, 12});
    odd.assign(Expr(A) * 2.0f + 1.0f);
    odd.assign(e);
    CHECK(W.to_vector<float>() == std::vector<float>{2, 2, 6, 4, 4, 6, 8, 8, 12, 10, 10, 12});
    Tensor H = ctx.zeros({2, 3}, DType::Float16);
    H.assign(e);
    CHECK(H.to_vector<float>() == times(v, 2));
}

TEST_CASE("plan cache: a new node where the last one was freed is not taken for it") {
    // Each expression dies with its statement; the next one's nodes often reuse its memory.
    Context ctx(ContextOptions{"cpu"});
    const std::vector<float> v{1, 2, 3};
    Tensor A = ctx.array(v, {3}), B = ctx.empty({3});
    int wrong = 0;
    for (int i = 0; i < 200; ++i) {
        B.assign(Expr(A) * (float)i);
        wrong += B.to_vector<float>() != times(v, (float)i);
    }
    CHECK(wrong == 0);
}

TEST_CASE("plan cache: options and the other paths in between change the plan the statement takes") {
    Context ctx(ContextOptions{"cpu"});
    std::vector<float> v;
    for (int i = 0; i < 4096; ++i) v.push_back(1.0f + (float)i / 4096.0f / 3.0f);   // between float16's steps
    Tensor A = ctx.array(v, {4096}), H = ctx.empty({4096}, DType::Float16), B = ctx.empty({4096});
    const Expr e = Expr(A) * 1.0f;
    H.assign(e);
    const std::vector<float> nearest = H.to_vector<float>();
    ctx.set_stochastic_round(10);
    H.assign(e);   // stochastic rounding is part of the plan
    CHECK(H.to_vector<float>() != nearest);
    ctx.set_stochastic_round(0);
    H.assign(e);
    CHECK(H.to_vector<float>() == nearest);
    // assign_together between two runs of the same statement.
    B.assign(e);
    Tensor C = ctx.empty({4096}), D = ctx.empty({4096});
    ctx.assign_together({{&C, Expr(A) + 1.0f}, {&D, Expr(A) - 1.0f}});
    B.assign(Expr(A) * 2.0f);
    B.assign(e);
    CHECK(B.to_vector<float>() == v);
    CHECK(C.to_vector<float>() == times(v, 1, 1));
}

TEST_CASE("plan cache: a repeated statement whose plan the kernel cache dropped is planned again") {
    ContextOptions o{"cpu"};
    o.kernel_cache_capacity = 1;
    Context ctx(o);
    const std::vector<float> v{1, 2, 3};
    Tensor A = ctx.array(v, {3}), B = ctx.empty({3}), C = ctx.empty({3});
    const Expr e = Expr(A) * 2.0f;
    for (int i = 0; i < 3; ++i) {
        B.assign(e);
        C.assign(exp(Expr(A)) - Expr(A));   // another kernel: evicts e's, and its plan with it
        B.assign(e);
        CHECK(B.to_vector<float>() == times(v, 2));
    }
}
