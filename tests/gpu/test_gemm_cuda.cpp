// kiln's CUDA GEMM kernels against a float64 reference computed on the host from the operands'
// stored values: every kernel entry (forced through KILN_GEMM_KERNEL) on every layout it
// accepts, odd sizes, padded and unaligned leading dimensions, every epilogue piece, batches,
// stochastic rounding and the selector's errors. Skips, saying why, without a CUDA device;
// compute-sanitizer runs it on the GPU.
#include "tests/support/cache_dir.hpp"
#include "tests/support/catch.hpp"
#include "tests/support/gpu.hpp"
#include "tests/support/random_values.hpp"
#include "tests/support/shared_storage_product.hpp"

#include <kiln/kiln.hpp>

#include "ir/half.hpp"
#include "kernels/cuda/gemm_cuda.hpp"
#include "kernels/cuda/gemm_params.hpp"
#include "kernels/cuda/gemm_select.hpp"
#include "runtime/cuda/device_backend.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace kiln;

namespace {

struct Case {
    int64_t m, n, k;
    bool ta, tb;          // A passed as A.T() of a (K, M) buffer; B as B.T() of (N, K)
    int64_t pad;          // extra elements per row of every buffer (leading dimension padding)
    bool align = false;   // round each buffer's row up to 8 elements before the padding (TMA-able)
    DotOptions o;
    DType cdtype;
    bool tc = false;      // C passed as C.T() of an (N, M) buffer: its columns contiguous
};

std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

// A rows x cols operand of dtype `dt`, as a view of a (rows, width) buffer, or, with `trans`,
// as the transpose of a (cols, width) buffer's view; width = cols (rows), rounded up to 8 with
// `align`, + pad.
Tensor operand(Context& ctx, int64_t rows, int64_t cols, bool trans, int64_t pad, bool align, DType dt, uint32_t seed) {
    const int64_t r = trans ? cols : rows, c = trans ? rows : cols;
    const int64_t width = (align ? (c + 7) / 8 * 8 : c) + pad;
    Tensor buf = ctx.array(random_floats(size_t(r * width), seed), {r, width}, dt);
    Tensor v = buf.slice({Slice::all(), Slice::range(0, c)});
    return trans ? v.T() : v;
}

// Max over elements of |got - ref| / bound, where bound is what the dtype's rounding allows:
// out_eps of |ref| (C's storage rounding) + acc_eps of the absolute-product magnitude.
// row_sums: C's row sums as stored (what bsum holds), in float64. row_mags (with row_sums):
// each row's sum of its values' magnitude bounds (the absolute products).
double check_against_reference(const Tensor& A, const Tensor& B, const Tensor& C0, const Tensor& C, const DotOptions& o,
                               double out_eps, double acc_eps, std::vector<double>* row_sums = nullptr,
                               std::vector<double>* row_mags = nullptr) {
    const int64_t M = C.shape()[0], N = C.shape()[1], K = A.shape()[1];
    const std::vector<float> a = A.to_vector<float>(), b = B.to_vector<float>(), c0 = C0.to_vector<float>(),
                             c = C.to_vector<float>();
    std::vector<float> bias = o.bias ? o.bias->to_vector<float>() : std::vector<float>();
    double worst = 0;
    if (row_sums) row_sums->assign(size_t(M), 0.0);
    if (row_mags) row_mags->assign(size_t(M), 0.0);
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            double acc = 0, mag = 0;
            for (int64_t kk = 0; kk < K; ++kk) {
                const double p = double(a[i * K + kk]) * b[kk * N + j];
                acc += p;
                mag += std::fabs(p);
            }
            double v = o.alpha * acc;
            mag = std::fabs(o.alpha) * mag;
            if (o.bias) v += bias[j], mag += std::fabs(bias[j]);
            if (o.relu && v <= 0) v *= o.slope, mag *= std::max(std::fabs(o.slope), 1.0);
            if (o.beta != 0) v += o.beta * c0[i * N + j], mag += std::fabs(o.beta * c0[i * N + j]);
            if (row_sums) (*row_sums)[i] += c[i * N + j];
            if (row_mags) (*row_mags)[i] += mag;
            const double bound = out_eps * std::fabs(v) + acc_eps * mag + 1e-30;
            worst = std::max(worst, std::fabs(c[i * N + j] - v) / bound);
        }
    return worst;
}

// bsum against the float64 row sums of C as stored: 1e-3 relative, plus `rounding`, plus
// `mag_eps` of the row's magnitudes (`mags`, check_against_reference's row_mags). (That the
// sums are of the rounded values, and to float32's precision, is asserted apart, by
// "bsum adds the values as stored".)
void check_row_sums(const std::vector<float>& got, const std::vector<double>& sums, double rounding, double relative = 1e-3,
                    const std::vector<double>* mags = nullptr, double mag_eps = 0) {
    for (size_t i = 0; i < sums.size(); ++i)
        CHECK(std::fabs(got[i] - sums[i]) <= relative * (1 + std::fabs(sums[i])) + rounding + (mags ? mag_eps * (*mags)[i] : 0.0));
}

// Whether the context's GPU runs the sm_90 kernels; if not, says why `what` skips.
bool hopper_or_skip(Context& ctx, const char* what) {
    const int sm = cuda::cuda_backend(ctx).info().sm;
    if (sm != 90) std::printf("SKIPPED (the %s kernels are sm_90 code; this GPU is sm_%d)\n", what, sm);
    return sm == 90;
}

double out_eps(DType c) { return c == DType::Float16 ? 1.01 / 2048 : c == DType::BFloat16 ? 1.01 / 256 : 0; }
double acc_eps(DType a, bool tf32) { return a == DType::Float32 && tf32 ? 2.5e-3 : 2e-6; }

// Runs one case (optionally forcing a kernel); returns false when the forced kernel cannot run
// it (the selector's Value error), true when it ran and matched.
bool run_case(Context& ctx, const Case& cs, DType dt, const std::string& kernel, uint32_t seed) {
    Tensor A = operand(ctx, cs.m, cs.k, cs.ta, cs.pad, cs.align, dt, seed);
    Tensor B = operand(ctx, cs.k, cs.n, cs.tb, cs.pad, cs.align, dt, seed + 1);
    Tensor C = operand(ctx, cs.m, cs.n, cs.tc, cs.pad, cs.align, cs.cdtype, seed + 2);
    Tensor C0 = ctx.empty({cs.m, cs.n}, cs.cdtype);
    C0.assign(C.expr());
    DotOptions o = cs.o;
    Tensor bsum;
    if (o.bsum) {
        bsum = ctx.zeros({cs.m}, DType::Float32);
        o.bsum = bsum;
    }
    if (o.bias) o.bias = ctx.array(random_floats(size_t(cs.n), seed + 3), {cs.n}, DType::Float32);
    if (!kernel.empty()) setenv("KILN_GEMM_KERNEL", kernel.c_str(), 1);
    try {
        compound_dot(A, B, C, o);
    } catch (const Error& e) {
        unsetenv("KILN_GEMM_KERNEL");
        if (!kernel.empty() && std::string(e.what()).find("cannot run this problem") != std::string::npos) return false;
        throw;
    }
    unsetenv("KILN_GEMM_KERNEL");
    std::vector<double> sums, mags;
    const double worst = check_against_reference(A, B, C0, C, o, out_eps(cs.cdtype), acc_eps(dt, ctx.allow_tf32()),
                                                 o.bsum ? &sums : nullptr, o.bsum ? &mags : nullptr);
    INFO(kernel << " " << dtype_name(dt) << " -> " << dtype_name(cs.cdtype) << " " << cs.m << "x" << cs.n << "x" << cs.k
                << (cs.ta ? " A^T" : "") << (cs.tb ? " B^T" : "") << " pad " << cs.pad << " alpha " << o.alpha << " beta "
                << o.beta << " relu " << o.relu << " slope " << o.slope << " bias " << bool(o.bias) << " bsum "
                << bool(o.bsum));
    CHECK(worst <= 1.0);
    if (o.bsum) {
        // The sums of C as stored, to float32's precision: 1e-5 of the sum and of the row's
        // magnitudes (float32 adds the row in some order; the tensor cores' adds truncate).
        check_row_sums(bsum.to_vector<float>(), sums, 0, 1e-5, &mags, 1e-5);
    }
    return true;
}

const std::vector<std::string> kEntries = {
    "kiln_gemm_fma_f32_128x128", "kiln_gemm_fma_f32_256x16",
    "kiln_gemm_mma_f16_128x128", "kiln_gemm_mma_f16_64x64", "kiln_gemm_mma_bf16_128x128", "kiln_gemm_mma_bf16_64x64",
    "kiln_gemm_mma_tf32_128x128", "kiln_gemm_mma_tf32_64x64",
};

std::vector<std::string> wgmma_entries(const std::string& tag, bool transposes) {
    std::vector<std::string> out;
    for (std::string l : {"kk", "kt", "tk", "tt"}) {
        if (!transposes && l != "kk") continue;
        for (std::string cfg : {"256_c2_s4", "128_c2_s6", "64_c2_s8", "64_c1_s8", "16_c1_s8"}) out.push_back("kiln_gemm_wg_" + tag + "_" + l + "_" + cfg);
    }
    return out;
}

// A one-tile wgmma kernel's launch: shared memory and threads, as the selector gives them
// (gemm_select.cpp).
int one_tile_smem(int64_t bm, int64_t bn, int64_t stages) { return int(stages * (bm + bn) * 128 + 1024 + bn * 4); }
int one_tile_threads(int64_t bm) { return int(bm / 64 + 1) * 128; }

DotOptions epilogue_variant(int i) {
    DotOptions o;
    switch (i % 4) {
        case 0: break;
        case 1: o.alpha = 0.5, o.beta = -1.25; break;
        case 2: o.relu = true, o.bias = Tensor(); break;
        case 3: o.relu = true, o.slope = 0.1, o.bias = Tensor(), o.bsum = Tensor(), o.beta = 1; break;
    }
    return o;
}

} // namespace

TEST_CASE("gpu gemm: every kernel on every layout it takes, odd sizes, every epilogue, against float64") {
    REQUIRE_GPU();
    struct Run { DType dt; bool tf32; std::vector<std::string> entries; };
    std::vector<Run> runs = {
        {DType::Float16, false, {kEntries[2], kEntries[3]}},
        {DType::BFloat16, false, {kEntries[4], kEntries[5]}},
        {DType::Float32, false, {kEntries[0], kEntries[1]}},
        {DType::Float32, true, {kEntries[6], kEntries[7]}},
    };
    for (auto& e : wgmma_entries("f16", true)) runs[0].entries.push_back(e);
    for (auto& e : wgmma_entries("bf16", true)) runs[1].entries.push_back(e);
    for (auto& e : wgmma_entries("tf32", false)) runs[3].entries.push_back(e);
    for (const char* e : {"kiln_gemm_wg_tf32_tk_64_c1_s8", "kiln_gemm_wg_tf32_tk_64_c2_s8", "kiln_gemm_wg_tf32_tk_16_c1_s8"})
        runs[3].entries.push_back(e);
    const std::vector<std::array<int64_t, 3>> sizes = {{1, 1, 1}, {7, 9, 13}, {129, 130, 67}, {300, 257, 1003}};
    std::map<std::string, int> ran;
    Context ctx(ContextOptions{"cuda"});
    const bool hopper = cuda::cuda_backend(ctx).info().sm == 90;
    int variant = 0;
    for (const Run& r : runs) {
        ctx.set_allow_tf32(r.tf32);
        for (const std::string& kernel : r.entries)
            for (int layout = 0; layout < 4; ++layout)
                for (auto [m, n, k] : sizes) {
                    Case cs{m, n, k, bool(layout & 1), bool(layout & 2), 8, true, epilogue_variant(variant++),
                            r.dt == DType::Float32 ? DType::Float32 : r.dt};
                    if (run_case(ctx, cs, r.dt, kernel, uint32_t(variant))) ++ran[kernel];
                }
    }
    // Every portable kernel ran somewhere; on sm_90 every wgmma kernel did too.
    for (const Run& r : runs)
        for (const std::string& kernel : r.entries) {
            INFO(kernel);
            if (hopper || kernel.find("_wg_") == std::string::npos) CHECK(ran[kernel] > 0);
        }
}

