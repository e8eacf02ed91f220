// The differential test's generator: views of base tensors (strided, reversed, transposed,
// index-dropped) and the random graphs, each built in lock step as a kiln Expr and as a
// reference node.
#pragma once
#include "tests/differential/reference.hpp"

namespace {

// ======================================================================================
// Views: strided, reversed, transposed, index-dropped windows of a contiguous base tensor
// ======================================================================================

struct ViewSpec {
    Shape base;
    std::vector<kiln::Slice> slices;  // applied to the base (empty: the whole base)
    std::vector<int> perm;            // then transposed (empty: not)
    std::vector<int64_t> map;         // view row-major index -> base row-major index
    std::string desc;
};

std::string slice_s(const kiln::Slice& s) {
    auto v = [](int64_t x) { return x == kiln::Slice::kNone ? std::string() : std::to_string(x); };
    if (s.is_index) return std::to_string(s.start);
    return v(s.start) + ":" + v(s.stop) + (s.step != 1 ? ":" + std::to_string(s.step) : "");
}

// A view of shape `S`; `strided` allows steps/negative steps/transposes/dropped indices.
ViewSpec make_view(Rng& rng, const Shape& S, bool strided, int64_t base_budget = 20000) {
    ViewSpec vs;
    const int r = (int)S.size();
    if (!strided) {
        vs.base = S;
        vs.map.resize(count(S));
        for (size_t i = 0; i < vs.map.size(); ++i) vs.map[i] = (int64_t)i;
        vs.desc = "contiguous";
        return vs;
    }
    // transpose: the pre-transpose shape P has P[perm[i]] = S[i]
    std::vector<int> perm(r);
    for (int i = 0; i < r; ++i) perm[i] = i;
    bool transposed = r >= 2 && rng.chance(0.4);
    if (transposed) {
        if (rng.chance(0.5)) std::reverse(perm.begin(), perm.end());  // .T()
        else
            for (int i = r - 1; i > 0; --i) std::swap(perm[i], perm[rng.range(0, i)]);
    }
    Shape P(r);
    for (int i = 0; i < r; ++i) P[perm[i]] = S[i];
    struct Dim { int64_t len, start, step; bool index; };
    std::vector<Dim> dims;
    int64_t budget = base_budget;
    int64_t total = 1;
    for (int j = 0; j < r; ++j) total *= std::max<int64_t>(P[j], 1);
    for (int j = 0; j < r; ++j) {
        int64_t n = P[j];
        int64_t step = 1;
        if (n > 0 && rng.chance(0.5)) step = rng.pick<int64_t>({2, 3, -1, -1, -2});
        if (total * std::abs(step) * 2 > budget) step = step < 0 ? -1 : 1;
        total *= std::abs(step);
        int64_t lo = rng.range(0, 2), hi = rng.range(0, 2);
        int64_t span = n > 0 ? (n - 1) * std::abs(step) + 1 : 0;
        int64_t len = lo + span + hi;
        int64_t start = step > 0 ? lo : len - 1 - hi;
        dims.push_back({len, start, step, false});
    }
    // an extra base dim selected by a single index (dropped from the view)
    int extra_at = -1;
    int64_t extra_len = 0, extra_idx = 0;
    if (rng.chance(0.2) && r < 4) {
        extra_at = (int)rng.range(0, r);
        extra_len = rng.range(2, 3);
        extra_idx = rng.range(-extra_len, extra_len - 1);
    }
    std::vector<int> base_dim_of(r);
    for (int j = 0, b = 0; j <= r; ++j) {
        if (j == extra_at) {
            vs.base.push_back(extra_len);
            vs.slices.push_back(kiln::Slice::at(extra_idx));
            ++b;
        }
        if (j == r) break;
        const Dim& d = dims[j];
        base_dim_of[j] = b++;
        vs.base.push_back(d.len);
        int64_t n = P[j];
        kiln::Slice s;
        if (d.step > 0) {
            int64_t stop = d.start + (n - 1) * d.step + 1;
            s = kiln::Slice::range(d.start, stop, d.step);
            if (d.start == 0 && rng.chance(0.5)) s.start = kiln::Slice::kNone;
            else if (rng.chance(0.3)) s.start = d.start - d.len;  // negative start
            if (stop == d.len && rng.chance(0.5)) s.stop = kiln::Slice::kNone;
        } else {
            int64_t last = d.start + (n - 1) * d.step;
            int64_t stop = last - 1;
            s = kiln::Slice::range(d.start, stop < 0 ? kiln::Slice::kNone : stop, d.step);
            if (d.start == d.len - 1 && rng.chance(0.5)) s.start = kiln::Slice::kNone;
        }
        vs.slices.push_back(s);
    }
    bool trivial = extra_at < 0;
    for (int j = 0; j < r; ++j)
        if (dims[j].step != 1 || dims[j].len != P[j]) trivial = false;
    if (trivial) vs.slices.clear();
    if (transposed) vs.perm = perm;
    // the map, computed from the definition (not from kiln's strides)
    Shape bst(vs.base.size());
    {
        int64_t acc = 1;
        for (size_t d = vs.base.size(); d-- > 0;) { bst[d] = acc; acc *= vs.base[d]; }
    }
    int64_t fixed = 0;
    if (extra_at >= 0) fixed = (extra_idx < 0 ? extra_idx + extra_len : extra_idx) * bst[extra_at];
    int64_t n = count(S);
    vs.map.resize(n);
    for (int64_t i = 0; i < n; ++i) {
        auto c = unravel(i, S);
        int64_t off = fixed;
        for (int d = 0; d < r; ++d) {
            int j = perm[d];  // view dim d is pre dim perm[d]
            off += (dims[j].start + c[d] * dims[j].step) * bst[base_dim_of[j]];
        }
        vs.map[i] = off;
    }
    vs.desc = "base " + shape_s(vs.base);
    if (!vs.slices.empty()) {
        vs.desc += "[";
        for (size_t k = 0; k < vs.slices.size(); ++k) vs.desc += (k ? "," : "") + slice_s(vs.slices[k]);
        vs.desc += "]";
    }
    if (transposed) {
        vs.desc += ".transpose(";
        for (int i = 0; i < r; ++i) vs.desc += (i ? "," : "") + std::to_string(perm[i]);
        vs.desc += ")";
    }
    return vs;
}

Tensor apply_view(const Tensor& base, const ViewSpec& vs) {
    Tensor t = base;
    if (!vs.slices.empty()) t = t.slice(vs.slices);
    if (!vs.perm.empty()) {
        bool reversed = true;  // all dims reversed: the spelling A.T()
        for (size_t i = 0; i < vs.perm.size(); ++i) reversed &= vs.perm[i] == (int)(vs.perm.size() - 1 - i);
        t = reversed ? t.T() : t.transpose(vs.perm);
    }
    return t;
}

// ======================================================================================
// The generator: kiln Expr and reference node built in lock step
// ======================================================================================

struct Built {
    Expr e;
    RP r;
};

enum class Kind { Random, Template, InPlace, Overlap, Special, Focus };

const char* kind_name(Kind k) {
    switch (k) {
    case Kind::Random: return "random";
    case Kind::Template: return "nested-reduction template";
    case Kind::InPlace: return "in-place";
    case Kind::Overlap: return "overlapping views";
    case Kind::Special: return "special values";
    case Kind::Focus: return "take/onehot/rand";
    }
    return "?";
}

const std::vector<int64_t> kSizes = {1, 1, 2, 3, 3, 4, 5, 7, 7, 8, 16, 17, 17, 33, 64, 129};

class Gen {
public:
    kiln::Context& ctx;
    Rng& rng;
    bool special = false;
    bool rand_used = false;
    uint32_t seed32 = 0;
    uint64_t ctx_seed = 0;
    DType main = DType::Float32;
    int ops = 0, max_ops = 12;
    std::string mismatch;  // first dtype/shape disagreement between kiln and the reference
    std::vector<std::string> leaves;
    std::vector<Tensor> keep;
    std::vector<Built> pool;  // leaves the generator must prefer (views of the destination)
    bool pool_used = false;
    int64_t composite[4] = {0, 0, 0, 0};  // clip, mean, var, std calls

