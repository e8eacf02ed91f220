// Convolution on the CPU backend against float64 loops written from the definition: fprop,
// bprop and update in 1D, 2D and 3D with padding, stride and dilation, every float dtype (fixed
// cases, and a seeded sweep of random geometries with random epilogues); the
// epilogue (alpha, beta with X, bias, relu and its slope, brelu, bsum); deconvolution as the
// transposed convolution; the layer's shapes and FLOPs; and the misuse messages.
#include "tests/support/catch.hpp"
#include "tests/support/random_values.hpp"

#include "kernels/conv_views.hpp"
#include "kernels/cuda/fast_div.hpp"
#include <kiln/kiln.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace kiln;
using kiln::test::make;
using kiln::test::random_values;

namespace {

struct Case {
    int64_t N, C, K;
    Dims3 image, filter, pad, stride, dilation;
};

// The definition: out[n, m, p, q, k] = sum over t, r, s, c of in[n, d, h, w, c] f[k, t, r, s, c]
// with d = m str_d - pad_d + t dil_d (and so for h, w); visit(o, i, f) for every term.
template <class Visit>
void each_term(const ConvLayer& L, Visit&& visit) {
    const auto [D, H, W] = L.image;
    const auto [T, R, S] = L.filter;
    const auto [M, P, Q] = L.output;
    for (int64_t n = 0; n < L.N; ++n)
        for (int64_t m = 0; m < M; ++m)
            for (int64_t p = 0; p < P; ++p)
                for (int64_t q = 0; q < Q; ++q)
                    for (int64_t k = 0; k < L.K; ++k)
                        for (int64_t t = 0; t < T; ++t)
                            for (int64_t r = 0; r < R; ++r)
                                for (int64_t s = 0; s < S; ++s) {
                                    const int64_t d = m * L.stride[0] - L.pad[0] + t * L.dilation[0];
                                    const int64_t h = p * L.stride[1] - L.pad[1] + r * L.dilation[1];
                                    const int64_t w = q * L.stride[2] - L.pad[2] + s * L.dilation[2];
                                    if (d < 0 || d >= D || h < 0 || h >= H || w < 0 || w >= W) continue;
                                    for (int64_t c = 0; c < L.C; ++c)
                                        visit((((n * M + m) * P + p) * Q + q) * L.K + k,
                                              (((n * D + d) * H + h) * W + w) * L.C + c,
                                              (((k * T + t) * R + r) * S + s) * L.C + c);
                                }
}

struct Reference {
    std::vector<double> value, magnitude;   // the exact result and the sum of |terms|
};

Reference ref_fprop(const ConvLayer& L, const std::vector<double>& I, const std::vector<double>& F, int64_t out_n) {
    Reference r{std::vector<double>((size_t)out_n), std::vector<double>((size_t)out_n)};
    each_term(L, [&](int64_t o, int64_t i, int64_t f) {
        r.value[o] += I[i] * F[f];
        r.magnitude[o] += std::fabs(I[i] * F[f]);
    });
    return r;
}

Reference ref_bprop(const ConvLayer& L, const std::vector<double>& F, const std::vector<double>& E, int64_t in_n) {
    Reference r{std::vector<double>((size_t)in_n), std::vector<double>((size_t)in_n)};
    each_term(L, [&](int64_t o, int64_t i, int64_t f) {
        r.value[i] += E[o] * F[f];
        r.magnitude[i] += std::fabs(E[o] * F[f]);
    });
    return r;
}

Reference ref_update(const ConvLayer& L, const std::vector<double>& I, const std::vector<double>& E, int64_t f_n) {
    Reference r{std::vector<double>((size_t)f_n), std::vector<double>((size_t)f_n)};
    each_term(L, [&](int64_t o, int64_t i, int64_t f) {
        r.value[f] += E[o] * I[i];
        r.magnitude[f] += std::fabs(E[o] * I[i]);
    });
    return r;
}

double eps_of(DType dt) { return dt == DType::Float32 ? 2e-6 : dt == DType::Float16 ? 2e-3 : 1.6e-2; }

// Elements of got farther from the reference than the dtype allows.
int count_bad(const Tensor& got, const Reference& want, DType dt, double scale = 1, const std::vector<double>* add = nullptr) {
    const std::vector<float> g = got.to_vector<float>();
    REQUIRE(g.size() == want.value.size());
    int bad = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        const double w = scale * want.value[i] + (add ? (*add)[i] : 0.0);
        const double tol = eps_of(dt) * (std::fabs(scale) * want.magnitude[i] + std::fabs(w) + 1e-3);
        if (!(std::fabs(g[i] - w) <= tol)) {
            if (bad < 3) UNSCOPED_INFO("element " << i << ": " << g[i] << " vs " << w);
            ++bad;
        }
    }
    return bad;
}

const std::vector<Case>& cases() {
    static const std::vector<Case> c = {
        {2, 3, 4, {1, 1, 11}, {1, 1, 3}, {0, 0, 1}, {1, 1, 2}, {1, 1, 1}},    // 1D, stride 2
        {2, 5, 3, {1, 7, 6}, {1, 3, 2}, {0, 1, 0}, {1, 2, 1}, {1, 1, 2}},     // 2D, dilated width
        {1, 2, 3, {5, 4, 4}, {2, 3, 3}, {1, 1, 1}, {1, 1, 2}, {2, 1, 1}},     // 3D
        {3, 8, 5, {1, 4, 4}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}, {1, 1, 1}},     // 1x1
        {1, 3, 4, {1, 13, 13}, {1, 7, 7}, {0, 3, 3}, {1, 2, 2}, {1, 1, 1}},   // a first layer: 3 channels, 7x7/2
    };
    return c;
}

} // namespace

