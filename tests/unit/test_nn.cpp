// Batch norm (forward in training and inference, backward), softmax, cross-entropy and the
// activation helpers on the CPU backend against float64 references; the backward batch norm's
// reference is itself checked against finite differences of the forward one. Misuse messages.
#include "tests/support/catch.hpp"
#include "tests/support/error_message.hpp"
#include "tests/support/pool_reference.hpp"
#include "tests/support/random_values.hpp"

#include <kiln/kiln.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

using namespace kiln;
using kiln::test::make;
using kiln::test::random_values;

namespace {

// y = (x - mean) / sqrt(var + eps) * gamma + beta per channel (the last of n x C values).
std::vector<double> bn_forward(const std::vector<double>& x, const std::vector<double>& gamma,
                               const std::vector<double>& beta, size_t C, double eps, std::vector<double>* mean_out = nullptr,
                               std::vector<double>* var_out = nullptr) {
    const size_t n = x.size() / C;
    std::vector<double> mean(C, 0.0), var(C, 0.0), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) mean[i % C] += x[i] / (double)n;
    for (size_t i = 0; i < x.size(); ++i) var[i % C] += (x[i] - mean[i % C]) * (x[i] - mean[i % C]) / (double)n;
    for (size_t i = 0; i < x.size(); ++i)
        y[i] = (x[i] - mean[i % C]) / std::sqrt(var[i % C] + eps) * gamma[i % C] + beta[i % C];
    if (mean_out) *mean_out = mean;
    if (var_out) *var_out = var;
    return y;
}

int count_far(const std::vector<float>& got, const std::vector<double>& want, double tol) {
    REQUIRE(got.size() == want.size());
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += !(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
    return bad;
}

} // namespace

