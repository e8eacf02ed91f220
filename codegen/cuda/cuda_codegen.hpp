// CUDA C for one kernel stage, rendered from the kernel IR (compiler/kernel_ir.hpp).
//
// The source is self-contained: it includes no header at all (16-bit float conversions are
// written out as bit manipulation), so that NVRTC spends its time on the kernel, not on parsing
// the CUDA headers. Every entry point is `extern "C"`, so its name is the kernel's name.
//
// ---- Kernel parameters
//
// Each entry point takes one struct `Args` by value, followed (full reductions only) by two
// extra parameters. With R = max(rank, 1), B = number of buffers, S = max(B * rank, 1),
// NF = max(num_fparams, 1), NI = max(num_iparams, 1):
//
//     struct Args {                      // byte offset
//         long long sizes[R];            // 0                      domain sizes
//         void*     buf[B];              // 8*R                    base pointers (view offset applied)
//         long long strides[S];          // 8*(R+B)                [buffer * rank + dim], in elements
//         float     fp[NF];              // 8*(R+B+S)              fparams
//         int       ip[NI];              // 8*(R+B+S) + 4*NF       iparams
//     };                                 // sizeof: the end of ip rounded up to 8 (alignment 8)
//
// Unused padding slots (rank 0, no params) are zero. `pack_cuda_args` writes exactly these
// bytes; `cuda_args_layout` gives the offsets. With cuLaunchKernel, kernelParams[0] points at
// the packed bytes. Every stride is passed, even those the layout marks 0 or 1 (the code
// uses the constant instead), so the struct depends only on rank, buffers and param counts.
//
// ---- Launch configuration (`plan_cuda_launch` computes it)
//
// Block size is always kCudaBlockSize (256) threads, 1-D; kernels carry
// __launch_bounds__(256) and need no dynamic shared memory. Every kernel loops grid-stride, so
// any grid size >= 1 is correct; the plan's grid sizes are only for speed.
//   - elementwise (no reduced dim), one entry point NAME(Args):
//       one thread per point of the flattened domain; grid = min(ceil(points / 256), kCudaMaxGrid).
//   - reduction with parallel dims, one entry point NAME(Args):
//       one block per point of the P dims, its threads stride over the R points;
//       grid = min(P points, kCudaMaxGrid).
//   - full reduction (Kernel::full_reduce), two entry points launched in order on one stream:
//       NAME_partial(Args, unsigned char* partials, int num_partials), grid = num_partials:
//           partial block b reduces the b-th contiguous chunk of ceil(points / num_partials)
//           points of the flattened R space into record b of `partials`;
//       NAME_final(Args, const unsigned char* partials, int num_partials), grid = 1:
//           combines the records in a fixed order (deterministic) and runs the Point block.
//       `partials` holds num_partials records of 8 * accums.size() bytes; accumulator i sits
//       at byte 8*i of a record: its value (f32 or i32) at +0, its i32 position at +4.
//       num_partials = clamp(ceil(points / kCudaPointsPerPartial), 1, kCudaMaxPartials),
//       independent of the device, so a result does not depend on which GPU computed it.
// A grid of 0 (an empty domain, elementwise or P dims) means: launch nothing.
#pragma once
#include "compiler/kernel_ir.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::codegen {

inline constexpr int kCudaBlockSize = 256;
inline constexpr int64_t kCudaMaxGrid = 65536;
inline constexpr int64_t kCudaPointsPerPartial = 4096;
inline constexpr int64_t kCudaMaxPartials = 1024;

struct CudaSource {
    std::string code;
    std::vector<std::string> entry_points;   // in launch order
};

// Throws InternalError for a Kernel that breaks the rules of kernel_ir.hpp.
CudaSource emit_cuda(const kir::Kernel& k);

// Byte offsets of the Args struct's members (see above) and its size.
struct CudaArgsLayout {
    size_t sizes = 0, buffers = 0, strides = 0, fparams = 0, iparams = 0, total = 0;
};
CudaArgsLayout cuda_args_layout(const kir::Kernel& k);

// The Args struct's bytes for one launch. Throws InternalError when `a` does not match `k`.
std::vector<uint8_t> pack_cuda_args(const kir::Kernel& k, const kir::LaunchArgs& a);

struct CudaLaunch {
    std::string entry;
    uint32_t grid = 0;     // blocks (gridDim.x); 0: nothing to launch
    uint32_t block = kCudaBlockSize;
};

struct CudaLaunchPlan {
    std::vector<CudaLaunch> launches;   // in order, same entries as CudaSource::entry_points
    int num_partials = 0;               // full reductions: the extra parameter of both kernels
    size_t partials_bytes = 0;          // full reductions: scratch size for `partials`
};
CudaLaunchPlan plan_cuda_launch(const kir::Kernel& k, const kir::LaunchArgs& a);

} // namespace kiln::codegen
