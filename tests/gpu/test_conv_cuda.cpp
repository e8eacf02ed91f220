// Convolution on a CUDA context (the implicit-GEMM kernels; the precompiled im2col and col2im
// kernels with kiln's GEMM kernels; the GEMM's or the JIT's epilogue) against the CPU path, which the unit tests hold to float64 loops:
// fprop, bprop and update in 1D, 2D and 3D with padding, stride and dilation, pointwise layers,
// a 3-channel first layer, every float dtype, the epilogue's pieces and deconvolution. Skips,
// saying why, without a CUDA device.
#include "tests/support/cache_dir.hpp"
#include "tests/support/catch.hpp"
#include "tests/support/gpu.hpp"
#include "tests/support/named_counts.hpp"
#include "tests/support/random_values.hpp"

#include <kiln/kiln.hpp>

#include "kernels/cuda/conv_cuda.hpp"
#include "kernels/cuda/conv_select.hpp"
#include "runtime/cuda/device_backend.hpp"

#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <vector>

using namespace kiln;

namespace {

struct Case {
    int64_t N, C, K;
    Dims3 image, filter, pad, stride, dilation;
};

const std::vector<Case>& cases() {
    static const std::vector<Case> c = {
        {2, 16, 32, {1, 12, 12}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}},
        {2, 64, 64, {1, 14, 14}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}},
        {2, 32, 48, {1, 14, 14}, {1, 1, 1}, {0, 0, 0}, {1, 2, 2}, {1, 1, 1}},    // 1x1, stride 2
        {2, 24, 40, {1, 7, 9}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}, {1, 1, 1}},      // pointwise: no im2col
        {1, 8, 16, {5, 6, 7}, {3, 3, 3}, {1, 1, 1}, {1, 2, 1}, {1, 1, 2}},       // 3D
        {2, 3, 16, {1, 31, 31}, {1, 7, 7}, {0, 3, 3}, {1, 2, 2}, {1, 1, 1}},     // a first layer
        {3, 8, 12, {1, 1, 50}, {1, 1, 5}, {0, 0, 2}, {1, 1, 3}, {1, 1, 2}},      // 1D, stride and dilation
        {2, 16, 8, {1, 11, 10}, {1, 5, 4}, {0, 4, 1}, {1, 3, 2}, {1, 2, 1}},     // overlapping windows, big pad
    };
    return c;
}

std::vector<float> random_floats(int64_t n, uint32_t seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    std::vector<float> v((size_t)n);
    for (auto& x : v) x = d(g);
    return v;
}

double ulp(DType dt) { return dt == DType::BFloat16 ? 0x1p-8 : dt == DType::Float16 ? 0x1p-11 : 0x1p-23; }

// GPU and CPU results agree to the output's rounding (one ulp each way) plus float32 summation
// in another order, a small fraction of the sum of |terms| (`mag`, from the CPU on |operands|).
int64_t count_off(const Tensor& gpu, const Tensor& cpu, const Tensor& mag, DType out, double rel = 1e-5) {
    const std::vector<float> g = gpu.to_vector<float>(), c = cpu.to_vector<float>(), m = mag.to_vector<float>();
    int64_t off = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        const double tol = 2 * ulp(out) * std::fabs(c[i]) + rel * m[i] + 1e-30;
        if (!(std::fabs((double)g[i] - c[i]) <= tol)) {
            if (off < 3) UNSCOPED_INFO("element " << i << ": gpu " << g[i] << ", cpu " << c[i] << ", tolerance " << tol);
            ++off;
        }
    }
    return off;
}

struct Pair {
    Tensor gpu, cpu, abs;   // the same values on both contexts, and |values| on the CPU
};
Pair pair(Context& gpu, Context& cpu, const Shape& s, DType dt, uint32_t seed) {
    const std::vector<float> v = random_floats(numel(s), seed);
    Tensor c = cpu.array(v, s, dt);
    return {gpu.array(c.to_vector<float>(), s, dt), c, cpu.eval(absolute(c.expr()))};
}

using Side = Tensor Pair::*;

// `op(out, side)` into an output of `shape` on the GPU (side &Pair::gpu), the CPU (&Pair::cpu)
// and the CPU over |operands| (&Pair::abs, float32: the magnitude); the GPU's results off the
// CPU's.
template <class Op>
int64_t agree(Context& gpu, Context& cpu, const Shape& shape, DType out, Op&& op) {
    Tensor g = gpu.empty(shape, out), c = cpu.empty(shape, out), m = cpu.empty(shape, DType::Float32);
    op(g, &Pair::gpu);
    op(c, &Pair::cpu);
    op(m, &Pair::abs);
    return count_off(g, c, m, out);
}

// The channels (of K) whose bsum `sums` is off the sum of O's values as stored, relative to the
// sum of their magnitudes.
int64_t sums_off(Context& ctx, const Tensor& O, const Tensor& sums, int64_t K) {
    const Expr as_rows = reshape(cast(O.expr(), DType::Float32), {numel(O.shape()) / K, K});
    const std::vector<float> got = sums.to_vector<float>(), want = ctx.eval(reshape(sum(as_rows, 0), {K})).to_vector<float>(),
                             scale = ctx.eval(reshape(sum(absolute(as_rows), 0), {K})).to_vector<float>();
    int64_t off = 0;
    for (int64_t k = 0; k < K; ++k)
        if (!(std::fabs(got[k] - want[k]) <= 1e-5f * scale[k] + 1e-6f)) ++off;
    return off;
}

// bprop of L on the GPU against the CPU: plain, and with alpha 0.5 and beta into an output
// first holding X.
void check_bprop_alpha_beta(Context& gpu, Context& cpu, const ConvLayer& L, uint32_t& seed) {
    const DType dt = L.dtype;
    const Pair F = pair(gpu, cpu, L.filter_shape(), dt, ++seed), E = pair(gpu, cpu, L.output_shape(), dt, ++seed),
               X = pair(gpu, cpu, L.input_shape(), dt, ++seed);
    CHECK(agree(gpu, cpu, L.input_shape(), dt, [&](Tensor& o, Side side) { bprop_conv(L, F.*side, E.*side, o); }) == 0);
    CHECK(agree(gpu, cpu, L.input_shape(), dt, [&](Tensor& o, Side side) {
              o.assign((X.*side).expr());
              ConvOptions ab;
              ab.alpha = 0.5, ab.beta = side == &Pair::abs ? 0.5 : -0.25;
              bprop_conv(L, F.*side, E.*side, o, ab);
          }) == 0);
}

// L's strided bprop on the forced walk (or, with `forced` null, kiln's choice), by phase (each
// phase more tiles than SMs, its rows landing in grad_I's strided view), plain and with alpha and
// beta, against the CPU; the path holds `walk` (the phases' walk, or the phased walk of all of
// them) and `width`.
void check_walked_phases(Context& gpu, Context& cpu, const ConvLayer& L, const char* width, uint32_t& seed,
                         const char* walk_name = "by phase kiln_conv_fprop_walk_", const char* forced = "walk") {
    INFO(L.str());
    const test::ScopedEnv walk("KILN_CONV_KERNEL", forced);
    const std::string path = conv_kernel(gpu, L, "bprop");
    INFO(path);
    CHECK(path.find(walk_name) != std::string::npos);
    CHECK(path.find(width) != std::string::npos);
    check_bprop_alpha_beta(gpu, cpu, L, seed);
}

// fprop of L (I into an output first holding X, B a bias) on the GPU against the CPU, into
// L's dtype and float32: plain; alpha, bias and ReLU (with bsum where `bsum`); beta, bias and
// leaky ReLU.
void check_fprop_epilogues(Context& gpu, Context& cpu, const ConvLayer& L, const Pair& I, const Pair& F, const Pair& X,
                           const Pair& B, bool bsum) {
    const DType dt = L.dtype;
    Tensor Om = cpu.empty(L.output_shape(), DType::Float32);
    fprop_conv(L, I.abs, F.abs, Om);
    const Tensor mag = cpu.eval(Om.expr() * 2.0 + absolute(X.cpu.expr()) + 1.0);
    for (DType out : {dt, DType::Float32})
        for (int variant = 0; variant < 3; ++variant) {
            INFO("output " << dtype_name(out) << ", variant " << variant);
            ConvOptions og, oc;
            og.alpha = oc.alpha = variant == 1 ? 0.75 : 1.0;
            og.beta = oc.beta = variant == 2 ? -0.5 : 0.0;
            og.relu = oc.relu = variant >= 1;
            og.slope = oc.slope = variant == 2 ? 0.25 : 0.0;
            if (variant >= 1) og.bias = B.gpu, oc.bias = B.cpu;
            const bool sums = bsum && variant == 1;
            Tensor bg = gpu.empty({L.K}, DType::Float32), bc = cpu.empty({L.K}, DType::Float32);
            if (sums) og.bsum = bg, oc.bsum = bc;
            Tensor Og = gpu.eval(cast(gpu.array(X.cpu.to_vector<float>(), L.output_shape(), dt).expr(), out));
            Tensor Oc = cpu.eval(cast(X.cpu.expr(), out));
            fprop_conv(L, I.gpu, F.gpu, Og, og);
            fprop_conv(L, I.cpu, F.cpu, Oc, oc);
            CHECK(count_off(Og, Oc, mag, out) == 0);
            if (sums) {   // (the sums add the outputs as stored, each off by up to its own scale)
                const Tensor bmag =
                    cpu.eval(reshape(sum(reshape(mag.expr(), {numel(L.output_shape()) / L.K, L.K}), 0), {L.K}));
                CHECK(count_off(bg, bc, bmag, DType::Float32, 2 * ulp(out) + 1e-5) == 0);
            }
        }
}

// fprop of L over I with an infinity in image 1's middle pixel, its last channel, on the GPU and
// the CPU: the outputs whose windows hold it are infinite or NaN on both, every other one finite
// and close, and they are some but under half of them.
void check_infinity_windows(Context& gpu, Context& cpu, const ConvLayer& L, const Pair& I, const Pair& F) {
    std::vector<float> iv = I.cpu.to_vector<float>();
    const int64_t hw = L.image[0] * L.image[1] * L.image[2];
    iv[size_t(((1 * hw) + hw / 2) * L.C + L.C - 1)] = INFINITY;
    const Tensor Ig = gpu.array(iv, L.input_shape(), L.dtype), Ic = cpu.array(iv, L.input_shape(), L.dtype);
    Tensor Og = gpu.empty(L.output_shape(), L.dtype), Oc = cpu.empty(L.output_shape(), L.dtype);
    fprop_conv(L, Ig, F.gpu, Og);
    fprop_conv(L, Ic, F.cpu, Oc);
    const std::vector<float> g = Og.to_vector<float>(), w = Oc.to_vector<float>();
    int64_t finite = 0, off = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        finite += std::isfinite(w[i]);
        if (std::isfinite(w[i]) != std::isfinite(g[i]) ||
            (std::isfinite(w[i]) && std::fabs(g[i] - w[i]) > 0.05 * (1 + std::fabs(w[i]))))
            ++off;
    }
    CHECK(finite < int64_t(g.size()));
    CHECK(finite > int64_t(g.size()) / 2);
    CHECK(off == 0);
}

// Whether gpu is an sm_90 GPU, which the implicit-GEMM kernels (sm_90a code) run on; else says
// the test skips.
bool sm90(Context& gpu) {
    const int sm = cuda::cuda_backend(gpu).info().sm;
    if (sm != 90) std::printf("SKIPPED (the implicit-GEMM kernels are sm_90a code; this GPU is sm_%d)\n", sm);
    return sm == 90;
}

// update of L (I and E into an output first holding G) on the GPU against the CPU, into L's
// dtype and float32: plain, and alpha 0.75 with beta -0.5.
void check_update_alpha_beta(Context& gpu, Context& cpu, const ConvLayer& L, const Pair& I, const Pair& E, const Pair& G) {
    Tensor Gm = cpu.empty(L.filter_shape(), DType::Float32);
    update_conv(L, I.abs, E.abs, Gm);
    const Tensor mag = cpu.eval(Gm.expr() * 0.75 + absolute(G.cpu.expr()) * 0.5 + 1.0);
    for (DType out : {L.dtype, DType::Float32})
        for (int variant = 0; variant < 2; ++variant) {
            INFO("update into " << dtype_name(out) << ", variant " << variant);
            const double alpha = variant ? 0.75 : 1.0, beta = variant ? -0.5 : 0.0;
            Tensor Gg = gpu.eval(cast(G.gpu.expr(), out)), Gc = cpu.eval(cast(G.cpu.expr(), out));
            update_conv(L, I.gpu, E.gpu, Gg, alpha, beta);
            update_conv(L, I.cpu, E.cpu, Gc, alpha, beta);
            CHECK(count_off(Gg, Gc, mag, out) == 0);
        }
}

// Whether the deconvolution of L's geometry has L's image size as its output (a stride that does
// not divide the window leaves a remainder).
bool round_trips(const ConvLayer& L) {
    for (int a = 0; a < 3; ++a)
        if ((L.output[a] - 1) * L.stride[a] - 2 * L.pad[a] + L.dilation[a] * (L.filter[a] - 1) + 1 != L.image[a]) return false;
    return true;
}

} // namespace

TEST_CASE("gpu conv: fprop, bprop and update match the CPU path; 1D, 2D, 3D; pad, stride, dilation; every dtype") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    uint32_t seed = 1;
    for (DType dt : {DType::Float16, DType::BFloat16, DType::Float32})
        for (const Case& c : cases()) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str());
            const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                       E = pair(gpu, cpu, L.output_shape(), dt, ++seed);
            CHECK(agree(gpu, cpu, L.output_shape(), dt,
                        [&](Tensor& o, Side side) { fprop_conv(L, I.*side, F.*side, o); }) == 0);

            CHECK(agree(gpu, cpu, L.input_shape(), DType::Float32,
                        [&](Tensor& o, Side side) { bprop_conv(L, F.*side, E.*side, o); }) == 0);

            CHECK(agree(gpu, cpu, L.filter_shape(), dt,
                        [&](Tensor& o, Side side) { update_conv(L, I.*side, E.*side, o); }) == 0);
        }
}