TEST_CASE("nn: compound_fprop_bn: batch statistics, running averages, accumbeta, relu, inference; every float dtype") {
    Context ctx(ContextOptions{"cpu"});
    const Shape shape{3, 4, 5, 6};
    const size_t C = 6, n = 60;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16}) {
        INFO(dtype_name(dt));
        const double tol = dt == DType::Float32 ? 2e-5 : dt == DType::Float16 ? 4e-3 : 3e-2;
        std::vector<double> x = random_values(n * C, 1, -2, 3), gamma = random_values(C, 2, 0.5, 2), beta = random_values(C, 3);
        std::vector<double> gm0 = random_values(C, 4), gv0 = random_values(C, 5, 0.5, 1.5), y0 = random_values(n * C, 6);
        Tensor X = make(ctx, x, shape, dt), G = make(ctx, gamma, {C, 1}), B = make(ctx, beta, {C, 1});
        Tensor xsum = ctx.empty({C, 1}), xvar = ctx.empty({C, 1}), gmean = make(ctx, gm0, {C, 1}), gvar = make(ctx, gv0, {C});
        Tensor Y = make(ctx, y0, shape, dt);
        compound_fprop_bn(X, xsum, xvar, gmean, gvar, G, B, Y, 1e-3, 0.9, true, 0.5, true);
        std::vector<double> mean, var;
        std::vector<double> want = bn_forward(x, gamma, beta, C, 1e-3, &mean, &var);
        for (size_t i = 0; i < want.size(); ++i) want[i] = std::max(want[i] + 0.5 * y0[i], 0.0);
        CHECK(count_far(Y.to_vector<float>(), want, tol) == 0);
        std::vector<double> sums(C), gm(C), gv(C);
        for (size_t c = 0; c < C; ++c) {
            sums[c] = mean[c] * (double)n;
            gm[c] = 0.9 * gm0[c] + 0.1 * mean[c];
            gv[c] = 0.9 * gv0[c] + 0.1 * var[c];
        }
        CHECK(count_far(xsum.to_vector<float>(), sums, 1e-5 * n) == 0);
        CHECK(count_far(xvar.to_vector<float>(), var, 1e-5) == 0);
        CHECK(count_far(gmean.to_vector<float>(), gm, 1e-5) == 0);
        CHECK(count_far(gvar.to_vector<float>(), gv, 1e-5) == 0);

        // A residual added before the relu in the same kernel (a residual block's end).
        std::vector<double> r0 = random_values(n * C, 7, -2, 2);
        Tensor R = make(ctx, r0, shape, dt), Yr = ctx.empty(shape, dt);
        Tensor gm_r = make(ctx, gm0, {C, 1}), gv_r = make(ctx, gv0, {C});
        compound_fprop_bn(X, xsum, xvar, gm_r, gv_r, G, B, Yr, 1e-3, 0.9, true, 0.0, true, false, R);
        std::vector<double> with_r = bn_forward(x, gamma, beta, C, 1e-3);
        for (size_t i = 0; i < with_r.size(); ++i) with_r[i] = std::max(with_r[i] + r0[i], 0.0);
        CHECK(count_far(Yr.to_vector<float>(), with_r, tol) == 0);
        Tensor wrong = ctx.empty({3, 4, 5, 7}, dt);
        CHECK_THAT(test::error_message([&] {
                       compound_fprop_bn(X, xsum, xvar, gm_r, gv_r, G, B, Yr, 1e-3, 0.9, true, 0.0, true, false, wrong);
                   }),
                   Catch::Matchers::Contains("compound_fprop_bn: residual is ") &&
                       Catch::Matchers::Contains("; it must have x's shape (3, 4, 5, 6)"));

        // xsum given (e.g. by the convolution's bsum): not recomputed.
        std::vector<double> given(C);
        for (size_t c = 0; c < C; ++c) given[c] = sums[c] + 3.0 * (double)n;   // a mean shifted by 3
        Tensor xsum2 = make(ctx, given, {C});
        compound_fprop_bn(X, xsum2, xvar, gmean, gvar, G, B, Y, 1e-3, 0.9, false);
        const std::vector<float> xv = xvar.to_vector<float>();
        for (size_t c = 0; c < C; ++c) CHECK(std::fabs(xv[c] - (var[c] + 9.0)) <= 1e-4 * (var[c] + 9.0));

        // Inference: the running statistics normalise; nothing else changes.
        const std::vector<float> gm_before = gmean.to_vector<float>(), gv_before = gvar.to_vector<float>();
        compound_fprop_bn(X, xsum, xvar, gmean, gvar, G, B, Y, 1e-3, 0.9, true, 0.0, false, true);
        CHECK(gmean.to_vector<float>() == gm_before);
        std::vector<double> inf(n * C);
        for (size_t i = 0; i < inf.size(); ++i)
            inf[i] = (x[i] - gm_before[i % C]) / std::sqrt(gv_before[i % C] + 1e-3) * gamma[i % C] + beta[i % C];
        CHECK(count_far(Y.to_vector<float>(), inf, tol) == 0);
    }
    // Inference into 16-bit outputs (x * scale + shift) on running means far from zero against
    // the spread (100 to 1), results of either sign: within the output's rounding. Also in a
    // context whose default dtype is float16 (the per-channel vectors stay float32).
    Context half_default(ContextOptions{"cpu", 0, DType::Float16});
    std::vector<float> inferred[2][2];
    for (int ci = 0; ci < 2; ++ci)
        for (int di = 0; di < 2; ++di) {
            Context* c = ci ? &half_default : &ctx;
            const DType dt = di ? DType::BFloat16 : DType::Float16;
            INFO(dtype_name(dt) << ", default dtype " << dtype_name(c->default_dtype()));
            std::vector<double> xf = random_values(n * C, 10, 99, 101), gamma(C), beta = random_values(C, 11, -0.5, 0.5);
            std::vector<double> gm(C, 100.0), gv = random_values(C, 12, 0.5, 2);
            for (size_t k = 0; k < C; ++k) gamma[k] = 0.5 + 0.25 * (double)k;
            Tensor X = make(*c, xf, shape, dt), G = make(*c, gamma, {C}), B = make(*c, beta, {C});   // xf rounded to dt
            Tensor xsum = c->empty({C}, DType::Float32), xvar = c->empty({C}, DType::Float32);
            Tensor gmean = make(*c, gm, {C}), gvar = make(*c, gv, {C});
            Tensor Y = c->empty(shape, dt);
            compound_fprop_bn(X, xsum, xvar, gmean, gvar, G, B, Y, 1e-5, 0.9, true, 0.0, false, true);
            const std::vector<float> y = Y.to_vector<float>();
            const double step = dt == DType::Float16 ? 0x1p-11 : 0x1p-8;
            int far = 0;
            for (size_t i = 0; i < y.size(); ++i) {
                const size_t k = i % C;
                const double want = (xf[i] - 100.0) / std::sqrt(gv[k] + 1e-5) * gamma[k] + beta[k];
                far += !(std::fabs(y[i] - want) <= step * std::fabs(want) + 1e-5);
            }
            CHECK(far == 0);
            inferred[ci][di] = y;
        }
    CHECK(inferred[1][0] == inferred[0][0]);
    CHECK(inferred[1][1] == inferred[0][1]);

    // Means far from zero against the spread (100 to 1), and a constant channel (variance 0, so
    // scale = 1 / sqrt(eps): the mean, xsum / n correctly rounded, is exact and the result beta).
    std::vector<double> x = random_values(n * C, 8, 99, 101), gamma(C, 1.0), beta(C, 0.1), zeros(C, 0.0), ones(C, 1.0);
    for (size_t i = 0; i < n; ++i) x[i * C] = 100.0;
    Tensor X = make(ctx, x, shape, DType::Float16), G = make(ctx, gamma, {C}), B = make(ctx, beta, {C});
    Tensor xsum = ctx.empty({C}), xvar = ctx.empty({C}), gmean = make(ctx, zeros, {C}), gvar = make(ctx, ones, {C});
    Tensor Y = ctx.empty(shape, DType::Float16);
    compound_fprop_bn(X, xsum, xvar, gmean, gvar, G, B, Y, 1e-5, 0.9, true);
    const std::vector<float> y = Y.to_vector<float>();
    CHECK(count_far(y, bn_forward(x, gamma, beta, C, 1e-5), 4e-3) == 0);
    for (size_t i = 0; i < n; ++i) CHECK(std::fabs(y[i * C] - beta[0]) <= 6.2e-5);   // half a float16 step at 0.1

    // The variance of data whose mean (1000) dwarfs its spread (about 0.6), 2000 rows, the first
    // row 5 to 8 spreads off the mean. float32 takes two passes (the variance about the mean):
    // float32's rounding. 16-bit data takes one (sums about a shift K, the mean of 64 rows spread
    // over the batch, which the outlying first row hardly moves), which loses about
    // (K - mean)^2 / var of float32's precision, where E[x^2] - E[x]^2 without a shift would
    // lose every digit.
    // The same in a context whose default dtype is float16: the sums stay float32, so the
    // variances are the same bits.
    std::vector<float> variances[2][2];
    for (int ci = 0; ci < 2; ++ci)
        for (int di = 0; di < 2; ++di) {
            Context* cx = ci ? &half_default : &ctx;
            const DType dt = di ? DType::Float16 : DType::Float32;
            INFO(dtype_name(dt) << ", default dtype " << dtype_name(cx->default_dtype()));
            const size_t rows = 2000;
            std::vector<double> xb = random_values(rows * C, 9, 999, 1001);
            for (size_t c = 0; c < C; ++c) xb[c] = 1000.0 + 3.0 + 0.3 * (double)c;
            Tensor Xb = make(*cx, xb, {(int64_t)rows, (int64_t)C}, dt);
            Tensor Gc = make(*cx, gamma, {C}), Bc = make(*cx, beta, {C});
            Tensor sb = cx->empty({C}, DType::Float32), vb = cx->empty({C}, DType::Float32), mb = make(*cx, zeros, {C}),
                   gb = make(*cx, ones, {C});
            Tensor Yb = cx->empty({(int64_t)rows, (int64_t)C}, dt);
            compound_fprop_bn(Xb, sb, vb, mb, gb, Gc, Bc, Yb, 1e-5, 0.9, true);
            std::vector<double> mean, var;
            bn_forward(xb, gamma, beta, C, 1e-5, &mean, &var);
            const std::vector<float> v = vb.to_vector<float>();
            const double tol = dt == DType::Float32 ? 1e-5 : 2e-4;
            for (size_t c = 0; c < C; ++c) CHECK(std::fabs(v[c] - var[c]) <= tol * var[c]);
            variances[ci][di] = v;
        }
    CHECK(variances[1][0] == variances[0][0]);
    CHECK(variances[1][1] == variances[0][1]);
}

