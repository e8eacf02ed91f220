// Compile policy and kernel manifests, for deployments that compile ahead of time.
//
// KILN_RECORD=path (or Context::record_to) appends every kernel a context compiles or loads to
// a manifest: one JSON object per line,
//   {"format":1,"kiln":"0.1.0","backend":"cuda","target":"sm_90","name":"kiln_...","kernel":"<text>"}
// where "kernel" is the kernel IR as text (compiler/kernel_text.hpp): enough to regenerate the
// kernel for any target without the program. docs/warmup.md has the format; manifest_line.hpp
// reads and writes a line.
//
// KILN_ASSERT_NO_COMPILE=1 makes any JIT compile an error naming the kernel: a deployment with a
// warmed cache fails loudly on a missing kernel instead of waiting for the compiler.
#pragma once
#include "compiler/kernel_ir.hpp"
#include "runtime/manifest_line.hpp"

#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

namespace kiln {

// The environment's KILN_ASSERT_NO_COMPILE (read when a context is created).
bool compile_forbidden_by_env();
// Throws kiln::Error (Runtime) saying that `kernel` would have to be compiled for `target`, and how
// to warm the cache instead. `cache` names where it was looked for.
[[noreturn]] void refuse_compile(const kir::Kernel& kernel, const std::string& target, const std::string& cache);

class ManifestWriter {
public:
    // Opens `path` for appending (created if missing); throws kiln::Error when it cannot.
    explicit ManifestWriter(std::string path);
    // Appends the kernel unless this writer already recorded its key. Thread-safe; each line
    // is one write() on an O_APPEND descriptor, so processes sharing a manifest never interleave.
    void add(const kir::Kernel& kernel, const std::string& key, const std::string& backend, const std::string& target);
    const std::string& path() const { return path_; }
    ~ManifestWriter();

private:
    std::string path_;
    int fd_ = -1;
    std::mutex mu_;
    std::unordered_set<std::string> seen_;
};

} // namespace kiln
