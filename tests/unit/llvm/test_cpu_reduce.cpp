// CPU backend, reductions: row (batch-norm shape), column (tiled), arg-reductions with ties and
// NaN, full reductions in chunks (determinism across thread counts), empty reductions.
#include "tests/support/catch.hpp"
#include "tests/unit/llvm/cpu_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

using namespace kiln;
using namespace kiln::test;

namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// y = (x - mean) * rstd * gamma, reducing over dim `r` of a 2-D domain (the other is P):
// Loop(sum) Point(mean, stored) Loop(sum of squared deviations) Point(rstd) Loop(y, stored).
// fparams: 1/n, eps. Buffers: y, mean, x, gamma.
kir::Kernel batch_norm_kernel(const std::string& name, bool reduce_first) {
    KernelBuilder kb(name, reduce_first ? "RP" : "PR");
    int y = kb.buffer(DType::Float32, {SK::Any, SK::One}, true);
    int mean_out = kb.buffer(DType::Float32, reduce_first ? std::vector<SK>{SK::Zero, SK::One} : std::vector<SK>{SK::One, SK::Zero}, true);
    int x = kb.buffer(DType::Float32, {SK::Any, SK::One});
    int gamma = kb.buffer(DType::Float32, {SK::Zero, SK::One});
    kb.loop();
    int s = kb.accum(AccKind::Sum, kb.load(x));
    kb.point();
    int mean = kb.op(Op::Mul, CT::F32, kb.acc_result(s), kb.paramf(0));
    kb.store(mean_out, mean);
    kb.loop();
    int d = kb.op(Op::Sub, CT::F32, kb.load(x), mean);
    int ss = kb.accum(AccKind::Sum, kb.op(Op::Mul, CT::F32, d, d));
    kb.point();
    int var = kb.op(Op::Mul, CT::F32, kb.acc_result(ss), kb.paramf(0));
    int rstd = kb.op(Op::Div, CT::F32, kb.constf(1), kb.op(Op::Sqrt, CT::F32, kb.op(Op::Add, CT::F32, var, kb.paramf(1))));
    kb.loop();
    int centred = kb.op(Op::Sub, CT::F32, kb.load(x), mean);
    kb.store(y, kb.op(Op::Mul, CT::F32, kb.op(Op::Mul, CT::F32, centred, rstd), kb.load(gamma)));
    return kb.kernel();
}

void check_batch_norm(cpu::CpuJit& jit, bool reduce_first, int64_t P, int64_t R) {
    const int64_t d0 = reduce_first ? R : P, d1 = reduce_first ? P : R;
    const int64_t ld = d1 + 5;  // padded rows
    auto xv = random_floats(d0 * ld, 2, 4, 21);
    auto gv = random_floats(d1, 0.5f, 1.5f, 22);
    std::vector<float> yv(d0 * d1), mv(P);
    const float eps = 1e-5f;
    kir::Kernel k = batch_norm_kernel(reduce_first ? "bn_columns" : "bn_rows", reduce_first);
    run(jit, k, Launch({d0, d1})
               .buffer(yv.data(), {d1, 1})
               .buffer(mv.data(), reduce_first ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{1, 0})
               .buffer(xv.data(), {ld, 1})
               .buffer(gv.data(), {0, 1})
               .fparam(1.0f / (float)R)
               .fparam(eps));
    auto X = [&](int64_t p, int64_t r) { return (double)(reduce_first ? xv[r * ld + p] : xv[p * ld + r]); };
    auto Y = [&](int64_t p, int64_t r) { return (double)(reduce_first ? yv[r * d1 + p] : yv[p * d1 + r]); };
    int bad = 0;
    for (int64_t p = 0; p < P; ++p) {
        double m = 0, v = 0;
        for (int64_t r = 0; r < R; ++r) m += X(p, r);
        m /= (double)R;
        for (int64_t r = 0; r < R; ++r) v += (X(p, r) - m) * (X(p, r) - m);
        double rstd = 1 / std::sqrt(v / (double)R + eps);
        bad += !near_rel(mv[p], m, 1e-5);
        for (int64_t r = 0; r < R; ++r) {
            double g = gv[reduce_first ? p : r];
            bad += !near_rel(Y(p, r), (X(p, r) - m) * rstd * g, 1e-4);
        }
    }
    CHECK(bad == 0);
}

