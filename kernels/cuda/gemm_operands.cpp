// The operands as the GEMM kernels see them: each tensor as a strided (batch, rows, cols)
// matrix, whether TMA can address it, the selector's description of the problem (and its
// remembered choice), and the copies that put an operand into a layout the kernels read (rule 5
// of gemm_select.hpp). Apart from the launch (gemm_launch.cpp) because these decide what is
// launched, before a kernel is chosen.
#include "kernels/cuda/gemm_launch.hpp"

#include "kernels/cuda/gemm_params.hpp"
#include "kernels/cuda/gemm_select.hpp"
#include "ir/storage.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include <kiln/context.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln::gemm::detail {

char* data_of(const Tensor& t) {
    return static_cast<char*>(t.view().storage->data) + t.offset() * dtype_size(t.dtype());
}

Tensor contiguous(const Tensor& t, Context& ctx) { return t.is_contiguous() ? t : ctx.eval(t.expr()); }

Tensor float32_bias(const Tensor& bias, int64_t n, Context& ctx) {
    if (bias.dtype() == DType::Float32 && (n == 1 || bias.strides().back() == 1)) return bias;
    return ctx.eval(cast(reshape(bias.expr(), {n}), DType::Float32));
}

Mat mat(const Tensor& t) {
    Mat m;
    m.base = data_of(t);
    const int r = t.rank();
    m.s_row = t.strides()[r - 2];
    m.s_col = t.strides()[r - 1];
    m.s_batch = r == 3 ? t.strides()[0] : 0;
    // Size-1 dimensions have meaningless strides; give them the stride that makes the other
    // dimension look contiguous, so layout tests see the real layout.
    if (t.shape()[r - 2] == 1) m.s_row = t.shape()[r - 1] == 1 ? 1 : m.s_col * t.shape()[r - 1];
    if (t.shape()[r - 1] == 1) m.s_col = 1;
    if (r == 3 && t.shape()[0] == 1) m.s_batch = 0;
    return m;
}

int gemm_dtype(DType t) { return t == DType::Float16 ? kF16 : t == DType::BFloat16 ? kBF16 : kF32; }

namespace {

// Whether TMA can address an operand whose contiguous dimension has stride 1: 16-byte aligned
// base, every other stride a multiple of 16 bytes.
bool tma_ok(const Mat& x, bool rows_contiguous, size_t es) {
    const int64_t other = rows_contiguous ? x.s_col : x.s_row;
    const int64_t unit = rows_contiguous ? x.s_row : x.s_col;
    return unit == 1 && reinterpret_cast<uintptr_t>(x.base) % 16 == 0 && (other * (int64_t)es) % 16 == 0 && other > 0 &&
           (x.s_batch * (int64_t)es) % 16 == 0;
}

// Whether operand x (A: (.., M, K), B: (.., K, N)) has k stride 1.
bool is_kmajor(const Mat& x, bool is_a) { return is_a ? x.s_col == 1 : x.s_row == 1; }

} // namespace

// The selector's rules are a pure function of the problem and of the overrides KILN_GEMM_KERNEL
// and KILN_GEMM_SPLITS, and programs repeat a handful of shapes: each choice is remembered.
// (Selecting again on every call costs microseconds of host time, which would be the pace of
// small products issued back to back, forced ones in a benchmark's A/B included.)
GemmKernel selection(const GemmProblem& pr) {
    struct Key {
        std::array<int64_t, 16> problem;
        std::string overrides;
        bool operator==(const Key&) const = default;
    };
    struct KeyHash {
        size_t operator()(const Key& k) const {
            uint64_t h = 1469598103934665603ull;
            for (int64_t v : k.problem) h = (h ^ uint64_t(v)) * 1099511628211ull;
            return size_t(h) ^ std::hash<std::string>()(k.overrides);
        }
    };
    static std::mutex mu;
    static std::unordered_map<Key, GemmKernel, KeyHash> chosen;
    const auto env = [](const char* name) {
        const char* v = std::getenv(name);
        return std::string(v ? v : "");
    };
    Key key{{pr.m, pr.n, pr.k, pr.batch, pr.dtype, pr.tf32, pr.a_kmajor, pr.b_kmajor, pr.a_tma, pr.b_tma, pr.sm, pr.sms,
             pr.may_split, pr.plain_epilogue, pr.c_f32, pr.bsum},
            env("KILN_GEMM_KERNEL") + "|" + env("KILN_GEMM_SPLITS")};
    std::lock_guard<std::mutex> lock(mu);
    auto it = chosen.find(key);
    if (it == chosen.end()) it = chosen.emplace(std::move(key), select_gemm(pr)).first;
    return it->second;
}

