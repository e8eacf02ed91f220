// kiln's GEMM kernels against cuBLAS and cuBLASLt on the same GPU, in one run:
//   squares 8192^3, 4096^3, 512^3 and the DeepBench training shapes (with their transposes),
//   for float16, bfloat16, float32 and tf32; each plain (kiln vs cublasGemmEx) and with a fused
//   bias + ReLU (kiln's epilogue vs cuBLASLt's RELU_BIAS epilogue), plus kiln's bias + ReLU +
//   bsum. Prints TFLOP/s, the ratio to cuBLAS, the kernel kiln's selector chose, and the largest
//   difference between kiln's and cuBLAS's results (relative to the largest |C|); writes one
//   JSON object per row to argv[1] (default gemm.json).
// Timing: CUDA events on kiln's stream (cuBLAS runs on the same stream) around batches of
// back-to-back calls, after warm-up; the median of 7 batches, the five calls taking turns (each round
// starting one call later). Operands are uniform in [-1, 1).
// Options: --dtypes f16,bf16,f32,tf32  --only square|deepbench  --quick (fewer, smaller shapes)
//          --shapes MxNxK,...  (only these; shapes not in the list run as nn products, or with
//          a suffix A^T or B^T as that transpose: 4096x4096x4096A^T)
//          --profile (each call a few times, for a profiler).
//          --compare ENTRY,...  (also times the plain product with the first of these kernels that
//          can run it, forced through KILN_GEMM_KERNEL, in turn with the other calls: an A/B of
//          two kernels in one run; printed after the row, in the JSON as "compare_*").
//          --serial  (also times the plain product launched without programmatic dependent
//          launch, KILN_PDL=0, in turn with the other calls; printed after the row, in the
//          JSON as "serial_*").
//          --queued  (each timed batch is queued whole behind a gate before the GPU starts it:
//          times are the GPU's even where the host's cost of a call exceeds the product's; the
//          host's time to issue each call is printed after the row, in the JSON as "host_us").
// Without a usable CUDA device it says why and exits 0.
#include <kiln/kiln.hpp>

#include "ir/storage.hpp"
#include "kernels/cuda/gemm_cuda.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace kiln;

struct Shape3 {
    int64_t m, n, k;
    bool ta, tb;
    const char* set;
};

const std::vector<Shape3> kShapes = {
    {8192, 8192, 8192, false, false, "square"}, {4096, 4096, 4096, false, false, "square"},
    {512, 512, 512, false, false, "square"},
    {1760, 16, 1760, false, false, "deepbench"}, {1760, 128, 1760, false, false, "deepbench"},
    {1760, 7000, 1760, false, false, "deepbench"}, {2560, 64, 2560, false, false, "deepbench"},
    {4096, 128, 4096, true, false, "deepbench"}, {4096, 7000, 4096, false, false, "deepbench"},
    {2560, 7133, 2560, false, true, "deepbench"}, {5124, 9124, 2560, false, false, "deepbench"},
    {35, 8457, 4096, true, false, "deepbench"}, {7680, 5481, 2560, false, true, "deepbench"},
    {3072, 128, 1024, false, false, "deepbench"}, {6144, 16, 2048, true, false, "deepbench"},
    {1024, 700, 512, false, false, "deepbench"}, {512, 8, 500000, false, false, "deepbench"},
    {7680, 16, 2560, false, false, "deepbench"},   // in the targets' list of N <= 128 shapes
    {8448, 48000, 2816, false, false, "deepbench"},
};

void cuda_check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}
void blas_check(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "%s: cuBLAS status %d\n", what, int(s));
        std::exit(1);
    }
}

void* dptr(const Tensor& t) {
    return static_cast<char*>(t.view().storage->data) + t.offset() * dtype_size(t.dtype());
}

bool g_profile = false;   // --profile: run each call a few times, untimed

// --queued: each timed batch waits in the stream behind a gate (cuStreamWaitValue32 on a word
// of mapped host memory) while the host queues it, then the gate opens and the GPU runs the
// batch back to back at its own pace: the time per call is the GPU's, whatever the host's
// cost of a call, which is timed too (the queueing loop, the GPU not consuming meanwhile).
// Without the gate a product shorter than the host's cost of a call measures the host.
struct Gate {
    using WaitValue = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
    WaitValue wait_value = nullptr;
    volatile uint32_t* host = nullptr;
    CUdeviceptr dev = 0;
    uint32_t value = 0;
    std::string why_not;   // empty when usable

