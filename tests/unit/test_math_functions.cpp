// kiln/math_functions.def's float functions, of one argument and of two, through every path that
// evaluates them: the kernel-IR interpreter gives the C library's float result bit for bit,
// constant folding its double result (within an ulp of the float one), the CPU JIT within 4 ulps (LLVM may call the vector math library's variant
// of a function in a vectorised loop); integer operands compute in float32, 16-bit floats keep
// their dtype; the CUDA renderer prints the C function (NVRTC compiles it: the differential suite).
#include "tests/support/catch.hpp"
#include "tests/support/error_message.hpp"
#include "tests/support/views.hpp"

#include <kiln/kiln.hpp>

#include "codegen/cuda/cuda_codegen.hpp"
#include "compiler/canonicalise.hpp"
#include "compiler/pipeline.hpp"
#include "ir/node.hpp"
#include "runtime/kir_interpreter.hpp"
#ifdef KILN_HAVE_NVRTC
#include "runtime/cuda/nvrtc.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace kiln;

namespace {

struct MathFn {
    const char* name;
    Expr (*build)(const Expr&);
    float (*host)(float);
    const char* c_function;
    OpKind op;
};

const std::vector<MathFn>& math_functions() {
    static const std::vector<MathFn> fns = {
#define KILN_MATH(K, name, c_function, host) \
    {#name, kiln::name, [](float x) { return (float)host(x); }, #c_function, OpKind::K},
#define KILN_MATH2(K, name, c_function, host)
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
    };
    return fns;
}

// Where a function is real: log1p and log10 need positive values, asin, acos and atanh values
// in (-1, 1), acosh values from 1; the others take [-6, 6].
struct Domain {
    float lo, hi;
};
Domain domain(const std::string& name) {
    if (name == "log1p" || name == "log10") return {1e-6f, 6.0f};
    if (name == "asin" || name == "acos" || name == "atanh") return {-0.99f, 0.99f};
    if (name == "acosh") return {1.0f, 7.0f};
    return {-6.0f, 6.0f};
}

// Values inside a function's domain, its ends included.
std::vector<float> inputs(const std::string& name) {
    const Domain dm = domain(name);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> d(dm.lo, dm.hi);
    std::vector<float> v(257);
    for (float& x : v) x = d(rng);
    v[0] = dm.lo < 0 && dm.hi > 0 ? 0.0f : dm.lo;
    v[1] = dm.hi;
    return v;
}

// A value inside the domain where a 16-bit input is exact.
float sample(const std::string& name) { return name == "acosh" ? 1.5f : 0.5f; }

// `e` evaluated by the kernel-IR interpreter, through the same lowering as `out`'s backend, into
// a float32 vector of out's size (the interpreter's output buffer; its inputs are e's tensors).
std::vector<float> interpreted(const Expr& e, const Tensor& out) {
    std::vector<float> result((size_t)out.size());
    View dst = out.view();
    CompiledAssignment ca = compile_assignment(e.node(), dst, "interpreter");
    REQUIRE(ca.stages.size() == 1);
    LoweredStage& st = ca.stages[0];
    for (size_t b = 0; b < st.sources.size(); ++b) {
        const View& v = st.sources[b].view;
        st.args.buffers[b] = b == 0 ? (void*)result.data()
                                    : static_cast<char*>(v.storage->data) + v.offset * (int64_t)dtype_size(v.dtype);
    }
    interpret(st.kernel, st.args);
    return result;
}

} // namespace

// Units in the last place between two finite floats of one sign.
static int64_t ulps(float a, float b) {
    int32_t ia, ib;
    std::memcpy(&ia, &a, 4);
    std::memcpy(&ib, &b, 4);
    if ((ia < 0) != (ib < 0)) return a == b ? 0 : INT64_MAX;
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

TEST_CASE("math functions: the interpreter gives the C library's float result, the CPU JIT within 4 ulps") {
    Context ctx(ContextOptions{"cpu"});
    for (const MathFn& f : math_functions()) {
        INFO(f.name);
        const std::vector<float> x = inputs(f.name);
        Tensor a = ctx.array(x, {(int64_t)x.size()});
        Tensor out = ctx.eval(f.build(a));
        CHECK(out.dtype() == DType::Float32);
        const std::vector<float> got = out.to_vector<float>();

        const std::vector<float> interp = interpreted(f.build(a), out);

        for (size_t i = 0; i < x.size(); ++i) {
            const float want = f.host(x[i]);
            REQUIRE(ulps(got[i], want) <= 4);
            REQUIRE(std::memcmp(&interp[i], &want, 4) == 0);
        }
    }
}

TEST_CASE("math functions: dtypes, folding and the names the renderers print") {
    Context ctx(ContextOptions{"cpu"});
    for (const MathFn& f : math_functions()) {
        INFO(f.name);
        CHECK(std::string(opkind_name(f.op)) == f.name);
        Tensor i = ctx.array(std::vector<int32_t>{1, 2, 3}, {3});
        const bool integral = std::string(f.name) == "ceil" || std::string(f.name) == "trunc";
        CHECK(f.build(i).dtype() == (integral ? DType::Int32 : DType::Float32));   // ceil, trunc: i itself
        const float at = sample(f.name);
        Tensor h = ctx.array(std::vector<float>{0.25f, at}, {2}, DType::Float16);
        CHECK(f.build(h).dtype() == DType::Float16);
        CHECK(std::fabs(ctx.eval(f.build(h)).to_vector<float>()[1] - f.host(at)) <= 1e-3f * (1 + std::fabs(f.host(at))));

        // A function of a constant folds to the constant, computed on the host in double.
        NodePtr folded = canonicalise(f.build(scalar(at, DType::Float32)).node());
        REQUIRE(folded->op == OpKind::Scalar);
        CHECK(ulps((float)folded->value, f.host(at)) <= 1);

        // The CUDA renderer prints the C function, which NVRTC knows; the CPU backend runs it (above).
        View dst = test::host_view({3});
        std::string src = codegen::emit_cuda(
            compile_assignment(f.build(leaf(test::host_view({3}))).node(), dst, "sm_90").stages[0].kernel).code;
        CHECK(src.find(std::string(f.c_function) + "(") != std::string::npos);
#ifdef KILN_HAVE_NVRTC
        for (int sm : {80, 90}) {
            const cuda::NvrtcResult r = cuda::nvrtc_compile(src, std::string(f.name) + ".cu", sm);
            INFO(r.log);
            CHECK(r.ok);
        }
#endif
    }
}

namespace {

struct MathFn2 {
    const char* name;
    Expr (*build)(const Expr&, const Expr&);
    float (*host)(float, float);
    const char* c_function;
    OpKind op;
};

const std::vector<MathFn2>& math_functions2() {
    static const std::vector<MathFn2> fns = {
#define KILN_MATH(K, name, c_function, host)
#define KILN_MATH2(K, name, c_function, host) \
    {#name, kiln::name, [](float x, float y) { return (float)host(x, y); }, #c_function, OpKind::K},
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
    };
    return fns;
}

} // namespace

TEST_CASE("math functions of two arguments: interpreter bit for bit, CPU JIT within 4 ulps, broadcasting") {
    Context ctx(ContextOptions{"cpu"});
    REQUIRE(math_functions2().size() >= 3);
    std::vector<float> x = inputs(""), y = inputs("");
    std::reverse(y.begin(), y.end());
    y[1] = 0.0f, y[2] = -0.0f, x[3] = 0.0f;   // atan2's signed zeros, copysign of -0
    for (const MathFn2& f : math_functions2()) {
        INFO(f.name);
        CHECK(std::string(opkind_name(f.op)) == f.name);
        Tensor a = ctx.array(x, {(int64_t)x.size()}), b = ctx.array(y, {(int64_t)y.size()});
        Tensor out = ctx.eval(f.build(a, b));
        CHECK(out.dtype() == DType::Float32);
        const std::vector<float> got = out.to_vector<float>();

        const std::vector<float> interp = interpreted(f.build(a, b), out);
        for (size_t i = 0; i < x.size(); ++i) {
            INFO(x[i] << ", " << y[i]);
            const float want = f.host(x[i], y[i]);
            REQUIRE(ulps(got[i], want) <= 4);
            REQUIRE(std::memcmp(&interp[i], &want, 4) == 0);
        }

        // A row against a column: the operands broadcast as every binary op's do.
        Tensor col = ctx.array(std::vector<float>{-1.5f, 2.0f}, {2, 1});
        Tensor row = ctx.array(std::vector<float>{0.5f, -3.0f, 4.0f}, {1, 3});
        Tensor outer = ctx.eval(f.build(col, row));
        REQUIRE(outer.shape() == Shape{2, 3});
        const std::vector<float> o = outer.to_vector<float>();
        CHECK(o[5] == f.host(2.0f, 4.0f));
        CHECK(o[1] == f.host(-1.5f, -3.0f));
    }
}

TEST_CASE("math functions of two arguments: dtypes, literals, folding and the CUDA C they print") {
    Context ctx(ContextOptions{"cpu"});
    for (const MathFn2& f : math_functions2()) {
        INFO(f.name);
        Tensor i = ctx.array(std::vector<int32_t>{1, 2, 3}, {3});
        Tensor i8 = ctx.array(std::vector<int8_t>{1, 2, 3}, {3});
        Tensor h = ctx.array(std::vector<float>{0.25f, -0.5f}, {2}, DType::Float16);
        CHECK(f.build(i, i).dtype() == DType::Float32);
        CHECK(f.build(i8, i8).dtype() == DType::Float16);            // NumPy: small integers give float16
        CHECK(f.build(h, 2.0).dtype() == DType::Float16);            // a Python float adopts the tensor's dtype
        CHECK(f.build(h, ctx.array(std::vector<int32_t>{1, 2}, {2})).dtype() == DType::Float32);
        CHECK(std::fabs(ctx.eval(f.build(h, 2.0)).to_vector<float>()[1] - f.host(-0.5f, 2.0f)) <=
              1e-3f * (1 + std::fabs(f.host(-0.5f, 2.0f))));

        NodePtr folded = canonicalise(f.build(scalar(0.5, DType::Float32), scalar(-0.25, DType::Float32)).node());
        REQUIRE(folded->op == OpKind::Scalar);
        CHECK((float)folded->value == f.host(0.5f, -0.25f));

        View dst = test::host_view({3});
        std::string src = codegen::emit_cuda(compile_assignment(
            f.build(leaf(test::host_view({3})), leaf(test::host_view({3}))).node(), dst, "sm_90").stages[0].kernel).code;
        CHECK(src.find(std::string(f.c_function) + "(") != std::string::npos);
    }
    // Broadcasting mistakes name the function and both shapes.
    Tensor a = ctx.empty({2, 3}), b = ctx.empty({4});
    const std::string msg = test::error_message([&] { atan2(a, b); });
    CHECK(msg.find("atan2: operands could not be broadcast together with shapes (2, 3) and (4,)") != std::string::npos);
}

// The CUDA C of `e` assigned to a 3-element tensor of `dt`, compiled by NVRTC for sm_90.
static void check_cuda_compiles(const Expr& e, DType dt, const std::string& name) {
    const std::string src =
        codegen::emit_cuda(compile_assignment(e.node(), test::host_view({3}, dt), "sm_90").stages[0].kernel).code;
#ifdef KILN_HAVE_NVRTC
    const cuda::NvrtcResult r = cuda::nvrtc_compile(src, name + ".cu", 90);
    INFO(r.log);
    CHECK(r.ok);
#else
    CHECK(!src.empty());
#endif
}

// kiln/elementwise.def's bitwise ops: integers and bools on the CPU JIT against the host's own
// operators, and the CUDA C they print compiled by NVRTC.
TEST_CASE("bitwise ops: and, or, xor and invert of integers and bools; floats refused") {
    Context ctx(ContextOptions{"cpu"});
    std::vector<int32_t> xi{-128, -1, 0, 1, 5, 127, 100, -77}, yi{3, -1, 7, -128, 6, 1, -2, 90};
    for (DType dt : {DType::Int32, DType::Int8, DType::UInt8, DType::Bool}) {
        INFO(dtype_name(dt));
        auto norm = [&](int32_t v) -> int32_t {
            return dt == DType::Int8 ? (int8_t)v : dt == DType::UInt8 ? (uint8_t)v : dt == DType::Bool ? v != 0 : v;
        };
        std::vector<int32_t> x, y;
        for (size_t i = 0; i < xi.size(); ++i) x.push_back(norm(xi[i])), y.push_back(norm(yi[i]));
        Tensor a = ctx.array(x, {(int64_t)x.size()}, dt), b = ctx.array(y, {(int64_t)y.size()}, dt);
        const std::vector<int32_t> band = ctx.eval(bitwise_and(a, b)).to_vector<int32_t>(),
                                   bor = ctx.eval(bitwise_or(a, b)).to_vector<int32_t>(),
                                   bxor = ctx.eval(bitwise_xor(a, b)).to_vector<int32_t>(),
                                   inv = ctx.eval(bitwise_invert(a)).to_vector<int32_t>();
        CHECK(bitwise_and(a, b).dtype() == dt);
        for (size_t i = 0; i < x.size(); ++i) {
            INFO(x[i] << ", " << y[i]);
            CHECK(band[i] == norm(x[i] & y[i]));
            CHECK(bor[i] == norm(x[i] | y[i]));
            CHECK(bxor[i] == norm(x[i] ^ y[i]));
            CHECK(inv[i] == (dt == DType::Bool ? !x[i] : norm(~x[i])));
        }
        auto x3 = [&] { return leaf(test::host_view({3}, dt)); };
        check_cuda_compiles(bitwise_invert(bitwise_xor(bitwise_or(x3(), x3()), bitwise_and(x3(), x3()))), dt, "bitwise");
    }
    Tensor f = ctx.array(std::vector<float>{1.0f}, {1}), i = ctx.array(std::vector<int32_t>{1}, {1});
    const std::string msg = test::error_message([&] { bitwise_or(i, f); });
    CHECK(msg.find("bitwise_or: float operands are not supported") != std::string::npos);
    CHECK(msg.find("bitwise ops take integers and bools") != std::string::npos);
}

// Shifts against NumPy's rules on the promoted dtype: a left shift by the width or more gives 0,
// a right shift is arithmetic, an amount below 0 counts as too large; two bools shift as int8.
TEST_CASE("bitwise shifts: NumPy's results for every amount, in every integer dtype; floats refused") {
    Context ctx(ContextOptions{"cpu"});
    for (DType dt : {DType::Int32, DType::Int8, DType::UInt8}) {
        INFO(dtype_name(dt));
        const int width = dt == DType::Int32 ? 32 : 8;
        auto norm = [&](int64_t v) -> int32_t {
            return dt == DType::Int8 ? (int8_t)v : dt == DType::UInt8 ? (uint8_t)v : (int32_t)v;
        };
        std::vector<int32_t> x, s;
        for (int32_t v : {-2147483647 - 1, -128, -77, -1, 0, 1, 5, 100, 127, 255, 2147483647})
            for (int32_t k : {-1, 0, 1, 3, 7, 8, 9, 30, 31, 32, 100}) x.push_back(norm(v)), s.push_back(norm(k));
        Tensor a = ctx.array(x, {(int64_t)x.size()}, dt), b = ctx.array(s, {(int64_t)s.size()}, dt);
        const std::vector<int32_t> l = ctx.eval(bitwise_left_shift(a, b)).to_vector<int32_t>(),
                                   r = ctx.eval(bitwise_right_shift(a, b)).to_vector<int32_t>();
        CHECK(bitwise_left_shift(a, b).dtype() == dt);
        for (size_t i = 0; i < x.size(); ++i) {
            INFO(x[i] << " shifted by " << s[i]);
            const bool wide = s[i] < 0 || s[i] >= width;
            CHECK(l[i] == (wide ? 0 : norm((int64_t)((uint64_t)(uint32_t)x[i] << s[i]))));
            CHECK(r[i] == (wide ? (x[i] < 0 ? -1 : 0) : x[i] >> s[i]));
        }
        auto x3 = [&] { return leaf(test::host_view({3}, dt)); };
        check_cuda_compiles(bitwise_right_shift(bitwise_left_shift(x3(), x3()), x3()), dt, "shifts");
    }
    Tensor t = ctx.array(std::vector<int32_t>{1, 0}, {2}, DType::Bool);
    CHECK(bitwise_left_shift(t, t).dtype() == DType::Int8);
    CHECK(ctx.eval(bitwise_left_shift(t, t)).to_vector<int32_t>() == std::vector<int32_t>{2, 0});
    Tensor f = ctx.array(std::vector<float>{1.0f}, {1}), i = ctx.array(std::vector<int32_t>{1}, {1});
    const std::string msg = test::error_message([&] { bitwise_right_shift(i, f); });
    CHECK(msg.find("bitwise_right_shift: float operands are not supported") != std::string::npos);
    CHECK(msg.find("shifts take integers") != std::string::npos);
}
