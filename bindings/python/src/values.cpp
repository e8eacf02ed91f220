// kiln.Tensor (memory, views, indexing, assignment) and kiln.Expr (a lazy expression). Both
// take part in arithmetic through the same operator table; a Tensor is a value, an Expr
// becomes one when it is assigned (t[...] = e), evaluated (e.eval()) or used where a value is
// needed (NumPy conversion, printing, indexing, DLPack). The host-side conveniences (get,
// __array__, repr, tolist) are added by the Python package on top of _download/_upload.
#include "indexing.hpp"
#include "ops.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace kiln::py {

namespace {

using namespace nb::literals;

// transpose(1, 0), transpose((1, 0)) or transpose(None).
std::vector<int> perm_arg(nb::args args) {
    std::vector<int> perm;
    nb::handle src = args;
    if (args.size() == 1 && !args[0].is_none() && !PyIndex_Check(args[0].ptr())) src = args[0];
    if (args.size() == 1 && args[0].is_none()) return perm;
    for (nb::handle h : src) {
        if (!PyIndex_Check(h.ptr()) || PyBool_Check(h.ptr()))
            throw Error(fmt::format("transpose: axes are ints, got {}", nb::cast<std::string>(nb::str(h.type().attr("__name__")))),
                        Error::Kind::Type);
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(nb::int_(h).ptr(), &overflow);
        if (overflow || v < INT32_MIN || v > INT32_MAX)  // out of range for any rank: normalize_axis names the rank
            throw Error(fmt::format("transpose: axis {} is out of range", nb::cast<std::string>(nb::str(h))), Error::Kind::Index);
        perm.push_back((int)v);
    }
    return perm;
}

Shape shape_from_args(nb::args args, const char* op) {
    if (args.size() == 1) return shape_arg(args[0], op);
    return shape_arg(args, op);
}

// A view with the size-1 axes dropped (all of them, or those in `axis`).
Shape squeezed(const Shape& s, nb::handle axis, const char* op) {
    Axes ax = parse_axes(axis, (int)s.size(), op);
    Shape out;
    for (int d = 0; d < (int)s.size(); ++d) {
        bool listed = ax.all || std::find(ax.list.begin(), ax.list.end(), d) != ax.list.end();
        if (listed && s[d] != 1 && !ax.all)
            throw Error(fmt::format("{}: cannot squeeze axis {} of shape {}: its size is {}, not 1", op, d, shape_str(s), s[d]),
                        Error::Kind::Value);
        if (!(listed && s[d] == 1)) out.push_back(s[d]);
    }
    return out;
}

nb::object tensor_reshape(const PyTensor& self, const Shape& want) {
    if (auto v = self.t.reshape_view(want)) return nb::cast(PyTensor{std::move(*v), self.ctx});
    return nb::cast(evaluate(reshape(self.t.expr(), want), self.ctx));
}

template <class T>
void bind_arithmetic(nb::class_<T>& cls) {
    struct Op { const char* name; BinaryFn fn; bool reflected; };
    static const Op ops[] = {
        {"__add__", add, false}, {"__radd__", add, true}, {"__sub__", subtract, false}, {"__rsub__", subtract, true},
        {"__mul__", multiply, false}, {"__rmul__", multiply, true}, {"__truediv__", divide, false},
        {"__rtruediv__", divide, true}, {"__floordiv__", floor_divide, false}, {"__rfloordiv__", floor_divide, true},
        {"__mod__", remainder, false}, {"__rmod__", remainder, true}, {"__pow__", power, false}, {"__rpow__", power, true},
        {"__eq__", equal, false}, {"__ne__", not_equal, false}, {"__lt__", less, false}, {"__le__", less_equal, false},
        {"__gt__", greater, false}, {"__ge__", greater_equal, false},
        {"__and__", bitwise_and, false}, {"__rand__", bitwise_and, true}, {"__or__", bitwise_or, false},
        {"__ror__", bitwise_or, true}, {"__xor__", bitwise_xor, false}, {"__rxor__", bitwise_xor, true},
        {"__lshift__", bitwise_left_shift, false}, {"__rlshift__", bitwise_left_shift, true},
        {"__rshift__", bitwise_right_shift, false}, {"__rrshift__", bitwise_right_shift, true},
    };
    for (const Op& o : ops) {
        BinaryFn fn = o.fn;
        bool refl = o.reflected;
        const char* name = o.name;
        cls.def(name, [fn, refl, name](nb::handle a, nb::handle b) { return binary_operator(a, b, fn, refl, name); },
                nb::sig(signature(fmt::format("def {}(self, other: {}, /) -> Expr", name, kOperand))), nb::arg().none());
    }
    cls.def("__divmod__", [](nb::handle a, nb::handle b) { return divmod_operator(a, b, false, "__divmod__"); },
            nb::sig(signature(fmt::format("def __divmod__(self, other: {}, /) -> tuple[Expr, Expr]", kOperand))),
            nb::arg().none());
    cls.def("__rdivmod__", [](nb::handle a, nb::handle b) { return divmod_operator(a, b, true, "__rdivmod__"); },
            nb::sig(signature(fmt::format("def __rdivmod__(self, other: {}, /) -> tuple[Expr, Expr]", kOperand))),
            nb::arg().none());
    cls.def("__neg__", [](nb::handle a) { nb::handle c; return wrap(negative(operand(a, c, "negative")), c); },
            nb::sig("def __neg__(self) -> Expr"));
    cls.def("__pos__", [](nb::handle a) { return nb::borrow(a); });
    cls.def("__invert__", [](nb::handle a) { nb::handle c; return wrap(bitwise_invert(operand(a, c, "bitwise_invert")), c); },
            nb::sig("def __invert__(self) -> Expr"));
    cls.def("__abs__", [](nb::handle a) { nb::handle c; return wrap(absolute(operand(a, c, "absolute")), c); },
            nb::sig("def __abs__(self) -> Expr"));
    // NumPy-style reduction methods: keepdims=False.
    for (const ReductionOp& r : reduction_ops()) {
        std::string n = r.name;
        if (n == "amax" || n == "amin") continue;
        Reduction kind = r.r;
        const char* name = r.name;
        cls.def(name, [kind, name](nb::handle self, nb::handle axis, nb::handle keepdims_arg, nb::handle out, nb::handle ddof) {
            nb::handle ctx;
            Expr e = reduce(kind, operand(self, ctx, name), axis, keepdims_arg, real_value(ddof, "ddof", name), nb::handle(), name);
            return finish(e, ctx, out, name);
        }, nb::sig(signature(fmt::format("def {}(self, axis: int | tuple[int, ...] | None = None, keepdims: bool = False, "
                                         "out: Tensor | None = None, ddof: float = 0) -> Expr | Tensor", name))),
           "axis"_a.none() = nb::none(), "keepdims"_a.none() = false, "out"_a.none() = nb::none(), "ddof"_a.none() = 0);
    }
    cls.def("clip", &clip_call, "a_min"_a.none() = nb::none(), "a_max"_a.none() = nb::none(), "out"_a.none() = nb::none());
    cls.def("astype", [](nb::handle self, nb::handle dtype) {
        nb::handle ctx;
        Expr e = operand(self, ctx, "astype");
        return wrap(cast(e, dtype_arg(dtype, "astype")), ctx);
    }, nb::sig("def astype(self, dtype: object) -> Expr"), "dtype"_a,
       "A lazy cast: evaluated on assignment or when a value is needed.");
    cls.def_prop_ro("ndim", [](nb::handle self) { nb::handle c; return operand(self, c, "ndim").rank(); });
    cls.def_prop_ro("size", [](nb::handle self) { nb::handle c; return operand(self, c, "size").size(); });
    cls.def_prop_ro("dtype", [](nb::handle self) { nb::handle c; return dtype_object(operand(self, c, "dtype").dtype()); });
    cls.def_prop_ro("shape", [](nb::handle self) { nb::handle c; return shape_tuple(operand(self, c, "shape").shape()); });
    cls.def_prop_ro("_dtype", [](nb::handle self) { nb::handle c; return operand(self, c, "dtype").dtype(); });
    cls.attr("__array_ufunc__") = nb::none();  // NumPy defers to kiln's reflected operators
    cls.attr("__array_priority__") = 1000;
    cls.attr("__hash__") = nb::none();
}

} // namespace

