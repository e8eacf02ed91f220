#include "runtime/cpu/thread_pool.hpp"

#include "compiler/env.hpp"
#include "compiler/log.hpp"

#include <optional>
#include <system_error>

namespace kiln::cpu {

namespace {
thread_local bool in_pool_task = false;
} // namespace

int default_num_threads() {
    if (std::optional<long long> n = env::integer("KILN_NUM_THREADS", 1, kMaxThreads)) return (int)*n;
    unsigned hw = std::thread::hardware_concurrency();
    return hw > 0 ? (int)hw : 1;
}

ThreadPool::ThreadPool(int threads) {
    // A system short of threads or memory for their stacks refuses some: the pool keeps the
    // workers it got (none: every job runs on the calling thread) rather than fail every launch.
    for (int i = 1; i < threads; ++i) {
        try {
            workers_.emplace_back([this] { worker_main(); });
        } catch (const std::system_error& e) {
            log_warn("the CPU backend asked for {} threads, but the system started only {} ({}); it runs with those "
                     "(KILN_NUM_THREADS sets the number)",
                     threads, i, e.what());
            break;
        }
    }
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
}

// Tasks are claimed one index at a time under the lock: tasks are coarse (thousands of points
// each), so the lock is cheap next to them, and claiming stays simple.
void ThreadPool::run_tasks(const std::function<void(int64_t)>& task, int64_t n) {
    in_pool_task = true;
    for (;;) {
        int64_t i;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (next_ >= n) break;
            i = next_++;
        }
        task(i);
    }
    in_pool_task = false;
}

void ThreadPool::worker_main() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (!task_) continue;  // woke after that job finished
        const auto* task = task_;
        const int64_t n = count_;
        ++busy_;
        lock.unlock();
        run_tasks(*task, n);
        lock.lock();
        if (--busy_ == 0) idle_.notify_all();
    }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& task) {
    if (n <= 0) return;
    if (workers_.empty() || n == 1 || in_pool_task) {
        for (int64_t i = 0; i < n; ++i) task(i);
        return;
    }
    std::lock_guard<std::mutex> submit(submit_mu_);
    {
        std::lock_guard<std::mutex> lock(mu_);
        task_ = &task;
        count_ = n;
        next_ = 0;
        ++generation_;
    }
    wake_.notify_all();
    run_tasks(task, n);
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return busy_ == 0; });
    task_ = nullptr;
}

} // namespace kiln::cpu
