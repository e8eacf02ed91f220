// What the collectives check before NCCL sees anything, and how the ranks of one job find each
// other (environment variables, the id file).
//
// Why it exists: NCCL answers a bad argument with ncclInvalidArgument at best and with a hang or
// a wrong sum at worst, and a rank that misreads its environment waits for peers that never
// come. Each misuse is caught here with a message naming the operation, the tensors and what is
// valid. None of it needs NCCL or a GPU, so it is tested everywhere (tests/unit, CI).
#pragma once
#include <kiln/collectives.hpp>

#include <string>

namespace kiln::collective {

enum class Op { AllReduce, AllGather, ReduceScatter, Broadcast };
const char* op_name(Op op);   // "all_reduce", ...

// Throws kiln::Error when src -> dst is not a valid `op` for a communicator of `world` ranks
// whose context is `ctx`: a tensor of another context, not contiguous, a dtype NCCL cannot
// reduce (or carry), dtypes that differ, sizes that do not fit, buffers that overlap other than
// in NCCL's in-place forms (for all_gather and reduce_scatter those depend on `rank`).
void check_tensors(Op op, const Context& ctx, int world, int rank, const Tensor& src, const Tensor& dst, ReduceOp red);
// A source that was never written (empty() and not assigned) holds garbage: an error, as for
// any other read (broadcast's source is read on the root only).
void check_written(Op op, const Tensor& src);
// The root of a broadcast: 0 <= root < world.
void check_root(int world, int root);
// A communicator's rank and size, and that the context is a CUDA one.
void check_member(const char* op, const Context& ctx, int world, int rank);
// The timeout in seconds: `requested` when > 0, else KILN_NCCL_TIMEOUT, else 600. Throws when
// `requested` is negative or not finite.
double timeout_seconds(double requested);

// The rank, world size and id source of a process started as torchrun starts them.
struct EnvRank {
    int rank = 0;
    int world = 0;
    bool has_id = false;     // KILN_NCCL_ID was set (and parsed)
    NcclId id;
    std::string id_file;     // else KILN_NCCL_ID_FILE
};
// Throws kiln::Error naming each variable that is missing or not valid.
EnvRank rank_from_env();

// Rank 0's side of the id file: written to a temporary file in the same directory, then renamed
// over `path`, so no rank reads half of it.
void write_id_file(const std::string& path, const NcclId& id);
// The others' side: waits (polling) until `path` holds an id, at most `timeout_s` seconds.
NcclId read_id_file(const std::string& path, int rank, double timeout_s);

} // namespace kiln::collective
