// The network layers that are expressions (kiln/nn.hpp), for Python: neon's compound_fprop_bn,
// compound_bprop_bn, fprop_softmax, fprop_relu and bprop_relu as module functions and Context
// methods, and the pieces kiln.nn (the package) builds its NumPy-style functions from.
#include "binding.hpp"

#include <nanobind/stl/string.h>

namespace kiln::py {

namespace {

using namespace nb::literals;

PyTensor& tensor_arg(nb::handle h, const char* what, const char* op) {
    if (!nb::isinstance<PyTensor>(h))
        throw Error(fmt::format("{}: {} must be a kiln tensor", op, what), Error::Kind::Type);
    return *nb::inst_ptr<PyTensor>(h);
}

void no_binary(bool binary, const char* op) {
    if (binary)
        throw Error(fmt::format("{}: binary=True (neon's shift-based arithmetic) is not supported; kiln computes in float32",
                                op),
                    Error::Kind::Value);
}

template <class F>
void run_unlocked(PyContext& pc, F&& f) {
    nb::gil_scoped_release unlocked;
    std::lock_guard<std::mutex> one_at_a_time(pc.busy);
    f();
}

} // namespace

void bind_nn(nb::module_& m, nb::handle context_class) {
    m.def(
        "compound_fprop_bn",
        [](nb::handle x, nb::handle xsum, nb::handle xvar, nb::handle gmean, nb::handle gvar, nb::handle gamma,
           nb::handle beta, nb::handle y, double eps, double rho, bool compute_batch_sum, double accumbeta, bool relu,
           nb::handle threads, int64_t repeat, bool binary, bool inference, nb::handle outputs, nb::handle layer) {
            const char* op = "compound_fprop_bn";
            (void)threads, (void)outputs, (void)layer;   // neon's GPU scheduling and layer hooks: no effect here
            no_binary(binary, op);
            if (repeat < 1) throw Error(fmt::format("{}: repeat={}; it must be at least 1", op, repeat), Error::Kind::Value);
            PyTensor X = value_of(x, op);
            PyTensor &S = tensor_arg(xsum, "xsum", op), &V = tensor_arg(xvar, "xvar", op), &GM = tensor_arg(gmean, "gmean", op),
                     &GV = tensor_arg(gvar, "gvar", op), &Y = tensor_arg(y, "y", op);
            PyTensor G = value_of(gamma, op), B = value_of(beta, op);
            run_unlocked(owner(Y), [&] {
                for (int64_t r = 0; r < repeat; ++r)
                    compound_fprop_bn(X.t, S.t, V.t, GM.t, GV.t, G.t, B.t, Y.t, eps, rho, compute_batch_sum, accumbeta, relu,
                                      inference);
            });
            return nb::borrow(y);
        },
        "x"_a, "xsum"_a, "xvar"_a, "gmean"_a, "gvar"_a, "gamma"_a, "beta"_a, "y"_a, "eps"_a, "rho"_a,
        "compute_batch_sum"_a, "accumbeta"_a = 0.0, "relu"_a = false, "threads"_a.none() = nb::none(), "repeat"_a = 1,
        "binary"_a = false, "inference"_a = false, "outputs"_a.none() = nb::none(), "layer"_a.none() = nb::none(),
        "Batch norm forward over x (..., C), channels last: batch statistics into xsum/xvar, running averages into "
        "gmean/gvar (weight rho), y normalised (inference: from gmean/gvar). threads, outputs, layer: accepted, no effect.");
    m.def(
        "compound_bprop_bn",
        [](nb::handle delta_out, nb::handle grad_gamma, nb::handle grad_beta, nb::handle delta_in, nb::handle x,
           nb::handle xsum, nb::handle xvar, nb::handle gamma, double eps, nb::handle threads, int64_t repeat, bool binary,
           nb::handle layer) {
            const char* op = "compound_bprop_bn";
            (void)threads, (void)layer;
            no_binary(binary, op);
            if (repeat < 1) throw Error(fmt::format("{}: repeat={}; it must be at least 1", op, repeat), Error::Kind::Value);
            PyTensor &DO = tensor_arg(delta_out, "delta_out", op), &GG = tensor_arg(grad_gamma, "grad_gamma", op),
                     &GB = tensor_arg(grad_beta, "grad_beta", op);
            PyTensor DI = value_of(delta_in, op), X = value_of(x, op), S = value_of(xsum, op), V = value_of(xvar, op),
                     G = value_of(gamma, op);
            run_unlocked(owner(DO), [&] {
                for (int64_t r = 0; r < repeat; ++r) compound_bprop_bn(DO.t, GG.t, GB.t, DI.t, X.t, S.t, V.t, G.t, eps);
            });
            return nb::borrow(delta_out);
        },
        "delta_out"_a, "grad_gamma"_a, "grad_beta"_a, "delta_in"_a, "x"_a, "xsum"_a, "xvar"_a, "gamma"_a, "eps"_a,
        "threads"_a.none() = nb::none(), "repeat"_a = 1, "binary"_a = false, "layer"_a.none() = nb::none(),
        "Batch norm backward from the forward pass's xsum and xvar: grad_gamma, grad_beta and delta_out.");
    m.def(
        "fprop_softmax",
        [](nb::handle x, int axis) {
            nb::handle ctx;
            Expr e = operand(x, ctx, "fprop_softmax");
            return wrap(softmax(e, axis), ctx);
        },
        "x"_a, "axis"_a, "exp(x - max(x)) / sum(exp(x - max(x))) along axis (an expression).");
    m.def(
        "fprop_relu",
        [](nb::handle layer, nb::handle x, double slope) {
            (void)layer;
            nb::handle ctx;
            Expr e = operand(x, ctx, "fprop_relu");
            return wrap(fprop_relu(e, slope), ctx);
        },
        "layer"_a.none(), "x"_a, "slope"_a = 0.0, "max(x, 0) + slope * min(x, 0) (an expression; layer: no effect).");
    m.def(
        "bprop_relu",
        [](nb::handle layer, nb::handle x, nb::handle error, nb::handle deltas, double slope) {
            (void)layer;
            nb::handle ctx;
            Expr ex = operand(x, ctx, "bprop_relu"), ee = operand(error, ctx, "bprop_relu");
            Expr r = bprop_relu(ex, ee, slope);
            if (deltas.is_none()) return wrap(r, ctx);
            assign(tensor_arg(deltas, "deltas", "bprop_relu"), r);
            return nb::borrow(deltas);
        },
        "layer"_a.none(), "x"_a, "error"_a, "deltas"_a.none() = nb::none(), "slope"_a = 0.0,
        "error * ((x > 0) + slope * (x < 0)), into deltas (returned) or as an expression when deltas is None.");
    // The pieces of kiln.nn.
    m.def(
        "_cross_entropy",
        [](nb::handle p, nb::handle t, int axis, bool mean) {
            nb::handle ctx;
            Expr ep = operand(p, ctx, "cross_entropy");
            if (nb::isinstance<PyTensor>(t)) {
                const Tensor& labels = nb::inst_ptr<PyTensor>(t)->t;
                if (!is_float(labels.dtype())) return wrap(cross_entropy_labels(ep, labels, mean), ctx);
            }
            Expr et = operand(t, ctx, "cross_entropy");
            return wrap(cross_entropy(ep, et, axis, mean), ctx);
        },
        "p"_a, "t"_a, "axis"_a, "mean"_a);
    m.def(
        "_activation_grad",
        [](nb::handle y, const std::string& kind) {
            nb::handle ctx;
            Expr e = operand(y, ctx, "activation_grad");
            if (kind == "sigmoid") return wrap(sigmoid_grad(e), ctx);
            if (kind == "tanh") return wrap(tanh_grad(e), ctx);
            throw Error(fmt::format("activation_grad: kind='{}'; it is 'sigmoid' or 'tanh'", kind), Error::Kind::Value);
        },
        "y"_a, "kind"_a);
    nb::object staticmethod = nb::module_::import_("builtins").attr("staticmethod");
    for (const char* name : {"compound_fprop_bn", "compound_bprop_bn", "fprop_softmax", "fprop_relu", "bprop_relu"})
        nb::setattr(context_class, name, staticmethod(m.attr(name)));
}

} // namespace kiln::py