struct RefArg {
    float best;
    int32_t pos;
};

// The reference rule: the first extreme wins, the first NaN beats everything.
RefArg ref_arg(const std::vector<float>& v, bool mx) {
    RefArg r{mx ? -kInf : kInf, 0};
    for (size_t i = 0; i < v.size(); ++i) {
        if (std::isnan(r.best)) break;
        if (std::isnan(v[i]) || (mx ? v[i] > r.best : v[i] < r.best)) r = {v[i], (int32_t)i};
    }
    return r;
}

} // namespace

TEST_CASE("cpu jit: row reduction, batch-norm shape") { check_batch_norm(shared_jit(), false, 64, 1000); }

TEST_CASE("cpu jit: column reduction, batch-norm shape (tiles of the parallel dim)") {
    cpu::CpuJit one(1);
    check_batch_norm(one, true, 1100, 30);          // whole tiles and a partial one
    check_batch_norm(shared_jit(), true, 1100, 30);  // split across threads
    check_batch_norm(shared_jit(), true, 5, 40);     // a single partial tile
}

TEST_CASE("cpu jit: column reduction over a middle dim: sum, max, argmax, int min") {
    // Domain [B (P), N (R), M (P)], x contiguous; NaN in one column, a tie in another, -inf in a third.
    const int64_t B = 3, N = 200, M = 130;
    KernelBuilder kb("col_multi", "PRP");
    std::vector<SK> out_layout{SK::Any, SK::Zero, SK::One};
    int osum = kb.buffer(DType::Float32, out_layout, true);
    int omax = kb.buffer(DType::Float32, out_layout, true);
    int oarg = kb.buffer(DType::Int32, out_layout, true);
    int omin = kb.buffer(DType::Int32, out_layout, true);
    int x = kb.buffer(DType::Float32, {SK::Any, SK::Any, SK::One});
    int xi = kb.buffer(DType::Int32, {SK::Any, SK::Any, SK::One});
    kb.loop();
    int lx = kb.load(x);
    int as = kb.accum(AccKind::Sum, lx), am = kb.accum(AccKind::Max, lx), aa = kb.accum(AccKind::ArgMax, lx);
    int ai = kb.accum(AccKind::Min, kb.load(xi));
    kb.point();
    kb.store(osum, kb.acc_result(as));
    kb.store(omax, kb.acc_result(am));
    kb.store(oarg, kb.acc_result(aa));
    kb.store(omin, kb.acc_result(ai));

    auto xv = random_floats(B * N * M, -1, 1, 31);
    std::vector<int32_t> iv(B * N * M);
    std::mt19937 rng(32);
    for (auto& v : iv) v = (int32_t)rng();
    auto at = [&](int64_t b, int64_t n, int64_t m) { return (b * N + n) * M + m; };
    xv[at(1, 50, 7)] = kNaN;
    xv[at(1, 120, 7)] = kNaN;
    xv[at(0, 30, 9)] = 100;
    xv[at(0, 150, 9)] = 100;
    for (int64_t n = 0; n < N; ++n) xv[at(2, n, 11)] = -kInf;
    std::vector<float> sv(B * M), mv(B * M);
    std::vector<int32_t> av(B * M), nv(B * M);
    run(kb.kernel(), Launch({B, N, M})
                         .buffer(sv.data(), {M, 0, 1})
                         .buffer(mv.data(), {M, 0, 1})
                         .buffer(av.data(), {M, 0, 1})
                         .buffer(nv.data(), {M, 0, 1})
                         .buffer(xv.data(), {N * M, M, 1})
                         .buffer(iv.data(), {N * M, M, 1}));
    int bad = 0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t m = 0; m < M; ++m) {
            std::vector<float> col(N);
            double s = 0;
            int32_t mn = INT32_MAX;
            for (int64_t n = 0; n < N; ++n) {
                col[n] = xv[at(b, n, m)];
                s += col[n];
                mn = std::min(mn, iv[at(b, n, m)]);
            }
            RefArg r = ref_arg(col, true);
            bad += !near_rel(sv[b * M + m], s, 1e-5);
            bad += !same(mv[b * M + m], r.best);
            bad += av[b * M + m] != r.pos;
            bad += nv[b * M + m] != mn;
        }
    CHECK(bad == 0);
    CHECK(av[1 * M + 7] == 50);
    CHECK(std::isnan(mv[1 * M + 7]));
    CHECK(av[0 * M + 9] == 30);
    CHECK(av[2 * M + 11] == 0);
    CHECK(mv[2 * M + 11] == -kInf);
}

