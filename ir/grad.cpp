// Reverse-mode differentiation over the expression graph (kiln/grad.hpp). It exists so that a
// kiln expression's backward pass is itself a kiln expression: built from the same nodes, it is
// simplified, fused and compiled like the forward one.
//
// The nodes are visited outputs first; each holds its adjoint, an expression of exactly the
// node's shape. A node hands each float input the adjoint times its local derivative, summed
// over the dimensions the input was broadcast along and cast to the input's dtype.
#include <kiln/grad.hpp>

#include "ir/error.hpp"
#include "ir/node.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <unordered_map>
#include <unordered_set>

namespace kiln {

namespace {

const Node& N(const Expr& e) { return *e.node(); }

// g broadcast to `shape` (g's shape broadcasts to it): reductions' adjoints reach their inputs
// this way, so that every element receives its share.
Expr expand(const Expr& g, const Shape& shape) {
    if (g.shape() == shape) return g;
    if (shape.empty()) return reshape(g, shape);
    // The coordinate along the shortest axis (an int32, exact there) is never negative.
    const int axis = (int)(std::min_element(shape.begin(), shape.end()) - shape.begin());
    return where(iota(shape, axis) < Expr(0), Expr(0.0), g);
}

// c (of the node's shape) summed over the dimensions along which `shape` was broadcast to it.
Expr unbroadcast(Expr c, const Shape& shape) {
    while (c.rank() > (int)shape.size()) c = sum(c, 0, false);
    for (int i = 0; i < c.rank(); ++i)
        if (shape[i] == 1 && c.shape()[i] != 1) c = sum(c, i, true);
    return c;
}

Expr zeros_like_shape(const Shape& shape, DType t) {
    Expr z = expand(scalar(0.0, t), shape);
    return z.dtype() == t ? z : cast(z, t);
}

class Differentiator {
public:
    Differentiator(const Expr& y, const std::vector<Expr>& wrt) : y_(y) {
        for (const Expr& w : wrt) {
            if (!w.valid() || N(w).op != OpKind::Leaf)
                fail(Error::Kind::Value, "grad: differentiate with respect to tensors (their leaves); got {}",
                     w.valid() ? std::string(opkind_name(N(w).op)) + " node" : std::string("an empty Expr"));
            targets_.insert(w.node().get());
        }
        node_ptr_.emplace(y.node().get(), y.node());
        for (const Node* n : postorder(y.node())) {
            order_.push_back(n);
            for (const NodePtr& in : n->inputs) node_ptr_.try_emplace(in.get(), in);
            if (n->op == OpKind::Leaf && !targets_.count(n)) relate_alias(*n);
            bool needed = targets_.count(n) != 0 || aliases_.count(n) != 0;
            for (const NodePtr& in : n->inputs) needed |= needed_.count(in.get()) != 0;
            if (needed && is_float(n->dtype)) needed_.insert(n);
        }
    }

    std::vector<Expr> run(const Expr& dy, const std::vector<Expr>& wrt) {
        if (!is_float(dy.dtype()))
            fail(Error::Kind::Type, "grad: dy must be a float expression; got {} {}", dtype_name(dy.dtype()),
                 shape_str(dy.shape()));
        if (needed_.count(y_.node().get())) {
            if (!broadcastable_to(dy.shape(), N(y_).shape))
                fail(Error::Kind::Value, "grad: dy {} does not broadcast to y's shape {}", shape_str(dy.shape()),
                     shape_str(N(y_).shape));
            adjoint_[y_.node().get()] = cast_to(expand(dy, N(y_).shape), N(y_).dtype);
        }
        for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
            auto a = adjoint_.find(*it);
            if (a != adjoint_.end()) backward(**it, a->second);
        }
        // Reads of a target through a reshaped or broadcast view add to its adjoint.
        for (auto& [alias, target] : aliases_) {
            auto a = adjoint_.find(alias);
            if (a == adjoint_.end()) continue;
            Expr c = a->second;
            c = alias->view.is_contiguous() && target->view.is_contiguous() && alias->size() == target->size()
                    ? reshape(c, target->shape)
                    : unbroadcast(c, target->shape);
            add_adjoint(target, cast_to(c, target->dtype));
        }
        std::vector<Expr> out;
        for (const Expr& w : wrt) {
            auto a = adjoint_.find(w.node().get());
            out.push_back(a == adjoint_.end() ? zeros_like_shape(N(w).shape, N(w).dtype) : a->second);
        }
        return out;
    }

private:
    static Expr cast_to(const Expr& e, DType t) { return e.dtype() == t ? e : cast(e, t); }