TEST_CASE("nn: compound_bprop_bn against the gradient of the forward pass (checked by finite differences)") {
    Context ctx(ContextOptions{"cpu"});
    const size_t C = 3, n = 20;
    const double eps = 1e-2;
    std::vector<double> x = random_values(n * C, 11, -1, 2), gamma = random_values(C, 12, 0.5, 2), beta = random_values(C, 13);
    std::vector<double> d = random_values(n * C, 14);
    Tensor X = make(ctx, x, {4, 5, C}), G = make(ctx, gamma, {C}), B = make(ctx, beta, {C}), D = make(ctx, d, {4, 5, C});
    Tensor xsum = ctx.empty({C}), xvar = ctx.empty({C}), gm = ctx.zeros({C}), gv = ctx.zeros({C}), Y = ctx.empty({4, 5, C});
    compound_fprop_bn(X, xsum, xvar, gm, gv, G, B, Y, eps, 0.9, true);
    Tensor dX = ctx.empty({4, 5, C}), dG = ctx.empty({C}), dB = ctx.empty({C, 1});
    compound_bprop_bn(dX, dG, dB, D, X, xsum, xvar, G, eps);
    // The loss sum(d * y): its gradients by central differences of bn_forward in float64.
    auto loss = [&](const std::vector<double>& xx, const std::vector<double>& gg, const std::vector<double>& bb) {
        const std::vector<double> y = bn_forward(xx, gg, bb, C, eps);
        double s = 0;
        for (size_t i = 0; i < y.size(); ++i) s += d[i] * y[i];
        return s;
    };
    const double h = 1e-5;
    auto fd = [&](std::vector<double>& v, size_t i) {
        const double keep = v[i];
        v[i] = keep + h;
        const double up = loss(x, gamma, beta);
        v[i] = keep - h;
        const double down = loss(x, gamma, beta);
        v[i] = keep;
        return (up - down) / (2 * h);
    };
    const std::vector<float> gx = dX.to_vector<float>(), gg = dG.to_vector<float>(), gb = dB.to_vector<float>();
    {
        // float16 activations (and a constant channel, variance 0): the float32 path's gradient on
        // the same rounded values, to float16's rounding.
        std::vector<double> xr = x, dr = d;
        for (size_t i = 0; i < n; ++i) xr[i * C] = 50.0;   // a constant channel: variance 0
        Tensor X16 = make(ctx, xr, {4, 5, C}, DType::Float16), D16 = make(ctx, dr, {4, 5, C}, DType::Float16);
        Tensor Xr = make(ctx, xr, {4, 5, C}), Dr = make(ctx, dr, {4, 5, C});
        Tensor s16 = ctx.empty({C}), v16 = ctx.empty({C}), Y16 = ctx.empty({4, 5, C}, DType::Float16);
        compound_fprop_bn(X16, s16, v16, gm, gv, G, B, Y16, eps, 0.9, true);
        Tensor dX16 = ctx.empty({4, 5, C}, DType::Float16), dXr = ctx.empty({4, 5, C});
        compound_bprop_bn(dX16, dG, dB, D16, X16, s16, v16, G, eps);
        compound_bprop_bn(dXr, dG, dB, Dr, Xr, s16, v16, G, eps);
        const std::vector<float> a = dX16.to_vector<float>(), b = dXr.to_vector<float>();
        int far = 0;
        for (size_t i = 0; i < a.size(); ++i) far += !(std::fabs(a[i] - b[i]) <= 2e-3 * (1 + std::fabs(b[i])));
        CHECK(far == 0);
    }
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) bad += !(std::fabs(gx[i] - fd(x, i)) <= 1e-4 * (1 + std::fabs(gx[i])));
    for (size_t c = 0; c < C; ++c) {
        bad += !(std::fabs(gg[c] - fd(gamma, c)) <= 1e-4 * (1 + std::fabs(gg[c])));
        bad += !(std::fabs(gb[c] - fd(beta, c)) <= 1e-4 * (1 + std::fabs(gb[c])));
    }
    CHECK(bad == 0);
}

