// The CUDA runtime on a real device: copies, the caching allocator and OutOfMemory, backend
// selection, the memory and disk kernel caches, NVRTC failures, and the row, column and full
// reduction kernels at sizes the differential graphs do not reach (a warp, a block and a
// cluster per row, and rows too long to cache). Every case prints why and passes when no CUDA
// device is usable; compute-sanitizer runs this suite on the GPU.
#include "tests/support/catch.hpp"

#include <kiln/kiln.hpp>

#include "ir/half.hpp"
#include "tests/support/cache_dir.hpp"
#include "tests/support/gpu.hpp"
#ifdef KILN_HAVE_NVRTC
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/cuda/device_backend.hpp"
#endif

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

using namespace kiln;
using kiln::test::why_no_gpu;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -2, float hi = 3) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

} // namespace

TEST_CASE("gpu: host <-> device copies round-trip every dtype, small and large (pinned staging)") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    CHECK(ctx.backend() == Backend::CUDA);
    for (size_t n : {size_t(0), size_t(1), size_t(1000), size_t(3) << 18, size_t(25) << 20}) {
        INFO("elements " << n);
        std::vector<float> f = random_floats(n, (uint32_t)n + 1);
        Tensor t = ctx.array(f, {(int64_t)n});
        CHECK(t.to_vector<float>() == f);
        std::vector<int32_t> i(n);
        for (size_t k = 0; k < n; ++k) i[k] = (int32_t)(k * 2654435761u);
        CHECK(ctx.array(i, {(int64_t)n}).to_vector<int32_t>() == i);
        std::vector<int8_t> b(n);
        for (size_t k = 0; k < n; ++k) b[k] = (int8_t)(k * 37 + 5);
        CHECK(ctx.array(b, {(int64_t)n}).to_vector<int8_t>() == b);
        // 16-bit floats: values representable in them survive exactly.
        std::vector<float> h(n);
        for (size_t k = 0; k < n; ++k) h[k] = f16_to_float(float_to_f16(f[k]));
        CHECK(ctx.array(h, {(int64_t)n}, DType::Float16).to_vector<float>() == h);
        for (size_t k = 0; k < n; ++k) h[k] = bf16_to_float(float_to_bf16(f[k]));
        CHECK(ctx.array(h, {(int64_t)n}, DType::BFloat16).to_vector<float>() == h);
    }
}

TEST_CASE("gpu: strided views copy to and from the host") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    std::vector<float> f = random_floats(60 * 70, 3);
    Tensor a = ctx.array(f, {60, 70});
    Tensor v = a.slice({Slice{2, 50, 3}, Slice{69, Slice::kNone, -2}});   // rows 2,5,..,47; columns reversed, every other
    std::vector<float> got = v.to_vector<float>();
    std::vector<float> want;
    for (int64_t r = 2; r < 50; r += 3)
        for (int64_t c = 69; c >= 0; c -= 2) want.push_back(f[r * 70 + c]);
    CHECK(got == want);
    std::vector<float> ones(want.size(), 1.0f);
    v.copy_from_host(ones.data(), DType::Float32);
    std::vector<float> after = a.to_vector<float>();
    for (int64_t r = 0; r < 60; ++r)
        for (int64_t c = 0; c < 70; ++c) {
            const bool in = r >= 2 && r < 50 && (r - 2) % 3 == 0 && c % 2 == 1;
            if (after[r * 70 + c] != (in ? 1.0f : f[r * 70 + c])) FAIL("element " << r << "," << c);
        }
    CHECK(a.T().to_vector<float>()[1] == f[70]);
}

TEST_CASE("gpu: the allocator reuses memory; an impossible allocation is OutOfMemory and the context lives on") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    Tensor keep = ctx.array(random_floats(1000, 4), {1000});
    for (int i = 0; i < 300; ++i) {
        Tensor t = ctx.full({(int64_t)(1000 + (i % 7) * 4096)}, (double)i, DType::Float32);
        if (i % 50 == 0) CHECK(t.to_vector<float>()[999] == (float)i);
    }
    const int64_t huge = int64_t(1) << 40;   // 4 TiB of float32
    try {
        Tensor t = ctx.empty({huge});
        FAIL("allocating 4 TiB did not fail");
    } catch (const OutOfMemory& e) {
        const std::string m = e.what();
        INFO(m);
        CHECK(m.find(std::to_string(huge * 4)) != std::string::npos);
        CHECK(m.find("free") != std::string::npos);
        CHECK(m.find("cache held") != std::string::npos);
    }
    Tensor y = ctx.empty({1000});
    y[all] = keep * 2.0f + 1.0f;
    std::vector<float> k = keep.to_vector<float>(), got = y.to_vector<float>();
    for (size_t i = 0; i < k.size(); ++i) CHECK(got[i] == k[i] * 2.0f + 1.0f);
}

TEST_CASE("gpu: KILN_BACKEND=cpu forces the CPU, KILN_BACKEND=cuda the GPU") {
    REQUIRE_GPU();
    ::setenv("KILN_BACKEND", "cpu", 1);
    {
        Context c;
        CHECK(c.backend() == Backend::CPU);
    }
    ::setenv("KILN_BACKEND", "cuda", 1);
    {
        Context c;
        CHECK(c.backend() == Backend::CUDA);
    }
    ::unsetenv("KILN_BACKEND");
    Context c;
    CHECK(c.backend() == Backend::CUDA);   // the default when a device is present
}

TEST_CASE("gpu: KILN_VALIDATE=cpu runs every kernel on the host backend too, gathers and math functions included") {
    REQUIRE_GPU();
    ::setenv("KILN_VALIDATE", "cpu", 1);
    Context ctx(ContextOptions{"cuda"});
    ::unsetenv("KILN_VALIDATE");
    std::vector<float> f = random_floats(64 * 48, 9);
    Tensor a = ctx.array(f, {64, 48}), r = ctx.empty({64, 1}), g = ctx.empty({5, 48}), e = ctx.empty({64, 48});
    Tensor idx = ctx.array(std::vector<int32_t>{3, 0, 63, -1, 17}, {5});
    r[all] = var(a, 1);                                   // a row reduction
    g[all] = kiln::take(a, idx, 0) * 2.0f;               // a gather over the whole of a
    e[all] = erf(a) + sin(a) * cos(a) - atan(a);          // C math functions
    const std::vector<float> gv = g.to_vector<float>(), ev = e.to_vector<float>();
    CHECK(gv[2 * 48 + 5] == 2.0f * f[63 * 48 + 5]);
    CHECK(gv[3 * 48] == 2.0f * f[63 * 48]);              // -1: the last row
    CHECK(std::fabs(ev[7] - (std::erf(f[7]) + std::sin(f[7]) * std::cos(f[7]) - std::atan(f[7]))) < 1e-5f);
    e[all] = atan2(a, 0.5f - a) + hypot(a, r) * copysign(1.0f, a);   // of two arguments, broadcast
    const std::vector<float> e2 = e.to_vector<float>(), rv = r.to_vector<float>();
    for (int i : {7, 48 * 20 + 3}) {
        const float x = f[i], want = std::atan2(x, 0.5f - x) + std::hypot(x, rv[i / 48]) * std::copysign(1.0f, x);
        CHECK(std::fabs(e2[i] - want) < 1e-5f * (1 + std::fabs(want)));
    }
    CHECK(ctx.counters().launches >= 4);
}

TEST_CASE("gpu: kernel caches — compile once, then memory hits, then disk hits in a new context") {
    REQUIRE_GPU();
    kiln::test::ScopedCacheDir cache_dir;
    const std::string& dir = cache_dir.path();
    ::setenv("KILN_DUMP_SOURCE", "1", 1);
    std::vector<float> f = random_floats(512, 5);
    {
        Context ctx(ContextOptions{"cuda"});
        Tensor a = ctx.array(f, {16, 32}), b = ctx.empty({16, 32});
        b[all] = tanh(a) * 3.0f - a;
        Counters k1 = ctx.counters();
        CHECK(k1.compiles == 1);
        CHECK(k1.disk_hits == 0);
        b[all] = tanh(a) * 3.0f - a;   // same plan: nothing looked up at all
        CHECK(ctx.counters().plan_hits == k1.plan_hits + 1);
        Tensor a2 = ctx.array(f, {8, 64}), c2 = ctx.empty({8, 64});
        c2[all] = tanh(a2) * 3.0f - a2;   // another shape: a new plan, the same kernel (a memory hit)
        CHECK(ctx.counters().memory_hits == k1.memory_hits + 1);
        CHECK(ctx.counters().compiles == 1);
    }
    int sources = 0, entries = 0;
    for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
        sources += e.path().extension() == ".cu";
        entries += e.path().extension() == ".bin";
    }
    CHECK(sources >= 1);   // KILN_DUMP_SOURCE
    CHECK(entries == 1);
    {
        Context ctx(ContextOptions{"cuda"});
        Tensor a = ctx.array(f, {16, 32}), b = ctx.empty({16, 32});
        b[all] = tanh(a) * 3.0f - a;
        CHECK(ctx.counters().compiles == 0);
        CHECK(ctx.counters().disk_hits == 1);
        std::vector<float> got = b.to_vector<float>();
        for (size_t i = 0; i < f.size(); ++i) CHECK(std::abs(got[i] - (std::tanh(f[i]) * 3.0f - f[i])) <= 1e-5f);
    }
    ::unsetenv("KILN_DUMP_SOURCE");
}

TEST_CASE("gpu: an elementwise assignment's third shape is resized from its plan family and matches the CPU") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    // Shapes whose merged length ends inside and on a 16-byte vector, and a large one (several
    // blocks, the aligned entry).
    for (auto [M, N] : std::vector<std::pair<int64_t, int64_t>>{{16, 32}, {17, 33}, {5, 7}, {1000, 1001}, {64, 64}}) {
        const std::vector<float> f = random_floats(size_t(M * N), unsigned(M + N));
        Tensor a = ctx.array(f, {M, N}), b = ctx.empty({M, N}, DType::Float16);
        Tensor ah = cpu.array(f, {M, N}), bh = cpu.empty({M, N}, DType::Float16);
        const auto c0 = ctx.counters();
        b[all] = cast(tanh(a) * 3.0f - a, DType::Float16);
        bh[all] = cast(tanh(ah) * 3.0f - ah, DType::Float16);
        if (M == 5) {
            CHECK(ctx.counters().plan_resizes == c0.plan_resizes + 1);
            CHECK(ctx.counters().memory_hits == c0.memory_hits);
        }
        const std::vector<float> got = ctx.eval(cast(b.expr(), DType::Float32)).to_vector<float>(),
                                 want = cpu.eval(cast(bh.expr(), DType::Float32)).to_vector<float>();
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < got.size(); ++i)
            if (got[i] != want[i]) CHECK(std::fabs(got[i] - want[i]) <= 1e-3f * (1 + std::fabs(want[i])));
    }
    // Three shapes each of the product and of the float16 -> float32 read-back resized; their two
    // kernels compiled (or loaded) once.
    CHECK(ctx.counters().plan_resizes == 6);
    CHECK(ctx.counters().compiles + ctx.counters().disk_hits <= 2);
}

TEST_CASE("gpu: a row reduction's new batch sizes are resized from its plan family and match the CPU") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    uint64_t resized = 0;
    for (int64_t M : {16, 17, 40, 1000, 3}) {
        const int64_t N = 333;
        const std::vector<float> f = random_floats(size_t(M * N), unsigned(M));
        auto softmax = [&](Context& c) {
            Tensor x = c.array(f, {M, N}), y = c.empty({M, N});
            Expr e = exp(x - max(x, 1));
            y.assign(e / sum(e, 1));
            return y.to_vector<float>();
        };
        const uint64_t r0 = ctx.counters().plan_resizes;
        const std::vector<float> got = softmax(ctx), want = softmax(cpu);
        resized += ctx.counters().plan_resizes - r0;
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - want[i]) <= 1e-5f * (1 + std::fabs(want[i])));
    }
    CHECK(resized == 3);   // 40, 1000 and 3 rows, after the check at 17
}