TEST_CASE("cpu jit: arg-reductions keep the first extreme; NaN wins, the first NaN") {
    const int64_t M = 8, N = 37;
    KernelBuilder kb("row_args", "PR");
    std::vector<SK> ol{SK::One, SK::Zero};
    int oamax = kb.buffer(DType::Int32, ol, true);
    int oamin = kb.buffer(DType::Int32, ol, true);
    int omax = kb.buffer(DType::Float32, ol, true);
    int omin = kb.buffer(DType::Float32, ol, true);
    int oiamax = kb.buffer(DType::Int32, ol, true);
    int oiamin = kb.buffer(DType::Int32, ol, true);
    int x = kb.buffer(DType::Float32, {SK::Any, SK::One});
    int xi = kb.buffer(DType::Int32, {SK::Any, SK::One});
    kb.loop();
    int lx = kb.load(x), li = kb.load(xi);
    int a0 = kb.accum(AccKind::ArgMax, lx), a1 = kb.accum(AccKind::ArgMin, lx);
    int a2 = kb.accum(AccKind::Max, lx), a3 = kb.accum(AccKind::Min, lx);
    int a4 = kb.accum(AccKind::ArgMax, li), a5 = kb.accum(AccKind::ArgMin, li);
    kb.point();
    kb.store(oamax, kb.acc_result(a0));
    kb.store(oamin, kb.acc_result(a1));
    kb.store(omax, kb.acc_result(a2));
    kb.store(omin, kb.acc_result(a3));
    kb.store(oiamax, kb.acc_result(a4));
    kb.store(oiamin, kb.acc_result(a5));

    auto xv = random_floats(M * N, -5, 5, 41);
    std::vector<int32_t> iv(M * N);
    for (int64_t i = 0; i < M * N; ++i) iv[i] = (int32_t)((i * 7919) % 23) - 11;  // many ties
    auto row = [&](int64_t r) { return xv.begin() + r * N; };
    row(0)[3] = 9, row(0)[20] = 9, row(0)[4] = -9, row(0)[30] = -9;  // ties
    row(1)[5] = kNaN, row(1)[9] = kNaN;                              // NaN wins, the first
    std::fill(row(2), row(2) + N, -kInf);                            // all at the max's identity
    row(3)[0] = kNaN;
    row(4)[10] = kInf, row(4)[12] = kNaN;
    std::fill(row(5), row(5) + N, kInf);
    row(6)[1] = -0.0f, row(6)[2] = 0.0f;
    std::vector<int32_t> amax(M), amin(M), iamax(M), iamin(M);
    std::vector<float> mx(M), mn(M);
    run(kb.kernel(), Launch({M, N})
                         .buffer(amax.data(), {1, 0})
                         .buffer(amin.data(), {1, 0})
                         .buffer(mx.data(), {1, 0})
                         .buffer(mn.data(), {1, 0})
                         .buffer(iamax.data(), {1, 0})
                         .buffer(iamin.data(), {1, 0})
                         .buffer(xv.data(), {N, 1})
                         .buffer(iv.data(), {N, 1}));
    for (int64_t r = 0; r < M; ++r) {
        std::vector<float> v(row(r), row(r) + N);
        RefArg hi = ref_arg(v, true), lo = ref_arg(v, false);
        INFO("row " << r);
        CHECK(amax[r] == hi.pos);
        CHECK(amin[r] == lo.pos);
        CHECK(same(mx[r], hi.best));
        CHECK(same(mn[r], lo.best));
        const int32_t* ir = iv.data() + r * N;
        CHECK(iamax[r] == (int32_t)(std::max_element(ir, ir + N) - ir));
        CHECK(iamin[r] == (int32_t)(std::min_element(ir, ir + N) - ir));
    }
    CHECK(amax[0] == 3);
    CHECK(amin[0] == 4);
    CHECK(amax[1] == 5);
    CHECK(amin[1] == 5);
    CHECK(amax[2] == 0);
    CHECK(amin[5] == 0);
    CHECK(amax[4] == 12);
}

