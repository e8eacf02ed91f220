// Differential test: seeded random expression graphs, evaluated by kiln and by a float64
// reference interpreter written here, independently of kiln's compiler.
//
// The generator builds every graph twice, in lock step: once with kiln's lazy API (Expr) and
// once as a reference node (RNode: op, dtype, shape, children, attributes) that is evaluated
// eagerly in double precision. The reference re-derives each node's dtype from the documented
// promotion rules (NumPy's, capped at 32 bits, weak Python-style literals) and the test
// requires it to equal Expr::dtype(). Values follow kiln's documented semantics:
//   - floats are computed in float32 (16-bit floats are storage formats, rounded only when
//     stored); the reference computes in double and rounds once, to the destination's dtype;
//   - int8/uint8/bool results wrap (or become 0/1) after every op; int32 wraps mod 2^32;
//   - float -> int conversion truncates, saturates at the int32 range, NaN -> 0, then wraps;
//   - tanh2 = tanh(x ln2), safelog = log(max(x, exp(-50))), sig = 1/(1+exp(-x));
//   - take wraps negative indices once and clips out-of-range ones;
//   - rand = philox_uniform(seed32, counter, linear index over the rand node's own shape).
//
// Tolerances. Alongside each value the reference carries a first-order bound of the error a
// float32 evaluation may make (each float32 operation contributes a few units of roundoff of its
// result, input errors propagate through the derivative, a reduction over n terms adds
// ~sqrt(n) units of sum|x|, a 16-bit value that may be materialised in a temporary adds half an
// ulp of its dtype; a correctly rounded operation on exact inputs whose exact result is a
// float32 adds nothing, so integer-valued and small dyadic arithmetic stays exact). An element
// passes when |got - ref| <= atol + rtol*|ref| + 4*bound, with
// rtol by destination dtype (float32 1e-5, 1e-4 once a reduction is involved; float16 2e-3 /
// 4e-3; bfloat16 1.6e-2 / 2.4e-2). The bound grows with cancellation (a - b of nearly equal
// values) so such results are not held to a relative tolerance they cannot meet.
//
// Discontinuous operations (comparisons, rint, sgn, float -> int/bool casts, argmax/argmin,
// where) are exact on exact inputs, but on computed floats the reference and kiln may land on
// different sides of the discontinuity when the inputs differ by less than their error bound.
// Those elements are marked unstable and skipped (the flag propagates to everything computed
// from them); the run prints how many were skipped. Integer and bool results are otherwise
// compared exactly.
//
// NaN and inf are avoided (values are generated in sane ranges per dtype, and the generator
// only applies sqrt/log/reciprocal/power/exp to operands whose reference values are in the
// domain, transforming the operand first when they are not), except in the "special values"
// graphs which put NaN/inf/-0 into float leaves on purpose and use only ops with well-defined
// results on them; there NaN must appear exactly where the reference has NaN.
//
// Graph families: random expressions (every elementwise op, reductions over an axis or all
// axes with and without keepdims, broadcasting against lower-rank operands and literals, casts,
// where/clip, onehot/take, reshapes, rand), the seeds' nested reductions (variance, batch norm,
// softmax, reductions over different axes that need several stages), in-place and overlapping
// assignments (A = A*2 + 1, A = A.T(), A = A[::-1], A[1:] = f(A[:-1])), special values, and
// focused take/onehot/rand graphs. Inputs and destinations are often strided, reversed,
// transposed or index-dropped views of larger tensors; destinations may have another dtype (cast
// on store) or a larger shape (broadcast on store), and elements outside a destination view
// must keep their values.
//
// Every graph's kernels are also emitted as CUDA C and compiled by NVRTC for sm_80 and sm_90
// (once per distinct kernel key; no GPU is needed), on a worker thread.
//
// The graphs run in a child process: a crash inside kiln fails that graph (printed with its
// seed) and a fresh child carries on with the next one.
//
// Environment:
//   KILN_FUZZ_COUNT=<n>        number of graphs (default 2000)
//   KILN_FUZZ_SEED=<s>         replay the single graph printed as "seed <s>"
//   KILN_FUZZ_NVRTC_MAX=<n>    cap on distinct kernels compiled by NVRTC (default: no cap, every kernel; 0: no CUDA C at all)
//   KILN_FUZZ_VERBOSE=1        print every graph
//   KILN_FUZZ_FORK=0           run the graphs in this process (no crash isolation; the default on cuda)
//   KILN_TEST_DEVICE=<device>  where kiln runs the graphs: "cpu" (default) or "cuda[:N]"; without a
//                              usable device every case prints why it is skipped and passes
#include "tests/support/catch.hpp"

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
    Add, Sub, Mul, Div, FloorDiv, Mod, Fmod, Pow, Maximum, Minimum, Eq, Ne, Gt, Ge, Lt, Le,
    Where,
    Sum, Max, Min, ArgMax, ArgMin,
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
    case Op::ArgMax: return "argmax"; case Op::ArgMin: return "argmin"; case Op::Reshape: return "reshape";
    case Op::Take: return "take"; case Op::Onehot: return "onehot";
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

// ---- dtype rules, re-derived from the documentation (ir/dtype.hpp, ir/expr.hpp)

int kind_of(DType t) { return t == DType::Bool ? 0 : isf(t) ? 2 : 1; }

// NumPy's promotion table on kiln's dtypes; where NumPy would need a wider type than kiln has
// (int8 with uint8 -> int16; int32 with a 16-bit float -> float64; float16 with bfloat16) the
// smallest kiln type holding both: int32, float32, float32.
DType ref_promote(DType a, DType b) {
    if (a == b) return a;
    if (a == DType::Bool) return b;
    if (b == DType::Bool) return a;
    const bool fa = isf(a), fb = isf(b);
    if (fa && fb) return DType::Float32;
    if (fa || fb) {
        DType f = fa ? a : b, i = fa ? b : a;
        if (f == DType::Float32) return DType::Float32;
        return i == DType::Int32 ? DType::Float32 : f;  // int8/uint8 fit a 16-bit float
    }
    return DType::Int32;
}

// Weak literals (Python numbers) take the other operand's dtype unless they are of a higher
// kind (bool < integer < float), in which case they bring their default dtype (int32/float32).
DType ref_result_type(const RP& a, const RP& b) {
    if (a->weak && b->weak) return kind_of(a->dtype) >= kind_of(b->dtype) ? a->dtype : b->dtype;
    if (a->weak) return kind_of(a->dtype) > kind_of(b->dtype) ? a->dtype : b->dtype;
    if (b->weak) return kind_of(b->dtype) > kind_of(a->dtype) ? b->dtype : a->dtype;
    return ref_promote(a->dtype, b->dtype);
}

// Transcendental functions: floats keep their dtype; int32 gives float32; int8/uint8/bool give
// float16 (NumPy's choice for small integers).
DType float_result(DType t) {
    if (isf(t)) return t;
    return t == DType::Int32 ? DType::Float32 : DType::Float16;
}

bool is_float_unary(Op o) {
    switch (o) {
    case Op::Sqrt: case Op::Exp: case Op::Exp2: case Op::Log: case Op::Log2: case Op::SafeLog: case Op::Sig:
    case Op::Sig2: case Op::Tanh: case Op::Tanh2: case Op::Recip: case Op::Rint: return true;
    default: return false;
    }
}

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
    if (op == Op::Sum && !isf(t)) t = DType::Int32;
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

// ======================================================================================
// Views: strided, reversed, transposed, index-dropped windows of a contiguous base tensor
// ======================================================================================

struct ViewSpec {
    Shape base;
    std::vector<kiln::Slice> slices;  // applied to the base (empty: the whole base)
    std::vector<int> perm;            // then transposed (empty: not)
    std::vector<int64_t> map;         // view row-major index -> base row-major index
    std::string desc;
};

std::string slice_s(const kiln::Slice& s) {
    auto v = [](int64_t x) { return x == kiln::Slice::kNone ? std::string() : std::to_string(x); };
    if (s.is_index) return std::to_string(s.start);
    return v(s.start) + ":" + v(s.stop) + (s.step != 1 ? ":" + std::to_string(s.step) : "");
}

// A view of shape `S`; `strided` allows steps/negative steps/transposes/dropped indices.
ViewSpec make_view(Rng& rng, const Shape& S, bool strided, int64_t base_budget = 20000) {
    ViewSpec vs;
    const int r = (int)S.size();
    if (!strided) {
        vs.base = S;
        vs.map.resize(count(S));
        for (size_t i = 0; i < vs.map.size(); ++i) vs.map[i] = (int64_t)i;
        vs.desc = "contiguous";
        return vs;
    }
    // transpose: the pre-transpose shape P has P[perm[i]] = S[i]
    std::vector<int> perm(r);
    for (int i = 0; i < r; ++i) perm[i] = i;
    bool transposed = r >= 2 && rng.chance(0.4);
    if (transposed) {
        if (rng.chance(0.5)) std::reverse(perm.begin(), perm.end());  // .T()
        else
            for (int i = r - 1; i > 0; --i) std::swap(perm[i], perm[rng.range(0, i)]);
    }
    Shape P(r);
    for (int i = 0; i < r; ++i) P[perm[i]] = S[i];
    struct Dim { int64_t len, start, step; bool index; };
    std::vector<Dim> dims;
    int64_t budget = base_budget;
    int64_t total = 1;
    for (int j = 0; j < r; ++j) total *= std::max<int64_t>(P[j], 1);
    for (int j = 0; j < r; ++j) {
        int64_t n = P[j];
        int64_t step = 1;
        if (n > 0 && rng.chance(0.5)) step = rng.pick<int64_t>({2, 3, -1, -1, -2});
        if (total * std::abs(step) * 2 > budget) step = step < 0 ? -1 : 1;
        total *= std::abs(step);
        int64_t lo = rng.range(0, 2), hi = rng.range(0, 2);
        int64_t span = n > 0 ? (n - 1) * std::abs(step) + 1 : 0;
        int64_t len = lo + span + hi;
        int64_t start = step > 0 ? lo : len - 1 - hi;
        dims.push_back({len, start, step, false});
    }
    // an extra base dim selected by a single index (dropped from the view)
    int extra_at = -1;
    int64_t extra_len = 0, extra_idx = 0;
    if (rng.chance(0.2) && r < 4) {
        extra_at = (int)rng.range(0, r);
        extra_len = rng.range(2, 3);
        extra_idx = rng.range(-extra_len, extra_len - 1);
    }
    std::vector<int> base_dim_of(r);
    for (int j = 0, b = 0; j <= r; ++j) {
        if (j == extra_at) {
            vs.base.push_back(extra_len);
            vs.slices.push_back(kiln::Slice::at(extra_idx));
            ++b;
        }
        if (j == r) break;
        const Dim& d = dims[j];
        base_dim_of[j] = b++;
        vs.base.push_back(d.len);
        int64_t n = P[j];
        kiln::Slice s;
        if (d.step > 0) {
            int64_t stop = d.start + (n - 1) * d.step + 1;
            s = kiln::Slice::range(d.start, stop, d.step);
            if (d.start == 0 && rng.chance(0.5)) s.start = kiln::Slice::kNone;
            else if (rng.chance(0.3)) s.start = d.start - d.len;  // negative start
            if (stop == d.len && rng.chance(0.5)) s.stop = kiln::Slice::kNone;
        } else {
            int64_t last = d.start + (n - 1) * d.step;
            int64_t stop = last - 1;
            s = kiln::Slice::range(d.start, stop < 0 ? kiln::Slice::kNone : stop, d.step);
            if (d.start == d.len - 1 && rng.chance(0.5)) s.start = kiln::Slice::kNone;
        }
        vs.slices.push_back(s);
    }
    bool trivial = extra_at < 0;
    for (int j = 0; j < r; ++j)
        if (dims[j].step != 1 || dims[j].len != P[j]) trivial = false;
    if (trivial) vs.slices.clear();
    if (transposed) vs.perm = perm;
    // the map, computed from the definition (not from kiln's strides)
    Shape bst(vs.base.size());
    {
        int64_t acc = 1;
        for (size_t d = vs.base.size(); d-- > 0;) { bst[d] = acc; acc *= vs.base[d]; }
    }
    int64_t fixed = 0;
    if (extra_at >= 0) fixed = (extra_idx < 0 ? extra_idx + extra_len : extra_idx) * bst[extra_at];
    int64_t n = count(S);
    vs.map.resize(n);
    for (int64_t i = 0; i < n; ++i) {
        auto c = unravel(i, S);
        int64_t off = fixed;
        for (int d = 0; d < r; ++d) {
            int j = perm[d];  // view dim d is pre dim perm[d]
            off += (dims[j].start + c[d] * dims[j].step) * bst[base_dim_of[j]];
        }
        vs.map[i] = off;
    }
    vs.desc = "base " + shape_s(vs.base);
    if (!vs.slices.empty()) {
        vs.desc += "[";
        for (size_t k = 0; k < vs.slices.size(); ++k) vs.desc += (k ? "," : "") + slice_s(vs.slices[k]);
        vs.desc += "]";
    }
    if (transposed) {
        vs.desc += ".transpose(";
        for (int i = 0; i < r; ++i) vs.desc += (i ? "," : "") + std::to_string(perm[i]);
        vs.desc += ")";
    }
    return vs;
}

