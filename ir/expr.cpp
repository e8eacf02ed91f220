#include "ir/node.hpp"

#include "ir/error.hpp"
#include "ir/view_ops.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <optional>

namespace kiln {

namespace {

int kind_rank(DType t) { return t == DType::Bool ? 0 : is_float(t) ? 2 : 1; }

const Node& N(const Expr& e) {
    if (!e.valid()) throw Error("an empty (default-constructed) kiln::Expr was used as an operand");
    return *e.node();
}

std::string describe(const Expr& e) {
    return fmt::format("{} {}", dtype_name(e.dtype()), shape_str(e.shape()));
}

Expr make(OpKind op, DType dtype, Shape shape, std::vector<NodePtr> inputs, int axis = kAllAxes) {
    Node n;
    n.op = op;
    n.dtype = dtype;
    n.shape = std::move(shape);
    n.inputs = std::move(inputs);
    n.axis = axis;
    return Expr(intern(std::move(n)));
}

// An integer dtype's scalar holds its value exactly in `ivalue`; one made from a double is that
// double truncated (0 where it is beyond int64, which the range checks then refuse).
int64_t exact_int(double v) {
    if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0)) return 0;
    return (int64_t)v;
}

Expr make_scalar(double v, DType t, bool weak) {
    Node n;
    n.op = OpKind::Scalar;
    n.dtype = t;
    n.value = v;
    if (!is_float(t))   // (uint64 from 2^63 on: its bits)
        n.ivalue = t == DType::UInt64 && v >= 9223372036854775808.0 && v < 18446744073709551616.0
                       ? (int64_t)(uint64_t)v
                       : exact_int(v);
    n.weak = weak;
    return Expr(intern(std::move(n)));
}

// (For uint64, v holds the value's bits.)
Expr make_int_scalar(int64_t v, DType t, bool weak) {
    Node n;
    n.op = OpKind::Scalar;
    n.dtype = t;
    n.value = t == DType::UInt64 ? (double)(uint64_t)v : (double)v;
    n.ivalue = v;
    n.weak = weak;
    return Expr(intern(std::move(n)));
}

bool is_weak(const Expr& e) { return N(e).op == OpKind::Scalar && N(e).weak; }

// NumPy's float result for a transcendental function of `t`: floats keep their type, 8-bit
// integers and bool give float16, 16-bit integers float32, int64, uint32 and uint64 float64; int32
// gives float32 (NumPy: float64; kiln keeps 32-bit arithmetic 32-bit).
DType float_result(DType t) {
    if (is_float(t)) return t;
    if (is_wide(t)) return DType::Float64;
    return dtype_size(t) >= 2 ? DType::Float32 : DType::Float16;
}

// The dtype a sum or product of integers accumulates in: int32, kiln's default integer, for the
// narrower ones and bool; int64, uint32 and uint64 keep theirs (wrapping at their width).
DType accumulated(DType t) { return is_float(t) || is_wide(t) ? t : DType::Int32; }

Expr unary(OpKind op, const Expr& a, DType result) { return make(op, result, N(a).shape, {a.node()}); }

// A literal as written: integral values without a fraction or exponent.
std::string literal_str(double v) {
    if (std::isfinite(v) && v == std::trunc(v)) return fmt::format("{:.0f}", v);
    return fmt::format("{}", v);
}

// The values of an integer dtype.
std::pair<double, double> int_range(DType t) {
    switch (t) {
    case DType::Int8: return {-128, 127};
    case DType::UInt8: return {0, 255};
    case DType::Int16: return {-32768, 32767};
    case DType::UInt16: return {0, 65535};
    case DType::UInt32: return {0, 4294967295.0};
    case DType::UInt64: return {0, 18446744073709549568.0};   // (the last double below 2^64)
    case DType::Int64: return {-9223372036854775808.0, 9223372036854774784.0};   // (the last double below 2^63)
    default: return {-2147483648.0, 2147483647.0};
    }
}

// "lo to hi" for an integer dtype, as integers.
std::string range_str(DType t) {
    if (t == DType::Int64) return "-9223372036854775808 to 9223372036854775807";
    if (t == DType::UInt64) return "0 to 18446744073709551615";
    const auto [lo, hi] = int_range(t);
    return fmt::format("{} to {}", literal_str(lo), literal_str(hi));
}

