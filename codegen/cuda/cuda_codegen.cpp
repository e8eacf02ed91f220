// The CUDA C emitter's shared pieces: the structural checks of a Kernel, the scopes in which code is
// emitted, offsets and coordinates, expressions, accumulators, and emit_cuda, which picks the
// kernel shape (cuda_launch.cpp) and its file (cuda_elementwise, cuda_row, cuda_column, cuda_full).
#include "codegen/cuda/cuda_emitter.hpp"

#include "ir/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

namespace kiln::codegen::detail {



const char* ctype(CT t) { return t == CT::F32 ? "float" : "int"; }

bool is_arg(AccKind k) { return k == AccKind::ArgMax || k == AccKind::ArgMin; }

const char* acc_struct(const kir::Accum& a) {
    bool f = a.type == CT::F32;
    switch (a.kind) {
    case AccKind::Sum: return f ? "kiln_sum_f" : "kiln_sum_i";
    case AccKind::Max: return f ? "kiln_max_f" : "kiln_max_i";
    case AccKind::Min: return f ? "kiln_min_f" : "kiln_min_i";
    case AccKind::ArgMax: return f ? "kiln_argmax_f" : "kiln_argmax_i";
    case AccKind::ArgMin: return f ? "kiln_argmin_f" : "kiln_argmin_i";
    }
    return "?";
}

// Type of AccResult: the position for Arg kinds, else the reduced value.
CT acc_result_type(const kir::Accum& a) { return is_arg(a.kind) ? CT::I32 : a.type; }

// A float literal that reads back to exactly `f`.
std::string float_literal(float f) {
    if (std::isnan(f) || std::isinf(f)) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return fmt::format("__uint_as_float(0x{:08x}u)", u);
    }
    std::string s = fmt::format("{}", f);
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s + "f";
}

std::string int_literal(int32_t i) {
    return i == INT32_MIN ? std::string("(-2147483647 - 1)") : fmt::format("{}", i);
}

const char* storage_type(DType t) {
    switch (t) {
    case DType::Float32: return "float";
    case DType::Float16: case DType::BFloat16: return "unsigned short";
    case DType::Int32: return "int";
    case DType::Int8: case DType::UInt8: case DType::Bool: return "unsigned char";
    }
    return "?";
}

std::string load_expr(DType t, const std::string& elem) {
    switch (t) {
    case DType::Float32: case DType::Int32: return elem;
    case DType::Float16: return fmt::format("kiln_f16_to_f32({})", elem);
    case DType::BFloat16: return fmt::format("kiln_bf16_to_f32({})", elem);
    case DType::Int8: return fmt::format("((int){} ^ 0x80) - 0x80", elem);
    case DType::UInt8: return fmt::format("(int){}", elem);
    case DType::Bool: return fmt::format("(int)({} != 0)", elem);
    }
    return "?";
}

std::string store_value(DType t, const std::string& v) {
    switch (t) {
    case DType::Float32: case DType::Int32: return v;
    case DType::Float16: return fmt::format("kiln_f32_to_f16({})", v);
    case DType::BFloat16: return fmt::format("kiln_f32_to_bf16({})", v);
    case DType::Int8: case DType::UInt8: return fmt::format("(unsigned char)({} & 0xff)", v);
    case DType::Bool: return fmt::format("(unsigned char)({} != 0)", v);
    }
    return "?";
}

// Number of operands `a[]` an op reads.
int arity(Op op) {
    switch (op) {
    case Op::ConstF: case Op::ConstI: case Op::ParamF: case Op::ParamI: case Op::Load: case Op::Coord:
    case Op::LinearId: case Op::AccResult:
        return 0;
    case Op::Gather: case Op::Neg: case Op::Abs: case Op::Sqrt: case Op::Exp: case Op::Exp2: case Op::Log:
    case Op::Log2: case Op::Tanh: case Op::Rint: case Op::Sign: case Op::IsFinite: case Op::ToF32: case Op::ToI32:
    case Op::WrapI8: case Op::WrapU8: case Op::ToBool: case Op::AsI32: case Op::AsF32: case Op::Floor:
        return 1;
    case Op::Select: return 3;
    default: return 2;
    }
}