Tensor apply_view(const Tensor& base, const ViewSpec& vs) {
    Tensor t = base;
    if (!vs.slices.empty()) t = t.slice(vs.slices);
    if (!vs.perm.empty()) {
        bool reversed = true;  // all dims reversed: the spelling A.T()
        for (size_t i = 0; i < vs.perm.size(); ++i) reversed &= vs.perm[i] == (int)(vs.perm.size() - 1 - i);
        t = reversed ? t.T() : t.transpose(vs.perm);
    }
    return t;
}

// ======================================================================================
// NVRTC: every distinct kernel's CUDA C compiled for sm_80 and sm_90, on a worker thread so
// that it overlaps the CPU JIT of the following graphs.
// ======================================================================================

struct NvrtcJob {
    std::string code, name;
    uint64_t seed;
    std::string expr;
};

class NvrtcWorker {
public:
    std::vector<std::string> failures;
    int64_t* compiled;  // in the shared counters: survives a crash of this process
    double ms = 0;      // NVRTC time, both architectures

    explicit NvrtcWorker(int64_t* counter) : compiled(counter), th_([this] { loop(); }) {}
    ~NvrtcWorker() { finish(); }
    // Waits while a kernel is still queued: if this process dies (a kiln crash in a later
    // graph), at most the kernel being compiled and one queued go uncompiled.
    void submit(NvrtcJob j) {
        std::unique_lock<std::mutex> l(mu_);
        space_.wait(l, [&] { return q_.empty(); });
        q_.push_back(std::move(j));
        cv_.notify_one();
    }
    void finish() {
        {
            std::lock_guard<std::mutex> l(mu_);
            if (done_) return;
            done_ = true;
            cv_.notify_one();
        }
        th_.join();
    }

private:
    std::mutex mu_;
    std::condition_variable cv_, space_;
    std::deque<NvrtcJob> q_;
    bool done_ = false;
    std::thread th_;

    void loop() {
        for (;;) {
            NvrtcJob j;
            {
                std::unique_lock<std::mutex> l(mu_);
                cv_.wait(l, [&] { return done_ || !q_.empty(); });
                if (q_.empty()) return;
                j = std::move(q_.front());
                q_.pop_front();
                space_.notify_one();
            }
            run(j);
        }
    }
    void run(const NvrtcJob& j) {
#ifdef KILN_DIFF_NVRTC
        for (int sm : {80, 90}) {
            std::string log;
            bool ok = false;
            try {
                auto res = kiln::cuda::nvrtc_compile(j.code, j.name, sm, true);
                ok = res.ok && !res.binary.empty();
                log = res.log;
                ms += res.milliseconds;
            } catch (const std::exception& e) {
                log = std::string("exception: ") + e.what();
            }
            if (!ok) {
                std::lock_guard<std::mutex> l(mu_);
                failures.push_back("NVRTC failed for sm_" + std::to_string(sm) + " on kernel " + j.name + " (seed " +
                                   std::to_string(j.seed) + ")\nexpression:\n" + j.expr + "log:\n" + log +
                                   "\nsource:\n" + j.code);
            }
        }
        __atomic_fetch_add(compiled, 1, __ATOMIC_RELAXED);
#else
        (void)j;
#endif
    }
};

// ======================================================================================
// The generator: kiln Expr and reference node built in lock step
// ======================================================================================

struct Built {
    Expr e;
    RP r;
};

enum class Kind { Random, Template, InPlace, Overlap, Special, Focus };

const char* kind_name(Kind k) {
    switch (k) {
    case Kind::Random: return "random";
    case Kind::Template: return "nested-reduction template";
    case Kind::InPlace: return "in-place";
    case Kind::Overlap: return "overlapping views";
    case Kind::Special: return "special values";
    case Kind::Focus: return "take/onehot/rand";
    }
    return "?";
}

const std::vector<int64_t> kSizes = {1, 1, 2, 3, 3, 4, 5, 7, 7, 8, 16, 17, 17, 33, 64, 129};

class Gen {
public:
    kiln::Context& ctx;
    Rng& rng;
    bool special = false;
    bool rand_used = false;
    uint32_t seed32 = 0;
    uint64_t ctx_seed = 0;
    DType main = DType::Float32;
    int ops = 0, max_ops = 12;
    std::string mismatch;  // first dtype/shape disagreement between kiln and the reference
    std::vector<std::string> leaves;
    std::vector<Tensor> keep;
    std::vector<Built> pool;  // leaves the generator must prefer (views of the destination)
    bool pool_used = false;
    int64_t composite[4] = {0, 0, 0, 0};  // clip, mean, var, std calls

    Gen(kiln::Context& c, Rng& r) : ctx(c), rng(r) {
        ctx_seed = rng.next();
        seed32 = (uint32_t)(ctx_seed ^ (ctx_seed >> 32));
    }

    // ---- checks
    Built chk(Expr e, RP r, const char* what) {
        if (mismatch.empty()) {
            if (e.dtype() != r->dtype)
                mismatch = std::string(what) + ": kiln dtype " + dname(e.dtype()) + ", reference dtype " + dname(r->dtype) +
                           " (shape " + shape_s(r->shape) + ")";
            else if (e.shape() != r->shape)
                mismatch = std::string(what) + ": kiln shape " + shape_s(e.shape()) + ", reference shape " + shape_s(r->shape);
        }
        return Built{std::move(e), std::move(r)};
    }

    static double limit(DType t) {
        switch (t) {
        case DType::Float16: return 3e4;
        case DType::BFloat16: return 1e5;
        case DType::Float32: return 1e6;
        case DType::Int32: return 268435456.0;
        default: return INFINITY;
        }
    }
    static double maxabs(const RP& r) {
        double m = 0;
        for (double x : r->v) m = std::max(m, std::fabs(x));
        return m;
    }
    static double minv(const RP& r) {
        double m = INFINITY;
        for (double x : r->v) m = std::min(m, x);
        return m;
    }
    static double minabs(const RP& r) {
        double m = INFINITY;
        for (double x : r->v) m = std::min(m, std::fabs(x));
        return m;
    }
    // Finite, within the dtype's comfortable range, a usable error bound, mostly stable.
    bool sane(const RP& r) const {
        if (special) return true;
        const double lim = limit(r->dtype);
        const double rel = is16(r->dtype) ? 5e-2 : 1e-2;
        int64_t unstable = 0;
        for (int64_t i = 0; i < r->n(); ++i) {
            double v = r->v[i];
            if (!std::isfinite(v) || std::fabs(v) > lim) return false;
            if (r->e[i] > rel * (std::fabs(v) + 1)) return false;
            unstable += r->u[i];
        }
        return unstable * 2 <= r->n();
    }

    // ---- leaves
    double leaf_value(DType t, int mode) {
        // mode 0: any sign; 1: positive
        switch (t) {
        case DType::Bool: return mode == 1 ? (rng.chance(0.85) ? 1 : 0) : (rng.chance(0.5) ? 1 : 0);
        case DType::Int8:
            if (mode == 1) return (double)rng.range(1, 12);
            return rng.chance(0.3) ? (double)rng.range(-128, 127) : (double)rng.range(-12, 12);
        case DType::UInt8:
            if (mode == 1) return (double)rng.range(1, 12);
            return rng.chance(0.3) ? (double)rng.range(0, 255) : (double)rng.range(0, 12);
        case DType::Int32:
            if (mode == 1) return (double)rng.range(1, 100);
            return rng.chance(0.2) ? (double)rng.range(-3000, 3000) : (double)rng.range(-60, 60);
        default: {
            double x;
            int k = (int)rng.range(0, 9);
            if (mode == 1) x = k < 3 ? 0.25 * (double)rng.range(1, 16) : rng.uni(0.1, 4.0);
            else if (k < 2) x = 0.25 * (double)rng.range(-16, 16);  // exact halves/quarters: ties for rint/compare
            else if (k < 3) x = (double)rng.range(-5, 5);
            else x = rng.uni(-3.0, 3.0);
            return round_float(t, x);
        }
        }
    }

    double special_value(DType t) {
        double r = rng.uni();
        if (r < 0.12) return NAN;
        if (r < 0.22) return INFINITY;
        if (r < 0.32) return -INFINITY;
        if (r < 0.38) return -0.0;
        return leaf_value(t, 0);
    }

    Tensor upload(const std::vector<double>& vals, const Shape& s, DType t) {
        if (isf(t)) {
            std::vector<float> f(vals.begin(), vals.end());
            return ctx.array(f.data(), f.size(), DType::Float32, s, t);
        }
        std::vector<int32_t> i(vals.size());
        for (size_t k = 0; k < vals.size(); ++k) i[k] = (int32_t)vals[k];
        return ctx.array(i.data(), i.size(), DType::Int32, s, t);
    }

    Built leaf(const Shape& s, DType t, int mode = -1, bool allow_view = true) {
        if (mode < 0) mode = rng.chance(0.35) ? 1 : 0;
        ViewSpec vs = make_view(rng, s, allow_view && rng.chance(0.4));
        std::vector<double> base((size_t)count(vs.base));
        bool specials = special && isf(t) && rng.chance(0.8);
        for (auto& x : base) x = specials ? special_value(t) : leaf_value(t, mode);
        std::vector<double> vals(vs.map.size());
        for (size_t i = 0; i < vals.size(); ++i) vals[i] = base[vs.map[i]];
        // never all zeros
        bool nonzero = false;
        for (double x : vals) nonzero |= x != 0;
        if (!nonzero && !vals.empty()) {
            base[vs.map[rng.next() % vals.size()]] = 1;
            for (size_t i = 0; i < vals.size(); ++i) vals[i] = base[vs.map[i]];
        }
        Tensor b = upload(base, vs.base, t);
        Tensor v = apply_view(b, vs);
        keep.push_back(b);
        std::string desc = "%" + std::to_string(g_next_id + 1) + " " + dname(t) + " " + shape_s(s) + " " + vs.desc;
        leaves.push_back(desc);
        return chk(v.expr(), r_leaf(t, s, vals, vs.desc), "tensor");
    }

    DType leaf_dtype() { return rng.chance(0.7) ? main : rng.pick(kAllDTypes); }

    Built terminal(const Shape& T) {
        for (auto& p : pool)
            if (p.r->shape == T && rng.chance(0.75)) {
                pool_used = true;
                return p;
            }
        if (!special && !rand_used && rng.chance(0.05)) return make_rand(T);
        if (!special && !T.empty() && rng.chance(0.03)) {
            int axis = (int)rng.range(0, (int)T.size() - 1);
            int arg = rng.chance(0.5) ? axis : axis - (int)T.size();
            return chk(kiln::iota(T, arg), r_iota(T, axis), "iota");
        }
        return leaf(T, leaf_dtype());
    }

    Built make_rand(const Shape& T) {
        // A rank-0 rand() draws per point of the kernel it lands in (the fixed test below pins
        // that); the reference draws per element of a node's own shape, so it gets rank >= 1.
        if (T.empty()) return leaf(T, leaf_dtype());
        rand_used = true;
        Shape s = T;
        for (auto& d : s)
            if (rng.chance(0.3)) d = 1;  // a smaller draw broadcast over the result
        while (s.size() > 1 && rng.chance(0.2)) s.erase(s.begin());
        Built r = chk(kiln::rand(s), r_rand(s, seed32, 0), "rand");
        if (s == T) return r;
        return apply_binary(rng.pick({Op::Add, Op::Mul, Op::Lt}), r, leaf(T, leaf_dtype()));
    }

