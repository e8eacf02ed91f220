// The layers on a CUDA context against the CPU path (which the unit tests hold to float64) and,
// for pooling, the float64 definition (tests/support/pool_reference.hpp). Pooling (the
// precompiled kernels of kernels/cuda/pool.cu): max, average and L2, forward (with argmax) and
// backward, 1D, 2D and 3D windows with padding, overlap and channel windows, 16-byte channel
// vectors and single channels, every float dtype, alpha and beta, more work than one grid round,
// and a strided output (the kernels decline it; the expression path runs). Batch norm (training
// and inference, relu, residual, given sums with accumbeta; backward) and LRN forward and
// backward; softmax, cross-entropy, the relu helpers and activation derivatives. Skips, saying
// why, without a CUDA device.
#include "tests/support/cache_dir.hpp"
#include "tests/support/catch.hpp"
#include "tests/support/gpu.hpp"
#include "tests/support/named_counts.hpp"
#include "tests/support/pool_reference.hpp"

#include <kiln/kiln.hpp>

#include "kernels/cuda/pool_cuda.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

using namespace kiln;

namespace {

std::vector<float> uniform(int64_t n, uint32_t seed, float lo, float hi) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v((size_t)n);
    for (auto& x : v) x = d(g);
    return v;
}

double ulp(DType dt) { return dt == DType::BFloat16 ? 0x1p-8 : dt == DType::Float16 ? 0x1p-11 : 0x1p-23; }

// Elements of got off want by more than the dtype's rounding (two ulps of |want| and of the
// scale) plus float32 arithmetic on the way; the first few are printed.
int64_t count_off(const std::vector<float>& got, const std::vector<double>& want, DType dt, double scale, const char* what) {
    int64_t off = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double tol = 2 * ulp(dt) * (std::fabs(want[i]) + scale) + 1e-6 * scale;
        if (!(std::fabs(got[i] - want[i]) <= tol)) {
            if (off < 3) UNSCOPED_INFO(what << " element " << i << ": got " << got[i] << ", want " << want[i]);
            ++off;
        }
    }
    return off;
}

std::vector<double> as_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

struct PoolCase {
    int64_t N, C;
    Dims3 image;
    int64_t J;
    Dims3 window;
    int64_t pad_c;
    Dims3 pad;
    int64_t str_c;
    Dims3 stride;
};

} // namespace

