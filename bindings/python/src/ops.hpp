// The operation tables shared by the module functions (NumPy conventions), the Context
// methods (the seeds' conventions) and the Tensor/Expr methods: one entry per operation, so
// an elementwise op added to the IR is exposed everywhere by one line here.
#pragma once
#include "binding.hpp"

#include <vector>

namespace kiln::py {

using UnaryFn = Expr (*)(const Expr&);
using BinaryFn = Expr (*)(const Expr&, const Expr&);

struct UnaryOp { const char* name; UnaryFn fn; };
struct BinaryOp { const char* name; BinaryFn fn; };

const std::vector<UnaryOp>& unary_ops();     // names as NumPy and neon spell them (aliases included)
const std::vector<BinaryOp>& binary_ops();

enum class Reduction { Sum, Prod, Max, Min, Mean, Var, Std, ArgMax, ArgMin };
struct ReductionOp { const char* name; Reduction r; };
const std::vector<ReductionOp>& reduction_ops();  // sum, prod, max, min, amax, amin, mean, var, std, argmax, argmin

// x reduced over `axes` (None, an int or a tuple). ddof applies to var and std; `dtype`
// (None or a dtype) casts x first, as NumPy's dtype= argument does.
Expr reduce(Reduction r, const Expr& x, nb::handle axes, nb::handle keepdims, double ddof, nb::handle dtype, const char* op);

// clip(a, a_min, a_max, out): either bound may be None (not both).
nb::object clip_call(nb::handle a, nb::handle lo, nb::handle hi, nb::handle out);

// `a op b` for Python's operator protocol: NotImplemented when b is no operand.
nb::object binary_operator(nb::handle a, nb::handle b, BinaryFn fn, bool reflected, const char* op);

// divmod(a, b) (reflected: divmod(b, a)) for Python's protocol: (a // b, a % b), two lazy
// expressions, or NotImplemented when b is no operand.
nb::object divmod_operator(nb::handle a, nb::handle b, bool reflected, const char* op);

} // namespace kiln::py