    // ---- scalars
    Built weak_float(double v) { return chk(Expr(v), r_scalar(v, DType::Float32, true), "weak float"); }
    Built weak_int(int v) { return chk(Expr(v), r_scalar(v, DType::Int32, true), "weak int"); }
    Built typed_scalar(double v, DType t) { return chk(kiln::scalar(v, t), r_scalar(v, t, false), "typed scalar"); }

    int const_depth = 0;

    // A constant subexpression (literals combined by ops): the compiler folds these.
    Built compound_constant(const RP& other) {
        ++const_depth;
        Built a = scalar_for(other);
        Built y;
        double r = rng.uni();
        if (r < 0.35)
            y = apply_binary(rng.pick({Op::Add, Op::Mul, Op::Sub, Op::Maximum, Op::Minimum, Op::Div, Op::FloorDiv, Op::Mod}),
                             a, scalar_for(other));
        else if (r < 0.6)
            y = apply_unary(rng.pick({Op::Neg, Op::Abs, Op::Exp, Op::Sqrt, Op::Square, Op::Recip, Op::Tanh, Op::Rint}), a);
        else if (r < 0.8)
            y = cast(a, rng.pick(kAllDTypes));
        else
            y = clip(a, weak_float(-1.25), weak_float(1.25));
        --const_depth;
        return y;
    }

    // A literal that combines with `other` without leaving its dtype's range: kiln converts a
    // weak literal to the tensor's dtype, so an out-of-range one (int8 tensor < 200, uint8 + -3)
    // wraps, where NumPy 2 compares exactly or raises. That choice is not what is tested here.
    Built scalar_for(const RP& other) {
        if (const_depth < 2 && rng.chance(0.12)) return compound_constant(other);
        DType ot = other->dtype;
        double r = rng.uni();
        if (r < 0.4) {
            double v = rng.pick({0.5, 2.0, -1.5, 3.0, 0.25, -0.75, 1.25, 0.1, -2.0});
            return weak_float(v);
        }
        if (r < 0.7) {
            int lo = ot == DType::UInt8 ? 0 : -20;
            return weak_int((int)rng.range(lo, 20));
        }
        DType t = rng.pick(kAllDTypes);
        double v;
        if (isf(t)) v = 0.25 * (double)rng.range(-12, 12);
        else if (t == DType::Bool) v = (double)rng.range(0, 1);
        else if (t == DType::UInt8) v = (double)rng.range(0, 20);
        else v = (double)rng.range(-20, 20);
        return typed_scalar(v, t);
    }

    // ---- direct application (no adaptation)
    Built un(Op op, const Built& x) {
        Expr e;
        switch (op) {
        case Op::Neg: e = kiln::negative(x.e); break;
        case Op::Abs: e = kiln::absolute(x.e); break;
        case Op::Sqrt: e = kiln::sqrt(x.e); break;
        case Op::Square: e = kiln::square(x.e); break;
        case Op::Exp: e = kiln::exp(x.e); break;
        case Op::Exp2: e = kiln::exp2(x.e); break;
        case Op::Log: e = kiln::log(x.e); break;
        case Op::Log2: e = kiln::log2(x.e); break;
        case Op::SafeLog: e = kiln::safelog(x.e); break;
        case Op::Sig: e = kiln::sig(x.e); break;
        case Op::Sig2: e = kiln::sig2(x.e); break;
        case Op::Tanh: e = kiln::tanh(x.e); break;
        case Op::Tanh2: e = kiln::tanh2(x.e); break;
        case Op::Recip: e = kiln::reciprocal(x.e); break;
        case Op::Sgn: e = kiln::sgn(x.e); break;
        case Op::Rint: e = kiln::rint(x.e); break;
        case Op::Finite: e = kiln::finite(x.e); break;
        default: throw std::logic_error("not a unary op");
        }
        return chk(e, r_unary(op, x.r), op_name(op));
    }
    Built cast(const Built& x, DType t) { return chk(kiln::cast(x.e, t), r_cast(x.r, t), "cast"); }
    Built bin(Op op, const Built& a, const Built& b) {
        Expr e;
        switch (op) {
        case Op::Add: e = rng.chance(0.5) ? a.e + b.e : kiln::add(a.e, b.e); break;
        case Op::Sub: e = rng.chance(0.5) ? a.e - b.e : kiln::subtract(a.e, b.e); break;
        case Op::Mul: e = rng.chance(0.5) ? a.e * b.e : kiln::multiply(a.e, b.e); break;
        case Op::Div: e = rng.chance(0.5) ? a.e / b.e : kiln::divide(a.e, b.e); break;
        case Op::FloorDiv: e = kiln::floor_divide(a.e, b.e); break;
        case Op::Mod: e = rng.chance(0.5) ? a.e % b.e : kiln::remainder(a.e, b.e); break;
        case Op::Fmod: e = kiln::fmod(a.e, b.e); break;
        case Op::Pow: e = kiln::power(a.e, b.e); break;
        case Op::Maximum: e = kiln::maximum(a.e, b.e); break;
        case Op::Minimum: e = kiln::minimum(a.e, b.e); break;
        case Op::Eq: e = rng.chance(0.5) ? a.e == b.e : kiln::equal(a.e, b.e); break;
        case Op::Ne: e = rng.chance(0.5) ? a.e != b.e : kiln::not_equal(a.e, b.e); break;
        case Op::Gt: e = rng.chance(0.5) ? a.e > b.e : kiln::greater(a.e, b.e); break;
        case Op::Ge: e = rng.chance(0.5) ? a.e >= b.e : kiln::greater_equal(a.e, b.e); break;
        case Op::Lt: e = rng.chance(0.5) ? a.e < b.e : kiln::less(a.e, b.e); break;
        case Op::Le: e = rng.chance(0.5) ? a.e <= b.e : kiln::less_equal(a.e, b.e); break;
        default: throw std::logic_error("not a binary op");
        }
        return chk(e, r_binary(op, a.r, b.r), op_name(op));
    }
    Built where(const Built& c, const Built& a, const Built& b) {
        return chk(kiln::where(c.e, a.e, b.e), r_where(c.r, a.r, b.r), "where");
    }
    Built clip(const Built& a, const Built& lo, const Built& hi) {
        RP m = r_binary(Op::Maximum, a.r, lo.r);
        ++composite[0];
        return chk(kiln::clip(a.e, lo.e, hi.e), r_binary(Op::Minimum, m, hi.r), "clip");
    }
    // `axis` normalised (or -1: all axes); the call passes it as given in `arg`.
    Built red(Op op, const Built& x, int axis, int arg, bool keepdims) {
        Expr e;
        RP r;
        const char* nm = "";
        switch (op) {
        case Op::Sum: e = kiln::sum(x.e, arg, keepdims); r = r_reduce(Op::Sum, x.r, axis, keepdims); nm = "sum"; break;
        case Op::Max: e = kiln::max(x.e, arg, keepdims); r = r_reduce(Op::Max, x.r, axis, keepdims); nm = "max"; break;
        case Op::Min: e = kiln::min(x.e, arg, keepdims); r = r_reduce(Op::Min, x.r, axis, keepdims); nm = "min"; break;
        case Op::ArgMax: e = kiln::argmax(x.e, arg, keepdims); r = r_reduce(Op::ArgMax, x.r, axis, keepdims); nm = "argmax"; break;
        case Op::ArgMin: e = kiln::argmin(x.e, arg, keepdims); r = r_reduce(Op::ArgMin, x.r, axis, keepdims); nm = "argmin"; break;
        default: throw std::logic_error("not a reduction");
        }
        return chk(e, r, nm);
    }
    Built mean(const Built& x, int axis, int arg, bool keepdims) {
        RP xf = isf(x.r->dtype) ? x.r : r_cast(x.r, DType::Float32);
        int64_t n = axis < 0 ? x.r->n() : x.r->shape[axis];
        RP s = r_reduce(Op::Sum, xf, axis, keepdims);
        RP m = r_binary(Op::Mul, s, r_scalar(1.0 / (double)n, DType::Float32, true));
        ++composite[1];
        return chk(kiln::mean(x.e, arg, keepdims), m, "mean");
    }
    RP ref_var(const RP& a, int axis, bool keepdims) {
        RP xf = isf(a->dtype) ? a : r_cast(a, DType::Float32);
        int64_t n = axis < 0 ? a->n() : a->shape[axis];
        RP m = r_binary(Op::Mul, r_reduce(Op::Sum, xf, axis, true), r_scalar(1.0 / (double)n, DType::Float32, true));
        RP sq = r_unary(Op::Square, r_binary(Op::Sub, xf, m));
        return r_binary(Op::Mul, r_reduce(Op::Sum, sq, axis, keepdims), r_scalar(1.0 / (double)n, DType::Float32, true));
    }
    Built var(const Built& x, int axis, int arg, bool keepdims) {
        ++composite[2];
        return chk(kiln::var(x.e, arg, keepdims), ref_var(x.r, axis, keepdims), "var");
    }
    Built stdev(const Built& x, int axis, int arg, bool keepdims) {
        ++composite[3];
        return chk(kiln::std(x.e, arg, keepdims), r_unary(Op::Sqrt, ref_var(x.r, axis, keepdims)), "std");
    }

    // ---- adaptation: make an operand fit an op's domain, keeping its shape
    Built bounded(const Built& x, double B) {
        if (maxabs(x.r) <= B) return x;
        DType t = x.r->dtype;
        Built y;
        if (!isf(t) && B >= 2 && rng.chance(0.6)) {
            int hi = (int)std::min(B / 2, 100.0);
            int lo = t == DType::UInt8 ? 0 : -hi;
            y = clip(x, weak_int(lo), weak_int(hi));
        } else if (rng.chance(0.5)) {
            y = clip(x, weak_float(-B / 2), weak_float(B / 2));
        } else {
            y = bin(Op::Mul, x, weak_float(round_float(DType::Float16, B / 2 / maxabs(x.r))));
        }
        if (maxabs(y.r) <= B && sane(y.r)) return y;
        return clip(cast(x, DType::Float32), weak_float(-B / 2), weak_float(B / 2));
    }
    bool stable(const RP& r) const {
        for (auto f : r->u)
            if (f) return false;
        return true;
    }
    Built positive(const Built& x, double m = 0.03) {
        if (minv(x.r) >= m && stable(x.r)) return x;
        for (int attempt = 0; attempt < 3; ++attempt) {
            Built y;
            int k = (int)rng.range(0, 3);
            if (k == 0) y = bin(Op::Add, un(Op::Abs, x), weak_float(0.5));
            else if (k == 1) y = bin(Op::Add, un(Op::Sig, x), weak_float(0.25));
            else if (k == 2) y = un(Op::Exp, clip(x, weak_float(-3), weak_float(3)));
            else y = bin(Op::Add, un(Op::Square, bounded(x, 8)), weak_float(1.0));
            if (minv(y.r) >= m && sane(y.r) && stable(y.r)) return y;
        }
        return un(Op::Exp, clip(x, weak_float(-3), weak_float(3)));
    }
    Built nonzero(const Built& x, double m = 0.05) {
        if (minabs(x.r) >= m && stable(x.r)) return x;
        Built p = positive(x, m);
        return rng.chance(0.3) ? un(Op::Neg, p) : p;
    }

