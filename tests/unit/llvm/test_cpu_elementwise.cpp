// CPU backend, elementwise kernels: strides and broadcasting, every op against C++.
#include "tests/support/catch.hpp"
#include "tests/unit/llvm/cpu_support.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

using namespace kiln;
using namespace kiln::test;

TEST_CASE("cpu jit: elementwise with a broadcast and a strided input") {
    const int64_t M = 37, N = 1001;
    // out[i,j] = a[i,j] * b[j] + c[i,j] - p0, with b broadcast over rows (stride 0) and c a
    // transposed view (strides 1, M); ids[i,j] = linear id + coord(1) as int32.
    KernelBuilder kb("ew_broadcast_strided", "PP");
    int out = kb.buffer(DType::Float32, {SK::Any, SK::One}, true);
    int ids = kb.buffer(DType::Int32, {SK::Any, SK::One}, true);
    int a = kb.buffer(DType::Float32, {SK::Any, SK::One});
    int b = kb.buffer(DType::Float32, {SK::Zero, SK::One});
    int c = kb.buffer(DType::Float32, {SK::One, SK::Any});
    kb.loop();
    int prod = kb.op(Op::Mul, CT::F32, kb.load(a), kb.load(b));
    int sum = kb.op(Op::Add, CT::F32, prod, kb.load(c));
    kb.store(out, kb.op(Op::Sub, CT::F32, sum, kb.paramf(0)));
    int lin = kb.op(Op::LinearId, CT::I32);
    kb.store(ids, kb.op(Op::Add, CT::I32, lin, kb.coord(1)));

    const int64_t lda = N + 3;  // padded rows
    auto av = random_floats(M * lda, -2, 2, 1);
    auto bv = random_floats(N, 0.5f, 1.5f, 2);
    auto cv = random_floats(N * M, -1, 1, 3);
    std::vector<float> ov(M * N, -1);
    std::vector<int32_t> iv(M * N, -1);
    const float p0 = 0.25f;
    run(kb.kernel(), Launch({M, N})
                         .buffer(ov.data(), {N, 1})
                         .buffer(iv.data(), {N, 1})
                         .buffer(av.data(), {lda, 1})
                         .buffer(bv.data(), {0, 1})
                         .buffer(cv.data(), {1, M})
                         .fparam(p0));
    int bad = 0;
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            float want = av[i * lda + j] * bv[j] + cv[j * M + i] - p0;
            if (!near_rel(ov[i * N + j], want, 1e-6)) ++bad;
            if (iv[i * N + j] != (int32_t)(i * N + j + j)) ++bad;
        }
    CHECK(bad == 0);
}

TEST_CASE("cpu jit: a rank-0 kernel runs once; an empty domain runs nothing") {
    KernelBuilder kb("ew_scalar", "");
    int out = kb.buffer(DType::Float32, {}, true);
    kb.loop();
    kb.store(out, kb.op(Op::Mul, CT::F32, kb.paramf(0), kb.constf(3)));
    float o = 0;
    run(kb.kernel(), Launch({}).buffer(&o, {}).fparam(1.5f));
    CHECK(o == 4.5f);

    KernelBuilder ke("ew_empty", "PP");
    int eo = ke.buffer(DType::Float32, {SK::Any, SK::One}, true);
    ke.loop();
    ke.store(eo, ke.constf(1));
    float sentinel = 7;
    run(ke.kernel(), Launch({0, 5}).buffer(&sentinel, {5, 1}));
    run(ke.kernel(), Launch({5, 0}).buffer(&sentinel, {0, 1}));
    CHECK(sentinel == 7);
}

TEST_CASE("cpu jit: gather adds index * axis stride") {
    // out[i,j] = src[i, idx[j]]: src's gathered axis is not a domain dim.
    const int64_t M = 5, J = 7, K = 11;
    KernelBuilder kb("ew_gather", "PP");
    int out = kb.buffer(DType::Float32, {SK::Any, SK::One}, true);
    int src = kb.buffer(DType::Float32, {SK::Any, SK::Zero});
    int idx = kb.buffer(DType::Int32, {SK::Zero, SK::One});
    kb.loop();
    int g = kb.indexed(Op::Gather, CT::F32, src, kb.load(idx), 0);
    kb.store(out, g);
    auto sv = random_floats(M * K, -1, 1, 4);
    std::vector<int32_t> iv = {3, 0, 10, 7, 7, 1, 5};
    std::vector<float> ov(M * J);
    run(kb.kernel(), Launch({M, J}).buffer(ov.data(), {J, 1}).buffer(sv.data(), {K, 0}).buffer(iv.data(), {0, 1}).iparam(1));
    int bad = 0;
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < J; ++j) bad += ov[i * J + j] != sv[i * K + iv[j]];
    CHECK(bad == 0);
}

namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Inputs for the op sweep: specials first, then random values of both signs and magnitudes.
std::vector<float> sweep_floats() {
    std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 1.5f, 2.5f, -2.5f, 3.5f, kInf, -kInf, kNaN,
                            1e-40f, -1e-40f, 3e9f, -3e9f, 2147483520.0f, 2147483648.0f, -2147483648.0f, 16777217.0f};
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> mant(-1, 1);
    std::uniform_int_distribution<int> ex(-20, 20);
    while (v.size() < 4096) v.push_back(std::ldexp(mant(rng), ex(rng)));
    return v;
}
std::vector<int32_t> sweep_ints() {
    std::vector<int32_t> v = {0, 1, -1, 2, 127, 128, -128, -129, 255, 256, INT32_MAX, INT32_MIN, 0x12345678, -0x12345678};
    std::mt19937 rng(6);
    while (v.size() < 4096) v.push_back((int32_t)rng());
    return v;
}

int32_t ref_to_i32(float f) {
    if (std::isnan(f)) return 0;
    if (f >= 2147483648.0f) return INT32_MAX;
    if (f < -2147483648.0f) return INT32_MIN;
    return (int32_t)f;
}

// Runs out[i] = op(x[i], y[i]) (types as given) over n values, y being a rotated copy of x.
template <typename Out, typename In>
std::vector<Out> run_op(Op op, CT out_t, CT in_t, const std::vector<In>& x, int arity) {
    const int64_t n = (int64_t)x.size();
    std::vector<In> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[(i * 7 + 3) % x.size()];
    std::vector<int32_t> cond(x.size());
    for (size_t i = 0; i < x.size(); ++i) cond[i] = (int32_t)(i % 3 == 0);
    DType in_dt = in_t == CT::F32 ? DType::Float32 : DType::Int32;
    DType out_dt = out_t == CT::F32 ? DType::Float32 : DType::Int32;
    KernelBuilder kb(std::string("op_") + kir::op_name(op) + (in_t == CT::F32 ? "_f" : "_i"), "P");
    int o = kb.buffer(out_dt, {SK::One}, true);
    int bx = kb.buffer(in_dt, {SK::One});
    int by = kb.buffer(in_dt, {SK::One});
    int bc = kb.buffer(DType::Int32, {SK::One});
    kb.loop();
    int r;
    if (arity == 3) r = kb.op(op, out_t, kb.load(bc), kb.load(bx), kb.load(by));
    else if (arity == 2) r = kb.op(op, out_t, kb.load(bx), kb.load(by));
    else r = kb.op(op, out_t, kb.load(bx));
    kb.store(o, r);
    std::vector<Out> out(x.size());
    run(kb.kernel(), Launch({n}).buffer(out.data(), {1}).buffer(x.data(), {1}).buffer(y.data(), {1}).buffer(cond.data(), {1}));
    return out;
}

template <typename F>
int count_float_mismatches(Op op, int arity, F ref, double rel) {
    auto x = sweep_floats();
    auto out = run_op<float>(op, CT::F32, CT::F32, x, arity);
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        float y = x[(i * 7 + 3) % x.size()];
        float want = ref(x[i], y);
        // rel == 0: bit-exact up to NaN payloads, so the sign of zero counts.
        bool ok = rel == 0 ? std::isnan(want) ? std::isnan(out[i]) : bits_of(out[i]) == bits_of(want)
                           : near_rel(out[i], want, rel);
        if (!ok && bad++ < 5) UNSCOPED_INFO(kir::op_name(op) << "(" << x[i] << ", " << y << ") = " << out[i] << ", want " << want);
    }
    return bad;
}