    Gen(kiln::Context& c, Rng& r) : ctx(c), rng(r) {
        ctx_seed = rng.next();
        seed32 = (uint32_t)(ctx_seed ^ (ctx_seed >> 32));
    }

    // ---- checks
    Built chk(Expr e, RP r, const char* what) {
        if (mismatch.empty()) {
            if (e.dtype() != r->dtype)
                mismatch = std::string(what) + ": kiln dtype " + dname(e.dtype()) + ", reference dtype " + dname(r->dtype) +
                           " (shape " + shape_s(r->shape) + ")";
            else if (e.shape() != r->shape)
                mismatch = std::string(what) + ": kiln shape " + shape_s(e.shape()) + ", reference shape " + shape_s(r->shape);
        }
        return Built{std::move(e), std::move(r)};
    }

    static double limit(DType t) {
        switch (t) {
        case DType::Float16: return 3e4;
        case DType::BFloat16: return 1e5;
        case DType::Float32: return 1e6;
        case DType::Int32: return 268435456.0;
        default: return INFINITY;
        }
    }
    static double maxabs(const RP& r) {
        double m = 0;
        for (double x : r->v) m = std::max(m, std::fabs(x));
        return m;
    }
    static double minv(const RP& r) {
        double m = INFINITY;
        for (double x : r->v) m = std::min(m, x);
        return m;
    }
    static double minabs(const RP& r) {
        double m = INFINITY;
        for (double x : r->v) m = std::min(m, std::fabs(x));
        return m;
    }
    // Finite, within the dtype's comfortable range, a usable error bound, mostly stable.
    bool sane(const RP& r) const {
        if (special) return true;
        const double lim = limit(r->dtype);
        const double rel = is16(r->dtype) ? 5e-2 : 1e-2;
        int64_t unstable = 0;
        for (int64_t i = 0; i < r->n(); ++i) {
            double v = r->v[i];
            if (!std::isfinite(v) || std::fabs(v) > lim) return false;
            if (r->e[i] > rel * (std::fabs(v) + 1)) return false;
            unstable += r->u[i];
        }
        return unstable * 2 <= r->n();
    }

    // ---- leaves
    double leaf_value(DType t, int mode) {
        // mode 0: any sign; 1: positive
        switch (t) {
        case DType::Bool: return mode == 1 ? (rng.chance(0.85) ? 1 : 0) : (rng.chance(0.5) ? 1 : 0);
        case DType::Int8:
            if (mode == 1) return (double)rng.range(1, 12);
            return rng.chance(0.3) ? (double)rng.range(-128, 127) : (double)rng.range(-12, 12);
        case DType::UInt8:
            if (mode == 1) return (double)rng.range(1, 12);
            return rng.chance(0.3) ? (double)rng.range(0, 255) : (double)rng.range(0, 12);
        case DType::Int32:
        case DType::Int16:   // (only as a result dtype: int8 with uint8)
            if (mode == 1) return (double)rng.range(1, 100);
            return rng.chance(0.2) ? (double)rng.range(-3000, 3000) : (double)rng.range(-60, 60);
        default: {
            double x;
            int k = (int)rng.range(0, 9);
            if (mode == 1) x = k < 3 ? 0.25 * (double)rng.range(1, 16) : rng.uni(0.1, 4.0);
            else if (k < 2) x = 0.25 * (double)rng.range(-16, 16);  // exact halves/quarters: ties for rint/compare
            else if (k < 3) x = (double)rng.range(-5, 5);
            else x = rng.uni(-3.0, 3.0);
            return round_float(t, x);
        }
        }
    }

    double special_value(DType t) {
        double r = rng.uni();
        if (r < 0.12) return NAN;
        if (r < 0.22) return INFINITY;
        if (r < 0.32) return -INFINITY;
        if (r < 0.38) return -0.0;
        return leaf_value(t, 0);
    }

    Tensor upload(const std::vector<double>& vals, const Shape& s, DType t) {
        if (isf(t)) {
            std::vector<float> f(vals.begin(), vals.end());
            return ctx.array(f.data(), f.size(), DType::Float32, s, t);
        }
        std::vector<int32_t> i(vals.size());
        for (size_t k = 0; k < vals.size(); ++k) i[k] = (int32_t)vals[k];
        return ctx.array(i.data(), i.size(), DType::Int32, s, t);
    }