TEST_CASE("nn: softmax, cross-entropy from targets and from labels, relu helpers, activation derivatives") {
    Context ctx(ContextOptions{"cpu"});
    std::vector<double> z = random_values(5 * 7, 21, -30, 30);
    Tensor Z = make(ctx, z, {5, 7});
    Tensor P = ctx.eval(softmax(Z));
    const std::vector<float> p = P.to_vector<float>();
    std::vector<double> want(z.size());
    for (int r = 0; r < 5; ++r) {
        double m = -1e300, s = 0;
        for (int c = 0; c < 7; ++c) m = std::max(m, z[r * 7 + c]);
        for (int c = 0; c < 7; ++c) s += std::exp(z[r * 7 + c] - m);
        for (int c = 0; c < 7; ++c) want[r * 7 + c] = std::exp(z[r * 7 + c] - m) / s;
    }
    CHECK(count_far(p, want, 1e-6) == 0);
    CHECK(count_far(ctx.eval(softmax(Z.T(), 0)).T().to_vector<float>(), want, 1e-6) == 0);

    const std::vector<int32_t> labels{3, 0, 6, 6, 1};
    Tensor L = ctx.array(labels, {5});
    std::vector<float> onehot(35, 0.0f);
    double ce = 0;
    for (int r = 0; r < 5; ++r) {
        onehot[r * 7 + labels[r]] = 1.0f;
        ce -= std::log(std::max((double)p[r * 7 + labels[r]], std::exp(-50.0)));
    }
    Tensor T = ctx.array(onehot, {5, 7});
    const float mean_ce = ctx.eval(cross_entropy(P, T)).to_vector<float>()[0];
    CHECK(std::fabs(mean_ce - ce / 5) <= 1e-5 * (1 + ce));
    CHECK(std::fabs(ctx.eval(cross_entropy(P, T, -1, false)).to_vector<float>()[0] - ce) <= 1e-5 * (1 + ce));
    CHECK(ctx.eval(cross_entropy_labels(P, L)).to_vector<float>()[0] == mean_ce);
    CHECK(std::fabs(ctx.eval(cross_entropy_labels(P, L, false)).to_vector<float>()[0] - ce) <= 1e-5 * (1 + ce));
    // Labels of other integer dtypes; a label outside [0, 7) (negative, past the classes, or one
    // that int32 would wrap onto a class) makes the loss NaN, in either reduction.
    CHECK(ctx.eval(cross_entropy_labels(P, ctx.array(std::vector<uint8_t>{3, 0, 6, 6, 1}, {5, 1}))).to_vector<float>()[0] ==
          mean_ce);
    for (int64_t bad : {int64_t(-1), int64_t(7), (int64_t(1) << 32) + 3}) {
        INFO("label " << bad);
        Tensor Lb = ctx.array(std::vector<int64_t>{3, 0, bad, 6, 1}, {5});
        CHECK(std::isnan(ctx.eval(cross_entropy_labels(P, Lb)).to_vector<float>()[0]));
        CHECK(std::isnan(ctx.eval(cross_entropy_labels(P, Lb, false)).to_vector<float>()[0]));
    }

    Tensor X = ctx.array(std::vector<float>{-2.0f, 0.0f, 3.0f, std::nanf("")}, {4});
    Tensor Err = ctx.array(std::vector<float>{1.0f, 1.0f, 2.0f, 1.0f}, {4});
    const std::vector<float> r = ctx.eval(fprop_relu(X)).to_vector<float>(), lr = ctx.eval(fprop_relu(X, 0.1)).to_vector<float>();
    CHECK(r[0] == 0.0f);
    CHECK(r[2] == 3.0f);
    CHECK(std::isnan(r[3]));
    CHECK(lr[0] == Approx(-0.2f));
    const std::vector<float> br = ctx.eval(bprop_relu(X, Err, 0.25)).to_vector<float>();
    CHECK(br == std::vector<float>{0.25f, 0.0f, 2.0f, 0.0f});
    Tensor Yv = ctx.array(std::vector<float>{0.25f, -0.5f}, {2});
    CHECK(ctx.eval(sigmoid_grad(Yv)).to_vector<float>() == std::vector<float>{0.1875f, -0.75f});
    CHECK(ctx.eval(tanh_grad(Yv)).to_vector<float>() == std::vector<float>{0.9375f, 0.75f});
}

TEST_CASE("nn: misuse names the operation, the tensor and what is valid") {
    Context ctx(ContextOptions{"cpu"});
    Tensor X = ctx.zeros({4, 3}), v3 = ctx.zeros({3}), v4 = ctx.zeros({4}), Y = ctx.empty({4, 3});
    Tensor s = ctx.empty({3}), q = ctx.empty({3});
    CHECK_THROWS_WITH(compound_fprop_bn(X, s, q, v3, v3, v4, v3, Y, 1e-3, 0.9, true),
                      Catch::Matchers::Contains("compound_fprop_bn: gamma is float32 (4,); x has 3 channels (its last axis), "
                                                "so it must be (3,) or (3, 1)"));
    Tensor wrongY = ctx.empty({3, 4});
    CHECK_THROWS_WITH(compound_fprop_bn(X, s, q, v3, v3, v3, v3, wrongY, 1e-3, 0.9, true),
                      Catch::Matchers::Contains("y is float32 (3, 4); it must have x's shape (4, 3)"));
    CHECK_THROWS_WITH(compound_fprop_bn(X, s, q, v3, v3, v3, v3, Y, 1e-3, 1.5, true),
                      Catch::Matchers::Contains("rho=1.5; the running averages' weight is in [0, 1]"));
    CHECK_THROWS_WITH(compound_fprop_bn(ctx.zeros({4, 3}, DType::Int32), s, q, v3, v3, v3, v3, Y, 1e-3, 0.9, true),
                      Catch::Matchers::Contains("x is int32 (4, 3); it must be a float tensor"));
    Tensor dX = ctx.empty({4, 3});
    CHECK_THROWS_WITH(compound_bprop_bn(dX, s, q, ctx.zeros({4, 4}), X, v3, v3, v3, 1e-3),
                      Catch::Matchers::Contains("compound_bprop_bn: delta_in is float32 (4, 4)"));
    CHECK_THROWS_WITH(cross_entropy(X, ctx.zeros({3, 4})),
                      Catch::Matchers::Contains("cross_entropy: p is (4, 3) and the targets (3, 4)"));
    CHECK_THROWS_WITH(cross_entropy_labels(X, ctx.zeros({4})),
                      Catch::Matchers::Contains("labels are float32 (4,); class indices are an integer tensor"));
    CHECK_THROWS_WITH(cross_entropy_labels(X, ctx.zeros({3}, DType::Int32)),
                      Catch::Matchers::Contains("p has 4 rows, so they must be (4,) or (4, 1)"));
    CHECK_THROWS_WITH(softmax(X, 2), Catch::Matchers::Contains("softmax"));
}

