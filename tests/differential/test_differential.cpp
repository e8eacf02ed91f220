// Differential test: seeded random expression graphs, evaluated by kiln and by a float64
// reference interpreter written here, independently of kiln's compiler.
//
// The generator builds every graph twice, in lock step: once with kiln's lazy API (Expr) and
// once as a reference node (RNode: op, dtype, shape, children, attributes) that is evaluated
// eagerly in double precision. The reference re-derives each node's dtype from the documented
// promotion rules (NumPy's, capped at 32 bits, weak Python-style literals) and the test
// requires it to equal Expr::dtype(). Values follow kiln's documented semantics:
//   - floats are computed in float32 (16-bit floats are storage formats, rounded only when
//     stored); the reference computes in double and rounds once, to the destination's dtype;
//   - int8/uint8/bool results wrap (or become 0/1) after every op; int32 wraps mod 2^32;
//   - float -> int conversion truncates, saturates at the int32 range, NaN -> 0, then wraps;
//   - tanh2 = tanh(x ln2), safelog = log(max(x, exp(-50))), sig = 1/(1+exp(-x));
//   - take wraps negative indices once and clips out-of-range ones;
//   - rand = philox_uniform(seed32, counter, linear index over the rand node's own shape).
//
// The pieces: reference.hpp (the float64 reference interpreter and its numerics),
// generator.hpp (views and random graphs), nvrtc_worker.hpp, runner.hpp (one graph, and a run of
// many); this file holds the test cases.
//
// Tolerances. Alongside each value the reference carries a first-order bound of the error a
// float32 evaluation may make (each float32 operation contributes a few units of roundoff of its
// result, input errors propagate through the derivative, a reduction over n terms adds
// ~sqrt(n) units of sum|x|, a 16-bit value that may be materialised in a temporary adds half an
// ulp of its dtype; a correctly rounded operation on exact inputs whose exact result is a
// float32 adds nothing, so integer-valued and small dyadic arithmetic stays exact). An element
// passes when |got - ref| <= atol + rtol*|ref| + 4*bound, with
// rtol by destination dtype (float32 1e-5, 1e-4 once a reduction is involved; float16 2e-3 /
// 4e-3; bfloat16 1.6e-2 / 2.4e-2). The bound grows with cancellation (a - b of nearly equal
// values) so such results are not held to a relative tolerance they cannot meet.
//
// Discontinuous operations (comparisons, rint, sgn, float -> int/bool casts, argmax/argmin,
// where) are exact on exact inputs, but on computed floats the reference and kiln may land on
// different sides of the discontinuity when the inputs differ by less than their error bound.
// Those elements are marked unstable and skipped (the flag propagates to everything computed
// from them); the run prints how many were skipped. Integer and bool results are otherwise
// compared exactly.
//
// NaN and inf are avoided (values are generated in sane ranges per dtype, and the generator
// only applies sqrt/log/reciprocal/power/exp to operands whose reference values are in the
// domain, transforming the operand first when they are not), except in the "special values"
// graphs which put NaN/inf/-0 into float leaves on purpose and use only ops with well-defined
// results on them; there NaN must appear exactly where the reference has NaN.
//
// Graph families: random expressions (every elementwise op, reductions over an axis or all
// axes with and without keepdims, broadcasting against lower-rank operands and literals, casts,
// where/clip, onehot/take, reshapes, rand), the seeds' nested reductions (variance, batch norm,
// softmax, reductions over different axes that need several stages), in-place and overlapping
// assignments (A = A*2 + 1, A = A.T(), A = A[::-1], A[1:] = f(A[:-1])), special values, and
// focused take/onehot/rand graphs. Inputs and destinations are often strided, reversed,
// transposed or index-dropped views of larger tensors; destinations may have another dtype (cast
// on store) or a larger shape (broadcast on store), and elements outside a destination view
// must keep their values.
//
// Every graph's kernels are also emitted as CUDA C and compiled by NVRTC to PTX for sm_80 and
// sm_90, one in four on to sm_90 machine code (once per distinct kernel key; no GPU is needed),
// on worker threads.
//
// The graphs run in a child process: a crash inside kiln fails that graph (printed with its
// seed) and a fresh child carries on with the next one.
//
// Environment:
//   KILN_FUZZ_COUNT=<n>        number of graphs (default 2000)
//   KILN_FUZZ_FIRST=<i>        start at graph i (graphs i..count-1: a run split across processes)
//   KILN_FUZZ_SEED=<s>         replay the single graph printed as "seed <s>"
//   KILN_FUZZ_NVRTC_MAX=<n>    cap on distinct kernels compiled by NVRTC (default: no cap, every kernel; 0: no CUDA C at all)
//   KILN_FUZZ_VERBOSE=1        print every graph
//   KILN_FUZZ_FORK=0           run the graphs in this process (no crash isolation; the default on cuda)
//   KILN_TEST_DEVICE=<device>  where kiln runs the graphs: "cpu" (default) or "cuda[:N]"; without a
//                              usable device every case prints why it is skipped and passes
#include "tests/support/catch.hpp"

