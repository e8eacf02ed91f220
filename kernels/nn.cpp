// Batch norm, softmax, cross-entropy and the activation helpers (kiln/nn.hpp): operand checks,
// then expressions. Batch norm views x as (n, C) so that each statistic is one column reduction
// and y one elementwise kernel.
#include <kiln/nn.hpp>

#include "ir/error.hpp"
#include <kiln/context.hpp>

namespace kiln {

namespace {

std::string desc(const Tensor& t) { return fmt::format("{} {}", dtype_name(t.dtype()), shape_str(t.shape())); }

void check_defined(const Tensor& t, const char* name, const char* op) {
    if (!t.defined()) fail(Error::Kind::Value, "{}: {} is an empty kiln::Tensor", op, name);
}

void check_float(const Tensor& t, const char* name, const char* op) {
    if (!is_float(t.dtype())) fail(Error::Kind::Type, "{}: {} is {}; it must be a float tensor", op, name, desc(t));
}

// A per-channel tensor: (C,) or (C, 1), float, usable with x's context.
void check_channels(const Tensor& v, const Tensor& x, int64_t C, const char* name, const char* op) {
    check_defined(v, name, op);
    if (!x.context().can_use(v))
        fail(Error::Kind::Value, "{}: {} lives on {} of another context, but x runs on {}", op, name,
             v.context().device_name(), x.context().device_name());
    check_float(v, name, op);
    if (v.shape() != Shape{C} && v.shape() != Shape{C, 1})
        fail(Error::Kind::Value, "{}: {} is {}; x has {} channels (its last axis), so it must be ({},) or ({}, 1)", op, name,
             desc(v), C, C, C);
}

// x (..., C): C and the batch size n (every other axis).
std::pair<int64_t, int64_t> channels_of(const Tensor& x, const char* op) {
    check_defined(x, "x", op);
    check_float(x, "x", op);
    if (x.rank() < 1 || x.shape().back() < 1 || x.size() == 0)
        fail(Error::Kind::Value, "{}: x is {}; it needs a last (channel) axis and at least one element per channel", op,
             desc(x));
    return {x.shape().back(), x.size() / x.shape().back()};
}

void check_like(const Tensor& t, const Tensor& x, const char* name, const char* op) {
    check_defined(t, name, op);
    if (!x.context().can_use(t) || t.shape() != x.shape())
        fail(Error::Kind::Value, "{}: {} is {}; it must have x's shape {} and context", op, name, desc(t),
             shape_str(x.shape()));
    check_float(t, name, op);
}

Expr per_channel(const Tensor& v, int64_t C) { return reshape(v.expr(), {1, C}); }
void store(Tensor& v, const Expr& e) { v.assign(reshape(e, v.shape())); }

Expr relu_keep_nan(const Expr& e) { return where(less(e, 0.0), Expr(0.0), e); }

} // namespace

void compound_fprop_bn(const Tensor& x, Tensor& xsum, Tensor& xvar, Tensor& gmean, Tensor& gvar, const Tensor& gamma,
                       const Tensor& beta, Tensor& y, double eps, double rho, bool compute_batch_sum, double accumbeta,
                       bool relu, bool inference) {
    const char* op = "compound_fprop_bn";
    const auto [C, n] = channels_of(x, op);
    for (auto [t, name] : {std::pair{&xsum, "xsum"}, {&xvar, "xvar"}, {&gmean, "gmean"}, {&gvar, "gvar"}})
        check_channels(*t, x, C, name, op);
    check_channels(gamma, x, C, "gamma", op);
    check_channels(beta, x, C, "beta", op);
    check_like(y, x, "y", op);
    if (!(eps >= 0)) fail(Error::Kind::Value, "{}: eps={}; it must be >= 0", op, eps);
    if (!(rho >= 0 && rho <= 1)) fail(Error::Kind::Value, "{}: rho={}; the running averages' weight is in [0, 1]", op, rho);
    const Expr x2 = reshape(x.expr(), {n, C});
    Expr mean_e, var_e;
    if (inference) {
        mean_e = per_channel(gmean, C);
        var_e = per_channel(gvar, C);
    } else {
        if (compute_batch_sum) store(xsum, sum(x2, 0, true));
        mean_e = per_channel(xsum, C) * (1.0 / (double)n);
        store(xvar, mean(square(x2 - mean_e), 0, true));
        var_e = per_channel(xvar, C);
        store(gmean, per_channel(gmean, C) * rho + mean_e * (1.0 - rho));
        store(gvar, per_channel(gvar, C) * rho + var_e * (1.0 - rho));
    }
    Expr out = (x2 - mean_e) * reciprocal(sqrt(var_e + eps)) * per_channel(gamma, C) + per_channel(beta, C);
    if (accumbeta != 0) out = out + Expr(accumbeta) * reshape(y.expr(), {n, C});
    if (relu) out = relu_keep_nan(out);
    store(y, out);
}

void compound_bprop_bn(Tensor& delta_out, Tensor& grad_gamma, Tensor& grad_beta, const Tensor& delta_in, const Tensor& x,
                       const Tensor& xsum, const Tensor& xvar, const Tensor& gamma, double eps) {
    const char* op = "compound_bprop_bn";
    const auto [C, n] = channels_of(x, op);
    check_like(delta_in, x, "delta_in", op);
    check_like(delta_out, x, "delta_out", op);
    for (auto [t, name] : {std::pair{&xsum, "xsum"}, {&xvar, "xvar"}, {&gamma, "gamma"}})
        check_channels(*t, x, C, name, op);
    check_channels(grad_gamma, x, C, "grad_gamma", op);
    check_channels(grad_beta, x, C, "grad_beta", op);
    if (!(eps >= 0)) fail(Error::Kind::Value, "{}: eps={}; it must be >= 0", op, eps);
    const Expr x2 = reshape(x.expr(), {n, C}), d2 = reshape(delta_in.expr(), {n, C});
    const Expr rstd = reciprocal(sqrt(per_channel(xvar, C) + eps));
    const Expr xhat = (x2 - per_channel(xsum, C) * (1.0 / (double)n)) * rstd;
    store(grad_gamma, sum(d2 * xhat, 0, true));
    store(grad_beta, sum(d2, 0, true));
    const Expr g = per_channel(grad_gamma, C), b = per_channel(grad_beta, C);
    store(delta_out, per_channel(gamma, C) * (d2 - (xhat * g + b) * (1.0 / (double)n)) * rstd);
}

Expr softmax(const Expr& x, int axis) {
    const int a = normalize_axis(axis, x.rank(), "softmax");
    const Expr e = exp(x - max(x, a, true));
    return e * reciprocal(sum(e, a, true));
}

Expr cross_entropy(const Expr& p, const Expr& t, int axis, bool mean_over_rows) {
    const char* op = "cross_entropy";
    if (p.shape() != t.shape())
        fail(Error::Kind::Value, "{}: p is {} and the targets {}: one target per probability (same shapes)", op,
             shape_str(p.shape()), shape_str(t.shape()));
    const int a = normalize_axis(axis, p.rank(), op);
    const Expr pf = is_float(p.dtype()) && p.dtype() != DType::Float32 ? cast(p, DType::Float32) : p;
    const Expr rows = -sum(t * safelog(pf), a, true);
    const Expr total = sum(rows, kAllAxes, false);
    const int64_t count = p.size() / std::max<int64_t>(p.shape()[a], 1);
    return mean_over_rows ? total * (1.0 / (double)std::max<int64_t>(count, 1)) : total;
}

Expr cross_entropy_labels(const Expr& p, const Tensor& labels, bool mean_over_rows) {
    const char* op = "cross_entropy_labels";
    check_defined(labels, "labels", op);
    if (p.rank() != 2)
        fail(Error::Kind::Value, "{}: p is {}; it must be (rows, classes)", op, shape_str(p.shape()));
    const int64_t rows = p.shape()[0], classes = p.shape()[1];
    if (is_float(labels.dtype()) || labels.dtype() == DType::Bool)
        fail(Error::Kind::Type, "{}: labels are {}; class indices are an integer tensor", op, desc(labels));
    if (labels.shape() != Shape{rows} && labels.shape() != Shape{rows, 1})
        fail(Error::Kind::Value, "{}: labels are {}; p has {} rows, so they must be ({},) or ({}, 1)", op, desc(labels),
             rows, rows, rows);
    const Tensor classes_t = labels.context().arange(classes, DType::Int32);
    const Expr one_hot = cast(equal(reshape(classes_t.expr(), {1, classes}),
                                    reshape(cast(labels.expr(), DType::Int32), {rows, 1})),
                              DType::Float32);
    return cross_entropy(p, one_hot, 1, mean_over_rows);
}

Expr fprop_relu(const Expr& x, double slope) {
    return slope == 0 ? relu_keep_nan(x) : where(greater(x, 0.0), x, x * slope);
}

Expr bprop_relu(const Expr& x, const Expr& error, double slope) {
    return where(greater(x, 0.0), error, slope == 0 ? Expr(0.0) : where(less(x, 0.0), error * slope, Expr(0.0)));
}

Expr sigmoid_grad(const Expr& y) { return y * (1.0 - y); }
Expr tanh_grad(const Expr& y) { return 1.0 - y * y; }

} // namespace kiln