    Built leaf(const Shape& s, DType t, int mode = -1, bool allow_view = true) {
        if (mode < 0) mode = rng.chance(0.35) ? 1 : 0;
        ViewSpec vs = make_view(rng, s, allow_view && rng.chance(0.4));
        std::vector<double> base((size_t)count(vs.base));
        bool specials = special && isf(t) && rng.chance(0.8);
        for (auto& x : base) x = specials ? special_value(t) : leaf_value(t, mode);
        std::vector<double> vals(vs.map.size());
        for (size_t i = 0; i < vals.size(); ++i) vals[i] = base[vs.map[i]];
        // never all zeros
        bool nonzero = false;
        for (double x : vals) nonzero |= x != 0;
        if (!nonzero && !vals.empty()) {
            base[vs.map[rng.next() % vals.size()]] = 1;
            for (size_t i = 0; i < vals.size(); ++i) vals[i] = base[vs.map[i]];
        }
        Tensor b = upload(base, vs.base, t);
        Tensor v = apply_view(b, vs);
        keep.push_back(b);
        std::string desc = "%" + std::to_string(g_next_id + 1) + " " + dname(t) + " " + shape_s(s) + " " + vs.desc;
        leaves.push_back(desc);
        return chk(v.expr(), r_leaf(t, s, vals, vs.desc), "tensor");
    }

    DType leaf_dtype() { return rng.chance(0.7) ? main : rng.pick(kAllDTypes); }

    Built terminal(const Shape& T) {
        for (auto& p : pool)
            if (p.r->shape == T && rng.chance(0.75)) {
                pool_used = true;
                return p;
            }
        if (!special && !rand_used && rng.chance(0.05)) return make_rand(T);
        if (!special && !T.empty() && rng.chance(0.03)) {
            int axis = (int)rng.range(0, (int)T.size() - 1);
            int arg = rng.chance(0.5) ? axis : axis - (int)T.size();
            return chk(kiln::iota(T, arg), r_iota(T, axis), "iota");
        }
        return leaf(T, leaf_dtype());
    }

    Built make_rand(const Shape& T) {
        // A rank-0 rand() draws per point of the kernel it lands in (the fixed test below pins
        // that); the reference draws per element of a node's own shape, so it gets rank >= 1.
        if (T.empty()) return leaf(T, leaf_dtype());
        rand_used = true;
        Shape s = T;
        for (auto& d : s)
            if (rng.chance(0.3)) d = 1;  // a smaller draw broadcast over the result
        while (s.size() > 1 && rng.chance(0.2)) s.erase(s.begin());
        Built r = chk(kiln::rand(s), r_rand(s, seed32, 0), "rand");
        if (s == T) return r;
        return apply_binary(rng.pick({Op::Add, Op::Mul, Op::Lt}), r, leaf(T, leaf_dtype()));
    }

    // ---- scalars
    Built weak_float(double v) { return chk(Expr(v), r_scalar(v, DType::Float32, true), "weak float"); }
    Built weak_int(int v) { return chk(Expr(v), r_scalar(v, DType::Int32, true), "weak int"); }
    Built typed_scalar(double v, DType t) { return chk(kiln::scalar(v, t), r_scalar(v, t, false), "typed scalar"); }

    int const_depth = 0;

    // A constant subexpression (literals combined by ops): the compiler folds these.
    Built compound_constant(const RP& other) {
        ++const_depth;
        Built a = scalar_for(other);
        Built y;
        double r = rng.uni();
        if (r < 0.35)
            y = apply_binary(rng.pick({Op::Add, Op::Mul, Op::Sub, Op::Maximum, Op::Minimum, Op::Div, Op::FloorDiv, Op::Mod}),
                             a, scalar_for(other));
        else if (r < 0.6)
            y = apply_unary(rng.pick({Op::Neg, Op::Abs, Op::Exp, Op::Sqrt, Op::Square, Op::Recip, Op::Tanh, Op::Rint}), a);
        else if (r < 0.8)
            y = cast(a, rng.pick(kAllDTypes));
        else
            y = clip(a, weak_float(-1.25), weak_float(1.25));
        --const_depth;
        return y;
    }

    // A literal that combines with `other` without leaving its dtype's range: kiln converts a
    // weak literal to the tensor's dtype, so an out-of-range one (int8 tensor < 200, uint8 + -3)
    // wraps, where NumPy 2 compares exactly or raises. That choice is not what is tested here.
    Built scalar_for(const RP& other) {
        if (const_depth < 2 && rng.chance(0.12)) return compound_constant(other);
        DType ot = other->dtype;
        double r = rng.uni();
        if (r < 0.4) {
            double v = rng.pick({0.5, 2.0, -1.5, 3.0, 0.25, -0.75, 1.25, 0.1, -2.0});
            return weak_float(v);
        }
        if (r < 0.7) {
            int lo = ot == DType::UInt8 ? 0 : -20;
            return weak_int((int)rng.range(lo, 20));
        }
        DType t = rng.pick(kAllDTypes);
        double v;
        if (isf(t)) v = 0.25 * (double)rng.range(-12, 12);
        else if (t == DType::Bool) v = (double)rng.range(0, 1);
        else if (t == DType::UInt8) v = (double)rng.range(0, 20);
        else v = (double)rng.range(-20, 20);
        return typed_scalar(v, t);
    }

