// The CUDA C emitter's shared pieces: the structural checks of a Kernel, the scopes in which code is
// emitted, offsets and coordinates, expressions, accumulators, and emit_cuda, which picks the
// kernel shape (cuda_launch.cpp) and its file (cuda_elementwise, cuda_row, cuda_column, cuda_full).
#include "codegen/cuda/cuda_emitter.hpp"

#include "compiler/kernel_check.hpp"
#include "ir/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

namespace kiln::codegen::detail {



const char* ctype(CT t) {
    switch (t) {
    case CT::F32: return "float";
    case CT::I32: return "int";
    case CT::F64: return "double";
    case CT::I64: return "long long";
    }
    return "?";
}

bool is_arg(AccKind k) { return k == AccKind::ArgMax || k == AccKind::ArgMin; }
bool stepped(AccKind k) { return is_arg(k) || k == AccKind::Max || k == AccKind::Min; }

std::string acc_struct(const kir::Accum& a) {
    const char* kind = "?";
    switch (a.kind) {
    case AccKind::Sum: kind = "sum"; break;
    case AccKind::Max: kind = "max"; break;
    case AccKind::Min: kind = "min"; break;
    case AccKind::ArgMax: kind = "argmax"; break;
    case AccKind::ArgMin: kind = "argmin"; break;
    case AccKind::Prod: kind = "prod"; break;
    }
    return fmt::format("kiln_{}_{}", kind, acc_suffix(a.type));
}

const char* acc_suffix(CT t) {
    switch (t) {
    case CT::F32: return "f";
    case CT::I32: return "i";
    case CT::F64: return "d";
    case CT::I64: return "l";
    }
    return "?";
}

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

// A double literal that reads back to exactly `d` (its bits).
std::string double_literal(double d) {
    uint64_t u;
    std::memcpy(&u, &d, 8);
    return fmt::format("__longlong_as_double(0x{:016x}LL)", u);
}

std::string long_literal(int64_t i) {
    return i == INT64_MIN ? std::string("(-9223372036854775807LL - 1)") : fmt::format("{}LL", i);
}

const char* storage_type(DType t) {
    switch (t) {
    case DType::Float32: return "float";
    case DType::Float16: case DType::BFloat16: return "unsigned short";
    case DType::Int32: return "int";
    case DType::Int8: case DType::UInt8: case DType::Bool: return "unsigned char";
    case DType::Float64: return "double";
    case DType::Int64: case DType::UInt64: return "long long";   // (uint64: its bits)
    case DType::Int16: return "short";
    case DType::UInt16: return "unsigned short";
    case DType::UInt32: return "unsigned";
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
    case DType::Float64: case DType::Int64: case DType::UInt64: return elem;
    case DType::Int16: case DType::UInt16: return fmt::format("(int){}", elem);
    case DType::UInt32: return fmt::format("(long long){}", elem);
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
    case DType::Float64: case DType::Int64: case DType::UInt64: return v;
    case DType::Int16: return fmt::format("(short){}", v);
    case DType::UInt16: return fmt::format("(unsigned short){}", v);
    case DType::UInt32: return fmt::format("(unsigned){}", v);
    }
    return "?";
}

// The kernel IR's rules (compiler/kernel_check.hpp) plus a C identifier for a name, so that a
// malformed Kernel fails here with its listing rather than in NVRTC with a confusing message
// (or, worse, compiles into something wrong).
void validate(const kir::Kernel& k) {
    auto fail = [&](const std::string& why) {
        throw InternalError(fmt::format("emit_cuda: {}\n{}", why, kir::to_string(k)));
    };
    bool ident = !k.name.empty() && !std::isdigit((unsigned char)k.name[0]);
    for (char c : k.name) ident = ident && (std::isalnum((unsigned char)c) || c == '_');
    if (!ident) fail(fmt::format("kernel name '{}' is not a C identifier", k.name));
    if (std::string problem = kir::kernel_problem(k); !problem.empty()) fail(problem);
}

CudaSource Emitter::run() {
    CudaSource src;
    out_ = "// generated by kiln from the kernel IR; compile with NVRTC, no headers needed\n";
    out_ += detail::kCudaPrelude;
    const CudaShape shape = cuda_shape(k_);
    const bool reduces = shape != CudaShape::Elementwise || !k_.accums.empty();
    // A row kernel's small entry (its module alone) has neither grouped steps nor folds.
    const bool row = shape == CudaShape::Row, steps = row && module_.entry != k_.name + "_s";
    const std::vector<detail::RowFold> folds = steps ? detail::row_folds(k_) : std::vector<detail::RowFold>{};
    auto folds_of = [&](detail::RowFold::Kind kind) {
        return std::any_of(folds.begin(), folds.end(), [&](const detail::RowFold& f) { return f.kind == kind; });
    };
    const bool extremes = std::any_of(k_.accums.begin(), k_.accums.end(), [](const kir::Accum& a) {
        return a.kind != kir::AccKind::Sum && a.kind != kir::AccKind::Prod;
    });
    const bool row_moments = folds_of(detail::RowFold::Moments);
    if (reduces) out_ += detail::kCudaReducePrelude;
    if (steps && extremes) out_ += detail::kCudaStepPrelude;
    if (shape == CudaShape::Column) out_ += detail::kCudaColumnPrelude;
    if (row_moments || !detail::column_folds(k_).empty()) out_ += detail::kCudaMomentsPrelude;
    if (row) out_ += detail::kCudaRowPrelude;
    if (row_moments) out_ += detail::kCudaRowMomentsPrelude;
    if (folds_of(detail::RowFold::ExpSum)) out_ += detail::kCudaLsePrelude;
    if (k_.hist.bins > 0) out_ += detail::kCudaHistPrelude;
    if (detail::has_wide(k_)) out_ += detail::kCudaWidePrelude;
    if (detail::has_wide(k_) && reduces) out_ += detail::kCudaWideReducePrelude;
    emit_args_struct();
    switch (shape) {
    case CudaShape::Full:
        emit_full_kernel();
        src.entry_points = {k_.name};
        break;
    case CudaShape::Row:
        if (module_.entry.empty() || module_.entry == k_.name) {
            emit_row_kernel(RowEntry::Shared);
            src.entry_points = {k_.name};
        }
        if (detail::row_register_entry(k_) && (module_.entry.empty() || module_.entry == k_.name + "_r")) {
            emit_row_kernel(RowEntry::Registers);
            src.entry_points.push_back(k_.name + "_r");
        }
        if (module_.entry.empty() || module_.entry == k_.name + "_s") {
            emit_row_kernel(RowEntry::Small);
            src.entry_points.push_back(k_.name + "_s");
            src.fast_compile = !module_.entry.empty();
        }
        break;
    case CudaShape::Column:
        emit_column_kernel();
        src.entry_points = {k_.name};
        if (detail::column_vector_width(k_)) src.entry_points.push_back(k_.name + "_v");
        if (detail::column_splittable(k_)) src.entry_points.push_back(k_.name + "_final");
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
        if (need[d]) line("const {} c{} = {};", index_type(), d, j == 0 ? cur : fmt::format("{} % {}", cur, size(d)));
        if (j == outer) break;
        if (cur == lin) {
            line("{} {} = {} / {};", index_type(), tmp, lin, size(d));
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
        s += l == StrideKind::One ? fmt::format("c{}", d)
                                  : fmt::format("c{} * {}a.strides[{}]", d, narrow_ ? "(int)" : "", b * k_.rank + d);
    }
    return s;
}

// Offset expression of buffer b in the current scope (variables declared by the scope).
std::string Emitter::offset(int b) const {
    if (scope_ == Scope::PPoint) {
        return offset_terms(b, pdims_).empty() ? "0" : fmt::format("pb{}{}", b, col_);
    }
    return fmt::format("o{}{}", b, col_);
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
    const std::string x = in.a[0] >= 0 ? v(in.a[0]) : "", y = in.a[1] >= 0 ? v(in.a[1]) : "";
    if (std::string s = width_free_expr(in, x, y); !s.empty()) return s;
    if (is_wide(in.type) || (in.a[0] >= 0 && is_wide(k_.instrs[in.a[0]].type))) return wide_expr(in, x, y);
    const bool f = in.type == CT::F32;
    const bool fx = in.a[0] >= 0 && k_.instrs[in.a[0]].type == CT::F32;   // operand type
    switch (in.op) {
    case Op::ConstF: return float_literal((float)in.fimm);
    case Op::ConstI: return int_literal((int32_t)in.iimm);
    case Op::ParamF: return fmt::format("a.fp[{}]", in.index);
    case Op::ParamI: return fmt::format("a.ip[{}]", in.index);
    case Op::Coord: return fmt::format("(int){}", coord(in.index));
    case Op::LinearId: return linear_id();
    case Op::Neg: return f ? "-" + x : fmt::format("(int)(0u - (unsigned){})", x);
    case Op::Abs: return f ? fmt::format("fabsf({})", x) : fmt::format("{0} < 0 ? (int)(0u - (unsigned){0}) : {0}", x);
    case Op::Sqrt: return fmt::format("sqrtf({})", x);
    case Op::Exp: {
        const size_t id = (size_t)(&in - k_.instrs.data());
        const bool sum = id < sum_exp_.size() && sum_exp_[id];
        return (stores_16_ ? (sum ? "kiln_exp_sum_fast(" : "kiln_exp_fast(") : "expf(") + x + ")";
    }
    case Op::Exp2: return fmt::format("exp2f({})", x);
    case Op::Log: return fmt::format("logf({})", x);
    case Op::Log2: return fmt::format("log2f({})", x);
    case Op::Tanh: return fmt::format("tanhf({})", x);
#define KILN_MATH(K, name, c_function, host) \
    case Op::K: return fmt::format(#c_function "({})", x);
#define KILN_MATH2(K, name, c_function, host) \
    case Op::K: return fmt::format(#c_function "({}, {})", x, y);
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
    case Op::Rint: return fmt::format("rintf({})", x);
    case Op::Sgn:
        return f ? fmt::format("{0} != {0} ? {0} : (float)(({0} > 0.0f) - ({0} < 0.0f))", x)
                 : fmt::format("({0} > 0) - ({0} < 0)", x);
    case Op::Finite: return fmt::format("(int)((__float_as_uint({}) & 0x7f800000u) != 0x7f800000u)", x);
    case Op::ToF32: return fmt::format("(float){}", x);
    case Op::ToI32: return fmt::format("kiln_f32_to_i32({})", x);
    case Op::WrapI8: return fmt::format("(({} & 0xff) ^ 0x80) - 0x80", x);
    case Op::WrapU8: return fmt::format("{} & 0xff", x);
    case Op::ToBool: return fmt::format("(int)({} != {})", x, fx ? "0.0f" : "0");
    case Op::Add: return f ? fmt::format("{} + {}", x, y) : fmt::format("(int)((unsigned){} + (unsigned){})", x, y);
    case Op::Sub: return f ? fmt::format("{} - {}", x, y) : fmt::format("(int)((unsigned){} - (unsigned){})", x, y);
    case Op::Mul: return f ? fmt::format("{} * {}", x, y) : fmt::format("(int)((unsigned){} * (unsigned){})", x, y);
    case Op::Pow: return fmt::format("powf({}, {})", x, y);
    case Op::Maximum: return f ? fmt::format("kiln_maxf({}, {})", x, y) : fmt::format("{0} > {1} ? {0} : {1}", x, y);
    case Op::Minimum: return f ? fmt::format("kiln_minf({}, {})", x, y) : fmt::format("{0} < {1} ? {0} : {1}", x, y);
    case Op::Shl: return fmt::format("(int)((unsigned){} << ({} & 31))", x, y);
    case Op::Shr: return fmt::format("(int)((unsigned){} >> ({} & 31))", x, y);
    case Op::MulHi: return fmt::format("(int)__umulhi((unsigned){}, (unsigned){})", x, y);
    case Op::AsI32: return fmt::format("__float_as_int({})", x);
    case Op::AsF32: return fmt::format("__int_as_float({})", x);
    case Op::Floor: return fmt::format("floorf({})", x);
    case Op::Fmod: return fmt::format("fmodf({}, {})", x, y);
    case Op::NextAfter: return fmt::format("nextafterf({}, {})", x, y);
    case Op::WrapI16: return fmt::format("(int)(short)(unsigned short)({} & 0xffff)", x);
    case Op::WrapU16: return fmt::format("{} & 0xffff", x);
    case Op::Convert: return fx && !f ? fmt::format("kiln_f32_to_i32({})", x) : fmt::format("({}){}", ctype(in.type), x);
    case Op::WrapU32: case Op::AsI64: case Op::AsF64: break;   // 64-bit: wide_expr
    case Op::Load: case Op::Gather: case Op::AccResult: case Op::Div: case Op::Eq: case Op::Ne: case Op::Lt:
    case Op::Le: case Op::Gt: case Op::Ge: case Op::And: case Op::Or: case Op::Xor: case Op::Select: case Op::IDiv:
    case Op::IRem: break;   // width_free_expr
    }
    return "?";
}

// Ops whose C text is the same for 32-bit and 64-bit values; "" for the others.
std::string Emitter::width_free_expr(const kir::Instr& in, const std::string& x, const std::string& y) const {
    switch (in.op) {
    case Op::Load:
        if (!load_override_[in.index].empty()) return load_override_[in.index];
        return load_expr(k_.buffers[in.index].dtype, fmt::format("b{}[{}]", in.index, offset(in.index)));
    case Op::Gather:
        return load_expr(k_.buffers[in.index].dtype,
                         fmt::format("b{}[{} + (long long){} * a.ip[{}]]", in.index, offset(in.index), x, in.aux));
    case Op::AccResult: return acc(in.index);
    case Op::Div: case Op::IDiv: return fmt::format("{} / {}", x, y);
    case Op::IRem: return fmt::format("{} % {}", x, y);
    case Op::Eq: return fmt::format("(int)({} == {})", x, y);
    case Op::Ne: return fmt::format("(int)({} != {})", x, y);
    case Op::Lt: return fmt::format("(int)({} < {})", x, y);
    case Op::Le: return fmt::format("(int)({} <= {})", x, y);
    case Op::Gt: return fmt::format("(int)({} > {})", x, y);
    case Op::Ge: return fmt::format("(int)({} >= {})", x, y);
    case Op::And: return fmt::format("{} & {}", x, y);
    case Op::Or: return fmt::format("{} | {}", x, y);
    case Op::Xor: return fmt::format("{} ^ {}", x, y);
    case Op::Select: return fmt::format("{} != 0 ? {} : {}", x, y, v(in.a[2]));
    default: return "";
    }
}

// Instructions with a 64-bit result or first operand (double, long long). Float to integer
// conversions saturate and send NaN to 0 as the 32-bit ones do (cvt.rzi.sat); integer
// arithmetic wraps through unsigned long long.
std::string Emitter::wide_expr(const kir::Instr& in, const std::string& x, const std::string& y) const {
    const bool f = in.type == CT::F64;
    const CT xt = in.a[0] >= 0 ? k_.instrs[in.a[0]].type : in.type;
    auto wrap2 = [&](const char* op) {
        return fmt::format("(long long)((unsigned long long){} {} (unsigned long long){})", x, op, y);
    };
    switch (in.op) {
    case Op::ConstF: return double_literal(in.fimm);
    case Op::ConstI: return long_literal(in.iimm);
    case Op::ParamF: return fmt::format("kiln_param_f64(a.fp, {})", in.index);
    case Op::ParamI: return fmt::format("kiln_param_i64(a.ip, {})", in.index);
    case Op::Neg: return f ? "-" + x : fmt::format("(long long)(0ull - (unsigned long long){})", x);
    case Op::Abs: return f ? fmt::format("fabs({})", x) : fmt::format("{0} < 0 ? (long long)(0ull - (unsigned long long){0}) : {0}", x);
    case Op::Sqrt: return fmt::format("sqrt({})", x);
    case Op::Exp: return fmt::format("exp({})", x);
    case Op::Exp2: return fmt::format("exp2({})", x);
    case Op::Log: return fmt::format("log({})", x);
    case Op::Log2: return fmt::format("log2({})", x);
    case Op::Tanh: return fmt::format("tanh({})", x);
#define KILN_MATH(K, name, c_function, host) \
    case Op::K: return fmt::format("{}({})", double_function(#c_function), x);
#define KILN_MATH2(K, name, c_function, host) \
    case Op::K: return fmt::format("{}({}, {})", double_function(#c_function), x, y);
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
    case Op::Rint: return fmt::format("rint({})", x);
    case Op::Sgn:
        return f ? fmt::format("{0} != {0} ? {0} : (double)(({0} > 0.0) - ({0} < 0.0))", x)
                 : fmt::format("(long long)(({0} > 0) - ({0} < 0))", x);
    case Op::Finite: return fmt::format("(int)isfinite({})", x);
    case Op::ToBool: return fmt::format("(int)({} != {})", x, xt == CT::F64 ? "0.0" : "0");
    case Op::Convert:
        // From a float to an integer: saturating, NaN to 0; any other conversion is C's.
        if (is_float(xt) && !is_float(in.type))
            return fmt::format("kiln_{}_to_{}({})", xt == CT::F64 ? "f64" : "f32", in.type == CT::I64 ? "i64" : "i32", x);
        return fmt::format("({}){}", ctype(in.type), x);
    case Op::WrapU32: return fmt::format("{} & 0xffffffffLL", x);
    case Op::AsI64: return fmt::format("__double_as_longlong({})", x);
    case Op::AsF64: return fmt::format("__longlong_as_double({})", x);
    // Doubles round each operation as the CPU does: the _rn intrinsics are never contracted
    // into fused multiply-adds.
    case Op::Add: return f ? fmt::format("__dadd_rn({}, {})", x, y) : wrap2("+");
    case Op::Sub: return f ? fmt::format("__dsub_rn({}, {})", x, y) : wrap2("-");
    case Op::Mul: return f ? fmt::format("__dmul_rn({}, {})", x, y) : wrap2("*");
    case Op::Pow: return fmt::format("pow({}, {})", x, y);
    case Op::Maximum: return f ? fmt::format("kiln_maxd({}, {})", x, y) : fmt::format("{0} > {1} ? {0} : {1}", x, y);
    case Op::Minimum: return f ? fmt::format("kiln_mind({}, {})", x, y) : fmt::format("{0} < {1} ? {0} : {1}", x, y);
    case Op::Shl: return fmt::format("(long long)((unsigned long long){} << ({} & 63))", x, y);
    case Op::Shr: return fmt::format("(long long)((unsigned long long){} >> ({} & 63))", x, y);
    case Op::Floor: return fmt::format("floor({})", x);
    case Op::Fmod: return fmt::format("fmod({}, {})", x, y);
    case Op::NextAfter: return fmt::format("nextafter({}, {})", x, y);
    default: break;
    }
    throw InternalError(fmt::format("emit_cuda: {} has no 64-bit form ({})", kir::op_name(in.op), k_.name));
}

// The C library's double function for a float one's name (sinf -> sin).
std::string Emitter::double_function(const char* c_function) {
    std::string n = c_function;
    if (!n.empty() && n.back() == 'f') n.pop_back();
    return n;
}

void Emitter::emit_instrs(const kir::Block& b) {
    for (int id : b.instrs)
        if (hoisted_.empty() || !hoisted_[id])
            line("const {} {} = {};", ctype(k_.instrs[id].type), v(id), expr(k_.instrs[id]));
}

void Emitter::emit_stores(const kir::Block& b) {
    for (auto& st : b.stores) {
        if (!store_to_.empty() && !store_to_[st.buffer].empty()) line("{} = {};", store_to_[st.buffer], v(st.value));
        else line("b{}[{}] = {};", st.buffer, offset(st.buffer), store_value(k_.buffers[st.buffer].dtype, v(st.value)));
        emit_hist_count(st.buffer, v(st.value));
    }
}

// The value as stored (rounded to the buffer's dtype, by the stores' own conversions) goes to
// its bin.
void Emitter::emit_hist_count(int buffer, const std::string& value) {
    if (!k_.buffers[buffer].hist) return;
    std::string stored = value;
    switch (k_.buffers[buffer].dtype) {
    case DType::Float16: stored = fmt::format("kiln_f16_to_f32_hw(kiln_f32_to_f16({}))", value); break;
    case DType::BFloat16: stored = fmt::format("kiln_bf16_to_f32(kiln_f32_to_bf16({}))", value); break;
    default: break;
    }
    line("kiln_hist_count<{}, {}>(kiln_hist, {});", k_.hist.bins, k_.hist.offset, stored);
}

void Emitter::close_kernel() {
    if (k_.hist.bins > 0) {
        line("__syncthreads();");
        line("for (int i = threadIdx.x; i < {}; i += blockDim.x)", k_.hist.bins);
        line("    if (kiln_hist[i]) atomicAdd(a.hist + i, kiln_hist[i]);");
    }
    close();
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
    if (k_.hist.bins > 0) line("unsigned* hist;");
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

// Shared scratch for combining the accumulators' states: kiln_sv<suffix> per state type and
// kiln_sp for positions, `n` entries each.
void Emitter::declare_acc_scratch(int n) {
    for (CT t : {CT::F32, CT::I32, CT::F64, CT::I64})
        if (std::any_of(k_.accums.begin(), k_.accums.end(), [&](const kir::Accum& a) { return a.type == t; }))
            line("__shared__ {} kiln_sv{}[{}];", ctype(t), acc_suffix(t), n);
    if (!k_.accums.empty()) line("__shared__ int kiln_sp[{}];", n);
}

void Emitter::emit_scratch() { declare_acc_scratch(33); }

void Emitter::declare_acc_results(const kir::Block& b) {
    for (int ai : b.accums) line("{} {};", ctype(kir::acc_result_type(k_.accums[ai])), acc(ai));
}

void Emitter::init_acc_states(const kir::Block& b) {
    for (int ai : b.accums) {
        const kir::Accum& ac = k_.accums[ai];
        line("{} {}_v = {}::init();", ctype(ac.type), acc(ai), acc_struct(ac));
        line("int {}_p = KILN_NO_POS;", acc(ai));
    }
}

void Emitter::add_to_acc_states(const kir::Block& b, const std::string& pos) {
    for (int ai : b.accums) {
        if (!from_fold_.empty() && from_fold_[ai]) continue;
        if (!step_summed_.empty() && step_summed_[ai]) continue;
        const kir::Accum& ac = k_.accums[ai];
        if (!step_arg_.empty() && step_arg_[ai]) {
            if (step_floats(ai)) line("av{}[u] = {};", ai, v(ac.value));
            continue;
        }
        line("{0}::{4}({1}_v, {1}_p, {2}, {3});", acc_struct(ac), acc(ai), v(ac.value), pos, in_order_ ? "add_next" : "add");
    }
}

void Emitter::store_acc_record(const kir::Block& b) {
    const int slot = detail::acc_record_slot(k_);
    for (int ai : b.accums) {
        line("*({}*)(rec + {}) = {}_v;", ctype(k_.accums[ai].type), slot * ai, acc(ai));
        line("*(int*)(rec + {}) = {}_p;", slot * ai + slot / 2, acc(ai));
    }
}

void Emitter::fold_acc_record(const kir::Block& b) {
    const int slot = detail::acc_record_slot(k_);
    for (int ai : b.accums) {
        const kir::Accum& ac = k_.accums[ai];
        line("{0}::add({1}_v, {1}_p, __ldcg((const {2}*)(rec + {3})), __ldcg((const int*)(rec + {4})));", acc_struct(ac),
             acc(ai), ctype(ac.type), slot * ai, slot * ai + slot / 2);
    }
}

void Emitter::emit_last_arrival(const std::string& counter, const std::string& arrivals) {
    line("__syncthreads();");
    open("if (threadIdx.x == 0)");
    line("kiln_last = kiln_arrive({}) == {} - 1;", counter, arrivals);
    line("if (kiln_last) *({}) = 0u;", counter);
    close();
    line("__syncthreads();");
}

void Emitter::block_reduce_acc_states(const kir::Block& b) {
    for (int ai : b.accums) {
        const kir::Accum& ac = k_.accums[ai];
        line("kiln_block_reduce<{0}>({1}_v, {1}_p, kiln_sv{2}, kiln_sp);", acc_struct(ac), acc(ai), acc_suffix(ac.type));
    }
}

// An Arg accumulator that saw no point (an empty R domain) yields position 0.
void Emitter::set_acc_results(const kir::Block& b) {
    for (int ai : b.accums) {
        if (is_arg(k_.accums[ai].kind)) line("{0} = {0}_p == KILN_NO_POS ? 0 : {0}_p;", acc(ai));
        else line("{0} = {0}_v;", acc(ai));
    }
}

// Declares o<b> for the buffers the block uses, inside an R loop: P part plus R part.
void Emitter::emit_rloop_offsets(const Uses& u) {
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
        if (!u.buffers[b]) continue;
        std::string p = offset_terms((int)b, pdims_).empty() ? "" : fmt::format("pb{}{}", b, col_);
        std::string r = offset_terms((int)b, rdims_);
        std::string e = p.empty() ? r : r.empty() ? p : p + " + " + r;
        line("const {} o{}{} = {};", index_type(), b, col_, e.empty() ? "0" : e);
    }
}

// The body of a Loop block for one R point at flattened R index `ri`.
void Emitter::emit_rloop_body(size_t bi, bool walked) {
    const kir::Block& b = k_.blocks[bi];
    scope_ = Scope::RLoop;
    const std::vector<bool> need = needed_coords(block_uses_[bi], rdims_, true);
    if (walked) {
        for (int d : rdims_)
            if (need[d]) line("const long long c{0} = k{0};", d);
    } else {
        emit_coords(rdims_, "ri", need, "tr");
    }
    emit_rloop_offsets(block_uses_[bi]);
    emit_instrs(b);
    if (!folds_now_.empty()) emit_fold_values();
    add_to_acc_states(b, "(int)ri");
    emit_stores(b);
    scope_ = Scope::PPoint;
}

std::string Emitter::signature(const std::string& entry, int max_threads, int min_blocks, bool counters) const {
    return fmt::format("extern \"C\" __global__ void __launch_bounds__({}{}) {}(const Args a, unsigned char* const "
                       "scratch, const int param{})",
                       max_threads, min_blocks > 1 ? fmt::format(", {}", min_blocks) : "", entry,
                       counters ? ", unsigned* const counters" : "");
}

void Emitter::open_kernel(const std::string& entry, int max_threads, int min_blocks, bool counters) {
    open(signature(entry, max_threads, min_blocks, counters));
    line("kiln_after_prior_grids();");
    if (k_.hist.bins > 0) {
        line("__shared__ unsigned kiln_hist[{}];", k_.hist.bins);
        line("for (int i = threadIdx.x; i < {}; i += blockDim.x) kiln_hist[i] = 0;", k_.hist.bins);
        line("__syncthreads();");
    }
}

bool Emitter::canonicalising(const kir::Instr& in) {
    if (in.type != CT::F32) return false;
    switch (in.op) {
    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Sqrt: case Op::Exp: return true;
    default: return false;
    }
}

void Emitter::find_payload_uses() {
    payload_seen_.assign(k_.instrs.size(), false);
    for (const kir::Instr& in : k_.instrs) {
        bool blind = canonicalising(in);
        switch (in.op) {
        case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: case Op::ToI32:
        case Op::Finite: case Op::ToBool: blind = true; break;
        default: break;
        }
        for (size_t i = 0; i < 3; ++i) {
            const int o = in.a[i];
            if (o < 0) continue;
            if (!(blind || (in.op == Op::Select && i == 0))) payload_seen_[o] = true;
        }
    }
    for (const kir::Block& b : k_.blocks)
        for (const kir::Store& st : b.stores) payload_seen_[st.value] = true;
    // A float sum or product is arithmetic; an arg reduction yields a position, whatever the NaN; a max or
    // min passes a NaN on, seen where its result is (until nothing changes: a max of an earlier
    // max's result passes it on too).
    for (bool changed = true; changed;) {
        changed = false;
        std::vector<bool> result_seen(k_.accums.size(), false);
        for (size_t id = 0; id < k_.instrs.size(); ++id)
            if (k_.instrs[id].op == Op::AccResult && payload_seen_[id]) result_seen[k_.instrs[id].index] = true;
        for (size_t ai = 0; ai < k_.accums.size(); ++ai) {
            const kir::Accum& ac = k_.accums[ai];
            const bool arithmetic = (ac.kind == AccKind::Sum || ac.kind == AccKind::Prod) && ac.type == CT::F32;
            if (!arithmetic && !is_arg(ac.kind) && result_seen[ai] &&
                !payload_seen_[ac.value])
                payload_seen_[ac.value] = changed = true;
        }
    }
}

bool Emitter::needs_exact_load(size_t buf, int bi) const {
    for (size_t i = 0; i < k_.blocks.size(); ++i) {
        if (bi >= 0 && (int)i != bi) continue;
        for (int id : k_.blocks[i].instrs)
            if (k_.instrs[id].op == Op::Load && k_.instrs[id].index == (int)buf && payload_seen_[id]) return true;
    }
    return false;
}

bool Emitter::needs_exact_store(size_t buf, int bi) const {
    for (size_t i = 0; i < k_.blocks.size(); ++i) {
        if (bi >= 0 && (int)i != bi) continue;
        for (const kir::Store& st : k_.blocks[i].stores)
            if (st.buffer == (int)buf && !canonicalising(k_.instrs[st.value])) return true;
    }
    return false;
}

void Emitter::emit_pbase_offsets() {
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
        if (!all_uses_.buffers[b]) continue;
        std::string e = offset_terms((int)b, pdims_);
        if (!e.empty()) line("const {} pb{}{} = {};", index_type(), b, col_, e);
    }
}

} // namespace kiln::codegen::detail

namespace kiln::codegen {

CudaSource emit_cuda(const kir::Kernel& k) {
    detail::validate(k);
    return detail::Emitter(k).run();
}

const char* cuda_reach_name(CudaReach r) {
    switch (r) {
    case CudaReach::Cluster: return "cluster";
    case CudaReach::Block: return "block";
    case CudaReach::Warp: return "warp";
    }
    return "?";
}

std::vector<CudaModuleId> cuda_modules(const kir::Kernel& k) {
    if (cuda_shape(k) != CudaShape::Row) return {CudaModuleId{}};
    std::vector<CudaModuleId> m = {{k.name, CudaReach::Cluster}, {k.name, CudaReach::Block}, {k.name, CudaReach::Warp}};
    if (detail::row_register_entry(k)) {   // never launched in a cluster
        m.push_back({k.name + "_r", CudaReach::Block});
        m.push_back({k.name + "_r", CudaReach::Warp});
    }
    m.push_back({k.name + "_s", CudaReach::Block});   // never launched in a cluster either
    m.push_back({k.name + "_s", CudaReach::Warp});
    return m;
}

CudaModuleId cuda_module_of(const kir::Kernel& k, const std::string& entry, CudaReach reach) {
    if (cuda_shape(k) != CudaShape::Row) return CudaModuleId{};
    return CudaModuleId{entry, reach};
}

std::string cuda_module_label(const kir::Kernel& k, const CudaModuleId& m) {
    return m.entry.empty() ? k.name : m.entry + "." + cuda_reach_name(m.reach);
}

CudaSource emit_cuda_module(const kir::Kernel& k, const CudaModuleId& m) {
    detail::validate(k);
    if (!m.entry.empty()) {
        const std::vector<CudaModuleId> all = cuda_modules(k);
        KILN_CHECK_INTERNAL(std::find(all.begin(), all.end(), m) != all.end(), "emit_cuda_module: kernel {} has no module {}",
                            k.name, cuda_module_label(k, m));
    }
    return detail::Emitter(k, m).run();
}

} // namespace kiln::codegen
