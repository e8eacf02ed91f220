#include "compiler/kernel_ir.hpp"

#include <fmt/format.h>

namespace kiln::kir {

// A switch rather than a table so that adding an Op without a name is a -Wswitch warning.
const char* op_name(Op op) {
    switch (op) {
    case Op::ConstF: return "constf";
    case Op::ConstI: return "consti";
    case Op::ParamF: return "paramf";
    case Op::ParamI: return "parami";
    case Op::Load: return "load";
    case Op::Gather: return "gather";
    case Op::Coord: return "coord";
    case Op::LinearId: return "linear_id";
    case Op::AccResult: return "acc_result";
    case Op::Neg: return "neg";
    case Op::Abs: return "abs";
    case Op::Sqrt: return "sqrt";
    case Op::Exp: return "exp";
    case Op::Exp2: return "exp2";
    case Op::Log: return "log";
    case Op::Log2: return "log2";
    case Op::Tanh: return "tanh";
    case Op::Rint: return "rint";
    case Op::Sgn: return "sgn";
    case Op::Finite: return "finite";
    case Op::ToF32: return "to_f32";
    case Op::ToI32: return "to_i32";
    case Op::WrapI8: return "wrap_i8";
    case Op::WrapU8: return "wrap_u8";
    case Op::ToBool: return "to_bool";
    case Op::Add: return "add";
    case Op::Sub: return "sub";
    case Op::Mul: return "mul";
    case Op::Div: return "div";
    case Op::Pow: return "pow";
    case Op::Maximum: return "maximum";
    case Op::Minimum: return "minimum";
    case Op::Eq: return "eq";
    case Op::Ne: return "ne";
    case Op::Lt: return "lt";
    case Op::Le: return "le";
    case Op::Gt: return "gt";
    case Op::Ge: return "ge";
    case Op::And: return "and";
    case Op::Or: return "or";
    case Op::Xor: return "xor";
    case Op::Shl: return "shl";
    case Op::Shr: return "shr";
    case Op::MulHi: return "mulhi";
    case Op::Select: return "select";
    case Op::AsI32: return "as_i32";
    case Op::AsF32: return "as_f32";
    case Op::Floor: return "floor";
    case Op::Fmod: return "fmod";
    case Op::IDiv: return "idiv";
    case Op::IRem: return "irem";
    }
    return "?";
}

namespace {

const char* acc_name(AccKind k) {
    switch (k) {
    case AccKind::Sum: return "sum";
    case AccKind::Max: return "max";
    case AccKind::Min: return "min";
    case AccKind::ArgMax: return "argmax";
    case AccKind::ArgMin: return "argmin";
    }
    return "?";
}

const char* type_name(ComputeType t) { return t == ComputeType::F32 ? "f32" : "i32"; }

// Operands first, then the immediate or index that qualifies the op: `%7 = gather f32 %6, buf2, ip[3]`.
std::string instr_line(const Instr& in, int id) {
    std::string s = fmt::format("%{} = {} {}", id, op_name(in.op), type_name(in.type));
    const char* sep = " ";
    auto arg = [&](const std::string& a) {
        s += sep;
        s += a;
        sep = ", ";
    };
    for (int a : in.a)
        if (a >= 0) arg(fmt::format("%{}", a));
    switch (in.op) {
    case Op::ConstF: arg(fmt::format("{}", in.fimm)); break;
    case Op::ConstI: arg(fmt::format("{}", in.iimm)); break;
    case Op::ParamF: arg(fmt::format("fp[{}]", in.index)); break;
    case Op::ParamI: arg(fmt::format("ip[{}]", in.index)); break;
    case Op::Load: arg(fmt::format("buf{}", in.index)); break;
    case Op::Gather: arg(fmt::format("buf{}", in.index)); arg(fmt::format("ip[{}]", in.aux)); break;
    case Op::Coord: arg(fmt::format("dim{}", in.index)); break;
    case Op::AccResult: arg(fmt::format("acc{}", in.index)); break;
    default: break;
    }
    return s;
}

} // namespace

std::string to_string(const Kernel& k) {
    std::string s = fmt::format("kernel {}: rank {}, dims [", k.name, k.rank);
    for (size_t d = 0; d < k.reduced.size(); ++d) s += k.reduced[d] ? 'R' : 'P';
    s += "]";
    if (k.full_reduce) s += ", full reduction";
    s += fmt::format(", {} fparams, {} iparams\n", k.num_fparams, k.num_iparams);
    for (size_t b = 0; b < k.buffers.size(); ++b) {
        const Buffer& buf = k.buffers[b];
        std::string layout;
        for (StrideKind l : buf.layout) layout += l == StrideKind::Zero ? '0' : l == StrideKind::One ? '1' : 'x';
        s += fmt::format("  buf{}: {} {} strides [{}]\n", b, buf.output ? "out" : "in ", dtype_name(buf.dtype), layout);
    }
    for (size_t a = 0; a < k.accums.size(); ++a)
        s += fmt::format("  acc{}: {} {} of %{}\n", a, acc_name(k.accums[a].kind), type_name(k.accums[a].type),
                         k.accums[a].value);
    for (size_t bi = 0; bi < k.blocks.size(); ++bi) {
        const Block& b = k.blocks[bi];
        s += fmt::format("  block {} ({}):\n", bi, b.loop ? "loop over R" : "point");
        for (int id : b.instrs) {
            if (id >= 0 && id < (int)k.instrs.size()) s += "    " + instr_line(k.instrs[id], id) + "\n";
            else s += fmt::format("    %{} = <out of range>\n", id);
        }
        for (int a : b.accums) {
            int v = a >= 0 && a < (int)k.accums.size() ? k.accums[a].value : -1;
            s += fmt::format("    accumulate acc{} <- %{}\n", a, v);
        }
        for (const Store& st : b.stores) s += fmt::format("    store buf{} <- %{}\n", st.buffer, st.value);
    }
    return s;
}

} // namespace kiln::kir