    // ---- direct application (no adaptation)
    Built un(Op op, const Built& x) {
        Expr e;
        switch (op) {
        case Op::Neg: e = kiln::negative(x.e); break;
        case Op::Abs: e = kiln::absolute(x.e); break;
        case Op::Sqrt: e = kiln::sqrt(x.e); break;
        case Op::Square: e = kiln::square(x.e); break;
        case Op::Exp: e = kiln::exp(x.e); break;
        case Op::Exp2: e = kiln::exp2(x.e); break;
        case Op::Log: e = kiln::log(x.e); break;
        case Op::Log2: e = kiln::log2(x.e); break;
        case Op::SafeLog: e = kiln::safelog(x.e); break;
        case Op::Sig: e = kiln::sig(x.e); break;
        case Op::Sig2: e = kiln::sig2(x.e); break;
        case Op::Tanh: e = kiln::tanh(x.e); break;
        case Op::Tanh2: e = kiln::tanh2(x.e); break;
        case Op::Recip: e = kiln::reciprocal(x.e); break;
        case Op::Sgn: e = kiln::sgn(x.e); break;
        case Op::Rint: e = kiln::rint(x.e); break;
        case Op::Finite: e = kiln::finite(x.e); break;
        case Op::Erf: e = kiln::erf(x.e); break;
        case Op::Erfc: e = kiln::erfc(x.e); break;
        case Op::Expm1: e = kiln::expm1(x.e); break;
        case Op::Log1p: e = kiln::log1p(x.e); break;
        case Op::Log10: e = kiln::log10(x.e); break;
        case Op::Sin: e = kiln::sin(x.e); break;
        case Op::Cos: e = kiln::cos(x.e); break;
        case Op::Atan: e = kiln::atan(x.e); break;
        default: throw std::logic_error("not a unary op");
        }
        return chk(e, r_unary(op, x.r), op_name(op));
    }
    Built cast(const Built& x, DType t) { return chk(kiln::cast(x.e, t), r_cast(x.r, t), "cast"); }
    Built bin(Op op, const Built& a, const Built& b) {
        Expr e;
        switch (op) {
        case Op::Add: e = rng.chance(0.5) ? a.e + b.e : kiln::add(a.e, b.e); break;
        case Op::Sub: e = rng.chance(0.5) ? a.e - b.e : kiln::subtract(a.e, b.e); break;
        case Op::Mul: e = rng.chance(0.5) ? a.e * b.e : kiln::multiply(a.e, b.e); break;
        case Op::Div: e = rng.chance(0.5) ? a.e / b.e : kiln::divide(a.e, b.e); break;
        case Op::FloorDiv: e = kiln::floor_divide(a.e, b.e); break;
        case Op::Mod: e = rng.chance(0.5) ? a.e % b.e : kiln::remainder(a.e, b.e); break;
        case Op::Fmod: e = kiln::fmod(a.e, b.e); break;
        case Op::Pow: e = kiln::power(a.e, b.e); break;
        case Op::Atan2: e = kiln::atan2(a.e, b.e); break;
        case Op::Hypot: e = kiln::hypot(a.e, b.e); break;
        case Op::Copysign: e = kiln::copysign(a.e, b.e); break;
        case Op::Maximum: e = kiln::maximum(a.e, b.e); break;
        case Op::Minimum: e = kiln::minimum(a.e, b.e); break;
        case Op::Eq: e = rng.chance(0.5) ? a.e == b.e : kiln::equal(a.e, b.e); break;
        case Op::Ne: e = rng.chance(0.5) ? a.e != b.e : kiln::not_equal(a.e, b.e); break;
        case Op::Gt: e = rng.chance(0.5) ? a.e > b.e : kiln::greater(a.e, b.e); break;
        case Op::Ge: e = rng.chance(0.5) ? a.e >= b.e : kiln::greater_equal(a.e, b.e); break;
        case Op::Lt: e = rng.chance(0.5) ? a.e < b.e : kiln::less(a.e, b.e); break;
        case Op::Le: e = rng.chance(0.5) ? a.e <= b.e : kiln::less_equal(a.e, b.e); break;
        default: throw std::logic_error("not a binary op");
        }
        return chk(e, r_binary(op, a.r, b.r), op_name(op));
    }
    Built where(const Built& c, const Built& a, const Built& b) {
        return chk(kiln::where(c.e, a.e, b.e), r_where(c.r, a.r, b.r), "where");
    }
    Built clip(const Built& a, const Built& lo, const Built& hi) {
        RP m = r_binary(Op::Maximum, a.r, lo.r);
        ++composite[0];
        return chk(kiln::clip(a.e, lo.e, hi.e), r_binary(Op::Minimum, m, hi.r), "clip");
    }
    // `axis` normalised (or -1: all axes); the call passes it as given in `arg`.
    Built red(Op op, const Built& x, int axis, int arg, bool keepdims) {
        Expr e;
        RP r;
        const char* nm = "";
        switch (op) {
        case Op::Sum: e = kiln::sum(x.e, arg, keepdims); r = r_reduce(Op::Sum, x.r, axis, keepdims); nm = "sum"; break;
        case Op::Max: e = kiln::max(x.e, arg, keepdims); r = r_reduce(Op::Max, x.r, axis, keepdims); nm = "max"; break;
        case Op::Min: e = kiln::min(x.e, arg, keepdims); r = r_reduce(Op::Min, x.r, axis, keepdims); nm = "min"; break;
        case Op::ArgMax: e = kiln::argmax(x.e, arg, keepdims); r = r_reduce(Op::ArgMax, x.r, axis, keepdims); nm = "argmax"; break;
        case Op::ArgMin: e = kiln::argmin(x.e, arg, keepdims); r = r_reduce(Op::ArgMin, x.r, axis, keepdims); nm = "argmin"; break;
        case Op::Prod: e = kiln::prod(x.e, arg, keepdims); r = r_reduce(Op::Prod, x.r, axis, keepdims); nm = "prod"; break;
        default: throw std::logic_error("not a reduction");
        }
        return chk(e, r, nm);
    }
    Built mean(const Built& x, int axis, int arg, bool keepdims) {
        RP xf = isf(x.r->dtype) ? x.r : r_cast(x.r, DType::Float32);
        int64_t n = axis < 0 ? x.r->n() : x.r->shape[axis];
        RP s = r_reduce(Op::Sum, xf, axis, keepdims);
        RP m = r_binary(Op::Mul, s, r_scalar(1.0 / (double)n, DType::Float32, true));
        ++composite[1];
        return chk(kiln::mean(x.e, arg, keepdims), m, "mean");
    }
    RP ref_var(const RP& a, int axis, bool keepdims) {
        RP xf = isf(a->dtype) ? a : r_cast(a, DType::Float32);
        int64_t n = axis < 0 ? a->n() : a->shape[axis];
        RP m = r_binary(Op::Mul, r_reduce(Op::Sum, xf, axis, true), r_scalar(1.0 / (double)n, DType::Float32, true));
        RP sq = r_unary(Op::Square, r_binary(Op::Sub, xf, m));
        return r_binary(Op::Mul, r_reduce(Op::Sum, sq, axis, keepdims), r_scalar(1.0 / (double)n, DType::Float32, true));
    }
    Built var(const Built& x, int axis, int arg, bool keepdims) {
        ++composite[2];
        return chk(kiln::var(x.e, arg, keepdims), ref_var(x.r, axis, keepdims), "var");
    }
    Built stdev(const Built& x, int axis, int arg, bool keepdims) {
        ++composite[3];
        return chk(kiln::std(x.e, arg, keepdims), r_unary(Op::Sqrt, ref_var(x.r, axis, keepdims)), "std");
    }