    Gate() {
        cudaDriverEntryPointQueryResult found{};
        void* fn = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess) {
            why_not = "the driver has no cuStreamWaitValue32";
            return;
        }
        wait_value = reinterpret_cast<WaitValue>(fn);
        void* h = nullptr;
        void* d = nullptr;
        if (cudaHostAlloc(&h, 64, cudaHostAllocMapped) != cudaSuccess || cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess) {
            why_not = "no mapped host memory";
            return;
        }
        host = static_cast<volatile uint32_t*>(h);
        *host = 0;
        dev = reinterpret_cast<CUdeviceptr>(d);
    }
};
Gate* g_gate = nullptr;   // set by --queued

// Times fs[j] per[j] times in a row on `stream` between events; the host's time to issue them
// goes to *host_ms (per call). Gated (g_gate): the batch is queued behind the gate, which opens
// once it is all issued, or after 0.5 s if issuing blocks (a full launch queue: the batch then
// ran partly at the host's pace, and *gate_timed_out says so).
double time_batch(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, const std::function<void()>& f, int per,
                  double* host_ms, bool* gate_timed_out) {
    std::mutex mu;
    std::condition_variable cv;
    bool issued = false;
    std::thread watchdog;
    uint32_t v = 0;
    if (g_gate) {
        v = ++g_gate->value;
        if (g_gate->wait_value(reinterpret_cast<CUstream>(stream), g_gate->dev, v, CU_STREAM_WAIT_VALUE_GEQ) !=
            CUDA_SUCCESS) {
            std::fprintf(stderr, "cuStreamWaitValue32 failed\n");
            std::exit(1);
        }
        watchdog = std::thread([&] {
            std::unique_lock<std::mutex> lock(mu);
            if (!cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return issued; })) {
                *gate_timed_out = true;
                *g_gate->host = v;
            }
        });
    }
    cudaEventRecord(e0, stream);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < per; ++i) f();
    *host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / per;
    cudaEventRecord(e1, stream);
    if (g_gate) {
        {
            std::lock_guard<std::mutex> lock(mu);
            issued = true;
            *g_gate->host = v;
        }
        cv.notify_one();
        watchdog.join();
    }
    cuda_check(cudaEventSynchronize(e1), "timed batch");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms / per;
}