TEST_CASE("gpu conv: the fused epilogue (alpha, beta, bias, relu, slope, bsum), brelu with X, deconvolution") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    uint32_t seed = 500;
    for (DType dt : {DType::Float16, DType::Float32}) {
        const Case& c = cases()[0];
        const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
        INFO(L.str());
        const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                   E = pair(gpu, cpu, L.output_shape(), dt, ++seed), X = pair(gpu, cpu, L.output_shape(), dt, ++seed),
                   B = pair(gpu, cpu, {c.K}, DType::Float32, ++seed);
        Tensor Om = cpu.empty(L.output_shape(), DType::Float32);
        fprop_conv(L, I.abs, F.abs, Om);
        const Tensor mag = cpu.eval(Om.expr() * 2.0 + absolute(X.cpu.expr()) + 1.0);   // alpha, beta and the bias's share
        for (int variant = 0; variant < 4; ++variant) {
            INFO("variant " << variant);
            ConvOptions og, oc;
            og.alpha = oc.alpha = variant == 1 ? 1.5 : 1.0;
            og.beta = oc.beta = variant >= 2 ? 0.5 : 0.0;
            og.relu = oc.relu = variant != 3;
            og.slope = oc.slope = variant == 2 ? 0.1 : 0.0;
            og.brelu = oc.brelu = variant == 3;
            if (variant == 3) og.X = X.gpu, oc.X = X.cpu;
            og.bias = B.gpu, oc.bias = B.cpu;
            Tensor bg = gpu.empty({c.K}, DType::Float32), bc = cpu.empty({c.K}, DType::Float32);
            og.bsum = bg, oc.bsum = bc;
            Tensor Og = gpu.array(X.cpu.to_vector<float>(), L.output_shape(), dt), Oc = cpu.eval(X.cpu.expr());
            fprop_conv(L, I.gpu, F.gpu, Og, og);
            fprop_conv(L, I.cpu, F.cpu, Oc, oc);
            CHECK(count_off(Og, Oc, mag, dt) == 0);
            // The sums add the outputs as stored: each may differ from the CPU's by its rounding.
            const Tensor bmag = cpu.eval(reshape(sum(absolute(reshape(Oc.expr(), {numel(L.output_shape()) / c.K, c.K})), 0),
                                                 {c.K}));
            CHECK(count_off(bg, bc, bmag, DType::Float32, 2 * ulp(dt) + 1e-5) == 0);
        }

        // deconvolution: fprop is the convolution's bprop, bprop its fprop.
        const ConvLayer D = deconv_layer(dt, c.N, c.C, c.K, L.output, c.filter, c.pad, c.stride, c.dilation);
        CHECK(agree(gpu, cpu, D.output_shape(), dt,
                    [&](Tensor& o, Side side) { fprop_conv(D, E.*side, F.*side, o); }) == 0);
        CHECK(agree(gpu, cpu, D.input_shape(), dt,
                    [&](Tensor& o, Side side) { bprop_conv(D, F.*side, I.*side, o); }) == 0);
        CHECK(agree(gpu, cpu, D.filter_shape(), dt,
                    [&](Tensor& o, Side side) { update_conv(D, E.*side, I.*side, o); }) == 0);
    }
}

TEST_CASE("gpu conv: the implicit-GEMM kernel on sm_90: tails of rows, taps and K, every epilogue, float32 output, bprop (stride 1, and strided by phase)") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (!sm90(gpu)) return;
    // Each with whether TMA brings the patches (C a multiple of 64 and a window the im2col
    // descriptor of that rank holds) or the producer gathers them.
    const std::vector<std::pair<Case, bool>> shapes = {
        {{3, 24, 200, {1, 13, 11}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, false},    // taps 216, K 200: tails
        {{2, 64, 64, {1, 15, 15}, {1, 3, 3}, {0, 2, 2}, {1, 2, 2}, {1, 2, 2}}, true},      // stride and dilation
        {{1, 8, 40, {6, 7, 5}, {3, 3, 3}, {1, 1, 1}, {2, 1, 1}, {1, 1, 1}}, false},        // 3D, C = 8
        {{2, 128, 136, {1, 9, 9}, {1, 5, 5}, {0, 4, 0}, {1, 1, 3}, {1, 1, 1}}, true},      // big pad, K past 128
        {{4, 16, 100, {1, 1, 77}, {1, 1, 7}, {0, 0, 3}, {1, 1, 1}, {1, 1, 1}}, false},     // 1D
        {{3, 64, 72, {1, 10, 9}, {1, 3, 2}, {0, 1, 0}, {1, 2, 1}, {1, 1, 2}}, true},       // R != S, uneven strides
        {{2, 64, 40, {5, 6, 7}, {3, 2, 3}, {1, 0, 2}, {2, 1, 1}, {1, 1, 1}}, true},        // 3D (rank 5)
        {{3, 128, 64, {1, 1, 50}, {1, 1, 5}, {0, 0, 2}, {1, 1, 2}, {1, 1, 1}}, true},      // 1D (rank 3)
        {{1, 64, 64, {4, 4, 4}, {3, 3, 3}, {0, 0, 20}, {1, 1, 1}, {1, 1, 1}}, false},      // 3D pad past rank 5's corners
        {{2, 64, 64, {1, 1, 16}, {1, 1, 3}, {0, 1, 1}, {1, 3, 1}, {1, 1, 1}}, true},       // a padded axis of ones: rank 4
    };
    uint32_t seed = 900;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const auto& [c, tma] : shapes) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str());
            CHECK(gemm::conv_fprop_kernel(gpu, L).find("kiln_conv_fprop_") == 0);
            CHECK((gemm::conv_fprop_kernel(gpu, L).find("(patches by TMA)") != std::string::npos) == tma);
            const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                       X = pair(gpu, cpu, L.output_shape(), dt, ++seed), B = pair(gpu, cpu, {c.K}, dt, ++seed);
            check_fprop_epilogues(gpu, cpu, L, I, F, X, B, false);
        }
    // bprop: with stride 1 the implicit kernel's convolution of E with the flipped filter (C
    // output channels, at least 32 of them); strided, a stride-1 convolution per phase of the
    // stride (phases without taps along an axis receive zeros); a padding past the dilated
    // filter, fewer channels or a dilated strided axis keep the product and col2im; a strided
    // one-tap filter (1x1) is the kernel's stride-1 1x1 into the gradient's strided view where
    // pointwise_implicit takes that (any width into a view) and the image's height is whole
    // strides, else the product and one strided copy. Each with
    // the deconvolution of the same geometry, whose fprop is this gradient.
    const std::string by_kernel = "implicit-gemm kiln_", by_phase = "implicit-gemm by phase", product = "im2col+gemm",
                      narrow = "narrow kiln_conv_narrow_";
    const std::vector<std::pair<Case, std::string>> dgrad = {
        {{3, 40, 200, {1, 13, 11}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, by_kernel},
        {{2, 32, 64, {1, 9, 10}, {1, 3, 3}, {0, 2, 2}, {1, 1, 1}, {1, 2, 2}}, by_kernel},
        {{1, 48, 16, {5, 6, 7}, {3, 3, 3}, {1, 0, 1}, {1, 1, 1}, {1, 1, 1}}, by_kernel},
        {{2, 32, 32, {1, 8, 8}, {1, 3, 3}, {0, 3, 1}, {1, 1, 1}, {1, 1, 1}}, product},       // pad 3 > 2
        {{2, 8, 64, {1, 9, 10}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, narrow},        // 8 channels: the narrow kernel
        {{2, 12, 64, {1, 9, 10}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, product},      // 12: neither
        {{2, 40, 64, {1, 13, 12}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}, {1, 1, 1}}, by_phase},
        {{2, 32, 48, {1, 14, 13}, {1, 1, 1}, {0, 0, 0}, {1, 2, 2}, {1, 1, 1}}, product},     // 1x1, few positions: a copy
        {{8, 48, 40, {1, 96, 95}, {1, 1, 1}, {0, 0, 0}, {1, 2, 2}, {1, 1, 1}}, by_kernel},   // 1x1: into the strided view
        {{8, 264, 64, {1, 96, 96}, {1, 1, 1}, {0, 0, 0}, {1, 2, 2}, {1, 1, 1}}, by_kernel},  // and wider than 128 channels
        {{8, 136, 128, {1, 96, 96}, {1, 1, 1}, {0, 0, 0}, {1, 2, 2}, {1, 1, 1}}, by_kernel},
        {{8, 48, 40, {1, 95, 96}, {1, 1, 1}, {0, 0, 0}, {1, 2, 2}, {1, 1, 1}}, product},     // odd height: one strided copy
        {{4, 64, 40, {8, 64, 63}, {1, 1, 1}, {0, 0, 0}, {1, 2, 3}, {1, 1, 1}}, by_kernel},   // 3D 1x1 into its view
        {{4, 64, 40, {8, 64, 63}, {1, 1, 1}, {0, 0, 0}, {2, 2, 3}, {1, 1, 1}}, product},     // depth stride 2: a copy
        {{2, 32, 48, {1, 14, 13}, {1, 2, 1}, {0, 0, 0}, {1, 3, 2}, {1, 1, 1}}, by_phase},    // phases of zeros
        {{1, 32, 16, {5, 6, 7}, {3, 3, 3}, {1, 1, 1}, {2, 2, 1}, {1, 1, 2}}, by_phase},      // 3D, a dilated stride-1 axis
        {{2, 32, 24, {1, 11, 10}, {1, 5, 4}, {0, 2, 1}, {1, 3, 2}, {1, 1, 1}}, by_phase},
        {{2, 32, 16, {1, 9, 10}, {1, 2, 2}, {0, 0, 0}, {1, 3, 3}, {1, 1, 1}}, by_phase},     // filter narrower than the stride
        {{2, 32, 24, {1, 12, 11}, {1, 3, 3}, {0, 2, 2}, {1, 2, 2}, {1, 1, 1}}, by_phase},    // a phase's padding is -1
        {{2, 32, 16, {1, 12, 12}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}, {1, 2, 1}}, product},     // dilation 2 on a strided axis
        {{2, 48, 64, {1, 9, 10}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, by_kernel},    // E's 64 channels by TMA
        {{2, 32, 128, {1, 12, 11}, {1, 3, 3}, {0, 2, 2}, {1, 2, 2}, {1, 1, 1}}, by_phase},   // and a phase's padding -1
        {{2, 32, 64, {1, 3, 12}, {1, 3, 3}, {0, 1, 1}, {1, 3, 3}, {1, 1, 1}}, by_phase},     // a phase of one row, padding -1
    };
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const auto& [c, path] : dgrad) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str());
            CHECK(conv_kernel(gpu, L, "bprop").rfind(path, 0) == 0);
            const Pair F = pair(gpu, cpu, L.filter_shape(), dt, ++seed), E = pair(gpu, cpu, L.output_shape(), dt, ++seed),
                       B = pair(gpu, cpu, {c.C}, DType::Float32, ++seed);
            // Variant 0 finishes a float32 gradient (bias); 1 finishes each piece in the kernel
            // (alpha and leaky ReLU touch only the computed positions).
            for (DType out : {dt, DType::Float32})
                for (int variant = 0; variant < 2; ++variant) {
                    INFO("output " << dtype_name(out) << ", variant " << variant);
                    ConvOptions og, oc;
                    if (variant == 0) og.bias = B.gpu, oc.bias = B.cpu;
                    else og.alpha = oc.alpha = 0.5, og.slope = oc.slope = 0.125;
                    og.relu = oc.relu = true;
                    Tensor Gg = gpu.empty(L.input_shape(), out), Gc = cpu.empty(L.input_shape(), out),
                           Gm = cpu.empty(L.input_shape(), DType::Float32);
                    bprop_conv(L, F.gpu, E.gpu, Gg, og);
                    bprop_conv(L, F.cpu, E.cpu, Gc, oc);
                    bprop_conv(L, F.abs, E.abs, Gm);
                    const Tensor mag = cpu.eval(Gm.expr() + 1.0);
                    CHECK(count_off(Gg, Gc, mag, out) == 0);
                }
            const ConvLayer D = deconv_layer(dt, c.N, c.C, c.K, L.output, c.filter, c.pad, c.stride, c.dilation);
            CHECK(agree(gpu, cpu, D.output_shape(), dt,
                        [&](Tensor& o, Side side) { fprop_conv(D, E.*side, F.*side, o); }) == 0);
        }
    // Layers the cost model gives the 256-wide tile on any SM count from 66 up (long enough
    // k-loops by TMA over many waves, or gathered patches; output channels filling the last tile
    // to 248 of 256): against im2col and the GEMM on the GPU (the CPU would take minutes).
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (int64_t C : {40, 256}) {
            const ConvLayer L = conv_layer(dt, 32, C, 504, {1, 64, 64}, {1, 3, 3}, {0, 1, 1});
            INFO(L.str());
            CHECK(gemm::conv_fprop_kernel(gpu, L).find("_256_") != std::string::npos);
            const Pair I = pair(gpu, gpu, L.input_shape(), dt, ++seed), F = pair(gpu, gpu, L.filter_shape(), dt, ++seed);
            ConvOptions o;
            o.relu = true;
            Tensor Og = gpu.empty(L.output_shape(), dt), Oi = gpu.empty(L.output_shape(), dt),
                   Om = gpu.empty(L.output_shape(), DType::Float32);
            fprop_conv(L, I.gpu, F.gpu, Og, o);
            setenv("KILN_CONV_KERNEL", "im2col", 1);
            CHECK(gemm::conv_fprop_kernel(gpu, L).empty());
            fprop_conv(L, I.gpu, F.gpu, Oi, o);
            fprop_conv(L, I.abs, F.abs, Om);
            unsetenv("KILN_CONV_KERNEL");
            CHECK(count_off(Og, Oi, Om, dt) == 0);
        }
    // More tiles than SMs: the walk (KILN_CONV_KERNEL=walk: a block per SM across its tiles), 64
    // and 128 wide, with a bias and ReLU reloaded per tile, against the one-tile kernel
    // (KILN_CONV_KERNEL=tile) and against im2col and the GEMM.
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (int64_t K : {64, 128, 72}) {
            const ConvLayer L = conv_layer(dt, 48, 64, K, {1, 28, 28}, {1, 3, 3}, {0, 1, 1});
            INFO(L.str());
            // 9 k-tiles a tile and 3 tiles an SM: the walk by the cost model (wider than 64
            // channels); 64 channels over a wave of 256-position tiles, the transposed walk.
            CHECK(gemm::conv_fprop_kernel(gpu, L).find(K == 64 ? "kiln_conv_fprop_walkt_" : "kiln_conv_fprop_walk_") == 0);
            setenv("KILN_CONV_KERNEL", "walk", 1);
            CHECK(gemm::conv_fprop_kernel(gpu, L).find("kiln_conv_fprop_walk_") == 0);
            const Pair I = pair(gpu, gpu, L.input_shape(), dt, ++seed), F = pair(gpu, gpu, L.filter_shape(), dt, ++seed),
                       B = pair(gpu, gpu, {K}, DType::Float32, ++seed);
            ConvOptions o;
            o.relu = true, o.bias = B.gpu;
            Tensor Ow = gpu.empty(L.output_shape(), dt), Ot = gpu.empty(L.output_shape(), dt),
                   Oi = gpu.empty(L.output_shape(), dt), Om = gpu.empty(L.output_shape(), DType::Float32);
            fprop_conv(L, I.gpu, F.gpu, Ow, o);
            setenv("KILN_CONV_KERNEL", "tile", 1);
            CHECK(gemm::conv_fprop_kernel(gpu, L).find("kiln_conv_fprop_walk_") == std::string::npos);
            fprop_conv(L, I.gpu, F.gpu, Ot, o);
            setenv("KILN_CONV_KERNEL", "im2col", 1);
            fprop_conv(L, I.gpu, F.gpu, Oi, o);
            unsetenv("KILN_CONV_KERNEL");
            ConvOptions m;
            m.bias = B.abs;
            fprop_conv(L, I.abs, F.abs, Om, m);
            CHECK(count_off(Ow, Ot, Om, dt) == 0);
            CHECK(count_off(Ow, Oi, Om, dt) == 0);
        }
    // Strided bprop by phase on the walk, with alpha and beta, against the CPU.
    for (DType dt : {DType::Float16, DType::BFloat16})
        check_walked_phases(gpu, cpu, conv_layer(dt, 24, 64, 64, {1, 56, 56}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}), "", seed);
    // A first layer padded along its axis of ones (depth): its one output depth reads only the
    // padding, so its outputs and its filter gradient are zeros (the staged im2col, which has no
    // depth, declines it).
    for (DType dt : {DType::Float16, DType::Float32}) {
        const ConvLayer L = conv_layer(dt, 2, 3, 16, {1, 31, 31}, {1, 7, 7}, {1, 3, 3}, {3, 2, 2});
        INFO(L.str());
        const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                   E = pair(gpu, cpu, L.output_shape(), dt, ++seed);
        CHECK(agree(gpu, cpu, L.output_shape(), dt, [&](Tensor& o, Side side) { fprop_conv(L, I.*side, F.*side, o); }) == 0);
        CHECK(agree(gpu, cpu, L.filter_shape(), dt, [&](Tensor& o, Side side) { update_conv(L, I.*side, E.*side, o); }) == 0);
    }
    // The kernel itself takes neither a 3-channel first layer nor float32.
    CHECK(gemm::conv_fprop_kernel(gpu, conv_layer(DType::Float16, 2, 3, 16, {1, 31, 31}, {1, 7, 7}, {0, 3, 3})).empty());
    CHECK(gemm::conv_fprop_kernel(gpu, conv_layer(DType::Float32, 2, 16, 16, {1, 8, 8}, {1, 3, 3}, {0, 1, 1})).empty());
    CHECK(conv_kernel(gpu, conv_layer(DType::Float32, 2, 3, 16, {1, 31, 31}, {1, 7, 7}, {0, 3, 3}), "fprop") == "im2col+gemm");
    // Channels not a multiple of 8 (first layers) with stride 1: fprop writes the W padding out,
    // pads the channels and the filter's W taps with zeros until a row of taps fills a k-tile (3
    // and 5 channels: 8 taps of 8; 12: 4 of 16) and reads the taps as channels (padded_taps),
    // where the channels padded to 8 would have at most 256 taps; 2 channels (4 times the taps)
    // and a 7x7 window over 3 (392) keep im2col and the GEMM. Every epilogue and bsum, both
    // output dtypes, against the CPU; the update reads every one of them so.
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (int64_t C : {3, 5, 12, 2, 7}) {
            const ConvLayer L = C == 5   ? conv_layer(dt, 2, C, 96, {1, 21, 23}, {1, 5, 5}, {0, 2, 0})
                                : C == 7 ? conv_layer(dt, 2, 3, 64, {1, 19, 18}, {1, 7, 7}, {0, 3, 3})
                                         : conv_layer(dt, 3, C, 64, {1, 29, 30}, {1, 3, 3}, {0, 1, 1});
            INFO(L.str());
            const bool padded = C != 2 && C != 7;
            const std::string path = conv_kernel(gpu, L, "fprop"), update = conv_kernel(gpu, L, "update");
            INFO(path << "; update " << update);
            const std::string taps = C == 12 ? "(W padding written out, 4 taps of 16 channels, W taps as channels)"
                                             : "(W padding written out, 8 taps of 8 channels, W taps as channels)";
            CHECK((path.find(taps) != std::string::npos) == padded);
            CHECK((path == "im2col+gemm") == !padded);
            CHECK(update.find(taps) != std::string::npos);
            const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                       X = pair(gpu, cpu, L.output_shape(), dt, ++seed), B = pair(gpu, cpu, {L.K}, DType::Float32, ++seed),
                       E = pair(gpu, cpu, L.output_shape(), dt, ++seed), G = pair(gpu, cpu, L.filter_shape(), dt, ++seed);
            {   // (the written-out image's pixels, 8 or 16 channels apart)
                const int64_t pixel = C == 12 ? 16 : 8;
                Tensor O = gpu.empty(L.output_shape(), dt), GF = gpu.empty(L.filter_shape(), dt);
                fprop_conv(L, I.gpu, F.gpu, O);
                CHECK(gemm::last_conv_layout().pixel == (padded ? pixel : 0));
                update_conv(L, I.gpu, E.gpu, GF);
                CHECK(gemm::last_conv_layout().pixel == pixel);
            }
            check_fprop_epilogues(gpu, cpu, L, I, F, X, B, true);
            check_update_alpha_beta(gpu, cpu, L, I, E, G);
            // brelu with X (the float32 product and the JIT epilogue), and a deconvolution's bprop
            // (the convolution forward() runs) from a strided view of the image.
            ConvOptions og, oc;
            og.brelu = oc.brelu = true, og.slope = oc.slope = 0.1;
            og.X = X.gpu, oc.X = X.cpu;
            CHECK(agree(gpu, cpu, L.output_shape(), dt, [&](Tensor& o, Side side) {
                      fprop_conv(L, I.*side, F.*side, o, side == &Pair::gpu ? og : side == &Pair::cpu ? oc : ConvOptions{});
                  }) == 0);
            const ConvLayer D = deconv_layer(dt, L.N, L.C, L.K, L.output, L.filter, L.pad, L.stride);
            CHECK((conv_kernel(gpu, D, "bprop").find("(channels padded to ") != std::string::npos) == padded);
            Shape wide_e = D.output_shape();   // (the deconvolution's output: its bprop's E)
            wide_e.back() = 2 * L.C;
            const Pair W = pair(gpu, cpu, wide_e, dt, ++seed);
            auto every_other = [&](const Tensor& t) {
                return t.slice({Slice::all(), Slice::all(), Slice::all(), Slice::range(0, 2 * L.C, 2)});
            };
            CHECK(agree(gpu, cpu, D.input_shape(), dt, [&](Tensor& o, Side side) {
                      bprop_conv(D, F.*side, every_other(W.*side), o);
                  }) == 0);
        }
}