TEST_CASE("conv: fprop, bprop and update against float64 loops; 1D, 2D, 3D; padding, stride, dilation; every float dtype; "
          "and each as a deconvolution") {
    Context ctx(ContextOptions{"cpu"});
    uint32_t seed = 1;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (const Case& c : cases()) {
            const ConvLayer L = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str());
            std::vector<double> I = random_values(numel(L.input_shape()), ++seed);
            std::vector<double> F = random_values(numel(L.filter_shape()), ++seed);
            std::vector<double> E = random_values(numel(L.output_shape()), ++seed);
            Tensor tI = make(ctx, I, L.input_shape(), dt), tF = make(ctx, F, L.filter_shape(), dt),
                   tE = make(ctx, E, L.output_shape(), dt);

            Tensor O = ctx.empty(L.output_shape(), dt);
            fprop_conv(L, tI, tF, O);
            CHECK(count_bad(O, ref_fprop(L, I, F, numel(L.output_shape())), dt) == 0);

            Tensor gI = ctx.empty(L.input_shape(), DType::Float32);   // a float32 gradient of 16-bit operands
            bprop_conv(L, tF, tE, gI);
            CHECK(count_bad(gI, ref_bprop(L, F, E, numel(L.input_shape())), DType::Float32) == 0);

            Tensor gF = ctx.empty(L.filter_shape(), dt);
            update_conv(L, tI, tE, gF);
            CHECK(count_bad(gF, ref_update(L, I, E, numel(L.filter_shape())), dt) == 0);

            // A deconvolution of E's shape with the same filter and parameters: its fprop is the
            // convolution's bprop, its bprop the convolution's fprop, its update the convolution's
            // with input and error exchanged; the convolution being D's geometry (whose image is
            // smaller than L's where L's stride left a tail of the image unread).
            const ConvLayer D = deconv_layer(dt, c.N, c.C, c.K, L.output, c.filter, c.pad, c.stride, c.dilation);
            ConvLayer Dc = D;
            Dc.deconv = false;
            REQUIRE(Dc.output == L.output);
            std::vector<double> Y = random_values(numel(D.output_shape()), ++seed);
            Tensor tY = make(ctx, Y, D.output_shape(), dt);
            Tensor dO = ctx.empty(D.output_shape(), dt);
            fprop_conv(D, tE, tF, dO);
            CHECK(count_bad(dO, ref_bprop(Dc, F, E, numel(D.output_shape())), dt) == 0);
            Tensor dG = ctx.empty(D.input_shape(), dt);
            bprop_conv(D, tF, tY, dG);
            CHECK(count_bad(dG, ref_fprop(Dc, Y, F, numel(D.input_shape())), dt) == 0);
            Tensor dF = ctx.empty(D.filter_shape(), DType::Float32);
            update_conv(D, tE, tY, dF);
            CHECK(count_bad(dF, ref_update(Dc, Y, E, numel(D.filter_shape())), DType::Float32) == 0);
        }
}

