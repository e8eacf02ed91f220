#include "runtime/host_convert.hpp"

#include "ir/half.hpp"

#include <cmath>
#include <cstring>

namespace kiln {

double load_element(DType t, const void* p) {
    switch (t) {
    case DType::Float32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::Float16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_float(h); }
    case DType::BFloat16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_float(h); }
    case DType::Int32: { int32_t i; std::memcpy(&i, p, 4); return i; }
    case DType::Int8: return *static_cast<const int8_t*>(p);
    case DType::UInt8: return *static_cast<const uint8_t*>(p);
    case DType::Bool: return *static_cast<const uint8_t*>(p) != 0;
    case DType::Float64: { double d; std::memcpy(&d, p, 8); return d; }
    case DType::Int64: { int64_t i; std::memcpy(&i, p, 8); return (double)i; }
    case DType::Int16: { int16_t i; std::memcpy(&i, p, 2); return i; }
    case DType::UInt16: { uint16_t i; std::memcpy(&i, p, 2); return i; }
    case DType::UInt32: { uint32_t i; std::memcpy(&i, p, 4); return i; }
    case DType::UInt64: { uint64_t i; std::memcpy(&i, p, 8); return (double)i; }
    }
    return 0;
}

void store_element(DType t, void* p, double v) {
    auto to_i32 = [](double x) -> int32_t {
        if (std::isnan(x)) return 0;
        x = std::trunc(x);
        if (x <= -2147483648.0) return INT32_MIN;
        if (x >= 2147483647.0) return INT32_MAX;
        return (int32_t)x;
    };
    switch (t) {
    case DType::Float32: { float f = (float)v; std::memcpy(p, &f, 4); return; }
    case DType::Float16: { uint16_t h = float_to_f16((float)v); std::memcpy(p, &h, 2); return; }
    case DType::BFloat16: { uint16_t h = float_to_bf16((float)v); std::memcpy(p, &h, 2); return; }
    case DType::Int32: { int32_t i = to_i32(v); std::memcpy(p, &i, 4); return; }
    case DType::Int8: *static_cast<int8_t*>(p) = (int8_t)(uint8_t)(to_i32(v) & 0xff); return;
    case DType::UInt8: *static_cast<uint8_t*>(p) = (uint8_t)(to_i32(v) & 0xff); return;
    case DType::Bool: *static_cast<uint8_t*>(p) = v != 0 ? 1 : 0; return;
    case DType::Float64: std::memcpy(p, &v, 8); return;
    case DType::Int64: {
        const double x = std::isnan(v) ? 0 : std::trunc(v);
        const int64_t i = x <= -9223372036854775808.0 ? INT64_MIN : x >= 9223372036854775807.0 ? INT64_MAX : (int64_t)x;
        std::memcpy(p, &i, 8);
        return;
    }
    case DType::Int16: { const int16_t i = (int16_t)(uint16_t)(to_i32(v) & 0xffff); std::memcpy(p, &i, 2); return; }
    case DType::UInt16: { const uint16_t i = (uint16_t)(to_i32(v) & 0xffff); std::memcpy(p, &i, 2); return; }
    case DType::UInt32: {
        const double x = std::isnan(v) ? 0 : std::trunc(v);
        const int64_t i = x <= -9223372036854775808.0 ? INT64_MIN : x >= 9223372036854775807.0 ? INT64_MAX : (int64_t)x;
        const uint32_t u = (uint32_t)(uint64_t)i;
        std::memcpy(p, &u, 4);
        return;
    }
    case DType::UInt64: {   // as the kernels convert: through int64 below 2^63, saturating at 2^64
        const double x = std::isnan(v) ? 0 : std::trunc(v);
        uint64_t u;
        if (x >= 18446744073709551615.0) u = UINT64_MAX;
        else if (x >= 9223372036854775808.0) u = (uint64_t)(x - 9223372036854775808.0) + (1ull << 63);
        else u = (uint64_t)(x <= -9223372036854775808.0 ? INT64_MIN : (int64_t)x);
        std::memcpy(p, &u, 8);
        return;
    }
    }
}

} // namespace kiln