bool is_weak_int(const Expr& e) { return is_weak(e) && N(e).dtype == DType::Int32; }
bool fits_int32(double v) {
    const auto [lo, hi] = int_range(DType::Int32);
    return v >= lo && v <= hi;
}

// NumPy 2 (NEP 50): a Python integer that does not fit the operands' integer dtype is an
// error, not a silent wrap-around. Two Python integers compute in int32, kiln's default
// integer; NumPy would use int64.
// Whether an integer scalar's value is one of t's (exactly, for the 64-bit integers: its integer
// value holds the low 64 bits of the literal, which its double must agree with).
bool int_fits(const Node& lit, DType t) {
    const double v = lit.value;
    if (t == DType::Int64) return v >= -9223372036854775808.0 && v <= 9223372036854775808.0 && (double)lit.ivalue == v;
    if (t == DType::UInt64) return v >= 0 && v <= 18446744073709551616.0 && (double)(uint64_t)lit.ivalue == v;
    const auto [lo, hi] = int_range(t);
    return v >= lo && v <= hi;
}

void check_weak_int_fits(OpKind op, const Expr& lit, const Expr& other, DType common) {
    const double v = N(lit).value;
    if (int_fits(N(lit), common)) return;
    if (is_weak(other))
        fail(Error::Kind::Value,
             "{}: the integer literal {} is outside int32 (-2147483648 to 2147483647), the dtype two integer literals "
             "compute in (kiln's default integer); write one of them as a float (e.g. {}.0) or give an int64 tensor operand",
             opkind_name(op), literal_str(v), literal_str(v));
    fail(Error::Kind::Value,
         "{}: the integer literal {} is out of range for {} (the dtype of the other operand, {}; valid: {}); "
         "cast the tensor to a wider dtype or pass a typed scalar",
         opkind_name(op), literal_str(v), dtype_name(common), describe(other), range_str(common));
}

// A weak literal meeting an operand of dtype `common` (NumPy 2): an integer literal with a
// float operand is that float value (2**31 stays 2147483648.0, not a wrapped int32), and with
// an integer operand must fit its dtype. Comparisons are exempt (they compare true values).
// A literal meeting a 64-bit operand (float64, int64, uint32, uint64) takes its dtype, so that the
// kernel reads it as a 64-bit parameter: 0.1 * x in float64 multiplies by the double 0.1.
Expr adopt_weak(OpKind op, const Expr& lit, const Expr& other, DType common) {
    if (!is_weak(lit)) return lit;
    if (!is_weak_int(lit)) return common == DType::Float64 ? make_scalar(N(lit).value, common, true) : lit;
    if (is_float(common)) return make_scalar(N(lit).value, common == DType::Float64 ? common : DType::Float32, true);
    if (!is_comparison(op)) check_weak_int_fits(op, lit, other, common);
    if (compute_type(common) == ComputeType::I64) return make_int_scalar(N(lit).ivalue, common, true);
    return lit;
}

// An integer compared with a Python integer beyond the range its values are computed in (int32,
// int64 for int64 and uint32, uint64's own): every value lies on one side of it, so the
// comparison is one against that range's bound that is always true or always false, as NumPy 2
// compares true values.
std::optional<Expr> compare_beyond_range(OpKind op, const Expr& a, const Expr& b, DType common) {
    const bool u64 = common == DType::UInt64, wide = compute_type(common) == ComputeType::I64;
    auto fits = [&](const Node& n) {
        return u64 ? int_fits(n, DType::UInt64) : wide ? int_fits(n, DType::Int64) : fits_int32(n.value);
    };
    bool la = is_weak_int(a) && !fits(N(a)), lb = is_weak_int(b) && !fits(N(b));
    if (!la && !lb) return std::nullopt;
    if (la && lb) {  // two literals: the result is known (exactly, where both are within int64)
        auto cmp = [&](auto x, auto y) {
            return op == OpKind::Eq ? x == y : op == OpKind::Ne ? x != y : op == OpKind::Lt ? x < y
                 : op == OpKind::Le ? x <= y : op == OpKind::Gt ? x > y : x >= y;
        };
        const bool exact = int_fits(N(a), DType::Int64) && int_fits(N(b), DType::Int64);
        const bool r = exact ? cmp(N(a).ivalue, N(b).ivalue) : cmp(N(a).value, N(b).value);
        return make_scalar(r ? 1 : 0, DType::Bool, false);
    }
    // As `x op literal`, the literal on the right.
    const Expr& x = la ? b : a;
    const double lit = N(la ? a : b).value;
    if (la) op = op == OpKind::Lt ? OpKind::Gt : op == OpKind::Gt ? OpKind::Lt : op == OpKind::Le ? OpKind::Ge
               : op == OpKind::Ge ? OpKind::Le : op;
    const bool above = lit > 0;
    const bool holds = above ? (op == OpKind::Lt || op == OpKind::Le || op == OpKind::Ne)
                             : (op == OpKind::Gt || op == OpKind::Ge || op == OpKind::Ne);
    Expr bound = u64    ? make_int_scalar(above ? -1 : 0, DType::UInt64, true)
                 : wide ? make_int_scalar(above ? INT64_MAX : INT64_MIN, DType::Int64, true)
                        : make_scalar(above ? 2147483647.0 : -2147483648.0, DType::Int32, true);
    OpKind k = above ? (holds ? OpKind::Le : OpKind::Gt) : (holds ? OpKind::Ge : OpKind::Lt);
    return make(k, DType::Bool, N(x).shape, {x.node(), bound.node()});
}