// Strided layers whose channels are not a multiple of 8 (first layers) fold the stride into
// the channels (space-to-depth) and run the stride-1 layer over the folded image: fprop (every
// epilogue, bsum), bprop (its gradient, unfolded; alpha, beta, bsum, and the image's positions
// no window reads) and update (alpha and beta, both output dtypes), 1D, 2D and 3D, and the
// deconvolution of the same geometry; against the CPU. 1x1 filters and dilation do not fold,
// nor fprop where the channels padded to 8 give fewer taps. Where the folded layer's W taps
// fill k-tiles of 64 channels (taps_as_channels), fprop and the update read them as channels,
// the update then folding into fprop's channels.
TEST_CASE("gpu conv: strided first layers fold the stride into the channels") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (!sm90(gpu)) return;
    struct Folded {
        Case c;
        int64_t fprop, bprop, update;   // the folded channels, 0 where the op does not fold
        bool taps = false;              // fprop and the update read the W taps as channels
    };
    const std::vector<Folded> layers = {
        {{3, 3, 64, {1, 29, 29}, {1, 7, 7}, {0, 3, 2}, {1, 2, 2}, {1, 1, 1}}, 16, 32, 16, true},   // ResNet's conv1
        {{2, 3, 40, {1, 30, 31}, {1, 7, 7}, {0, 3, 3}, {1, 2, 2}, {1, 1, 1}}, 16, 32, 16, true},   // odd, K tail
        {{2, 4, 64, {1, 23, 26}, {1, 5, 8}, {0, 2, 3}, {1, 2, 2}, {1, 1, 1}}, 16, 32, 16, true},
        {{2, 3, 72, {1, 1, 301}, {1, 1, 15}, {0, 0, 7}, {1, 1, 2}, {1, 1, 1}}, 8, 32, 8, true},    // 1D, 8 taps of 8
        {{1, 1, 64, {6, 9, 10}, {3, 3, 16}, {1, 1, 7}, {2, 2, 2}, {1, 1, 1}}, 8, 32, 8, true},     // 3D
        {{2, 3, 96, {1, 47, 45}, {1, 11, 11}, {0, 2, 0}, {1, 4, 4}, {1, 1, 1}}, 48, 48, 64},   // AlexNet's, Overfeat's
        {{2, 3, 72, {1, 24, 25}, {1, 5, 5}, {0, 0, 0}, {1, 2, 2}, {1, 1, 1}}, 16, 32, 64},     // unread last rows
        {{2, 12, 64, {1, 21, 21}, {1, 5, 5}, {0, 2, 2}, {1, 2, 2}, {1, 1, 1}}, 48, 48, 64},
        {{2, 2, 64, {1, 22, 22}, {1, 7, 7}, {0, 3, 3}, {1, 2, 2}, {1, 1, 1}}, 8, 32, 64},
        {{1, 3, 40, {9, 11, 11}, {3, 3, 3}, {1, 1, 1}, {2, 2, 2}, {1, 1, 1}}, 24, 32, 64},     // 3D
        {{2, 3, 48, {1, 1, 60}, {1, 1, 5}, {0, 0, 1}, {1, 1, 3}, {1, 1, 1}}, 16, 32, 64},      // 1D
        {{2, 3, 32, {1, 1, 4001}, {1, 1, 5}, {0, 0, 2}, {1, 1, 3}, {1, 1, 1}}, 16, 32, 64},    // rows of several tiles
        {{2, 3, 64, {1, 17, 18}, {1, 3, 5}, {0, 1, 2}, {1, 3, 2}, {1, 1, 1}}, 24, 32, 64},     // uneven strides
        {{2, 3, 64, {1, 16, 16}, {1, 1, 1}, {0, 0, 0}, {1, 2, 2}, {1, 1, 1}}, 0, 0, 0},        // 1x1: nothing to fold
        {{2, 5, 64, {1, 20, 21}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}, {1, 1, 1}}, 0, 32, 64},      // padded: fewer taps
        {{2, 3, 64, {1, 21, 21}, {1, 3, 3}, {0, 2, 2}, {1, 2, 2}, {1, 2, 2}}, 0, 0, 0},        // dilation
    };
    uint32_t seed = 3000;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const Folded& f : layers) {
            const Case& c = f.c;
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str());
            auto folds = [&](const ConvLayer& layer, const char* op, int64_t channels, bool taps = false) {
                const std::string path = conv_kernel(gpu, layer, op);
                INFO(op << ": " << path);
                CHECK((path.find("(stride folded into " + std::to_string(channels) + " channels") != std::string::npos) ==
                      (channels != 0));
                CHECK((path.find(", W taps as channels)") != std::string::npos) == taps);
                // (These layers' forward convolution, where it does not fold, runs over channels
                // padded to 8: a deconvolution's bprop.)
                if (channels == 0 && std::string(op) != "update" && (std::string(op) == "fprop") != layer.deconv)
                    CHECK(path.find("(channels padded to 8)") != std::string::npos);
            };
            folds(L, "fprop", f.fprop, f.taps);
            folds(L, "bprop", f.bprop);
            folds(L, "update", f.update, f.taps);
            const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                       X = pair(gpu, cpu, L.output_shape(), dt, ++seed), B = pair(gpu, cpu, {L.K}, DType::Float32, ++seed),
                       E = pair(gpu, cpu, L.output_shape(), dt, ++seed), GI = pair(gpu, cpu, L.input_shape(), dt, ++seed),
                       GF = pair(gpu, cpu, L.filter_shape(), dt, ++seed);
            {   // (the folded image's pixels, f.fprop or f.update channels apart, where read as taps)
                Tensor O = gpu.empty(L.output_shape(), dt), G = gpu.empty(L.filter_shape(), dt);
                fprop_conv(L, I.gpu, F.gpu, O);
                CHECK(gemm::last_conv_layout().pixel == (f.taps ? f.fprop : 0));
                update_conv(L, I.gpu, E.gpu, G);
                CHECK(gemm::last_conv_layout().pixel == (f.taps ? f.update : 0));
            }
            check_fprop_epilogues(gpu, cpu, L, I, F, X, B, true);
            // bprop: plain, and alpha with leaky ReLU (applied by the kernel, unfolded into the
            // output) into L's dtype and float32; alpha, beta and bsum into float32 (the JIT
            // epilogue).
            CHECK(agree(gpu, cpu, L.input_shape(), dt, [&](Tensor& o, Side side) { bprop_conv(L, F.*side, E.*side, o); }) == 0);
            ConvOptions leaky;
            leaky.alpha = 0.5, leaky.relu = true, leaky.slope = 0.2;
            for (DType out : {dt, DType::Float32})
                CHECK(agree(gpu, cpu, L.input_shape(), out, [&](Tensor& o, Side side) {
                          bprop_conv(L, F.*side, E.*side, o, side == &Pair::abs ? ConvOptions{} : leaky);
                      }) == 0);
            {
                Tensor Im = cpu.empty(L.input_shape(), DType::Float32);
                bprop_conv(L, F.abs, E.abs, Im);
                const Tensor mag = cpu.eval(Im.expr() * 0.75 + absolute(GI.cpu.expr()) * 0.5 + 1.0);
                ConvOptions og, oc;
                og.alpha = oc.alpha = 0.75, og.beta = oc.beta = -0.5;
                Tensor sg = gpu.empty({L.C}, DType::Float32), sc = cpu.empty({L.C}, DType::Float32);
                og.bsum = sg, oc.bsum = sc;
                Tensor Og = gpu.eval(cast(GI.gpu.expr(), DType::Float32)), Oc = cpu.eval(cast(GI.cpu.expr(), DType::Float32));
                bprop_conv(L, F.gpu, E.gpu, Og, og);
                bprop_conv(L, F.cpu, E.cpu, Oc, oc);
                CHECK(count_off(Og, Oc, mag, DType::Float32) == 0);
                const Tensor smag = cpu.eval(reshape(sum(absolute(reshape(Oc.expr(), {numel(L.input_shape()) / L.C, L.C})), 0), {L.C}));
                CHECK(count_off(sg, sc, smag, DType::Float32, 1e-5) == 0);
            }
            // update: alpha and beta into L's dtype and float32.
            check_update_alpha_beta(gpu, cpu, L, I, E, GF);
            // The deconvolution of the same geometry, where its output has the image's size: its
            // bprop is this fprop, its fprop this bprop, its update this one with I and E's roles.
            if (!round_trips(L)) continue;
            const ConvLayer D = deconv_layer(dt, c.N, c.C, c.K, L.output, c.filter, c.pad, c.stride, c.dilation);
            folds(D, "bprop", f.fprop, f.taps);
            folds(D, "fprop", f.bprop);
            folds(D, "update", f.update, f.taps);
            CHECK(agree(gpu, cpu, D.output_shape(), dt, [&](Tensor& o, Side side) { fprop_conv(D, E.*side, F.*side, o); }) == 0);
            CHECK(agree(gpu, cpu, D.input_shape(), dt, [&](Tensor& o, Side side) { bprop_conv(D, F.*side, I.*side, o); }) == 0);
            CHECK(agree(gpu, cpu, D.filter_shape(), dt, [&](Tensor& o, Side side) { update_conv(D, E.*side, I.*side, o); }) == 0);
        }
}

