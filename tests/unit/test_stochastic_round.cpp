// Stochastic rounding of float16/bfloat16 stores (Context::set_stochastic_round): each result
// is one of the two neighbours on the kept grid, chosen so that the expectation is the exact
// value (checked statistically), reproducible for a seed, and off means round to nearest.
#include "tests/support/catch.hpp"

#include <kiln/kiln.hpp>

#include "codegen/cuda/cuda_codegen.hpp"
#include "compiler/pipeline.hpp"
#include "ir/half.hpp"
#ifdef KILN_HAVE_NVRTC
#include "runtime/cuda/nvrtc.hpp"
#endif

#include <cmath>
#include <cstring>
#include <vector>

using namespace kiln;

namespace {

constexpr int64_t kN = 1 << 20;

Context cpu_context(uint64_t seed = 7) { return Context(ContextOptions{"cpu", seed, DType::Float32}); }

// Neighbours of x on the grid of `dt` keeping `bits` mantissa bits (normal range).
std::pair<double, double> neighbours(double x, int bits) {
    const int e = (int)std::floor(std::log2(std::fabs(x)));
    const double ulp = std::ldexp(1.0, e - bits);
    const double lo = std::floor(x / ulp) * ulp;
    return {lo, lo + ulp};
}

std::vector<float> stored(Context& ctx, float x, DType dt) {
    Tensor src = ctx.full({kN}, x, DType::Float32), dst = ctx.empty({kN}, dt);
    dst[all] = src;
    return dst.to_vector<float>();
}

// All results are lo or hi, and the count of hi is within 5 standard deviations of n * p.
void require_unbiased(const std::vector<float>& got, double x, double lo, double hi) {
    int64_t n_hi = 0, other = 0;
    double sum = 0;
    for (float g : got) {
        if (g == (float)hi) ++n_hi;
        else if (g != (float)lo) ++other;
        sum += g;
    }
    INFO("x " << x << " lo " << lo << " hi " << hi);
    CHECK(other == 0);
    const double p = (x - lo) / (hi - lo), n = (double)got.size(), sigma = std::sqrt(n * p * (1 - p));
    CHECK(std::fabs((double)n_hi - n * p) <= 5 * sigma + 1);
    CHECK(std::fabs(sum / n - x) <= 5 * sigma / n * (hi - lo) + 1e-12 * std::fabs(x));
}

} // namespace

TEST_CASE("stochastic rounding: float16 results are the neighbours, unbiased") {
    Context ctx = cpu_context();
    ctx.set_stochastic_round(true);
    CHECK(ctx.stochastic_round() == 10);
    for (double x : {1.0 + 1.0 / 3 * std::ldexp(1.0, -10), -1.0 - 0.9 * std::ldexp(1.0, -10), 1000.3, 0.1, -3.14159,
                     60000.7}) {
        auto [lo, hi] = neighbours(std::fabs(x), 10);
        if (x < 0) std::swap(lo, hi), lo = -lo, hi = -hi;
        const float xf = (float)x;
        require_unbiased(stored(ctx, xf, DType::Float16), xf, lo, hi);
    }
    // Subnormal float16 (below 2^-14): the grid is the subnormals' 2^-24.
    const double sub = 3.3e-6, ulp = std::ldexp(1.0, -24), lo = std::floor(sub / ulp) * ulp;
    require_unbiased(stored(ctx, (float)sub, DType::Float16), (float)sub, lo, lo + ulp);
}

TEST_CASE("stochastic rounding: bfloat16 keeps at most 7 bits, unbiased") {
    Context ctx = cpu_context();
    ctx.set_stochastic_round(10);
    for (double x : {1.0 + 0.3 * std::ldexp(1.0, -7), -250.77, 1e-20, 3.0e30}) {
        const float xf = (float)x;
        auto [lo, hi] = neighbours(std::fabs((double)xf), 7);
        if (xf < 0) std::swap(lo, hi), lo = -lo, hi = -hi;
        require_unbiased(stored(ctx, xf, DType::BFloat16), xf, lo, hi);
    }
}

TEST_CASE("stochastic rounding: fewer bits land on the coarser grid") {
    Context ctx = cpu_context();
    ctx.set_stochastic_round(4);
    const float x = 1.23456f;
    auto [lo, hi] = neighbours(x, 4);
    require_unbiased(stored(ctx, x, DType::Float16), x, lo, hi);
    int off_grid = 0;
    for (float g : stored(ctx, 97.3f, DType::Float16)) off_grid += (float_to_f16(g) & 0x3f) != 0;
    CHECK(off_grid == 0);   // the 6 low mantissa bits of float16 are 0
}

TEST_CASE("stochastic rounding: representable values, zero, inf and NaN are unchanged; off is round to nearest") {
    Context ctx = cpu_context();
    ctx.set_stochastic_round(true);
    for (float x : {1.5f, -2.0f, 0.0f, -0.0f, 65504.0f, std::ldexp(1.0f, -24), INFINITY, -INFINITY}) {
        std::vector<float> got = stored(ctx, x, DType::Float16);
        INFO(x);
        CHECK(got.front() == x);
        CHECK(std::signbit(got.front()) == std::signbit(x));
        CHECK(std::count(got.begin(), got.end(), got.front()) == (long)got.size());
    }
    std::vector<float> nan = stored(ctx, NAN, DType::Float16);
    CHECK(std::isnan(nan.front()));
    CHECK(std::isnan(nan.back()));
    ctx.set_stochastic_round(false);
    CHECK(ctx.stochastic_round() == 0);
    const float x = 1.0f + 0.3f * std::ldexp(1.0f, -10);
    int not_nearest = 0;
    for (float g : stored(ctx, x, DType::Float16)) not_nearest += g != f16_to_float(float_to_f16(x));
    CHECK(not_nearest == 0);
}