template <typename F>
int count_int_mismatches(Op op, CT in_t, int arity, F ref) {
    int bad = 0;
    if (in_t == CT::F32) {
        auto x = sweep_floats();
        auto out = run_op<int32_t>(op, CT::I32, CT::F32, x, arity);
        for (size_t i = 0; i < x.size(); ++i) {
            int32_t want = ref(x[i], x[(i * 7 + 3) % x.size()]);
            if (out[i] != want && bad++ < 5) UNSCOPED_INFO(kir::op_name(op) << "(" << x[i] << ") = " << out[i] << ", want " << want);
        }
    } else {
        auto x = sweep_ints();
        auto out = run_op<int32_t>(op, CT::I32, CT::I32, x, arity);
        for (size_t i = 0; i < x.size(); ++i) {
            int32_t want = ref(x[i], x[(i * 7 + 3) % x.size()]);
            if (out[i] != want && bad++ < 5) UNSCOPED_INFO(kir::op_name(op) << "(" << x[i] << ") = " << out[i] << ", want " << want);
        }
    }
    return bad;
}

int32_t wrap(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }

} // namespace

TEST_CASE("cpu jit: float ops match C++ (NaN rules, rounding, saturation)") {
    CHECK(count_float_mismatches(Op::Neg, 1, [](float x, float) { return -x; }, 0) == 0);
    CHECK(count_float_mismatches(Op::Abs, 1, [](float x, float) { return std::fabs(x); }, 0) == 0);
    CHECK(count_float_mismatches(Op::Sqrt, 1, [](float x, float) { return std::sqrt(x); }, 0) == 0);
    CHECK(count_float_mismatches(Op::Rint, 1, [](float x, float) { return std::nearbyint(x); }, 0) == 0);
    CHECK(count_float_mismatches(Op::Sgn, 1, [](float x, float) { return std::isnan(x) ? x : (float)((x > 0) - (x < 0)); }, 0) == 0);
    CHECK(count_float_mismatches(Op::Add, 2, [](float x, float y) { return x + y; }, 0) == 0);
    CHECK(count_float_mismatches(Op::Sub, 2, [](float x, float y) { return x - y; }, 0) == 0);
    CHECK(count_float_mismatches(Op::Mul, 2, [](float x, float y) { return x * y; }, 0) == 0);
    CHECK(count_float_mismatches(Op::Div, 2, [](float x, float y) { return x / y; }, 0) == 0);
    CHECK(count_float_mismatches(Op::Floor, 1, [](float x, float) { return std::floor(x); }, 0) == 0);
    CHECK(count_float_mismatches(Op::Fmod, 2, [](float x, float y) { return std::fmod(x, y); }, 0) == 0);
    CHECK(count_float_mismatches(Op::Maximum, 2, [](float x, float y) { return (x > y || std::isnan(x)) ? x : y; }, 0) == 0);
    CHECK(count_float_mismatches(Op::Minimum, 2, [](float x, float y) { return (x < y || std::isnan(x)) ? x : y; }, 0) == 0);
    // Transcendentals may come from a vector math library: a few ulp.
    CHECK(count_float_mismatches(Op::Exp, 1, [](float x, float) { return (float)std::exp((double)x); }, 4e-7) == 0);
    CHECK(count_float_mismatches(Op::Exp2, 1, [](float x, float) { return (float)std::exp2((double)x); }, 4e-7) == 0);
    CHECK(count_float_mismatches(Op::Log, 1, [](float x, float) { return (float)std::log((double)x); }, 4e-7) == 0);
    CHECK(count_float_mismatches(Op::Log2, 1, [](float x, float) { return (float)std::log2((double)x); }, 4e-7) == 0);
    CHECK(count_float_mismatches(Op::Tanh, 1, [](float x, float) { return (float)std::tanh((double)x); }, 4e-7) == 0);
    CHECK(count_float_mismatches(Op::Pow, 2, [](float x, float y) { return (float)std::pow((double)x, (double)y); }, 4e-7) == 0);
}

TEST_CASE("cpu jit: select picks by a nonzero condition") {
    auto x = sweep_floats();
    auto out = run_op<float>(Op::Select, CT::F32, CT::F32, x, 3);
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) bad += !same(out[i], i % 3 == 0 ? x[i] : x[(i * 7 + 3) % x.size()]);
    CHECK(bad == 0);
}