TEST_CASE("conv: a seeded sweep of random geometries (rank, sizes, padding, stride, dilation), dtypes and epilogues, "
          "convolution and deconvolution, against float64 loops") {
    Context ctx(ContextOptions{"cpu"});
    std::mt19937 g(2024);
    auto pick = [&](int lo, int hi) { return (int64_t)std::uniform_int_distribution<int>(lo, hi)(g); };
    int layers = 0;
    for (int trial = 0; layers < 48 && trial < 1000; ++trial) {
        const int rank = (int)pick(1, 3);
        Dims3 image{1, 1, 1}, filter{1, 1, 1}, pad{0, 0, 0}, stride{1, 1, 1}, dilation{1, 1, 1};
        for (int a = 3 - rank; a < 3; ++a) {
            image[a] = pick(1, 7), filter[a] = pick(1, 3), dilation[a] = pick(1, 2), stride[a] = pick(1, 3);
            pad[a] = pick(0, filter[a] - 1);
        }
        bool fits = true;   // the dilated filter within the padded image along every axis
        for (int a = 0; a < 3; ++a) fits = fits && image[a] + 2 * pad[a] >= dilation[a] * (filter[a] - 1) + 1;
        if (!fits) continue;
        const DType dt = layers % 3 == 0 ? DType::Float32 : layers % 3 == 1 ? DType::Float16 : DType::BFloat16;
        const ConvLayer C = conv_layer(dt, pick(1, 2), pick(1, 5), pick(1, 5), image, filter, pad, stride, dilation);
        // Every other layer as the deconvolution of the convolution's output; its convolution
        // geometry is the references' (Dc).
        const bool deconv = layers % 2 == 1;
        const ConvLayer L = deconv ? deconv_layer(dt, C.N, C.C, C.K, C.output, filter, pad, stride, dilation) : C;
        ConvLayer Dc = L;
        Dc.deconv = false;
        ++layers;
        INFO(L.str() << " " << dtype_name(dt));
        const Shape in = L.input_shape(), out = L.output_shape();
        std::vector<double> I = random_values(numel(in), g()), F = random_values(numel(L.filter_shape()), g()),
                            E = random_values(numel(out), g()), X = random_values(numel(out), g()),
                            B = random_values(out.back(), g());
        Tensor tI = make(ctx, I, in, dt), tF = make(ctx, F, L.filter_shape(), dt), tE = make(ctx, E, out, dt),
               tX = make(ctx, X, out, dt), tB = make(ctx, B, {out.back()}, DType::Float32);
        // fprop: the conv's fprop, or the deconv's (the conv's bprop), with a random epilogue.
        const Reference plain = deconv ? ref_bprop(Dc, F, I, numel(out)) : ref_fprop(Dc, I, F, numel(out));
        ConvOptions o;
        o.alpha = pick(0, 1) ? 1.0 : 0.75;
        if (pick(0, 1)) o.bias = tB;
        if (pick(0, 1)) o.relu = true, o.slope = pick(0, 1) ? 0.0 : 0.125;
        if (pick(0, 2) == 0) o.beta = 0.5, o.X = tX;
        o.bsum = ctx.empty({out.back()});
        Tensor O = ctx.empty(out, dt);
        fprop_conv(L, tI, tF, O, o);
        const std::vector<float> got = O.to_vector<float>(), sums = o.bsum->to_vector<float>();
        int bad = 0;
        std::vector<double> stored(out.back(), 0.0), stored_abs(out.back(), 0.0);
        for (size_t i = 0; i < got.size(); ++i) {
            const int64_t k = (int64_t)i % out.back();
            double v = o.alpha * plain.value[i] + (o.bias ? B[k] : 0.0);
            if (o.relu) v = v > 0 ? v : o.slope * v;
            if (o.X) v += o.beta * X[i];
            const double tol = eps_of(dt) * (o.alpha * plain.magnitude[i] + std::fabs(B[k]) + std::fabs(v) + 1e-3) + 1e-6;
            if (!(std::fabs(got[i] - v) <= tol)) {
                if (bad < 3) UNSCOPED_INFO("fprop element " << i << ": " << got[i] << " vs " << v);
                ++bad;
            }
            stored[k] += got[i], stored_abs[k] += std::fabs(got[i]);
        }
        CHECK(bad == 0);
        for (int64_t k = 0; k < out.back(); ++k) CHECK(std::fabs(sums[k] - stored[k]) <= 1e-5 * (stored_abs[k] + 1));
        // bprop into the input's shape, in the layer's dtype.
        Tensor gI = ctx.empty(in, dt);
        bprop_conv(L, tF, tE, gI);
        CHECK(count_bad(gI, deconv ? ref_fprop(Dc, E, F, numel(in)) : ref_bprop(Dc, F, E, numel(in)), dt) == 0);
        // update, accumulating into a float32 gradient: alpha dF + beta grad_F.
        std::vector<double> G0 = random_values(numel(L.filter_shape()), g()), half(G0.size());
        for (size_t i = 0; i < G0.size(); ++i) half[i] = 0.5 * G0[i];
        Tensor gF = make(ctx, G0, L.filter_shape(), DType::Float32);
        update_conv(L, tI, tE, gF, 2.0, 0.5);
        CHECK(count_bad(gF, deconv ? ref_update(Dc, E, I, numel(L.filter_shape())) : ref_update(Dc, I, E, numel(L.filter_shape())),
                        DType::Float32, 2.0, &half) == 0);
    }
    CHECK(layers == 48);
}

TEST_CASE("conv: im2col and col2im as strided copies (the CUDA path's) match the definition on every case") {
    Context ctx(ContextOptions{"cpu"});
    uint32_t seed = 100;
    for (DType dt : {DType::Float32, DType::BFloat16})
        for (const Case& c : cases()) {
            // K = 1: each_term's output index is the patch matrix's row, its filter index the column.
            const ConvLayer L = conv_layer(dt, c.N, c.C, 1, c.image, c.filter, c.pad, c.stride, c.dilation);
            INFO(L.str());
            const int64_t rows = numel(L.output_shape()), taps = numel(L.filter_shape());
            std::vector<double> I = random_values(numel(L.input_shape()), ++seed);
            Tensor tI = make(ctx, I, L.input_shape(), dt);
            Tensor I5 = tI.reshape({c.N, L.image[0], L.image[1], L.image[2], c.C});
            std::vector<double> cols((size_t)(rows * taps), 0.0), image(I.size(), 0.0);
            std::vector<double> dcols = random_values(rows * taps, ++seed);
            each_term(L, [&](int64_t o, int64_t i, int64_t f) {
                cols[(size_t)(o * taps + f)] = I[(size_t)i];
                image[(size_t)i] += dcols[(size_t)(o * taps + f)];
            });
            const Tensor got = detail::im2col_views(L, I5);
            REQUIRE(got.shape() == Shape{rows, taps});
            CHECK(got.dtype() == dt);
            const std::vector<float> g = got.to_vector<float>();
            int64_t wrong = 0;
            for (size_t k = 0; k < g.size(); ++k) wrong += g[k] != (float)cols[k];
            CHECK(wrong == 0);

            const Tensor tD = make(ctx, dcols, {rows, taps}, DType::Float32);
            const Tensor back = detail::col2im_views(L, tD);
            REQUIRE(back.shape() == Shape{c.N, L.image[0], L.image[1], L.image[2], c.C});
            const std::vector<float> b = ctx.eval(back.expr()).to_vector<float>();
            int64_t off = 0;
            for (size_t k = 0; k < b.size(); ++k) off += std::fabs(b[k] - image[k]) > 1e-5 * (1 + std::fabs(image[k]));
            CHECK(off == 0);
        }
}

