// The lazy operator API. Every function here builds (or finds) a node and checks the operands
// at once, so a mistake is reported where it is made, naming the operation, the shapes and
// dtypes involved and what would be valid. Nothing executes until the expression is assigned
// into a tensor or evaluated (kiln/tensor.hpp, kiln/context.hpp).
//
// Reductions take an axis (negative counts from the end) or kAllAxes, and keep the reduced
// dimension (size 1) by default, as neon's backend does, so `A - mean(A, 1)` broadcasts;
// pass keepdims=false for NumPy's default.
#pragma once
#include <kiln/dtype.hpp>
#include <kiln/export.hpp>
#include <kiln/shape.hpp>
#include <kiln/view.hpp>

#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace kiln {

// A node of the expression graph: kiln's own, reached only through Expr.
struct Node;
using NodePtr = std::shared_ptr<const Node>;

// "Reduce over every axis". Not -1: that is the last axis, as in NumPy.
inline constexpr int kAllAxes = INT32_MIN;

class KILN_API Expr {
public:
    Expr() = default;
    explicit Expr(NodePtr n) : node_(std::move(n)) {}
    Expr(double v);   // a weak float scalar: adopts the other operand's float dtype
    Expr(float v);
    Expr(int v);      // a weak integer scalar
    Expr(int64_t v);

    const NodePtr& node() const { return node_; }
    DType dtype() const;
    const Shape& shape() const;
    int rank() const { return (int)shape().size(); }
    int64_t size() const { return numel(shape()); }
    bool valid() const { return node_ != nullptr; }
    std::string str() const;   // the graph, a node per line
    size_t node_count() const; // distinct nodes in the graph (repeated subexpressions are one)

private:
    NodePtr node_;
};

// ---- leaves
KILN_API Expr leaf(const View& v);
// A weak integer scalar of any magnitude (a Python int): an integer operand checks that it fits,
// a float operand takes it as a float value.
KILN_API Expr int_literal(double v);
KILN_API Expr scalar(double v, DType dtype);  // a strongly typed scalar; an integer dtype's must be in its range
// Throws kiln::Error naming `op` when `v` is outside integer dtype `dtype`'s values (NaN included).
KILN_API void check_literal_fits(double v, DType dtype, const char* op);
// Uniform [0, 1), float32. A draw per element of `shape`, broadcast like any operand (rand({1})
// is one value for all); a rank-0 rand({}) instead draws per element of the kernel it lands in,
// i.e. of what it is combined into: `A = rand({})` fills A, as the seeds' `A[:] = ng.rand()`.
KILN_API Expr rand(const Shape& shape);
KILN_API Expr iota(const Shape& shape, int axis);

// ---- unary
KILN_API Expr negative(const Expr& a);
KILN_API Expr absolute(const Expr& a);
inline Expr fabs(const Expr& a) { return absolute(a); }
KILN_API Expr sqrt(const Expr& a);
KILN_API Expr square(const Expr& a);
KILN_API Expr exp(const Expr& a);
KILN_API Expr exp2(const Expr& a);
KILN_API Expr log(const Expr& a);
KILN_API Expr log2(const Expr& a);
KILN_API Expr safelog(const Expr& a);     // log(max(a, exp(-50))): never -inf for a >= 0
KILN_API Expr sig(const Expr& a);         // 1 / (1 + exp(-a))
KILN_API Expr sig2(const Expr& a);        // 1 / (1 + exp2(-a))
KILN_API Expr tanh(const Expr& a);
KILN_API Expr tanh2(const Expr& a);       // (exp2(2a) - 1) / (exp2(2a) + 1)
KILN_API Expr reciprocal(const Expr& a);
KILN_API Expr sgn(const Expr& a);
KILN_API Expr rint(const Expr& a);        // round half to even
KILN_API Expr finite(const Expr& a);      // bool
// erf, erfc, expm1, log1p, log10, sin, cos, atan: C's float functions (kiln/math_functions.def).
#define KILN_MATH(K, name, c_function, host) KILN_API Expr name(const Expr& a);
#include <kiln/math_functions.def>
#undef KILN_MATH
KILN_API Expr cast(const Expr& a, DType to);