#include "tests/differential/runner.hpp"

// ---- Fixed cases for semantics a random graph rarely pins down exactly

TEST_CASE("rand: philox stream, one counter per rand() node per assignment, reset by seed()") {
    if (!test_device_usable()) return;
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    const uint64_t s = 0x0123456789abcdefull;
    const uint32_t seed32 = (uint32_t)(s ^ (s >> 32));
    const int64_t n = 37;
    auto expect = [&](uint32_t counter, int64_t i) { return kiln::philox_uniform(seed32, counter, (uint32_t)i); };
    ctx.seed(s);
    Tensor a = ctx.empty({n}), b = ctx.empty({n}), c = ctx.empty({n}), d = ctx.empty({n}), e = ctx.empty({4, n});
    a.assign(kiln::rand({n}));  // counter 0
    b.assign(kiln::rand({n}));  // counter 1
    Expr r = kiln::rand({n});
    c.assign(r + r * 2.0);      // one node read twice: one draw, counter 2
    Expr r1 = kiln::rand({n}), r2 = kiln::rand({n});
    d.assign(r1 - r2 * 4.0);    // two nodes: counters 3 and 4, in either order
    e.assign(kiln::rand({1, n}));  // a (1, n) draw broadcast over 4 rows: counter 5
    auto va = a.to_vector<float>(), vb = b.to_vector<float>(), vc = c.to_vector<float>(), vd = d.to_vector<float>(),
         ve = e.to_vector<float>();
    int bad = 0;
    bool order34 = std::fabs((double)vd[0] - ((double)expect(3, 0) - 4.0 * expect(4, 0))) < 1e-6;
    for (int64_t i = 0; i < n; ++i) {
        bad += va[i] != expect(0, i);
        bad += vb[i] != expect(1, i);
        bad += !(va[i] >= 0 && va[i] < 1);
        bad += std::fabs((double)vc[i] - 3.0 * expect(2, i)) > 1e-6;
        double dd = order34 ? (double)expect(3, i) - 4.0 * expect(4, i) : (double)expect(4, i) - 4.0 * expect(3, i);
        bad += std::fabs((double)vd[i] - dd) > 1e-5;
        for (int row = 0; row < 4; ++row) bad += ve[row * n + i] != expect(5, i);
    }
    INFO("first values: " << va[0] << " " << vb[0] << " " << vc[0] << " " << vd[0] << " " << ve[0]);
    CHECK(bad == 0);
    // seed() restarts the stream
    ctx.seed(s);
    Tensor a2 = ctx.empty({n});
    a2.assign(kiln::rand({n}));
    CHECK(a2.to_vector<float>() == va);
}

TEST_CASE("rand: a rank-0 rand() draws per element of what it is combined into (the seeds' A[:] = ng.rand())") {
    if (!test_device_usable()) return;
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    const uint64_t s = 42;
    const uint32_t seed32 = (uint32_t)(s ^ (s >> 32));
    ctx.seed(s);
    const int64_t rows = 5, cols = 33;
    Tensor a = ctx.empty({rows, cols}), b = ctx.empty({rows, cols}), one = ctx.empty({rows, cols});
    a.assign(kiln::rand({}));                                  // counter 0, per element of a
    Tensor x = ctx.full({rows, cols}, 2.0, DType::Float32);
    b.assign(kiln::rand({}) * x + 1.0);                        // counter 1, per element of the product
    one.assign(kiln::rand({1}) + 0.0 * x);                     // counter 2: an explicit (1,) draw stays one value
    auto va = a.to_vector<float>(), vb = b.to_vector<float>(), vo = one.to_vector<float>();
    int bad = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
        bad += va[i] != kiln::philox_uniform(seed32, 0, (uint32_t)i);
        bad += std::fabs((double)vb[i] - (2.0 * kiln::philox_uniform(seed32, 1, (uint32_t)i) + 1.0)) > 1e-6;
        bad += vo[i] != kiln::philox_uniform(seed32, 2, 0);
    }
    CHECK(bad == 0);
    std::set<float> distinct(va.begin(), va.end());
    CHECK(distinct.size() > (size_t)(rows * cols * 9 / 10));
    // Inside a reduction it draws per reduced element: the row means of rand() approach 1/2.
    Tensor big = ctx.empty({4, 4096}), m = ctx.empty({4, 1});
    big.assign(0.0);
    m.assign(kiln::mean(big + kiln::rand({}), 1));
    for (float v : m.to_vector<float>()) CHECK(std::fabs(v - 0.5f) < 0.03f);
}

