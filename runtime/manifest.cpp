#include "runtime/manifest.hpp"

#include "compiler/env.hpp"
#include "compiler/kernel_text.hpp"
#include "ir/error.hpp"

#include <cerrno>
#include <cstring>
#include <ctime>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#ifndef KILN_VERSION
#define KILN_VERSION "dev"
#endif

namespace kiln {

bool compile_forbidden_by_env() {
    return env::flag("KILN_ASSERT_NO_COMPILE").value_or(false);
}

void refuse_compile(const kir::Kernel& kernel, const std::string& target, const std::string& cache) {
    int reduced = 0;
    for (bool r : kernel.reduced) reduced += r;
    fail(Error::Kind::Runtime,
         "KILN_ASSERT_NO_COMPILE is set, but kernel {} ({}, rank {} with {} reduced dims, {} buffers) is not in the "
         "kernel cache{}: it would be compiled now. Warm the cache first (run the program once without "
         "KILN_ASSERT_NO_COMPILE; KILN_RECORD=manifest.jsonl lists what it compiles), or unset KILN_ASSERT_NO_COMPILE",
         kernel.name, target, kernel.rank, reduced, kernel.buffers.size(), cache.empty() ? "" : " at " + cache);
}

ManifestWriter::ManifestWriter(std::string path) : path_(std::move(path)) {
    // Opened without blocking (a FIFO no process reads would wait forever), blocking again after.
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd_ < 0 && errno == ENXIO)
        fail(Error::Kind::Runtime, "KILN_RECORD: the manifest {} is a FIFO that no process reads; give a file path, or "
             "start its reader first", path_);
    if (fd_ < 0)
        fail(Error::Kind::Runtime, "KILN_RECORD: cannot open the manifest {} for appending: {}", path_, std::strerror(errno));
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) < 0) {
        const int e = errno;
        ::close(fd_);
        fd_ = -1;
        fail(Error::Kind::Runtime, "KILN_RECORD: cannot set up the manifest {} for writing: {}", path_, std::strerror(e));
    }
}

ManifestWriter::~ManifestWriter() {
    if (fd_ >= 0) ::close(fd_);
}

namespace {
// A write to a pipe or FIFO whose reader has gone raises SIGPIPE, which ends a program that has
// not set it aside: for the duration of a manifest write this thread blocks it, so that the
// write fails with EPIPE (a kiln::Error) instead, and a SIGPIPE that write left pending is
// taken before the mask is restored.
class SigpipeBlocked {
public:
    SigpipeBlocked() {
        sigemptyset(&pipe_);
        sigaddset(&pipe_, SIGPIPE);
        pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
        sigset_t pending;
        sigpending(&pending);
        was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    }
    ~SigpipeBlocked() {
        sigset_t pending;
        sigpending(&pending);
        if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
            const timespec now{0, 0};
            while (sigtimedwait(&pipe_, nullptr, &now) < 0 && errno == EINTR) {
            }
        }
        pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    }
    SigpipeBlocked(const SigpipeBlocked&) = delete;
    SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

private:
    sigset_t pipe_, old_;
    bool was_pending_ = false;
};
} // namespace

void ManifestWriter::add(const kir::Kernel& kernel, const std::string& key, const std::string& backend,
                         const std::string& target) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!seen_.insert(key).second) return;
    std::string line =
        manifest_line_json({kManifestFormat, KILN_VERSION, backend, target, kernel.name, kernel_text(kernel)}) + "\n";
    const char* p = line.data();
    size_t left = line.size();
    SigpipeBlocked no_sigpipe;
    while (left > 0) {
        ssize_t n = ::write(fd_, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            fail(Error::Kind::Runtime, "KILN_RECORD: writing to the manifest {} failed: {}", path_, std::strerror(errno));
        p += n;
        left -= (size_t)n;
    }
}

} // namespace kiln
