// The public API's handles to memory and graphs: Tensor::data, Tensor::reshape_view and
// Expr::node_count, through <kiln/kiln.hpp> and what libkiln exports alone (this program links
// the shared library, not the library's objects).
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
