// One section per compiler pass: canonicalise, cse, legality, partition, lower/key.
#include "tests/support/catch.hpp"
#include "tests/support/views.hpp"

#include <kiln/kiln.hpp>

#include "compiler/canonicalise.hpp"
#include "compiler/cse.hpp"
#include "compiler/legality.hpp"
#include "compiler/lower.hpp"
#include "compiler/partition.hpp"
#include "compiler/pipeline.hpp"
#include "ir/node.hpp"
#include "ir/view_ops.hpp"

#include <cmath>
#include <memory>

using namespace kiln;

namespace {
using test::host_view;
int count_op(const NodePtr& root, OpKind k) {
    int n = 0;
    for (const Node* x : postorder(root)) n += x->op == k;
    return n;
}
Expr batchnorm(const Expr& A) { return reciprocal(sqrt(var(A, 1) + 0.001)) * (A - mean(A, 1)); }
}  // namespace

TEST_CASE("canonicalise folds constants and strips identities") {
    Expr a = leaf(host_view({3, 5}));
    CanonicaliseStats st;
    NodePtr r = canonicalise((a * 1.0 + 0.0).node(), &st);
    CHECK(r == a.node());
    CHECK(st.identities == 2);
    r = canonicalise((a * (Expr(2.0) * Expr(3.0))).node(), &st);
    CHECK(st.folded == 1);
    REQUIRE(r->inputs.size() == 2);
    CHECK(r->inputs[1]->op == OpKind::Scalar);
    CHECK(r->inputs[1]->value == 6.0);
    CHECK(canonicalise((-(-a)).node()) == a.node());
    // b*a and a*b become one node
    Expr b = leaf(host_view({3, 5}));
    CHECK(canonicalise((b * a).node()) == canonicalise((a * b).node()));
    // an identity that would change the dtype is kept: int8 * 1.0 is float32
    Expr i = leaf(host_view({3}, DType::Int8));
    CHECK(canonicalise((i * 1.0).node())->op == OpKind::Mul);
    CanonicaliseStats none;
    canonicalise(exp(a).node(), &none);
    CHECK_FALSE(none.changed());
}

TEST_CASE("canonicalise: a float's x**2 is x*x, elsewhere pow stays") {
    Expr a = leaf(host_view({3, 5})), h = leaf(host_view({3, 5}, DType::Float16));
    CanonicaliseStats st;
    NodePtr r = canonicalise(power(a, 2.0).node(), &st);
    CHECK(st.squares == 1);
    CHECK(r->op == OpKind::Mul);
    REQUIRE(r->inputs.size() == 2);
    CHECK(r->inputs[0] == a.node());
    CHECK(r->inputs[1] == a.node());
    CHECK(r->dtype == DType::Float32);
    CHECK(canonicalise(power(h, 2.0).node())->op == OpKind::Mul);   // float16 stays float16
    CHECK(canonicalise(power(h, 2.0).node())->dtype == DType::Float16);
    // Not where the exponent is another value, a tensor, or the base; nor where x**2 changes the
    // dtype (int8 ** 2.0 is float32), nor for integers.
    CHECK(canonicalise(power(a, 3.0).node())->op == OpKind::Pow);
    CHECK(canonicalise(power(a, 0.5).node())->op == OpKind::Pow);
    CHECK(canonicalise(power(a, a).node())->op == OpKind::Pow);
    CHECK(canonicalise(power(Expr(2.0), a).node())->op == OpKind::Pow);
    CHECK(canonicalise(power(leaf(host_view({3}, DType::Int8)), 2.0).node())->op == OpKind::Pow);
    CHECK(canonicalise(power(leaf(host_view({3}, DType::Int32)), scalar(2, DType::Int32)).node())->op == OpKind::Pow);
    // The CPU backend's x*x against the powf the expression names: the same values, NaN, infinities,
    // signed zeros and overflow included.
    Context ctx(ContextOptions{"cpu"});
    const std::vector<float> xs = {-3.5f, -0.0f, 0.0f, 1e-30f, 2e19f, -2e19f, std::nanf(""), INFINITY, -INFINITY, 1.1f};
    Tensor x = ctx.array(xs, {int64_t(xs.size())});
    const std::vector<float> got = ctx.eval(power(x, 2.0)).to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) {
        INFO(xs[i]);
        const float want = std::pow(xs[i], 2.0f);
        if (std::isnan(want)) CHECK(std::isnan(got[i]));
        else CHECK(got[i] == want);
    }
}

