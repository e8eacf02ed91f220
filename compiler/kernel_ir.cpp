#include "compiler/kernel_ir.hpp"

#include <fmt/format.h>

namespace kiln::kir {

const char* op_name(Op op) {
    static const char* names[] = {"constf", "consti", "paramf", "parami", "load", "gather", "coord", "linear_id",
                                  "acc_result", "neg", "abs", "sqrt", "exp", "exp2", "log", "log2", "tanh", "rint",
                                  "sign", "isfinite", "to_f32", "to_i32", "wrap_i8", "wrap_u8", "to_bool", "add", "sub",
                                  "mul", "div", "pow", "max", "min", "eq", "ne", "lt", "le", "gt", "ge", "and", "or",
                                  "xor", "shl", "shr", "mulhi", "select"};
    return names[(int)op];
}

std::string to_string(const Kernel& k) {
    static const char* acc_names[] = {"sum", "max", "min", "argmax", "argmin"};
    std::string s = fmt::format("kernel {} rank {} reduced [", k.name, k.rank);
    for (bool r : k.reduced) s += r ? 'R' : 'P';
    s += k.full_reduce ? "] full\n" : "]\n";
    for (size_t b = 0; b < k.buffers.size(); ++b) {
        s += fmt::format("  buf{} {} {} strides ", b, dtype_name(k.buffers[b].dtype), k.buffers[b].output ? "out" : "in");
        for (auto l : k.buffers[b].layout) s += "01x"[(int)l];
        s += "\n";
    }
    for (size_t bi = 0; bi < k.blocks.size(); ++bi) {
        const Block& b = k.blocks[bi];
        s += fmt::format("  block {} ({}):\n", bi, b.loop ? "loop over reduced dims" : "once per point");
        for (int id : b.instrs) {
            const Instr& in = k.instrs[id];
            std::string args;
            for (int a : in.a)
                if (a >= 0) args += fmt::format(" %{}", a);
            std::string extra;
            if (in.op == Op::ConstF) extra = fmt::format(" {}", in.fimm);
            else if (in.op == Op::ConstI) extra = fmt::format(" {}", in.iimm);
            else if (in.op == Op::ParamF || in.op == Op::ParamI || in.op == Op::Load || in.op == Op::Gather ||
                     in.op == Op::Coord || in.op == Op::AccResult)
                extra = fmt::format(" #{}", in.index);
            s += fmt::format("    %{} = {} {}{}{}\n", id, op_name(in.op), in.type == ComputeType::F32 ? "f32" : "i32", args, extra);
        }
        for (int a : b.accums)
            s += fmt::format("    acc{} = {}(%{})\n", a, acc_names[(int)k.accums[a].kind], k.accums[a].value);
        for (auto& st : b.stores) s += fmt::format("    store buf{} <- %{}\n", st.buffer, st.value);
    }
    return s;
}

} // namespace kiln::kir
