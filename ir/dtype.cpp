#include "ir/dtype.hpp"

namespace kiln {

namespace {

int bits(DType t) { return 8 * (int)dtype_size(t); }

DType signed_of_bits(int b) {
    return b <= 8 ? DType::Int8 : b <= 16 ? DType::Int16 : b <= 32 ? DType::Int32 : DType::Int64;
}

} // namespace

DType promote(DType a, DType b) {
    if (a == b) return a;
    if (a == DType::Bool) return b;
    if (b == DType::Bool) return a;
    if (is_float(a) && is_float(b)) {
        if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
        return DType::Float32;   // float16 with bfloat16, or either with float32
    }
    if (is_float(a) || is_float(b)) {
        const DType f = is_float(a) ? a : b, i = is_float(a) ? b : a;
        if (f == DType::Float64 || f == DType::Float32) return f;
        return bits(i) == 8 ? f : DType::Float32;   // a 16-bit float holds the 8-bit integers exactly
    }
    // Two integers.
    if (is_unsigned(a) == is_unsigned(b)) return bits(a) >= bits(b) ? a : b;
    const DType s = is_unsigned(a) ? b : a, u = is_unsigned(a) ? a : b;
    if (u == DType::UInt64) return DType::Float64;
    return bits(s) > bits(u) ? s : signed_of_bits(2 * bits(u));
}

bool parse_dtype(std::string_view n, DType& out) {
    struct { std::string_view name; DType t; } table[] = {
        {"float32", DType::Float32}, {"f32", DType::Float32}, {"float", DType::Float32},
        {"float16", DType::Float16}, {"f16", DType::Float16}, {"half", DType::Float16},
        {"bfloat16", DType::BFloat16}, {"bf16", DType::BFloat16},
        {"float64", DType::Float64}, {"f64", DType::Float64}, {"double", DType::Float64},
        {"int64", DType::Int64}, {"i64", DType::Int64}, {"int32", DType::Int32}, {"i32", DType::Int32},
        {"int16", DType::Int16}, {"i16", DType::Int16}, {"int8", DType::Int8}, {"i8", DType::Int8},
        {"uint64", DType::UInt64}, {"u64", DType::UInt64}, {"uint32", DType::UInt32}, {"u32", DType::UInt32}, {"uint16", DType::UInt16}, {"u16", DType::UInt16},
        {"uint8", DType::UInt8}, {"u8", DType::UInt8}, {"bool", DType::Bool},
    };
    for (auto& e : table)
        if (e.name == n) { out = e.t; return true; }
    return false;
}

} // namespace kiln
