// kiln::Communicator in a build without the CUDA toolkit's headers or nccl.h: every entry point
// says so. The argument checks (runtime/collective_checks.cpp) are the same as everywhere.
#include "runtime/collective_checks.hpp"

#include "ir/error.hpp"

namespace kiln {

namespace {

const char* kWhy = "this build of kiln has no NCCL support (the CUDA toolkit or nccl.h was not found when it was built)";

[[noreturn]] void unavailable(const char* op) { fail(Error::Kind::Runtime, "{}: {}", op, kWhy); }

} // namespace

struct Communicator::Impl {};
struct Pending::State {};

NcclInfo nccl_info() { return {false, 0, "", kWhy}; }

NcclId Communicator::new_id() { unavailable("Communicator::new_id"); }
Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::Communicator(Context& ctx, int world_size, int rank, const NcclId&, CommOptions opts) {
    collective::timeout_seconds(opts.timeout_s);
    collective::check_member("Communicator", ctx, world_size, rank);
    unavailable("Communicator");
}
std::unique_ptr<Communicator> Communicator::through_file(Context& ctx, int world_size, int rank, const std::string&,
                                                         CommOptions opts) {
    collective::timeout_seconds(opts.timeout_s);
    collective::check_member("Communicator::through_file", ctx, world_size, rank);
    unavailable("Communicator::through_file");
}
std::unique_ptr<Communicator> Communicator::from_env(Context& ctx, CommOptions opts) {
    collective::EnvRank e = collective::rank_from_env();
    return through_file(ctx, e.world, e.rank, e.id_file, opts);
}
std::vector<std::unique_ptr<Communicator>> Communicator::for_contexts(const std::vector<Context*>& contexts, CommOptions) {
    for (size_t i = 0; i < contexts.size(); ++i)
        if (contexts[i]) collective::check_member("Communicator::for_contexts", *contexts[i], (int)contexts.size(), (int)i);
    unavailable("Communicator::for_contexts");
}
Communicator::~Communicator() = default;
int Communicator::rank() const { return 0; }
int Communicator::size() const { return 1; }
Context& Communicator::context() const { unavailable("Communicator::context"); }
double Communicator::timeout_s() const { return 0; }
void Communicator::all_reduce(Tensor&, ReduceOp) { unavailable("all_reduce"); }
void Communicator::all_reduce(const Tensor&, Tensor&, ReduceOp) { unavailable("all_reduce"); }
void Communicator::all_reduce(const std::vector<Tensor>&, ReduceOp) { unavailable("all_reduce"); }
void Communicator::all_gather(const Tensor&, Tensor&) { unavailable("all_gather"); }
void Communicator::reduce_scatter(const Tensor&, Tensor&, ReduceOp) { unavailable("reduce_scatter"); }
void Communicator::broadcast(Tensor&, int) { unavailable("broadcast"); }
void Communicator::broadcast(const Tensor&, Tensor&, int) { unavailable("broadcast"); }
Pending Communicator::all_reduce_async(const std::vector<Tensor>&, ReduceOp) { unavailable("all_reduce_async"); }
void Communicator::synchronize() { unavailable("synchronize"); }
void Communicator::abort() {}
std::string Communicator::error() const { return kWhy; }

Pending::Pending() = default;
Pending::~Pending() = default;
Pending::Pending(Pending&&) noexcept = default;
Pending& Pending::operator=(Pending&&) noexcept = default;
void Pending::wait() {}
bool Pending::done() const { return true; }

CollectiveGroup::CollectiveGroup() { unavailable("CollectiveGroup"); }
CollectiveGroup::~CollectiveGroup() = default;
void CollectiveGroup::end() {}

} // namespace kiln
