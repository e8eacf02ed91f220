// Whole-file reads and atomic replacement on POSIX (see file_io.hpp for the rules they keep).
#include "runtime/cache/file_io.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <functional>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kiln::cache {

namespace {

constexpr std::string_view kTempPrefix = ".tmp.";

std::atomic<uint64_t> temp_counter{0};

FileId id_of(const struct stat& st) { return FileId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)}; }

std::string parent_of(const std::string& path) {
    size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

bool write_all(int fd, const char* p, size_t n, int* error) {
    while (n > 0) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            *error = errno;
            return false;
        }
        if (w == 0) {   // no progress and no errno: report it as a full device
            *error = ENOSPC;
            return false;
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

void sync_directory(const std::string& dir) {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    (void)::fsync(fd);   // best effort: some file systems refuse fsync on a directory
    ::close(fd);
}

} // namespace

ReadResult read_file(const std::string& path, size_t max_size, size_t head_bytes, const HeadCheck& check) {
    ReadResult r;
    struct Descriptor {   // closed on every way out, a throwing check or allocation included
        int fd = -1;
        ~Descriptor() {
            if (fd >= 0) ::close(fd);
        }
    } d;
    do {
        // O_NONBLOCK: opening a FIFO someone left at the path must not wait for a writer.
        d.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    } while (d.fd < 0 && errno == EINTR);
    if (d.fd < 0) {
        r.error = errno;
        r.status = (errno == ENOENT || errno == ENOTDIR) ? ReadStatus::NotFound : ReadStatus::Error;
        return r;
    }
    struct stat st;
    if (::fstat(d.fd, &st) != 0) {
        r.error = errno;
        return r;
    }
    r.id = id_of(st);
    if (!S_ISREG(st.st_mode)) {
        r.status = ReadStatus::NotRegular;
        return r;
    }
    if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > max_size) {
        r.status = ReadStatus::TooLarge;
        return r;
    }
    // Cache files are replaced, never modified in place, so the size from fstat holds; if the
    // file is shorter after all, the short read is kept and the format check rejects it.
    const size_t size = static_cast<size_t>(st.st_size);
    size_t got = 0;
    // Reads up to `until` bytes; false on a read error (r then says so).
    auto read_until = [&](size_t until) {
        while (got < until) {
            ssize_t n = ::read(d.fd, r.data.data() + got, until - got);
            if (n < 0) {
                if (errno == EINTR) continue;
                r.error = errno;
                r.data.clear();
                return false;
            }
            if (n == 0) break;
            got += static_cast<size_t>(n);
        }
        return true;
    };
    if (check) {
        r.data.resize(std::min(size, head_bytes));
        if (!read_until(r.data.size())) return r;
        if (!check(std::span<const char>(r.data.data(), got), static_cast<uint64_t>(size))) {
            r.data.clear();
            r.status = ReadStatus::Refused;
            return r;
        }
    }
    r.data.resize(size);
    if (!read_until(size)) return r;
    r.data.resize(got);
    r.status = ReadStatus::Ok;
    return r;
}

std::string temp_path_for(const std::string& path) {
    const std::string dir = parent_of(path);
    const size_t slash = path.rfind('/');
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    const size_t thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
    const uint64_t n = temp_counter.fetch_add(1, std::memory_order_relaxed);
    return fmt::format("{}/{}{}.{}.{:x}.{}", dir, kTempPrefix, name, static_cast<long>(::getpid()), thread, n);
}

bool is_temp_name(std::string_view filename) { return filename.starts_with(kTempPrefix); }

WriteResult write_file_atomic(const std::string& path, std::initializer_list<std::span<const char>> pieces, bool sync) {
    WriteResult r;
    std::string tmp;
    int fd = -1;
    // O_EXCL: a name that somehow exists already (a pid reused after a crash) is never shared.
    for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
        tmp = temp_path_for(path);
        do {
            fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0644);
        } while (fd < 0 && errno == EINTR);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        r.error = errno;
        r.step = "create";
        return r;
    }
    auto fail = [&](int error, const char* step) {
        if (fd >= 0) ::close(fd);
        ::unlink(tmp.c_str());
        r.error = error;
        r.step = step;
        return r;
    };
    for (std::span<const char> piece : pieces) {
        int error = 0;
        if (!write_all(fd, piece.data(), piece.size(), &error)) return fail(error, "write");
    }
    if (sync && ::fsync(fd) != 0) return fail(errno, "fsync");
    // close() can report a delayed write error (NFS, quota): the file is not complete then.
    int closed = ::close(fd);
    fd = -1;
    if (closed != 0 && errno != EINTR) return fail(errno, "write");
    if (::rename(tmp.c_str(), path.c_str()) != 0) return fail(errno, "rename");
    if (sync) sync_directory(parent_of(path));
    r.ok = true;
    return r;
}

bool make_directories(const std::string& path, int* error) {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    std::error_code ec2;
    if (std::filesystem::is_directory(path, ec2)) return true;
    *error = ec ? ec.value() : ec2 ? ec2.value() : ENOTDIR;
    return false;
}

bool remove_if_unchanged(const std::string& path, FileId id) {
    // lstat: a symlink someone placed at the path has another id than its target, so it stays.
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !(id_of(st) == id)) return false;
    return ::unlink(path.c_str()) == 0;
}

} // namespace kiln::cache