TEST_CASE("gpu conv: the gradient of stride-1 layers of at most 8 channels by the narrow kernel") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (cuda::cuda_backend(gpu).info().sm < 80) {
        std::printf("SKIPPED (the narrow kernel is mma.sync code for sm_80 and later)\n");
        return;
    }
    // VGG's first layer (smaller); E's channels in several 64-channel chunks with a tail of 8;
    // 8 channels, dilation and a padding past the window's middle; 1D; R != S, output rows and
    // positions past a tile's 8 x 32; K = 12 (E's channels a multiple of 8 is what it needs: 12
    // is not, and keeps the product).
    const std::vector<std::pair<Case, bool>> layers = {
        {{2, 3, 64, {1, 37, 45}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, true},
        {{2, 3, 200, {1, 19, 70}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, true},
        {{3, 8, 40, {1, 17, 33}, {1, 5, 5}, {0, 3, 1}, {1, 1, 1}, {1, 2, 2}}, true},
        {{2, 1, 16, {1, 1, 300}, {1, 1, 7}, {0, 0, 3}, {1, 1, 1}, {1, 1, 1}}, true},
        {{2, 5, 24, {1, 12, 29}, {1, 2, 5}, {0, 0, 4}, {1, 1, 1}, {1, 1, 1}}, true},
        {{2, 3, 12, {1, 9, 9}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, false},
    };
    uint32_t seed = 8000;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const auto& [c, takes] : layers) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str());
            CHECK((conv_kernel(gpu, L, "bprop").rfind("narrow kiln_conv_narrow_", 0) == 0) == takes);
            const Pair F = pair(gpu, cpu, L.filter_shape(), dt, ++seed), E = pair(gpu, cpu, L.output_shape(), dt, ++seed),
                       G = pair(gpu, cpu, L.input_shape(), dt, ++seed), B = pair(gpu, cpu, {c.C}, DType::Float32, ++seed);
            Tensor Gm = cpu.empty(L.input_shape(), DType::Float32);
            bprop_conv(L, F.abs, E.abs, Gm);
            const Tensor mag = cpu.eval(Gm.expr() + absolute(G.cpu.expr()) + 1.0);
            // plain; alpha and leaky ReLU; alpha, beta, bias and ReLU (its own epilogue); brelu
            // with X (the float32 gradient and the JIT epilogue); bsum; into L's dtype and float32.
            for (DType out : {dt, DType::Float32})
                for (int variant = 0; variant < 5; ++variant) {
                    INFO("output " << dtype_name(out) << ", variant " << variant);
                    ConvOptions og, oc;
                    if (variant == 1) og.alpha = oc.alpha = 0.5, og.relu = oc.relu = true, og.slope = oc.slope = 0.2;
                    if (variant == 2) {
                        og.alpha = oc.alpha = 0.75, og.beta = oc.beta = -0.5, og.relu = oc.relu = true;
                        og.bias = B.gpu, oc.bias = B.cpu;
                    }
                    if (variant == 3) og.brelu = oc.brelu = true, og.slope = oc.slope = 0.1, og.X = G.gpu, oc.X = G.cpu;
                    Tensor sg = gpu.empty({c.C}, DType::Float32), sc = cpu.empty({c.C}, DType::Float32);
                    if (variant == 4) og.bsum = sg, oc.bsum = sc;
                    Tensor Og = gpu.eval(cast(G.gpu.expr(), out)), Oc = cpu.eval(cast(G.cpu.expr(), out));
                    bprop_conv(L, F.gpu, E.gpu, Og, og);
                    bprop_conv(L, F.cpu, E.cpu, Oc, oc);
                    CHECK(count_off(Og, Oc, mag, out) == 0);
                    if (variant == 4) {
                        const Tensor smag = cpu.eval(reshape(sum(absolute(reshape(Oc.expr(), {numel(L.input_shape()) / c.C, c.C})), 0), {c.C}));
                        CHECK(count_off(sg, sc, smag, DType::Float32, 2 * ulp(out) + 1e-5) == 0);
                    }
                }
            // The deconvolution of the same geometry: its fprop is this gradient.
            const ConvLayer D = deconv_layer(dt, c.N, c.C, c.K, L.output, c.filter, c.pad, c.stride, c.dilation);
            CHECK(conv_kernel(gpu, D, "fprop") == conv_kernel(gpu, L, "bprop"));
            CHECK(agree(gpu, cpu, D.output_shape(), dt, [&](Tensor& o, Side side) { fprop_conv(D, E.*side, F.*side, o); }) == 0);
            // Into the first C channels of a wider tensor (rows 2C apart: the kernel's row
            // stride), and from an E one element off 16-byte alignment (the kernel declines; the
            // product runs): against the CPU.
            Shape wide = L.input_shape();
            wide.back() = 2 * c.C;
            Tensor Wg = gpu.zeros(wide, dt);
            std::vector<Slice> channels(wide.size() - 1, Slice::all());   // 1D layers have one axis less
            channels.push_back(Slice::range(0, c.C));
            Tensor Vg = Wg.slice(channels);
            bprop_conv(L, F.gpu, E.gpu, Vg);
            Tensor Gc = cpu.empty(L.input_shape(), dt);
            bprop_conv(L, F.cpu, E.cpu, Gc);
            CHECK(count_off(gpu.eval(Vg.expr()), Gc, mag, dt) == 0);
            const int64_t n = numel(L.output_shape());
            Tensor flat = gpu.array(std::vector<float>(size_t(n) + 1, 0.f), {n + 1}, dt);
            Tensor Eo = *flat.slice({Slice::range(1, n + 1)}).reshape_view(L.output_shape());
            Eo.assign(E.gpu.expr());
            Tensor Og = gpu.empty(L.input_shape(), dt);
            bprop_conv(L, F.gpu, Eo, Og);
            CHECK(count_off(Og, Gc, mag, dt) == 0);
        }
    // KILN_CONV_KERNEL=im2col takes the patch matrix here too.
    {
        kiln::test::ScopedEnv im2col("KILN_CONV_KERNEL", "im2col");
        const ConvLayer L = conv_layer(DType::Float16, 2, 3, 64, {1, 37, 45}, {1, 3, 3}, {0, 1, 1});
        CHECK(conv_kernel(gpu, L, "bprop") == "im2col+gemm");
    }
    // A dilation whose window would not fit in shared memory (4000 positions wide) keeps the
    // product: against the CPU.
    {
        const ConvLayer L = conv_layer(DType::Float16, 1, 3, 8, {1, 1, 4100}, {1, 1, 2}, {0, 0, 0}, {1, 1, 1}, {1, 1, 4000});
        INFO(L.str());
        CHECK(conv_kernel(gpu, L, "bprop") == "im2col+gemm");
        const Pair F = pair(gpu, cpu, L.filter_shape(), DType::Float16, ++seed), E = pair(gpu, cpu, L.output_shape(), DType::Float16, ++seed);
        CHECK(agree(gpu, cpu, L.input_shape(), DType::Float16, [&](Tensor& o, Side side) { bprop_conv(L, F.*side, E.*side, o); }) == 0);
    }
}

TEST_CASE("gpu conv: channels a multiple of 8 but not of 64 padded to 64 where TMA then brings the patches") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (!sm90(gpu)) return;
    // fprop pads where the cost model says the padded layer by TMA wins (K past 64; never where
    // TMA brings the patches in 32-channel halves instead); the update wherever the taps grow by
    // at most a third (96 and 160 channels, not 40).
    struct Padded {
        Case c;
        bool fprop, update;
    };
    const std::vector<Padded> layers = {
        {{3, 96, 256, {1, 12, 12}, {1, 5, 5}, {0, 0, 0}, {1, 1, 1}, {1, 1, 1}}, false, true},    // Overfeat's conv2, smaller
        {{2, 160, 72, {1, 9, 11}, {1, 3, 3}, {0, 1, 1}, {1, 2, 1}, {1, 1, 2}}, false, true},    // 160 to 192; stride, dilation
        {{2, 96, 48, {1, 10, 10}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, false, true},    // K <= 64: not modelled
        {{2, 48, 96, {1, 10, 10}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, true, true},     // 48 to 64
        {{2, 40, 96, {1, 10, 10}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, false, false},   // 40 to 64: too many taps
        {{1, 6152, 72, {1, 3, 4}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, false, false},   // past the fold's 12 KiB
    };
    uint32_t seed = 9000;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const Padded& t : layers) {
            const Case& c = t.c;
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            const std::string padded = "(channels padded to " + std::to_string((c.C + 63) / 64 * 64) + ")";
            INFO(L.str() << ": fprop " << conv_kernel(gpu, L, "fprop") << ", update " << conv_kernel(gpu, L, "update"));
            CHECK((conv_kernel(gpu, L, "fprop").find(padded) != std::string::npos) == t.fprop);
            CHECK((conv_kernel(gpu, L, "update").find(padded) != std::string::npos) == t.update);
            const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                       X = pair(gpu, cpu, L.output_shape(), dt, ++seed), B = pair(gpu, cpu, {L.K}, DType::Float32, ++seed),
                       E = pair(gpu, cpu, L.output_shape(), dt, ++seed), G = pair(gpu, cpu, L.filter_shape(), dt, ++seed);
            check_fprop_epilogues(gpu, cpu, L, I, F, X, B, true);
            check_update_alpha_beta(gpu, cpu, L, I, E, G);
            // The deconvolution of the same geometry: its bprop is this fprop, its update this one.
            if (!round_trips(L)) continue;
            const ConvLayer D = deconv_layer(dt, c.N, c.C, c.K, L.output, c.filter, c.pad, c.stride, c.dilation);
            CHECK(conv_kernel(gpu, D, "bprop") == conv_kernel(gpu, L, "fprop"));
            CHECK(conv_kernel(gpu, D, "update") == conv_kernel(gpu, L, "update"));
            CHECK(agree(gpu, cpu, D.input_shape(), dt, [&](Tensor& o, Side side) { bprop_conv(D, F.*side, I.*side, o); }) == 0);
            CHECK(agree(gpu, cpu, D.filter_shape(), dt, [&](Tensor& o, Side side) { update_conv(D, E.*side, I.*side, o); }) == 0);
        }
}

// fprop over channels a multiple of 32 but not of 64: the `_h` kernels, A in halves of 32
// channels of one tap, by TMA (an odd number of halves: the last k-tile's second half past the
// channels, zeros) or gathered where the descriptor cannot hold the geometry (stride 9); the
// one-tile kernels 64, 128 and 256 wide and the persistent walk; 1D, 2D, 3D; every epilogue and
// bsum, into the layer's dtype and float32, against the CPU. An infinity in the image reaches
// exactly the outputs whose windows hold it.
TEST_CASE("gpu conv: channels a multiple of 32 but not of 64 by TMA in 32-channel halves") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (!sm90(gpu)) return;
    struct Halves {
        Case c;
        const char* entry;   // what the plan's kernel name holds
        bool tma;
    };
    const std::vector<Halves> layers = {
        {{2, 96, 48, {1, 10, 10}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, "kiln_conv_fprop_h_f16_64_s4", true},
        {{3, 96, 128, {1, 12, 12}, {1, 5, 5}, {0, 0, 0}, {1, 1, 1}, {1, 1, 1}}, "kiln_conv_fprop_h_f16_128_s6", true},
        {{2, 160, 200, {1, 9, 11}, {1, 3, 3}, {0, 1, 1}, {1, 2, 1}, {1, 1, 2}}, "kiln_conv_fprop_h_f16_128_s6", true},
        {{8, 96, 192, {1, 40, 40}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, "kiln_conv_fprop_h_f16_256_s4", true},
        {{3, 32, 72, {1, 1, 50}, {1, 1, 5}, {0, 0, 2}, {1, 1, 3}, {1, 1, 2}}, "kiln_conv_fprop_h_f16_128_s6", true},   // 1D
        {{1, 32, 40, {5, 6, 7}, {3, 3, 3}, {1, 1, 1}, {1, 2, 1}, {1, 1, 1}}, "kiln_conv_fprop_h_f16_64_s4", true},    // 3D
        {{2, 96, 128, {1, 40, 40}, {1, 3, 3}, {0, 1, 1}, {1, 9, 9}, {1, 1, 1}}, "kiln_conv_fprop_h_f16_128_s6", false},
        {{32, 96, 256, {1, 24, 24}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, "kiln_conv_fprop_pers_h_f16_256_s4", true},
    };
    uint32_t seed = 9500;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const Halves& t : layers) {
            const Case& c = t.c;
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            std::string entry = t.entry;
            if (dt == DType::BFloat16) entry.replace(entry.find("f16"), 3, "bf16");
            const std::string path = conv_kernel(gpu, L, "fprop");
            INFO(L.str() << ": " << path);
            CHECK(path.find(entry) != std::string::npos);
            CHECK((path.find("(patches by TMA in 32-channel halves)") != std::string::npos) == t.tma);
            CHECK(path.find("padded") == std::string::npos);
            const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                       X = pair(gpu, cpu, L.output_shape(), dt, ++seed), B = pair(gpu, cpu, {L.K}, DType::Float32, ++seed);
            check_fprop_epilogues(gpu, cpu, L, I, F, X, B, true);
            if (c.N < 32) continue;
            check_infinity_windows(gpu, cpu, L, I, F);   // (its last channel: the last half of a tap)
        }
}

// Output channels 65-96 with the patches by TMA: the 96-wide one-tile kernel (a 128-wide tile
// would multiply a quarter of its columns for nothing): 96, 88, 80 and 72 channels (columns past
// K in the tile), 1D, 2D, 3D, stride and dilation; every epilogue and bsum, into the layer's
// dtype and float32, against the CPU; bprop into 96 channels (Overfeat's conv2, smaller), plain
// and with alpha and beta; an infinity in the image reaching exactly the windows that hold it.
TEST_CASE("gpu conv: 65-96 output channels on the 96-wide tile") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (!sm90(gpu)) return;
    const std::vector<Case> layers = {
        {2, 64, 96, {1, 10, 10}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}},
        {3, 128, 72, {1, 12, 12}, {1, 5, 5}, {0, 0, 0}, {1, 1, 1}, {1, 1, 1}},
        {3, 64, 80, {1, 1, 50}, {1, 1, 5}, {0, 0, 2}, {1, 1, 3}, {1, 1, 2}},     // 1D
        {1, 64, 88, {5, 6, 7}, {3, 3, 3}, {1, 1, 1}, {1, 2, 1}, {1, 1, 1}},      // 3D
        {32, 64, 96, {1, 12, 12}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}},   // 36 rows of tiles
        {32, 192, 72, {1, 9, 9}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}},
    };
    uint32_t seed = 9700;
    for (DType dt : {DType::Float16, DType::BFloat16}) {
        const std::string entry = dt == DType::Float16 ? "kiln_conv_fprop_f16_96_s6" : "kiln_conv_fprop_bf16_96_s6";
        for (const Case& c : layers) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            const std::string path = conv_kernel(gpu, L, "fprop");
            INFO(L.str() << ": " << path);
            CHECK(path.find(entry + " (patches by TMA)") != std::string::npos);
            {   // KILN_CONV_KERNEL=walk: no 96-wide walk, the same kernel
                const test::ScopedEnv walk("KILN_CONV_KERNEL", "walk");
                CHECK(conv_kernel(gpu, L, "fprop").find(entry) != std::string::npos);
            }
            const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                       X = pair(gpu, cpu, L.output_shape(), dt, ++seed), B = pair(gpu, cpu, {L.K}, DType::Float32, ++seed);
            check_fprop_epilogues(gpu, cpu, L, I, F, X, B, true);
            if (c.N < 32) continue;
            check_infinity_windows(gpu, cpu, L, I, F);
        }
        // bprop into 96 channels: E's 256 channels by TMA with the flipped filter.
        const ConvLayer L = conv_layer(dt, 8, 96, 256, {1, 12, 12}, {1, 5, 5}, {0, 0, 0});
        const std::string path = conv_kernel(gpu, L, "bprop");
        INFO(L.str() << ": " << path);
        CHECK(path.find(entry) != std::string::npos);
        check_bprop_alpha_beta(gpu, cpu, L, seed);
    }
}

