#include "kernels/cpu/blas.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <dlfcn.h>
#include <vector>

namespace kiln::cpu {

namespace {

Blas load() {
    Blas b;
    std::vector<std::string> names;
    if (const char* e = std::getenv("KILN_BLAS"); e && *e) names.push_back(e);
    else names = {"libopenblas.so.0", "libopenblas.so", "libcblas.so.3", "libblas.so.3", "libmkl_rt.so", "libblis.so.4"};
    std::string tried;
    for (const std::string& n : names) {
        void* lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char* err = dlerror();
            tried += fmt::format("{}{}: {}", tried.empty() ? "" : "; ", n, err ? err : "not found");
            continue;
        }
        if (auto f = reinterpret_cast<Blas::Sgemm>(dlsym(lib, "cblas_sgemm"))) {
            b.sgemm = f;
            b.library = n;
            return b;
        }
        tried += fmt::format("{}{}: no cblas_sgemm", tried.empty() ? "" : "; ", n);
        dlclose(lib);
    }
    b.why_not = fmt::format("no BLAS with cblas_sgemm could be loaded ({}); install OpenBLAS (Debian: libopenblas0) or "
                            "name a library with KILN_BLAS",
                            tried);
    return b;
}

} // namespace

const Blas& blas() {
    static const Blas b = load();
    return b;
}

} // namespace kiln::cpu