TEST_CASE("gpu pool: max, avg and l2 forward and backward match float64 and the CPU path in every float dtype") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    const std::vector<PoolCase> cases = {
        {2, 16, {1, 13, 11}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 2, 2}},   // 3x3/2 pad 1: 16-byte channel vectors
        {2, 5, {1, 13, 11}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 2, 2}},    // the same, single channels
        {2, 7, {1, 6, 5}, 3, {1, 2, 2}, 1, {0, 0, 0}, 1, {1, 2, 2}},      // channel windows, padded
        {1, 8, {4, 5, 6}, 1, {2, 3, 3}, 0, {1, 1, 0}, 0, {1, 2, 2}},      // 3D
        {3, 24, {1, 1, 50}, 1, {1, 1, 4}, 0, {0, 0, 1}, 0, {1, 1, 3}},    // 1D
        {16, 12, {1, 96, 96}, 1, {1, 2, 2}, 0, {0, 0, 0}, 0, {1, 1, 1}},  // more items than one grid round
        {2, 8, {1, 10, 9}, 1, {1, 2, 2}, 0, {0, 1, 0}, 0, {1, 3, 3}},     // gaps between windows: inputs in none
        {2, 16, {1, 7, 9}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 1, 1}},     // stride 1: up to 9 windows an input
        {3, 24, {1, 9, 7}, 1, {1, 2, 2}, 0, {0, 0, 0}, 0, {1, 2, 2}},     // 2x2/2: the last row and column in none
        {2, 8, {1, 12, 10}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 2, 2}},    // 3x3/2 pad 1 over even sizes
        {2, 16, {3, 6, 8}, 1, {1, 3, 2}, 0, {0, 0, 1}, 0, {1, 2, 3}},     // planar over depths, uneven windows
        {2, 16, {1, 8, 10}, 1, {1, 2, 2}, 0, {0, 0, 0}, 0, {1, 2, 2}},    // 2x2/2 tiling the image
        {1, 8, {4, 6, 9}, 1, {2, 3, 3}, 0, {0, 0, 0}, 0, {2, 3, 3}},      // 3D windows tiling it
        {2, 32, {1, 7, 7}, 1, {1, 7, 7}, 0, {0, 0, 0}, 0, {1, 7, 7}},     // one window: a global pool
        {3, 8, {1, 4, 9}, 1, {1, 2, 3}, 0, {0, 0, 0}, 0, {1, 2, 3}},      // tiling, uneven windows; alpha and beta
    };
    // Each case by kiln's choice of backward kernel (max and average over tiling windows: the
    // tiled form; other 16-bit max: the planar gather where it applies), then by the general
    // gather (KILN_POOL_KERNEL=general).
    int planar = 0, tiled = 0;
    for (const char* kernel : {static_cast<const char*>(nullptr), "general"})
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (PoolOp op : {PoolOp::Max, PoolOp::Avg, PoolOp::L2})
            for (const PoolCase& c : cases) {
                const PoolLayer L = pool_layer(dt, op, c.N, c.C, c.image, c.J, c.window, c.pad_c, c.pad, c.str_c, c.stride);
                INFO(L.str() << (kernel ? " (KILN_POOL_KERNEL=general)" : ""));
                test::ScopedEnv forced("KILN_POOL_KERNEL", kernel);
                const Shape in = L.input_shape(), out = L.output_shape();
                const bool l2 = op == PoolOp::L2;
                // Distinct values (ties in 16 bits would make argmax depend on rounding alone).
                std::vector<float> xf = uniform(numel(in), 11, l2 ? 0.1f : -1.f, 1.f), ef = uniform(numel(out), 12, -1.f, 1.f);
                Tensor Xc = cpu.array(xf, in, dt), Ec = cpu.array(ef, out, dt);
                xf = Xc.to_vector<float>(), ef = Ec.to_vector<float>();
                Tensor Xg = gpu.array(xf, in, dt), Eg = gpu.array(ef, out, dt);
                const double alpha = c.N == 3 ? 0.5 : 1.0, beta = c.N == 3 ? 0.25 : 0.0;   // the 1D case: alpha and beta
                const std::vector<float> o0 = uniform(numel(out), 13, -1.f, 1.f), g0 = uniform(numel(in), 14, -1.f, 1.f);
                Tensor Og = gpu.array(o0, out, dt), Oc = cpu.array(o0, out, dt);
                Tensor Ag = gpu.empty(out, DType::Int32), Ac = cpu.empty(out, DType::Int32);
                const uint64_t before = gpu.counters().assignments;
                if (op == PoolOp::Max) {
                    fprop_pool(L, Xg, Og, Ag, alpha, beta);
                    fprop_pool(L, Xc, Oc, Ac, alpha, beta);
                } else {
                    fprop_pool(L, Xg, Og, std::nullopt, alpha, beta);
                    fprop_pool(L, Xc, Oc, std::nullopt, alpha, beta);
                }
                CHECK(gpu.counters().assignments == before);   // one precompiled kernel, no expression
                const std::vector<float> og = Og.to_vector<float>(), oc = Oc.to_vector<float>(), o0r = Tensor(cpu.array(o0, out, dt)).to_vector<float>();
                test::PoolReference ref = test::pool_reference(L, as_double(xf), as_double(ef));
                std::vector<double> want(ref.out.size());
                for (size_t i = 0; i < want.size(); ++i) want[i] = alpha * ref.out[i] + beta * o0r[i];
                CHECK(count_off(og, want, dt, 1.0, "fprop vs float64") == 0);
                CHECK(count_off(og, as_double(oc), dt, 1.0, "fprop vs cpu") == 0);
                if (op == PoolOp::Max) {
                    if (beta == 0) CHECK(og == oc);   // the same values picked
                    CHECK(Ag.to_vector<int32_t>() == ref.argmax);
                    CHECK(Ac.to_vector<int32_t>() == ref.argmax);
                }
                // Backward, from the CPU's forward output (L2 takes it as Y).
                Tensor Gg = gpu.array(g0, in, dt), Gc = cpu.array(g0, in, dt);
                const std::vector<float> g0r = Tensor(cpu.array(g0, in, dt)).to_vector<float>();
                Tensor Yc = cpu.empty(out, dt);
                fprop_pool(L, Xc, Yc);
                Tensor Yg = gpu.array(Yc.to_vector<float>(), out, dt);
                if (op == PoolOp::Max) {
                    bprop_pool(L, Eg, Gg, Ag, alpha, beta);
                    bprop_pool(L, Ec, Gc, Ac, alpha, beta);
                } else if (op == PoolOp::Avg) {
                    bprop_pool(L, Eg, Gg, std::nullopt, alpha, beta);
                    bprop_pool(L, Ec, Gc, std::nullopt, alpha, beta);
                } else {
                    bprop_pool(L, Eg, Gg, std::nullopt, alpha, beta, Xg, Yg);
                    bprop_pool(L, Ec, Gc, std::nullopt, alpha, beta, Xc, Yc);
                }
                // (gpu's last pooling kernel: the CPU context launches none)
                const bool took_planar = gemm::last_pool_entry().find("_planar") != std::string::npos;
                const bool took_tiled = gemm::last_pool_entry().find("_tiled") != std::string::npos;
                if (kernel) CHECK_FALSE((took_planar || took_tiled));
                planar += took_planar;
                tiled += took_tiled;
                const std::vector<float> gg = Gg.to_vector<float>(), gc = Gc.to_vector<float>();
                std::vector<double> gwant(ref.grad.size());
                for (size_t i = 0; i < gwant.size(); ++i) gwant[i] = alpha * ref.grad[i] + beta * g0r[i];
                // Each element sums up to (window / stride) shares per axis: the scale of the sum.
                const double scale = double(L.taps());
                // (L2's reference divides by its float64 output, the kernels by Y rounded to the dtype.)
                CHECK(count_off(gg, gwant, dt, scale, "bprop vs float64") == 0);
                CHECK(count_off(gg, as_double(gc), dt, scale, "bprop vs cpu") == 0);
                if (op == PoolOp::Max && beta == 0) CHECK(gg == gc);   // the same shares in the same order
            }
    // The planar gather's layers: 3x3/2 twice, 1D, gaps, 2x2/2 and over depths (6 cases), max
    // pooling in 16 bits; the tiled form's: the last 4 cases, max and average, in every dtype.
    CHECK(planar == 6 * 2);
    CHECK(tiled == 4 * 2 * 3);
}

