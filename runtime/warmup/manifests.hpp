// kiln-warmup's reading of manifests: every line of every manifest is read as JSON
// (runtime/manifest_line.hpp) and its kernel text parsed (compiler/kernel_text.hpp) before any
// compile starts, so a manifest that is damaged anywhere is refused whole, each bad line named.
#pragma once
#include "compiler/kernel_ir.hpp"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace kiln::warmup {

struct Entry {
    kir::Kernel kernel;
    std::set<std::string> recorded_archs;   // "sm_90", or "cpu" for lines recorded on the CPU backend
};

// The kernels of the manifests by kernel text (a kernel recorded several times counts once).
// Prints each bad line ("<path>:<line>: <what is wrong>"; the first 20) and exits with status 2
// when there is one, or when a file cannot be read to its end.
std::map<std::string, Entry> read_manifests(const std::vector<std::string>& paths);

} // namespace kiln::warmup