TEST_CASE("cpu jit: float -> int ops and comparisons") {
    CHECK(count_int_mismatches(Op::ToI32, CT::F32, 1, [](float x, float) { return ref_to_i32(x); }) == 0);
    CHECK(count_int_mismatches(Op::Finite, CT::F32, 1, [](float x, float) { return (int32_t)std::isfinite(x); }) == 0);
    CHECK(count_int_mismatches(Op::ToBool, CT::F32, 1, [](float x, float) { return (int32_t)(x != 0 || std::isnan(x)); }) == 0);
    CHECK(count_int_mismatches(Op::Eq, CT::F32, 2, [](float x, float y) { return (int32_t)(x == y); }) == 0);
    CHECK(count_int_mismatches(Op::Ne, CT::F32, 2, [](float x, float y) { return (int32_t)(x != y); }) == 0);
    CHECK(count_int_mismatches(Op::Lt, CT::F32, 2, [](float x, float y) { return (int32_t)(x < y); }) == 0);
    CHECK(count_int_mismatches(Op::Le, CT::F32, 2, [](float x, float y) { return (int32_t)(x <= y); }) == 0);
    CHECK(count_int_mismatches(Op::Gt, CT::F32, 2, [](float x, float y) { return (int32_t)(x > y); }) == 0);
    CHECK(count_int_mismatches(Op::Ge, CT::F32, 2, [](float x, float y) { return (int32_t)(x >= y); }) == 0);
}

TEST_CASE("cpu jit: int ops wrap, shifts are logical, mulhi is unsigned") {
    CHECK(count_int_mismatches(Op::Neg, CT::I32, 1, [](int32_t x, int32_t) { return wrap(-(int64_t)x); }) == 0);
    CHECK(count_int_mismatches(Op::Abs, CT::I32, 1, [](int32_t x, int32_t) { return wrap(x < 0 ? -(int64_t)x : x); }) == 0);
    CHECK(count_int_mismatches(Op::Sgn, CT::I32, 1, [](int32_t x, int32_t) { return (x > 0) - (x < 0); }) == 0);
    CHECK(count_int_mismatches(Op::WrapI8, CT::I32, 1, [](int32_t x, int32_t) { return (int32_t)(int8_t)(uint8_t)(x & 0xff); }) == 0);
    CHECK(count_int_mismatches(Op::WrapU8, CT::I32, 1, [](int32_t x, int32_t) { return x & 0xff; }) == 0);
    CHECK(count_int_mismatches(Op::ToBool, CT::I32, 1, [](int32_t x, int32_t) { return (int32_t)(x != 0); }) == 0);
    CHECK(count_int_mismatches(Op::Add, CT::I32, 2, [](int32_t x, int32_t y) { return wrap((int64_t)x + y); }) == 0);
    CHECK(count_int_mismatches(Op::Sub, CT::I32, 2, [](int32_t x, int32_t y) { return wrap((int64_t)x - y); }) == 0);
    CHECK(count_int_mismatches(Op::Mul, CT::I32, 2, [](int32_t x, int32_t y) { return (int32_t)((uint32_t)x * (uint32_t)y); }) == 0);
    CHECK(count_int_mismatches(Op::Maximum, CT::I32, 2, [](int32_t x, int32_t y) { return std::max(x, y); }) == 0);
    CHECK(count_int_mismatches(Op::Minimum, CT::I32, 2, [](int32_t x, int32_t y) { return std::min(x, y); }) == 0);
    CHECK(count_int_mismatches(Op::And, CT::I32, 2, [](int32_t x, int32_t y) { return x & y; }) == 0);
    CHECK(count_int_mismatches(Op::Or, CT::I32, 2, [](int32_t x, int32_t y) { return x | y; }) == 0);
    CHECK(count_int_mismatches(Op::Xor, CT::I32, 2, [](int32_t x, int32_t y) { return x ^ y; }) == 0);
    CHECK(count_int_mismatches(Op::Shl, CT::I32, 2, [](int32_t x, int32_t y) { return (int32_t)((uint32_t)x << (y & 31)); }) == 0);
    CHECK(count_int_mismatches(Op::Shr, CT::I32, 2, [](int32_t x, int32_t y) { return (int32_t)((uint32_t)x >> (y & 31)); }) == 0);
    CHECK(count_int_mismatches(Op::MulHi, CT::I32, 2, [](int32_t x, int32_t y) {
              return (int32_t)(uint32_t)(((uint64_t)(uint32_t)x * (uint32_t)y) >> 32);
          }) == 0);
    CHECK(count_int_mismatches(Op::Lt, CT::I32, 2, [](int32_t x, int32_t y) { return (int32_t)(x < y); }) == 0);
    CHECK(count_int_mismatches(Op::Ge, CT::I32, 2, [](int32_t x, int32_t y) { return (int32_t)(x >= y); }) == 0);
}

