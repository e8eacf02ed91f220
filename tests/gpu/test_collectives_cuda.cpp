// Collectives on real GPUs: one-rank communicators (any machine with a GPU), every GPU of the
// machine driven by one process (the multi-GPU cases need 2 or more), joining timeouts, abort.
// Several processes are tested from Python (tests/python/test_distributed.py). Every case
// prints why and passes without a usable GPU or NCCL.
#include "tests/support/catch.hpp"
#include "tests/support/error_message.hpp"

#include <kiln/kiln.hpp>

#include "tests/support/gpu.hpp"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace kiln;
using kiln::test::error_message;
using Catch::Matchers::Contains;

namespace {

#define REQUIRE_NCCL()                                                                                 \
    REQUIRE_GPU();                                                                                     \
    do {                                                                                               \
        if (!nccl_info().available) {                                                                  \
            std::printf("SKIPPED (NCCL not available): %s\n", nccl_info().why_not.c_str());            \
            return;                                                                                    \
        }                                                                                              \
    } while (0)

std::vector<float> values(size_t n, uint32_t seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> d(-4, 4);
    std::vector<float> v(n);
    for (auto& x : v) x = std::round(d(g) * 8) / 8;   // exact in every 16-bit dtype
    return v;
}

// The CUDA contexts of every usable GPU, one each.
std::vector<std::unique_ptr<Context>> every_gpu() {
    std::vector<std::unique_ptr<Context>> out;
    for (int i = 0; i < 16; ++i) {
        try {
            out.push_back(std::make_unique<Context>(ContextOptions{"cuda:" + std::to_string(i)}));
        } catch (const Error&) {
            break;
        }
    }
    return out;
}

} // namespace

TEST_CASE("gpu collectives: one rank, every collective, dtype and op, then an expression on the same stream") {
    REQUIRE_NCCL();
    Context ctx(ContextOptions{"cuda:0"});
    Communicator comm(ctx, 1, 0, Communicator::new_id(), CommOptions{60});
    CHECK(comm.rank() == 0);
    CHECK(comm.size() == 1);
    CHECK(comm.timeout_s() == 60);
    const size_t n = 3000;
    auto v = values(n, 1);
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16}) {
        CAPTURE(dtype_name(dt));
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod}) {
            Tensor x = ctx.array(v, {30, 100}, dt), y = ctx.zeros({30, 100}, dt);
            comm.all_reduce(x, y, op);
            y = y * 2.0f + 1.0f;   // no host wait between: ordered on the stream
            auto got = y.to_vector<float>();
            for (size_t i = 0; i < n; i += 97) CHECK(got[i] == v[i] * 2 + 1);
        }
        Tensor x = ctx.array(v, {3000}, dt);
        comm.all_reduce(x, ReduceOp::Sum);   // in place
        CHECK(x.to_vector<float>() == v);
        Tensor all = ctx.zeros({1, 3000}, dt);
        comm.all_gather(x, all);
        CHECK(all.to_vector<float>() == v);
        Tensor part = ctx.zeros({3000}, dt);
        comm.reduce_scatter(all, part, ReduceOp::Sum);
        CHECK(part.to_vector<float>() == v);
        Tensor b = ctx.zeros({3000}, dt);
        comm.broadcast(x, b, 0);
        CHECK(b.to_vector<float>() == v);
    }
    // A group of tensors, and the asynchronous form followed by an expression.
    Tensor p = ctx.array(v, {3000}, DType::Float32), q = ctx.array(v, {1000, 3}, DType::BFloat16);
    comm.all_reduce(std::vector<Tensor>{p, q}, ReduceOp::Avg);
    CHECK(p.to_vector<float>() == v);
    {
        Pending pend = comm.all_reduce_async({p, q}, ReduceOp::Sum);
        pend.wait();
        p = p + 1.0f;
        CHECK(pend.done());
    }
    auto got = p.to_vector<float>();
    for (size_t i = 0; i < n; i += 31) CHECK(got[i] == v[i] + 1);
    {
        // Inside a group the reduction is enqueued when the group ends: waiting earlier is refused.
        CollectiveGroup g;
        Pending early = comm.all_reduce_async({q}, ReduceOp::Max);
        CHECK_THAT(error_message([&] { early.wait(); }), Contains("given inside a CollectiveGroup that is still open"));
        Pending later = comm.all_reduce_async({q}, ReduceOp::Max);
        g.end();
        later.wait();
    }
    comm.synchronize();
    CHECK(comm.error().empty());
    // Zero-size tensors are nothing to do.
    Tensor empty = ctx.zeros({0}, DType::Float32);
    comm.all_reduce(empty);
    // Misuse reaches the same checks as everywhere.
    Tensor wrong = ctx.zeros({2999}, DType::Float32);
    CHECK_THAT(error_message([&] { comm.all_reduce(p, wrong); }), Contains("they have one shape"));
    Context cpu(ContextOptions{"cpu"});
    Tensor host = cpu.zeros({3000}, DType::Float32);
    CHECK_THAT(error_message([&] { comm.all_reduce(host); }), Contains("is memory of cpu, not of this communicator's context cuda:0"));
}

TEST_CASE("gpu collectives: from_env with the id in KILN_NCCL_ID") {
    REQUIRE_NCCL();
    Context ctx(ContextOptions{"cuda:0"});
    std::string hex = Communicator::new_id().hex();
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("KILN_NCCL_ID", hex.c_str(), 1);
    auto comm = Communicator::from_env(ctx);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("KILN_NCCL_ID");
    Tensor x = ctx.array(values(64, 2), {64}, DType::Float32);
    comm->all_reduce(x, ReduceOp::Max);
    comm->synchronize();
    CHECK(x.to_vector<float>() == values(64, 2));
}