TEST_CASE("stochastic rounding: reproducible for a seed, fresh for each assignment") {
    auto run = [](uint64_t seed) {
        Context ctx = cpu_context(seed);
        ctx.set_stochastic_round(true);
        Tensor src = ctx.full({4096}, 0.1, DType::Float32), a = ctx.empty({4096}, DType::Float16),
               b = ctx.empty({4096}, DType::Float16);
        a[all] = src;
        b[all] = src;
        return std::make_pair(a.to_vector<float>(), b.to_vector<float>());
    };
    auto [a1, b1] = run(7);
    auto [a2, b2] = run(7);
    auto [a3, b3] = run(8);
    CHECK(a1 == a2);
    CHECK(b1 == b2);
    CHECK(a1 != b1);   // another assignment draws other bits
    CHECK(a1 != a3);   // another seed too
    // The option in ContextOptions does the same as the setter.
    Context c(ContextOptions{"cpu", 7, DType::Float32, 10});
    CHECK(c.stochastic_round() == 10);
}

TEST_CASE("stochastic rounding: part of the plan (a change recompiles) and of the CUDA C") {
    Context ctx = cpu_context();
    Tensor src = ctx.full({64}, 0.1, DType::Float32), dst = ctx.empty({64}, DType::Float16);
    // A kernel this context did not have yet is compiled, or loaded from the disk cache when
    // another test of this program compiled it first: either counts as a new kernel.
    auto new_kernels = [&] { return ctx.counters().compiles + ctx.counters().disk_hits; };
    dst[all] = src * 3.0f;
    const uint64_t kernels = new_kernels();
    ctx.set_stochastic_round(8);
    dst[all] = src * 3.0f;
    CHECK(new_kernels() == kernels + 1);
    ctx.set_stochastic_round(0);
    dst[all] = src * 3.0f;
    CHECK(new_kernels() == kernels + 1);   // the round-to-nearest kernel is in memory

    const NodePtr e = (src * 3.0f + ctx.rand({64})).node();
    CompiledAssignment ca = compile_assignment(e, dst.view(), "sm_90", LowerOptions{10, {}});
    REQUIRE(ca.stages.size() == 1);
    CHECK(ca.stages[0].rands.size() == 2);   // rand() and the rounding: separate counters
    CHECK(ca.stages[0].rands[1].serial >= kRoundingSerial);
    codegen::CudaSource src_c = codegen::emit_cuda(ca.stages[0].kernel);
    CHECK(src_c.code.find("__float_as_int(") != std::string::npos);
    CHECK(src_c.code.find("__int_as_float(") != std::string::npos);
#ifdef KILN_HAVE_NVRTC
    for (int sm : {80, 90}) {
        cuda::NvrtcResult r = cuda::nvrtc_compile(src_c.code, "sr.cu", sm);
        INFO(r.log);
        CHECK(r.ok);
    }
#endif
}

TEST_CASE("stochastic rounding: every finite float16 and bfloat16 value is stored unchanged") {
    std::vector<float> f16, bf16;
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7c00) != 0x7c00) f16.push_back(f16_to_float((uint16_t)h));   // subnormals and -0 included
        if ((h & 0x7f80) != 0x7f80) bf16.push_back(bf16_to_float((uint16_t)h));
    }
    auto unchanged = [](const std::vector<float>& vals, DType dt, int bits) {
        Context ctx = cpu_context(21);
        ctx.set_stochastic_round(bits);
        Tensor src = ctx.array(vals, {(int64_t)vals.size()}), dst = ctx.empty({(int64_t)vals.size()}, dt);
        dst[all] = src;
        const std::vector<float> out = dst.to_vector<float>();
        int bad = 0;
        for (size_t i = 0; i < vals.size(); ++i) bad += std::memcmp(&out[i], &vals[i], 4) != 0;
        INFO(dtype_name(dt) << ", " << bits << " bits, " << vals.size() << " values");
        CHECK(bad == 0);
    };
    unchanged(f16, DType::Float16, 10);
    unchanged(bf16, DType::BFloat16, 7);
    unchanged(bf16, DType::BFloat16, 10);   // bfloat16 keeps 7
}

TEST_CASE("the random stream's state: rng_state, set_rng_state and rng_reset reproduce the draws, rounding included") {
    ContextOptions o;
    o.device = "cpu";
    o.seed = 5;
    Context ctx(o);
    Tensor src = ctx.array(std::vector<float>(256, 1.0f / 3.0f), {256});
    // One draw of each kind per step: a random tensor, and a stochastically rounded float16 store.
    auto step = [&] {
        ctx.set_stochastic_round(10);
        Tensor h = ctx.eval(cast(src.expr() * 1.001, DType::Float16));
        ctx.set_stochastic_round(0);
        std::vector<float> v = ctx.eval(ctx.rand({64})).to_vector<float>(), r = h.to_vector<float>();
        v.insert(v.end(), r.begin(), r.end());
        return v;
    };
    const RngState start = ctx.rng_state();
    const std::vector<float> first = step();
    const RngState mid = ctx.rng_state();
    CHECK(mid.counter > start.counter);
    CHECK(mid.seed == start.seed);
    const std::vector<float> second = step();
    CHECK(second != first);
    ctx.set_rng_state(mid);
    CHECK(step() == second);
    ctx.rng_reset();
    CHECK(ctx.rng_state() == start);
    CHECK(step() == first);
    ctx.seed(77);
    const RngState seeded = ctx.rng_state();
    step();
    ctx.rng_reset();   // the last seeding is seed(77)'s
    CHECK(ctx.rng_state() == seeded);
}