TEST_CASE("gpu gemm: the selector's choice on unaligned leading dimensions, mixed output dtypes, batches") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    int seed = 100;
    for (DType dt : {DType::Float16, DType::BFloat16, DType::Float32})
        for (DType cdt : {DType::Float32, DType::Float16, DType::BFloat16})
            for (int64_t pad : {0, 1, 3, 8})
                for (int layout = 0; layout < 4; ++layout)
                    for (const char* copy : {"never", "always"}) {
                        // "always": operands the wgmma kernels cannot read are copied (sm_90).
                        setenv("KILN_GEMM_COPY", copy, 1);
                        Case cs{1003, 70, 130, bool(layout & 1), bool(layout & 2), pad, pad == 8, epilogue_variant(seed), cdt};
                        const bool ran = run_case(ctx, cs, dt, "", uint32_t(seed++));
                        unsetenv("KILN_GEMM_COPY");
                        REQUIRE(ran);
                    }
    // tf32 on operands that are not K-major: copied to K-major for wgmma when allowed.
    ctx.set_allow_tf32(true);
    for (int layout = 0; layout < 4; ++layout) {
        setenv("KILN_GEMM_COPY", "always", 1);
        Case cs{300, 260, 200, bool(layout & 1), bool(layout & 2), 3, false, epilogue_variant(layout), DType::Float32};
        const bool ran = run_case(ctx, cs, DType::Float32, "", uint32_t(seed++));
        unsetenv("KILN_GEMM_COPY");
        REQUIRE(ran);
    }
    // A M-major (tf32 A^T, N <= 256): through registers on the tk kernels, B copied K-major
    // where it is N-major; a forced kk kernel has A copied K-major instead (with copies forced:
    // this product is too small for rule 5 to copy).
    for (int layout : {1, 3})
        for (const char* kernel : {"", "kiln_gemm_wg_tf32_kk_64_c1_s8", "kiln_gemm_wg_tf32_tk_16_c1_s8"}) {
            setenv("KILN_GEMM_COPY", "always", 1);
            Case cs{300, 200, 260, true, bool(layout & 2), 8, true, epilogue_variant(layout + 1), DType::Float32};
            INFO("layout " << layout << " kernel '" << kernel << "'");
            const bool ran = run_case(ctx, cs, DType::Float32, kernel, uint32_t(seed++));
            unsetenv("KILN_GEMM_COPY");
            REQUIRE(ran);
        }
    ctx.set_allow_tf32(false);
    // Split-K, forced: the slices' sums and the JIT epilogue (bias, relu, beta, bsum).
    for (const char* splits : {"2", "5", "16"})
        for (DType dt : {DType::Float16, DType::Float32}) {
            setenv("KILN_GEMM_SPLITS", splits, 1);
            Case cs{513, 40, 1000, false, true, 8, true, epilogue_variant(3), dt};
            const bool ran = run_case(ctx, cs, dt, "", uint32_t(seed++));
            unsetenv("KILN_GEMM_SPLITS");
            REQUIRE(ran);
        }
    // A C whose columns are contiguous (as a weight gradient is written), stored along them: by the
    // general epilogue unsplit, by split-K's second step (32 x 32 blocks) split; M and N past
    // multiples of 32 (N a multiple of 4: the slices read 4 at a time), alpha and beta, bias and ReLU.
    for (const char* splits : {"1", "3", "7"})
        for (DType dt : {DType::Float16, DType::Float32})
            for (int variant : {1, 2}) {
                setenv("KILN_GEMM_SPLITS", splits, 1);
                Case cs{130, variant == 1 ? 97 : 100, 1000, false, true, 8, true, epilogue_variant(variant), dt, true};
                const bool ran = run_case(ctx, cs, dt, "", uint32_t(seed++));
                unsetenv("KILN_GEMM_SPLITS");
                REQUIRE(ran);
            }
    // Few long rows with bsum: the second step's warps share a row (2, 4 and 8 of them).
    for (int64_t n : {300, 700, 1500})
        for (DType dt : {DType::Float16, DType::Float32}) {
            setenv("KILN_GEMM_SPLITS", "5", 1);
            Case cs{37, n, 1000, true, false, 8, true, epilogue_variant(3), dt};
            INFO("N " << n);
            const bool ran = run_case(ctx, cs, dt, "", uint32_t(seed++));
            unsetenv("KILN_GEMM_SPLITS");
            REQUIRE(ran);
        }
    // Batched, B shared, with bias, ReLU and bsum over several tiles per row: one launch (the
    // last tile of a row adds the row's partial sums), the same bits every time (the turn
    // counters return to zero), in bsum's dtype; C in float32 (the general epilogue) and in
    // the operands' dtype with 16-byte rows (the wgmma kernels' 16-bit epilogue on sm_90).
    for (DType dt : {DType::Float16, DType::BFloat16, DType::Float32}) {
        // C in float32, and (16-bit operands) in the operands' dtype.
        const std::vector<DType> cdts = dt == DType::Float32 ? std::vector<DType>{dt} : std::vector<DType>{DType::Float32, dt};
        for (DType cdt : cdts)
            for (DType bdt : {DType::Float32, DType::BFloat16}) {
                const int64_t batch = 3, M = 130, N = 304, K = 40;
                Tensor A = ctx.array(random_floats(batch * M * K, 7), {batch, M, K}, dt);
                Tensor B = ctx.array(random_floats(K * N, 8), {K, N}, dt);
                Tensor C = ctx.zeros({batch, M, N}, cdt);
                Tensor bs = ctx.zeros({batch, M, 1}, bdt);
                Tensor bias = ctx.array(random_floats(size_t(N), 9), {N}, DType::Float32);
                DotOptions o;
                o.bsum = bs;
                o.alpha = 2;
                o.relu = true;
                o.bias = bias;
                std::vector<float> first;
                for (int rep = 0; rep < 3; ++rep) {
                    const uint64_t launches = cuda::cuda_backend(ctx).counters().launches;   // every kernel, GEMMs too
                    batched_dot(A, B, C, o);
                    CHECK(cuda::cuda_backend(ctx).counters().launches - launches == 1);
                    const std::vector<float> all = bs.to_vector<float>();
                    if (rep == 0) first = all;
                    CHECK(all == first);
                }
                const double tol = bdt == DType::BFloat16 ? 8e-3 : 1e-3;
                for (int64_t i = 0; i < batch; ++i) {
                    DotOptions oi;
                    oi.alpha = 2;
                    oi.relu = true;
                    oi.bias = bias;
                    Tensor zero = ctx.zeros({M, N}, cdt);
                    std::vector<double> sums;
                    INFO(dtype_name(dt) << " -> " << dtype_name(cdt) << ", bsum " << dtype_name(bdt));
                    CHECK(check_against_reference(A[i], B, zero, C[i], oi, out_eps(cdt), acc_eps(dt, false), &sums) <= 1.0);
                    for (int64_t r = 0; r < M; ++r) CHECK(std::fabs(first[i * M + r] - sums[r]) <= tol * (1 + std::fabs(sums[r])));
                }
            }
    }
    // tf32, batched A M-major beside a shared B (rank 2): A through registers (the tk kernels),
    // each batch entry against float64.
    ctx.set_allow_tf32(true);
    for (bool b_kmajor : {false, true}) {
        const int64_t batch = 2, M = 200, N = 72, K = 96;
        Tensor A = ctx.array(random_floats(batch * K * M, 11), {batch, K, M}, DType::Float32).transpose({0, 2, 1});
        Tensor B = b_kmajor ? ctx.array(random_floats(N * K, 12), {N, K}, DType::Float32).T()
                            : ctx.array(random_floats(K * N, 12), {K, N}, DType::Float32);
        Tensor C = ctx.zeros({batch, M, N}, DType::Float32);
        DotOptions o;
        o.relu = true;
        batched_dot(A, B, C, o);
        for (int64_t i = 0; i < batch; ++i) {
            INFO("B K-major " << b_kmajor << ", entry " << i);
            CHECK(check_against_reference(A[i], B, ctx.zeros({M, N}, DType::Float32), C[i], o, out_eps(DType::Float32),
                                          acc_eps(DType::Float32, true)) <= 1.0);
        }
    }
    ctx.set_allow_tf32(false);
    // Batched operands copied (forced) through the copy kernels: rows 16 bytes apart but not
    // 128, whose length is not a whole number of 16-byte vectors: the row copy's last partial
    // vector (16-bit M-major A and N-major B on sm_90), the float32 transpose's partial vectors
    // and edge tiles on both sides (K-major A, B^T), in every batch entry. `unaligned`: rows an
    // odd number of elements apart, each view starting one element into its buffer (the
    // unaligned row copy, words shifted by 2 bytes in every other row; the general transpose).
    setenv("KILN_GEMM_COPY", "always", 1);
    for (DType dt : {DType::Float16, DType::Float32})
        for (bool unaligned : {false, true})
            for (bool ta : {false, true})
                for (bool tb : {false, true}) {
                    const int64_t batch = 3, M = 70, N = 100, K = 50, la = ta ? M : K, lb = tb ? K : N;
                    const int64_t wa = unaligned ? la + 3 : (la + 7) / 8 * 8, wb = unaligned ? lb + 3 : (lb + 7) / 8 * 8;
                    const int64_t ra = ta ? K : M, rb = tb ? N : K, at = unaligned ? 1 : 0;
                    Tensor Abuf = ctx.array(random_floats(size_t(batch * ra * wa), 71), {batch, ra, wa}, dt);
                    Tensor Bbuf = ctx.array(random_floats(size_t(batch * rb * wb), 72), {batch, rb, wb}, dt);
                    Tensor A = Abuf.slice({Slice::all(), Slice::all(), Slice::range(at, at + la)});
                    Tensor B = Bbuf.slice({Slice::all(), Slice::all(), Slice::range(at, at + lb)});
                    if (ta) A = A.transpose({0, 2, 1});
                    if (tb) B = B.transpose({0, 2, 1});
                    Tensor C = ctx.zeros({batch, M, N}, dt);
                    // Every copy is a precompiled kernel: no generated kernel is looked up.
                    const cuda::CudaCounters before = cuda::cuda_backend(ctx).counters();
                    batched_dot(A, B, C);
                    const cuda::CudaCounters after = cuda::cuda_backend(ctx).counters();
                    CHECK(after.compiles + after.memory_hits + after.disk_hits ==
                          before.compiles + before.memory_hits + before.disk_hits);
                    for (int64_t i = 0; i < batch; ++i) {
                        INFO(dtype_name(dt) << (unaligned ? " unaligned rows" : "") << " A^T " << ta << " B^T " << tb << ", entry "
                                            << i);
                        Tensor zero = ctx.zeros({M, N}, dt);
                        CHECK(check_against_reference(A[i], B[i], zero, C[i], DotOptions{}, out_eps(dt), acc_eps(dt, false)) <= 1.0);
                    }
                }
    unsetenv("KILN_GEMM_COPY");
}

TEST_CASE("gpu gemm: the float32 cp.async FMA kernel: tile and stage edges, refusals, splits, operand copies") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    uint32_t seed = 900;
    const std::string kernel = "kiln_gemm_fma_f32_tt_128x128";
    // A M-major (A^T), B N-major. M, N and K on and off the tile's 128, the stage's 16 and the
    // copies' 4 rows (K = 4: one partial stage; K = 1003: 63 stages wrapping the 4-stage ring).
    // (No size-1 dimension in A: its stride says nothing, and A would read as K-major.)
    const std::vector<std::array<int64_t, 3>> sizes = {{3, 5, 2},      {7, 9, 13},       {4, 4, 4},      {129, 130, 67},
                                                       {132, 260, 68}, {301, 257, 1003}, {256, 128, 16}, {8, 518, 20}};
    int variant = 0;
    for (const std::string& entry : {kernel, kernel + "_u8"})
        for (auto [m, n, k] : sizes)
            for (int v = 0; v < 4; ++v) {
                Case cs{m, n, k, true, false, 8, true, epilogue_variant(variant++), DType::Float32};
                INFO(entry << " " << m << "x" << n << "x" << k);
                REQUIRE(run_case(ctx, cs, DType::Float32, entry, seed++));
            }
    // Refused: K-major A or B, rows not 16 bytes apart.
    const DotOptions plain;
    for (const Case& cs : {Case{132, 260, 68, false, false, 8, true, plain, DType::Float32},
                           Case{132, 260, 68, true, true, 8, true, plain, DType::Float32},
                           Case{132, 260, 68, true, false, 1, false, plain, DType::Float32}}) {
        INFO(cs.m << "x" << cs.n << " A^T " << cs.ta << " B^T " << cs.tb << " pad " << cs.pad);
        CHECK_FALSE(run_case(ctx, cs, DType::Float32, kernel, seed++));
    }
    // Global k slices (the last one ends inside a stage), with leaky ReLU, bias, beta and bsum.
    setenv("KILN_GEMM_SPLITS", "4", 1);
    const bool ran_split = run_case(ctx, Case{256, 132, 1000, true, false, 8, true, epilogue_variant(3), DType::Float32},
                                    DType::Float32, kernel + "_u8", seed++);
    unsetenv("KILN_GEMM_SPLITS");
    CHECK(ran_split);
    // Rule 5: operands in other layouts (K-major, unaligned rows) copied rows-major, on every
    // layout (K long enough that the cp.async kernel's splits match the staged kernel's).
    setenv("KILN_GEMM_COPY", "always", 1);
    for (int layout = 0; layout < 4; ++layout)
        for (int64_t pad : {3, 8}) {
            Case cs{259, 258, 1024, bool(layout & 1), bool(layout & 2), pad, pad == 8, epilogue_variant(layout), DType::Float32};
            REQUIRE(run_case(ctx, cs, DType::Float32, "", seed++));
            Tensor A = operand(ctx, cs.m, cs.k, cs.ta, cs.pad, cs.align, DType::Float32, 1);
            Tensor B = operand(ctx, cs.k, cs.n, cs.tb, cs.pad, cs.align, DType::Float32, 2);
            Tensor C = ctx.zeros({cs.m, cs.n}, DType::Float32);
            const std::string chosen = gemm::selected_kernel(A, B, C);
            INFO(chosen << ", layout " << layout << ", pad " << pad);
            CHECK(chosen.find(kernel) == 0);
            CHECK((chosen.find("copied") != std::string::npos) == (layout != 1 || pad == 3));
        }
    // A batch: each entry of a K-major A copied M-major (B shared), one launch for the product.
    {
        const int64_t batch = 3, M = 130, N = 196, K = 72;
        Tensor A = ctx.array(random_floats(batch * M * K, 61), {batch, M, K}, DType::Float32);
        Tensor B = ctx.array(random_floats(K * N, 62), {K, N}, DType::Float32);
        Tensor C = ctx.zeros({batch, M, N}, DType::Float32);
        CHECK(gemm::selected_kernel(A, B, C) == kernel + "_u8 (copied A)");
        batched_dot(A, B, C);
        for (int64_t i = 0; i < batch; ++i) {
            Tensor zero = ctx.zeros({M, N}, DType::Float32);
            CHECK(check_against_reference(A[i], B, zero, C[i], DotOptions{}, 0, acc_eps(DType::Float32, false)) <= 1.0);
        }
    }
    unsetenv("KILN_GEMM_COPY");
    // Without the override: a product large enough copies A (nn), a small one does not.
    Tensor A = ctx.zeros({4096, 512}, DType::Float32), B = ctx.zeros({512, 4096}, DType::Float32);
    Tensor C = ctx.zeros({4096, 4096}, DType::Float32);
    CHECK(gemm::selected_kernel(A, B, C) == kernel + " (copied A)");
    Tensor As = ctx.zeros({256, 256}, DType::Float32), Bs = ctx.zeros({256, 256}, DType::Float32);
    Tensor Cs = ctx.zeros({256, 256}, DType::Float32);
    CHECK(gemm::selected_kernel(As, Bs, Cs).find("kiln_gemm_fma_f32_128x128") == 0);
    // Operands the staged kernel would read element by element (rows not 16 bytes apart):
    // copied where the copies cost less than the product at 10 TFLOP/s.
    Tensor Au = ctx.zeros({4096, 37}, DType::Float32).slice({Slice::all(), Slice::range(0, 35)});
    Tensor Bu = ctx.zeros({4096, 8457}, DType::Float32), Cu = ctx.zeros({35, 8457}, DType::Float32);
    CHECK(gemm::selected_kernel(Au.T(), Bu, Cu) == kernel + "_u8 (copied A B)");
    // A forced staged kernel runs on the operands as they are.
    setenv("KILN_GEMM_KERNEL", "kiln_gemm_fma_f32_128x128", 1);
    CHECK(gemm::selected_kernel(A, B, C) == "kiln_gemm_fma_f32_128x128");
    unsetenv("KILN_GEMM_KERNEL");
}

