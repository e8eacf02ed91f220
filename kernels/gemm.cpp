// compound_dot / dot / batched_dot: operand checks, then the backend's product and the fused
// epilogue. See kiln/gemm.hpp for the semantics.
#include <kiln/gemm.hpp>

#include "ir/error.hpp"
#include "kernels/hist_named.hpp"
#include "runtime/bench.hpp"
#include "ir/storage.hpp"
#include "kernels/cpu/blas.hpp"
#include <kiln/context.hpp>

#include <limits>
#include <tuple>

#ifdef KILN_HAVE_GEMM_KERNELS
#include "kernels/cuda/gemm_cuda.hpp"
#endif

namespace kiln {

namespace {

std::string desc(const Tensor& t) { return fmt::format("{} {}", dtype_name(t.dtype()), shape_str(t.shape())); }

void check_float(const Tensor& t, const char* what, const char* op) {
    if (!is_float(t.dtype()) || t.dtype() == DType::Float64)
        fail(Error::Kind::Type, "{}: {} is {}; GEMM operands are float32, float16 or bfloat16", op, what, desc(t));
}

// The rule of every operation (Context::can_use): host memory is any CPU context's, device
// memory only its own context's.
void check_same_context(const Tensor& a, const Tensor& b, const char* what, const char* op) {
    if (!a.context().can_use(b))
        fail(Error::Kind::Value,
             "{}: {} lives on {} of another context, but A's context runs on {}; only CPU contexts share memory: "
             "create it with A's context",
             op, what, b.context().device_name(), a.context().device_name());
}

// One BLAS operand: a float32 matrix whose rows or columns are contiguous, as (pointer,
// transposed, leading dimension). Other layouts and 16-bit dtypes are copied to a contiguous
// float32 tensor first (`keep` holds it).
struct BlasOperand {
    const float* data = nullptr;
    bool trans = false;
    int64_t ld = 1;
    Tensor keep;
};

BlasOperand blas_operand(const Tensor& x0) {
    Context& ctx = x0.context();
    Tensor x = x0;
    if (x.dtype() != DType::Float32) x = ctx.eval(cast(x.expr(), DType::Float32));
    const int64_t rows = x.shape()[0], cols = x.shape()[1];
    const int64_t s0 = x.strides()[0], s1 = x.strides()[1];
    auto ptr = [](const Tensor& t) {
        return static_cast<const float*>(t.view().storage->data) + t.offset();
    };
    if ((s1 == 1 || cols <= 1) && (rows <= 1 || s0 >= std::max<int64_t>(cols, 1)))
        return {ptr(x), false, rows <= 1 ? std::max<int64_t>(cols, 1) : s0, x};
    if ((s0 == 1 || rows <= 1) && (cols <= 1 || s1 >= std::max<int64_t>(rows, 1)))
        return {ptr(x), true, cols <= 1 ? std::max<int64_t>(rows, 1) : s1, x};
    Tensor c = ctx.eval(x.expr());  // contiguous copy
    return {ptr(c), false, std::max<int64_t>(cols, 1), c};
}

void check_blas_size(int64_t v, const char* what, const char* op) {
    if (v > std::numeric_limits<int>::max())
        fail(Error::Kind::Value, "{}: {} = {} exceeds the BLAS interface's 32-bit sizes", op, what, v);
}

// T (M x N float32, contiguous) = alpha * A . B on the CPU.
Tensor cpu_product(const Tensor& A, const Tensor& B, double alpha, const char* op) {
    const cpu::Blas& blas = cpu::blas();
    if (!blas.sgemm) fail(Error::Kind::Runtime, "{}: the CPU backend needs a BLAS: {}", op, blas.why_not);
    const int64_t M = A.shape()[0], K = A.shape()[1], N = B.shape()[1];
    Context& ctx = A.context();
    Tensor T = ctx.empty({M, N}, DType::Float32);
    if (M == 0 || N == 0) return T;
    if (K == 0) {
        T.assign(Expr(0.0));
        return T;
    }
    BlasOperand a = blas_operand(A), b = blas_operand(B);
    for (auto [v, name] : {std::pair{M, "M"}, {N, "N"}, {K, "K"}, {a.ld, "lda"}, {b.ld, "ldb"}}) check_blas_size(v, name, op);
    float* t = static_cast<float*>(T.view().storage->data);
    blas.sgemm(cpu::kCblasRowMajor, a.trans ? cpu::kCblasTrans : cpu::kCblasNoTrans,
               b.trans ? cpu::kCblasTrans : cpu::kCblasNoTrans, (int)M, (int)N, (int)K, (float)alpha, a.data, (int)a.ld,
               b.data, (int)b.ld, 0.0f, t, (int)N);
    T.view().storage->written = true;
    return T;
}

void check_operands(const Tensor& A, const Tensor& B, const Tensor& C, const DotOptions& o, const char* op) {
    for (auto [t, name] : {std::pair{&A, "A"}, {&B, "B"}, {&C, "C"}})
        if (!t->defined()) fail(Error::Kind::Value, "{}: {} is an empty kiln::Tensor", op, name);
    if (A.rank() != 2 || B.rank() != 2 || C.rank() != 2)
        fail(Error::Kind::Value, "{}: A, B and C must be matrices (rank 2); got A {}, B {}, C {}", op, desc(A), desc(B),
             desc(C));
    check_float(A, "A", op);
    check_float(B, "B", op);
    check_float(C, "C", op);
    if (A.dtype() != B.dtype())
        fail(Error::Kind::Type, "{}: A is {} and B {}: both operands must have one dtype", op, desc(A), desc(B));
    check_same_context(A, B, "B", op);
    check_same_context(A, C, "C", op);
    const int64_t M = A.shape()[0], K = A.shape()[1], N = B.shape()[1];
    if (B.shape()[0] != K)
        fail(Error::Kind::Value, "{}: A is {} and B is {}: A's columns ({}) must equal B's rows ({})", op, desc(A), desc(B),
             K, B.shape()[0]);
    if (C.shape() != Shape{M, N})
        fail(Error::Kind::Value, "{}: C is {}, but A {} . B {} is ({}, {})", op, desc(C), desc(A), desc(B), M, N);
    if (o.bias) {
        check_same_context(A, *o.bias, "bias", op);
        check_float(*o.bias, "bias", op);
        if (o.bias->shape() != Shape{N} && o.bias->shape() != Shape{1, N})
            fail(Error::Kind::Value, "{}: bias is {}; it holds one value per column of C: ({},) or (1, {})", op,
                 desc(*o.bias), N, N);
    }
    if (o.bsum) {
        check_same_context(A, *o.bsum, "bsum", op);
        check_float(*o.bsum, "bsum", op);
        if (o.bsum->shape() != Shape{M} && o.bsum->shape() != Shape{M, 1})
            fail(Error::Kind::Value, "{}: bsum is {}; it receives one sum per row of C: ({},) or ({}, 1)", op,
                 desc(*o.bsum), M, M);
    }
    if (o.slope != 0 && !o.relu)
        fail(Error::Kind::Value, "{}: slope={} is the leaky ReLU's slope and needs relu=true", op, o.slope);
}

// C = relu_slope(T + bias) + beta * C, then bsum: the JIT fuses it into one kernel (and one
// row reduction for bsum).
void epilogue(const Tensor& T, Tensor& C, const DotOptions& o) {
    Expr e = T;
    if (o.bias) e = e + reshape(o.bias->expr(), {1, C.shape()[1]});
    // ReLU keeps NaN (e < 0 is false for it) and takes -inf to zero; leaky ReLU keeps both.
    if (o.relu) e = o.slope == 0 ? where(less(e, 0.0), Expr(0.0), e) : where(greater(e, 0.0), e, e * o.slope);
    if (o.beta != 0) e = e + Expr(o.beta) * C.expr();
    C.assign(e);
    if (o.bsum) {
        Tensor bs = *o.bsum;
        bs.assign(sum(C.expr(), 1, bs.rank() == 2));
    }
}

bool shares_storage(const Tensor& a, const Tensor& b) { return a.view().storage == b.view().storage; }

// The CUDA path for C of rank 2 or 3 (batched). Shapes the kernels need not handle (an empty
// product, K = 0) and outputs that overlap an operand are arranged here. With `count`, the
// kernel counts C's values into it as it stores them where it can: true when it did.
bool cuda_product(const Tensor& A, const Tensor& B, Tensor& C, const DotOptions& o, const char* op,
                  const StoreCount* count = nullptr, const Tensor* col_sums = nullptr, bool* summed = nullptr) {
    if (summed) *summed = false;   // (until a kernel adds the column sums)
#ifdef KILN_HAVE_GEMM_KERNELS
    (void)op;
    const int r = C.rank();
    const int64_t M = C.shape()[r - 2], N = C.shape()[r - 1], K = A.shape()[A.rank() - 1];
    if (M == 0 || N == 0 || K == 0) {
        // Nothing to multiply (batched callers split such shapes per entry): the epilogue of
        // a zero product.
        epilogue(C.context().zeros(C.shape(), DType::Float32), C, o);
        return false;
    }
    if (o.bsum && (shares_storage(*o.bsum, A) || shares_storage(*o.bsum, B) || shares_storage(*o.bsum, C) ||
                   (o.bias && shares_storage(*o.bsum, *o.bias)))) {
        // The kernels write bsum while other blocks still read the operands and write C: the
        // sums go to a fresh bsum, copied once C is written.
        DotOptions fresh = o;
        fresh.bsum = C.context().empty(o.bsum->shape(), o.bsum->dtype());
        const bool counted = cuda_product(A, B, C, fresh, op, count);
        Tensor bsum = *o.bsum;
        bsum.assign(fresh.bsum->expr());
        return counted;
    }
    if (shares_storage(C, A) || shares_storage(C, B) || (o.bias && shares_storage(C, *o.bias))) {
        // The kernels read A, B and the bias while C's tiles are written: compute into a fresh C.
        Tensor fresh = C.context().empty(C.shape(), C.dtype());
        if (o.beta != 0) fresh.assign(C.expr());
        gemm::cuda_gemm(A, B, fresh, o);
        C.assign(fresh.expr());
        return false;
    }
    return gemm::cuda_gemm(A, B, C, o, count, col_sums, summed);
#else
    (void)A, (void)B, (void)C, (void)o, (void)count, (void)col_sums, (void)summed;
    fail(Error::Kind::Runtime,
         "{}: this build of kiln has no CUDA GEMM kernels (nvcc was not found when it was built); rebuild with the CUDA "
         "toolkit's nvcc on PATH, or run the product on a CPU context",
         op);
#endif
}

// Bench mode's line for a product (runtime/bench.hpp): operands, bytes, 2 M N K flops a batch entry.
void bench_product(BenchTimer& bench, const Tensor& A, const Tensor& B, const Tensor& C, int64_t batch) {
    if (!bench.on()) return;
    const int64_t r = C.rank();
    bench.set(fmt::format("{} {} x {} {} -> {} {}", dtype_name(A.dtype()), shape_str(A.shape()), dtype_name(B.dtype()),
                          shape_str(B.shape()), dtype_name(C.dtype()), shape_str(C.shape())),
              view_bytes(A.view()) + view_bytes(B.view()) + view_bytes(C.view()),
              2.0 * (double)batch * (double)C.shape()[r - 2] * (double)C.shape()[r - 1] * (double)A.shape()[A.rank() - 1]);
}

} // namespace

void compound_dot_extras(const Tensor& A, const Tensor& B, Tensor& C, const DotOptions& opts, StoreExtras& x) {
    x.counted = x.summed = false;
    const char* op = "compound_dot";
    check_operands(A, B, C, opts, op);
    NamedCount named(C.context(), C);
    BenchTimer bench(context_impl(A.context()), op);
    bench_product(bench, A, B, C, 1);
    if (A.context().backend() == Backend::CUDA) {
        const bool counted = cuda_product(A, B, C, opts, op, x.count ? x.count : named.store(), x.column_sums, &x.summed);
        if (counted && !x.count) named.counted();
        x.counted = counted && x.count;
        return;
    }
    Tensor T = cpu_product(A, B, opts.alpha, op);
    epilogue(T, C, opts);
}

Tensor& compound_dot(const Tensor& A, const Tensor& B, Tensor& C, const DotOptions& opts) {
    StoreExtras x;
    compound_dot_extras(A, B, C, opts, x);
    return C;
}

Tensor dot(const Tensor& A, const Tensor& B) {
    if (!A.defined() || !B.defined()) fail(Error::Kind::Value, "dot: an operand is an empty kiln::Tensor");
    if (A.rank() != 2 || B.rank() != 2)
        fail(Error::Kind::Value, "dot: A and B must be matrices (rank 2); got A {}, B {}", desc(A), desc(B));
    const DType out = A.dtype() == DType::Float32 || !is_float(A.dtype()) ? DType::Float32 : A.dtype();
    Tensor C = A.context().empty({A.shape()[0], B.shape()[1]}, out);
    return compound_dot(A, B, C);
}

Tensor& batched_dot(const Tensor& A, const Tensor& B, Tensor& C, const DotOptions& opts) {
    const char* op = "batched_dot";
    if (!A.defined() || !B.defined() || !C.defined()) fail(Error::Kind::Value, "{}: an operand is an empty kiln::Tensor", op);
    if (C.rank() != 3 || (A.rank() != 2 && A.rank() != 3) || (B.rank() != 2 && B.rank() != 3) ||
        (A.rank() == 2 && B.rank() == 2))
        fail(Error::Kind::Value,
             "{}: C must be (batch, M, N) and A, B (batch, M, K), (batch, K, N) (one of them may be a shared matrix); got "
             "A {}, B {}, C {}",
             op, desc(A), desc(B), desc(C));
    const int64_t batch = C.shape()[0];
    for (auto [t, name] : {std::pair{&A, "A"}, {&B, "B"}})
        if (t->rank() == 3 && t->shape()[0] != batch)
            fail(Error::Kind::Value, "{}: {} is {}, but C has a batch of {}", op, name, desc(*t), batch);
    if (opts.bsum && opts.bsum->rank() >= 1 && opts.bsum->shape()[0] != batch)
        fail(Error::Kind::Value, "{}: bsum is {}; it needs one row of sums per batch entry: ({}, M) or ({}, M, 1)", op,
             desc(*opts.bsum), batch, batch);
    const auto entry = [&](int64_t i, DotOptions& o) {
        o = opts;
        if (opts.bsum) o.bsum = (*opts.bsum)[i];
        return std::tuple<Tensor, Tensor, Tensor>{A.rank() == 3 ? A[i] : A, B.rank() == 3 ? B[i] : B, C[i]};
    };
    const bool empty = batch == 0 || C.shape()[1] == 0 || C.shape()[2] == 0 || A.shape()[A.rank() - 1] == 0;
    NamedCount named(C.context(), C);
    BenchTimer bench(context_impl(C.context()), op);
    bench_product(bench, A, B, C, batch);
    if (A.context().backend() == Backend::CUDA && !empty) {
        // One launch for the whole batch; the first entry stands for the others in the checks.
        DotOptions o;
        auto [a, b, c] = entry(0, o);
        check_operands(a, b, c, o, op);
        if (cuda_product(A, B, C, opts, op, named.store())) named.counted();
        return C;
    }
    // Entry by entry, an entry's results must not land where a later entry reads: where C or
    // bsum shares memory with an operand (or with each other), the entries go to fresh
    // outputs, copied once all are done.
    const auto overlaps = [&](const Tensor& out) {
        return shares_storage(out, A) || shares_storage(out, B) || (opts.bias && shares_storage(out, *opts.bias));
    };
    if (batch > 1 && (overlaps(C) || (opts.bsum && (overlaps(*opts.bsum) || shares_storage(*opts.bsum, C))))) {
        DotOptions fresh = opts;
        Tensor c = C.context().empty(C.shape(), C.dtype());
        if (opts.beta != 0) c.assign(C.expr());
        if (opts.bsum) fresh.bsum = C.context().empty(opts.bsum->shape(), opts.bsum->dtype());
        batched_dot(A, B, c, fresh);
        C.assign(c.expr());
        if (opts.bsum) {
            Tensor bsum = *opts.bsum;
            bsum.assign(fresh.bsum->expr());
        }
        return C;
    }
    for (int64_t i = 0; i < batch; ++i) {
        DotOptions o;
        auto [a, b, c] = entry(i, o);
        compound_dot(a, b, c, o);
    }
    return C;
}

} // namespace kiln