GemmProblem problem_of(const Tensor& A, const Tensor& C, const Mat& a, const Mat& b, const cuda::CudaBackend& be) {
    const int r = C.rank();
    const size_t es = dtype_size(A.dtype());
    GemmProblem pr;
    pr.m = C.shape()[r - 2], pr.n = C.shape()[r - 1], pr.k = A.shape()[A.rank() - 1];
    pr.batch = r == 3 ? C.shape()[0] : 1;
    pr.dtype = gemm_dtype(A.dtype());
    pr.tf32 = A.dtype() == DType::Float32 && C.context().allow_tf32();
    pr.a_kmajor = is_kmajor(a, true);
    pr.b_kmajor = is_kmajor(b, false);
    pr.a_tma = tma_ok(a, /*rows_contiguous=*/!pr.a_kmajor, es);
    pr.b_tma = tma_ok(b, /*rows_contiguous=*/pr.b_kmajor, es);
    pr.sm = be.info().sm;
    pr.sms = be.info().multiprocessors;
    pr.have_sm90a = true;
    pr.may_split = r == 2;
    // The persistent kernel's TMA stores: C whose rows TMA can address (run_gemm adds the
    // epilogue's own conditions).
    const Mat c = mat(C);
    pr.plain_epilogue = tma_ok(c, /*rows_contiguous=*/false, dtype_size(C.dtype()));
    pr.c_f32 = C.dtype() == DType::Float32;
    return pr;
}