TEST_CASE("canonicalise: integer constants fold with the kernel's wrap-around, casts with its saturation") {
    auto folded = [](const Expr& e) {
        NodePtr r = canonicalise(e.node());
        REQUIRE(r->op == OpKind::Scalar);
        return r->value;
    };
    const Expr big = scalar(2147483647, DType::Int32), low = scalar(-2147483648.0, DType::Int32);
    CHECK(folded(big + scalar(1, DType::Int32)) == -2147483648.0);
    CHECK(folded(low - scalar(1, DType::Int32)) == 2147483647.0);
    CHECK(folded(-low) == -2147483648.0);
    CHECK(folded(scalar(65536, DType::Int32) * scalar(65537, DType::Int32)) == 65536.0);   // 2^32 + 2^16
    CHECK(folded(scalar(46341, DType::Int32) * scalar(46341, DType::Int32)) == -2147479015.0);
    CHECK(folded(scalar(127, DType::Int8) + scalar(1, DType::Int8)) == -128.0);
    CHECK(folded(scalar(200, DType::UInt8) * scalar(2, DType::UInt8)) == 144.0);
    CHECK(folded(cast(scalar(3e9, DType::Float32), DType::Int32)) == 2147483647.0);    // float -> int saturates
    // The same values computed by a kernel (the CPU backend) agree.
    Context ctx(ContextOptions{"cpu"});
    Tensor x = ctx.array(std::vector<int32_t>{2147483647, 46341}, {2});
    CHECK(ctx.eval(x + scalar(1, DType::Int32)).to_vector<int32_t>()[0] == -2147483647 - 1);
    CHECK(ctx.eval(x * x).to_vector<int32_t>()[1] == -2147479015);
}

TEST_CASE("cse: the two mean(A, axis=1) of batch normalisation are one node") {
    Expr A = leaf(host_view({128, 32}));
    CseStats st;
    NodePtr r = cse(canonicalise(batchnorm(A).node()), &st);
    CHECK(count_op(r, OpKind::Sum) == 2);  // mean(A) and the sum inside var, not three
    bool reported = false;
    for (auto& s : st.shared) reported |= s.find("sum(%") != std::string::npos && s.find("appears 2 times as written") != std::string::npos;
    CHECK(reported);
    // A - mean(A, 1) appears in var and in the numerator: one node with two users.
    auto uses = use_counts(r);
    int shared = 0;
    for (const Node* n : postorder(r))
        if (n->op == OpKind::Sub && uses[n] >= 2) ++shared;
    CHECK(shared == 1);
}

TEST_CASE("legality: same-axis reductions fuse (postfix order = pass order), others split") {
    Expr A = leaf(host_view({64, 32}));
    CHECK(legality(batchnorm(A).node(), {64, 32}).materialized.empty());
    // the division form, which nervanagpu could not fuse, also fuses here
    Expr div = (A - mean(A, 1)) / sqrt(var(A, 1) + 0.001);
    CHECK(legality(div.node(), {64, 32}).materialized.empty());
    // different axes: one reduction goes to its own stage, with a reason
    Expr mixed = A - mean(A, 0) - mean(A, 1);
    auto l = legality(mixed.node(), {64, 32});
    REQUIRE(l.materialized.size() == 1);
    CHECK(l.reasons[l.materialized[0].get()].find("does not match") != std::string::npos);
    // a full reduction broadcast back is split
    auto f = legality((A - mean(A)).node(), {64, 32});
    CHECK(f.materialized.size() == 1);
    // full variance: the inner full mean feeds another full reduction
    auto fv = legality(var(A).node(), {1, 1});
    CHECK(fv.materialized.size() == 1);
}

TEST_CASE("partition classifies stages") {
    Expr A = leaf(host_view({64, 32}));
    auto kind_of = [](const Expr& e, const Shape& dst_shape) {
        View dst = host_view(dst_shape);
        auto l = legality(e.node(), dst_shape);
        return partition(e.node(), dst, l).stages.back().kind;
    };
    CHECK(kind_of(exp(A) + 1.0, {64, 32}) == StageKind::Elementwise);
    CHECK(kind_of(sum(A, 1), {64, 1}) == StageKind::RowReduction);
    CHECK(kind_of(sum(A, 0), {1, 32}) == StageKind::ColumnReduction);
    CHECK(kind_of(sum(A), {1, 1}) == StageKind::FullReduction);
    CHECK(kind_of(batchnorm(A), {64, 32}) == StageKind::RowReduction);
    // writing A from A.T goes through a temporary
    View a = A.node()->view;
    Expr sq = leaf(host_view({8, 8}));
    View sqv = sq.node()->view;
    Expr tr = leaf(transpose_view(sqv, {}));
    auto plan = partition(tr.node(), sqv, legality(tr.node(), {8, 8}));
    CHECK(plan.stages.size() == 2);
    CHECK(plan.temps.size() == 1);
    (void)a;
}