TEST_CASE("gpu gemm: K = 0, C overlapping A, stochastic rounding, and a kernel that cannot run the problem") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    // K = 0: the epilogue of a zero product.
    Tensor A0 = ctx.zeros({5, 0}, DType::Float16), B0 = ctx.zeros({0, 4}, DType::Float16);
    Tensor C0 = ctx.array(std::vector<float>(20, 2.f), {5, 4}, DType::Float32);
    DotOptions o;
    o.beta = 0.5;
    compound_dot(A0, B0, C0, o);
    for (float v : C0.to_vector<float>()) CHECK(v == 1.f);
    // C is A: computed into a fresh buffer first.
    Tensor S = ctx.array(random_floats(64 * 64, 3), {64, 64}, DType::Float32);
    const std::vector<float> s = S.to_vector<float>();
    compound_dot(S, S, S);
    const std::vector<float> got = S.to_vector<float>();
    for (int i = 0; i < 64; i += 7)
        for (int j = 0; j < 64; j += 5) {
            double ref = 0;
            for (int k = 0; k < 64; ++k) ref += double(s[i * 64 + k]) * s[k * 64 + j];
            CHECK(std::fabs(got[i * 64 + j] - ref) <= 1e-4 * 64);
        }
    // Stochastic rounding to float16: each result is one of its two float16 neighbours, both
    // occur, and over many equal products the mean is close to the exact value.
    {
        Context sr(ContextOptions{"cuda", 5, DType::Float32, 10});
        const int64_t M = 256, N = 256, K = 16;
        Tensor a = sr.empty({M, K}, DType::Float16), b = sr.empty({K, N}, DType::Float16);
        a.assign(Expr(1.0));
        b.assign(Expr(0.25));
        Tensor c = sr.empty({M, N}, DType::Float16);
        DotOptions third;
        third.alpha = 1.0 / 3.0;     // 16 * 0.25 / 3 = 4/3: between float16 grid points
        compound_dot(a, b, c, third);
        const double exact = 4.0 / 3.0;
        const uint16_t near = float_to_f16(float(exact));
        const float r = f16_to_float(near);
        const float lo = r < exact ? r : f16_to_float(uint16_t(near - 1)), hi = r < exact ? f16_to_float(uint16_t(near + 1)) : r;
        const std::vector<float> cv = c.to_vector<float>();
        double mean = 0;
        int n_lo = 0, n_hi = 0;
        for (float v : cv) {
            CHECK((v == lo || v == hi));
            n_lo += v == lo;
            n_hi += v == hi;
            mean += v;
        }
        mean /= double(cv.size());
        CHECK(n_lo > 0);
        CHECK(n_hi > 0);
        CHECK(std::fabs(mean - exact) < 0.02 * (hi - lo));
    }
    // A forced kernel that cannot run the problem names the ones that can.
    setenv("KILN_GEMM_KERNEL", "kiln_gemm_fma_f32_128x128", 1);
    Tensor h = ctx.zeros({8, 8}, DType::Float16), hc = ctx.zeros({8, 8}, DType::Float16);
    try {
        compound_dot(h, h, hc);
        FAIL("expected an error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("KILN_GEMM_KERNEL=kiln_gemm_fma_f32_128x128 cannot run this problem (8x8x8, batch "
                                         "1); the kernels that can: kiln_gemm_") != std::string::npos);
    }
    unsetenv("KILN_GEMM_KERNEL");
}

TEST_CASE("gpu gemm: KILN_AUTOTUNE=1 times the candidates, keeps a correct result and stores the choice") {
    REQUIRE_GPU();
    kiln::test::ScopedCacheDir dir;
    setenv("KILN_AUTOTUNE", "1", 1);
    bool ok = false;
    std::vector<gemm::AutotuneTiming> timed;
    {
        Context ctx(ContextOptions{"cuda"});
        Case cs{257, 190, 333, false, false, 8, true, epilogue_variant(3), DType::Float16};
        ok = run_case(ctx, cs, DType::Float16, "", 4242);
        timed = gemm::last_autotune_timings();
    }
    REQUIRE(ok);
    // Every candidate was timed.
    REQUIRE(timed.size() >= 2);
    for (const auto& t : timed) CHECK(t.ms > 0);
    // The choice is in the disk cache: an entry whose key material names the autotuner.
    CHECK(kiln::test::files_containing(dir.path(), "gemm-autotune|") == 1);
    // The candidates run as the call launches them: a 16-bit product into C of its dtype with
    // rows 16 bytes apart times the lean twins of rule 7 (plain, and with bias, ReLU and bsum),
    // not the general kernels into float32 C.
    {
        Context ctx(ContextOptions{"cuda"});
        if (hopper_or_skip(ctx, "lean twin")) {
            DotOptions with_sums;
            with_sums.relu = true, with_sums.bias = Tensor(), with_sums.bsum = Tensor();
            for (const DotOptions& o : {DotOptions{}, with_sums}) {
                Case cs{512, 256, 1024, false, false, 0, true, o, DType::Float16};
                CHECK(run_case(ctx, cs, DType::Float16, "", 4300 + int(bool(o.bsum))));
                const auto t = gemm::last_autotune_timings();
                INFO("bsum " << bool(o.bsum));
                CHECK(std::any_of(t.begin(), t.end(), [](const auto& x) { return x.kernel.find(" lean") != std::string::npos; }));
                CHECK(std::any_of(t.begin(), t.end(), [](const auto& x) { return x.kernel.find(" lean") == std::string::npos; }));
            }
        }
    }
    unsetenv("KILN_AUTOTUNE");
}

TEST_CASE("gpu gemm: the persistent wgmma kernels walk several waves of tiles, batches folded in") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "persistent")) return;
    int seed = 900;
    for (DType dt : {DType::Float16, DType::BFloat16}) {
        const std::string tag = dt == DType::Float16 ? "f16" : "bf16";
        for (const std::string l : {"kk", "kt", "tk", "tt"})
            for (int variant : {0, 2}) {
                // 14 x 11 tiles of 128 x 256: more than one per SM on 132 SMs; plain and bias + ReLU.
                const std::string kernel = "kiln_gemm_wg_" + tag + "_" + l + "_256_c2_s4_p";
                // Kernel names say k for K-major; a Case's tb passes B as the transpose of (N, K).
                Case cs{1700, 2600, 40, l[0] == 't', l[1] == 'k', 8, true, epilogue_variant(variant), dt};
                INFO(kernel);
                CHECK(run_case(ctx, cs, dt, kernel, uint32_t(seed++)));
            }
        // 9 k-tiles per tile, not a multiple of the 4 stages: the ring wraps across tiles at
        // every offset; M and N end inside a tile, C's rows are padded. C in the other 16-bit
        // type; alpha, bias, leaky ReLU and bsum over 11 tiles per row (counted and added
        // while the consumers go on), twice: the turn counters are back at zero after each.
        const DType other = dt == DType::Float16 ? DType::BFloat16 : DType::Float16;
        const std::string kernel = "kiln_gemm_wg_" + tag + "_kt_256_c2_s4_p";
        DotOptions leaky = epilogue_variant(2);
        leaky.alpha = 0.75, leaky.slope = 0.1, leaky.bsum = Tensor();
        for (int rep = 0; rep < 2; ++rep) {
            Case cs{1700, 2600, 520, false, false, 8, true, leaky, other};
            INFO(kernel << " K 520, bsum, repetition " << rep);
            CHECK(run_case(ctx, cs, dt, kernel, uint32_t(seed++)));
        }
        // One tile per row (N <= 256): each tile stores its rows' sums itself.
        Case one_column{17920, 200, 40, false, false, 8, true, leaky, dt};
        CHECK(run_case(ctx, one_column, dt, kernel, uint32_t(seed++)));
        // float32 C and beta need the other kernels: forcing this one is refused with the list.
        for (int variant : {1, 3}) {
            Case refused{1700, 2600, 40, false, false, 8, true, epilogue_variant(variant), dt};
            CHECK_FALSE(run_case(ctx, refused, dt, kernel, uint32_t(seed++)));
        }
        // float32 C: the _pf kernel (two parts per half of the 16-bit kernel's), not this one.
        Case f32c{1700, 2600, 520, false, false, 8, true, leaky, DType::Float32};
        CHECK_FALSE(run_case(ctx, f32c, dt, kernel, uint32_t(seed++)));
        for (const std::string l : {"kt", "tk"}) {
            Case cs32{1700, 2600, l == "kt" ? 520 : 40, l[0] == 't', l[1] == 'k', 8, true, leaky, DType::Float32};
            INFO("kiln_gemm_wg_" + tag + "_" + l + "_256_c2_s4_pf");
            CHECK(run_case(ctx, cs32, dt, "kiln_gemm_wg_" + tag + "_" + l + "_256_c2_s4_pf", uint32_t(seed++)));
        }
        // C's rows not a multiple of 16 bytes: TMA cannot store them, refused.
        Case odd{1700, 2600, 40, false, false, 3, false, epilogue_variant(0), dt};
        CHECK_FALSE(run_case(ctx, odd, dt, kernel, uint32_t(seed++)));
    }
    // tf32 into float32 C (K-major operands): alpha, bias, leaky ReLU.
    ctx.set_allow_tf32(true);
    {
        DotOptions o = epilogue_variant(2);
        o.alpha = 1.5, o.slope = 0.2;
        Case cs{1700, 2600, 300, false, true, 8, true, o, DType::Float32};
        CHECK(run_case(ctx, cs, DType::Float32, "kiln_gemm_wg_tf32_kk_256_c2_s4_pf", uint32_t(seed++)));
    }
    ctx.set_allow_tf32(false);
    // A batch of 2 x 81 tiles: the walk crosses from one batch entry to the next. (N is a
    // multiple of 8 so that TMA can read B's rows.)
    const int64_t batch = 2, M = 1100, N = 2112, K = 24;
    Tensor A = ctx.array(random_floats(batch * M * K, 31), {batch, M, K}, DType::Float16);
    Tensor B = ctx.array(random_floats(batch * K * N, 32), {batch, K, N}, DType::Float16);
    Tensor C = ctx.zeros({batch, M, N}, DType::Float16);
    setenv("KILN_GEMM_KERNEL", "kiln_gemm_wg_f16_kt_256_c2_s4_p", 1);
    batched_dot(A, B, C);
    unsetenv("KILN_GEMM_KERNEL");
    for (int64_t i = 0; i < batch; ++i) {
        Tensor zero = ctx.zeros({M, N}, DType::Float16);
        CHECK(check_against_reference(A[i], B[i], zero, C[i], DotOptions{}, out_eps(DType::Float16), 2e-6) <= 1.0);
    }
}

// The register epilogues on rows of A that hold NaN or -inf: ReLU keeps NaN and takes -inf to
// zero, leaky ReLU keeps -inf, and bsum sees the same values (not the NaN of A's -inf times the
// zeros TMA reads past N = 2600, inside the last 256-wide tile). The persistent kernels (16-bit
// C, float32 C, tf32 with B through registers) and the one-tile kernel.
TEST_CASE("gpu gemm: ReLU, leaky ReLU and bsum of the register epilogues on NaN and -inf rows") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "persistent")) return;
    const int64_t M = 1700, N = 2600, K = 64;   // 14 x 11 tiles: the persistent kernels run it
    std::vector<float> a = random_floats(size_t(M * K), 77), b = random_floats(size_t(K * N), 78);
    a[5 * K] = std::nanf("");
    a[9 * K] = -INFINITY;
    for (int64_t n = 0; n < N; ++n) b[n] = 0.5f;   // row 9 of C: -inf in every column
    struct Run {
        std::string kernel;
        DType in, out;
    };
    const std::vector<Run> runs = {{"kiln_gemm_wg_f16_kt_256_c2_s4_p", DType::Float16, DType::Float16},
                                   {"kiln_gemm_wg_bf16_kt_256_c2_s4_p", DType::BFloat16, DType::BFloat16},
                                   {"kiln_gemm_wg_f16_kt_256_c2_s4", DType::Float16, DType::Float16},
                                   {"kiln_gemm_wg_bf16_kt_256_c2_s4_pf", DType::BFloat16, DType::Float32},
                                   {"kiln_gemm_wg_tf32_kt_256x128_c2_s4_pf", DType::Float32, DType::Float32}};
    for (const Run& r : runs) {
        ctx.set_allow_tf32(r.in == DType::Float32);
        Tensor A = ctx.array(a, {M, K}, r.in), B = ctx.array(b, {K, N}, r.in);
        for (double slope : {0.0, 0.25})
            for (bool with_bsum : {false, true}) {
                INFO(r.kernel << " slope " << slope << (with_bsum ? " with bsum" : ""));
                Tensor C = ctx.empty({M, N}, r.out), bs = ctx.full({M}, -7.0, DType::Float32);
                DotOptions o;
                o.relu = true, o.slope = slope;
                if (with_bsum) o.bsum = bs;
                setenv("KILN_GEMM_KERNEL", r.kernel.c_str(), 1);
                compound_dot(A, B, C, o);
                unsetenv("KILN_GEMM_KERNEL");
                const std::vector<float> c = C.to_vector<float>();
                int nan5 = 0, row9 = 0, negatives = 0;
                for (int64_t n = 0; n < N; ++n) {
                    nan5 += std::isnan(c[5 * N + n]);
                    row9 += slope == 0 ? c[9 * N + n] == 0.f : c[9 * N + n] == -INFINITY;
                }
                for (int64_t i = 0; i < M * N; ++i) negatives += slope == 0 && c[i] < 0.f;
                CHECK(nan5 == N);
                CHECK(row9 == N);
                CHECK(negatives == 0);
                if (with_bsum) {
                    const std::vector<float> s = bs.to_vector<float>();
                    CHECK(std::isnan(s[5]));
                    CHECK(s[9] == (slope == 0 ? 0.f : -INFINITY));
                    CHECK(std::isfinite(s[0]));
                }
            }
    }
    ctx.set_allow_tf32(false);
}

