// The operation tables, reductions over several axes, and the module-level functions with
// NumPy's conventions: keepdims=False, axis=None reduces everything, `out=` receives the
// value. Without out= a function returns a lazy kiln.Expr, evaluated on assignment or when a
// value is needed.
#include "ops.hpp"

#include <kiln/grad.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>

namespace kiln::py {

namespace {

Expr sign(const Expr& a) { return sgn(a); }
// NumPy's fabs is a float function: 8-bit integers and bool give float16, int32 float32 (NumPy's
// float64, capped at kiln's widest float).
Expr float_abs(const Expr& a) {
    if (is_float(a.dtype())) return absolute(a);
    return absolute(cast(a, a.dtype() == DType::Int32 ? DType::Float32 : DType::Float16));
}

Expr reduce_one(Reduction r, const Expr& x, int axis, bool keepdims) {
    switch (r) {
    case Reduction::Sum: return sum(x, axis, keepdims);
    case Reduction::Prod: return prod(x, axis, keepdims);
    case Reduction::Max: return max(x, axis, keepdims);
    case Reduction::Min: return min(x, axis, keepdims);
    case Reduction::Mean: return mean(x, axis, keepdims);
    case Reduction::Var: return var(x, axis, keepdims);
    case Reduction::Std: return kiln::std(x, axis, keepdims);
    case Reduction::ArgMax: return argmax(x, axis, keepdims);
    case Reduction::ArgMin: return argmin(x, axis, keepdims);
    }
    return {};
}

// Several axes (not all): nested single-axis reductions, innermost axis first.
Expr reduce_several(Reduction r, const Expr& x, std::vector<int> axes, const char* op) {
    std::sort(axes.rbegin(), axes.rend());
    int64_t count = 1;
    for (int a : axes) count *= x.shape()[a];
    auto nested = [&](Reduction base, const Expr& v) {
        Expr y = v;
        for (int a : axes) y = reduce_one(base, y, a, true);
        return y;
    };
    switch (r) {
    case Reduction::Sum: case Reduction::Prod: case Reduction::Max: case Reduction::Min: return nested(r, x);
    case Reduction::Mean: return divide(nested(Reduction::Sum, x), Expr((double)count));
    case Reduction::Var: case Reduction::Std: {
        Expr m = divide(nested(Reduction::Sum, x), Expr((double)count));
        Expr v = divide(nested(Reduction::Sum, square(subtract(x, m))), Expr((double)count));
        return r == Reduction::Var ? v : sqrt(v);
    }
    case Reduction::ArgMax: case Reduction::ArgMin:
        throw Error(fmt::format("{}: reduces over one axis or all of them (axis=None), not over {} axes", op, axes.size()),
                    Error::Kind::Value);
    }
    return {};
}

} // namespace

// Every op of kiln/elementwise.def and kiln/math_functions.def under its own name, then NumPy's
// other names for some of them.
const std::vector<UnaryOp>& unary_ops() {
    static const std::vector<UnaryOp> ops = {
#define KILN_UNARY(K, name, rule, fold, hint) {#name, name},
#define KILN_BINARY(K, name, rule, commutative, fold, hint)
#include <kiln/elementwise.def>
#undef KILN_BINARY
#undef KILN_UNARY
#define KILN_MATH(K, name, c_function, host) {#name, name},
#define KILN_MATH2(K, name, c_function, host)
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
        {"abs", absolute}, {"fabs", float_abs}, {"sign", sign}, {"isfinite", finite},
        {"invert", bitwise_invert}, {"bitwise_not", bitwise_invert},   // NumPy's
        {"arctan", atan}, {"arcsin", asin}, {"arccos", acos},   // NumPy 1's names
        {"arcsinh", asinh}, {"arccosh", acosh}, {"arctanh", atanh},
    };
    return ops;
}

const std::vector<BinaryOp>& binary_ops() {
    static const std::vector<BinaryOp> ops = {
#define KILN_UNARY(K, name, rule, fold, hint)
#define KILN_BINARY(K, name, rule, commutative, fold, hint) {#name, name},
#include <kiln/elementwise.def>
#undef KILN_BINARY
#undef KILN_UNARY
#define KILN_MATH(K, name, c_function, host)
#define KILN_MATH2(K, name, c_function, host) {#name, name},
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
        {"true_divide", divide}, {"mod", remainder}, {"arctan2", atan2},
    };
    return ops;
}

const std::vector<ReductionOp>& reduction_ops() {
    static const std::vector<ReductionOp> ops = {
        {"sum", Reduction::Sum}, {"prod", Reduction::Prod}, {"max", Reduction::Max}, {"min", Reduction::Min}, {"amax", Reduction::Max},
        {"amin", Reduction::Min}, {"mean", Reduction::Mean}, {"var", Reduction::Var}, {"std", Reduction::Std},
        {"argmax", Reduction::ArgMax}, {"argmin", Reduction::ArgMin},
    };
    return ops;
}

Expr reduce(Reduction r, const Expr& x0, nb::handle axis, nb::handle keepdims_arg, double ddof, nb::handle dtype, const char* op) {
    const bool keepdims = bool_value(keepdims_arg, "keepdims", op);
    Expr x = x0;
    // dtype (sum, prod, mean): the operand's and the result's dtype, as NumPy's; integers are
    // added in a wider type and wrapped into it at the end, the same bits as adding in it.
    std::optional<DType> want;
    if (dtype.is_valid() && !dtype.is_none()) x = cast(x, *(want = dtype_arg(dtype, op)));
    const auto as_wanted = [&](const Expr& e) { return want && e.dtype() != *want ? cast(e, *want) : e; };
    const int rank = x.rank();
    if ((r == Reduction::ArgMax || r == Reduction::ArgMin) && (nb::isinstance<nb::tuple>(axis) || nb::isinstance<nb::list>(axis)))
        throw Error(fmt::format("{}: axis must be an int or None (the flattened index), not a tuple", op), Error::Kind::Type);
    Axes ax = parse_axes(axis, rank, op);
    int64_t count = 1;
    Expr y;
    if (!ax.all && ax.list.empty()) {  // axis=(): nothing reduced
        if (r == Reduction::ArgMax || r == Reduction::ArgMin)
            throw Error(fmt::format("{}: axis=() reduces nothing; give one axis or None", op), Error::Kind::Value);
        if (r == Reduction::Var || r == Reduction::Std) return multiply(cast(x, DType::Float32), 0.0);
        return as_wanted(r == Reduction::Mean ? cast(x, is_float(x.dtype()) ? x.dtype() : DType::Float32) : x);
    }
    if (ax.all || (int)ax.list.size() == rank) {
        count = x.size();
        y = reduce_one(r, x, kAllAxes, keepdims);
    } else if (ax.list.size() == 1) {
        count = x.shape()[ax.list[0]];
        y = reduce_one(r, x, ax.list[0], keepdims);
    } else {
        for (int a : ax.list) count *= x.shape()[a];
        y = reduce_several(r, x, ax.list, op);
        if (!keepdims) {
            Shape s;
            for (int d = 0; d < rank; ++d)
                if (std::find(ax.list.begin(), ax.list.end(), d) == ax.list.end()) s.push_back(x.shape()[d]);
            y = reshape(y, s);
        }
    }
    if (ddof != 0 && (r == Reduction::Var || r == Reduction::Std)) {
        if (!(ddof >= 0))   // (NaN too)
            throw Error(fmt::format("{}: ddof={}; the degrees of freedom removed (ddof or correction) are 0 or more", op, ddof),
                        Error::Kind::Value);
        if (ddof >= count)
            throw Error(fmt::format("{}: ddof={} needs more than {} elements per reduction (there are {})", op, ddof, ddof,
                                    count),
                        Error::Kind::Value);
        double f = (double)count / (double)(count - ddof);
        y = r == Reduction::Var ? multiply(y, Expr(f)) : multiply(y, Expr(std::sqrt(f)));
    }
    return as_wanted(y);
}

nb::object clip_call(nb::handle a, nb::handle lo, nb::handle hi, nb::handle out) {
    nb::handle ctx;
    Expr ea = operand(a, ctx, "clip");
    Expr elo = lo.is_none() ? Expr() : operand(lo, ctx, "clip");
    Expr ehi = hi.is_none() ? Expr() : operand(hi, ctx, "clip");
    Expr e;
    if (elo.valid() && ehi.valid()) e = clip(ea, elo, ehi);
    else if (elo.valid()) e = maximum(ea, elo);
    else if (ehi.valid()) e = minimum(ea, ehi);
    else throw Error("clip: a_min and a_max cannot both be None", Error::Kind::Value);
    return finish(e, ctx, out, "clip");
}

nb::object binary_operator(nb::handle a, nb::handle b, BinaryFn fn, bool reflected, const char* op) {
    nb::handle ctx;
    Expr ea, eb;
    to_expr(a, ea, ctx);
    if (!to_expr(b, eb, ctx)) {
        std::string t = nb::cast<std::string>(nb::str(b.type().attr("__name__")));
        if (t == "ndarray" || t == "list" || t == "tuple") throw Error(not_an_operand(b, op), Error::Kind::Type);
        return nb::borrow(Py_NotImplemented);
    }
    return wrap(reflected ? fn(eb, ea) : fn(ea, eb), ctx);
}

nb::object divmod_operator(nb::handle a, nb::handle b, bool reflected, const char* op) {
    nb::object q = binary_operator(a, b, floor_divide, reflected, op);
    if (q.is(nb::handle(Py_NotImplemented))) return q;
    return nb::make_tuple(q, binary_operator(a, b, remainder, reflected, op));
}

void bind_ops(nb::module_& m) {
    using namespace nb::literals;
    for (const UnaryOp& u : unary_ops()) {
        UnaryFn fn = u.fn;
        const char* name = u.name;
        m.def(name, [fn, name](nb::handle a, nb::handle out) {
            nb::handle ctx;
            Expr e = fn(operand(a, ctx, name));
            return finish(e, ctx, out, name);
        }, nb::sig(signature(fmt::format("def {}(a: {}, out: Tensor | None = None) -> Expr | Tensor", name, kOperand))),
           "a"_a.none(), "out"_a.none() = nb::none(), "Elementwise; lazy unless out= is given.");
    }
    for (const BinaryOp& b : binary_ops()) {
        BinaryFn fn = b.fn;
        const char* name = b.name;
        m.def(name, [fn, name](nb::handle a, nb::handle x, nb::handle out) {
            nb::handle ctx;
            Expr ea = operand(a, ctx, name);
            Expr eb = operand(x, ctx, name);
            return finish(fn(ea, eb), ctx, out, name);
        }, nb::sig(signature(fmt::format("def {}(a: {}, b: {}, out: Tensor | None = None) -> Expr | Tensor", name, kOperand,
                                         kOperand))),
           "a"_a.none(), "b"_a.none(), "out"_a.none() = nb::none(), "Elementwise with NumPy broadcasting; lazy unless out= is given.");
    }
    for (const ReductionOp& r : reduction_ops()) {
        Reduction kind = r.r;
        const char* name = r.name;
        const bool has_ddof = kind == Reduction::Var || kind == Reduction::Std;
        const bool has_dtype = kind == Reduction::Sum || kind == Reduction::Prod || kind == Reduction::Mean;
        if (has_ddof) {
            // correction: the Array API's name for ddof; both may be fractional, as NumPy's ddof.
            m.def(name, [kind, name](nb::handle a, nb::handle axis, nb::handle keepdims_arg, nb::handle out, nb::handle ddof_arg,
                                     nb::handle correction_arg) {
                nb::handle ctx;
                const double ddof = real_value(ddof_arg, "ddof", name);
                std::optional<double> correction;
                if (!correction_arg.is_none()) correction = real_value(correction_arg, "correction", name);
                if (correction && ddof != 0)
                    throw Error(fmt::format("{}: give ddof or correction, not both (ddof={}, correction={})", name, ddof,
                                            *correction),
                                Error::Kind::Value);
                Expr e = reduce(kind, operand(a, ctx, name), axis, keepdims_arg, correction ? *correction : ddof,
                                nb::handle(), name);
                return finish(e, ctx, out, name);
            }, nb::sig(signature(fmt::format("def {}(a: {}, axis: int | tuple[int, ...] | None = None, keepdims: bool = False, "
                                             "out: Tensor | None = None, ddof: float = 0, correction: float | None = None) "
                                             "-> Expr | Tensor", name, kOperand))),
               "a"_a.none(), "axis"_a.none() = nb::none(), "keepdims"_a.none() = false, "out"_a.none() = nb::none(), "ddof"_a.none() = 0,
               "correction"_a.none() = nb::none());
        } else if (has_dtype) {
            m.def(name, [kind, name](nb::handle a, nb::handle axis, nb::handle keepdims_arg, nb::handle out, nb::handle dtype) {
                nb::handle ctx;
                Expr e = reduce(kind, operand(a, ctx, name), axis, keepdims_arg, 0, dtype, name);
                return finish(e, ctx, out, name);
            }, nb::sig(signature(fmt::format("def {}(a: {}, axis: int | tuple[int, ...] | None = None, keepdims: bool = False, "
                                             "out: Tensor | None = None, dtype: object = None) -> Expr | Tensor", name, kOperand))),
               "a"_a.none(), "axis"_a.none() = nb::none(), "keepdims"_a.none() = false, "out"_a.none() = nb::none(), "dtype"_a.none() = nb::none());
        } else {
            m.def(name, [kind, name](nb::handle a, nb::handle axis, nb::handle keepdims_arg, nb::handle out) {
                nb::handle ctx;
                Expr e = reduce(kind, operand(a, ctx, name), axis, keepdims_arg, 0, nb::handle(), name);
                return finish(e, ctx, out, name);
            }, nb::sig(signature(fmt::format("def {}(a: {}, axis: int | tuple[int, ...] | None = None, keepdims: bool = False, "
                                             "out: Tensor | None = None) -> Expr | Tensor", name, kOperand))),
               "a"_a.none(), "axis"_a.none() = nb::none(), "keepdims"_a.none() = false, "out"_a.none() = nb::none());
        }
    }
    m.def("divmod", [](nb::handle a, nb::handle b) {
        nb::handle ctx;
        Expr ea = operand(a, ctx, "divmod"), eb = operand(b, ctx, "divmod");
        return nb::make_tuple(wrap(floor_divide(ea, eb), ctx), wrap(remainder(ea, eb), ctx));
    }, nb::sig(signature(fmt::format("def divmod(a: {}, b: {}) -> tuple[Expr, Expr]", kOperand, kOperand))),
       "a"_a.none(), "b"_a.none(), "(floor_divide(a, b), remainder(a, b)): two lazy expressions.");
    m.def("where", [](nb::handle c, nb::handle a, nb::handle b, nb::handle out) {
        nb::handle ctx;
        Expr ec = operand(c, ctx, "where"), ea = operand(a, ctx, "where"), eb = operand(b, ctx, "where");
        return finish(where(ec, ea, eb), ctx, out, "where");
    }, "condition"_a.none(), "x"_a.none(), "y"_a.none(), "out"_a.none() = nb::none());
    m.def("grad", [](nb::handle y, nb::handle wrt, nb::handle dy) -> nb::object {
        nb::handle ctx;
        Expr ey = operand(y, ctx, "grad");
        const bool one = nb::isinstance<PyTensor>(wrt);
        std::vector<Expr> ws;
        if (one) {
            ws.push_back(operand(wrt, ctx, "grad"));
        } else {
            if (!nb::isinstance<nb::sequence>(wrt) || nb::isinstance<nb::str>(wrt))
                throw Error(fmt::format("grad: wrt must be a kiln tensor or a sequence of them; got {}",
                                        nb::type_name(wrt.type()).c_str()), Error::Kind::Type);
            for (nb::handle w : wrt) {
                if (!nb::isinstance<PyTensor>(w))
                    throw Error(fmt::format("grad: wrt must hold kiln tensors (the leaves to differentiate with respect "
                                            "to); got {}", nb::type_name(w.type()).c_str()), Error::Kind::Type);
                ws.push_back(operand(w, ctx, "grad"));
            }
        }
        Expr edy = dy.is_none() ? Expr(1.0) : operand(dy, ctx, "grad");
        std::vector<Expr> gs = kiln::grad(ey, ws, edy);
        if (one) return wrap(gs[0], ctx);
        nb::list out;
        for (const Expr& g : gs) out.append(wrap(g, ctx));
        return out;
    }, "y"_a.none(), "wrt"_a, "dy"_a.none() = nb::none(),
       "The vector-Jacobian product dy^T (dy/dwrt) for each tensor of wrt, as lazy expressions of their shapes and "
       "dtypes (kiln/grad.hpp): the derivative of sum(dy * y); dy defaults to ones.");
    m.def("clip", &clip_call, "a"_a.none(), "a_min"_a.none(), "a_max"_a.none(), "out"_a.none() = nb::none());
    m.def("astype", [](nb::handle a, nb::handle dtype) {
        nb::handle ctx;
        Expr e = operand(a, ctx, "astype");
        return wrap(cast(e, dtype_arg(dtype, "astype")), ctx);
    }, "a"_a.none(), "dtype"_a, "Lazy cast to dtype.");
    m.def("take", [](nb::handle a, nb::handle indices, nb::handle axis, nb::handle out) {
        nb::handle ctx;
        Expr ea = operand(a, ctx, "take");
        Expr ei;
        nb::handle ictx = ctx;
        nb::object uploaded;
        if (!to_expr(indices, ei, ictx)) {
            uploaded = nb::module_::import_("kiln").attr("asarray")(indices, "ctx"_a = context_object(ctx, "take"));
            ei = nb::inst_ptr<PyTensor>(uploaded)->t.expr();
        }
        std::optional<int> ax;
        if (!axis.is_none()) ax = axis_value(axis, ea.rank(), "take");
        return finish(take(ea, ei, ax), ctx, out, "take");
    }, "a"_a.none(), "indices"_a.none(), "axis"_a.none() = nb::none(), "out"_a.none() = nb::none(),
       "Gathers along axis (None: of the flattened tensor). Negative indices count from the end; out-of-range ones are clipped.");
    m.def("onehot", [](nb::handle indices, int64_t num_classes, int axis, nb::handle dtype, nb::handle out) {
        nb::handle ctx;
        Expr ei = operand(indices, ctx, "onehot");
        DType dt = dtype.is_none() ? DType::Float32 : dtype_arg(dtype, "onehot");
        return finish(onehot(ei, num_classes, axis, dt), ctx, out, "onehot");
    }, "indices"_a.none(), "num_classes"_a, "axis"_a = -1, "dtype"_a.none() = nb::none(), "out"_a.none() = nb::none());
    m.def("_iota", [](nb::handle shape, int axis) { return wrap(iota(shape_arg(shape, "iota"), axis), nb::none()); });
    m.def("_rand", [](nb::handle shape, nb::handle ctx) { return wrap(rand(shape_arg(shape, "rand")), ctx); },
          "shape"_a, "ctx"_a.none() = nb::none());
}

} // namespace kiln::py
