// kiln::Communicator over NCCL (include/kiln/collectives.hpp).
//
// Joining must be able to give up: a rank that never comes would block ncclCommInitRank for
// ever. So the ranks first join a non-blocking communicator (ncclConfig_t.blocking = 0), polled
// with ncclCommGetAsyncError until it is ready or the timeout passes, and split from it, once
// everyone is there, the blocking communicator the collectives run on: NCCL gives each call of
// a non-blocking communicator a thread of its own, tens of microseconds a collective. A
// collective's kernels, and the first call's connection set-up, can still wait for ever for a
// rank that died; a watchdog thread per communicator follows each collective by an event and
// aborts the communicator (ncclCommAbort ends its kernels and host waits) when one is older
// than the timeout, when a call has not returned within it, or when NCCL reports an
// asynchronous error (a rank that exited).
#include "runtime/collective_checks.hpp"
#include "runtime/cuda/device_backend.hpp"
#include "runtime/cuda/driver.hpp"
#include "runtime/cuda/nccl.hpp"

#include "compiler/log.hpp"
#include "ir/error.hpp"
#include "ir/storage.hpp"

#include <chrono>
#include <cstring>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

namespace kiln {

using Clock = std::chrono::steady_clock;
using collective::Op;

namespace {

const cuda::Nccl& loaded_nccl(const char* op) {
    const cuda::Nccl& n = cuda::nccl();
    if (!n.loaded) fail(Error::Kind::Runtime, "{}: NCCL is not available: {}", op, n.why_not);
    return n;
}

ncclDataType_t nccl_dtype(DType t) {
    switch (t) {
    case DType::Float32: return ncclFloat32;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Int32: return ncclInt32;
    case DType::Int8: return ncclInt8;
    case DType::UInt8:
    case DType::Bool: return ncclUint8;
    case DType::Float64: return ncclFloat64;
    case DType::Int64: return ncclInt64;
    case DType::UInt32: return ncclUint32;
    case DType::UInt64: return ncclUint64;
    case DType::Int16: case DType::UInt16: break;   // refused by collective_checks
    }
    return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
    switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Prod: return ncclProd;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Avg: return ncclAvg;
    }
    return ncclSum;
}

// "ncclAllReduce: ncclRemoteError (...): <NCCL's last message for the communicator>".
std::string nccl_failure(const cuda::Nccl& n, ncclResult_t r, const char* call, ncclComm_t handle) {
    std::string s = cuda::describe(r, call);
    const char* last = handle ? n.ncclGetLastError(handle) : nullptr;
    if (last && *last) s += fmt::format(": {}", last);
    return s;
}

// What a collective wrote counts as written (a destination made by empty() is then readable).
void written(const Tensor& t) { t.view().storage->written = true; }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The collectives given inside the calling thread's open groups, settled when the outermost
// one closes.
struct GroupMember {
    Communicator::Impl* impl;
    CUstream stream;
    const char* what;
};
thread_local int group_depth = 0;
thread_local std::vector<GroupMember> group_members;
// all_reduce_async's completion events given inside an outer group: recorded on their stream
// when the outermost group closes, after NCCL has enqueued the reductions.
thread_local std::vector<std::pair<Pending::State*, CUstream>> deferred_pending;

} // namespace

struct Communicator::Impl {
    const cuda::Nccl& n;   // the library this communicator was made with (loaded)
    Context* ctx = nullptr;
    cuda::CudaBackend* be = nullptr;
    int rank = 0, world = 1;
    double timeout = 600;