namespace {

// Full reduction of x[n] (rank 1): sum, mean (sum * p0), max, argmax. Buffers: 4 outputs, x.
kir::Kernel full_kernel() {
    KernelBuilder kb("full_1d", "R");
    int osum = kb.buffer(DType::Float32, {SK::Zero}, true);
    int omean = kb.buffer(DType::Float32, {SK::Zero}, true);
    int omax = kb.buffer(DType::Float32, {SK::Zero}, true);
    int oarg = kb.buffer(DType::Int32, {SK::Zero}, true);
    int x = kb.buffer(DType::Float32, {SK::One});
    kb.loop();
    int lx = kb.load(x);
    int s = kb.accum(AccKind::Sum, lx), m = kb.accum(AccKind::Max, lx), a = kb.accum(AccKind::ArgMax, lx);
    kb.point();
    int rs = kb.acc_result(s);
    kb.store(osum, rs);
    kb.store(omean, kb.op(Op::Mul, CT::F32, rs, kb.paramf(0)));
    kb.store(omax, kb.acc_result(m));
    kb.store(oarg, kb.acc_result(a));
    return kb.kernel();
}

struct FullResult {
    float sum, mean, max;
    int32_t arg;
};

FullResult run_full(cpu::CpuJit& jit, const std::vector<float>& x) {
    FullResult r{-1, -1, -1, -1};
    run(jit, full_kernel(),
        Launch({(int64_t)x.size()})
            .buffer(&r.sum, {0})
            .buffer(&r.mean, {0})
            .buffer(&r.max, {0})
            .buffer(&r.arg, {0})
            .buffer(x.data(), {1})
            .fparam(x.empty() ? 0.0f : 1.0f / (float)x.size()));
    return r;
}

} // namespace

TEST_CASE("cpu jit: full reduction in chunks is exact enough and deterministic") {
    const int64_t N = 3000017;  // ~92 chunks
    auto x = random_floats(N, 0.5f, 1.5f, 51);
    x[100000] = 10;   // a tie across chunks: the first wins
    x[2500000] = 10;
    double s = 0;
    for (float v : x) s += v;

    FullResult a = run_full(shared_jit(), x);
    CHECK(near_rel(a.sum, s, 1e-5));
    CHECK(near_rel(a.mean, s / (double)N, 1e-5));
    CHECK(a.max == 10);
    CHECK(a.arg == 100000);

    cpu::CpuJit one(1), three(3);
    ::setenv("KILN_NUM_THREADS", "1", 1);
    cpu::CpuJit from_env;
    ::unsetenv("KILN_NUM_THREADS");
    CHECK(from_env.num_threads() == 1);
    for (cpu::CpuJit* j : {&one, &three, &from_env}) {
        FullResult b = run_full(*j, x);
        CHECK(bits_of(b.sum) == bits_of(a.sum));
        CHECK(bits_of(b.mean) == bits_of(a.mean));
        CHECK(b.arg == a.arg);
    }

    x[2000000] = kNaN;  // NaN beats the maximum, the first NaN wins
    x[2900000] = kNaN;
    FullResult n = run_full(three, x);
    CHECK(std::isnan(n.max));
    CHECK(std::isnan(n.sum));
    CHECK(n.arg == 2000000);
}