    // A leaf reading a target's memory through another view: a reshape of it (both contiguous,
    // the same elements) or a broadcast of it (stride 0 along the added or expanded dimensions)
    // passes its adjoint on to the target. Any other overlap (a transpose, a slice) would
    // silently drop that path, so it is refused.
    void relate_alias(const Node& leaf) {
        for (const Node* t : targets_)
            if (t->view.storage == leaf.view.storage && t->dtype == leaf.dtype && t->view.offset == leaf.view.offset &&
                (reshape_of(t->view, leaf.view) || broadcast_of(t->view, leaf.view))) {
                aliases_.emplace(&leaf, t);
                return;
            }
        for (const Node* t : targets_) {
            if (t->view.storage != leaf.view.storage) continue;
            fail(Error::Kind::Value,
                 "grad: the expression reads the tensor {} {} also through another view ({} {}, strides {}, offset {}); "
                 "kiln follows reshaped and broadcast views of a tensor it differentiates with respect to, not others: "
                 "copy that view first",
                 dtype_name(t->dtype), shape_str(t->shape), dtype_name(leaf.dtype), shape_str(leaf.shape),
                 shape_str(leaf.view.strides), leaf.view.offset);
        }
    }

    static bool reshape_of(const View& t, const View& v) {
        return t.is_contiguous() && v.is_contiguous() && numel(t.shape) == numel(v.shape);
    }

    // v repeats t along dimensions of stride 0: added on the left, or t's size-1 ones expanded.
    static bool broadcast_of(const View& t, const View& v) {
        const int extra = (int)v.shape.size() - (int)t.shape.size();
        if (extra < 0) return false;
        for (int i = 0; i < (int)v.shape.size(); ++i) {
            const int j = i - extra;
            const bool repeated = v.strides[i] == 0 && (j < 0 || t.shape[j] == 1);
            const bool same = j >= 0 && v.shape[i] == t.shape[j] && (v.strides[i] == t.strides[j] || v.shape[i] == 1);
            if (!repeated && !same) return false;
        }
        return true;
    }

    // Adds c to the adjoint of n's input i: c is of n's shape (or broadcastable to it) when n is
    // elementwise, of the input's shape when n is a reduction or a reshape.
    void give(const Node& n, int i, Expr c) {
        const Node& in = *n.inputs[i];
        if (!needed_.count(&in)) return;
        if (is_elementwise(n.op)) c = unbroadcast(expand(c, n.shape), in.shape);
        else if (c.size() == 1 && c.shape() != in.shape) c = expand(c, in.shape);   // a rank-0 scalar stays one
        KILN_CHECK_INTERNAL(c.shape() == in.shape, "grad: {}'s contribution is {}, its input {}", opkind_name(n.op),
                            shape_str(c.shape()), shape_str(in.shape));
        add_adjoint(&in, cast_to(c, in.dtype));
    }

    void add_adjoint(const Node* n, const Expr& c) {
        auto [it, fresh] = adjoint_.try_emplace(n, c);
        if (!fresh) it->second = it->second + c;
    }

