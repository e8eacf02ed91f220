// Storage dtypes and NumPy-style promotion. Arithmetic happens in float32 for float32 and the
// 16-bit floats (which are a storage format), in float64 for float64, in int32 for bool and the
// integers of up to 32 signed bits, and in int64 for int64, uint32 and uint64 (uint64 as its
// bits: the lowering gives it unsigned comparison, division, shifts and conversions).
#pragma once
#include <kiln/export.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

// The numbers are part of recorded kernel texts (compiler/kernel_text.hpp): new dtypes are appended.
enum class DType : uint8_t {
    Float32, Float16, BFloat16, Int32, Int8, UInt8, Bool, Float64, Int64, Int16, UInt16, UInt32, UInt64
};
inline constexpr int kNumDTypes = 13;

constexpr std::string_view dtype_name(DType t) {
    switch (t) {
    case DType::Float32: return "float32";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int32: return "int32";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::Bool: return "bool";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Int16: return "int16";
    case DType::UInt16: return "uint16";
    case DType::UInt32: return "uint32";
    case DType::UInt64: return "uint64";
    }
    return "?";
}

constexpr size_t dtype_size(DType t) {
    switch (t) {
    case DType::Float64: case DType::Int64: case DType::UInt64: return 8;
    case DType::Float32: case DType::Int32: case DType::UInt32: return 4;
    case DType::Float16: case DType::BFloat16: case DType::Int16: case DType::UInt16: return 2;
    default: return 1;
    }
}

constexpr bool is_float(DType t) {
    return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16 || t == DType::Float64;
}
constexpr bool is_integer(DType t) { return !is_float(t) && t != DType::Bool; }
constexpr bool is_unsigned(DType t) {
    return t == DType::UInt8 || t == DType::UInt16 || t == DType::UInt32 || t == DType::UInt64;
}
// Whether values of dtype `t` are 64 bits wide in a kernel (float64, int64, uint32, uint64).
constexpr bool is_wide(DType t) {
    return t == DType::Float64 || t == DType::Int64 || t == DType::UInt32 || t == DType::UInt64;
}

// NumPy's promotion table restricted to kiln's dtypes: integers of one signedness give the wider,
// a signed and an unsigned integer the smallest signed integer that holds both (int64 for int64
// with uint32; float64 for uint64 with a signed integer, which no integer dtype holds), floats the wider (float16 with bfloat16: float32). An integer with a float gives
// the float where that holds every value of the integer as NumPy would (float64; float32 with
// integers of up to 16 bits; float16 and bfloat16 with 8-bit ones), else float32 for 32-bit and
// 16-bit floats (NumPy would give float64: kiln keeps float32 arithmetic float32, as PyTorch does).
KILN_API DType promote(DType a, DType b);

// Parses the dtype names above and "f64", "double", "i64", "i16", "u16", "u32", "u64", "f32", "float",
// "f16", "half", "bf16", "i32", "i8", "u8". Returns false for anything else.
KILN_API bool parse_dtype(std::string_view name, DType& out);

} // namespace kiln