TEST_CASE("cpu jit: empty reductions give the identities") {
    FullResult e = run_full(shared_jit(), {});
    CHECK(e.sum == 0);
    CHECK(e.max == -kInf);
    CHECK(e.arg == 0);

    // Rows of length 0 (row kernel) and columns of length 0 (tiled kernel): the Point block runs.
    for (bool reduce_first : {false, true}) {
        KernelBuilder kb(reduce_first ? "empty_cols" : "empty_rows", reduce_first ? "RP" : "PR");
        int o = kb.buffer(DType::Float32, reduce_first ? std::vector<SK>{SK::Zero, SK::One} : std::vector<SK>{SK::One, SK::Zero}, true);
        int x = kb.buffer(DType::Float32, {SK::Any, SK::One});
        kb.loop();
        int s = kb.accum(AccKind::Sum, kb.load(x));
        kb.point();
        kb.store(o, kb.op(Op::Add, CT::F32, kb.acc_result(s), kb.constf(2)));
        std::vector<float> out(70, -1);
        float dummy = 0;
        std::vector<int64_t> sizes = reduce_first ? std::vector<int64_t>{0, 70} : std::vector<int64_t>{70, 0};
        run(kb.kernel(), Launch(sizes)
                             .buffer(out.data(), reduce_first ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{1, 0})
                             .buffer(&dummy, {1, 1}));
        CHECK(std::count(out.begin(), out.end(), 2.0f) == 70);
    }
}

TEST_CASE("cpu jit: full reduction over two dims, strided, positions are absolute") {
    // x[i, j] with padded rows; sum and argmin over both dims: chunks split dim 0 only.
    const int64_t A = 6, B = 70001, ld = B + 3;
    KernelBuilder kb("full_2d", "RR");
    int osum = kb.buffer(DType::Float32, {SK::Zero, SK::Zero}, true);
    int oarg = kb.buffer(DType::Int32, {SK::Zero, SK::Zero}, true);
    int x = kb.buffer(DType::Float32, {SK::Any, SK::One});
    kb.loop();
    int lx = kb.load(x);
    int s = kb.accum(AccKind::Sum, lx), a = kb.accum(AccKind::ArgMin, lx);
    kb.point();
    kb.store(osum, kb.acc_result(s));
    kb.store(oarg, kb.acc_result(a));
    auto xv = random_floats(A * ld, 1, 2, 61);
    xv[4 * ld + 12345] = -3;
    xv[5 * ld + 7] = -3;
    float sum = 0;
    int32_t arg = -1;
    run(kb.kernel(), Launch({A, B}).buffer(&sum, {0, 0}).buffer(&arg, {0, 0}).buffer(xv.data(), {ld, 1}));
    double s_ref = 0;
    for (int64_t i = 0; i < A; ++i)
        for (int64_t j = 0; j < B; ++j) s_ref += xv[i * ld + j];
    CHECK(near_rel(sum, s_ref, 1e-5));
    CHECK(arg == 4 * B + 12345);
}

TEST_CASE("cpu jit: a full reduction with a second pass breaks the kernel IR's rules and is refused") {
    // Loop(sum) Point(mean) Loop(sum of squared deviations) Point(var): the lowering never makes
    // one (legality gives a full reduction's kernel a single pass); the checker both renderers
    // share refuses it, naming the rule.
    KernelBuilder kb("full_var", "R");
    int ovar = kb.buffer(DType::Float32, {SK::Zero}, true);
    int x = kb.buffer(DType::Float32, {SK::One});
    kb.loop();
    int s = kb.accum(AccKind::Sum, kb.load(x));
    kb.point();
    int mean = kb.op(Op::Mul, CT::F32, kb.acc_result(s), kb.paramf(0));
    kb.loop();
    int d = kb.op(Op::Sub, CT::F32, kb.load(x), mean);
    int ss = kb.accum(AccKind::Sum, kb.op(Op::Mul, CT::F32, d, d));
    kb.point();
    kb.store(ovar, kb.op(Op::Mul, CT::F32, kb.acc_result(ss), kb.paramf(0)));
    std::string message;
    try {
        shared_jit().compile(kb.kernel(), kb.kernel().name);
    } catch (const std::logic_error& e) {
        message = e.what();
    }
    CHECK(message.find("malformed kernel 'full_var'") != std::string::npos);
    CHECK(message.find("a full reduction has exactly two blocks: Loop, then Point") != std::string::npos);
}
