#include "runtime/collective_checks.hpp"

#include "compiler/env.hpp"
#include "ir/error.hpp"
#include "ir/storage.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace kiln {

std::string_view reduce_op_name(ReduceOp op) {
    switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Avg: return "avg";
    }
    return "?";
}

std::string NcclId::hex() const {
    static const char* digits = "0123456789abcdef";
    std::string s(bytes.size() * 2, '0');
    for (size_t i = 0; i < bytes.size(); ++i) {
        s[2 * i] = digits[bytes[i] >> 4];
        s[2 * i + 1] = digits[bytes[i] & 15];
    }
    return s;
}

NcclId NcclId::from_hex(std::string_view text) {
    NcclId id;
    if (text.size() != 2 * id.bytes.size())
        fail(Error::Kind::Value, "NcclId: an id is {} hex digits (as NcclId::hex() writes it), got {} characters",
             2 * id.bytes.size(), text.size());
    auto value = [&](size_t i) {
        char c = text[i];
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        fail(Error::Kind::Value, "NcclId: character {} of the id is '{}' (code {}), not a hex digit", i,
             std::isprint((unsigned char)c) ? std::string(1, c) : std::string("?"), (int)(unsigned char)c);
    };
    for (size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = (uint8_t)(value(2 * i) * 16 + value(2 * i + 1));
    return id;
}

namespace collective {

const char* op_name(Op op) {
    switch (op) {
    case Op::AllReduce: return "all_reduce";
    case Op::AllGather: return "all_gather";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::Broadcast: return "broadcast";
    }
    return "?";
}

namespace {

std::string describe(const Tensor& t) {
    return fmt::format("{} {}", shape_str(t.shape()), dtype_name(t.dtype()));
}

void check_one(const char* op, const char* which, const Context& ctx, const Tensor& t) {
    if (!t.defined()) fail(Error::Kind::Value, "{}: the {} tensor is undefined (a default-constructed Tensor)", op, which);
    if (!ctx.can_use(t))
        fail(Error::Kind::Value, "{}: the {} tensor {} is memory of {}, not of this communicator's context {}", op, which,
             describe(t), t.context().device_name(), ctx.device_name());
    if (!t.is_contiguous())
        fail(Error::Kind::Value,
             "{}: the {} tensor {} is not contiguous (strides {}); collectives take contiguous tensors: copy it first",
             op, which, describe(t), shape_str(t.strides()));
}

} // namespace

void check_tensors(Op kind, const Context& ctx, int world, int rank, const Tensor& src, const Tensor& dst, ReduceOp red) {
    const char* op = op_name(kind);
    check_one(op, "source", ctx, src);
    check_one(op, "destination", ctx, dst);
    bool reduces = kind == Op::AllReduce || kind == Op::ReduceScatter;
    if (src.dtype() != dst.dtype())
        fail(Error::Kind::Type, "{}: the source is {} and the destination {}; a collective keeps the dtype", op,
             describe(src), describe(dst));
    DType dt = src.dtype();
    if (dt == DType::Int16 || dt == DType::UInt16)
        fail(Error::Kind::Type, "{}: {}: NCCL has no 16-bit integer type; valid dtypes: float64, float32, float16, "
             "bfloat16, int64, int32, uint64, uint32, int8, uint8 and bool (not reduced)", op, describe(src));
    if (dt == DType::Bool && reduces)
        fail(Error::Kind::Type, "{}: {} cannot be reduced; valid dtypes: float64, float32, float16, bfloat16, int64, int32, "
             "uint64, uint32, int8, uint8", op, describe(src));
    if (reduces && red == ReduceOp::Avg && is_integer(dt))
        fail(Error::Kind::Type, "{}: the average of {} values would be truncated; avg takes float64, float32, float16 and "
             "bfloat16 (sum an integer tensor and divide)", op, describe(src));
    int64_t n = src.size(), m = dst.size();
    switch (kind) {
    case Op::AllReduce:
    case Op::Broadcast:
        if (src.shape() != dst.shape())
            fail(Error::Kind::Value, "{}: the source is {} and the destination {}; they have one shape", op, describe(src),
                 describe(dst));
        break;
    case Op::AllGather:
        if (m != n * world)
            fail(Error::Kind::Value, "{}: the destination {} holds {} elements; it holds {} ranks x the source's {} = {}", op,
                 describe(dst), m, world, n, n * world);
        break;
    case Op::ReduceScatter:
        if (n != m * world)
            fail(Error::Kind::Value, "{}: the source {} holds {} elements; it holds {} ranks x the destination's {} = {}", op,
                 describe(src), n, world, m, m * world);
        break;
    }
    // Overlap: only NCCL's in-place forms.
    size_t es = dtype_size(dt);
    auto lo_s = reinterpret_cast<uintptr_t>(src.data()), lo_d = reinterpret_cast<uintptr_t>(dst.data());
    uintptr_t hi_s = lo_s + (uintptr_t)n * es, hi_d = lo_d + (uintptr_t)m * es;
    bool overlap = n > 0 && m > 0 && lo_s < hi_d && lo_d < hi_s;
    if (!overlap) return;
    uintptr_t in_place = lo_d;
    const char* form = "the source and destination are the same tensor";
    if (kind == Op::AllGather) {
        in_place = lo_d + (uintptr_t)rank * n * es;
        form = "the source is the destination's block of this rank (dst[rank * n : (rank + 1) * n])";
    } else if (kind == Op::ReduceScatter) {
        in_place = lo_s + (uintptr_t)rank * m * es;
        form = "the destination is the source's block of this rank (src[rank * m : (rank + 1) * m], m the "
               "destination's size)";
        if (lo_d == in_place) return;
        fail(Error::Kind::Value, "{}: the source {} and destination {} overlap; valid: no overlap, or {}", op,
             describe(src), describe(dst), form);
    }
    if (lo_s == in_place) return;
    fail(Error::Kind::Value, "{}: the source {} and destination {} overlap; valid: no overlap, or {}", op, describe(src),
         describe(dst), form);
}

void check_written(Op op, const Tensor& src) {
    if (src.defined() && src.size() > 0 && !src.view().storage->written)
        fail(Error::Kind::Value, "{}: reads a {} tensor of shape {} that was never written (created by empty() and not "
             "assigned); assign it, or create it with zeros()/array()", op_name(op), dtype_name(src.dtype()),
             shape_str(src.shape()));
}

void check_root(int world, int root) {
    if (root < 0 || root >= world)
        fail(Error::Kind::Index, "broadcast: root {} is not a rank of this communicator; valid: 0 to {}", root, world - 1);
}

void check_member(const char* op, const Context& ctx, int world, int rank) {
    if (world < 1) fail(Error::Kind::Value, "{}: world size {}; a communicator has at least 1 rank", op, world);
    if (rank < 0 || rank >= world)
        fail(Error::Kind::Index, "{}: rank {} of a world of {}; valid ranks: 0 to {}", op, rank, world, world - 1);
    if (ctx.backend() != Backend::CUDA)
        fail(Error::Kind::Value, "{}: the context runs on {}; collectives run between CUDA devices through NCCL "
             "(make the context with device \"cuda:N\")", op, ctx.device_name());
}

double timeout_seconds(double requested) {
    if (!std::isfinite(requested) || requested < 0)
        fail(Error::Kind::Value, "Communicator: timeout {} s; valid: a positive number of seconds, or 0 for "
             "KILN_NCCL_TIMEOUT (else 600)", requested);
    if (requested > 0) return requested;
    if (auto v = env::integer("KILN_NCCL_TIMEOUT", 1, 1000000)) return (double)*v;
    return 600;
}

namespace {

std::optional<long long> env_int(const char* var, long long lo, long long hi, std::vector<std::string>& problems) {
    auto t = env::text(var);
    if (!t) {
        problems.push_back(fmt::format("{} is not set", var));
        return std::nullopt;
    }
    auto p = env::parse_integer(var, *t, lo, hi);
    if (!p.value) problems.push_back(p.problem);
    return p.value;
}

} // namespace

EnvRank rank_from_env() {
    std::vector<std::string> problems;
    EnvRank r;
    auto world = env_int("WORLD_SIZE", 1, 1 << 20, problems);
    auto rank = env_int("RANK", 0, 1 << 20, problems);
    if (world && rank && *rank >= *world)
        problems.push_back(fmt::format("RANK is {} but WORLD_SIZE is {}: ranks go from 0 to {}", *rank, *world, *world - 1));
    auto id = env::text("KILN_NCCL_ID");
    auto file = env::text("KILN_NCCL_ID_FILE");
    if (id) {
        try {
            r.id = NcclId::from_hex(*id);
            r.has_id = true;
        } catch (const Error& e) {
            problems.push_back(fmt::format("KILN_NCCL_ID is not an id ({})", e.what()));
        }
    } else if (file) {
        r.id_file = *file;
    } else {
        problems.push_back("neither KILN_NCCL_ID (the id in hex) nor KILN_NCCL_ID_FILE (a path every rank can read, "
                           "fresh for each job) is set");
    }
    if (!problems.empty()) {
        std::string all;
        for (auto& p : problems) all += (all.empty() ? "" : "; ") + p;
        fail(Error::Kind::Value, "Communicator::from_env: {}. A process per GPU gets RANK and WORLD_SIZE from its launcher "
             "(torchrun, python -m kiln.distributed.launch)", all);
    }
    r.world = (int)*world;
    r.rank = (int)*rank;
    return r;
}

void write_id_file(const std::string& path, const NcclId& id) {
    std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
    {
        std::ofstream f(tmp, std::ios::trunc);
        f << id.hex() << "\n";
        f.close();
        if (!f) fail(Error::Kind::Runtime, "Communicator: rank 0 could not write the id file {} (as {})", path, tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        fail(Error::Kind::Runtime, "Communicator: rank 0 could not rename {} to the id file {}", tmp, path);
    }
}

NcclId read_id_file(const std::string& path, int rank, double timeout_s) {
    auto start = std::chrono::steady_clock::now();
    auto sleep = std::chrono::milliseconds(1);
    for (;;) {
        // Only a regular file: a device never ends (/dev/zero) and a FIFO blocks past the timeout.
        std::error_code ec;
        const std::filesystem::file_status st = std::filesystem::status(path, ec);
        if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
            fail(Error::Kind::Value, "Communicator: the id file {} is not a regular file; rank 0 writes the id there "
                 "(KILN_NCCL_ID_FILE)", path);
        std::ifstream f(path);
        if (f) {
            std::string text;
            f.width(4 * sizeof(NcclId::bytes));   // at most this much of a file that is not an id
            f >> text;
            return NcclId::from_hex(text);   // rank 0 renames a whole file into place
        }
        double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (waited > timeout_s)
            fail(Error::Kind::Runtime, "Communicator: rank {} waited {:.0f} s for rank 0 to write the id file {}; is rank 0 "
                 "running, and do both see the same path?", rank, waited, path);
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
    }
}

} // namespace collective
} // namespace kiln