// Max pooling keeps the first tap, then every strictly greater one: with ties, zeros of both
// signs, infinities and NaNs (kept only as a window's first tap) the GPU's kernels, 16-bit
// vectors of channels among them, pick the CPU path's taps and values.
TEST_CASE("gpu pool: max pooling over ties, signed zeros, infinities and NaNs picks the CPU path's taps") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> specials = {0.f, -0.f, 1.f, 1.f, -inf, inf, nan, -1.f, 0.5f, 0.5f, -inf, nan};
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (int64_t C : {int64_t(16), int64_t(5)}) {   // vectors of channels, and single channels
            const PoolLayer L = pool_layer(dt, PoolOp::Max, 2, C, {1, 9, 7}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 2, 2});
            INFO(L.str());
            const Shape in = L.input_shape(), out = L.output_shape();
            std::vector<float> x((size_t)numel(in));
            std::mt19937 g(7);
            for (auto& v : x) v = specials[g() % specials.size()];
            Tensor Xg = gpu.array(x, in, dt), Xc = cpu.array(x, in, dt);
            Tensor Og = gpu.empty(out, dt), Oc = cpu.empty(out, dt);
            Tensor Ag = gpu.empty(out, DType::Int32), Ac = cpu.empty(out, DType::Int32);
            const uint64_t before = gpu.counters().assignments;
            fprop_pool(L, Xg, Og, Ag);
            CHECK(gpu.counters().assignments == before);   // the precompiled kernel
            fprop_pool(L, Xc, Oc, Ac);
            CHECK(Ag.to_vector<int32_t>() == Ac.to_vector<int32_t>());
            const std::vector<float> og = Og.to_vector<float>(), oc = Oc.to_vector<float>();
            int64_t apart = 0;
            for (size_t i = 0; i < og.size(); ++i)
                if (!(std::isnan(og[i]) ? std::isnan(oc[i]) : std::memcmp(&og[i], &oc[i], sizeof(float)) == 0)) ++apart;
            CHECK(apart == 0);
        }
}