    mutable std::mutex mu;   // guards everything below
    ncclComm_t comm = nullptr;   // null once aborted or destroyed
    std::string error;           // why it failed
    struct Inflight {
        CUevent done;
        Clock::time_point given;
        const char* what;
    };
    std::deque<Inflight> inflight;
    CUstream side = nullptr;     // all_reduce_async's stream, made on first use
    std::condition_variable wake;
    bool stopping = false;
    std::thread watchdog;
    // The NCCL call under way (with mu held): when it began (0: none) and on which handle. A
    // call that hangs holds mu, so the watchdog (or abort()) ends it without mu, under hard_mu,
    // which the caller takes again before it looks at the result; the cause is left here.
    std::mutex hard_mu;
    int64_t call_started_ns = 0;
    ncclComm_t call_handle = nullptr;
    std::string hard_error;

    Impl(const cuda::Nccl& lib, Context& c, int w, int r, double t)
        : n(lib), ctx(&c), be(&cuda::cuda_backend(c)), rank(r), world(w), timeout(t) {}

    std::string who() const { return fmt::format("rank {} of {} on {}", rank, world, ctx->device_name()); }

    // Records the failure, ends the communicator (its kernels stop) and says so on stderr: the
    // thread that meets it may be the watchdog, with no caller to throw to.
    void fail_locked(const std::string& why) {
        if (!error.empty()) return;
        error = why;
        if (comm) {
            n.ncclCommAbort(comm);
            comm = nullptr;
        }
        log_write(LogLevel::Error, fmt::format("communicator {} aborted: {}", who(), why));
    }

    void throw_if_failed(const char* op) const {
        if (!error.empty()) fail(Error::Kind::Runtime, "{}: the communicator ({}) failed: {}", op, who(), error);
    }

    std::string nccl_error(ncclResult_t r, const char* call) const { return nccl_failure(n, r, call, comm); }