void bind_values(nb::module_& m) {
    auto tensor = nb::class_<PyTensor>(m, "Tensor",
        "An n-dimensional array in a Context's memory (device or host). Operators on tensors build lazy\n"
        "expressions; `t[...] = expr` evaluates one into t. Views (slices, .T, reshape) share memory.");
    bind_arithmetic(tensor);
    tensor
        .def_prop_ro("strides", [](const PyTensor& s) {
            nb::list l;
            for (int64_t st : s.t.strides()) l.append(st * (int64_t)dtype_size(s.t.dtype()));
            return nb::tuple(l);
        }, "Strides in bytes, as NumPy's.")
        .def_prop_ro("itemsize", [](const PyTensor& s) { return dtype_size(s.t.dtype()); })
        .def_prop_ro("nbytes", [](const PyTensor& s) { return (size_t)s.t.size() * dtype_size(s.t.dtype()); })
        .def_prop_ro("device", [](const PyTensor& s) { return s.t.context().device_name(); })
        .def_prop_ro("ctx", [](const PyTensor& s) { return s.ctx; }, "The Context whose memory this is.")
        .def_prop_ro("is_contiguous", [](const PyTensor& s) { return s.t.is_contiguous(); })
        .def_prop_ro("_data_ptr", [](const PyTensor& s) {
            return (uintptr_t)s.t.data();
        })
        .def_prop_ro("T", [](const PyTensor& s) { return PyTensor{s.t.transpose(), s.ctx}; })
        .def("transpose", [](const PyTensor& s, nb::args axes) {
            return PyTensor{s.t.transpose(perm_arg(axes)), s.ctx};
        }, "A view with the axes permuted (reversed when none are given).")
        .def("reshape", [](const PyTensor& s, nb::args shape) { return tensor_reshape(s, shape_from_args(shape, "reshape")); },
             "A view when the memory allows it, else a copy (as NumPy's reshape).")
        .def("ravel", [](const PyTensor& s) { return tensor_reshape(s, {-1}); })
        .def("flatten", [](const PyTensor& s) { return evaluate(reshape(s.t.expr(), {s.t.size()}), s.ctx); })
        .def("squeeze", [](const PyTensor& s, nb::handle axis) {
            return tensor_reshape(s, squeezed(s.t.shape(), axis, "squeeze"));
        }, "axis"_a.none() = nb::none())
        .def("copy", [](const PyTensor& s) { return evaluate(s.t.expr(), s.ctx); })
        .def("eval", [](nb::handle s) { return nb::borrow(s); }, "A tensor is already a value: itself.")
        .def("fill", [](PyTensor& s, nb::handle v) {
            nb::handle c;
            assign(s, operand(v, c, "fill"));
        })
        .def("__len__", [](const PyTensor& s) {
            if (s.t.rank() == 0) throw Error("len() of a 0-d tensor", Error::Kind::Type);
            return s.t.shape()[0];
        })
        .def("__getitem__", [](const PyTensor& s, nb::handle key_arg) -> nb::object {
            const nb::object uploaded_mask = host_mask_uploaded(key_arg, s.ctx);
            const nb::handle key = uploaded_mask;
            if (is_whole(key)) return nb::cast(s);
            // Masks and several index arrays: shapes that depend on the data, or NumPy's
            // advanced indexing, computed on the host (kiln/_host_functions.py).
            if (is_mask(key) || several_array_indices(key))
                return nb::module_::import_("kiln._host_functions").attr("host_getitem")(nb::cast(s), key);
            Index ix = parse_index(s.t, key);
            if (ix.gather_axis < 0) return nb::cast(PyTensor{ix.view, s.ctx});
            nb::handle c = s.ctx;
            Expr idx;
            nb::object uploaded;
            if (!to_expr(ix.gather, idx, c)) {
                uploaded = nb::module_::import_("kiln").attr("asarray")(ix.gather, "ctx"_a = s.ctx);
                idx = nb::inst_ptr<PyTensor>(uploaded)->t.expr();
            }
            if (is_float(idx.dtype()))
                throw Error(fmt::format("index: a {} array cannot index; use integers", dtype_name(idx.dtype())),
                            Error::Kind::Index);
            if (idx.dtype() == DType::Bool)
                throw Error("index: a bool array indexes as a mask only as the whole key (x[mask]); beside other "
                            "indices, select with kiln.where or integer indices",
                            Error::Kind::Index);
            return wrap(take(ix.view.expr(), idx, ix.gather_axis), s.ctx);
        }, "key"_a.none())
        .def("__setitem__", [](PyTensor& s, nb::handle key_arg, nb::handle value) {
            const nb::object uploaded_mask = host_mask_uploaded(key_arg, s.ctx);
            const nb::handle key = uploaded_mask;
            if (is_mask(key)) {
                nb::module_::import_("kiln._host_functions").attr("mask_setitem")(nb::cast(s), key, value);
                return;
            }
            PyTensor target = s;
            if (!is_whole(key)) {
                Index ix = parse_index(s.t, key);
                if (ix.gather_axis >= 0)
                    throw Error("index: assignment through an integer-array index is not supported; assign to a slice",
                                Error::Kind::Index);
                target.t = ix.view;
            }
            nb::handle c;
            Expr e;
            if (to_expr(value, e, c)) {
                assign(target, e);
                return;
            }
            nb::module_::import_("kiln._host").attr("assign_host")(nb::cast(target), value);
        }, "key"_a.none(), "value"_a.none())
        .def("_download", [](const PyTensor& s, uintptr_t ptr, DType as) {
            PyContext& pc = owner(s);
            nb::gil_scoped_release unlocked;
            std::lock_guard<std::mutex> one_at_a_time(pc.busy);
            s.t.copy_to_host((void*)ptr, as);
        })
        .def("_upload", [](PyTensor& s, uintptr_t ptr, DType as) {
            PyContext& pc = owner(s);
            nb::gil_scoped_release unlocked;
            std::lock_guard<std::mutex> one_at_a_time(pc.busy);
            s.t.copy_from_host((const void*)ptr, as);
        });
    bind_dlpack_methods(tensor);
    // t += e (and the others) evaluate into t, as NumPy's in-place operators write into the array.
    static const BinaryOp in_place[] = {{"__iadd__", add}, {"__isub__", subtract}, {"__imul__", multiply},
                                        {"__itruediv__", divide}, {"__ifloordiv__", floor_divide},
                                        {"__imod__", remainder}, {"__ipow__", power}, {"__iand__", bitwise_and},
                                        {"__ior__", bitwise_or}, {"__ixor__", bitwise_xor},
                                        {"__ilshift__", bitwise_left_shift}, {"__irshift__", bitwise_right_shift}};
    for (const BinaryOp& op : in_place) {
        BinaryFn fn = op.fn;
        tensor.def(op.name, [fn, name = op.name](nb::handle self, nb::handle other) -> nb::object {
            PyTensor& s = out_tensor(self, "self", name);
            nb::handle c;
            Expr e;
            if (!to_expr(other, e, c)) throw Error(not_an_operand(other, "in-place operator"), Error::Kind::Type);
            assign(s, fn(s.t.expr(), e));
            return nb::borrow(self);
        });
    }

    auto expr = nb::class_<PyExpr>(m, "Expr",
        "A lazy expression over tensors. Assign it (t[...] = e) to evaluate it into a tensor, or use it\n"
        "where a value is needed (e.eval(), np.asarray(e), print(e)).");
    bind_arithmetic(expr);
    expr.def("eval", [](const PyExpr& e) { return evaluate(e.e, e.ctx); }, "A new tensor holding the value.")
        .def_prop_ro("ctx", [](const PyExpr& e) { return context_object(e.ctx, "Expr.ctx"); })
        .def_prop_ro("T", [](const PyExpr& e) { PyTensor t = evaluate(e.e, e.ctx); return PyTensor{t.t.transpose(), t.ctx}; })
        .def("transpose", [](const PyExpr& e, nb::args axes) {
            PyTensor t = evaluate(e.e, e.ctx);
            return PyTensor{t.t.transpose(perm_arg(axes)), t.ctx};
        })
        .def("reshape", [](const PyExpr& e, nb::args shape) {
            return wrap(reshape(e.e, shape_from_args(shape, "reshape")), e.ctx);
        }, "A lazy reshape (row-major order).")
        .def("ravel", [](const PyExpr& e) { return wrap(reshape(e.e, {-1}), e.ctx); })
        .def("flatten", [](const PyExpr& e) { return wrap(reshape(e.e, {-1}), e.ctx); })
        .def("squeeze", [](const PyExpr& e, nb::handle axis) {
            return wrap(reshape(e.e, squeezed(e.e.shape(), axis, "squeeze")), e.ctx);
        }, "axis"_a.none() = nb::none())
        .def("copy", [](const PyExpr& e) { return evaluate(e.e, e.ctx); })
        .def("__len__", [](const PyExpr& e) {
            if (e.e.rank() == 0) throw Error("len() of a 0-d expression", Error::Kind::Type);
            return e.e.shape()[0];
        })
        .def("__getitem__", [](const PyExpr& e, nb::handle key) {
            return nb::cast(evaluate(e.e, e.ctx)).attr("__getitem__")(key);
        }, "key"_a.none())
        .def("graph", [](const PyExpr& e) { return e.e.str(); }, "The expression graph, one node per line.");
}

} // namespace kiln::py
