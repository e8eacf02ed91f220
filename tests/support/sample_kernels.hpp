// Real kernels, lowered from expressions that cover every kind of kernel kiln writes (row,
// column and full reductions, arg reductions, several passes, integer and bool arithmetic, the
// RNG, gathers): the valid inputs that the kernel-text and manifest tests start from.
#pragma once
#include "compiler/pipeline.hpp"
#include "ir/node.hpp"
#include "tests/support/views.hpp"

#include <set>
#include <vector>

namespace kiln::test {

// The sum of every float function of kiln/math_functions.def, each applied to `a`.
inline Expr math_functions_of(const Expr& a) {
    Expr sum = 0.0f * a;
#define KILN_MATH(K, name, c_function, host) sum = sum + kiln::name(a);
#define KILN_MATH2(K, name, c_function, host) sum = sum + kiln::name(a, 0.75f);
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
    return sum;
}

inline std::vector<kir::Kernel> sample_kernels(const std::string& target = "sm_90") {
    const Expr A = leaf(host_view({64, 32}));
    const Expr I = leaf(host_view({64, 32}, DType::Int8));
    const Expr H = leaf(host_view({64, 32}, DType::Float16));
    const Expr idx = leaf(host_view({5}, DType::Int32));
    const std::vector<std::pair<Expr, View>> work = {
        {mean(square(A - mean(A, 1)), 1), host_view({64, 1})},
        {reciprocal(sqrt(var(A, 1) + 0.001)) * (A - mean(A, 1)), host_view({64, 32})},
        {tanh(A * 0.5 + 1.0) * sig(A), host_view({64, 32})},
        {sum(A * A), host_view({1, 1})},
        {sum(A, 0), host_view({1, 32})},
        {var(H, 0) + mean(H, 0), host_view({1, 32})},   // a column's moments, folded
        {argmax(A, 1), host_view({64, 1}, DType::Int32)},
        {argmin(H, 0), host_view({1, 32}, DType::Int32)},
        {max(I, 1) + min(I, 1), host_view({64, 1}, DType::Int8)},
        {prod(A, 1) + cast(prod(I, 0), DType::Float32), host_view({64, 32})},
        {where(A > 0.0, I * 3, -I), host_view({64, 32}, DType::Int8)},
        {rand({64, 32}) * H + rint(A), host_view({64, 32}, DType::Float16)},
        {take(A, idx, 0), host_view({5, 32})},
        {finite(log(A)) != (A <= exp2(A)), host_view({64, 32}, DType::Bool)},
        {cast(clip(A, -1.0, 1.0) * 100.0, DType::Int32), host_view({64, 32}, DType::Int32)},
        {math_functions_of(A), host_view({64, 32})},
    };
    std::vector<kir::Kernel> out;
    std::set<std::string> keys;
    for (const auto& [e, dst] : work)
        for (auto& stage : compile_assignment(e.node(), dst, target).stages)
            if (keys.insert(stage.key).second) out.push_back(stage.kernel);
    return out;
}

} // namespace kiln::test
