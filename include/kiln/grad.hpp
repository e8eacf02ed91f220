// Reverse-mode derivatives of expressions: the gradient of an expression is another expression,
// fused and compiled like any other (the backward pass of a kiln expression is one more kiln
// expression, which is what kiln.torch's autograd formulas are).
#pragma once
#include <kiln/expr.hpp>
#include <kiln/export.hpp>

#include <vector>

namespace kiln {

// For each of `wrt` (leaves: the expressions of tensors, Tensor::expr()), the expression of the
// vector-Jacobian product dy^T (dy/dwrt): the derivative of sum(dy * y) with respect to it, of
// its shape and dtype. `dy` is a float expression broadcastable to y's shape. Leaves y does not
// depend on get zeros; integer and bool values carry no derivative. Derivatives follow
// PyTorch's conventions where a function is not differentiable: maximum and minimum split a tie
// evenly, max and min reductions share the derivative among the elements equal to the extreme,
// floor, rint, sign and the comparisons have derivative zero. Reads of a leaf of `wrt` through a
// reshaped or broadcast view of its memory count towards its derivative. Throws kiln::Error for
// take (its derivative is a scatter), for other views of such a leaf's memory (a transpose, a
// slice) and for a derivative that would read random draws (rand: evaluating it draws anew).
KILN_API std::vector<Expr> grad(const Expr& y, const std::vector<Expr>& wrt, const Expr& dy);

} // namespace kiln
