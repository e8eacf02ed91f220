// Pooling from its definition in float64 (the CPU and GPU tests' reference): each output's
// window over the input's in-bounds taps, and the gradient each input element gathers.
#pragma once
#include <kiln/nn.hpp>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace kiln::test {

struct PoolReference {
    std::vector<double> out, grad;   // forward output; the input's gradient from e
    std::vector<int32_t> argmax;     // max: the first tap holding the window's maximum
};

// L's pooling of x (L.input_shape(), row-major) and its gradient from e (L.output_shape()).
// L2's gradient is taken through its own forward output.
inline PoolReference pool_reference(const PoolLayer& L, const std::vector<double>& x, const std::vector<double>& e) {
    const auto [D, H, W] = L.image;
    const auto [M, P, Q] = L.output;
    PoolReference ref{std::vector<double>(e.size()), std::vector<double>(x.size(), 0.0), std::vector<int32_t>(e.size())};
    std::vector<std::pair<int64_t, int64_t>> taps;   // (tap index, input offset) inside the input
    for (int64_t n = 0; n < L.N; ++n)
        for (int64_t m = 0; m < M; ++m)
            for (int64_t p = 0; p < P; ++p)
                for (int64_t q = 0; q < Q; ++q)
                    for (int64_t k = 0; k < L.K; ++k) {
                        taps.clear();
                        for (int64_t j = 0; j < L.J; ++j)
                            for (int64_t t = 0; t < L.window[0]; ++t)
                                for (int64_t r = 0; r < L.window[1]; ++r)
                                    for (int64_t s = 0; s < L.window[2]; ++s) {
                                        const int64_t d = m * L.stride[0] - L.pad[0] + t, h = p * L.stride[1] - L.pad[1] + r,
                                                      w = q * L.stride[2] - L.pad[2] + s, c = k * L.str_c - L.pad_c + j;
                                        if (d < 0 || d >= D || h < 0 || h >= H || w < 0 || w >= W || c < 0 || c >= L.C) continue;
                                        taps.push_back({((j * L.window[0] + t) * L.window[1] + r) * L.window[2] + s,
                                                        (((n * D + d) * H + h) * W + w) * L.C + c});
                                    }
                        const int64_t o = (((n * M + m) * P + p) * Q + q) * L.K + k;
                        double best = -INFINITY, sum = 0, sq = 0;
                        int32_t arg = 0;
                        for (auto [tap, at] : taps) {
                            if (x[at] > best) best = x[at], arg = (int32_t)tap;
                            sum += x[at];
                            sq += x[at] * x[at];
                        }
                        const double y = L.op == PoolOp::Max ? best : L.op == PoolOp::Avg ? sum / (double)taps.size() : std::sqrt(sq);
                        ref.out[o] = y;
                        ref.argmax[o] = arg;
                        for (auto [tap, at] : taps)
                            ref.grad[at] += L.op == PoolOp::Max ? (tap == arg ? e[o] : 0.0)
                                            : L.op == PoolOp::Avg ? e[o] / (double)taps.size() : e[o] * x[at] / y;
                    }
    return ref;
}

} // namespace kiln::test