// Stride-1 layers without W padding whose C channels (under 64) times S taps along W fill
// k-tiles of 64 read their W taps as channels (taps_as_channels: a view whose pixels overlap),
// fprop and update alike, every epilogue, against the CPU; a strided image (not contiguous) is
// made dense first; a layer with W padding or dilation does not take the view. Each asserts
// the image layout the kernel ran on (last_conv_layout: pixels C apart).
TEST_CASE("gpu conv: W taps read as channels where they fill k-tiles") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (!sm90(gpu)) return;
    struct Taps {
        Case c;
        bool taps;
    };
    const std::vector<Taps> layers = {
        {{2, 16, 64, {1, 13, 17}, {1, 3, 4}, {0, 1, 0}, {1, 1, 1}, {1, 1, 1}}, true},
        {{3, 32, 96, {1, 9, 40}, {1, 3, 2}, {0, 1, 0}, {1, 2, 1}, {1, 2, 1}}, true},      // H stride, dilation
        {{2, 8, 72, {1, 1, 700}, {1, 1, 16}, {0, 0, 0}, {1, 1, 1}, {1, 1, 1}}, true},     // 1D, 2 k-tiles a tap row
        {{1, 16, 64, {5, 6, 9}, {2, 3, 8}, {1, 0, 0}, {1, 1, 1}, {1, 1, 1}}, true},       // 3D
        {{2, 16, 64, {1, 13, 17}, {1, 3, 4}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, false},    // W padded
        {{2, 16, 64, {1, 13, 17}, {1, 3, 4}, {0, 1, 0}, {1, 1, 1}, {1, 1, 2}}, false},    // W dilated
    };
    uint32_t seed = 9500;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const Taps& t : layers) {
            const Case& c = t.c;
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str() << ": fprop " << conv_kernel(gpu, L, "fprop") << ", update " << conv_kernel(gpu, L, "update"));
            CHECK((conv_kernel(gpu, L, "fprop").find("(W taps as channels)") != std::string::npos) == t.taps);
            CHECK((conv_kernel(gpu, L, "update").find("(W taps as channels)") != std::string::npos) == t.taps);
            const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                       X = pair(gpu, cpu, L.output_shape(), dt, ++seed), B = pair(gpu, cpu, {L.K}, DType::Float32, ++seed),
                       E = pair(gpu, cpu, L.output_shape(), dt, ++seed), G = pair(gpu, cpu, L.filter_shape(), dt, ++seed);
            auto viewed = [&] { return gemm::last_conv_layout().pixel == c.C; };
            {
                Tensor O = gpu.empty(L.output_shape(), dt), GF = gpu.empty(L.filter_shape(), dt);
                fprop_conv(L, I.gpu, F.gpu, O);
                CHECK(viewed() == t.taps);
                update_conv(L, I.gpu, E.gpu, GF);
                CHECK(viewed() == t.taps);
            }
            check_fprop_epilogues(gpu, cpu, L, I, F, X, B, true);
            check_update_alpha_beta(gpu, cpu, L, I, E, G);
            // The image as every other channel of a wider one: not contiguous.
            Shape wide = L.input_shape();
            wide.back() *= 2;
            const Pair Iw = pair(gpu, cpu, wide, dt, ++seed);
            auto half = [&](const Tensor& x) {
                std::vector<Slice> sl(x.rank(), Slice::all());
                sl.back() = Slice::range(0, x.shape().back(), 2);
                return x.slice(sl);
            };
            CHECK(agree(gpu, cpu, L.output_shape(), dt, [&](Tensor& o, Side side) {
                      fprop_conv(L, half(Iw.*side), F.*side, o);
                      if (side == &Pair::gpu) CHECK(viewed() == t.taps);
                  }) == 0);
            CHECK(agree(gpu, cpu, L.filter_shape(), dt, [&](Tensor& o, Side side) {
                      update_conv(L, half(Iw.*side), E.*side, o);
                      if (side == &Pair::gpu) CHECK(viewed() == t.taps);
                  }) == 0);
        }
}

TEST_CASE("gpu conv: pointwise layers of at most 128 output channels over a wave of row tiles run on the implicit kernel") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (!sm90(gpu)) return;
    const int64_t wave = 128 * cuda::cuda_backend(gpu).info().multiprocessors;   // rows of a wave of tiles
    struct Pointwise {
        int64_t N, C, K, H, W;
    };
    uint32_t seed = 7000;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const Pointwise& c : {Pointwise{8, 64, 64, 48, 48}, Pointwise{5, 136, 128, 60, 61}, Pointwise{8, 40, 256, 48, 47},
                                   Pointwise{2, 64, 64, 8, 8}}) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, {1, c.H, c.W}, {1, 1, 1});
            INFO(L.str());
            const bool rows = c.N * c.H * c.W >= wave;
            // fprop's output channels are K, bprop's C (E . F: K into C).
            CHECK((conv_kernel(gpu, L, "fprop").rfind("implicit-gemm kiln_conv_fprop", 0) == 0) == (rows && c.K <= 128));
            CHECK((conv_kernel(gpu, L, "bprop").rfind("implicit-gemm kiln_conv_fprop", 0) == 0) == (rows && c.C <= 128));
            CHECK(conv_kernel(gpu, L, "update") == "gemm");
            const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                       X = pair(gpu, cpu, L.output_shape(), dt, ++seed), B = pair(gpu, cpu, {L.K}, DType::Float32, ++seed),
                       E = pair(gpu, cpu, L.output_shape(), dt, ++seed);
            check_fprop_epilogues(gpu, cpu, L, I, F, X, B, true);
            ConvOptions leaky;
            leaky.alpha = 0.5, leaky.relu = true, leaky.slope = 0.2;
            for (DType out : {dt, DType::Float32})
                for (bool options : {false, true})
                    CHECK(agree(gpu, cpu, L.input_shape(), out, [&](Tensor& o, Side side) {
                              bprop_conv(L, F.*side, E.*side, o, options && side != &Pair::abs ? leaky : ConvOptions{});
                          }) == 0);
            // The deconvolution: its fprop is this bprop.
            const ConvLayer D = deconv_layer(dt, c.N, c.C, c.K, L.output, {1, 1, 1});
            CHECK(conv_kernel(gpu, D, "fprop") == conv_kernel(gpu, L, "bprop"));
            CHECK(agree(gpu, cpu, D.output_shape(), dt, [&](Tensor& o, Side side) { fprop_conv(D, E.*side, F.*side, o); }) == 0);
        }
}

TEST_CASE("gpu conv: the implicit weight gradient on sm_90: taps past the tile, K tails, splits, alpha and beta, float32 output, 1D, 2D, 3D, deconvolution") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (!sm90(gpu)) return;
    const std::string wgrad = "implicit-gemm kiln_conv_wgrad_";
    // Each with whether the implicit kernel takes its update (C a multiple of 64, the window in
    // the im2col descriptor's corners).
    const std::vector<std::pair<Case, bool>> shapes = {
        {{2, 64, 72, {1, 10, 9}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, true},      // 576 taps: a part tile
        {{3, 64, 40, {1, 11, 13}, {1, 3, 2}, {0, 1, 0}, {1, 2, 1}, {1, 1, 2}}, true},     // R != S, stride, dilation
        {{2, 128, 136, {1, 9, 9}, {1, 5, 5}, {0, 4, 0}, {1, 1, 3}, {1, 1, 1}}, true},     // big pad, K past 128
        {{2, 64, 24, {5, 6, 7}, {3, 2, 3}, {1, 0, 2}, {2, 1, 1}, {1, 1, 1}}, true},       // 3D
        {{3, 128, 64, {1, 1, 50}, {1, 1, 5}, {0, 0, 2}, {1, 1, 2}, {1, 1, 1}}, true},     // 1D
        {{2, 64, 264, {1, 6, 6}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, true},      // K across 256-wide tiles
        {{2, 32, 64, {1, 10, 9}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}, false},     // 32 channels
        {{2, 64, 64, {1, 1, 16}, {1, 1, 3}, {0, 1, 1}, {1, 3, 1}, {1, 1, 1}}, true},      // a padded axis of ones
    };
    uint32_t seed = 5000;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const auto& [c, implicit] : shapes) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str());
            CHECK((conv_kernel(gpu, L, "update").rfind(wgrad, 0) == 0) == implicit);
            const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), E = pair(gpu, cpu, L.output_shape(), dt, ++seed),
                       G = pair(gpu, cpu, L.filter_shape(), dt, ++seed);
            check_update_alpha_beta(gpu, cpu, L, I, E, G);
            // The deconvolution of the same geometry: its update is this one with I and E's roles.
            if (!round_trips(L)) continue;
            const ConvLayer D = deconv_layer(dt, c.N, c.C, c.K, L.output, c.filter, c.pad, c.stride, c.dilation);
            CHECK((conv_kernel(gpu, D, "update").rfind(wgrad, 0) == 0) == implicit);
            CHECK(agree(gpu, cpu, D.filter_shape(), dt,
                        [&](Tensor& o, Side side) { update_conv(D, E.*side, I.*side, o); }) == 0);
        }
    // Large enough for many slices, and for one (every tile a wave of its own): against im2col and
    // the GEMM on the GPU.
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const Case& c : {Case{64, 64, 64, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}},
                              Case{8, 512, 512, {1, 7, 7}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}}}) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str() << ": " << conv_kernel(gpu, L, "update"));
            CHECK(conv_kernel(gpu, L, "update").rfind(wgrad, 0) == 0);
            const Pair I = pair(gpu, gpu, L.input_shape(), dt, ++seed), E = pair(gpu, gpu, L.output_shape(), dt, ++seed);
            Tensor Gg = gpu.empty(L.filter_shape(), dt), Gi = gpu.empty(L.filter_shape(), dt),
                   Gm = gpu.empty(L.filter_shape(), DType::Float32);
            update_conv(L, I.gpu, E.gpu, Gg);
            setenv("KILN_CONV_KERNEL", "im2col", 1);
            CHECK(conv_kernel(gpu, L, "update") == "im2col+gemm");
            update_conv(L, I.gpu, E.gpu, Gi);
            update_conv(L, I.abs, E.abs, Gm);
            unsetenv("KILN_CONV_KERNEL");
            CHECK(count_off(Gg, Gi, Gm, dt) == 0);
        }
}

// The weight gradient's balanced split (KILN_CONV_KERNEL=balanced) against its slices (=sliced)
// and im2col with the GEMM, on the GPU: a tile shared by many runs (5 tiles over 132 runs, 128
// wide), runs across two tiles (72 tiles of 7 k-tiles), runs that finish two or three tiles
// (288 tiles of 2 k-tiles: the producer waits for each epilogue), K's tail in a 256-wide tile
// past a part m-tile, and fewer k-tiles than SMs (a run each); the balanced split sums the
// same bits on every call.
TEST_CASE("gpu conv: the weight gradient's balanced split agrees with the slices and im2col, deterministically") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"});
    if (!sm90(gpu)) return;
    uint32_t seed = 7000;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const Case& c : {Case{32, 64, 128, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}},
                              Case{8, 512, 512, {1, 7, 7}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}},
                              Case{2, 1024, 1024, {1, 7, 7}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}},
                              Case{16, 64, 192, {1, 15, 15}, {1, 5, 5}, {0, 2, 2}, {1, 1, 1}, {1, 1, 1}},
                              Case{4, 128, 256, {1, 9, 9}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}, {1, 1, 1}}}) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str());
            const Pair I = pair(gpu, gpu, L.input_shape(), dt, ++seed), E = pair(gpu, gpu, L.output_shape(), dt, ++seed);
            Tensor Gb = gpu.empty(L.filter_shape(), dt), Gb2 = gpu.empty(L.filter_shape(), dt),
                   Gs = gpu.empty(L.filter_shape(), dt), Gi = gpu.empty(L.filter_shape(), dt),
                   Gm = gpu.empty(L.filter_shape(), DType::Float32);
            {
                const test::ScopedEnv forced("KILN_CONV_KERNEL", "balanced");
                const std::string k = conv_kernel(gpu, L, "update");
                INFO(k);
                CHECK(k.find(" balanced over ") != std::string::npos);
                update_conv(L, I.gpu, E.gpu, Gb);
                update_conv(L, I.gpu, E.gpu, Gb2);
            }
            {
                const test::ScopedEnv forced("KILN_CONV_KERNEL", "sliced");
                CHECK(conv_kernel(gpu, L, "update").find("balanced") == std::string::npos);
                update_conv(L, I.gpu, E.gpu, Gs);
            }
            {
                const test::ScopedEnv forced("KILN_CONV_KERNEL", "im2col");
                update_conv(L, I.gpu, E.gpu, Gi);
                update_conv(L, I.abs, E.abs, Gm);
            }
            CHECK(count_off(Gb, Gi, Gm, dt) == 0);
            CHECK(count_off(Gs, Gi, Gm, dt) == 0);
            CHECK(Gb.to_vector<float>() == Gb2.to_vector<float>());
        }
}