// A named output of pooling and LRN, forward and backward, is counted by the kernel as it stores
// it (the counts equal hist() of the output): every pooling op and float dtype, 16-byte vectors
// and single channels, alpha and beta, overlapping and tiling windows.
TEST_CASE("gpu pool: named outputs of pooling and LRN are counted in their kernels' store path") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"});
    set_hist_buffers(gpu, 64, -40);
    auto check_named = [&](Tensor& out, const std::function<void()>& call) {
        test::check_named_counts(gpu, out, 64, call, [] { CHECK(gemm::last_pool_counted()); });
    };
    uint32_t seed = 300;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (PoolOp op : {PoolOp::Max, PoolOp::Avg, PoolOp::L2})
            for (int64_t C : {64, 3, 32}) {
                // (C = 32: 2x2/2 windows tiling the image, the tiled backward for max and average)
                const PoolLayer L = C == 32 ? pool_layer(dt, op, 4, C, {1, 16, 18}, 1, {1, 2, 2}, 0, {0, 0, 0}, 0, {1, 2, 2})
                                            : pool_layer(dt, op, 4, C, {1, 17, 17}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 2, 2});
                INFO(dtype_name(dt) << " " << L.str());
                Tensor X = gpu.array(uniform(numel(L.input_shape()), ++seed, -3.f, 3.f), L.input_shape(), dt);
                Tensor E = gpu.array(uniform(numel(L.output_shape()), ++seed, -1.f, 1.f), L.output_shape(), dt);
                Tensor O = gpu.array(uniform(numel(L.output_shape()), ++seed, -1.f, 1.f), L.output_shape(), dt);
                Tensor G = gpu.array(uniform(numel(L.input_shape()), ++seed, -1.f, 1.f), L.input_shape(), dt);
                Tensor A = gpu.empty(L.output_shape(), DType::Int32);
                Tensor Y = gpu.empty(L.output_shape(), dt);
                fprop_pool(L, X, Y, op == PoolOp::Max ? std::optional<Tensor>(A) : std::nullopt);
                check_named(O, [&] { fprop_pool(L, X, O, std::nullopt, 0.5, 0.25); });
                check_named(G, [&] {
                    bprop_pool(L, E, G, op == PoolOp::Max ? std::optional<Tensor>(A) : std::nullopt, 1.0, 0.5,
                               op == PoolOp::L2 ? std::optional<Tensor>(X) : std::nullopt,
                               op == PoolOp::L2 ? std::optional<Tensor>(Y) : std::nullopt);
                });
            }
    for (DType dt : {DType::Float32, DType::BFloat16}) {
        const PoolLayer L = lrn_layer(dt, 4, 64, {1, 9, 9}, 5);
        INFO(dtype_name(dt) << " " << L.str());
        Tensor X = gpu.array(uniform(numel(L.input_shape()), ++seed, -3.f, 3.f), L.input_shape(), dt);
        Tensor E = gpu.array(uniform(numel(L.input_shape()), ++seed, -1.f, 1.f), L.input_shape(), dt);
        Tensor O = gpu.empty(L.input_shape(), dt), D = gpu.empty(L.input_shape(), dt), G = gpu.empty(L.input_shape(), dt);
        check_named(O, [&] { fprop_lrn(L, X, O, D, 1.0, 0.0, 1e-2, 0.75); });
        check_named(G, [&] { bprop_lrn(L, X, O, E, G, D, 1.0, 0.0, 1e-2, 0.75); });
    }
    // The most bins a histogram has: 16 KiB of counters a block beside the forward's taps staged
    // in static shared memory (together past the 48 KiB a launch gets without asking).
    set_hist_buffers(gpu, 4096, -1000);
    for (DType dt : {DType::Float32, DType::Float16}) {
        const PoolLayer L = pool_layer(dt, PoolOp::Max, 4, 64, {1, 17, 17}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 2, 2});
        INFO(dtype_name(dt) << " " << L.str() << ", 4096 bins");
        Tensor X = gpu.array(uniform(numel(L.input_shape()), ++seed, -3.f, 3.f), L.input_shape(), dt);
        Tensor O = gpu.empty(L.output_shape(), dt);
        test::check_named_counts(gpu, O, 4096, [&] { fprop_pool(L, X, O); }, [] { CHECK(gemm::last_pool_counted()); });
    }
}

TEST_CASE("gpu pool: a strided or in-place output takes the expression path, with the same values; a tensor never written is named") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"});
    const PoolLayer L = pool_layer(DType::Float16, PoolOp::Max, 2, 16, {1, 9, 9}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 2, 2});
    const std::vector<float> x = uniform(numel(L.input_shape()), 21, -1.f, 1.f);
    Tensor X = gpu.array(x, L.input_shape(), DType::Float16);
    Tensor O = gpu.empty(L.output_shape(), DType::Float16);
    Shape wide = L.output_shape();
    wide.back() *= 2;
    Tensor big = gpu.zeros(wide, DType::Float16);
    Tensor half = big.slice({Slice::all(), Slice::all(), Slice::all(), Slice::range(0, 16)});
    fprop_pool(L, X, O);
    const uint64_t before = gpu.counters().assignments;
    fprop_pool(L, X, half);
    CHECK(gpu.counters().assignments > before);
    const std::vector<float> whole = big.to_vector<float>(), o = O.to_vector<float>();
    int64_t off = 0;
    for (size_t i = 0; i < o.size(); ++i) off += whole[i / 16 * 32 + i % 16] != o[i] || whole[i / 16 * 32 + 16 + i % 16] != 0.f;
    CHECK(off == 0);
    // An input never written: the kernels decline, and the expression path names it.
    Tensor unwritten = gpu.empty(L.input_shape(), DType::Float16);
    CHECK_THROWS_WITH(fprop_pool(L, unwritten, O), Catch::Matchers::Contains("never written"));
    Tensor unwritten_out = gpu.empty(L.output_shape(), DType::Float16);   // read through beta
    CHECK_THROWS_WITH(fprop_pool(L, X, unwritten_out, std::nullopt, 1.0, 0.5), Catch::Matchers::Contains("never written"));
    // In place (the output is the input): the kernels decline, the result is the out-of-place one.
    const PoolLayer same = pool_layer(DType::Float16, PoolOp::Max, 2, 16, {1, 9, 9}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 1, 1});
    REQUIRE(same.output_shape() == same.input_shape());
    Tensor Xi = gpu.array(x, same.input_shape(), DType::Float16), Oo = gpu.empty(same.output_shape(), DType::Float16);
    fprop_pool(same, Xi, Oo);
    fprop_pool(same, Xi, Xi);
    CHECK(Xi.to_vector<float>() == Oo.to_vector<float>());
    const PoolLayer lrn = lrn_layer(DType::Float16, 2, 16, {1, 9, 9}, 5);
    Tensor Xl = gpu.array(x, lrn.input_shape(), DType::Float16), Ol = gpu.empty(lrn.input_shape(), DType::Float16);
    Tensor D1 = gpu.empty(lrn.input_shape(), DType::Float16), D2 = gpu.empty(lrn.input_shape(), DType::Float16);
    fprop_lrn(lrn, Xl, Ol, D1, 1.0, 0.0, 1e-2, 0.75);
    fprop_lrn(lrn, Xl, Xl, D2, 1.0, 0.0, 1e-2, 0.75);
    int64_t lrn_off = 0;
    const std::vector<float> a = Xl.to_vector<float>(), b = Ol.to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) lrn_off += std::fabs(a[i] - b[i]) > 2 * ulp(DType::Float16) * std::fabs(b[i]);
    CHECK(lrn_off == 0);
}