TEST_CASE("gpu gemm: tf32 with B N-major through registers, no copy of B") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "wgmma")) return;
    ctx.set_allow_tf32(true);
    const std::string kernel = "kiln_gemm_wg_tf32_kt_256x128_c2_s4_pf";
    int seed = 1900;
    // The selector's choice for a row-major product of several waves: this kernel, B as it is.
    {
        Tensor A = ctx.empty({2048, 64}, DType::Float32), B = ctx.empty({64, 4096}, DType::Float32);
        Tensor C = ctx.empty({2048, 4096}, DType::Float32);
        CHECK(gemm::selected_kernel(A, B, C) == kernel);
        // One wave of its tiles (4 x 32): the K-major kernels, B copied.
        Tensor A1 = ctx.empty({1024, 64}, DType::Float32), C1 = ctx.empty({1024, 4096}, DType::Float32);
        CHECK(gemm::selected_kernel(A1, B, C1).find("(copied B)") != std::string::npos);
    }
    // 7 x 21 tiles of 256 x 128 (N ends inside a tile, C's rows padded): plain, bias + ReLU,
    // unforced (the selector's choice) and forced.
    for (int variant : {0, 2})
        for (const std::string& forced : {std::string(), kernel}) {
            Case cs{1700, 2600, 300, false, false, 8, true, epilogue_variant(variant), DType::Float32};
            INFO("variant " << variant << " forced " << forced);
            CHECK(run_case(ctx, cs, DType::Float32, forced, uint32_t(seed++)));
        }
    // 17 k-tiles (odd: the fragment registers alternate across tiles, the ring wraps at every
    // offset), alpha, bias, leaky ReLU and bsum over 21 tiles per row (counted), twice.
    DotOptions leaky = epilogue_variant(2);
    leaky.alpha = 0.75, leaky.slope = 0.1, leaky.bsum = Tensor();
    for (int rep = 0; rep < 2; ++rep) {
        Case cs{1700, 2600, 520, false, false, 8, true, leaky, DType::Float32};
        INFO("K 520, bsum, repetition " << rep);
        CHECK(run_case(ctx, cs, DType::Float32, kernel, uint32_t(seed++)));
    }
    // One tile per row (N <= 128): each tile stores its rows' sums itself; K shorter than a
    // stage and M ending inside a tile.
    Case one_column{35000, 100, 20, false, false, 8, true, leaky, DType::Float32};
    CHECK(run_case(ctx, one_column, DType::Float32, kernel, uint32_t(seed++)));
    // beta needs the other kernels (refused when forced); so do K-major B and 16-bit C.
    Case beta{1700, 2600, 40, false, false, 8, true, epilogue_variant(1), DType::Float32};
    CHECK_FALSE(run_case(ctx, beta, DType::Float32, kernel, uint32_t(seed++)));
    Case kmajor_b{1700, 2600, 40, false, true, 8, true, epilogue_variant(0), DType::Float32};
    CHECK_FALSE(run_case(ctx, kmajor_b, DType::Float32, kernel, uint32_t(seed++)));
    Case half_c{1700, 2600, 40, false, false, 8, true, epilogue_variant(0), DType::Float16};
    CHECK_FALSE(run_case(ctx, half_c, DType::Float32, kernel, uint32_t(seed++)));
    // bsum has the same bits in every run (the consumers' sums are added in a fixed order).
    {
        const int64_t M = 1300, N = 2900, K = 100;
        Tensor A = ctx.array(random_floats(M * K, 41), {M, K}, DType::Float32);
        Tensor B = ctx.array(random_floats(K * N, 42), {K, N}, DType::Float32);
        Tensor bias = ctx.array(random_floats(N, 43), {N}, DType::Float32);
        std::vector<float> first_c, first_s;
        for (int rep = 0; rep < 3; ++rep) {
            Tensor C = ctx.empty({M, N}, DType::Float32), bs = ctx.zeros({M}, DType::Float32);
            DotOptions o;
            o.relu = true, o.bias = bias, o.bsum = bs;
            setenv("KILN_GEMM_KERNEL", kernel.c_str(), 1);
            compound_dot(A, B, C, o);
            unsetenv("KILN_GEMM_KERNEL");
            if (rep == 0) {
                first_c = C.to_vector<float>(), first_s = bs.to_vector<float>();
                std::vector<double> sums;
                Tensor zero = ctx.zeros({M, N}, DType::Float32);
                CHECK(check_against_reference(A, B, zero, C, o, 0, acc_eps(DType::Float32, true), &sums) <= 1.0);
                check_row_sums(first_s, sums, 0);
            } else {
                CHECK(C.to_vector<float>() == first_c);
                CHECK(bs.to_vector<float>() == first_s);
            }
        }
    }
    // A batch of 2 x 76 tiles, B per entry: the walk crosses from one entry to the next.
    const int64_t batch = 2, M = 1000, N = 2400, K = 72;
    Tensor A = ctx.array(random_floats(batch * M * K, 51), {batch, M, K}, DType::Float32);
    Tensor B = ctx.array(random_floats(batch * K * N, 52), {batch, K, N}, DType::Float32);
    Tensor C = ctx.zeros({batch, M, N}, DType::Float32);
    setenv("KILN_GEMM_KERNEL", kernel.c_str(), 1);
    batched_dot(A, B, C);
    unsetenv("KILN_GEMM_KERNEL");
    for (int64_t i = 0; i < batch; ++i) {
        Tensor zero = ctx.zeros({M, N}, DType::Float32);
        CHECK(check_against_reference(A[i], B[i], zero, C[i], DotOptions{}, 0, acc_eps(DType::Float32, true)) <= 1.0);
    }
    ctx.set_allow_tf32(false);
}

// bsum in the persistent kernels: tiles store tagged partial sums and each row's last tile in
// the walk adds them (sm90/scheduler.cuh). Batch entries, blocks that add several rows (by their
// bsum warps, and the last by their consumers), tags left in the scratch by earlier launches
// of other shapes, and the same bits on every run.
TEST_CASE("gpu gemm: bsum in the persistent kernels: tagged partials, one adder per row") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "persistent")) return;
    struct Run {
        const char* kernel;
        DType dt;
        bool tf32;
        int64_t batch, m, n, k;
    };
    const std::vector<Run> runs = {
        // 3 entries of 6 x 20 tiles (M and N end inside a tile).
        {"kiln_gemm_wg_f16_kt_256_c2_s4_p", DType::Float16, false, 3, 700, 5000, 64},
        // 150 x 2 tiles: with 128 blocks a block often adds two rows of tiles in a row.
        {"kiln_gemm_wg_bf16_kt_256_c2_s4_p", DType::BFloat16, false, 1, 19200, 400, 72},
        // 12 x 22 tiles: 264, two rounds on 132 blocks but three on 128, so all SMs run it
        // (rule 6), and a round's 8 consecutive blocks do not share a column of tiles.
        {"kiln_gemm_wg_f16_kt_256_c2_s4_p", DType::Float16, false, 1, 1536, 5600, 64},
        // Fewer, shorter rows than the first run: words of its launch are still in the scratch.
        {"kiln_gemm_wg_f16_kt_256_c2_s4_p", DType::Float16, false, 1, 2200, 4200, 64},
        {"kiln_gemm_wg_tf32_kt_256x128_c2_s4_pf", DType::Float32, true, 2, 700, 3000, 40},
        {"kiln_gemm_wg_tf32_kt_256x128_c2_s4_pf", DType::Float32, true, 1, 38400, 200, 24},
        {"kiln_gemm_wg_f16_kt_256_c2_s4_p", DType::Float16, false, 3, 700, 5000, 64},
    };
    uint32_t seed = 2900;
    for (const Run& r : runs) {
        INFO(r.kernel << " batch " << r.batch << " " << r.m << "x" << r.n << "x" << r.k);
        ctx.set_allow_tf32(r.tf32);
        Tensor A = ctx.array(random_floats(size_t(r.batch * r.m * r.k), seed++), {r.batch, r.m, r.k}, r.dt);
        Tensor B = ctx.array(random_floats(size_t(r.batch * r.k * r.n), seed++), {r.batch, r.k, r.n}, r.dt);
        Tensor bias = ctx.array(random_floats(size_t(r.n), seed++), {r.n}, DType::Float32);
        std::vector<float> first_c, first_s;
        for (int rep = 0; rep < 2; ++rep) {
            // -7 everywhere: every sum must be written.
            Tensor C = ctx.empty({r.batch, r.m, r.n}, r.dt), bs = ctx.full({r.batch, r.m}, -7.0, DType::Float32);
            DotOptions o;
            o.relu = true, o.slope = 0.05, o.bias = bias, o.bsum = bs;
            setenv("KILN_GEMM_KERNEL", r.kernel, 1);
            batched_dot(A, B, C, o);
            unsetenv("KILN_GEMM_KERNEL");
            // The grid of rule 6 (persistent_grid) on this GPU's SMs (the 16-bit kernels' 128 x
            // 256 tiles).
            if (!r.tf32) {
                const int64_t tiles = r.batch * ((r.m + 127) / 128) * ((r.n + 255) / 256);
                CHECK(gemm::last_gemm_blocks() == gemm::persistent_grid(tiles, cuda::cuda_backend(ctx).info().multiprocessors));
            }
            if (rep == 1) {
                CHECK(C.to_vector<float>() == first_c);
                CHECK(bs.to_vector<float>() == first_s);   // the same bits on every run
                continue;
            }
            first_c = C.to_vector<float>(), first_s = bs.to_vector<float>();
            for (int64_t z = 0; z < r.batch; ++z) {
                std::vector<double> sums;
                Tensor zero = ctx.zeros({r.m, r.n}, r.dt);
                CHECK(check_against_reference(A[z], B[z], zero, C[z], o, out_eps(r.dt), acc_eps(r.dt, r.tf32), &sums) <= 1.0);
                check_row_sums(bs[z].to_vector<float>(), sums, r.n * out_eps(r.dt) * 4);
            }
        }
    }
    ctx.set_allow_tf32(false);
}

TEST_CASE("gpu gemm: rows of 2-4 tiles launched as clusters where every row's cluster fits at once") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "wgmma")) return;
    // Rows of 2, 3 and 4 tiles on every one-tile kernel, few rows (one cluster per row, all at
    // once) and, but on the 256-wide tile, more rows than any GPU holds clusters of that size at
    // once (more blocks than the SMs hold at once: no cluster), every epilogue variant, A in both
    // layouts; with bsum (variant 3) too (bsum_cluster where the rows fit at once, else the
    // partials in global memory). K = 136 is 3 k-tiles: no split-K.
    int seed = 2100;
    const int64_t sms = cuda::cuda_backend(ctx).info().multiprocessors;
    for (const std::string cfg : {"16_c1_s8", "64_c1_s8", "64_c2_s8", "128_c2_s6", "256_c2_s4"})
        for (const int64_t tiles_n : {2, 3, 4})
            for (const int64_t rows : {5, 70})
                for (int variant = 0; variant < 4; ++variant) {
                    if (cfg == "256_c2_s4" && rows > 5) continue;
                    const int64_t bm = cfg == "16_c1_s8" || cfg == "64_c1_s8" ? 64 : 128;
                    const int64_t bn = cfg == "256_c2_s4" ? 256 : cfg == "128_c2_s6" ? 128 : cfg == "16_c1_s8" ? 16 : 64;
                    const bool ta = variant % 2;
                    const std::string kernel = std::string("kiln_gemm_wg_f16_") + (ta ? "t" : "k") + "t_" + cfg;
                    Case cs{bm * rows - 3, bn * tiles_n - 8, 136, ta, false, 8, true, epilogue_variant(variant), DType::Float16};
                    INFO(kernel << ", rows of " << tiles_n << " tiles, " << rows << " rows");
                    const uint64_t clusters = cuda::cuda_backend(ctx).counters().cluster_launches;
                    CHECK(run_case(ctx, cs, DType::Float16, kernel, uint32_t(seed++)));
                    const uint64_t launched = cuda::cuda_backend(ctx).counters().cluster_launches - clusters;
                    // (Blocks of the 16-wide tile, 82 KB of shared memory, may run two to an SM.)
                    const int64_t per_sm = cfg == "16_c1_s8" ? 2 : 1;
                    if (rows == 5) CHECK(launched == 1);
                    else if (rows * tiles_n > per_sm * sms) CHECK(launched == 0);
                }
}

