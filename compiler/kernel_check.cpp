#include "compiler/kernel_check.hpp"

#include <fmt/format.h>

#include <cmath>
#include <vector>

namespace kiln::kir {

namespace {

using CT = ComputeType;

const char* type_name(CT t) { return compute_type_name(t); }

// Whether a value of compute type `t` fits what an op's signature asks for at one place.
bool fits(OpType want, CT t, CT own) {
    switch (want) {
    case OpType::F32: return t == CT::F32;
    case OpType::I32: return t == CT::I32;
    case OpType::F64: return t == CT::F64;
    case OpType::I64: return t == CT::I64;
    case OpType::Float: return is_float(t);
    case OpType::Int: return !is_float(t);
    case OpType::Same: return t == own;
    case OpType::Any: return true;
    case OpType::None: return false;
    }
    return false;
}
const char* kind_name(OpType t) {
    switch (t) {
    case OpType::F32: return "f32";
    case OpType::I32: return "i32";
    case OpType::F64: return "f64";
    case OpType::I64: return "i64";
    case OpType::Float: return "f32 or f64";
    case OpType::Int: return "i32 or i64";
    default: return "any type";
    }
}

using T = OpType;

bool is_comparison(Op op) {
    return op == Op::Eq || op == Op::Ne || op == Op::Lt || op == Op::Le || op == Op::Gt || op == Op::Ge;
}

// One instruction alone: op and type in range, operands earlier instructions of the right
// types, its index naming something that exists.
std::string instr_problem(const Kernel& k, int id) {
    const Instr& in = k.instrs[id];
    if (in.op > kLastOp) return fmt::format("instruction %{} has op {}, not an op (0..{})", id, (int)in.op, (int)kLastOp);
    if ((int)in.type >= kNumComputeTypes)
        return fmt::format("instruction %{} has type {}, not a compute type (0 f32, 1 i32, 2 f64, 3 i64)", id, (int)in.type);
    const char* name = op_name(in.op);
    const OpInfo& sig = op_info(in.op);
    if (!fits(sig.result, in.type, in.type))
        return fmt::format("instruction %{} ({}) has type {}; {} gives {}", id, name, type_name(in.type), name,
                           kind_name(sig.result));
    const int n_ops = arity(in.op);
    for (int i = 0; i < 3; ++i) {
        const int a = in.a[i];
        if (i >= n_ops) {
            if (a != -1) return fmt::format("instruction %{} ({}) reads {} operands, but operand {} is %{} (not -1)", id, name, n_ops, i, a);
            continue;
        }
        if (a < 0 || a >= id)
            return fmt::format("instruction %{} ({}): operand {} is %{}, not an earlier instruction ({})", id, name, i, a,
                               id == 0 ? std::string("there is none") : fmt::format("%0..%{}", id - 1));
        const CT at = k.instrs[a].type;
        const T want = sig.operand[i];
        if (!fits(want, at, in.type))
            return fmt::format("instruction %{} ({} {}): operand {} (%{}) is {}, which {} does not take there", id, name,
                               type_name(in.type), i, a, type_name(at), name);
    }
    if (is_comparison(in.op) && k.instrs[in.a[0]].type != k.instrs[in.a[1]].type)
        return fmt::format("instruction %{} ({}) compares %{} ({}) with %{} ({}): operands of one type", id, name, in.a[0],
                           type_name(k.instrs[in.a[0]].type), in.a[1], type_name(k.instrs[in.a[1]].type));
    const int nbuf = (int)k.buffers.size();
    switch (in.op) {
    case Op::ParamF:
        if (in.index < 0 || in.index >= k.num_fparams - (is_wide(in.type) ? 1 : 0))
            return fmt::format("instruction %{} (paramf{}) reads fp[{}]{}; the kernel has {} float parameters", id,
                               is_wide(in.type) ? " f64" : "", in.index, is_wide(in.type) ? " and the next" : "", k.num_fparams);
        break;
    case Op::ParamI:
        if (in.index < 0 || in.index >= k.num_iparams - (is_wide(in.type) ? 1 : 0))
            return fmt::format("instruction %{} (parami{}) reads ip[{}]{}; the kernel has {} integer parameters", id,
                               is_wide(in.type) ? " i64" : "", in.index, is_wide(in.type) ? " and the next" : "", k.num_iparams);
        break;
    case Op::ConstF:
        if (in.type == CT::F32 && !std::isnan(in.fimm) && (double)(float)in.fimm != in.fimm)
            return fmt::format("instruction %{} (constf f32) holds {}, not a float32 value", id, in.fimm);
        break;
    case Op::ConstI:
        if (in.type == CT::I32 && (int64_t)(int32_t)in.iimm != in.iimm)
            return fmt::format("instruction %{} (consti i32) holds {}, not an int32 value", id, in.iimm);
        break;
    case Op::Load:
    case Op::Gather:
        if (in.index < 0 || in.index >= nbuf)
            return fmt::format("instruction %{} ({}) reads buf{}; the kernel has {} buffers", id, name, in.index, nbuf);
        if (k.buffers[in.index].output)
            return fmt::format("instruction %{} ({}) reads buf{}, an output (a kernel never reads what it writes)", id, name, in.index);
        if (in.type != compute_type(k.buffers[in.index].dtype))
            return fmt::format("instruction %{} ({}) has type {}, but buf{} ({}) loads as {}", id, name, type_name(in.type), in.index,
                               dtype_name(k.buffers[in.index].dtype), type_name(compute_type(k.buffers[in.index].dtype)));
        if (in.op == Op::Gather && (in.aux < 0 || in.aux >= k.num_iparams))
            return fmt::format("instruction %{} (gather) takes its stride from ip[{}]; the kernel has {} integer parameters", id,
                               in.aux, k.num_iparams);
        break;
    case Op::Coord:
        if (in.index < 0 || in.index >= k.rank)
            return fmt::format("instruction %{} (coord) reads dim {}; the kernel has rank {}", id, in.index, k.rank);
        break;
    case Op::AccResult:
        if (in.index < 0 || in.index >= (int)k.accums.size())
            return fmt::format("instruction %{} (acc_result) reads acc{}; the kernel has {} accumulators", id, in.index, k.accums.size());
        if (in.type != acc_result_type(k.accums[in.index]))
            return fmt::format("instruction %{} (acc_result) has type {}; acc{} yields {}", id, type_name(in.type), in.index,
                               type_name(acc_result_type(k.accums[in.index])));
        break;
    default: break;
    }
    return {};
}

} // namespace

int arity(Op op) { return op_info(op).arity; }

ComputeType acc_result_type(const Accum& a) {
    return a.kind == AccKind::ArgMax || a.kind == AccKind::ArgMin ? CT::I32 : a.type;
}

std::string kernel_problem(const Kernel& k) {
    if (k.rank < 0) return fmt::format("rank {} is negative", k.rank);
    if ((int)k.reduced.size() != k.rank)
        return fmt::format("{} reduced flags for rank {} (one per dim)", k.reduced.size(), k.rank);
    if (k.buffers.empty()) return "no buffers (a kernel writes at least one)";
    for (size_t b = 0; b < k.buffers.size(); ++b) {
        const Buffer& buf = k.buffers[b];
        if ((int)buf.dtype >= kNumDTypes)
            return fmt::format("buf{} has dtype {}, not a dtype (0..{})", b, (int)buf.dtype, kNumDTypes - 1);
        if ((int)buf.layout.size() != k.rank)
            return fmt::format("buf{} has {} stride kinds for rank {} (one per dim)", b, buf.layout.size(), k.rank);
        for (StrideKind s : buf.layout)
            if (s != StrideKind::Zero && s != StrideKind::One && s != StrideKind::Any)
                return fmt::format("buf{} has stride kind {}, not one (0 zero, 1 one, 2 any)", b, (int)s);
        if (buf.hist && !(buf.output && is_float(buf.dtype) && buf.dtype != DType::Float64))
            return fmt::format("buf{} ({} {}) is counted into the histogram; only float32 and 16-bit float outputs are", b,
                               buf.output ? "output" : "input", dtype_name(buf.dtype));
        if (buf.hist && k.hist.bins == 0) return fmt::format("buf{} is counted into the histogram, but the kernel has none", b);
    }
    if (k.hist.bins < 0 || k.hist.bins > kMaxHistBins || k.hist.offset < -kMaxHistOffset || k.hist.offset > kMaxHistOffset)
        return fmt::format("histogram of {} bins from 2^{}; valid: 0 to {} bins from 2^-{} to 2^{}", k.hist.bins,
                           k.hist.offset, kMaxHistBins, kMaxHistOffset, kMaxHistOffset);
    if (k.num_fparams < 0 || k.num_iparams < 0)
        return fmt::format("{} float and {} integer parameters: counts are not negative", k.num_fparams, k.num_iparams);
    const int n = (int)k.instrs.size();
    for (size_t a = 0; a < k.accums.size(); ++a) {
        const Accum& ac = k.accums[a];
        if (ac.kind > kLastAccKind)
            return fmt::format("acc{} has kind {}, not an accumulator kind (0..{})", a, (int)ac.kind, (int)kLastAccKind);
        if ((int)ac.type >= kNumComputeTypes)
            return fmt::format("acc{} has type {}, not a compute type (0 f32, 1 i32, 2 f64, 3 i64)", a, (int)ac.type);
    }
    for (int id = 0; id < n; ++id)
        if (std::string p = instr_problem(k, id); !p.empty()) return p;
    for (size_t a = 0; a < k.accums.size(); ++a) {
        const Accum& ac = k.accums[a];
        if (ac.value < 0 || ac.value >= n)
            return fmt::format("acc{} reduces %{}; the kernel has {} instructions", a, ac.value, n);
        if (k.instrs[ac.value].type != ac.type)
            return fmt::format("acc{} has type {} but reduces %{} of type {}", a, type_name(ac.type), ac.value,
                               type_name(k.instrs[ac.value].type));
    }

    if (k.blocks.empty()) return "no blocks (a kernel runs at least one)";
    std::vector<int> block_of(n, -1), acc_block(k.accums.size(), -1), position(n, -1);
    for (size_t bi = 0; bi < k.blocks.size(); ++bi) {
        const Block& b = k.blocks[bi];
        for (size_t at = 0; at < b.instrs.size(); ++at) {
            const int id = b.instrs[at];
            if (id < 0 || id >= n) return fmt::format("block {} lists %{}; the kernel has {} instructions", bi, id, n);
            if (block_of[id] >= 0) return fmt::format("%{} is listed by block {} and block {} (at most one)", id, block_of[id], bi);
            block_of[id] = (int)bi;
            position[id] = (int)at;
        }
        for (int a : b.accums) {
            if (a < 0 || a >= (int)k.accums.size())
                return fmt::format("block {} lists acc{}; the kernel has {} accumulators", bi, a, k.accums.size());
            if (!b.loop) return fmt::format("block {} is a Point block but lists acc{} (only Loop blocks accumulate)", bi, a);
            if (acc_block[a] >= 0) return fmt::format("acc{} is listed by block {} and block {} (exactly one)", a, acc_block[a], bi);
            acc_block[a] = (int)bi;
            if (block_of[k.accums[a].value] != (int)bi)
                return fmt::format("acc{} reduces %{}, which block {} does not compute", a, k.accums[a].value, bi);
        }
    }
    for (size_t a = 0; a < k.accums.size(); ++a)
        if (acc_block[a] < 0) return fmt::format("acc{} is listed by no block (exactly one Loop block)", a);

    // A value is visible in block `bi` at list position `at` when its block computed it earlier
    // in the same list, or is an earlier Point block.
    auto visible = [&](int v, size_t bi, int at) {
        const int home = block_of[v];
        if (home == (int)bi) return position[v] < at;
        return home >= 0 && home < (int)bi && !k.blocks[home].loop;
    };
    for (size_t bi = 0; bi < k.blocks.size(); ++bi) {
        const Block& b = k.blocks[bi];
        for (int id : b.instrs) {
            const Instr& in = k.instrs[id];
            for (int i = 0; i < arity(in.op); ++i)
                if (!visible(in.a[i], bi, position[id]))
                    return fmt::format("%{} ({}) in block {} reads %{}, which is not visible there (computed {})", id,
                                       op_name(in.op), bi, in.a[i],
                                       block_of[in.a[i]] < 0 ? std::string("by no block")
                                                             : fmt::format("later or in block {}", block_of[in.a[i]]));
            if (in.op == Op::AccResult && acc_block[in.index] >= (int)bi)
                return fmt::format("%{} in block {} reads acc{}, which block {} computes (only earlier blocks' results are "
                                   "visible)", id, bi, in.index, acc_block[in.index]);
        }
        for (const Store& st : b.stores) {
            if (st.buffer < 0 || st.buffer >= (int)k.buffers.size())
                return fmt::format("block {} stores to buf{}; the kernel has {} buffers", bi, st.buffer, k.buffers.size());
            if (!k.buffers[st.buffer].output) return fmt::format("block {} stores to buf{}, an input", bi, st.buffer);
            if (st.value < 0 || st.value >= n)
                return fmt::format("block {} stores %{}; the kernel has {} instructions", bi, st.value, n);
            if (!visible(st.value, bi, (int)b.instrs.size()))
                return fmt::format("block {} stores %{}, which is not visible there", bi, st.value);
            const CT want = compute_type(k.buffers[st.buffer].dtype);
            if (k.instrs[st.value].type != want)
                return fmt::format("block {} stores %{} ({}) to buf{} ({}), which takes {}", bi, st.value,
                                   type_name(k.instrs[st.value].type), st.buffer, dtype_name(k.buffers[st.buffer].dtype),
                                   type_name(want));
        }
    }
    if (k.full_reduce) {
        if (k.rank == 0) return "a full reduction of rank 0 (it reduces at least one dim)";
        for (int d = 0; d < k.rank; ++d)
            if (!k.reduced[d]) return fmt::format("a full reduction with parallel dim {} (all dims are reduced)", d);
        if (k.blocks.size() != 2 || !k.blocks[0].loop || k.blocks[1].loop)
            return "a full reduction has exactly two blocks: Loop, then Point";
    }
    return {};
}

} // namespace kiln::kir