    // ---- shapes
    Shape random_shape(int max_rank = 4, int64_t budget = 2048) {
        int r = (int)rng.pick<int64_t>({0, 1, 1, 2, 2, 2, 3, 3, 4});
        r = std::min(r, max_rank);
        Shape s;
        int64_t n = 1;
        for (int i = 0; i < r; ++i) {
            int64_t d = rng.pick(kSizes);
            while (d > 1 && n * d > budget) d = rng.pick<int64_t>({1, 2, 3});
            if (n * d > budget) d = 1;
            s.push_back(d);
            n *= d;
        }
        return s;
    }
    // Two shapes that broadcast to exactly T.
    std::pair<Shape, Shape> split_shapes(const Shape& T) {
        auto sub = [&](const Shape& s) {
            Shape o = s;
            for (auto& d : o)
                if (rng.chance(0.25)) d = 1;
            int drop = rng.chance(0.25) ? (int)rng.range(0, (int)o.size()) : 0;
            o.erase(o.begin(), o.begin() + drop);
            return o;
        };
        double r = rng.uni();
        Shape a = r < 0.6 ? T : sub(T);
        // b must provide every dim that a lacks
        const int R = (int)T.size();
        int off = R - (int)a.size();
        Shape b = sub(T);
        int boff = R - (int)b.size();
        int need = R;  // outermost dim b must cover
        for (int d = 0; d < R; ++d) {
            bool a_has = d >= off && a[d - off] == T[d];
            if (!a_has && T[d] != 1) { need = std::min(need, d); }
        }
        if (need < boff) {  // b too short: extend with T's dims (or 1s where a covers)
            Shape ext(T.begin() + need, T.begin() + boff);
            b.insert(b.begin(), ext.begin(), ext.end());
            boff = need;
        }
        for (int d = boff; d < R; ++d) {
            bool a_has = d >= off && a[d - off] == T[d];
            if (!a_has) b[d - boff] = T[d];
        }
        if ((int)std::max(a.size(), b.size()) < R) {  // neither has T's rank: give it to b
            Shape ext(T.begin(), T.begin() + (R - (int)b.size()));
            b.insert(b.begin(), ext.begin(), ext.end());
        }
        if (rng.chance(0.5)) std::swap(a, b);
        return {a, b};
    }

    // ---- random expressions
    Built operand(const Shape& s, int depth, const RP& other) {
        if (s.empty() && other && rng.chance(0.5)) return scalar_for(other);
        return gen(s, depth);
    }

    Built gen(const Shape& T, int depth) {
        if (depth <= 0 || ops >= max_ops) return terminal(T);
        ++ops;
        if (special) return gen_special(T, depth);
        double r = rng.uni();
        if (r < 0.27) return gen_unary(T, depth);
        if (r < 0.57) return gen_binary(T, depth);
        if (r < 0.62) return gen_where(T, depth);
        if (r < 0.66) return gen_clip(T, depth);
        if (r < 0.82) return gen_reduce(T, depth);
        if (r < 0.86) return gen_cast(T, depth);
        if (r < 0.89) return gen_onehot(T, depth);
        if (r < 0.93) return gen_take(T, depth);
        return gen_reshape(T, depth);
    }

    Built apply_unary(Op op, Built x) {
        DType t = x.r->dtype;
        if (t == DType::Bool && (op == Op::Neg || op == Op::Sgn)) x = cast(x, rng.pick({DType::Int8, DType::Int32, DType::Float32}));
        switch (op) {
        case Op::Sqrt: case Op::Log: case Op::Log2: x = positive(x); break;
        case Op::SafeLog:
            if (!(minv(x.r) >= 0 && stable(x.r))) x = positive(x);
            else
                for (int64_t i = 0; i < x.r->n(); ++i)
                    if (x.r->v[i] < 0.03 && (x.r->v[i] != 0 || x.r->e[i] != 0)) { x = positive(x); break; }
            break;
        case Op::Recip: x = nonzero(x); break;
        case Op::Exp: case Op::Exp2: x = bounded(x, 10); break;
        case Op::Sig: case Op::Sig2: case Op::Tanh: case Op::Tanh2: x = bounded(x, 30); break;
        case Op::Square:
            if (isf(x.r->dtype)) x = bounded(x, is16(x.r->dtype) ? 150 : 900);
            else if (x.r->dtype == DType::Int32) x = bounded(x, 4000);
            break;
        default: break;
        }
        Built y = un(op, x);
        if (sane(y.r)) return y;
        return x.r->shape == y.r->shape ? un(Op::Abs, x) : y;
    }

    Built gen_unary(const Shape& T, int depth) {
        static const std::vector<Op> ops_ = {Op::Neg,  Op::Abs,  Op::Sqrt, Op::Square, Op::Exp,   Op::Exp2,
                                             Op::Log,  Op::Log2, Op::SafeLog, Op::Sig, Op::Sig2,  Op::Tanh,
                                             Op::Tanh2, Op::Recip, Op::Sgn, Op::Rint,  Op::Finite};
        Built x = gen(T, depth - 1);
        return apply_unary(rng.pick(ops_), x);
    }

    Built apply_binary(Op op, Built a, Built b) {
        DType t = ref_result_type(a.r, b.r);
        if (op == Op::Sub && t == DType::Bool) {
            if (rng.chance(0.5)) b = cast(b, DType::Int8);
            else op = Op::Add;
        }
        if (op == Op::Pow) {
            if (!isf(t)) {
                if (b.r->weak) a = cast(a, rng.pick({DType::Float32, DType::Float16, DType::BFloat16}));
                else b = cast(b, rng.pick({DType::Float32, DType::Float16, DType::BFloat16}));
            }
            if (b.r->weak && rng.chance(0.5)) {
                // an integral exponent: a negative base is valid (NumPy: (-2)**3 == -8)
                double ex = rng.pick({2.0, 3.0, -1.0, 2.0});
                b = weak_float(ex);
                a = ex < 0 ? nonzero(bounded(a, 6), 0.2) : bounded(a, 6);
            } else {
                a = bounded(positive(a, 0.1), 12);
                b = bounded(b, 2.5);
            }
        }
        if (op == Op::Div) {
            b = nonzero(b);
            double lim = limit(ref_result_type(a.r, b.r)) * 0.05;
            if (maxabs(a.r) > lim) a = bounded(a, lim);
        }
        if (is_division(op) && isf(ref_result_type(a.r, b.r))) {
            // Float division by 0 gives inf and NaN (the special-value graphs cover those); an
            // integer divisor may be 0 (the result is 0). Quotients stay far below 2^24.
            b = nonzero(b);
            double lim = limit(ref_result_type(a.r, b.r)) * 0.05;
            if (maxabs(a.r) > lim) a = bounded(a, lim);
        }
        if (op == Op::Mul) {
            t = ref_result_type(a.r, b.r);
            double lim = limit(t);
            if (std::isfinite(lim) && maxabs(a.r) * maxabs(b.r) > lim * 0.5) {
                double s = std::sqrt(lim * 0.5);
                a = bounded(a, s);
                b = bounded(b, s);
            }
        }
        if (op == Op::Add || op == Op::Sub) {
            t = ref_result_type(a.r, b.r);
            double lim = limit(t);
            if (std::isfinite(lim) && maxabs(a.r) + maxabs(b.r) > lim * 0.5) {
                a = bounded(a, lim * 0.25);
                b = bounded(b, lim * 0.25);
            }
        }
        Built y = bin(op, a, b);
        if (sane(y.r)) return y;
        Built z = bin(Op::Maximum, a, b);
        if (sane(z.r)) return z;
        return bin(Op::Gt, a, b);
    }

    Built gen_binary(const Shape& T, int depth) {
        static const std::vector<Op> ops_ = {Op::Add, Op::Add, Op::Sub, Op::Sub, Op::Mul, Op::Mul, Op::Div,
                                             Op::FloorDiv, Op::Mod, Op::Fmod, Op::Pow, Op::Maximum, Op::Minimum,
                                             Op::Eq, Op::Ne, Op::Gt, Op::Ge, Op::Lt, Op::Le};
        Op op = rng.pick(ops_);
        auto [sa, sb] = split_shapes(T);
        bool scalar_b = sb.empty() && rng.chance(0.6);
        bool swap = rng.chance(0.3);
        Built a = gen(sa, depth - 1);
        Built b = scalar_b ? scalar_for(a.r) : gen(sb, depth - 1);
        if (swap && op != Op::Pow) std::swap(a, b);
        return apply_binary(op, a, b);
    }

    Built gen_condition(const Shape& s, int depth) {
        double r = rng.uni();
        if (r < 0.55) {
            auto [sa, sb] = split_shapes(s);
            Built a = gen(sa, depth - 1);
            Built b = sb.empty() && rng.chance(0.5) ? scalar_for(a.r) : gen(sb, depth - 1);
            return bin(rng.pick({Op::Gt, Op::Lt, Op::Ge, Op::Le, Op::Eq, Op::Ne}), a, b);
        }
        if (r < 0.8) return leaf(s, DType::Bool);
        return gen(s, depth - 1);  // any dtype: nonzero is true
    }

    Built gen_where(const Shape& T, int depth) {
        auto [sa, sb] = split_shapes(T);
        Shape sc = T;
        for (auto& d : sc)
            if (rng.chance(0.3)) d = 1;
        Built c = gen_condition(sc, depth);
        Built a = gen(sa, depth - 1);
        Built b = sb.empty() && rng.chance(0.5) ? scalar_for(a.r) : gen(sb, depth - 1);
        Built y = where(c, a, b);
        if (sane(y.r)) return y;
        return bin(Op::Maximum, a, b);
    }

    Built gen_clip(const Shape& T, int depth) {
        Built a = gen(T, depth - 1);
        DType t = a.r->dtype;
        Built lo, hi;
        if (rng.chance(0.7)) {
            if (isf(t) || rng.chance(0.3)) {
                double l = 0.25 * (double)rng.range(-8, 4), h = l + 0.25 * (double)rng.range(-1, 12);
                lo = weak_float(l);
                hi = weak_float(h);
            } else {
                int l = t == DType::UInt8 ? (int)rng.range(0, 5) : (int)rng.range(-10, 5);
                int h = l + (int)rng.range(-1, 12);
                if (t == DType::UInt8) h = std::max(h, 0);
                lo = weak_int(l);
                hi = weak_int(h);
            }
        } else {
            auto [s1, s2] = split_shapes(T);
            (void)s2;
            Shape s3 = T;
            for (auto& d : s3)
                if (rng.chance(0.4)) d = 1;
            lo = gen(s1, depth - 2);
            hi = gen(s3, depth - 2);
        }
        Built y = clip(a, lo, hi);
        if (sane(y.r)) return y;
        return a;
    }

    Built gen_reduce(const Shape& T, int depth) {
        const int R = (int)T.size();
        const int64_t nT = count(T);
        std::vector<int> ones;
        for (int d = 0; d < R; ++d)
            if (T[d] == 1) ones.push_back(d);
        bool all_ones = (int)ones.size() == R;
        // modes: 0 keepdims over axis, 1 drop axis, 2 all axes keepdims, 3 all axes dropped
        std::vector<int> modes;
        if (!ones.empty()) modes.insert(modes.end(), {0, 0});
        if (R < 4) modes.insert(modes.end(), {1, 1});
        if (all_ones) modes.push_back(2);
        if (R == 0) modes.push_back(3);
        if (modes.empty()) return gen_unary(T, depth);
        int mode = rng.pick(modes);
        int64_t budget = 4096;
        auto red_len = [&]() {
            int64_t n = rng.pick(kSizes);
            while (n > 1 && nT * n > budget) n = rng.pick<int64_t>({1, 2, 3, 5, 7});
            return n;
        };
        Shape in;
        int axis = -1;
        bool keepdims = true;
        switch (mode) {
        case 0: axis = rng.pick(ones); in = T; in[axis] = red_len(); break;
        case 1: axis = (int)rng.range(0, R); in = T; in.insert(in.begin() + axis, red_len()); keepdims = false; break;
        case 2: {
            in = random_shape(4, budget);
            in.resize(R, 1);
            if (in.size() != (size_t)R) in.assign(R, 1);
            for (auto& d : in) d = std::max<int64_t>(1, std::min<int64_t>(d, 33));
            break;
        }
        default: in = random_shape(4, budget); keepdims = false; break;
        }
        const int rin = (int)in.size();
        // The axis as the caller passes it: positive or counted from the end.
        int arg = axis;
        if (axis >= 0 && rng.chance(0.4)) arg = axis - rin;
        Built x = gen(in, depth - 1);
        static const std::vector<Op> rops = {Op::Sum, Op::Sum, Op::Max, Op::Min, Op::ArgMax, Op::ArgMin};
        double r = rng.uni();
        Built y;
        if (r < 0.62) {
            Op op = rng.pick(rops);
            y = red(op, x, axis, axis < 0 ? kiln::all_axes : arg, keepdims);
        } else if (r < 0.82) {
            y = mean(x, axis, axis < 0 ? kiln::all_axes : arg, keepdims);
        } else if (r < 0.92) {
            y = var(bounded(x, 100), axis, axis < 0 ? kiln::all_axes : arg, keepdims);
        } else {
            y = stdev(bounded(x, 100), axis, axis < 0 ? kiln::all_axes : arg, keepdims);
        }
        if (sane(y.r)) return y;
        Built m = mean(bounded(x, 100), axis, axis < 0 ? kiln::all_axes : arg, keepdims);
        if (sane(m.r)) return m;
        return red(Op::Max, x, axis, axis < 0 ? kiln::all_axes : arg, keepdims);
    }

