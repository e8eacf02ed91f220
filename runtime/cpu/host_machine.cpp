// The CPU backend's target machine and its description (see host_machine.hpp).
#include "runtime/cpu/host_machine.hpp"

#include "ir/error.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"  // LLVM's headers
#include <llvm/Config/llvm-config.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/TargetSelect.h>
#pragma GCC diagnostic pop

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace kiln::cpu {

void init_llvm() {
    static std::once_flag once;
    std::call_once(once, [] {
        llvm::InitializeNativeTarget();
        llvm::InitializeNativeTargetAsmPrinter();
        llvm::InitializeNativeTargetAsmParser();
    });
}

llvm::orc::JITTargetMachineBuilder machine_builder(const std::optional<CpuTarget>& target) {
    init_llvm();
    auto detected = llvm::orc::JITTargetMachineBuilder::detectHost();
    if (!detected) throw InternalError("cpu jit: detecting the host target: " + llvm::toString(detected.takeError()));
    llvm::orc::JITTargetMachineBuilder jtmb = std::move(*detected);
    if (target) {
        jtmb.setCPU(target->cpu);
        jtmb.setFeatures(target->features);
    }
    jtmb.setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
    return jtmb;
}

bool has_avx2(const llvm::orc::JITTargetMachineBuilder& jtmb) {
    const std::vector<std::string>& f = jtmb.getFeatures().getFeatures();
    // Later entries override earlier ones, as in LLVM's own parsing.
    bool on = false;
    for (const std::string& s : f)
        if (s == "+avx2") on = true;
        else if (s == "-avx2") on = false;
    return on;
}

MachineDescription describe_machine(const llvm::orc::JITTargetMachineBuilder& jtmb, const llvm::TargetMachine& tm,
                                    bool vector_math) {
    std::vector<std::string> features = jtmb.getFeatures().getFeatures();
    std::sort(features.begin(), features.end());
    std::string joined;
    for (const std::string& f : features) joined += (joined.empty() ? "" : ",") + f;
    MachineDescription d;
    d.cpu = jtmb.getCPU().empty() ? std::string("generic") : jtmb.getCPU();
    d.llvm_version = LLVM_VERSION_STRING;
    d.text = fmt::format("triple {}\ncpu {}\nfeatures {}\nir-opt O3\ncodegen-opt {}\ncode-model {}\nreloc-model {}\n"
                         "vector-math {}",
                         tm.getTargetTriple().str(), d.cpu, joined, (int)tm.getOptLevel(), (int)tm.getCodeModel(),
                         (int)tm.getRelocationModel(), vector_math ? "libmvec" : "none");
    return d;
}

} // namespace kiln::cpu
