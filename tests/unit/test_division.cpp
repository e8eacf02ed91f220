// floor_divide, remainder and fmod: NumPy's result dtypes, and NumPy's values (written out by
// hand below, as NumPy 2 gives them) from the CPU JIT and from the kernel IR interpreter, bit for
// bit: negative operands, zero divisors, inf and NaN, signed zeros, INT32_MIN // -1, int8 and
// uint8 wrap-around, bool, float16 rounding; and constant folding agrees with the kernels.
#include "tests/support/catch.hpp"
#include "tests/support/interpret.hpp"
#include "tests/support/views.hpp"

#include <kiln/kiln.hpp>

#include "compiler/canonicalise.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace kiln;

namespace {

using test::interpret_assignment;

using test::host_view;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Context cpu_context() { return Context(ContextOptions{"cpu", 7, DType::Float32}); }

enum class Fn { FloorDiv, Mod, Fmod };

Expr apply(Fn f, const Expr& a, const Expr& b) {
    switch (f) {
    case Fn::FloorDiv: return floor_divide(a, b);
    case Fn::Mod: return remainder(a, b);
    case Fn::Fmod: return fmod(a, b);
    }
    return {};
}

const char* fn_name(Fn f) { return f == Fn::FloorDiv ? "floor_divide" : f == Fn::Mod ? "remainder" : "fmod"; }


// Same value, or both NaN; a zero's sign counts.
bool same(double got, double want) {
    if (std::isnan(want)) return std::isnan(got);
    return got == want && std::signbit(got) == std::signbit(want);
}

struct Case {
    double a, b, floordiv, mod, fmod;
};

// Evaluates f over the cases (operands of dtype `t`, one element each along a vector) with the
// JIT and with the interpreter, and compares both with the expected column.
void check_cases(DType t, const std::vector<Case>& cases) {
    Context ctx = cpu_context();
    std::vector<double> a, b;
    for (const Case& c : cases) a.push_back(c.a), b.push_back(c.b);
    const Shape s{(int64_t)cases.size()};
    Tensor ta = ctx.array(a, s, t), tb = ctx.array(b, s, t);
    for (Fn f : {Fn::FloorDiv, Fn::Mod, Fn::Fmod}) {
        Expr e = apply(f, ta, tb);
        const DType rt = e.dtype();
        Tensor jit = ctx.empty(s, rt), interp = ctx.full(s, 0, rt);
        jit[all] = e;
        interpret_assignment(e, interp);
        std::vector<double> got_jit, got_interp;
        if (is_float(rt)) {
            for (float v : jit.to_vector<float>()) got_jit.push_back(v);
            for (float v : interp.to_vector<float>()) got_interp.push_back(v);
        } else {
            for (int32_t v : jit.to_vector<int32_t>()) got_jit.push_back(v);
            for (int32_t v : interp.to_vector<int32_t>()) got_interp.push_back(v);
        }
        for (size_t i = 0; i < cases.size(); ++i) {
            const Case& c = cases[i];
            const double want = f == Fn::FloorDiv ? c.floordiv : f == Fn::Mod ? c.mod : c.fmod;
            INFO(fn_name(f) << "(" << c.a << ", " << c.b << ") " << dtype_name(t) << ": jit " << got_jit[i]
                            << ", interpreter " << got_interp[i] << ", NumPy " << want);
            CHECK(same(got_jit[i], want));
            CHECK(same(got_interp[i], want));
        }
    }
}

} // namespace

TEST_CASE("division: result dtypes are NumPy's (two bools give int8)") {
    Expr f16 = leaf(host_view({2, 3}, DType::Float16));
    Expr i8 = leaf(host_view({2, 3}, DType::Int8));
    Expr u8 = leaf(host_view({2, 3}, DType::UInt8));
    Expr i32 = leaf(host_view({2, 3}, DType::Int32));
    Expr b = leaf(host_view({2, 3}, DType::Bool));
    for (Fn f : {Fn::FloorDiv, Fn::Mod, Fn::Fmod}) {
        INFO(fn_name(f));
        CHECK(apply(f, f16, f16).dtype() == DType::Float16);
        CHECK(apply(f, i8, i8).dtype() == DType::Int8);
        CHECK(apply(f, b, b).dtype() == DType::Int8);
        CHECK(apply(f, b, 1).dtype() == DType::Int32);                   // an integer literal is an integer
        CHECK(apply(f, i8, u8).dtype() == DType::Int16);                  // as NumPy
        CHECK(apply(f, i8, 2).dtype() == DType::Int8);                    // weak literals keep the tensor's dtype
        CHECK(apply(f, 2, u8).dtype() == DType::UInt8);
        CHECK(apply(f, i8, 2.5).dtype() == DType::Float32);
        CHECK(apply(f, f16, i8).dtype() == DType::Float16);
        CHECK(apply(f, i32, f16).dtype() == DType::Float32);
        CHECK(apply(f, f16, 3).dtype() == DType::Float16);
        CHECK(apply(f, i8, b).shape() == Shape{2, 3});
    }
    CHECK((i8 % 3).node()->op == OpKind::Mod);
    CHECK(floor_divide(leaf(host_view({4, 1})), leaf(host_view({5}))).shape() == Shape{4, 5});
    CHECK(std::string(opkind_name(OpKind::FloorDiv)) == "floor_divide");
    CHECK(std::string(opkind_name(OpKind::Mod)) == "remainder");
    CHECK(std::string(opkind_name(OpKind::Fmod)) == "fmod");
    CHECK((is_binary(OpKind::FloorDiv) && is_binary(OpKind::Mod) && is_binary(OpKind::Fmod)));
    CHECK_FALSE(is_commutative(OpKind::FloorDiv));
    CHECK_FALSE(is_comparison(OpKind::Mod));
}

