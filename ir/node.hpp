// Expression graph nodes: immutable and hash-consed at construction, so structurally equal
// subtrees are one node (two `mean(A, axis=1)` are one object). Nodes carry their result dtype
// and shape; reductions always keep their reduced dims (size 1) and a Reshape node on top
// removes them when the caller asked for keepdims=false.
#pragma once
#include "ir/dtype.hpp"
#include <kiln/shape.hpp>
#include "ir/storage.hpp"
#include <kiln/expr.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

enum class OpKind : uint8_t {
    // leaves
    Leaf,    // a tensor view
    Scalar,  // a constant; becomes a kernel argument, not source text
    Rand,    // uniform [0, 1) float32 from the evaluating context's counter-based RNG
    Iota,    // int32 coordinate along `axis` of `shape` (one-hot encoding is built from it)
    // elementwise of one operand (kiln/elementwise.def), then the dtype conversion
#define KILN_UNARY(K, name, rule, fold, hint) K,
#define KILN_BINARY(K, name, rule, commutative, fold, hint)
#include <kiln/elementwise.def>
#undef KILN_BINARY
#undef KILN_UNARY
    Cast,
    // elementwise of two operands (kiln/elementwise.def)
#define KILN_UNARY(K, name, rule, fold, hint)
#define KILN_BINARY(K, name, rule, commutative, fold, hint) K,
#include <kiln/elementwise.def>
#undef KILN_BINARY
#undef KILN_UNARY
    // ternary elementwise
    Where,
    // reductions over `axis` (or all dims when axis == kAllAxes); result keeps dims
    Sum, Max, Min, ArgMax, ArgMin, Prod,
    // data movement
    Reshape,  // same elements, new shape (row-major order)
    Take,     // inputs {source, indices}: source gathered along `axis` by indices
    // float functions of one and two arguments (kiln/math_functions.def)
#define KILN_MATH(K, name, c_function, host) K,
#define KILN_MATH2(K, name, c_function, host) K,
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
};
inline constexpr size_t kNumOpKinds = (size_t)OpKind::Take + 1
#define KILN_MATH(K, name, c_function, host) + 1
#define KILN_MATH2(K, name, c_function, host) + 1
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
    ;

enum class OpClass : uint8_t { Leaf, Unary, Binary, Ternary, Reduction, Movement };

// An elementwise op's result dtype from its operands' (kiln/elementwise.def says what each means).
enum class DTypeRule : uint8_t {
    None,                                      // not from the table (leaves, cast, where, reductions)
    Same, NotBool, Float, Square, Bool,        // one operand (Float: two as well)
    Promote, PromoteNotBool, FloatPromote, Division, FloatOnly, Compare,  // two
    Integral,                                  // one or two: integers and bools, promoted; floats refused
    Shift,                                     // two: Integral, two bools give int8
};

// What the graph knows of an op, from one table (node.cpp) in OpKind's order.
struct OpKindInfo {
    OpKind op;
    const char* name;    // the public function's name: graph listings and error messages
    OpClass cls;
    int arity;           // inputs
    bool commutative;    // operands may be swapped (canonical order, CSE)
    bool comparison;     // a bool result from two operands of any dtype
    DTypeRule rule;
    const char* hint;    // what to do instead, when the rule refuses the operands
};
const OpKindInfo& opkind_info(OpKind k);

inline const char* opkind_name(OpKind k) { return opkind_info(k).name; }
inline bool is_unary(OpKind k) { return opkind_info(k).cls == OpClass::Unary; }
inline bool is_binary(OpKind k) { return opkind_info(k).cls == OpClass::Binary; }
inline bool is_elementwise(OpKind k) {   // unary, binary, Where, Cast
    OpClass c = opkind_info(k).cls;
    return c == OpClass::Unary || c == OpClass::Binary || c == OpClass::Ternary;
}
inline bool is_reduction(OpKind k) { return opkind_info(k).cls == OpClass::Reduction; }
inline bool is_commutative(OpKind k) { return opkind_info(k).commutative; }
inline bool is_comparison(OpKind k) { return opkind_info(k).comparison; }


struct Node {
    OpKind op;
    DType dtype;
    Shape shape;
    std::vector<NodePtr> inputs;
    // attributes (meaning depends on op)
    int axis = kAllAxes;      // reductions, Iota, Take
    double value = 0;         // Scalar
    int64_t ivalue = 0;       // Scalar of an integer or bool dtype: its exact value (`value` rounds past 2^53)
    bool weak = false;        // Scalar: a literal without an explicit dtype (NumPy's "weak" scalars)
    uint64_t serial = 0;      // Rand: unique per call, so two rand() never merge
    View view;                // Leaf
    // derived
    size_t hash = 0;
    uint64_t id = 0;          // creation order; stable printing and operand ordering

    int64_t size() const { return numel(shape); }
    int rank() const { return (int)shape.size(); }
};

// The only way to make a node: returns the existing node when a structurally equal one is alive.
NodePtr intern(Node proto);

// Number of live interned nodes (tests use it to check that hash-consing shares nodes).
size_t live_node_count();

// One line per node reachable from `root`, inputs first: "%12 = add(%3, %11) float32 (128, 32)".
std::string graph_str(const NodePtr& root);
std::string node_str(const Node& n);  // the node alone, operands by id

// Postorder (inputs before users), each node once.
std::vector<const Node*> postorder(const NodePtr& root);
// The same, not descending below a node for which `stop` holds (that node is listed): a stage's
// nodes, stopping at what earlier stages computed.
std::vector<const Node*> postorder(const NodePtr& root, const std::function<bool(const Node*)>& stop);

} // namespace kiln
