// GEMM for Python: kiln.dot / compound_dot / batched_dot, the same as Context methods (the
// seeds' ng.dot, ng.compound_dot), and the @ operator. Unlike elementwise operations these run
// at once (GEMM is not fused into expressions); expression operands are evaluated first.
#include "binding.hpp"

#include <nanobind/stl/string.h>

namespace kiln::py {

namespace {

using namespace nb::literals;

DotOptions options(double alpha, double beta, bool relu, double slope, nb::handle bias, nb::handle bsum, const char* op) {
    DotOptions o;
    o.alpha = alpha;
    o.beta = beta;
    o.relu = relu;
    o.slope = slope;
    o.bias = optional_tensor(bias, "bias", op);
    o.bsum = optional_tensor(bsum, "bsum", op);
    return o;
}

nb::object compound(nb::handle A, nb::handle B, nb::handle C, double alpha, double beta, bool relu, double slope,
                    nb::handle bias, nb::handle bsum, bool batched) {
    const char* op = batched ? "batched_dot" : "compound_dot";
    PyTensor a = value_of(A, op), b = value_of(B, op);
    PyTensor& c = out_tensor(C, "C", op);
    DotOptions o = options(alpha, beta, relu, slope, bias, bsum, op);
    run_unlocked(owner(c), [&] {
        if (batched) batched_dot(a.t, b.t, c.t, o);
        else compound_dot(a.t, b.t, c.t, o);
    });
    return nb::borrow(C);
}

// NumPy's dot for vectors and matrices: a vector operand acts as a row (left) or a column
// (right), and its dimension is dropped from the result.
nb::object matrix_product(nb::handle a, nb::handle b, nb::handle out) {
    const char* op = "dot";
    PyTensor A = value_of(a, op), B = value_of(b, op);
    const bool va = A.t.rank() == 1, vb = B.t.rank() == 1;
    if (A.t.rank() < 1 || A.t.rank() > 2 || B.t.rank() < 1 || B.t.rank() > 2)
        throw Error(fmt::format("dot: operands are vectors or matrices; got {} {} and {} {} (batched_dot takes a batch)",
                                dtype_name(A.t.dtype()), shape_str(A.t.shape()), dtype_name(B.t.dtype()),
                                shape_str(B.t.shape())),
                    Error::Kind::Value);
    Tensor a2 = va ? A.t.reshape({1, A.t.shape()[0]}) : A.t;
    Tensor b2 = vb ? B.t.reshape({B.t.shape()[0], 1}) : B.t;
    Shape result;
    if (!va) result.push_back(a2.shape()[0]);
    if (!vb) result.push_back(b2.shape()[1]);
    if (out.is_none()) {
        Tensor c;
        run_unlocked(owner(A), [&] { c = kiln::dot(a2, b2); });  // a new contiguous matrix: always viewable
        return nb::cast(PyTensor{*c.reshape_view(result), A.ctx});
    }
    PyTensor& C = out_tensor(out, "out", op);
    if (C.t.shape() != result)
        throw Error(fmt::format("dot: out is {} {}, but the result is {}", dtype_name(C.t.dtype()), shape_str(C.t.shape()),
                                shape_str(result)),
                    Error::Kind::Value);
    std::optional<Tensor> c2 = C.t.reshape_view({a2.shape()[0], b2.shape()[1]});
    if (!c2) throw Error("dot: out cannot be viewed as a matrix (pass a contiguous tensor)", Error::Kind::Value);
    run_unlocked(owner(C), [&] { compound_dot(a2, b2, *c2); });
    return nb::borrow(out);
}

} // namespace

void bind_gemm(nb::module_& m, nb::handle context_class, nb::handle tensor_class, nb::handle expr_class) {
    const char* doc =
        "C = relu_slope(alpha * A . B + bias) + beta * C, written into C (returned). A and B may be transposed\n"
        "views (A.T). bias: one value per column; bsum receives the per-row sums of C as stored (rounded to its dtype).";
    auto compound_fn = [](nb::handle A, nb::handle B, nb::handle C, double alpha, double beta, bool relu, double slope,
                          nb::handle bias, nb::handle bsum) {
        return compound(A, B, C, alpha, beta, relu, slope, bias, bsum, false);
    };
    auto batched_fn = [](nb::handle A, nb::handle B, nb::handle C, double alpha, double beta, bool relu, double slope,
                         nb::handle bias, nb::handle bsum) {
        return compound(A, B, C, alpha, beta, relu, slope, bias, bsum, true);
    };
    m.def("compound_dot", compound_fn, "A"_a, "B"_a, "C"_a, "alpha"_a = 1.0, "beta"_a = 0.0, "relu"_a = false,
          "slope"_a = 0.0, "bias"_a.none() = nb::none(), "bsum"_a.none() = nb::none(), doc);
    m.def("batched_dot", batched_fn, "A"_a, "B"_a, "C"_a, "alpha"_a = 1.0, "beta"_a = 0.0, "relu"_a = false,
          "slope"_a = 0.0, "bias"_a.none() = nb::none(), "bsum"_a.none() = nb::none(),
          "compound_dot over a leading batch dimension (A or B may be a shared matrix).");
    m.def("dot", &matrix_product, "a"_a.none(), "b"_a.none(), "out"_a.none() = nb::none(),
          "The matrix product (vectors act as a row or a column, as NumPy's dot), computed at once.");
    // The same as methods of Context (the seeds' ng.dot / ng.compound_dot / ng.batched_dot).
    // The operands name the context, so the methods are the functions themselves.
    nb::object staticmethod = nb::module_::import_("builtins").attr("staticmethod");
    for (const char* name : {"compound_dot", "batched_dot", "dot"}) nb::setattr(context_class, name, staticmethod(m.attr(name)));
    for (nb::handle cls : {tensor_class, expr_class}) {
        nb::setattr(cls, "__matmul__", nb::cpp_function([](nb::handle a, nb::handle b) {
            return matrix_product(a, b, nb::none());
        }, nb::is_method(), nb::arg("other").none()));
        nb::setattr(cls, "__rmatmul__", nb::cpp_function([](nb::handle a, nb::handle b) {
            return matrix_product(b, a, nb::none());
        }, nb::is_method(), nb::arg("other").none()));
    }
}

} // namespace kiln::py
