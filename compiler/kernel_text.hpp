// kernel_text: a kernel IR as one line of text, and back. The text is the body of the kernel's
// cache key (compiler/key.hpp), so it holds everything that makes the kernel: a manifest that
// stores it (KILN_RECORD) lets kiln-warmup regenerate the kernel exactly, for any target,
// without the program that produced it. parse_kernel_text(kernel_text(k)) equals k, name aside
// (the name derives from the key).
#pragma once
#include "compiler/kernel_ir.hpp"

#include <string>
#include <string_view>

namespace kiln {

std::string kernel_text(const kir::Kernel& k);
// Throws kiln::Error (Value) naming the position and what was expected when `text` is not one.
kir::Kernel parse_kernel_text(std::string_view text);

} // namespace kiln