Expr binary(OpKind op, const Expr& a_in, const Expr& b_in, DType result) {
    const DType common = result_type(a_in, b_in);
    Shape s = broadcast_shapes(N(a_in).shape, N(b_in).shape, opkind_name(op));
    if (is_comparison(op) && !is_float(common))
        if (auto r = compare_beyond_range(op, a_in, b_in, common)) return *r;
    Expr a = adopt_weak(op, a_in, b_in, common), b = adopt_weak(op, b_in, a_in, common);
    return make(op, result, std::move(s), {a.node(), b.node()});
}

void reject_bool(const char* op, const Expr& a, const char* instead) {
    if (N(a).dtype == DType::Bool)
        fail(Error::Kind::Type, "{}: not supported for bool operands (got {}); {}", op, describe(a), instead);
}

std::atomic<uint64_t> g_rand_serial{1};

} // namespace

Expr::Expr(double v) : node_(make_scalar(v, DType::Float32, true).node()) {}
Expr::Expr(float v) : node_(make_scalar(v, DType::Float32, true).node()) {}
Expr::Expr(int v) : node_(make_scalar(v, DType::Int32, true).node()) {}
Expr::Expr(int64_t v) : node_(make_int_scalar(v, DType::Int32, true).node()) {}
// A Python int beyond int64 may round to -2^63 as a double: int_literal's value is taken as such
// (its integer value 0, not -2^63, so that an int64 operand refuses it).
Expr int_literal(double v) {
    Expr e = make_scalar(std::trunc(v), DType::Int32, true);
    if (std::trunc(v) > -9223372036854775808.0) return e;
    Node n = *e.node();
    n.ivalue = 0;
    return Expr(intern(std::move(n)));
}

Expr uint_literal(uint64_t v) {
    Node n = *make_int_scalar((int64_t)v, DType::Int32, true).node();
    n.value = (double)v;
    return Expr(intern(std::move(n)));
}

std::string Expr::str() const { return graph_str(node_); }
size_t Expr::node_count() const { return node_ ? postorder(node_).size() : 0; }
DType Expr::dtype() const { return N(*this).dtype; }
const Shape& Expr::shape() const { return N(*this).shape; }

DType result_type(const Expr& a, const Expr& b) {
    DType ta = N(a).dtype, tb = N(b).dtype;
    bool wa = is_weak(a), wb = is_weak(b);
    if (wa && wb) return kind_rank(ta) >= kind_rank(tb) ? ta : tb;
    if (wa) return kind_rank(ta) > kind_rank(tb) ? ta : tb;
    if (wb) return kind_rank(tb) > kind_rank(ta) ? tb : ta;
    return promote(ta, tb);
}

// ---- leaves

Expr leaf(const View& v) {
    if (!v.storage) throw Error("tensor: the view has no storage (an empty kiln::Tensor was used)");
    if (v.strides.size() != v.shape.size())
        throw InternalError(fmt::format("leaf: {} strides for shape {}", v.strides.size(), shape_str(v.shape)));
    Node n;
    n.op = OpKind::Leaf;
    n.dtype = v.dtype;
    n.shape = v.shape;
    n.view = v;
    return Expr(intern(std::move(n)));
}