    Built gen_cast(const Shape& T, int depth) {
        Built x = gen(T, depth - 1);
        DType to = rng.pick(kAllDTypes);
        if (is16(to) && maxabs(x.r) > 6e4) to = DType::Float32;
        return cast(x, to);
    }

    Built index_leaf(const Shape& s, int64_t lo, int64_t hi) {
        DType t = rng.pick({DType::Int32, DType::Int32, DType::Int8, DType::UInt8});
        if (t == DType::UInt8) lo = std::max<int64_t>(lo, 0);
        if (t != DType::Int32) { lo = std::max<int64_t>(lo, -128); hi = std::min<int64_t>(hi, 127); }
        ViewSpec vs = make_view(rng, s, rng.chance(0.3));
        std::vector<double> base((size_t)count(vs.base));
        for (auto& x : base) x = (double)rng.range(lo, hi);
        std::vector<double> vals(vs.map.size());
        for (size_t i = 0; i < vals.size(); ++i) vals[i] = base[vs.map[i]];
        Tensor b = upload(base, vs.base, t);
        keep.push_back(b);
        leaves.push_back("%" + std::to_string(g_next_id + 1) + " " + dname(t) + " indices " + shape_s(s) + " " + vs.desc);
        return chk(apply_view(b, vs).expr(), r_leaf(t, s, vals, vs.desc), "indices");
    }

    Built gen_onehot(const Shape& T, int depth) {
        const int R = (int)T.size();
        if (R == 0 || R > 4) return gen_unary(T, depth);
        int axis = (int)rng.range(0, R - 1);
        int64_t C = T[axis];
        Shape is = T;
        is.erase(is.begin() + axis);
        Built idx;
        if (rng.chance(0.25) && (int)is.size() < 4 && count(is) * C <= 4096) {
            Shape in = is;
            in.push_back(C);
            Built src = gen(in, depth - 1);
            idx = red(Op::ArgMax, src, (int)is.size(), (int)is.size(), false);
        } else {
            idx = index_leaf(is, -1, C);
        }
        DType t = rng.chance(0.5) ? DType::Float32 : rng.pick(kAllDTypes);
        int arg = rng.chance(0.5) ? axis : axis - R;
        Expr e = t == DType::Float32 && rng.chance(0.5) && arg == -1 ? kiln::onehot(idx.e, C)
                                                                     : kiln::onehot(idx.e, C, arg, t);
        return chk(e, r_onehot(idx.r, C, axis, t), "onehot");
    }

    Built gen_take(const Shape& T, int depth) {
        const int R = (int)T.size();
        bool flat = rng.chance(0.3);
        Shape src_shape, idx_shape;
        int axis = 0;
        int64_t L = rng.pick<int64_t>({1, 2, 3, 5, 7, 8, 17});
        if (flat) {
            idx_shape = T;
            src_shape = random_shape(3, 256);
            if (count(src_shape) == 0) src_shape = {3};
            L = count(src_shape);
        } else {
            int k = (int)rng.range(0, std::min(R, 2));  // rank of the indices
            if (R - k + 1 > 4) k = R - 3;
            axis = (int)rng.range(0, R - k);
            src_shape.assign(T.begin(), T.begin() + axis);
            src_shape.push_back(L);
            src_shape.insert(src_shape.end(), T.begin() + axis + k, T.end());
            idx_shape.assign(T.begin() + axis, T.begin() + axis + k);
            if (count(src_shape) > 8192) return gen_unary(T, depth);
        }
        Built src = rng.chance(0.7) ? leaf(src_shape, leaf_dtype()) : gen(src_shape, depth - 1);
        Built idx = index_leaf(idx_shape, -L - 2, L + 2);
        Expr e;
        std::optional<int> ax;
        if (!flat) {
            int rs = (int)src_shape.size();
            ax = axis;
            e = kiln::take(src.e, idx.e, rng.chance(0.5) ? axis : axis - rs);
        } else {
            e = kiln::take(src.e, idx.e);
        }
        return chk(e, r_take(src.r, idx.r, ax), "take");
    }

    Built gen_reshape(const Shape& T, int depth) {
        const int R = (int)T.size();
        std::vector<int> ones;
        for (int d = 0; d < R; ++d)
            if (T[d] == 1) ones.push_back(d);
        if (!ones.empty() && rng.chance(0.4)) {
            int a = rng.pick(ones);
            Shape in = T;
            in.erase(in.begin() + a);
            Built x = gen(in, depth - 1);
            int arg = rng.chance(0.5) ? a : a - R;
            return chk(kiln::expand_dims(x.e, arg), r_reshape(x.r, T, "expand_dims " + std::to_string(a)), "expand_dims");
        }
        // another factorisation of the same count
        int64_t n = count(T);
        Shape in;
        double r = rng.uni();
        if (r < 0.4) in = {n};
        else if (r < 0.7) { in = T; std::reverse(in.begin(), in.end()); }
        else { in = T; in.insert(in.begin() + rng.range(0, R), 1); }
        if (in.size() > 4) in = {n};
        Built x = gen(in, depth - 1);
        Shape arg = T;
        if (!T.empty() && rng.chance(0.3)) arg[rng.range(0, R - 1)] = -1;
        return chk(kiln::reshape(x.e, arg), r_reshape(x.r, T, "reshape"), "reshape");
    }

    // ---- special values: NaN, inf, -0 in float leaves, ops with defined results on them
    Built gen_special(const Shape& T, int depth) {
        double r = rng.uni();
        auto sub = [&](const Shape& s) { return gen(s, depth - 1); };
        if (r < 0.30) {
            Built x = sub(T);
            Op op = rng.pick({Op::Finite, Op::Abs, Op::Neg, Op::Sgn, Op::Rint, Op::Finite});
            if (x.r->dtype == DType::Bool && (op == Op::Neg || op == Op::Sgn)) op = Op::Abs;
            if (op == Op::Rint && !isf(x.r->dtype)) op = Op::Abs;
            return un(op, x);
        }
        if (r < 0.55) {
            Op op = rng.pick({Op::Maximum, Op::Minimum, Op::Gt, Op::Le, Op::Eq, Op::Ne, Op::Mul, Op::Add, Op::FloorDiv,
                              Op::Mod, Op::Fmod});
            if (op == Op::Mul || op == Op::Add) return bin(op, sub(T), weak_float(rng.pick({2.0, -0.5, 1.5})));
            auto [sa, sb] = split_shapes(T);
            Built a = sub(sa);
            Built b = sb.empty() && rng.chance(0.5) ? scalar_for(a.r) : sub(sb);
            return bin(op, a, b);
        }
        if (r < 0.70) {
            Built x = sub(T);
            Built fin = un(Op::Finite, x);
            Built alt = scalar_for(x.r);
            return rng.chance(0.5) ? where(fin, x, alt) : where(bin(Op::Ne, x, x), alt, x);  // x != x: isnan
        }
        if (r < 0.80) {
            Built x = sub(T);
            return cast(x, rng.pick(kAllDTypes));
        }
        // reductions
        const int R = (int)T.size();
        if (R >= 4) return un(Op::Finite, sub(T));
        int axis = (int)rng.range(0, R);
        Shape in = T;
        in.insert(in.begin() + axis, rng.pick<int64_t>({1, 3, 5, 17}));
        Built x = sub(in);
        Op op = rng.pick({Op::Max, Op::Min, Op::ArgMax, Op::ArgMin, Op::Sum});
        return red(op, x, axis, axis, false);
    }
};

// ======================================================================================
// One graph: build, assign, compare
// ======================================================================================

// Counters of a run. They live in memory shared with the child processes that run the graphs
// (see the test case), so plain integers only.
struct Totals {
    int64_t graphs, failed, elements, skipped, nan_checked;
    int64_t by_kind[6];
    int64_t rand_graphs, strided_dst, cast_dst, broadcast_dst, with_reduction;
    int64_t nvrtc_over_cap, nvrtc_compiled, nvrtc_failed, distinct_kernels;
    int64_t next;     // index of the next graph to run
    int64_t current;  // index of the graph running now, -1 between graphs
    int64_t crashed;
    int64_t jit_compiles;
    double jit_ms, nvrtc_ms;
    // coverage, over the nodes of every checked graph
    int64_t op_count[kNumOps];
    int64_t composite[4];
    int64_t dtype_count[7];
    int64_t rank_count[5];
    int64_t weak_float, weak_int, typed_scalar, strided_leaves, keepdims_false, all_axes;
};

struct Env {
    int64_t count = 2000;
    std::optional<uint64_t> seed;
    int64_t nvrtc_max = INT64_MAX;  // every distinct kernel is compiled for sm_80 and sm_90
    bool verbose = false;
    bool fork = true;
};

Env read_env() {
    Env e;
    if (const char* s = std::getenv("KILN_FUZZ_COUNT")) e.count = std::atoll(s);
    if (const char* s = std::getenv("KILN_FUZZ_SEED")) e.seed = std::strtoull(s, nullptr, 10);
    if (const char* s = std::getenv("KILN_FUZZ_NVRTC_MAX")) e.nvrtc_max = std::atoll(s);
    if (const char* s = std::getenv("KILN_FUZZ_VERBOSE")) e.verbose = std::atoi(s) != 0;
    // A process that has initialised CUDA cannot use it in a forked child: GPU runs stay in-process.
    if (test_device().rfind("cuda", 0) == 0) e.fork = false;
    if (const char* s = std::getenv("KILN_FUZZ_FORK")) e.fork = std::atoi(s) != 0;
    return e;
}

// The destination: a view into a base tensor whose other elements must survive the assignment.
struct Dst {
    Tensor base, view;
    ViewSpec spec;
    DType dtype;
    std::vector<double> before;  // base contents before the assignment (when prefilled)
    bool prefilled = false;
    std::string desc;
};

std::vector<double> read_back(const Tensor& t) {
    std::vector<double> out((size_t)t.size());
    if (isf(t.dtype())) {
        std::vector<float> f((size_t)t.size());
        t.copy_to_host(f.data(), DType::Float32);
        for (size_t i = 0; i < f.size(); ++i) out[i] = f[i];
    } else {
        std::vector<int32_t> v((size_t)t.size());
        t.copy_to_host(v.data(), DType::Int32);
        for (size_t i = 0; i < v.size(); ++i) out[i] = v[i];
    }
    return out;
}

struct GraphResult {
    bool ok = true;
    std::string log;
};

class Runner {
public:
    kiln::Context& ctx;
    Totals& tot;
    NvrtcWorker* nvrtc;
    const Env& env;
    std::set<std::string> keys;  // kernels already sent to NVRTC

    Runner(kiln::Context& c, Totals& t, NvrtcWorker* w, const Env& e) : ctx(c), tot(t), nvrtc(w), env(e) {}

    Dst make_dst(Gen& g, Rng& rng, const RP& root, bool allow_cast = true) {
        Dst d;
        Shape s = root->shape;
        if (rng.chance(0.15) && count(s) * 3 <= 8192) {  // assign broadcasts the result
            for (auto& x : s)
                if (x == 1 && rng.chance(0.6)) x = rng.pick<int64_t>({2, 3, 5});
            if (s.size() < 4 && rng.chance(0.4)) s.insert(s.begin(), rng.pick<int64_t>({1, 2, 3}));
            if (count(s) > 8192) s = root->shape;
        }
        d.dtype = root->dtype;
        if (allow_cast && rng.chance(0.25)) {
            d.dtype = rng.pick(kAllDTypes);
            if (is16(d.dtype) && Gen::maxabs(root) > 6e4) d.dtype = DType::Float32;
        }
        double m = rng.uni();
        bool strided = m < 0.35;
        d.spec = make_view(rng, s, strided, 30000);
        if (strided || m < 0.5) {
            std::vector<double> base((size_t)count(d.spec.base));
            for (auto& x : base) x = g.leaf_value(d.dtype, 0);
            d.base = g.upload(base, d.spec.base, d.dtype);
            d.before = base;
            d.prefilled = true;
        } else {
            d.base = ctx.empty(d.spec.base, d.dtype);  // never written before the assignment
        }
        d.view = apply_view(d.base, d.spec);
        d.desc = std::string(dname(d.dtype)) + " " + shape_s(s) + " " + d.spec.desc + (d.prefilled ? "" : " (empty())");
        return d;
    }