namespace {

// GPU and CPU tensors agree within two ulps of the dtype plus `slack` (float32 sums in another
// order: a small fraction of the sum of the terms' magnitudes).
int64_t count_apart(const Tensor& gpu, const Tensor& cpu, DType dt, double slack, const char* what) {
    const std::vector<float> g = gpu.to_vector<float>(), c = cpu.to_vector<float>();
    int64_t off = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        const double tol = 2 * ulp(dt) * std::fabs(c[i]) + slack;
        if (!(std::fabs((double)g[i] - c[i]) <= tol)) {
            if (off < 3) UNSCOPED_INFO(what << " element " << i << ": gpu " << g[i] << ", cpu " << c[i]);
            ++off;
        }
    }
    return off;
}

} // namespace

TEST_CASE("gpu nn: batch norm (training, inference, relu, residual; backward) and LRN match the CPU path in every float dtype") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (const Shape& shape : {Shape{37, 11, 13, 40}, Shape{8, 9, 9, 256}}) {
            INFO(dtype_name(dt) << " " << shape_str(shape));
            const int64_t C = shape.back(), n = numel(shape) / C;
            std::vector<float> xv = uniform(numel(shape), 31, -2.f, 3.f), dv = uniform(numel(shape), 32, -1.f, 1.f),
                               rv = uniform(numel(shape), 33, -1.f, 1.f);
            const std::vector<float> gam = uniform(C, 34, 0.5f, 1.5f), bet = uniform(C, 35, -0.5f, 0.5f),
                                     gm0 = uniform(C, 36, -0.1f, 0.1f), gv0 = uniform(C, 37, 0.5f, 1.5f);
            struct Side {
                Tensor x, d, res, gamma, beta, xsum, xvar, gmean, gvar, y, yi, dx, dg, db;
            };
            auto make_side = [&](Context& c) {
                Side t;
                t.x = c.array(xv, shape, dt), t.d = c.array(dv, shape, dt), t.res = c.array(rv, shape, dt);
                t.gamma = c.array(gam, {C}), t.beta = c.array(bet, {C}), t.gmean = c.array(gm0, {C}), t.gvar = c.array(gv0, {C});
                t.xsum = c.empty({C}), t.xvar = c.empty({C});
                t.y = c.empty(shape, dt), t.yi = c.empty(shape, dt), t.dx = c.empty(shape, dt), t.dg = c.empty({C}), t.db = c.empty({C});
                compound_fprop_bn(t.x, t.xsum, t.xvar, t.gmean, t.gvar, t.gamma, t.beta, t.y, 1e-5, 0.9, true, 0.0, true,
                                  false, t.res);
                compound_fprop_bn(t.x, t.xsum, t.xvar, t.gmean, t.gvar, t.gamma, t.beta, t.yi, 1e-5, 0.9, true, 0.0, false,
                                  true);
                compound_bprop_bn(t.dx, t.dg, t.db, t.d, t.x, t.xsum, t.xvar, t.gamma, 1e-5);
                return t;
            };
            const Side g = make_side(gpu), c = make_side(cpu);
            // Per channel: sums of n terms up to 3 (x), 1 (delta_in), 9 (squares) in magnitude.
            const double sum_slack = 1e-6 * double(n);
            CHECK(count_apart(g.xsum, c.xsum, DType::Float32, 3 * sum_slack, "xsum") == 0);
            CHECK(count_apart(g.xvar, c.xvar, DType::Float32, 1e-4, "xvar") == 0);
            CHECK(count_apart(g.gmean, c.gmean, DType::Float32, 1e-6, "gmean") == 0);
            CHECK(count_apart(g.gvar, c.gvar, DType::Float32, 1e-5, "gvar") == 0);
            CHECK(count_apart(g.db, c.db, DType::Float32, sum_slack, "grad_beta") == 0);
            CHECK(count_apart(g.dg, c.dg, DType::Float32, 3 * sum_slack, "grad_gamma") == 0);
            // Elementwise results of those statistics: values up to about 5.
            CHECK(count_apart(g.y, c.y, dt, 10 * ulp(dt) + 1e-5, "y (training, relu, residual)") == 0);
            CHECK(count_apart(g.yi, c.yi, dt, 10 * ulp(dt) + 1e-5, "y (inference)") == 0);
            CHECK(count_apart(g.dx, c.dx, dt, 10 * ulp(dt) + 1e-4, "delta_out") == 0);
            // LRN across 3, 5 and 9 channels (up to 4 either side: a whole float32 vector),
            // forward and backward; the kernel's warps straddle positions of C = 40.
            for (int64_t J : {3, 5, 9}) {
                INFO("LRN across " << J << " channels");
                const PoolLayer L = lrn_layer(dt, shape[0], C, {1, shape[1], shape[2]}, J);
                Tensor Og = gpu.empty(shape, dt), Dg = gpu.empty(shape, dt), Gg = gpu.empty(shape, dt);
                Tensor Oc = cpu.empty(shape, dt), Dc = cpu.empty(shape, dt), Gc = cpu.empty(shape, dt);
                const uint64_t before = gpu.counters().assignments;
                fprop_lrn(L, g.x, Og, Dg, 1.0, 0.0, 1e-2, 0.75);
                CHECK(gpu.counters().assignments == before);   // the precompiled kernel
                fprop_lrn(L, c.x, Oc, Dc, 1.0, 0.0, 1e-2, 0.75);
                CHECK(count_apart(Dg, Dc, dt, 1e-6, "lrn denom") == 0);
                CHECK(count_apart(Og, Oc, dt, 4 * ulp(dt), "lrn out") == 0);
                bprop_lrn(L, g.x, Og, g.d, Gg, Dg, 1.0, 0.0, 1e-2, 0.75);
                CHECK(gpu.counters().assignments == before);
                bprop_lrn(L, c.x, Oc, c.d, Gc, Dc, 1.0, 0.0, 1e-2, 0.75);
                CHECK(count_apart(Gg, Gc, dt, 4 * ulp(dt), "lrn delta") == 0);
            }
        }
}