namespace {

// Swaps the last two dimensions of a view.
Tensor swap_last(const Tensor& t) {
    if (t.rank() == 2) return t.T();
    return t.transpose({0, 2, 1});
}

// Operand copies (rule 5 of gemm_select.hpp, copy_pays). `is_a`: X is (.., M, K), else
// (.., K, N).
// Whether the wgmma kernels can read X as it is (dtype and layout): TMA needs a unit-stride
// dimension, a 16-byte aligned base and 16-byte multiples for the other strides; tf32 also
// needs K-major.
bool wgmma_readable(const Tensor& X, bool is_a, bool need_kmajor) {
    const Mat x = mat(X);
    const bool kmajor = is_kmajor(x, is_a);
    return tma_ok(x, /*rows_contiguous=*/is_a ? !kmajor : kmajor, dtype_size(X.dtype())) && (kmajor || !need_kmajor);
}

// Whether an M- or N-major X (A stored (K, M), B stored (K, N)) has rows that do not start on
// 32-byte sectors (its base, its rows or its batch entries 16 bytes off them). Each 128-byte
// row of a TMA box then spans five sectors instead of four, and the product slows enough
// that copying the operand, copy included, is faster. Rows on sectors but not 128 bytes apart
// do not slow it: their copies made the product slower. Neither do K-major rows off sectors:
// copying such an A made the product slower.
bool mn_rows_unaligned(const Tensor& X, bool is_a) {
    const Mat x = mat(X);
    const bool kmajor = is_kmajor(x, is_a);
    if (kmajor) return false;
    const int64_t es = int64_t(dtype_size(X.dtype()));
    const int64_t stride = is_a ? x.s_col : x.s_row;   // between rows of k
    return rows_off_sectors(reinterpret_cast<uintptr_t>(x.base), stride * es, x.s_batch * es);
}

bool needs_staging(const Tensor& X, bool is_a, bool need_kmajor, double flops, const cuda::CudaBackend& be) {
    const bool wgmma_dtype = X.dtype() != DType::Float32 || need_kmajor;
    if (be.info().sm != 90 || !wgmma_dtype) return false;
    return copy_pays(wgmma_readable(X, is_a, need_kmajor), mn_rows_unaligned(X, is_a),
                     double(X.size()) * double(dtype_size(X.dtype())), flops);
}

// Whether the tf32 kernel that reads B N-major through registers runs this product as it is
// (rule 1), so that B is not copied to K-major. `plain`: no beta (the persistent kernels'
// epilogue; stochastic rounding does not apply to its float32 C). B's rows off 32-byte sectors
// are still copied where rule 5 says the copy pays (as for 16-bit operands).
bool b_through_registers(const Tensor& A, const Tensor& B, const Tensor& C, bool plain, double flops,
                         const cuda::CudaBackend& be) {
    GemmProblem pr = problem_of(A, C, mat(A), mat(B), be);
    if (!pr.tf32 || !pr.a_kmajor || pr.b_kmajor) return false;
    if (copy_pays(/*readable=*/true, mn_rows_unaligned(B, /*is_a=*/false),
                  double(B.size()) * double(dtype_size(B.dtype())), flops))
        return false;
    pr.plain_epilogue = pr.plain_epilogue && plain;
    if (const char* forced = std::getenv("KILN_GEMM_KERNEL"); forced && *forced) {
        const std::vector<GemmKernel> all = gemm_candidates(pr);
        return std::any_of(all.begin(), all.end(), [&](const GemmKernel& k) { return k.b_in_registers && k.entry == forced; });
    }
    return selection(pr).b_in_registers;   // remembered per problem, like the launch's own choice
}

// Whether tf32's A, M-major, goes through registers (the tk kernels, gemm_select.cpp) instead
// of being copied K-major: on narrow products (N <= 256, where the selector takes the one-tile
// kernels 64 or 16 wide anyway) where TMA reads A as it is (rows on sectors). B is copied
// K-major where it is N-major, as it would be beside a copied A (the B-in-registers kernel
// takes only products of more than a wave of 256 x 128 tiles). Through registers A is read
// once; copied, it is read and written once more before the product.
bool a_through_registers(const Tensor& A, const Tensor& B, const cuda::CudaBackend& be) {
    if (be.info().sm != 90 || B.shape()[B.rank() - 1] > 256) return false;   // (B may be shared by a batched A)
    if (is_kmajor(mat(A), true) || !wgmma_readable(A, true, /*need_kmajor=*/false) || mn_rows_unaligned(A, true)) return false;
    // A forced kernel (KILN_GEMM_KERNEL) decides: A stays M-major only for a tk kernel.
    if (const char* forced = std::getenv("KILN_GEMM_KERNEL"); forced && *forced)
        return std::string_view(forced).rfind("kiln_gemm_wg_tf32_tk_", 0) == 0;
    return true;
}

} // namespace

