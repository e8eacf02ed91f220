// LLVM IR for one kernel stage (kir::Kernel), rendered for the CPU backend.
//
// Entry points (C ABI; NAME is kernel.name):
//
//   Kernels without full_reduce:
//     void NAME(const int64_t* sizes, void* const* buffers, const int64_t* strides,
//               const float* fparams, const int32_t* iparams, int64_t begin, int64_t end);
//   runs every P point whose coordinate on the first P dim is in [begin, end), every other P dim
//   over its full range. A kernel without P dims runs once when begin < end.
//
//   full_reduce kernels:
//     void NAME_partial(sizes, buffers, strides, fparams, iparams, int64_t begin, int64_t end,
//                       void* partial);
//   runs the first block (a Loop block) over the R points whose R-dim-0 coordinate is in
//   [begin, end) and writes the state of every accumulator i of that block to
//   partial + kAccStateBytes * i: the value (f32, i32, f64 or i64) at +0, the i32 position
//   (row-major over all R dims, absolute) at +kAccStatePosition.
//     void NAME_final(sizes, buffers, strides, fparams, iparams, const void* partials,
//                     int64_t nchunks);
//   combines `nchunks` consecutive partial records (each kAccStateBytes * accums.size() bytes)
//   in order with the per-element update rules, then runs the remaining blocks.
//
// `sizes` has rank entries, `strides` buffers*rank (in elements), as in kir::LaunchArgs.
#pragma once
#include "compiler/kernel_ir.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"  // LLVM's headers
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <memory>
#include <string>

namespace kiln::codegen {

inline constexpr size_t kAccStateBytes = 16;
inline constexpr size_t kAccStatePosition = 8;
// The version of what a compiled kernel exchanges with the runtime (the entries' arguments, the
// partial records above): part of the CPU disk cache's key, so that an object compiled for
// another layout is never loaded. 2: 16-byte partial records.
inline constexpr int kObjectAbi = 2;

inline std::string partial_entry_name(const std::string& kernel_name) { return kernel_name + "_partial"; }
inline std::string final_entry_name(const std::string& kernel_name) { return kernel_name + "_final"; }

// The module holds the entry points of `k` and declarations of what they call (libm). It has no
// target triple or data layout: the JIT sets them. Throws std::logic_error (kiln::InternalError)
// when the kernel is malformed or the generated IR does not verify.
std::unique_ptr<llvm::Module> emit_llvm(const kir::Kernel& k, llvm::LLVMContext& ctx);

} // namespace kiln::codegen