TEST_CASE("gpu collectives: every GPU of the machine driven by one process") {
    REQUIRE_NCCL();
    auto gpus = every_gpu();
    int world = (int)gpus.size();
    std::vector<Context*> ctxs;
    for (auto& g : gpus) ctxs.push_back(g.get());
    auto comms = Communicator::for_contexts(ctxs, CommOptions{120});
    REQUIRE((int)comms.size() == world);
    if (world < 2) std::printf("NOTE: one GPU: the multi-GPU reductions below run over a single rank\n");
    const size_t n = 1 << 20;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16}) {
        CAPTURE(dtype_name(dt));
        std::vector<Tensor> xs, sums, avgs, gathered, scattered, bcast;
        for (int r = 0; r < world; ++r) {
            Context& c = *ctxs[r];
            std::vector<float> v(n);
            for (size_t i = 0; i < n; ++i) v[i] = (float)((int)(i % 13) - 6 + r);
            xs.push_back(c.array(v, {(int64_t)n}, dt));
            sums.push_back(c.zeros({(int64_t)n}, dt));
            avgs.push_back(c.zeros({(int64_t)n}, dt));
            gathered.push_back(c.zeros({world, (int64_t)n}, dt));
            scattered.push_back(c.zeros({(int64_t)n / world}, dt));
            bcast.push_back(c.zeros({(int64_t)n}, dt));
        }
        {
            CollectiveGroup g;
            for (int r = 0; r < world; ++r) {
                comms[r]->all_reduce(xs[r], sums[r], ReduceOp::Sum);
                comms[r]->all_reduce(xs[r], avgs[r], ReduceOp::Avg);
                comms[r]->all_gather(xs[r], gathered[r]);
                comms[r]->broadcast(xs[r], bcast[r], world - 1);
            }
            g.end();
        }
        {
            CollectiveGroup g;
            for (int r = 0; r < world; ++r) comms[r]->reduce_scatter(sums[r], scattered[r], ReduceOp::Max);
            g.end();
        }
        double rsum = world * (world - 1) / 2.0;
        for (int r = 0; r < world; ++r) {
            auto s = sums[r].to_vector<float>(), a = avgs[r].to_vector<float>(), b = bcast[r].to_vector<float>();
            auto ga = gathered[r].to_vector<float>(), sc = scattered[r].to_vector<float>();
            bool ok = true;
            for (size_t i = 0; i < n && ok; i += 101) {
                float base = (float)((int)(i % 13) - 6);
                ok = s[i] == world * base + rsum && a[i] == base + rsum / world && b[i] == base + world - 1;
                for (int k = 0; k < world; ++k) ok = ok && ga[k * n + i] == base + k;
            }
            for (size_t i = 0; i < sc.size() && ok; i += 7) {
                size_t j = r * sc.size() + i;
                ok = sc[i] == world * (float)((int)(j % 13) - 6) + rsum;
            }
            CHECK(ok);
        }
    }
    // The asynchronous bucket form on every GPU, followed by an expression on each context.
    std::vector<Tensor> ts;
    for (int r = 0; r < world; ++r) ts.push_back(ctxs[r]->full({4096}, r + 1.0, DType::Float32));
    std::vector<Pending> pend;
    {
        CollectiveGroup g;
        for (int r = 0; r < world; ++r) pend.push_back(comms[r]->all_reduce_async({ts[r]}, ReduceOp::Sum));
        g.end();
    }
    for (int r = 0; r < world; ++r) {
        pend[r].wait();
        ts[r] = ts[r] * 0.5f;
    }
    for (int r = 0; r < world; ++r) CHECK(ts[r].to_vector<float>()[17] == 0.5f * world * (world + 1) / 2);
    for (auto& c : comms) c->synchronize();
}

TEST_CASE("gpu collectives: two contexts on one GPU are refused; a rank that never joins times out") {
    REQUIRE_NCCL();
    Context a(ContextOptions{"cuda:0"}), b(ContextOptions{"cuda:0"});
    CHECK_THAT(error_message([&] { Communicator::for_contexts({&a, &b}); }),
               Contains("contexts 0 and 1 are both on cuda:0; a communicator has one rank per GPU"));
    auto t0 = std::chrono::steady_clock::now();
    std::string m = error_message([&] { Communicator comm(a, 2, 0, Communicator::new_id(), CommOptions{2}); });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK_THAT(m, Contains("rank 0 of 2 on cuda:0 could not join"));
    CHECK_THAT(m, Contains("within the timeout of 2 s"));
    CHECK_THAT(m, Contains("are all 2 ranks started, with the same id?"));
    CHECK(s < 30);
}

TEST_CASE("gpu collectives: after abort every call says why") {
    REQUIRE_NCCL();
    Context ctx(ContextOptions{"cuda:0"});
    Communicator comm(ctx, 1, 0, Communicator::new_id());
    Tensor x = ctx.zeros({16}, DType::Float32);
    comm.all_reduce(x);
    comm.abort();
    CHECK_THAT(comm.error(), Contains("aborted by Communicator::abort()"));
    CHECK_THAT(error_message([&] { comm.all_reduce(x); }),
               Contains("all_reduce: the communicator (rank 0 of 1 on cuda:0) failed: aborted by Communicator::abort()"));
    CHECK_THAT(error_message([&] { comm.synchronize(); }), Contains("synchronize: the communicator"));
    // The context itself goes on.
    x = x + 1.0f;
    CHECK(x.to_vector<float>()[3] == 1.0f);
}