TEST_CASE("conv: conv_kernel names how each op runs; a bad op is a Value error") {
    Context ctx(ContextOptions{"cpu"});
    const ConvLayer point = conv_layer(DType::Float16, 2, 16, 32, {1, 5, 5});
    const ConvLayer three = conv_layer(DType::Float16, 2, 16, 32, {1, 5, 5}, {1, 3, 3}, {0, 1, 1});
    for (const char* op : {"fprop", "fprop+bsum", "bprop", "update"}) {
        CHECK(conv_kernel(ctx, point, op) == "gemm");
        CHECK(conv_kernel(ctx, three, op) == "im2col+gemm");   // the implicit-GEMM kernels are the GPU's
    }
    CHECK_THROWS_WITH(conv_kernel(ctx, three, "forward"),
                      Catch::Matchers::Contains("conv_kernel: op 'forward'; it is 'fprop', 'fprop+bsum', 'bprop' or 'update'"));
}

TEST_CASE("conv: the epilogue: alpha, beta with X, bias, relu and leaky relu, brelu, bsum; update accumulates") {
    Context ctx(ContextOptions{"cpu"});
    const Case& c = cases()[1];
    const ConvLayer L = conv_layer(DType::Float32, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
    const int64_t no = numel(L.output_shape());
    std::vector<double> I = random_values(numel(L.input_shape()), 11), F = random_values(numel(L.filter_shape()), 12);
    std::vector<double> X = random_values(no, 13), B = random_values(L.K, 14), O0 = random_values(no, 15);
    Tensor tI = make(ctx, I, L.input_shape(), DType::Float32), tF = make(ctx, F, L.filter_shape(), DType::Float32);
    Tensor tX = make(ctx, X, L.output_shape(), DType::Float32), tB = make(ctx, B, {L.K, 1}, DType::Float32);
    const Reference conv = ref_fprop(L, I, F, no);
    for (int variant = 0; variant < 4; ++variant) {
        INFO("variant " << variant);
        ConvOptions o;
        o.alpha = 0.5;
        o.bias = tB;
        o.bsum = ctx.empty({L.K});
        if (variant == 0) o.relu = true;                                        // ReLU, beta over O itself
        if (variant == 1) o.relu = true, o.slope = 0.1, o.X = tX, o.beta = -2;  // leaky ReLU, beta over X
        if (variant == 2) o.brelu = true, o.slope = 0.25, o.X = tX;             // backward ReLU of X
        if (variant == 3) o.beta = 1.5;
        Tensor O = make(ctx, O0, L.output_shape(), DType::Float32);
        fprop_conv(L, tI, tF, O, o);
        std::vector<double> want(no);
        std::vector<double> sums(L.K, 0.0);
        for (int64_t i = 0; i < no; ++i) {
            const int64_t k = i % L.K;
            double v = 0.5 * conv.value[i] + B[k];
            if (o.relu) v = v > 0 ? v : o.slope * v;
            const double x = o.X ? X[i] : O0[i];
            if (o.brelu) v = x > 0 ? v : x < 0 ? o.slope * v : 0.0;
            v += o.beta * x;
            want[i] = v;
            sums[k] += v;
        }
        const std::vector<float> got = O.to_vector<float>(), gs = o.bsum->to_vector<float>();
        int bad = 0;
        for (int64_t i = 0; i < no; ++i) bad += !(std::fabs(got[i] - want[i]) <= 1e-5 * (conv.magnitude[i] + 4));
        CHECK(bad == 0);
        for (int64_t k = 0; k < L.K; ++k) CHECK(std::fabs(gs[k] - sums[k]) <= 1e-4 * (1 + std::fabs(sums[k])));
    }
    // update_conv: grad_F = alpha * dF + beta * grad_F, into a contiguous tensor and into a view.
    std::vector<double> E = random_values(no, 16), G0 = random_values(numel(L.filter_shape()), 17);
    Tensor tE = make(ctx, E, L.output_shape(), DType::Float32);
    const Reference dF = ref_update(L, I, E, numel(L.filter_shape()));
    std::vector<double> beta_g0(G0.size());
    for (size_t i = 0; i < G0.size(); ++i) beta_g0[i] = 0.25 * G0[i];
    Tensor gF = make(ctx, G0, L.filter_shape(), DType::Float32);
    update_conv(L, tI, tE, gF, 2.0, 0.25);
    CHECK(count_bad(gF, dF, DType::Float32, 2.0, &beta_g0) == 0);
    Shape padded = L.filter_shape();
    padded.back() += 3;
    Tensor big = ctx.zeros(padded, DType::Float32);
    std::vector<Slice> window(padded.size(), Slice::all());
    window.back() = Slice::range(1, 1 + L.C);
    Tensor view = big.slice(window);
    REQUIRE_FALSE(view.is_contiguous());
    update_conv(L, tI, tE, view, 2.0, 0.0);
    CHECK(count_bad(view, dF, DType::Float32, 2.0) == 0);
}

TEST_CASE("conv: bprop's epilogue and update's grad_bias in every dtype, for a convolution and a deconvolution") {
    Context ctx(ContextOptions{"cpu"});
    uint32_t seed = 40;
    for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16})
        for (bool deconv : {false, true}) {
            // The 2D case with a dilated width; as a deconvolution, the same geometry transposed.
            const Case& c = cases()[1];
            const ConvLayer C = conv_layer(dt, c.N, c.C, c.K, c.image, c.filter, c.pad, c.stride, c.dilation);
            const ConvLayer L = deconv ? deconv_layer(dt, c.N, c.C, c.K, C.output, c.filter, c.pad, c.stride, c.dilation) : C;
            ConvLayer conv = L;   // the geometry as a convolution: the references' loops
            conv.deconv = false;
            INFO(L.str());
            // bprop reads E (the output's shape) and writes grad_I (the input's), with the
            // input's channels; a deconvolution's bprop is the convolution's fprop.
            const Shape in = L.input_shape(), out = L.output_shape();
            const int64_t ni = numel(in), no = numel(out), ch = in.back();
            std::vector<double> F = random_values(numel(L.filter_shape()), ++seed), E = random_values(no, ++seed);
            std::vector<double> X = random_values(ni, ++seed), B = random_values(ch, ++seed), G0 = random_values(ni, ++seed);
            Tensor tF = make(ctx, F, L.filter_shape(), dt), tE = make(ctx, E, out, dt), tX = make(ctx, X, in, dt);
            Tensor tB = make(ctx, B, {ch}, DType::Float32);
            const Reference grad = deconv ? ref_fprop(conv, E, F, ni) : ref_bprop(conv, F, E, ni);
            for (int variant = 0; variant < 3; ++variant) {
                INFO("variant " << variant);
                ConvOptions o;
                o.alpha = 0.5;
                o.bias = tB;
                o.bsum = ctx.empty({ch, 1});
                if (variant == 0) o.relu = true, o.slope = 0.125, o.beta = 0.5;   // leaky ReLU, beta over grad_I
                if (variant == 1) o.brelu = true, o.X = tX;                       // backward ReLU of X
                if (variant == 2) o.beta = -1.5, o.X = tX;                        // beta over X
                Tensor gI = make(ctx, G0, in, dt);
                bprop_conv(L, tF, tE, gI, o);
                const std::vector<float> got = gI.to_vector<float>(), sums = o.bsum->to_vector<float>();
                std::vector<double> stored(ch, 0.0), stored_abs(ch, 0.0);
                int bad = 0;
                for (int64_t i = 0; i < ni; ++i) {
                    const int64_t k = i % ch;
                    double v = 0.5 * grad.value[i] + B[k];
                    if (o.relu) v = v > 0 ? v : o.slope * v;
                    const double x = o.X ? X[i] : G0[i];
                    if (o.brelu) v = x > 0 ? v : 0.0;
                    v += o.beta * x;
                    const double tol = eps_of(dt) * (0.5 * grad.magnitude[i] + std::fabs(B[k]) + 2 * std::fabs(x) + std::fabs(v) + 1e-3);
                    if (!(std::fabs(got[i] - v) <= tol)) {
                        if (bad < 3) UNSCOPED_INFO("element " << i << ": " << got[i] << " vs " << v);
                        ++bad;
                    }
                    stored[k] += got[i], stored_abs[k] += std::fabs(got[i]);
                }
                CHECK(bad == 0);
                // bsum: the sums of grad_I as stored, added in float32.
                for (int64_t k = 0; k < ch; ++k) CHECK(std::fabs(sums[k] - stored[k]) <= 1e-5 * (stored_abs[k] + 1));
            }
            // update_conv's grad_bias: E summed over every axis but its channel, whatever alpha and beta.
            const int64_t ech = out.back();
            Tensor gF = ctx.empty(L.filter_shape(), dt), gB = ctx.full({ech}, 7.0, DType::Float32);
            update_conv(L, make(ctx, X, in, dt), tE, gF, 2.0, 0.0, gB);
            std::vector<double> want(ech, 0.0);
            for (int64_t i = 0; i < no; ++i) want[i % ech] += E[i];
            const std::vector<float> gb = gB.to_vector<float>();
            for (int64_t k = 0; k < ech; ++k) CHECK(std::fabs(gb[k] - want[k]) <= 1e-5 * (double(no / ech) + std::fabs(want[k])));
            Tensor gB16 = ctx.empty({ech, 1}, dt);   // (channels, 1), in the operands' dtype
            update_conv(L, make(ctx, X, in, dt), tE, gF, 1.0, 0.0, gB16);
            const std::vector<float> gb16 = gB16.to_vector<float>();
            for (int64_t k = 0; k < ech; ++k) CHECK(std::fabs(gb16[k] - want[k]) <= eps_of(dt) * (std::fabs(want[k]) + 1));
        }
}

