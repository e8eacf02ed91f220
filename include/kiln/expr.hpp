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
// The same for an integer in [2^63, 2^64), exact for uint64 operands (a Python int there).
KILN_API Expr uint_literal(uint64_t v);
KILN_API Expr scalar(double v, DType dtype);  // a strongly typed scalar; an integer dtype's must be in its range
KILN_API Expr int_scalar(int64_t v, DType dtype);  // the same from an integer, exact (uint64: v's bits)
// Throws kiln::Error naming `op` when `v` is outside integer dtype `dtype`'s values (NaN included).
KILN_API void check_literal_fits(double v, DType dtype, const char* op);
// The same for an integer literal (an integer-dtype scalar), exactly for int64 and uint64, whose
// values a double does not all hold.
KILN_API void check_literal_fits(const Expr& literal, DType dtype, const char* op);
// Uniform [0, 1), float32. A draw per element of `shape`, broadcast like any operand (rand({1})
// is one value for all); a rank-0 rand({}) instead draws per element of the kernel it lands in,
// i.e. of what it is combined into: `A = rand({})` fills A, as the seeds' `A[:] = ng.rand()`.
KILN_API Expr rand(const Shape& shape);
KILN_API Expr iota(const Shape& shape, int axis);

// ---- elementwise (binary ones with NumPy broadcasting and promotion): one function per line
// of kiln/elementwise.def (negative ... less_equal, with their dtype rules) and of
// kiln/math_functions.def (C's float functions: erf, erfc, expm1, log1p, log10, sin, cos, atan;
// atan2, hypot, copysign).
#define KILN_UNARY(K, name, rule, fold, hint) KILN_API Expr name(const Expr& a);
#define KILN_BINARY(K, name, rule, commutative, fold, hint) KILN_API Expr name(const Expr& a, const Expr& b);
#include <kiln/elementwise.def>
#undef KILN_BINARY
#undef KILN_UNARY
#define KILN_MATH(K, name, c_function, host) KILN_API Expr name(const Expr& a);
#define KILN_MATH2(K, name, c_function, host) KILN_API Expr name(const Expr& a, const Expr& b);
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
inline Expr fabs(const Expr& a) { return absolute(a); }
inline Expr mod(const Expr& a, const Expr& b) { return remainder(a, b); }
KILN_API Expr cast(const Expr& a, DType to);
KILN_API Expr where(const Expr& cond, const Expr& a, const Expr& b);
KILN_API Expr clip(const Expr& a, const Expr& lo, const Expr& hi);

// ---- reductions
inline constexpr int all_axes = kAllAxes;
KILN_API Expr sum(const Expr& a, int axis = kAllAxes, bool keepdims = true);
// The product, in float32 for floats and in wrapping int32 for integers and bool (as sum); an
// empty reduction gives 1.
KILN_API Expr prod(const Expr& a, int axis = kAllAxes, bool keepdims = true);
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
