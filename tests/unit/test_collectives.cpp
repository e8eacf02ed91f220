// The collectives' behaviour where no GPU or no NCCL is needed: every misuse error (argument
// checks, environment, ids, the id file) and what each entry point says when NCCL is missing.
// The collectives themselves run in tests/gpu/test_collectives_cuda.cpp and
// tests/python/test_distributed.py.
#include "tests/support/catch.hpp"
#include "tests/support/error_message.hpp"

#include <kiln/kiln.hpp>

#include "runtime/collective_checks.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <unistd.h>

using namespace kiln;
using kiln::test::error_message;
using collective::Op;
using Catch::Matchers::Contains;

namespace {

// Sets (or, with nullopt, unsets) an environment variable for a scope.
struct EnvVar {
    std::string name;
    std::optional<std::string> old;
    EnvVar(const char* n, std::optional<std::string> v) : name(n) {
        if (const char* o = std::getenv(n)) old = o;
        if (v) setenv(n, v->c_str(), 1);
        else unsetenv(n);
    }
    ~EnvVar() {
        if (old) setenv(name.c_str(), old->c_str(), 1);
        else unsetenv(name.c_str());
    }
};

Context& cpu() {
    static Context c(ContextOptions{"cpu"});
    return c;
}

} // namespace

TEST_CASE("collectives: tensor checks name the op, the tensors and what is valid") {
    Context& c = cpu();
    Tensor a = c.zeros({4, 6}, DType::Float32), b = c.zeros({4, 6}, DType::Float32);
    // Valid forms pass: out of place, in place, every collective's sizes.
    collective::check_tensors(Op::AllReduce, c, 2, 0, a, b, ReduceOp::Sum);
    collective::check_tensors(Op::AllReduce, c, 2, 0, a, a, ReduceOp::Avg);
    Tensor big = c.zeros({8, 6}, DType::Float32);
    collective::check_tensors(Op::AllGather, c, 2, 0, a, big, ReduceOp::Sum);
    collective::check_tensors(Op::ReduceScatter, c, 2, 1, big, a, ReduceOp::Max);
    // In place: this rank's block of the larger buffer.
    collective::check_tensors(Op::AllGather, c, 2, 1, big.slice({Slice::range(4, 8)}), big, ReduceOp::Sum);
    collective::check_tensors(Op::ReduceScatter, c, 2, 1, big, big.slice({Slice::range(4, 8)}), ReduceOp::Sum);

    CHECK_THAT(error_message([&] { collective::check_tensors(Op::AllReduce, c, 2, 0, a, c.zeros({6, 4}, DType::Float32), ReduceOp::Sum); }),
               Contains("all_reduce: the source is (4, 6) float32 and the destination (6, 4) float32; they have one shape"));
    CHECK_THAT(error_message([&] { collective::check_tensors(Op::AllReduce, c, 2, 0, a, c.zeros({4, 6}, DType::Float16), ReduceOp::Sum); }),
               Contains("a collective keeps the dtype"));
    CHECK_THAT(error_message([&] { collective::check_tensors(Op::AllReduce, c, 2, 0, a.T(), a.T(), ReduceOp::Sum); }),
               Contains("all_reduce: the source tensor (6, 4) float32 is not contiguous (strides (1, 6)); collectives take contiguous tensors"));
    CHECK_THAT(error_message([&] { collective::check_tensors(Op::AllGather, c, 3, 0, a, big, ReduceOp::Sum); }),
               Contains("all_gather: the destination (8, 6) float32 holds 48 elements; it holds 3 ranks x the source's 24 = 72"));
    CHECK_THAT(error_message([&] { collective::check_tensors(Op::ReduceScatter, c, 3, 0, big, a, ReduceOp::Sum); }),
               Contains("reduce_scatter: the source (8, 6) float32 holds 48 elements; it holds 3 ranks x the destination's 24 = 72"));
    Tensor flags = c.zeros({4}, DType::Bool);
    CHECK_THAT(error_message([&] { collective::check_tensors(Op::AllReduce, c, 2, 0, flags, flags, ReduceOp::Sum); }),
               Contains("all_reduce: (4,) bool cannot be reduced; valid dtypes: float64, float32, float16, bfloat16, int64, int32, "
                        "uint64, uint32, int8, uint8"));
    Tensor shorts = c.zeros({4}, DType::Int16);
    CHECK_THAT(error_message([&] { collective::check_tensors(Op::Broadcast, c, 2, 0, shorts, shorts, ReduceOp::Sum); }),
               Contains("broadcast: (4,) int16: NCCL has no 16-bit integer type"));
    collective::check_tensors(Op::Broadcast, c, 2, 0, flags, flags, ReduceOp::Sum);   // bool travels
    Tensor counts = c.zeros({4}, DType::Int32);
    CHECK_THAT(error_message([&] { collective::check_tensors(Op::AllReduce, c, 2, 0, counts, counts, ReduceOp::Avg); }),
               Contains("the average of (4,) int32 values would be truncated"));
    // Partial overlap, and in place at the wrong rank's block.
    Tensor row = c.zeros({10}, DType::Float32);
    CHECK_THAT(error_message([&] { collective::check_tensors(Op::AllReduce, c, 2, 0, row.slice({Slice::range(0, 6)}), row.slice({Slice::range(4, 10)}), ReduceOp::Sum); }),
               Contains("overlap; valid: no overlap, or the source and destination are the same tensor"));
    CHECK_THAT(error_message([&] { collective::check_tensors(Op::AllGather, c, 2, 0, big.slice({Slice::range(4, 8)}), big, ReduceOp::Sum); }),
               Contains("the source is the destination's block of this rank"));
    CHECK_THAT(error_message([&] { collective::check_tensors(Op::AllReduce, c, 2, 0, Tensor(), a, ReduceOp::Sum); }),
               Contains("all_reduce: the source tensor is undefined"));
    CHECK_THAT(error_message([&] { collective::check_root(4, 4); }),
               Contains("broadcast: root 4 is not a rank of this communicator; valid: 0 to 3"));
    CHECK_THAT(error_message([&] { collective::check_root(4, -1); }), Contains("root -1"));
}