TEST_CASE("nn: pooling max, avg and l2 with overlap, padding and channel windows; argmax; bprop accumulates overlaps") {
    Context ctx(ContextOptions{"cpu"});
    struct PoolCase { int64_t N, C; Dims3 image; int64_t J; Dims3 window; int64_t pad_c; Dims3 pad; int64_t str_c; Dims3 stride; };
    const std::vector<PoolCase> pcases = {
        {2, 3, {1, 7, 6}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 2, 2}},   // 3x3/2 pad 1: overlapping, AlexNet-style
        {1, 4, {1, 1, 9}, 1, {1, 1, 2}, 0, {0, 0, 0}, 0, {0, 0, 0}},   // 1D, default stride = window
        {1, 6, {3, 4, 4}, 2, {2, 2, 2}, 0, {1, 0, 0}, 1, {1, 1, 2}},   // 3D, with 2-channel windows at channel stride 1
        // Windows mostly padding, a stride past the input: taps 0, 3-5 and 8 of 9 read the input
        {1, 2, {1, 1, 3}, 1, {1, 1, 9}, 0, {0, 0, 8}, 0, {0, 0, 5}},
        {1, 2, {1, 1, 2}, 9, {1, 1, 1}, 8, {0, 0, 0}, 5, {0, 0, 0}},   // and along the channels: 3, 4 and 8
    };
    for (PoolOp pop : {PoolOp::Max, PoolOp::Avg, PoolOp::L2})
        for (const PoolCase& c : pcases) {
            const PoolLayer L = pool_layer(DType::Float32, pop, c.N, c.C, c.image, c.J, c.window, c.pad_c, c.pad, c.str_c, c.stride);
            INFO(L.str());
            std::vector<double> x = random_values((size_t)numel(L.input_shape()), 31, -1, 1);
            if (pop == PoolOp::L2) for (auto& v : x) v = std::fabs(v) + 0.1;
            std::vector<double> e = random_values((size_t)numel(L.output_shape()), 32);
            Tensor X = make(ctx, x, L.input_shape()), E = make(ctx, e, L.output_shape());
            Tensor O = ctx.empty(L.output_shape()), A = ctx.empty(L.output_shape(), DType::Int32);
            if (pop == PoolOp::Max) fprop_pool(L, X, O, A);
            else fprop_pool(L, X, O);
            const test::PoolReference ref = test::pool_reference(L, x, e);
            const std::vector<double>& want = ref.out;
            const std::vector<int32_t>& want_arg = ref.argmax;
            const std::vector<double>& grad = ref.grad;
            CHECK(count_far(O.to_vector<float>(), want, 1e-6) == 0);
            if (pop == PoolOp::Max) CHECK(A.to_vector<int32_t>() == want_arg);
            Tensor G = ctx.empty(L.input_shape());
            if (pop == PoolOp::Max) bprop_pool(L, E, G, A);
            else if (pop == PoolOp::Avg) bprop_pool(L, E, G);
            else bprop_pool(L, E, G, std::nullopt, 1.0, 0.0, X, O);
            CHECK(count_far(G.to_vector<float>(), grad, 1e-5) == 0);
        }
    const PoolLayer L = pool_layer(DType::Float32, PoolOp::Max, 1, 2, {1, 4, 4}, 1, {1, 2, 2});
    CHECK(L.output == Dims3{1, 2, 2});
    CHECK(L.stride == Dims3{1, 2, 2});
    Tensor X = ctx.zeros(L.input_shape()), O = ctx.empty(L.output_shape());
    CHECK_THROWS_WITH(bprop_pool(L, O, X), Catch::Matchers::Contains("max pooling's gradient needs fprop_pool's argmax"));
    CHECK_THROWS_WITH(fprop_pool(L, ctx.zeros(L.input_shape(), DType::Int32), O),
                      Catch::Matchers::Contains("fprop_pool: I is int32 (1, 4, 4, 2); it must be a float tensor"));
    CHECK_THROWS_WITH(fprop_pool(L, ctx.zeros({1, 4, 4, 3}), O), Catch::Matchers::Contains("it must be (1, 1, 4, 4, 2) or (1, 4, 4, 2)"));
    CHECK_THROWS_WITH(pool_layer(DType::Float32, PoolOp::Avg, 1, 2, {1, 4, 4}, 1, {1, 2, 2}, 0, {0, 2, 0}),
                      Catch::Matchers::Contains("along height pad=2 is not smaller than the window (2)"));
    // Sizes past what the geometry's arithmetic holds, and layers past kiln's element limit.
    const int64_t huge = int64_t(1) << 62;
    CHECK_THROWS_WITH(pool_layer(DType::Float32, PoolOp::Max, huge, 2, {1, 4, 4}),
                      Catch::Matchers::Contains("pool_layer: N=4611686018427387904, C=2, J=1, pad_c=0, str_c=0: each is at "
                                                "most 2^31 - 1 (2147483647)"));
    CHECK_THROWS_WITH(pool_layer(DType::Float32, PoolOp::Max, 1, 2, {1, 4, 4}, 1, {1, 2, 2}, 0, {0, 0, 0}, 0, {0, INT64_MAX, 0}),
                      Catch::Matchers::Contains("pool_layer: along height size 4, window 2, pad 0, stride 9223372036854775807: "
                                                "each is at most 2^31 - 1"));
    CHECK_THROWS_WITH(pool_layer(DType::Float32, PoolOp::Max, 1 << 30, 1 << 30, {1, 1 << 20, 1 << 20}),
                      Catch::Matchers::Contains("pool_layer: shape (1073741824, 1048576, 1048576, 1073741824) has"));
    const PoolLayer avg = pool_layer(DType::Float32, PoolOp::Avg, 1, 2, {1, 4, 4}, 1, {1, 2, 2});
    CHECK_THROWS_WITH(fprop_pool(avg, X, O, ctx.empty(avg.output_shape(), DType::Int32)),
                      Catch::Matchers::Contains("argmax is given, but the layer pools by avg, not max"));
}