TEST_CASE("gpu: a row reduction compiles only the module its launch takes, one per reach of G") {
    REQUIRE_GPU();
    kiln::test::ScopedCacheDir cache_dir;
    auto check_sums = [](Tensor& a, Tensor& s, int64_t M, int64_t N, const std::vector<float>& h) {
        std::vector<float> got = s.to_vector<float>();
        int bad = 0;
        for (int64_t i = 0; i < M; ++i) {
            double want = 0, mag = 0;
            for (int64_t j = 0; j < N; ++j) want += h[(size_t)(i * N + j)], mag += std::fabs(h[(size_t)(i * N + j)]);
            bad += std::fabs(got[(size_t)i] - want) > 1e-5 * (mag + 1);
        }
        (void)a;
        CHECK(bad == 0);
    };
    struct Shape { int64_t M, N; };
    // 64 rows of 256: the small entry, G 256, a block. 100000 rows of 16: G 2, a warp. 4 rows of
    // 2^20: a cluster on sm_90 (past a block of threads), a block before it (no clusters).
    const Shape block{64, 256}, warp{100000, 16}, longrow{4, 1 << 20};
    {
        Context ctx(ContextOptions{"cuda"});
        const int sm = cuda::cuda_backend(ctx).info().sm;
        auto run = [&](Shape sh) {
            std::vector<float> h = random_floats((size_t)(sh.M * sh.N), (uint32_t)(sh.M + sh.N));
            Tensor a = ctx.array(h, {sh.M, sh.N}), s = ctx.empty({sh.M, 1});
            s[all] = sum(a, 1);
            check_sums(a, s, sh.M, sh.N, h);
            return ctx.counters().compiles;
        };
        CHECK(run(block) == 1);
        CHECK(run(warp) == 2);             // the same kernel, another reach: one more module
        CHECK(run(longrow) == (sm >= 90 ? 3u : 2u));
        CHECK(run(block) == (sm >= 90 ? 3u : 2u));   // loaded: nothing compiled
        CHECK(ctx.counters().disk_hits == 0);
    }
    {
        // A new context finds the module of the reach it launches on disk, and only that one.
        Context ctx(ContextOptions{"cuda"});
        std::vector<float> h = random_floats((size_t)(warp.M * warp.N), 11);
        Tensor a = ctx.array(h, {warp.M, warp.N}), s = ctx.empty({warp.M, 1});
        s[all] = sum(a, 1);
        check_sums(a, s, warp.M, warp.N, h);
        CHECK(ctx.counters().compiles == 0);
        CHECK(ctx.counters().disk_hits == 1);
    }
}

// The small entry indexes in 32 bits: a few rows of a view whose last element lies past 2^31
// elements from its first take the general entries, which index in 64 (a 32-bit offset would
// wrap and fault), also right after the same expression planned a small launch of the same
// sizes over dense rows; reversed too.
TEST_CASE("gpu: a small row reduction over a view past 2^31 elements agrees with float64") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    const int64_t M = 3, N = 64, ld = (int64_t(1) << 30) + 8;   // the last row starts 2^31 + 16 in
    Tensor big = ctx.zeros({M, ld}, DType::Float16);   // 6 GiB
    std::vector<float> h = random_floats((size_t)(M * N), 19);
    for (auto& x : h) x = f16_to_float(float_to_f16(x));
    Tensor rows = big.slice({Slice::all(), Slice::range(0, N)});
    rows[all] = ctx.array(h, {M, N}, DType::Float16);
    // First the same expression over a dense copy of the same sizes, so that the kernel holds a
    // small entry's plan when the far view comes (the plan must not carry over).
    {
        Tensor dense = ctx.array(h, {M, N}, DType::Float16), s = ctx.empty({M, 1});
        s[all] = sum(dense * 2.0f, 1);
        const std::vector<float> got = s.to_vector<float>();
        for (int64_t i = 0; i < M; ++i) {
            double want = 0, mag = 0;
            for (int64_t j = 0; j < N; ++j) want += 2.0 * h[(size_t)(i * N + j)], mag += std::fabs(2.0 * h[(size_t)(i * N + j)]);
            CHECK(std::fabs(got[(size_t)i] - want) <= 1e-5 * (mag + 1));
        }
    }
    for (bool reversed : {false, true}) {
        INFO((reversed ? "rows reversed" : "rows in order"));
        Tensor v = reversed ? rows.slice({Slice{Slice::kNone, Slice::kNone, -1}, Slice::all()}) : rows;
        Tensor s = ctx.empty({M, 1});
        s[all] = sum(v * 2.0f, 1);
        const std::vector<float> got = s.to_vector<float>();
        for (int64_t i = 0; i < M; ++i) {
            const int64_t r = reversed ? M - 1 - i : i;
            double want = 0, mag = 0;
            for (int64_t j = 0; j < N; ++j) want += 2.0 * h[(size_t)(r * N + j)], mag += std::fabs(2.0 * h[(size_t)(r * N + j)]);
            CHECK(std::fabs(got[(size_t)i] - want) <= 1e-5 * (mag + 1));
        }
    }
}

#ifdef KILN_HAVE_NVRTC
TEST_CASE("gpu: NVRTC failure is a CompileError with the log, the options and the numbered source") {
    REQUIRE_GPU();
    kiln::test::ScopedCacheDir cache_dir;
    const std::string& dir = cache_dir.path();
    cuda::CudaBackend gpu(0);
    kir::Kernel k;
    k.name = "int";   // an identifier, but a keyword: the renderer accepts it, NVRTC does not
    k.rank = 1;
    k.reduced = {false};
    k.buffers = {kir::Buffer{DType::Float32, true, {kir::StrideKind::One}}};
    kir::Instr c{kir::Op::ConstF, ComputeType::F32};
    c.fimm = 1;
    k.instrs = {c};
    k.blocks = {kir::Block{true, {0}, {}, {kir::Store{0, 0}}}};
    try {
        gpu.load_modules(gpu.compile(k, "bad kernel key"));
        FAIL("NVRTC accepted a kernel named int");
    } catch (const CompileError& e) {
        const std::string m = e.what();
        INFO(m);
        CHECK(m.find("NVRTC could not compile kernel int") != std::string::npos);
        CHECK(m.find("source saved to " + dir + "/sources/int.cu") != std::string::npos);
        CHECK_FALSE(e.log().empty());
        CHECK(e.options().find("--gpu-architecture=sm_") != std::string::npos);
        CHECK(e.numbered_source().find("    1 | ") != std::string::npos);
    }
    CHECK(std::filesystem::exists(dir + "/sources/int.cu"));
}
#endif

// (600 rows of 40000: more rows than the GPU holds clusters at once, so each cluster walks several.)
TEST_CASE("gpu: row reductions by a warp, a block, a cluster and uncached long rows; columns, split into many chunks; full") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    const float eps = 0.001f;
    struct Case { int64_t M, N; };
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (Case s : {Case{1000, 3}, Case{777, 5000}, Case{300, 1001}, Case{64, 20000}, Case{3, 100000}, Case{5, 300000},
                       Case{2, 1 << 21}, Case{4096, 1}, Case{200000, 5}, Case{7, 70001}, Case{600, 40000}}) {
            INFO(dtype_name(dt) << " " << s.M << "x" << s.N);
            const int64_t M = s.M, N = s.N;
            std::vector<float> h = random_floats((size_t)(M * N), (uint32_t)(M + N));
            if (dt == DType::Float16) for (auto& x : h) x = f16_to_float(float_to_f16(x));
            if (dt == DType::BFloat16) for (auto& x : h) x = bf16_to_float(float_to_bf16(x));
            Tensor A = ctx.array(h, {M, N}, dt), col = ctx.empty({M, 1}, DType::Float32), out = ctx.empty({M, N}, DType::Float32),
                   cs = ctx.empty({1, N}, DType::Float32), am = ctx.empty({M, 1}, DType::Int32), tot = ctx.empty({1, 1});
            // A row scaled by a row vector and stored in the input's dtype: a buffer only the
            // last pass reads, and a 16-bit store, on rows in registers, partial and misaligned
            // ones (N = 1001) included.
            std::vector<float> hw = random_floats((size_t)N, (uint32_t)(7 * N + 1));
            for (auto& x : hw) x = dt == DType::Float16 ? f16_to_float(float_to_f16(x)) : dt == DType::BFloat16 ? bf16_to_float(float_to_bf16(x)) : x;
            Tensor W = ctx.array(hw, {1, N}, dt), scaled = ctx.empty({M, N}, dt);
            col[all] = var(A, 1);
            out[all] = reciprocal(sqrt(var(A, 1) + eps)) * (A - mean(A, 1));
            scaled[all] = (A - mean(A, 1)) * W;
            cs[all] = sum(A, 0);
            am[all] = argmax(A, 1);
            tot[all] = sum(A);
            std::vector<float> v = col.to_vector<float>(), o = out.to_vector<float>(), c = cs.to_vector<float>();
            std::vector<float> sc = scaled.to_vector<float>();
            const double tol16 = dt == DType::Float32 ? 1e-5 : dt == DType::Float16 ? 2e-3 : 1.6e-2;
            std::vector<int32_t> a = am.to_vector<int32_t>();
            double total = 0;
            std::vector<double> colsum(N, 0.0);
            int bad = 0;
            for (int64_t i = 0; i < M; ++i) {
                double m = 0, q = 0, best = -1e30;
                int32_t arg = 0;
                for (int64_t j = 0; j < N; ++j) {
                    m += h[i * N + j];
                    colsum[j] += h[i * N + j];
                    if (h[i * N + j] > best) best = h[i * N + j], arg = (int32_t)j;
                }
                total += m;
                m /= N;
                for (int64_t j = 0; j < N; ++j) q += (h[i * N + j] - m) * (h[i * N + j] - m);
                q /= N;
                bad += std::abs(v[i] - q) > 1e-4 * (q + 1e-3) + 1e-6;
                bad += a[i] != arg;
                for (int64_t j = 0; j < N; j += 1 + N / 97) {
                    const double e = (h[i * N + j] - m) / std::sqrt(q + eps);
                    bad += std::abs(o[i * N + j] - e) > 1e-3 * (std::abs(e) + 1);
                }
                for (int64_t j = 0; j < N; ++j) {
                    const double e = (h[i * N + j] - m) * hw[j];
                    bad += std::abs(sc[i * N + j] - e) > tol16 * (std::abs(e) + 1);
                }
            }
            for (int64_t j = 0; j < N; ++j) bad += std::abs(c[j] - colsum[j]) > 1e-4 * (std::abs(colsum[j]) + M);
            const double t = tot.to_vector<float>()[0];
            CHECK(std::abs(t - total) <= 1e-5 * (double)(M * N) + 1e-3);
            CHECK(bad == 0);
        }
}

// Full reductions over views of rank 2 and 3 take their points element by element, each
// thread stepping its coordinates by the block's digits in the domain's radix: inner sizes
// below, near and above the block of 256 threads (carries of every size), every other row, a
// column left out, a transposed view; sums (exact: small integers), max and argmax against the
// CPU backend.
TEST_CASE("gpu: full reductions over strided views of rank 2 and 3 agree with the CPU backend") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    struct Case { int64_t A, B, C; };
    int cases = 0;
    for (Case c : {Case{1, 300, 7}, Case{1, 64, 255}, Case{1, 90, 256}, Case{1, 40, 1001}, Case{5, 37, 11},
                   Case{3, 129, 70}, Case{1, 2000, 513}})
        for (int view = 0; view < 3; ++view) {
            INFO(c.A << "x" << c.B << "x" << c.C << ", view " << view);
            // Small integers: every sum exact in any order; many ties for argmax's first position.
            std::vector<float> h = random_floats((size_t)(c.A * c.B * c.C), (uint32_t)(c.B * 7 + c.C + view), -4, 4);
            for (auto& x : h) x = std::round(2 * x);
            double sums[2];
            float maxes[2];
            int32_t args[2];
            for (int side = 0; side < 2; ++side) {
                Context& ctx = side ? cpu : gpu;
                Tensor X = ctx.array(h, {c.A, c.B, c.C});
                Tensor V = view == 0 ? X.slice({Slice::all(), Slice::range(0, c.B, 2), Slice::all()})
                           : view == 1 ? X.slice({Slice::all(), Slice::all(), Slice::range(1, c.C)})
                                       : X.slice({Slice::all(), Slice::range(1, c.B), Slice::all()}).transpose();
                Tensor S = ctx.empty({1, 1, 1}), M = ctx.empty({1, 1, 1}), I = ctx.empty({1, 1, 1}, DType::Int32);
                S[all] = sum(V);
                M[all] = max(V);
                I[all] = argmax(V);
                sums[side] = S.to_vector<float>()[0];
                maxes[side] = M.to_vector<float>()[0];
                args[side] = I.to_vector<int32_t>()[0];
            }
            CHECK(sums[0] == sums[1]);
            CHECK(maxes[0] == maxes[1]);
            CHECK(args[0] == args[1]);
            ++cases;
        }
    CHECK(cases == 21);
}

