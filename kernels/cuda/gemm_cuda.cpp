// compound_dot on CUDA contexts (gemm_cuda.hpp): cuda_gemm, the public entry, builds the
// kernels' parameter block from the tensors and the epilogue's options, copies operands where
// that pays (gemm_operands.cpp), chooses a kernel (the selector, or KILN_AUTOTUNE's timing of
// the candidates) and launches it (gemm_launch.cpp).
#include "kernels/cuda/gemm_cuda.hpp"

#include "compiler/env.hpp"
#include "compiler/log.hpp"
#include "ir/error.hpp"
#include "kernels/cuda/gemm_launch.hpp"
#include "kernels/cuda/gemm_params.hpp"
#include "kernels/cuda/gemm_select.hpp"
#include "runtime/cache/disk_cache.hpp"
#include "runtime/context_impl.hpp"
#include "runtime/cuda/device_backend.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace kiln::gemm {

using namespace detail;

namespace {

// KILN_AUTOTUNE=1: each candidate kernel runs the problem once to warm up and three times
// timed with events; the fastest is kept for this process and in the disk cache, keyed by the
// problem and the device, so later processes skip the timing. The candidates run as the call
// would launch them: into a scratch C of C's dtype, row stride, batch stride and address
// alignment, with the call's epilogue (alpha, beta, bias, ReLU, stochastic rounding) and a
// scratch bsum where the call has one, so that the kernel variants the launch derives from C
// and the epilogue (the lean twins of rule 7, the persistent kernel for 16-bit or float32 C,
// a split's register push) are the ones timed. (Timed into float32 C without an epilogue, a
// product into 16-bit C was tuned on kernels it never ran.) Scratch C is not initialised:
// beta reads whatever it holds, which changes no kernel's time.
thread_local std::vector<AutotuneTiming> last_timings;

GemmKernel autotuned(Context& ctx, cuda::CudaBackend& be, const GemmProblem& pr, const GemmParams& p, const Mat& a,
                     const Mat& b, DType dt, DType c_dtype, const Tensor* bsum, int c_rank, const std::string& key) {
    last_timings.clear();
    const std::vector<GemmKernel> all = gemm_candidates(pr);
    cache::DiskCache* disk = be.disk_cache();
    const cache::DiskCacheKey dkey{"gemm-autotune|" + key, be.target(), be.info().name};
    if (disk)
        if (auto hit = disk->load(dkey)) {
            const std::string entry(hit->begin(), hit->end());
            for (const GemmKernel& k : all)
                if (describe(k) == entry) return k;
        }
    // C's layout where its rows are contiguous (the kernels' conditions read the strides and
    // the address's alignment), else packed: by columns where C's columns are contiguous (the
    // epilogues then store along them), else M x N.
    const int64_t M = p.m, N = p.n, batch = p.batch, es = int64_t(dtype_size(c_dtype));
    const bool same_layout = p.c_sn == 1 && p.c_sm >= N && (batch == 1 || p.c_batch >= M * p.c_sm);
    const bool by_columns = !same_layout && p.c_sm == 1 && p.c_sn != 1;
    const int64_t c_sm = same_layout ? p.c_sm : by_columns ? 1 : N, c_sn = by_columns ? M : 1;
    const int64_t c_batch = same_layout ? p.c_batch : M * N;
    const int64_t misalign = same_layout ? int64_t(reinterpret_cast<uintptr_t>(p.c) % 256) : 0;
    const int64_t c_bytes = ((batch - 1) * c_batch + (M - 1) * c_sm + (N - 1) * c_sn + 1) * es + misalign;
    Tensor scratch = ctx.empty({(c_bytes + 3) / 4}, DType::Float32);
    GemmParams t = p;
    t.c = static_cast<char*>(scratch.view().storage->data) + misalign;
    t.c_sm = c_sm, t.c_sn = c_sn, t.c_batch = c_batch;
    Tensor scratch_bsum;
    if (bsum) scratch_bsum = ctx.empty(bsum->shape(), bsum->dtype());
    const Tensor* sums = bsum ? &scratch_bsum : nullptr;
    Tensor scratch_hist;   // the candidates count too, but not into the caller's slot
    if (p.flags & kHist) {
        scratch_hist = ctx.empty({p.hist_bins}, DType::Int32);
        t.hist = static_cast<uint32_t*>(scratch_hist.view().storage->data);
    }
    GemmKernel best = all.front();
    float best_ms = 1e30f;
    for (const GemmKernel& k : all) {
        const float ms = median_launch_ms(be, [&] { run_kernel(ctx, be, k, t, a, b, dt, sums, c_rank); });
        last_timings.push_back({describe(k) + (last_gemm_launch_lean() ? " lean" : ""), ms});
        log_debug("gemm autotune: {}: {:.4f} ms", last_timings.back().kernel, ms);
        if (ms < best_ms) best_ms = ms, best = k;
    }
    scratch.view().storage->written = true;
    if (bsum) scratch_bsum.view().storage->written = true;
    const std::string entry = describe(best);
    log_info("gemm autotune: {} -> {} ({:.4f} ms)", key, entry, best_ms);
    if (disk) disk->store(dkey, std::vector<char>(entry.begin(), entry.end()));
    return best;
}

std::string problem_key(const GemmProblem& pr) {
    return fmt::format("{}x{}x{} batch {} dtype {} tf32 {} kmajor {}{} tma {}{} sm {} sms {} split {} plain {} c32 {} bsum {}",
                       pr.m, pr.n, pr.k, pr.batch, pr.dtype, pr.tf32, pr.a_kmajor, pr.b_kmajor, pr.a_tma, pr.b_tma, pr.sm,
                       pr.sms, pr.may_split, pr.plain_epilogue, pr.c_f32, pr.bsum);
}

bool autotune_enabled() {
    return env::flag("KILN_AUTOTUNE").value_or(false);
}

} // namespace

