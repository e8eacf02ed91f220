// Host-side random operands for the CPU tests against float64 references: uniform values, and a
// tensor holding them rounded to its dtype (the values replaced by what the tensor holds, so the
// reference sees exactly the operands the kernels read).
#pragma once
#include <kiln/kiln.hpp>

#include <cstdint>
#include <random>
#include <vector>

namespace kiln::test {

inline std::vector<double> random_values(size_t n, uint32_t seed, double lo = -1, double hi = 1) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> v(n);
    for (auto& x : v) x = u(g);
    return v;
}

inline Tensor make(Context& ctx, std::vector<double>& v, const Shape& shape, DType dt = DType::Float32) {
    std::vector<float> f(v.begin(), v.end());
    Tensor t = ctx.array(f, shape, dt);
    std::vector<float> back = t.to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = back[i];
    return t;
}

// A tensor of `shape` on ctx holding standard normal draws from g, rounded to dt.
inline Tensor random_normal(Context& ctx, std::mt19937& g, const Shape& shape, DType dt) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> h((size_t)numel(shape));
    for (float& x : h) x = nd(g);
    return ctx.array(h, shape, dt);
}

} // namespace kiln::test
