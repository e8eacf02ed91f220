// compound_dot / dot / batched_dot on the CPU backend against a float64 reference: odd sizes,
// every transpose combination, views with padded leading dimensions, each epilogue piece, the
// 16-bit dtypes, and the misuse messages.
#include "tests/support/catch.hpp"
#include "tests/support/shared_storage_product.hpp"

#include <fmt/format.h>
#include <kiln/kiln.hpp>

#include <cmath>
#include <random>

using namespace kiln;

namespace {

struct Host {
    int64_t rows = 0, cols = 0;
    std::vector<double> v;
    double at(int64_t i, int64_t j) const { return v[(size_t)(i * cols + j)]; }
};

Host random_host(int64_t rows, int64_t cols, uint32_t seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    Host h{rows, cols, std::vector<double>((size_t)(rows * cols))};
    for (auto& x : h.v) x = u(g);
    return h;
}

// A tensor holding h (rounded to dtype) as a view of the given kind: row-major, a transposed
// view of a (cols, rows) tensor, or a window of a larger padded tensor.
enum class Layout { RowMajor, Transposed, Padded };

Tensor make(Context& ctx, Host& h, DType dt, Layout layout) {
    std::vector<float> f(h.v.begin(), h.v.end());
    Tensor t;
    if (layout == Layout::RowMajor) {
        t = ctx.array(f, {h.rows, h.cols}, dt);
    } else if (layout == Layout::Transposed) {
        std::vector<float> tr((size_t)(h.rows * h.cols));
        for (int64_t i = 0; i < h.rows; ++i)
            for (int64_t j = 0; j < h.cols; ++j) tr[(size_t)(j * h.rows + i)] = f[(size_t)(i * h.cols + j)];
        t = ctx.array(tr, {h.cols, h.rows}, dt).T();
    } else {
        Tensor big = ctx.zeros({h.rows + 3, h.cols + 5}, dt);
        t = big.slice({Slice::range(1, 1 + h.rows), Slice::range(2, 2 + h.cols)});
        t.copy_from_host(f.data(), DType::Float32);
    }
    // What the tensor holds after rounding to dt: the reference uses the same values.
    std::vector<float> back = t.to_vector<float>();
    for (size_t i = 0; i < back.size(); ++i) h.v[i] = back[i];
    return t;
}

double tol_for(DType dt, int64_t K) {
    double eps = dt == DType::Float32 ? 1.2e-7 : dt == DType::Float16 ? 9.8e-4 : 7.8e-3;
    return eps * 4 + 1e-6 * std::sqrt((double)std::max<int64_t>(K, 1));
}

// The reference: relu_slope(alpha * A.B + bias) + beta * C0, in float64.
std::vector<double> reference(const Host& A, const Host& B, const std::vector<double>& C0, const DotOptions& o,
                              const std::vector<double>& bias) {
    std::vector<double> out((size_t)(A.rows * B.cols));
    for (int64_t i = 0; i < A.rows; ++i)
        for (int64_t j = 0; j < B.cols; ++j) {
            double s = 0;
            for (int64_t k = 0; k < A.cols; ++k) s += A.at(i, k) * B.at(k, j);
            s = o.alpha * s + (bias.empty() ? 0.0 : bias[(size_t)j]);
            if (o.relu && s <= 0) s *= o.slope;
            out[(size_t)(i * B.cols + j)] = s + o.beta * C0[(size_t)(i * B.cols + j)];
        }
    return out;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const std::string& what) {
    REQUIRE(got.size() == want.size());
    double scale = 1;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        double e = std::fabs((double)got[i] - want[i]) / scale;
        worst = std::max(worst, e);
        bad += !(e <= tol);
    }
    INFO(what << ": worst relative error " << worst << " (tolerance " << tol << ")");
    CHECK(bad == 0);
}

Context& cpu() {
    static Context ctx(ContextOptions{"cpu"});
    return ctx;
}

} // namespace