// Named outputs of the convolutions are counted as the GEMM or implicit-GEMM epilogue stores
// them where that epilogue writes the output (the counts equal hist() of it), and after the call
// elsewhere (brelu's epilogue): fprop on both kernels (the one-tile kernel and the walk, the
// 16-bit register epilogue and the general one), bprop, update (unsplit, and split: the
// slices' reduction counts).
TEST_CASE("gpu conv: named outputs are counted in the epilogue's store path") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    set_hist_buffers(ctx, 64, -40);
    std::mt19937 g(4);
    auto random = [&](Shape s, DType dt) { return test::random_normal(ctx, g, s, dt); };
    // in_store: 1 counted as stored by the implicit kernels, 0 after the call, -1 not asked
    auto check_named = [&](Tensor& out, int in_store, const std::function<void()>& call) {
        test::check_named_counts(ctx, out, 64, call, [&] {
            if (in_store >= 0) CHECK(gemm::last_conv_counted() == (in_store == 1));
        });
    };
    const bool implicit = sm90(ctx);
    for (DType dt : {DType::Float16, DType::Float32}) {   // the implicit-GEMM kernel (sm_90, 16-bit), im2col + GEMM
        INFO(dtype_name(dt));
        const ConvLayer L = conv_layer(dt, 8, 64, 128, {1, 20, 20}, {1, 3, 3}, {0, 1, 1});
        Tensor I = random(L.input_shape(), dt), F = random(L.filter_shape(), dt), E = random(L.output_shape(), dt);
        Tensor O = ctx.empty(L.output_shape(), dt), gI = ctx.empty(L.input_shape(), dt), gF = ctx.empty(L.filter_shape(), dt);
        const int on_kernel = implicit && dt != DType::Float32 ? 1 : -1;
        check_named(O, on_kernel, [&] { fprop_conv(L, I, F, O); });
        check_named(gI, on_kernel, [&] { bprop_conv(L, F, E, gI); });
        check_named(gF, on_kernel, [&] { update_conv(L, I, E, gF); });
        ConvOptions brelu;
        brelu.brelu = true;
        brelu.X = I;
        check_named(gI, -1, [&] { bprop_conv(L, F, E, gI, brelu); });
    }
    if (!implicit) return;
    // More tiles than SMs: the one-tile kernel and the walk, with a bias and ReLU, into rows of
    // 16 bytes (the register epilogue; 96 channels: the 96-wide tile, whose lanes past two rows
    // of 12 chunks idle); rows of 68 channels take the general epilogue (on the 96-wide tile).
    const DType dt = DType::BFloat16;
    for (int64_t K : {128, 96, 68}) {
        const ConvLayer L = conv_layer(dt, 48, 64, K, {1, 28, 28}, {1, 3, 3}, {0, 1, 1});
        INFO(L.str());
        Tensor I = random(L.input_shape(), dt), F = random(L.filter_shape(), dt);
        ConvOptions o;
        o.relu = true, o.bias = random({K}, DType::Float32);
        Tensor O = ctx.empty(L.output_shape(), dt);
        for (const char* kernel : {"tile", "walk"}) {
            if (K != 128 && std::string(kernel) == "walk") continue;   // (no 96-wide walk; rows of 16 bytes only)
            INFO(kernel);
            const test::ScopedEnv forced("KILN_CONV_KERNEL", kernel);
            check_named(O, 1, [&] { fprop_conv(L, I, F, O, o); });
        }
    }
    // The weight gradient split into slices (37632 positions, few tiles), and not (288 tiles of
    // 7 k-tiles); each also balanced (its runs' finishing tiles counted as stored).
    for (const ConvLayer& L : {conv_layer(dt, 48, 64, 128, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}),
                               conv_layer(dt, 8, 512, 1024, {1, 7, 7}, {1, 3, 3}, {0, 1, 1})}) {
        const std::string kernel = gemm::conv_wgrad_kernel(ctx, L);
        INFO(L.str() << " " << kernel);
        CHECK((kernel.find(" split ") != std::string::npos) == (L.K == 128));
        Tensor I = random(L.input_shape(), dt), E = random(L.output_shape(), dt), gF = ctx.empty(L.filter_shape(), dt);
        check_named(gF, 1, [&] { update_conv(L, I, E, gF); });
        const test::ScopedEnv forced("KILN_CONV_KERNEL", "balanced");
        CHECK(gemm::conv_wgrad_kernel(ctx, L).find(" balanced over ") != std::string::npos);
        check_named(gF, 1, [&] { update_conv(L, I, E, gF); });
    }
}

// bsum where the implicit kernel's 16-bit register epilogue stores (16-bit output, no beta): each
// row of tiles' column sums of the values as stored, added up after the kernel, on the one-tile
// kernel 64, 128 and 256 wide (gathered patches and by TMA) and on the walk, with rows and
// channels past the last tile. Against the sums of the output as stored (the JIT reduction the
// other paths run), the same bits in a second run; float32 output and beta keep the reduction.
TEST_CASE("gpu conv: bsum added up in the implicit kernel's store path, per channel, deterministically") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    if (!sm90(ctx)) return;
    std::mt19937 g(5);
    auto random = [&](Shape s, DType dt) { return test::random_normal(ctx, g, s, dt); };
    struct Case {
        ConvLayer L;
        const char* kernel;   // KILN_CONV_KERNEL, or "" for the model's choice
        const char* width;    // the tile the kernel name holds
    };
    for (DType dt : {DType::Float16, DType::BFloat16}) {
        const std::vector<Case> cases = {
            {conv_layer(dt, 3, 64, 40, {1, 13, 11}, {1, 3, 3}, {0, 1, 1}), "", "_64_"},      // 429 rows, 40 of 64 channels
            {conv_layer(dt, 3, 24, 200, {1, 13, 11}, {1, 3, 3}, {0, 1, 1}), "", "kiln_"},    // gathered patches
            {conv_layer(dt, 47, 64, 72, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}), "tile", "_96_"},    // 288 rows of tiles, the last partly full
            {conv_layer(dt, 47, 64, 128, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}), "tile", "_128_"},
            {conv_layer(dt, 47, 64, 72, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}), "walk", "_walk_"},
            // The walk's running sums: 64 wide; 5 columns of tiles, which blocks leave and come
            // back to on any SM count not a multiple of 5, the last row of tiles partly full.
            {conv_layer(dt, 47, 64, 40, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}), "walk", "_64_s6"},
            // The 256-wide walk on the persistent kernel: 3 columns of tiles, the last partly full.
            {conv_layer(dt, 23, 64, 520, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}), "walk", "_pers_"},
            {conv_layer(dt, 31, 256, 504, {1, 64, 63}, {1, 3, 3}, {0, 1, 1}), "", "_256_"},        // 977, the last half full

        };
        for (const Case& c : cases) {
            const ConvLayer& L = c.L;
            std::optional<test::ScopedEnv> forced;
            if (*c.kernel) forced.emplace("KILN_CONV_KERNEL", c.kernel);
            INFO(L.str() << " " << gemm::conv_fprop_kernel(ctx, L));
            CHECK(gemm::conv_fprop_kernel(ctx, L).find(c.width) != std::string::npos);
            Tensor I = random(L.input_shape(), dt), F = random(L.filter_shape(), dt);
            for (DType out : {dt, DType::Float32})
                for (bool beta : {false, true}) {
                    INFO("output " << dtype_name(out) << (beta ? ", beta" : ""));
                    Tensor O = ctx.eval(cast(random(L.output_shape(), dt).expr(), out));
                    ConvOptions o;
                    o.relu = true, o.bias = random({L.K}, DType::Float32);
                    if (beta) o.beta = 0.5;
                    Tensor bs = ctx.empty({L.K}, DType::Float32), again = ctx.empty({L.K}, DType::Float32);
                    o.bsum = bs;
                    const Tensor before = ctx.eval(O.expr());
                    fprop_conv(L, I, F, O, o);
                    CHECK(gemm::last_conv_summed() == (out == dt && !beta));
                    CHECK(sums_off(ctx, O, bs, L.K) == 0);
                    const std::vector<float> got = bs.to_vector<float>();
                    // The same call again from the same output: the same sums, bit for bit.
                    Tensor O2 = ctx.eval(before.expr());
                    o.bsum = again;
                    fprop_conv(L, I, F, O2, o);
                    CHECK(again.to_vector<float>() == got);
                    // Into a strided bsum (every other float of a buffer): the output's sums.
                    Tensor wide = ctx.empty({2 * L.K}, DType::Float32);
                    Tensor O3 = ctx.eval(before.expr());
                    o.bsum = wide.slice({Slice::range(0, 2 * L.K, 2)});
                    fprop_conv(L, I, F, O3, o);
                    CHECK(gemm::last_conv_summed() == (out == dt && !beta));
                    CHECK(sums_off(ctx, O3, *o.bsum, L.K) == 0);
                    // bsum beside the bias in one buffer: the sums land next to what the kernel
                    // reads, the bias untouched.
                    Tensor shared = ctx.empty({2 * L.K}, DType::Float32);
                    Tensor bias2 = shared.slice({Slice::range(0, L.K)});
                    bias2.assign(o.bias->expr());
                    const std::vector<float> bias_values = o.bias->to_vector<float>();
                    Tensor O4 = ctx.eval(before.expr());
                    o.bias = bias2;
                    o.bsum = shared.slice({Slice::range(L.K, 2 * L.K)});
                    fprop_conv(L, I, F, O4, o);
                    CHECK(gemm::last_conv_summed() == (out == dt && !beta));
                    CHECK(sums_off(ctx, O4, *o.bsum, L.K) == 0);
                    CHECK(bias2.to_vector<float>() == bias_values);
                }
        }
    }
}

// fprop of L with a bias and ReLU on the path kiln takes (as the environment has it) against one
// tile a block (KILN_CONV_KERNEL=tile), im2col and the GEMM, to the CPU's magnitudes; then with a
// bsum: the same output, and channel sums equal to the output's (rows past M left out).
void check_fprop_beside_tile(Context& gpu, const ConvLayer& L, uint32_t& seed) {
    const DType dt = L.dtype;
    const Pair I = pair(gpu, gpu, L.input_shape(), dt, ++seed), F = pair(gpu, gpu, L.filter_shape(), dt, ++seed),
               B = pair(gpu, gpu, {L.K}, DType::Float32, ++seed);
    ConvOptions o;
    o.relu = true, o.bias = B.gpu;
    Tensor Ow = gpu.empty(L.output_shape(), dt), Ot = gpu.empty(L.output_shape(), dt),
           Oi = gpu.empty(L.output_shape(), dt), Om = gpu.empty(L.output_shape(), DType::Float32);
    fprop_conv(L, I.gpu, F.gpu, Ow, o);
    {
        const test::ScopedEnv tile("KILN_CONV_KERNEL", "tile");
        fprop_conv(L, I.gpu, F.gpu, Ot, o);
    }
    {
        const test::ScopedEnv im2col("KILN_CONV_KERNEL", "im2col");
        fprop_conv(L, I.gpu, F.gpu, Oi, o);
    }
    ConvOptions m;
    m.bias = B.abs;
    fprop_conv(L, I.abs, F.abs, Om, m);
    CHECK(count_off(Ow, Ot, Om, dt) == 0);
    CHECK(count_off(Ow, Oi, Om, dt) == 0);
    Tensor Os = gpu.empty(L.output_shape(), dt), sums = gpu.empty({L.K}, DType::Float32);
    ConvOptions ob = o;
    ob.bsum = sums;
    fprop_conv(L, I.gpu, F.gpu, Os, ob);
    CHECK(gemm::last_conv_summed());
    CHECK(count_off(Os, Ow, Om, dt) == 0);
    CHECK(sums_off(gpu, Os, sums, L.K) == 0);
}

// The 256-wide walk (KILN_CONV_KERNEL=walk over more than 128 output channels): on the GEMM's
// persistent kernel into plain rows, by TMA, with a bias and ReLU and a partial last column of
// tiles (296 channels), against the one-tile kernel, im2col and the GEMM; a strided bprop's
// phases 256 wide into grad_I's view on the walk's own kernel (a bulk copy a row), with alpha
// and beta, against the CPU; and a bsum the persistent kernel adds as it stores, rows past M
// (47 x 28 x 28 is not a multiple of 128) left out.
TEST_CASE("gpu conv: the 256-wide walk stores plain rows and a phase's grouped rows, and adds a bsum") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (!sm90(gpu)) return;
    uint32_t seed = 7700;
    for (DType dt : {DType::Float16, DType::BFloat16}) {
        const ConvLayer L = conv_layer(dt, 47, 64, 296, {1, 28, 28}, {1, 3, 3}, {0, 1, 1});
        INFO(L.str());
        const test::ScopedEnv walk("KILN_CONV_KERNEL", "walk");
        CHECK(gemm::conv_fprop_kernel(gpu, L).find("kiln_conv_fprop_pers_") == 0);
        CHECK(gemm::conv_fprop_kernel(gpu, L).find("_256_s4") != std::string::npos);
        CHECK(conv_kernel(gpu, L, "fprop+bsum") == "implicit-gemm " + gemm::conv_fprop_kernel(gpu, L, true));
        CHECK(gemm::conv_fprop_kernel(gpu, L, true).find("_256_s4_cols") != std::string::npos);
        check_fprop_beside_tile(gpu, L, seed);   // (the bsum: the persistent kernel adds it as it stores)
    }
    // (An odd image: phases of 29 and 28 positions a row, not one launch: each its walk.)
    for (DType dt : {DType::Float16, DType::BFloat16})
        check_walked_phases(gpu, cpu, conv_layer(dt, 24, 256, 64, {1, 57, 57}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}), "_256_s3",
                            seed);
}

// The 192-wide walk, by the cost model for 192 output channels and where the last column of
// tiles is partial (184 and 376: 192 + 184), with a bias and ReLU, against the one-tile kernel
// (KILN_CONV_KERNEL=tile), im2col and the GEMM; its channel sums (tested at run time in its plain
// entry) against the output's, rows past M (47 x 28 x 28 is not a multiple of 128) left out; and
// a strided gradient's phases of an odd image (each its own launch) 192 wide into grad_I's view
// (grouped rows, a bulk copy a row), against the CPU.
TEST_CASE("gpu conv: the 192-wide walk") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (!sm90(gpu)) return;
    uint32_t seed = 7900;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (int64_t K : {192, 184, 376}) {
            const ConvLayer L = conv_layer(dt, 47, 64, K, {1, 28, 28}, {1, 3, 3}, {0, 1, 1});
            INFO(L.str());
            CHECK(gemm::conv_fprop_kernel(gpu, L).find("kiln_conv_fprop_walk_") == 0);
            CHECK(gemm::conv_fprop_kernel(gpu, L).find("_192_s4 ") != std::string::npos);
            CHECK(gemm::conv_fprop_kernel(gpu, L, true) == gemm::conv_fprop_kernel(gpu, L));
            check_fprop_beside_tile(gpu, L, seed);
        }
    // (Each phase: 512 channels into 192 over 147 or more row tiles, the 4-tap phase's 32
    // k-tiles priced lowest 192 wide.)
    for (DType dt : {DType::Float16, DType::BFloat16})
        check_walked_phases(gpu, cpu, conv_layer(dt, 24, 192, 512, {1, 57, 57}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}),
                            "_192_s4", seed, "by phase kiln_conv_fprop_walk_", nullptr);
}