TEST_CASE("cpu jit: idiv and irem truncate toward zero (divisors other than 0 and -1)") {
    // Their contract excludes b == 0 and INT32_MIN / -1 (the lowering never emits those):
    // such divisors in the sweep are replaced.
    const auto x = sweep_ints();
    std::vector<int32_t> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const int32_t d = x[(i * 7 + 3) % x.size()];
        const int32_t v = i % 4 == 0 ? d % 97 : d;  // small divisors too: quotients other than 0 and +-1
        y[i] = v == 0 || v == -1 ? 7 : v;
    }
    for (Op op : {Op::IDiv, Op::IRem}) {
        KernelBuilder kb(std::string("op_") + kir::op_name(op), "P");
        const int o = kb.buffer(DType::Int32, {SK::One}, true);
        const int bx = kb.buffer(DType::Int32, {SK::One});
        const int by = kb.buffer(DType::Int32, {SK::One});
        kb.loop();
        kb.store(o, kb.op(op, CT::I32, kb.load(bx), kb.load(by)));
        std::vector<int32_t> out(x.size());
        run(kb.kernel(), Launch({(int64_t)x.size()}).buffer(out.data(), {1}).buffer(x.data(), {1}).buffer(y.data(), {1}));
        int bad = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            const int32_t want = op == Op::IDiv ? x[i] / y[i] : x[i] % y[i];
            if (out[i] != want && bad++ < 5) UNSCOPED_INFO(kir::op_name(op) << "(" << x[i] << ", " << y[i] << ") = " << out[i]);
        }
        CHECK(bad == 0);
    }
}

TEST_CASE("cpu jit: int -> float conversion") {
    auto x = sweep_ints();
    auto out = run_op<float>(Op::ToF32, CT::F32, CT::I32, x, 1);
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) bad += out[i] != (float)x[i];
    CHECK(bad == 0);
}

namespace {

// |got - want| in units in the last place of want rounded to float.
double ulps(float got, double want) {
    if (std::isnan(want)) return std::isnan(got) ? 0 : INFINITY;
    if (std::isinf(want)) return got == (float)want ? 0 : INFINITY;
    float w = std::fabs((float)want);
    double ulp = (double)std::nextafter(w, INFINITY) - (double)w;
    return std::fabs((double)got - want) / ulp;
}

template <typename F>
double max_ulps(Op op, const std::vector<float>& x, F ref) {
    auto out = run_op<float>(op, CT::F32, CT::F32, x, 1);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, ulps(out[i], ref((double)x[i])));
    return worst;
}

} // namespace

// exp and log may come from glibc's vector math library (libmvec), documented to a few ulp.
TEST_CASE("cpu jit: tanh, exp, log and sqrt are within a few ulp") {
    std::vector<float> x = {0.0f, -0.0f, 1e-40f, -1e-30f, 1e-8f, 0.6249f, 0.625f, -0.625f, 9.0f, 20.0f, -50.0f, 1e30f,
                            kInf, -kInf, kNaN};
    for (int i = -60000; i <= 60000; ++i) x.push_back((float)i * 2e-4f);  // [-12, 12]
    CHECK(max_ulps(Op::Tanh, x, [](double v) { return std::tanh(v); }) <= 4);
    CHECK(max_ulps(Op::Exp, x, [](double v) { return std::exp(v); }) <= 8);
    std::vector<float> pos;
    for (int i = 0; i <= 100000; ++i) pos.push_back(std::ldexp(1.0f + (float)i / 100000.0f, i % 200 - 100));
    pos.push_back(0.0f);
    pos.push_back(kInf);
    pos.push_back(1e-40f);
    CHECK(max_ulps(Op::Log, pos, [](double v) { return std::log(v); }) <= 8);
    CHECK(max_ulps(Op::Log2, pos, [](double v) { return std::log2(v); }) <= 8);
    CHECK(max_ulps(Op::Sqrt, pos, [](double v) { return std::sqrt(v); }) <= 0.5);
}