    // ---- adaptation: make an operand fit an op's domain, keeping its shape
    Built bounded(const Built& x, double B) {
        if (maxabs(x.r) <= B) return x;
        DType t = x.r->dtype;
        Built y;
        if (!isf(t) && B >= 2 && rng.chance(0.6)) {
            int hi = (int)std::min(B / 2, 100.0);
            int lo = t == DType::UInt8 ? 0 : -hi;
            y = clip(x, weak_int(lo), weak_int(hi));
        } else if (rng.chance(0.5)) {
            y = clip(x, weak_float(-B / 2), weak_float(B / 2));
        } else {
            y = bin(Op::Mul, x, weak_float(round_float(DType::Float16, B / 2 / maxabs(x.r))));
        }
        if (maxabs(y.r) <= B && sane(y.r)) return y;
        return clip(cast(x, DType::Float32), weak_float(-B / 2), weak_float(B / 2));
    }
    bool stable(const RP& r) const {
        for (auto f : r->u)
            if (f) return false;
        return true;
    }
    Built positive(const Built& x, double m = 0.03) {
        if (minv(x.r) >= m && stable(x.r)) return x;
        for (int attempt = 0; attempt < 3; ++attempt) {
            Built y;
            int k = (int)rng.range(0, 3);
            if (k == 0) y = bin(Op::Add, un(Op::Abs, x), weak_float(0.5));
            else if (k == 1) y = bin(Op::Add, un(Op::Sig, x), weak_float(0.25));
            else if (k == 2) y = un(Op::Exp, clip(x, weak_float(-3), weak_float(3)));
            else y = bin(Op::Add, un(Op::Square, bounded(x, 8)), weak_float(1.0));
            if (minv(y.r) >= m && sane(y.r) && stable(y.r)) return y;
        }
        return un(Op::Exp, clip(x, weak_float(-3), weak_float(3)));
    }
    Built nonzero(const Built& x, double m = 0.05) {
        if (minabs(x.r) >= m && stable(x.r)) return x;
        Built p = positive(x, m);
        return rng.chance(0.3) ? un(Op::Neg, p) : p;
    }

    // ---- shapes
    Shape random_shape(int max_rank = 4, int64_t budget = 2048) {
        int r = (int)rng.pick<int64_t>({0, 1, 1, 2, 2, 2, 3, 3, 4});
        r = std::min(r, max_rank);
        Shape s;
        int64_t n = 1;
        for (int i = 0; i < r; ++i) {
            int64_t d = rng.pick(kSizes);
            while (d > 1 && n * d > budget) d = rng.pick<int64_t>({1, 2, 3});
            if (n * d > budget) d = 1;
            s.push_back(d);
            n *= d;
        }
        return s;
    }
    // Two shapes that broadcast to exactly T.
    std::pair<Shape, Shape> split_shapes(const Shape& T) {
        auto sub = [&](const Shape& s) {
            Shape o = s;
            for (auto& d : o)
                if (rng.chance(0.25)) d = 1;
            int drop = rng.chance(0.25) ? (int)rng.range(0, (int)o.size()) : 0;
            o.erase(o.begin(), o.begin() + drop);
            return o;
        };
        double r = rng.uni();
        Shape a = r < 0.6 ? T : sub(T);
        // b must provide every dim that a lacks
        const int R = (int)T.size();
        int off = R - (int)a.size();
        Shape b = sub(T);
        int boff = R - (int)b.size();
        int need = R;  // outermost dim b must cover
        for (int d = 0; d < R; ++d) {
            bool a_has = d >= off && a[d - off] == T[d];
            if (!a_has && T[d] != 1) { need = std::min(need, d); }
        }
        if (need < boff) {  // b too short: extend with T's dims (or 1s where a covers)
            Shape ext(T.begin() + need, T.begin() + boff);
            b.insert(b.begin(), ext.begin(), ext.end());
            boff = need;
        }
        for (int d = boff; d < R; ++d) {
            bool a_has = d >= off && a[d - off] == T[d];
            if (!a_has) b[d - boff] = T[d];
        }
        if ((int)std::max(a.size(), b.size()) < R) {  // neither has T's rank: give it to b
            Shape ext(T.begin(), T.begin() + (R - (int)b.size()));
            b.insert(b.begin(), ext.begin(), ext.end());
        }
        if (rng.chance(0.5)) std::swap(a, b);
        return {a, b};
    }

    // ---- random expressions
    Built operand(const Shape& s, int depth, const RP& other) {
        if (s.empty() && other && rng.chance(0.5)) return scalar_for(other);
        return gen(s, depth);
    }

    Built gen(const Shape& T, int depth) {
        if (depth <= 0 || ops >= max_ops) return terminal(T);
        ++ops;
        if (special) return gen_special(T, depth);
        double r = rng.uni();
        if (r < 0.27) return gen_unary(T, depth);
        if (r < 0.57) return gen_binary(T, depth);
        if (r < 0.62) return gen_where(T, depth);
        if (r < 0.66) return gen_clip(T, depth);
        if (r < 0.82) return gen_reduce(T, depth);
        if (r < 0.86) return gen_cast(T, depth);
        if (r < 0.89) return gen_onehot(T, depth);
        if (r < 0.93) return gen_take(T, depth);
        return gen_reshape(T, depth);
    }

