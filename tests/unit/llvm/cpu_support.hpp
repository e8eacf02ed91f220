// What the CPU backend's tests share besides the kernel builder (tests/support): launch
// arguments, one JIT, float helpers.
#pragma once
#include "compiler/kernel_ir.hpp"
#include "runtime/cpu/cpu_jit.hpp"
#include "tests/support/kernel_builder.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace kiln::test {

struct Launch {
    kir::LaunchArgs args;
    explicit Launch(std::vector<int64_t> sizes) { args.sizes = std::move(sizes); }
    Launch& buffer(const void* p, std::vector<int64_t> strides) {
        args.buffers.push_back(const_cast<void*>(p));
        args.strides.insert(args.strides.end(), strides.begin(), strides.end());
        return *this;
    }
    Launch& fparam(float v) {
        args.fparams.push_back(v);
        return *this;
    }
    Launch& iparam(int32_t v) {
        args.iparams.push_back(v);
        return *this;
    }
};

// One JIT for the tests that do not care about threads or counters (LLVM setup is not free).
inline cpu::CpuJit& shared_jit() {
    static cpu::CpuJit jit;
    return jit;
}

inline void run(cpu::CpuJit& jit, const kir::Kernel& k, const Launch& l) { jit.launch(jit.compile(k, k.name), l.args); }
inline void run(const kir::Kernel& k, const Launch& l) { run(shared_jit(), k, l); }

inline uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float float_of(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Same value, with NaN equal to NaN.
inline bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

inline bool near_rel(double got, double want, double rel) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want)) return got == want;
    return std::fabs(got - want) <= rel * std::max(1.0, std::fabs(want));
}

inline std::vector<float> random_floats(size_t n, float lo, float hi, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

} // namespace kiln::test