TEST_CASE("conv: deconv_layer is the transposed convolution: fprop and bprop exchanged, shapes from the input") {
    Context ctx(ContextOptions{"cpu"});
    // Input 4x5 of K=3 channels, 3x3 filter, stride 2, pad 1: output (4-1)*2-2+3 = 7 by (5-1)*2-2+3 = 9, C=2.
    const ConvLayer D = deconv_layer(DType::Float32, 2, 2, 3, {1, 4, 5}, {1, 3, 3}, {0, 1, 1}, {1, 2, 2});
    CHECK(D.deconv);
    CHECK(D.image == Dims3{1, 7, 9});
    CHECK(D.output == Dims3{1, 4, 5});
    CHECK(D.input_shape() == Shape{2, 4, 5, 3});
    CHECK(D.output_shape() == Shape{2, 7, 9, 2});
    CHECK(D.filter_shape() == Shape{3, 3, 3, 2});
    ConvLayer L = D;   // the same geometry as a convolution
    L.deconv = false;
    std::vector<double> X = random_values(numel(D.input_shape()), 21), F = random_values(numel(D.filter_shape()), 22);
    std::vector<double> Y = random_values(numel(D.output_shape()), 23);
    Tensor tX = make(ctx, X, D.input_shape(), DType::Float32), tF = make(ctx, F, D.filter_shape(), DType::Float32);
    Tensor tY = make(ctx, Y, D.output_shape(), DType::Float32);
    Tensor O = ctx.empty(D.output_shape());
    fprop_conv(D, tX, tF, O);   // the convolution's data gradient of X
    CHECK(count_bad(O, ref_bprop(L, F, X, numel(D.output_shape())), DType::Float32) == 0);
    Tensor gX = ctx.empty(D.input_shape());
    bprop_conv(D, tF, tY, gX);   // the convolution of Y
    CHECK(count_bad(gX, ref_fprop(L, Y, F, numel(D.input_shape())), DType::Float32) == 0);
    Tensor gF = ctx.empty(D.filter_shape());
    update_conv(D, tX, tY, gF);   // the convolution's filter gradient, its input being Y
    CHECK(count_bad(gF, ref_update(L, Y, X, numel(D.filter_shape())), DType::Float32) == 0);
}