TEST_CASE("compound_dot: odd sizes, all transposes and padded views match float64") {
    Context& ctx = cpu();
    const int64_t sizes[][3] = {{1, 1, 1}, {7, 1, 5}, {1, 7, 3}, {7, 129, 13}, {129, 7, 1}, {130, 33, 257}, {1003, 65, 70}};
    uint32_t seed = 1;
    for (auto& s : sizes) {
        const int64_t M = s[0], N = s[1], K = s[2];
        for (Layout la : {Layout::RowMajor, Layout::Transposed, Layout::Padded})
            for (Layout lb : {Layout::RowMajor, Layout::Transposed, Layout::Padded}) {
                Host ha = random_host(M, K, seed++), hb = random_host(K, N, seed++);
                Tensor A = make(ctx, ha, DType::Float32, la), B = make(ctx, hb, DType::Float32, lb);
                Tensor C = ctx.empty({M, N});
                compound_dot(A, B, C);
                std::vector<double> zero((size_t)(M * N), 0.0);
                check_close(C.to_vector<float>(), reference(ha, hb, zero, DotOptions{}, {}), tol_for(DType::Float32, K),
                            fmt::format("{}x{}x{} layouts {} {}", M, N, K, (int)la, (int)lb));
            }
    }
}

TEST_CASE("compound_dot: alpha, beta, bias, relu, leaky slope and bsum in one call") {
    Context& ctx = cpu();
    const int64_t M = 37, N = 29, K = 41;
    Host ha = random_host(M, K, 11), hb = random_host(K, N, 12), hc = random_host(M, N, 13), hbias = random_host(1, N, 14);
    for (bool relu : {false, true})
        for (double slope : {0.0, 0.1}) {
            if (!relu && slope != 0) continue;
            Tensor A = make(ctx, ha, DType::Float32, Layout::Transposed), B = make(ctx, hb, DType::Float32, Layout::Padded);
            Tensor C = make(ctx, hc, DType::Float32, Layout::RowMajor);
            Tensor bias = make(ctx, hbias, DType::Float32, Layout::RowMajor).reshape({N});
            Tensor bsum = ctx.empty({M, 1});
            DotOptions o;
            o.alpha = 0.75;
            o.beta = -0.5;
            o.relu = relu;
            o.slope = slope;
            o.bias = bias;
            o.bsum = bsum;
            compound_dot(A, B, C, o);
            std::vector<double> want = reference(ha, hb, hc.v, o, hbias.v);
            check_close(C.to_vector<float>(), want, tol_for(DType::Float32, K), fmt::format("relu {} slope {}", relu, slope));
            std::vector<double> sums((size_t)M, 0.0);
            std::vector<float> c = C.to_vector<float>();
            for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) sums[(size_t)i] += c[(size_t)(i * N + j)];
            check_close(bsum.to_vector<float>(), sums, 1e-5, "bsum = row sums of the result");
            if (relu && slope == 0) {
                int negative = 0;
                for (float v : c) negative += v < -0.5 * 1.0 - 1e-6;  // beta * C0 >= -0.5: relu(.) + beta*C0 >= -0.5
                CHECK(negative == 0);
            }
        }
}

TEST_CASE("compound_dot: C and bsum sharing one buffer with the operands and the bias") {
    const int64_t M = 23, K = 17, N = 19;
    Host values = random_host(M + K + 1, 1 + K + N, 31);
    const auto r = test::shared_storage_product(cpu(), M, K, N, std::vector<float>(values.v.begin(), values.v.end()));
    check_close(r.c, std::vector<double>(r.c_separate.begin(), r.c_separate.end()), 1e-5, "C in the shared buffer");
    check_close(r.bsum, std::vector<double>(r.bsum_separate.begin(), r.bsum_separate.end()), 1e-5, "bsum in the shared buffer");
    CHECK(r.inputs_unchanged);
}

// The activation on rows that hold NaN or -inf, as the GPU epilogues apply it: ReLU keeps NaN
// and takes -inf to zero, leaky ReLU keeps both; bsum adds what C holds.
TEST_CASE("compound_dot: ReLU and leaky ReLU on NaN and -inf") {
    Context& ctx = cpu();
    const int64_t M = 4, N = 5, K = 3;
    std::vector<float> a(size_t(M * K), 0.25f), b(size_t(K * N), 0.5f);
    a[1 * K] = std::nanf("");
    a[2 * K] = -INFINITY;
    a[3 * K] = -1.f;   // row 3: -0.25 in every column
    Tensor A = ctx.array(a, {M, K}), B = ctx.array(b, {K, N});
    for (double slope : {0.0, 0.5}) {
        Tensor C = ctx.empty({M, N}), bsum = ctx.empty({M});
        DotOptions o;
        o.relu = true, o.slope = slope, o.bsum = bsum;
        compound_dot(A, B, C, o);
        const std::vector<float> c = C.to_vector<float>(), s = bsum.to_vector<float>();
        INFO("slope " << slope);
        for (int64_t n = 0; n < N; ++n) {
            CHECK(c[size_t(n)] == 0.375f);
            CHECK(std::isnan(c[size_t(N + n)]));
            CHECK(c[size_t(2 * N + n)] == (slope == 0 ? 0.f : -INFINITY));
            CHECK(c[size_t(3 * N + n)] == (slope == 0 ? 0.f : -0.125f));
        }
        CHECK(std::isnan(s[1]));
        CHECK(s[2] == (slope == 0 ? 0.f : -INFINITY));
    }
}