// Structural checks, so that a malformed Kernel fails here with its listing rather than in NVRTC
// with a confusing message (or, worse, compiles into something wrong).
void validate(const kir::Kernel& k) {
    auto fail = [&](const std::string& why) {
        throw InternalError(fmt::format("emit_cuda: {}\n{}", why, kir::to_string(k)));
    };
    bool ident = !k.name.empty() && !std::isdigit((unsigned char)k.name[0]);
    for (char c : k.name) ident = ident && (std::isalnum((unsigned char)c) || c == '_');
    if (!ident) fail(fmt::format("kernel name '{}' is not a C identifier", k.name));
    if (k.rank < 0 || (int)k.reduced.size() != k.rank) fail("reduced[] does not match rank");
    if (k.buffers.empty()) fail("no buffers");
    for (auto& b : k.buffers)
        if ((int)b.layout.size() != k.rank) fail("a buffer layout does not match rank");
    const int n = (int)k.instrs.size();
    std::vector<int> block_of(n, -1);
    for (size_t bi = 0; bi < k.blocks.size(); ++bi)
        for (int id : k.blocks[bi].instrs) {
            if (id < 0 || id >= n) fail(fmt::format("block {} lists instruction %{}", bi, id));
            if (block_of[id] >= 0) fail(fmt::format("instruction %{} is in two blocks", id));
            block_of[id] = (int)bi;
        }
    for (int id = 0; id < n; ++id) {
        const kir::Instr& in = k.instrs[id];
        for (int i = 0; i < 3; ++i) {
            const bool used = i < arity(in.op);
            if (used ? (in.a[i] < 0 || in.a[i] >= n) : in.a[i] >= n)
                fail(fmt::format("%{} ({}) operand {} is %{}", id, kir::op_name(in.op), i, in.a[i]));
        }
        bool bad = false;
        switch (in.op) {
        case Op::ParamF: bad = in.index < 0 || in.index >= k.num_fparams; break;
        case Op::ParamI: bad = in.index < 0 || in.index >= k.num_iparams; break;
        case Op::Load: bad = in.index < 0 || in.index >= (int)k.buffers.size(); break;
        case Op::Gather:
            bad = in.index < 0 || in.index >= (int)k.buffers.size() || in.aux < 0 || in.aux >= k.num_iparams;
            break;
        case Op::Coord: bad = in.index < 0 || in.index >= k.rank; break;
        case Op::AccResult: bad = in.index < 0 || in.index >= (int)k.accums.size(); break;
        default: break;
        }
        if (bad) fail(fmt::format("%{} ({}) has an index out of range", id, kir::op_name(in.op)));
        // The rendered load yields the storage dtype's compute type; the IR promises the same.
        if ((in.op == Op::Load || in.op == Op::Gather) && in.type != compute_type(k.buffers[in.index].dtype))
            fail(fmt::format("%{} loads buf{} as the wrong compute type", id, in.index));
    }
    for (size_t bi = 0; bi < k.blocks.size(); ++bi) {
        const kir::Block& b = k.blocks[bi];
        if (!b.loop && !b.accums.empty()) fail(fmt::format("point block {} has accumulators", bi));
        for (int a : b.accums) {
            if (a < 0 || a >= (int)k.accums.size()) fail(fmt::format("block {} lists acc{}", bi, a));
            const int v = k.accums[a].value;
            if (v < 0 || v >= n || block_of[v] != (int)bi || k.instrs[v].type != k.accums[a].type)
                fail(fmt::format("acc{} reduces %{}, not a value of its type in block {}", a, v, bi));
        }
        for (auto& st : b.stores) {
            if (st.buffer < 0 || st.buffer >= (int)k.buffers.size() || !k.buffers[st.buffer].output)
                fail(fmt::format("block {} stores to buf{}, not an output", bi, st.buffer));
            if (st.value < 0 || st.value >= n) fail(fmt::format("block {} stores %{}", bi, st.value));
            if (k.instrs[st.value].type != compute_type(k.buffers[st.buffer].dtype))
                fail(fmt::format("block {} stores %{} of the wrong compute type to buf{}", bi, st.value, st.buffer));
        }
    }
    if (k.full_reduce) {
        if (k.blocks.size() != 2 || !k.blocks[0].loop || k.blocks[1].loop)
            fail("a full reduction has exactly two blocks: Loop, then Point");
        for (bool r : k.reduced)
            if (!r) fail("a full reduction has no parallel dims");
    }
}