TEST_CASE("conv: the layer's output sizes, shapes in each spatial rank, FLOPs") {
    const ConvLayer a = conv_layer(DType::Float16, 8, 3, 64, {1, 224, 224}, {1, 7, 7}, {0, 3, 3}, {1, 2, 2});
    CHECK(a.output == Dims3{1, 112, 112});
    CHECK(a.spatial_rank() == 2);
    CHECK(a.input_shape() == Shape{8, 224, 224, 3});
    CHECK(a.filter_shape() == Shape{64, 7, 7, 3});
    CHECK(a.output_shape() == Shape{8, 112, 112, 64});
    CHECK(a.flops() == 2.0 * 8 * 64 * 3 * 112 * 112 * 49);
    const ConvLayer w = conv_layer(DType::Float32, 2, 4, 6, {1, 1, 100}, {1, 1, 5}, {0, 0, 0}, {1, 1, 1}, {1, 1, 3});
    CHECK(w.spatial_rank() == 1);
    CHECK(w.output == Dims3{1, 1, 88});
    CHECK(w.input_shape() == Shape{2, 100, 4});
    const ConvLayer v = conv_layer(DType::BFloat16, 1, 2, 2, {9, 9, 9}, {3, 3, 3}, {1, 1, 1}, {2, 2, 2});
    CHECK(v.spatial_rank() == 3);
    CHECK(v.output_shape() == Shape{1, 5, 5, 5, 2});
    // The full 5-D form is accepted in every rank.
    Context ctx(ContextOptions{"cpu"});
    Tensor I = ctx.zeros({2, 1, 1, 100, 4}), F = ctx.zeros({6, 1, 1, 5, 4}), O = ctx.empty({2, 88, 6});
    fprop_conv(w, I, F, O);
    CHECK(O.to_vector<float>()[17] == 0.0f);
}

TEST_CASE("conv: neon's CHWN activations and CRSK filters convert to NHWC / KRSC and back") {
    Context ctx(ContextOptions{"cpu"});
    std::vector<float> v(2 * 3 * 4 * 5);
    for (size_t i = 0; i < v.size(); ++i) v[i] = (float)i;
    Tensor chwn = ctx.array(v, {2, 3, 4, 5}, DType::Float16);   // C=2, H=3, W=4, N=5
    Tensor nhwc = from_chwn(chwn);
    CHECK(nhwc.shape() == Shape{5, 3, 4, 2});
    CHECK(nhwc.dtype() == DType::Float16);
    CHECK(nhwc.is_contiguous());
    const std::vector<float> got = nhwc.to_vector<float>();
    // nhwc[n, h, w, c] = chwn[c, h, w, n]
    CHECK(got[((4 * 3 + 2) * 4 + 1) * 2 + 1] == v[((1 * 3 + 2) * 4 + 1) * 5 + 4]);
    CHECK(to_chwn(nhwc).to_vector<float>() == v);
    // 3D: (C, D, H, W, N) <-> (N, D, H, W, C), and filters (C, T, R, S, K) <-> (K, T, R, S, C).
    std::vector<float> v5(2 * 3 * 2 * 4 * 5);
    for (size_t i = 0; i < v5.size(); ++i) v5[i] = (float)i;
    Tensor cdhwn = ctx.array(v5, {2, 3, 2, 4, 5}, DType::BFloat16);
    Tensor ndhwc = from_chwn(cdhwn);
    CHECK(ndhwc.shape() == Shape{5, 3, 2, 4, 2});
    const std::vector<float> g5 = ndhwc.to_vector<float>();
    // ndhwc[n, d, h, w, c] = cdhwn[c, d, h, w, n], at n=3, d=2, h=1, w=2, c=1
    CHECK(g5[(((3 * 3 + 2) * 2 + 1) * 4 + 2) * 2 + 1] == v5[(((1 * 3 + 2) * 2 + 1) * 4 + 2) * 5 + 3]);
    CHECK(to_chwn(ndhwc).to_vector<float>() == v5);
    CHECK_THROWS_WITH(from_chwn(ctx.zeros({7})), Catch::Matchers::Contains("from_chwn: x is float32 (7,); it needs a channel"));
}

