// A build without LLVM: the host's expressions run on the kernel-IR interpreter.
#include "runtime/host_backend.hpp"

namespace kiln {

std::unique_ptr<DeviceBackend> make_host_backend() { return make_interpreter_backend(); }

} // namespace kiln
