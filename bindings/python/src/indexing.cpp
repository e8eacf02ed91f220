// Python indexing of tensors: ints, slices with steps, Ellipsis and None give views (no copy);
// an integer tensor or array along one axis gathers with take(). The view arithmetic follows
// Python's slice rules exactly (PySlice_AdjustIndices), so results match NumPy's.
#include "indexing.hpp"

#include <nanobind/stl/string.h>

namespace kiln::py {

namespace {

bool is_full_slice(nb::handle h) {
    if (!PySlice_Check(h.ptr())) return false;
    auto* s = reinterpret_cast<PySliceObject*>(h.ptr());
    return s->start == Py_None && s->stop == Py_None && s->step == Py_None;
}

// An array-like index (tensor, expression, list, NumPy array of rank >= 1): gathered with take().
bool is_array_index(nb::handle h) {
    if (nb::isinstance<PyTensor>(h) || nb::isinstance<PyExpr>(h) || nb::isinstance<nb::list>(h)) return true;
    if (!nb::hasattr(h, "__array_interface__") && !nb::hasattr(h, "__array__")) return false;
    // NumPy scalars and 0-d arrays have an array interface too: they index like ints.
    int ndim = 1;   // an ndim that is not an int: an array-like, as one without ndim
    return !nb::hasattr(h, "ndim") || !nb::try_cast(h.attr("ndim"), ndim) || ndim > 0;
}

bool is_int_index(nb::handle h) {
    return PyIndex_Check(h.ptr()) && !PyBool_Check(h.ptr()) && !is_array_index(h);
}

} // namespace

Index parse_index(const Tensor& t, nb::handle key) {
    Index r;
    std::vector<nb::handle> items;
    if (nb::isinstance<nb::tuple>(key)) {
        for (nb::handle h : key) items.push_back(h);
    } else {
        items.push_back(key);
    }
    int consumed = 0, ellipsis = -1;
    for (size_t i = 0; i < items.size(); ++i) {
        nb::handle h = items[i];
        if (h.ptr() == Py_Ellipsis) {
            if (ellipsis >= 0) throw Error("index: an index can only have a single ellipsis ('...')", Error::Kind::Index);
            ellipsis = (int)i;
        } else if (!h.is_none()) {
            ++consumed;
        }
    }
    const View& v = t.view();
    const int rank = (int)v.shape.size();
    if (consumed > rank)
        throw Error(fmt::format("index: too many indices for a tensor of shape {}: {} given, {} dimensions", shape_str(v.shape),
                                consumed, rank),
                    Error::Kind::Index);
    View out = v;
    out.shape.clear();
    out.strides.clear();
    int dim = 0;
    auto take_full = [&] {
        out.shape.push_back(v.shape[dim]);
        out.strides.push_back(v.strides[dim]);
        ++dim;
    };
    for (size_t i = 0; i < items.size(); ++i) {
        nb::handle h = items[i];
        if (h.ptr() == Py_Ellipsis) {
            for (int k = 0; k < rank - consumed; ++k) take_full();
        } else if (h.is_none()) {
            out.shape.push_back(1);
            out.strides.push_back(0);
        } else if (PySlice_Check(h.ptr())) {
            Py_ssize_t start, stop, step;
            if (PySlice_Unpack(h.ptr(), &start, &stop, &step) < 0) throw nb::python_error();
            Py_ssize_t n = PySlice_AdjustIndices((Py_ssize_t)v.shape[dim], &start, &stop, step);
            if (n > 0) out.offset += (int64_t)start * v.strides[dim];
            out.shape.push_back(n);
            out.strides.push_back(n > 1 ? v.strides[dim] * step : v.strides[dim]);  // a step past the end never multiplies
            ++dim;
        } else if (is_int_index(h)) {
            Py_ssize_t k = PyNumber_AsSsize_t(h.ptr(), PyExc_IndexError);
            if (k == -1 && PyErr_Occurred()) throw nb::python_error();
            int64_t len = v.shape[dim];
            if (k < -len || k >= len)
                throw Error(fmt::format("index: index {} is out of bounds for axis {} with size {}", k, dim, len),
                            Error::Kind::Index);
            if (k < 0) k += len;
            out.offset += (int64_t)k * v.strides[dim];
            ++dim;
        } else if (is_array_index(h)) {
            if (r.gather_axis >= 0)
                throw Error("index: only one integer-array index per indexing is supported (each becomes a take())",
                            Error::Kind::Index);
            r.gather_axis = (int)out.shape.size();
            r.gather = nb::borrow(h);
            take_full();
        } else {
            std::string tn = nb::cast<std::string>(nb::str(h.type().attr("__name__")));
            throw Error(fmt::format("index: {} is not a valid index; valid: int, slice, ..., None, or an integer tensor/array "
                                    "(one, gathered with take())",
                                    tn),
                        Error::Kind::Index);
        }
    }
    while (dim < rank) take_full();
    r.view = Tensor(&t.context(), out);
    return r;
}

bool is_mask(nb::handle key) {
    if (nb::isinstance<PyTensor>(key)) return nb::inst_ptr<PyTensor>(key)->t.dtype() == DType::Bool;
    if (nb::isinstance<PyExpr>(key)) return nb::inst_ptr<PyExpr>(key)->e.dtype() == DType::Bool;
    return false;
}

bool several_array_indices(nb::handle key) {
    if (!nb::isinstance<nb::tuple>(key)) return false;
    int n = 0;
    for (nb::handle h : key) n += is_array_index(h);
    return n >= 2;
}

nb::object host_mask_uploaded(nb::handle key, nb::handle ctx) {
    // (The common keys, at no cost: ints, slices, tuples, ..., None, kiln's own arrays.)
    if (PyLong_Check(key.ptr()) || PySlice_Check(key.ptr()) || PyTuple_Check(key.ptr()) || key.ptr() == Py_Ellipsis ||
        key.is_none() || nb::isinstance<PyTensor>(key) || nb::isinstance<PyExpr>(key))
        return nb::borrow(key);
    nb::object array = nb::borrow(key);
    if (nb::isinstance<nb::list>(key)) {   // a list of bools, as NumPy reads it
        if (nb::len(key) == 0 || !PyBool_Check(key[0].ptr())) return nb::borrow(key);
        array = nb::module_::import_("numpy").attr("asarray")(key);
    }
    if (!nb::hasattr(array, "__array_interface__") || !nb::hasattr(array, "dtype")) return nb::borrow(key);
    nb::object dt = array.attr("dtype");
    if (!nb::hasattr(dt, "kind") || !nb::isinstance<nb::str>(dt.attr("kind")) || nb::cast<std::string>(dt.attr("kind")) != "b")
        return nb::borrow(key);
    return nb::module_::import_("kiln").attr("asarray")(array, nb::arg("ctx") = ctx);
}

bool is_whole(nb::handle key) {
    if (key.ptr() == Py_Ellipsis || is_full_slice(key)) return true;
    if (nb::isinstance<nb::tuple>(key) && nb::len(key) == 1) return is_whole(key[0]);
    return false;
}

} // namespace kiln::py
