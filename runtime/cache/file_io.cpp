#include "runtime/cache/file_io.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

namespace kiln::cache {

std::optional<std::vector<char>> read_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    std::vector<char> out;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            ::close(fd);
            return std::nullopt;
        }
        if (n == 0) break;
        out.insert(out.end(), buf, buf + n);
    }
    ::close(fd);
    return out;
}

bool write_file_atomic(const std::string& path, const char* bytes, size_t n, std::string* why) {
    static std::atomic<uint64_t> counter{0};
    std::error_code ec;
    const std::filesystem::path dst(path);
    std::filesystem::create_directories(dst.parent_path(), ec);
    if (ec) {
        *why = fmt::format("cannot create {}: {}", dst.parent_path().string(), ec.message());
        return false;
    }
    const std::string tmp = fmt::format("{}.tmp.{}.{:x}.{}", path, (long)::getpid(),
                                        std::hash<std::thread::id>()(std::this_thread::get_id()), counter++);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        *why = fmt::format("cannot create {}: {}", tmp, std::strerror(errno));
        return false;
    }
    size_t done = 0;
    while (done < n) {
        const ssize_t w = ::write(fd, bytes + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            *why = fmt::format("cannot write {}: {}", tmp, w < 0 ? std::strerror(errno) : "no space");
            ::close(fd);
            ::unlink(tmp.c_str());
            return false;
        }
        done += (size_t)w;
    }
    if (::close(fd) != 0) {
        *why = fmt::format("cannot write {}: {}", tmp, std::strerror(errno));
        ::unlink(tmp.c_str());
        return false;
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        *why = fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno));
        ::unlink(tmp.c_str());
        return false;
    }
    return true;
}

} // namespace kiln::cache