TEST_CASE("gpu: prod along rows (warp, block, cluster), columns (split) and all agrees with float64 and wrapping int32") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    struct Case { int64_t M, N; };
    for (Case s : {Case{1000, 3}, Case{300, 1001}, Case{64, 20000}, Case{5, 300000}, Case{200000, 5}, Case{7, 70001}}) {
        INFO(s.M << "x" << s.N);
        const int64_t M = s.M, N = s.N;
        // Factors 1 + u, u symmetric about 0 within 1/512, so that no product of up to 1.3M of
        // them leaves float32's range (the log of one drifts by about sqrt(n)/900); float32
        // products of n of them carry about sqrt(n) roundings in any order.
        std::vector<float> h = random_floats((size_t)(M * N), (uint32_t)(3 * M + N), -1, 1);
        for (auto& x : h) x = 1.0f + x / 512.0f;
        std::vector<int32_t> hi((size_t)(M * N));
        for (size_t i = 0; i < hi.size(); ++i) hi[i] = h[i] > 1.0f ? 3 : -1;   // products wrap
        Tensor A = ctx.array(h, {M, N}), I = ctx.array(hi, {M, N});
        Tensor rows = ctx.empty({M}), cols = ctx.empty({N}), all_ = ctx.empty({}), irows = ctx.empty({M}, DType::Int32);
        rows[all] = prod(A, 1, false);
        cols[all] = prod(A, 0, false);
        all_[all] = prod(A, kAllAxes, false);
        irows[all] = prod(I, 1, false);
        const std::vector<float> r = rows.to_vector<float>(), c = cols.to_vector<float>();
        const std::vector<int32_t> ir = irows.to_vector<int32_t>();
        std::vector<double> wr(M, 1.0), wc(N, 1.0);
        std::vector<uint32_t> wi(M, 1u);
        double wa = 1.0;
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
                wr[i] *= h[i * N + j], wc[j] *= h[i * N + j], wa *= h[i * N + j];
                wi[i] *= (uint32_t)hi[i * N + j];
            }
        auto close = [](double got, double want, int64_t n) {
            return std::abs(got - want) <= (16 + 4 * std::sqrt((double)n)) * 0x1p-24 * std::abs(want);
        };
        int bad = 0;
        for (int64_t i = 0; i < M; ++i) bad += !close(r[i], wr[i], N) + (ir[i] != (int32_t)wi[i]);
        for (int64_t j = 0; j < N; ++j) bad += !close(c[j], wc[j], M);
        CHECK(bad == 0);
        CHECK(close(all_.to_vector<float>()[0], wa, M * N));
    }
}

// Column reductions take their vector entry (V adjacent columns per thread, 16-byte loads)
// when the columns come in whole, aligned groups, and one column per thread otherwise: widths
// that are and are not multiples of V, inputs at an offset and with rows out of phase, a
// single row and many, split and unsplit, one pass and two (a variance), vectors broadcast
// along the rows inside the pass and after it, every float dtype and int8.
#ifdef KILN_HAVE_NVRTC
TEST_CASE("gpu: column reductions by groups of adjacent columns (aligned) and column by column agree with float64") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    auto round_to = [](DType dt, float x) {
        return dt == DType::Float16 ? f16_to_float(float_to_f16(x)) : dt == DType::BFloat16 ? bf16_to_float(float_to_bf16(x))
               : dt == DType::Int8 ? std::nearbyint(x * 20) : x;
    };
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    int vector_cases = 0, cases = 0;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16, DType::Int8})
        for (int64_t N : {8, 72, 1000, 1004, 4104})
            for (int64_t M : {1, 7, 300, 5000})
                for (int layout = 0; layout < 3; ++layout) {   // dense, at an offset, rows out of phase
                    const int64_t ld = N + (layout == 2 ? 1 : 8), xo = layout == 1 ? 1 : 0;
                    INFO(dtype_name(dt) << " " << M << "x" << N << " layout " << layout);
                    std::vector<float> hx = random_floats((size_t)(M * ld), (uint32_t)(M * 7 + N + layout));
                    std::vector<float> hw = random_floats((size_t)N, (uint32_t)(N + 3), 0.5f, 2.0f);
                    for (auto& x : hx) x = round_to(dt, x);
                    Tensor X = ctx.array(hx, {M, ld}, dt).slice({Slice::all(), Slice::range(xo, xo + N)});
                    Tensor W = ctx.array(hw, {1, N});
                    Tensor s = ctx.empty({1, N}), mx = ctx.empty({1, N}, dt), am = ctx.empty({1, N}, DType::Int32),
                           ws = ctx.empty({1, N}), vr = ctx.empty({1, N});
                    const int64_t v = std::min<int64_t>(16 / (int64_t)dtype_size(dt), 8);
                    const bool expect = layout == 0 && N % v == 0;
                    auto took_vector = [&](auto&& assign) {
                        const uint64_t before = be.counters().aligned_launches;
                        assign();
                        return be.counters().aligned_launches > before;
                    };
                    int taken = 0;
                    taken += took_vector([&] { s[all] = sum(X, 0); });
                    taken += took_vector([&] { mx[all] = max(X, 0); });
                    taken += took_vector([&] { am[all] = argmax(X, 0); });
                    taken += took_vector([&] { ws[all] = sum(X * W, 0) * W; });
                    if (dt != DType::Int8) taken += took_vector([&] { vr[all] = var(X, 0); });
                    if (M > 1) CHECK(taken == (expect ? (dt == DType::Int8 ? 4 : 5) : 0));
                    vector_cases += M > 1 && expect;
                    ++cases;
                    const std::vector<float> gs = s.to_vector<float>(), gm = mx.to_vector<float>(), gw = ws.to_vector<float>(),
                                             gv = dt == DType::Int8 ? std::vector<float>() : vr.to_vector<float>();
                    const std::vector<int32_t> ga = am.to_vector<int32_t>();
                    int bad = 0;
                    for (int64_t j = 0; j < N; ++j) {
                        double sum = 0, wsum = 0, best = -1e30, q = 0;
                        int32_t arg = 0;
                        for (int64_t i = 0; i < M; ++i) {
                            const double x = hx[i * ld + xo + j];
                            sum += x;
                            wsum += x * (double)hw[j];
                            if (x > best) best = x, arg = (int32_t)i;
                        }
                        for (int64_t i = 0; i < M; ++i) q += std::pow(hx[i * ld + xo + j] - sum / M, 2);
                        const double scale = dt == DType::Int8 ? 40.0 * M : 3.0 * M;
                        bad += !(std::abs(gs[j] - sum) <= 1e-5 * scale + 1e-4);
                        bad += gm[j] != (float)best;
                        bad += ga[j] != arg;
                        bad += !(std::abs(gw[j] - wsum * hw[j]) <= 1e-5 * scale * 4 + 1e-4);
                        if (dt != DType::Int8) bad += !(std::abs(gv[j] - q / M) <= 1e-4 * (q / M) + 1e-5);
                    }
                    CHECK(bad == 0);
                }
    CHECK(cases == 4 * 5 * 4 * 3);
    CHECK(vector_cases > 30);
    // Every float16 pattern through the vector entry: a NaN keeps its payload (quieted on the way
    // in, as ir/half.hpp stores it).
    const int64_t n = 1 << 16;
    std::vector<float> h(2 * n, -INFINITY);
    for (int64_t p = 0; p < n; ++p) h[p] = f16_to_float((uint16_t)p);
    Tensor H = ctx.array(h, {2, n}, DType::Float16), f = ctx.empty({1, n});
    const uint64_t before = be.counters().aligned_launches;
    f[all] = max(H, 0);
    CHECK(be.counters().aligned_launches - before == 1u);
    const std::vector<float> got = f.to_vector<float>();
    int bad = 0;
    for (int64_t p = 0; p < n; ++p) bad += f32_bits(got[p]) != f32_bits(f16_to_float(float_to_f16(h[p])));
    CHECK(bad == 0);
}

#endif

// Row kernels hold the row in registers (their entry NAME_r) when every row is aligned, whole
// groups of 16 bytes, and fits kRowRegisterGroups groups a thread within a block; otherwise the
// shared-memory entry runs: lengths that are and are not multiples of V, too long for registers,
// inputs at an offset and rows out of phase; batch norm, layer norm (weights read in the last
// pass), a residual norm (two buffers in registers), RMS norm stored in the input's dtype, an
// argmax, an int8 row beside the input, a 16-bit variance whose fold the register entry undoes,
// and softmax, which has no register entry; every float dtype; results against float64. The
// launches of at most kCudaSmallRowElements elements again through the small entry.
#ifdef KILN_HAVE_NVRTC
TEST_CASE("gpu: rows held in registers (aligned rows), in shared memory and element by element (small launches) agree "
          "with float64") {
    REQUIRE_GPU();
    // The general entries (KILN_SMALL_ROWS=0: small launches too), then for launches of at most
    // kCudaSmallRowElements elements the small entry NAME_s, which never holds a row in registers.
    setenv("KILN_SMALL_ROWS", "0", 1);
    Context general(ContextOptions{"cuda"});
    unsetenv("KILN_SMALL_ROWS");
    Context small(ContextOptions{"cuda"});
    const float eps = 1e-5f;
    int register_cases = 0, cases = 0, small_cases = 0;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (int64_t N : {8, 96, 1000, 1004, 3000, 4096, 8192, 16384})
            for (int64_t M : {1, 7, 300, 1000})
                for (int layout = 0; layout < 3; ++layout) {   // dense, at an offset, rows out of phase
                    if (M * N > (int64_t)1 << 24) continue;
                    const int64_t ld = N + (layout == 2 ? 1 : 0), xo = layout == 1 ? 1 : 0;
                    INFO(dtype_name(dt) << " " << M << "x" << N << " layout " << layout);
                    auto rounded = [&](std::vector<float> v) {
                        for (auto& x : v)
                            x = dt == DType::Float16 ? f16_to_float(float_to_f16(x)) : dt == DType::BFloat16 ? bf16_to_float(float_to_bf16(x)) : x;
                        return v;
                    };
                    const std::vector<float> hx = rounded(random_floats((size_t)(M * ld + 1), (uint32_t)(M * 5 + N + layout)));
                    const std::vector<float> hr = rounded(random_floats((size_t)(M * ld + 1), (uint32_t)(M * 3 + N + layout), -1, 1));
                    const std::vector<float> hw = rounded(random_floats((size_t)N, (uint32_t)(N + 11), 0.5f, 2.0f));
                    std::vector<float> hm = random_floats((size_t)(M * ld + 1), (uint32_t)(M + 7 * N + layout), 0, 3);
                    for (auto& x : hm) x = std::floor(x);
                    for (int pass = 0; pass < 2; ++pass) {
                        if (pass == 1 && M * N > codegen::kCudaSmallRowElements) break;
                        Context& ctx = pass ? small : general;
                        cuda::CudaBackend& be = cuda::cuda_backend(ctx);
                        INFO((pass ? "the small entry" : "the general entries"));
                        auto rows = [&](const std::vector<float>& h, DType t) {
                            return ctx.array(h, {(int64_t)h.size()}, t).slice({Slice::range(xo, xo + M * ld)}).reshape({M, ld}).slice(
                                {Slice::all(), Slice::range(0, N)});
                        };
                        Tensor X = rows(hx, dt), R = rows(hr, dt), Mk = rows(hm, DType::Int8), W = ctx.array(hw, {1, N}, dt);
                        Tensor bn = ctx.empty({M, N}), sm = ctx.empty({M, N}), ln = ctx.empty({M, N}), rn = ctx.empty({M, N}),
                               rms = ctx.empty({M, N}, dt), ar = ctx.empty({M, N}), mk = ctx.empty({M, N}), fv = ctx.empty({M, N});
                        const int64_t v = 16 / (int64_t)dtype_size(dt);
                        // Rows of a block of up to 256 threads' groups go through registers; up to 512
                        // threads' (a block each) where one 16-byte group is cached and one pass at
                        // most streams one more buffer (`wide`: 3 blocks a multiprocessor).
                        const bool aligned = (layout == 0 || (layout == 2 && M == 1)) && N % v == 0;
                        int taken = 0, expected = 0;
                        auto count = [&](bool wide, auto&& assign) {
                            const uint64_t before = be.counters().aligned_launches;
                            assign();
                            taken += be.counters().aligned_launches > before;
                            expected += pass == 0 && aligned && N <= 4 * (wide ? 512 : 256) * v;
                        };
                        count(true, [&] { bn[all] = reciprocal(sqrt(var(X, 1) + eps)) * (X - mean(X, 1)); });
                        sm[all] = exp(X - max(X, 1)) / sum(exp(X - max(X, 1)), 1);   // softmax keeps shared memory
                        count(true, [&] { ln[all] = (X - mean(X, 1)) * reciprocal(sqrt(var(X, 1) + eps)) * W; });
                        count(false, [&] { rn[all] = (X + R - mean(X + R, 1)) * reciprocal(sqrt(var(X + R, 1) + eps)); });
                        count(true, [&] { rms[all] = X * reciprocal(sqrt(mean(X * X, 1) + eps)) * W; });
                        // An arg reduction; an int8 row held beside the input (groups of 4 or 8 bytes); a
                        // 16-bit variance whose fold the register entry undoes, its row then read twice.
                        count(true, [&] { ar[all] = X * (argmax(X, 1) + 1); });
                        count(false, [&] { mk[all] = X * Mk - mean(X * Mk, 1); });
                        count(false, [&] { fv[all] = (R - mean(R, 1)) * reciprocal(sqrt(var(X, 1) + eps)); });
                        CHECK(taken == expected);
                        register_cases += expected > 0;
                        ++(pass ? small_cases : cases);
                        const std::vector<float> gbn = bn.to_vector<float>(), gsm = sm.to_vector<float>(), gln = ln.to_vector<float>(),
                                                 grn = rn.to_vector<float>(), grms = rms.to_vector<float>(),
                                                 gar = ar.to_vector<float>(), gmk = mk.to_vector<float>(), gfv = fv.to_vector<float>();
                        const double tol = dt == DType::Float32 ? 2e-5 : dt == DType::Float16 ? 2e-3 : 1.6e-2;
                        int bad = 0;
                        for (int64_t i = 0; i < M; ++i) {
                            const float* x = hx.data() + xo + i * ld;
                            const float* r = hr.data() + xo + i * ld;
                            const float* mkr = hm.data() + xo + i * ld;
                            double m = 0, q = 0, mx = -1e30, se = 0, mr = 0, qr = 0, ss = 0, sxm = 0, rr = 0;
                            int64_t arg = 0;
                            for (int64_t j = 0; j < N; ++j) {
                                m += x[j], mr += (double)x[j] + r[j], ss += (double)x[j] * x[j], sxm += (double)x[j] * mkr[j], rr += r[j];
                                if (x[j] > mx) mx = x[j], arg = j;
                            }
                            m /= N, mr /= N, sxm /= N, rr /= N;
                            for (int64_t j = 0; j < N; ++j)
                                q += (x[j] - m) * (x[j] - m), qr += ((double)x[j] + r[j] - mr) * ((double)x[j] + r[j] - mr), se += std::exp(x[j] - mx);
                            q /= N, qr /= N;
                            const double is = 1 / std::sqrt(q + eps), isr = 1 / std::sqrt(qr + eps), irms = 1 / std::sqrt(ss / N + eps);
                            for (int64_t j = 0; j < N; ++j) {
                                const size_t o = (size_t)(i * N + j);
                                const double b = (x[j] - m) * is, s = std::exp(x[j] - mx) / se, l = b * hw[j],
                                             n = ((double)x[j] + r[j] - mr) * isr, rm = x[j] * irms * hw[j];
                                bad += !(std::abs(gbn[o] - b) <= 1e-4 * (std::abs(b) + 1));
                                bad += !(std::abs(gsm[o] - s) <= 1e-4 * s + 1e-7);
                                bad += !(std::abs(gln[o] - l) <= 1e-4 * (std::abs(l) + 1));
                                bad += !(std::abs(grn[o] - n) <= 1e-4 * (std::abs(n) + 1));
                                bad += !(std::abs(grms[o] - rm) <= tol * (std::abs(rm) + 1));
                                const double a = (double)x[j] * (arg + 1), k = (double)x[j] * mkr[j] - sxm, f = (r[j] - rr) * is;
                                bad += !(std::abs(gar[o] - a) <= tol * (std::abs(a) + 1));
                                bad += !(std::abs(gmk[o] - k) <= tol * (std::abs(k) + 1));
                                bad += !(std::abs(gfv[o] - f) <= 1e-4 * (std::abs(f) + 1));
                            }
                        }
                        CHECK(bad == 0);
                    }
                }
    CHECK(register_cases > 20);
    CHECK(cases > 200);
    CHECK(small_cases > 50);
}
#endif