TEST_CASE("gpu gemm: rows one tile wide that fill 7/8 or more of the SMs launch as clusters of 4 along m") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "wgmma")) return;
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    const int64_t sms = be.info().multiprocessors;
    // Every one-tile kernel, N inside one tile. Tile counts: the most clusters of 4 that run at
    // once one block to an SM, within the SMs (a cluster launch where that is 7/8 of the SMs or
    // more); four more than that (no cluster: they would not all run at once, or more blocks
    // than SMs); 3/4 of the SMs (no cluster); and a batch of two entries holding the first count
    // between them. Every epilogue variant; K = 136 is 3 k-tiles (no split).
    int seed = 2700;
    struct Cfg { const char* name; int64_t bm, bn, stages; };
    // (The 16-wide tile shares B in clusters along m instead: the next case.)
    for (const Cfg cfg : {Cfg{"64_c1_s8", 64, 64, 8}, Cfg{"64_c2_s8", 128, 64, 8}, Cfg{"128_c2_s6", 128, 128, 6},
                          Cfg{"256_c2_s4", 128, 256, 4}})
        for (const bool ta : {false, true}) {
            const std::string kernel = std::string("kiln_gemm_wg_f16_") + (ta ? "t" : "k") + "t_" + cfg.name;
            const int smem = one_tile_smem(cfg.bm, cfg.bn, cfg.stages), threads = one_tile_threads(cfg.bm);
            const int64_t most = gemm::clusters_at_once_one_per_sm(be, kernel, 4, threads, smem);
            const int64_t full = std::min(4 * most, sms / 4 * 4);
            for (const int64_t tiles : {full, full + 4, sms * 3 / 4 / 4 * 4})
                for (int variant = 0; variant < 4; ++variant) {
                    Case cs{cfg.bm * tiles - 5, cfg.bn - 3, 136, ta, false, 8, true, epilogue_variant(variant), DType::Float16};
                    INFO(kernel << ", " << tiles << " tiles of " << cfg.bm << " rows, " << sms << " SMs, " << most
                                << " clusters of 4 at once");
                    const uint64_t clusters = be.counters().cluster_launches;
                    CHECK(run_case(ctx, cs, DType::Float16, kernel, uint32_t(seed++)));
                    const bool expect = tiles <= 4 * most && tiles <= sms && 8 * tiles >= 7 * sms;
                    CHECK(be.counters().cluster_launches - clusters == (expect ? 1u : 0u));
                }
            // Two batch entries of full / 2 tiles (rounded to whole clusters), bias, ReLU, bsum (rows
            // of A^T's and B's buffers 16-byte aligned: TMA).
            const int64_t half = full / 8 * 4, m = cfg.bm * half - 8, n = cfg.bn - 8, k = 136;
            Tensor As = ctx.array(random_floats(size_t(2 * m * k), uint32_t(seed++)), ta ? Shape{2, k, m} : Shape{2, m, k},
                                  DType::Float16);
            Tensor A = ta ? As.transpose({0, 2, 1}) : As;
            Tensor B = ctx.array(random_floats(size_t(2 * k * n), uint32_t(seed++)), {2, k, n}, DType::Float16);
            Tensor C = ctx.empty({2, m, n}, DType::Float16), bs = ctx.full({2, m}, -7.0, DType::Float32);
            DotOptions o;
            o.relu = true, o.bias = ctx.array(random_floats(size_t(n), uint32_t(seed++)), {n}, DType::Float32), o.bsum = bs;
            const uint64_t clusters = be.counters().cluster_launches;
            setenv("KILN_GEMM_KERNEL", kernel.c_str(), 1);
            batched_dot(A, B, C, o);
            unsetenv("KILN_GEMM_KERNEL");
            INFO(kernel << ", a batch of 2 x " << half << " tiles");
            const bool expect = 2 * half <= 4 * most && 8 * 2 * half >= 7 * sms;
            CHECK(be.counters().cluster_launches - clusters == (expect ? 1u : 0u));
            for (int64_t z = 0; z < 2; ++z) {
                std::vector<double> sums;
                Tensor zero = ctx.zeros({m, n}, DType::Float16);
                CHECK(check_against_reference(A[z], B[z], zero, C[z], o, out_eps(DType::Float16), acc_eps(DType::Float16, false),
                                              &sums) <= 1.0);
                check_row_sums(bs[z].to_vector<float>(), sums, n * out_eps(DType::Float16) * 4);
            }
        }
}

TEST_CASE("gpu gemm: the 16-wide tile shares B along m in clusters of 4 or 2 (TMA multicast)") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "wgmma")) return;
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    // Every 16-wide one-tile kernel that shares B, N inside the tile, and tf32's with A K-major,
    // which does not share (it ran slower shared) and launches as the m-cluster case says. A share is
    // whole 8-row swizzle atoms of B's box: N-major B (64 rows of k for 16-bit) splits in 4,
    // K-major B (16 rows of n) in 2. Tile counts: the most clusters of 4 that run at once; four
    // more (clusters of 2 if those fit); 2 mod 4 (clusters of 2); odd (no cluster). K of 3
    // k-tiles (no stage used twice: every release skipped) and of 20 or more (the releases of
    // the other blocks' stages, the last 8 skipped). Every epilogue variant.
    int seed = 3900;
    struct Layout { DType dt; bool ta, tb; };
    for (const Layout l : {Layout{DType::Float16, false, false}, Layout{DType::Float16, true, false},
                           Layout{DType::Float16, false, true}, Layout{DType::Float16, true, true},
                           Layout{DType::BFloat16, false, false}, Layout{DType::Float32, false, true}}) {
        const bool tf32 = l.dt == DType::Float32;
        ctx.set_allow_tf32(tf32);
        const std::string kernel = std::string("kiln_gemm_wg_") + (tf32 ? "tf32" : l.dt == DType::Float16 ? "f16" : "bf16") + "_" +
                                   (l.ta ? "t" : "k") + (l.tb ? "k" : "t") + "_16_c1_s8";
        const int smem = one_tile_smem(64, 16, 8), threads = one_tile_threads(64);
        const int64_t most4 = gemm::clusters_at_once_one_per_sm(be, kernel, 4, threads, smem);
        const int64_t most2 = gemm::clusters_at_once_one_per_sm(be, kernel, 2, threads, smem);
        const int64_t sms = be.info().multiprocessors;
        const auto expected = [&](int64_t tiles, int64_t batch) {
            if (tf32) return 1;
            if (!l.tb && tiles % 4 == 0 && tiles / 4 * batch <= most4) return 4;
            if (tiles % 2 == 0 && tiles / 2 * batch <= most2) return 2;
            return 1;
        };
        setenv("KILN_GEMM_SPLITS", "1", 1);   // (the selector would split some of these in k)
        for (const int64_t tiles : {4 * most4, 4 * most4 + 4, int64_t(30), int64_t(31)})
            for (const int64_t k : {int64_t(136), tf32 ? int64_t(1221) : int64_t(64 * 19 + 5)})
                for (int variant = 0; variant < 4; ++variant) {
                    Case cs{64 * tiles - 5, 13, k, l.ta, l.tb, 8, true, epilogue_variant(variant), tf32 ? DType::Float32 : l.dt};
                    INFO(kernel << ", " << tiles << " tiles, K " << k << ", variant " << variant << ", " << most4
                                << " clusters of 4 and " << most2 << " of 2 at once");
                    const uint64_t clusters = be.counters().cluster_launches;
                    REQUIRE(run_case(ctx, cs, l.dt, kernel, uint32_t(seed++)));
                    const int share = expected(tiles, 1);
                    CHECK(gemm::last_gemm_b_share() == share);
                    const bool m_cluster = tiles % 4 == 0 && 8 * tiles >= 7 * sms && tiles <= sms && tiles / 4 <= most4;
                    CHECK(be.counters().cluster_launches - clusters == (share > 1 || m_cluster ? 1u : 0u));
                }
        // Two batch entries of 2 * most4 tiles each (a cluster of 4 per four tiles of an entry),
        // bias, ReLU and bsum.
        const int64_t tiles = std::max<int64_t>(2, most4 / 2 * 2), m = 64 * tiles - 8, n = 16, k = 64 * 21;
        const DType cd = tf32 ? DType::Float32 : l.dt;
        Tensor As = ctx.array(random_floats(size_t(2 * m * k), uint32_t(seed++)), l.ta ? Shape{2, k, m} : Shape{2, m, k}, l.dt);
        Tensor Bs = ctx.array(random_floats(size_t(2 * k * n), uint32_t(seed++)), l.tb ? Shape{2, n, k} : Shape{2, k, n}, l.dt);
        Tensor A = l.ta ? As.transpose({0, 2, 1}) : As, B = l.tb ? Bs.transpose({0, 2, 1}) : Bs;
        Tensor C = ctx.empty({2, m, n}, cd), bs = ctx.full({2, m}, -7.0, DType::Float32);
        DotOptions o;
        o.relu = true, o.bias = ctx.array(random_floats(size_t(n), uint32_t(seed++)), {n}, DType::Float32), o.bsum = bs;
        setenv("KILN_GEMM_KERNEL", kernel.c_str(), 1);
        batched_dot(A, B, C, o);
        unsetenv("KILN_GEMM_KERNEL");
        unsetenv("KILN_GEMM_SPLITS");
        INFO(kernel << ", a batch of 2 x " << tiles << " tiles");
        CHECK(gemm::last_gemm_b_share() == expected(tiles, 2));
        for (int64_t z = 0; z < 2; ++z) {
            std::vector<double> sums, mags;
            Tensor zero = ctx.zeros({m, n}, cd);
            CHECK(check_against_reference(A[z], B[z], zero, C[z], o, out_eps(cd), acc_eps(l.dt, tf32), &sums, &mags) <= 1.0);
            check_row_sums(bs[z].to_vector<float>(), sums, n * out_eps(cd) * 4, 1e-3, &mags, acc_eps(l.dt, tf32));
        }
    }
    ctx.set_allow_tf32(false);
    // The selector's own choice on DeepBench's 7680x16x2560: the description says the share
    // the launch used.
    for (const DType dt : {DType::Float16, DType::BFloat16}) {
        Tensor A = ctx.array(random_floats(size_t(7680 * 2560), 4100), {7680, 2560}, dt);
        Tensor B = ctx.array(random_floats(size_t(2560 * 16), 4101), {2560, 16}, dt);
        Tensor C = ctx.empty({7680, 16}, dt);
        const std::string chosen = gemm::selected_kernel(A, B, C);
        compound_dot(A, B, C);
        const int share = gemm::last_gemm_b_share();
        INFO(chosen);
        CHECK((share > 1) == (chosen.find(" B shared x" + std::to_string(share)) != std::string::npos));
        CHECK(check_against_reference(A, B, ctx.zeros({7680, 16}, dt), C, DotOptions{}, out_eps(dt), acc_eps(dt, false)) <= 1.0);
    }
}

TEST_CASE("gpu gemm: one wave of one-tile blocks in the raster groups of rule 6") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "wgmma")) return;
    const int64_t sms = cuda::cuda_backend(ctx).info().multiprocessors;
    // Every one-tile kernel on grids of one wave that no cluster launch groups (rows of more
    // than 4 tiles, or more rows than clusters of 4 fit at once), with partial groups at the
    // bottom of the grid and partial tiles at its edges: the raster groups of 1, 2 and 4 rows
    // that one_wave_raster_group picks there, each epilogue variant, A in both layouts. K = 136
    // is 3 k-tiles (no split).
    int seed = 3100;
    struct Cfg { const char* name; int64_t bm, bn; };
    struct Grid { int64_t tiles_m, tiles_n; };
    std::set<int> groups;
    for (const Cfg cfg : {Cfg{"16_c1_s8", 64, 16}, Cfg{"64_c1_s8", 64, 64}, Cfg{"64_c2_s8", 128, 64},
                          Cfg{"128_c2_s6", 128, 128}, Cfg{"256_c2_s4", 128, 256}})
        for (const Grid g : {Grid{5, 9}, Grid{std::min<int64_t>(31, sms / 4), 4}, Grid{7, 6}, Grid{3, 12}})
            for (int variant = 0; variant < 4; ++variant) {
                const bool ta = variant % 2;
                const std::string kernel = std::string("kiln_gemm_wg_f16_") + (ta ? "t" : "k") + "t_" + cfg.name;
                const int group = gemm::one_wave_raster_group(int(cfg.bm), int(cfg.bn), g.tiles_m, g.tiles_n);
                groups.insert(group);
                Case cs{cfg.bm * g.tiles_m - 5, cfg.bn * g.tiles_n - 8, 136, ta, false, 8, true, epilogue_variant(variant),
                        DType::Float16};
                INFO(kernel << ", " << g.tiles_m << " x " << g.tiles_n << " tiles, raster groups of " << group);
                CHECK(run_case(ctx, cs, DType::Float16, kernel, uint32_t(seed++)));
            }
    for (const int group : {1, 2, 4}) CHECK(groups.count(group) == 1);   // each group the rule can pick, run
}

TEST_CASE("gpu gemm: bsum over a row of 2-8 tiles in one cluster, through distributed shared memory") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "wgmma")) return;
    // The one-tile kernels: 2 to 8 tiles per row take the cluster, 9 or more the global sums
    // (bsum_partials and the turn counters); N = 104, 296, 520, 1000 make 1-63 tiles per row
    // over the four tile widths (B's rows 16-byte multiples, as TMA needs). 16-bit C without
    // beta (the 16-bit epilogue) and float32 C with beta (the general one); M ends inside a
    // tile. bsum in float32 and in bfloat16 (rounded once, after the tiles' sums are added),
    // holding garbage before the product (every row is written). Each case twice: the same
    // bits both times.
    int seed = 1500;
    for (const std::string cfg : {"64_c1_s8", "128_c2_s6", "256_c2_s4", "16_c1_s8", "64_c2_s8"})
        for (const int64_t n : {104, 296, 520, 1000})
            for (int variant : {2, 3})
                for (DType bdt : {DType::Float32, DType::BFloat16}) {
                    const std::string kernel = "kiln_gemm_wg_f16_kt_" + cfg;
                    DotOptions o = epilogue_variant(variant);
                    o.bsum = Tensor();
                    const DType cdt = variant == 3 ? DType::Float32 : DType::Float16;
                    INFO(kernel << " N " << n << " variant " << variant << " bsum " << dtype_name(bdt));
                    const int64_t M = 333, K = 200;
                    Tensor A = ctx.array(random_floats(M * K, uint32_t(seed)), {M, K}, DType::Float16);
                    Tensor B = ctx.array(random_floats(K * n, uint32_t(seed + 1)), {K, n}, DType::Float16);
                    Tensor C0 = ctx.array(random_floats(M * n, uint32_t(seed + 2)), {M, n}, cdt);
                    Tensor bias = ctx.array(random_floats(size_t(n), uint32_t(seed + 3)), {n}, DType::Float32);
                    Tensor garbage = ctx.array(random_floats(size_t(M), uint32_t(seed + 4)), {M}, DType::Float32);
                    seed += 5;
                    o.bias = bias;
                    std::vector<float> first;
                    for (int rep = 0; rep < 2; ++rep) {
                        Tensor C = ctx.empty({M, n}, cdt);
                        C.assign(C0.expr());
                        Tensor bs = ctx.empty({M}, bdt);
                        bs.assign(garbage.expr() * 1000.0);
                        o.bsum = bs;
                        setenv("KILN_GEMM_KERNEL", kernel.c_str(), 1);
                        const uint64_t launches = cuda::cuda_backend(ctx).counters().launches;
                        compound_dot(A, B, C, o);
                        CHECK(cuda::cuda_backend(ctx).counters().launches - launches == 1);
                        unsetenv("KILN_GEMM_KERNEL");
                        std::vector<double> sums;
                        CHECK(check_against_reference(A, B, C0, C, o, out_eps(cdt), 2e-6, &sums) <= 1.0);
                        const std::vector<float> got = bs.to_vector<float>();
                        const double bsum_eps = bdt == DType::BFloat16 ? 1.01 / 256 : 0;
                        check_row_sums(got, sums, n * out_eps(cdt) * 4, 1e-3 + bsum_eps);
                        if (rep == 0) first = got;
                        CHECK(got == first);
                    }
                }
    // Batched (bsum (batch, M, 1), garbage before): rows of two tiles and of three, 16-bit C
    // and float32 C.
    for (const auto& [cfg, n] : std::vector<std::pair<std::string, int64_t>>{{"64_c1_s8", 104}, {"256_c2_s4", 296}, {"128_c2_s6", 296}, {"64_c2_s8", 104}})
        for (DType cdt : {DType::Float16, DType::Float32}) {
            const std::string kernel = "kiln_gemm_wg_f16_kt_" + cfg;
            INFO(kernel << " batched, N " << n << " C " << dtype_name(cdt));
            const int64_t batch = 3, M = 150, K = 72;
            Tensor A = ctx.array(random_floats(batch * M * K, uint32_t(seed)), {batch, M, K}, DType::Float16);
            Tensor B = ctx.array(random_floats(batch * K * n, uint32_t(seed + 1)), {batch, K, n}, DType::Float16);
            Tensor bias = ctx.array(random_floats(size_t(n), uint32_t(seed + 2)), {n}, DType::Float32);
            Tensor bs = ctx.array(random_floats(size_t(batch * M), uint32_t(seed + 3)), {batch, M, 1}, DType::Float32);
            seed += 4;
            Tensor C = ctx.empty({batch, M, n}, cdt);
            DotOptions o;
            o.relu = true;
            o.bias = bias;
            o.bsum = bs;
            setenv("KILN_GEMM_KERNEL", kernel.c_str(), 1);
            batched_dot(A, B, C, o);
            unsetenv("KILN_GEMM_KERNEL");
            const std::vector<float> got = bs.to_vector<float>();
            for (int64_t i = 0; i < batch; ++i) {
                DotOptions oi;
                oi.relu = true;
                oi.bias = bias;
                Tensor zero = ctx.zeros({M, n}, cdt);
                std::vector<double> sums;
                CHECK(check_against_reference(A[i], B[i], zero, C[i], oi, out_eps(cdt), 2e-6, &sums) <= 1.0);
                check_row_sums(std::vector<float>(got.begin() + i * M, got.begin() + (i + 1) * M), sums, n * out_eps(cdt) * 4);
            }
        }
}

