// Conversions shared by every binding file: Python operands to expressions, dtype and shape
// arguments, evaluation and assignment with the GIL released.
#include "binding.hpp"

#include <nanobind/stl/string.h>

#include <algorithm>
#include <deque>
#include <cstdio>

namespace kiln::py {

namespace {

nb::object* g_dtype_objects = nullptr;  // kiln.float32 ... by DType, set by the package at import
nb::object* g_dtype_parser = nullptr;   // kiln.dtype(x) -> DType

nb::object& kiln_package_attr(const char* name) {
    // Looked up once: the package sets these at import, before any tensor exists.
    static nb::object* pkg = new nb::object(nb::module_::import_("kiln"));
    static std::unordered_map<std::string, nb::object*> cache;
    auto it = cache.find(name);
    if (it == cache.end()) it = cache.emplace(name, new nb::object(pkg->attr(name))).first;
    return *it->second;
}


// A Python int as a weak integer literal, of any magnitude: a float operand takes it as a float
// value, an integer operand checks that it fits (ir/expr.cpp).
Expr python_int(nb::handle h) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
    if (!overflow) return Expr((int64_t)v);
    if (overflow > 0) {   // within uint64: exact for uint64 operands
        const unsigned long long u = PyLong_AsUnsignedLongLong(h.ptr());
        if (!(u == (unsigned long long)-1 && PyErr_Occurred())) return uint_literal(u);
        PyErr_Clear();
    }
    double d = PyLong_AsDouble(h.ptr());
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        throw Error("integer operand " + nb::cast<std::string>(nb::str(h)) + " is beyond every kiln dtype's range",
                    Error::Kind::Value);
    }
    return int_literal(d);
}

bool numpy_scalar(nb::handle h, Expr& out) {
    // NumPy scalars are typed (NumPy 2): a float32 scalar keeps float32. float64 acts as a Python
    // float, and int64, int16, uint16, uint32, uint64 and the types kiln lacks as Python ints would.
    nb::handle t = h.type();
    if (!nb::hasattr(t, "__module__")) return false;
    nb::object mod = t.attr("__module__");
    if (!nb::isinstance<nb::str>(mod)) return false;
    std::string m = nb::cast<std::string>(mod);
    if (m != "numpy" && m != "ml_dtypes") return false;
    int ndim = -1;
    if (!nb::hasattr(h, "dtype") || !nb::hasattr(h, "ndim") || !nb::try_cast(h.attr("ndim"), ndim) || ndim != 0) return false;
    nb::object dtype = h.attr("dtype");
    std::string name;
    if (!nb::hasattr(dtype, "name") || !nb::try_cast(dtype.attr("name"), name)) return false;
    DType d;
    if (name == "float64") {
        out = Expr(nb::cast<double>(nb::float_(h)));
        return true;
    }
    // NumPy's default integer and the other integers wider than kiln's default act as Python
    // ints: weak, so they keep a tensor's dtype.
    const bool as_python_int =
        name == "int64" || name == "uint64" || name == "uint32" || name == "int16" || name == "uint16";
    if (as_python_int || !parse_dtype(name, d)) {
        if (nb::hasattr(h, "is_integer") || name.find("int") != std::string::npos) {
            out = python_int(nb::int_(h));
            return true;
        }
        return false;
    }
    out = scalar(nb::cast<double>(nb::float_(h)), d);
    return true;
}

} // namespace

std::string shown_text(nb::handle h) {
    nb::object s = nb::steal(PyObject_Str(h.ptr()));
    if (!s.is_valid()) {
        PyErr_Clear();
        return "(unprintable)";
    }
    // Lone surrogates (which UTF-8 cannot hold) as \udc80 escapes.
    nb::object bytes = nb::steal(PyUnicode_AsEncodedString(s.ptr(), "utf-8", "backslashreplace"));
    if (!bytes.is_valid()) {
        PyErr_Clear();
        return "(unprintable)";
    }
    return std::string(PyBytes_AS_STRING(bytes.ptr()), (size_t)PyBytes_GET_SIZE(bytes.ptr()));
}