TEST_CASE("nn: pooling and LRN in float16 and bfloat16 on the CPU against float64 (operands as rounded)") {
    Context ctx(ContextOptions{"cpu"});
    for (DType dt : {DType::Float16, DType::BFloat16}) {
        const double tol = dt == DType::Float16 ? 2e-3 : 1.6e-2;   // a few roundings of the dtype
        for (PoolOp pop : {PoolOp::Max, PoolOp::Avg, PoolOp::L2}) {
            // 3x3/2 windows with padding (overlapping) and 2-channel windows at channel stride 1.
            const PoolLayer L = pool_layer(dt, pop, 2, 6, {1, 7, 6}, 2, {1, 3, 3}, 0, {0, 1, 1}, 1, {1, 2, 2});
            INFO(L.str() << " " << dtype_name(dt));
            std::vector<double> x = random_values((size_t)numel(L.input_shape()), 51, -1, 1);
            if (pop == PoolOp::L2) for (auto& v : x) v = std::fabs(v) + 0.1;
            std::vector<double> e = random_values((size_t)numel(L.output_shape()), 52);
            Tensor X = make(ctx, x, L.input_shape(), dt), E = make(ctx, e, L.output_shape(), dt);
            Tensor O = ctx.empty(L.output_shape(), dt), A = ctx.empty(L.output_shape(), DType::Int32);
            if (pop == PoolOp::Max) fprop_pool(L, X, O, A);
            else fprop_pool(L, X, O);
            const test::PoolReference ref = test::pool_reference(L, x, e);
            CHECK(count_far(O.to_vector<float>(), ref.out, tol) == 0);
            if (pop == PoolOp::Max) CHECK(A.to_vector<int32_t>() == ref.argmax);
            // (L2's backward divides by the forward output as stored.)
            Tensor G = ctx.empty(L.input_shape(), dt);
            if (pop == PoolOp::Max) bprop_pool(L, E, G, A);
            else if (pop == PoolOp::Avg) bprop_pool(L, E, G);
            else bprop_pool(L, E, G, std::nullopt, 1.0, 0.0, X, O);
            CHECK(count_far(G.to_vector<float>(), ref.grad, 3 * tol) == 0);
        }
        const int64_t C = 7, J = 5;
        const double ascale = 0.3, bpower = 0.75;
        const PoolLayer L = lrn_layer(dt, 2, C, {1, 3, 2}, J);
        std::vector<double> x = random_values((size_t)numel(L.input_shape()), 53);
        Tensor X = make(ctx, x, L.input_shape(), dt), O = ctx.empty(L.input_shape(), dt), D = ctx.empty(L.input_shape(), dt);
        fprop_lrn(L, X, O, D, 1.0, 0.0, ascale, bpower);
        std::vector<double> want(x.size()), dn(x.size());
        for (size_t p = 0; p < x.size() / C; ++p)
            for (int64_t c = 0; c < C; ++c) {
                double sq = 0;
                for (int64_t k = std::max<int64_t>(c - J / 2, 0); k <= std::min<int64_t>(c + J / 2, C - 1); ++k)
                    sq += x[p * C + k] * x[p * C + k];
                dn[p * C + c] = 1 + ascale * sq;
                want[p * C + c] = x[p * C + c] * std::pow(dn[p * C + c], -bpower);
            }
        CHECK(count_far(O.to_vector<float>(), want, tol) == 0);
        CHECK(count_far(D.to_vector<float>(), dn, tol) == 0);
    }
}

TEST_CASE("nn: a window far wider than its input runs a pass per tap that reads the input, not per tap") {
    Context ctx(ContextOptions{"cpu"});
    const int64_t C = 3;
    // Every channel's window of 7 or more holds all 3 channels: the same sums, in the same order.
    const PoolLayer wide = lrn_layer(DType::Float32, 2, C, {1, 2, 2}, (1 << 14) + 1), narrow = lrn_layer(DType::Float32, 2, C, {1, 2, 2}, 7);
    std::vector<double> x = random_values((size_t)numel(wide.input_shape()), 43);
    Tensor X = make(ctx, x, wide.input_shape());
    Tensor O1 = ctx.empty(wide.input_shape()), D1 = ctx.empty(wide.input_shape()), O2 = ctx.empty(wide.input_shape()),
           D2 = ctx.empty(wide.input_shape());
    const uint64_t before = ctx.counters().launches;
    fprop_lrn(wide, X, O1, D1, 1.0, 0.0, 0.3, 0.75);
    CHECK(ctx.counters().launches - before < 20);   // (a pass for each 32 of its 16385 taps: 512)
    fprop_lrn(narrow, X, O2, D2, 1.0, 0.0, 0.3, 0.75);
    CHECK(O1.to_vector<float>() == O2.to_vector<float>());
    CHECK(D1.to_vector<float>() == D2.to_vector<float>());
    // Pooling: 4096 x 4096 windows 4095 apart, padded by 4095, over one element: of their 2^24
    // taps, 4 read it (one for each of the 2 x 2 windows).
    const PoolLayer pool = pool_layer(DType::Float32, PoolOp::Max, 1, 1, {1, 1, 1}, 1, {1, 4096, 4096}, 0, {0, 4095, 4095}, 0,
                                      {0, 4095, 4095});
    REQUIRE(pool.output_shape() == Shape{1, 2, 2, 1});
    Tensor I = ctx.full(pool.input_shape(), 2.5, DType::Float32), P = ctx.empty(pool.output_shape());
    Tensor A = ctx.empty(pool.output_shape(), DType::Int32);
    fprop_pool(pool, I, P, A);
    CHECK(P.to_vector<float>() == std::vector<float>{2.5f, 2.5f, 2.5f, 2.5f});
    CHECK(A.to_vector<int32_t>() == std::vector<int32_t>{4095 * 4096 + 4095, 4095 * 4096, 4095, 0});
}