TEST_CASE("reductions: a negative axis counts from the end, -1 included") {
    if (!test_device_usable()) return;
    // NumPy: np.sum(A, axis=-1) reduces the last axis. kiln::all_axes is the marker for all axes
    // and must not swallow axis -1.
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    Tensor A = ctx.array(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    Expr last = kiln::sum(A, -1, false);
    CHECK(last.shape() == Shape{2});
    Expr kept = kiln::max(A, -1);
    CHECK(kept.shape() == Shape{2, 1});
    CHECK(kiln::argmax(A, -1, false).shape() == Shape{2});
    if (last.shape() == Shape{2}) {
        Tensor out = ctx.empty({2});
        out.assign(last);
        CHECK(out.to_vector<float>() == std::vector<float>{6, 15});
    }
    CHECK(kiln::sum(A, -2, false).shape() == Shape{3});
}

TEST_CASE("in-place: a gather from the destination reads the values from before the assignment") {
    if (!test_device_usable()) return;
    // A = take(A, reversed): every element must come from the old A, as in NumPy (A[:] = A[idx]).
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    const int64_t n = 64;
    std::vector<float> h(n);
    std::vector<int32_t> rev(n);
    for (int64_t i = 0; i < n; ++i) { h[i] = (float)i; rev[i] = (int32_t)(n - 1 - i); }
    Tensor A = ctx.array(h, {n});
    Tensor idx = ctx.array(rev, {n});
    A.assign(kiln::take(A, idx));
    auto v = A.to_vector<float>();
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += v[i] != (float)(n - 1 - i);
    INFO("A[n-1] = " << v[n - 1] << " (expected 0)");
    CHECK(bad == 0);
}

TEST_CASE("iota: a size-1 axis broadcast over a larger result stays 0") {
    if (!test_device_usable()) return;
    // iota(shape, axis) holds the coordinate along `axis` of its own shape; broadcasting a
    // size-1 axis repeats that 0 (NumPy: np.zeros((1,3)) + np.zeros((2,3)) broadcasts values).
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    Tensor out = ctx.empty({2, 3}, DType::Int32);
    out.assign(kiln::iota({1, 3}, 0) + ctx.zeros({2, 3}, DType::Int32));
    CHECK(out.to_vector<int32_t>() == std::vector<int32_t>{0, 0, 0, 0, 0, 0});
    out.assign(kiln::iota({1, 3}, 1) + ctx.zeros({2, 3}, DType::Int32));
    CHECK(out.to_vector<int32_t>() == std::vector<int32_t>{0, 1, 2, 0, 1, 2});
}

TEST_CASE("legality: what lies under a reduction computed in a stage of its own is legalised too") {
    if (!test_device_usable()) return;
    // A reduction that cannot fuse into its consumer gets its own stage; the reductions and
    // reshapes inside it must then be split or materialised by the same rules, as they would be
    // at the top of an assignment.
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    Tensor A = ctx.array(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    std::vector<float> hb(20);
    for (int i = 0; i < 20; ++i) hb[i] = (float)(i % 5) - 1;  // four equal rows: B - mean(B, 0) == 0
    Tensor B = ctx.array(hb, {4, 5});
    // a full reduction holding a column reduction, added to a column reduction of another shape
    Tensor c1 = ctx.empty({1, 3});
    c1.assign(kiln::sum(A, 0) + kiln::max(Expr(B) - kiln::mean(B, 0)));
    CHECK(c1.to_vector<float>() == std::vector<float>{5, 7, 9});
    // a row reduction holding a column reduction, broadcast into a larger destination
    Tensor c2 = ctx.empty({2, 6});
    c2.assign(kiln::sum(Expr(A) - kiln::sum(A, 0), 1));
    CHECK(c2.to_vector<float>() == std::vector<float>{-15, -15, -15, -15, -15, -15, -6, -6, -6, -6, -6, -6});
    // a reshape of a computed expression under a reduction in its own stage
    Tensor c3 = ctx.empty({1, 3});
    std::string err;
    try {
        c3.assign(kiln::sum(A, 0) + kiln::min(kiln::reshape(kiln::exp(B), {20}), 0));
    } catch (const std::exception& e) {
        err = e.what();
    }
    INFO(err);
    REQUIRE(err.empty());
    auto v3 = c3.to_vector<float>();
    const double e_1 = std::exp(-1.0);
    CHECK(std::fabs(v3[0] - (5 + e_1)) < 1e-5);
    CHECK(std::fabs(v3[1] - (7 + e_1)) < 1e-5);
    CHECK(std::fabs(v3[2] - (9 + e_1)) < 1e-5);
}

TEST_CASE("constant folding: nested constant subexpressions fold to their values") {
    if (!test_device_usable()) return;
    // canonicalise folds an op whose operands are all literals; when an operand was itself
    // folded in the same pass, the folded value must be used.
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    Tensor A = ctx.array(std::vector<float>{1, 2}, {2});
    Tensor c = ctx.empty({2});
    c.assign(Expr(A) + kiln::exp(kiln::scalar(1, DType::Float32) + kiln::scalar(1, DType::Float32)));
    auto v = c.to_vector<float>();
    CHECK(std::fabs(v[0] - (1 + std::exp(2.0))) < 1e-5);
    c.assign(Expr(A) * kiln::clip(kiln::cast(kiln::scalar(4, DType::UInt8), DType::BFloat16), -1.25, 1.25));
    CHECK(c.to_vector<float>() == std::vector<float>{1.25f, 2.5f});
    Tensor u = ctx.empty({}, DType::UInt8);
    u.assign(kiln::scalar(0, DType::Int32) - kiln::scalar(1.5, DType::BFloat16));  // -1.5 -> -1 -> wraps to 255
    CHECK(u.to_vector<uint8_t>() == std::vector<uint8_t>{255});
}

TEST_CASE("differential: random expression graphs against a float64 reference") {
    if (!test_device_usable()) return;
    Env env = read_env();
    // The graphs run in a child process: a crash (a kiln bug) then fails that one graph, which is
    // reported with its seed, and a new child carries on with the next graph instead of the whole
    // run dying. The counters live in shared memory. KILN_FUZZ_FORK=0, or a replayed seed, runs
    // in this process (for a debugger).
    void* mem = mmap(nullptr, sizeof(Totals), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    Totals& tot = *new (mem) Totals{};
    tot.current = -1;
    tot.next = env.first;
    auto t0 = std::chrono::steady_clock::now();
    if (env.seed || !env.fork) {
        run_graphs(tot, env, env.count);
    } else {
        while (tot.next < env.count) {
            std::fflush(stdout);
            std::fflush(stderr);
            pid_t pid = fork();
            REQUIRE(pid >= 0);
            if (pid == 0) {
                for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, SIG_DFL);
                int rc = 0;
                try {
                    run_graphs(tot, env, env.count);
                } catch (const std::exception& e) {
                    std::printf("differential: unexpected exception: %s\n", e.what());
                    rc = 3;
                } catch (...) {
                    rc = 3;
                }
                std::fflush(stdout);
                std::fflush(stderr);
                _exit(rc);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;
            ++tot.crashed;
            ++tot.failed;
            std::string how = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                                  : "exit status " + std::to_string(WEXITSTATUS(status));
            if (tot.current >= 0) {
                ++tot.graphs;
                uint64_t seed = graph_seed(tot.current);
                std::printf("FAILED graph seed %llu CRASHED the process (%s); replay with KILN_FUZZ_SEED=%llu "
                            "KILN_FUZZ_VERBOSE=1 to see the expression\n\n",
                            (unsigned long long)seed, how.c_str(), (unsigned long long)seed);
                tot.current = -1;
            } else {
                std::printf("FAILED: the graph runner crashed outside a graph (%s)\n\n", how.c_str());
                break;
            }
        }
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("differential: %lld failed (%lld crashed)\n", (long long)tot.failed, (long long)tot.crashed);
    std::printf("differential: %lld elements compared, %lld skipped as unstable (a discontinuity within the error bound), "
                "%lld NaN positions checked\n",
                (long long)tot.elements, (long long)tot.skipped, (long long)tot.nan_checked);
    std::printf("differential: kinds:");
    for (int k = 0; k < 6; ++k) std::printf(" %s %lld%s", kind_name((Kind)k), (long long)tot.by_kind[k], k < 5 ? "," : "\n");
    std::printf("differential: %lld with reductions, %lld with rand, %lld strided destinations, %lld cast on store, "
                "%lld broadcast on store\n",
                (long long)tot.with_reduction, (long long)tot.rand_graphs, (long long)tot.strided_dst,
                (long long)tot.cast_dst, (long long)tot.broadcast_dst);
    if (tot.nvrtc_over_cap)
        std::printf("differential: %lld distinct kernel keys; %lld over KILN_FUZZ_NVRTC_MAX=%lld not compiled by NVRTC\n",
                    (long long)tot.distinct_kernels, (long long)tot.nvrtc_over_cap, (long long)env.nvrtc_max);
    std::printf("differential: %.1f s (%s JIT: %lld kernels compiled in %.1f s; NVRTC checks: %.1f s of compiling, on worker threads)\n",
                secs, test_device().c_str(), (long long)tot.jit_compiles, tot.jit_ms / 1000, tot.nvrtc_ms / 1000);
    std::string cov = "differential: coverage (nodes):";
    std::vector<std::string> missing;
    for (int o = 0; o < kNumOps; ++o) {
        cov += std::string(" ") + op_name((Op)o) + " " + std::to_string(tot.op_count[o]);
        if (tot.op_count[o] == 0) missing.push_back(op_name((Op)o));
    }
    const char* composite_names[4] = {"clip", "mean", "var", "std"};
    for (int i = 0; i < 4; ++i) {
        cov += std::string(" ") + composite_names[i] + " " + std::to_string(tot.composite[i]);
        if (tot.composite[i] == 0) missing.push_back(composite_names[i]);
    }
    cov += "\ndifferential: coverage (dtypes):";
    for (int t = 0; t < 7; ++t) {
        cov += std::string(" ") + dname((DType)t) + " " + std::to_string(tot.dtype_count[t]);
        if (tot.dtype_count[t] == 0) missing.push_back(dname((DType)t));
    }
    cov += "; ranks:";
    for (int r = 0; r < 5; ++r) {
        cov += " " + std::to_string(r) + ":" + std::to_string(tot.rank_count[r]);
        if (tot.rank_count[r] == 0) missing.push_back("rank " + std::to_string(r));
    }
    cov += "; weak float " + std::to_string(tot.weak_float) + ", weak int " + std::to_string(tot.weak_int) +
           ", typed scalars " + std::to_string(tot.typed_scalar) + ", strided/transposed leaves " +
           std::to_string(tot.strided_leaves) + ", keepdims=false " + std::to_string(tot.keepdims_false) +
           ", all axes " + std::to_string(tot.all_axes);
    for (auto [n, name] : {std::pair{tot.weak_float, "weak float"}, {tot.weak_int, "weak int"}, {tot.typed_scalar, "typed scalar"},
                           {tot.strided_leaves, "strided leaf"}, {tot.keepdims_false, "keepdims=false"}, {tot.all_axes, "all axes"}})
        if (n == 0) missing.push_back(name);
    std::printf("%s\n", cov.c_str());
    // The last two lines, in this form, are what CI logs are searched for.
    std::printf("differential: %lld graphs checked\n", (long long)tot.graphs);
#ifdef KILN_DIFF_NVRTC
    std::printf("differential: %lld distinct CUDA kernels compiled for sm_90 and sm_80 (PTX; one in four also to "
                "sm_90 machine code)\n",
                (long long)tot.nvrtc_compiled);
#else
    std::printf("differential: 0 distinct CUDA kernels compiled for sm_80 and sm_90 (this build has no NVRTC)\n");
#endif
    std::fflush(stdout);
    Totals result = tot;
    munmap(mem, sizeof(Totals));
    if (!env.seed && env.first == 0 && result.graphs >= 1000) {
        // A full run must exercise everything the generator is meant to cover.
        std::string m;
        for (auto& x : missing) m += " " + x;
        INFO("never generated:" << m);
        CHECK(missing.empty());
    }
    INFO("failing graphs are printed above with their seeds; KILN_FUZZ_SEED=<seed> replays one");
    CHECK(result.nvrtc_failed == 0);
    CHECK(result.failed == 0);
#if defined(KILN_HAVE_NVRTC) && !defined(KILN_DIFF_NVRTC)
    FAIL("NVRTC is part of this build but codegen/cuda/cuda_codegen.hpp or runtime/cuda/nvrtc.hpp is missing: the "
         "generated CUDA C cannot be checked");
#endif
}