std::string py_type_name(nb::handle h) {
    nb::handle t = h.type();
    std::string mod = nb::hasattr(t, "__module__") ? shown_text(t.attr("__module__")) : "";
    std::string name = shown_text(t.attr("__qualname__"));
    return mod.empty() || mod == "builtins" ? name : mod + "." + name;
}

bool to_expr(nb::handle h, Expr& out, nb::handle& ctx) {
    if ((nb::isinstance<PyExpr>(h) || nb::isinstance<PyTensor>(h)) && !nb::inst_ready(h))
        throw Error("a kiln tensor or expression that was never initialised (made by __new__ without __init__) "
                    "was used as an operand",
                    Error::Kind::Type);
    if (nb::isinstance<PyExpr>(h)) {
        auto* e = nb::inst_ptr<PyExpr>(h);
        out = e->e;
        if (!ctx.is_valid() || ctx.is_none()) ctx = e->ctx;
        return true;
    }
    if (nb::isinstance<PyTensor>(h)) {
        auto* t = nb::inst_ptr<PyTensor>(h);
        out = t->t.expr();
        if (!ctx.is_valid() || ctx.is_none()) ctx = t->ctx;
        return true;
    }
    PyObject* o = h.ptr();
    if (PyBool_Check(o)) {
        out = scalar(o == Py_True ? 1.0 : 0.0, DType::Bool);
        return true;
    }
    if (PyLong_Check(o)) {
        out = python_int(h);
        return true;
    }
    if (PyFloat_Check(o)) {
        out = Expr(PyFloat_AS_DOUBLE(o));
        return true;
    }
    return numpy_scalar(h, out);
}

std::string not_an_operand(nb::handle h, const char* op) {
    std::string t = py_type_name(h);
    if (t == "numpy.ndarray" || t == "list" || t == "tuple")
        return std::string(op) + ": an operand is a " + t +
               "; kiln does not copy host data implicitly: make it a tensor first with kiln.asarray(x) (or ctx.array(x))";
    return std::string(op) + ": an operand of type " + t +
           " is not a kiln tensor, expression or scalar (bool, int, float, NumPy scalar)";
}

Expr operand(nb::handle h, nb::handle& ctx, const char* op) {
    Expr e;
    if (!to_expr(h, e, ctx)) throw Error(not_an_operand(h, op), Error::Kind::Type);
    return e;
}

const char* signature(const std::string& s) {
    static std::deque<std::string> keep;
    return keep.emplace_back(s).c_str();
}

nb::object default_context() { return kiln_package_attr("default_context")(); }

nb::object context_object(nb::handle ctx, const char* op) {
    if (!ctx.is_valid() || ctx.is_none()) return default_context();
    if (nb::isinstance<PyContext>(ctx) && !nb::inst_ready(ctx))
        throw Error(fmt::format("{}: ctx is a kiln.Context that was never initialised (a subclass's __init__ must call "
                                "super().__init__())", op),
                    Error::Kind::Type);
    if (!nb::isinstance<PyContext>(ctx))
        throw Error(fmt::format("{}: ctx is of type {}; it must be a kiln.Context, or None for the default context", op,
                                nb::type_name(ctx.type()).c_str()),
                    Error::Kind::Type);
    return nb::borrow(ctx);
}

PyContext& context_of(nb::handle ctx, const char* op) { return *nb::inst_ptr<PyContext>(context_object(ctx, op)); }

nb::object wrap(Expr e, nb::handle ctx) {
    return nb::cast(PyExpr{std::move(e), ctx.is_valid() ? nb::borrow(ctx) : nb::none()});
}

nb::object wrap(Tensor t, nb::handle ctx) { return nb::cast(PyTensor{std::move(t), context_object(ctx, "tensor")}); }

void assign(PyTensor& dst, const Expr& e) {
    PyContext& pc = *nb::inst_ptr<PyContext>(dst.ctx);
    {
        nb::gil_scoped_release unlocked;
        std::lock_guard<std::mutex> one_at_a_time(pc.busy);
        dst.t.assign(e);
    }
    pc.last = e;  // under the GIL: Python threads may share a context
}

PyTensor evaluate(const Expr& e, nb::handle ctx) {
    nb::object c = context_object(ctx, "eval");
    PyTensor out{nb::inst_ptr<PyContext>(c)->c().empty(e.shape(), e.dtype()), c};
    assign(out, e);
    return out;
}