    // Follows the work just given to `stream` with an event for the watchdog and synchronize().
    void record_locked(CUstream stream, const char* what) {
        const auto& d = cuda::driver();
        be->make_current();   // the event belongs to the stream's device
        CUevent ev = nullptr;
        cuda::check(d.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        cuda::check(d.cuEventRecord(ev, stream), "cuEventRecord");
        inflight.push_back({ev, Clock::now(), what});
        wake.notify_one();
    }

    // Drops the finished collectives at the front; fails the communicator when the oldest one
    // is older than the timeout or NCCL reports an asynchronous error. True when none is left.
    bool poll_locked() {
        const auto& d = cuda::driver();
        if (comm) {
            ncclResult_t state = ncclSuccess;
            n.ncclCommGetAsyncError(comm, &state);
            if (state != ncclSuccess && state != ncclInProgress)
                fail_locked(nccl_error(state, "a collective in flight") + " (did another rank exit or fail?)");
        }
        while (!inflight.empty()) {
            Inflight& f = inflight.front();
            CUresult q = d.cuEventQuery(f.done);
            if (q == CUDA_ERROR_NOT_READY) {
                if (error.empty() && seconds_since(f.given) > timeout)
                    fail_locked(fmt::format("{} given {:.0f} s ago has not finished (timeout {:.0f} s): a rank did not "
                                            "call it, or exited", f.what, seconds_since(f.given), timeout));
                if (error.empty()) return false;
            } else if (q != CUDA_SUCCESS && error.empty()) {
                fail_locked(cuda::describe(q, "cuEventQuery"));
            }
            d.cuEventDestroy(f.done);
            inflight.pop_front();
        }
        return true;
    }

    void watch() {
        be->make_current();
        std::unique_lock<std::mutex> lock(mu, std::defer_lock);
        for (;;) {
            if (!lock.try_lock()) {
                abort_hung_call();
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
                continue;
            }
            if (stopping) break;
            wake.wait_for(lock, std::chrono::milliseconds(inflight.empty() ? 200 : 10));
            if (stopping) break;
            if (comm || !inflight.empty()) poll_locked();
            lock.unlock();
        }
    }

    // A call holds mu: after the timeout (or at once when `now`) it is ended from here.
    // Returns whether a call was under way.
    bool abort_hung_call(bool now = false, const char* why = nullptr) {
        std::lock_guard<std::mutex> h(hard_mu);
        if (!call_started_ns || !hard_error.empty()) return call_started_ns != 0;
        double held = (Clock::now().time_since_epoch().count() - call_started_ns) * 1e-9;
        if (!now && held <= timeout) return true;
        hard_error = why ? why
                         : fmt::format("an NCCL call did not return within the timeout of {:.0f} s (a rank did not make "
                                       "the same call, or exited)", timeout);
        log_write(LogLevel::Error, fmt::format("communicator {} aborted: {}", who(), hard_error));
        n.ncclCommAbort(call_handle);
        return true;
    }

    // Gives one NCCL call on the communicator (blocking: it returns once enqueued); inside a
    // group it gets its event when the group closes.
    template <class F>
    void give(const char* op, CUstream stream, F&& call) {
        std::unique_lock<std::mutex> lock(mu);
        throw_if_failed(op);
        be->make_current();
        ncclResult_t r = timed_call([&] { return call(comm, stream); });
        if (r != ncclSuccess) {
            fail_locked(nccl_error(r, op));
            throw_if_failed(op);
        }
        if (group_depth > 0) {
            group_members.push_back({this, stream, op});
            return;
        }
        record_locked(stream, op);
    }

    // Runs an NCCL call with mu held, visible to the watchdog; when the watchdog had to abort
    // it, the communicator is gone and the failure says why.
    template <class F>
    ncclResult_t timed_call(F&& f) {
        {
            std::lock_guard<std::mutex> h(hard_mu);
            call_started_ns = Clock::now().time_since_epoch().count();
            call_handle = comm;
        }
        ncclResult_t r = f();
        std::lock_guard<std::mutex> h(hard_mu);
        call_started_ns = 0;
        if (!hard_error.empty() && error.empty()) {
            error = hard_error;
            comm = nullptr;
            if (r == ncclSuccess) r = ncclRemoteError;
        }
        return r;
    }

    void start_watchdog() { watchdog = std::thread([this] { watch(); }); }

    // Returns once no collective is in flight: they finished, or the communicator failed
    // (poll_locked gives up on them after the timeout).
    void wait_idle() {
        be->make_current();
        for (auto sleep = std::chrono::microseconds(2);; sleep = std::min(sleep * 2, std::chrono::microseconds(500))) {
            {
                std::lock_guard<std::mutex> lock(mu);
                if (poll_locked()) return;
            }
            std::this_thread::sleep_for(sleep);
        }
    }

    // One collective on the context's stream: the checks, then the NCCL call (none for an
    // empty one); what it writes counts as written.
    template <class F>
    void run(Op kind, const Tensor& src, const Tensor& dst, ReduceOp red, bool reads_src, size_t count, F&& call) {
        collective::check_tensors(kind, *ctx, world, rank, src, dst, red);
        if (reads_src) collective::check_written(kind, src);
        if (count == 0) return;
        give(collective::op_name(kind), be->stream(), call);
        written(dst);
    }

    ~Impl() {
        // The collectives in flight finish first, so destroying the communicator does not wait
        // on a dead peer.
        wait_idle();
        {
            std::lock_guard<std::mutex> lock(mu);
            stopping = true;
        }
        wake.notify_one();
        if (watchdog.joinable()) watchdog.join();
        const auto& d = cuda::driver();
        be->make_current();
        std::lock_guard<std::mutex> lock(mu);
        // Every collective of this rank has finished: ncclCommAbort frees the communicator
        // here and now, where ncclCommDestroy would wait for its peers, which may be gone.
        if (comm) n.ncclCommAbort(comm);
        comm = nullptr;
        for (auto& f : inflight) d.cuEventDestroy(f.done);
        if (side) {
            d.cuStreamSynchronize(side);
            d.cuStreamDestroy(side);
        }
    }
};

// ---- joining

namespace {

// Joins `impl` to the clique of `id`: a non-blocking communicator first, given up after the
// timeout, then the blocking one split from it (everyone has joined by then).
void join(Communicator::Impl& impl, const NcclId& id) {
    // Every connection is made while joining, where the timeout applies, not by a rank's first
    // collective, whose host call would wait for a peer that never makes it (set before NCCL's
    // first communicator reads it; a value the user gave stays).
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    const auto& n = impl.n;
    const char* op = "Communicator";
    ncclUniqueId raw;
    std::memcpy(raw.internal, id.bytes.data(), sizeof(raw.internal));
    std::lock_guard<std::mutex> lock(impl.mu);
    impl.be->make_current();
    ncclConfig_t nonblocking = NCCL_CONFIG_INITIALIZER;
    nonblocking.blocking = 0;
    ncclComm_t parent = nullptr;
    ncclResult_t r = n.ncclCommInitRankConfig(&parent, impl.world, raw, impl.rank, &nonblocking);
    auto give_up = [&](const std::string& why, bool timed_out = false) {
        if (parent) n.ncclCommAbort(parent);
        impl.error = why;
        fail(Error::Kind::Runtime, "{}: {} could not join: {}{}", op, impl.who(), why,
             timed_out ? fmt::format(" (are all {} ranks started, with the same id?)", impl.world) : "");
    };
    if (r != ncclSuccess && r != ncclInProgress) give_up(cuda::describe(r, "ncclCommInitRankConfig"));
    auto settle = [&](ncclComm_t handle, const char* what) {
        auto start = Clock::now();
        for (;;) {
            ncclResult_t state = ncclSuccess;
            ncclResult_t q = n.ncclCommGetAsyncError(handle, &state);
            if (q != ncclSuccess) state = q;
            if (state == ncclSuccess) return;
            if (state != ncclInProgress) give_up(nccl_failure(n, state, what, handle));
            if (seconds_since(start) > impl.timeout)
                give_up(fmt::format("{} did not complete within the timeout of {:.0f} s", what, impl.timeout), true);
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
    };
    settle(parent, "joining");
    ncclConfig_t blocking = NCCL_CONFIG_INITIALIZER;
    blocking.blocking = 1;
    ncclComm_t child = nullptr;
    r = n.ncclCommSplit(parent, 0, impl.rank, &child, &blocking);
    if (r != ncclSuccess && r != ncclInProgress) give_up(cuda::describe(r, "ncclCommSplit"));
    // The split of a non-blocking parent runs on NCCL's thread, which writes `child` when it
    // has made it: the parent settles first, then the child.
    settle(parent, "the split");
    auto start = Clock::now();
    while (!std::atomic_ref<ncclComm_t>(child).load()) {
        if (seconds_since(start) > impl.timeout) give_up("ncclCommSplit gave no communicator within the timeout", true);
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    settle(child, "the split");
    impl.comm = child;
    n.ncclCommDestroy(parent);
}

} // namespace

NcclInfo nccl_info() {
    const cuda::Nccl& n = cuda::nccl();
    return {n.loaded, n.version, n.library, n.why_not};
}

NcclId Communicator::new_id() {
    const auto& n = loaded_nccl("Communicator::new_id");
    ncclUniqueId raw;
    ncclResult_t r = n.ncclGetUniqueId(&raw);
    if (r != ncclSuccess) fail(Error::Kind::Runtime, "Communicator::new_id: {}", cuda::describe(r, "ncclGetUniqueId"));
    NcclId id;
    static_assert(sizeof(raw.internal) == sizeof(id.bytes));
    std::memcpy(id.bytes.data(), raw.internal, sizeof(raw.internal));
    return id;
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Communicator::Communicator(Context& ctx, int world_size, int rank, const NcclId& id, CommOptions opts) {
    double timeout = collective::timeout_seconds(opts.timeout_s);
    collective::check_member("Communicator", ctx, world_size, rank);
    impl_ = std::make_unique<Impl>(loaded_nccl("Communicator"), ctx, world_size, rank, timeout);
    join(*impl_, id);
    impl_->start_watchdog();
}

std::unique_ptr<Communicator> Communicator::through_file(Context& ctx, int world_size, int rank, const std::string& path,
                                                         CommOptions opts) {
    double timeout = collective::timeout_seconds(opts.timeout_s);
    collective::check_member("Communicator::through_file", ctx, world_size, rank);
    if (path.empty()) fail(Error::Kind::Value, "Communicator::through_file: the id file's path is empty");
    opts.timeout_s = timeout;
    if (rank == 0) {
        NcclId id = new_id();
        collective::write_id_file(path, id);
        std::unique_ptr<Communicator> c;
        try {
            c = std::make_unique<Communicator>(ctx, world_size, 0, id, opts);
        } catch (...) {
            std::remove(path.c_str());
            throw;
        }
        std::remove(path.c_str());   // every rank has read it: it joined
        return c;
    }
    NcclId id = collective::read_id_file(path, rank, timeout);
    return std::make_unique<Communicator>(ctx, world_size, rank, id, opts);
}

std::unique_ptr<Communicator> Communicator::from_env(Context& ctx, CommOptions opts) {
    collective::EnvRank e = collective::rank_from_env();
    if (e.has_id) return std::make_unique<Communicator>(ctx, e.world, e.rank, e.id, opts);
    return through_file(ctx, e.world, e.rank, e.id_file, opts);
}

std::vector<std::unique_ptr<Communicator>> Communicator::for_contexts(const std::vector<Context*>& contexts,
                                                                      CommOptions opts) {
    const char* op = "Communicator::for_contexts";
    if (contexts.empty()) fail(Error::Kind::Value, "{}: no contexts; give one CUDA context per GPU", op);
    int world = (int)contexts.size();
    for (int i = 0; i < world; ++i) {
        if (!contexts[i]) fail(Error::Kind::Value, "{}: context {} is null", op, i);
        collective::check_member(op, *contexts[i], world, i);
        for (int j = 0; j < i; ++j)
            if (contexts[j]->device_name() == contexts[i]->device_name())
                fail(Error::Kind::Value, "{}: contexts {} and {} are both on {}; a communicator has one rank per GPU", op,
                     j, i, contexts[i]->device_name());
    }
    double timeout = collective::timeout_seconds(opts.timeout_s);
    const auto& n = loaded_nccl(op);
    // One process: every rank is here, so the blocking ncclCommInitAll cannot wait for a
    // missing one.
    std::vector<std::unique_ptr<Impl>> impls;
    std::vector<int> devices;
    std::vector<ncclComm_t> handles(world, nullptr);
    for (int i = 0; i < world; ++i) {
        impls.push_back(std::make_unique<Impl>(n, *contexts[i], world, i, timeout));
        devices.push_back(impls.back()->be->info().index);
    }
    ncclResult_t r = n.ncclCommInitAll(handles.data(), world, devices.data());
    if (r != ncclSuccess) fail(Error::Kind::Runtime, "{}: {}", op, cuda::describe(r, "ncclCommInitAll"));
    std::vector<std::unique_ptr<Communicator>> out;
    for (int i = 0; i < world; ++i) {
        impls[i]->comm = handles[i];
        impls[i]->start_watchdog();
        out.push_back(std::unique_ptr<Communicator>(new Communicator(std::move(impls[i]))));
    }
    return out;
}

Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->world; }
Context& Communicator::context() const { return *impl_->ctx; }
double Communicator::timeout_s() const { return impl_->timeout; }

// ---- collectives

void Communicator::all_reduce(Tensor& t, ReduceOp op) { all_reduce(t, t, op); }

void Communicator::all_reduce(const Tensor& src, Tensor& dst, ReduceOp op) {
    impl_->run(Op::AllReduce, src, dst, op, true, (size_t)src.size(), [&](ncclComm_t c, CUstream s) {
        return impl_->n.ncclAllReduce(src.data(), dst.data(), (size_t)src.size(), nccl_dtype(src.dtype()), nccl_op(op), c, s);
    });
}

void Communicator::all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) {
    for (const Tensor& t : tensors) {   // all checked before any is given: no partial group
        collective::check_tensors(Op::AllReduce, *impl_->ctx, impl_->world, impl_->rank, t, t, op);
        collective::check_written(Op::AllReduce, t);
    }
    CollectiveGroup group;
    for (const Tensor& t : tensors) {
        Tensor dst = t;
        all_reduce(t, dst, op);
    }
    group.end();
}

void Communicator::all_gather(const Tensor& src, Tensor& dst) {
    impl_->run(Op::AllGather, src, dst, ReduceOp::Sum, true, (size_t)src.size(), [&](ncclComm_t c, CUstream s) {
        return impl_->n.ncclAllGather(src.data(), dst.data(), (size_t)src.size(), nccl_dtype(src.dtype()), c, s);
    });
}

void Communicator::reduce_scatter(const Tensor& src, Tensor& dst, ReduceOp op) {
    impl_->run(Op::ReduceScatter, src, dst, op, true, (size_t)dst.size(), [&](ncclComm_t c, CUstream s) {
        return impl_->n.ncclReduceScatter(src.data(), dst.data(), (size_t)dst.size(), nccl_dtype(src.dtype()), nccl_op(op),
                                          c, s);
    });
}

void Communicator::broadcast(Tensor& t, int root) { broadcast(t, t, root); }

void Communicator::broadcast(const Tensor& src, Tensor& dst, int root) {
    collective::check_root(impl_->world, root);
    impl_->run(Op::Broadcast, src, dst, ReduceOp::Sum, root == impl_->rank, (size_t)src.size(), [&](ncclComm_t c, CUstream s) {
        return impl_->n.ncclBroadcast(src.data(), dst.data(), (size_t)src.size(), nccl_dtype(src.dtype()), root, c, s);
    });
}

// ---- all_reduce_async and Pending

struct Pending::State {
    CUstream ctx_stream = nullptr;
    cuda::CudaBackend* be = nullptr;
    CUevent done = nullptr;
    bool recorded = false;      // false while the group it was given in is open
    std::vector<Tensor> keep;   // alive until the context's work is ordered after the reduction
};

Pending Communicator::all_reduce_async(const std::vector<Tensor>& tensors, ReduceOp op) {
    for (const Tensor& t : tensors) {
        collective::check_tensors(Op::AllReduce, *impl_->ctx, impl_->world, impl_->rank, t, t, op);
        collective::check_written(Op::AllReduce, t);
    }
    const auto& d = cuda::driver();
    Impl& im = *impl_;
    const auto& n = im.n;
    CUstream side = nullptr;
    {
        std::lock_guard<std::mutex> lock(im.mu);
        im.throw_if_failed("all_reduce_async");
        im.be->make_current();
        if (!im.side) cuda::check(d.cuStreamCreate(&im.side, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        side = im.side;
    }
    im.be->order_before(side);
    {
        CollectiveGroup group;
        for (const Tensor& t : tensors) {
            if (t.size() == 0) continue;
            im.give("all_reduce_async", side, [&](ncclComm_t c, CUstream s) {
                return n.ncclAllReduce(t.data(), t.data(), (size_t)t.size(), nccl_dtype(t.dtype()), nccl_op(op), c, s);
            });
        }
        group.end();
    }
    Pending p;
    p.s_ = std::make_unique<Pending::State>();
    p.s_->be = im.be;
    p.s_->ctx_stream = im.be->stream();
    p.s_->keep = tensors;
    im.be->make_current();
    cuda::check(d.cuEventCreate(&p.s_->done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    if (group_depth > 0) {
        deferred_pending.push_back({p.s_.get(), side});
    } else {
        cuda::check(d.cuEventRecord(p.s_->done, side), "cuEventRecord");
        p.s_->recorded = true;
    }
    return p;
}

Pending::Pending() = default;
Pending::Pending(Pending&&) noexcept = default;
Pending& Pending::operator=(Pending&& o) noexcept {
    if (this != &o) {
        try {
            wait();
        } catch (...) {
        }
        s_ = std::move(o.s_);
    }
    return *this;
}

Pending::~Pending() {
    try {
        wait();
    } catch (const std::exception& e) {
        log_write(LogLevel::Error, fmt::format("Pending: {}", e.what()));
    }
}

void Pending::wait() {
    if (!s_) return;
    const auto& d = cuda::driver();
    if (!s_->recorded) {
        std::erase_if(deferred_pending, [&](const auto& e) { return e.first == s_.get(); });
        d.cuEventDestroy(s_->done);
        s_.reset();
        fail(Error::Kind::Value, "Pending::wait: its all_reduce_async was given inside a CollectiveGroup that is still "
             "open, so the reduction is not enqueued yet; wait after the group ends");
    }
    s_->be->make_current();
    CUresult r = d.cuStreamWaitEvent(s_->ctx_stream, s_->done, 0);
    d.cuEventDestroy(s_->done);
    s_.reset();
    cuda::check(r, "cuStreamWaitEvent");
}

bool Pending::done() const {
    if (!s_) return true;
    s_->be->make_current();
    return cuda::driver().cuEventQuery(s_->done) == CUDA_SUCCESS;
}

// ---- waiting, failing

void Communicator::synchronize() {
    impl_->wait_idle();
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->throw_if_failed("synchronize");
}

void Communicator::abort() {
    std::unique_lock<std::mutex> lock(impl_->mu, std::try_to_lock);
    while (!lock.owns_lock()) {
        // A call holds the lock: end it (it then fails with this cause), then take the lock.
        if (impl_->abort_hung_call(true, "aborted by Communicator::abort()")) {
            lock.lock();
            break;
        }
        lock.try_lock();
    }
    impl_->fail_locked("aborted by Communicator::abort()");
}

std::string Communicator::error() const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    return impl_->error;
}

// ---- groups

CollectiveGroup::CollectiveGroup() {
    const auto& n = loaded_nccl("CollectiveGroup");
    ncclResult_t r = n.ncclGroupStart();
    if (r != ncclSuccess) fail(Error::Kind::Runtime, "CollectiveGroup: {}", cuda::describe(r, "ncclGroupStart"));
    ++group_depth;
}

CollectiveGroup::~CollectiveGroup() {
    try {
        end();
    } catch (const std::exception& e) {
        log_write(LogLevel::Error, fmt::format("CollectiveGroup: {}", e.what()));
    }
}

void CollectiveGroup::end() {
    if (!open_) return;
    open_ = false;
    --group_depth;
    ncclResult_t r = cuda::nccl().ncclGroupEnd();
    if (group_depth > 0) return;
    std::vector<GroupMember> members;
    members.swap(group_members);
    std::string first_error;
    for (auto& m : members) {
        std::lock_guard<std::mutex> lock(m.impl->mu);
        try {
            if (r != ncclSuccess) m.impl->fail_locked(m.impl->nccl_error(r, "ncclGroupEnd"));
            m.impl->throw_if_failed(m.what);
            m.impl->record_locked(m.stream, m.what);
        } catch (const Error& e) {
            if (first_error.empty()) first_error = e.what();
        }
    }
    std::vector<std::pair<Pending::State*, CUstream>> deferred;
    deferred.swap(deferred_pending);
    for (auto& [state, stream] : deferred) {
        state->be->make_current();
        CUresult rec = cuda::driver().cuEventRecord(state->done, stream);
        state->recorded = rec == CUDA_SUCCESS;
        if (rec != CUDA_SUCCESS && first_error.empty()) first_error = cuda::describe(rec, "cuEventRecord");
    }
    if (!first_error.empty()) throw Error(first_error, Error::Kind::Runtime);
}

} // namespace kiln