// Which operands to copy: a copy pays only when the other operand is readable or copied too,
// and B not when the tf32 kernel that takes it through registers runs the product as it is.
// `plain`: the epilogue has no beta.
Staging staging(const Tensor& A, const Tensor& B, const Tensor& C, bool need_kmajor, bool plain, double flops,
                const cuda::CudaBackend& be) {
    if (A.dtype() == DType::Float32 && !need_kmajor) {
        // Exact float32: the cp.async FMA kernel reads rows-contiguous operands (A M-major, B
        // N-major, aligned; fma_async_ok); the others are copied so when that pays and the
        // selector then runs that kernel (not where a split of the staged kernel beats it).
        GemmProblem pr = problem_of(A, C, mat(A), mat(B), be);
        const bool a_ok = !pr.a_kmajor && pr.a_tma, b_ok = !pr.b_kmajor && pr.b_tma;
        if (a_ok && b_ok) return {};
        const double bytes = 4.0 * ((a_ok ? 0 : double(A.size())) + (b_ok ? 0 : double(B.size())));
        if (!fma_copy_pays(bytes, flops, /*element_loads=*/!pr.a_tma || !pr.b_tma)) return {};
        pr.a_kmajor = pr.b_kmajor = false;
        pr.a_tma = pr.b_tma = true;
        const char* forced = std::getenv("KILN_GEMM_KERNEL");
        const std::string runs = forced && *forced ? std::string(forced) : selection(pr).entry;
        if (runs.rfind("kiln_gemm_fma_f32_tt_128x128", 0) != 0) return {};
        return {!a_ok, !b_ok};
    }
    if (need_kmajor && a_through_registers(A, B, be)) return {false, !wgmma_readable(B, false, true)};
    const bool copy_a = needs_staging(A, true, need_kmajor, flops, be);
    const bool copy_b = needs_staging(B, false, need_kmajor, flops, be);
    Staging st{copy_a && (copy_b || wgmma_readable(B, false, need_kmajor)),
               copy_b && (copy_a || wgmma_readable(A, true, need_kmajor))};
    if (st.b && b_through_registers(A, B, C, plain, flops, be)) st.b = false;
    return st;
}