PyTensor value_of(nb::handle h, const char* op) {
    if (nb::isinstance<PyTensor>(h)) return *nb::inst_ptr<PyTensor>(h);
    if (nb::isinstance<PyExpr>(h)) {
        auto* e = nb::inst_ptr<PyExpr>(h);
        return evaluate(e->e, e->ctx);
    }
    throw Error(std::string(op) + ": expected a kiln tensor or expression, got " + py_type_name(h), Error::Kind::Type);
}

nb::object finish(const Expr& e, nb::handle ctx, nb::handle out, const char* op) {
    if (!out.is_valid() || out.is_none()) return wrap(e, ctx);
    if (!nb::isinstance<PyTensor>(out))
        throw Error(std::string(op) + ": out= must be a kiln tensor, got " + py_type_name(out), Error::Kind::Type);
    assign(*nb::inst_ptr<PyTensor>(out), e);
    return nb::borrow(out);
}

namespace {

// An int-like argument (int, NumPy integer; not bool), or a kiln.DTypeError built by
// `what_is_valid`; one beyond 64 bits is a kiln.InvalidArgument built by `too_large`.
template <class Message, class TooLarge>
int64_t int_arg(nb::handle h, Message&& what_is_valid, TooLarge&& too_large) {
    if (!PyIndex_Check(h.ptr()) || PyBool_Check(h.ptr())) throw Error(what_is_valid(), Error::Kind::Type);
    Py_ssize_t v = PyNumber_AsSsize_t(h.ptr(), PyExc_OverflowError);
    if (v == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw nb::python_error();
        PyErr_Clear();
        throw Error(too_large(nb::cast<std::string>(nb::str(h))), Error::Kind::Value);
    }
    return (int64_t)v;
}

} // namespace

int64_t int_value(nb::handle h, const char* name, const char* op) {
    return int_arg(h, [&] { return fmt::format("{}: {} must be an int, got {}", op, name, py_type_name(h)); },
                   [&](const std::string& v) { return fmt::format("{}: {}={} is past 64 bits", op, name, v); });
}

bool bool_value(nb::handle h, const char* name, const char* op) {
    if (PyBool_Check(h.ptr())) return h.ptr() == Py_True;
    // A NumPy bool scalar (no __index__ in NumPy 2), by its dtype's kind and empty shape.
    if (nb::hasattr(h, "dtype") && nb::hasattr(h, "shape")) {
        nb::object kind = nb::getattr(nb::getattr(h, "dtype"), "kind", nb::none());
        nb::object shape = nb::getattr(h, "shape");
        if (nb::isinstance<nb::str>(kind) && nb::cast<std::string>(kind) == "b" && nb::isinstance<nb::tuple>(shape) &&
            nb::len(shape) == 0)
            return PyObject_IsTrue(h.ptr()) == 1;
    }
    if (PyIndex_Check(h.ptr())) return int_value(h, name, op) != 0;
    throw Error(fmt::format("{}: {} must be a bool, got {}", op, name, py_type_name(h)), Error::Kind::Type);
}

std::string str_value(nb::handle h, const char* name, const char* op) {
    if (!nb::isinstance<nb::str>(h))
        throw Error(fmt::format("{}: {} must be a str, got {}", op, name, py_type_name(h)), Error::Kind::Type);
    Py_ssize_t n = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(h.ptr(), &n);
    if (!utf8) {
        PyErr_Clear();
        throw Error(fmt::format("{}: {} '{}' holds a lone surrogate, which UTF-8 cannot encode; use text without one", op,
                                name, shown_text(h)),
                    Error::Kind::Value);
    }
    return std::string(utf8, (size_t)n);
}

double real_value(nb::handle h, const char* name, const char* op) {
    PyNumberMethods* nm = Py_TYPE(h.ptr())->tp_as_number;
    if (!PyIndex_Check(h.ptr()) && !(nm && nm->nb_float))
        throw Error(fmt::format("{}: {} must be a real number, got {}", op, name, py_type_name(h)), Error::Kind::Type);
    const double v = PyFloat_AsDouble(h.ptr());
    if (v == -1.0 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw nb::python_error();
        PyErr_Clear();
        throw Error(fmt::format("{}: {}={} is past the range of a double", op, name, nb::cast<std::string>(nb::str(h))),
                    Error::Kind::Value);
    }
    return v;
}

