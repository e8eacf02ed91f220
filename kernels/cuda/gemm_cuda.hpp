// compound_dot on CUDA contexts: kiln's precompiled GEMM kernels (gemm_sm80.cu, gemm_sm90.cu),
// embedded in the library as module images and loaded on first use. The functions here turn
// tensors into the kernels' parameter block (gemm_params.hpp) and TMA descriptors, ask the
// selector (gemm_select.hpp) for a kernel and launch it on the context's stream: gemm_cuda.cpp
// (cuda_gemm, KILN_AUTOTUNE), gemm_operands.cpp (operand layouts and copies) and
// gemm_launch.cpp (the launch).
#pragma once
#include <kiln/gemm.hpp>

#include "kernels/hist_named.hpp"

#include <string>
#include <vector>

namespace kiln::cuda {
class CudaBackend;
}

namespace kiln::gemm {

// C = epilogue(A . B) for C of rank 2, or rank 3 with a leading batch dimension (then A and B
// are rank 3, or rank 2 and shared by every batch entry; bsum is (batch, M) or (batch, M, 1)).
// Operands are checked by the caller; M, N and K are positive and C shares no memory with A
// or B. With `count`, the kernel counts the values it stores to C into it (the general
// epilogue, GemmParams::hist) where its counters fit beside the kernel's shared memory: true
// when it did. With `col_sums` (float32, N elements; a convolution's bsum per channel), the
// kernel adds up C's columns as stored where its epilogue can (col_sums_in_epilogue,
// gemm_launch.hpp) and *summed says whether it did.
bool cuda_gemm(const Tensor& A, const Tensor& B, Tensor& C, const DotOptions& o, const StoreCount* count = nullptr,
               const Tensor* col_sums = nullptr, bool* summed = nullptr);

// The entry point the selector picks for these operands (benchmarks and logs), with " lean"
// where the plain product runs its lean twin (rule 7, gemm_select.hpp).
std::string selected_kernel(const Tensor& A, const Tensor& B, const Tensor& C);

// Whether the last GEMM launched on this thread ran a lean twin (rule 7): what tests check.
bool last_gemm_launch_lean();
// The entry point the last GEMM launched on this thread ran (its twin's, where one ran).
std::string last_gemm_entry();
// Whether the last GEMM launched on this thread counted C into a histogram as it stored it.
bool last_gemm_counted();
// How many blocks shared B's stages in the last GEMM launched on this thread (1: none;
// GemmParams::b_multicast): what tests check.
int last_gemm_b_share();
// The blocks per cluster of the last GEMM launched on this thread (1: no cluster): what tests
// check.
int last_gemm_cluster();
// The blocks of the last GEMM kernel launched on this thread (its grid): what tests check.
int64_t last_gemm_blocks();

// The last KILN_AUTOTUNE timing on this thread (empty where the choice came from the disk
// cache): each candidate as launched (its description, " lean" where its twin ran) and the
// median of its three timed runs, milliseconds. What tests check.
struct AutotuneTiming {
    std::string kernel;
    float ms;
};
std::vector<AutotuneTiming> last_autotune_timings();

// How many clusters of `size` blocks of the sm_90 kernel `entry` (`threads` threads a block,
// `smem` bytes of dynamic shared memory) the backend's GPU runs at once, one block to an SM:
// what decides the launcher's clusters along m (gemm_launch.cpp), and what its test expects.
int clusters_at_once_one_per_sm(cuda::CudaBackend& be, const std::string& entry, int size, int threads, int smem);

} // namespace kiln::gemm