    // Expected contents of the destination's base after `dst = root`.
    bool compare(const RP& root, const Dst& d, const std::vector<double>& got, std::string& log) {
        const Shape& ds = d.view.shape();
        auto m = bmap(root->shape, ds);
        std::vector<int64_t> pos(got.size(), -1);
        for (size_t i = 0; i < d.spec.map.size(); ++i) pos[d.spec.map[i]] = (int64_t)i;
        const bool red = root->reduction;
        double rtol = 0, atol = 0;
        switch (d.dtype) {
        case DType::Float32: rtol = red ? 1e-4 : 1e-5; atol = 1e-37; break;
        case DType::Float16: rtol = red ? 4e-3 : 2e-3; atol = 0x1p-24; break;
        case DType::BFloat16: rtol = red ? 2.4e-2 : 1.6e-2; atol = 1e-37; break;
        default: break;
        }
        int bad = 0;
        int64_t skipped_here = 0;
        for (size_t b = 0; b < got.size(); ++b) {
            double g = got[b];
            if (pos[b] < 0) {
                if (d.prefilled && !(g == d.before[b] || (std::isnan(g) && std::isnan(d.before[b])))) {
                    if (bad++ < 8)
                        log += "  element outside the destination view, base index " + std::to_string(b) + ": was " +
                               std::to_string(d.before[b]) + ", now " + std::to_string(g) + "\n";
                }
                continue;
            }
            int64_t i = pos[b];
            X x = root->at(m[i]);
            ++tot.elements;
            bool fail = false;
            double exp, tol = 0;
            if (isf(d.dtype)) {
                exp = round_float(d.dtype, x.v);
                if (x.u) { ++tot.skipped; ++skipped_here; continue; }
                if (std::isnan(exp)) { ++tot.nan_checked; fail = !std::isnan(g); }
                else if (std::isinf(exp)) fail = g != exp;
                else {
                    tol = atol + rtol * std::fabs(exp) + kTolFactor * x.e;
                    fail = !(std::fabs(g - exp) <= tol);
                }
            } else {
                X c = convert(x, root->dtype, d.dtype);
                exp = c.v;
                if (c.u) { ++tot.skipped; ++skipped_here; continue; }
                fail = g != exp;
            }
            if (fail && bad++ < 8) {
                char buf[320];
                std::snprintf(buf, sizeof buf, "  at %s: got %.9g, expected %.9g (reference %.17g, bound %.3g, tol %.3g)\n",
                              idx_s(i, ds).c_str(), g, exp, x.v, x.e, tol);
                log += buf;
            }
        }
        if (bad > 8) log += "  ... " + std::to_string(bad) + " mismatching elements in all\n";
        if (skipped_here && env.verbose) log += "  " + std::to_string(skipped_here) + " elements skipped as unstable\n";
        return bad == 0;
    }

    void compile_cuda(const Expr& e, const Tensor& dst, uint64_t seed, std::string& log, bool& ok) {
        try {
            kiln::CompiledAssignment ca = kiln::compile_assignment(e.node(), dst.view(), "sm_90");
            for (auto& ls : ca.stages) {
                if (!keys.insert(ls.key).second) continue;
                ++tot.distinct_kernels;
                // Manifests store kernels as text: every kernel must come back from it whole.
                kiln::kir::Kernel back = kiln::parse_kernel_text(kiln::kernel_text(ls.kernel));
                if (kiln::key_material(back, "sm_90") != ls.key) {
                    ok = false;
                    log += "  kernel text round trip changed the kernel's key\n";
                }
                if (tot.distinct_kernels > env.nvrtc_max) { ++tot.nvrtc_over_cap; continue; }
#ifdef KILN_DIFF_NVRTC
                auto src = kiln::codegen::emit_cuda(ls.kernel);
                nvrtc->submit(NvrtcJob{src.code, ls.kernel.name, seed, e.str()});
#else
                (void)seed;
                (void)nvrtc;
#endif
            }
        } catch (const std::exception& ex) {
            ok = false;
            log += std::string("  compile_assignment/emit_cuda for sm_90 threw: ") + ex.what() + "\n";
        }
    }

    GraphResult run(uint64_t seed) {
        GraphResult res;
        if (env.verbose) {
            std::printf("-- seed %llu\n", (unsigned long long)seed);
            std::fflush(stdout);
        }
        Rng rng(seed);
        Gen g(ctx, rng);
        g.main = rng.pick(kAllDTypes);
        g.max_ops = (int)rng.range(3, 12);
        double kr = rng.uni();
        Kind kind = kr < 0.70 ? Kind::Random : kr < 0.78 ? Kind::Template : kr < 0.84 ? Kind::InPlace
                  : kr < 0.88 ? Kind::Overlap : kr < 0.93 ? Kind::Special : Kind::Focus;
        ++tot.by_kind[(int)kind];
        Built root;
        std::optional<Dst> dst;
        try {
            switch (kind) {
            case Kind::Random: {
                Shape T = g.random_shape();
                root = g.gen(T, (int)rng.range(1, 4));
                break;
            }
            case Kind::Template: root = build_template(g, rng); break;
            case Kind::Special: {
                g.special = true;
                g.main = rng.pick({DType::Float32, DType::Float32, DType::Float16, DType::BFloat16});
                Shape T = g.random_shape(3, 512);
                root = g.gen(T, (int)rng.range(1, 3));
                break;
            }
            case Kind::Focus: {
                Shape T = g.random_shape(3, 2048);
                double r = rng.uni();
                if (r < 0.35 && !T.empty()) root = g.gen_onehot(T, 2);
                else if (r < 0.7) root = g.gen_take(T, 2);
                else {
                    Built x = g.make_rand(T);
                    Built y = g.gen(T, 2);
                    root = g.apply_binary(rng.pick({Op::Add, Op::Mul, Op::Lt}), x, y);
                    if (rng.chance(0.3) && !T.empty()) root = g.mean(root, 0, 0, true);
                }
                break;
            }
            case Kind::InPlace: case Kind::Overlap: dst = build_aliasing(g, rng, kind, root); break;
            }
        } catch (const kiln::Error& ex) {
            res.ok = false;
            res.log += std::string("  kiln::Error while building the expression: ") + ex.what() + "\n";
        } catch (const std::exception& ex) {
            res.ok = false;
            res.log += std::string("  exception while building the expression: ") + ex.what() + "\n";
        }
        if (res.ok && !g.mismatch.empty()) {
            res.ok = false;
            res.log += "  dtype/shape disagreement: " + g.mismatch + "\n";
        }
        if (!res.ok) return finish(seed, kind, g, root, dst, res);
        if (!dst) dst = make_dst(g, rng, root.r);
        tot.rand_graphs += g.rand_used;
        tot.strided_dst += !dst->spec.slices.empty() || !dst->spec.perm.empty();
        tot.cast_dst += dst->dtype != root.r->dtype;
        tot.broadcast_dst += dst->view.shape() != root.r->shape;
        tot.with_reduction += root.r->reduction;
        count_coverage(root.r, g);

        if (env.verbose) {
            std::printf("about to assign into %s:\n%s", dst->desc.c_str(), root.e.str().c_str());
            std::fflush(stdout);
        }
        if (env.nvrtc_max > 0) compile_cuda(root.e, dst->view, seed, res.log, res.ok);
        try {
            if (g.rand_used) ctx.seed(g.ctx_seed);
            if (rng.chance(0.5)) dst->view.assign(root.e);
            else dst->view[kiln::all] = root.e;  // nervanagpu's spelling, dst[:] = expr
        } catch (const std::exception& ex) {
            res.ok = false;
            res.log += std::string("  assignment threw: ") + ex.what() + "\n";
            return finish(seed, kind, g, root, dst, res);
        }
        try {
            std::vector<double> got = read_back(dst->base);
            if (!compare(root.r, *dst, got, res.log)) res.ok = false;
        } catch (const std::exception& ex) {
            res.ok = false;
            res.log += std::string("  reading the result threw: ") + ex.what() + "\n";
        }
        return finish(seed, kind, g, root, dst, res);
    }

    void count_coverage(const RP& root, const Gen& g) {
        std::set<int> seen;
        std::function<void(const RP&)> walk = [&](const RP& n) {
            if (!seen.insert(n->id).second) return;
            for (auto& k : n->kids) walk(k);
            ++tot.op_count[(int)n->op];
            ++tot.dtype_count[(int)n->dtype];
            ++tot.rank_count[std::min<size_t>(n->shape.size(), 4)];
            if (n->op == Op::Scalar) {
                if (!n->weak) ++tot.typed_scalar;
                else if (n->dtype == DType::Float32) ++tot.weak_float;
                else ++tot.weak_int;
            }
            if (n->op == Op::Leaf && n->attr != "contiguous") ++tot.strided_leaves;
            if (n->attr.find("keepdims=false") != std::string::npos) ++tot.keepdims_false;
            if (n->attr.find("axis=all") != std::string::npos) ++tot.all_axes;
        };
        walk(root);
        for (int i = 0; i < 4; ++i) tot.composite[i] += g.composite[i];
    }

    GraphResult finish(uint64_t seed, Kind kind, Gen& g, const Built& root, const std::optional<Dst>& dst, GraphResult res) {
        ++tot.graphs;
        if (res.ok && !env.verbose) return res;
        std::string s;
        s += std::string(res.ok ? "graph" : "FAILED graph") + " seed " + std::to_string(seed) + " (" + kind_name(kind) +
             ", replay with KILN_FUZZ_SEED=" + std::to_string(seed) + ")\n";
        s += res.log;
        if (root.e.valid()) s += "kiln expression:\n" + root.e.str();
        if (root.r) s += "reference:\n" + ref_str(root.r);
        s += "leaves:\n";
        for (auto& l : g.leaves) s += "  " + l + "\n";
        if (dst) s += "destination: " + dst->desc + "\n";
        if (!res.ok) ++tot.failed;
        std::printf("%s\n", s.c_str());
        std::fflush(stdout);
        return res;
    }