    Built apply_unary(Op op, Built x) {
        DType t = x.r->dtype;
        if (t == DType::Bool && (op == Op::Neg || op == Op::Sgn)) x = cast(x, rng.pick({DType::Int8, DType::Int32, DType::Float32}));
        switch (op) {
        case Op::Sqrt: case Op::Log: case Op::Log2: case Op::Log1p: case Op::Log10: x = positive(x); break;
        case Op::SafeLog:
            if (!(minv(x.r) >= 0 && stable(x.r))) x = positive(x);
            else
                for (int64_t i = 0; i < x.r->n(); ++i)
                    if (x.r->v[i] < 0.03 && (x.r->v[i] != 0 || x.r->e[i] != 0)) { x = positive(x); break; }
            break;
        case Op::Recip: x = nonzero(x); break;
        case Op::Exp: case Op::Exp2: case Op::Expm1: case Op::Erf: x = bounded(x, 10); break;
        case Op::Erfc: x = bounded(x, 4); break;   // erfc(4) = 1.5e-8: no float32 underflow
        case Op::Sin: case Op::Cos: x = bounded(x, 30); break;
        case Op::Sig: case Op::Sig2: case Op::Tanh: case Op::Tanh2: x = bounded(x, 30); break;
        case Op::Square:
            if (isf(x.r->dtype)) x = bounded(x, is16(x.r->dtype) ? 150 : 900);
            else if (x.r->dtype == DType::Int32) x = bounded(x, 4000);
            break;
        default: break;
        }
        Built y = un(op, x);
        if (sane(y.r)) return y;
        return x.r->shape == y.r->shape ? un(Op::Abs, x) : y;
    }

    Built gen_unary(const Shape& T, int depth) {
        static const std::vector<Op> ops_ = {Op::Neg,  Op::Abs,  Op::Sqrt, Op::Square, Op::Exp,   Op::Exp2,
                                             Op::Log,  Op::Log2, Op::SafeLog, Op::Sig, Op::Sig2,  Op::Tanh,
                                             Op::Tanh2, Op::Recip, Op::Sgn, Op::Rint,  Op::Finite,
                                             Op::Erf,   Op::Erfc,  Op::Expm1, Op::Log1p, Op::Log10,
                                             Op::Sin,   Op::Cos,   Op::Atan};
        Built x = gen(T, depth - 1);
        return apply_unary(rng.pick(ops_), x);
    }

    Built apply_binary(Op op, Built a, Built b) {
        DType t = ref_result_type(a.r, b.r);
        if (op == Op::Sub && t == DType::Bool) {
            if (rng.chance(0.5)) b = cast(b, DType::Int8);
            else op = Op::Add;
        }
        if (op == Op::Pow) {
            if (!isf(t)) {
                if (b.r->weak) a = cast(a, rng.pick({DType::Float32, DType::Float16, DType::BFloat16}));
                else b = cast(b, rng.pick({DType::Float32, DType::Float16, DType::BFloat16}));
            }
            if (b.r->weak && rng.chance(0.5)) {
                // an integral exponent: a negative base is valid (NumPy: (-2)**3 == -8)
                double ex = rng.pick({2.0, 3.0, -1.0, 2.0});
                b = weak_float(ex);
                a = ex < 0 ? nonzero(bounded(a, 6), 0.2) : bounded(a, 6);
            } else {
                a = bounded(positive(a, 0.1), 12);
                b = bounded(b, 2.5);
            }
        }
        if (op == Op::Div) {
            b = nonzero(b);
            double lim = limit(ref_result_type(a.r, b.r)) * 0.05;
            if (maxabs(a.r) > lim) a = bounded(a, lim);
        }
        if (is_division(op) && isf(ref_result_type(a.r, b.r))) {
            // Float division by 0 gives inf and NaN (the special-value graphs cover those); an
            // integer divisor may be 0 (the result is 0). Quotients stay far below 2^24.
            b = nonzero(b);
            double lim = limit(ref_result_type(a.r, b.r)) * 0.05;
            if (maxabs(a.r) > lim) a = bounded(a, lim);
        }
        if (op == Op::Mul) {
            t = ref_result_type(a.r, b.r);
            double lim = limit(t);
            if (std::isfinite(lim) && maxabs(a.r) * maxabs(b.r) > lim * 0.5) {
                double s = std::sqrt(lim * 0.5);
                a = bounded(a, s);
                b = bounded(b, s);
            }
        }
        if (op == Op::Hypot) {   // |a| + |b| bounds the result: keep it finite in its dtype
            const double lim = limit(float_result(ref_result_type(a.r, b.r)));
            if (std::isfinite(lim) && maxabs(a.r) + maxabs(b.r) > lim * 0.5) {
                a = bounded(a, lim * 0.25);
                b = bounded(b, lim * 0.25);
            }
        }
        if (op == Op::Add || op == Op::Sub) {
            t = ref_result_type(a.r, b.r);
            double lim = limit(t);
            if (std::isfinite(lim) && maxabs(a.r) + maxabs(b.r) > lim * 0.5) {
                a = bounded(a, lim * 0.25);
                b = bounded(b, lim * 0.25);
            }
        }
        Built y = bin(op, a, b);
        if (sane(y.r)) return y;
        Built z = bin(Op::Maximum, a, b);
        if (sane(z.r)) return z;
        return bin(Op::Gt, a, b);
    }

    Built gen_binary(const Shape& T, int depth) {
        static const std::vector<Op> ops_ = {Op::Add, Op::Add, Op::Sub, Op::Sub, Op::Mul, Op::Mul, Op::Div,
                                             Op::FloorDiv, Op::Mod, Op::Fmod, Op::Pow, Op::Maximum, Op::Minimum,
                                             Op::Atan2, Op::Hypot, Op::Copysign,
                                             Op::Eq, Op::Ne, Op::Gt, Op::Ge, Op::Lt, Op::Le};
        Op op = rng.pick(ops_);
        auto [sa, sb] = split_shapes(T);
        bool scalar_b = sb.empty() && rng.chance(0.6);
        bool swap = rng.chance(0.3);
        Built a = gen(sa, depth - 1);
        Built b = scalar_b ? scalar_for(a.r) : gen(sb, depth - 1);
        if (swap && op != Op::Pow) std::swap(a, b);
        return apply_binary(op, a, b);
    }

    Built gen_condition(const Shape& s, int depth) {
        double r = rng.uni();
        if (r < 0.55) {
            auto [sa, sb] = split_shapes(s);
            Built a = gen(sa, depth - 1);
            Built b = sb.empty() && rng.chance(0.5) ? scalar_for(a.r) : gen(sb, depth - 1);
            return bin(rng.pick({Op::Gt, Op::Lt, Op::Ge, Op::Le, Op::Eq, Op::Ne}), a, b);
        }
        if (r < 0.8) return leaf(s, DType::Bool);
        return gen(s, depth - 1);  // any dtype: nonzero is true
    }

