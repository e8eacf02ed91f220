// The host side's internal interface between gemm_operands.cpp (the operands' layouts, the
// selector's problem, the operand copies), gemm_launch.cpp (the launch of a chosen kernel) and
// gemm_cuda.cpp (cuda_gemm, the public entry, and KILN_AUTOTUNE): what one of them defines and
// another uses. Internal to the library (namespace detail).
#pragma once
#include "kernels/cuda/gemm_cuda.hpp"
#include "kernels/cuda/gemm_params.hpp"
#include "kernels/cuda/gemm_select.hpp"

#include <cuda.h>

#include <cstdint>
#include <functional>

// The module images, generated at build time (kernels/cuda/meson.build): nvcc fatbins.
extern "C" const unsigned char kiln_gemm_sm80_image[];
extern "C" const unsigned char kiln_gemm_sm90_image[];       // bfloat16 and tf32 entries
extern "C" const unsigned char kiln_gemm_sm90_f16_image[];   // float16 entries

namespace kiln::gemm::detail {

// One operand as a (batch, rows, cols) matrix: strides in elements, batch stride 0 when shared.
struct Mat {
    const char* base = nullptr;   // device address of element (0, 0, 0)
    int64_t s_batch = 0, s_row = 0, s_col = 0;
};
Mat mat(const Tensor& t);

// The device address of t's first element (its view's offset applied).
char* data_of(const Tensor& t);

// t itself where it is contiguous, else a contiguous copy made on ctx (t's own context by
// default): an operand the precompiled kernels read as dense memory.
Tensor contiguous(const Tensor& t, Context& ctx);
inline Tensor contiguous(const Tensor& t) { return contiguous(t, t.context()); }

// A bias of n values as the kernels read it, n adjacent float32 values: `bias` itself where it
// is that, else a float32 copy made on ctx. (The caller keeps the result alive until the launch.)
Tensor float32_bias(const Tensor& bias, int64_t n, Context& ctx);

// 0 < v < 2^31: a size or index the kernels form in 32 bits.
inline bool fits_32_bits(int64_t v) { return v > 0 && v < (int64_t(1) << 31); }

// The kernels' dtype code (gemm_params.hpp) of a tensor dtype.
int gemm_dtype(DType t);

// The selector's choice for a problem, remembered (gemm_operands.cpp).
GemmKernel selection(const GemmProblem& pr);

// The selector's description of C = A . B with operands a and b as they are.
GemmProblem problem_of(const Tensor& A, const Tensor& C, const Mat& a, const Mat& b, const cuda::CudaBackend& be);

// Operand copies (rule 5 of gemm_select.hpp): which operands to copy, the copy, and its layout.
struct Staging {
    bool a = false, b = false;
};
Staging staging(const Tensor& A, const Tensor& B, const Tensor& C, bool need_kmajor, bool plain, double flops,
                const cuda::CudaBackend& be);
Tensor staged_operand(const Tensor& X, bool is_a, bool to_kmajor, cuda::CudaBackend& be);
bool staged_kmajor(const Tensor& X, bool is_a, bool tf32);

// A 3-D tiled TMA descriptor over (inner, outer, batch) elements of dtype dt, boxes of
// box_inner x box_outer in the swizzle as wide as the box's inner bytes; the last few encoded
// on this thread are reused (gemm_launch.cpp).
CUtensorMap tensor_map(const void* base, DType dt, uint64_t inner, uint64_t outer, uint64_t batch, int64_t outer_stride,
                       int64_t batch_stride, uint32_t box_inner, uint32_t box_outer);

// Split-K through global memory (gemm_launch.cpp): `p` storing each slice's raw float32 sums as
// the plane slices[split] (p.m x p.n, contiguous), no epilogue; then the reduction kernel
// (kiln_gemm_reduce_splits), which adds the p.k_splits planes in order and applies p's
// epilogue (and bsum) into p's C.
GemmParams slice_params(const GemmParams& p, void* slices);
void reduce_slices(cuda::CudaBackend& be, const GemmParams& p, const float* slices);

// Whether a kernel of an image built for sm_80 (sm_80 and sm_90 code, compute_80 PTX) launches
// with programmatic stream serialization: only where the GPU runs the image's sm_90 code, which
// waits for the grids before it (gemm_common.cuh); later GPUs compile its compute_80 PTX, which
// cannot.
bool sm80_image_programmatic(const cuda::CudaBackend& be);

// Where a kernel's histogram counters (kHist: `bytes` of them) start in its dynamic shared
// memory: past its own `smem` bytes, 16-byte aligned; -1 where they would not fit beside those
// and f's static shared memory.
int counters_at(cuda::CudaBackend& be, CUfunction f, int smem, int bytes);

// One product with kernel `chosen` as launched (gemm_launch.cpp). With kHist in `p`: true when
// the kernels counted C's values (their counters fit), else the flag is dropped and nothing is
// counted. `col_sums` (float32, N elements): C's column sums as stored, where the kernel adds
// them in its register epilogue (col_sums_in_epilogue); *summed says whether it did.
bool run_kernel(Context& ctx, cuda::CudaBackend& be, const GemmKernel& chosen, GemmParams p, const Mat& a, const Mat& b,
                DType dt, const Tensor* bsum, int c_rank, const Tensor* col_sums = nullptr, bool* summed = nullptr);

// kColSums' last step: `sums` (n values of any float dtype, shaped as the caller's bsum) = the sum
// over the rows of the float32 `partials` (rows x at least n; with `every_8th`, rows 0, 8, ...: a
// block's first of its 8, where the walks and the persistent kernels leave its sums), in row order
// by one JIT reduction: the same bits in every run.
void add_col_partials(const Tensor& partials, bool every_8th, int64_t n, Tensor sums);

// Whether kernel k adds C's column sums in its epilogue (kColSums): a wgmma kernel, unsplit, one
// tile a block (the general kernel) or persistent (its kLeanCols twin: C of the operands' dtype
// dt, both operands K-major, no bsum, at most 32 columns of tiles), not B in registers, into
// 16-bit C through the register epilogue (rows_of_16_bytes), unbatched; not with
// KILN_GEMM_COLSUMS=0 (then the caller reads C again).
bool col_sums_in_epilogue(const GemmKernel& k, const GemmParams& p, DType dt);

// The autotuners' timing (KILN_AUTOTUNE, gemm_launch.cpp): `run` (launches on be's stream)
// once to warm up, then three times between events; the median, in ms.
float median_launch_ms(cuda::CudaBackend& be, const std::function<void()>& run);

} // namespace kiln::gemm::detail
