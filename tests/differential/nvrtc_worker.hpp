// The differential test's NVRTC worker: every distinct kernel's CUDA C compiled for sm_80 and
// sm_90 on a thread of its own, overlapping the CPU work on the following graphs.
#pragma once
#include "tests/differential/reference.hpp"

namespace {

// ======================================================================================
// NVRTC: every distinct kernel's CUDA C compiled for sm_80 and sm_90, on a worker thread so
// that it overlaps the CPU JIT of the following graphs.
// ======================================================================================

struct NvrtcJob {
    std::string code, name;
    uint64_t seed;
    std::string expr;
};

class NvrtcWorker {
public:
    std::vector<std::string> failures;
    int64_t* compiled;  // in the shared counters: survives a crash of this process
    double ms = 0;      // NVRTC time, both architectures

    explicit NvrtcWorker(int64_t* counter) : compiled(counter), th_([this] { loop(); }) {}
    ~NvrtcWorker() { finish(); }
    // Waits while a kernel is still queued: if this process dies (a kiln crash in a later
    // graph), at most the kernel being compiled and one queued go uncompiled.
    void submit(NvrtcJob j) {
        std::unique_lock<std::mutex> l(mu_);
        space_.wait(l, [&] { return q_.empty(); });
        q_.push_back(std::move(j));
        cv_.notify_one();
    }
    void finish() {
        {
            std::lock_guard<std::mutex> l(mu_);
            if (done_) return;
            done_ = true;
            cv_.notify_one();
        }
        th_.join();
    }

private:
    std::mutex mu_;
    std::condition_variable cv_, space_;
    std::deque<NvrtcJob> q_;
    bool done_ = false;
    std::thread th_;

    void loop() {
        for (;;) {
            NvrtcJob j;
            {
                std::unique_lock<std::mutex> l(mu_);
                cv_.wait(l, [&] { return done_ || !q_.empty(); });
                if (q_.empty()) return;
                j = std::move(q_.front());
                q_.pop_front();
                space_.notify_one();
            }
            run(j);
        }
    }
    void run(const NvrtcJob& j) {
#ifdef KILN_DIFF_NVRTC
        for (int sm : {80, 90}) {
            std::string log;
            bool ok = false;
            try {
                auto res = kiln::cuda::nvrtc_compile(j.code, j.name, sm, true);
                ok = res.ok && !res.binary.empty();
                log = res.log;
                ms += res.milliseconds;
            } catch (const std::exception& e) {
                log = std::string("exception: ") + e.what();
            }
            if (!ok) {
                std::lock_guard<std::mutex> l(mu_);
                failures.push_back("NVRTC failed for sm_" + std::to_string(sm) + " on kernel " + j.name + " (seed " +
                                   std::to_string(j.seed) + ")\nexpression:\n" + j.expr + "log:\n" + log +
                                   "\nsource:\n" + j.code);
            }
        }
        __atomic_fetch_add(compiled, 1, __ATOMIC_RELAXED);
#else
        (void)j;
#endif
    }
};

} // namespace
