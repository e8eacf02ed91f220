// The machine the CPU backend generates code for, and its description for the disk cache key.
//
// Why it exists: an object file holds machine code for one CPU model and feature set, made by one
// LLVM with one set of code generation options; on another CPU it may execute instructions that
// CPU does not have. Everything that changes the bytes LLVM emits is chosen and described here,
// in one place, so the code the JIT generates and the key that guards its object on disk cannot
// disagree. Includes LLVM's headers: for runtime/cpu's .cpp files (cpu_jit.hpp stays free of them).
#pragma once
#include "runtime/cpu/cpu_jit.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"  // LLVM's headers
#pragma GCC diagnostic ignored "-Wredundant-move"
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/Target/TargetMachine.h>
#pragma GCC diagnostic pop

#include <optional>
#include <string>

namespace kiln::cpu {

// LLVM's native target, asm printer and asm parser, registered once per process.
void init_llvm();

// A builder for the host as LLVM detects it (sys::getHostCPUName and the host's feature list),
// or for `target` when it is set; machine code optimised at -O3 (CodeGenOpt::Aggressive).
// Throws kiln::InternalError when LLVM cannot describe the host.
llvm::orc::JITTargetMachineBuilder machine_builder(const std::optional<CpuTarget>& target);

// Whether the builder's features include AVX2: libmvec's vector entry points need it.
bool has_avx2(const llvm::orc::JITTargetMachineBuilder& jtmb);

struct MachineDescription {
    std::string cpu;           // LLVM's CPU model name: "znver3", "sapphirerapids", "x86-64"
    std::string text;          // one "name value" line per property that changes the machine code
    std::string llvm_version;  // "16.0.6"
};

// What the objects made with `tm` (created from `jtmb`) depend on besides the kernel: triple,
// CPU model, the full feature list (sorted: the order LLVM lists them in carries no meaning), the
// IR and machine-code optimisation levels, code and relocation models, and whether loops call
// libmvec's vector math. The kiln version is added by the disk cache itself.
MachineDescription describe_machine(const llvm::orc::JITTargetMachineBuilder& jtmb, const llvm::TargetMachine& tm,
                                    bool vector_math);

} // namespace kiln::cpu