// Shifts on the GPU give the CPU backend's results (NumPy's rules, tests/unit/test_math_functions.cpp):
// every amount from below 0 to past the width, in every integer dtype.
TEST_CASE("gpu: bitwise shifts agree with the CPU for every amount and integer dtype") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    for (DType dt : {DType::Int32, DType::Int8, DType::UInt8}) {
        INFO(dtype_name(dt));
        std::vector<int32_t> x, s;
        std::mt19937 g(7);
        for (int i = 0; i < 4000; ++i) {
            const int32_t v = (int32_t)g(), k = (int32_t)(g() % 70) - 3;
            x.push_back(dt == DType::Int8 ? (int8_t)v : dt == DType::UInt8 ? (uint8_t)v : v);
            s.push_back(dt == DType::Int8 ? (int8_t)k : dt == DType::UInt8 ? (uint8_t)k : k);
        }
        auto run = [&](Context& c) {
            Tensor a = c.array(x, {(int64_t)x.size()}, dt), b = c.array(s, {(int64_t)s.size()}, dt);
            return std::make_pair(c.eval(bitwise_left_shift(a, b)).to_vector<int32_t>(),
                                  c.eval(bitwise_xor(bitwise_right_shift(a, b), a)).to_vector<int32_t>());
        };
        CHECK(run(gpu) == run(cpu));
    }
}

// Kernels whose every store is a 16-bit float take the hardware's exp: stored, a value is the
// CPU's or one rounding step from it, and rarely that (exp2 and tanh for comparison).
TEST_CASE("gpu: exp/exp2/tanh stored as 16-bit floats are within one step of the CPU's, and rarely off") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    const int64_t n = 300000;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (int op = 0; op < 4; ++op) {   // exp, exp2, tanh, a softmax over rows of 1000
            INFO(dtype_name(dt) << " op " << op);
            const double lo = op == 2 ? -6 : -17, hi = op == 2 ? 6 : 11;
            std::vector<float> h((size_t)n);
            for (int64_t i = 0; i < n; ++i) h[i] = (float)(lo + (hi - lo) * (double)i / (double)(n - 1));
            std::vector<float> got[2];
            for (int side = 0; side < 2; ++side) {
                Context& ctx = side ? cpu : gpu;
                Tensor X = ctx.array(h, {300, 1000}, dt), Y = ctx.empty({300, 1000}, dt);
                if (op == 0) Y[all] = exp(X);
                if (op == 1) Y[all] = exp2(X);
                if (op == 2) Y[all] = tanh(X);
                if (op == 3) Y[all] = exp(X - max(X, 1)) * reciprocal(sum(exp(X - max(X, 1)), 1));
                got[side] = Y.to_vector<float>();
            }
            auto bits = [&](float f) {
                return (int)(dt == DType::Float16 ? float_to_f16(f) : float_to_bf16(f));
            };
            int64_t off = 0, far = 0;
            for (size_t i = 0; i < got[0].size(); ++i) {
                const int a = bits(got[0][i]), b = bits(got[1][i]);
                if (a == b) continue;
                ++off;
                far += (a ^ b) & 0x8000 || std::abs(a - b) > 1;
            }
            CHECK(far == 0);
            CHECK(off * 100 <= (int64_t)got[0].size());
        }
}

// The GPU's float arithmetic makes every NaN the canonical one (the premise of skipping the
// 16-bit NaN tests where a value only feeds arithmetic): every 16-bit pattern through each
// canonicalising op, elementwise and in a row kernel, stored in 16 and 32 bits. (Not x * 1,
// x - 0 or x / 1: the compiler folds those into copies, which keep payloads.)
TEST_CASE("gpu: arithmetic on 16-bit NaNs gives the canonical NaN") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    const int64_t n = 1 << 16;
    for (DType dt : {DType::Float16, DType::BFloat16}) {
        std::vector<float> h(n);
        for (int64_t p = 0; p < n; ++p) h[p] = dt == DType::Float16 ? f16_to_float((uint16_t)p) : bf16_to_float((uint16_t)p);
        Tensor X = ctx.array(h, {256, 256}, dt), Y = ctx.empty({256, 256}, dt), F = ctx.empty({256, 256});
        auto bits16 = [&](float f) { return dt == DType::Float16 ? float_to_f16(f) : float_to_bf16(f); };
        for (int op = 0; op < 6; ++op) {
            INFO(dtype_name(dt) << " op " << op);
            auto expr = [&](const Tensor& x) -> Expr {
                switch (op) {
                case 0: return x * 2.0f;
                case 1: return x - 1.0f;
                case 2: return x / 3.0f;
                case 3: return sqrt(absolute(x)) * 0.0f + x;
                case 4: return exp(x) * 0.0f + x;
                default: return x - mean(X, 1) * 0.0f;   // a row kernel
                }
            };
            Y[all] = expr(X);
            F[all] = expr(X);
            const std::vector<float> y = Y.to_vector<float>(), f = F.to_vector<float>();
            int bad = 0, nans = 0;
            for (int64_t p = 0; p < n; ++p) {
                // A row holding a NaN or an infinity is NaN throughout in the row kernel.
                const bool row_nan = op == 5 && std::any_of(h.begin() + p / 256 * 256, h.begin() + p / 256 * 256 + 256,
                                                            [](float v) { return !std::isfinite(v); });
                if (std::isnan(h[p]) || row_nan) bad += !std::isnan(y[p]) + !std::isnan(f[p]);
                if (std::isnan(y[p])) bad += bits16(y[p]) != 0x7fff, ++nans;
                if (std::isnan(f[p])) bad += f32_bits(f[p]) != 0x7fffffffu;
            }
            CHECK(bad == 0);
            CHECK(nans >= (dt == DType::Float16 ? 2046 : 254));
        }
    }
}

// A norm's weight and bias vectors are out of phase with most rows when the row length is not a
// multiple of the group: the row kernels read them as shifted 16-byte words. Every row length
// mod 8, every weight offset mod 8 (views into a larger vector), each dtype, a warp, a block and
// a cluster per row; rows at an offset too (the input then out of phase with the output).
TEST_CASE("gpu: row kernels read vectors out of the rows' phase, every phase, every dtype") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    auto round_to = [](DType dt, float x) {
        return dt == DType::Float16 ? f16_to_float(float_to_f16(x)) : dt == DType::BFloat16 ? bf16_to_float(float_to_bf16(x)) : x;
    };
    int cases = 0;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (int64_t base : {64, 2048, 40000})
            for (int64_t r = 0; r < 8; ++r) {
                const int64_t N = base + r, M = base > 10000 ? 3 : 9, o = (r * 3 + base) % 8, xo = r % 2;
                INFO(dtype_name(dt) << " " << M << "x" << N << ", vectors at offset " << o << ", rows at " << xo);
                std::vector<float> hx = random_floats((size_t)(M * (N + 1)), (uint32_t)(N + 5));
                std::vector<float> hg = random_floats((size_t)(N + 8), (uint32_t)(N + 6), 0.5f, 2.0f);
                std::vector<float> hb = random_floats((size_t)(N + 8), (uint32_t)(N + 7));
                for (auto* v : {&hx, &hg, &hb})
                    for (auto& x : *v) x = round_to(dt, x);
                Tensor X = ctx.array(hx, {M, N + 1}, dt).slice({Slice::all(), Slice::range(xo, xo + N)});
                Tensor G = ctx.array(hg, {1, N + 8}, dt).slice({Slice::all(), Slice::range(o, o + N)});
                Tensor B = ctx.array(hb, {1, N + 8}, dt).slice({Slice::all(), Slice::range(8 - o, 8 - o + N)});
                Tensor Y = ctx.empty({M, N}, dt);
                Y[all] = (X - mean(X, 1)) * reciprocal(sqrt(mean(square(X - mean(X, 1)), 1) + 1e-5f)) * G + B;
                const std::vector<float> y = Y.to_vector<float>();
                const double tol = dt == DType::Float32 ? 1e-4 : dt == DType::Float16 ? 4e-3 : 3e-2;
                int bad = 0;
                for (int64_t i = 0; i < M; ++i) {
                    double m = 0, q = 0;
                    for (int64_t j = 0; j < N; ++j) m += hx[i * (N + 1) + xo + j];
                    m /= N;
                    for (int64_t j = 0; j < N; ++j) q += std::pow(hx[i * (N + 1) + xo + j] - m, 2);
                    q /= N;
                    for (int64_t j = 0; j < N; ++j) {
                        const double e = (hx[i * (N + 1) + xo + j] - m) / std::sqrt(q + 1e-5) * hg[o + j] + hb[8 - o + j];
                        bad += !(std::abs(y[i * N + j] - e) <= tol * (std::abs(e) + 1));
                    }
                }
                CHECK(bad == 0);
                ++cases;
            }
    CHECK(cases == 72);
}

