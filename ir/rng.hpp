// kiln's random numbers: Philox-2x32 with 10 rounds (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3"), counter = (element's linear index, draw counter), key = seed. Every
// backend computes exactly these integer operations, so CPU and GPU draw the same stream.
#pragma once
#include <cstdint>

namespace kiln {

inline constexpr uint32_t kPhiloxM = 0xD256D193u;
inline constexpr uint32_t kPhiloxW = 0x9E3779B9u;
inline constexpr int kPhiloxRounds = 10;

inline uint32_t philox2x32(uint32_t seed, uint32_t counter, uint32_t linear) {
    uint32_t x0 = linear, x1 = counter, key = seed;
    for (int r = 0; r < kPhiloxRounds; ++r) {
        uint64_t p = (uint64_t)kPhiloxM * x0;
        uint32_t hi = (uint32_t)(p >> 32), lo = (uint32_t)p;
        x0 = hi ^ key ^ x1;
        x1 = lo;
        key += kPhiloxW;
    }
    return x0;
}

// Uniform in [0, 1): the top 24 bits, exactly representable in float32.
inline float philox_uniform(uint32_t seed, uint32_t counter, uint32_t linear) {
    return (float)(philox2x32(seed, counter, linear) >> 8) * (1.0f / 16777216.0f);
}

} // namespace kiln