Expr scalar(double v, DType dtype) {
    check_literal_fits(v, dtype, "scalar");
    return make_scalar(v, dtype, false);
}

Expr int_scalar(int64_t v, DType dtype) {
    if (is_float(dtype)) return make_scalar((double)v, dtype, false);
    Expr e = make_int_scalar(v, dtype, false);
    if (!int_fits(N(e), dtype)) {
        fail(Error::Kind::Value, "scalar: the value {} is out of range for {} (valid: {})", v, dtype_name(dtype),
             range_str(dtype));
    }
    return e;
}

void check_literal_fits(double v, DType dtype, const char* op) {
    if (!is_integer(dtype)) return;
    const auto [lo, hi] = int_range(dtype);
    if (!(v >= lo && v <= hi))
        fail(Error::Kind::Value, "{}: the value {} is out of range for {} (valid: {})", op, literal_str(v),
             dtype_name(dtype), range_str(dtype));
}

void check_literal_fits(const Expr& literal, DType dtype, const char* op) {
    const Node& n = N(literal);
    if (dtype != DType::Int64 && dtype != DType::UInt64) return check_literal_fits(n.value, dtype, op);
    if (!int_fits(n, dtype))
        fail(Error::Kind::Value, "{}: the integer literal {} is out of range for {} (valid: {})", op, literal_str(n.value),
             dtype_name(dtype), range_str(dtype));
}

Expr rand(const Shape& shape) {
    check_shape(shape, "rand");
    Node n;
    n.op = OpKind::Rand;
    n.dtype = DType::Float32;
    n.shape = shape;
    n.serial = g_rand_serial++;
    return Expr(intern(std::move(n)));
}

Expr iota(const Shape& shape, int axis) {
    axis = normalize_axis(axis, (int)shape.size(), "iota");
    return make(OpKind::Iota, DType::Int32, shape, {}, axis);
}

// ---- elementwise (kiln/elementwise.def, kiln/math_functions.def)

namespace {

// The result dtype of a one-operand op under its rule, or the error its rule gives.
DType unary_result(OpKind op, const Expr& a) {
    const OpKindInfo& info = opkind_info(op);
    const DType t = N(a).dtype;
    switch (info.rule) {
    case DTypeRule::Same: return t;
    case DTypeRule::NotBool: reject_bool(info.name, a, info.hint); return t;
    case DTypeRule::Float: return float_result(t);
    case DTypeRule::Square: return t == DType::Bool ? DType::Int8 : t;   // NumPy's square has no bool loop
    case DTypeRule::Bool: return DType::Bool;
    case DTypeRule::Integral:
        if (is_float(t)) fail(Error::Kind::Type, "{}: float operands are not supported (got {}); {}", info.name, describe(a), info.hint);
        return t;
    case DTypeRule::None: case DTypeRule::Promote: case DTypeRule::PromoteNotBool: case DTypeRule::FloatPromote:
    case DTypeRule::Division: case DTypeRule::FloatOnly: case DTypeRule::Compare: case DTypeRule::Shift: break;
    }
    throw InternalError(fmt::format("{}: no one-operand dtype rule", info.name));
}

// The same for two operands, promoted as NumPy does (result_type).
DType binary_result(OpKind op, const Expr& a, const Expr& b) {
    const OpKindInfo& info = opkind_info(op);
    const DType t = result_type(a, b);
    switch (info.rule) {
    case DTypeRule::Promote: return t;
    case DTypeRule::PromoteNotBool:
        if (t == DType::Bool)
            fail(Error::Kind::Type, "{}: not supported for two bool operands ({} and {}); {}", info.name, describe(a),
                 describe(b), info.hint);
        return t;
    case DTypeRule::FloatPromote: return is_float(t) ? t : is_wide(t) ? DType::Float64 : DType::Float32;
    // The division family: quotients and remainders of 0/1 values are not bools (NumPy: int8).
    case DTypeRule::Division: return t == DType::Bool ? DType::Int8 : t;
    case DTypeRule::FloatOnly:
        if (!is_float(t))
            fail(Error::Kind::Type, "{}: integer and bool operands are not supported ({} and {}); {}", info.name,
                 describe(a), describe(b), info.hint);
        if (op == OpKind::NextAfter && dtype_size(t) == 2)
            fail(Error::Kind::Type, "{}: {} and {}: nextafter steps float32 and float64 values, not 16-bit ones (cast "
                 "to float32, or step the 16-bit pattern yourself)", info.name, describe(a), describe(b));
        return t;
    case DTypeRule::Compare: return DType::Bool;
    case DTypeRule::Integral: case DTypeRule::Shift:
        if (is_float(t))
            fail(Error::Kind::Type, "{}: float operands are not supported ({} and {}); {}", info.name, describe(a),
                 describe(b), info.hint);
        return info.rule == DTypeRule::Shift && t == DType::Bool ? DType::Int8 : t;
    case DTypeRule::Float: return float_result(t);   // kiln/math_functions.def's functions of two
    case DTypeRule::None: case DTypeRule::Same: case DTypeRule::NotBool: case DTypeRule::Square:
    case DTypeRule::Bool: break;
    }
    throw InternalError(fmt::format("{}: no two-operand dtype rule", info.name));
}

// floor, ceil and trunc of integers and bools are the operand itself, in its dtype (NumPy 2,
// the Array API).
bool integral_identity(OpKind op, const Expr& a) {
    return (op == OpKind::Floor || op == OpKind::Ceil || op == OpKind::Trunc) && !is_float(N(a).dtype);
}

} // namespace