CudaSource Emitter::run() {
    CudaSource src;
    out_ = "// generated by kiln from the kernel IR; compile with NVRTC, no headers needed\n";
    out_ += detail::kCudaPrelude;
    emit_args_struct();
    switch (cuda_shape(k_)) {
    case CudaShape::Full:
        emit_partial_kernel();
        emit_final_kernel();
        src.entry_points = {k_.name + "_partial", k_.name + "_final"};
        break;
    case CudaShape::Row:
        emit_row_kernel();
        src.entry_points = {k_.name};
        break;
    case CudaShape::Column:
        emit_column_kernel();
        src.entry_points = {k_.name};
        break;
    case CudaShape::Elementwise:
        emit_elementwise_kernel();
        src.entry_points = {k_.name};
        break;
    }
    src.code = std::move(out_);
    return src;
}

void Emitter::merge(Uses& into, const Uses& u) {
    for (size_t i = 0; i < u.buffers.size(); ++i) into.buffers[i] = into.buffers[i] || u.buffers[i];
    for (size_t i = 0; i < u.coords.size(); ++i) into.coords[i] = into.coords[i] || u.coords[i];
    into.linear_id = into.linear_id || u.linear_id;
}

Uses Emitter::uses_of(const kir::Block& b) const {
    Uses u{std::vector<bool>(k_.buffers.size()), std::vector<bool>(k_.rank), false};
    for (int id : b.instrs) {
        const kir::Instr& in = k_.instrs[id];
        if (in.op == Op::Load || in.op == Op::Gather) u.buffers[in.index] = true;
        if (in.op == Op::Coord) u.coords[in.index] = true;
        if (in.op == Op::LinearId) u.linear_id = true;
    }
    for (auto& st : b.stores) u.buffers[st.buffer] = true;
    return u;
}

// Coordinates among `dims` that code with uses `u` reads, in the current scope.
std::vector<bool> Emitter::needed_coords(const Uses& u, const std::vector<int>& dims, bool linear_from_coords) const {
    std::vector<bool> need(k_.rank, false);
    for (int d : dims) {
        need[d] = u.coords[d] || (u.linear_id && linear_from_coords);
        for (size_t b = 0; b < k_.buffers.size(); ++b)
            if (u.buffers[b] && k_.buffers[b].layout[d] != StrideKind::Zero) need[d] = true;
    }
    return need;
}

std::string Emitter::product(const std::vector<int>& dims) const {
    if (dims.empty()) return "1LL";
    std::string s;
    for (int d : dims) s += (s.empty() ? "" : " * ") + size(d);
    return s;
}

// Declares `c<d>` for the needed dims of `dims` from their row-major flattened index `lin`.
void Emitter::emit_coords(const std::vector<int>& dims, const std::string& lin, const std::vector<bool>& need,
                          const std::string& tmp) {
    int outer = -1;
    for (int j = 0; j < (int)dims.size() && outer < 0; ++j)
        if (need[dims[j]]) outer = j;
    if (outer < 0) return;
    std::string cur = lin;
    for (int j = (int)dims.size() - 1; j >= outer; --j) {
        int d = dims[j];
        if (need[d]) line("const long long c{} = {};", d, j == 0 ? cur : fmt::format("{} % {}", cur, size(d)));
        if (j == outer) break;
        if (cur == lin) {
            line("long long {} = {} / {};", tmp, lin, size(d));
            cur = tmp;
        } else {
            line("{} /= {};", tmp, size(d));
        }
    }
}