std::vector<AutotuneTiming> last_autotune_timings() { return last_timings; }

bool cuda_gemm(const Tensor& A0, const Tensor& B0, Tensor& C, const DotOptions& o, const StoreCount* count,
               const Tensor* col_sums, bool* summed) {
    Context& ctx = C.context();
    Context::Impl& impl = context_impl(ctx);
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    const int r = C.rank();
    const int64_t batch = r == 3 ? C.shape()[0] : 1;
    const int64_t M = C.shape()[r - 2], N = C.shape()[r - 1], K = A0.shape()[A0.rank() - 1];
    if (M > 0x7fffffff || N > 0x7fffffff || K > 0x7fffffff)
        fail(Error::Kind::Value, "compound_dot: {} x {} x {} exceeds the GEMM kernels' 32-bit sizes", M, N, K);
    const double flops = 2.0 * double(M) * double(N) * double(K) * double(batch);
    const bool tf32 = A0.dtype() == DType::Float32 && impl.allow_tf32;
    const Staging st = staging(A0, B0, C, tf32, /*plain=*/o.beta == 0, flops, be);
    const Tensor A = st.a ? staged_operand(A0, /*is_a=*/true, staged_kmajor(A0, true, tf32), be) : A0;
    const Tensor B = st.b ? staged_operand(B0, /*is_a=*/false, staged_kmajor(B0, false, tf32), be) : B0;
    const DType dt = A.dtype();
    const Mat a = mat(A), b = mat(B), c = mat(C);

    GemmParams p{};
    p.a = a.base;
    p.b = b.base;
    p.c = const_cast<char*>(c.base);
    p.a_sm = a.s_row, p.a_sk = a.s_col, p.a_batch = a.s_batch;
    p.b_sk = b.s_row, p.b_sn = b.s_col, p.b_batch = b.s_batch;
    p.c_sm = c.s_row, p.c_sn = c.s_col, p.c_batch = c.s_batch;
    p.m = int32_t(M), p.n = int32_t(N), p.k = int32_t(K), p.batch = int32_t(batch);
    p.alpha = float(o.alpha), p.beta = float(o.beta), p.slope = float(o.slope);
    p.c_dtype = gemm_dtype(C.dtype());
    if (o.relu) p.flags |= kRelu;
    if (o.beta != 0) p.flags |= kBeta;
    Tensor bias;
    if (o.bias) {
        bias = detail::float32_bias(*o.bias, N, ctx);
        p.bias = reinterpret_cast<const float*>(detail::data_of(bias));
        p.flags |= kBias;
    }
    if (impl.stochastic_round_bits > 0 && C.dtype() != DType::Float32) {
        p.sr_bits = impl.stochastic_round_bits;
        p.seed = impl.seed;
        p.counter = impl.rng_counter++;
    }

    if (count) {
        p.hist = static_cast<uint32_t*>(count->counters);
        p.hist_bins = count->bins, p.hist_offset = count->offset;
        p.flags |= kHist;
    }
    GemmProblem pr = problem_of(A, C, a, b, be);
    // The persistent kernel's epilogue: alpha, bias, ReLU, bsum, round to nearest.
    pr.plain_epilogue = pr.plain_epilogue && o.beta == 0 && p.sr_bits == 0;
    pr.bsum = o.bsum.has_value();
    GemmKernel k;
    if (autotune_enabled() && !std::getenv("KILN_GEMM_KERNEL")) {
        static std::mutex mu;
        static std::unordered_map<std::string, GemmKernel> tuned;
        const std::string key = problem_key(pr) + ((p.flags & kHist) ? " hist" : "");
        std::unique_lock<std::mutex> lock(mu);
        auto it = tuned.find(key);
        if (it == tuned.end()) it = tuned.emplace(key, autotuned(ctx, be, pr, p, a, b, dt, C.dtype(), o.bsum ? &*o.bsum : nullptr, r, key)).first;
        k = it->second;
    } else {
        k = selection(pr);
    }
    const bool counted = run_kernel(ctx, be, k, p, a, b, dt, o.bsum ? &*o.bsum : nullptr, r, col_sums, summed);
    C.view().storage->written = true;
    return counted;
}

} // namespace kiln::gemm
