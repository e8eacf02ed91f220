// IR pieces: dtypes and promotion, shapes and broadcasting, views, hash-consing.
#include "tests/support/catch.hpp"
#include "tests/support/views.hpp"

#include "ir/error.hpp"
#include "ir/node.hpp"
#include "ir/view_ops.hpp"

#include <kiln/kiln.hpp>

#include <memory>
#include <vector>

using namespace kiln;

namespace {
using test::host_view;
}  // namespace

TEST_CASE("promotion follows NumPy within kiln's dtypes") {
    CHECK(promote(DType::Int8, DType::UInt8) == DType::Int16);
    CHECK(promote(DType::Int16, DType::UInt16) == DType::Int32);
    CHECK(promote(DType::Int32, DType::UInt32) == DType::Int64);
    CHECK(promote(DType::Int64, DType::UInt32) == DType::Int64);
    CHECK(promote(DType::UInt8, DType::UInt32) == DType::UInt32);
    CHECK(promote(DType::Int8, DType::Int64) == DType::Int64);
    CHECK(promote(DType::Float32, DType::Float64) == DType::Float64);
    CHECK(promote(DType::Float16, DType::Float64) == DType::Float64);
    CHECK(promote(DType::Int64, DType::Float64) == DType::Float64);
    CHECK(promote(DType::Int64, DType::Float32) == DType::Float32);   // kiln keeps float32 (NumPy: float64)
    CHECK(promote(DType::Int16, DType::Float16) == DType::Float32);
    CHECK(promote(DType::UInt8, DType::BFloat16) == DType::BFloat16);
    CHECK(promote(DType::Int8, DType::Float16) == DType::Float16);
    CHECK(promote(DType::Int32, DType::Float16) == DType::Float32);
    CHECK(promote(DType::Float16, DType::BFloat16) == DType::Float32);
    CHECK(promote(DType::Bool, DType::UInt8) == DType::UInt8);
    Expr a = leaf(host_view({2, 3}, DType::Float16));
    Expr i = leaf(host_view({2, 3}, DType::Int8));
    CHECK((a * 2.5).dtype() == DType::Float16);   // weak scalar keeps the tensor's float type
    CHECK((i * 2).dtype() == DType::Int8);
    CHECK((i * 2.5).dtype() == DType::Float32);   // int tensor with a float literal
    CHECK((i / i).dtype() == DType::Float32);     // true division
    CHECK(sqrt(i).dtype() == DType::Float16);     // NumPy: small ints give float16
    CHECK((i < 3).dtype() == DType::Bool);
    CHECK(sum(i).dtype() == DType::Int32);
    CHECK(mean(i).dtype() == DType::Float32);
    CHECK(argmax(a, 1).dtype() == DType::Int32);
    // A literal meeting a 64-bit operand takes its dtype (a 64-bit kernel parameter).
    Expr d = leaf(host_view({2, 3}, DType::Float64));
    Expr l = leaf(host_view({2, 3}, DType::Int64));
    CHECK((d * 0.1).dtype() == DType::Float64);
    CHECK((l * 2).dtype() == DType::Int64);
    CHECK((l + 4294967296.0).dtype() == DType::Float32);   // a float literal with an integer tensor
    CHECK((l * 2).node()->inputs[1]->dtype == DType::Int64);
    CHECK((d * 0.1).node()->inputs[1]->dtype == DType::Float64);
    CHECK((d + a).dtype() == DType::Float64);
}

TEST_CASE("broadcasting and reduction shapes") {
    CHECK(broadcast_shapes({3, 1, 5}, {4, 1}, "t") == Shape{3, 4, 5});
    CHECK_THROWS_AS(broadcast_shapes({3}, {4}, "t"), Error);
    Expr a = leaf(host_view({4, 6}));
    CHECK(sum(a, 1).shape() == Shape{4, 1});
    CHECK(sum(a, 1, false).shape() == Shape{4});
    CHECK(sum(a, -2, false).shape() == Shape{6});
    CHECK(sum(a).shape() == Shape{1, 1});
    CHECK(onehot(leaf(host_view({5}, DType::Int32)), 3, 0).shape() == Shape{3, 5});
    CHECK(take(a, leaf(host_view({2, 2}, DType::Int32)), 1).shape() == Shape{4, 2, 2});
    // A literal (rank 0, kept so by reshape) flattened: the indices' shape, the literal's dtype.
    const Expr lit = take(scalar(2.5, DType::Float32), leaf(host_view({2, 3}, DType::Int32)), std::nullopt);
    CHECK((lit.shape() == Shape{2, 3} && lit.dtype() == DType::Float32));
    CHECK(take(scalar(2.5, DType::Float32), leaf(host_view({}, DType::Int32)), std::nullopt).shape() == Shape{});
    CHECK_THROWS_WITH(take(scalar(2.5, DType::Float32), leaf(host_view({2}, DType::Int32)), 0),
                      Catch::Contains("take: axis 0 given for a 0-d (scalar) operand"));
}