TEST_CASE("compound_dot: float16 and bfloat16 operands accumulate in float32") {
    Context& ctx = cpu();
    const int64_t M = 65, N = 33, K = 300;
    for (DType dt : {DType::Float16, DType::BFloat16}) {
        Host ha = random_host(M, K, 21), hb = random_host(K, N, 22);
        Tensor A = make(ctx, ha, dt, Layout::RowMajor), B = make(ctx, hb, dt, Layout::Transposed);
        Tensor C = ctx.empty({M, N}, dt);
        compound_dot(A, B, C);
        std::vector<double> zero((size_t)(M * N), 0.0);
        // The inputs are exact in dt; only the output rounding to dt remains (float32 sums).
        check_close(C.to_vector<float>(), reference(ha, hb, zero, DotOptions{}, {}), tol_for(dt, K),
                    std::string(dtype_name(dt)));
    }
}

TEST_CASE("dot and batched_dot") {
    Context& ctx = cpu();
    Host ha = random_host(5, 7, 31), hb = random_host(7, 3, 32);
    Tensor A = make(ctx, ha, DType::Float32, Layout::RowMajor), B = make(ctx, hb, DType::Float32, Layout::RowMajor);
    Tensor C = dot(A, B);
    CHECK(C.shape() == Shape{5, 3});
    CHECK(C.dtype() == DType::Float32);
    std::vector<double> zero(15, 0.0);
    check_close(C.to_vector<float>(), reference(ha, hb, zero, DotOptions{}, {}), 1e-6, "dot");

    // batched: A (4, 6, 9) per batch, B shared (9, 5)
    const int64_t batch = 4, M = 6, K = 9, N = 5;
    std::vector<float> av((size_t)(batch * M * K));
    std::mt19937 g(5);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : av) x = u(g);
    Tensor A3 = ctx.array(av, {batch, M, K});
    Host hb2 = random_host(K, N, 33);
    Tensor B2 = make(ctx, hb2, DType::Float32, Layout::RowMajor);
    Tensor C3 = ctx.empty({batch, M, N}), bs = ctx.empty({batch, M});
    DotOptions o;
    o.bsum = bs;
    batched_dot(A3, B2, C3, o);
    std::vector<float> c = C3.to_vector<float>(), s = bs.to_vector<float>();
    int bad = 0;
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < M; ++i) {
            double row = 0;
            for (int64_t j = 0; j < N; ++j) {
                double want = 0;
                for (int64_t k = 0; k < K; ++k) want += (double)av[(size_t)((b * M + i) * K + k)] * hb2.at(k, j);
                bad += std::fabs(c[(size_t)((b * M + i) * N + j)] - want) > 1e-5;
                row += c[(size_t)((b * M + i) * N + j)];
            }
            bad += std::fabs(s[(size_t)(b * M + i)] - row) > 1e-5;
        }
    CHECK(bad == 0);
}