    Built gen_where(const Shape& T, int depth) {
        auto [sa, sb] = split_shapes(T);
        Shape sc = T;
        for (auto& d : sc)
            if (rng.chance(0.3)) d = 1;
        Built c = gen_condition(sc, depth);
        Built a = gen(sa, depth - 1);
        Built b = sb.empty() && rng.chance(0.5) ? scalar_for(a.r) : gen(sb, depth - 1);
        Built y = where(c, a, b);
        if (sane(y.r)) return y;
        return bin(Op::Maximum, a, b);
    }

    Built gen_clip(const Shape& T, int depth) {
        Built a = gen(T, depth - 1);
        DType t = a.r->dtype;
        Built lo, hi;
        if (rng.chance(0.7)) {
            if (isf(t) || rng.chance(0.3)) {
                double l = 0.25 * (double)rng.range(-8, 4), h = l + 0.25 * (double)rng.range(-1, 12);
                lo = weak_float(l);
                hi = weak_float(h);
            } else {
                int l = t == DType::UInt8 ? (int)rng.range(0, 5) : (int)rng.range(-10, 5);
                int h = l + (int)rng.range(-1, 12);
                if (t == DType::UInt8) h = std::max(h, 0);
                lo = weak_int(l);
                hi = weak_int(h);
            }
        } else {
            auto [s1, s2] = split_shapes(T);
            (void)s2;
            Shape s3 = T;
            for (auto& d : s3)
                if (rng.chance(0.4)) d = 1;
            lo = gen(s1, depth - 2);
            hi = gen(s3, depth - 2);
        }
        Built y = clip(a, lo, hi);
        if (sane(y.r)) return y;
        return a;
    }

    Built gen_reduce(const Shape& T, int depth) {
        const int R = (int)T.size();
        const int64_t nT = count(T);
        std::vector<int> ones;
        for (int d = 0; d < R; ++d)
            if (T[d] == 1) ones.push_back(d);
        bool all_ones = (int)ones.size() == R;
        // modes: 0 keepdims over axis, 1 drop axis, 2 all axes keepdims, 3 all axes dropped
        std::vector<int> modes;
        if (!ones.empty()) modes.insert(modes.end(), {0, 0});
        if (R < 4) modes.insert(modes.end(), {1, 1});
        if (all_ones) modes.push_back(2);
        if (R == 0) modes.push_back(3);
        if (modes.empty()) return gen_unary(T, depth);
        int mode = rng.pick(modes);
        int64_t budget = 4096;
        auto red_len = [&]() {
            int64_t n = rng.pick(kSizes);
            while (n > 1 && nT * n > budget) n = rng.pick<int64_t>({1, 2, 3, 5, 7});
            return n;
        };
        Shape in;
        int axis = -1;
        bool keepdims = true;
        switch (mode) {
        case 0: axis = rng.pick(ones); in = T; in[axis] = red_len(); break;
        case 1: axis = (int)rng.range(0, R); in = T; in.insert(in.begin() + axis, red_len()); keepdims = false; break;
        case 2: {
            in = random_shape(4, budget);
            in.resize(R, 1);
            if (in.size() != (size_t)R) in.assign(R, 1);
            for (auto& d : in) d = std::max<int64_t>(1, std::min<int64_t>(d, 33));
            break;
        }
        default: in = random_shape(4, budget); keepdims = false; break;
        }
        const int rin = (int)in.size();
        // The axis as the caller passes it: positive or counted from the end.
        int arg = axis;
        if (axis >= 0 && rng.chance(0.4)) arg = axis - rin;
        Built x = gen(in, depth - 1);
        static const std::vector<Op> rops = {Op::Sum, Op::Sum, Op::Max, Op::Min, Op::ArgMax, Op::ArgMin, Op::Prod};
        double r = rng.uni();
        Built y;
        if (r < 0.62) {
            Op op = rng.pick(rops);
            // A product of factors of at most 2 in magnitude stays in range over short axes.
            y = red(op, op == Op::Prod ? bounded(x, 2) : x, axis, axis < 0 ? kiln::all_axes : arg, keepdims);
        } else if (r < 0.82) {
            y = mean(x, axis, axis < 0 ? kiln::all_axes : arg, keepdims);
        } else if (r < 0.92) {
            y = var(bounded(x, 100), axis, axis < 0 ? kiln::all_axes : arg, keepdims);
        } else {
            y = stdev(bounded(x, 100), axis, axis < 0 ? kiln::all_axes : arg, keepdims);
        }
        if (sane(y.r)) return y;
        Built m = mean(bounded(x, 100), axis, axis < 0 ? kiln::all_axes : arg, keepdims);
        if (sane(m.r)) return m;
        return red(Op::Max, x, axis, axis < 0 ? kiln::all_axes : arg, keepdims);
    }

    Built gen_cast(const Shape& T, int depth) {
        Built x = gen(T, depth - 1);
        DType to = rng.pick(kAllDTypes);
        if (is16(to) && maxabs(x.r) > 6e4) to = DType::Float32;
        return cast(x, to);
    }

    Built index_leaf(const Shape& s, int64_t lo, int64_t hi) {
        DType t = rng.pick({DType::Int32, DType::Int32, DType::Int8, DType::UInt8});
        if (t == DType::UInt8) lo = std::max<int64_t>(lo, 0);
        if (t != DType::Int32) { lo = std::max<int64_t>(lo, -128); hi = std::min<int64_t>(hi, 127); }
        ViewSpec vs = make_view(rng, s, rng.chance(0.3));
        std::vector<double> base((size_t)count(vs.base));
        for (auto& x : base) x = (double)rng.range(lo, hi);
        std::vector<double> vals(vs.map.size());
        for (size_t i = 0; i < vals.size(); ++i) vals[i] = base[vs.map[i]];
        Tensor b = upload(base, vs.base, t);
        keep.push_back(b);
        leaves.push_back("%" + std::to_string(g_next_id + 1) + " " + dname(t) + " indices " + shape_s(s) + " " + vs.desc);
        return chk(apply_view(b, vs).expr(), r_leaf(t, s, vals, vs.desc), "indices");
    }