TEST_CASE("collectives: members, timeouts and the CPU context") {
    CHECK_THAT(error_message([&] { collective::check_member("Communicator", cpu(), 0, 0); }),
               Contains("Communicator: world size 0; a communicator has at least 1 rank"));
    CHECK_THAT(error_message([&] { collective::check_member("Communicator", cpu(), 2, 2); }),
               Contains("Communicator: rank 2 of a world of 2; valid ranks: 0 to 1"));
    CHECK_THAT(error_message([&] { collective::check_member("Communicator", cpu(), 2, 0); }),
               Contains("Communicator: the context runs on cpu; collectives run between CUDA devices through NCCL"));
    // The public constructors check the same before anything else (no NCCL needed to say so).
    CHECK_THAT(error_message([&] { Communicator comm(cpu(), 1, 0, NcclId{}); }), Contains("the context runs on cpu"));
    CHECK_THAT(error_message([&] { Communicator::for_contexts({&cpu()}); }), Contains("the context runs on cpu"));
    CHECK_THAT(error_message([&] { Communicator::for_contexts({}); }), Contains("no contexts"));

    CHECK(collective::timeout_seconds(2.5) == 2.5);
    {
        EnvVar t("KILN_NCCL_TIMEOUT", std::nullopt);
        CHECK(collective::timeout_seconds(0) == 600);
    }
    {
        EnvVar t("KILN_NCCL_TIMEOUT", "30");
        CHECK(collective::timeout_seconds(0) == 30);
    }
    {
        EnvVar t("KILN_NCCL_TIMEOUT", "soon");   // warned about, then the default
        CHECK(collective::timeout_seconds(0) == 600);
    }
    CHECK_THAT(error_message([&] { collective::timeout_seconds(-1); }), Contains("timeout -1 s; valid: a positive number"));
    CHECK_THAT(error_message([&] { collective::timeout_seconds(std::nan("")); }), Contains("valid: a positive number"));
}

