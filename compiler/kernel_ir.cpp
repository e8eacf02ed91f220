#include "compiler/kernel_ir.hpp"

#include <fmt/format.h>

#include <cstring>

namespace kiln::kir {

namespace {

using T = OpType;

// Every op once, in the enum's order (an op's number is its index; kernel text records ops by
// number): the static_asserts below refuse a table that misses an op or lists one out of place.
constexpr OpInfo kOps[] = {
    {Op::ConstF, "constf", 0, T::Float, {T::None, T::None, T::None}},
    {Op::ConstI, "consti", 0, T::Int, {T::None, T::None, T::None}},
    {Op::ParamF, "paramf", 0, T::Float, {T::None, T::None, T::None}},
    {Op::ParamI, "parami", 0, T::Int, {T::None, T::None, T::None}},
    {Op::Load, "load", 0, T::Any, {T::None, T::None, T::None}},
    {Op::Gather, "gather", 1, T::Any, {T::I32, T::None, T::None}},
    {Op::Coord, "coord", 0, T::I32, {T::None, T::None, T::None}},
    {Op::LinearId, "linear_id", 0, T::I32, {T::None, T::None, T::None}},
    {Op::AccResult, "acc_result", 0, T::Any, {T::None, T::None, T::None}},
    {Op::Neg, "neg", 1, T::Any, {T::Same, T::None, T::None}},
    {Op::Abs, "abs", 1, T::Any, {T::Same, T::None, T::None}},
    {Op::Sqrt, "sqrt", 1, T::Float, {T::Same, T::None, T::None}},
    {Op::Exp, "exp", 1, T::Float, {T::Same, T::None, T::None}},
    {Op::Exp2, "exp2", 1, T::Float, {T::Same, T::None, T::None}},
    {Op::Log, "log", 1, T::Float, {T::Same, T::None, T::None}},
    {Op::Log2, "log2", 1, T::Float, {T::Same, T::None, T::None}},
    {Op::Tanh, "tanh", 1, T::Float, {T::Same, T::None, T::None}},
    {Op::Rint, "rint", 1, T::Float, {T::Same, T::None, T::None}},
    {Op::Sgn, "sgn", 1, T::Any, {T::Same, T::None, T::None}},
    {Op::Finite, "finite", 1, T::I32, {T::Float, T::None, T::None}},
    {Op::ToF32, "to_f32", 1, T::F32, {T::I32, T::None, T::None}},
    {Op::ToI32, "to_i32", 1, T::I32, {T::F32, T::None, T::None}},
    {Op::WrapI8, "wrap_i8", 1, T::I32, {T::I32, T::None, T::None}},
    {Op::WrapU8, "wrap_u8", 1, T::I32, {T::I32, T::None, T::None}},
    {Op::ToBool, "to_bool", 1, T::I32, {T::Any, T::None, T::None}},
    {Op::Add, "add", 2, T::Any, {T::Same, T::Same, T::None}},
    {Op::Sub, "sub", 2, T::Any, {T::Same, T::Same, T::None}},
    {Op::Mul, "mul", 2, T::Any, {T::Same, T::Same, T::None}},
    {Op::Div, "div", 2, T::Float, {T::Same, T::Same, T::None}},
    {Op::Pow, "pow", 2, T::Float, {T::Same, T::Same, T::None}},
    {Op::Maximum, "maximum", 2, T::Any, {T::Same, T::Same, T::None}},
    {Op::Minimum, "minimum", 2, T::Any, {T::Same, T::Same, T::None}},
    {Op::Eq, "eq", 2, T::I32, {T::Any, T::Any, T::None}},
    {Op::Ne, "ne", 2, T::I32, {T::Any, T::Any, T::None}},
    {Op::Lt, "lt", 2, T::I32, {T::Any, T::Any, T::None}},
    {Op::Le, "le", 2, T::I32, {T::Any, T::Any, T::None}},
    {Op::Gt, "gt", 2, T::I32, {T::Any, T::Any, T::None}},
    {Op::Ge, "ge", 2, T::I32, {T::Any, T::Any, T::None}},
    {Op::And, "and", 2, T::Int, {T::Same, T::Same, T::None}},
    {Op::Or, "or", 2, T::Int, {T::Same, T::Same, T::None}},
    {Op::Xor, "xor", 2, T::Int, {T::Same, T::Same, T::None}},
    {Op::Shl, "shl", 2, T::Int, {T::Same, T::Same, T::None}},
    {Op::Shr, "shr", 2, T::Int, {T::Same, T::Same, T::None}},
    {Op::MulHi, "mulhi", 2, T::I32, {T::I32, T::I32, T::None}},
    {Op::Select, "select", 3, T::Any, {T::I32, T::Same, T::Same}},
    {Op::AsI32, "as_i32", 1, T::I32, {T::F32, T::None, T::None}},
    {Op::AsF32, "as_f32", 1, T::F32, {T::I32, T::None, T::None}},
    {Op::Floor, "floor", 1, T::Float, {T::Same, T::None, T::None}},
    {Op::Fmod, "fmod", 2, T::Float, {T::Same, T::Same, T::None}},
    {Op::IDiv, "idiv", 2, T::Int, {T::Same, T::Same, T::None}},
    {Op::IRem, "irem", 2, T::Int, {T::Same, T::Same, T::None}},
#define KILN_MATH(K, name, c_function, host) {Op::K, #name, 1, T::Float, {T::Same, T::None, T::None}},
#define KILN_MATH2(K, name, c_function, host) {Op::K, #name, 2, T::Float, {T::Same, T::Same, T::None}},
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
    {Op::Convert, "convert", 1, T::Any, {T::Any, T::None, T::None}},
    {Op::WrapI16, "wrap_i16", 1, T::I32, {T::I32, T::None, T::None}},
    {Op::WrapU16, "wrap_u16", 1, T::I32, {T::I32, T::None, T::None}},
    {Op::WrapU32, "wrap_u32", 1, T::I64, {T::I64, T::None, T::None}},
    {Op::AsI64, "as_i64", 1, T::I64, {T::F64, T::None, T::None}},
    {Op::AsF64, "as_f64", 1, T::F64, {T::I64, T::None, T::None}},
    {Op::NextAfter, "nextafter", 2, T::Float, {T::Same, T::Same, T::None}},
};

constexpr bool in_enum_order() {
    for (size_t i = 0; i < sizeof(kOps) / sizeof(kOps[0]); ++i)
        if ((size_t)kOps[i].op != i) return false;
    return true;
}
static_assert(sizeof(kOps) / sizeof(kOps[0]) == (size_t)kLastOp + 1, "kOps must list every kir::Op");
static_assert(in_enum_order(), "kOps must list the ops in the enum's order");
// Kernel texts record ops by number: the ops of kiln/math_functions.def follow IRem, in the
// order listed there, then the 64-bit ops and NextAfter; new ops are appended after the last.
static_assert((int)Op::Erf == (int)Op::IRem + 1 && (int)Op::Atan == (int)Op::IRem + 8,
              "kiln/math_functions.def: existing lines keep their places");
static_assert((int)Op::Convert == (int)Op::Trunc + 1,
              "kiln/math_functions.def is closed (a line there renumbers the ops after it): append a new op instead");

} // namespace

uint32_t f32_bits(double held) {
    uint64_t d;
    std::memcpy(&d, &held, 8);
    if ((d & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (d & 0x000fffffffffffffull)) {
        // NaN: sign, all-ones exponent, the float's 23 payload bits (from_f32_bits put them on top).
        return (uint32_t)(d >> 32 & 0x80000000u) | 0x7f800000u | (uint32_t)(d >> 29 & 0x7fffffu);
    }
    const float f = (float)held;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

double from_f32_bits(uint32_t bits) {
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu)) {
        const uint64_t d = (uint64_t)(bits & 0x80000000u) << 32 | 0x7ff0000000000000ull | (uint64_t)(bits & 0x7fffffu) << 29;
        double r;
        std::memcpy(&r, &d, 8);
        return r;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

const OpInfo& op_info(Op op) {
    static const OpInfo unknown{(Op)255, "?", 0, T::None, {T::None, T::None, T::None}};
    return op <= kLastOp ? kOps[(size_t)op] : unknown;
}

const char* op_name(Op op) { return op_info(op).name; }

namespace {

const char* acc_name(AccKind k) {
    switch (k) {
    case AccKind::Sum: return "sum";
    case AccKind::Max: return "max";
    case AccKind::Min: return "min";
    case AccKind::ArgMax: return "argmax";
    case AccKind::ArgMin: return "argmin";
    case AccKind::Prod: return "prod";
    }
    return "?";
}

const char* type_name(ComputeType t) { return compute_type_name(t); }

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
    case Op::ConstF: arg(in.type == ComputeType::F32 ? fmt::format("{}", (float)in.fimm) : fmt::format("{}", in.fimm)); break;
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