TEST_CASE("batched_dot into outputs that overlap its operands computes as if into fresh memory") {
    Context& ctx = cpu();
    const int64_t batch = 3, n = 4;
    std::vector<float> h((size_t)(batch * n * n));
    std::mt19937 g(8);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : h) x = u(g);
    // The product of batch entry b of (a, b) from host copies: shared = -1 for entry 0's matrix.
    auto want = [&](const std::vector<float>& a, int a_entry, const std::vector<float>& b, int b_entry, int64_t e,
                    const std::vector<float>& c, double beta) {
        std::vector<double> out((size_t)(n * n));
        const int64_t ea = a_entry < 0 ? e : a_entry, eb = b_entry < 0 ? e : b_entry;
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < n; ++j) {
                double s = beta * c[(size_t)((e * n + i) * n + j)];
                for (int64_t k = 0; k < n; ++k) s += (double)a[(size_t)((ea * n + i) * n + k)] * b[(size_t)((eb * n + k) * n + j)];
                out[(size_t)(i * n + j)] = s;
            }
        return out;
    };
    struct Case {
        const char* what;
        int a_entry, b_entry;   // -1: the batch itself; 0: its entry 0 shared by every entry
        bool reversed_c;
        double beta;
    };
    for (const Case cs : {Case{"C = X, B = X[0]", -1, 0, false, 0.0}, Case{"C = X, A = X[0]", 0, -1, false, 0.0},
                          Case{"C = X reversed, A = B = X", -1, -1, true, 0.0}, Case{"C = X, B = X[0], beta 0.5", -1, 0, false, 0.5}}) {
        INFO(cs.what);
        Tensor X = ctx.array(h, {batch, n, n});
        Tensor A = cs.a_entry < 0 ? X : X[0], B = cs.b_entry < 0 ? X : X[0];
        Tensor C = cs.reversed_c ? X.slice({Slice{batch - 1, Slice::kNone, -1, false}, Slice::all(), Slice::all()}) : X;
        DotOptions o;
        o.beta = cs.beta;
        batched_dot(A, B, C, o);
        const std::vector<float> got = C.to_vector<float>();
        std::vector<float> c_before = h;
        if (cs.reversed_c)
            for (int64_t e = 0; e < batch; ++e)
                std::copy_n(h.begin() + (batch - 1 - e) * n * n, n * n, c_before.begin() + e * n * n);
        double worst = 0;
        for (int64_t e = 0; e < batch; ++e) {
            const std::vector<double> w = want(h, cs.a_entry, h, cs.b_entry, e, c_before, cs.beta);
            for (int64_t i = 0; i < n * n; ++i) worst = std::max(worst, std::fabs(got[(size_t)(e * n * n + i)] - w[(size_t)i]));
        }
        CHECK(worst < 1e-5);
    }
    // bsum in A's memory: entry e's sums in column 0 of X[batch - 1 - e], which a later entry reads.
    Tensor X = ctx.array(h, {batch, n, n});
    Tensor Y = ctx.array(h, {batch, n, n});
    DotOptions o;
    o.bsum = X.slice({Slice{batch - 1, Slice::kNone, -1, false}, Slice::all(), Slice::range(0, 1)});
    Tensor C = ctx.empty({batch, n, n});
    batched_dot(X, Y, C, o);
    const std::vector<float> c = C.to_vector<float>(), x = X.to_vector<float>();
    double worst = 0;
    for (int64_t e = 0; e < batch; ++e) {
        const std::vector<double> w = want(h, -1, h, -1, e, h, 0.0);
        for (int64_t i = 0; i < n; ++i) {
            double row = 0;
            for (int64_t j = 0; j < n; ++j) {
                worst = std::max(worst, std::fabs(c[(size_t)((e * n + i) * n + j)] - w[(size_t)(i * n + j)]));
                row += c[(size_t)((e * n + i) * n + j)];
            }
            worst = std::max(worst, std::fabs(x[(size_t)(((batch - 1 - e) * n + i) * n)] - row));
        }
    }
    CHECK(worst < 1e-5);
}

TEST_CASE("compound_dot: misuse names the operands, shapes and dtypes") {
    Context& ctx = cpu();
    Tensor A = ctx.ones({4, 3}), B = ctx.ones({5, 2}), C = ctx.empty({4, 2});
    auto message = [](auto&& f) {
        try {
            f();
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    std::string m = message([&] { compound_dot(A, B, C); });
    CHECK(m.find("A's columns (3) must equal B's rows (5)") != std::string::npos);
    CHECK(m.find("(4, 3)") != std::string::npos);
    Tensor B2 = ctx.ones({3, 2});
    Tensor Cbad = ctx.empty({4, 3});
    m = message([&] { compound_dot(A, B2, Cbad); });
    CHECK(m.find("C is float32 (4, 3)") != std::string::npos);
    CHECK(m.find("is (4, 2)") != std::string::npos);
    Tensor Ai = ctx.ones({4, 3}, DType::Int32);
    m = message([&] { compound_dot(Ai, B2, C); });
    CHECK(m.find("float32, float16 or bfloat16") != std::string::npos);
    Tensor Bh = ctx.ones({3, 2}, DType::Float16);
    m = message([&] { compound_dot(A, Bh, C); });
    CHECK(m.find("one dtype") != std::string::npos);
    DotOptions o;
    o.bias = ctx.ones({3});
    m = message([&] { compound_dot(A, B2, C, o); });
    CHECK(m.find("one value per column") != std::string::npos);
    DotOptions leaky;
    leaky.slope = 0.2;
    m = message([&] { compound_dot(A, B2, C, leaky); });
    CHECK(m.find("needs relu=true") != std::string::npos);
    Tensor v = ctx.ones({3});
    m = message([&] { dot(v, B2); });
    CHECK(m.find("rank 2") != std::string::npos);
}
