// The public API's handles to memory and graphs: Tensor::data, Tensor::reshape_view and
// Expr::node_count, and a convolution, through <kiln/kiln.hpp> and what libkiln exports alone
// (this program links the shared library, not the library's objects).
#include "tests/support/catch.hpp"

#include <kiln/kiln.hpp>

#include <cstring>
#include <vector>

using namespace kiln;

TEST_CASE("Tensor::data is element (0, ..., 0) of any view; reshape_view never copies") {
    Context ctx(ContextOptions{"cpu"});
    std::vector<float> host(24);
    for (size_t i = 0; i < host.size(); ++i) host[i] = float(i);
    Tensor a = ctx.array(host, {4, 6});
    CHECK(std::memcmp(a.data(), host.data(), host.size() * sizeof(float)) == 0);
    Tensor row2 = a[2];
    CHECK(*static_cast<const float*>(row2.data()) == 12.0f);
    Tensor tail = a.slice({Slice::all(), Slice::range(3, 6)});
    CHECK(*static_cast<const float*>(tail.data()) == 3.0f);

    std::optional<Tensor> flat = a.reshape_view({-1});
    REQUIRE(flat);
    CHECK(flat->shape() == Shape{24});
    CHECK(flat->data() == a.data());
    CHECK(!tail.reshape_view({12}));            // strided: a copy would be needed
    CHECK(tail.reshape({12}).to_vector<float>()[3] == 9.0f);
    CHECK_THROWS_AS(a.reshape_view({5, 5}), Error);
    CHECK_THROWS_AS(Tensor().data(), Error);
}

TEST_CASE("Expr::node_count counts a repeated subexpression once") {
    Context ctx(ContextOptions{"cpu"});
    Tensor a = ctx.ones({8, 4}, DType::Float32);
    Expr m = mean(a, 1);
    Expr e = (a - m) * (a - m);   // leaf, mean's nodes, one subtract, one multiply
    CHECK(e.node_count() == m.node_count() + 2);
    CHECK(Expr().node_count() == 0);
}

TEST_CASE("convolution through libkiln's exported API: a 3x3 box filter over a 4x4 image") {
    kiln::Context ctx(kiln::ContextOptions{"cpu"});
    const kiln::ConvLayer L = kiln::conv_layer(kiln::DType::Float32, 1, 1, 1, {1, 4, 4}, {1, 3, 3}, {0, 1, 1});
    std::vector<float> img(16);
    for (int i = 0; i < 16; ++i) img[i] = (float)i;
    kiln::Tensor I = ctx.array(img, L.input_shape()), F = ctx.array(std::vector<float>(9, 1.0f), L.filter_shape());
    kiln::Tensor O = ctx.empty(L.output_shape());
    kiln::fprop_conv(L, I, F, O);
    const std::vector<float> o = O.to_vector<float>();
    CHECK(o[0] == 0 + 1 + 4 + 5);              // a corner: four taps inside the image
    CHECK(o[5] == 0 + 1 + 2 + 4 + 5 + 6 + 8 + 9 + 10);
}
