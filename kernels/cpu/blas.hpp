// The system BLAS, loaded at run time (dlopen): libkiln links none, so it loads on machines
// without one (the lent GPU hosts have none), and CPU GEMMs say why they cannot run. KILN_BLAS
// names a library to use instead of the default search (OpenBLAS, then generic CBLAS names).
#pragma once
#include <string>

namespace kiln::cpu {

struct Blas {
    // cblas_sgemm with CBLAS's enum values (RowMajor = 101, NoTrans = 111, Trans = 112).
    using Sgemm = void (*)(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                           int lda, const float* b, int ldb, float beta, float* c, int ldc);
    Sgemm sgemm = nullptr;
    std::string library;   // what was loaded
    std::string why_not;   // when sgemm is null
};

inline constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;

const Blas& blas();  // loaded on first use; never throws

} // namespace kiln::cpu