// bsum holds the row sums of C as stored (rounded to C's dtype), on every path: each value of
// this product, alpha * A . B + bias = 1.5 + k / 16 + a quarter of C's ulp at 1.5 (A has two
// entries of +-1 a row, B entries of -1, 0 and 1, alpha 1/16), lies a quarter ulp above a
// value C holds, so the unrounded row sums exceed the stored ones by N quarter ulps; and the
// stored values are positive multiples of 2^-12 whose sums (under 4096) float32 adds exactly
// in any order, so bsum must equal them to the bit. Every kernel entry, with and without the
// lean twins, one row of tiles and several (cluster and global sums), split-K (global and in
// clusters), beta, stochastic rounding, and float32 C (the values themselves, exactly).
TEST_CASE("gpu gemm: bsum adds the values as stored (rounded to C's dtype), on every path") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    const bool hopper = cuda::cuda_backend(ctx).info().sm == 90;
    const int64_t K = 512;
    uint32_t seed = 7100;
    const auto run = [&](DType dt, DType cdt, int64_t M, int64_t N, const std::string& kernel, const char* splits, bool lean,
                         double beta) {
        std::mt19937 g(seed++);
        std::vector<float> a(size_t(M * K), 0.f), b(size_t(K * N)), c0(size_t(M * N));
        std::vector<std::array<int64_t, 2>> at(static_cast<size_t>(M));   // where A's row holds its two entries
        for (int64_t i = 0; i < M; ++i) {
            at[size_t(i)] = {int64_t(g() % (K / 2)), K / 2 + int64_t(g() % (K / 2))};
            for (int64_t kk : at[size_t(i)]) a[size_t(i * K + kk)] = g() % 2 ? 1.f : -1.f;
        }
        for (auto& x : b) x = float(int(g() % 3) - 1);
        for (auto& x : c0) x = float(int(g() % 3) - 1) / 16;
        const double quarter_ulp = cdt == DType::BFloat16 ? 1.0 / 512 : 1.0 / 4096;
        Tensor A = ctx.array(a, {M, K}, dt), B = ctx.array(b, {K, N}, dt);
        Tensor C = ctx.array(c0, {M, N}, cdt);
        Tensor bias = ctx.full({N}, 1.5 + quarter_ulp, DType::Float32);
        Tensor bs = ctx.full({M}, -7.0, DType::Float32);
        DotOptions o;
        o.alpha = 1.0 / 16, o.beta = beta, o.relu = true, o.bias = bias, o.bsum = bs;
        if (!kernel.empty()) setenv("KILN_GEMM_KERNEL", kernel.c_str(), 1);
        if (*splits) setenv("KILN_GEMM_SPLITS", splits, 1);
        if (!lean) setenv("KILN_GEMM_LEAN", "0", 1);
        bool ran = true;
        try {
            compound_dot(A, B, C, o);
        } catch (const Error& e) {
            if (kernel.empty() || std::string(e.what()).find("cannot run this problem") == std::string::npos) throw;
            ran = false;
        }
        unsetenv("KILN_GEMM_KERNEL"), unsetenv("KILN_GEMM_SPLITS"), unsetenv("KILN_GEMM_LEAN");
        if (!ran) return false;
        INFO(kernel << " " << dtype_name(dt) << " -> " << dtype_name(cdt) << " " << M << "x" << N << " splits '" << splits
                    << "' lean " << lean << " beta " << beta << " stochastic " << ctx.stochastic_round());
        const std::vector<float> c = C.to_vector<float>(), got = bs.to_vector<float>();
        int64_t off_value = 0, wrong = 0;
        for (int64_t i = 0; i < M; ++i) {
            double stored = 0, unrounded = 0;
            for (int64_t j = 0; j < N; ++j) {
                double ab = 0;
                for (int64_t kk : at[size_t(i)]) ab += double(a[size_t(i * K + kk)]) * b[size_t(kk * N + j)];
                const double v = ab / 16 + 1.5 + quarter_ulp + beta * c0[size_t(i * N + j)], x = c[size_t(i * N + j)];
                unrounded += v;
                stored += x;
                // The premise: C holds v (float32), or one of its neighbours a quarter ulp
                // under it and three quarters over it.
                off_value += cdt == DType::Float32 ? x != v : std::fabs(x - v) > 3 * quarter_ulp;
            }
            if (cdt != DType::Float32 && ctx.stochastic_round() == 0 && i == 0) CHECK(unrounded - stored == N * quarter_ulp);
            wrong += double(got[size_t(i)]) != stored;
        }
        CHECK(off_value == 0);
        CHECK(wrong == 0);
        return true;
    };
    std::vector<std::string> entries = {"kiln_gemm_mma_f16_128x128", "kiln_gemm_mma_f16_64x64", "kiln_gemm_mma_bf16_128x128",
                                        "kiln_gemm_mma_bf16_64x64"};
    if (hopper)
        for (const std::string t : {"f16", "bf16"})   // (A and B row-major: A K-major, B N-major)
            for (const char* cfg : {"256_c2_s4", "128_c2_s6", "64_c2_s8", "64_c1_s8", "16_c1_s8", "256_c2_s4_p", "256_c2_s4_pf"})
                entries.push_back("kiln_gemm_wg_" + t + "_kt_" + cfg);
    else
        std::printf("SKIPPED (the wgmma entries of the stored-values bsum case are sm_90 code; this GPU is sm_%d)\n",
                    cuda::cuda_backend(ctx).info().sm);
    for (const std::string& kernel : entries) {
        const DType dt = kernel.find("bf16") != std::string::npos ? DType::BFloat16 : DType::Float16;
        // One row of tiles and several; the persistent kernels take more tiles than SMs.
        const bool persistent = kernel.find("_s4_p") != std::string::npos;
        const int64_t m = persistent ? 2200 : 300;
        int ran = 0;   // (each entry runs some of these shapes and C dtypes, and refuses the rest)
        for (const int64_t n : persistent ? std::vector<int64_t>{2200} : std::vector<int64_t>{40, 520, 1100})
            for (DType cdt : {dt, DType::Float32})
                for (bool lean : {true, false}) ran += run(dt, cdt, m, n, kernel, "", lean, 0);
        INFO(kernel);
        CHECK(ran > 0);
    }
    // The selector's choices: split-K (global slices, clusters), beta, stochastic rounding.
    for (DType dt : {DType::Float16, DType::BFloat16}) {
        for (const char* splits : {"2", "5", "2c", "4c"})
            for (const int64_t n : {40, 520}) CHECK(run(dt, dt, 300, n, "", splits, true, 0));
        for (const int64_t n : {40, 1100}) {
            CHECK(run(dt, dt, 300, n, "", "", true, 1.0));
            CHECK(run(dt, DType::Float32, 300, n, "", "", true, 1.0));
            ctx.set_stochastic_round(10);
            CHECK(run(dt, dt, 300, n, "", "", true, 0));
            ctx.set_stochastic_round(0);
        }
    }
}

TEST_CASE("gpu gemm: bsum and C sharing storage with the operands, the bias or each other") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    const int64_t M = 200, K = 64, N = 128;
    const auto r = test::shared_storage_product(ctx, M, K, N, random_floats(size_t((M + K + 1) * (1 + K + N)), 77));
    // (The strided views may take another kernel than the separate tensors: not the same bits.)
    const auto close = [](const std::vector<float>& got, const std::vector<float>& want) {
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - want[i]) <= 1e-4 * (1 + std::fabs(want[i])));
    };
    close(r.c, r.c_separate);
    close(r.bsum, r.bsum_separate);
    CHECK(r.inputs_unchanged);
}