TEST_CASE("division: float32 as NumPy's floor_divide, remainder and fmod") {
    check_cases(DType::Float32, {
        //  a       b        a // b   a % b     fmod
        {7, 2, 3, 1, 1},
        {-7, 2, -4, 1, -1},
        {7, -2, -4, -1, 1},
        {-7, -2, 3, -1, -1},
        {7.5, 2, 3, 1.5, 1.5},
        {-7.5, 2, -4, 0.5, -1.5},
        {-3.5, 0.75, -5, 0.25, -0.5},
        {3, 0.5, 6, 0, 0},
        {1, (double)0.1f, 9, (double)0.099999986f, (double)0.099999986f},
        {1e10, 3, (double)3.3333332e9f, 1, 1},          // the quotient rounded to float32
        {-1e-30, 1e30, -1, (double)1e30f, (double)-1e-30f},
        // zero divisors: a / 0 for the quotient, NaN remainders
        {1, 0, kInf, kNaN, kNaN},
        {-1, 0, -kInf, kNaN, kNaN},
        {0, 0, kNaN, kNaN, kNaN},
        {1, -0.0, -kInf, kNaN, kNaN},
        // signed zeros
        {0, 5, 0, 0, 0},
        {-0.0, 5, -0.0, 0, -0.0},
        {0, -5, -0.0, -0.0, 0},
        {5, -5, -1, -0.0, 0},
        {-5, 5, -1, 0, -0.0},
        // infinities and NaN
        {kInf, 2, kNaN, kNaN, kNaN},
        {-kInf, 2, kNaN, kNaN, kNaN},
        {kInf, kInf, kNaN, kNaN, kNaN},
        {2, kInf, 0, 2, 2},
        {-2, kInf, -1, kInf, -2},
        {2, -kInf, -1, -kInf, 2},
        {-2, -kInf, 0, -2, -2},
        {kNaN, 2, kNaN, kNaN, kNaN},
        {2, kNaN, kNaN, kNaN, kNaN},
    });
}

TEST_CASE("division: float16 and bfloat16 compute in float32 and round on store") {
    check_cases(DType::Float16, {
        {65504, 0.5, kInf, 0, 0},  // 131008 overflows float16
        {-7, 2, -4, 1, -1},
        {1, 0, kInf, kNaN, kNaN},
        {-0.0, 3, -0.0, 0, -0.0},
    });
    check_cases(DType::BFloat16, {
        {-7.5, 2, -4, 0.5, -1.5},
        {2, -kInf, -1, -kInf, 2},
    });
}

TEST_CASE("division: int32 rounds toward -inf; a zero divisor gives 0; INT32_MIN // -1 wraps") {
    const double mn = INT32_MIN, mx = INT32_MAX;
    check_cases(DType::Int32, {
        {7, 2, 3, 1, 1},
        {-7, 2, -4, 1, -1},
        {7, -2, -4, -1, 1},
        {-7, -2, 3, -1, -1},
        {-1, 3, -1, 2, -1},
        {6, -3, -2, 0, 0},
        {0, -3, 0, 0, 0},
        {5, 0, 0, 0, 0},
        {-5, 0, 0, 0, 0},
        {0, 0, 0, 0, 0},
        {mn, -1, mn, 0, 0},
        {mn, 1, mn, 0, 0},
        {mn, 3, -715827883, 1, -2},
        {mx, -1, -mx, 0, 0},
        {mn, mn, 1, 0, 0},
        {mx, mn, -1, -1, mx},
    });
}