// Median ms per call of each function, timed by events on `stream` in batches of about 2 ms.
// The functions take turns, batch by batch, for 7 rounds, so a drift in the card's clocks over
// the run (warming up under load) spreads over all of them instead of favouring the first.
// host_ms (when given): the median host time to issue one call, per function.
std::vector<double> time_all(cudaStream_t stream, const std::vector<std::function<void()>>& fs,
                             std::vector<double>* host_ms = nullptr, bool* gate_timed_out = nullptr) {
    std::vector<double> out(fs.size(), 1.0);
    if (host_ms) host_ms->assign(fs.size(), 0.0);
    if (g_profile) {
        for (const auto& f : fs)
            for (int i = 0; i < 3; ++i) f();
        cudaStreamSynchronize(stream);
        return out;
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<int> per(fs.size());
    for (size_t j = 0; j < fs.size(); ++j) {
        for (int i = 0; i < 3; ++i) fs[j]();
        cudaEventRecord(e0, stream);
        fs[j]();
        cudaEventRecord(e1, stream);
        cuda_check(cudaEventSynchronize(e1), "warm-up");
        float one = 0;
        cudaEventElapsedTime(&one, e0, e1);
        // Gated batches stay well inside the driver's queue of pending launches.
        per[j] = std::clamp(int(2.0 / std::max(one, 1e-3f)), 1, g_gate ? 100 : 200);
    }
    std::vector<std::vector<double>> t(fs.size()), h(fs.size());
    bool timed_out = false;
    // Each round starts one call later than the round before: a call is not always timed
    // right after the same one, nor always first or last in its round.
    for (int round = 0; round < 7; ++round)
        for (size_t jj = 0; jj < fs.size(); ++jj) {
            const size_t j = (jj + size_t(round)) % fs.size();
            double host = 0;
            t[j].push_back(time_batch(stream, e0, e1, fs[j], per[j], &host, &timed_out));
            h[j].push_back(host);
        }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    for (size_t j = 0; j < fs.size(); ++j) {
        std::sort(t[j].begin(), t[j].end());
        std::sort(h[j].begin(), h[j].end());
        out[j] = t[j][t[j].size() / 2];
        if (host_ms) (*host_ms)[j] = h[j][h[j].size() / 2];
    }
    if (gate_timed_out) *gate_timed_out = timed_out;
    return out;
}

struct DtypeRun {
    const char* name;
    DType dt;
    bool tf32;
    cudaDataType_t cu;
    cublasComputeType_t compute;
};

// C (row-major M x N) = A . B through cuBLAS's column-major interface: C^T = B^T . A^T.
struct CublasCall {
    cublasOperation_t op_b, op_a;
    int lda, ldb;
};
CublasCall cublas_layout(const Shape3& s) {
    // A stored (M, K) row-major, or (K, M) when A^T; B stored (K, N), or (N, K) when B^T.
    return {s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(s.ta ? s.m : s.k),
            int(s.tb ? s.k : s.n)};
}

struct Lt {
    cublasLtHandle_t h = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 64 << 20;
};

// cuBLASLt with the RELU_BIAS epilogue (bias per column of the row-major C): set up once,
// run() per call.
class LtBiasRelu {
public:
    LtBiasRelu(Lt& lt, cudaStream_t stream, const DtypeRun& d, const Shape3& s, const void* A, const void* B, void* C,
               const void* bias)
        : lt_(lt), stream_(stream), A_(A), B_(B), C_(C) {
        const CublasCall l = cublas_layout(s);
        blas_check(cublasLtMatmulDescCreate(&op_, d.compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
        cublasOperation_t ta = l.op_b, tb = l.op_a;
        cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_RELU_BIAS;
        cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        // Column-major: the first operand is B^T (N x K), the second A^T (K x M), C^T is N x M.
        cublasLtMatrixLayoutCreate(&la_, d.cu, l.op_b == CUBLAS_OP_N ? s.n : s.k, l.op_b == CUBLAS_OP_N ? s.k : s.n, l.ldb);
        cublasLtMatrixLayoutCreate(&lb_, d.cu, l.op_a == CUBLAS_OP_N ? s.k : s.m, l.op_a == CUBLAS_OP_N ? s.m : s.k, l.lda);
        cublasLtMatrixLayoutCreate(&lc_, d.cu, s.n, s.m, s.n);
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt.workspace_bytes,
                                             sizeof lt.workspace_bytes);
        int found = 0;
        cublasLtMatmulAlgoGetHeuristic(lt.h, op_, la_, lb_, lc_, lc_, pref, 1, &heur_, &found);
        ok_ = found > 0;
        cublasLtMatmulPreferenceDestroy(pref);
    }
    ~LtBiasRelu() {
        cublasLtMatrixLayoutDestroy(la_);
        cublasLtMatrixLayoutDestroy(lb_);
        cublasLtMatrixLayoutDestroy(lc_);
        cublasLtMatmulDescDestroy(op_);
    }
    bool ok() const { return ok_; }
    void run() {
        const float one = 1.f, zero = 0.f;
        blas_check(cublasLtMatmul(lt_.h, op_, &one, B_, la_, A_, lb_, &zero, C_, lc_, C_, lc_, &heur_.algo, lt_.workspace,
                                  lt_.workspace_bytes, stream_),
                   "cublasLtMatmul");
    }

private:
    Lt& lt_;
    cudaStream_t stream_;
    const void *A_, *B_;
    void* C_;
    cublasLtMatmulDesc_t op_ = nullptr;
    cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
    cublasLtMatmulHeuristicResult_t heur_{};
    bool ok_ = false;
};

} // namespace

int main(int argc, char** argv) {
    std::string json_path = "gemm.json", only, dtypes = "f16,bf16,f32,tf32", shapes, compare;
    bool quick = false, serial = false, queued = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--dtypes" && i + 1 < argc) dtypes = argv[++i];
        else if (a == "--only" && i + 1 < argc) only = argv[++i];
        else if (a == "--quick") quick = true;
        else if (a == "--profile") g_profile = true;
        else if (a == "--shapes" && i + 1 < argc) shapes = std::string(",") + argv[++i] + ",";
        else if (a == "--compare" && i + 1 < argc) compare = argv[++i];
        else if (a == "--serial") serial = true;
        else if (a == "--queued") queued = true;
        else json_path = a;
    }
    std::unique_ptr<Context> ctxp;
    try {
        ctxp = std::make_unique<Context>(ContextOptions{"cuda"});
    } catch (const Error& e) {
        std::printf("SKIPPED (no usable CUDA device): %s\n", e.what());
        return 0;
    }
    Context& ctx = *ctxp;
    cudaStream_t stream = reinterpret_cast<cudaStream_t>(ctx.stream_handle());
    cublasHandle_t blas;
    blas_check(cublasCreate(&blas), "cublasCreate");
    cublasSetStream(blas, stream);
    Lt lt;
    blas_check(cublasLtCreate(&lt.h), "cublasLtCreate");
    cuda_check(cudaMalloc(&lt.workspace, lt.workspace_bytes), "cudaMalloc");
    void* blas_ws = nullptr;
    cuda_check(cudaMalloc(&blas_ws, 64 << 20), "cudaMalloc");
    cublasSetWorkspace(blas, blas_ws, 64 << 20);

    if (g_profile) std::printf("(--profile: every time below is a placeholder; read the profiler's)\n");
    std::unique_ptr<Gate> gate;   // only with --queued: it pins a word of host memory
    if (queued) {
        gate = std::make_unique<Gate>();
        if (!gate->why_not.empty()) {
            std::fprintf(stderr, "--queued: %s\n", gate->why_not.c_str());
            return 1;
        }
        g_gate = gate.get();
        std::printf("(--queued: times per call are the GPU's, each batch queued behind a gate before it runs)\n");
    }
    const std::vector<DtypeRun> all = {
        {"f16", DType::Float16, false, CUDA_R_16F, CUBLAS_COMPUTE_32F},
        {"bf16", DType::BFloat16, false, CUDA_R_16BF, CUBLAS_COMPUTE_32F},
        {"f32", DType::Float32, false, CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC},
        {"tf32", DType::Float32, true, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32},
    };
    FILE* json = std::fopen(json_path.c_str(), "w");
    std::printf("%-6s %-22s %-5s | %9s %9s %6s | %9s %9s %6s | %9s %6s | %-34s | %8s\n", "dtype", "M x N x K", "op",
                "kiln TF/s", "cuBLAS", "ratio", "kiln+br", "cuBLASLt", "ratio", "+bsum", "cost", "kiln kernel",
                "max diff");
    // --shapes may name products outside the list: they run as nn products.
    std::vector<Shape3> listed = kShapes;
    for (size_t at = 1; at < shapes.size();) {
        const size_t comma = shapes.find(',', at);
        long long m = 0, n = 0, k = 0;
        const std::string item = shapes.substr(at, comma - at);
        const bool ta = item.find("A^T") != std::string::npos, tb = item.find("B^T") != std::string::npos;
        if (std::sscanf(item.c_str(), "%lldx%lldx%lld", &m, &n, &k) == 3 && m > 0 && n > 0 && k > 0 && (ta || tb ||
            std::none_of(kShapes.begin(), kShapes.end(), [&](const Shape3& s) { return s.m == m && s.n == n && s.k == k; })))
            listed.push_back({m, n, k, ta, tb, "custom"});
        at = comma + 1;
    }
    for (const DtypeRun& d : all) {
        // Whole names between commas ("bf16" does not select "f16").
        if (("," + dtypes + ",").find("," + std::string(d.name) + ",") == std::string::npos) continue;
        ctx.set_allow_tf32(d.tf32);
        for (const Shape3& s0 : listed) {
            if (!only.empty() && only != s0.set) continue;
            Shape3 s = s0;
            if (quick && s.m * s.n * s.k > 4096ll * 4096 * 4096) continue;
            const std::string suffix = std::string(s.set) != "custom" ? "" : s.ta ? "A^T" : s.tb ? "B^T" : "";
            const std::string dims_key =
                "," + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + suffix + ",";
            if (!shapes.empty() && shapes.find(dims_key) == std::string::npos) continue;
            const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
            // Operands: A (M, K) or stored (K, M) for A^T, B (K, N) or stored (N, K) for B^T.
            Tensor As = ctx.empty({s.ta ? s.k : s.m, s.ta ? s.m : s.k}, d.dt);
            Tensor Bs = ctx.empty({s.tb ? s.n : s.k, s.tb ? s.k : s.n}, d.dt);
            As.assign(rand(As.shape()) * 2.0 - 1.0);
            Bs.assign(rand(Bs.shape()) * 2.0 - 1.0);
            Tensor A = s.ta ? As.T() : As, B = s.tb ? Bs.T() : Bs;
            Tensor C = ctx.empty({s.m, s.n}, d.dt), Cb = ctx.empty({s.m, s.n}, d.dt);
            Tensor bias32 = ctx.empty({s.n}, DType::Float32), bias_lt = ctx.empty({s.n}, d.dt);
            bias32.assign(rand({s.n}) - 0.5);
            bias_lt.assign(bias32.expr());
            Tensor bsum = ctx.empty({s.m}, DType::Float32);
            // Written by cuBLAS, outside kiln's knowledge.
            Cb.view().storage->written = true;

            DotOptions br;
            br.relu = true;
            br.bias = bias32;
            DotOptions brs = br;
            brs.bsum = bsum;
            const CublasCall l = cublas_layout(s);
            const float one = 1.f, zero = 0.f;
            Tensor Clt = ctx.empty({s.m, s.n}, d.dt);
            Clt.view().storage->written = true;
            LtBiasRelu lt_call(lt, stream, d, s, dptr(As), dptr(Bs), dptr(Clt), dptr(bias_lt));
            const bool lt_ok = lt_call.ok();
            std::vector<std::function<void()>> calls = {
                [&] { compound_dot(A, B, C); },
                [&] { compound_dot(A, B, C, br); },
                [&] { compound_dot(A, B, C, brs); },
                [&] {
                    blas_check(cublasGemmEx(blas, l.op_b, l.op_a, int(s.n), int(s.m), int(s.k), &one, dptr(Bs), d.cu, l.ldb,
                                            dptr(As), d.cu, l.lda, &zero, dptr(Cb), d.cu, int(s.n), d.compute,
                                            CUBLAS_GEMM_DEFAULT),
                               "cublasGemmEx");
                },
            };
            if (lt_ok) calls.push_back([&] { lt_call.run(); });
            // --compare: the first listed kernel that runs this product.
            std::string cmp_entry;
            for (size_t at = 0; !compare.empty() && at != std::string::npos && cmp_entry.empty();) {
                const size_t comma = compare.find(',', at);
                const std::string e = compare.substr(at, comma == std::string::npos ? comma : comma - at);
                at = comma == std::string::npos ? comma : comma + 1;
                setenv("KILN_GEMM_KERNEL", e.c_str(), 1);
                try {
                    compound_dot(A, B, C);
                    cmp_entry = e;
                } catch (const Error&) {
                }
                unsetenv("KILN_GEMM_KERNEL");
            }
            if (!cmp_entry.empty())
                calls.push_back([&] {
                    setenv("KILN_GEMM_KERNEL", cmp_entry.c_str(), 1);
                    compound_dot(A, B, C);
                    unsetenv("KILN_GEMM_KERNEL");
                });
            const size_t serial_at = calls.size();
            if (serial)
                calls.push_back([&] {
                    setenv("KILN_PDL", "0", 1);
                    compound_dot(A, B, C);
                    unsetenv("KILN_PDL");
                });
            std::vector<double> host_ms;
            bool gate_timed_out = false;
            const std::vector<double> t = time_all(stream, calls, &host_ms, &gate_timed_out);
            const double t_kiln = t[0], t_kiln_br = t[1], t_kiln_brs = t[2], t_blas = t[3], t_lt = lt_ok ? t[4] : -1;
            compound_dot(A, B, C);   // plain results for the comparison
            calls[3]();
            // The difference between the two plain results, relative to the largest |C|.
            Tensor diff = ctx.eval(max(absolute(cast(C.expr(), DType::Float32) - cast(Cb.expr(), DType::Float32))));
            Tensor big = ctx.eval(max(absolute(cast(Cb.expr(), DType::Float32))));
            const double rel = double(diff.to_vector<float>()[0]) / std::max(1e-30, double(big.to_vector<float>()[0]));

            char dims[64];
            std::snprintf(dims, sizeof dims, "%lldx%lldx%lld", (long long)s.m, (long long)s.n, (long long)s.k);
            const char* opname = s.ta ? "A^T" : s.tb ? "B^T" : "nn";
            const char* forced = std::getenv("KILN_GEMM_KERNEL");
            const std::string chosen = forced && *forced ? forced : gemm::selected_kernel(A, B, C);
            auto tf = [&](double ms) { return ms > 0 ? flop / ms / 1e9 : 0.0; };
            std::printf("%-6s %-22s %-5s | %9.1f %9.1f %6.2f | %9.1f %9.1f %6.2f | %9.1f %5.1f%% | %-34s | %8.1e\n", d.name,
                        dims, opname, tf(t_kiln), tf(t_blas), t_blas / t_kiln, tf(t_kiln_br), tf(t_lt),
                        lt_ok ? t_lt / t_kiln_br : 0.0, tf(t_kiln_brs), 100.0 * (t_kiln_brs / t_kiln - 1), chosen.c_str(),
                        rel);
            std::fflush(stdout);
            if (json)
                std::fprintf(json,
                             "{\"dtype\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"op\": \"%s\", \"kiln_ms\": %.5f, "
                             "\"cublas_ms\": %.5f, \"kiln_bias_relu_ms\": %.5f, \"cublaslt_bias_relu_ms\": %.5f, "
                             "\"kiln_bias_relu_bsum_ms\": %.5f, \"kiln_tflops\": %.2f, \"cublas_tflops\": %.2f, "
                             "\"max_rel_diff\": %.3e, \"kernel\": \"%s\"}\n",
                             d.name, (long long)s.m, (long long)s.n, (long long)s.k, opname, t_kiln, t_blas, t_kiln_br,
                             t_lt, t_kiln_brs, tf(t_kiln), tf(t_blas), rel, chosen.c_str());
            if (json) std::fflush(json);
            if (queued) {
                std::printf("       host us to issue a call: plain %.2f, bias+relu %.2f, +bsum %.2f (cuBLAS %.2f)%s\n",
                            1e3 * host_ms[0], 1e3 * host_ms[1], 1e3 * host_ms[2], 1e3 * host_ms[3],
                            gate_timed_out ? "; a batch filled the launch queue: its time is partly the host's" : "");
                if (json)
                    std::fprintf(json, "{\"dtype\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"host_us\": [%.3f, %.3f, %.3f, %.3f], "
                                       "\"gate_timed_out\": %s}\n",
                                 d.name, (long long)s.m, (long long)s.n, (long long)s.k, 1e3 * host_ms[0], 1e3 * host_ms[1],
                                 1e3 * host_ms[2], 1e3 * host_ms[3], gate_timed_out ? "true" : "false");
            }
            if (serial) {
                const double t_serial = t[serial_at];
                std::printf("       serial launch %28s %9.1f TFLOP/s, %.3fx the time with dependent launch\n", "",
                            tf(t_serial), t_serial / t_kiln);
                if (json)
                    std::fprintf(json, "{\"dtype\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"serial_ms\": %.5f, "
                                       "\"serial_tflops\": %.2f}\n",
                                 d.name, (long long)s.m, (long long)s.n, (long long)s.k, t_serial, tf(t_serial));
            }
            if (!cmp_entry.empty()) {
                const double t_cmp = t[serial_at - 1];
                std::printf("       compare %-34s %9.1f TFLOP/s, %.3fx the selected kernel\n", cmp_entry.c_str(), tf(t_cmp),
                            t_kiln / t_cmp);
                if (json)
                    std::fprintf(json, "{\"dtype\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"compare_kernel\": \"%s\", "
                                       "\"compare_ms\": %.5f, \"compare_tflops\": %.2f}\n",
                                 d.name, (long long)s.m, (long long)s.n, (long long)s.k, cmp_entry.c_str(), t_cmp, tf(t_cmp));
            }
        }
    }
    // Host cost of one compound_dot call (selection, descriptors, launch), nothing synchronised:
    // what bounds small products issued back to back. (Not with a KILN_GEMM_KERNEL that cannot
    // run it.)
    try {
        ctx.set_allow_tf32(false);
        Tensor a = ctx.empty({512, 512}, DType::Float16), b = ctx.empty({512, 512}, DType::Float16);
        a.assign(rand({512, 512}));
        b.assign(rand({512, 512}));
        Tensor c = ctx.empty({512, 512}, DType::Float16);
        std::vector<double> us;
        for (int rep = 0; rep < 7; ++rep) {
            ctx.synchronize();
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < 200; ++i) compound_dot(a, b, c);
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200);
        }
        ctx.synchronize();
        std::sort(us.begin(), us.end());
        std::printf("host: %.2f us per compound_dot call (512^3 float16, median of 7 x 200 calls)\n", us[3]);
        if (json) std::fprintf(json, "{\"host_us_per_call\": %.3f}\n", us[3]);
    } catch (const Error& e) {
        std::printf("host: not timed: %s\n", e.what());
    }
    if (json) std::fclose(json);
    cublasDestroy(blas);
    cublasLtDestroy(lt.h);
    cudaFree(lt.workspace);
    cudaFree(blas_ws);
    return 0;
}
