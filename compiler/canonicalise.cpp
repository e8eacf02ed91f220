#include "compiler/canonicalise.hpp"

#include "compiler/divmod.hpp"
#include "ir/node.hpp"

#include <cmath>
#include <optional>
#include <unordered_map>

namespace kiln {

namespace {

bool is_scalar(const NodePtr& n) { return n->op == OpKind::Scalar; }
bool scalar_is(const NodePtr& n, double v) { return is_scalar(n) && n->value == v; }

// Rounds a host double the way a store to `t` would, so folded constants equal computed ones.
double to_dtype(double v, DType t) {
    switch (t) {
    case DType::Float32: case DType::Float16: case DType::BFloat16: return (double)(float)v;
    case DType::Bool: return v != 0 ? 1 : 0;
    case DType::Int32: case DType::Int8: case DType::UInt8: case DType::Int16: case DType::UInt16: {
        if (std::isnan(v)) return 0;
        double tr = std::trunc(v);
        int64_t i = tr < -2147483648.0 ? INT32_MIN : tr > 2147483647.0 ? INT32_MAX : (int64_t)tr;
        if (t == DType::Int8) return (double)(int8_t)(uint8_t)(i & 0xff);
        if (t == DType::UInt8) return (double)(uint8_t)(i & 0xff);
        if (t == DType::Int16) return (double)(int16_t)(uint16_t)(i & 0xffff);
        if (t == DType::UInt16) return (double)(uint16_t)(i & 0xffff);
        return (double)i;
    }
    // 64-bit values are not folded (fold() below); a scalar of their dtype keeps its value.
    case DType::Float64: case DType::Int64: case DType::UInt32: case DType::UInt64: return v;
    }
    return v;
}

// The division family in the kernel's arithmetic: both operands converted to the result's
// compute type (float32, or int32 wrapped to the result's width), then compiler/divmod.hpp.
double fold_division(const Node& n, double a, double b) {
    if (is_float(n.dtype)) {
        const float x = (float)a, y = (float)b;
        if (n.op == OpKind::FloorDiv) return floor_divide_f32(x, y);
        if (n.op == OpKind::Mod) return remainder_f32(x, y);
        return std::fmod(x, y);
    }
    const auto x = (int32_t)to_dtype(a, n.dtype), y = (int32_t)to_dtype(b, n.dtype);
    if (n.op == OpKind::FloorDiv) return floor_divide_i32(x, y);
    if (n.op == OpKind::Mod) return remainder_i32(x, y);
    return fmod_i32(x, y);
}

// Negative, add, subtract and multiply of integers as the kernel computes them: the operands in
// the result's dtype, 32-bit arithmetic that wraps (the caller narrows int8 and uint8).
std::optional<double> fold_wrapping(const Node& n, const std::vector<NodePtr>& ins) {
    auto x = [&](int i) { return (uint32_t)(int32_t)to_dtype(ins[i]->value, n.dtype); };
    switch (n.op) {
    case OpKind::Neg: return (double)(int32_t)(0u - x(0));
    case OpKind::Add: return (double)(int32_t)(x(0) + x(1));
    case OpKind::Sub: return (double)(int32_t)(x(0) - x(1));
    case OpKind::Mul: return (double)(int32_t)(x(0) * x(1));
    default: return std::nullopt;
    }
}

// The value of `n` from constant operands `ins` (already folded scalars, not n.inputs), as
// kiln/elementwise.def's fold column says; nothing where the op does not fold at n's dtype.
// 64-bit values (float64, int64, uint32, uint64) are left to the kernel: the host's double holds neither
// every int64 nor the wrap-around of their arithmetic.
std::optional<double> fold(const Node& n, const std::vector<NodePtr>& ins) {
    if (is_wide(n.dtype)) return std::nullopt;
    for (const NodePtr& i : ins)
        if (is_wide(i->dtype)) return std::nullopt;
    if (is_integer(n.dtype))
        if (auto v = fold_wrapping(n, ins)) return v;
    const double a = ins[0]->value, b = ins.size() > 1 ? ins[1]->value : 0;
    (void)b;
#define FoldAny(e) return (e);
#define FoldFloat(e) if (is_float(n.dtype)) return (e); return std::nullopt;
#define NoFold return std::nullopt;
#define KILN_UNARY(K, name, rule, fold, hint) case OpKind::K: { fold }
#define KILN_BINARY(K, name, rule, commutative, fold, hint) case OpKind::K: { fold }
    switch (n.op) {
#include <kiln/elementwise.def>
#define KILN_MATH(K, name, c_function, host) case OpKind::K: return host(a);
#define KILN_MATH2(K, name, c_function, host) case OpKind::K: return host(a, b);
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
    case OpKind::Cast: return a;
    default: return std::nullopt;   // leaves, where, reductions, movement
    }
#undef KILN_BINARY
#undef KILN_UNARY
#undef NoFold
#undef FoldFloat
#undef FoldAny
}

struct Canon {
    CanonicaliseStats st;
    std::unordered_map<const Node*, NodePtr> memo;

