// The CUDA backend on the seeds' fused expressions, in one run:
//   1. the device's copy bandwidth (driver device-to-device memcpy of 1 GiB, and kiln's own
//      `dst = src` on 256 MiB), the yardstick for everything below;
//   2. variance and batch norm, float32 and float16, at 128x32, 4096x16384, 65536x1024 and
//      1024x65536: median ms, GB/s (bytes read + written once), % of copy bandwidth, and the
//      largest error against a float64 evaluation on the host;
//   3. host dispatch of a cached expression (µs per call, nothing synchronised in the loop) beside
//      the driver's floor for a launch, and the 128x32 batch norm end to end (assign +
//      synchronize);
//   4. JIT latency: cold compile (empty cache directory) of nine new row reductions (the
//      target's) and nine new elementwise structures, beside NVRTC's floor (a new one-line
//      kernel, named apart, each time); disk hit (a new context on that directory); a new plan
//      whose kernel is already loaded (an elementwise structure's third shape, resized from its
//      plan family, as is a row reduction's third batch size; their second planned by the passes),
//      end to end and, for the elementwise one, until the assignment returns;
//   5. a new batch size with the same structure compiles nothing (counters), small launches
//      (the small row entry's own module) aside.
// Times come from the host clock around back-to-back calls bracketed by synchronize(), so a
// kernel's time includes nothing but its own launch, amortised. Prints a table and writes JSON
// (argv[1], default fusion.json). Without a usable CUDA device it says why and exits 0.
#include <kiln/kiln.hpp>

#include "ir/half.hpp"
#include "runtime/cuda/device_backend.hpp"
#include "runtime/cuda/nvrtc.hpp"

#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace kiln;
using Clock = std::chrono::steady_clock;

double since_us(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Per-call ms of `f`: median over batches of `per` back-to-back calls.
double time_ms(Context& ctx, const std::function<void()>& f, int per, int batches = 7) {
    f();
    ctx.synchronize();
    std::vector<double> t;
    for (int b = 0; b < batches; ++b) {
        auto t0 = Clock::now();
        for (int i = 0; i < per; ++i) f();
        ctx.synchronize();
        t.push_back(since_us(t0) / 1000.0 / per);
    }
    return median(t);
}

// Device-to-device memcpy bandwidth through the driver (loaded at run time, as kiln does).
double driver_copy_gbs() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return 0;
    auto sym = [&](const char* n) { return dlsym(lib, n); };
    auto init = (CUresult(*)(unsigned))sym("cuInit");
    auto dev_get = (CUresult(*)(CUdevice*, int))sym("cuDeviceGet");
    auto retain = (CUresult(*)(CUcontext*, CUdevice))sym("cuDevicePrimaryCtxRetain");
    auto set_cur = (CUresult(*)(CUcontext))sym("cuCtxSetCurrent");
    auto alloc = (CUresult(*)(CUdeviceptr*, size_t))sym("cuMemAlloc_v2");
    auto mfree = (CUresult(*)(CUdeviceptr))sym("cuMemFree_v2");
    auto memset = (CUresult(*)(CUdeviceptr, unsigned char, size_t))sym("cuMemsetD8_v2");
    auto copy = (CUresult(*)(CUdeviceptr, CUdeviceptr, size_t))sym("cuMemcpyDtoD_v2");
    auto sync = (CUresult(*)())sym("cuCtxSynchronize");
    CUdevice dev;
    CUcontext ctx;
    if (!init || init(0) || dev_get(&dev, 0) || retain(&ctx, dev) || set_cur(ctx)) return 0;
    const size_t n = size_t(1) << 30;
    CUdeviceptr a = 0, b = 0;
    if (alloc(&a, n) || alloc(&b, n)) return 0;
    memset(a, 0x5a, n);
    std::vector<double> t;
    for (int i = 0; i < 12; ++i) {
        sync();
        auto t0 = Clock::now();
        copy(b, a, n);
        sync();
        if (i >= 2) t.push_back(since_us(t0));
    }
    mfree(a);
    mfree(b);
    return 2.0 * n / median(t) / 1e3;
}