TEST_CASE("gpu: a variance read in one pass (folded moments) keeps its precision on rows far from zero") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    struct Case { int64_t M, N; };
    // A warp segment, a block, a cluster, misaligned rows, one element, a partial last group.
    for (Case s : {Case{500, 7}, Case{64, 1000}, Case{33, 5001}, Case{4, 70001}, Case{3, 1 << 20}, Case{9, 1}, Case{17, 97}}) {
        INFO(s.M << "x" << s.N);
        std::vector<float> h = random_floats((size_t)(s.M * s.N), (uint32_t)(3 * s.M + s.N));
        for (size_t i = 0; i < h.size(); ++i) h[i] = 1.0e4f + h[i] + (float)((i / (size_t)s.N) % 5);   // mean ~1e4, std ~1
        Tensor A = ctx.array(h, {s.M, s.N}), v = ctx.empty({s.M, 1}), sd = ctx.empty({s.M, 1});
        v[all] = var(A, 1);
        sd[all] = sqrt(mean(square(A - mean(A, 1)), 1));
        const std::vector<float> got = v.to_vector<float>(), gsd = sd.to_vector<float>();
        int bad = 0;
        for (int64_t i = 0; i < s.M; ++i) {
            double m = 0, q = 0;
            for (int64_t j = 0; j < s.N; ++j) m += h[i * s.N + j];
            m /= s.N;
            for (int64_t j = 0; j < s.N; ++j) q += (h[i * s.N + j] - m) * (h[i * s.N + j] - m);
            q /= s.N;
            // float32 inputs near 1e4 carry 1e-3 of rounding each: the variance is known to about that.
            bad += !(std::abs(got[i] - q) <= 2e-3 * q + 1e-3);
            bad += !(std::abs(gsd[i] - std::sqrt(q)) <= 2e-3 * std::sqrt(q) + 1e-3);
        }
        CHECK(bad == 0);
    }
}

// The same along columns (codegen::detail::column_folds): one pass whose moments merge a step
// at a time, across the block's slices and across the chunks (the final entry); the vector entry
// (aligned columns) and column by column (77 columns); few rows (one chunk) and many; every
// dtype, far from zero; the shared sum beside it.
TEST_CASE("gpu: a column variance read in one pass (folded moments) keeps its precision far from zero, every dtype") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    struct Case { int64_t M, N; };
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (Case s : {Case{65536, 256}, Case{3000, 77}, Case{100, 24}, Case{1, 64}, Case{200003, 8}, Case{4099, 1000}}) {
            INFO(dtype_name(dt) << " " << s.M << "x" << s.N);
            std::vector<float> h = random_floats((size_t)(s.M * s.N), (uint32_t)(5 * s.M + s.N));
            // columns near 1e3 (float32: 1e4) with a spread of about 1, and rows shifted in turn
            const float base = dt == DType::Float32 ? 1.0e4f : 1.0e3f;
            for (size_t i = 0; i < h.size(); ++i) h[i] = base + h[i] + (float)((i / (size_t)s.N) % 5);
            for (auto& x : h) x = dt == DType::Float16 ? f16_to_float(float_to_f16(x)) : dt == DType::BFloat16 ? bf16_to_float(float_to_bf16(x)) : x;
            Tensor A = ctx.array(h, {s.M, s.N}, dt), v = ctx.empty({1, s.N}), t = ctx.empty({1, s.N});
            const Expr total = sum(cast(A.expr(), DType::Float32), 0, true);
            ctx.assign_together({{&t, total}, {&v, mean(square(cast(A.expr(), DType::Float32) - total * (1.0 / (double)s.M)), 0, true)}});
            const std::vector<float> got = v.to_vector<float>(), gt = t.to_vector<float>();
            int bad = 0;
            for (int64_t j = 0; j < s.N; ++j) {
                double m = 0, q = 0;
                for (int64_t i = 0; i < s.M; ++i) m += h[i * s.N + j];
                const double total_ref = m;
                m /= s.M;
                for (int64_t i = 0; i < s.M; ++i) q += (h[i * s.N + j] - m) * (h[i * s.N + j] - m);
                q /= s.M;
                // float32 inputs near 1e4 carry 1e-3 of rounding each (16-bit: exact inputs).
                if (!(std::abs(got[j] - q) <= 2e-3 * q + 1e-3)) {
                    if (bad < 3) UNSCOPED_INFO("column " << j << ": variance " << got[j] << ", want " << q);
                    ++bad;
                }
                bad += !(std::abs(gt[j] - total_ref) <= 1e-5 * std::abs(total_ref));
            }
            CHECK(bad == 0);
        }
}

// Softmax's sum of exponentials is kept by the pass that finds the row's max (a running max,
// the sum rescaled as it grows): a warp segment, a block, a cluster, a cluster of 16 (float32
// rows of 250001, which 8 blocks cannot cache; 64 such rows: each cluster walks several),
// uncached rows, rows out of phase, one element; rows of -inf, with one or two +inf, with a NaN, with -inf among finite
// values and far from zero, against the CPU backend (which reduces in two rounds) and float64.
TEST_CASE("gpu: softmax's max and sum of exponentials in one round agree with the CPU, special values included") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    struct Case { int64_t M, N; };
    int cases = 0;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (Case s : {Case{500, 7}, Case{64, 1000}, Case{33, 5001}, Case{4, 70001}, Case{2, 1 << 20}, Case{9, 1},
                       Case{17, 97}, Case{12, 4096}, Case{6, 250001}, Case{64, 250001}})
            for (int64_t xo : {0, 1}) {
                const int64_t M = s.M, N = s.N;
                INFO(dtype_name(dt) << " " << M << "x" << N << ", rows at " << xo);
                std::vector<float> h = random_floats((size_t)(M * (N + 1)), (uint32_t)(M + N + xo), -8, 8);
                auto at = [&](int64_t i, int64_t j) -> float& { return h[(size_t)(i * (N + 1) + xo + j)]; };
                for (int64_t j = 0; j < N; ++j) at(0, j) = -inf;   // every value -inf: NaN
                if (M > 4) {
                    at(1, N / 2) = inf;                              // one +inf: NaN
                    at(2, N - 1) = nan;                              // NaN: NaN
                    for (int64_t j = 0; j < N; j += 2) at(3, j) = -inf;   // -inf among finite values: 0 there
                    for (int64_t j = 0; j < N; ++j) at(4, j) += 60.0f;    // far from zero: exp(x) alone overflows
                }
                for (auto& x : h) x = dt == DType::Float16 ? f16_to_float(float_to_f16(x)) : dt == DType::BFloat16 ? bf16_to_float(float_to_bf16(x)) : x;
                std::vector<float> got[2], sums[2];
                for (int side = 0; side < 2; ++side) {
                    Context& ctx = side ? cpu : gpu;
                    Tensor X = ctx.array(h, {M, N + 1}, dt).slice({Slice::all(), Slice::range(xo, xo + N)});
                    Tensor Y = ctx.empty({M, N}, dt), S = ctx.empty({M, 1});
                    Y[all] = exp(X - max(X, 1)) * reciprocal(sum(exp(X - max(X, 1)), 1));
                    S[all] = sum(exp(X - max(X, 1)), 1);
                    got[side] = Y.to_vector<float>();
                    sums[side] = S.to_vector<float>();
                }
                const double tol = dt == DType::Float32 ? 2e-6 : dt == DType::Float16 ? 1e-3 : 8e-3;
                int bad = 0;
                for (int64_t i = 0; i < M; ++i) {
                    double mx = -INFINITY, sum = 0;
                    bool has_nan = false;
                    for (int64_t j = 0; j < N; ++j) has_nan |= std::isnan(at(i, j)), mx = std::max(mx, (double)at(i, j));
                    for (int64_t j = 0; j < N; ++j) sum += std::exp((double)at(i, j) - mx);
                    const bool row_nan = has_nan || std::isinf(mx) || std::isnan(sum);
                    bad += std::isnan(sums[0][i]) != std::isnan(sums[1][i]) || std::isnan(sums[0][i]) != row_nan;
                    if (!row_nan) bad += !(std::abs(sums[0][i] - sum) <= 1e-5 * sum);
                    for (int64_t j = 0; j < N; ++j) {
                        const float g = got[0][(size_t)(i * N + j)], c = got[1][(size_t)(i * N + j)];
                        if (row_nan) {
                            bad += !std::isnan(g) || !std::isnan(c);
                            continue;
                        }
                        const double e = std::exp((double)at(i, j) - mx) / sum;
                        bad += !(std::abs(g - e) <= tol * e + 1e-7) || !(std::abs(g - c) <= 2 * tol * e + 1e-7);
                    }
                }
                CHECK(bad == 0);
                ++cases;
            }
    CHECK(cases == 60);
}

// Stored exps keep ex2's subnormal fix-up (kiln_exp_fast; only a sum of exponentials about the
// max flushes): softmax rows whose exps fall below float's normal range (values 88 to 92 under
// the row's max, the sum of exponentials about 1) keep them as bfloat16 subnormals, within a
// subnormal step of float64's; float16 rounds them to zero. The register entry, a block and a
// cluster a row.
TEST_CASE("gpu: 16-bit softmax keeps exps below float's normal range (bfloat16 subnormals)") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    int cases = 0;
    for (DType dt : {DType::BFloat16, DType::Float16})
        for (int64_t N : {1000, 5001, 70001}) {
            const int64_t M = 8;
            INFO(dtype_name(dt) << " " << M << "x" << N);
            std::vector<float> h((size_t)(M * N));
            for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j)
                    h[(size_t)(i * N + j)] = j == i ? 0.0f : j % 7 == 3 ? -88.0f - float((i + j) % 5) : -20.0f;
            for (auto& x : h) x = dt == DType::Float16 ? f16_to_float(float_to_f16(x)) : bf16_to_float(float_to_bf16(x));
            Tensor X = ctx.array(h, {M, N}, dt), Y = ctx.empty({M, N}, dt);
            Y[all] = exp(X - max(X, 1)) * reciprocal(sum(exp(X - max(X, 1)), 1));
            const std::vector<float> y = Y.to_vector<float>();
            const double step = std::ldexp(1.0, -133);   // bfloat16's least subnormal
            const double floor16 = dt == DType::Float16 ? std::ldexp(1.0, -24) : step;   // the dtype's
            int bad = 0, tiny = 0;
            for (int64_t i = 0; i < M; ++i) {
                double sum = 0;
                for (int64_t j = 0; j < N; ++j) sum += std::exp((double)h[(size_t)(i * N + j)]);
                for (int64_t j = 0; j < N; ++j) {
                    const double e = std::exp((double)h[(size_t)(i * N + j)]) / sum, g = y[(size_t)(i * N + j)];
                    if (e < 1.17549435e-38) {
                        ++tiny;
                        bad += dt == DType::Float16 ? g != 0.0 : !(std::abs(g - e) <= step + e / 128) || g == 0.0;
                    } else {
                        bad += !(std::abs(g - e) <= e / (dt == DType::Float16 ? 1000.0 : 120.0) + floor16);
                    }
                }
            }
            CHECK(tiny > M * N / 8);
            CHECK(bad == 0);
            ++cases;
        }
    CHECK(cases == 6);
}

// Arg reductions along rows take a thread's elements in order on the grouped path (fewer
// tests per element) and in any order on the element-by-element one (rows out of phase wrap):
// ties keep the first position (-0 and +0 tie), the first NaN wins, a row of -inf (or of +inf
// for argmin) gives 0; every dtype, aligned rows and rows out of phase, against the CPU backend.
TEST_CASE("gpu: argmax and argmin along rows keep the first extreme, the first NaN, in every phase") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    int cases = 0;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16, DType::Int32})
        for (int64_t N : {7, 64, 1000, 1001, 5001, 70001})
            for (int64_t xo : {0, 1, 3}) {
                const int64_t M = 12;
                INFO(dtype_name(dt) << " " << M << "x" << N << ", rows at " << xo);
                std::mt19937 g((uint32_t)(N * 7 + xo));
                std::vector<float> h((size_t)(M * (N + 3)));
                for (auto& v : h) v = (float)(int)(g() % 9) - 4.0f;   // few values: many ties
                auto at = [&](int64_t i, int64_t j) -> float& { return h[(size_t)(i * (N + 3) + xo + j)]; };
                const bool fl = dt != DType::Int32;
                for (int64_t j = 0; j < N; ++j) at(0, j) = fl ? -inf : -4.0f;   // all equal (or -inf)
                for (int64_t j = 0; j < N; ++j) at(1, j) = fl ? inf : 4.0f;
                if (fl) {
                    at(2, N - 1) = nan;                                  // one NaN, last
                    at(3, N / 3) = nan, at(3, N / 2) = nan;              // two: the first wins
                    at(4, 0) = nan;
                }
                at(5, N - 1) = 100.0f;                                   // the max last, the min first
                at(5, 0) = -100.0f;
                for (int64_t j = 0; j < N; ++j) at(6, j) = j % 3 ? 0.0f : -0.0f;   // zeros of both signs tie
                std::vector<int32_t> got[2][2];
                for (int side = 0; side < 2; ++side) {
                    Context& ctx = side ? cpu : gpu;
                    Tensor X = ctx.array(h, {M, N + 3}, dt).slice({Slice::all(), Slice::range(xo, xo + N)});
                    Tensor A = ctx.empty({M, 1}, DType::Int32), B = ctx.empty({M, 1}, DType::Int32);
                    A[all] = argmax(X, 1);
                    B[all] = argmin(X, 1);
                    got[side][0] = A.to_vector<int32_t>();
                    got[side][1] = B.to_vector<int32_t>();
                }
                CHECK(got[0][0] == got[1][0]);
                CHECK(got[0][1] == got[1][1]);
                if (fl) CHECK(got[0][0][3] == (int32_t)(N / 3));
                CHECK(got[0][0][5] == (int32_t)(N - 1));
                CHECK(got[0][1][5] == 0);
                CHECK(got[0][0][6] == 0);
                CHECK(got[0][1][6] == 0);
                ++cases;
            }
    CHECK(cases == 72);
}

