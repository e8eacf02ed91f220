// The CUDA backend behind the DeviceBackend interface (runtime/backend.hpp): device memory
// from the caching allocator, copies and kernels ordered on the backend's stream, and
// KILN_VALIDATE=cpu's checked launches. Code that launches precompiled kernels (kernels/cuda)
// reaches the CudaBackend itself through cuda_backend().
#pragma once
#include "runtime/backend.hpp"
#include "runtime/cuda/cuda_backend.hpp"

namespace kiln {
class Context;
}

namespace kiln::cuda {

// The CUDA backend `ctx` runs on; throws kiln::InternalError when it runs on another backend.
CudaBackend& cuda_backend(Context& ctx);

} // namespace kiln::cuda