TEST_CASE("views: slicing with steps, transpose, reshape") {
    View v = host_view({4, 6});
    View s = slice_view(v, {Slice::range(1, 4, 2), Slice::range(Slice::kNone, Slice::kNone, -2)});
    CHECK(s.shape == Shape{2, 3});
    CHECK(s.strides == Strides{12, -2});
    CHECK(s.offset == 6 + 5);
    View t = transpose_view(v, {});
    CHECK(t.shape == Shape{6, 4});
    CHECK(t.strides == Strides{1, 6});
    CHECK(reshape_view(v, {2, 12})->strides == Strides{12, 1});
    CHECK_FALSE(reshape_view(t, {24}).has_value());        // a transpose cannot be flattened in place
    View col = slice_view(v, {Slice::all(), Slice::range(0, 3)});
    auto r = reshape_view(col, {2, 2, 3});
    REQUIRE(r.has_value());
    CHECK(r->strides == Strides{12, 6, 1});
    CHECK(slice_view(v, {Slice::at(-1)}).offset == 18);
}

TEST_CASE("nodes are hash-consed: equal subtrees are one node") {
    Expr a = leaf(host_view({8, 4}));
    Expr m1 = mean(a, 1), m2 = mean(a, 1);
    CHECK(m1.node() == m2.node());
    CHECK((a + 1.0).node() == (a + 1.0).node());
    CHECK((a + 1.0).node() != (a + 2.0).node());
    CHECK(rand({2}).node() != rand({2}).node());  // every rand() is its own draw
    size_t before = live_node_count();
    {
        Expr tmp = exp(a) * 3.0;
        CHECK(live_node_count() > before);
    }
    CHECK(live_node_count() == before);  // dead nodes leave the table
}

TEST_CASE("the node table stays shared past its first buckets, and dying nodes leave it") {
    Expr a = leaf(host_view({8, 4}));
    const size_t before = live_node_count();
    {
        std::vector<Expr> kept;
        for (int i = 0; i < 5000; ++i) kept.push_back(a * (double)i + 1.0);  // 10000 nodes: the table doubles
        CHECK(live_node_count() >= before + 10000);
        for (int i = 0; i < 5000; i += 7) CHECK((a * (double)i + 1.0).node() == kept[(size_t)i].node());
        for (int i = 0; i < 5000; i += 2) kept[(size_t)i] = Expr();   // half of them die
        for (int i = 1; i < 5000; i += 2 * 7) CHECK((a * (double)i + 1.0).node() == kept[(size_t)i].node());
        for (int i = 0; i < 5000; i += 2 * 7) CHECK((a * (double)i + 1.0).node() != nullptr);
    }
    CHECK(live_node_count() == before);
}

TEST_CASE("a tensor's leaf is made once: its expression is the same node every time") {
    Context ctx(ContextOptions{"cpu"});
    Tensor t = ctx.empty({3, 4});
    const uint64_t id = t.expr().node()->id;   // the expression dies here; the tensor keeps its leaf
    CHECK(Expr(t).node()->id == id);
    CHECK(Tensor(t).expr().node()->id == id);  // copies share it
    Tensor s = t.slice({Slice::all(), Slice::range(1, 3)});
    CHECK(s.expr().node()->id != id);           // a view is its own leaf
    CHECK(s.expr().node()->view.offset == 1);
    CHECK_THROWS_WITH(Tensor().expr(), Catch::Contains("an empty kiln::Tensor"));
}

TEST_CASE("integer scalars hold their exact value: literals past 2^53 are distinct nodes and reach int64 exactly") {
    const int64_t big = (int64_t(1) << 53) + 1;
    Expr a(big), b(big - 1);
    REQUIRE(a.node()->value == b.node()->value);   // the same double
    CHECK(a.node() != b.node());                   // yet two nodes
    CHECK(a.node()->ivalue == big);
    Expr c = cast(a, DType::Int64);                // a scalar cast keeps the integer
    CHECK(c.node()->op == OpKind::Scalar);
    CHECK(c.node()->ivalue == big);
    CHECK(cast(Expr(int64_t(-1)), DType::UInt32).node()->ivalue == 4294967295);
    CHECK(int_scalar(INT64_MAX, DType::Int64).node()->ivalue == INT64_MAX);
    CHECK_THROWS_WITH(int_scalar(int64_t(1) << 40, DType::Int32),
                      Catch::Contains("out of range for int32 (valid: -2147483648 to 2147483647)"));
    // uint64: its bits. From a double past 2^63, a Python int past 2^63, a typed -1 cast to it.
    CHECK((uint64_t)scalar(1e19, DType::UInt64).node()->ivalue == 10000000000000000000ull);
    const Expr u = uint_literal(18446744073709551615ull);
    CHECK((uint64_t)cast(u, DType::UInt64).node()->ivalue == 18446744073709551615ull);
    CHECK_THROWS_WITH(cast(u, DType::Int64), Catch::Contains("out of range for int64"));
    CHECK((uint64_t)cast(int_scalar(-1, DType::Int32), DType::UInt64).node()->ivalue == 18446744073709551615ull);
    CHECK_THROWS_WITH(cast(Expr(int64_t(-1)), DType::UInt64),
                      Catch::Contains("the integer literal -1 is out of range for uint64 (0 to 18446744073709551615)"));
}