#define KILN_UNARY(K, name, rule, fold, hint) \
    Expr name(const Expr& a) { return integral_identity(OpKind::K, a) ? a : unary(OpKind::K, a, unary_result(OpKind::K, a)); }
#define KILN_BINARY(K, name, rule, commutative, fold, hint) \
    Expr name(const Expr& a, const Expr& b) { return binary(OpKind::K, a, b, binary_result(OpKind::K, a, b)); }
#include <kiln/elementwise.def>
#undef KILN_BINARY
#undef KILN_UNARY
#define KILN_MATH(K, name, c_function, host) \
    Expr name(const Expr& a) { return integral_identity(OpKind::K, a) ? a : unary(OpKind::K, a, unary_result(OpKind::K, a)); }
#define KILN_MATH2(K, name, c_function, host) \
    Expr name(const Expr& a, const Expr& b) { return binary(OpKind::K, a, b, binary_result(OpKind::K, a, b)); }
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH

Expr cast(const Expr& a, DType to) {
    if (N(a).dtype == to) return a;
    // An integer scalar converted to a 64-bit integer keeps its exact value (a Python int past
    // int32 is an int32 literal until it meets its dtype): a Python int must be one of int64's
    // (one of uint64's for uint64); uint32 wraps, as the kernel would, and so does a typed scalar
    // into any of them (its bits: an int32 -1 is uint64's 2^64 - 1).
    const Node& n = N(a);
    if (n.op == OpKind::Scalar && !is_float(n.dtype) && compute_type(to) == ComputeType::I64) {
        const DType holder = to == DType::UInt64 ? to : DType::Int64;
        if (n.weak && !int_fits(n, holder))
            fail(Error::Kind::Value, "cast: the integer literal {} is out of range for {} ({})", literal_str(n.value),
                 dtype_name(holder), range_str(holder));
        return make_int_scalar(to == DType::UInt32 ? (int64_t)(uint32_t)(uint64_t)n.ivalue : n.ivalue, to, false);
    }
    return unary(OpKind::Cast, a, to);
}

Expr where(const Expr& cond, const Expr& a_in, const Expr& b_in) {
    Shape s = broadcast_shapes(broadcast_shapes(N(cond).shape, N(a_in).shape, "where"), N(b_in).shape, "where");
    const DType t = result_type(a_in, b_in);
    Expr a = adopt_weak(OpKind::Where, a_in, b_in, t), b = adopt_weak(OpKind::Where, b_in, a_in, t);
    return make(OpKind::Where, t, std::move(s), {cond.node(), a.node(), b.node()});
}

Expr clip(const Expr& a, const Expr& lo, const Expr& hi) { return minimum(maximum(a, lo), hi); }

// ---- reductions