TEST_CASE("conv: 16-bit outputs round stochastically where the context says so: neighbours, unbiased") {
    // Every output of this layer is the same exact value, about 1 + ulp / 3, between two float16
    // neighbours: with stochastic rounding about a third of them round up, without none do.
    Context ctx(ContextOptions{"cpu", 11, DType::Float32});
    const double ulp = std::ldexp(1.0, -10);
    const ConvLayer L = conv_layer(DType::Float16, 4, 2, 16, {1, 32, 32}, {1, 1, 1});   // 65536 outputs
    // I = 1 everywhere and each filter's two taps 1 and (ulp / 3 as float16 holds it): every
    // output is 1 + tap, strictly between 1 and 1 + ulp.
    std::vector<float> f(size_t(L.K * L.C));
    for (int64_t k = 0; k < L.K; ++k) f[size_t(k * 2)] = 1.0f, f[size_t(k * 2 + 1)] = float(ulp / 3);
    Tensor I = ctx.full(L.input_shape(), 1.0, DType::Float16), F = ctx.array(f, L.filter_shape(), DType::Float16);
    const double tap = F.to_vector<float>()[1], exact = 1.0 + tap;   // the tap as float16 holds it
    REQUIRE(exact > 1.0);
    REQUIRE(exact < 1.0 + ulp);
    auto count_up = [&](const Tensor& O) {
        int64_t up = 0, other = 0;
        for (float v : O.to_vector<float>()) up += v == float(1.0 + ulp), other += v != 1.0f && v != float(1.0 + ulp);
        CHECK(other == 0);
        return up;
    };
    Tensor O = ctx.empty(L.output_shape(), DType::Float16);
    fprop_conv(L, I, F, O);
    CHECK(count_up(O) == 0);   // round to nearest: all down
    ctx.set_stochastic_round(true);
    fprop_conv(L, I, F, O);
    const double n = double(numel(L.output_shape())), p = (exact - 1.0) / ulp, sigma = std::sqrt(n * p * (1 - p));
    CHECK(std::fabs(double(count_up(O)) - n * p) <= 5 * sigma);
    // bprop of the same layer into a float16 gradient: E = 1 and the same filter give each input
    // channel c the sum over k of F[k, c]: 16 (channel 0) and 16 tap (channel 1), both exact, so
    // stochastic rounding leaves them as they are.
    Tensor E = ctx.full(L.output_shape(), 1.0, DType::Float16), gI = ctx.empty(L.input_shape(), DType::Float16);
    bprop_conv(L, F, E, gI);
    const std::vector<float> g = gI.to_vector<float>();
    CHECK(g[0] == 16.0f);
    CHECK(g[1] == float(16 * tap));
}