// LRN with a negative ascale and an integral power: denominators from -1.25 to 0.9625, so vectors
// mix elements the hardware's lg2 and ex2 take with elements that need powf (d <= 0, finite for
// an integral exponent), forward and backward. Channels hold 3 or 0.5 in runs of 7, so a window's
// sum of squares takes eight values (the edges' windows are short) and no denominator comes
// nearer 0 than 0.0625. Backward's two terms reach about 1e3 and may cancel: the slack scales
// with the largest value.
TEST_CASE("gpu nn: LRN denominators outside the approximation's range (d <= 0) match the CPU path") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    const Shape shape{4, 5, 6, 48};
    std::vector<float> xv((size_t)numel(shape)), dv = uniform(numel(shape), 41, -1.f, 1.f);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = (i % 48) / 7 % 2 ? 3.f : 0.5f;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16}) {
        INFO(dtype_name(dt));
        const PoolLayer L = lrn_layer(dt, shape[0], shape[3], {1, shape[1], shape[2]}, 5);
        struct Side {
            Tensor x, d, o, den, g;
        };
        auto run = [&](Context& c) {
            Side s{c.array(xv, shape, dt), c.array(dv, shape, dt), c.empty(shape, dt), c.empty(shape, dt), c.empty(shape, dt)};
            fprop_lrn(L, s.x, s.o, s.den, 1.0, 0.0, -0.05, 2.0);
            bprop_lrn(L, s.x, s.o, s.d, s.g, s.den, 1.0, 0.0, -0.05, 2.0);
            return s;
        };
        const Side g = run(gpu), c = run(cpu);
        auto apart = [&](const Tensor& a, const Tensor& b, const char* what) {
            const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
            double largest = 0;
            for (float v : y) largest = std::max(largest, (double)std::fabs(v));
            int64_t off = 0;
            for (size_t i = 0; i < x.size(); ++i)
                if (!(std::fabs((double)x[i] - y[i]) <= 8 * ulp(dt) * std::fabs(y[i]) + 1e-6 * largest)) {
                    if (off < 3) UNSCOPED_INFO(what << " element " << i << ": gpu " << x[i] << ", cpu " << y[i]);
                    ++off;
                }
            return off;
        };
        const std::vector<float> den = c.den.to_vector<float>();
        CHECK(std::count_if(den.begin(), den.end(), [](float d) { return d < 0; }) > 0);
        CHECK(std::count_if(den.begin(), den.end(), [](float d) { return d > 0; }) > 0);
        CHECK(apart(g.den, c.den, "denom") == 0);
        CHECK(apart(g.o, c.o, "out") == 0);
        CHECK(apart(g.g, c.g, "delta") == 0);
    }
}