    Built gen_onehot(const Shape& T, int depth) {
        const int R = (int)T.size();
        if (R == 0 || R > 4) return gen_unary(T, depth);
        int axis = (int)rng.range(0, R - 1);
        int64_t C = T[axis];
        Shape is = T;
        is.erase(is.begin() + axis);
        Built idx;
        if (rng.chance(0.25) && (int)is.size() < 4 && count(is) * C <= 4096) {
            Shape in = is;
            in.push_back(C);
            Built src = gen(in, depth - 1);
            idx = red(Op::ArgMax, src, (int)is.size(), (int)is.size(), false);
        } else {
            idx = index_leaf(is, -1, C);
        }
        DType t = rng.chance(0.5) ? DType::Float32 : rng.pick(kAllDTypes);
        int arg = rng.chance(0.5) ? axis : axis - R;
        Expr e = t == DType::Float32 && rng.chance(0.5) && arg == -1 ? kiln::onehot(idx.e, C)
                                                                     : kiln::onehot(idx.e, C, arg, t);
        return chk(e, r_onehot(idx.r, C, axis, t), "onehot");
    }

    Built gen_take(const Shape& T, int depth) {
        const int R = (int)T.size();
        bool flat = rng.chance(0.3);
        Shape src_shape, idx_shape;
        int axis = 0;
        int64_t L = rng.pick<int64_t>({1, 2, 3, 5, 7, 8, 17});
        if (flat) {
            idx_shape = T;
            src_shape = random_shape(3, 256);
            if (count(src_shape) == 0) src_shape = {3};
            L = count(src_shape);
        } else {
            int k = (int)rng.range(0, std::min(R, 2));  // rank of the indices
            if (R - k + 1 > 4) k = R - 3;
            axis = (int)rng.range(0, R - k);
            src_shape.assign(T.begin(), T.begin() + axis);
            src_shape.push_back(L);
            src_shape.insert(src_shape.end(), T.begin() + axis + k, T.end());
            idx_shape.assign(T.begin() + axis, T.begin() + axis + k);
            if (count(src_shape) > 8192) return gen_unary(T, depth);
        }
        Built src = rng.chance(0.7) ? leaf(src_shape, leaf_dtype()) : gen(src_shape, depth - 1);
        Built idx = index_leaf(idx_shape, -L - 2, L + 2);
        Expr e;
        std::optional<int> ax;
        if (!flat) {
            int rs = (int)src_shape.size();
            ax = axis;
            e = kiln::take(src.e, idx.e, rng.chance(0.5) ? axis : axis - rs);
        } else {
            e = kiln::take(src.e, idx.e);
        }
        return chk(e, r_take(src.r, idx.r, ax), "take");
    }

    Built gen_reshape(const Shape& T, int depth) {
        const int R = (int)T.size();
        std::vector<int> ones;
        for (int d = 0; d < R; ++d)
            if (T[d] == 1) ones.push_back(d);
        if (!ones.empty() && rng.chance(0.4)) {
            int a = rng.pick(ones);
            Shape in = T;
            in.erase(in.begin() + a);
            Built x = gen(in, depth - 1);
            int arg = rng.chance(0.5) ? a : a - R;
            return chk(kiln::expand_dims(x.e, arg), r_reshape(x.r, T, "expand_dims " + std::to_string(a)), "expand_dims");
        }
        // another factorisation of the same count
        int64_t n = count(T);
        Shape in;
        double r = rng.uni();
        if (r < 0.4) in = {n};
        else if (r < 0.7) { in = T; std::reverse(in.begin(), in.end()); }
        else { in = T; in.insert(in.begin() + rng.range(0, R), 1); }
        if (in.size() > 4) in = {n};
        Built x = gen(in, depth - 1);
        Shape arg = T;
        if (!T.empty() && rng.chance(0.3)) arg[rng.range(0, R - 1)] = -1;
        return chk(kiln::reshape(x.e, arg), r_reshape(x.r, T, "reshape"), "reshape");
    }

    // ---- special values: NaN, inf, -0 in float leaves, ops with defined results on them
    Built gen_special(const Shape& T, int depth) {
        double r = rng.uni();
        auto sub = [&](const Shape& s) { return gen(s, depth - 1); };
        if (r < 0.30) {
            Built x = sub(T);
            Op op = rng.pick({Op::Finite, Op::Abs, Op::Neg, Op::Sgn, Op::Rint, Op::Finite});
            if (x.r->dtype == DType::Bool && (op == Op::Neg || op == Op::Sgn)) op = Op::Abs;
            if (op == Op::Rint && !isf(x.r->dtype)) op = Op::Abs;
            return un(op, x);
        }
        if (r < 0.55) {
            Op op = rng.pick({Op::Maximum, Op::Minimum, Op::Gt, Op::Le, Op::Eq, Op::Ne, Op::Mul, Op::Add, Op::FloorDiv,
                              Op::Mod, Op::Fmod});
            if (op == Op::Mul || op == Op::Add) return bin(op, sub(T), weak_float(rng.pick({2.0, -0.5, 1.5})));
            auto [sa, sb] = split_shapes(T);
            Built a = sub(sa);
            Built b = sb.empty() && rng.chance(0.5) ? scalar_for(a.r) : sub(sb);
            return bin(op, a, b);
        }
        if (r < 0.70) {
            Built x = sub(T);
            Built fin = un(Op::Finite, x);
            Built alt = scalar_for(x.r);
            return rng.chance(0.5) ? where(fin, x, alt) : where(bin(Op::Ne, x, x), alt, x);  // x != x: isnan
        }
        if (r < 0.80) {
            Built x = sub(T);
            return cast(x, rng.pick(kAllDTypes));
        }
        // reductions
        const int R = (int)T.size();
        if (R >= 4) return un(Op::Finite, sub(T));
        int axis = (int)rng.range(0, R);
        Shape in = T;
        in.insert(in.begin() + axis, rng.pick<int64_t>({1, 3, 5, 17}));
        Built x = sub(in);
        Op op = rng.pick({Op::Max, Op::Min, Op::ArgMax, Op::ArgMin, Op::Sum, Op::Prod});
        return red(op, x, axis, axis, false);
    }
};

} // namespace
