#include <kiln/shape.hpp>

#include "ir/error.hpp"

#include <fmt/format.h>

namespace kiln {

namespace {

// The product of the non-zero dims, or -1 when it passes kMaxElements.
int64_t nonzero_product(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) {
        if (d == 0) continue;
        if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxElements) return -1;
    }
    return n;
}

[[noreturn]] void too_large(const Shape& s, const char* op) {
    long double count = 1;
    for (int64_t d : s) count *= (long double)d;
    fail(Error::Kind::Value, "{}: shape {} has {:.4g} elements; a kiln tensor has at most 2^60 ({})", op, shape_str(s),
         (double)count, kMaxElements);
}

} // namespace

void check_shape(const Shape& s, const char* op) {
    for (int64_t d : s)
        if (d < 0) fail(Error::Kind::Value, "{}: negative dimension {} in shape {}", op, d, shape_str(s));
    if (nonzero_product(s) < 0) too_large(s, op);
}

int64_t numel(const Shape& s) {
    for (int64_t d : s)
        if (d == 0) return 0;
    int64_t n = nonzero_product(s);
    if (n < 0) too_large(s, "shape");
    return n;
}

Strides contiguous_strides(const Shape& s) {
    Strides st(s.size());
    int64_t acc = 1;
    for (size_t i = s.size(); i-- > 0;) {
        st[i] = acc;
        acc *= s[i];
    }
    return st;
}

std::string shape_str(const Shape& s) {
    if (s.size() == 1) return fmt::format("({},)", s[0]);
    return fmt::format("({})", fmt::join(s, ", "));
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
    size_t r = std::max(a.size(), b.size());
    Shape out(r);
    for (size_t i = 0; i < r; ++i) {
        int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
        int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
        if (da != db && da != 1 && db != 1)
            fail(Error::Kind::Value,
                 "{}: operands could not be broadcast together with shapes {} and {} (dimension {} from the right: {} vs {}; "
                 "sizes must be equal or one of them 1)",
                 op, shape_str(a), shape_str(b), r - i, da, db);
        out[i] = da == 1 ? db : da;
    }
    return out;
}

bool broadcastable_to(const Shape& from, const Shape& to) {
    if (from.size() > to.size()) return false;
    size_t off = to.size() - from.size();
    for (size_t i = 0; i < from.size(); ++i)
        if (from[i] != 1 && from[i] != to[i + off]) return false;
    return true;
}

int normalize_axis(int64_t axis, int rank, const char* op) {
    if (rank == 0) fail(Error::Kind::Index, "{}: axis {} given for a 0-d (scalar) operand, which has no axes", op, axis);
    if (axis < -rank || axis >= rank)
        fail(Error::Kind::Index, "{}: axis {} is out of range for a tensor of rank {} (valid: {} to {})", op, axis,
             rank, -rank, rank - 1);
    return int(axis < 0 ? axis + rank : axis);
}

} // namespace kiln