// ---- binary (NumPy broadcasting and promotion)
KILN_API Expr add(const Expr& a, const Expr& b);
KILN_API Expr subtract(const Expr& a, const Expr& b);
KILN_API Expr multiply(const Expr& a, const Expr& b);
KILN_API Expr divide(const Expr& a, const Expr& b);  // true division: integers give a float
// NumPy's floor_divide and remainder (Python's // and %): the quotient rounds toward -inf and
// the remainder has the divisor's sign, a == floor_divide(a, b) * b + remainder(a, b). The
// result dtype is add's (bool with bool: int8). Integer division by 0 gives 0 for both, and
// INT32_MIN // -1 wraps to INT32_MIN with remainder 0, as NumPy's do. Floats follow NumPy's
// divmod: a // 0 is a / 0 (+-inf, or nan for 0 // 0), x % 0 is nan, inf // x and inf % x are
// nan, x % +-inf is x when x and the divisor have the same sign and the divisor otherwise.
KILN_API Expr floor_divide(const Expr& a, const Expr& b);
KILN_API Expr remainder(const Expr& a, const Expr& b);
inline Expr mod(const Expr& a, const Expr& b) { return remainder(a, b); }
// C's fmod (NumPy's fmod): the remainder of the division truncated toward zero, with the
// dividend's sign. Integers divided by 0 give 0; floats give nan.
KILN_API Expr fmod(const Expr& a, const Expr& b);
KILN_API Expr power(const Expr& a, const Expr& b);
KILN_API Expr maximum(const Expr& a, const Expr& b);
KILN_API Expr minimum(const Expr& a, const Expr& b);
KILN_API Expr equal(const Expr& a, const Expr& b);
KILN_API Expr not_equal(const Expr& a, const Expr& b);
KILN_API Expr greater(const Expr& a, const Expr& b);
KILN_API Expr greater_equal(const Expr& a, const Expr& b);
KILN_API Expr less(const Expr& a, const Expr& b);
KILN_API Expr less_equal(const Expr& a, const Expr& b);
KILN_API Expr where(const Expr& cond, const Expr& a, const Expr& b);
KILN_API Expr clip(const Expr& a, const Expr& lo, const Expr& hi);

// ---- reductions
inline constexpr int all_axes = kAllAxes;
KILN_API Expr sum(const Expr& a, int axis = kAllAxes, bool keepdims = true);
KILN_API Expr max(const Expr& a, int axis = kAllAxes, bool keepdims = true);
KILN_API Expr min(const Expr& a, int axis = kAllAxes, bool keepdims = true);
KILN_API Expr mean(const Expr& a, int axis = kAllAxes, bool keepdims = true);
KILN_API Expr var(const Expr& a, int axis = kAllAxes, bool keepdims = true);   // population variance (ddof 0)
KILN_API Expr std(const Expr& a, int axis = kAllAxes, bool keepdims = true);
KILN_API Expr argmax(const Expr& a, int axis = kAllAxes, bool keepdims = true);  // int32; flat index for all axes
KILN_API Expr argmin(const Expr& a, int axis = kAllAxes, bool keepdims = true);

// ---- shape and data movement
KILN_API Expr reshape(const Expr& a, const Shape& shape);  // one dim may be -1
KILN_API Expr expand_dims(const Expr& a, int axis);
KILN_API Expr onehot(const Expr& indices, int64_t num_classes, int axis = -1, DType dtype = DType::Float32);
KILN_API Expr take(const Expr& a, const Expr& indices, std::optional<int> axis = std::nullopt);  // negative indices count from the end; out-of-range ones are clipped

// ---- operators
KILN_API Expr operator+(const Expr& a, const Expr& b);
KILN_API Expr operator-(const Expr& a, const Expr& b);
KILN_API Expr operator*(const Expr& a, const Expr& b);
KILN_API Expr operator/(const Expr& a, const Expr& b);
KILN_API Expr operator%(const Expr& a, const Expr& b);   // remainder (Python's %), not C's fmod
KILN_API Expr operator-(const Expr& a);
KILN_API Expr operator==(const Expr& a, const Expr& b);
KILN_API Expr operator!=(const Expr& a, const Expr& b);
KILN_API Expr operator<(const Expr& a, const Expr& b);
KILN_API Expr operator<=(const Expr& a, const Expr& b);
KILN_API Expr operator>(const Expr& a, const Expr& b);
KILN_API Expr operator>=(const Expr& a, const Expr& b);

// Result dtype of a binary arithmetic op under kiln's promotion (NumPy's, capped at 32 bits).
KILN_API DType result_type(const Expr& a, const Expr& b);

} // namespace kiln