int axis_value(nb::handle h, int rank, const char* op) { return normalize_axis(int_value(h, "axis", op), rank, op); }

Axes parse_axes(nb::handle axis, int rank, const char* op) {
    Axes a;
    if (!axis.is_valid() || axis.is_none()) return a;
    a.all = false;
    auto one = [&](nb::handle h) {
        const int64_t v = int_arg(h, [&] {
            return fmt::format("{}: axis must be None, an int or a tuple of ints, got {}", op, py_type_name(h));
        }, [&](const std::string& v) { return fmt::format("{}: axis {} is out of range for a tensor of rank {}", op, v, rank); });
        const int ax = normalize_axis(v, rank, op);   // (int64: a cast to int first wrapped 2**40 to 0)
        if (std::find(a.list.begin(), a.list.end(), ax) != a.list.end())
            throw Error(fmt::format("{}: axis {} is repeated", op, v), Error::Kind::Value);
        a.list.push_back(ax);
    };
    if (nb::isinstance<nb::tuple>(axis) || nb::isinstance<nb::list>(axis)) {
        for (nb::handle h : axis) one(h);
    } else {
        one(axis);
    }
    return a;
}

void set_dtype_objects(nb::list objs, nb::object parser) {
    if (nb::len(objs) != (size_t)kNumDTypes) throw Error("internal: dtype table size", Error::Kind::Value);
    g_dtype_objects = new nb::object[kNumDTypes];
    for (int i = 0; i < kNumDTypes; ++i) g_dtype_objects[i] = objs[i];
    g_dtype_parser = new nb::object(parser);
}

nb::object dtype_object(DType t) {
    if (!g_dtype_objects) return nb::str(std::string(dtype_name(t)).c_str());
    return g_dtype_objects[(int)t];
}

DType dtype_arg(nb::handle h, const char* op) {
    if (nb::isinstance<DType>(h)) return nb::cast<DType>(h);
    if (!g_dtype_parser) throw Error(std::string(op) + ": the kiln package is not initialised", Error::Kind::Runtime);
    return nb::cast<DType>((*g_dtype_parser)(h));
}

Shape shape_arg(nb::handle h, const char* op) {
    Shape s;
    auto dim = [&](nb::handle d) {
        s.push_back(int_arg(d, [&] {
            return fmt::format("{}: a shape is an int or a sequence of ints; got an element of type {}", op, py_type_name(d));
        }, [&](const std::string& v) {
            return fmt::format("{}: dimension {} is too large; a kiln tensor has at most 2^60 ({}) elements", op, v, kMaxElements);
        }));
    };
    if (PyIndex_Check(h.ptr())) {
        dim(h);
        return s;
    }
    if (!PySequence_Check(h.ptr()) || nb::isinstance<nb::str>(h))
        throw Error(fmt::format("{}: a shape is an int or a sequence of ints, got {}", op, py_type_name(h)), Error::Kind::Type);
    for (nb::handle d : h) dim(d);
    return s;
}

std::optional<Tensor> optional_tensor(nb::handle h, const char* what, const char* op) {
    if (!h.is_valid() || h.is_none()) return std::nullopt;
    if (!nb::isinstance<PyTensor>(h))
        throw Error(fmt::format("{}: {} must be a kiln tensor or None", op, what), Error::Kind::Type);
    return nb::inst_ptr<PyTensor>(h)->t;
}

PyTensor& out_tensor(nb::handle h, const char* what, const char* op) {
    if (!nb::isinstance<PyTensor>(h))
        throw Error(fmt::format("{}: {} must be a kiln tensor (the result is written into it)", op, what), Error::Kind::Type);
    return *nb::inst_ptr<PyTensor>(h);
}

nb::tuple shape_tuple(const Shape& s) {
    nb::list l;
    for (int64_t d : s) l.append(d);
    return nb::tuple(l);
}

void check_repeat(int64_t repeat, const char* op) {
    if (repeat < 1) throw Error(fmt::format("{}: repeat={}; it must be at least 1", op, repeat), Error::Kind::Value);
}

} // namespace kiln::py
