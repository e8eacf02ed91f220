// The differential test's float64 reference (test_differential.cpp says what it checks): small
// utilities (a portable RNG, the device under test), the numerics of the reference (values with
// their error bounds, dtype rules re-derived from the documentation) and the reference node with
// its eager interpreter, written independently of kiln's compiler.
#pragma once
#include <kiln/kiln.hpp>

#include "compiler/kernel_text.hpp"
#include "compiler/key.hpp"
#include "compiler/pipeline.hpp"
#include "ir/rng.hpp"

#if defined(KILN_HAVE_NVRTC) && __has_include("codegen/cuda/cuda_codegen.hpp") && __has_include("runtime/cuda/nvrtc.hpp")
#include "codegen/cuda/cuda_codegen.hpp"
#include "runtime/cuda/nvrtc.hpp"
#define KILN_DIFF_NVRTC 1
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <csignal>
#include <new>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

using kiln::DType;
using kiln::Expr;
using kiln::Shape;
using kiln::Tensor;


namespace {


// The device under test (KILN_TEST_DEVICE), and whether it can be used here.
std::string test_device() {
    const char* d = std::getenv("KILN_TEST_DEVICE");
    return d && *d ? d : "cpu";
}


// ======================================================================================
// Small utilities
// ======================================================================================

// splitmix64: the same sequence on every platform (std's distributions are not portable), so a
// printed seed replays anywhere.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    int64_t range(int64_t lo, int64_t hi) { return lo + (int64_t)(next() % (uint64_t)(hi - lo + 1)); }  // inclusive
    double uni() { return (double)(next() >> 11) * 0x1.0p-53; }
    double uni(double lo, double hi) { return lo + (hi - lo) * uni(); }
    bool chance(double p) { return uni() < p; }
    template <class T>
    T pick(std::initializer_list<T> v) { return *(v.begin() + next() % v.size()); }
    template <class T>
    const T& pick(const std::vector<T>& v) { return v[next() % v.size()]; }
};

uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int64_t count(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}

std::string shape_s(const Shape& s) {
    std::string r = "(";
    for (size_t i = 0; i < s.size(); ++i) {
        if (i) r += ", ";
        r += std::to_string(s[i]);
    }
    if (s.size() == 1) r += ",";
    return r + ")";
}

// Names come from the library: only the dtype *rules* are re-derived independently here.
const char* dname(DType t) { return kiln::dtype_name(t).data(); }

const std::vector<DType> kAllDTypes = {DType::Float32, DType::Float16, DType::BFloat16, DType::Int32,
                                       DType::Int8,    DType::UInt8,   DType::Bool};