    void backward(const Node& n, const Expr& g) {
        if (n.inputs.empty()) return;
        const Expr x(n.inputs[0]);
        const Expr y(node_ptr_.at(&n));
        const Expr b = n.inputs.size() > 1 ? Expr(n.inputs[1]) : Expr();
        constexpr double ln2 = std::numbers::ln2, ln10 = std::numbers::ln10;
        switch (n.op) {
        // ---- one operand
        case OpKind::Neg: give(n, 0, -g); break;
        case OpKind::Abs: give(n, 0, g * sgn(x)); break;
        case OpKind::Sqrt: give(n, 0, g * Expr(0.5) / y); break;
        case OpKind::Square: give(n, 0, g * Expr(2.0) * x); break;
        case OpKind::Exp: give(n, 0, g * y); break;
        case OpKind::Exp2: give(n, 0, g * y * Expr(ln2)); break;
        case OpKind::Log: give(n, 0, g / x); break;
        case OpKind::Log2: give(n, 0, g / (x * Expr(ln2))); break;
        case OpKind::Log10: give(n, 0, g / (x * Expr(ln10))); break;
        case OpKind::SafeLog: give(n, 0, where(x > Expr(std::exp(-50.0)), g / x, Expr(0.0))); break;
        case OpKind::Sig: give(n, 0, g * y * (Expr(1.0) - y)); break;
        case OpKind::Sig2: give(n, 0, g * y * (Expr(1.0) - y) * Expr(ln2)); break;
        case OpKind::Tanh: give(n, 0, g * (Expr(1.0) - square(y))); break;
        case OpKind::Tanh2: give(n, 0, g * (Expr(1.0) - square(y)) * Expr(ln2)); break;
        case OpKind::Reciprocal: give(n, 0, -g * square(y)); break;
        case OpKind::Erf: give(n, 0, g * Expr(2.0 / std::sqrt(std::numbers::pi)) * exp(-square(x))); break;
        case OpKind::Erfc: give(n, 0, g * Expr(-2.0 / std::sqrt(std::numbers::pi)) * exp(-square(x))); break;
        case OpKind::Expm1: give(n, 0, g * (y + Expr(1.0))); break;
        case OpKind::Log1p: give(n, 0, g / (x + Expr(1.0))); break;
        case OpKind::Sin: give(n, 0, g * cos(x)); break;
        case OpKind::Cos: give(n, 0, -g * sin(x)); break;
        case OpKind::Tan: give(n, 0, g * (Expr(1.0) + square(y))); break;
        case OpKind::Atan: give(n, 0, g / (Expr(1.0) + square(x))); break;
        case OpKind::Asin: give(n, 0, g / sqrt(Expr(1.0) - square(x))); break;
        case OpKind::Acos: give(n, 0, -g / sqrt(Expr(1.0) - square(x))); break;
        case OpKind::Sinh: give(n, 0, g * cosh(x)); break;
        case OpKind::Cosh: give(n, 0, g * sinh(x)); break;
        case OpKind::Asinh: give(n, 0, g / sqrt(square(x) + Expr(1.0))); break;
        case OpKind::Acosh: give(n, 0, g / sqrt(square(x) - Expr(1.0))); break;
        case OpKind::Atanh: give(n, 0, g / (Expr(1.0) - square(x))); break;
        case OpKind::Cast: give(n, 0, g); break;
        // ---- two operands
        case OpKind::Add: give(n, 0, g); give(n, 1, g); break;
        case OpKind::Sub: give(n, 0, g); give(n, 1, -g); break;
        case OpKind::Mul: give(n, 0, g * b); give(n, 1, g * x); break;
        case OpKind::Div: give(n, 0, g / b); give(n, 1, -g * y / b); break;
        case OpKind::Mod: give(n, 0, g); give(n, 1, -g * floor_divide(x, b)); break;
        case OpKind::Fmod: give(n, 0, g); give(n, 1, -g * trunc(x / b)); break;
        case OpKind::Pow:
            // d/dx of x^b where b is 0: 0 (not 0 * inf at x = 0); d/db where x is 0 and b >= 0: 0.
            give(n, 0, where(b == Expr(0.0), Expr(0.0), g * b * power(x, b - Expr(1.0))));
            give(n, 1, where(bitwise_and(x == Expr(0.0), b >= Expr(0.0)), Expr(0.0), g * y * log(x)));
            break;
        case OpKind::Maximum:
        case OpKind::Minimum: {
            const Expr first = n.op == OpKind::Maximum ? x > b : x < b;
            const Expr tie = x == b;
            const Expr share = where(tie, g * Expr(0.5), g);
            give(n, 0, where(bitwise_or(first, tie), share, Expr(0.0)));
            give(n, 1, where(first, Expr(0.0), share));
            break;
        }
        case OpKind::Atan2: {
            const Expr r = square(x) + square(b);
            give(n, 0, g * b / r);
            give(n, 1, -g * x / r);
            break;
        }
        case OpKind::Hypot: give(n, 0, g * x / y); give(n, 1, g * b / y); break;
        case OpKind::Copysign: give(n, 0, where(x == Expr(0.0), Expr(0.0), g * y / x)); break;
        case OpKind::Where:
            give(n, 1, where(x, g, Expr(0.0)));
            give(n, 2, where(x, Expr(0.0), g));
            break;
        // ---- reductions (the node keeps the reduced dimensions)
        case OpKind::Sum: give(n, 0, expand(g, N(x).shape)); break;
        case OpKind::Max:
        case OpKind::Min: {
            // Counted in float32 at least: a 16-bit float counts exactly only to 2048 (or 256).
            const Expr hit = cast(x == y, n.dtype == DType::Float64 ? DType::Float64 : DType::Float32);
            give(n, 0, hit * (g / sum(hit, n.axis, true)));
            break;
        }
        case OpKind::Prod: {
            // Where x is 0 the others' product; two or more zeros give zero everywhere.
            const Expr zero = x == Expr(0.0);
            const Expr zeros = sum(cast(zero, DType::Int32), n.axis, true);
            const Expr others = prod(where(zero, Expr(1.0), x), n.axis, true);
            give(n, 0, where(zero, where(zeros == Expr(1), g * others, Expr(0.0)), g * y / x));
            break;
        }
        case OpKind::Reshape: give(n, 0, reshape(g, N(x).shape)); break;
        case OpKind::Take:
            fail(Error::Kind::Value,
                 "grad: take (indexing with an integer array) has no derivative in kiln's expressions (it would be a "
                 "scatter); gather with onehot and a sum instead, or take the derivative outside kiln");
        default:
            // Floor, rint, sign, ceil, trunc, floor_divide, nextafter, comparisons: zero; integer
            // ops never hold an adjoint.
            break;
        }
    }

    Expr y_;
    std::vector<const Node*> order_;
    std::unordered_set<const Node*> targets_, needed_;
    std::unordered_map<const Node*, Expr> adjoint_;
    std::unordered_map<const Node*, NodePtr> node_ptr_;   // postorder hands out raw pointers
    std::unordered_map<const Node*, const Node*> aliases_;   // leaf -> the target it views
};

} // namespace

std::vector<Expr> grad(const Expr& y, const std::vector<Expr>& wrt, const Expr& dy) {
    if (!y.valid() || !dy.valid()) fail(Error::Kind::Value, "grad: y and dy must be expressions (got an empty Expr)");
    Differentiator d(y, wrt);
    std::vector<Expr> out = d.run(dy, wrt);
    // A derivative that reads random draws would draw them again, not see the forward pass's.
    for (const Expr& e : out)
        for (const Node* n : postorder(e.node()))
            if (n->op == OpKind::Rand)
                fail(Error::Kind::Value,
                     "grad: the derivative depends on random draws (rand), which evaluating it would draw anew rather "
                     "than reuse; make the random values a tensor and pass it in");
    return out;
}

} // namespace kiln
