// The compute types kernels do arithmetic in: float32 for float32 and the 16-bit floats, float64
// for float64, int32 for bool and the integers of up to 32 signed bits, int64 for int64, uint32
// and uint64 (its bits; the dtypes themselves are public: kiln/dtype.hpp). The numbers are part of recorded
// kernel texts: new types are appended.
#pragma once
#include <kiln/dtype.hpp>

namespace kiln {

enum class ComputeType : uint8_t { F32, I32, F64, I64 };
inline constexpr int kNumComputeTypes = 4;

constexpr ComputeType compute_type(DType t) {
    if (t == DType::Float64) return ComputeType::F64;
    if (t == DType::Int64 || t == DType::UInt32 || t == DType::UInt64) return ComputeType::I64;
    return is_float(t) ? ComputeType::F32 : ComputeType::I32;
}
constexpr bool is_float(ComputeType t) { return t == ComputeType::F32 || t == ComputeType::F64; }
constexpr bool is_wide(ComputeType t) { return t == ComputeType::F64 || t == ComputeType::I64; }
// The float compute type of the same width (F32 for I32, F64 for I64) and the integer one.
constexpr ComputeType float_of(ComputeType t) { return is_wide(t) ? ComputeType::F64 : ComputeType::F32; }
constexpr ComputeType int_of(ComputeType t) { return is_wide(t) ? ComputeType::I64 : ComputeType::I32; }
constexpr const char* compute_type_name(ComputeType t) {
    switch (t) {
    case ComputeType::F32: return "f32";
    case ComputeType::I32: return "i32";
    case ComputeType::F64: return "f64";
    case ComputeType::I64: return "i64";
    }
    return "?";
}

} // namespace kiln