TEST_CASE("gpu gemm: split-K in a cluster adds the slices through distributed shared memory") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "wgmma")) return;
    int seed = 1300;
    // Every one-tile wgmma kernel, 2, 3, 4 and 8 blocks per tile, every epilogue (beta, bias,
    // leaky ReLU, bsum over several tiles per row: each block of a cluster counts its rows).
    // K = 200 is 4 k-tiles: with 8 slices, half of the blocks add nothing but their zeros.
    // Variants 0, 2 and 4 (16-bit C, no beta) take the register epilogue on tiles up to 64
    // wide (the slices' sums sent between blocks' registers), 1 and 3 the general one. Splits
    // of 3 (row groups owned 3, 3, 2; one slice of nothing at K = 200) run only where the sums
    // cross in registers (variants 0, 2 and 4 on tiles up to 64 wide); the other products run
    // unsplit.
    for (const char* splits : {"2c", "3c", "4c", "8c"})
        for (const std::string cfg : {"16_c1_s8", "64_c1_s8", "128_c2_s6", "256_c2_s4", "64_c2_s8"})
            for (int variant = 0; variant < 5; ++variant) {
                const DType dt = variant % 2 ? DType::BFloat16 : DType::Float16;
                const std::string kernel = std::string("kiln_gemm_wg_") + (variant % 2 ? "bf16" : "f16") + "_kt_" + cfg;
                setenv("KILN_GEMM_SPLITS", splits, 1);
                DotOptions o = epilogue_variant(variant);
                if (variant == 4) o.relu = true, o.slope = 0.1, o.bias = Tensor(), o.bsum = Tensor();
                Case cs{variant == 4 ? 299 : 301, 300, variant < 2 ? 1000 : 200, false, false, 8, true, o,
                        variant == 3 ? DType::Float32 : dt};
                INFO(kernel << " k/" << splits);
                const bool ran = run_case(ctx, cs, dt, kernel, uint32_t(seed++));
                unsetenv("KILN_GEMM_SPLITS");
                CHECK(ran);
            }
    // The selector's counts where a cluster's blocks would not all run at once (as_launched):
    // 33, 36 and 40 tiles of 64 x 64 with 16-bit C (3 allowed) ask for 4, 3 and 3 blocks a tile;
    // each launches the most of those counts whose clusters the GPU runs at once, 2 at the
    // least, and computes the product.
    {
        cuda::CudaBackend& be = cuda::cuda_backend(ctx);
        const int64_t sms = be.info().multiprocessors;
        for (const int64_t m : {2112, 2304, 2560}) {
            const int64_t tiles = m / 64;
            int expected = 2;
            for (const int s : {4, 3})
                if (expected == 2 && s <= sms / tiles &&
                    tiles <= gemm::clusters_at_once_one_per_sm(be, "kiln_gemm_wg_f16_kt_64_c1_s8", s, 256, 1 << 17))
                    expected = s;
            Tensor A = ctx.array(random_floats(size_t(m * 2560), uint32_t(seed)), {m, 2560}, DType::Float16);
            Tensor B = ctx.array(random_floats(size_t(2560 * 64), uint32_t(seed + 1)), {2560, 64}, DType::Float16);
            Tensor C = ctx.zeros({m, 64}, DType::Float16);
            seed += 2;
            const std::string chosen = gemm::selected_kernel(A, B, C);
            INFO(m << "x64x2560: " << chosen << ", expected k/" << expected);
            CHECK(chosen.find("kiln_gemm_wg_f16_kt_64_c1_s8 k/" + std::to_string(expected) + " cluster") == 0);
            compound_dot(A, B, C);
            CHECK(check_against_reference(A, B, ctx.zeros({m, 64}, DType::Float16), C, DotOptions{}, out_eps(DType::Float16),
                                          2e-6) <= 1.0);
        }
    }
    // Several tiles in one cluster, each with its slices (rank = tile in the cluster x splits +
    // split), the slices' sums sent to the tile's own blocks: a row of 2-3 tiles whose slices
    // fit in one cluster (splits x tiles <= 8, every such cluster at once; not with bsum,
    // variants 3 and 4), and, on a grid one tile wide split in 2, two tiles along m. 64-wide
    // tiles on N = 64 (12 rows of tiles), 128 and 192 (11 rows), 2-4 slices, every epilogue
    // (variants 1 and 3 on the general kernel's staged reduction, the others through registers,
    // the lean twins among them): the product against float64 and the cluster launched.
    {
        cuda::CudaBackend& be = cuda::cuda_backend(ctx);
        for (const int64_t n : {64, 128, 192})
            for (const int s : {2, 3, 4})
                for (int variant = 0; variant < 5; ++variant) {
                    const DType dt = variant % 2 ? DType::BFloat16 : DType::Float16;
                    const std::string kernel = std::string("kiln_gemm_wg_") + (variant % 2 ? "bf16" : "f16") + "_kt_64_c1_s8";
                    const int64_t m = n == 64 ? 750 : 700, tiles_n = n / 64, rows = (m + 63) / 64;
                    setenv("KILN_GEMM_SPLITS", (std::to_string(s) + "c").c_str(), 1);
                    DotOptions o = epilogue_variant(variant);
                    if (variant == 4) o.relu = true, o.slope = 0.1, o.bias = Tensor(), o.bsum = Tensor();
                    Case cs{m, n, 1000, false, false, 8, true, o, variant == 3 ? DType::Float32 : dt};
                    INFO(kernel << " k/" << s << " N = " << n << " variant " << variant);
                    const bool ran = run_case(ctx, cs, dt, kernel, uint32_t(seed++));
                    unsetenv("KILN_GEMM_SPLITS");
                    CHECK(ran);
                    // Splits of 3 run only where the sums cross in registers (16-bit C, no beta);
                    // the others run unsplit, a row of tiles in one cluster.
                    const bool split = s != 3 || variant % 2 == 0;
                    const auto fits = [&](int size, int64_t clusters) {
                        return clusters <= gemm::clusters_at_once_one_per_sm(be, kernel, size, one_tile_threads(64),
                                                                            one_tile_smem(64, 64, 8) + gemm::split_receive_bytes(64, 64, s));
                    };
                    int expected = split ? s : tiles_n > 1 ? int(tiles_n) : 1;
                    if (split && tiles_n > 1 && !o.bsum && s * tiles_n <= 8 && fits(s * int(tiles_n), rows))
                        expected = s * int(tiles_n);
                    if (split && tiles_n == 1 && s == 2 && rows % 2 == 0 && fits(4, rows / 2)) expected = 4;
                    CHECK(gemm::last_gemm_cluster() == expected);
                }
    }
    // Transposed operands and tf32.
    for (const std::string l : {"tk", "tt"}) {
        setenv("KILN_GEMM_SPLITS", "4c", 1);
        Case cs{130, 70, 777, l[0] == 't', l[1] == 'k', 8, true, epilogue_variant(3), DType::Float16};
        const bool ran = run_case(ctx, cs, DType::Float16, "kiln_gemm_wg_f16_" + l + "_64_c1_s8", uint32_t(seed++));
        unsetenv("KILN_GEMM_SPLITS");
        CHECK(ran);
    }
    // The same with a row's tiles in the split's cluster (no bsum): rows of 2 tiles in 4 slices
    // (clusters of 8), A or B transposed.
    for (const std::string l : {"tk", "tt", "kt"}) {
        setenv("KILN_GEMM_SPLITS", "4c", 1);
        Case cs{130, 70, 777, l[0] == 't', l[1] == 'k', 8, true, epilogue_variant(2), DType::Float16};
        const bool ran = run_case(ctx, cs, DType::Float16, "kiln_gemm_wg_f16_" + l + "_64_c1_s8", uint32_t(seed++));
        unsetenv("KILN_GEMM_SPLITS");
        CHECK(ran);
        CHECK(gemm::last_gemm_cluster() == 8);
    }
    ctx.set_allow_tf32(true);
    {
        setenv("KILN_GEMM_SPLITS", "8c", 1);
        Case cs{200, 100, 900, false, true, 8, true, epilogue_variant(3), DType::Float32};
        const bool ran = run_case(ctx, cs, DType::Float32, "kiln_gemm_wg_tf32_kk_128_c2_s6", uint32_t(seed++));
        unsetenv("KILN_GEMM_SPLITS");
        CHECK(ran);
    }
    // tf32 in 2 slices: a row of 2 tiles in one cluster (N = 128), two tiles along m (N = 64).
    for (const int64_t n : {128, 64}) {
        setenv("KILN_GEMM_SPLITS", "2c", 1);
        Case cs{n == 64 ? 750 : 700, n, 1000, false, true, 8, true, epilogue_variant(2), DType::Float32};
        const bool ran = run_case(ctx, cs, DType::Float32, "kiln_gemm_wg_tf32_kk_64_c1_s8", uint32_t(seed++));
        unsetenv("KILN_GEMM_SPLITS");
        CHECK(ran);
        CHECK(gemm::last_gemm_cluster() == 4);
    }
    ctx.set_allow_tf32(false);
    // A narrow product with long k split 4 ways in clusters, batched (global slices would refuse
    // a batch): one launch, and the same bits every time, C and bsum (the slices are added in
    // rank order).
    const int64_t batch = 3, M = 1760, N = 16, K = 1760;
    Tensor A = ctx.array(random_floats(batch * M * K, 41), {batch, M, K}, DType::Float16);
    Tensor B = ctx.array(random_floats(K * N, 42), {K, N}, DType::Float16);
    Tensor C = ctx.zeros({batch, M, N}, DType::Float16);
    Tensor bs = ctx.zeros({batch, M}, DType::Float32);
    DotOptions o;
    o.bsum = bs;
    o.relu = true;
    setenv("KILN_GEMM_SPLITS", "4c", 1);
    INFO(gemm::selected_kernel(A, B, C));
    CHECK(gemm::selected_kernel(A, B, C).find("k/4 cluster") != std::string::npos);
    std::vector<float> first_c, first_sums;
    for (int rep = 0; rep < 3; ++rep) {
        const uint64_t launches = cuda::cuda_backend(ctx).counters().launches;
        batched_dot(A, B, C, o);
        CHECK(cuda::cuda_backend(ctx).counters().launches - launches == 1);
        const std::vector<float> c = C.to_vector<float>(), s = bs.to_vector<float>();
        if (rep == 0) first_c = c, first_sums = s;
        CHECK(c == first_c);
        CHECK(s == first_sums);
    }
    unsetenv("KILN_GEMM_SPLITS");
    for (int64_t i = 0; i < batch; ++i) {
        Tensor zero = ctx.zeros({M, N}, DType::Float16);
        DotOptions oi;
        oi.relu = true;
        std::vector<double> sums;
        CHECK(check_against_reference(A[i], B, zero, C[i], oi, out_eps(DType::Float16), 2e-6, &sums) <= 1.0);
        check_row_sums(bs[i].to_vector<float>(), sums, N * 4.0 / 2048);
    }
}

TEST_CASE("gpu gemm: products launched back to back wait for the kernels before them (programmatic dependent launch)") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "wgmma")) return;
    // X <- X . P with P a signed permutation, 8 times over two buffers, nothing synchronised in
    // between: each product reads the C that the product before it wrote (it may start before
    // that one ends) and writes the buffer that one read; before every third product an
    // elementwise kernel negates X. Small integers keep every value exact in float16, so a read
    // of a stale or half-written buffer shows as a wrong element. Kernels: one-tile (bsum over
    // a row in one cluster, over 8 tiles through global partials), split-K in a cluster, global
    // k slices (a reduction kernel after the product), persistent (bsum's cooperative launch).
    struct Chain {
        int64_t m, n;
        const char* kernel;   // nullptr: the selector's
        const char* splits;   // KILN_GEMM_SPLITS, or nullptr
        bool bsum;
    };
    const Chain chains[] = {
        {384, 128, "kiln_gemm_wg_f16_kt_64_c1_s8", nullptr, false},
        {384, 128, "kiln_gemm_wg_f16_kt_64_c1_s8", nullptr, true},
        {384, 128, "kiln_gemm_wg_f16_kt_16_c1_s8", "2c", true},
        {128, 512, "kiln_gemm_wg_f16_kt_64_c1_s8", "4", false},
        {4096, 2048, nullptr, nullptr, false},
        {4096, 2048, nullptr, nullptr, true},
    };
    uint32_t seed = 2600;
    for (const Chain& ch : chains) {
        const int64_t m = ch.m, n = ch.n;
        std::mt19937 g(seed++);
        std::vector<int> perm(static_cast<size_t>(n));
        for (int i = 0; i < int(n); ++i) perm[size_t(i)] = i;
        std::shuffle(perm.begin(), perm.end(), g);
        std::vector<float> sign(static_cast<size_t>(n)), p(static_cast<size_t>(n * n), 0.f), x(static_cast<size_t>(m * n));
        for (auto& s : sign) s = g() % 2 ? 1.f : -1.f;
        for (int64_t k = 0; k < n; ++k) p[size_t(k * n + perm[size_t(k)])] = sign[size_t(k)];
        for (auto& v : x) v = float(int(g() % 17) - 8);
        Tensor P = ctx.array(p, {n, n}, DType::Float16);
        Tensor X[2] = {ctx.array(x, {m, n}, DType::Float16), ctx.zeros({m, n}, DType::Float16)};
        Tensor bs = ctx.zeros({m}, DType::Float32);
        DotOptions o;
        if (ch.bsum) o.bsum = bs;
        if (ch.kernel) setenv("KILN_GEMM_KERNEL", ch.kernel, 1);
        if (ch.splits) setenv("KILN_GEMM_SPLITS", ch.splits, 1);
        const std::string chosen = gemm::selected_kernel(X[0], P, X[1]);
        INFO(m << "x" << n << "x" << n << " " << chosen << (ch.bsum ? " bsum" : ""));
        const bool persistent = chosen.find("_256_c2_s4_p") != std::string::npos;   // (" lean": its twin, rule 7)
        if (!ch.kernel) CHECK(persistent);
        std::vector<float> ref = x, next(x.size());
        for (int step = 0; step < 8; ++step) {
            Tensor& src = X[step % 2];
            if (step % 3 == 2) {
                src.assign(-src.expr());
                for (auto& v : ref) v = -v;
            }
            compound_dot(src, P, X[(step + 1) % 2], o);
            for (int64_t i = 0; i < m; ++i)
                for (int64_t k = 0; k < n; ++k) next[size_t(i * n + perm[size_t(k)])] = ref[size_t(i * n + k)] * sign[size_t(k)];
            ref.swap(next);
        }
        unsetenv("KILN_GEMM_KERNEL");
        unsetenv("KILN_GEMM_SPLITS");
        const std::vector<float> got = X[0].to_vector<float>();   // 8 steps: back in X[0]
        size_t wrong = 0;
        for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != ref[i];
        CHECK(wrong == 0);
        if (ch.bsum) {
            const std::vector<float> sums = bs.to_vector<float>();
            size_t wrong_sums = 0;
            for (int64_t i = 0; i < m; ++i) {
                float s = 0;
                for (int64_t j = 0; j < n; ++j) s += ref[size_t(i * n + j)];
                wrong_sums += sums[size_t(i)] != s;
            }
            CHECK(wrong_sums == 0);
        }
    }
}

