// Whole-file reads and atomic writes for the disk cache: a writer fills a temporary file in the
// destination's directory, then renames it over the destination, so a reader (in any process)
// sees either the old complete file or the new complete file, never a partial one.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace kiln::cache {

// The file's bytes; nullopt when it does not exist or cannot be read.
std::optional<std::vector<char>> read_file(const std::string& path);

// Writes `bytes` to `path` atomically, creating missing directories. False (with `why`) when any
// step fails; no temporary file is left behind.
bool write_file_atomic(const std::string& path, const char* bytes, size_t n, std::string* why);

} // namespace kiln::cache