// Max and min along rows take a grouped step's extreme at once (max.NaN, min.NaN) and the
// values one by one when that extreme is a NaN or a zero, whose bits depend on the order: a row
// holding a NaN gives NaN, a row whose extreme is a zero of either sign a zero, any other row
// its extreme exactly; so does the max that softmax's sum of exponentials keeps (exposed by a
// row-shaped where). A warp, a block and a cluster a row, every dtype, aligned rows and rows
// out of phase, against the host.
TEST_CASE("gpu: max and min along rows: NaN for a NaN, a zero for a zero extreme, the extreme otherwise") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    int cases = 0;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (int64_t N : {200, 5001, 70001})
            for (int64_t xo : {0, 1}) {
                const int64_t M = 8;
                INFO(dtype_name(dt) << " " << M << "x" << N << ", rows at " << xo);
                std::vector<float> h = random_floats((size_t)(M * (N + 1)), (uint32_t)(N + xo), -8, 8);
                auto at = [&](int64_t i, int64_t j) -> float& { return h[(size_t)(i * (N + 1) + xo + j)]; };
                at(1, N / 3) = f32_from_bits(0x7fc01234u);                        // a NaN with a payload
                for (int64_t j = 0; j < N; ++j) at(2, j) = -std::abs(at(2, j));   // max: a zero
                at(2, N / 4) = 0.0f, at(2, N / 2) = -0.0f;
                for (int64_t j = 0; j < N; ++j) at(3, j) = std::abs(at(3, j));    // min: a zero
                at(3, N / 5) = -0.0f, at(3, 2 * N / 3) = 0.0f;
                for (int64_t j = 0; j < N; ++j) at(4, j) = -inf;                 // -inf and one +inf
                at(4, N - 1) = inf;
                for (int64_t j = 0; j < N; ++j) at(5, j) = j % 2 ? -0.0f : 0.0f;  // zeros only
                at(6, 0) = nan, at(6, N - 1) = -nan;                              // two NaNs
                for (int64_t j = 0; j < N; ++j) at(7, j) = 3.0f;                  // all equal
                for (auto& x : h)
                    if (x == x) x = dt == DType::Float16 ? f16_to_float(float_to_f16(x)) : dt == DType::BFloat16 ? bf16_to_float(float_to_bf16(x)) : x;
                Tensor X = ctx.array(h, {M, N + 1}, dt).slice({Slice::all(), Slice::range(xo, xo + N)});
                Tensor A = ctx.empty({M, 1}), B = ctx.empty({M, 1}), C = ctx.empty({M, 1});
                A[all] = max(X, 1);
                B[all] = min(X, 1);
                C[all] = where(sum(exp(X - max(X, 1)), 1) >= 0.0f, max(X, 1), -1.0f);
                const std::vector<float> a = A.to_vector<float>(), b = B.to_vector<float>(), c = C.to_vector<float>();
                int bad = 0;
                for (int64_t i = 0; i < M; ++i) {
                    bool has_nan = false;
                    float mx = -inf, mn = inf;
                    for (int64_t j = 0; j < N; ++j) {
                        has_nan |= std::isnan(at(i, j));
                        mx = std::max(mx, at(i, j)), mn = std::min(mn, at(i, j));
                    }
                    if (has_nan) {
                        bad += !std::isnan(a[i]) + !std::isnan(b[i]) + (c[i] != -1.0f);
                        continue;
                    }
                    bad += (a[i] != mx) + (b[i] != mn);
                    // exp(+inf - +inf) is NaN: row 4's sum is NaN.
                    bad += c[i] != (std::isinf(mx) ? -1.0f : mx);
                }
                CHECK(bad == 0);
                CHECK(a[2] == 0.0f);
                CHECK(b[3] == 0.0f);
                CHECK((a[5] == 0.0f && b[5] == 0.0f));
                ++cases;
            }
    CHECK(cases == 18);
}

// The kernels convert 16-bit floats two at a time with the hardware's paired conversions and
// fall back to ir/half.hpp's rules when a NaN is among them: every float16 pattern, and float32
// patterns around every float16 and bfloat16 value, NaN payloads included, give the host's bits
// on the vector paths (aligned, contiguous) and the element-by-element ones (a strided view).
TEST_CASE("gpu: 16-bit float conversions give ir/half.hpp's bits for every pattern, paired or not") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    const int64_t n = 1 << 16;
    std::vector<float> halves(n), wide;
    for (int64_t p = 0; p < n; ++p) halves[p] = f16_to_float((uint16_t)p);
    std::mt19937 g(7);
    for (int64_t p = 0; p < n; ++p) {
        const uint32_t u16 = f32_bits(f16_to_float((uint16_t)p)), ub = (uint32_t)p << 16;
        for (uint32_t u : {u16, u16 + 1, u16 - 1, u16 + 0x1000, ub, ub + 0x8000, ub + 0x7fff, (uint32_t)g()})
            wide.push_back(f32_from_bits(u));
    }
    const int64_t m = (int64_t)wide.size();
    for (DType dt : {DType::Float16, DType::BFloat16}) {
        INFO(dtype_name(dt));
        auto round = [&](float x) { return dt == DType::Float16 ? f16_to_float(float_to_f16(x)) : bf16_to_float(float_to_bf16(x)); };
        // 16 -> 32: the patterns as uploaded (the host quiets signalling NaNs).
        Tensor h = ctx.array(halves, {n}, dt), f = ctx.empty({n}, DType::Float32);
        f[all] = h;
        std::vector<float> got = f.to_vector<float>();
        int bad = 0;
        for (int64_t p = 0; p < n; ++p) bad += f32_bits(got[p]) != f32_bits(round(halves[p]));
        CHECK(bad == 0);
        // 32 -> 16, contiguous (paired) and through a stride-2 view (one at a time).
        Tensor w = ctx.array(wide, {m}, DType::Float32), o = ctx.empty({m}, dt), o2 = ctx.empty({m / 2, 2}, dt);
        o[all] = w;
        o2[all] = ctx.array(wide, {2, m / 2}, DType::Float32).transpose();
        std::vector<float> a = o.to_vector<float>(), b = o2.to_vector<float>();
        bad = 0;
        for (int64_t i = 0; i < m; ++i) {
            bad += f32_bits(a[i]) != f32_bits(round(wide[i]));
            bad += f32_bits(b[(i % (m / 2)) * 2 + i / (m / 2)]) != f32_bits(round(wide[i]));
        }
        CHECK(bad == 0);
    }
}

// A row kernel's grouped steps convert 16-bit floats with the hardware when the step holds no
// NaN and exactly when it does: every float16 pattern, read in a first pass (argmax) and again
// from the row cache (the selected value, bits unchanged), comes out as ir/half.hpp widens it.
TEST_CASE("gpu: row kernels widen every 16-bit pattern exactly, NaN payloads included, in every pass") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    const int64_t n = 1 << 16;
    std::vector<float> halves(n);
    for (int64_t p = 0; p < n; ++p) halves[p] = f16_to_float((uint16_t)p);
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (int64_t cols : {256, 4096, 32768}) {
            INFO(dtype_name(dt) << ", rows of " << cols);
            auto round = [&](float x) {
                return dt == DType::Float16 ? f16_to_float(float_to_f16(x)) : bf16_to_float(float_to_bf16(x));
            };
            Tensor h = ctx.array(halves, {n / cols, cols}, dt), f = ctx.empty({n / cols, cols}, DType::Float32);
            f[all] = where(argmax(h, 1) >= 0, h, 0.0f);
            const std::vector<float> got = f.to_vector<float>();
            int bad = 0;
            for (int64_t p = 0; p < n; ++p) bad += f32_bits(got[p]) != f32_bits(round(halves[p]));
            CHECK(bad == 0);
        }
}

TEST_CASE("gpu: each kernel reads what the kernels before it wrote, launched back to back (programmatic launch)") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    // Row maxima (a warp, a block or a cluster of blocks per row), column minima, full sums and
    // elementwise updates, each its own kernel reading the output of the one before it (which it
    // may start before, on sm_90) and writing what that one read, 12 rounds with nothing
    // synchronised in between. Small integers keep every value exact in float32, so a read of
    // a stale or half-written buffer shows as a wrong element or sum.
    struct Case { int64_t M, N; };
    for (Case s : {Case{4096, 24}, Case{256, 3000}, Case{4, 100000}}) {   // sums stay below 2^24
        const int64_t M = s.M, N = s.N;
        INFO(M << "x" << N);
        std::mt19937 g(uint32_t(M + N));
        std::vector<float> h(static_cast<size_t>(M * N));
        for (auto& x : h) x = float(int(g() % 17) - 8);
        constexpr int kRounds = 12;
        Tensor a = ctx.array(h, {M, N}), rmax = ctx.empty({M, 1}), cmin = ctx.empty({1, N}), sums = ctx.empty({kRounds, 1});
        std::vector<double> ref(h.begin(), h.end()), ref_sums(kRounds);
        for (int r = 0; r < kRounds; ++r) {
            rmax.assign(max(a.expr(), 1));
            a.assign(rmax.expr() - a.expr() + double(r % 3));
            cmin.assign(min(a.expr(), 0));
            a.assign(a.expr() - cmin.expr());
            sums.slice({Slice::range(r, r + 1), Slice::all()}).assign(sum(a.expr()));
            std::vector<double> row_max(size_t(M), -1e30), col_min(size_t(N), 1e30);
            for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) row_max[size_t(i)] = std::max(row_max[size_t(i)], ref[size_t(i * N + j)]);
            for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) {
                    double& v = ref[size_t(i * N + j)];
                    v = row_max[size_t(i)] - v + r % 3;
                    col_min[size_t(j)] = std::min(col_min[size_t(j)], v);
                }
            double total = 0;
            for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) total += ref[size_t(i * N + j)] -= col_min[size_t(j)];
            ref_sums[size_t(r)] = total;
        }
        const std::vector<float> got = a.to_vector<float>(), got_sums = sums.to_vector<float>();
        size_t wrong = 0;
        for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != ref[i];
        CHECK(wrong == 0);
        for (int r = 0; r < kRounds; ++r) CHECK(got_sums[size_t(r)] == ref_sums[size_t(r)]);
    }
}

TEST_CASE("gpu: a result does not depend on the run (deterministic reductions)") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    Tensor A = ctx.array(random_floats(3 * 100000, 9), {3, 100000}), r = ctx.empty({3, 1}), s = ctx.empty({1, 1});
    // Columns split into chunks and a full sum whose partials the last block to end combines: a
    // column variance and sum, of 100000 x 3 and 100000 x 200.
    Tensor B = ctx.array(random_floats(100000 * 200, 10), {100000, 200}), c = ctx.empty({1, 3}), d = ctx.empty({1, 200});
    const Tensor Bt = B.slice({Slice::all(), Slice::range(0, 3)});
    auto run = [&] {
        r[all] = var(A, 1);
        s[all] = sum(A);
        c[all] = var(Bt, 0);
        d[all] = sum(B, 0);
    };
    run();
    const std::vector<float> r0 = r.to_vector<float>(), s0 = s.to_vector<float>(), c0 = c.to_vector<float>(),
                             d0 = d.to_vector<float>();
    // (against float64: the combine ran, on every column)
    const std::vector<float> hb = B.to_vector<float>();
    std::vector<double> dsum(200, 0.0);
    for (size_t i = 0; i < hb.size(); ++i) dsum[i % 200] += hb[i];
    for (size_t j = 0; j < 200; ++j) CHECK(std::fabs(d0[j] - dsum[j]) <= 1e-3 * std::sqrt(100000.0) + 1e-5 * std::fabs(dsum[j]));
    for (int i = 0; i < 20; ++i) {
        run();
        CHECK(r.to_vector<float>() == r0);
        CHECK(s.to_vector<float>() == s0);
        CHECK(c.to_vector<float>() == c0);
        CHECK(d.to_vector<float>() == d0);
    }
}