TEST_CASE("gpu nn: softmax, cross-entropy (targets and labels), relu helpers, activation derivatives; batch norm from "
          "given sums with accumbeta: the CPU path's values") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16}) {
        INFO(dtype_name(dt));
        const int64_t rows = 300, classes = 37;
        const std::vector<float> zv = uniform(rows * classes, 61, -8.f, 8.f), ev = uniform(rows * classes, 62, -1.f, 1.f);
        std::vector<int32_t> lv((size_t)rows);
        for (int64_t r = 0; r < rows; ++r) lv[(size_t)r] = int32_t((r * 7) % classes);
        std::vector<float> onehot((size_t)(rows * classes), 0.f);
        for (int64_t r = 0; r < rows; ++r) onehot[(size_t)(r * classes + lv[(size_t)r])] = 1.f;
        struct Side {
            Tensor p, ce, ce_sum, ce_labels, relu, leaky, relu_grad, sig, th;
        };
        // The functions of probabilities take the CPU's softmax on both sides (the two sides'
        // exponentials differ in their last bits, which a log would magnify).
        const std::vector<float> pv = cpu.eval(softmax(cpu.array(zv, {rows, classes}, dt))).to_vector<float>();
        auto run = [&](Context& c) {
            Side s;
            Tensor z = c.array(zv, {rows, classes}, dt), e = c.array(ev, {rows, classes}, dt);
            const Tensor p = c.array(pv, {rows, classes}, dt);
            s.p = c.eval(softmax(z));
            s.ce = c.eval(cross_entropy(p, c.array(onehot, {rows, classes})));
            s.ce_sum = c.eval(cross_entropy(p, c.array(onehot, {rows, classes}), -1, false));
            s.ce_labels = c.eval(cross_entropy_labels(p, c.array(lv, {rows})));
            s.relu = c.eval(fprop_relu(z));
            s.leaky = c.eval(fprop_relu(z, 0.1));
            s.relu_grad = c.eval(bprop_relu(z, e, 0.25));
            s.sig = c.eval(sigmoid_grad(p));
            s.th = c.eval(tanh_grad(p));
            return s;
        };
        const Side g = run(gpu), c = run(cpu);
        CHECK(count_apart(g.p, c.p, dt, 4 * ulp(dt) + 1e-6, "softmax") == 0);
        CHECK(count_apart(g.ce, c.ce, DType::Float32, 1e-4, "cross_entropy (mean)") == 0);
        CHECK(count_apart(g.ce_sum, c.ce_sum, DType::Float32, 1e-4 * rows, "cross_entropy (sum)") == 0);
        CHECK(count_apart(g.ce_labels, c.ce_labels, DType::Float32, 1e-4, "cross_entropy_labels") == 0);
        CHECK(count_apart(g.relu, c.relu, dt, 0, "fprop_relu") == 0);
        CHECK(count_apart(g.leaky, c.leaky, dt, ulp(dt), "fprop_relu slope") == 0);
        CHECK(count_apart(g.relu_grad, c.relu_grad, dt, ulp(dt), "bprop_relu") == 0);
        CHECK(count_apart(g.sig, c.sig, dt, 2 * ulp(dt), "sigmoid_grad") == 0);
        CHECK(count_apart(g.th, c.th, dt, 2 * ulp(dt), "tanh_grad") == 0);
        // A label past the classes: NaN on both.
        std::vector<int32_t> bad = lv;
        bad[5] = int32_t(classes);
        CHECK(std::isnan(gpu.eval(cross_entropy_labels(gpu.array(pv, {rows, classes}, dt), gpu.array(bad, {rows})))
                             .to_vector<float>()[0]));

        // Batch norm with the batch's sums given (compute_batch_sum false, as from a
        // convolution's bsum), and accumbeta adding half of y's earlier values.
        const Shape shape{16, 7, 9, 48};
        const int64_t C = shape.back();
        const std::vector<float> xv = uniform(numel(shape), 63, -2.f, 3.f), gam = uniform(C, 64, 0.5f, 1.5f),
                                 bet = uniform(C, 65, -0.5f, 0.5f), gm0 = uniform(C, 66, -0.1f, 0.1f),
                                 gv0 = uniform(C, 67, 0.5f, 1.5f), y0 = uniform(numel(shape), 68, -1.f, 1.f);
        auto bn = [&](Context& ctx) {
            Tensor x = ctx.array(xv, shape, dt);
            Tensor xsum = ctx.eval(reshape(sum(cast(reshape(x.expr(), {numel(shape) / C, C}), DType::Float32), 0), {C}));
            Tensor xvar = ctx.empty({C}), gmean = ctx.array(gm0, {C}), gvar = ctx.array(gv0, {C});
            Tensor y = ctx.array(y0, shape, dt);
            compound_fprop_bn(x, xsum, xvar, gmean, gvar, ctx.array(gam, {C}), ctx.array(bet, {C}), y, 1e-5, 0.9, false, 0.5,
                              false);
            return std::vector<Tensor>{xvar, gmean, gvar, y};
        };
        const std::vector<Tensor> bg = bn(gpu), bc = bn(cpu);
        CHECK(count_apart(bg[0], bc[0], DType::Float32, 1e-4, "xvar (given sums)") == 0);
        CHECK(count_apart(bg[1], bc[1], DType::Float32, 1e-6, "gmean (accumbeta)") == 0);
        CHECK(count_apart(bg[2], bc[2], DType::Float32, 1e-5, "gvar (accumbeta)") == 0);
        CHECK(count_apart(bg[3], bc[3], dt, 10 * ulp(dt) + 1e-5, "y (given sums)") == 0);
    }
}

