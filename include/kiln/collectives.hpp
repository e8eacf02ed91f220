// Collectives over kiln tensors through NCCL: all-reduce, all-gather, reduce-scatter and
// broadcast between CUDA contexts of one process (a context per GPU) or of several processes
// (one per GPU, started as torchrun starts them).
//
//   kiln::Context ctx({.device = "cuda:" + local_rank});
//   auto comm = kiln::Communicator::from_env(ctx);    // RANK, WORLD_SIZE, KILN_NCCL_ID[_FILE]
//   comm->all_reduce(grad, kiln::ReduceOp::Avg);      // on ctx's stream
//   grad[kiln::all] = grad * 0.5f;                    // ordered after it, no host wait
//
// NCCL is loaded at run time (KILN_NCCL_LIBRARY, else libnccl.so.2); without it every entry
// point says why and how to fix it. Each collective is enqueued on the context's stream (or,
// for all_reduce_async, on the communicator's own stream) and returns at once. A collective that
// does not finish within the communicator's timeout (a rank that died or never called it), and
// any error NCCL reports, abort the communicator: the call that sees it, or the next one, throws
// kiln::Error naming the operation, the rank and the cause, instead of waiting forever.
#pragma once
#include <kiln/context.hpp>
#include <kiln/export.hpp>
#include <kiln/tensor.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

enum class ReduceOp { Sum, Prod, Max, Min, Avg };
KILN_API std::string_view reduce_op_name(ReduceOp op);   // "sum", "prod", "max", "min", "avg"

// The NCCL this process would use now.
struct NcclInfo {
    bool available = false;
    int version = 0;        // 10000 * major + 100 * minor + patch (22809 for 2.28.9)
    std::string library;    // KILN_NCCL_LIBRARY, else "libnccl.so.2"
    std::string why_not;    // when not available: why, and how to fix it
};
KILN_API NcclInfo nccl_info();

// What the ranks of one communicator join through: 128 bytes that one process makes
// (Communicator::new_id) and every rank is given. hex() is 256 lowercase hex digits.
struct KILN_API NcclId {
    std::array<uint8_t, 128> bytes{};
    std::string hex() const;
    // Throws kiln::Error saying what is wrong with `text` (length, a character that is not hex).
    static NcclId from_hex(std::string_view text);
    bool operator==(const NcclId&) const = default;
};

struct CommOptions {
    // Seconds the joining of the ranks, a collective or synchronize() may take before the
    // communicator is aborted and the error says so. 0: KILN_NCCL_TIMEOUT, else 600.
    double timeout_s = 0;
};

class Pending;

class KILN_API Communicator {
public:
    // A new id from NCCL. The process that makes it hosts the rendezvous: it must live until
    // every rank has joined (rank 0 makes it in from_env and through_file).
    static NcclId new_id();

    // Rank `rank` of `world_size` on `ctx` (a CUDA context; one rank per GPU). Returns once every
    // rank has joined, or throws when the timeout passes first.
    Communicator(Context& ctx, int world_size, int rank, const NcclId& id, CommOptions opts = {});
    // The id shared through the file `path`: rank 0 makes it and writes it (a temporary file
    // renamed into place, removed again once every rank has joined); the others wait for it.
    static std::unique_ptr<Communicator> through_file(Context& ctx, int world_size, int rank, const std::string& path,
                                                      CommOptions opts = {});
    // One process per GPU, as torchrun starts them: the rank and world size from RANK and
    // WORLD_SIZE, the id from KILN_NCCL_ID (hex) or else through the file KILN_NCCL_ID_FILE.
    static std::unique_ptr<Communicator> from_env(Context& ctx, CommOptions opts = {});
    // One process driving several GPUs: a communicator per context (each on its own device),
    // rank i on contexts[i]. Collectives over them must be given inside one CollectiveGroup.
    static std::vector<std::unique_ptr<Communicator>> for_contexts(const std::vector<Context*>& contexts,
                                                                   CommOptions opts = {});
    // Waits for this rank's collectives in flight (at most the timeout), then frees NCCL's
    // communicator. Destroy a communicator before its context.
    ~Communicator();
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const;
    int size() const;
    Context& context() const;
    double timeout_s() const;

    // ---- collectives, on the context's stream. Tensors are contiguous, of this communicator's
    // context, of one dtype (float64, float32, float16, bfloat16, int64, int32, uint64, uint32, int8, uint8;
    // bool for all_gather and broadcast; not int16 or uint16, which NCCL lacks). Every rank calls the same collectives in the same order.
    void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
    void all_reduce(const Tensor& src, Tensor& dst, ReduceOp op = ReduceOp::Sum);   // same shape
    // Each tensor in place, as one NCCL group (one launch for many small tensors).
    void all_reduce(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::Sum);
    // dst holds size() * src.size() elements: rank r's src at [r * src.size(), (r+1) * src.size()).
    void all_gather(const Tensor& src, Tensor& dst);
    // src holds size() * dst.size() elements; rank r gets the reduction of block r.
    void reduce_scatter(const Tensor& src, Tensor& dst, ReduceOp op = ReduceOp::Sum);
    // Every rank's t (or dst) becomes root's t (or src).
    void broadcast(Tensor& t, int root);
    void broadcast(const Tensor& src, Tensor& dst, int root);

    // The tensors all-reduced in place on the communicator's own stream, after everything the
    // context was given before the call, while the context goes on with later work (a backward
    // pass overlapping its gradients' all-reduce). The context's work after Pending::wait() is
    // ordered after the reduction; until then the tensors must not be used. Given inside a
    // CollectiveGroup, it is waited for after the group ends. A failure of the reduction is
    // reported by the communicator's next call or synchronize(), not by wait().
    Pending all_reduce_async(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::Sum);

    // Blocks until every collective given so far has finished; throws when one failed or the
    // timeout passed (the communicator is then aborted).
    void synchronize();
    // Ends the communicator at once (its collectives in flight stop); later calls throw.
    void abort();
    // Why the communicator failed; empty while it works.
    std::string error() const;

    struct Impl;

private:
    explicit Communicator(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// An all_reduce_async in flight.
class KILN_API Pending {
public:
    Pending();
    ~Pending();   // wait()s if it was not
    Pending(Pending&&) noexcept;
    Pending& operator=(Pending&&) noexcept;
    // The context's later work waits for the reduction (no host wait); the tensors are usable again.
    void wait();
    bool done() const;   // the reduction has finished on the GPU

    struct State;

private:
    friend class Communicator;
    std::unique_ptr<State> s_;
};

// The collectives a thread gives while a group is open launch together when it closes (NCCL's
// ncclGroupStart / ncclGroupEnd): required when one thread drives several communicators of one
// clique (Communicator::for_contexts), and it fuses many small collectives. Groups nest. end()
// throws what went wrong; the destructor, which must not, leaves it in the communicators'
// error(), and their next call throws it.
class KILN_API CollectiveGroup {
public:
    CollectiveGroup();
    ~CollectiveGroup();   // end(), unless called
    CollectiveGroup(const CollectiveGroup&) = delete;
    CollectiveGroup& operator=(const CollectiveGroup&) = delete;
    void end();

private:
    bool open_ = true;
};

} // namespace kiln
