#include "ir/expr.hpp"

#include "ir/error.hpp"
#include "ir/view_ops.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cmath>

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

Expr make_scalar(double v, DType t, bool weak) {
    Node n;
    n.op = OpKind::Scalar;
    n.dtype = t;
    n.value = v;
    n.weak = weak;
    return Expr(intern(std::move(n)));
}

bool is_weak(const Expr& e) { return N(e).op == OpKind::Scalar && N(e).weak; }

// NumPy's float result for a transcendental function of `t`: floats keep their type, small
// integers and bool give float16, int32 gives float32 (NumPy: float64, beyond kiln's dtypes).
DType float_result(DType t) {
    if (is_float(t)) return t;
    return t == DType::Int32 ? DType::Float32 : DType::Float16;
}

Expr unary(OpKind op, const Expr& a, DType result) { return make(op, result, N(a).shape, {a.node()}); }

Expr float_unary(OpKind op, const Expr& a) { return unary(op, a, float_result(N(a).dtype)); }

// NumPy 2: a Python integer that does not fit the result's integer dtype is an error, not a
// silent wrap-around (comparisons are exempt: they compare the true values).
void check_weak_int_fits(OpKind op, const Expr& lit, const Expr& other, DType result) {
    if (!is_weak(lit) || N(lit).dtype != DType::Int32 || !is_integer(result) || is_comparison(op)) return;
    double v = N(lit).value;
    double lo = result == DType::Int8 ? -128 : result == DType::UInt8 ? 0 : -2147483648.0;
    double hi = result == DType::Int8 ? 127 : result == DType::UInt8 ? 255 : 2147483647.0;
    if (v < lo || v > hi)
        fail(Error::Kind::Value,
             "{}: the integer literal {} is out of range for {} (the dtype of the other operand, {}; valid: {} to {}); "
             "cast the tensor to a wider dtype or pass a typed scalar",
             opkind_name(op), v, dtype_name(result), describe(other), lo, hi);
}