TEST_CASE("division: int8 and uint8 wrap as NumPy's; bool divides as int8") {
    check_cases(DType::Int8, {
        {-128, -1, -128, 0, 0},  // 128 wraps to -128
        {-128, 3, -43, 1, -2},
        {127, -2, -64, -1, 1},
        {-7, 0, 0, 0, 0},
        {-128, -128, 1, 0, 0},
        {5, -128, -1, -123, 5},
    });
    check_cases(DType::UInt8, {
        {255, 2, 127, 1, 1},
        {200, 0, 0, 0, 0},
        {7, 255, 0, 7, 7},
        {0, 0, 0, 0, 0},
    });
    check_cases(DType::Bool, {
        {1, 1, 1, 0, 0},
        {1, 0, 0, 0, 0},
        {0, 1, 0, 0, 0},
        {0, 0, 0, 0, 0},
    });
}

TEST_CASE("division: broadcasting, literals on either side, mixed dtypes") {
    Context ctx = cpu_context();
    Tensor a = ctx.array(std::vector<double>{-7, -1, 0, 5}, {4, 1}, DType::Int8);
    Tensor b = ctx.array(std::vector<double>{-3, 0, 2}, {3}, DType::Int8);
    Tensor q = ctx.empty({4, 3}, DType::Int8), r = ctx.empty({4, 3}, DType::Int8);
    q[all] = floor_divide(a, b);
    r[all] = a % b;
    CHECK(q.to_vector<int32_t>() == std::vector<int32_t>{2, 0, -4, 0, 0, -1, 0, 0, 0, -2, 0, 2});
    CHECK(r.to_vector<int32_t>() == std::vector<int32_t>{-1, 0, 1, -1, 0, 1, 0, 0, 0, -1, 0, 1});
    // a literal divisor and a literal dividend
    Tensor l = ctx.empty({4, 1}, DType::Int8), m = ctx.empty({4, 1}, DType::Int8);
    l[all] = floor_divide(a, 2);
    m[all] = remainder(9, a);
    CHECK(l.to_vector<int32_t>() == std::vector<int32_t>{-4, -1, 0, 2});
    CHECK(m.to_vector<int32_t>() == std::vector<int32_t>{-5, 0, 0, 4});
    // int8 by a float literal is float32 (NumPy: float64)
    Tensor f = ctx.empty({4, 1}, DType::Float32);
    f[all] = a % 2.5;
    CHECK(f.to_vector<float>() == std::vector<float>{0.5f, 1.5f, 0.0f, 0.0f});
}

TEST_CASE("division: scalar subtrees fold to the values the kernels compute") {
    Context ctx = cpu_context();
    struct Folded { Expr e; double want; };
    const std::vector<Folded> cases = {
        {floor_divide(Expr(-7), Expr(2)), -4},
        {remainder(Expr(-7), Expr(2)), 1},
        {fmod(Expr(-7), Expr(2)), -1},
        {floor_divide(Expr(5), Expr(0)), 0},
        {floor_divide(scalar(INT32_MIN, DType::Int32), Expr(-1)), INT32_MIN},
        {floor_divide(scalar(-128, DType::Int8), scalar(-1, DType::Int8)), -128},
        {remainder(scalar(5, DType::Int8), scalar(-128, DType::Int8)), -123},
        {floor_divide(Expr(-7.5), Expr(2.0)), -4},
        {remainder(Expr(-2.0), Expr(kInf)), kInf},
        {floor_divide(Expr(1.0), Expr(0.1)), 9},
        {remainder(Expr(1.0), Expr(0.1)), (double)0.099999986f},
        {floor_divide(Expr(1.0), Expr(-0.0)), -kInf},
        {remainder(Expr(3.0), Expr(0.0)), kNaN},
        {floor_divide(Expr(-0.0), Expr(5.0)), -0.0},
        {floor_divide(scalar(true, DType::Bool), scalar(false, DType::Bool)), 0},
    };
    for (const Folded& c : cases) {
        INFO(c.e.str());
        NodePtr folded = canonicalise(c.e.node());
        REQUIRE(folded->op == OpKind::Scalar);
        CHECK(folded->dtype == c.e.dtype());
        CHECK(same(folded->value, c.want));
        // The same division computed by a kernel: the dividend times a tensor of ones (the
        // product keeps the value, signed zeros included) does not fold.
        const Node& n = *c.e.node();
        const Fn f = n.op == OpKind::FloorDiv ? Fn::FloorDiv : n.op == OpKind::Mod ? Fn::Mod : Fn::Fmod;
        Tensor ones = ctx.full({1}, 1, n.inputs[0]->dtype);
        Tensor out = ctx.empty({1}, c.e.dtype());
        out[all] = apply(f, multiply(Expr(n.inputs[0]), ones), Expr(n.inputs[1]));
        const double got = is_float(c.e.dtype()) ? (double)out.to_vector<float>()[0] : (double)out.to_vector<int32_t>()[0];
        CHECK(same(got, c.want));
    }
}
