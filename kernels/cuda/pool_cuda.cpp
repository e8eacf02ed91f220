// Launches pool.cu's kernels (pool_cuda.hpp): whether they take the layer, the parameter block,
// the vector width and the grid; pooling's and LRN's.
#include "kernels/cuda/pool_cuda.hpp"

#include "compiler/env.hpp"
#include "compiler/log.hpp"
#include "ir/storage.hpp"
#include "kernels/cuda/gemm_launch.hpp"
#include "kernels/cuda/pool_params.hpp"
#include "runtime/cuda/device_backend.hpp"
#include <kiln/context.hpp>

#include <algorithm>
#include <optional>
#include <string>

extern "C" const unsigned char kiln_pool_image[];

namespace kiln::gemm {

namespace {

using detail::contiguous;
using detail::fits_32_bits;

// The kernels' geometry, or nothing where a size or index they form in 32 bits could pass 2^31.
std::optional<PoolShape> shape_of(const PoolLayer& L) {
    const int64_t in_pos = L.N * L.image[0] * L.image[1] * L.image[2], out_pos = L.N * L.output[0] * L.output[1] * L.output[2];
    // (backward rounds image + pad up to a multiple of the stride: image + pad + stride stays below too)
    if (!fits_32_bits(in_pos) || !fits_32_bits(out_pos) || !fits_32_bits(L.C + 2 * L.pad_c + L.str_c) ||
        !fits_32_bits(L.K * L.str_c + L.J) || !fits_32_bits(L.taps()))
        return std::nullopt;
    for (int a = 0; a < 3; ++a)
        if (!fits_32_bits(L.image[a] + 2 * L.pad[a] + L.stride[a]) || !fits_32_bits(L.output[a] * L.stride[a] + L.window[a]))
            return std::nullopt;
    auto i32 = [](int64_t v) { return int32_t(v); };
    return PoolShape{i32(L.N),         i32(L.image[0]),  i32(L.image[1]),  i32(L.image[2]),  i32(L.C),
                     i32(L.output[0]), i32(L.output[1]), i32(L.output[2]), i32(L.K),         i32(L.J),
                     i32(L.window[0]), i32(L.window[1]), i32(L.window[2]), i32(L.pad_c),     i32(L.pad[0]),
                     i32(L.pad[1]),    i32(L.pad[2]),    i32(L.str_c),     i32(L.stride[0]), i32(L.stride[1]),
                     i32(L.stride[2])};
}

// The forward stages its taps in shared memory (cp.async: many in flight without holding
// registers) for 16-bit vectors of channels in windows overlapping along some axis, where the
// register path waits on taps reread through L1. float32 vectors and windows sharing no taps run
// no faster staged, and keep registers.
bool staged_taps(const PoolLayer& L, DType t, int v) {
    const bool overlap = L.window[0] > L.stride[0] || L.window[1] > L.stride[1] || L.window[2] > L.stride[2];
    return v == 8 && dtype_size(t) == 2 && overlap;
}

const char* op_name(PoolOp op) { return op == PoolOp::Max ? "max" : op == PoolOp::Avg ? "avg" : "l2"; }
const char* type_name(DType t) { return t == DType::Float32 ? "f32" : t == DType::Float16 ? "f16" : "bf16"; }

// 16 bytes of channels a thread where a window holds one channel and every tensor's channels
// are whole, aligned 16-byte vectors; else one. (16-bit max pooling keeps a vector's winning taps
// in 16 bits: windows of 2^16 taps or more take one channel a thread.)
int vector_width(const PoolLayer& L, DType t, std::initializer_list<const Tensor*> tensors) {
    const int v = int(16 / dtype_size(t));
    if (L.J != 1 || L.str_c != 1 || L.pad_c != 0 || L.C % v != 0 || (L.op == PoolOp::Max && L.taps() >= 65536)) return 1;
    for (const Tensor* x : tensors)
        if (x && reinterpret_cast<uintptr_t>(detail::data_of(*x)) % 16 != 0) return 1;
    return v;
}

// KILN_POOL_KERNEL, for A/B runs: 0 "general" (the backward's general gather for every layer,
// neither the tiled nor the planar form); unset: kiln's choice. Read at each call.
std::optional<int> pool_kernel_choice() { return env::choice("KILN_POOL_KERNEL", {"general"}); }

// The backward's planar gather (pool.cu's pool_bprop_max_planar): max pooling over 16-bit
// vectors of channels, one depth a window (M == D), at most 2 windows covering two neighbouring
// inputs along the height and the width (a window shorter than twice its stride), a row of the
// output's windows within 32-bit offsets.
bool planar_bprop(const PoolLayer& L, DType t, int v) {
    return v == 8 && dtype_size(t) == 2 && L.op == PoolOp::Max && pool_kernel_choice() != 0 && L.window[0] == 1 &&
           L.stride[0] == 1 && L.pad[0] == 0 && L.window[1] < 2 * L.stride[1] && L.window[2] < 2 * L.stride[2] &&
           fits_32_bits((L.output[2] + 1) * L.K);
}

// The backward's tiled form (pool.cu's pool_bprop_tiled): max or average pooling over vectors of
// channels whose windows tile the input, window = stride and no padding along the depth, height
// and width, each a whole number of strides, so that every input lies in exactly one window.
bool tiled_bprop(const PoolLayer& L, int v) {
    if (v == 1 || (L.op != PoolOp::Max && L.op != PoolOp::Avg) || pool_kernel_choice() == 0) return false;
    for (int a = 0; a < 3; ++a)
        if (L.pad[a] != 0 || L.window[a] != L.stride[a] || L.output[a] * L.stride[a] != L.image[a]) return false;
    return true;
}

// A thread per output window (n, m, p, q) and v channels: the forward's items, and the tiled
// backward's.
void per_window(const PoolLayer& L, int v, PoolParams& p) {
    p.items = L.N * L.output[0] * L.output[1] * L.output[2] * (L.K / v);
    p.lanes = fast_div(uint32_t(L.K / v));
    p.d3 = fast_div(uint32_t(L.output[2])), p.d2 = fast_div(uint32_t(L.output[1])), p.d1 = fast_div(uint32_t(L.output[0]));
}

// Every tensor a kernel would read holds data (null entries skipped); otherwise the kernels
// decline and the expression path reports the tensor that was never written.
bool all_written(std::initializer_list<const Tensor*> reads) {
    for (const Tensor* t : reads)
        if (t && !t->view().storage->written) return false;
    return true;
}

// No written tensor shares memory with a tensor the kernel reads, nor with another written one
// (null entries skipped): the kernels read neighbours that other threads write, so aliased
// operands take the expression path, whose plans order such reads before the writes.
bool apart(std::initializer_list<const Tensor*> writes, std::initializer_list<const Tensor*> reads) {
    for (const Tensor* w : writes) {
        if (!w) continue;
        for (const Tensor* r : reads)
            if (r && r->view().storage == w->view().storage) return false;
        for (const Tensor* o : writes)
            if (o && o != w && o->view().storage == w->view().storage) return false;
    }
    return true;
}

thread_local bool last_counted = false;
thread_local std::string last_entry;

// The kernels round to nearest: where the context rounds 16-bit stores stochastically they
// decline a 16-bit output, and the expression path rounds it as every other store (max
// pooling's plain forward copies its inputs' values, which no rounding changes).
bool rounds_stochastically(const Tensor& out) {
    return out.context().stochastic_round() > 0 && out.dtype() != DType::Float32;
}

// With `count`, the entry's counting twin (pool.cu's KILN_ENTRY) counts what it stores into it,
// each block into its dynamic shared memory first.
template <class Params>
void launch(Context& ctx, std::string entry, Params& p, const PoolLayer& L, const StoreCount* count) {
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    const int smem = count ? 4 * count->bins : 0;
    last_counted = count != nullptr;
    last_entry = entry;
    if (count) {
        p.hist = PoolHist{static_cast<uint32_t*>(count->counters), int32_t(count->bins), int32_t(count->offset)};
        entry += "_counted";
    }
    CUfunction f = be.precompiled(kiln_pool_image, entry, smem);
    const int64_t blocks = be.stride_grid(f, (p.items + kPoolThreads - 1) / kPoolThreads, kPoolThreads);
    log_debug("pool: {} -> {} ({} items, {} blocks{})", L.str(), entry, p.items, blocks, count ? ", counted" : "");
    void* params[] = {&p};
    be.launch_precompiled(f, unsigned(blocks), 1, 1, kPoolThreads, unsigned(smem), params, {});
}

// LRN's parameters for layer L over tensors of dtype t, or nothing where the kernels decline.
std::optional<LrnParams> lrn_params(const PoolLayer& L, DType t, std::initializer_list<const Tensor*> tensors,
                                    std::initializer_list<const Tensor*> outputs, double alpha, double beta, double ascale,
                                    double bpower) {
    const int v = int(16 / dtype_size(t));
    const int64_t positions = L.N * L.image[0] * L.image[1] * L.image[2];
    // lrn_layer's windows: J (odd) channels centred on each channel, nothing across positions.
    const bool centred = L.op == PoolOp::Lrn && L.J % 2 == 1 && L.pad_c == L.J / 2 && L.str_c == 1 && L.K == L.C &&
                         L.window == Dims3{1, 1, 1} && L.pad == Dims3{0, 0, 0} && L.stride == Dims3{1, 1, 1} &&
                         L.output == L.image;
    if (!centred || L.C % v != 0 || L.J / 2 < 1 || L.J / 2 > 4 || !fits_32_bits(positions) || !fits_32_bits(L.C)) return std::nullopt;
    for (const Tensor* x : tensors)
        if (x->dtype() != t || reinterpret_cast<uintptr_t>(detail::data_of(*x)) % 16 != 0) return std::nullopt;
    for (const Tensor* x : outputs)
        if (!x->is_contiguous()) return std::nullopt;
    LrnParams p{};
    p.alpha = float(alpha), p.beta = float(beta), p.ascale = float(ascale), p.bpower = float(bpower);
    p.scale2 = float(2.0 * ascale * bpower);
    p.C = int32_t(L.C);
    p.items = positions * (L.C / v);
    p.lanes = fast_div(uint32_t(L.C / v));
    return p;
}

} // namespace

bool last_pool_counted() { return last_counted; }

const std::string& last_pool_entry() { return last_entry; }

bool pool_fprop_cuda(const PoolLayer& L, const Tensor& I5, Tensor& O5, Tensor* A5, double alpha, double beta,
                     const StoreCount* count) {
    Context& ctx = I5.context();
    if (ctx.backend() != Backend::CUDA || L.op == PoolOp::Lrn || I5.dtype() != O5.dtype() || !O5.is_contiguous() ||
        (A5 && !A5->is_contiguous()) || !all_written({&I5, beta != 0 ? &O5 : nullptr}) || !apart({&O5, A5}, {&I5}) ||
        (rounds_stochastically(O5) && !(L.op == PoolOp::Max && alpha == 1 && beta == 0)))
        return false;
    const std::optional<PoolShape> g = shape_of(L);
    if (!g) return false;
    const Tensor I = contiguous(I5);
    const int v = vector_width(L, I.dtype(), {&I, &O5, A5});
    PoolParams p{};
    p.x = detail::data_of(I);
    p.y = detail::data_of(O5);
    p.argmax = A5 ? reinterpret_cast<int32_t*>(detail::data_of(*A5)) : nullptr;
    p.alpha = float(alpha), p.beta = float(beta);
    p.g = *g;
    per_window(L, v, p);
    if (p.items > 0)
        launch(ctx,
               fmt::format("kiln_pool_fprop_{}_{}_v{}{}", op_name(L.op), type_name(I.dtype()), v,
                           staged_taps(L, I.dtype(), v) ? "_staged" : ""),
               p, L, count);
    O5.view().storage->written = true;
    if (A5) A5->view().storage->written = true;
    return true;
}

bool pool_bprop_cuda(const PoolLayer& L, const Tensor& E5, Tensor& G5, const Tensor* A5, const Tensor* X5, const Tensor* Y5,
                     double alpha, double beta, const StoreCount* count) {
    Context& ctx = E5.context();
    if (ctx.backend() != Backend::CUDA || L.op == PoolOp::Lrn || !G5.is_contiguous() ||
        !all_written({&E5, A5, X5, Y5, beta != 0 ? &G5 : nullptr}) || !apart({&G5}, {&E5, A5, X5, Y5}) ||
        rounds_stochastically(G5))
        return false;
    for (const Tensor* t : {&E5, X5, Y5})
        if (t && t->dtype() != G5.dtype()) return false;
    const std::optional<PoolShape> g = shape_of(L);
    if (!g) return false;
    const Tensor E = contiguous(E5);
    std::optional<Tensor> A, X, Y;
    if (A5) A = contiguous(*A5);
    if (X5) X = contiguous(*X5);
    if (Y5) Y = contiguous(*Y5);
    const int v = vector_width(L, G5.dtype(), {&E, &G5, A ? &*A : nullptr, X ? &*X : nullptr, Y ? &*Y : nullptr});
    PoolParams p{};
    p.x = detail::data_of(E);
    p.y = detail::data_of(G5);
    p.argmax = A ? reinterpret_cast<int32_t*>(detail::data_of(*A)) : nullptr;
    p.x2 = X ? detail::data_of(*X) : nullptr;
    p.y2 = Y ? detail::data_of(*Y) : nullptr;
    p.alpha = float(alpha), p.beta = float(beta);
    p.g = *g;
    const bool tiled = tiled_bprop(L, v);
    if (tiled) {
        per_window(L, v, p);
    } else {
        const int block = v > 1 ? kPoolBpropBlock : 1;   // a thread's input positions along the height and width
        const int64_t blocks_w = (L.image[2] + block - 1) / block, blocks_h = (L.image[1] + block - 1) / block;
        p.items = L.N * L.image[0] * blocks_h * blocks_w * (L.C / v);
        p.lanes = fast_div(uint32_t(L.C / v));
        p.d3 = fast_div(uint32_t(blocks_w)), p.d2 = fast_div(uint32_t(blocks_h)), p.d1 = fast_div(uint32_t(L.image[0]));
    }
    p.str_c = fast_div(uint32_t(L.str_c)), p.str_d = fast_div(uint32_t(L.stride[0]));
    p.str_h = fast_div(uint32_t(L.stride[1])), p.str_w = fast_div(uint32_t(L.stride[2]));
    if (p.items > 0)
        launch(ctx,
               fmt::format("kiln_pool_bprop_{}_{}_v{}{}", op_name(L.op), type_name(G5.dtype()), v,
                           tiled ? "_tiled" : planar_bprop(L, G5.dtype(), v) ? "_planar" : ""),
               p, L, count);
    G5.view().storage->written = true;
    return true;
}

bool lrn_fprop_cuda(const PoolLayer& L, const Tensor& I5, Tensor& O5, Tensor& D5, double alpha, double beta, double ascale,
                    double bpower, const StoreCount* count) {
    Context& ctx = I5.context();
    if (ctx.backend() != Backend::CUDA || !all_written({&I5, beta != 0 ? &O5 : nullptr}) || !apart({&O5, &D5}, {&I5}) ||
        rounds_stochastically(O5) || rounds_stochastically(D5))
        return false;
    const Tensor I = contiguous(I5);
    std::optional<LrnParams> p = lrn_params(L, I.dtype(), {&I, &O5, &D5}, {&O5, &D5}, alpha, beta, ascale, bpower);
    if (!p) return false;
    p->in = detail::data_of(I);
    p->denom = detail::data_of(D5);
    p->result = detail::data_of(O5);
    if (p->items > 0) launch(ctx, fmt::format("kiln_lrn_fprop_{}_h{}", type_name(I.dtype()), L.J / 2), *p, L, count);
    O5.view().storage->written = true;
    D5.view().storage->written = true;
    return true;
}

bool lrn_bprop_cuda(const PoolLayer& L, const Tensor& I5, const Tensor& O5, const Tensor& E5, Tensor& G5, const Tensor& D5,
                    double alpha, double beta, double ascale, double bpower, const StoreCount* count) {
    Context& ctx = I5.context();
    if (ctx.backend() != Backend::CUDA || !all_written({&I5, &O5, &E5, &D5, beta != 0 ? &G5 : nullptr}) ||
        !apart({&G5}, {&I5, &O5, &E5, &D5}) || rounds_stochastically(G5))
        return false;
    const Tensor I = contiguous(I5), O = contiguous(O5), E = contiguous(E5), D = contiguous(D5);
    std::optional<LrnParams> p = lrn_params(L, G5.dtype(), {&I, &O, &E, &D, &G5}, {&G5}, alpha, beta, ascale, bpower);
    if (!p) return false;
    p->in = detail::data_of(I);
    p->out = detail::data_of(O);
    p->err = detail::data_of(E);
    p->denom = detail::data_of(D);
    p->result = detail::data_of(G5);
    if (p->items > 0) launch(ctx, fmt::format("kiln_lrn_bprop_{}_h{}", type_name(G5.dtype()), L.J / 2), *p, L, count);
    G5.view().storage->written = true;
    return true;
}

} // namespace kiln::gemm
