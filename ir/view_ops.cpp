#include "ir/view_ops.hpp"

#include "ir/error.hpp"

#include <algorithm>

namespace kiln {

View slice_view(const View& v, const std::vector<Slice>& slices) {
    if (slices.size() > v.shape.size())
        fail(Error::Kind::Index, "slice: {} indices given for a tensor of shape {} (at most {})", slices.size(),
             shape_str(v.shape), v.shape.size());
    View out = v;
    out.shape.clear();
    out.strides.clear();
    for (size_t d = 0; d < v.shape.size(); ++d) {
        int64_t n = v.shape[d];
        Slice s = d < slices.size() ? slices[d] : Slice::all();
        if (s.is_index) {
            int64_t i = s.start < 0 ? s.start + n : s.start;
            if (i < 0 || i >= n)
                fail(Error::Kind::Index, "slice: index {} is out of range for dimension {} of size {} (valid: {} to {})",
                     s.start, d, n, -n, n - 1);
            out.offset += i * v.strides[d];
            continue;
        }
        if (s.step == 0) fail(Error::Kind::Value, "slice: step must not be 0 (dimension {} of shape {})", d, shape_str(v.shape));
        int64_t step = s.step, start, stop;
        // Python's slice.indices()
        auto clampi = [&](int64_t x, int64_t def, bool neg_step) {
            if (x == Slice::kNone) return def;
            if (x < 0) x += n;
            if (neg_step) return std::clamp<int64_t>(x, -1, n - 1);
            return std::clamp<int64_t>(x, 0, n);
        };
        if (step > 0) {
            start = clampi(s.start, 0, false);
            stop = clampi(s.stop, n, false);
        } else {
            start = clampi(s.start, n - 1, true);
            stop = clampi(s.stop, -1, true);
        }
        // Written so that no step, however large, overflows: a step past the end takes one element.
        int64_t len = step > 0 ? (stop > start ? (stop - start - 1) / step + 1 : 0)
                               : (start > stop ? (start - stop - 1) / -std::max(step, -kMaxElements) + 1 : 0);
        if (len > 0) out.offset += start * v.strides[d];
        out.shape.push_back(len);
        out.strides.push_back(len > 1 ? v.strides[d] * step : v.strides[d]);
    }
    return out;
}

View transpose_view(const View& v, const std::vector<int>& perm_in) {
    int r = (int)v.shape.size();
    std::vector<int> perm = perm_in;
    if (perm.empty())
        for (int i = r - 1; i >= 0; --i) perm.push_back(i);
    std::vector<bool> seen(r, false);
    bool ok = (int)perm.size() == r;
    for (int p : perm) {
        if (!ok) break;
        if (p < 0) p += r;
        if (p < 0 || p >= r || seen[p]) ok = false;
        else seen[p] = true;
    }
    if (!ok) {
        std::vector<int> shown(perm_in.begin(), perm_in.end());
        fail(Error::Kind::Value, "transpose: axes ({}) are not a permutation of 0..{} for a tensor of shape {}",
             fmt::join(shown, ", "), r - 1, shape_str(v.shape));
    }
    View out = v;
    for (int i = 0; i < r; ++i) {
        int p = perm[i] < 0 ? perm[i] + r : perm[i];
        out.shape[i] = v.shape[p];
        out.strides[i] = v.strides[p];
    }
    return out;
}

Shape resolve_reshape(const Shape& from, const Shape& to, const char* op) {
    Shape s = to;
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < (int)s.size(); ++i) {
        if (s[i] == -1) {
            if (infer >= 0) fail(Error::Kind::Value, "{}: only one dimension can be -1 in {}", op, shape_str(to));
            infer = i;
        } else if (s[i] < 0) {
            fail(Error::Kind::Value, "{}: negative dimension {} in {}", op, s[i], shape_str(to));
        } else if (__builtin_mul_overflow(known, s[i], &known) || known > kMaxElements) {
            fail(Error::Kind::Value, "{}: cannot reshape {} ({} elements) into {}: more than 2^60 elements", op,
                 shape_str(from), numel(from), shape_str(to));
        }
    }
    int64_t total = numel(from);
    if (infer >= 0) {
        if (known == 0 || total % known != 0)
            fail(Error::Kind::Value, "{}: cannot reshape {} ({} elements) into {}", op, shape_str(from), total,
                 shape_str(to));
        s[infer] = total / known;
    } else if (known != total) {
        fail(Error::Kind::Value, "{}: cannot reshape {} ({} elements) into {} ({} elements)", op, shape_str(from),
             total, shape_str(to), known);
    }
    return s;
}

std::optional<View> reshape_view(const View& v, const Shape& to) {
    View out = v;
    out.shape = to;
    if (numel(to) == 0 || v.is_contiguous()) {
        out.strides = contiguous_strides(to);
        if (v.is_contiguous()) return out;
        return out;
    }
    // Drop size-1 dims of the source; walk groups of old and new dims with equal products.
    Shape os;
    Strides ost;
    for (size_t i = 0; i < v.shape.size(); ++i)
        if (v.shape[i] != 1) { os.push_back(v.shape[i]); ost.push_back(v.strides[i]); }
    Strides nst(to.size(), 0);
    size_t oi = 0, ni = 0;
    while (ni < to.size() || oi < os.size()) {
        if (ni < to.size() && to[ni] == 1) { nst[ni] = 0; ++ni; continue; }
        if (oi >= os.size() || ni >= to.size()) return std::nullopt;
        size_t o0 = oi, n0 = ni;
        int64_t op = os[oi++], np = to[ni++];
        while (op != np) {
            if (op < np) { if (oi >= os.size()) return std::nullopt; op *= os[oi++]; }
            else { if (ni >= to.size()) return std::nullopt; np *= to[ni++]; }
        }
        for (size_t k = o0; k + 1 < oi; ++k)
            if (ost[k] != ost[k + 1] * os[k + 1]) return std::nullopt;  // group not contiguous in memory
        int64_t st = ost[oi - 1];
        for (size_t k = ni; k-- > n0;) {
            nst[k] = st;
            st *= to[k];
        }
    }
    out.strides = nst;
    return out;
}

} // namespace kiln
