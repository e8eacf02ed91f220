// The POSIX file operations the kernel cache needs, with their failure modes made explicit.
//
// Why it exists: several processes and threads read and write the same cache directory with
// no lock. What keeps that safe is how files are written — a new file with a unique name in
// the destination's directory, renamed over the destination, so a reader opens either the old
// complete file or the new complete one — and how they are read: one open descriptor, whose
// content a later rename cannot change. Keeping those rules here, apart from the entry format
// and the cache's policy, makes them easy to check and to test. Nothing here throws or logs;
// results carry errno values for the caller to report.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::cache {

// Identifies a file (not a path): a rename over the path gives it another identity.
struct FileId {
    uint64_t dev = 0, ino = 0;
    bool operator==(const FileId&) const = default;
};

enum class ReadStatus {
    Ok,
    NotFound,     // no such file (or a parent is missing / not a directory)
    NotRegular,   // a directory, FIFO, device...: never opened for reading beyond open(2)
    TooLarge,     // larger than max_size: not read
    Refused,      // its head did not pass the caller's check: the rest not read
    Error,        // open/fstat/read failed; see error
};

struct ReadResult {
    ReadStatus status = ReadStatus::Error;
    int error = 0;               // errno for NotFound and Error
    std::vector<char> data;      // Ok: the whole file
    FileId id;                   // Ok, NotRegular, TooLarge, Refused: the file that was opened
};

// Whether a file whose first bytes are `head` and whose size is `size` is worth reading whole.
using HeadCheck = std::function<bool(std::span<const char> head, uint64_t size)>;

// Reads a whole regular file through one descriptor. Never blocks on a FIFO. With `check`, the
// first head_bytes (all of a shorter file) are read first and the rest only where check
// accepts them, so that a large file that is not what the caller wants costs one small read.
ReadResult read_file(const std::string& path, size_t max_size, size_t head_bytes = 0, const HeadCheck& check = {});

struct WriteResult {
    bool ok = false;
    int error = 0;               // errno of the failed step
    const char* step = "";       // "create", "write", "fsync", "rename"
};

// Writes `pieces`, concatenated, to a new temporary file in path's directory (see temp_path_for),
// optionally fsyncs it (and then the directory after the rename), and renames it over `path`.
// On failure the temporary file is removed and `path` is untouched. The directory must exist.
WriteResult write_file_atomic(const std::string& path, std::initializer_list<std::span<const char>> pieces, bool sync);

// "<dir>/.tmp.<name>.<pid>.<thread>.<counter>" for path "<dir>/<name>": unique among the
// processes and threads of this host that write into the same directory.
std::string temp_path_for(const std::string& path);
bool is_temp_name(std::string_view filename);

// mkdir -p. True when `path` is a directory afterwards; otherwise *error holds the errno.
bool make_directories(const std::string& path, int* error);

// Unlinks `path` if it still names the file `id` was taken from. Used to drop an entry that
// failed its checks without deleting a good one another process renamed into place since.
bool remove_if_unchanged(const std::string& path, FileId id);

} // namespace kiln::cache
