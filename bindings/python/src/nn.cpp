// The network layers that are expressions (kiln/nn.hpp), for Python: neon's compound_fprop_bn,
// compound_bprop_bn, fprop_softmax, fprop_relu and bprop_relu as module functions and Context
// methods, and the pieces kiln.nn (the package) builds its NumPy-style functions from.
#include "binding.hpp"

#include <kiln/hist.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

namespace kiln::py {

namespace {

using namespace nb::literals;

void no_binary(bool binary, const char* op) {
    if (binary)
        throw Error(fmt::format("{}: binary=True (neon's shift-based arithmetic) is not supported; kiln computes in float32",
                                op),
                    Error::Kind::Value);
}

// A tensor whose memory a histogram tag names: a kiln Tensor (an expression has no memory of its own).
const Tensor& tagged_tensor(nb::handle x, const char* op) {
    if (!nb::isinstance<PyTensor>(x))
        throw Error(fmt::format("{}: x must be a kiln Tensor (a tag names memory; an expression has none), got {}", op,
                                py_type_name(x)),
                    Error::Kind::Type);
    return nb::inst_ptr<PyTensor>(x)->t;
}

// fprop_lrn's and bprop_lrn's numbers, checked.
struct LrnScalars {
    double alpha, beta, ascale, bpower;
};
LrnScalars lrn_scalars(nb::handle alpha, nb::handle beta, nb::handle ascale, nb::handle bpower, const char* op) {
    return {real_value(alpha, "alpha", op), real_value(beta, "beta", op), real_value(ascale, "ascale", op),
            real_value(bpower, "bpower", op)};
}

} // namespace

void bind_nn(nb::module_& m, nb::handle context_class) {
    m.def(
        "compound_fprop_bn",
        [](nb::handle x, nb::handle xsum, nb::handle xvar, nb::handle gmean, nb::handle gvar, nb::handle gamma,
           nb::handle beta, nb::handle y, double eps, double rho, bool compute_batch_sum, double accumbeta, bool relu,
           nb::handle threads, int64_t repeat, bool binary, bool inference, nb::handle outputs, nb::handle layer,
           nb::handle residual) {
            const char* op = "compound_fprop_bn";
            (void)threads, (void)outputs, (void)layer;   // neon's GPU scheduling and layer hooks: no effect here
            no_binary(binary, op);
            check_repeat(repeat, op);
            PyTensor X = value_of(x, op);
            PyTensor &S = out_tensor(xsum, "xsum", op), &V = out_tensor(xvar, "xvar", op), &GM = out_tensor(gmean, "gmean", op),
                     &GV = out_tensor(gvar, "gvar", op), &Y = out_tensor(y, "y", op);
            PyTensor G = value_of(gamma, op), B = value_of(beta, op);
            PyTensor R;
            if (!residual.is_none()) R = value_of(residual, op);
            repeat_unlocked(owner(Y), repeat, [&] {
                compound_fprop_bn(X.t, S.t, V.t, GM.t, GV.t, G.t, B.t, Y.t, eps, rho, compute_batch_sum, accumbeta, relu,
                                  inference, R.t);
            });
            return nb::borrow(y);
        },
        "x"_a, "xsum"_a, "xvar"_a, "gmean"_a, "gvar"_a, "gamma"_a, "beta"_a, "y"_a, "eps"_a, "rho"_a,
        "compute_batch_sum"_a, "accumbeta"_a = 0.0, "relu"_a = false, "threads"_a.none() = nb::none(), "repeat"_a = 1,
        "binary"_a = false, "inference"_a = false, "outputs"_a.none() = nb::none(), "layer"_a.none() = nb::none(),
        "residual"_a.none() = nb::none(),
        "Batch norm forward over x (..., C), channels last: batch statistics into xsum/xvar, running averages into "
        "gmean/gvar (weight rho), y normalised (inference: from gmean/gvar); residual (x's shape), when given, added "
        "before the relu in the same kernel. threads, outputs, layer: accepted, no effect.");
    m.def(
        "compound_bprop_bn",
        [](nb::handle delta_out, nb::handle grad_gamma, nb::handle grad_beta, nb::handle delta_in, nb::handle x,
           nb::handle xsum, nb::handle xvar, nb::handle gamma, double eps, nb::handle threads, int64_t repeat, bool binary,
           nb::handle layer) {
            const char* op = "compound_bprop_bn";
            (void)threads, (void)layer;
            no_binary(binary, op);
            check_repeat(repeat, op);
            PyTensor &DO = out_tensor(delta_out, "delta_out", op), &GG = out_tensor(grad_gamma, "grad_gamma", op),
                     &GB = out_tensor(grad_beta, "grad_beta", op);
            PyTensor DI = value_of(delta_in, op), X = value_of(x, op), S = value_of(xsum, op), V = value_of(xvar, op),
                     G = value_of(gamma, op);
            repeat_unlocked(owner(DO), repeat, [&] {
                compound_bprop_bn(DO.t, GG.t, GB.t, DI.t, X.t, S.t, V.t, G.t, eps);
            });
            return nb::borrow(delta_out);
        },
        "delta_out"_a, "grad_gamma"_a, "grad_beta"_a, "delta_in"_a, "x"_a, "xsum"_a, "xvar"_a, "gamma"_a, "eps"_a,
        "threads"_a.none() = nb::none(), "repeat"_a = 1, "binary"_a = false, "layer"_a.none() = nb::none(),
        "Batch norm backward from the forward pass's xsum and xvar: grad_gamma, grad_beta and delta_out.");
    m.def(
        "fprop_softmax",
        [](nb::handle x, nb::handle axis) {
            nb::handle ctx;
            Expr e = operand(x, ctx, "fprop_softmax");
            return wrap(softmax(e, axis_value(axis, e.rank(), "softmax")), ctx);
        },
        "x"_a.none(), "axis"_a.none(), "exp(x - max(x)) / sum(exp(x - max(x))) along axis (an expression).");
    m.def(
        "fprop_relu",
        [](nb::handle layer, nb::handle x, nb::handle slope) {
            (void)layer;
            nb::handle ctx;
            Expr e = operand(x, ctx, "fprop_relu");
            return wrap(fprop_relu(e, real_value(slope, "slope", "fprop_relu")), ctx);
        },
        nb::sig("def fprop_relu(layer: object | None, x: object, slope: float = 0.0) -> object"),
        "layer"_a.none(), "x"_a.none(), "slope"_a.none() = 0.0, "max(x, 0) + slope * min(x, 0) (an expression; layer: no effect).");
    m.def(
        "bprop_relu",
        [](nb::handle layer, nb::handle x, nb::handle error, nb::handle deltas, nb::handle slope) {
            (void)layer;
            nb::handle ctx;
            Expr ex = operand(x, ctx, "bprop_relu"), ee = operand(error, ctx, "bprop_relu");
            Expr r = bprop_relu(ex, ee, real_value(slope, "slope", "bprop_relu"));
            if (deltas.is_none()) return wrap(r, ctx);
            assign(out_tensor(deltas, "deltas", "bprop_relu"), r);
            return nb::borrow(deltas);
        },
        nb::sig("def bprop_relu(layer: object | None, x: object, error: object, deltas: object | None = None, "
                "slope: float = 0.0) -> object"),
        "layer"_a.none(), "x"_a.none(), "error"_a.none(), "deltas"_a.none() = nb::none(), "slope"_a.none() = 0.0,
        "error * ((x > 0) + slope * (x < 0)), into deltas (returned) or as an expression when deltas is None.");
    // The pieces of kiln.nn.
    m.def(
        "_cross_entropy",
        [](nb::handle p, nb::handle t, nb::handle axis_arg, bool mean) {
            nb::handle ctx;
            Expr ep = operand(p, ctx, "cross_entropy");
            const int axis = axis_value(axis_arg, ep.rank(), "cross_entropy");
            if (nb::isinstance<PyTensor>(t)) {
                const Tensor& labels = nb::inst_ptr<PyTensor>(t)->t;
                if (!is_float(labels.dtype())) return wrap(cross_entropy_labels(ep, labels, mean), ctx);
            }
            Expr et = operand(t, ctx, "cross_entropy");
            return wrap(cross_entropy(ep, et, axis, mean), ctx);
        },
        "p"_a.none(), "t"_a.none(), "axis"_a.none(), "mean"_a);
    m.def(
        "_activation_grad",
        [](nb::handle y, const std::string& kind) {
            nb::handle ctx;
            Expr e = operand(y, ctx, "activation_grad");
            if (kind == "sigmoid") return wrap(sigmoid_grad(e), ctx);
            if (kind == "tanh") return wrap(tanh_grad(e), ctx);
            throw Error(fmt::format("activation_grad: kind='{}'; it is 'sigmoid' or 'tanh'", kind), Error::Kind::Value);
        },
        "y"_a.none(), "kind"_a);
    nb::class_<PoolLayer>(m, "PoolLayer", "A pooling layer's geometry (pool_layer): pass it to fprop_pool and bprop_pool.")
        .def_prop_ro("op",
                     [](const PoolLayer& l) {
                         return l.op == PoolOp::Max ? "max" : l.op == PoolOp::Avg ? "avg" : l.op == PoolOp::L2 ? "l2" : "lrn";
                     })
        .def_prop_ro("dtype", [](const PoolLayer& l) { return dtype_object(l.dtype); })
        .def_ro("N", &PoolLayer::N)
        .def_ro("C", &PoolLayer::C)
        .def_ro("J", &PoolLayer::J)
        .def_ro("K", &PoolLayer::K)
        .def_prop_ro("M", [](const PoolLayer& l) { return l.output[0]; })
        .def_prop_ro("P", [](const PoolLayer& l) { return l.output[1]; })
        .def_prop_ro("Q", [](const PoolLayer& l) { return l.output[2]; })
        .def_prop_ro("dimI", [](const PoolLayer& l) { return shape_tuple(l.input_shape()); }, "The input's shape.")
        .def_prop_ro("dimO", [](const PoolLayer& l) { return shape_tuple(l.output_shape()); }, "The output's shape.")
        .def("__repr__", &PoolLayer::str);
    m.def(
        "pool_layer",
        [](nb::handle dtype, const std::string& op, int64_t N, int64_t C, int64_t D, int64_t H, int64_t W, int64_t J, int64_t T,
           int64_t R, int64_t S, int64_t pad_c, int64_t pad_d, int64_t pad_h, int64_t pad_w, std::optional<int64_t> str_c,
           std::optional<int64_t> str_d, std::optional<int64_t> str_h, std::optional<int64_t> str_w) {
            PoolOp kind;
            if (op == "max") kind = PoolOp::Max;
            else if (op == "avg") kind = PoolOp::Avg;
            else if (op == "l2") kind = PoolOp::L2;
            else throw Error(fmt::format("pool_layer: op='{}'; it is 'max', 'avg' or 'l2'", op), Error::Kind::Value);
            const std::pair<const char*, std::optional<int64_t>> strides[] = {
                {"str_c", str_c}, {"str_d", str_d}, {"str_h", str_h}, {"str_w", str_w}};
            for (const auto& [name, v] : strides)
                if (v && *v < 1)
                    throw Error(fmt::format("pool_layer: {}={}; strides are at least 1 (None: the window's size)", name, *v),
                                Error::Kind::Value);
            return pool_layer(dtype_arg(dtype, "pool_layer"), kind, N, C, {D, H, W}, J, {T, R, S}, pad_c, {pad_d, pad_h, pad_w},
                              str_c.value_or(0), {str_d.value_or(0), str_h.value_or(0), str_w.value_or(0)});
        },
        "dtype"_a, "op"_a, "N"_a, "C"_a, "D"_a = 1, "H"_a = 1, "W"_a = 1, "J"_a = 1, "T"_a = 1, "R"_a = 1, "S"_a = 1,
        "pad_c"_a = 0, "pad_d"_a = 0, "pad_h"_a = 0, "pad_w"_a = 0, "str_c"_a.none() = nb::none(), "str_d"_a.none() = nb::none(),
        "str_h"_a.none() = nb::none(), "str_w"_a.none() = nb::none(),
        "Pooling ('max', 'avg', 'l2') over J channels x T x R x S windows of an NDHWC input; strides default to the window.");
    m.def(
        "fprop_pool",
        [](const PoolLayer& layer, nb::handle I, nb::handle O, nb::handle argmax, double alpha, double beta, int64_t repeat) {
            const char* op = "fprop_pool";
            check_repeat(repeat, op);
            PyTensor i = value_of(I, op);
            PyTensor& o = out_tensor(O, "O", op);
            std::optional<Tensor> a = optional_tensor(argmax, "argmax", op);
            repeat_unlocked(owner(o), repeat, [&] {
                fprop_pool(layer, i.t, o.t, a, alpha, beta);
            });
            return nb::borrow(O);
        },
        "layer"_a, "I"_a, "O"_a, "argmax"_a.none() = nb::none(), "alpha"_a = 1.0, "beta"_a = 0.0, "repeat"_a = 1,
        "O = alpha * pool(I) + beta * O; argmax (int32, O's shape) receives max pooling's winning taps.");
    m.def(
        "bprop_pool",
        [](const PoolLayer& layer, nb::handle I, nb::handle O, nb::handle argmax, double alpha, double beta, int64_t repeat,
           nb::handle X, nb::handle Y) {
            const char* op = "bprop_pool";
            check_repeat(repeat, op);
            PyTensor e = value_of(I, op);
            PyTensor& g = out_tensor(O, "O", op);
            std::optional<Tensor> a = optional_tensor(argmax, "argmax", op), x, y;
            if (!X.is_none()) x = value_of(X, op).t;
            if (!Y.is_none()) y = value_of(Y, op).t;
            repeat_unlocked(owner(g), repeat, [&] {
                bprop_pool(layer, e.t, g.t, a, alpha, beta, x, y);
            });
            return nb::borrow(O);
        },
        "layer"_a, "I"_a, "O"_a, "argmax"_a.none() = nb::none(), "alpha"_a = 1.0, "beta"_a = 0.0, "repeat"_a = 1,
        "X"_a.none() = nb::none(), "Y"_a.none() = nb::none(),
        "neon's order: I is the error (the pool output's shape), O receives the input's gradient (alpha, beta as fprop); max "
        "pooling needs fprop's argmax, L2 the forward input X and output Y.");
    m.def(
        "lrn_layer",
        [](nb::handle dtype, nb::handle N, nb::handle C, nb::handle D, nb::handle H, nb::handle W, nb::handle J) {
            const char* op = "lrn_layer";
            return lrn_layer(dtype_arg(dtype, op), int_value(N, "N", op), int_value(C, "C", op),
                             {int_value(D, "D", op), int_value(H, "H", op), int_value(W, "W", op)}, int_value(J, "J", op));
        },
        nb::sig("def lrn_layer(dtype: object, N: int, C: int, D: int = 1, H: int = 1, W: int = 1, J: int = 1) -> PoolLayer"),
        "dtype"_a, "N"_a.none(), "C"_a.none(), "D"_a.none() = 1, "H"_a.none() = 1, "W"_a.none() = 1, "J"_a.none() = 1,
        "Local response normalisation across J channels (J odd) of an NDHWC input.");
    m.def(
        "fprop_lrn",
        [](const PoolLayer& layer, nb::handle I, nb::handle O, nb::handle denom, nb::handle alpha_arg, nb::handle beta_arg,
           nb::handle ascale_arg, nb::handle bpower_arg, int64_t repeat) {
            const char* op = "fprop_lrn";
            check_repeat(repeat, op);
            const auto [alpha, beta, ascale, bpower] = lrn_scalars(alpha_arg, beta_arg, ascale_arg, bpower_arg, op);
            PyTensor i = value_of(I, op);
            PyTensor &o = out_tensor(O, "O", op), &d = out_tensor(denom, "denom", op);
            repeat_unlocked(owner(o), repeat, [&] {
                fprop_lrn(layer, i.t, o.t, d.t, alpha, beta, ascale, bpower);
            });
            return nb::borrow(O);
        },
        nb::sig("def fprop_lrn(layer: PoolLayer, I: object, O: object, denom: object, alpha: float = 1.0, beta: float = 0.0, "
                "ascale: float = 1.0, bpower: float = 1.0, repeat: int = 1) -> object"),
        "layer"_a, "I"_a, "O"_a, "denom"_a, "alpha"_a.none() = 1.0, "beta"_a.none() = 0.0, "ascale"_a.none() = 1.0,
        "bpower"_a.none() = 1.0, "repeat"_a = 1,
        "denom = 1 + ascale * (window sum of I^2); O = alpha * I * denom^-bpower + beta * O.");
    m.def(
        "bprop_lrn",
        [](const PoolLayer& layer, nb::handle I, nb::handle O, nb::handle E, nb::handle delta, nb::handle denom,
           nb::handle alpha_arg, nb::handle beta_arg, nb::handle ascale_arg, nb::handle bpower_arg, int64_t repeat) {
            const char* op = "bprop_lrn";
            check_repeat(repeat, op);
            const auto [alpha, beta, ascale, bpower] = lrn_scalars(alpha_arg, beta_arg, ascale_arg, bpower_arg, op);
            PyTensor i = value_of(I, op), o = value_of(O, op), e = value_of(E, op), d = value_of(denom, op);
            PyTensor& g = out_tensor(delta, "delta", op);
            repeat_unlocked(owner(g), repeat, [&] {
                bprop_lrn(layer, i.t, o.t, e.t, g.t, d.t, alpha, beta, ascale, bpower);
            });
            return nb::borrow(delta);
        },
        nb::sig("def bprop_lrn(layer: PoolLayer, I: object, O: object, E: object, delta: object, denom: object, "
                "alpha: float = 1.0, beta: float = 0.0, ascale: float = 1.0, bpower: float = 1.0, repeat: int = 1) -> object"),
        "layer"_a, "I"_a, "O"_a, "E"_a, "delta"_a, "denom"_a, "alpha"_a.none() = 1.0, "beta"_a.none() = 0.0,
        "ascale"_a.none() = 1.0, "bpower"_a.none() = 1.0, "repeat"_a = 1, "The gradient of fprop_lrn with respect to I, from E, into delta.");
    m.def(
        "hist",
        [](nb::handle x, nb::handle tag_arg) {
            const char* op = "hist";
            PyTensor X = value_of(x, op);
            const std::string tag = str_value(tag_arg, "tag", op);
            Tensor slot;
            run_unlocked(owner(X), [&] { slot = hist(X.t, tag); });
            return wrap(std::move(slot), X.ctx);
        },
        nb::sig("def hist(x: object, tag: str) -> Tensor"), "x"_a.none(), "tag"_a.none(),
        "Counts x's values by round(log2|x|) into a new histogram slot named tag (neon's Tensor.hist): a (1, bins) "
        "int32 tensor; bin i holds the values whose rounded log2 is hist_offset + i, the first and last bins also "
        "everything below and above, 0 and NaN in the first.");
    m.def(
        "set_hist_tag",
        [](nb::handle x, nb::handle tag) {
            set_hist_tag(tagged_tensor(x, "set_hist_tag"), str_value(tag, "tag", "set_hist_tag"));
        },
        nb::sig("def set_hist_tag(x: Tensor, tag: str) -> None"), "x"_a.none(), "tag"_a.none(),
        "Tags x's memory for the numerics histograms (neon's tensor name; '' removes it): while its context's "
        "hist_named is on, every call that writes it counts what it wrote under the tag.");
    m.def("hist_tag", [](nb::handle x) { return hist_tag(tagged_tensor(x, "hist_tag")); },
          nb::sig("def hist_tag(x: Tensor) -> str"), "x"_a.none(), "The tag of x's memory, or ''.");
    nb::object staticmethod = nb::module_::import_("builtins").attr("staticmethod");
    for (const char* name : {"hist", "compound_fprop_bn", "compound_bprop_bn", "fprop_softmax", "fprop_relu", "bprop_relu",
                             "pool_layer", "fprop_pool", "bprop_pool", "lrn_layer", "fprop_lrn", "bprop_lrn"})
        nb::setattr(context_class, name, staticmethod(m.attr(name)));
}

} // namespace kiln::py