// sum over `dims` of c<d> * stride, constants folded from the layout; "" when empty.
std::string Emitter::offset_terms(int b, const std::vector<int>& dims) const {
    std::string s;
    for (int d : dims) {
        StrideKind l = k_.buffers[b].layout[d];
        if (l == StrideKind::Zero) continue;
        if (!s.empty()) s += " + ";
        s += l == StrideKind::One ? fmt::format("c{}", d) : fmt::format("c{} * a.strides[{}]", d, b * k_.rank + d);
    }
    return s;
}

// Offset expression of buffer b in the current scope (variables declared by the scope).
std::string Emitter::offset(int b) const {
    if (scope_ == Scope::PPoint) {
        return offset_terms(b, pdims_).empty() ? "0" : fmt::format("pb{}", b);
    }
    return fmt::format("o{}", b);
}

std::string Emitter::coord(int d) const {
    if (scope_ == Scope::PPoint && k_.reduced[d]) return "0";
    return fmt::format("c{}", d);
}

std::string Emitter::linear_id() const {
    if (scope_ == Scope::Elementwise) return "(int)(unsigned)i";
    if (k_.rank == 0) return "0";
    std::string e = coord(0);
    for (int d = 1; d < k_.rank; ++d) e = fmt::format("({}) * {} + {}", e, size(d), coord(d));
    return fmt::format("(int)(unsigned)({})", e);
}