namespace {

Expr squeeze_axis(const Expr& r, int axis, const Shape& in_shape) {
    Shape out;
    for (int i = 0; i < (int)in_shape.size(); ++i)
        if (axis != kAllAxes && i != axis) out.push_back(in_shape[i]);
    return reshape(r, out);
}

Expr reduce(OpKind op, const Expr& a, int axis, bool keepdims) {
    const Node& n = N(a);
    const char* name = opkind_name(op);
    if (axis != kAllAxes) {
        if (n.rank() == 0)
            fail(Error::Kind::Index, "{}: axis {} given for a 0-d (scalar) operand; only axis=all is valid", name, axis);
        axis = normalize_axis(axis, n.rank(), name);
    }
    int64_t count = axis == kAllAxes ? n.size() : n.shape[axis];
    // A sum and a product have identities (0 and 1); the extremes and their positions do not.
    const bool accumulates = op == OpKind::Sum || op == OpKind::Prod;
    if (count == 0 && !accumulates)
        fail(Error::Kind::Value, "{}: zero-size reduction over {} of {} has no identity; reduce a non-empty axis",
             name, axis == kAllAxes ? std::string("all axes") : fmt::format("axis {}", axis), describe(a));
    if ((op == OpKind::ArgMax || op == OpKind::ArgMin) && count > INT32_MAX)
        fail(Error::Kind::Value, "{}: {} elements over {} of {}; positions are int32, so at most 2^31 - 1 ({}) elements a reduction",
             name, count, axis == kAllAxes ? std::string("all axes") : fmt::format("axis {}", axis), describe(a), INT32_MAX);
    if (n.rank() == 0) {  // nothing to reduce: NumPy returns the value (argmax/argmin: index 0)
        if (op == OpKind::ArgMax || op == OpKind::ArgMin) return scalar(0, DType::Int32);
        return cast(a, accumulates ? accumulated(n.dtype) : n.dtype);
    }
    Shape kept = n.shape;
    for (int i = 0; i < n.rank(); ++i)
        if (axis == kAllAxes || i == axis) kept[i] = 1;
    DType t = n.dtype;
    if (accumulates) t = accumulated(t);
    if (op == OpKind::ArgMax || op == OpKind::ArgMin) t = DType::Int32;
    Expr r = make(op, t, kept, {a.node()}, axis);
    return keepdims ? r : squeeze_axis(r, axis, n.shape);
}

int64_t reduced_count(const Expr& a, int axis) {
    if (axis == kAllAxes) return a.size();
    if (a.rank() == 0) return 1;
    return a.shape()[normalize_axis(axis, a.rank(), "mean")];
}

} // namespace

Expr sum(const Expr& a, int axis, bool keepdims) { return reduce(OpKind::Sum, a, axis, keepdims); }
Expr max(const Expr& a, int axis, bool keepdims) { return reduce(OpKind::Max, a, axis, keepdims); }
Expr min(const Expr& a, int axis, bool keepdims) { return reduce(OpKind::Min, a, axis, keepdims); }
Expr argmax(const Expr& a, int axis, bool keepdims) { return reduce(OpKind::ArgMax, a, axis, keepdims); }
Expr argmin(const Expr& a, int axis, bool keepdims) { return reduce(OpKind::ArgMin, a, axis, keepdims); }
Expr prod(const Expr& a, int axis, bool keepdims) { return reduce(OpKind::Prod, a, axis, keepdims); }

Expr mean(const Expr& a, int axis, bool keepdims) {
    // Integers are summed as float32: NumPy's float64 mean never overflows, an int32 sum would.
    Expr x = is_float(a.dtype()) ? a : cast(a, is_wide(a.dtype()) ? DType::Float64 : DType::Float32);
    Expr s = sum(x, axis, keepdims);
    int64_t count = reduced_count(a, axis);
    return s * Expr(1.0 / (double)count);
}

Expr var(const Expr& a, int axis, bool keepdims) {
    Expr x = is_float(a.dtype()) ? a : cast(a, is_wide(a.dtype()) ? DType::Float64 : DType::Float32);
    return mean(square(x - mean(x, axis, true)), axis, keepdims);
}

Expr std(const Expr& a, int axis, bool keepdims) { return sqrt(var(a, axis, keepdims)); }

// ---- shape and data movement