TEST_CASE("nn: LRN across channels, forward against float64 and backward against finite differences") {
    Context ctx(ContextOptions{"cpu"});
    const int64_t C = 7, J = 5;
    const double ascale = 0.3, bpower = 0.75;
    const PoolLayer L = lrn_layer(DType::Float32, 2, C, {1, 3, 2}, J);
    CHECK(L.input_shape() == Shape{2, 3, 2, C});
    const size_t total = (size_t)numel(L.input_shape()), pixels = total / C;
    std::vector<double> x = random_values(total, 41), e = random_values(total, 42);
    // The definition, float64.
    auto forward = [&](const std::vector<double>& xx, std::vector<double>* denom) {
        std::vector<double> out(total);
        for (size_t p = 0; p < pixels; ++p)
            for (int64_t c = 0; c < C; ++c) {
                double s = 0;
                for (int64_t k = c - J / 2; k <= c + J / 2; ++k)
                    if (k >= 0 && k < C) s += xx[p * C + k] * xx[p * C + k];
                const double d = 1 + ascale * s;
                if (denom) (*denom)[p * C + c] = d;
                out[p * C + c] = xx[p * C + c] * std::pow(d, -bpower);
            }
        return out;
    };
    std::vector<double> dn(total);
    const std::vector<double> want = forward(x, &dn);
    Tensor X = make(ctx, x, L.input_shape()), E = make(ctx, e, L.input_shape());
    Tensor O = ctx.empty(L.input_shape()), D = ctx.empty(L.input_shape()), G = ctx.empty(L.input_shape());
    fprop_lrn(L, X, O, D, 1.0, 0.0, ascale, bpower);
    CHECK(count_far(O.to_vector<float>(), want, 1e-6) == 0);
    CHECK(count_far(D.to_vector<float>(), dn, 1e-6) == 0);
    bprop_lrn(L, X, O, E, G, D, 1.0, 0.0, ascale, bpower);
    const std::vector<float> g = G.to_vector<float>();
    int bad = 0;
    const double h = 1e-6;
    for (size_t i = 0; i < total; ++i) {
        std::vector<double> up = x, down = x;
        up[i] += h;
        down[i] -= h;
        const std::vector<double> fu = forward(up, nullptr), fd = forward(down, nullptr);
        double num = 0;
        for (size_t k = 0; k < total; ++k) num += e[k] * (fu[k] - fd[k]) / (2 * h);
        bad += !(std::fabs(g[i] - num) <= 1e-4 * (1 + std::fabs(num)));
    }
    CHECK(bad == 0);
    // alpha and beta, in a 3D layer: O = alpha I denom^-bpower + beta O, delta = alpha (the
    // gradient) + beta delta.
    {
        const PoolLayer L3 = lrn_layer(DType::Float32, 2, C, {2, 3, 2}, 3);
        CHECK(L3.input_shape() == Shape{2, 2, 3, 2, C});
        std::vector<double> x3 = random_values((size_t)numel(L3.input_shape()), 43), o3 = random_values(x3.size(), 44),
                            e3 = random_values(x3.size(), 45), g3 = random_values(x3.size(), 46);
        Tensor X3 = make(ctx, x3, L3.input_shape()), E3 = make(ctx, e3, L3.input_shape());
        Tensor O3 = make(ctx, o3, L3.input_shape()), D3 = ctx.empty(L3.input_shape()), P3 = ctx.empty(L3.input_shape());
        fprop_lrn(L3, X3, P3, D3, 1.0, 0.0, ascale, bpower);   // plain
        fprop_lrn(L3, X3, O3, D3, 0.5, 2.0, ascale, bpower);
        const std::vector<float> plain = P3.to_vector<float>(), mixed = O3.to_vector<float>();
        std::vector<double> want3(x3.size());
        int bad3 = 0;
        for (size_t i = 0; i < x3.size(); ++i) {
            const size_t p = i / C, c = i % C;
            double sq = 0;
            for (int64_t k = std::max<int64_t>((int64_t)c - 1, 0); k <= std::min<int64_t>((int64_t)c + 1, C - 1); ++k)
                sq += x3[p * C + k] * x3[p * C + k];
            want3[i] = 0.5 * x3[i] * std::pow(1 + ascale * sq, -bpower) + 2.0 * o3[i];
            bad3 += !(std::fabs(plain[i] * 0.5 + 2.0 * o3[i] - mixed[i]) <= 1e-6 * (1 + std::fabs(mixed[i])));
        }
        CHECK(bad3 == 0);
        CHECK(count_far(mixed, want3, 1e-6) == 0);
        Tensor G1 = ctx.empty(L3.input_shape()), G2 = make(ctx, g3, L3.input_shape());
        bprop_lrn(L3, X3, P3, E3, G1, D3, 1.0, 0.0, ascale, bpower);
        bprop_lrn(L3, X3, P3, E3, G2, D3, 0.5, 2.0, ascale, bpower);
        const std::vector<float> one = G1.to_vector<float>();
        std::vector<double> want_g(x3.size());
        for (size_t i = 0; i < x3.size(); ++i) want_g[i] = 0.5 * one[i] + 2.0 * g3[i];
        CHECK(count_far(G2.to_vector<float>(), want_g, 1e-6) == 0);
    }
    CHECK_THROWS_WITH(lrn_layer(DType::Float32, 1, 4, {1, 1, 1}, 4), Catch::Matchers::Contains("J=4; the window of channels is centred"));
    CHECK_THROWS_WITH(lrn_layer(DType::Float32, 1, 4, {1, 1, 1}, INT64_MAX),
                      Catch::Matchers::Contains("lrn_layer: N=1, C=4, J=9223372036854775807, pad_c=4611686018427387903"));
    CHECK_THROWS_WITH(fprop_pool(L, X, O), Catch::Matchers::Contains("the layer is an LRN layer (lrn_layer): use fprop_lrn"));
    const PoolLayer mx = pool_layer(DType::Float32, PoolOp::Max, 2, C, {1, 3, 2});
    CHECK_THROWS_WITH(fprop_lrn(mx, X, O, D), Catch::Matchers::Contains("fprop_lrn: the layer pools by max"));
}

