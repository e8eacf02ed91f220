// Limits that hostile or merely large programs reach: expression depth (every pass and the
// destruction of a graph walk it without recursion) and the in-memory kernel cache's bound.
#include "tests/support/catch.hpp"

#include "compiler/kernel_text.hpp"
#include "compiler/legality.hpp"
#include "compiler/pipeline.hpp"
#include "ir/node.hpp"
#include <kiln/context.hpp>
#include "tests/support/views.hpp"

#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace kiln;

namespace {

Context& cpu() {
    static Context ctx(ContextOptions{"cpu"});
    return ctx;
}

// x + 1 + 1 + ... : a chain `depth` nodes deep.
Expr chain(const Expr& x, int depth) {
    Expr e = x;
    for (int i = 0; i < depth; ++i) e = e + 1.0;
    return e;
}

} // namespace

TEST_CASE("a deep expression is destroyed without recursion (a million chained additions)") {
    const size_t before = live_node_count();
    {
        Expr e = chain(leaf(test::host_view({4})), 1000000);
        CHECK(live_node_count() >= before + 1000000);
    }
    CHECK(live_node_count() <= before + 2);  // the leaf's view and the literal may live on in the test's views
}

TEST_CASE("nodes released as their thread ends, after its release list is gone, are released all the same") {
    const size_t before = live_node_count();
    std::thread([] {
        struct Holder {
            Expr e;
        };
        // Made before any node dies on this thread, so destroyed after the thread's release list.
        thread_local Holder held;
        Expr a = leaf(test::host_view({4}));
        held.e = chain(exp(a), 50);
        { Expr gone = a * 2.0; }   // a node dies here: the thread's release list is made now
    }).join();
    CHECK(live_node_count() == before);
}

TEST_CASE("every pass walks a deep expression without recursion (200000 nodes, with reductions and a take)") {
    Expr a = leaf(test::host_view({8, 16}));
    Expr e = a - mean(a, 1);
    for (int i = 0; i < 100000; ++i) e = e * 1.0001 + 0.5;
    e = e / sum(e, 1);  // a reduction above the chain: legality and lowering reach the bottom through it
    Expr idx = leaf(test::host_view({3}, DType::Int32));
    Expr g = take(e, idx, 1);  // the chain is gathered from: it is materialised first
    CompiledAssignment ca = compile_assignment(g.node(), test::host_view({8, 3}), "cpu-test", {});
    // Cut into stages of about kMaxStageOperations: the chain's pieces are a handful of kernels.
    CHECK(ca.stages.size() >= 200000 / kMaxStageOperations);
    size_t instrs = 0;
    std::set<std::string> keys;
    for (auto& st : ca.stages) {
        instrs += st.kernel.instrs.size();
        keys.insert(st.key);
        CHECK(st.kernel.instrs.size() < 8 * kMaxStageOperations);
    }
    CHECK(instrs > 200000);
    CHECK(keys.size() <= 8);
}

TEST_CASE("a sum of thousands of tensors is cut into kernels a manifest can hold") {
    std::vector<Expr> leaves;
    for (int i = 0; i < 3000; ++i) leaves.push_back(leaf(test::host_view({16})));
    Expr e = leaves[0];
    for (int i = 1; i < 3000; ++i) e = e + leaves[i];
    CompiledAssignment ca = compile_assignment(e.node(), test::host_view({16}), "cpu-test", {});
    CHECK(ca.stages.size() >= 3);
    for (auto& st : ca.stages) {
        CHECK(st.kernel.buffers.size() <= (size_t)kMaxKernelBuffers);
        CHECK_NOTHROW(parse_kernel_text(kernel_text(st.kernel)));  // what kiln-warmup reads back
    }
}

TEST_CASE("a deep expression evaluates on the CPU (100000 chained additions, cut into stages)") {
    Tensor x = cpu().zeros({5}, DType::Float32);
    Tensor out = cpu().empty({5}, DType::Float32);
    const auto before = cpu().counters();
    out.assign(chain(x, 100000));
    CHECK(out.to_vector<float>() == std::vector<float>(5, 100000.0f));
    const auto after = cpu().counters();
    CHECK(after.launches - before.launches >= 100000 / kMaxStageOperations);
    CHECK(after.compiles + after.disk_hits - before.compiles - before.disk_hits <= 3);  // the pieces share kernels
}

TEST_CASE("the memory kernel cache keeps at most its capacity, and evicted plans still run") {
    ContextOptions o{"cpu"};
    o.kernel_cache_capacity = 4;
    Context ctx(o);
    Tensor x = ctx.array(std::vector<float>{1, 2, 3}, {3});
    Tensor out = ctx.empty({3});
    // Distinct structures: each needs a kernel of its own.
    auto structure = [&](int k) { return chain(x, k + 1); };
    for (int k = 0; k < 12; ++k) {
        out.assign(structure(k));
        CHECK(ctx.counters().cached_kernels <= 4);
        CHECK(out.to_vector<float>() == std::vector<float>{2.0f + k, 3.0f + k, 4.0f + k});
    }
    CHECK(ctx.counters().cached_kernels == 4);
    // The first structures' kernels were evicted with their plans: they come back (from the disk
    // cache or a compile) and still compute the right values.
    const auto c0 = ctx.counters();
    out.assign(structure(0));
    CHECK(out.to_vector<float>() == std::vector<float>{2, 3, 4});
    const auto c1 = ctx.counters();
    CHECK(c1.compiles + c1.disk_hits == c0.compiles + c0.disk_hits + 1);
    CHECK(c1.plan_hits == c0.plan_hits);
    // The most recent structure is still cached, with its plan.
    out.assign(structure(11));
    CHECK(ctx.counters().plan_hits == c1.plan_hits + 1);
    CHECK(out.to_vector<float>() == std::vector<float>{13, 14, 15});
}

TEST_CASE("a plan with more stages than the kernel cache holds keeps its kernels until it is dropped") {
    ContextOptions o{"cpu"};
    o.kernel_cache_capacity = 1;
    Context ctx(o);
    Tensor x = ctx.array(std::vector<float>{1, 2, 3, 4}, {2, 2});
    Tensor out = ctx.empty({2, 2});
    Expr e = Expr(x) - mean(x, 1);   // two stages need two kernels when the mean is materialised
    e = e / sum(square(e) + 1.0, 0); // a column reduction: its own stage
    for (int rep = 0; rep < 3; ++rep) {
        out.assign(e);
        std::vector<float> v = out.to_vector<float>();
        // rows minus their means: +-0.5; the column sums of their squares plus 1: 2.5
        CHECK(v == std::vector<float>{-0.2f, 0.2f, -0.2f, 0.2f});
    }
}
