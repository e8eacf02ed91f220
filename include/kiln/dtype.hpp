// Storage dtypes and NumPy-style promotion. Arithmetic happens in float32 for every floating
// dtype (16-bit floats are a storage format) and in int32 for the integer dtypes and bool.
#pragma once
#include <kiln/export.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

enum class DType : uint8_t { Float32, Float16, BFloat16, Int32, Int8, UInt8, Bool };
inline constexpr int kNumDTypes = 7;

constexpr std::string_view dtype_name(DType t) {
    switch (t) {
    case DType::Float32: return "float32";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int32: return "int32";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::Bool: return "bool";
    }
    return "?";
}

constexpr size_t dtype_size(DType t) {
    switch (t) {
    case DType::Float32: case DType::Int32: return 4;
    case DType::Float16: case DType::BFloat16: return 2;
    default: return 1;
    }
}

constexpr bool is_float(DType t) {
    return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16;
}
constexpr bool is_integer(DType t) { return t == DType::Int32 || t == DType::Int8 || t == DType::UInt8; }

// NumPy's promotion table restricted to kiln's dtypes; where NumPy would widen past them
// (int32 with a 16-bit float, float16 with bfloat16, int8 with uint8) kiln picks the smallest
// supported type that holds both: float32, float32, int32.
KILN_API DType promote(DType a, DType b);

// Parses "float32", "f32", "float16", "half", "bfloat16", "int32", "int8", "uint8", "bool".
// Returns false for anything else.
KILN_API bool parse_dtype(std::string_view name, DType& out);

} // namespace kiln
