// kiln::Communicator over NCCL (include/kiln/collectives.hpp).
//
// Every communicator is non-blocking (ncclConfig_t.blocking = 0): NCCL calls return at once and
// kiln polls ncclCommGetAsyncError until the call has settled, so the joining of the ranks and
// every call can be given up after the timeout, by ncclCommAbort, instead of hanging. A
// collective's kernels can still wait forever on the GPU for a rank that never comes; a
// watchdog thread per communicator follows each collective by an event and aborts the
// communicator when one is older than the timeout or NCCL reports an asynchronous error (a rank
// that exited), which also ends a host thread's wait on the stream. All NCCL calls on a
// communicator happen under its mutex, so the watchdog never aborts one mid-call.
#include "runtime/collective_checks.hpp"
#include "runtime/cuda/device_backend.hpp"
#include "runtime/cuda/driver.hpp"
#include "runtime/cuda/nccl.hpp"

#include "compiler/log.hpp"
#include "ir/error.hpp"

#include <chrono>
#include <cstring>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <set>
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

} // namespace

struct Communicator::Impl {
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

    Impl(Context& c, int w, int r, double t) : ctx(&c), be(&cuda::cuda_backend(c)), rank(r), world(w), timeout(t) {}

    std::string who() const { return fmt::format("rank {} of {} on {}", rank, world, ctx->device_name()); }

    // Records the failure, ends the communicator (its kernels stop) and says so on stderr: the
    // thread that meets it may be the watchdog, with no caller to throw to.
    void fail_locked(const std::string& why) {
        if (!error.empty()) return;
        error = why;
        if (comm) {
            cuda::nccl().ncclCommAbort(comm);
            comm = nullptr;
        }
        log_write(LogLevel::Error, fmt::format("communicator {} aborted: {}", who(), why));
    }

    void throw_if_failed(const char* op) const {
        if (!error.empty()) fail(Error::Kind::Runtime, "{}: the communicator ({}) failed: {}", op, who(), error);
    }

    std::string nccl_error(ncclResult_t r, const char* call) const {
        std::string s = cuda::describe(r, call);
        const char* last = comm ? cuda::nccl().ncclGetLastError(comm) : nullptr;
        if (last && *last) s += fmt::format(": {}", last);
        return s;
    }