    // ---- graph families with fixed structure
    Built build_template(Gen& g, Rng& rng) {
        DType t = rng.pick({DType::Float32, DType::Float32, DType::Float16, DType::BFloat16, DType::Int8, DType::Int32});
        int64_t R = rng.pick<int64_t>({1, 3, 7, 16, 33, 64}), C = rng.pick<int64_t>({1, 3, 17, 32, 33, 129});
        if (R * C > 4096) C = 33;
        Built A = g.leaf({R, C}, t, 0);
        const Shape rc{R, C};
        auto eps = g.weak_float(0.001);
        switch ((int)rng.range(0, 9)) {
        case 0:  // the seed's variance: mean(square(A - mean(A, 1)), 1)
            return g.mean(g.un(Op::Square, g.bin(Op::Sub, A, g.mean(A, 1, 1, true))), 1, 1, true);
        case 1: {  // batch norm: reciprocal(sqrt(var(A, 1) + eps)) * (A - mean(A, 1))
            Built v = g.var(A, 1, 1, true);
            return g.bin(Op::Mul, g.un(Op::Recip, g.un(Op::Sqrt, g.bin(Op::Add, v, eps))), g.bin(Op::Sub, A, g.mean(A, 1, 1, true)));
        }
        case 2:  // column mean subtracted, then row sums: two stages
            return g.red(Op::Sum, g.bin(Op::Sub, A, g.mean(A, 0, 0, true)), 1, 1, true);
        case 3:  // row max minus column min broadcast to (R, C)
            return g.bin(Op::Sub, g.red(Op::Max, A, 1, 1, true), g.red(Op::Min, A, 0, -2, true));
        case 4:  // a full reduction of something holding a column reduction
            return g.red(Op::Sum, g.bin(Op::Mul, g.bounded(A, 10), g.mean(g.bounded(A, 10), 0, 0, true)), -1, kiln::all_axes, true);
        case 5: {  // softmax over rows
            Built Af = isf(t) ? g.bounded(A, 8) : g.cast(g.bounded(A, 8), DType::Float32);
            Built z = g.un(Op::Exp, g.bin(Op::Sub, Af, g.red(Op::Max, Af, 1, 1, true)));
            return g.bin(Op::Div, z, g.red(Op::Sum, z, 1, 1, true));
        }
        case 6:  // normalise by the global mean, reduce over columns
            return g.red(rng.pick({Op::ArgMax, Op::Max, Op::Sum}), g.bin(Op::Sub, A, g.mean(A, -1, kiln::all_axes, true)), 0, 0,
                         rng.chance(0.5));
        case 7:  // std over rows of a row-centred matrix, no keepdims
            return g.stdev(g.bin(Op::Sub, A, g.mean(A, 1, 1, true)), 1, 1, false);
        case 8:  // var over columns of an elementwise chain, then broadcast back
            return g.bin(Op::Div, g.bin(Op::Sub, A, g.mean(A, 0, 0, true)),
                         g.un(Op::Sqrt, g.bin(Op::Add, g.var(A, 0, -2, true), g.weak_float(0.01))));
        default:  // nested reductions on one axis (postfix order: one kernel with two passes)
            (void)rc;
            return g.red(Op::Max, g.bin(Op::Sub, A, g.mean(A, 1, 1, true)), 1, 1, false);
        }
    }

    // In-place (dst is a leaf of the expression, same layout) and overlapping (dst's memory
    // read through another view) assignments.
    std::optional<Dst> build_aliasing(Gen& g, Rng& rng, Kind kind, Built& root) {
        DType t = rng.pick(kAllDTypes);
        Dst d;
        d.dtype = t;
        Shape S;
        ViewSpec dst_spec, src_spec;
        if (kind == Kind::InPlace) {
            S = g.random_shape(3, 1024);
            if (S.empty()) S = {5};
            dst_spec = make_view(rng, S, rng.chance(0.4));
            src_spec = dst_spec;
        } else {
            int which = (int)rng.range(0, 2);
            int64_t n = rng.pick<int64_t>({2, 3, 7, 16, 33});
            if (which == 0) {  // A = A.T() on a square A
                S = {n, n};
                dst_spec = make_view(rng, S, false);
                src_spec = dst_spec;
                src_spec.perm = {1, 0};
                for (int64_t i = 0; i < n; ++i)
                    for (int64_t j = 0; j < n; ++j) src_spec.map[i * n + j] = j * n + i;
                src_spec.desc = "A.T()";
            } else if (which == 1) {  // A[::-1] into A
                S = {n + 1, rng.pick<int64_t>({1, 3, 5})};
                dst_spec = make_view(rng, S, false);
                src_spec = dst_spec;
                src_spec.slices = {kiln::Slice::range(kiln::Slice::kNone, kiln::Slice::kNone, -1)};
                for (int64_t i = 0; i < S[0]; ++i)
                    for (int64_t j = 0; j < S[1]; ++j) src_spec.map[i * S[1] + j] = (S[0] - 1 - i) * S[1] + j;
                src_spec.desc = "A[::-1]";
            } else {  // A[1:] = f(A[:-1])
                Shape B = {n + 1, rng.pick<int64_t>({1, 4, 7})};
                S = {n, B[1]};
                dst_spec.base = B;
                dst_spec.slices = {kiln::Slice::range(1, kiln::Slice::kNone)};
                src_spec.base = B;
                src_spec.slices = {kiln::Slice::range(0, -1)};
                for (int64_t i = 0; i < n; ++i)
                    for (int64_t j = 0; j < B[1]; ++j) {
                        dst_spec.map.push_back((i + 1) * B[1] + j);
                        src_spec.map.push_back(i * B[1] + j);
                    }
                dst_spec.desc = "A[1:]";
                src_spec.desc = "A[:-1]";
            }
        }
        std::vector<double> base((size_t)count(dst_spec.base));
        for (auto& x : base) x = g.leaf_value(t, rng.chance(0.3) ? 1 : 0);
        base[0] = base[0] == 0 ? 1 : base[0];
        d.base = g.upload(base, dst_spec.base, t);
        d.before = base;
        d.prefilled = true;
        d.spec = dst_spec;
        d.view = apply_view(d.base, dst_spec);
        Tensor src = apply_view(d.base, src_spec);
        std::vector<double> vals(src_spec.map.size());
        for (size_t i = 0; i < vals.size(); ++i) vals[i] = base[src_spec.map[i]];
        Built L = g.chk(src.expr(), r_leaf(t, S, vals, src_spec.desc), "aliased tensor");
        g.leaves.push_back("%" + std::to_string(L.r->id) + " " + dname(t) + " " + shape_s(S) + " " + src_spec.desc +
                           " (destination's memory)");
        g.pool.push_back(L);
        g.main = rng.chance(0.6) ? t : rng.pick(kAllDTypes);
        if (rng.chance(0.25)) {
            // the seeds' canonical in-place update
            root = g.apply_binary(Op::Add, g.apply_binary(Op::Mul, L, g.weak_int(2)), g.weak_int(1));
        } else {
            root = g.gen(S, (int)rng.range(1, 3));
            if (!g.pool_used) root = g.apply_binary(rng.pick({Op::Add, Op::Mul, Op::Maximum, Op::Sub}), root, L);
        }
        // Broadcast results are fine too: the root may be smaller than S only if it broadcasts.
        d.desc = std::string(dname(t)) + " " + shape_s(S) + " " + dst_spec.desc + " (aliases " + src_spec.desc + ")";
        return d;
    }
};

// Whether the device under test can be used here.
bool test_device_usable() {
    static const std::string why_not = [] {
        try {
            kiln::Context probe(kiln::ContextOptions{test_device(), 0, DType::Float32});
            std::printf("differential: running on %s\n", probe.device_description().c_str());
            return std::string();
        } catch (const kiln::Error& e) {
            return std::string(e.what());
        }
    }();
    if (!why_not.empty()) std::printf("SKIPPED: no usable %s device: %s\n", test_device().c_str(), why_not.c_str());
    return why_not.empty();
}

uint64_t graph_seed(int64_t i) { return mix64(0x6b696c6e00000000ull + (uint64_t)i) % 100000000000ull; }

// Runs graphs tot.next, tot.next+1, ... up to `end` (or the one replayed seed) in this process.
void run_graphs(Totals& tot, const Env& env, int64_t end) {
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    NvrtcWorker worker(&tot.nvrtc_compiled);
    Runner runner(ctx, tot, &worker, env);
    const int64_t jit_base = tot.jit_compiles;
    const double jit_ms_base = tot.jit_ms;
    if (env.seed) {
        tot.current = 0;
        runner.run(*env.seed);
    } else {
        while (tot.next < end) {
            tot.current = tot.next++;
            runner.run(graph_seed(tot.current));
            auto c = ctx.counters();  // kept up to date: a later crash of this process loses nothing
            tot.jit_compiles = jit_base + (int64_t)c.compiles;
            tot.jit_ms = jit_ms_base + c.compile_ms;
        }
    }
    tot.current = -1;
    worker.finish();
    tot.nvrtc_ms += worker.ms;
    tot.nvrtc_failed += (int64_t)worker.failures.size();
    for (auto& f : worker.failures) std::printf("%s\n", f.c_str());
    std::fflush(stdout);
}

} // namespace
// ---- Fixed cases for semantics a random graph rarely pins down exactly

TEST_CASE("rand: philox stream, one counter per rand() node per assignment, reset by seed()") {
    if (!test_device_usable()) return;
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    const uint64_t s = 0x0123456789abcdefull;
    const uint32_t seed32 = (uint32_t)(s ^ (s >> 32));
    const int64_t n = 37;
    auto expect = [&](uint32_t counter, int64_t i) { return kiln::philox_uniform(seed32, counter, (uint32_t)i); };
    ctx.seed(s);
    Tensor a = ctx.empty({n}), b = ctx.empty({n}), c = ctx.empty({n}), d = ctx.empty({n}), e = ctx.empty({4, n});
    a.assign(kiln::rand({n}));  // counter 0
    b.assign(kiln::rand({n}));  // counter 1
    Expr r = kiln::rand({n});
    c.assign(r + r * 2.0);      // one node read twice: one draw, counter 2
    Expr r1 = kiln::rand({n}), r2 = kiln::rand({n});
    d.assign(r1 - r2 * 4.0);    // two nodes: counters 3 and 4, in either order
    e.assign(kiln::rand({1, n}));  // a (1, n) draw broadcast over 4 rows: counter 5
    auto va = a.to_vector<float>(), vb = b.to_vector<float>(), vc = c.to_vector<float>(), vd = d.to_vector<float>(),
         ve = e.to_vector<float>();
    int bad = 0;
    bool order34 = std::fabs((double)vd[0] - ((double)expect(3, 0) - 4.0 * expect(4, 0))) < 1e-6;
    for (int64_t i = 0; i < n; ++i) {
        bad += va[i] != expect(0, i);
        bad += vb[i] != expect(1, i);
        bad += !(va[i] >= 0 && va[i] < 1);
        bad += std::fabs((double)vc[i] - 3.0 * expect(2, i)) > 1e-6;
        double dd = order34 ? (double)expect(3, i) - 4.0 * expect(4, i) : (double)expect(4, i) - 4.0 * expect(3, i);
        bad += std::fabs((double)vd[i] - dd) > 1e-5;
        for (int row = 0; row < 4; ++row) bad += ve[row * n + i] != expect(5, i);
    }
    INFO("first values: " << va[0] << " " << vb[0] << " " << vc[0] << " " << vd[0] << " " << ve[0]);
    CHECK(bad == 0);
    // seed() restarts the stream
    ctx.seed(s);
    Tensor a2 = ctx.empty({n});
    a2.assign(kiln::rand({n}));
    CHECK(a2.to_vector<float>() == va);
}

TEST_CASE("rand: a rank-0 rand() draws per element of what it is combined into (the seeds' A[:] = ng.rand())") {
    if (!test_device_usable()) return;
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    const uint64_t s = 42;
    const uint32_t seed32 = (uint32_t)(s ^ (s >> 32));
    ctx.seed(s);
    const int64_t rows = 5, cols = 33;
    Tensor a = ctx.empty({rows, cols}), b = ctx.empty({rows, cols}), one = ctx.empty({rows, cols});
    a.assign(kiln::rand({}));                                  // counter 0, per element of a
    Tensor x = ctx.full({rows, cols}, 2.0, DType::Float32);
    b.assign(kiln::rand({}) * x + 1.0);                        // counter 1, per element of the product
    one.assign(kiln::rand({1}) + 0.0 * x);                     // counter 2: an explicit (1,) draw stays one value
    auto va = a.to_vector<float>(), vb = b.to_vector<float>(), vo = one.to_vector<float>();
    int bad = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
        bad += va[i] != kiln::philox_uniform(seed32, 0, (uint32_t)i);
        bad += std::fabs((double)vb[i] - (2.0 * kiln::philox_uniform(seed32, 1, (uint32_t)i) + 1.0)) > 1e-6;
        bad += vo[i] != kiln::philox_uniform(seed32, 2, 0);
    }
    CHECK(bad == 0);
    std::set<float> distinct(va.begin(), va.end());
    CHECK(distinct.size() > (size_t)(rows * cols * 9 / 10));
    // Inside a reduction it draws per reduced element: the row means of rand() approach 1/2.
    Tensor big = ctx.empty({4, 4096}), m = ctx.empty({4, 1});
    big.assign(0.0);
    m.assign(kiln::mean(big + kiln::rand({}), 1));
    for (float v : m.to_vector<float>()) CHECK(std::fabs(v - 0.5f) < 0.03f);
}

