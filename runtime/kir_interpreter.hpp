// A direct executor of the kernel IR, one point at a time. It is the reference the compiled
// backends are checked against, and what runs expressions when kiln is built without LLVM.
#pragma once
#include "compiler/kernel_ir.hpp"

namespace kiln {

void interpret(const kir::Kernel& k, const kir::LaunchArgs& args);

} // namespace kiln