// The transposed walk (64 or 128 channels x 256 positions a tile, conv_walk_t.cuh): kiln's
// choice for at most 64 output channels over a wave of its tiles, forced by KILN_CONV_KERNEL=walkt
// elsewhere; 64, 56 and 40 channels (rows of C and of the filter past them) on one consumer, 128
// and 96 on two, 3x3 and 1x1, C 64 and 128, positions not a multiple of 256 (47 x 28 x 28), 3D;
// plain, with alpha, a bias and ReLU
// or its slope, against the 64-wide walk and one tile a block (KILN_CONV_KERNEL=walk, =tile),
// im2col and the CPU's magnitudes, every position written (the output first filled with NaN);
// its channel sums against the output's, and the same bits again; a stride-1 gradient into 64
// channels on it.
TEST_CASE("gpu conv: the transposed walk") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (!sm90(gpu)) return;
    uint32_t seed = 8100;
    struct Case {
        int64_t N, C, K, D, HW, RS;
    };
    const Case cases[] = {{47, 64, 64, 1, 28, 3},  {47, 128, 56, 1, 28, 1}, {47, 64, 40, 1, 28, 3},
                          {3, 64, 64, 6, 20, 3},   {47, 64, 128, 1, 28, 3}, {47, 128, 96, 1, 28, 1}};
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const Case& k : cases) {
            const int64_t pad = k.RS / 2, pd = k.D > 1 ? pad : 0;
            const ConvLayer L = conv_layer(dt, k.N, k.C, k.K, {k.D, k.HW, k.HW}, {k.D > 1 ? k.RS : 1, k.RS, k.RS}, {pd, pad, pad});
            INFO(L.str());
            const bool chosen = gemm::conv_fprop_kernel(gpu, L).find("kiln_conv_fprop_walkt_") == 0;
            // (at most 64 channels wherever it suits; over 64 where the model prefers it too)
            const bool suits = gemm::transposed_suits(L, cuda::cuda_backend(gpu).info().multiprocessors);
            CHECK((k.K <= 64 ? chosen == suits : !chosen || suits));
            const test::ScopedEnv forced("KILN_CONV_KERNEL", "walkt");
            CHECK(gemm::conv_fprop_kernel(gpu, L).find("kiln_conv_fprop_walkt_") == 0);
            CHECK(gemm::conv_fprop_kernel(gpu, L, true) == gemm::conv_fprop_kernel(gpu, L));
            const Pair I = pair(gpu, gpu, L.input_shape(), dt, ++seed), F = pair(gpu, gpu, L.filter_shape(), dt, ++seed),
                       B = pair(gpu, gpu, {k.K}, DType::Float32, ++seed);
            for (int variant = 0; variant < 3; ++variant) {
                INFO("variant " << variant);
                ConvOptions o;
                if (variant == 1) o.relu = true, o.bias = B.gpu;
                if (variant == 2) o.alpha = 0.75, o.relu = true, o.slope = 0.125, o.bias = B.gpu;
                Tensor Ot = gpu.empty(L.output_shape(), dt), Ow = gpu.empty(L.output_shape(), dt),
                       Oi = gpu.empty(L.output_shape(), dt), Om = gpu.empty(L.output_shape(), DType::Float32);
                Ot.assign(Expr(std::nan("")));
                fprop_conv(L, I.gpu, F.gpu, Ot, o);
                for (const char* other : {"walk", "tile", "im2col"}) {
                    const test::ScopedEnv e("KILN_CONV_KERNEL", other);
                    CHECK(gemm::conv_fprop_kernel(gpu, L).find("walkt") == std::string::npos);
                    fprop_conv(L, I.gpu, F.gpu, std::string(other) == "im2col" ? Oi : Ow, o);
                }
                ConvOptions m;
                m.alpha = o.alpha;
                if (o.bias) m.bias = B.abs;
                fprop_conv(L, I.abs, F.abs, Om, m);
                CHECK(count_off(Ot, Ow, Om, dt) == 0);
                CHECK(count_off(Ot, Oi, Om, dt) == 0);
            }
            ConvOptions ob;
            ob.relu = true, ob.bias = B.gpu;
            Tensor Os = gpu.empty(L.output_shape(), dt), sums = gpu.empty({k.K}, DType::Float32),
                   again = gpu.empty({k.K}, DType::Float32);
            ob.bsum = sums;
            fprop_conv(L, I.gpu, F.gpu, Os, ob);
            CHECK(gemm::last_conv_summed());
            CHECK(sums_off(gpu, Os, sums, k.K) == 0);
            ob.bsum = again;
            fprop_conv(L, I.gpu, F.gpu, Os, ob);
            CHECK(again.to_vector<float>() == sums.to_vector<float>());
        }
    // A stride-1 gradient into 64 channels: the convolution of E on the transposed walk.
    for (DType dt : {DType::Float16, DType::BFloat16}) {
        const ConvLayer L = conv_layer(dt, 40, 64, 128, {1, 28, 28}, {1, 3, 3}, {0, 1, 1});
        INFO(L.str());
        const test::ScopedEnv forced("KILN_CONV_KERNEL", "walkt");
        CHECK(conv_kernel(gpu, L, "bprop").find("walkt") != std::string::npos);
        const Pair F = pair(gpu, cpu, L.filter_shape(), dt, ++seed), E = pair(gpu, cpu, L.output_shape(), dt, ++seed);
        CHECK(agree(gpu, cpu, L.input_shape(), dt, [&](Tensor& o, Side side) { bprop_conv(L, F.*side, E.*side, o); }) == 0);
    }
}

// A strided gradient's phases in one launch (the phased walk, conv_dgrad_phased): against the
// CPU, plain and with alpha, ReLU and its slope, every position written (the output first filled
// with NaN). Phases of equal padding (3x3, stride 2, pad 1; 128 and 256 wide), of paddings 1 and
// 0 (3x3 without padding, 5x5 with 2: windows moved by the offsets), the channels not a multiple
// of the tile (192 in 128-wide tiles), 3D (8 phases), stride 2 along H alone (2 phases, W's whole
// filter); an odd image's phases (29 and 28 positions a row) each their own launch.
TEST_CASE("gpu conv: a strided gradient's phases in one launch") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"});
    Context cpu;
    if (!sm90(gpu)) return;
    uint32_t seed = 9100;
    struct Want {
        ConvLayer L;
        const char* path;
    };
    const char* one = "implicit-gemm, phases in one launch, kiln_conv_dgrad_phases_";
    const Want wants[] = {
        {conv_layer(DType::Float16, 16, 128, 64, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}), "_f16_128_s5"},
        {conv_layer(DType::BFloat16, 48, 256, 256, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}), "_bf16_256_s3"},
        {conv_layer(DType::Float16, 8, 128, 64, {1, 30, 30}, {1, 3, 3}, {0, 0, 0}, {1, 2, 2}), one},
        {conv_layer(DType::BFloat16, 8, 192, 64, {1, 28, 28}, {1, 5, 5}, {0, 2, 2}, {1, 2, 2}), one},
        {conv_layer(DType::Float16, 2, 128, 64, {8, 16, 16}, {3, 3, 3}, {1, 1, 1}, {2, 2, 2}), one},
        {conv_layer(DType::BFloat16, 8, 128, 64, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}, {1, 2, 1}), one},
        {conv_layer(DType::Float16, 8, 128, 64, {1, 29, 29}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}), "by phase kiln_conv_"},
    };
    for (const Want& w : wants) {
        const ConvLayer& L = w.L;
        const std::string path = conv_kernel(gpu, L, "bprop");
        INFO(L.str() << ": " << path);
        CHECK(path.find(w.path) != std::string::npos);
        if (w.path != one && std::string(w.path).rfind("by phase", 0) != 0) CHECK(path.find(one) != std::string::npos);
        const DType dt = L.dtype;
        const Pair F = pair(gpu, cpu, L.filter_shape(), dt, ++seed), E = pair(gpu, cpu, L.output_shape(), dt, ++seed);
        CHECK(agree(gpu, cpu, L.input_shape(), dt, [&](Tensor& o, Side side) {
                  if (side == &Pair::gpu) o.assign(Expr(std::nan("")));
                  bprop_conv(L, F.*side, E.*side, o);
              }) == 0);
        CHECK(agree(gpu, cpu, L.input_shape(), dt, [&](Tensor& o, Side side) {
                  ConvOptions r;
                  r.alpha = 0.5, r.relu = true, r.slope = side == &Pair::abs ? 0.0 : 0.125;
                  bprop_conv(L, F.*side, E.*side, o, r);
              }) == 0);
    }
}

// A strided gradient's phases each start beside the one before (kBeforeSibling, kAfterSibling):
// the gradient is bit for bit the one of phases run one after another (KILN_PDL=0), over an
// output first filled with NaN, so that a position no phase wrote shows; and a reduction
// launched right after the call sees every phase's values (its sum bit for bit the sum of the
// gradient made one phase after another). 2D stride 2 (phases of 1, 2, 2 and 4 taps, walking
// and, KILN_CONV_KERNEL=tile, one tile a block: 128 channels out otherwise take one launch for
// all phases), 3D stride 2 (8 phases), and stride 3 over a 2-tap filter (phases without taps,
// zeros).
TEST_CASE("gpu conv: a strided gradient's phases started beside one another equal them one after another") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"});
    if (!sm90(gpu)) return;
    uint32_t seed = 8800;
    const std::pair<ConvLayer, const char*> layers[] = {
        {conv_layer(DType::Float16, 64, 128, 128, {1, 56, 56}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}), "tile"},
        {conv_layer(DType::BFloat16, 8, 64, 192, {1, 30, 30}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}), nullptr},
        {conv_layer(DType::Float16, 4, 64, 64, {8, 16, 16}, {3, 3, 3}, {1, 1, 1}, {2, 2, 2}), nullptr},
        {conv_layer(DType::BFloat16, 8, 64, 64, {1, 30, 30}, {1, 2, 2}, {0, 0, 0}, {1, 3, 3}), nullptr},
    };
    for (const auto& [L, forced] : layers) {
        INFO(L.str());
        std::optional<test::ScopedEnv> kernel;
        if (forced) kernel.emplace("KILN_CONV_KERNEL", forced);
        CHECK(conv_kernel(gpu, L, "bprop").find("by phase") != std::string::npos);
        const Pair F = pair(gpu, gpu, L.filter_shape(), L.dtype, ++seed), E = pair(gpu, gpu, L.output_shape(), L.dtype, ++seed);
        Tensor ref = gpu.empty(L.input_shape(), L.dtype);
        ref.assign(Expr(std::nan("")));
        {
            const test::ScopedEnv serial("KILN_PDL", "0");
            bprop_conv(L, F.gpu, E.gpu, ref);
        }
        const std::vector<float> want = ref.to_vector<float>();
        const float want_sum = gpu.eval(sum(cast(ref.expr(), DType::Float32))).to_vector<float>()[0];
        CHECK(std::none_of(want.begin(), want.end(), [](float v) { return std::isnan(v); }));
        for (int run = 0; run < 4; ++run) {
            Tensor got = gpu.empty(L.input_shape(), L.dtype);
            got.assign(Expr(std::nan("")));
            bprop_conv(L, F.gpu, E.gpu, got);
            const Tensor total = gpu.eval(sum(cast(got.expr(), DType::Float32)));
            CHECK(total.to_vector<float>()[0] == want_sum);
            CHECK(got.to_vector<float>() == want);
        }
    }
}

// The taps a gradient with respect to the input multiplies, K and C exchanged, by the precompiled
// transpose: bit for bit the JIT copy of the same slice, whole 64 x 64 blocks and partial ones,
// the filter flipped (stride 1) and a phase of stride 2, 2D and 3D.
TEST_CASE("gpu conv: a gradient's filter taps by the precompiled transpose equal the JIT copy") {
    REQUIRE_GPU();
    Context ctx(ContextOptions{"cuda"});
    std::mt19937 g(11);
    struct Case {
        Shape F;
        Dims3 taps, base, step;
    };
    for (const Case& c : {Case{{72, 1, 3, 3, 200}, {1, 3, 3}, {0, 2, 2}, {-1, -1, -1}},
                          Case{{136, 1, 5, 5, 96}, {1, 2, 3}, {0, 3, 4}, {-1, -2, -2}},
                          Case{{16, 3, 3, 3, 24}, {2, 1, 2}, {2, 1, 2}, {-2, -2, -2}},
                          Case{{256, 1, 3, 3, 64}, {1, 1, 1}, {0, 1, 1}, {-1, -2, -2}}})
        for (DType dt : {DType::Float16, DType::BFloat16}) {
            INFO(shape_str(c.F) << " taps " << c.taps[0] << "x" << c.taps[1] << "x" << c.taps[2] << " from " << c.base[0]
                                << "," << c.base[1] << "," << c.base[2] << " " << dtype_name(dt));
            const Tensor F = test::random_normal(ctx, g, c.F, dt);
            auto along = [&](int a) {
                const int64_t stop = c.base[a] + c.step[a] * c.taps[a];
                return Slice::range(c.base[a], stop >= 0 ? stop : Slice::kNone, c.step[a]);
            };
            const Tensor want = ctx.eval(F.slice({Slice::all(), along(0), along(1), along(2), Slice::all()})
                                             .transpose({4, 1, 2, 3, 0})
                                             .expr());
            const Tensor got = gemm::filter_taps_cuda(F, c.taps, c.base, c.step);
            CHECK(got.shape() == want.shape());
            CHECK(got.dtype() == dt);
            CHECK(ctx.eval(cast(got.expr(), DType::Float32)).to_vector<float>() ==
                  ctx.eval(cast(want.expr(), DType::Float32)).to_vector<float>());
        }
    // Several sets in one call: the four phases of a stride-2 3x3 filter (one launch), and 19 sets
    // (two launches of at most kMaxTapSets), each equal to its own call; the four side by side, each
    // a view of one buffer's channel rows (every set's taps in a row).
    const Tensor F = test::random_normal(ctx, g, {40, 1, 3, 3, 24}, DType::BFloat16);
    std::vector<gemm::TapSet> phases;
    for (int64_t ph = 0; ph < 2; ++ph)
        for (int64_t pw = 0; pw < 2; ++pw) {
            // (pad 1: phase phi's first tap (phi + 1) % 2, its taps 1 or 2, the last first)
            const int64_t th = ph == 0 ? 1 : 2, tw = pw == 0 ? 1 : 2;
            phases.push_back({{1, th, tw}, {0, (ph + 1) % 2 + 2 * (th - 1), (pw + 1) % 2 + 2 * (tw - 1)}, {-1, -2, -2}});
        }
    std::vector<gemm::TapSet> many;
    for (int i = 0; i < 19; ++i) many.push_back(phases[size_t(i) % phases.size()]);
    for (const std::vector<gemm::TapSet>* sets : {&phases, &many}) {
        INFO(sets->size() << " sets");
        const std::vector<Tensor> got = gemm::filter_taps_cuda(F, *sets);
        REQUIRE(got.size() == sets->size());
        for (size_t i = 0; i < got.size(); ++i) {
            const gemm::TapSet& t = (*sets)[i];
            const Tensor one = gemm::filter_taps_cuda(F, t.taps, t.base, t.step);
            CHECK(got[i].shape() == one.shape());
            CHECK(ctx.eval(cast(got[i].expr(), DType::Float32)).to_vector<float>() ==
                  ctx.eval(cast(one.expr(), DType::Float32)).to_vector<float>());
        }
    }
    const std::vector<Tensor> side = gemm::filter_taps_cuda(F, phases, true);
    REQUIRE(side.size() == phases.size());
    int64_t first = 0;
    for (size_t i = 0; i < side.size(); ++i) {
        const gemm::TapSet& t = phases[i];
        const Tensor one = gemm::filter_taps_cuda(F, t.taps, t.base, t.step);
        CHECK(side[i].shape() == one.shape());
        CHECK(side[i].strides()[0] == 9 * 40);   // (1 + 2 + 2 + 4 taps of 40 in a channel's row)
        CHECK(side[i].view().storage == side[0].view().storage);
        CHECK(side[i].view().offset == side[0].view().offset + first * 40);
        first += t.taps[0] * t.taps[1] * t.taps[2];
        CHECK(ctx.eval(cast(side[i].expr(), DType::Float32)).to_vector<float>() ==
              ctx.eval(cast(one.expr(), DType::Float32)).to_vector<float>());
    }
}