TEST_CASE("reductions: a negative axis counts from the end, -1 included") {
    if (!test_device_usable()) return;
    // NumPy: np.sum(A, axis=-1) reduces the last axis. kiln::all_axes is the marker for all axes
    // and must not swallow axis -1.
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    Tensor A = ctx.array(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    Expr last = kiln::sum(A, -1, false);
    CHECK(last.shape() == Shape{2});
    Expr kept = kiln::max(A, -1);
    CHECK(kept.shape() == Shape{2, 1});
    CHECK(kiln::argmax(A, -1, false).shape() == Shape{2});
    if (last.shape() == Shape{2}) {
        Tensor out = ctx.empty({2});
        out.assign(last);
        CHECK(out.to_vector<float>() == std::vector<float>{6, 15});
    }
    CHECK(kiln::sum(A, -2, false).shape() == Shape{3});
}

TEST_CASE("in-place: a gather from the destination reads the values from before the assignment") {
    if (!test_device_usable()) return;
    // A = take(A, reversed): every element must come from the old A, as in NumPy (A[:] = A[idx]).
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    const int64_t n = 64;
    std::vector<float> h(n);
    std::vector<int32_t> rev(n);
    for (int64_t i = 0; i < n; ++i) { h[i] = (float)i; rev[i] = (int32_t)(n - 1 - i); }
    Tensor A = ctx.array(h, {n});
    Tensor idx = ctx.array(rev, {n});
    A.assign(kiln::take(A, idx));
    auto v = A.to_vector<float>();
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += v[i] != (float)(n - 1 - i);
    INFO("A[n-1] = " << v[n - 1] << " (expected 0)");
    CHECK(bad == 0);
}

TEST_CASE("iota: a size-1 axis broadcast over a larger result stays 0") {
    if (!test_device_usable()) return;
    // iota(shape, axis) holds the coordinate along `axis` of its own shape; broadcasting a
    // size-1 axis repeats that 0 (NumPy: np.zeros((1,3)) + np.zeros((2,3)) broadcasts values).
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    Tensor out = ctx.empty({2, 3}, DType::Int32);
    out.assign(kiln::iota({1, 3}, 0) + ctx.zeros({2, 3}, DType::Int32));
    CHECK(out.to_vector<int32_t>() == std::vector<int32_t>{0, 0, 0, 0, 0, 0});
    out.assign(kiln::iota({1, 3}, 1) + ctx.zeros({2, 3}, DType::Int32));
    CHECK(out.to_vector<int32_t>() == std::vector<int32_t>{0, 1, 2, 0, 1, 2});
}

TEST_CASE("legality: what lies under a reduction computed in a stage of its own is legalised too") {
    if (!test_device_usable()) return;
    // A reduction that cannot fuse into its consumer gets its own stage; the reductions and
    // reshapes inside it must then be split or materialised by the same rules, as they would be
    // at the top of an assignment.
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    Tensor A = ctx.array(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    std::vector<float> hb(20);
    for (int i = 0; i < 20; ++i) hb[i] = (float)(i % 5) - 1;  // four equal rows: B - mean(B, 0) == 0
    Tensor B = ctx.array(hb, {4, 5});
    // a full reduction holding a column reduction, added to a column reduction of another shape
    Tensor c1 = ctx.empty({1, 3});
    c1.assign(kiln::sum(A, 0) + kiln::max(Expr(B) - kiln::mean(B, 0)));
    CHECK(c1.to_vector<float>() == std::vector<float>{5, 7, 9});
    // a row reduction holding a column reduction, broadcast into a larger destination
    Tensor c2 = ctx.empty({2, 6});
    c2.assign(kiln::sum(Expr(A) - kiln::sum(A, 0), 1));
    CHECK(c2.to_vector<float>() == std::vector<float>{-15, -15, -15, -15, -15, -15, -6, -6, -6, -6, -6, -6});
    // a reshape of a computed expression under a reduction in its own stage
    Tensor c3 = ctx.empty({1, 3});
    std::string err;
    try {
        c3.assign(kiln::sum(A, 0) + kiln::min(kiln::reshape(kiln::exp(B), {20}), 0));
    } catch (const std::exception& e) {
        err = e.what();
    }
    INFO(err);
    REQUIRE(err.empty());
    auto v3 = c3.to_vector<float>();
    const double e_1 = std::exp(-1.0);
    CHECK(std::fabs(v3[0] - (5 + e_1)) < 1e-5);
    CHECK(std::fabs(v3[1] - (7 + e_1)) < 1e-5);
    CHECK(std::fabs(v3[2] - (9 + e_1)) < 1e-5);
}

TEST_CASE("constant folding: nested constant subexpressions fold to their values") {
    if (!test_device_usable()) return;
    // canonicalise folds an op whose operands are all literals; when an operand was itself
    // folded in the same pass, the folded value must be used.
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    Tensor A = ctx.array(std::vector<float>{1, 2}, {2});
    Tensor c = ctx.empty({2});
    c.assign(Expr(A) + kiln::exp(kiln::scalar(1, DType::Float32) + kiln::scalar(1, DType::Float32)));
    auto v = c.to_vector<float>();
    CHECK(std::fabs(v[0] - (1 + std::exp(2.0))) < 1e-5);
    c.assign(Expr(A) * kiln::clip(kiln::cast(kiln::scalar(4, DType::UInt8), DType::BFloat16), -1.25, 1.25));
    CHECK(c.to_vector<float>() == std::vector<float>{1.25f, 2.5f});
    Tensor u = ctx.empty({}, DType::UInt8);
    u.assign(kiln::scalar(0, DType::Int32) - kiln::scalar(1.5, DType::BFloat16));  // -1.5 -> -1 -> wraps to 255
    CHECK(u.to_vector<uint8_t>() == std::vector<uint8_t>{255});
}

TEST_CASE("differential: random expression graphs against a float64 reference") {
    if (!test_device_usable()) return;
    Env env = read_env();
    // The graphs run in a child process: a crash (a kiln bug) then fails that one graph, which is
    // reported with its seed, and a new child carries on with the next graph instead of the whole
    // run dying. The counters live in shared memory. KILN_FUZZ_FORK=0, or a replayed seed, runs
    // in this process (for a debugger).
    void* mem = mmap(nullptr, sizeof(Totals), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    Totals& tot = *new (mem) Totals{};
    tot.current = -1;
    auto t0 = std::chrono::steady_clock::now();
    if (env.seed || !env.fork) {
        run_graphs(tot, env, env.count);
    } else {
        while (tot.next < env.count) {
            std::fflush(stdout);
            std::fflush(stderr);
            pid_t pid = fork();
            REQUIRE(pid >= 0);
            if (pid == 0) {
                for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, SIG_DFL);
                int rc = 0;
                try {
                    run_graphs(tot, env, env.count);
                } catch (const std::exception& e) {
                    std::printf("differential: unexpected exception: %s\n", e.what());
                    rc = 3;
                } catch (...) {
                    rc = 3;
                }
                std::fflush(stdout);
                std::fflush(stderr);
                _exit(rc);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;
            ++tot.crashed;
            ++tot.failed;
            std::string how = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                                  : "exit status " + std::to_string(WEXITSTATUS(status));
            if (tot.current >= 0) {
                ++tot.graphs;
                uint64_t seed = graph_seed(tot.current);
                std::printf("FAILED graph seed %llu CRASHED the process (%s); replay with KILN_FUZZ_SEED=%llu "
                            "KILN_FUZZ_VERBOSE=1 to see the expression\n\n",
                            (unsigned long long)seed, how.c_str(), (unsigned long long)seed);
                tot.current = -1;
            } else {
                std::printf("FAILED: the graph runner crashed outside a graph (%s)\n\n", how.c_str());
                break;
            }
        }
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("differential: %lld failed (%lld crashed)\n", (long long)tot.failed, (long long)tot.crashed);
    std::printf("differential: %lld elements compared, %lld skipped as unstable (a discontinuity within the error bound), "
                "%lld NaN positions checked\n",
                (long long)tot.elements, (long long)tot.skipped, (long long)tot.nan_checked);
    std::printf("differential: kinds:");
    for (int k = 0; k < 6; ++k) std::printf(" %s %lld%s", kind_name((Kind)k), (long long)tot.by_kind[k], k < 5 ? "," : "\n");
    std::printf("differential: %lld with reductions, %lld with rand, %lld strided destinations, %lld cast on store, "
                "%lld broadcast on store\n",
                (long long)tot.with_reduction, (long long)tot.rand_graphs, (long long)tot.strided_dst,
                (long long)tot.cast_dst, (long long)tot.broadcast_dst);
    if (tot.nvrtc_over_cap)
        std::printf("differential: %lld distinct kernel keys; %lld over KILN_FUZZ_NVRTC_MAX=%lld not compiled by NVRTC\n",
                    (long long)tot.distinct_kernels, (long long)tot.nvrtc_over_cap, (long long)env.nvrtc_max);
    std::printf("differential: %.1f s (%s JIT: %lld kernels compiled in %.1f s; NVRTC checks: %.1f s on a worker thread)\n",
                secs, test_device().c_str(), (long long)tot.jit_compiles, tot.jit_ms / 1000, tot.nvrtc_ms / 1000);
    std::string cov = "differential: coverage (nodes):";
    std::vector<std::string> missing;
    for (int o = 0; o < kNumOps; ++o) {
        cov += std::string(" ") + op_name((Op)o) + " " + std::to_string(tot.op_count[o]);
        if (tot.op_count[o] == 0) missing.push_back(op_name((Op)o));
    }
    const char* composite_names[4] = {"clip", "mean", "var", "std"};
    for (int i = 0; i < 4; ++i) {
        cov += std::string(" ") + composite_names[i] + " " + std::to_string(tot.composite[i]);
        if (tot.composite[i] == 0) missing.push_back(composite_names[i]);
    }
    cov += "\ndifferential: coverage (dtypes):";
    for (int t = 0; t < 7; ++t) {
        cov += std::string(" ") + dname((DType)t) + " " + std::to_string(tot.dtype_count[t]);
        if (tot.dtype_count[t] == 0) missing.push_back(dname((DType)t));
    }
    cov += "; ranks:";
    for (int r = 0; r < 5; ++r) {
        cov += " " + std::to_string(r) + ":" + std::to_string(tot.rank_count[r]);
        if (tot.rank_count[r] == 0) missing.push_back("rank " + std::to_string(r));
    }
    cov += "; weak float " + std::to_string(tot.weak_float) + ", weak int " + std::to_string(tot.weak_int) +
           ", typed scalars " + std::to_string(tot.typed_scalar) + ", strided/transposed leaves " +
           std::to_string(tot.strided_leaves) + ", keepdims=false " + std::to_string(tot.keepdims_false) +
           ", all axes " + std::to_string(tot.all_axes);
    for (auto [n, name] : {std::pair{tot.weak_float, "weak float"}, {tot.weak_int, "weak int"}, {tot.typed_scalar, "typed scalar"},
                           {tot.strided_leaves, "strided leaf"}, {tot.keepdims_false, "keepdims=false"}, {tot.all_axes, "all axes"}})
        if (n == 0) missing.push_back(name);
    std::printf("%s\n", cov.c_str());
    // The last two lines, in this form, are what CI logs are searched for.
    std::printf("differential: %lld graphs checked\n", (long long)tot.graphs);
#ifdef KILN_DIFF_NVRTC
    std::printf("differential: %lld distinct CUDA kernels compiled for sm_80 and sm_90\n", (long long)tot.nvrtc_compiled);
#else
    std::printf("differential: 0 distinct CUDA kernels compiled for sm_80 and sm_90 (this build has no NVRTC)\n");
#endif
    std::fflush(stdout);
    Totals result = tot;
    munmap(mem, sizeof(Totals));
    if (!env.seed && result.graphs >= 1000) {
        // A full run must exercise everything the generator is meant to cover.
        std::string m;
        for (auto& x : missing) m += " " + x;
        INFO("never generated:" << m);
        CHECK(missing.empty());
    }
    INFO("failing graphs are printed above with their seeds; KILN_FUZZ_SEED=<seed> replays one");
    CHECK(result.nvrtc_failed == 0);
    CHECK(result.failed == 0);
#if defined(KILN_HAVE_NVRTC) && !defined(KILN_DIFF_NVRTC)
    FAIL("NVRTC is part of this build but codegen/cuda/cuda_codegen.hpp or runtime/cuda/nvrtc.hpp is missing: the "
         "generated CUDA C cannot be checked");
#endif
}