std::string Emitter::expr(const kir::Instr& in) const {
    const bool f = in.type == CT::F32;
    const std::string x = in.a[0] >= 0 ? v(in.a[0]) : "", y = in.a[1] >= 0 ? v(in.a[1]) : "";
    const bool fx = in.a[0] >= 0 && k_.instrs[in.a[0]].type == CT::F32;   // operand type
    switch (in.op) {
    case Op::ConstF: return float_literal(in.fimm);
    case Op::ConstI: return int_literal(in.iimm);
    case Op::ParamF: return fmt::format("a.fp[{}]", in.index);
    case Op::ParamI: return fmt::format("a.ip[{}]", in.index);
    case Op::Load:
        if (!load_override_[in.index].empty()) return load_override_[in.index];
        return load_expr(k_.buffers[in.index].dtype, fmt::format("b{}[{}]", in.index, offset(in.index)));
    case Op::Gather:
        return load_expr(k_.buffers[in.index].dtype,
                         fmt::format("b{}[{} + (long long){} * a.ip[{}]]", in.index, offset(in.index), x, in.aux));
    case Op::Coord: return fmt::format("(int){}", coord(in.index));
    case Op::LinearId: return linear_id();
    case Op::AccResult: return fmt::format("acc{}", in.index);
    case Op::Neg: return f ? "-" + x : fmt::format("(int)(0u - (unsigned){})", x);
    case Op::Abs: return f ? fmt::format("fabsf({})", x) : fmt::format("{0} < 0 ? (int)(0u - (unsigned){0}) : {0}", x);
    case Op::Sqrt: return fmt::format("sqrtf({})", x);
    case Op::Exp: return fmt::format("expf({})", x);
    case Op::Exp2: return fmt::format("exp2f({})", x);
    case Op::Log: return fmt::format("logf({})", x);
    case Op::Log2: return fmt::format("log2f({})", x);
    case Op::Tanh: return fmt::format("tanhf({})", x);
    case Op::Rint: return fmt::format("rintf({})", x);
    case Op::Sign:
        return f ? fmt::format("{0} != {0} ? {0} : (float)(({0} > 0.0f) - ({0} < 0.0f))", x)
                 : fmt::format("({0} > 0) - ({0} < 0)", x);
    case Op::IsFinite: return fmt::format("(int)((__float_as_uint({}) & 0x7f800000u) != 0x7f800000u)", x);
    case Op::ToF32: return fmt::format("(float){}", x);
    case Op::ToI32: return fmt::format("kiln_f32_to_i32({})", x);
    case Op::WrapI8: return fmt::format("(({} & 0xff) ^ 0x80) - 0x80", x);
    case Op::WrapU8: return fmt::format("{} & 0xff", x);
    case Op::ToBool: return fmt::format("(int)({} != {})", x, fx ? "0.0f" : "0");
    case Op::Add: return f ? fmt::format("{} + {}", x, y) : fmt::format("(int)((unsigned){} + (unsigned){})", x, y);
    case Op::Sub: return f ? fmt::format("{} - {}", x, y) : fmt::format("(int)((unsigned){} - (unsigned){})", x, y);
    case Op::Mul: return f ? fmt::format("{} * {}", x, y) : fmt::format("(int)((unsigned){} * (unsigned){})", x, y);
    case Op::Div: return fmt::format("{} / {}", x, y);
    case Op::Pow: return fmt::format("powf({}, {})", x, y);
    case Op::Max: return f ? fmt::format("kiln_maxf({}, {})", x, y) : fmt::format("{0} > {1} ? {0} : {1}", x, y);
    case Op::Min: return f ? fmt::format("kiln_minf({}, {})", x, y) : fmt::format("{0} < {1} ? {0} : {1}", x, y);
    case Op::Eq: return fmt::format("(int)({} == {})", x, y);
    case Op::Ne: return fmt::format("(int)({} != {})", x, y);
    case Op::Lt: return fmt::format("(int)({} < {})", x, y);
    case Op::Le: return fmt::format("(int)({} <= {})", x, y);
    case Op::Gt: return fmt::format("(int)({} > {})", x, y);
    case Op::Ge: return fmt::format("(int)({} >= {})", x, y);
    case Op::And: return fmt::format("{} & {}", x, y);
    case Op::Or: return fmt::format("{} | {}", x, y);
    case Op::Xor: return fmt::format("{} ^ {}", x, y);
    case Op::Shl: return fmt::format("(int)((unsigned){} << ({} & 31))", x, y);
    case Op::Shr: return fmt::format("(int)((unsigned){} >> ({} & 31))", x, y);
    case Op::MulHi: return fmt::format("(int)__umulhi((unsigned){}, (unsigned){})", x, y);
    case Op::Select: return fmt::format("{} != 0 ? {} : {}", x, y, v(in.a[2]));
    case Op::AsI32: return fmt::format("__float_as_int({})", x);
    case Op::AsF32: return fmt::format("__int_as_float({})", x);
    case Op::Floor: return fmt::format("floorf({})", x);
    case Op::FMod: return fmt::format("fmodf({}, {})", x, y);
    case Op::IDiv: return fmt::format("{} / {}", x, y);
    case Op::IRem: return fmt::format("{} % {}", x, y);
    }
    return "?";
}

void Emitter::emit_instrs(const kir::Block& b) {
    for (int id : b.instrs) line("const {} {} = {};", ctype(k_.instrs[id].type), v(id), expr(k_.instrs[id]));
}

void Emitter::emit_stores(const kir::Block& b) {
    for (auto& st : b.stores)
        line("b{}[{}] = {};", st.buffer, offset(st.buffer), store_value(k_.buffers[st.buffer].dtype, v(st.value)));
}

void Emitter::emit_args_struct() {
    const int r = std::max(k_.rank, 1), nb = (int)k_.buffers.size(), s = std::max(nb * k_.rank, 1);
    line("");
    line("// Kernel parameters; layout documented in codegen/cuda/cuda_codegen.hpp.");
    open("struct Args");
    line("long long sizes[{}];", r);
    line("void* buf[{}];", nb);
    line("long long strides[{}];", s);
    line("float fp[{}];", std::max(k_.num_fparams, 1));
    line("int ip[{}];", std::max(k_.num_iparams, 1));
    --indent_;
    line("}};");
}

void Emitter::emit_buffer_pointers(const Uses& u) {
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
        if (!u.buffers[b]) continue;
        const char* t = storage_type(k_.buffers[b].dtype);
        if (k_.buffers[b].output) line("{0}* const b{1} = ({0}*)a.buf[{1}];", t, b);
        else line("const {0}* const b{1} = (const {0}*)a.buf[{1}];", t, b);
    }
}

