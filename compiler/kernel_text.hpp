// kernel_text: a kernel IR as one line of text, and back. The text is the body of the kernel's
// cache key (compiler/key.hpp), so it holds everything that makes the kernel: a manifest that
// stores it (KILN_RECORD) lets kiln-warmup regenerate the kernel exactly, for any target,
// without the program that produced it. parse_kernel_text(kernel_text(k)) equals k, name aside
// (the name derives from the key).
//
// Reading text from outside (a manifest) must not cost more than the text is worth: the reader
// refuses counts and sizes beyond the limits below before allocating anything for them, then
// checks the kernel against every rule of the kernel IR (compiler/kernel_check.hpp), so a text
// that parses is a kernel every backend can compile. The limits are far above what kiln lowers
// (the kernels of the examples and tests have two to a few buffers, a few parameters, up to
// about a hundred instructions: a draw of rand() is sixty).
#pragma once
#include "compiler/kernel_ir.hpp"

#include <string>
#include <string_view>

namespace kiln {

inline constexpr size_t kMaxKernelTextLength = size_t(8) << 20;   // bytes
inline constexpr int kMaxKernelRank = 64;
inline constexpr int kMaxKernelBuffers = 1024;
inline constexpr int kMaxKernelParams = 4096;      // float parameters, and integer ones
inline constexpr int kMaxKernelInstrs = 65536;
inline constexpr int kMaxKernelAccums = 1024;
inline constexpr int kMaxKernelBlocks = 1024;

std::string kernel_text(const kir::Kernel& k);
// Throws kiln::Error (Value) when `text` is not a kernel kiln could have written: the message
// names the offset and what was expected there, the count beyond its limit, or the rule of
// the kernel IR that the kernel breaks.
kir::Kernel parse_kernel_text(std::string_view text);

} // namespace kiln
