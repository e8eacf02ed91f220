#include "runtime/cuda/validate.hpp"

#include "ir/error.hpp"
#include "runtime/host_convert.hpp"

#include <fmt/ranges.h>

#include <cmath>

namespace kiln::cuda {

namespace {

// The elements a buffer's strides reach over the domain, relative to its base: [lo, hi].
std::pair<int64_t, int64_t> reach(const kir::LaunchArgs& a, size_t buffer, int rank) {
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < rank; ++d) {
        int64_t step = a.strides[buffer * rank + d] * (a.sizes[d] - 1);
        (step < 0 ? lo : hi) += step;
    }
    return {lo, hi};
}

double tolerance(DType t) {
    switch (t) {
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 1.6e-2;
    case DType::Float32: return 1e-4;
    case DType::Float64: return 1e-12;
    default: return 0;
    }
}

// Whether a Gather reads buffer `b`: its elements are then reached through an index the
// strides do not bound, so the host copy of that input takes the buffer's whole allocation.
bool gathered(const kir::Kernel& k, size_t b) {
    for (const kir::Instr& in : k.instrs)
        if (in.op == kir::Op::Gather && in.index == (int)b) return true;
    return false;
}

} // namespace

void validate_launch(CudaBackend& gpu, const CudaKernel* k, const kir::LaunchArgs& args,
                     const std::function<void(const kir::LaunchArgs&)>& run_on_host) {
    const kir::Kernel& kernel = k->kernel;
    for (int64_t s : args.sizes)
        if (s == 0) return gpu.launch(k, args);
    const int rank = kernel.rank;
    struct Copy {
        std::vector<char> bytes;
        int64_t lo = 0;
    };
    std::vector<Copy> host(args.buffers.size());
    kir::LaunchArgs h = args;
    for (size_t b = 0; b < args.buffers.size(); ++b) {
        const size_t es = dtype_size(kernel.buffers[b].dtype);
        auto [lo, hi] = reach(args, b, rank);
        CUdeviceptr base = 0;
        size_t bytes = 0;
        if (!kernel.buffers[b].output && gathered(kernel, b) &&
            (gpu.make_current(), driver().cuMemGetAddressRange(&base, &bytes, (CUdeviceptr)args.buffers[b])) ==
                CUDA_SUCCESS) {
            // Memory the driver does not know as one allocation keeps the strides' reach.
            const int64_t at = (int64_t)((CUdeviceptr)args.buffers[b] - base);
            lo = std::min(lo, -at / (int64_t)es);
            hi = std::max(hi, ((int64_t)bytes - at) / (int64_t)es - 1);
        }
        host[b].lo = lo;
        host[b].bytes.resize((size_t)(hi - lo + 1) * es);
        gpu.download(host[b].bytes.data(), (CUdeviceptr)args.buffers[b] + lo * (int64_t)es, host[b].bytes.size());
        h.buffers[b] = host[b].bytes.data() - lo * (int64_t)es;
    }
    gpu.launch(k, args);
    run_on_host(h);
    for (size_t b = 0; b < args.buffers.size(); ++b) {
        if (!kernel.buffers[b].output) continue;
        const DType t = kernel.buffers[b].dtype;
        const size_t es = dtype_size(t);
        std::vector<char> dev(host[b].bytes.size());
        gpu.download(dev.data(), (CUdeviceptr)args.buffers[b] + host[b].lo * (int64_t)es, dev.size());
        std::string diffs;
        int64_t bad = 0, n = (int64_t)(dev.size() / es);
        double scale = 0;
        for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(load_element(t, host[b].bytes.data() + i * es)));
        const double tol = tolerance(t);
        // Sums in another order differ by a few units of roundoff of the sum's magnitude, not of
        // each result: a value that cancels (x - mean) is held to the scale of the outputs.
        const double floor = kernel.has_reduction() ? scale : 1e-3 * scale;
        for (int64_t i = 0; i < n; ++i) {
            double g = load_element(t, dev.data() + i * es), c = load_element(t, host[b].bytes.data() + i * es);
            bool same = (std::isnan(g) && std::isnan(c)) || g == c ||
                        (tol > 0 && std::fabs(g - c) <= tol * std::max(std::fabs(c), floor));
            if (same) continue;
            if (bad++ < 5) diffs += fmt::format("\n  element {}: cuda {} vs cpu {}", i + host[b].lo, g, c);
        }
        if (bad)
            throw InternalError(fmt::format("KILN_VALIDATE=cpu: kernel {} buffer {} ({}): {} of {} elements differ between "
                                            "cuda and the CPU backend (sizes {}):{}\n{}",
                                            kernel.name, b, dtype_name(t), bad, n, fmt::join(args.sizes, "x"), diffs,
                                            kir::to_string(kernel)));
    }
}

} // namespace kiln::cuda