bool isf(DType t) { return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16; }
bool is16(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

std::vector<int64_t> unravel(int64_t i, const Shape& s) {
    std::vector<int64_t> c(s.size());
    for (size_t d = s.size(); d-- > 0;) {
        c[d] = s[d] ? i % s[d] : 0;
        i = s[d] ? i / s[d] : 0;
    }
    return c;
}

std::string idx_s(int64_t i, const Shape& s) {
    auto c = unravel(i, s);
    std::string r = "[";
    for (size_t d = 0; d < c.size(); ++d) {
        if (d) r += ',';
        r += std::to_string(c[d]);
    }
    return r + "]";
}

// For each row-major index of `out`, the row-major index of `in` that NumPy broadcasting reads.
std::vector<int64_t> bmap(const Shape& in, const Shape& out) {
    int r = (int)out.size(), k = (int)in.size();
    std::vector<int64_t> st(r, 0);
    int64_t acc = 1;
    for (int j = k - 1; j >= 0; --j) {
        int d = j + r - k;
        st[d] = in[j] == 1 ? 0 : acc;
        acc *= in[j];
    }
    int64_t n = count(out);
    std::vector<int64_t> m((size_t)n);
    std::vector<int64_t> c(r, 0);
    int64_t idx = 0;
    for (int64_t i = 0; i < n; ++i) {
        m[i] = idx;
        for (int d = r - 1; d >= 0; --d) {
            if (++c[d] < out[d]) { idx += st[d]; break; }
            idx -= st[d] * (out[d] - 1);
            c[d] = 0;
        }
    }
    return m;
}

// NumPy's broadcast of two shapes; nullopt when they do not broadcast.
std::optional<Shape> bshape(const Shape& a, const Shape& b) {
    size_t r = std::max(a.size(), b.size());
    Shape o(r);
    for (size_t i = 0; i < r; ++i) {
        int64_t x = i < r - a.size() ? 1 : a[i - (r - a.size())];
        int64_t y = i < r - b.size() ? 1 : b[i - (r - b.size())];
        if (x != y && x != 1 && y != 1) return std::nullopt;
        o[i] = x == 1 ? y : x;
    }
    return o;
}

// ======================================================================================
// Numerics of the reference
// ======================================================================================

constexpr double kU = 0x1p-24;  // float32 unit roundoff: every float op is computed in float32
constexpr double kTolFactor = 4;  // tolerance = 4x the first-order error bound (+ rtol, atol)
constexpr double kUnstable = 8;   // a discontinuity within 8x the bound marks the element unstable

// Rounds x to `p` significant bits with minimum normal exponent `emin` (subnormals below it),
// ties to even; beyond `maxfin` it becomes inf. Used for float32/float16/bfloat16 stores.
double round_prec(double x, int p, int emin, double maxfin) {
    if (!std::isfinite(x) || x == 0) return x;
    int e;
    std::frexp(x, &e);
    int lead = std::max(e - 1, emin);
    double q = std::ldexp(1.0, lead - (p - 1));
    double r = std::nearbyint(x / q) * q;  // the default rounding mode: to nearest, ties to even
    if (std::fabs(r) > maxfin) return std::copysign(INFINITY, x);
    return r;
}

double round_float(DType t, double x) {
    switch (t) {
    case DType::Float32: return round_prec(x, 24, -126, (double)FLT_MAX);
    case DType::Float16: return round_prec(x, 11, -14, 65504.0);
    case DType::BFloat16: return round_prec(x, 8, -126, 3.3895313892515355e38);
    default: return x;
    }
}

// Half an ulp, relative: the error of storing a value to this dtype.
double store_unit(DType t) { return t == DType::Float16 ? 0x1p-11 : t == DType::BFloat16 ? 0x1p-8 : kU; }

int64_t trunc_sat(double x) {
    if (std::isnan(x)) return 0;
    double t = std::trunc(x);
    if (t <= -2147483648.0) return INT32_MIN;
    if (t >= 2147483647.0) return INT32_MAX;
    return (int64_t)t;
}

int64_t wrap_int(DType t, int64_t i) {
    switch (t) {
    case DType::Int32: return (int64_t)(int32_t)(uint32_t)(uint64_t)i;
    case DType::Int8: return (int64_t)(int8_t)(uint8_t)((uint64_t)i & 0xff);
    case DType::UInt8: return (int64_t)((uint64_t)i & 0xff);
    case DType::Int16: return (int64_t)(int16_t)(uint16_t)((uint64_t)i & 0xffff);
    case DType::UInt16: return (int64_t)((uint64_t)i & 0xffff);
    case DType::Bool: return i != 0;
    default: return i;
    }
}

// One element of the reference: value (exact integer for integer dtypes; double for floats,
// not rounded to 16 bits in flight), first-order error bound, and the unstable flag.
struct X {
    double v = 0, e = 0;
    bool u = false;
};

// A value of dtype `from` re-expressed in dtype `to`, as kiln's kernels convert operands to
// the op's dtype and results to the destination's.
X convert(X x, DType from, DType to) {
    const bool ff = isf(from);
    if (isf(to)) {
        if (!ff) x.e = std::fabs(x.v) > 16777216.0 ? kU * std::fabs(x.v) : 0;  // int -> float32
        return x;
    }
    if (to == DType::Bool) {
        if (ff && x.e > 0 && std::fabs(x.v) <= kUnstable * x.e) x.u = true;
        x.v = (x.v != 0 || std::isnan(x.v)) ? 1 : 0;
        x.e = 0;
        return x;
    }
    int64_t i;
    if (ff) {
        if (x.e > 0 && std::isfinite(x.v) && trunc_sat(x.v - kUnstable * x.e) != trunc_sat(x.v + kUnstable * x.e))
            x.u = true;
        i = trunc_sat(x.v);
    } else {
        i = (int64_t)x.v;
    }
    x.v = (double)wrap_int(to, i);
    x.e = 0;
    return x;
}

// Error terms multiply values; in the special-values graphs those may be inf, where the
// product says nothing: such terms count as 0 (those graphs only use exact selections).
double fe(double x) { return std::isfinite(x) ? x : 0; }

// ======================================================================================
// The reference node and its interpreter
// ======================================================================================

enum class Op {
    Leaf, Scalar, Rand, Iota,
    Neg, Abs, Sqrt, Square, Exp, Exp2, Log, Log2, SafeLog, Sig, Sig2, Tanh, Tanh2, Recip, Sgn, Rint, Finite, Cast,
    Erf, Erfc, Expm1, Log1p, Log10, Sin, Cos, Atan,
    Add, Sub, Mul, Div, FloorDiv, Mod, Fmod, Pow, Maximum, Minimum, Eq, Ne, Gt, Ge, Lt, Le,
    Atan2, Hypot, Copysign,
    Where,
    Sum, Max, Min, ArgMax, ArgMin, Prod,
    Reshape, Take, Onehot,
};

constexpr int kNumOps = (int)Op::Onehot + 1;

const char* op_name(Op o) {
    switch (o) {
    case Op::Leaf: return "tensor"; case Op::Scalar: return "scalar"; case Op::Rand: return "rand";
    case Op::Iota: return "iota"; case Op::Neg: return "negative"; case Op::Abs: return "absolute";
    case Op::Sqrt: return "sqrt"; case Op::Square: return "square"; case Op::Exp: return "exp";
    case Op::Exp2: return "exp2"; case Op::Log: return "log"; case Op::Log2: return "log2";
    case Op::SafeLog: return "safelog"; case Op::Sig: return "sig"; case Op::Sig2: return "sig2";
    case Op::Tanh: return "tanh"; case Op::Tanh2: return "tanh2"; case Op::Recip: return "reciprocal";
    case Op::Sgn: return "sgn"; case Op::Rint: return "rint"; case Op::Finite: return "finite";
    case Op::Cast: return "cast"; case Op::Add: return "add"; case Op::Sub: return "subtract";
    case Op::Mul: return "multiply"; case Op::Div: return "divide"; case Op::FloorDiv: return "floor_divide";
    case Op::Mod: return "remainder"; case Op::Fmod: return "fmod"; case Op::Pow: return "power";
    case Op::Maximum: return "maximum"; case Op::Minimum: return "minimum"; case Op::Eq: return "equal";
    case Op::Ne: return "not_equal"; case Op::Gt: return "greater"; case Op::Ge: return "greater_equal";
    case Op::Lt: return "less"; case Op::Le: return "less_equal"; case Op::Where: return "where";
    case Op::Sum: return "sum"; case Op::Max: return "max"; case Op::Min: return "min";
    case Op::ArgMax: return "argmax"; case Op::ArgMin: return "argmin"; case Op::Prod: return "prod";
    case Op::Reshape: return "reshape";
    case Op::Take: return "take"; case Op::Onehot: return "onehot";
    case Op::Erf: return "erf"; case Op::Erfc: return "erfc"; case Op::Expm1: return "expm1";
    case Op::Log1p: return "log1p"; case Op::Log10: return "log10"; case Op::Sin: return "sin";
    case Op::Cos: return "cos"; case Op::Atan: return "atan";
    case Op::Atan2: return "atan2"; case Op::Hypot: return "hypot"; case Op::Copysign: return "copysign";
    }
    return "?";
}

struct RNode;
using RP = std::shared_ptr<RNode>;

struct RNode {
    Op op;
    DType dtype;
    bool weak = false;  // a literal without a dtype of its own
    Shape shape;
    std::vector<RP> kids;
    std::string attr;
    int id = 0;
    bool reduction = false;  // a reduction in this subtree
    std::vector<double> v, e;
    std::vector<uint8_t> u;

    int64_t n() const { return (int64_t)v.size(); }
    X at(int64_t i) const { return X{v[i], e[i], u[i] != 0}; }
    void set(int64_t i, X x) {
        v[i] = x.v;
        if (!std::isfinite(x.v)) x.e = 0;  // inf/NaN results are compared exactly
        if (!std::isfinite(x.e)) { x.e = 0; x.u = true; }
        e[i] = x.e;
        u[i] = x.u;
    }
};

int g_next_id = 0;

RP mk(Op op, DType t, Shape s, std::vector<RP> kids, std::string attr = "") {
    auto r = std::make_shared<RNode>();
    r->op = op;
    r->dtype = t;
    r->shape = std::move(s);
    r->kids = std::move(kids);
    r->attr = std::move(attr);
    r->id = ++g_next_id;
    for (auto& k : r->kids) r->reduction |= k->reduction;
    int64_t n = count(r->shape);
    r->v.assign(n, 0);
    r->e.assign(n, 0);
    r->u.assign(n, 0);
    return r;
}

std::string ref_str(const RP& root) {
    std::string out;
    std::set<int> seen;
    std::function<void(const RP&)> walk = [&](const RP& n) {
        if (!seen.insert(n->id).second) return;
        for (auto& k : n->kids) walk(k);
        std::string args;
        for (auto& k : n->kids) args += (args.empty() ? "" : ", ") + std::string("%") + std::to_string(k->id);
        if (!n->attr.empty()) args += (args.empty() ? "" : ", ") + n->attr;
        out += "  %" + std::to_string(n->id) + " = " + op_name(n->op) + "(" + args + ") " + dname(n->dtype) +
               (n->weak ? " (weak)" : "") + " " + shape_s(n->shape) + "\n";
    };
    walk(root);
    return out;
}

// ---- dtype rules, re-derived from the documentation (kiln/dtype.hpp, kiln/expr.hpp)

int kind_of(DType t) { return t == DType::Bool ? 0 : isf(t) ? 2 : 1; }

// NumPy's promotion table on the generator's dtypes (int8 with uint8 -> int16); where kiln
// keeps 32-bit arithmetic 32-bit (int32 with a float -> float32, not NumPy's float64) or NumPy
// has no rule (float16 with bfloat16), float32.
DType ref_promote(DType a, DType b) {
    if (a == b) return a;
    if (a == DType::Bool) return b;
    if (b == DType::Bool) return a;
    const bool fa = isf(a), fb = isf(b);
    if (fa && fb) return DType::Float32;
    if (fa || fb) {
        DType f = fa ? a : b, i = fa ? b : a;
        if (f == DType::Float32) return DType::Float32;
        return i == DType::Int32 || i == DType::Int16 ? DType::Float32 : f;  // int8/uint8 fit a 16-bit float
    }
    if (a == DType::Int32 || b == DType::Int32) return DType::Int32;
    return DType::Int16;   // int8 or int16 with uint8
}

// Weak literals (Python numbers) take the other operand's dtype unless they are of a higher
// kind (bool < integer < float), in which case they bring their default dtype (int32/float32).
DType ref_result_type(const RP& a, const RP& b) {
    if (a->weak && b->weak) return kind_of(a->dtype) >= kind_of(b->dtype) ? a->dtype : b->dtype;
    if (a->weak) return kind_of(a->dtype) > kind_of(b->dtype) ? a->dtype : b->dtype;
    if (b->weak) return kind_of(b->dtype) > kind_of(a->dtype) ? b->dtype : a->dtype;
    return ref_promote(a->dtype, b->dtype);
}

// Transcendental functions: floats keep their dtype; int32 and int16 give float32; int8/uint8/bool
// give float16 (NumPy's choice for small integers).
DType float_result(DType t) {
    if (isf(t)) return t;
    return t == DType::Int32 || t == DType::Int16 ? DType::Float32 : DType::Float16;
}

bool is_float_unary(Op o) {
    switch (o) {
    case Op::Sqrt: case Op::Exp: case Op::Exp2: case Op::Log: case Op::Log2: case Op::SafeLog: case Op::Sig:
    case Op::Sig2: case Op::Tanh: case Op::Tanh2: case Op::Recip: case Op::Rint: case Op::Erf: case Op::Erfc:
    case Op::Expm1: case Op::Log1p: case Op::Log10: case Op::Sin: case Op::Cos: case Op::Atan: return true;
    default: return false;
    }
}

// C's float functions of two arguments: the operands' common dtype's float result (as one).
bool is_math2(Op o) { return o == Op::Atan2 || o == Op::Hypot || o == Op::Copysign; }

bool is_cmp(Op o) { return o == Op::Eq || o == Op::Ne || o == Op::Gt || o == Op::Ge || o == Op::Lt || o == Op::Le; }
bool is_division(Op o) { return o == Op::FloorDiv || o == Op::Mod || o == Op::Fmod; }

// ---- elementwise evaluation in float32 semantics (values in double, error bound alongside)

// The error a float32 operation adds to its result. Inputs without error are float32 values;
// for a correctly rounded operation (+ - * / sqrt) on them kiln's result is the exact result
// rounded once to float32, which is the reference itself when that is representable (exact
// integer and small dyadic arithmetic stays exact, so comparisons, rint and casts on it stay
// decidable). Otherwise: `ulps` units of roundoff of the result.
double local_err(double r, bool exact_inputs, double ulps = 1) {
    if (!std::isfinite(r)) return 0;
    if (exact_inputs && round_float(DType::Float32, r) == r) return 0;
    return ulps * kU * std::fabs(r);
}

X f_unary(Op op, X a) {
    X r;
    r.u = a.u;
    const double x = a.v, ex = a.e;
    switch (op) {
    case Op::Neg: r.v = -x; r.e = ex; break;
    case Op::Abs: r.v = std::fabs(x); r.e = ex; break;
    case Op::Square: r.v = x * x; r.e = fe(2 * std::fabs(x) * ex) + ex * ex + local_err(r.v, ex == 0); break;
    case Op::Sqrt:
        r.v = std::sqrt(x);
        r.e = (x > 0 ? std::min(ex / (2 * r.v), std::sqrt(ex)) : std::sqrt(ex)) + local_err(r.v, ex == 0, 2);
        break;
    case Op::Exp:
        r.v = std::exp(x);
        r.e = fe(r.v * std::expm1(ex)) + fe(4 * kU * r.v + 2 * kU * std::fabs(x) * r.v);
        break;
    case Op::Exp2:
        r.v = std::exp2(x);
        r.e = fe(r.v * std::expm1(ex * M_LN2)) + fe(4 * kU * r.v + 2 * kU * std::fabs(x) * M_LN2 * r.v);
        break;
    case Op::Log:
        r.v = std::log(x);
        r.e = (x > ex ? ex / (x - ex) : (ex > 0 ? INFINITY : 0)) + 4 * kU * std::fabs(r.v) + 2 * kU;
        break;
    case Op::Log2:
        r.v = std::log2(x);
        r.e = (x > ex ? ex / ((x - ex) * M_LN2) : (ex > 0 ? INFINITY : 0)) + 4 * kU * std::fabs(r.v) + 3 * kU;
        break;
    case Op::SafeLog: {
        const double floor = (double)(float)std::exp(-50.0);  // the float32 constant kiln uses
        double m = std::isnan(x) ? x : std::max(x, floor);
        r.v = std::log(m);
        r.e = (ex > 0 ? ex / std::max(m - ex, floor) : 0) + 4 * kU * std::fabs(r.v) + 2 * kU;
        break;
    }
    case Op::Sig: case Op::Sig2: {
        const double k = op == Op::Sig ? 1.0 : M_LN2;
        r.v = 1.0 / (1.0 + std::exp(-x * k));
        double d = k * r.v * (1 - r.v);
        r.e = d * ex + 6 * kU * r.v + 2 * kU * fe(std::fabs(x) * d);
        break;
    }
    case Op::Tanh: case Op::Tanh2: {
        const double k = op == Op::Tanh ? 1.0 : M_LN2;
        r.v = std::tanh(x * k);
        double d = k * (1 - r.v * r.v);
        r.e = d * ex + 4 * kU * std::fabs(r.v) + 3 * kU * fe(std::fabs(x) * d);
        break;
    }
    // C's float functions: the input's error through the derivative's bound near x, a few ulps of
    // the result (the GPU's erfcf is within 4), and the argument's own rounding, as for tanh.
    case Op::Erf: case Op::Erfc: {
        r.v = op == Op::Erf ? std::erf(x) : std::erfc(x);
        double d = M_2_SQRTPI * std::exp(-std::max(0.0, std::fabs(x) - ex) * std::max(0.0, std::fabs(x) - ex));
        r.e = d * ex + 6 * kU * std::fabs(r.v) + 3 * kU * fe(std::fabs(x) * d);
        break;
    }
    case Op::Expm1:
        r.v = std::expm1(x);
        r.e = fe(std::exp(x + ex) * ex) + 4 * kU * std::fabs(r.v) + 3 * kU * fe(std::fabs(x) * std::exp(x));
        break;
    case Op::Log1p:
        r.v = std::log1p(x);
        r.e = (1 + x > ex ? ex / (1 + x - ex) : (ex > 0 ? INFINITY : 0)) + 4 * kU * std::fabs(r.v) + 2 * kU;
        break;
    case Op::Log10:
        r.v = std::log10(x);
        r.e = (x > ex ? ex / ((x - ex) * M_LN10) : (ex > 0 ? INFINITY : 0)) + 4 * kU * std::fabs(r.v) + 3 * kU;
        break;
    case Op::Sin: case Op::Cos:
        r.v = op == Op::Sin ? std::sin(x) : std::cos(x);
        r.e = ex + 4 * kU * std::fabs(r.v) + 3 * kU * fe(std::fabs(x));
        break;
    case Op::Atan:
        r.v = std::atan(x);
        r.e = ex + 4 * kU * std::fabs(r.v) + 3 * kU * fe(std::fabs(x) / (1 + x * x));
        break;
    case Op::Recip: {
        r.v = 1.0 / x;
        double lo = std::fabs(x) - ex;
        r.e = (lo > 0 ? ex / (lo * lo) : (ex > 0 ? INFINITY : 0)) + local_err(r.v, ex == 0, 2);
        break;
    }
    case Op::Sgn:
        r.v = std::isnan(x) ? x : (double)((x > 0) - (x < 0));
        if (ex > 0 && std::fabs(x) <= kUnstable * ex) r.u = true;
        break;
    case Op::Rint: {
        r.v = std::nearbyint(x);  // ties to even
        double frac = x - std::floor(x);
        if (ex > 0 && std::fabs(frac - 0.5) <= kUnstable * ex) r.u = true;
        break;
    }
    default: break;
    }
    return r;
}

X i_unary(Op op, X a, DType t) {
    X r;
    r.u = a.u;
    int64_t x = (int64_t)a.v;
    switch (op) {
    case Op::Neg: r.v = (double)wrap_int(t, -x); break;
    case Op::Abs: r.v = (double)wrap_int(t, x < 0 ? -x : x); break;
    case Op::Square: r.v = (double)wrap_int(t, (int64_t)((uint64_t)x * (uint64_t)x)); break;
    case Op::Sgn: r.v = (double)((x > 0) - (x < 0)); break;
    default: break;
    }
    return r;
}

X f_binary(Op op, X a, X b) {
    X r;
    r.u = a.u || b.u;
    const double x = a.v, y = b.v;
    const bool exact = a.e == 0 && b.e == 0;
    switch (op) {
    case Op::Add: r.v = x + y; r.e = a.e + b.e + local_err(r.v, exact); break;
    case Op::Sub: r.v = x - y; r.e = a.e + b.e + local_err(r.v, exact); break;
    case Op::Mul:
        r.v = x * y;
        r.e = fe(std::fabs(y) * a.e) + fe(std::fabs(x) * b.e) + a.e * b.e + local_err(r.v, exact);
        break;
    case Op::Div: {
        r.v = x / y;
        double lo = std::fabs(y) - b.e;
        r.e = lo > 0 ? a.e / lo + std::fabs(x) * b.e / (lo * lo) : (a.e + b.e > 0 ? INFINITY : 0);
        r.e += local_err(r.v, exact, 2);
        break;
    }
    case Op::Pow: {
        r.v = std::pow(x, y);
        double l = std::log(std::fabs(x));
        double dx = fe(std::fabs(y * std::pow(x, y - 1)));
        r.e = dx * a.e + fe(std::fabs(r.v * l)) * b.e + fe((4 + 2 * std::fabs(y * l)) * kU * std::fabs(r.v));
        break;
    }
    case Op::FloorDiv: case Op::Mod: case Op::Fmod: {
        // NumPy's floor_divide and remainder are Python's float // and % (the quotient rounded
        // toward -inf, the remainder with the divisor's sign); fmod is C's. By 0: x / 0, NaN, NaN.
        double fd, md, fm;
        if (y == 0) {
            fd = x / y;
            md = fm = NAN;
        } else if (!std::isfinite(x) || std::isnan(y)) {
            fd = md = fm = NAN;
        } else if (std::isinf(y)) {  // a finite dividend: quotient 0 or -1
            fm = x;
            if (x == 0 || (x < 0) == (y < 0)) {
                fd = std::copysign(0.0, x / y);
                md = x == 0 ? std::copysign(0.0, y) : x;
            } else {
                fd = -1;
                md = y;
            }
        } else {
            fd = std::floor(x / y);
            md = x - fd * y;  // exact for the operands' float32 values and the quotients used here
            if (md == 0) md = std::copysign(0.0, y);
            if (fd == 0) fd = std::copysign(0.0, x / y);
            fm = std::fmod(x, y);
        }
        r.v = op == Op::FloorDiv ? fd : op == Op::Mod ? md : fm;
        // A dividend near a multiple of the divisor is a discontinuity (the quotient steps,
        // the remainder jumps by the divisor) when the operands are not exact.
        const double q = x / y, err = a.e + fe(std::fabs(q) * b.e);
        if (err > 0 && std::isfinite(q) && std::fabs(x - std::nearbyint(q) * y) <= kUnstable * err) r.u = true;
        if (op == Op::FloorDiv) r.e = local_err(r.v, true);  // an integer: exact unless beyond 2^24
        else if (op == Op::Mod) r.e = err + local_err(r.v, exact);  // fmod is exact; moving it rounds
        else r.e = err;
        break;
    }
    case Op::Atan2: {
        // d/dx atan2(x, y) = y / (x^2 + y^2), d/dy = -x / (x^2 + y^2). Unstable near the branch
        // cut (x crossing 0 with y < 0 jumps by 2 pi), near the origin, and at signed zeros.
        r.v = std::atan2(x, y);
        const double d = x * x + y * y;
        r.e = d > 0 ? fe((std::fabs(y) * a.e + std::fabs(x) * b.e) / d) : 0;
        r.e += local_err(r.v, false, 4);
        if (x == 0 || std::fabs(x) <= kUnstable * a.e || d <= kUnstable * (a.e + b.e) * (a.e + b.e))
            r.u = true;
        break;
    }
    case Op::Hypot: {
        // First and second order, capped by hypot(a.e, b.e): hypot moves no more than its operands.
        r.v = std::hypot(x, y);
        const double cap = std::hypot(a.e, b.e);
        r.e = r.v > 0 ? std::min(cap, fe((std::fabs(x) * a.e + std::fabs(y) * b.e) / r.v) +
                                          fe((a.e * a.e + b.e * b.e) / (2 * r.v)))
                      : cap;
        r.e += local_err(r.v, false, 2);
        break;
    }
    case Op::Copysign:
        // Exact; unstable where y's sign is in doubt (within its error of 0, or a zero).
        r.v = std::copysign(x, y);
        r.e = a.e;
        if (y == 0 || std::isnan(y) || std::fabs(y) <= kUnstable * b.e) r.u = true;
        break;
    case Op::Maximum: case Op::Minimum: {
        // NaN-propagating (NumPy's maximum/minimum)
        if (std::isnan(x)) r.v = x;
        else if (std::isnan(y)) r.v = y;
        else r.v = op == Op::Maximum ? std::max(x, y) : std::min(x, y);
        r.e = std::max(a.e, b.e);
        break;
    }
    default: {  // comparisons
        bool c = false;
        switch (op) {
        case Op::Eq: c = x == y; break;
        case Op::Ne: c = x != y; break;
        case Op::Gt: c = x > y; break;
        case Op::Ge: c = x >= y; break;
        case Op::Lt: c = x < y; break;
        case Op::Le: c = x <= y; break;
        default: break;
        }
        r.v = c;
        double eb = a.e + b.e;
        if (eb > 0 && !std::isnan(x) && !std::isnan(y) && std::fabs(x - y) <= kUnstable * eb) r.u = true;
        break;
    }
    }
    return r;
}

X i_binary(Op op, X a, X b, DType t) {
    X r;
    r.u = a.u || b.u;
    int64_t x = (int64_t)a.v, y = (int64_t)b.v;
    switch (op) {
    case Op::Add: r.v = (double)wrap_int(t, x + y); break;
    case Op::Sub: r.v = (double)wrap_int(t, x - y); break;
    case Op::Mul: r.v = (double)wrap_int(t, (int64_t)((uint64_t)x * (uint64_t)y)); break;
    case Op::FloorDiv: case Op::Mod: case Op::Fmod: {
        // NumPy's integer loops: a zero divisor gives 0; the quotient rounds toward -inf (in
        // int64, so INT32_MIN // -1 is 2^31, which wraps back); the remainder has y's sign.
        if (y == 0) { r.v = 0; break; }
        int64_t q = x / y, m = x % y;
        if (op != Op::Fmod && m != 0 && (m < 0) != (y < 0)) --q, m += y;
        r.v = (double)wrap_int(t, op == Op::FloorDiv ? q : m);
        break;
    }
    case Op::Maximum: r.v = (double)std::max(x, y); break;
    case Op::Minimum: r.v = (double)std::min(x, y); break;
    case Op::Eq: r.v = x == y; break;
    case Op::Ne: r.v = x != y; break;
    case Op::Gt: r.v = x > y; break;
    case Op::Ge: r.v = x >= y; break;
    case Op::Lt: r.v = x < y; break;
    case Op::Le: r.v = x <= y; break;
    default: break;
    }
    return r;
}

// ---- reference node constructors (each evaluates eagerly)

RP r_leaf(DType t, const Shape& s, const std::vector<double>& vals, const std::string& desc) {
    RP r = mk(Op::Leaf, t, s, {}, desc);
    r->v = vals;
    return r;
}

// A literal: kiln passes it to the kernel as a float32 or int32 argument.
RP r_scalar(double value, DType t, bool weak) {
    RP r = mk(Op::Scalar, t, {}, {}, std::to_string(value));
    r->weak = weak;
    r->v[0] = isf(t) ? (double)(float)value : (double)trunc_sat(value);
    return r;
}

RP r_rand(const Shape& s, uint32_t seed32, uint32_t counter) {
    RP r = mk(Op::Rand, DType::Float32, s, {}, "counter " + std::to_string(counter));
    for (int64_t i = 0; i < r->n(); ++i) r->v[i] = (double)kiln::philox_uniform(seed32, counter, (uint32_t)i);
    return r;
}

RP r_iota(const Shape& s, int axis) {
    RP r = mk(Op::Iota, DType::Int32, s, {}, "axis=" + std::to_string(axis));
    for (int64_t i = 0; i < r->n(); ++i) r->v[i] = (double)unravel(i, s)[axis];
    return r;
}

RP r_unary(Op op, const RP& a) {
    DType t;
    if (is_float_unary(op)) t = float_result(a->dtype);
    else if (op == Op::Finite) t = DType::Bool;
    else if (op == Op::Square && a->dtype == DType::Bool) t = DType::Int8;
    else t = a->dtype;
    RP r = mk(op, t, a->shape, {a});
    for (int64_t i = 0; i < r->n(); ++i) {
        X x = a->at(i);
        X y;
        if (op == Op::Finite) {
            y.v = isf(a->dtype) ? (double)std::isfinite(x.v) : 1.0;
            y.u = x.u;
        } else if (op == Op::Abs && t == DType::Bool) {
            y = x;
        } else {
            X c = convert(x, a->dtype, t);
            y = isf(t) ? f_unary(op, c) : i_unary(op, c, t);
        }
        r->set(i, y);
    }
    return r;
}

RP r_cast(const RP& a, DType to) {
    if (a->dtype == to) return a;
    RP r = mk(Op::Cast, to, a->shape, {a}, dname(to));
    for (int64_t i = 0; i < r->n(); ++i) r->set(i, convert(a->at(i), a->dtype, to));
    return r;
}

RP r_binary(Op op, const RP& a, const RP& b) {
    DType rt = ref_result_type(a, b);
    DType t = rt, in = rt;
    if (is_cmp(op)) t = DType::Bool;
    if (op == Op::Div && !isf(rt)) t = in = DType::Float32;
    if (is_division(op) && rt == DType::Bool) t = in = DType::Int8;  // NumPy: bool // bool is int8
    if (is_math2(op)) t = in = float_result(rt);
    auto s = bshape(a->shape, b->shape);
    if (!s) throw std::logic_error("generator bug: operands do not broadcast");
    RP r = mk(op, t, *s, {a, b});
    auto ma = bmap(a->shape, *s), mb = bmap(b->shape, *s);
    for (int64_t i = 0; i < r->n(); ++i) {
        X x = convert(a->at(ma[i]), a->dtype, in), y = convert(b->at(mb[i]), b->dtype, in);
        X z = isf(in) ? f_binary(op, x, y) : i_binary(op, x, y, t);
        if (op == Op::Add || op == Op::Sub || op == Op::Mul) {
            if (!isf(t)) z.v = (double)wrap_int(t, (int64_t)z.v);
        }
        r->set(i, z);
    }
    return r;
}

RP r_where(const RP& c, const RP& a, const RP& b) {
    DType t = ref_result_type(a, b);
    auto s1 = bshape(c->shape, a->shape);
    if (!s1) throw std::logic_error("generator bug: where operands do not broadcast");
    auto s = bshape(*s1, b->shape);
    if (!s) throw std::logic_error("generator bug: where operands do not broadcast");
    RP r = mk(Op::Where, t, *s, {c, a, b});
    auto mc = bmap(c->shape, *s), ma = bmap(a->shape, *s), mb = bmap(b->shape, *s);
    for (int64_t i = 0; i < r->n(); ++i) {
        X cond = convert(c->at(mc[i]), c->dtype, DType::Bool);
        X pick = cond.v != 0 ? convert(a->at(ma[i]), a->dtype, t) : convert(b->at(mb[i]), b->dtype, t);
        pick.u = pick.u || cond.u;
        r->set(i, pick);
    }
    return r;
}

// Reductions over `axis` (normalised, or -1 for all axes); the result keeps the reduced dims
// (size 1) when keepdims, else they are dropped.
RP r_reduce(Op op, const RP& a, int axis, bool keepdims) {
    const Shape& s = a->shape;
    const int rank = (int)s.size();
    Shape kept = s, out;
    for (int d = 0; d < rank; ++d) {
        bool red = axis < 0 || d == axis;
        if (red) kept[d] = 1;
        if (!red) out.push_back(s[d]);
        else if (keepdims) out.push_back(1);
    }
    DType t = a->dtype;
    if ((op == Op::Sum || op == Op::Prod) && !isf(t)) t = DType::Int32;
    if (op == Op::ArgMax || op == Op::ArgMin) t = DType::Int32;
    std::string attr = std::string(axis < 0 ? "axis=all" : "axis=" + std::to_string(axis)) + (keepdims ? "" : ", keepdims=false");
    RP r = mk(op, t, out, {a}, attr);
    r->reduction = true;
    // groups: output element -> list of input indices in row-major order of the reduced dims
    const int64_t nout = count(kept);
    const int64_t nred = nout ? count(s) / nout : 0;
    auto in_strides = std::vector<int64_t>(rank);
    {
        int64_t acc = 1;
        for (int d = rank - 1; d >= 0; --d) { in_strides[d] = acc; acc *= s[d]; }
    }
    Shape red_shape;
    std::vector<int64_t> red_strides;
    for (int d = 0; d < rank; ++d)
        if (axis < 0 || d == axis) { red_shape.push_back(s[d]); red_strides.push_back(in_strides[d]); }
    std::vector<int64_t> roffs((size_t)nred);
    for (int64_t j = 0; j < nred; ++j) {
        auto c = unravel(j, red_shape);
        int64_t o = 0;
        for (size_t k = 0; k < c.size(); ++k) o += c[k] * red_strides[k];
        roffs[j] = o;
    }
    const bool fl = isf(a->dtype);
    for (int64_t oi = 0; oi < nout; ++oi) {
        auto c = unravel(oi, kept);
        int64_t base = 0;
        for (int d = 0; d < rank; ++d) base += c[d] * in_strides[d];
        X res;
        bool unstable = false;
        for (int64_t j = 0; j < nred; ++j) unstable |= a->u[base + roffs[j]] != 0;
        if (op == Op::Sum) {
            if (fl) {
                double sum = 0, abs = 0, err = 0;
                int qexp = INT32_MAX;  // every term is a multiple of 2^qexp
                for (int64_t j = 0; j < nred; ++j) {
                    X x = a->at(base + roffs[j]);
                    sum += x.v;
                    abs += fe(std::fabs(x.v));
                    err += x.e;
                    if (x.v != 0 && std::isfinite(x.v)) {
                        int e;
                        double m = std::frexp(x.v, &e);  // x = m * 2^e, |m| in [0.5, 1)
                        qexp = std::min(qexp, e - 53 + __builtin_ctzll((uint64_t)std::ldexp(std::fabs(m), 53) | (1ull << 53)));
                    }
                }
                res.v = sum;
                // Exact terms on a common grid whose |sum| stays below 2^24 grid steps: every partial
                // sum is a float32, in any order, so the sum is exact.
                bool exact_sum = err == 0 && (qexp == INT32_MAX || abs <= std::ldexp(1.0, 24 + qexp));
                res.e = err + (exact_sum ? 0 : (4 + std::sqrt((double)nred)) * kU * abs);
            } else {
                int64_t sum = 0;
                for (int64_t j = 0; j < nred; ++j) sum += (int64_t)convert(a->at(base + roffs[j]), a->dtype, DType::Int32).v;
                res.v = (double)wrap_int(DType::Int32, sum);
            }
        } else if (op == Op::Prod) {
            if (fl) {
                // In any order, every partial product lies between the product of the factors'
                // lower bounds below 1 and of their upper bounds above 1: where that range leaves
                // float32's normal numbers (a partial product could overflow or underflow), the
                // result is not compared; nor is a float16 result outside float16's normal range
                // (it may be kept in a float16 temporary). Otherwise an exact zero factor among
                // finite ones makes the product exactly zero in any order.
                double prod = 1, hi = 1, lo = 1, big = 1, small = 1;
                bool exact_zero = false, finite = true, uncertain = false;
                for (int64_t j = 0; j < nred; ++j) {
                    X x = a->at(base + roffs[j]);
                    prod *= x.v;
                    const double m = std::fabs(x.v);
                    finite &= std::isfinite(x.v);
                    exact_zero |= m == 0 && x.e == 0;
                    uncertain |= x.e > 0 && (m <= x.e || !std::isfinite(x.e));
                    hi *= m + x.e;
                    lo *= m;
                    if (m + x.e > 1) big *= m + x.e;
                    if (m - x.e < 1) small *= std::max(m - x.e, 0.0);
                }
                res.v = prod;
                const bool in_range = big <= 0x1p120 && (nred < 2 || small >= 0x1p-120 || (exact_zero && finite));
                if (!in_range) unstable = true;
                if (exact_zero && finite) {
                    res.e = 0;
                } else {
                    // (A NaN or infinite product is exact as float32 gives it, unless a factor's
                    // sign or zero-ness is uncertain.)
                    res.e = std::isfinite(prod) ? (hi - lo) + (4 + (double)nred) * kU * hi : 0;
                    if (std::isnan(res.e)) res.e = INFINITY;
                    if (!std::isfinite(prod) && uncertain) unstable = true;
                    if (t == DType::Float16 && std::isfinite(prod) && (hi > 0x1p15 || lo < 0x1p-13)) unstable = true;
                }
            } else {
                uint32_t p = 1;
                for (int64_t j = 0; j < nred; ++j) p *= (uint32_t)(int32_t)convert(a->at(base + roffs[j]), a->dtype, DType::Int32).v;
                res.v = (double)(int32_t)p;
            }
        } else if (op == Op::Max || op == Op::Min) {
            double best = 0, err = 0;
            bool nan = false;
            for (int64_t j = 0; j < nred; ++j) {
                X x = a->at(base + roffs[j]);
                if (std::isnan(x.v)) nan = true;
                if (j == 0 || (op == Op::Max ? x.v > best : x.v < best)) best = x.v;
                err = std::max(err, x.e);
            }
            res.v = nan ? NAN : best;
            res.e = err;
        } else {  // ArgMax / ArgMin: first extreme; the first NaN counts as the extreme
            const bool mx = op == Op::ArgMax;
            int64_t pos = 0;
            double best = a->v[base + roffs[0]];
            for (int64_t j = 1; j < nred && !std::isnan(best); ++j) {
                double x = a->v[base + roffs[j]];
                if (std::isnan(x) || (mx ? x > best : x < best)) { best = x; pos = j; }
            }
            res.v = (double)pos;
            if (fl && !std::isnan(best)) {
                double eb = a->e[base + roffs[pos]];
                for (int64_t j = 0; j < nred; ++j) {
                    if (j == pos) continue;
                    double x = a->v[base + roffs[j]], ex = a->e[base + roffs[j]];
                    if (eb + ex > 0 && std::fabs(x - best) <= kUnstable * (eb + ex)) unstable = true;
                }
            }
        }
        // A 16-bit float reduction may be materialised in a temporary of its dtype.
        if (is16(t) && std::isfinite(res.v))
            res.e += res.e == 0 ? std::fabs(round_float(t, res.v) - res.v) : store_unit(t) * std::fabs(res.v);
        res.u = unstable;
        r->set(oi, res);
    }
    return r;
}

// A computed value (not a tensor) that kiln writes to a temporary of its dtype first.
void add_temp_rounding(const RP& r) {
    if (!is16(r->dtype)) return;
    for (int64_t i = 0; i < r->n(); ++i) {
        double v = r->v[i];
        if (std::isfinite(v)) r->e[i] += r->e[i] == 0 ? std::fabs(round_float(r->dtype, v) - v) : store_unit(r->dtype) * std::fabs(v);
    }
}

RP r_reshape(const RP& a, const Shape& s, const std::string& attr) {
    RP r = mk(Op::Reshape, a->dtype, s, {a}, attr);
    r->v = a->v;
    r->e = a->e;
    r->u = a->u;
    if (a->op != Op::Leaf) add_temp_rounding(r);
    return r;
}

// take(src, idx, axis): negative indices count from the end (once), out-of-range ones clip.
RP r_take(const RP& src, const RP& idx, std::optional<int> axis_opt) {
    Shape ss = axis_opt ? src->shape : Shape{src->n()};
    int axis = axis_opt ? *axis_opt : 0;
    Shape out(ss.begin(), ss.begin() + axis);
    out.insert(out.end(), idx->shape.begin(), idx->shape.end());
    out.insert(out.end(), ss.begin() + axis + 1, ss.end());
    RP r = mk(Op::Take, src->dtype, out, {src, idx}, axis_opt ? "axis=" + std::to_string(axis) : "flat");
    const int64_t L = ss[axis];
    int64_t inner = 1;
    for (size_t d = axis + 1; d < ss.size(); ++d) inner *= ss[d];
    const int64_t ni = idx->n();
    for (int64_t o = 0; o < r->n(); ++o) {
        int64_t in_i = o % inner, rest = o / inner;
        int64_t k = rest % ni, pre = rest / ni;
        X ix = convert(idx->at(k), idx->dtype, DType::Int32);
        int64_t i = (int64_t)ix.v;
        if (i < 0) i += L;
        i = std::clamp<int64_t>(i, 0, L - 1);
        X x = src->at((pre * L + i) * inner + in_i);
        x.u = x.u || ix.u;
        r->set(o, x);
    }
    if (src->op != Op::Leaf) add_temp_rounding(r);
    return r;
}

RP r_onehot(const RP& idx, int64_t classes, int axis, DType t) {
    Shape out = idx->shape;
    out.insert(out.begin() + axis, classes);
    RP r = mk(Op::Onehot, t, out, {idx}, "classes=" + std::to_string(classes) + ", axis=" + std::to_string(axis));
    for (int64_t o = 0; o < r->n(); ++o) {
        auto c = unravel(o, out);
        int64_t cls = c[axis];
        c.erase(c.begin() + axis);
        int64_t k = 0;
        for (size_t d = 0; d < c.size(); ++d) k = k * idx->shape[d] + c[d];
        X ix = convert(idx->at(k), idx->dtype, DType::Int32);
        X y;
        y.v = ix.v == (double)cls ? 1 : 0;
        y.u = ix.u;
        r->set(o, y);
    }
    return r;
}

} // namespace