// KILN_AUTOTUNE=1: the first fprop and update of a layer time the implicit kernels' tile widths
// (and the fprop walk, the update's splits), keep the fastest for the process and in the disk
// cache; the results agree with im2col and the GEMM on the GPU; with the process's choices
// forgotten, a new context takes the same ones from the disk cache without storing again; the
// layer's kernel names say they were tuned.
TEST_CASE("gpu conv: KILN_AUTOTUNE=1 times the fprop tiles and the update's splits, keeps correct results and stores the choices") {
    REQUIRE_GPU();
    kiln::test::ScopedCacheDir dir;
    gemm::conv_autotune_forget();
    uint32_t seed = 7000;
    std::string first_fprop, first_update;
    for (int pass = 0; pass < 2; ++pass) {
        Context gpu(ContextOptions{"cuda"});
        if (!sm90(gpu)) return;
        INFO("pass " << pass);
        gemm::conv_autotune_forget();
        const Case c{64, 64, 128, {1, 28, 28}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}};
        const DType dt = DType::Float16;
        const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
        const Pair I = pair(gpu, gpu, L.input_shape(), dt, ++seed), F = pair(gpu, gpu, L.filter_shape(), dt, ++seed),
                   E = pair(gpu, gpu, L.output_shape(), dt, ++seed);
        Tensor O = gpu.empty(L.output_shape(), dt), Oi = gpu.empty(L.output_shape(), dt),
               Om = gpu.empty(L.output_shape(), DType::Float32);
        Tensor G = gpu.empty(L.filter_shape(), dt), Gi = gpu.empty(L.filter_shape(), dt),
               Gm = gpu.empty(L.filter_shape(), DType::Float32);
        std::string fk, uk;
        {
            kiln::test::ScopedEnv tune("KILN_AUTOTUNE", "1"), choice("KILN_CONV_KERNEL", nullptr);
            fprop_conv(L, I.gpu, F.gpu, O);
            update_conv(L, I.gpu, E.gpu, G);
            fk = gemm::conv_fprop_kernel(gpu, L), uk = conv_kernel(gpu, L, "update");
        }
        INFO(fk << "; " << uk);
        CHECK(fk.rfind("kiln_conv_fprop_", 0) == 0);   // one tile a block or the walk
        CHECK(fk.find("(tuned)") != std::string::npos);
        CHECK(uk.find("kiln_conv_wgrad_f16_") != std::string::npos);
        CHECK(uk.find("(tuned)") != std::string::npos);
        CHECK(kiln::test::files_containing(dir.path(), "conv-autotune|") == 2);   // stored once each
        if (pass == 0) first_fprop = fk, first_update = uk;
        else CHECK((fk == first_fprop && uk == first_update));   // read back from the disk cache
        {
            kiln::test::ScopedEnv tune("KILN_AUTOTUNE", nullptr), choice("KILN_CONV_KERNEL", "im2col");
            fprop_conv(L, I.gpu, F.gpu, Oi);
            update_conv(L, I.gpu, E.gpu, Gi);
            fprop_conv(L, I.abs, F.abs, Om);
            update_conv(L, I.abs, E.abs, Gm);
        }
        CHECK(count_off(O, Oi, Om, dt) == 0);
        CHECK(count_off(G, Gi, Gm, dt) == 0);
    }
    gemm::conv_autotune_forget();
}

// A seeded sweep of random layers, so that the paths the GPU picks by rule (the implicit kernel
// and its tiles, folded strides, padded channels, taps as channels, phases, the narrow kernel,
// the GEMM and im2col) meet geometries no fixed case names: channel counts below, at and past
// multiples of 8 and 64, odd images, every stride, padding and dilation up to the window's, 1D to
// 3D, every dtype, convolution and deconvolution; fprop with its epilogues, bprop, update.
namespace {
void random_layers_agree(Context& gpu, Context& cpu, uint32_t seed0) {
    std::mt19937 g(seed0);
    auto pick = [&](std::initializer_list<int64_t> v) { return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(g)); };
    int layers = 0;
    for (int trial = 0; layers < 32 && trial < 1000; ++trial) {
        const int rank = (int)pick({2, 2, 2, 1, 3});
        Dims3 image{1, 1, 1}, filter{1, 1, 1}, pad{0, 0, 0}, stride{1, 1, 1}, dilation{1, 1, 1};
        for (int a = 3 - rank; a < 3; ++a) {
            image[a] = rank == 3 ? pick({3, 4, 6}) : pick({4, 7, 9, 14, 19});
            filter[a] = pick({1, 3, 3, 5});
            stride[a] = pick({1, 1, 2, 3});
            dilation[a] = filter[a] > 1 ? pick({1, 1, 2}) : 1;
            pad[a] = std::uniform_int_distribution<int64_t>(0, filter[a] - 1)(g);
        }
        bool fits = true;
        for (int a = 0; a < 3; ++a) fits = fits && image[a] + 2 * pad[a] >= dilation[a] * (filter[a] - 1) + 1;
        if (!fits) continue;
        const DType dt = layers % 4 == 3 ? DType::Float32 : layers % 2 ? DType::BFloat16 : DType::Float16;
        const ConvLayer C = conv_layer(dt, pick({1, 2, 4}), pick({3, 8, 16, 24, 40, 64, 72}), pick({8, 16, 24, 64, 136}),
                                       image, filter, pad, stride, dilation);
        const bool deconv = layers % 3 == 2;
        const ConvLayer L = deconv ? deconv_layer(dt, C.N, C.C, C.K, C.output, filter, pad, stride, dilation) : C;
        ++layers;
        INFO(L.str());
        uint32_t seed = 1000u * (uint32_t)layers;
        const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                   E = pair(gpu, cpu, L.output_shape(), dt, ++seed), X = pair(gpu, cpu, L.output_shape(), dt, ++seed),
                   B = pair(gpu, cpu, {L.output_shape().back()}, DType::Float32, ++seed);
        if (!deconv) check_fprop_epilogues(gpu, cpu, L, I, F, X, B, true);
        else CHECK(agree(gpu, cpu, L.output_shape(), dt, [&](Tensor& o, Side side) { fprop_conv(L, I.*side, F.*side, o); }) == 0);
        CHECK(agree(gpu, cpu, L.input_shape(), dt, [&](Tensor& o, Side side) { bprop_conv(L, F.*side, E.*side, o); }) == 0);
        CHECK(agree(gpu, cpu, L.filter_shape(), DType::Float32,
                    [&](Tensor& o, Side side) { update_conv(L, I.*side, E.*side, o); }) == 0);
    }
    CHECK(layers == 32);
}
} // namespace

TEST_CASE("gpu conv: a seeded sweep of random layers matches the CPU path in every op") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    random_layers_agree(gpu, cpu, 77);
}

// The mma.sync fprop (sm80/conv_mma.cuh), which every GPU from sm_80 but sm_90 runs and sm_90
// runs under KILN_CONV_KERNEL=mma: tails of positions, taps (C of 8 and 16: several taps a
// k-tile) and K, every epilogue into 16-bit and float32 outputs, stochastic rounding, counted
// named outputs, the gradient with respect to the input through it (stride 1, and by phase into
// grouped rows), and the seeded sweep with it; the update takes im2col and the GEMM.
TEST_CASE("gpu conv: the mma.sync kernel: tails, every epilogue, bprop by phase, named counts, a seeded sweep") {
    REQUIRE_GPU();
    Context gpu(ContextOptions{"cuda"}), cpu(ContextOptions{"cpu"});
    if (cuda::cuda_backend(gpu).info().sm < 80) {
        std::printf("SKIPPED (mma.sync m16n8k16 needs sm_80; this GPU is sm_%d)\n", cuda::cuda_backend(gpu).info().sm);
        return;
    }
    const test::ScopedEnv forced("KILN_CONV_KERNEL", "mma");
    const std::vector<Case> shapes = {
        {3, 24, 200, {1, 13, 11}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}},   // taps 216, K 200: tails
        {2, 64, 64, {1, 15, 15}, {1, 3, 3}, {0, 2, 2}, {1, 2, 2}, {1, 2, 2}},    // stride and dilation
        {1, 8, 40, {6, 7, 5}, {3, 3, 3}, {1, 1, 1}, {2, 1, 1}, {1, 1, 1}},       // 3D, C = 8: 4 taps a k-tile
        {2, 16, 136, {1, 9, 9}, {1, 5, 5}, {0, 4, 0}, {1, 1, 3}, {1, 1, 1}},     // big pad, K past 128, C = 16
        {4, 16, 100, {1, 1, 77}, {1, 1, 7}, {0, 0, 3}, {1, 1, 1}, {1, 1, 1}},    // 1D
        {2, 32, 8, {1, 11, 10}, {1, 5, 4}, {0, 4, 1}, {1, 3, 2}, {1, 2, 1}},     // K = 8: one column of mma tiles
    };
    uint32_t seed = 4100;
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const Case& c : shapes) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str());
            const std::string kernel = gemm::conv_fprop_kernel(gpu, L);
            CHECK(kernel.rfind(c.K <= 64 ? "kiln_conv_mma_" + std::string(dt == DType::Float16 ? "f16" : "bf16") + "_64_"
                                         : "kiln_conv_mma_" + std::string(dt == DType::Float16 ? "f16" : "bf16") + "_128_",
                               0) == 0);
            CHECK(conv_kernel(gpu, L, "update") == "im2col+gemm");
            const Pair I = pair(gpu, cpu, L.input_shape(), dt, ++seed), F = pair(gpu, cpu, L.filter_shape(), dt, ++seed),
                       X = pair(gpu, cpu, L.output_shape(), dt, ++seed), B = pair(gpu, cpu, {c.K}, dt, ++seed);
            check_fprop_epilogues(gpu, cpu, L, I, F, X, B, true);
        }
    // The gradient with respect to the input: stride 1 as one convolution, strided by phase.
    const std::vector<Case> dgrad = {
        {3, 40, 200, {1, 13, 11}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}},
        {2, 40, 64, {1, 13, 12}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2}, {1, 1, 1}},
        {1, 32, 16, {5, 6, 7}, {3, 3, 3}, {1, 1, 1}, {2, 2, 1}, {1, 1, 2}},
    };
    for (DType dt : {DType::Float16, DType::BFloat16})
        for (const Case& c : dgrad) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str());
            CHECK(conv_kernel(gpu, L, "bprop").find("kiln_conv_mma_") != std::string::npos);
            const Pair F = pair(gpu, cpu, L.filter_shape(), dt, ++seed), E = pair(gpu, cpu, L.output_shape(), dt, ++seed);
            for (DType out : {dt, DType::Float32}) {
                ConvOptions o;
                o.alpha = 0.5, o.relu = true, o.slope = 0.125;
                Tensor Gg = gpu.empty(L.input_shape(), out), Gc = cpu.empty(L.input_shape(), out),
                       Gm = cpu.empty(L.input_shape(), DType::Float32);
                bprop_conv(L, F.gpu, E.gpu, Gg, o);
                bprop_conv(L, F.cpu, E.cpu, Gc, o);
                bprop_conv(L, F.abs, E.abs, Gm);
                CHECK(count_off(Gg, Gc, cpu.eval(Gm.expr() + 1.0), out) == 0);
            }
        }
    // Stochastic rounding of a 16-bit output: within a step of round-to-nearest's.
    {
        const Case& c = shapes[0];
        const ConvLayer L = conv_layer(DType::Float16, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
        const Pair I = pair(gpu, cpu, L.input_shape(), L.dtype, ++seed), F = pair(gpu, cpu, L.filter_shape(), L.dtype, ++seed);
        Tensor near = gpu.empty(L.output_shape(), L.dtype), sr = gpu.empty(L.output_shape(), L.dtype);
        fprop_conv(L, I.gpu, F.gpu, near);
        gpu.set_stochastic_round(10);
        fprop_conv(L, I.gpu, F.gpu, sr);
        gpu.set_stochastic_round(0);
        const std::vector<float> a = near.to_vector<float>(), b = sr.to_vector<float>();
        int64_t far = 0, moved = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            far += !(std::fabs(a[i] - b[i]) <= 0x1p-10 * std::fabs(a[i]) + 1e-7);
            moved += a[i] != b[i];
        }
        CHECK(far == 0);
        CHECK(moved > 0);
    }
    {   // An image and a filter that start mid-vector (contiguous views one element in): copied to a
        // 16-byte boundary first.
        const ConvLayer L = conv_layer(DType::BFloat16, 2, 16, 24, {1, 9, 9}, {1, 3, 3}, {0, 1, 1});
        const Pair I = pair(gpu, cpu, L.input_shape(), L.dtype, ++seed), F = pair(gpu, cpu, L.filter_shape(), L.dtype, ++seed);
        auto one_in = [&](const Tensor& t) {
            std::vector<float> v = t.to_vector<float>();
            v.insert(v.begin(), 0.f);
            const int64_t n = numel(t.shape());
            return *gpu.array(v, {n + 1}, t.dtype()).slice({Slice::range(1, n + 1)}).reshape_view(t.shape());
        };
        const Tensor Iv = one_in(I.cpu), Fv = one_in(F.cpu);
        CHECK(Iv.offset() == 1);
        Tensor Og = gpu.empty(L.output_shape(), L.dtype), Oc = cpu.empty(L.output_shape(), L.dtype),
               Om = cpu.empty(L.output_shape(), DType::Float32);
        fprop_conv(L, Iv, Fv, Og);
        fprop_conv(L, I.cpu, F.cpu, Oc);
        fprop_conv(L, I.abs, F.abs, Om);
        CHECK(count_off(Og, Oc, Om, L.dtype) == 0);
    }
    {   // A named output counted in the kernel's store path.
        Context ctx(ContextOptions{"cuda"});
        set_hist_buffers(ctx, 64, -40);
        std::mt19937 g(5);
        const ConvLayer L = conv_layer(DType::BFloat16, 8, 64, 128, {1, 20, 20}, {1, 3, 3}, {0, 1, 1});
        Tensor I = test::random_normal(ctx, g, L.input_shape(), L.dtype), F = test::random_normal(ctx, g, L.filter_shape(), L.dtype);
        Tensor O = ctx.empty(L.output_shape(), L.dtype);
        test::check_named_counts(ctx, O, 64, [&] { fprop_conv(L, I, F, O); }, [&] { CHECK(gemm::last_conv_counted()); });
    }
    random_layers_agree(gpu, cpu, 78);
}