// With stochastic rounding on, the pooling and LRN kernels decline 16-bit outputs and the
// expression path stores them: every value one of the two float16 neighbours of the float32
// result, about as many above as below (LRN's output, computed from its denominator as rounded,
// itself stochastically: within 4 steps of the round-to-nearest output, and not always equal).
TEST_CASE("gpu pool: with stochastic rounding on, 16-bit pooling and LRN outputs round stochastically") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda", 5, DType::Float32});
    const PoolLayer avg = pool_layer(DType::Float16, PoolOp::Avg, 8, 64, {1, 32, 32}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 2, 2});
    const PoolLayer lrn = lrn_layer(DType::Float16, 8, 64, {1, 16, 16}, 5);
    const std::vector<float> xv = uniform(numel(avg.input_shape()), 71, -2.f, 2.f), lv = uniform(numel(lrn.input_shape()), 72, -2.f, 2.f);
    // The float32 results, from the same float16 inputs.
    Tensor x16 = gpu.array(xv, avg.input_shape(), DType::Float16), l16 = gpu.array(lv, lrn.input_shape(), DType::Float16);
    Tensor x32 = gpu.eval(cast(x16.expr(), DType::Float32)), l32 = gpu.eval(cast(l16.expr(), DType::Float32));
    Tensor a32 = gpu.empty(avg.output_shape()), o32 = gpu.empty(lrn.input_shape()), d32 = gpu.empty(lrn.input_shape());
    const PoolLayer avg32 = pool_layer(DType::Float32, PoolOp::Avg, 8, 64, {1, 32, 32}, 1, {1, 3, 3}, 0, {0, 1, 1}, 0, {1, 2, 2});
    const PoolLayer lrn32 = lrn_layer(DType::Float32, 8, 64, {1, 16, 16}, 5);
    fprop_pool(avg32, x32, a32);
    fprop_lrn(lrn32, l32, o32, d32, 1.0, 0.0, 0.3, 0.75);
    Tensor rn16 = gpu.empty(lrn.input_shape(), DType::Float16), rnd16 = gpu.empty(lrn.input_shape(), DType::Float16);
    fprop_lrn(lrn, l16, rn16, rnd16, 1.0, 0.0, 0.3, 0.75);
    gpu.set_stochastic_round(true);
    Tensor a16 = gpu.empty(avg.output_shape(), DType::Float16), o16 = gpu.empty(lrn.input_shape(), DType::Float16),
           d16 = gpu.empty(lrn.input_shape(), DType::Float16);
    fprop_pool(avg, x16, a16);
    fprop_lrn(lrn, l16, o16, d16, 1.0, 0.0, 0.3, 0.75);
    auto check = [](const Tensor& got, const Tensor& exact, const char* what, bool unbiased = true) {
        INFO(what);
        const std::vector<float> g = got.to_vector<float>(), e = exact.to_vector<float>();
        int64_t far = 0, rounded_away = 0;
        double bias = 0, spread = 0;
        for (size_t i = 0; i < g.size(); ++i) {
            const double mag = unbiased ? std::fabs(e[i]) : std::max(std::fabs(e[i]), std::fabs(g[i]));
            const double step = std::ldexp(1.0, std::max(-24, (int)std::floor(std::log2(mag + 1e-30)) - 10));
            far += !(std::fabs((double)g[i] - e[i]) < (unbiased ? 1 : 4) * step);
            rounded_away += unbiased ? std::fabs((double)g[i] - e[i]) > step / 2 : g[i] != e[i];
            bias += ((double)g[i] - e[i]) / step;
            spread += 0.25;
        }
        CHECK(far == 0);
        CHECK(rounded_away > 0);   // round to nearest never moves a value more than half a step
        if (unbiased) CHECK(std::fabs(bias) <= 5 * std::sqrt(spread) + 1);
    };
    check(a16, a32, "avg pool");
    check(o16, rn16, "lrn out", false);
    check(d16, d32, "lrn denom");
}
