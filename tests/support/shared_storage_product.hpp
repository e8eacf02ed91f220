// compound_dot with C and bsum in one float32 buffer with A, B and the bias, beside the same
// product on separate tensors. The kernels write C and bsum while other blocks still read the
// inputs, so the library must route such outputs through fresh ones (kernels/gemm.cpp); a test
// compares the two results with its backend's tolerance and checks the inputs are unchanged.
#pragma once
#include <kiln/kiln.hpp>

#include <vector>

namespace kiln::test {

struct SharedStorageProduct {
    std::vector<float> c, c_separate, bsum, bsum_separate;
    bool inputs_unchanged = false;
};

// Rows of 1 + K + N floats hold bsum's column, A's row and C's row; B and the bias take rows of
// their own below. `values` fills the buffer: (M + K + 1) * (1 + K + N) floats.
inline SharedStorageProduct shared_storage_product(Context& ctx, int64_t M, int64_t K, int64_t N,
                                                   const std::vector<float>& values) {
    const int64_t W = 1 + K + N;
    Tensor buf = ctx.array(values, {M + K + 1, W}, DType::Float32);
    Tensor bsum = buf.slice({Slice::range(0, M), Slice::at(0)});
    Tensor A = buf.slice({Slice::range(0, M), Slice::range(1, 1 + K)});
    Tensor C = buf.slice({Slice::range(0, M), Slice::range(1 + K, W)});
    Tensor B = buf.slice({Slice::range(M, M + K), Slice::range(0, N)});
    Tensor bias = buf.slice({Slice::at(M + K), Slice::range(0, N)});
    Tensor A2 = ctx.empty({M, K}, DType::Float32), B2 = ctx.empty({K, N}, DType::Float32);
    Tensor C2 = ctx.empty({M, N}, DType::Float32), bias2 = ctx.empty({N}, DType::Float32);
    Tensor bsum2 = ctx.empty({M}, DType::Float32);
    A2.assign(A.expr());
    B2.assign(B.expr());
    C2.assign(C.expr());
    bias2.assign(bias.expr());
    DotOptions o, o2;
    o.beta = o2.beta = 0.5;
    o.relu = o2.relu = true;
    o.bias = bias;
    o.bsum = bsum;
    o2.bias = bias2;
    o2.bsum = bsum2;
    compound_dot(A, B, C, o);
    compound_dot(A2, B2, C2, o2);
    SharedStorageProduct r;
    r.c = C.to_vector<float>();
    r.c_separate = C2.to_vector<float>();
    r.bsum = bsum.to_vector<float>();
    r.bsum_separate = bsum2.to_vector<float>();
    r.inputs_unchanged = A.to_vector<float>() == A2.to_vector<float>() && B.to_vector<float>() == B2.to_vector<float>() &&
                         bias.to_vector<float>() == bias2.to_vector<float>();
    return r;
}

} // namespace kiln::test
