// kiln::Error becomes a Python exception that is both a kiln.Error and the standard exception
// a Python user expects (ValueError, TypeError, IndexError, MemoryError, RuntimeError), with
// the C++ message intact. InternalError (a bug in kiln) becomes a plain RuntimeError.
#include "binding.hpp"

namespace kiln::py {

namespace {

PyObject* g_error = nullptr;
PyObject* g_kinds[5] = {};  // by Error::Kind
PyObject* g_compile = nullptr;
PyObject* g_oom = nullptr;

PyObject* make_type(nb::module_& m, const char* name, std::initializer_list<PyObject*> bases, const char* doc) {
    nb::object tuple = nb::steal(PyTuple_New((Py_ssize_t)bases.size()));
    Py_ssize_t i = 0;
    for (PyObject* b : bases) {
        Py_INCREF(b);
        PyTuple_SET_ITEM(tuple.ptr(), i++, b);
    }
    std::string qualified = std::string("kiln.") + name;
    PyObject* t = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, tuple.ptr(), nullptr);
    if (!t) throw nb::python_error();
    m.attr(name) = nb::borrow(t);
    return t;  // kept for the life of the process
}

void raise(PyObject* type, const char* msg) {
    PyErr_SetString(type, msg);
}

} // namespace

void bind_errors(nb::module_& m) {
    g_error = make_type(m, "Error", {PyExc_Exception}, "Base of every error a kiln user can cause.");
    g_kinds[(int)Error::Kind::Value] = make_type(m, "InvalidArgument", {g_error, PyExc_ValueError},
                                                 "A shape, axis or value that the operation cannot take.");
    g_kinds[(int)Error::Kind::Type] = make_type(m, "DTypeError", {g_error, PyExc_TypeError},
                                                "A dtype or an operand type that the operation cannot take.");
    g_kinds[(int)Error::Kind::Index] = make_type(m, "OutOfBounds", {g_error, PyExc_IndexError},
                                                 "An index outside a tensor's shape.");
    g_oom = make_type(m, "OutOfMemory", {g_error, PyExc_MemoryError},
                      "A device allocation failed after the allocator released its cache. The context stays usable.");
    g_kinds[(int)Error::Kind::Memory] = g_oom;
    g_kinds[(int)Error::Kind::Runtime] = make_type(m, "BackendError", {g_error, PyExc_RuntimeError},
                                                   "The device or the compiler failed (driver error, unusable device).");
    g_compile = make_type(m, "CompileError", {g_kinds[(int)Error::Kind::Runtime]},
                          "A kernel kiln generated failed to compile: .log, .options and .source say why.");

    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const CompileError& e) {
            nb::object exc = nb::steal(PyObject_CallOneArg(g_compile, nb::str(e.what()).ptr()));
            if (!exc.is_valid()) return;
            exc.attr("log") = nb::str(e.log().c_str());
            exc.attr("options") = nb::str(e.options().c_str());
            exc.attr("source") = nb::str(e.numbered_source().c_str());
            PyErr_SetObject(g_compile, exc.ptr());
        } catch (const OutOfMemory& e) {
            nb::object exc = nb::steal(PyObject_CallOneArg(g_oom, nb::str(e.what()).ptr()));
            if (!exc.is_valid()) return;
            exc.attr("requested") = e.requested();
            exc.attr("free_bytes") = e.free_bytes();
            exc.attr("cached_bytes") = e.cached_bytes();
            PyErr_SetObject(g_oom, exc.ptr());
        } catch (const Error& e) {
            raise(g_kinds[(int)e.kind()], e.what());
        } catch (const InternalError& e) {
            raise(PyExc_RuntimeError, e.what());
        }
    });
}

} // namespace kiln::py