    // Polls until the communicator's last call has settled (ncclInProgress no more), at most
    // the timeout; any error fails the communicator and throws.
    void settle_locked(const char* op) {
        auto start = Clock::now();
        for (;;) {
            ncclResult_t state = ncclSuccess;
            ncclResult_t r = cuda::nccl().ncclCommGetAsyncError(comm, &state);
            if (r != ncclSuccess) state = r;
            if (state == ncclSuccess) return;
            if (state != ncclInProgress) {
                fail_locked(nccl_error(state, op));
                throw_if_failed(op);
            }
            if (seconds_since(start) > timeout) {
                fail_locked(fmt::format("{} did not complete within the timeout of {:.0f} s", op, timeout));
                throw_if_failed(op);
            }
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

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
            cuda::nccl().ncclCommGetAsyncError(comm, &state);
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
        std::unique_lock<std::mutex> lock(mu);
        while (!stopping) {
            wake.wait_for(lock, std::chrono::milliseconds(inflight.empty() ? 200 : 10));
            if (stopping) break;
            if (comm || !inflight.empty()) poll_locked();
        }
    }

    // Gives one NCCL call on the communicator: inside a group it settles when the group closes.
    template <class F>
    void give(const char* op, CUstream stream, F&& call) {
        std::unique_lock<std::mutex> lock(mu);
        throw_if_failed(op);
        be->make_current();
        ncclResult_t r = call(comm, stream);
        if (r != ncclSuccess && r != ncclInProgress) {
            fail_locked(nccl_error(r, op));
            throw_if_failed(op);
        }
        if (group_depth > 0) {
            group_members.push_back({this, stream, op});
            return;
        }
        settle_locked(op);
        record_locked(stream, op);
    }

    void start_watchdog() { watchdog = std::thread([this] { watch(); }); }

    ~Impl() {
        {
            std::lock_guard<std::mutex> lock(mu);
            stopping = true;
        }
        wake.notify_one();
        if (watchdog.joinable()) watchdog.join();
        const auto& d = cuda::driver();
        be->make_current();
        std::lock_guard<std::mutex> lock(mu);
        if (comm) {
            // Finalize flushes the collectives in flight; it settles like any other call.
            const auto& n = cuda::nccl();
            ncclResult_t r = n.ncclCommFinalize(comm);
            try {
                if (r == ncclSuccess || r == ncclInProgress) settle_locked("Communicator destruction");
            } catch (const Error&) {
            }
            if (comm) n.ncclCommDestroy(comm);
            comm = nullptr;
        }
        for (auto& f : inflight) d.cuEventDestroy(f.done);
        if (side) {
            d.cuStreamSynchronize(side);
            d.cuStreamDestroy(side);
        }
    }
};

// ---- joining

namespace {

ncclConfig_t nonblocking_config() {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

// Waits for the joins given to `impls` to settle (they were given in one group, or one alone).
void settle_join(const std::vector<Communicator::Impl*>& impls, const char* op) {
    for (auto* impl : impls) {
        std::lock_guard<std::mutex> lock(impl->mu);
        try {
            impl->settle_locked(op);
        } catch (const Error&) {
            std::string why = impl->error;
            for (auto* other : impls) {
                if (other == impl) continue;
                std::lock_guard<std::mutex> l2(other->mu);
                other->fail_locked("another rank of this process failed to join");
            }
            fail(Error::Kind::Runtime, "{}: {} could not join: {}{}", op, impl->who(), why,
                 why.find("did not complete") != std::string::npos
                     ? fmt::format(" (are all {} ranks started, with the same id?)", impl->world)
                     : "");
        }
    }
    for (auto* impl : impls) impl->start_watchdog();
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
    const auto& n = loaded_nccl("Communicator");
    impl_ = std::make_unique<Impl>(ctx, world_size, rank, timeout);
    ncclUniqueId raw;
    std::memcpy(raw.internal, id.bytes.data(), sizeof(raw.internal));
    ncclConfig_t cfg = nonblocking_config();
    impl_->be->make_current();
    ncclResult_t r = n.ncclCommInitRankConfig(&impl_->comm, world_size, raw, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        if (impl_->comm) n.ncclCommAbort(impl_->comm);
        impl_->comm = nullptr;
        fail(Error::Kind::Runtime, "Communicator: {} could not join: {}", impl_->who(),
             cuda::describe(r, "ncclCommInitRankConfig"));
    }
    settle_join({impl_.get()}, "Communicator");
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
    NcclId id = new_id();
    ncclUniqueId raw;
    std::memcpy(raw.internal, id.bytes.data(), sizeof(raw.internal));
    std::vector<std::unique_ptr<Impl>> impls;
    for (int i = 0; i < world; ++i) impls.push_back(std::make_unique<Impl>(*contexts[i], world, i, timeout));
    ncclConfig_t cfg = nonblocking_config();
    n.ncclGroupStart();
    ncclResult_t bad = ncclSuccess;
    for (int i = 0; i < world && bad == ncclSuccess; ++i) {
        impls[i]->be->make_current();
        ncclResult_t r = n.ncclCommInitRankConfig(&impls[i]->comm, world, raw, i, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) bad = r;
    }
    ncclResult_t r = n.ncclGroupEnd();
    if (bad == ncclSuccess && r != ncclSuccess && r != ncclInProgress) bad = r;
    std::vector<Impl*> raw_impls;
    for (auto& i : impls) raw_impls.push_back(i.get());
    if (bad != ncclSuccess) {
        for (auto* i : raw_impls) {
            std::lock_guard<std::mutex> lock(i->mu);
            i->fail_locked("joining failed");
        }
        fail(Error::Kind::Runtime, "{}: {}", op, cuda::describe(bad, "ncclCommInitRankConfig"));
    }
    settle_join(raw_impls, op);
    std::vector<std::unique_ptr<Communicator>> out;
    for (auto& i : impls) out.push_back(std::unique_ptr<Communicator>(new Communicator(std::move(i))));
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
    collective::check_tensors(Op::AllReduce, *impl_->ctx, impl_->world, impl_->rank, src, dst, op);
    if (src.size() == 0) return;
    const auto& n = loaded_nccl("all_reduce");
    impl_->give("all_reduce", impl_->be->stream(), [&](ncclComm_t c, CUstream s) {
        return n.ncclAllReduce(src.data(), dst.data(), (size_t)src.size(), nccl_dtype(src.dtype()), nccl_op(op), c, s);
    });
}

void Communicator::all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) {
    for (const Tensor& t : tensors)
        collective::check_tensors(Op::AllReduce, *impl_->ctx, impl_->world, impl_->rank, t, t, op);
    CollectiveGroup group;
    for (const Tensor& t : tensors) {
        Tensor dst = t;
        all_reduce(t, dst, op);
    }
    group.end();
}

void Communicator::all_gather(const Tensor& src, Tensor& dst) {
    collective::check_tensors(Op::AllGather, *impl_->ctx, impl_->world, impl_->rank, src, dst, ReduceOp::Sum);
    if (src.size() == 0) return;
    const auto& n = loaded_nccl("all_gather");
    impl_->give("all_gather", impl_->be->stream(), [&](ncclComm_t c, CUstream s) {
        return n.ncclAllGather(src.data(), dst.data(), (size_t)src.size(), nccl_dtype(src.dtype()), c, s);
    });
}

void Communicator::reduce_scatter(const Tensor& src, Tensor& dst, ReduceOp op) {
    collective::check_tensors(Op::ReduceScatter, *impl_->ctx, impl_->world, impl_->rank, src, dst, op);
    if (dst.size() == 0) return;
    const auto& n = loaded_nccl("reduce_scatter");
    impl_->give("reduce_scatter", impl_->be->stream(), [&](ncclComm_t c, CUstream s) {
        return n.ncclReduceScatter(src.data(), dst.data(), (size_t)dst.size(), nccl_dtype(src.dtype()), nccl_op(op), c, s);
    });
}

void Communicator::broadcast(Tensor& t, int root) { broadcast(t, t, root); }

void Communicator::broadcast(const Tensor& src, Tensor& dst, int root) {
    collective::check_root(impl_->world, root);
    collective::check_tensors(Op::Broadcast, *impl_->ctx, impl_->world, impl_->rank, src, dst, ReduceOp::Sum);
    if (src.size() == 0) return;
    const auto& n = loaded_nccl("broadcast");
    impl_->give("broadcast", impl_->be->stream(), [&](ncclComm_t c, CUstream s) {
        return n.ncclBroadcast(src.data(), dst.data(), (size_t)src.size(), nccl_dtype(src.dtype()), root, c, s);
    });
}

// ---- all_reduce_async and Pending

struct Pending::State {
    CUstream ctx_stream = nullptr;
    cuda::CudaBackend* be = nullptr;
    CUevent done = nullptr;
    std::vector<Tensor> keep;   // alive until the context's work is ordered after the reduction
};

Pending Communicator::all_reduce_async(const std::vector<Tensor>& tensors, ReduceOp op) {
    for (const Tensor& t : tensors)
        collective::check_tensors(Op::AllReduce, *impl_->ctx, impl_->world, impl_->rank, t, t, op);
    const auto& n = loaded_nccl("all_reduce_async");
    const auto& d = cuda::driver();
    Impl& im = *impl_;
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
    cuda::check(d.cuEventRecord(p.s_->done, side), "cuEventRecord");
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
    Impl& im = *impl_;
    im.be->make_current();
    for (auto sleep = std::chrono::microseconds(2);; sleep = std::min(sleep * 2, std::chrono::microseconds(500))) {
        {
            std::lock_guard<std::mutex> lock(im.mu);
            bool idle = im.poll_locked();
            im.throw_if_failed("synchronize");
            if (idle) return;
        }
        std::this_thread::sleep_for(sleep);
    }
}

void Communicator::abort() {
    std::lock_guard<std::mutex> lock(impl_->mu);
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
    std::set<Communicator::Impl*> seen;
    std::string first_error;
    for (auto& m : members) {
        std::lock_guard<std::mutex> lock(m.impl->mu);
        if (!seen.insert(m.impl).second) {
            if (m.impl->error.empty()) m.impl->record_locked(m.stream, m.what);
            continue;
        }
        try {
            if (r != ncclSuccess && r != ncclInProgress) m.impl->fail_locked(m.impl->nccl_error(r, "ncclGroupEnd"));
            m.impl->throw_if_failed(m.what);
            if (m.impl->comm) m.impl->settle_locked(m.what);
            m.impl->record_locked(m.stream, m.what);
        } catch (const Error& e) {
            if (first_error.empty()) first_error = e.what();
        }
    }
    if (!first_error.empty()) throw Error(first_error, Error::Kind::Runtime);
}

} // namespace kiln