void Emitter::emit_scratch() {
    bool f = false, i = false;
    for (auto& a : k_.accums) (a.type == CT::F32 ? f : i) = true;
    if (f) line("__shared__ float kiln_svf[33];");
    if (i) line("__shared__ int kiln_svi[33];");
    if (f || i) line("__shared__ int kiln_sp[33];");
}

void Emitter::declare_acc_results(const kir::Block& b) {
    for (int ai : b.accums) line("{} acc{};", ctype(acc_result_type(k_.accums[ai])), ai);
}

void Emitter::init_acc_states(const kir::Block& b) {
    for (int ai : b.accums) {
        const kir::Accum& ac = k_.accums[ai];
        line("{} acc{}_v = {}::init();", ctype(ac.type), ai, acc_struct(ac));
        line("int acc{}_p = KILN_NO_POS;", ai);
    }
}

void Emitter::add_to_acc_states(const kir::Block& b, const std::string& pos) {
    for (int ai : b.accums) {
        const kir::Accum& ac = k_.accums[ai];
        line("{}::add(acc{}_v, acc{}_p, {}, {});", acc_struct(ac), ai, ai, v(ac.value), pos);
    }
}

void Emitter::block_reduce_acc_states(const kir::Block& b) {
    for (int ai : b.accums) {
        const kir::Accum& ac = k_.accums[ai];
        line("kiln_block_reduce<{}>(acc{}_v, acc{}_p, {}, kiln_sp);", acc_struct(ac), ai, ai,
             ac.type == CT::F32 ? "kiln_svf" : "kiln_svi");
    }
}

// An Arg accumulator that saw no point (an empty R domain) yields position 0.
void Emitter::set_acc_results(const kir::Block& b) {
    for (int ai : b.accums) {
        if (is_arg(k_.accums[ai].kind)) line("acc{0} = acc{0}_p == KILN_NO_POS ? 0 : acc{0}_p;", ai);
        else line("acc{0} = acc{0}_v;", ai);
    }
}

// Declares o<b> for the buffers the block uses, inside an R loop: P part plus R part.
void Emitter::emit_rloop_offsets(const Uses& u) {
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
        if (!u.buffers[b]) continue;
        std::string p = offset_terms((int)b, pdims_).empty() ? "" : fmt::format("pb{}", b);
        std::string r = offset_terms((int)b, rdims_);
        std::string e = p.empty() ? r : r.empty() ? p : p + " + " + r;
        line("const long long o{} = {};", b, e.empty() ? "0" : e);
    }
}

// The body of a Loop block for one R point at flattened R index `ri`.
void Emitter::emit_rloop_body(size_t bi) {
    const kir::Block& b = k_.blocks[bi];
    scope_ = Scope::RLoop;
    emit_coords(rdims_, "ri", needed_coords(block_uses_[bi], rdims_, true), "tr");
    emit_rloop_offsets(block_uses_[bi]);
    emit_instrs(b);
    add_to_acc_states(b, "(int)ri");
    emit_stores(b);
    scope_ = Scope::PPoint;
}

std::string Emitter::signature(const std::string& entry, int max_threads) const {
    return fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}(const Args a, unsigned char* const "
                       "scratch, const int param)",
                       max_threads, entry);
}

void Emitter::open_kernel(const std::string& entry, int max_threads) {
    open(signature(entry, max_threads));
    line("kiln_after_prior_grids();");
}

void Emitter::emit_pbase_offsets() {
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
        if (!all_uses_.buffers[b]) continue;
        std::string e = offset_terms((int)b, pdims_);
        if (!e.empty()) line("const long long pb{} = {};", b, e);
    }
}

} // namespace kiln::codegen::detail

namespace kiln::codegen {

CudaSource emit_cuda(const kir::Kernel& k) {
    detail::validate(k);
    return detail::Emitter(k).run();
}

} // namespace kiln::codegen