TEST_CASE("gpu: column reductions of few chunks combine in their one launch, every run alike") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    // Chunks per column block (detail::kColumnCombineChunks at most, so the last block to finish
    // combines them): 2 (1024 x 8192 float32), 4 and a ragged last column block (2048 x 4100
    // float32, 1024 x 8200 float16).
    for (auto [n, C, dt] : {std::tuple<int64_t, int64_t, DType>{1024, 8192, DType::Float32}, {2048, 4100, DType::Float32},
                            {1024, 8200, DType::Float16}}) {
        INFO(n << "x" << C << " " << dtype_name(dt));
        const std::vector<float> h = random_floats((size_t)(n * C), (uint32_t)(n * 7 + C));
        const std::vector<float> x = cpu.array(h, {n, C}, dt).to_vector<float>();
        std::vector<double> sum(C), sq(C), mag(C);
        std::vector<int> arg(C, 0);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t c = 0; c < C; ++c) {
                const double v = x[(size_t)(i * C + c)];
                sum[c] += v, mag[c] += std::fabs(v);
                if (v > x[(size_t)(arg[c] * C + c)]) arg[c] = (int)i;
            }
        for (int64_t i = 0; i < n; ++i)
            for (int64_t c = 0; c < C; ++c) {
                const double d = x[(size_t)(i * C + c)] - sum[c] / n;
                sq[c] += d * d;
            }
        Tensor X = gpu.array(h, {n, C}, dt), s = gpu.empty({1, C}), v = gpu.empty({1, C}), a = gpu.empty({1, C}, DType::Int32);
        // (columns 1.. of X: off the 16-byte groups, so the entry of a point a thread)
        const Tensor Xs = X.slice({Slice::all(), Slice::range(1, C)});
        Tensor s1 = gpu.empty({1, C - 1});
        auto run = [&] {
            s[all] = kiln::sum(cast(X.expr(), DType::Float32), 0, true);
            v[all] = var(cast(X.expr(), DType::Float32), 0, true);
            a[all] = argmax(X, 0, true);
            s1[all] = kiln::sum(cast(Xs.expr(), DType::Float32), 0, true);
        };
        const uint64_t launches = cuda::cuda_backend(gpu).counters().launches;
        run();
        CHECK(cuda::cuda_backend(gpu).counters().launches - launches == 4);   // one each
        const std::vector<float> s0 = s.to_vector<float>(), v0 = v.to_vector<float>(), s10 = s1.to_vector<float>();
        const std::vector<int32_t> a0 = a.to_vector<int32_t>();
        for (int64_t c = 0; c < C; ++c) {
            CHECK(std::fabs(s0[c] - sum[c]) <= 1e-6 * mag[c] + 1e-6);
            CHECK(std::fabs(v0[c] - sq[c] / n) <= 1e-5 * sq[c] / n + 1e-6);
            CHECK(a0[c] == arg[c]);
            if (c > 0) CHECK(std::fabs(s10[c - 1] - sum[c]) <= 1e-6 * mag[c] + 1e-6);
        }
        for (int i = 0; i < 10; ++i) {
            run();
            CHECK(s.to_vector<float>() == s0);
            CHECK(v.to_vector<float>() == v0);
            CHECK(a.to_vector<int32_t>() == a0);
            CHECK(s1.to_vector<float>() == s10);
        }
    }
}

TEST_CASE("gpu: stochastic rounding draws the same bits as the CPU backend") {
    REQUIRE_GPU();
    std::vector<float> f = random_floats(100000, 21);
    auto run = [&](const char* device) {
        Context ctx(ContextOptions{device, 99, DType::Float32, 10});
        Tensor a = ctx.array(f, {100, 1000}), h = ctx.empty({100, 1000}, DType::Float16), b = ctx.empty({100, 1}, DType::BFloat16);
        h[all] = a * 1.37f;
        b[all] = sum(a, 1) * 0.01f;
        return std::make_pair(h.to_vector<float>(), b.to_vector<float>());
    };
    auto [hc, bc] = run("cpu");
    auto [hg, bg] = run("cuda");
    CHECK(hg == hc);
    // Sums in another order may differ in their last bits before rounding: compare loosely.
    for (size_t i = 0; i < bc.size(); ++i) CHECK(std::abs(bg[i] - bc[i]) <= std::abs(bc[i]) * 0.01f + 1e-6f);
}

TEST_CASE("gpu: timing marks are CUDA events on the context's stream") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    Tensor a = ctx.zeros({4096, 4096}, DType::Float32);
    Mark start = ctx.init_mark(), end = ctx.init_mark();
    ctx.record_mark(start);
    for (int i = 0; i < 10; ++i) a = a * 1.5f + 1.0f;
    ctx.record_mark(end);
    ctx.synchronize_mark(end);
    double ms = ctx.elapsed_ms(start, end);
    CHECK(ms > 0.05);   // 10 passes over 64 MiB: far above an empty stream's
    CHECK(ms < 10000);
}

// Bench mode on a GPU: the time between two events around the call's work, the rate from it.
TEST_CASE("gpu: bench mode times assignments and products with CUDA events") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    Tensor a = ctx.ones({4096, 4096}, DType::Float32), b = ctx.empty({4096, 4096});
    Tensor A = ctx.ones({2048, 2048}, DType::Float16), B = ctx.ones({2048, 2048}, DType::Float16),
           C = ctx.empty({2048, 2048}, DType::Float16);
    b.assign(a * 2.0f);   // compiled before bench mode, so that the timed call is the kernel alone
    compound_dot(A, B, C);
    ctx.synchronize();
    ctx.set_bench(true);
    b.assign(a * 2.0f);
    compound_dot(A, B, C);
    const std::vector<BenchRecord> log = ctx.bench_log();
    REQUIRE(log.size() == 2);
    CHECK(log[0].op == "assign");
    CHECK(log[0].bytes == 2.0 * 4096 * 4096 * 4);
    CHECK(log[0].ms > 0.005);   // 128 MiB moved: at least tens of microseconds
    CHECK(log[0].bytes / (log[0].ms * 1e-3) < 20e12);   // and no faster than any HBM
    CHECK(log[1].op == "compound_dot");
    CHECK(log[1].flops == 2.0 * 2048 * 2048 * 2048);
    CHECK(log[1].ms > 0.001);
    CHECK(log[1].flops / (log[1].ms * 1e-3) < 5e15);
    CHECK(b.to_vector<float>()[5] == 2.0f);
}

// The precompiled histogram kernel counts as the CPU does: every dtype, special values
// (zeros, NaN, infinities, subnormals, the largest float, both sides of sqrt(2)'s significand),
// a strided view, a tensor of many blocks, bins within the normal exponents (the carry form,
// hist_bin.cuh) and bins past them at either end (the general rule), at the edges of both.
TEST_CASE("gpu: hist counts as the CPU path does") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    std::mt19937 g(11);
    std::uniform_real_distribution<float> e(-70.0f, 70.0f), s(-1.0f, 1.0f);
    std::vector<float> h(3 << 20);
    for (auto& x : h) x = std::copysign(std::exp2(e(g)), s(g));
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7fc00000u, 0xffc00001u, 0x7f800000u, 0xff800000u,
                                0x00000001u, 0x00400000u, 0x007fffffu, 0x80400000u, 0x00800000u, 0x7f7fffffu,
                                0x3fb504f3u, 0x3fb504f4u, 0x3fb504f5u, 0x3fc00000u, 0x40200000u, 0x0fb504f4u};
    for (size_t i = 0; i < std::size(special); ++i) {   // in row 0, and in row 1 where the strided view sees them
        std::memcpy(&h[3 * i], &special[i], 4);
        std::memcpy(&h[1024 + 2 * i], &special[i], 4);
    }
    for (auto [bins, offset] : {std::pair{64, -48}, {16, -8}, {1, 0}, {255, -126}, {256, -126}, {300, -160}, {64, 100},
                                {64, 65}, {4096, -1000}})
        for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
            for (bool strided : {false, true}) {
                INFO(dtype_name(dt) << (strided ? " strided" : "") << " bins " << bins << " offset " << offset);
                set_hist_buffers(gpu, bins, offset);
                set_hist_buffers(cpu, bins, offset);
                Tensor xg = gpu.array(h, {3 << 10, 1 << 10}, dt), xc = cpu.array(h, {3 << 10, 1 << 10}, dt);
                if (strided) {
                    xg = xg.slice({Slice::range(1, 3 << 10, 3), Slice::range(0, 1 << 10, 2)});
                    xc = xc.slice({Slice::range(1, 3 << 10, 3), Slice::range(0, 1 << 10, 2)});
                }
                const std::vector<int32_t> a = hist(xg, "g").to_vector<int32_t>(), b = hist(xc, "c").to_vector<int32_t>();
                CHECK(a == b);
                int64_t total = 0;
                for (int32_t n : a) total += n;
                CHECK(total == xg.size());
            }
    HistData d = dump_hist_data(gpu);
    CHECK(d.tags.size() == 1);   // the slot taken since the last set_hist_buffers
}

// Named tensors on CUDA are counted by the fused kernels as they store them: every kernel shape
// (row passes with 16-byte stores, row, column and full reductions, elementwise with and
// without the vector path), every float dtype; the counts equal hist() of the stored result.
TEST_CASE("gpu: named tensors are counted in the fused kernels' store path") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"});
    std::mt19937 g(5);
    std::uniform_real_distribution<float> e(-30.0f, 30.0f), s(-1.0f, 1.0f);
    std::vector<float> h(300 * 3001);
    for (auto& x : h) x = std::copysign(std::exp2(e(g)), s(g));
    h[7] = NAN, h[8] = INFINITY, h[9] = 0.0f, h[10] = 1e-41f;
    for (auto [bins, offset] : {std::pair{64, -48}, {9, -3}, {4096, -1000}}) {   // 16 KiB of counters per block
        set_hist_buffers(gpu, bins, offset);
        for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16}) {
            Tensor x = gpu.array(h, {300, 3001}, dt);
            Tensor flat = x.reshape({300 * 3001});
            struct Case {
                const char* name;
                Expr e;
                Shape shape;
            };
            const Case cases[] = {
                {"softmax", softmax(x.expr() * (1.0 / 1024), 1), {300, 3001}},
                {"row sum", sum(x.expr() * (1.0 / 4096), 1, false), {300}},
                {"column sum", sum(x.expr() * (1.0 / 4096), 0, false), {3001}},
                {"full sum", sum(absolute(flat.expr()) * (1.0 / (1 << 20))), {1}},
                {"elementwise", tanh(flat.expr()) * 3.0, {300 * 3001}},
                {"transposed", x.T().expr() * 0.5, {3001, 300}},
            };
            for (const Case& c : cases) {
                INFO(c.name << " " << dtype_name(dt) << " bins " << bins << " offset " << offset);
                Tensor y = gpu.empty(c.shape, dt);
                set_hist_tag(y, "y");
                dump_hist_data(gpu);
                set_hist_named(gpu, true);
                y.assign(c.e);
                set_hist_named(gpu, false);
                hist(y, "check");
                HistData d = dump_hist_data(gpu);
                REQUIRE(d.tags == std::vector<std::string>{"y", "check"});
                const std::vector<int32_t> counts = d.counts.to_vector<int32_t>();
                const std::vector<int32_t> named(counts.begin(), counts.begin() + bins), check(counts.begin() + bins, counts.end());
                CHECK(named == check);
                int64_t total = 0;
                for (int32_t n : named) total += n;
                CHECK(total == y.size());
            }
        }
    }
}

