// A build without the CUDA toolkit: the factory says so (runtime/backend.hpp).
#include "runtime/backend.hpp"

#include "ir/error.hpp"

namespace kiln {

std::unique_ptr<DeviceBackend> make_cuda_backend(int, std::unique_ptr<DeviceBackend>) {
    throw Error("this build of kiln has no CUDA backend (built without the CUDA toolkit's NVRTC)", Error::Kind::Runtime);
}

} // namespace kiln