// The driver's own floor for a launch: host µs per cuLaunchKernel of an empty kernel (PTX
// JIT-compiled by the driver), nothing synchronised in the loop, and the same through
// cuLaunchKernelEx with programmatic stream serialisation, as kiln launches on sm_90.
struct LaunchFloor {
    double plain_us = -1, programmatic_us = -1;
    double roundtrip_us = -1;   // one empty kernel launched, then the context synchronised
};
LaunchFloor driver_launch_floor() {
    LaunchFloor f;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return f;
    auto sym = [&](const char* n) { return dlsym(lib, n); };
    auto load = (CUresult(*)(CUmodule*, const void*))sym("cuModuleLoadData");
    auto get = (CUresult(*)(CUfunction*, CUmodule, const char*))sym("cuModuleGetFunction");
    auto launch = (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                               void**, void**))sym("cuLaunchKernel");
    auto launch_ex = (CUresult(*)(const CUlaunchConfig*, CUfunction, void**, void**))sym("cuLaunchKernelEx");
    auto sync = (CUresult(*)())sym("cuCtxSynchronize");
    auto unload = (CUresult(*)(CUmodule))sym("cuModuleUnload");
    static const char ptx[] = ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry kiln_empty() { ret; }\n";
    CUmodule m;
    CUfunction fn;
    if (!load || !launch || load(&m, ptx) || get(&fn, m, "kiln_empty")) return f;
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig cfg{};
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 32, cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    std::vector<double> plain, prog;
    for (int rep = 0; rep < 5; ++rep) {
        sync();
        auto t0 = Clock::now();
        for (int i = 0; i < 10000; ++i) launch(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr);
        plain.push_back(since_us(t0) / 10000);
        sync();
        if (!launch_ex) continue;
        t0 = Clock::now();
        for (int i = 0; i < 10000; ++i) launch_ex(&cfg, fn, nullptr, nullptr);
        prog.push_back(since_us(t0) / 10000);
        sync();
    }
    // The end-to-end floor: what "assign + synchronize" of any kernel cannot beat.
    std::vector<double> trip;
    for (int i = 0; i < 2000; ++i) {
        auto t0 = Clock::now();
        launch(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr);
        sync();
        trip.push_back(since_us(t0));
    }
    f.roundtrip_us = median(trip);
    unload(m);
    f.plain_us = median(plain);
    if (!prog.empty()) f.programmatic_us = median(prog);
    return f;
}

struct Row {
    std::string expr, dtype, shape;
    double ms = 0, gbs = 0, pct = 0, err = 0;
};

}  // namespace

