#include "ir/dtype.hpp"

namespace kiln {

DType promote(DType a, DType b) {
    if (a == b) return a;
    if (a == DType::Bool) return b;
    if (b == DType::Bool) return a;
    if (is_float(a) || is_float(b)) {
        if (!is_float(a)) return (b == DType::Float32 || a == DType::Int8 || a == DType::UInt8) ? b : DType::Float32;
        if (!is_float(b)) return (a == DType::Float32 || b == DType::Int8 || b == DType::UInt8) ? a : DType::Float32;
        return DType::Float32;  // f16+bf16, or either with f32
    }
    // both integers, different
    if (a == DType::Int32 || b == DType::Int32) return DType::Int32;
    return DType::Int32;  // int8 with uint8: NumPy gives int16
}

bool parse_dtype(std::string_view n, DType& out) {
    struct { std::string_view name; DType t; } table[] = {
        {"float32", DType::Float32}, {"f32", DType::Float32}, {"float", DType::Float32},
        {"float16", DType::Float16}, {"f16", DType::Float16}, {"half", DType::Float16},
        {"bfloat16", DType::BFloat16}, {"bf16", DType::BFloat16},
        {"int32", DType::Int32}, {"i32", DType::Int32}, {"int8", DType::Int8}, {"i8", DType::Int8},
        {"uint8", DType::UInt8}, {"u8", DType::UInt8}, {"bool", DType::Bool},
    };
    for (auto& e : table)
        if (e.name == n) { out = e.t; return true; }
    return false;
}

} // namespace kiln