TEST_CASE("gpu gemm: the lean twins of rule 7 give the general kernels' bits, and only where the epilogue is plain") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!hopper_or_skip(ctx, "wgmma")) return;
    // Every one-tile kernel with a lean twin, both 16-bit dtypes, A in both layouts, unsplit and
    // split in clusters of 2, 3 and 4 (tiles up to 64 wide: the splits whose sums cross in
    // registers), four plain epilogues (the last with bsum, whose rows span 2 or 5 tiles on the
    // 64- and 16-wide tiles: in one cluster unsplit, through global partials split; one on the
    // 128-wide tile): C and bsum from the lean twin equal those from the general kernel
    // (KILN_GEMM_LEAN=0) bit for bit, and both match the float64 reference. 301 x 72: partial
    // tiles along both dimensions, C's rows 16-byte aligned; K = 600 is 10 k-tiles.
    uint32_t seed = 7100;
    // One product through the general kernel and through its twin: both against the float64
    // reference, then the twin's C and bsum against the general kernel's, bit for bit.
    // `variant`: 0 plain, 1 alpha + bias + ReLU, 2 bias + leaky ReLU, 3 the same with bsum.
    const auto twins_agree = [&](const std::string& kernel, const char* splits, DType dt, bool ta, int64_t m, int64_t n,
                                 int64_t k, int variant) {
        DotOptions o;
        if (variant == 1) o.alpha = 0.5, o.relu = true;
        if (variant >= 2) o.relu = true, o.slope = 0.1;
        if (variant > 0) o.bias = ctx.array(random_floats(size_t(n), seed + 3), {n}, DType::Float32);
        Tensor A = operand(ctx, m, k, ta, 0, true, dt, seed);
        Tensor B = operand(ctx, k, n, false, 0, true, dt, seed + 1);
        seed += 4;
        std::vector<float> out[2], sums_out[2];
        bool lean[2];
        for (int twin = 0; twin < 2; ++twin) {
            Tensor C = ctx.zeros({m, n}, dt), bs;
            if (variant == 3) o.bsum = bs = ctx.zeros({m}, DType::Float32);
            setenv("KILN_GEMM_KERNEL", kernel.c_str(), 1);
            setenv("KILN_GEMM_SPLITS", splits, 1);
            if (twin == 0) setenv("KILN_GEMM_LEAN", "0", 1);
            compound_dot(A, B, C, o);
            lean[twin] = gemm::last_gemm_launch_lean();
            if (std::string(splits) != "1")   // the split asked for is the one described
                CHECK(gemm::selected_kernel(A, B, C).find(std::string(" k/") + splits[0] + " cluster") != std::string::npos);
            unsetenv("KILN_GEMM_KERNEL");
            unsetenv("KILN_GEMM_SPLITS");
            unsetenv("KILN_GEMM_LEAN");
            out[twin] = C.to_vector<float>();
            INFO(kernel << " k/" << splits << " variant " << variant << (twin ? " lean" : " general"));
            std::vector<double> sums;
            CHECK(check_against_reference(A, B, ctx.zeros({m, n}, dt), C, o, out_eps(dt), 2e-6,
                                          variant == 3 ? &sums : nullptr) <= 1.0);
            if (variant == 3) {
                sums_out[twin] = bs.to_vector<float>();
                check_row_sums(sums_out[twin], sums, n * out_eps(dt) * 4);
            }
        }
        INFO(kernel << " k/" << splits << " variant " << variant);
        CHECK(!lean[0]);
        CHECK(lean[1]);
        CHECK(out[0] == out[1]);
        CHECK(sums_out[0] == sums_out[1]);
    };
    const auto entry = [](DType dt, bool ta, const std::string& cfg) {
        return std::string("kiln_gemm_wg_") + (dt == DType::Float16 ? "f16" : "bf16") + "_" + (ta ? "t" : "k") + "t_" + cfg;
    };
    for (const std::string cfg : {"16_c1_s8", "64_c1_s8", "64_c2_s8", "128_c2_s6"})
        for (const DType dt : {DType::Float16, DType::BFloat16})
            for (const bool ta : {false, true})
                for (const char* splits : {"1", "2c", "3c", "4c"})
                    for (int variant = 0; variant < 4; ++variant)
                        if (cfg != "128_c2_s6" || std::string(splits) == "1")
                            twins_agree(entry(dt, ta, cfg), splits, dt, ta, 301, 72, 600, variant);
    // The persistent kernels' twins (16-bit C of the operands' dtype): more than one wave of
    // 128 x 256 tiles (17 x 8, with partial tiles at the bottom and the right), A in both
    // layouts, the four epilogues (bsum over rows of 8 tiles: tagged partials).
    for (const DType dt : {DType::Float16, DType::BFloat16})
        for (const bool ta : {false, true})
            for (int variant = 0; variant < 4; ++variant)
                twins_agree(entry(dt, ta, "256_c2_s4_p"), "1", dt, ta, 128 * 17 - 3, 256 * 8 - 8, 200, variant);
    const int64_t M = 301, N = 72, K = 600;
    // Where the epilogue is not plain the general kernel runs: beta, float32 C, C of the other
    // 16-bit dtype, C rows not 16-byte aligned, stochastic rounding, a split through shared
    // memory (128 wide), and the 256-wide tile, which has no twin.
    // (`rounding`: C's rounding error in units of round-to-nearest's; stochastic rounding's is twice.)
    const auto ran_lean = [&](const char* kernel, const char* splits, DotOptions o, DType cdt, int64_t c_pad,
                              double rounding = 1) {
        Tensor A = operand(ctx, M, K, false, 0, true, DType::Float16, seed);
        Tensor B = operand(ctx, K, N, false, 0, true, DType::Float16, seed + 1);
        Tensor C = operand(ctx, M, N, false, c_pad, true, cdt, seed + 2);
        Tensor C0 = ctx.empty({M, N}, cdt);
        C0.assign(C.expr());
        seed += 3;
        Tensor bs;
        if (o.bsum) o.bsum = bs = ctx.zeros({M}, DType::Float32);
        setenv("KILN_GEMM_KERNEL", kernel, 1);
        setenv("KILN_GEMM_SPLITS", splits, 1);
        compound_dot(A, B, C, o);
        const bool lean = gemm::last_gemm_launch_lean();
        unsetenv("KILN_GEMM_KERNEL");
        unsetenv("KILN_GEMM_SPLITS");
        std::vector<double> sums;
        CHECK(check_against_reference(A, B, C0, C, o, rounding * out_eps(cdt), 2e-6, o.bsum ? &sums : nullptr) <= 1.0);
        if (o.bsum) check_row_sums(bs.to_vector<float>(), sums, N * out_eps(cdt) * 4);
        return lean;
    };
    DotOptions plain, with_bsum, with_beta;
    with_bsum.bsum = Tensor();
    with_beta.beta = 0.5;
    CHECK(ran_lean("kiln_gemm_wg_f16_kt_64_c1_s8", "1", plain, DType::Float16, 0));   // the baselines: lean
    CHECK(ran_lean("kiln_gemm_wg_f16_kt_64_c1_s8", "2c", with_bsum, DType::Float16, 0));
    CHECK(!ran_lean("kiln_gemm_wg_f16_kt_64_c1_s8", "1", with_bsum, DType::Float32, 0));
    CHECK(!ran_lean("kiln_gemm_wg_f16_kt_16_c1_s8", "1", with_beta, DType::Float16, 0));
    CHECK(!ran_lean("kiln_gemm_wg_f16_kt_64_c1_s8", "1", plain, DType::Float32, 0));
    CHECK(!ran_lean("kiln_gemm_wg_f16_kt_64_c1_s8", "1", plain, DType::BFloat16, 0));
    CHECK(!ran_lean("kiln_gemm_wg_f16_kt_64_c1_s8", "1", plain, DType::Float16, 3));   // rows 150 bytes apart
    CHECK(!ran_lean("kiln_gemm_wg_f16_kt_128_c2_s6", "2c", plain, DType::Float16, 0));
    CHECK(!ran_lean("kiln_gemm_wg_f16_kt_256_c2_s4", "1", plain, DType::Float16, 0));
    {
        ctx.set_stochastic_round(10);
        CHECK(!ran_lean("kiln_gemm_wg_f16_kt_64_c1_s8", "1", plain, DType::Float16, 0, 2));
        ctx.set_stochastic_round(0);
    }
    // The benchmark's "kernel chosen" says which runs.
    Tensor A = ctx.array(random_floats(size_t(3072 * 1024), 5), {3072, 1024}, DType::Float16);
    Tensor B = ctx.array(random_floats(size_t(1024 * 128), 6), {1024, 128}, DType::Float16);
    Tensor C = ctx.zeros({3072, 128}, DType::Float16);
    CHECK(gemm::selected_kernel(A, B, C).find(" lean") != std::string::npos);
    Tensor C32 = ctx.zeros({3072, 128}, DType::Float32);
    CHECK(gemm::selected_kernel(A, B, C32).find(" lean") == std::string::npos);
}

// Named outputs (include/kiln/hist.hpp) are counted by the kernel that stores them, as it
// stores them: the general epilogue (float32 C, beta), the 16-bit register epilogue (in place of
// a lean twin), the persistent kernels (16-bit and float32 C, the tf32 kernel with B through
// registers), splits in a cluster and global slices' reduction; every dtype, a bias, ReLU,
// bsum, odd sizes, a batch, 4096 bins; the counts equal hist() of C.
TEST_CASE("gpu gemm: named outputs are counted in the epilogue's store path") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    std::mt19937 g(9);
    auto random = [&](Shape s, DType dt) { return test::random_normal(ctx, g, s, dt); };
    struct Case {
        int64_t batch, m, n, k;
        DType dt, cdt;
        bool bias, relu, beta, bsum;
        int bins, offset;
        int in_store;                      // 1: counted as stored, -1: either (4096 bins a warp may not fit)
        const char* kernel = nullptr;      // KILN_GEMM_KERNEL
        const char* splits = nullptr;      // KILN_GEMM_SPLITS
        bool tf32 = false;
    };
    const DType f32 = DType::Float32, f16 = DType::Float16, bf16 = DType::BFloat16;
    const Case cases[] = {
        {0, 100, 70, 50, f32, f32, false, false, false, false, 64, -48, 1},
        {0, 1024, 2048, 512, f16, f16, true, true, false, false, 64, -48, 1},   // the register epilogue (a lean twin's shape)
        {0, 1000, 1000, 512, bf16, bf16, true, false, false, true, 64, -48, 1},   // with bsum
        {0, 777, 1000, 300, bf16, bf16, false, false, true, false, 9, -3, 1},
        {0, 1024, 1024, 512, f16, f16, true, true, true, false, 64, -48, 1},
        {0, 4096, 4096, 1024, f16, f16, false, false, false, false, 64, -20, 1},   // the persistent kernels' size
        // the persistent kernels (more tiles than SMs), rows and columns past the tiles
        {0, 3000, 2008, 256, f16, f16, true, true, false, false, 64, -48, 1, "kiln_gemm_wg_f16_kt_256_c2_s4_p"},
        {0, 3000, 2008, 256, f16, f32, true, false, false, false, 64, -48, 1, "kiln_gemm_wg_f16_kt_256_c2_s4_pf"},
        {0, 3000, 2008, 256, f32, f32, true, false, false, false, 64, -48, 1, "kiln_gemm_wg_tf32_kt_256x128_c2_s4_pf",
         nullptr, true},
        {0, 200, 300, 4096, f16, f16, true, false, false, false, 64, -48, 1, nullptr, "4"},    // global slices
        {0, 200, 296, 4096, f16, f16, true, false, false, true, 64, -48, 1, nullptr, "4"},     // with bsum
        {0, 200, 304, 4096, f16, f16, true, false, false, false, 64, -48, 1, nullptr, "3c"},   // sums pushed
        {0, 200, 304, 4096, f16, f16, false, false, false, false, 64, -48, 1, nullptr, "4c"},
        {3, 200, 304, 64, f16, f16, true, false, false, false, 64, -48, 1},
        {3, 200, 300, 64, f16, f16, true, false, false, false, 64, -48, 1},   // rows not 16 bytes apart: general
        {3, 200, 300, 64, f32, f32, true, false, false, false, 64, -48, 1},
        {0, 512, 512, 256, f32, f32, false, false, false, false, 4096, -1000, -1},
    };
    for (const Case& c : cases) {
        INFO("batch " << c.batch << " " << c.m << "x" << c.n << "x" << c.k << " " << dtype_name(c.dt) << " -> "
                      << dtype_name(c.cdt) << " bins " << c.bins << " kernel " << (c.kernel ? c.kernel : "-") << " splits "
                      << (c.splits ? c.splits : "-"));
        set_hist_buffers(ctx, c.bins, c.offset);
        ctx.set_allow_tf32(c.tf32);
        const Shape cs = c.batch ? Shape{c.batch, c.m, c.n} : Shape{c.m, c.n};
        Tensor A = random(c.batch ? Shape{c.batch, c.m, c.k} : Shape{c.m, c.k}, c.dt);
        Tensor B = random(c.batch ? Shape{c.batch, c.k, c.n} : Shape{c.k, c.n}, c.dt);
        Tensor C = random(cs, c.cdt);
        DotOptions o;
        if (c.bias) o.bias = random({c.n}, DType::Float32);
        o.relu = c.relu;
        if (c.beta) o.beta = 0.5;
        if (c.bsum) o.bsum = ctx.zeros({c.m, 1}, DType::Float32);
        set_hist_tag(C, "C");
        set_hist_named(ctx, true);
        {
            const test::ScopedEnv kernel("KILN_GEMM_KERNEL", c.kernel), splits("KILN_GEMM_SPLITS", c.splits);
            if (c.batch) batched_dot(A, B, C, o);
            else compound_dot(A, B, C, o);
        }
        if (c.in_store >= 0) CHECK(gemm::last_gemm_counted() == (c.in_store == 1));
        set_hist_named(ctx, false);
        hist(C, "check");
        HistData d = dump_hist_data(ctx);
        REQUIRE(d.tags == std::vector<std::string>{"C", "check"});
        const std::vector<int32_t> counts = d.counts.to_vector<int32_t>();
        const std::vector<int32_t> named(counts.begin(), counts.begin() + c.bins), check(counts.begin() + c.bins, counts.end());
        CHECK(named == check);
        int64_t total = 0;
        for (int32_t n : named) total += n;
        CHECK(total == C.size());
    }
    ctx.set_allow_tf32(false);
}

// C's column sums added up in the store path (GemmParams::kColSums; a convolution's bsum per
// channel through the GEMM): the persistent kernels' kLeanCols twin (each warp's running sums
// over its block's tiles, through walks that stay on one column of tiles and walks that move
// between three, blocks that skip most of nine columns and store zeros there, M and N past the
// last tile) and the one-tile kernel (the warps' sums in shared memory), with bias and ReLU,
// float16 and bfloat16. Against the sums of C as stored, the same bits in a second run; where no
// epilogue adds them (float32 C; more than 32 columns of 256-wide tiles) nothing is summed.
TEST_CASE("gpu gemm: column sums in the persistent twin's and the one-tile kernel's store path, deterministically") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (cuda::cuda_backend(ctx).info().sm != 90) return;
    struct Case {
        int64_t m, n, k;
        const char* entry;   // what the entry point ends with
        bool f32;            // float32 C
    };
    uint32_t seed = 900;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const Case& c : {Case{40001, 200, 64, "_p_lean_cols", false}, Case{20003, 600, 72, "_p_lean_cols", false},
                              Case{3001, 2056, 64, "_p_lean_cols", false},   // 9 columns of tiles, a block on 1-2
                              Case{1000, 296, 64, "", false}, Case{20003, 600, 72, "", true},
                              Case{2000, 8456, 64, "", false}}) {   // 34 columns of tiles: read again
            const DType cdt = c.f32 ? DType::Float32 : dt;
            INFO(dtype_name(dt) << " " << c.m << "x" << c.n << "x" << c.k << " C " << dtype_name(cdt));
            const Tensor A = operand(ctx, c.m, c.k, false, 0, false, dt, ++seed),
                         B = operand(ctx, c.k, c.n, true, 0, false, dt, ++seed);
            Tensor C = ctx.empty({c.m, c.n}, cdt), sums = ctx.empty({c.n}, DType::Float32),
                   again = ctx.empty({c.n}, DType::Float32);
            DotOptions o;
            o.relu = true;
            o.bias = ctx.array(random_floats(size_t(c.n), ++seed), {c.n});
            bool summed = false;
            gemm::cuda_gemm(A, B, C, o, nullptr, &sums, &summed);
            const std::string entry = gemm::last_gemm_entry();
            INFO(entry);
            const bool persistent = entry.find("_p") != std::string::npos;
            const bool expect = !c.f32 && !(persistent && c.n > 32 * 256);
            CHECK(summed == expect);
            if (!expect) continue;
            const size_t tail = std::strlen(c.entry);
            const bool ends = entry.size() > tail && entry.compare(entry.size() - tail, std::string::npos, c.entry) == 0;
            if (*c.entry) CHECK(ends);
            else if (c.n <= 32 * 256) CHECK_FALSE(persistent);   // one tile a block
            const Expr as_f32 = cast(C.expr(), DType::Float32);
            const std::vector<float> got = sums.to_vector<float>(), want = ctx.eval(sum(as_f32, 0)).to_vector<float>(),
                                     scale = ctx.eval(sum(absolute(as_f32), 0)).to_vector<float>();
            int off = 0;
            for (int64_t j = 0; j < c.n; ++j)
                if (!(std::fabs(got[size_t(j)] - want[size_t(j)]) <= 1e-5f * scale[size_t(j)] + 1e-6f)) ++off;
            CHECK(off == 0);
            bool summed_again = false;
            gemm::cuda_gemm(A, B, C, o, nullptr, &again, &summed_again);
            CHECK(summed_again);
            CHECK(again.to_vector<float>() == got);
        }
}