Expr binary(OpKind op, const Expr& a, const Expr& b, DType result) {
    check_weak_int_fits(op, a, b, result);
    check_weak_int_fits(op, b, a, result);
    Shape s = broadcast_shapes(N(a).shape, N(b).shape, opkind_name(op));
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
Expr::Expr(int64_t v) : node_(make_scalar((double)v, DType::Int32, true).node()) {}

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

Expr scalar(double v, DType dtype) { return make_scalar(v, dtype, false); }

Expr rand(const Shape& shape) {
    for (int64_t d : shape)
        if (d < 0) fail(Error::Kind::Value, "rand: negative dimension in shape {}", shape_str(shape));
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

// ---- unary

Expr negative(const Expr& a) {
    reject_bool("negative", a, "use logical negation (equal(a, false)) instead");
    return unary(OpKind::Neg, a, N(a).dtype);
}
Expr absolute(const Expr& a) { return unary(OpKind::Abs, a, N(a).dtype); }
Expr sqrt(const Expr& a) { return float_unary(OpKind::Sqrt, a); }
Expr square(const Expr& a) {
    return unary(OpKind::Square, a, N(a).dtype == DType::Bool ? DType::Int8 : N(a).dtype);
}
Expr exp(const Expr& a) { return float_unary(OpKind::Exp, a); }
Expr exp2(const Expr& a) { return float_unary(OpKind::Exp2, a); }
Expr log(const Expr& a) { return float_unary(OpKind::Log, a); }
Expr log2(const Expr& a) { return float_unary(OpKind::Log2, a); }
Expr safelog(const Expr& a) { return float_unary(OpKind::SafeLog, a); }
Expr sig(const Expr& a) { return float_unary(OpKind::Sig, a); }
Expr sig2(const Expr& a) { return float_unary(OpKind::Sig2, a); }
Expr tanh(const Expr& a) { return float_unary(OpKind::Tanh, a); }
Expr tanh2(const Expr& a) { return float_unary(OpKind::Tanh2, a); }
Expr reciprocal(const Expr& a) { return float_unary(OpKind::Reciprocal, a); }
Expr sgn(const Expr& a) {
    reject_bool("sgn", a, "cast to an integer or float dtype first");
    return unary(OpKind::Sgn, a, N(a).dtype);
}
Expr rint(const Expr& a) { return float_unary(OpKind::Rint, a); }
Expr finite(const Expr& a) { return unary(OpKind::Finite, a, DType::Bool); }
Expr cast(const Expr& a, DType to) {
    if (N(a).dtype == to) return a;
    return unary(OpKind::Cast, a, to);
}

// ---- binary

Expr add(const Expr& a, const Expr& b) { return binary(OpKind::Add, a, b, result_type(a, b)); }

Expr subtract(const Expr& a, const Expr& b) {
    DType t = result_type(a, b);
    if (t == DType::Bool)
        fail(Error::Kind::Type, "subtract: not supported for two bool operands ({} and {}); use not_equal for logical xor",
             describe(a), describe(b));
    return binary(OpKind::Sub, a, b, t);
}

Expr multiply(const Expr& a, const Expr& b) { return binary(OpKind::Mul, a, b, result_type(a, b)); }

Expr divide(const Expr& a, const Expr& b) {
    DType t = result_type(a, b);
    return binary(OpKind::Div, a, b, is_float(t) ? t : DType::Float32);
}

namespace {

// The division family's result dtype: add's, except that two bools give int8 (NumPy's
// bool // bool is int8: quotients and remainders of 0/1 values are not bools).
DType floor_division_type(const Expr& a, const Expr& b) {
    DType t = result_type(a, b);
    return t == DType::Bool ? DType::Int8 : t;
}

} // namespace

Expr floor_divide(const Expr& a, const Expr& b) {
    return binary(OpKind::FloorDiv, a, b, floor_division_type(a, b));
}
Expr remainder(const Expr& a, const Expr& b) { return binary(OpKind::Mod, a, b, floor_division_type(a, b)); }
Expr fmod(const Expr& a, const Expr& b) { return binary(OpKind::Fmod, a, b, floor_division_type(a, b)); }

Expr power(const Expr& a, const Expr& b) {
    DType t = result_type(a, b);
    if (!is_float(t))
        fail(Error::Kind::Type,
             "power: integer and bool operands are not supported ({} and {}); cast one operand to a float dtype, "
             "e.g. power(cast(a, float32), b)",
             describe(a), describe(b));
    return binary(OpKind::Pow, a, b, t);
}

Expr maximum(const Expr& a, const Expr& b) { return binary(OpKind::Maximum, a, b, result_type(a, b)); }
Expr minimum(const Expr& a, const Expr& b) { return binary(OpKind::Minimum, a, b, result_type(a, b)); }
Expr equal(const Expr& a, const Expr& b) { return binary(OpKind::Eq, a, b, DType::Bool); }
Expr not_equal(const Expr& a, const Expr& b) { return binary(OpKind::Ne, a, b, DType::Bool); }
Expr greater(const Expr& a, const Expr& b) { return binary(OpKind::Gt, a, b, DType::Bool); }
Expr greater_equal(const Expr& a, const Expr& b) { return binary(OpKind::Ge, a, b, DType::Bool); }
Expr less(const Expr& a, const Expr& b) { return binary(OpKind::Lt, a, b, DType::Bool); }
Expr less_equal(const Expr& a, const Expr& b) { return binary(OpKind::Le, a, b, DType::Bool); }

Expr where(const Expr& cond, const Expr& a, const Expr& b) {
    Shape s = broadcast_shapes(broadcast_shapes(N(cond).shape, N(a).shape, "where"), N(b).shape, "where");
    return make(OpKind::Where, result_type(a, b), std::move(s), {cond.node(), a.node(), b.node()});
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
    if (count == 0 && op != OpKind::Sum)
        fail(Error::Kind::Value, "{}: zero-size reduction over {} of {} has no identity; reduce a non-empty axis",
             name, axis == kAllAxes ? std::string("all axes") : fmt::format("axis {}", axis), describe(a));
    if (n.rank() == 0) {  // nothing to reduce: NumPy returns the value (argmax/argmin: index 0)
        if (op == OpKind::ArgMax || op == OpKind::ArgMin) return scalar(0, DType::Int32);
        return cast(a, op == OpKind::Sum && !is_float(n.dtype) ? DType::Int32 : n.dtype);
    }
    Shape kept = n.shape;
    for (int i = 0; i < n.rank(); ++i)
        if (axis == kAllAxes || i == axis) kept[i] = 1;
    DType t = n.dtype;
    if (op == OpKind::Sum && !is_float(t)) t = DType::Int32;
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

Expr mean(const Expr& a, int axis, bool keepdims) {
    // Integers are summed as float32: NumPy's float64 mean never overflows, an int32 sum would.
    Expr x = is_float(a.dtype()) ? a : cast(a, DType::Float32);
    Expr s = sum(x, axis, keepdims);
    int64_t count = reduced_count(a, axis);
    return s * Expr(1.0 / (double)count);
}

Expr var(const Expr& a, int axis, bool keepdims) {
    Expr x = is_float(a.dtype()) ? a : cast(a, DType::Float32);
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
    if (!axis_opt) {
        src = reshape(a, {a.size()});
    } else {
        if (a.rank() == 0) fail(Error::Kind::Index, "take: axis {} given for a 0-d (scalar) operand", *axis_opt);
        axis = normalize_axis(*axis_opt, a.rank(), "take");
    }
    if (src.shape()[axis] == 0)
        fail(Error::Kind::Index, "take: cannot take from an empty axis {} of {}", axis, describe(src));
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