    NodePtr rebuild(const Node& n, std::vector<NodePtr> ins) {
        Node p = n;
        p.inputs = std::move(ins);
        return intern(std::move(p));
    }

    // Inputs before users (postorder), so each node's operands are already canonical; no
    // recursion, so the depth of an expression is bounded by memory alone.
    NodePtr run(const NodePtr& root) {
        for (const Node* n : postorder(root)) {
            std::vector<NodePtr> ins;
            ins.reserve(n->inputs.size());
            for (auto& i : n->inputs) ins.push_back(memo.at(i.get()));
            memo[n] = visit(*n, std::move(ins));
        }
        return memo.at(root.get());
    }

    NodePtr visit(const Node& n, std::vector<NodePtr> ins) {
        if (is_elementwise(n.op) && !ins.empty()) {
            bool all_scalar = true, all_weak = true;
            for (auto& i : ins) all_scalar &= is_scalar(i), all_weak &= i->weak;
            if (all_scalar) {
                if (auto v = fold(n, ins)) {
                    ++st.folded;
                    Node s;
                    s.op = OpKind::Scalar;
                    s.dtype = n.dtype;
                    s.value = to_dtype(*v, n.dtype);
                    if (!is_float(n.dtype)) s.ivalue = (int64_t)s.value;   // fold leaves 64-bit values alone
                    s.weak = all_weak;
                    return intern(std::move(s));
                }
            }
        }
        auto keeps = [&](const NodePtr& x) { return x->dtype == n.dtype && x->shape == n.shape; };
        switch (n.op) {
        case OpKind::Add:
            if (scalar_is(ins[1], 0) && keeps(ins[0])) { ++st.identities; return ins[0]; }
            if (scalar_is(ins[0], 0) && keeps(ins[1])) { ++st.identities; return ins[1]; }
            break;
        case OpKind::Sub:
            if (scalar_is(ins[1], 0) && keeps(ins[0])) { ++st.identities; return ins[0]; }
            break;
        case OpKind::Mul:
            if (scalar_is(ins[1], 1) && keeps(ins[0])) { ++st.identities; return ins[0]; }
            if (scalar_is(ins[0], 1) && keeps(ins[1])) { ++st.identities; return ins[1]; }
            break;
        case OpKind::Div: case OpKind::Pow:
            if (scalar_is(ins[1], 1) && keeps(ins[0])) { ++st.identities; return ins[0]; }
            // x**2 of a float as x*x: one multiply, correctly rounded, against powf (a libdevice
            // call the kernel pays for at run time and NVRTC at compile time, ~6 ms a kernel).
            if (n.op == OpKind::Pow && is_float(n.dtype) && scalar_is(ins[1], 2) && keeps(ins[0])) {
                ++st.squares;
                Node m = n;
                m.op = OpKind::Mul;
                return rebuild(m, {ins[0], ins[0]});
            }
            break;
        case OpKind::Neg:
            if (ins[0]->op == OpKind::Neg && keeps(ins[0]->inputs[0])) { ++st.identities; return ins[0]->inputs[0]; }
            break;
        default: break;
        }
        if (is_commutative(n.op) && ins.size() == 2) {
            auto rank = [](const NodePtr& x) { return std::make_pair(x->op == OpKind::Scalar ? 1 : 0, x->id); };
            if (rank(ins[1]) < rank(ins[0])) {
                std::swap(ins[0], ins[1]);
                ++st.reordered;
            }
        }
        return rebuild(n, std::move(ins));
    }
};

} // namespace

NodePtr canonicalise(const NodePtr& root, CanonicaliseStats* stats) {
    Canon c;
    NodePtr out = c.run(root);
    if (stats) *stats = c.st;
    return out;
}

} // namespace kiln
