// The differential test's NVRTC workers: every distinct kernel's CUDA C compiled for sm_80 and
// sm_90 on threads of their own, overlapping the CPU work on the following graphs.
#pragma once
#include "tests/differential/reference.hpp"

namespace {

// ======================================================================================
// NVRTC: every distinct kernel's CUDA C compiled for sm_80 and sm_90, on worker threads so
// that it overlaps the CPU JIT of the following graphs. NVRTC is most of the suite's time: one
// thread per hardware thread (at most 4) compiles while the main thread runs the graphs.
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
    double ms = 0;      // NVRTC time, both architectures, all threads

    explicit NvrtcWorker(int64_t* counter) : compiled(counter) {
        const unsigned n = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
        for (unsigned i = 0; i < n; ++i) th_.emplace_back([this] { loop(); });
    }
    ~NvrtcWorker() { finish(); }
    // Waits while a kernel per thread is still queued: if this process dies (a kiln crash in a
    // later graph), at most the kernels being compiled and as many queued go uncompiled.
    void submit(NvrtcJob j) {
        std::unique_lock<std::mutex> l(mu_);
        space_.wait(l, [&] { return q_.size() < th_.size(); });
        q_.push_back(std::move(j));
        cv_.notify_one();
    }
    void finish() {
        {
            std::lock_guard<std::mutex> l(mu_);
            if (done_) return;
            done_ = true;
            cv_.notify_all();
        }
        for (std::thread& t : th_) t.join();
    }

private:
    std::mutex mu_;
    std::condition_variable cv_, space_;
    std::deque<NvrtcJob> q_;
    bool done_ = false;
    std::vector<std::thread> th_;

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
        // Both to PTX, and one kernel in four (by its name, so the same ones every run) on to
        // sm_90 machine code: ptxas checks what the source's inline PTX says, which is the
        // prelude's and the same for every kernel (the unit tests take every kernel shape through
        // ptxas for both architectures), and it took half of each compile.
        const bool machine_code = std::hash<std::string>{}(j.name) % 4 == 0;
        for (int sm : {80, 90}) {
            std::string log;
            bool ok = false;
            try {
                auto res = kiln::cuda::nvrtc_compile(j.code, j.name, sm, /*want_cubin=*/sm == 90 && machine_code);
                ok = res.ok && !res.binary.empty();
                log = res.log;
                std::lock_guard<std::mutex> l(mu_);
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
