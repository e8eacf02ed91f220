// KILN_VALIDATE=cpu: every CUDA launch is checked against the CPU backend running the same
// kernel IR on copies of the same inputs. It catches renderer bugs (the CUDA C and the LLVM IR
// are independent printers of one lowering) on real data, at the cost of copying each
// kernel's memory to the host twice; it is a debugging mode, not for production.
#pragma once
#include "runtime/cuda/cuda_backend.hpp"

#include <functional>

namespace kiln::cuda {

// Launches `k` on the GPU with `args` (device pointers), and `run_on_host` with the same
// arguments pointing at host copies of every buffer taken before the launch; compares every
// output element (floats within a relative tolerance set by the dtype, integers exactly) and
// throws kiln::InternalError naming the kernel, the buffer, the first differing elements and
// both values when they differ.
void validate_launch(CudaBackend& gpu, const CudaKernel* k, const kir::LaunchArgs& args,
                     const std::function<void(const kir::LaunchArgs&)>& run_on_host);

} // namespace kiln::cuda