TEST_CASE("gpu: float64, int64, uint64, uint32 and the 16-bit integers compute elementwise exactly as on the CPU, and "
          "reduce along rows, columns, a cluster-long row and whole as the CPU does") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    const int64_t n = (1 << 20) + 37;   // past a grid-stride round, with a tail
    std::mt19937_64 g(7);
    std::vector<double> x(n), y(n);
    std::vector<int64_t> i(n), j(n);
    for (int64_t k = 0; k < n; ++k) {
        x[k] = std::ldexp((double)(g() >> 11) / 9007199254740992.0 - 0.5, (int)(g() % 40) - 20);
        y[k] = std::ldexp((double)(g() >> 11) / 9007199254740992.0 + 0.25, (int)(g() % 8) - 4);
        i[k] = (int64_t)g();
        j[k] = (int64_t)(g() % 2000001) - 1000000;
    }
    auto run = [&](Context& c, auto&& build, DType out_dtype) {
        Tensor X = c.array(x, {n}), Y = c.array(y, {n});
        Tensor I = c.array(i, {n}), J = c.array(j, {n});
        Tensor out = c.empty({n}, out_dtype);
        out.assign(build(Expr(X), Expr(Y), Expr(I), Expr(J)));
        return out;
    };
    auto same_f64 = [&](const char* what, auto&& build, double ulps) {
        INFO(what);
        std::vector<double> a = run(gpu, build, DType::Float64).template to_vector<double>();
        std::vector<double> b = run(cpu, build, DType::Float64).template to_vector<double>();
        size_t bad = 0;
        int64_t first = -1;
        for (int64_t k = 0; k < n; ++k) {
            const bool ok = (std::isnan(a[k]) && std::isnan(b[k])) || a[k] == b[k] ||
                            std::fabs(a[k] - b[k]) <= ulps * std::max(std::numeric_limits<double>::epsilon() * std::fabs(b[k]),
                                                                      std::numeric_limits<double>::denorm_min());
            if (!ok && first < 0) first = k;
            bad += !ok;
        }
        const std::string at = first < 0 ? std::string("none") : fmt::format("first at {}: x {:a} y {:a}: gpu {:a}, cpu {:a}", first, x[first], y[first], a[first], b[first]);
        INFO(at);
        CHECK(bad == 0);
    };
    auto same_i64 = [&](auto&& build, DType t) {
        Tensor a = run(gpu, build, t), b = run(cpu, build, t);
        std::vector<int64_t> av(n), bv(n);
        a.copy_to_host(av.data(), DType::Int64);
        b.copy_to_host(bv.data(), DType::Int64);
        CHECK(av == bv);
    };
    // Exact: arithmetic (never contracted into fused multiply-adds), the double parameter,
    // the division family, min/max, conversions.
    same_f64("arithmetic", [](Expr X, Expr Y, Expr, Expr) { return X * 0.1 + Y / 3.0 - X * Y; }, 0);
    same_f64("division", [](Expr X, Expr Y, Expr, Expr) { return floor_divide(X, Y) + remainder(X, Y) + fmod(X, Y); }, 0);
    same_f64("min/max", [](Expr X, Expr Y, Expr, Expr J) { return maximum(X, Y) - minimum(X, cast(J, DType::Float64)); }, 0);
    same_f64("sqrt", [](Expr, Expr Y, Expr, Expr) { return sqrt(Y); }, 0);
    // The C library's double functions and CUDA's differ by an ulp or two (CUDA's sin and atan2
    // are within 2 ulps, glibc's within 1).
    same_f64("exp", [](Expr X, Expr, Expr, Expr) { return exp(X); }, 4);
    same_f64("log", [](Expr, Expr Y, Expr, Expr) { return log(Y); }, 4);
    same_f64("tanh", [](Expr X, Expr, Expr, Expr) { return tanh(X); }, 4);
    same_f64("sin", [](Expr X, Expr, Expr, Expr) { return sin(X); }, 4);
    same_f64("atan2", [](Expr X, Expr Y, Expr, Expr) { return atan2(X, Y); }, 4);
    same_i64([](Expr, Expr, Expr I, Expr J) { return I * J + bitwise_right_shift(I, Expr(3)) - bitwise_xor(I, J); }, DType::Int64);
    same_i64([](Expr, Expr, Expr I, Expr J) { return floor_divide(I, J) + remainder(I, J); }, DType::Int64);
    same_i64([](Expr X, Expr, Expr I, Expr) { return cast(X * 1e12, DType::Int64) + cast(I, DType::UInt32); }, DType::Int64);
    same_i64([](Expr, Expr, Expr I, Expr J) { return cast(I, DType::Int16) + cast(J, DType::UInt16); }, DType::Int32);
    same_i64([](Expr, Expr, Expr I, Expr J) { return cast(I, DType::UInt32) * cast(J, DType::UInt32) + 7; }, DType::UInt32);
    // uint64: unsigned division, order, shifts and conversions, compared bit for bit.
    auto same_u64 = [&](const char* what, auto&& build) {
        INFO(what);
        Tensor a = run(gpu, build, DType::UInt64), b = run(cpu, build, DType::UInt64);
        std::vector<uint64_t> av(n), bv(n);
        a.copy_to_host(av.data(), DType::UInt64);
        b.copy_to_host(bv.data(), DType::UInt64);
        CHECK(av == bv);
    };
    same_u64("division", [](Expr, Expr, Expr I, Expr J) {
        const Expr u = cast(I, DType::UInt64), v = cast(J, DType::UInt64);
        return floor_divide(u, v) + remainder(u, bitwise_right_shift(u, Expr(7))) + remainder(u, cast(J, DType::UInt32));
    });
    same_u64("order, shifts", [](Expr, Expr, Expr I, Expr J) {
        const Expr u = cast(I, DType::UInt64), v = cast(J, DType::UInt64);
        return maximum(u, v) - minimum(u, v * 3) + cast(u < v, DType::UInt64) + bitwise_right_shift(u, bitwise_and(v, Expr(63)));
    });
    same_u64("conversions", [](Expr X, Expr, Expr I, Expr) {
        return cast(cast(cast(I, DType::UInt64), DType::Float64) * 0.75, DType::UInt64) +
               cast(cast(cast(I, DType::UInt64), DType::Float32), DType::UInt64) + cast(X * 1e15, DType::UInt64);
    });
    // Reductions: integers and every max, min and arg exactly; float64 sums, products and what
    // is built of them within the rounding that their order of summation allows.
    const int64_t rows = 999, cols = 1049;   // odd rows, each in either 16-byte phase
    REQUIRE(rows * cols <= n);               // (the layouts copy their data from the first rows * cols values)
    struct Layout {
        const char* name;
        Shape shape;
        int axis;
    };
    const Layout layouts[] = {{"rows", {rows, cols}, 1}, {"columns", {rows, cols}, 0}, {"whole", {rows * cols}, kAllAxes},
                              {"one long row (a cluster)", {1, rows * cols}, 1}};
    auto reduce = [&](Context& c, const Layout& lay, auto&& build, DType out_dtype, Shape out_shape) {
        const std::vector<double> xs(x.begin(), x.begin() + rows * cols);
        const std::vector<int64_t> is(i.begin(), i.begin() + rows * cols), js(j.begin(), j.begin() + rows * cols);
        Tensor X = c.array(xs, lay.shape), I = c.array(is, lay.shape), J = c.array(js, lay.shape);
        Tensor out = c.empty(out_shape, out_dtype);
        out.assign(build(Expr(X), Expr(I), Expr(J), lay.axis));
        std::vector<double> v(out.size());
        out.copy_to_host(v.data(), DType::Float64);
        return v;
    };
    for (const Layout& lay : layouts) {
        const Shape out_shape = lay.axis == kAllAxes ? Shape{1} : lay.axis == 0 ? Shape{1, lay.shape[1]} : Shape{lay.shape[0], 1};
        // (0 tolerance: exact. Otherwise relative to the CPU's sum of magnitudes along the axis.)
        auto same = [&](const char* what, auto&& build, DType t, bool exact) {
            INFO(lay.name << ": " << what);
            const std::vector<double> a = reduce(gpu, lay, build, t, out_shape), b = reduce(cpu, lay, build, t, out_shape);
            const std::vector<double> mag = reduce(
                cpu, lay, [](Expr X, Expr, Expr, int axis) { return sum(absolute(X), axis); }, DType::Float64, out_shape);
            REQUIRE(a.size() == b.size());
            size_t bad = 0;
            std::string first;
            for (size_t k = 0; k < a.size(); ++k) {
                const double tol = exact ? 0.0 : 1e-12 * std::max(mag[k], std::fabs(b[k]));
                const bool ok = a[k] == b[k] || std::fabs(a[k] - b[k]) <= tol;
                if (!ok && first.empty()) first = fmt::format("first at {}: gpu {:.17g}, cpu {:.17g}", k, a[k], b[k]);
                bad += !ok;
            }
            INFO(first);
            CHECK(bad == 0);
        };
        same("float64 sum", [](Expr X, Expr, Expr, int ax) { return sum(X, ax); }, DType::Float64, false);
        same("float64 mean of squares", [](Expr X, Expr, Expr, int ax) { return mean(X * X, ax) / sum(X * X, ax); },
             DType::Float64, false);
        same("float64 max - min", [](Expr X, Expr, Expr, int ax) { return max(X, ax) - min(X * 3.0, ax); }, DType::Float64,
             true);
        same("float64 argmax, argmin", [](Expr X, Expr, Expr, int ax) { return argmax(X, ax) * 2 + argmin(X, ax); },
             DType::Int64, true);
        same("float64 product", [](Expr X, Expr, Expr, int ax) { return prod(1.0 + X * 1e-7, ax); }, DType::Float64, false);
        same("int64 sum, product", [](Expr, Expr I, Expr J, int ax) { return sum(I, ax) + prod(bitwise_or(J, Expr(1)), ax); },
             DType::Int64, true);
        same("int64 max, min, argmax", [](Expr, Expr I, Expr J, int ax) {
            return max(I, ax) - min(I, ax) + cast(argmax(J, ax), DType::Int64);
        }, DType::Int64, true);
        same("uint32 sum, max", [](Expr, Expr I, Expr, int ax) {
            return sum(cast(I, DType::UInt32), ax) + max(cast(I, DType::UInt32), ax);
        }, DType::Int64, true);
        {
            INFO(lay.name << ": uint64 sum, max, min, argmax");
            auto build = [&](Expr, Expr I, Expr, int ax) {
                const Expr u = cast(I, DType::UInt64);
                return sum(u, ax) + max(u, ax) * 3 + min(u, ax) + cast(argmax(u, ax), DType::UInt64);
            };
            std::vector<std::vector<uint64_t>> got;
            for (Context* c : {&gpu, &cpu}) {
                const std::vector<int64_t> is(i.begin(), i.begin() + rows * cols);
                Tensor I = c->array(is, lay.shape), out = c->empty(out_shape, DType::UInt64);
                out.assign(build(Expr(), Expr(I), Expr(), lay.axis));
                got.emplace_back(out.size());
                out.copy_to_host(got.back().data(), DType::UInt64);
            }
            CHECK(got[0] == got[1]);
        }
        same("int16, uint16", [](Expr, Expr I, Expr J, int ax) {
            return sum(cast(I, DType::Int16), ax) + min(cast(J, DType::UInt16), ax) + cast(argmin(cast(I, DType::Int16), ax), DType::Int64);
        }, DType::Int64, true);
        if (lay.axis == 1) {
            same("float64 variance", [](Expr X, Expr, Expr, int ax) { return var(X * 1e-3, ax); }, DType::Float64, false);
        }
    }

}

TEST_CASE("gpu: assign_together's sibling kernels (column, split column, whole) agree with float64 and the CPU") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    // (rows, columns): a column kernel split across blocks (few columns, many rows), one that is
    // not (many columns), a ragged shape; per columns and whole.
    for (auto [n, C] : {std::pair<int64_t, int64_t>{200003, 24}, {4097, 1040}, {77, 3}}) {
        for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16}) {
            for (bool whole : {false, true}) {
                INFO(n << "x" << C << " " << dtype_name(dt) << (whole ? " whole" : " columns"));
                const std::vector<float> h = random_floats((size_t)(n * C), (uint32_t)(n + C));
                const Shape out = whole ? Shape{1, 1} : Shape{1, C};
                // float64 references of the values as the tensors hold them: sum, sum of
                // squares about 0.25 (with the sums of magnitudes that bound float32's error), max.
                const std::vector<float> x = cpu.array(h, {n, C}, dt).to_vector<float>();
                const size_t outs = whole ? 1 : (size_t)C;
                std::vector<double> sum(outs), sq(outs), mag(outs), mx(outs, -INFINITY);
                for (size_t i = 0; i < x.size(); ++i) {
                    const size_t c = whole ? 0 : i % (size_t)C;
                    sum[c] += x[i], mag[c] += std::fabs(x[i]), sq[c] += (x[i] - 0.25) * (x[i] - 0.25);
                    mx[c] = std::max(mx[c], (double)x[i]);
                }
                for (Context* ctx : {&gpu, &cpu}) {
                    INFO((ctx == &gpu ? "cuda" : "cpu"));
                    Tensor X = ctx->array(h, {n, C}, dt);
                    Tensor A = ctx->empty(out), B = ctx->empty(out), M = ctx->empty(out, dt);
                    const Expr xf = cast(X.expr(), DType::Float32);
                    const uint64_t launches = ctx->counters().launches;
                    const uint64_t cuda_launches = ctx == &gpu ? cuda::cuda_backend(gpu).counters().launches : 0;
                    if (whole)
                        ctx->assign_together({{&A, kiln::sum(xf)}, {&B, kiln::sum(square(xf - 0.25))}, {&M, max(X.expr())}});
                    else
                        ctx->assign_together({{&A, kiln::sum(xf, 0, true)},
                                              {&B, kiln::sum(square(xf - 0.25), 0, true)},
                                              {&M, max(X.expr(), 0, true)}});
                    // One kernel; on the GPU one launch for the whole sums (the last block combines the
                    // partials), two for columns split into chunks (the final entry combines them).
                    CHECK(ctx->counters().launches - launches == 1);
                    if (ctx == &gpu && whole) CHECK(cuda::cuda_backend(gpu).counters().launches - cuda_launches == 1);
                    if (ctx == &gpu && !whole) CHECK(cuda::cuda_backend(gpu).counters().launches - cuda_launches <= 2);
                    const std::vector<float> a = A.to_vector<float>(), b = B.to_vector<float>(), m = M.to_vector<float>();
                    for (size_t c = 0; c < outs; ++c) {
                        CHECK(std::fabs(a[c] - sum[c]) <= 1e-4 * mag[c]);
                        CHECK(std::fabs(b[c] - sq[c]) <= 2e-4 * sq[c]);   // a float32 sum of 200003 terms: ~5e-5 here
                        CHECK(m[c] == (float)mx[c]);
                    }
                }
            }
        }
    }
}
