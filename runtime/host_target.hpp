// The CPU backend's target label: the "target" part of every CPU kernel's key and of its
// manifest line ("cpu-x86_64-avx2").
//
// Why it exists: the runtime (Context) and kiln-warmup must compute the same kernel key for the
// same kernel on the same machine, or a warmed entry would never be found. The label is coarse
// on purpose (it names the vector ISA, not the CPU model): the exact CPU, its features and the
// LLVM version are added by the CPU backend's disk key (runtime/cpu/host_machine.hpp). Needs
// no LLVM, so a build without the CPU JIT keys its interpreted kernels the same way.
#pragma once
#include <string>

namespace kiln {

std::string host_target_label();

} // namespace kiln
