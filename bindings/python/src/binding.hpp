// Shared pieces of the Python extension `kiln._kiln`: the Python-side wrappers of Context,
// Tensor and Expr, and the conversions every binding file uses. Only the public C++ API
// (kiln/kiln.hpp) is used here.
#pragma once
#include <fmt/format.h>
#include <kiln/kiln.hpp>
#include <nanobind/nanobind.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>

namespace nb = nanobind;

namespace kiln::py {

// A Python Context: owns the C++ Context. Tensors and expressions hold a reference to their
// Python Context, so a context lives as long as anything that uses its memory.
struct PyContext {
    std::unique_ptr<Context> ctx;
    // The graph of the last assignment, kept until the next one: a statement repeated in a loop
    // then finds every node of its graph already interned (no allocation, no teardown).
    Expr last;
    // Serialises the calls that run without the GIL (assignment, copies, synchronize): a C++
    // Context is used by one thread at a time, and Python threads may share one. Taken after
    // the GIL is released, never the other way round.
    std::mutex busy;
    Context& c() const { return *ctx; }
};

struct PyTensor {
    Tensor t;
    nb::object ctx;  // the Python Context owning t's memory
};

struct PyExpr {
    Expr e;
    nb::object ctx;  // the Python Context of its first tensor operand, or None (the default context)
};

// Converts a Python operand (Tensor, Expr, bool, int, float, NumPy scalar) to an Expr. Returns
// false for anything else. `ctx` is set to the operand's Python context when it has one and
// `ctx` is still unset.
bool to_expr(nb::handle h, Expr& out, nb::handle& ctx);
// Like to_expr but raises kiln.DTypeError naming `op` when h is not an operand.
Expr operand(nb::handle h, nb::handle& ctx, const char* op);
// The message for an operand that is neither a kiln value nor a scalar.
std::string not_an_operand(nb::handle h, const char* op);

nb::object default_context();                 // kiln.default_context()
// ctx (None: the default context); a TypeError naming `op` where it is not a kiln.Context.
PyContext& context_of(nb::handle ctx, const char* op);
nb::object context_object(nb::handle ctx, const char* op);
inline PyContext& owner(const PyTensor& t) { return *nb::inst_ptr<PyContext>(t.ctx); }

nb::object wrap(Expr e, nb::handle ctx);
nb::object wrap(Tensor t, nb::handle ctx);

// dst = e, with the GIL released (a compile or a CPU kernel may take a while).
void assign(PyTensor& dst, const Expr& e);
// A new tensor holding e's value, on e's context.
PyTensor evaluate(const Expr& e, nb::handle ctx);
// e as a value: a Tensor stays itself, an Expr is evaluated.
PyTensor value_of(nb::handle h, const char* op);

// The seeds' `out=` convention: None returns the lazy expression; a tensor receives the value
// and is returned.
nb::object finish(const Expr& e, nb::handle ctx, nb::handle out, const char* op);

// Axis arguments: None (all axes), an int, or a tuple of ints.
struct Axes {
    bool all = true;
    std::vector<int> list;
};
Axes parse_axes(nb::handle axis, int rank, const char* op);
// An int argument `name` of op (int, NumPy integer; not bool): a kiln.DTypeError for another
// type, a kiln.InvalidArgument past 64 bits.
int64_t int_value(nb::handle h, const char* name, const char* op);
// A bool argument `name` of op: a bool, a NumPy bool scalar, or an int (nonzero is true, as
// NumPy's keepdims=1); a kiln.DTypeError naming the type for anything else.
bool bool_value(nb::handle h, const char* name, const char* op);
// The type of h as messages name it ("NoneType", "numpy.ndarray").
std::string py_type_name(nb::handle h);
// str(h) as UTF-8 for a message: lone surrogates escaped (\udc80), "(unprintable)" where str() fails.
std::string shown_text(nb::handle h);
// A str argument `name` of op: a kiln.DTypeError naming the type for anything else, a
// kiln.InvalidArgument for text with a lone surrogate (UTF-8 has no encoding for it).
std::string str_value(nb::handle h, const char* name, const char* op);
// A real argument `name` of op (int, float, NumPy real scalars): a kiln.DTypeError naming the
// type for anything else (a str is not parsed).
double real_value(nb::handle h, const char* name, const char* op);
// One axis (an int) of a tensor of rank `rank`, in range, counted from the front.
int axis_value(nb::handle h, int rank, const char* op);

nb::object dtype_object(DType t);  // the Python dtype object kiln reports (numpy.dtype where one exists)
DType dtype_arg(nb::handle h, const char* op);  // any dtype spelling kiln.dtype() understands
Shape shape_arg(nb::handle h, const char* op);  // an int or a sequence of ints

// Arguments of the operations that run at once (GEMM, convolution, layers): an optional tensor
// (None: absent), a tensor the result is written into, a shape as a tuple.
std::optional<Tensor> optional_tensor(nb::handle h, const char* what, const char* op);
PyTensor& out_tensor(nb::handle h, const char* what, const char* op);
nb::tuple shape_tuple(const Shape& s);
void check_repeat(int64_t repeat, const char* op);   // neon's repeat=: at least 1
// Runs f without the GIL, one call at a time per context.
template <class F>
void run_unlocked(PyContext& pc, F&& f) {
    nb::gil_scoped_release unlocked;
    std::lock_guard<std::mutex> one_at_a_time(pc.busy);
    f();
}

// f() `repeat` times (neon's repeat=, for timing; check_repeat first) as run_unlocked runs it.
// Between runs, at most every 50 ms, the context is let go and the GIL taken back to check for
// signals, so that Ctrl-C stops a long repetition with KeyboardInterrupt (a signal handler may
// then use the context itself: busy is not held while it runs).
template <class F>
void repeat_unlocked(PyContext& pc, int64_t repeat, F&& f) {
    nb::gil_scoped_release unlocked;
    std::unique_lock<std::mutex> one_at_a_time(pc.busy);
    auto checked = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < repeat; ++r) {
        f();
        if (r + 1 < repeat && std::chrono::steady_clock::now() - checked > std::chrono::milliseconds(50)) {
            one_at_a_time.unlock();
            {
                nb::gil_scoped_acquire held;
                if (PyErr_CheckSignals() != 0) throw nb::python_error();
            }
            one_at_a_time.lock();
            checked = std::chrono::steady_clock::now();
        }
    }
}

// A signature string for stubs (nb::sig), kept alive for the life of the process.
const char* signature(const std::string& s);
// The operand type as the stubs spell it.
inline constexpr const char* kOperand = "Tensor | Expr | float | int | bool";

void bind_errors(nb::module_& m);
void bind_context(nb::module_& m);
void bind_values(nb::module_& m);
void bind_ops(nb::module_& m);
void bind_dlpack(nb::module_& m);
void bind_gemm(nb::module_& m, nb::handle context_class, nb::handle tensor_class, nb::handle expr_class);
void bind_conv(nb::module_& m, nb::handle context_class);
void bind_nn(nb::module_& m, nb::handle context_class);
void bind_distributed(nb::module_& m);
void bind_dlpack_methods(nb::class_<PyTensor>& tensor);  // __dlpack__, __cuda_array_interface__

} // namespace kiln::py