TEST_CASE("conv: misuse names the layer, the tensor, its shape and what is valid") {
    Context ctx(ContextOptions{"cpu"});
    auto message = [](auto&& f) {
        try {
            f();
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    CHECK_THAT(message([] { conv_layer(DType::Float32, 1, 3, 4, {1, 2, 2}, {1, 3, 3}); }),
               Catch::Matchers::Contains("along height the padded input (2 + 2 x 0 = 2) is smaller than the dilated filter"));
    CHECK_THAT(message([] { conv_layer(DType::Float32, 1, 3, 4, {1, 5, 5}, {1, 3, 3}, {0, -1, 0}); }),
               Catch::Matchers::Contains("along height pad=-1, stride=1, dilation=1"));
    CHECK_THAT(message([] { conv_layer(DType::Int32, 1, 3, 4, {1, 5, 5}, {1, 3, 3}); }),
               Catch::Matchers::Contains("conv_layer: dtype int32"));
    CHECK_THAT(message([] { conv_layer(DType::Float32, 0, 3, 4); }), Catch::Matchers::Contains("N=0, C=3, K=4"));
    CHECK_THAT(message([] { deconv_layer(DType::Float32, 1, 3, 4, {1, 1, 1}, {1, 1, 1}, {0, 0, 1}); }),
               Catch::Matchers::Contains("deconv_layer: along width the output size (1 - 1) x 1 - 2 x 1 + 1 x (1 - 1) + 1 = -1"));
    // Sizes whose arithmetic would leave int64 (padded inputs, dilated filters, a deconvolution's
    // output), and layers whose tensors pass kiln's element limit, are refused by name.
    const int64_t huge = int64_t(1) << 62;
    CHECK_THAT(message([&] { conv_layer(DType::Float32, huge, 3, 4, {1, 8, 8}, {1, 3, 3}); }),
               Catch::Matchers::Contains("conv_layer: N=4611686018427387904, C=3, K=4: the batch and the channel counts are "
                                         "at most 2^31 - 1 (2147483647)"));
    CHECK_THAT(message([&] { conv_layer(DType::Float32, 1, 3, 4, {1, 8, 8}, {1, 3, 3}, {0, huge, 0}); }),
               Catch::Matchers::Contains("conv_layer: along height image size=8, filter=3, pad=4611686018427387904, stride=1, "
                                         "dilation=1: each is at most 2^31 - 1 (2147483647)"));
    CHECK_THAT(message([&] { conv_layer(DType::Float32, 1, 3, 4, {1, 8, 8}, {1, 3, 3}, {0, 0, 0}, {1, 1, 1}, {1, 1, huge}); }),
               Catch::Matchers::Contains("along width image size=8, filter=3, pad=0, stride=1, dilation=4611686018427387904"));
    CHECK_THAT(message([&] { conv_layer(DType::Float32, 1, 3, 4, {1, INT64_MAX, 8}, {1, 3, 3}); }),
               Catch::Matchers::Contains("along height image size=9223372036854775807"));
    CHECK_THAT(message([] { conv_layer(DType::Float32, 1 << 30, 1 << 30, 4, {1, 1 << 20, 1 << 20}, {1, 1, 1}); }),
               Catch::Matchers::Contains("conv_layer: shape (1073741824, 1048576, 1048576, 1073741824) has") &&
                   Catch::Matchers::Contains("a kiln tensor has at most 2^60"));
    CHECK_THAT(message([] {
                   deconv_layer(DType::Float32, 1, 3, 4, {1, 1, 2147483647}, {1, 1, 2147483647}, {0, 0, 0}, {1, 1, 2147483647});
               }),
               Catch::Matchers::Contains("deconv_layer: shape (1, 4611686014132420609, 3)") &&
                   Catch::Matchers::Contains("at most 2^60"));
    const ConvLayer L = conv_layer(DType::Float32, 2, 3, 4, {1, 6, 6}, {1, 3, 3});
    Tensor I = ctx.zeros(L.input_shape()), F = ctx.zeros(L.filter_shape()), O = ctx.empty(L.output_shape());
    Tensor wrong = ctx.zeros({2, 6, 6, 5});
    CHECK_THAT(message([&] { fprop_conv(L, wrong, F, O); }),
               Catch::Matchers::Contains("fprop_conv: I (the input) is float32 (2, 6, 6, 5); for layer conv_layer(float32 N=2 "
                                         "C=3 K=4 image 1x6x6 filter 1x3x3 output 1x4x4") &&
                   Catch::Matchers::Contains("it must be (2, 1, 6, 6, 3) or (2, 6, 6, 3)"));
    CHECK_THAT(message([&] { fprop_conv(L, ctx.zeros({2, 36, 3}), F, O); }), Catch::Matchers::Contains("(2, 36, 3)"));
    Tensor I16 = ctx.zeros(L.input_shape(), DType::Float16);
    CHECK_THAT(message([&] { fprop_conv(L, I16, F, O); }),
               Catch::Matchers::Contains("I (the input) is float16 (2, 6, 6, 3), but the layer was made for float32"));
    ConvOptions slope;
    slope.slope = 0.1;
    CHECK_THAT(message([&] { fprop_conv(L, I, F, O, slope); }), Catch::Matchers::Contains("slope=0.1"));
    ConvOptions bias;
    bias.bias = ctx.zeros({3});
    CHECK_THAT(message([&] { fprop_conv(L, I, F, O, bias); }),
               Catch::Matchers::Contains("bias is float32 (3,); it holds one value per output channel: (4,) or (4, 1)"));
    ConvOptions x;
    x.X = ctx.zeros({2, 4, 4, 5});
    CHECK_THAT(message([&] { fprop_conv(L, I, F, O, x); }), Catch::Matchers::Contains("X is float32 (2, 4, 4, 5)"));
    Tensor gF = ctx.empty({4, 3, 3, 2});
    CHECK_THAT(message([&] { update_conv(L, I, O, gF); }), Catch::Matchers::Contains("grad_F (the filter's gradient"));
    Tensor gF_ok = ctx.empty(L.filter_shape());
    CHECK_THAT(message([&] { update_conv(L, I, O, gF_ok, 1.0, 0.0, ctx.zeros({3, 1})); }),
               Catch::Matchers::Contains("update_conv: grad_bias is float32 (3, 1); it holds one value per output channel: "
                                         "(4,) or (4, 1)"));
    CHECK_THAT(message([&] { update_conv(L, I, O, gF_ok, 1.0, 0.0, ctx.zeros({4}, DType::Int32)); }),
               Catch::Matchers::Contains("update_conv: grad_bias is int32 (4,); it must be a float tensor"));
    CHECK_THAT(message([&] { bprop_conv(L, F, Tensor(), I); }), Catch::Matchers::Contains("bprop_conv: E is an empty"));
}

TEST_CASE("conv kernels' fast division (kernels/cuda/fast_div.hpp) is exact for every dividend below 2^31") {
    std::mt19937 gen(42);
    std::vector<uint32_t> divisors;
    for (uint32_t d = 1; d <= 3000; ++d) divisors.push_back(d);
    for (uint32_t d : {(1u << 16) - 1, 1u << 16, (1u << 16) + 1, 1u << 30, (1u << 30) + 1, 3u << 29, (1u << 31) - 1})
        divisors.push_back(d);
    for (int i = 0; i < 2000; ++i) divisors.push_back(std::uniform_int_distribution<uint32_t>(1, (1u << 31) - 1)(gen));
    int64_t wrong = 0;
    for (uint32_t d : divisors) {
        const gemm::FastDiv f = gemm::fast_div(d);
        std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, (1u << 31) - 1, (1u << 31) - 2,
                                    (1u << 31) - d};
        for (int i = 0; i < 64; ++i) ns.push_back(std::uniform_int_distribution<uint32_t>(0, (1u << 31) - 1)(gen));
        for (uint32_t n : ns) {
            if (n >= (1u << 31)) continue;
            if (gemm::divide(n, f) != n / d) {
                if (wrong++ < 3) UNSCOPED_INFO(n << " / " << d << ": " << gemm::divide(n, f) << ", exact " << n / d);
            }
        }
    }
    CHECK(wrong == 0);
}
