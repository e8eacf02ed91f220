// Launches hist.cu's kernel (hist_cuda.hpp).
#include "kernels/cuda/hist_cuda.hpp"

#include "compiler/log.hpp"
#include "kernels/cuda/gemm_launch.hpp"
#include "ir/storage.hpp"
#include "runtime/cuda/device_backend.hpp"
#include <kiln/context.hpp>

#include <algorithm>
#include <string>

extern "C" const unsigned char kiln_hist_image[];

namespace kiln::gemm {

namespace {
struct HistParams {   // hist.cu's
    const void* x;
    unsigned int* counts;
    long long n;
    int bins;
    int offset;
};
} // namespace

void hist_cuda(const Tensor& x, Tensor& slot, int bins, int offset) {
    cuda::CudaBackend& be = cuda::cuda_backend(x.context());
    const int64_t n = x.size();
    if (n == 0) return;
    HistParams p{detail::data_of(x), reinterpret_cast<unsigned int*>(detail::data_of(slot)), (long long)n, bins, offset};
    const std::string entry = "kiln_hist_" + std::string(dtype_name(x.dtype()));
    CUfunction f = be.precompiled(kiln_hist_image, entry, bins * 4);
    const int64_t blocks = std::clamp<int64_t>((n + 255) / 256, 1, int64_t(be.info().multiprocessors) * 8);
    log_debug("hist: {} values of {} -> {} ({} blocks)", n, dtype_name(x.dtype()), entry, blocks);
    void* params[] = {&p};
    be.launch_precompiled(f, unsigned(blocks), 1, 1, 256, unsigned(bins * 4), params, {});
    slot.view().storage->written = true;
}

} // namespace kiln::gemm