// X copied into a fresh buffer with rows 128 bytes apart, K-major or rows-major (M-major A,
// N-major B) as `to_kmajor` says; the view of it that stands for X.
Tensor staged_operand(const Tensor& X, bool is_a, bool to_kmajor, cuda::CudaBackend& be) {
    const size_t es = dtype_size(X.dtype());
    const Mat x = mat(X);
    const bool kmajor = is_kmajor(x, is_a);
    const int r = X.rank();
    const int64_t rows = is_a ? X.shape()[r - 2] : X.shape()[r - 1], k = is_a ? X.shape()[r - 1] : X.shape()[r - 2];
    const int64_t inner = to_kmajor ? k : rows, outer = to_kmajor ? rows : k;
    // Rows 128 bytes apart (on sectors: mn_rows_unaligned).
    const int64_t padded = (inner * int64_t(es) + 127) / 128 * 128 / int64_t(es);
    Shape shape = r == 3 ? Shape{X.shape()[0], outer, padded} : Shape{outer, padded};
    Tensor buf = X.context().empty(shape, X.dtype());
    std::vector<Slice> sl(size_t(r), Slice::all());
    sl.back() = Slice::range(0, inner);
    Tensor view = buf.slice(sl);   // (.., outer, inner)
    // A: K-major (M, K) is view itself; M-major is (K, M) swapped. B: K-major (N, K) swapped;
    // N-major (K, N) is view itself.
    Tensor as_operand = (is_a == to_kmajor) ? view : swap_last(view);
    if (to_kmajor != kmajor) {
        // A transposing copy: a tiled kernel (the JIT's elementwise copy would read or write
        // with a large stride). dst[outer][inner] = X's element; s_i, s_j: X's strides along
        // the inner and outer dimensions.
        const void* src = x.base;
        const int64_t s_k = is_a ? x.s_col : x.s_row, s_rows = is_a ? x.s_row : x.s_col;
        int64_t s_i = to_kmajor ? s_k : s_rows, s_j = to_kmajor ? s_rows : s_k, s_z = x.s_batch;
        int ni = int(inner), nj = int(outer), esize = int(es);
        void* dst = buf.view().storage->data;
        int64_t ld = padded, d_z = outer * padded;
        const unsigned batch = r == 3 ? unsigned(X.shape()[0]) : 1u;
        // Float32 (the operands transposed: tf32 and the FMA kernels') in 16-byte vectors where
        // the source's rows along j are contiguous and 16 bytes apart (the destination's are:
        // rows 128 bytes apart in a fresh buffer).
        const bool vectors = es == 4 && s_j == 1 && s_i % 4 == 0 && (batch == 1 || s_z % 4 == 0) &&
                             reinterpret_cast<uintptr_t>(src) % 16 == 0;
        if (vectors) {
            void* params[] = {&src, &s_i, &s_z, &ni, &nj, &dst, &ld, &d_z};
            be.launch_precompiled(be.precompiled(kiln_gemm_sm80_image, "kiln_gemm_transpose_64", 0),
                                  unsigned((nj + 63) / 64), unsigned((ni + 63) / 64), batch, 256, 0, params);
        } else {
            void* params[] = {&src, &s_i, &s_j, &s_z, &ni, &nj, &dst, &ld, &d_z, &esize};
            be.launch_precompiled(be.precompiled(kiln_gemm_sm80_image, "kiln_gemm_transpose", 0),
                                  unsigned((nj + 31) / 32), unsigned((ni + 31) / 32), batch, 256, 0, params);
        }
        buf.view().storage->written = true;
        return as_operand;
    }
    // Rows moved 128 bytes apart, in 16-byte vectors, where X's rows are contiguous: read as
    // such where its rows, batch entries and base are 16-byte aligned, else assembled from the
    // aligned words under them (the elements are 2- or 4-byte aligned; that kernel counts a
    // row's bytes in 32 bits).
    const int64_t s_inner = to_kmajor ? (is_a ? x.s_col : x.s_row) : (is_a ? x.s_row : x.s_col);
    const int64_t s_outer = to_kmajor ? (is_a ? x.s_row : x.s_col) : (is_a ? x.s_col : x.s_row);
    const int64_t row_bytes = inner * int64_t(es), vecs = (row_bytes + 15) / 16, total = vecs * outer;
    const int64_t batch = r == 3 ? X.shape()[0] : 1;
    const bool aligned = (s_outer * int64_t(es)) % 16 == 0 && (batch == 1 || (x.s_batch * int64_t(es)) % 16 == 0) &&
                         reinterpret_cast<uintptr_t>(x.base) % 16 == 0;
    if (s_inner == 1 && total > 0 && total < (int64_t(1) << 31) && batch <= 65535 &&
        (aligned || row_bytes < (int64_t(1) << 32) - 16)) {
        const void* src = x.base;
        void* dst = buf.view().storage->data;
        int64_t ld = padded * int64_t(es) / 16, d_z = outer * ld;
        uint32_t vecs32 = uint32_t(vecs), total32 = uint32_t(total);
        const auto launch = [&](const char* entry, void** params) {
            be.launch_precompiled(be.precompiled(kiln_gemm_sm80_image, entry, 0), unsigned((total + 255) / 256),
                                  unsigned(batch), 1, 256, 0, params);
        };
        if (aligned) {   // strides in vectors
            int64_t s_row = s_outer * int64_t(es) / 16, s_z = x.s_batch * int64_t(es) / 16;
            uint32_t tail = uint32_t(row_bytes % 16);
            void* params[] = {&src, &s_row, &s_z, &vecs32, &tail, &total32, &dst, &ld, &d_z};
            launch("kiln_gemm_copy_rows", params);
        } else {   // strides in bytes
            int64_t s_row = s_outer * int64_t(es), s_z = x.s_batch * int64_t(es);
            uint32_t bytes32 = uint32_t(row_bytes);
            void* params[] = {&src, &s_row, &s_z, &bytes32, &vecs32, &total32, &dst, &ld, &d_z};
            launch("kiln_gemm_copy_rows_unaligned", params);
        }
        buf.view().storage->written = true;
        return as_operand;
    }
    as_operand.assign(X.expr());
    return as_operand;
}

// The layout a copy of X takes: float32 without tf32 goes rows-major (the cp.async FMA
// kernel); otherwise K-major when X is or the path needs it (tf32 wgmma), else as X is.
bool staged_kmajor(const Tensor& X, bool is_a, bool tf32) {
    if (X.dtype() == DType::Float32 && !tf32) return false;
    return is_kmajor(mat(X), is_a) || tf32;
}

} // namespace kiln::gemm::detail
