// The extension module kiln._kiln. The package `kiln` (bindings/python/kiln) re-exports it and
// adds what is simpler in Python: dtype spellings, host data (NumPy) in and out, printing.
#include "binding.hpp"

#include <nanobind/stl/string.h>

namespace kiln::py {
void set_dtype_objects(nb::list objs, nb::object parser);
}

NB_MODULE(_kiln, m) {
    using namespace kiln::py;
    // Exported DLPack capsules may hold a context at exit, legitimately: no leak report.
    nb::set_leak_warnings(false);
    m.doc() = "kiln: a runtime JIT compiler for tensor expressions (the C++ extension; use the package `kiln`).";
    m.attr("__version__") = KILN_VERSION;
    bind_errors(m);
    bind_context(m);
    bind_values(m);
    bind_ops(m);
    bind_dlpack(m);
    bind_gemm(m, m.attr("_Context"), m.attr("Tensor"), m.attr("Expr"));
    bind_conv(m, m.attr("_Context"));
    bind_nn(m, m.attr("_Context"));
    bind_distributed(m);
    m.def("_set_dtypes", &set_dtype_objects, "Called once by the package: dtype objects by DType, and kiln.dtype().");
}
