// A persistent pool of worker threads for the CPU backend's kernel launches.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::cpu {

// The most threads KILN_NUM_THREADS may ask for.
inline constexpr int kMaxThreads = 4096;

// The number of threads a pool uses by default: $KILN_NUM_THREADS when it is an integer from 1
// to kMaxThreads (another value is warned about once), else the hardware concurrency (at least 1).
int default_num_threads();

class ThreadPool {
public:
    // `threads` counts the calling thread, which takes part in every job: 1 means no workers.
    // Where the system starts fewer, the pool has those (size() says how many), with a warning.
    explicit ThreadPool(int threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return (int)workers_.size() + 1; }

    // Calls task(i) for every i in [0, n), spread over the pool, and returns when all are done.
    // Jobs from several threads run one after another; a call from inside a task runs inline.
    void parallel_for(int64_t n, const std::function<void(int64_t)>& task);

private:
    void worker_main();
    void run_tasks(const std::function<void(int64_t)>& task, int64_t n);

    std::vector<std::thread> workers_;
    std::mutex submit_mu_;  // one job at a time

    std::mutex mu_;
    std::condition_variable wake_;
    std::condition_variable idle_;
    const std::function<void(int64_t)>* task_ = nullptr;
    int64_t count_ = 0;
    int64_t next_ = 0;        // next task index to claim (under mu_)
    uint64_t generation_ = 0; // bumped per job so sleeping workers notice it
    int busy_ = 0;            // workers inside the current job
    bool stop_ = false;
};

} // namespace kiln::cpu
