#include "codegen/cuda/cuda_codegen.hpp"
#include "codegen/cuda/cuda_internal.hpp"

#include "ir/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

namespace kiln::codegen {

namespace {

using kir::AccKind;
using kir::Op;
using kir::StrideKind;
using CT = ComputeType;



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
    case Op::WrapI8: case Op::WrapU8: case Op::ToBool: case Op::AsI32: case Op::AsF32:
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

// What a group of instructions and stores touches: buffers, coordinates, the linear index.
struct Uses {
    std::vector<bool> buffers;
    std::vector<bool> coords;   // by Coord
    bool linear_id = false;
};

class Emitter {
public:
    explicit Emitter(const kir::Kernel& k) : k_(k) {
        for (int d = 0; d < k.rank; ++d) (k.reduced[d] ? rdims_ : pdims_).push_back(d);
        for (size_t bi = 0; bi < k.blocks.size(); ++bi) block_uses_.push_back(uses_of(k.blocks[bi]));
        all_uses_ = Uses{std::vector<bool>(k.buffers.size()), std::vector<bool>(k.rank), false};
        for (auto& u : block_uses_) merge(all_uses_, u);
        load_override_.assign(k.buffers.size(), "");
    }

    CudaSource run() {
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

private:
    // Where the code being emitted runs: which coordinates are variables and how offsets read.
    enum class Scope {
        Elementwise,   // one thread per domain point, all coordinates from `i`
        PPoint,        // per P point of a reduction: R coordinates are 0
        RLoop,         // inside a loop over R points: every coordinate is a variable
    };

    const kir::Kernel& k_;
    std::vector<int> pdims_, rdims_;
    std::vector<Uses> block_uses_;
    Uses all_uses_;
    std::string out_;
    int indent_ = 0;
    Scope scope_ = Scope::Elementwise;
    // Per buffer: when set, what a Load of it reads (a register holding the converted value).
    std::vector<std::string> load_override_;
    // Row kernels, per buffer: when set, the element already loaded (by a 16-byte load).
    std::vector<std::string> preloaded_;

    template <typename... T>
    void line(fmt::format_string<T...> f, T&&... args) {
        out_.append(4 * indent_, ' ');
        out_ += fmt::format(f, std::forward<T>(args)...);
        out_ += '\n';
    }
    void open(const std::string& head) {
        if (head.empty()) line("{{");
        else line("{} {{", head);
        ++indent_;
    }
    void close() { --indent_; line("}}"); }

    static void merge(Uses& into, const Uses& u) {
        for (size_t i = 0; i < u.buffers.size(); ++i) into.buffers[i] = into.buffers[i] || u.buffers[i];
        for (size_t i = 0; i < u.coords.size(); ++i) into.coords[i] = into.coords[i] || u.coords[i];
        into.linear_id = into.linear_id || u.linear_id;
    }

    Uses uses_of(const kir::Block& b) const {
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
    std::vector<bool> needed_coords(const Uses& u, const std::vector<int>& dims, bool linear_from_coords) const {
        std::vector<bool> need(k_.rank, false);
        for (int d : dims) {
            need[d] = u.coords[d] || (u.linear_id && linear_from_coords);
            for (size_t b = 0; b < k_.buffers.size(); ++b)
                if (u.buffers[b] && k_.buffers[b].layout[d] != StrideKind::Zero) need[d] = true;
        }
        return need;
    }

    std::string size(int d) const { return fmt::format("a.sizes[{}]", d); }

    std::string product(const std::vector<int>& dims) const {
        if (dims.empty()) return "1LL";
        std::string s;
        for (int d : dims) s += (s.empty() ? "" : " * ") + size(d);
        return s;
    }

    // Declares `c<d>` for the needed dims of `dims` from their row-major flattened index `lin`.
    void emit_coords(const std::vector<int>& dims, const std::string& lin, const std::vector<bool>& need,
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
    std::string offset_terms(int b, const std::vector<int>& dims) const {
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
    std::string offset(int b) const {
        if (scope_ == Scope::PPoint) {
            return offset_terms(b, pdims_).empty() ? "0" : fmt::format("pb{}", b);
        }
        return fmt::format("o{}", b);
    }

    std::string coord(int d) const {
        if (scope_ == Scope::PPoint && k_.reduced[d]) return "0";
        return fmt::format("c{}", d);
    }

    std::string linear_id() const {
        if (scope_ == Scope::Elementwise) return "(int)(unsigned)i";
        if (k_.rank == 0) return "0";
        std::string e = coord(0);
        for (int d = 1; d < k_.rank; ++d) e = fmt::format("({}) * {} + {}", e, size(d), coord(d));
        return fmt::format("(int)(unsigned)({})", e);
    }

    std::string v(int id) const { return fmt::format("v{}", id); }

    std::string expr(const kir::Instr& in) const {
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
        }
        return "?";
    }

    void emit_instrs(const kir::Block& b) {
        for (int id : b.instrs) line("const {} {} = {};", ctype(k_.instrs[id].type), v(id), expr(k_.instrs[id]));
    }

    void emit_stores(const kir::Block& b) {
        for (auto& st : b.stores)
            line("b{}[{}] = {};", st.buffer, offset(st.buffer), store_value(k_.buffers[st.buffer].dtype, v(st.value)));
    }

    // ---- pieces shared by the kernels

    void emit_args_struct() {
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

    void emit_buffer_pointers(const Uses& u) {
        for (size_t b = 0; b < k_.buffers.size(); ++b) {
            if (!u.buffers[b]) continue;
            const char* t = storage_type(k_.buffers[b].dtype);
            if (k_.buffers[b].output) line("{0}* const b{1} = ({0}*)a.buf[{1}];", t, b);
            else line("const {0}* const b{1} = (const {0}*)a.buf[{1}];", t, b);
        }
    }

    void emit_scratch() {
        bool f = false, i = false;
        for (auto& a : k_.accums) (a.type == CT::F32 ? f : i) = true;
        if (f) line("__shared__ float kiln_svf[33];");
        if (i) line("__shared__ int kiln_svi[33];");
        if (f || i) line("__shared__ int kiln_sp[33];");
    }

    void declare_acc_results(const kir::Block& b) {
        for (int ai : b.accums) line("{} acc{};", ctype(acc_result_type(k_.accums[ai])), ai);
    }
    void init_acc_states(const kir::Block& b) {
        for (int ai : b.accums) {
            const kir::Accum& ac = k_.accums[ai];
            line("{} acc{}_v = {}::init();", ctype(ac.type), ai, acc_struct(ac));
            line("int acc{}_p = KILN_NO_POS;", ai);
        }
    }
    void add_to_acc_states(const kir::Block& b, const std::string& pos) {
        for (int ai : b.accums) {
            const kir::Accum& ac = k_.accums[ai];
            line("{}::add(acc{}_v, acc{}_p, {}, {});", acc_struct(ac), ai, ai, v(ac.value), pos);
        }
    }
    void block_reduce_acc_states(const kir::Block& b) {
        for (int ai : b.accums) {
            const kir::Accum& ac = k_.accums[ai];
            line("kiln_block_reduce<{}>(acc{}_v, acc{}_p, {}, kiln_sp);", acc_struct(ac), ai, ai,
                 ac.type == CT::F32 ? "kiln_svf" : "kiln_svi");
        }
    }
    // An Arg accumulator that saw no point (an empty R domain) yields position 0.
    void set_acc_results(const kir::Block& b) {
        for (int ai : b.accums) {
            if (is_arg(k_.accums[ai].kind)) line("acc{0} = acc{0}_p == KILN_NO_POS ? 0 : acc{0}_p;", ai);
            else line("acc{0} = acc{0}_v;", ai);
        }
    }

    // Declares o<b> for the buffers the block uses, inside an R loop: P part plus R part.
    void emit_rloop_offsets(const Uses& u) {
        for (size_t b = 0; b < k_.buffers.size(); ++b) {
            if (!u.buffers[b]) continue;
            std::string p = offset_terms((int)b, pdims_).empty() ? "" : fmt::format("pb{}", b);
            std::string r = offset_terms((int)b, rdims_);
            std::string e = p.empty() ? r : r.empty() ? p : p + " + " + r;
            line("const long long o{} = {};", b, e.empty() ? "0" : e);
        }
    }

    // The body of a Loop block for one R point at flattened R index `ri`.
    void emit_rloop_body(size_t bi) {
        const kir::Block& b = k_.blocks[bi];
        scope_ = Scope::RLoop;
        emit_coords(rdims_, "ri", needed_coords(block_uses_[bi], rdims_, true), "tr");
        emit_rloop_offsets(block_uses_[bi]);
        emit_instrs(b);
        add_to_acc_states(b, "(int)ri");
        emit_stores(b);
        scope_ = Scope::PPoint;
    }

    // ---- the kernels

    std::string signature(const std::string& entry, int max_threads) const {
        return fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}(const Args a, unsigned char* const "
                           "scratch, const int param)",
                           max_threads, entry);
    }

    void emit_elementwise_kernel() {
        line("");
        open(signature(k_.name, kCudaBlockSize));
        emit_buffer_pointers(all_uses_);
        if (vectorisable()) emit_vector_path();
        std::vector<int> all;
        for (int d = 0; d < k_.rank; ++d) all.push_back(d);
        line("const long long n = {};", product(all));
        open(fmt::format("for (long long i = {}(long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; "
                         "i += (long long)gridDim.x * blockDim.x)",
                         vectorisable() ? "start + " : ""));
        scope_ = Scope::Elementwise;
        emit_coords(all, "i", needed_coords(all_uses_, all, false), "t");
        for (size_t b = 0; b < k_.buffers.size(); ++b) {
            if (!all_uses_.buffers[b]) continue;
            std::string e = offset_terms((int)b, all);
            line("const long long o{} = {};", b, e.empty() ? "0" : e);
        }
        // With no reduced dim a Loop block runs once and its accumulators see one point.
        for (const kir::Block& b : k_.blocks) {
            if (!b.loop) {
                emit_instrs(b);
                emit_stores(b);
                continue;
            }
            declare_acc_results(b);
            open("");
            init_acc_states(b);
            emit_instrs(b);
            add_to_acc_states(b, "0");
            emit_stores(b);
            set_acc_results(b);
            close();
        }
        close();
        close();
    }

    void emit_pbase_offsets() {
        for (size_t b = 0; b < k_.buffers.size(); ++b) {
            if (!all_uses_.buffers[b]) continue;
            std::string e = offset_terms((int)b, pdims_);
            if (!e.empty()) line("const long long pb{} = {};", b, e);
        }
    }

    // ---- row reductions (see cuda_codegen.hpp): G threads per row, the row in shared memory

    void emit_reduce_scratch(bool row) {
        bool f = false, i = false;
        for (auto& a : k_.accums) (a.type == CT::F32 ? f : i) = true;
        const int n = row ? 32 : detail::kColumnWidth * detail::kColumnSlices;
        if (f) line("__shared__ float kiln_svf[{}];", n);
        if (i) line("__shared__ int kiln_svi[{}];", n);
        line("__shared__ int kiln_sp[{}];", n);
        if (row) {
            if (f) line("__shared__ float kiln_cvf;");
            if (i) line("__shared__ int kiln_cvi;");
            line("__shared__ int kiln_cp;");
        }
    }

    // Loop block `bi` at R point `ri`, element `j` of this thread: loads of cached buffers go
    // through the row cache (stored by their first pass, read by the later ones).
    void emit_row_element(size_t bi, const std::vector<int>& slot, const std::vector<int>& first_use,
                          const std::string& j) {
        const kir::Block& b = k_.blocks[bi];
        scope_ = Scope::RLoop;
        emit_coords(rdims_, "ri", needed_coords(block_uses_[bi], rdims_, true), "tr");
        emit_rloop_offsets(block_uses_[bi]);
        for (size_t buf = 0; buf < k_.buffers.size(); ++buf) {
            if (slot[buf] < 0 || !block_uses_[bi].buffers[buf]) continue;
            const DType t = k_.buffers[buf].dtype;
            const std::string mem = load_expr(t, fmt::format("b{}[{}]", buf, offset((int)buf)));
            const char* ct = ctype(compute_type(t));
            const std::string& pre = preloaded_.empty() ? std::string() : preloaded_[buf];
            if (!pre.empty()) {
                line("const {} l{} = {};", ct, buf, pre);
                if (first_use[buf] == (int)bi) line("if (cached) x{0}[{1} * row_threads] = l{0};", buf, j);
            } else if (first_use[buf] == (int)bi) {
                line("const {} l{} = {};", ct, buf, mem);
                line("if (cached) x{0}[{1} * row_threads] = l{0};", buf, j);
            } else {
                line("const {0} l{1} = cached ? x{1}[{2} * row_threads] : {3};", ct, buf, j, mem);
            }
            load_override_[buf] = fmt::format("l{}", buf);
        }
        for (size_t buf = 0; buf < preloaded_.size(); ++buf)
            if (slot[buf] < 0 && !preloaded_[buf].empty()) load_override_[buf] = preloaded_[buf];
        emit_instrs(b);
        add_to_acc_states(b, "(int)ri");
        emit_stores(b);
        load_override_.assign(k_.buffers.size(), "");
        scope_ = Scope::PPoint;
    }

    int row_vector_width() const { return detail::row_vector_width(k_); }

    // The R index of this thread's element `j` (see row_vector_width).
    std::string row_index(const std::string& j) const {
        const int v = row_vector_width();
        if (v == 1) return fmt::format("({}) * G + t", j);
        int s = 0;
        while ((1 << s) < v) ++s;
        return fmt::format("((({0}) >> {1}) * G + t) * {2} + (({0}) & {3})", j, s, v, v - 1);
    }

    // Per P point `pi`: the coordinates and the buffers' P offsets.
    void emit_ppoint_setup() {
        scope_ = Scope::PPoint;
        emit_coords(pdims_, "pi", needed_coords(all_uses_, pdims_, true), "tp");
        emit_pbase_offsets();
    }

    // A Point block: every thread computes it (later blocks may read its values); the threads
    // for which `who` holds store.
    void emit_point_block(const kir::Block& b, const std::string& who) {
        emit_instrs(b);
        if (b.stores.empty()) return;
        open(fmt::format("if ({})", who));
        emit_stores(b);
        close();
    }

    int first_loop_block() const {
        for (size_t bi = 0; bi < k_.blocks.size(); ++bi)
            if (k_.blocks[bi].loop) return (int)bi;
        return -1;
    }

    void emit_row_kernel() {
        const std::vector<int> slot = detail::row_cache_slots(k_);
        const int nslots = detail::row_cache_slot_count(k_);
        std::vector<int> first_use(k_.buffers.size(), -1);
        for (size_t bi = 0; bi < k_.blocks.size(); ++bi)
            for (int id : k_.blocks[bi].instrs)
                if (k_.instrs[id].op == Op::Load && slot[k_.instrs[id].index] >= 0 && first_use[k_.instrs[id].index] < 0)
                    first_use[k_.instrs[id].index] = (int)bi;
        line("");
        open(signature(k_.name, kCudaMaxRowBlock));
        emit_buffer_pointers(all_uses_);
        emit_reduce_scratch(true);
        line("extern __shared__ float kiln_row_cache[];");
        line("(void)scratch;");
        line("const int G = param;   // threads per row, a power of two");
        line("const long long np = {};", product(pdims_));
        line("const long long nr = {};", product(rdims_));
        line("const int nthreads = (int)blockDim.x;");
        line("const int blocks_per_row = G > nthreads ? G / nthreads : 1;   // the cluster size");
        line("const int rows_per_block = G < nthreads ? nthreads / G : 1;");
        line("const int row_threads = G < nthreads ? G : nthreads;   // threads of one row in this block");
        line("const int group = (int)threadIdx.x / G;");
        line("const int lane = (int)threadIdx.x % row_threads;");
        line("const int t = (int)(blockIdx.x % blocks_per_row) * nthreads + lane;");
        const int vw = row_vector_width();
        line("const long long per_thread = (nr + (long long)G * {0} - 1) / ((long long)G * {0}) * {0};", vw);
        line("const long long full = nr / ((long long)G * {0}) * {0};   // elements every thread of a row has", vw);
        if (nslots > 0) {
            // Element j of this thread sits at [j * row_threads + lane] of its row's slice: each
            // thread reads back only what it wrote, so no barrier is needed.
            line("const long long slice = per_thread * row_threads;");
            line("const bool cached = (unsigned long long)kiln_dynamic_smem_size() >= "
                 "(unsigned long long){} * rows_per_block * slice * 4;",
                 nslots);
            for (size_t b = 0; b < k_.buffers.size(); ++b)
                if (slot[b] >= 0)
                    line("{0}* const x{1} = ({0}*)kiln_row_cache + ((long long){2} * rows_per_block + group) * slice + lane;",
                         ctype(compute_type(k_.buffers[b].dtype)), b, slot[b]);
        }
        line("#pragma unroll 1");
        open("for (long long row0 = (long long)(blockIdx.x / blocks_per_row) * rows_per_block; row0 < np; "
             "row0 += (long long)(gridDim.x / blocks_per_row) * rows_per_block)");
        // A group past the last row still takes part in the barriers; it reads row0's P point.
        line("const bool live = row0 + group < np;");
        line("const long long pi = live ? row0 + group : row0;");
        emit_ppoint_setup();
        for (size_t bi = 0; bi < k_.blocks.size(); ++bi) {
            const kir::Block& b = k_.blocks[bi];
            if (!b.loop) {
                emit_point_block(b, "live && t == 0");
                continue;
            }
            declare_acc_results(b);
            open("");
            init_acc_states(b);
            // Several elements per step without bounds checks (their loads can all be in flight
            // at once: sixteen in the first pass, which reads memory), then the rest one by one.
            const bool first = (int)bi == first_loop_block();
            const int step = first ? 16 : 4;
            // The first pass loads each aligned row's groups with 16-byte loads.
            std::vector<size_t> vec_bufs;
            if (first && vw > 1)
                for (size_t buf = 0; buf < k_.buffers.size(); ++buf) {
                    bool loaded = false;
                    for (int id : b.instrs) loaded = loaded || (k_.instrs[id].op == Op::Load && k_.instrs[id].index == (int)buf);
                    if (loaded && k_.buffers[buf].layout[rdims_[0]] == StrideKind::One &&
                        dtype_size(k_.buffers[buf].dtype) * vw == 16)
                        vec_bufs.push_back(buf);
                }
            line("long long j = 0;");
            open("if (live)");
            if (!vec_bufs.empty()) {
                std::string mis;
                for (size_t buf : vec_bufs)
                    mis += fmt::format("{}(unsigned long long)(b{} + {})", mis.empty() ? "" : " | ", buf, offset((int)buf));
                line("const bool aligned = (({}) & 15) == 0;", mis);
                line("#pragma unroll 1");
                open(fmt::format("for (; aligned && j + {0} <= full; j += {0})", step));
                preloaded_.assign(k_.buffers.size(), "");
                for (size_t buf : vec_bufs) {
                    const DType t = k_.buffers[buf].dtype;
                    for (int g = 0; g < step / vw; ++g)
                        line("const uint4 w{0}_{1} = *(const uint4*)(b{0} + {2} + (((j >> {3}) + {1}) * G + t) * {4});", buf, g,
                             offset((int)buf), vw == 4 ? 2 : vw == 8 ? 3 : 4, vw);
                    line("{} e{}[{}];", ctype(compute_type(t)), buf, step);
                    for (int u = 0; u < step; ++u)
                        line("e{}[{}] = {};", buf, u,
                             load_expr(t, word_element(t, vw, fmt::format("w{}_{}", buf, u / vw), u % vw)));
                    preloaded_[buf] = fmt::format("e{}[u]", buf);
                }
                line("#pragma unroll");
                open(fmt::format("for (int u = 0; u < {}; ++u)", step));
                line("const long long ri = {};", row_index("j + u"));
                emit_row_element(bi, slot, first_use, "(j + u)");
                preloaded_.clear();
                close();
                close();
            }
            line("#pragma unroll 1");
            open(fmt::format("for (; j + {0} <= full; j += {0})", step));
            line("#pragma unroll");
            open(fmt::format("for (int u = 0; u < {}; ++u)", step));
            line("const long long ri = {};", row_index("j + u"));
            emit_row_element(bi, slot, first_use, "(j + u)");
            close();
            close();
            close();
            line("#pragma unroll 1");
            open("for (; j < per_thread; ++j)");
            line("const long long ri = {};", row_index("j"));
            open("if (live && ri < nr)");
            emit_row_element(bi, slot, first_use, "j");
            close();
            close();
            for (int ai : b.accums) {
                const kir::Accum& ac = k_.accums[ai];
                const char* sfx = ac.type == CT::F32 ? "f" : "i";
                line("kiln_row_reduce<{0}>(acc{1}_v, acc{1}_p, G, kiln_sv{2}, kiln_sp, &kiln_cv{2}, &kiln_cp);",
                     acc_struct(ac), ai, sfx);
            }
            set_acc_results(b);
            close();
        }
        close();   // rows
        close();
    }

    // ---- column reductions: 32 parallel points x 8 slices of the reduced points per block

    void emit_column_kernel() {
        const int width = detail::kColumnWidth, slices = detail::kColumnSlices;
        line("");
        open(signature(k_.name, width * slices));
        emit_buffer_pointers(all_uses_);
        emit_reduce_scratch(false);
        line("(void)scratch; (void)param;");
        line("const long long np = {};", product(pdims_));
        line("const long long nr = {};", product(rdims_));
        line("const int column = (int)(threadIdx.x & {}), slice = (int)(threadIdx.x / {});", width - 1, width);
        open(fmt::format("for (long long p0 = (long long)blockIdx.x * {0}; p0 < np; p0 += (long long)gridDim.x * {0})",
                         width));
        line("const bool live = p0 + column < np;");
        line("const long long pi = live ? p0 + column : p0;");
        emit_ppoint_setup();
        for (size_t bi = 0; bi < k_.blocks.size(); ++bi) {
            const kir::Block& b = k_.blocks[bi];
            if (!b.loop) {
                emit_point_block(b, "live && slice == 0");
                continue;
            }
            declare_acc_results(b);
            open("");
            init_acc_states(b);
            open(fmt::format("for (long long ri = live ? slice : nr; ri < nr; ri += {})", slices));
            emit_rloop_body(bi);
            close();
            for (int ai : b.accums) {
                const kir::Accum& ac = k_.accums[ai];
                line("kiln_column_reduce<{0}>(acc{1}_v, acc{1}_p, kiln_sv{2}, kiln_sp);", acc_struct(ac), ai,
                     ac.type == CT::F32 ? "f" : "i");
            }
            set_acc_results(b);
            close();
        }
        close();
        close();
    }

    // ---- the vector path of contiguous rank-1 elementwise kernels

    // Rank 1, every buffer contiguous or a broadcast scalar, no gathers or coordinates.
    bool vectorisable() const {
        if (k_.rank != 1) return false;
        for (size_t b = 0; b < k_.buffers.size(); ++b)
            if (all_uses_.buffers[b] && k_.buffers[b].layout[0] == StrideKind::Any) return false;
        for (const kir::Instr& in : k_.instrs)
            if (in.op == Op::Gather || in.op == Op::Coord) return false;
        return true;
    }

    // Elements per thread on the vector path: 16 bytes of the widest contiguous buffer.
    int vector_width() const {
        size_t widest = 1;
        for (size_t b = 0; b < k_.buffers.size(); ++b)
            if (all_uses_.buffers[b] && k_.buffers[b].layout[0] == StrideKind::One)
                widest = std::max(widest, dtype_size(k_.buffers[b].dtype));
        return widest >= 4 ? 4 : widest == 2 ? 8 : 16;
    }
    // A word holding `n` elements of `t` (4, 8 or 16 bytes), the expression of element `lane` of
    // word w, and the statement replacing it with storage value v.
    static const char* word_type(DType t, int n) {
        const size_t bytes = n * dtype_size(t);
        return bytes == 16 ? "uint4" : bytes == 8 ? "uint2" : "unsigned";
    }
    static std::string word_part(DType t, int n, const std::string& w, int lane, int* shift) {
        const size_t es = dtype_size(t), byte = lane * es;
        *shift = (int)(byte % 4) * 8;
        return n * es == 4 ? w : fmt::format("{}.{}", w, "xyzw"[byte / 4]);
    }
    static std::string word_element(DType t, int n, const std::string& w, int lane) {
        int shift = 0;
        const std::string part = word_part(t, n, w, lane, &shift);
        switch (dtype_size(t)) {
        case 4: return t == DType::Float32 ? fmt::format("__uint_as_float({})", part) : fmt::format("(int){}", part);
        case 2: return fmt::format("(unsigned short)({} >> {})", part, shift);
        default: return fmt::format("(unsigned char)({} >> {})", part, shift);
        }
    }
    static std::string word_store(DType t, int n, const std::string& w, int lane, const std::string& v) {
        int shift = 0;
        const std::string part = word_part(t, n, w, lane, &shift);
        switch (dtype_size(t)) {
        case 4:
            return fmt::format("{} = {};", part,
                               t == DType::Float32 ? fmt::format("__float_as_uint({})", v) : fmt::format("(unsigned)({})", v));
        case 2: return fmt::format("{0} = ({0} & ~(0xffffu << {1})) | ((unsigned)({2}) << {1});", part, shift, v);
        default: return fmt::format("{0} = ({0} & ~(0xffu << {1})) | ((unsigned)({2}) << {1});", part, shift, v);
        }
    }

    // n elements per thread with one load and one store of up to 16 bytes per contiguous
    // buffer, when every contiguous buffer is aligned for it; the scalar loop does the rest.
    void emit_vector_path() {
        const int n = vector_width();
        std::string misaligned;
        for (size_t b = 0; b < k_.buffers.size(); ++b) {
            if (!all_uses_.buffers[b] || k_.buffers[b].layout[0] != StrideKind::One) continue;
            misaligned += fmt::format("{}((unsigned long long)b{} & {})", misaligned.empty() ? "" : " | ", b,
                                      n * dtype_size(k_.buffers[b].dtype) - 1);
        }
        line("long long start = 0;");
        open(fmt::format("if (({}) == 0)", misaligned.empty() ? "0" : misaligned));
        line("const long long nv = a.sizes[0] / {};", n);
        open("for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < nv; "
             "q += (long long)gridDim.x * blockDim.x)");
        std::vector<bool> stored(k_.buffers.size(), false);
        for (const kir::Block& b : k_.blocks)
            for (auto& st : b.stores) stored[st.buffer] = true;
        for (size_t b = 0; b < k_.buffers.size(); ++b) {
            if (!all_uses_.buffers[b] || k_.buffers[b].layout[0] != StrideKind::One) continue;
            const char* wt = word_type(k_.buffers[b].dtype, n);
            if (stored[b]) line("{} w{} = {{}};", wt, b);
            else line("const {0} w{1} = ((const {0}*)b{1})[q];", wt, b);
        }
        scope_ = Scope::Elementwise;
        for (int lane = 0; lane < n; ++lane) {
            open("");
            line("const long long i = {} * q + {};", n, lane);
            for (size_t b = 0; b < k_.buffers.size(); ++b) {
                if (!all_uses_.buffers[b]) continue;
                if (k_.buffers[b].layout[0] == StrideKind::Zero) line("const long long o{} = 0;", b);
                else if (!stored[b]) load_override_[b] = load_expr(k_.buffers[b].dtype, word_element(k_.buffers[b].dtype, n, fmt::format("w{}", b), lane));
            }
            for (const kir::Block& b : k_.blocks) {
                if (b.loop) {
                    declare_acc_results(b);
                    open("");
                    init_acc_states(b);
                }
                emit_instrs(b);
                if (b.loop) add_to_acc_states(b, "0");
                for (auto& st : b.stores) {
                    const DType t = k_.buffers[st.buffer].dtype;
                    if (k_.buffers[st.buffer].layout[0] == StrideKind::Zero) {
                        line("b{}[0] = {};", st.buffer, store_value(t, v(st.value)));
                    } else {
                        line("{}", word_store(t, n, fmt::format("w{}", st.buffer), lane, store_value(t, v(st.value))));
                    }
                }
                if (b.loop) {
                    set_acc_results(b);
                    close();
                }
            }
            load_override_.assign(k_.buffers.size(), "");
            close();
        }
        for (size_t b = 0; b < k_.buffers.size(); ++b)
            if (stored[b] && k_.buffers[b].layout[0] == StrideKind::One)
                line("(({}*)b{})[q] = w{};", word_type(k_.buffers[b].dtype, n), b, b);
        close();
        line("start = nv * {};", n);
        close();
    }
    size_t record_bytes() const { return 8 * k_.accums.size(); }

    void emit_partial_kernel() {
        const kir::Block& b = k_.blocks[0];
        line("");
        open(signature(k_.name + "_partial", kCudaBlockSize));
        line("unsigned char* const partials = scratch;");
        line("const int num_partials = param;");
        emit_buffer_pointers(block_uses_[0]);
        emit_scratch();
        line("const long long nr = {};", product(rdims_));
        line("const long long chunk = (nr + num_partials - 1) / num_partials;");
        open("for (int part = blockIdx.x; part < num_partials; part += gridDim.x)");
        scope_ = Scope::PPoint;
        line("const long long rbegin = (long long)part * chunk;");
        line("const long long rend = rbegin + chunk < nr ? rbegin + chunk : nr;");
        init_acc_states(b);
        open("for (long long ri = rbegin + threadIdx.x; ri < rend; ri += blockDim.x)");
        emit_rloop_body(0);
        close();
        block_reduce_acc_states(b);
        open("if (threadIdx.x == 0)");
        line("unsigned char* const rec = partials + (long long)part * {};", record_bytes());
        for (int ai : b.accums) {
            line("*({}*)(rec + {}) = acc{}_v;", ctype(k_.accums[ai].type), 8 * ai, ai);
            line("*(int*)(rec + {}) = acc{}_p;", 8 * ai + 4, ai);
        }
        close();
        close();
        close();
    }

    void emit_final_kernel() {
        const kir::Block& loop = k_.blocks[0];
        const kir::Block& point = k_.blocks[1];
        line("");
        open(signature(k_.name + "_final", kCudaBlockSize));
        line("const unsigned char* const partials = scratch;");
        line("const int num_partials = param;");
        emit_buffer_pointers(block_uses_[1]);
        emit_scratch();
        scope_ = Scope::PPoint;
        declare_acc_results(loop);
        init_acc_states(loop);
        // Thread t folds records t, t + blockDim.x, ... in order, then the block combines the
        // threads in a fixed tree: the same partials always give the same result.
        open("for (int j = threadIdx.x; j < num_partials; j += blockDim.x)");
        line("const unsigned char* const rec = partials + (long long)j * {};", record_bytes());
        for (int ai : loop.accums) {
            const kir::Accum& ac = k_.accums[ai];
            line("{}::add(acc{}_v, acc{}_p, *(const {}*)(rec + {}), *(const int*)(rec + {}));", acc_struct(ac), ai, ai,
                 ctype(ac.type), 8 * ai, 8 * ai + 4);
        }
        close();
        block_reduce_acc_states(loop);
        set_acc_results(loop);
        emit_instrs(point);
        if (!point.stores.empty()) {
            open("if (threadIdx.x == 0)");
            emit_stores(point);
            close();
        }
        close();
    }
};

} // namespace

CudaSource emit_cuda(const kir::Kernel& k) {
    validate(k);
    return Emitter(k).run();
}

} // namespace kiln::codegen