TEST_CASE("hist counts values by their rounded log2 into named slots; dump returns them in order and discards them") {
    Context ctx(ContextOptions{"cpu"});
    CHECK(hist_bins(ctx) == 64);
    CHECK(hist_offset(ctx) == -48);
    // 1 -> log2 0 -> bin 48; 3 -> rint(1.58) = 2 -> bin 50; 0.25 -> -2 -> bin 46; -1 counts as 1;
    // 0 and NaN -> bin 0; 2^-60 below the range -> bin 0; inf and 2^100 above it -> bin 63.
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    std::vector<float> v{1.0f, 3.0f, 0.25f, -1.0f, 0.0f, nan, std::ldexp(1.0f, -60), inf, std::ldexp(1.0f, 100)};
    for (DType dt : {DType::Float32, DType::BFloat16}) {
        INFO(dtype_name(dt));
        Tensor x = ctx.array(v, {3, 3}, dt);
        Tensor slot = hist(x, "x");
        REQUIRE(slot.shape() == Shape{1, 64});
        const std::vector<int32_t> c = slot.to_vector<int32_t>();
        CHECK(c[48] == 2);
        CHECK(c[50] == 1);
        CHECK(c[46] == 1);
        CHECK(c[0] == (dt == DType::BFloat16 ? 3 : 3));
        CHECK(c[63] == 2);
        int64_t total = 0;
        for (int32_t n : c) total += n;
        CHECK(total == 9);
    }
    // A strided view counts the elements it addresses.
    Tensor big = ctx.array(std::vector<float>(20, 4.0f), {4, 5});
    CHECK(hist(big.slice({Slice::range(0, 4, 2), Slice::all()}), "half").to_vector<int32_t>()[50] == 10);
    HistData d = dump_hist_data(ctx);
    REQUIRE(d.tags == std::vector<std::string>{"x", "x", "half"});
    CHECK(d.counts.shape() == Shape{3, 64});
    CHECK(d.counts.to_vector<int32_t>()[64 + 50] == 1);
    CHECK(d.counts.to_vector<int32_t>()[128 + 50] == 10);
    CHECK(dump_hist_data(ctx).tags.empty());   // the dump discarded them

    set_hist_buffers(ctx, 8, -2);
    CHECK(hist(ctx.array(std::vector<float>{0.25f, 1.0f, 16.0f, 1e6f}, {4}), "y").to_vector<int32_t>() ==
          std::vector<int32_t>{1, 0, 1, 0, 0, 0, 1, 1});
    CHECK_THAT(test::error_message([&] { set_hist_buffers(ctx, 0, 0); }),
               Catch::Matchers::Contains("set_hist_buffers: hist_bins=0; valid: 1 to 4096"));
    CHECK_THAT(test::error_message([&] { hist(ctx.array(std::vector<int32_t>{1, 2}, {2}, DType::Int32), "i"); }),
               Catch::Matchers::Contains("hist: x is int32 (2,); histograms count float32, float16 or bfloat16 values"));
    CHECK_THAT(test::error_message([&] { hist(Tensor(), "e"); }), Catch::Matchers::Contains("hist: x is an empty kiln::Tensor"));
}

TEST_CASE("named tensors are counted after every write while the context counts them, once per outermost call") {
    Context ctx(ContextOptions{"cpu"});
    Tensor y = ctx.empty({4, 3}), untagged = ctx.empty({4, 3});
    set_hist_tag(y, "y");
    CHECK(hist_tag(y) == "y");
    CHECK(hist_tag(y.slice({Slice::range(0, 2), Slice::all()})) == "y");   // the memory's tag
    y.assign(Expr(2.0f));
    CHECK(dump_hist_data(ctx).tags.empty());   // off by default
    set_hist_named(ctx, true);
    CHECK(hist_named(ctx));
    y.assign(Expr(2.0f));
    untagged.assign(Expr(1.0f));
    HistData d = dump_hist_data(ctx);
    REQUIRE(d.tags == std::vector<std::string>{"y"});
    CHECK(d.counts.to_vector<int32_t>()[49] == 12);   // twelve 2s: log2 1, bin 1 - (-48)
    // A product into a tagged C counts C once, not also for the copies the product makes inside.
    Tensor A = ctx.array(std::vector<float>(4 * 5, 0.5f), {4, 5}), B = ctx.array(std::vector<float>(5 * 3, 2.0f), {5, 3});
    compound_dot(A, B, y);
    d = dump_hist_data(ctx);
    REQUIRE(d.tags == std::vector<std::string>{"y"});
    CHECK(d.counts.to_vector<int32_t>()[48 + 2] == 12);   // 5: log2 2.32, rounds to 2
    set_hist_named(ctx, false);
    y.assign(Expr(3.0f));
    CHECK(dump_hist_data(ctx).tags.empty());
    CHECK_THAT(test::error_message([&] { set_hist_tag(Tensor(), "x"); }),
               Catch::Matchers::Contains("set_hist_tag: x is an empty kiln::Tensor"));
}