int main(int argc, char** argv) {
    const char* json_path = argc > 1 ? argv[1] : "fusion.json";
    // A fresh cache directory, so the cold-compile numbers are cold; and NVRTC's own disk cache
    // (the CUDA compute cache, which serves a source compiled before, comments aside, in this
    // process or an earlier one) off for the same reason.
    char dir_tmpl[] = "/tmp/kiln-fusion-cache-XXXXXX";
    const std::string cache_dir = mkdtemp(dir_tmpl);
    setenv("KILN_CACHE_DIR", cache_dir.c_str(), 1);
    setenv("CUDA_CACHE_DISABLE", "1", 1);
    std::unique_ptr<Context> owned;
    try {
        owned = std::make_unique<Context>(ContextOptions{"cuda"});
    } catch (const Error& e) {
        std::printf("fusion benchmark: skipped: %s\n", e.what());
        return 0;
    }
    Context& ctx = *owned;
    std::printf("device: %s\n", ctx.device_description().c_str());
    bool ok = true;

    // ---- 1. copy bandwidth
    const double driver_gbs = driver_copy_gbs();
    double kiln_copy_gbs = 0;
    {
        const int64_t n = int64_t(64) << 20;   // 256 MiB of float32
        Tensor src = ctx.full({n}, 1.25, DType::Float32), dst = ctx.empty({n}, DType::Float32);
        const double ms = time_ms(ctx, [&] { dst[all] = src; }, 10);
        kiln_copy_gbs = 2.0 * 4 * n / ms / 1e6;
    }
    const double copy_gbs = std::max(driver_gbs, kiln_copy_gbs);
    std::printf("copy bandwidth: driver memcpy %.0f GB/s, kiln dst = src %.0f GB/s\n", driver_gbs, kiln_copy_gbs);

    // ---- 2. variance and batch norm
    const float eps = 0.001f;
    struct Shape2 { int64_t M, N; };
    const Shape2 shapes[] = {{128, 32}, {4096, 16384}, {65536, 1024}, {1024, 65536}};
    std::vector<Row> rows;
    std::mt19937 gen(11);
    std::uniform_real_distribution<float> dist(-2.0f, 3.0f);
    for (DType dt : {DType::Float32, DType::Float16}) {
        for (auto [M, N] : shapes) {
            std::vector<float> host((size_t)(M * N));
            for (auto& x : host) x = dist(gen);
            if (dt == DType::Float16) for (auto& x : host) x = f16_to_float(float_to_f16(x));
            Tensor A = ctx.array(host, {M, N}, dt), col = ctx.empty({M, 1}, dt), out = ctx.empty({M, N}, dt);
            // float64 reference per row
            std::vector<double> mean(M), var(M);
            for (int64_t i = 0; i < M; ++i) {
                double s = 0, q = 0;
                for (int64_t j = 0; j < N; ++j) s += host[i * N + j];
                mean[i] = s / N;
                for (int64_t j = 0; j < N; ++j) q += (host[i * N + j] - mean[i]) * (host[i * N + j] - mean[i]);
                var[i] = q / N;
            }
            const double es = dtype_size(dt), in_bytes = es * M * N;
            const int per = M * N >= (1 << 24) ? 20 : 200;
            const std::string shape = std::to_string(M) + "x" + std::to_string(N);
            const std::string dname(dtype_name(dt));

            Row v{"variance", dname, shape};
            v.ms = time_ms(ctx, [&] { col[all] = kiln::mean(square(A - kiln::mean(A, 1)), 1); }, per);
            v.gbs = (in_bytes + es * M) / v.ms / 1e6;
            std::vector<float> got = col.to_vector<float>();
            for (int64_t i = 0; i < M; ++i) v.err = std::max(v.err, std::abs(got[i] - var[i]) / var[i]);

            Row b{"batchnorm", dname, shape};
            b.ms = time_ms(ctx, [&] { out[all] = reciprocal(sqrt(kiln::var(A, 1) + eps)) * (A - kiln::mean(A, 1)); }, per);
            b.gbs = 2 * in_bytes / b.ms / 1e6;
            got = out.to_vector<float>();
            for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) {
                    const double e = (host[i * N + j] - mean[i]) / std::sqrt(var[i] + eps);
                    b.err = std::max(b.err, std::abs(got[i * N + j] - e) / (std::abs(e) + 1));
                }
            const double tol = dt == DType::Float32 ? 1e-3 : 1e-2;
            for (Row* r : {&v, &b}) {
                r->pct = 100 * r->gbs / copy_gbs;
                if (!(r->err <= tol)) {
                    std::printf("WRONG: %s %s %s max error %.3g > %.3g\n", r->expr.c_str(), r->dtype.c_str(), r->shape.c_str(),
                                r->err, tol);
                    ok = false;
                }
                rows.push_back(*r);
            }
        }
    }

    // ---- 3. dispatch and tiny latency
    std::vector<float> small(128 * 32);
    {
        std::mt19937 gen(7);
        std::normal_distribution<float> nd(0.5f, 1.0f);
        for (float& x : small) x = nd(gen);
    }
    Tensor A = ctx.array(small, {128, 32}), B = ctx.empty({128, 32}), C = ctx.empty({128, 32});
    for (int i = 0; i < 2000; ++i) B[all] = A * 2.0f + 1.0f;
    ctx.synchronize();
    std::vector<double> disp, disp_pre, tiny;
    const Expr pre = A * 2.0f + 1.0f;
    for (int rep = 0; rep < 5; ++rep) {
        auto t0 = Clock::now();
        for (int i = 0; i < 10000; ++i) B[all] = A * 2.0f + 1.0f;
        disp.push_back(since_us(t0) / 10000);
        ctx.synchronize();
        t0 = Clock::now();
        for (int i = 0; i < 10000; ++i) B.assign(pre);
        disp_pre.push_back(since_us(t0) / 10000);
        ctx.synchronize();
    }
    for (int i = 0; i < 300; ++i) {
        auto t0 = Clock::now();
        C[all] = reciprocal(sqrt(kiln::var(A, 1) + eps)) * (A - kiln::mean(A, 1));
        ctx.synchronize();
        tiny.push_back(since_us(t0));
    }
    const double dispatch_us = median(disp), dispatch_pre_us = median(disp_pre), tiny_us = median(tiny);
    const LaunchFloor floor = driver_launch_floor();

    // ---- 4. JIT latency on expression structures never compiled before: nine elementwise and
    // nine row reductions (the cold-compile target is the row reductions'), each assigned cold
    // and again warm; cold minus warm is the compile and load.
    constexpr int kStructures = 18, kFirstRow = 9;
    auto structures = [](Tensor& X, Tensor& Y, int s) -> Expr {
        switch (s) {
        case 0: return X * 3.0f - 1.0f;
        case 1: return exp(X) + X;
        case 2: return tanh(X) * X + 0.5f;
        case 3: return sqrt(absolute(X)) + X * X;
        case 4: return maximum(X, 0.0f) * 2.0f;
        case 5: return sig(X) - X;
        case 6: return log(absolute(X) + 1.0f) * 3.0f;
        case 7: return X / (absolute(X) + 1.0f);
        case 8: return minimum(X * X, 2.0f) - X;
        case 9: return sum(X * X + 1.0f, 1) + Y;
        case 10: return max(absolute(X), 1);
        case 11: return mean(sqrt(absolute(X)), 1);
        case 12: return sum(exp(X - max(X, 1)), 1);
        case 13: return min(X * 2.0f + 1.0f, 1);
        case 14: return X * reciprocal(sqrt(mean(X * X, 1) + 1e-5f));   // RMS norm
        case 15: return exp(X - max(X, 1)) / sum(exp(X - max(X, 1)), 1);   // softmax
        case 16: return tanh(X) - mean(tanh(X), 1);
        default: return (X - mean(X, 1)) * 2.0f;
        }
    };
    auto reduces = [](int s) { return s >= kFirstRow && s <= 13; };   // a [64, 1] result
    auto first_and_warm = [&](Context& c, int s) {
        Tensor X = c.array(std::vector<float>(4096, 0.5f), {64, 64}), Y = c.empty({64, 64}), Z = c.empty({64, 1});
        Tensor& dst = reduces(s) ? Z : Y;
        Tensor Yz = c.zeros({64, 1}, DType::Float32);
        auto t0 = Clock::now();
        dst[all] = structures(X, Yz, s);
        c.synchronize();
        const double first = since_us(t0);
        t0 = Clock::now();
        dst[all] = structures(X, Yz, s);
        c.synchronize();
        return std::pair<double, double>(first, since_us(t0));
    };
    std::vector<double> cold_ew, cold_row, nvrtc_ew, nvrtc_row, disk;
    for (int s = 0; s < kStructures; ++s) {
        Counters before = ctx.counters();
        auto [first, warm] = first_and_warm(ctx, s);
        Counters after = ctx.counters();
        (s < kFirstRow ? cold_ew : cold_row).push_back((first - warm) / 1000);
        if (after.compiles > before.compiles)
            (s < kFirstRow ? nvrtc_ew : nvrtc_row)
                .push_back((after.compile_ms - before.compile_ms) / double(after.compiles - before.compiles));
    }
    std::vector<double> memory, resized, resized_host, memory_row, resized_row;
    uint64_t disk_hits = 0;
    {
        Context fresh(ContextOptions{"cuda"});
        for (int s = 0; s < kStructures; ++s) {
            auto [first, warm] = first_and_warm(fresh, s);
            disk.push_back((first - warm) / 1000);
        }
        disk_hits = fresh.counters().disk_hits;
        // A new plan (another shape) whose kernel this context has loaded, its operands uploaded
        // before the clock starts: a structure's second shape (the passes plan it, and it checks
        // the structure's plan family) and third (resized from the family without the passes),
        // elementwise and row reductions (a new batch size); `host` also takes the time until the
        // assignment returns (its kernel launched, not waited for).
        auto new_plan_us = [&](int s, int64_t rows, std::vector<double>& into, uint64_t Counters::*counter,
                               std::vector<double>* host = nullptr) {
            Tensor X = fresh.array(std::vector<float>(size_t(rows * 64), 0.5f), {rows, 64}), Y = fresh.empty({rows, 64}), Yz;
            fresh.synchronize();
            const uint64_t c0 = fresh.counters().*counter;
            auto t0 = Clock::now();
            Y[all] = structures(X, Yz, s);
            const double returned_us = since_us(t0);
            fresh.synchronize();
            const double us = since_us(t0);
            if (fresh.counters().*counter > c0) {
                into.push_back(us);
                if (host) host->push_back(returned_us);
            }
        };
        for (int s = 0; s < 8; ++s) {
            new_plan_us(s, 65, memory, &Counters::memory_hits);
            new_plan_us(s, 66, resized, &Counters::plan_resizes, &resized_host);
        }
        for (int s = 14; s < kStructures; ++s) {
            new_plan_us(s, 65, memory_row, &Counters::memory_hits);
            new_plan_us(s, 66, resized_row, &Counters::plan_resizes);
        }
    }
    const double cold_ms = median(cold_row), cold_ew_ms = median(cold_ew), disk_ms = median(disk),
                 memory_us = memory.empty() ? -1 : median(memory), resized_us = resized.empty() ? -1 : median(resized),
                 resized_host_us = resized_host.empty() ? -1 : median(resized_host),
                 memory_row_us = memory_row.empty() ? -1 : median(memory_row),
                 resized_row_us = resized_row.empty() ? -1 : median(resized_row);
    // NVRTC's own floor: a one-line kernel compiled as kiln compiles its kernels (machine code
    // for this device), in this process, after kiln's compiles (the library loaded). Each a
    // kernel of its own, named apart as kiln's kernels are.
    std::vector<double> floor_ms;
    const int sm = kiln::cuda::cuda_backend(ctx).info().sm;
    const long long nonce = (long long)std::chrono::system_clock::now().time_since_epoch().count() % 1000000007LL;
    for (int i = 0; i < 9; ++i) {
        auto t0 = Clock::now();
        const std::string name = "kiln_trivial_" + std::to_string(nonce) + "_" + std::to_string(i);
        kiln::cuda::nvrtc_compile("extern \"C\" __global__ void " + name + "(float* x) { x[threadIdx.x] = " +
                                      std::to_string(nonce * 10 + i) + ".0f; }\n",
                                  name + ".cu", sm);
        floor_ms.push_back(since_us(t0) / 1000);
    }
    const double nvrtc_floor_ms = median(floor_ms), nvrtc_median_ms = nvrtc_row.empty() ? -1 : median(nvrtc_row),
                 nvrtc_ew_ms = nvrtc_ew.empty() ? -1 : median(nvrtc_ew);

    // ---- 5. a new batch size compiles nothing
    uint64_t new_batch_compiles = 0;
    {
        auto bn = [&](int64_t M, int64_t N) {
            Tensor X = ctx.array(std::vector<float>((size_t)(M * N), 0.25f), {M, N}), Y = ctx.empty({M, N});
            X[all] = X + ctx.rand({M, N});
            Y[all] = reciprocal(sqrt(kiln::var(X, 1) + eps)) * (X - kiln::mean(X, 1));
        };
        bn(512, 256);
        const uint64_t c0 = ctx.counters().compiles;
        bn(384, 256);
        bn(512, 300);
        bn(70, 1000);   // (a launch of at most kCudaSmallRowElements takes the small entry, its own module)
        ctx.synchronize();
        new_batch_compiles = ctx.counters().compiles - c0;
        if (new_batch_compiles) ok = false;
    }

    // ---- report
    std::printf("\n%-10s %-8s %-12s %10s %9s %8s %10s\n", "expr", "dtype", "shape", "ms", "GB/s", "% copy", "max err");
    for (const Row& r : rows)
        std::printf("%-10s %-8s %-12s %10.4f %9.1f %7.1f%% %10.2e\n", r.expr.c_str(), r.dtype.c_str(), r.shape.c_str(), r.ms,
                    r.gbs, r.pct, r.err);
    double worst_big = 1e9;
    for (const Row& r : rows)
        if (r.shape != "128x32") worst_big = std::min(worst_big, r.pct);
    auto met = [](bool b) { return b ? "met" : "NOT met"; };
    std::printf("\n%-44s %12s %12s\n", "target", "measured", "");
    std::printf("%-44s %11.1f%% %12s\n", ">= 90% of copy bandwidth (inputs >= 64 MiB)", worst_big, met(worst_big >= 90));
    std::printf("%-44s %10.2f us %12s\n", "host dispatch of a cached expression <= 3 us", dispatch_us, met(dispatch_us <= 3));
    std::printf("%-44s %10.2f us %12s\n", "  (expression built once, assigned 10000x)", dispatch_pre_us, "");
    std::printf("%-44s %10.2f us %12s\n", "  (driver floor: cuLaunchKernel, empty kernel)", floor.plain_us, "");
    std::printf("%-44s %10.2f us %12s\n", "  (driver floor: cuLaunchKernelEx, programmatic)", floor.programmatic_us, "");
    std::printf("%-44s %10.2f us %12s\n", "tiny (128x32 batch norm) end to end <= 5 us", tiny_us, met(tiny_us <= 5));
    std::printf("%-44s %10.2f us %12s\n", "  (driver floor: empty kernel + synchronize)", floor.roundtrip_us, "");
    std::printf("%-44s %10.1f ms %12s\n", "cold compile of a row reduction <= 40 ms", cold_ms, met(cold_ms <= 40));
    std::printf("%-44s %10.1f ms %12s\n", "  (NVRTC alone, median)", nvrtc_median_ms, "");
    std::printf("%-44s %10.1f ms %12s\n", "  (elementwise, median of 9)", cold_ew_ms, "");
    std::printf("%-44s %10.1f ms %12s\n", "  (elementwise, NVRTC alone, median)", nvrtc_ew_ms, "");
    std::printf("%-44s %10.1f ms %12s\n", "  (NVRTC floor: a one-line kernel)", nvrtc_floor_ms, "");
    std::printf("%-44s %10.3f ms %12s\n", "disk hit <= 1 ms (median of 18)", disk_ms, met(disk_ms <= 1));
    std::printf("%-44s %10.2f us %12s\n", "new plan, kernel loaded, end to end <= 10 us", resized_us, met(resized_us >= 0 && resized_us <= 10));
    std::printf("%-44s %10.2f us %12s\n", "  (the same, until the assignment returns)", resized_host_us, "");
    std::printf("%-44s %10.2f us %12s\n", "  (elementwise, a shape the passes plan)", memory_us, "");
    std::printf("%-44s %10.2f us %12s\n", "  (row reduction, a new batch size resized)", resized_row_us, "");
    std::printf("%-44s %10.2f us %12s\n", "  (row reduction, the passes)", memory_row_us, "");
    std::printf("%-44s %13llu %12s\n", "new batch size compiles nothing", (unsigned long long)new_batch_compiles,
                met(new_batch_compiles == 0));
    std::printf("disk hits in the second context: %llu\n", (unsigned long long)disk_hits);

    std::string json = "{\"device\":\"" + ctx.device_description() + "\",\"copy_gbs\":" + std::to_string(copy_gbs) +
                       ",\"driver_copy_gbs\":" + std::to_string(driver_gbs) + ",\"kiln_copy_gbs\":" + std::to_string(kiln_copy_gbs) +
                       ",\"cases\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
        char buf[512];
        std::snprintf(buf, sizeof buf, "%s{\"expr\":\"%s\",\"dtype\":\"%s\",\"shape\":\"%s\",\"ms\":%.6f,\"gbs\":%.2f,"
                      "\"pct_copy\":%.2f,\"max_err\":%.3g}",
                      i ? "," : "", rows[i].expr.c_str(), rows[i].dtype.c_str(), rows[i].shape.c_str(), rows[i].ms, rows[i].gbs,
                      rows[i].pct, rows[i].err);
        json += buf;
    }
    json += "],\"dispatch_us\":" + std::to_string(dispatch_us) + ",\"dispatch_prebuilt_us\":" + std::to_string(dispatch_pre_us) +
            ",\"launch_floor_us\":" + std::to_string(floor.plain_us) +
            ",\"launch_floor_programmatic_us\":" + std::to_string(floor.programmatic_us) +
            ",\"launch_sync_floor_us\":" + std::to_string(floor.roundtrip_us) +
            ",\"tiny_us\":" + std::to_string(tiny_us) + ",\"jit\":{\"cold_ms\":" + std::to_string(cold_ms) +
            ",\"nvrtc_ms\":" + std::to_string(nvrtc_median_ms) + ",\"cold_elementwise_ms\":" + std::to_string(cold_ew_ms) +
            ",\"nvrtc_elementwise_ms\":" + std::to_string(nvrtc_ew_ms) + ",\"nvrtc_floor_ms\":" + std::to_string(nvrtc_floor_ms) +
            ",\"disk_ms\":" + std::to_string(disk_ms) + ",\"memory_us\":" + std::to_string(memory_us) +
            ",\"resized_us\":" + std::to_string(resized_us) + ",\"resized_host_us\":" + std::to_string(resized_host_us) +
            ",\"memory_row_us\":" + std::to_string(memory_row_us) +
            ",\"resized_row_us\":" + std::to_string(resized_row_us) +
            ",\"disk_hits\":" + std::to_string(disk_hits) + "},\"new_batch_compiles\":" + std::to_string(new_batch_compiles) + "}\n";
    if (FILE* f = std::fopen(json_path, "w")) {
        std::fputs(json.c_str(), f);
        std::fclose(f);
    }
    std::printf("json: %s\n", json_path);
    return ok ? 0 : 1;
}
