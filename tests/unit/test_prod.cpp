// prod: the product reduction through every pass, on the CPU JIT and the kernel IR interpreter,
// against float64 (floats) and wrapping int32 arithmetic (integers and bool: exact in any order),
// along each axis and over all of them; the identity of an empty reduction; NaN and infinity.
#include "tests/support/catch.hpp"
#include "tests/support/interpret.hpp"

#include <kiln/kiln.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace kiln;

namespace {

using test::interpret_assignment;

Context cpu_context() { return Context(ContextOptions{"cpu", 7, DType::Float32}); }

// The (rows x cols) values' products along `axis` (0, 1, or -1 for all), in float64 or wrapping
// uint32 arithmetic.
std::vector<double> reference(const std::vector<double>& v, int64_t rows, int64_t cols, int axis, bool wrap) {
    const int64_t n = axis == 0 ? cols : axis == 1 ? rows : 1;
    std::vector<double> f(n, 1.0);
    std::vector<uint32_t> w(n, 1u);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            const int64_t o = axis == 0 ? c : axis == 1 ? r : 0;
            f[o] *= v[r * cols + c];
            w[o] *= (uint32_t)(int32_t)v[r * cols + c];
        }
    if (wrap)
        for (int64_t i = 0; i < n; ++i) f[i] = (double)(int32_t)w[i];
    return f;
}

} // namespace

TEST_CASE("prod: along each axis and over all, every dtype, CPU JIT and interpreter against float64 or wrapping int32") {
    Context ctx = cpu_context();
    std::mt19937 gen(11);
    const int64_t rows = 9, cols = 37;
    for (DType t : {DType::Float32, DType::Float16, DType::BFloat16, DType::Int32, DType::Int8, DType::UInt8, DType::Bool}) {
        std::vector<double> v((size_t)(rows * cols));
        for (double& x : v)
            x = is_float(t) ? std::uniform_real_distribution<double>(0.7, 1.35)(gen)
                : t == DType::Bool ? (double)std::bernoulli_distribution(0.9)(gen)
                : t == DType::UInt8 ? (double)std::uniform_int_distribution<int>(1, 5)(gen)
                : (double)std::uniform_int_distribution<int>(-5, 5)(gen);
        Tensor x = ctx.array(v, {rows, cols}, t);
        const std::vector<double> stored = x.to_vector<double>();   // the values as the dtype holds them
        for (int axis : {0, 1, -1}) {
            INFO(dtype_name(t) << " axis " << axis);
            Expr e = axis < 0 ? prod(x.expr(), kAllAxes, false) : prod(x.expr(), axis, false);
            CHECK(e.dtype() == (is_float(t) ? t : DType::Int32));
            Tensor jit = ctx.empty(e.shape(), e.dtype()), interp = ctx.full(e.shape(), 0, e.dtype());
            jit[all] = e;
            interpret_assignment(e, interp);
            const std::vector<double> want = reference(stored, rows, cols, axis, !is_float(t));
            const std::vector<double> got = jit.to_vector<double>(), got_i = interp.to_vector<double>();
            REQUIRE(got.size() == want.size());
            // Float32 products of ~37 factors, reassociated, then rounded once to the dtype.
            const double tol = t == DType::Float32 ? 1e-5 : t == DType::Float16 ? 1e-3 : t == DType::BFloat16 ? 8e-3 : 0;
            for (size_t i = 0; i < want.size(); ++i) {
                CHECK(std::fabs(got[i] - want[i]) <= tol * std::fabs(want[i]));
                CHECK(std::fabs(got_i[i] - want[i]) <= tol * std::fabs(want[i]));
            }
        }
    }
}

TEST_CASE("prod: an empty reduction is 1; NaN and 0 x inf give NaN; a 0-d operand is its value") {
    Context ctx = cpu_context();
    Tensor empty = ctx.zeros({0, 4}, DType::Float32);
    Tensor ones = ctx.empty({4}, DType::Float32);
    ones[all] = prod(empty.expr(), 0, false);
    CHECK(ones.to_vector<float>() == std::vector<float>(4, 1.0f));
    Tensor one = ctx.empty({}, DType::Int32);
    one[all] = prod(ctx.zeros({3, 0}, DType::Int8).expr(), kAllAxes, false);
    CHECK(one.to_vector<int32_t>() == std::vector<int32_t>{1});

    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    Tensor x = ctx.array(std::vector<float>{2, nan, 3, 0, inf, 5, -1, 2, 4}, {3, 3});
    Tensor rows = ctx.empty({3}, DType::Float32);
    rows[all] = prod(x.expr(), 1, false);
    const std::vector<float> r = rows.to_vector<float>();
    CHECK(std::isnan(r[0]));
    CHECK(std::isnan(r[1]));
    CHECK(r[2] == -8.0f);

    Tensor s = ctx.array(std::vector<float>{-2.5f}, {});
    Tensor out = ctx.empty({}, DType::Float32);
    out[all] = prod(s.expr(), kAllAxes, false);
    CHECK(out.to_vector<float>() == std::vector<float>{-2.5f});
}

TEST_CASE("prod: a misused axis names the op") {
    Context ctx = cpu_context();
    Tensor x = ctx.zeros({2, 3}, DType::Float32);
    CHECK_THROWS_WITH(prod(x.expr(), 2), Catch::Matchers::Contains("prod") && Catch::Matchers::Contains("axis"));
    CHECK_THROWS_WITH(prod(ctx.array(std::vector<float>{1}, {}).expr(), 0),
                      Catch::Matchers::Contains("prod: axis 0 given for a 0-d (scalar) operand"));
}