TEST_CASE("partition: a chain of materialised reductions gives each stage only the temporaries it reads") {
    // x <- sum(x, 0) + t, 3000 times: every step is its own stage reading the step before. Each
    // stage holding every earlier temporary made planning O(N^2) in memory (gigabytes at 20000).
    Expr t = leaf(host_view({3}));
    Expr x = t;
    constexpr int kSteps = 3000;
    for (int i = 0; i < kSteps; ++i) x = sum(x, 0, true) + t;
    auto plan = partition(x.node(), host_view({3}), legality(x.node(), {3}));
    REQUIRE(plan.stages.size() >= kSteps);
    CHECK(plan.temps.size() == plan.stages.size() - 1);
    CHECK(plan.stages.front().inputs_from_temps.empty());
    for (size_t i = 1; i < plan.stages.size(); ++i) {
        const Stage& st = plan.stages[i];
        REQUIRE(st.inputs_from_temps.size() == 1);
        CHECK(st.inputs_from_temps.begin()->second == plan.stages[i - 1].out.temp);
    }
}

TEST_CASE("legality: a stage's context is not read through a long chain's cut below it") {
    // x - mean(x, 1), then 1500 more elementwise operations: the chain is cut after about
    // kMaxStageOperations, and the row reduction belongs to the stage below the cut. The stage
    // above it is elementwise (its context no longer walks through the cut, which made planning a
    // chain of N operations cost O(N^2 / kMaxStageOperations)).
    Expr A = leaf(host_view({16, 32}));
    Expr y = A - mean(A, 1);
    for (int i = 0; i < 1500; ++i) y = y * 1.5 + A;
    auto l = legality(y.node(), {16, 32});
    REQUIRE(!l.cuts.empty());
    auto plan = partition(y.node(), host_view({16, 32}), l);
    REQUIRE(plan.stages.size() >= 2);
    CHECK(plan.stages.front().kind == StageKind::RowReduction);
    CHECK(plan.stages.back().kind == StageKind::Elementwise);
}

TEST_CASE("legality: a gradient's shared forward values count once towards a stage's length") {
    // y <- sin(y) * x, 400 times, and its derivative: about 2800 distinct nodes, forward values
    // each read by several backward ones. Counting an operand per user cut it every few dozen
    // operations (one distinct kernel each: 999 compiles for 1000 steps).
    Expr x = leaf(host_view({3}));
    Expr y = x;
    for (int i = 0; i < 400; ++i) y = sin(y) * x;
    NodePtr g = grad(sum(y), {x}, Expr(1.0))[0].node();
    const size_t nodes = postorder(g).size();
    auto l = legality(g, {3});
    auto plan = partition(g, host_view({3}), l);
    CHECK(plan.stages.size() <= 2 * nodes / kMaxStageOperations + 1);
    for (const Stage& st : plan.stages) {
        auto computed = [&](const Node* n) { return n != st.root.get() && st.inputs_from_temps.count(n) != 0; };
        // a stage recomputes the forward values since the last cut of the forward chain
        CHECK(postorder(st.root, computed).size() <= size_t(3 * kMaxStageOperations));
    }
}

TEST_CASE("lower + key: sizes are arguments, layouts and structure are the key") {
    auto key_of = [](Shape s) {
        Expr A = leaf(host_view(s));
        View dst = host_view(s);
        auto ca = compile_assignment(batchnorm(A).node(), dst, "test");
        REQUIRE(ca.stages.size() == 1);
        return ca.stages[0];
    };
    auto a = key_of({128, 32}), b = key_of({4096, 16384});
    CHECK(a.key == b.key);                       // a new batch size reuses the kernel
    CHECK(a.kernel.name == b.kernel.name);
    CHECK(a.args.sizes != b.args.sizes);
    CHECK(a.kernel.blocks.size() == 3);          // mean pass, variance pass, store pass
    // 3-d contiguous elementwise merges to rank 1
    Expr C = leaf(host_view({4, 5, 6}));
    View d3 = host_view({4, 5, 6});
    auto e = compile_assignment((C * 2.0).node(), d3, "test");
    CHECK(e.stages[0].kernel.rank == 1);
    // a strided view keeps its rank and changes the key
    View st = slice_view(host_view({4, 10}), {Slice::all(), Slice::range(0, 5)});
    auto s = compile_assignment((leaf(st) * 2.0).node(), host_view({4, 5}), "test");
    CHECK(s.stages[0].kernel.rank == 2);
    CHECK(s.stages[0].key != compile_assignment((leaf(host_view({4, 5})) * 2.0).node(), host_view({4, 5}), "test").stages[0].key);
    // scalar values are arguments: a different constant is the same kernel
    CHECK(compile_assignment((C * 3.0).node(), d3, "test").stages[0].key == e.stages[0].key);
    // the target is part of the key
    CHECK(compile_assignment((C * 2.0).node(), d3, "other").stages[0].key != e.stages[0].key);
}