TEST_CASE("collectives: ids round-trip through hex; bad text is refused") {
    NcclId id;
    for (size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = (uint8_t)(i * 37 + 11);
    std::string hex = id.hex();
    CHECK(hex.size() == 256);
    CHECK(NcclId::from_hex(hex) == id);
    std::string upper = hex;
    for (auto& ch : upper) ch = (char)std::toupper((unsigned char)ch);
    CHECK(NcclId::from_hex(upper) == id);
    CHECK_THAT(error_message([&] { NcclId::from_hex("abc"); }), Contains("an id is 256 hex digits (as NcclId::hex() writes it), got 3 characters"));
    std::string bad = hex;
    bad[17] = 'g';
    CHECK_THAT(error_message([&] { NcclId::from_hex(bad); }), Contains("character 17 of the id is 'g'"));
    bad[17] = '\n';
    CHECK_THAT(error_message([&] { NcclId::from_hex(bad); }), Contains("(code 10), not a hex digit"));
}

TEST_CASE("collectives: the launcher's environment, every missing or bad variable named") {
    {
        EnvVar r("RANK", std::nullopt), w("WORLD_SIZE", std::nullopt), i("KILN_NCCL_ID", std::nullopt),
            f("KILN_NCCL_ID_FILE", std::nullopt);
        std::string m = error_message([] { collective::rank_from_env(); });
        CHECK_THAT(m, Contains("WORLD_SIZE is not set"));
        CHECK_THAT(m, Contains("RANK is not set"));
        CHECK_THAT(m, Contains("neither KILN_NCCL_ID"));
        CHECK_THAT(m, Contains("torchrun"));
        CHECK_THAT(error_message([] { Communicator::from_env(cpu()); }), Contains("WORLD_SIZE is not set"));
    }
    {
        EnvVar r("RANK", "2"), w("WORLD_SIZE", "2"), i("KILN_NCCL_ID", "xyz"), f("KILN_NCCL_ID_FILE", std::nullopt);
        std::string m = error_message([] { collective::rank_from_env(); });
        CHECK_THAT(m, Contains("RANK is 2 but WORLD_SIZE is 2: ranks go from 0 to 1"));
        CHECK_THAT(m, Contains("KILN_NCCL_ID is not an id"));
    }
    {
        EnvVar r("RANK", "one"), w("WORLD_SIZE", "0"), i("KILN_NCCL_ID", std::nullopt), f("KILN_NCCL_ID_FILE", "/tmp/x");
        std::string m = error_message([] { collective::rank_from_env(); });
        CHECK_THAT(m, Contains("RANK"));
        CHECK_THAT(m, Contains("WORLD_SIZE"));
    }
    {
        NcclId id;
        id.bytes[0] = 7;
        EnvVar r("RANK", "1"), w("WORLD_SIZE", "4"), i("KILN_NCCL_ID", id.hex()), f("KILN_NCCL_ID_FILE", std::nullopt);
        auto e = collective::rank_from_env();
        CHECK(e.rank == 1);
        CHECK(e.world == 4);
        CHECK(e.has_id);
        CHECK(e.id == id);
    }
    {
        EnvVar r("RANK", "0"), w("WORLD_SIZE", "2"), i("KILN_NCCL_ID", std::nullopt), f("KILN_NCCL_ID_FILE", "/tmp/kiln-id");
        auto e = collective::rank_from_env();
        CHECK(!e.has_id);
        CHECK(e.id_file == "/tmp/kiln-id");
    }
}

TEST_CASE("collectives: the id file is written whole and waited for, with a timeout") {
    auto dir = std::filesystem::temp_directory_path() / ("kiln-id-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::string path = (dir / "id").string();
    NcclId id;
    id.bytes[5] = 200;
    std::thread writer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        collective::write_id_file(path, id);
    });
    NcclId got = collective::read_id_file(path, 1, 10);
    writer.join();
    CHECK(got == id);
    // No temporary is left beside it.
    int files = 0;
    for (auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
    CHECK(files == 1);
    std::filesystem::remove(path);
    CHECK_THAT(error_message([&] { collective::read_id_file(path, 3, 0.2); }),
               Contains("rank 3 waited 0 s for rank 0 to write the id file"));
    { std::ofstream(path) << "not an id\n"; }
    CHECK_THAT(error_message([&] { collective::read_id_file(path, 1, 1); }), Contains("an id is 256 hex digits"));
    // A file far longer than an id is refused after reading a little of it; a device is refused
    // before it is opened.
    { std::ofstream(path) << std::string(50 << 20, 'a'); }
    CHECK_THAT(error_message([&] { collective::read_id_file(path, 1, 1); }), Contains("got 512 characters"));
    CHECK_THAT(error_message([&] { collective::read_id_file("/dev/zero", 1, 1); }),
               Contains("the id file /dev/zero is not a regular file"));
    CHECK_THAT(error_message([&] { collective::write_id_file((dir / "missing" / "id").string(), id); }),
               Contains("could not write the id file"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("collectives: without NCCL every entry point says why and how to fix it") {
    EnvVar lib("KILN_NCCL_LIBRARY", "/nonexistent/libnccl.so.2");
    NcclInfo info = nccl_info();
    CHECK(!info.available);
    CHECK_THAT(info.why_not, Contains("/nonexistent/libnccl.so.2"));
    CHECK_THAT(info.why_not, Contains("KILN_NCCL_LIBRARY"));
    CHECK_THAT(error_message([] { Communicator::new_id(); }), Contains("Communicator::new_id: NCCL is not available"));
    CHECK_THAT(error_message([] { CollectiveGroup g; }), Contains("CollectiveGroup: NCCL is not available"));
    // A library that is not NCCL at all.
    EnvVar other("KILN_NCCL_LIBRARY", "libm.so.6");
    info = nccl_info();
    CHECK(!info.available);
    CHECK_THAT(info.why_not, Contains("has no symbol nccl"));
}

TEST_CASE("collectives: reduce_op_name") {
    CHECK(reduce_op_name(ReduceOp::Sum) == "sum");
    CHECK(reduce_op_name(ReduceOp::Prod) == "prod");
    CHECK(reduce_op_name(ReduceOp::Max) == "max");
    CHECK(reduce_op_name(ReduceOp::Min) == "min");
    CHECK(reduce_op_name(ReduceOp::Avg) == "avg");
}

TEST_CASE("collectives: a source never written is an error") {
    Context& c = cpu();
    Tensor fresh = c.empty({3, 2}, DType::Float16);
    CHECK_THAT(error_message([&] { collective::check_written(Op::AllReduce, fresh); }),
               Contains("all_reduce: reads a float16 tensor of shape (3, 2) that was never written"));
    collective::check_written(Op::AllReduce, c.zeros({3, 2}, DType::Float16));
    collective::check_written(Op::AllGather, c.empty({0}, DType::Float32));   // nothing to read
}
