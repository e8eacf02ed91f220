// One line of a kernel manifest (KILN_RECORD; docs/warmup.md) as JSON, both ways.
//
// Why it exists: kiln writes manifests, but reads them from outside: a line may have been
// re-serialised by another JSON tool (spaces after ':' and ',', other key orders, \u escapes),
// edited by hand, truncated or damaged. A real JSON library (nlohmann-json, used only in
// manifest_line.cpp) reads and writes them, so every valid JSON spelling of a line reads the
// same, and a line that is not one gets a kiln::Error naming the file, the line and what is valid.
#pragma once
#include "compiler/kernel_text.hpp"

#include <cstddef>
#include <string>
#include <string_view>

namespace kiln {

inline constexpr int kManifestFormat = 1;
// Longer lines are refused unread: kiln writes a kernel text and a few short fields.
inline constexpr size_t kMaxManifestLineLength = kMaxKernelTextLength + 4096;
// Deeper JSON is refused while it is read (a manifest line is one flat object).
inline constexpr int kMaxManifestJsonDepth = 16;

struct ManifestLine {
    int format = kManifestFormat;
    std::string kiln;      // the kiln version that recorded it ("" when the line does not say)
    std::string backend;   // "cuda" or "cpu"
    std::string target;    // "sm_90" for cuda; the recording CPU's label ("cpu-x86_64-avx2") for cpu
    std::string name;      // the kernel's name ("" when the line does not say)
    std::string kernel;    // the kernel text (compiler/kernel_text.hpp), not parsed here
};

// The line's JSON object, without a newline: {"format":1,"kiln":...,"kernel":...}.
std::string manifest_line_json(const ManifestLine& line);

// Reads one line of the manifest `path` (its number `line_number`, from 1). Throws kiln::Error
// (Value) whose message starts "<path>:<line>: " and says what is wrong and what is valid: bad
// JSON (with the column), not an object, a missing field or one of the wrong type, a format
// version this kiln does not read, an unknown backend (with the valid ones), a target that is
// not one. Fields other than the six above are ignored.
ManifestLine parse_manifest_line(std::string_view text, std::string_view path, size_t line_number);

} // namespace kiln