Expr reshape(const Expr& a, const Shape& shape) {
    const Node& n = N(a);
    Shape s = resolve_reshape(n.shape, shape, "reshape");
    if (s == n.shape) return a;
    if (n.op == OpKind::Leaf) {
        if (auto v = reshape_view(n.view, s)) return leaf(*v);
    }
    if (n.op == OpKind::Reshape) return reshape(Expr(n.inputs[0]), s);
    if (n.op == OpKind::Scalar) return a;  // rank-0 broadcasts anywhere; keep it a scalar
    return make(OpKind::Reshape, n.dtype, s, {a.node()});
}

Expr expand_dims(const Expr& a, int axis) {
    int r = a.rank();
    axis = normalize_axis(axis, r + 1, "expand_dims");
    Shape s = a.shape();
    s.insert(s.begin() + axis, 1);
    return reshape(a, s);
}

Expr onehot(const Expr& indices, int64_t num_classes, int axis, DType dtype) {
    if (!is_integer(indices.dtype()))
        fail(Error::Kind::Type, "onehot: indices must have an integer dtype (int32, int8, uint8), got {}",
             describe(indices));
    if (num_classes <= 0) fail(Error::Kind::Value, "onehot: num_classes must be positive, got {}", num_classes);
    axis = normalize_axis(axis, indices.rank() + 1, "onehot");
    Shape out = indices.shape();
    out.insert(out.begin() + axis, num_classes);
    Expr hit = equal(expand_dims(indices, axis), iota(out, axis));
    return cast(hit, dtype);
}

Expr take(const Expr& a, const Expr& indices, std::optional<int> axis_opt) {
    if (!is_integer(indices.dtype()))
        fail(Error::Kind::Type, "take: indices must have an integer dtype (int32, int8, uint8), got {}",
             describe(indices));
    Expr src = a;
    int axis = 0;
    if (!axis_opt && N(a).op == OpKind::Scalar) {
        // A literal stays rank 0 when reshaped: as a one-element array, every index (clipped into
        // [0, 1), as take clips) selects it, so the result is the literal over the indices' shape.
        if (indices.rank() == 0) return a;
        return where(greater_equal(iota(indices.shape(), 0), int_scalar(0, DType::Int32)), a, a);
    }
    if (!axis_opt) {
        src = reshape(a, {a.size()});
    } else {
        axis = normalize_axis(*axis_opt, a.rank(), "take");
    }
    if (src.shape()[axis] == 0)
        fail(Error::Kind::Index, "take: cannot take from an empty axis {} of {}", axis, describe(src));
    if (src.shape()[axis] > INT32_MAX)
        fail(Error::Kind::Value, "take: axis {} of {} holds {} elements; take indexes at most 2^31 - 1 ({}) along an axis",
             axis, describe(src), src.shape()[axis], INT32_MAX);
    Shape out(src.shape().begin(), src.shape().begin() + axis);
    out.insert(out.end(), indices.shape().begin(), indices.shape().end());
    out.insert(out.end(), src.shape().begin() + axis + 1, src.shape().end());
    // Indices are reshaped so that they broadcast, right-aligned, over the result.
    Shape idx_shape(axis, 1);
    idx_shape.insert(idx_shape.end(), indices.shape().begin(), indices.shape().end());
    idx_shape.insert(idx_shape.end(), src.rank() - axis - 1, 1);
    Expr idx = reshape(indices, idx_shape);
    return make(OpKind::Take, src.dtype(), out, {src.node(), idx.node()}, axis);
}

// ---- operators

Expr operator+(const Expr& a, const Expr& b) { return add(a, b); }
Expr operator-(const Expr& a, const Expr& b) { return subtract(a, b); }
Expr operator*(const Expr& a, const Expr& b) { return multiply(a, b); }
Expr operator/(const Expr& a, const Expr& b) { return divide(a, b); }
Expr operator%(const Expr& a, const Expr& b) { return remainder(a, b); }
Expr operator-(const Expr& a) { return negative(a); }
Expr operator==(const Expr& a, const Expr& b) { return equal(a, b); }
Expr operator!=(const Expr& a, const Expr& b) { return not_equal(a, b); }
Expr operator<(const Expr& a, const Expr& b) { return less(a, b); }
Expr operator<=(const Expr& a, const Expr& b) { return less_equal(a, b); }
Expr operator>(const Expr& a, const Expr& b) { return greater(a, b); }
Expr operator>=(const Expr& a, const Expr& b) { return greater_equal(a, b); }

} // namespace kiln
