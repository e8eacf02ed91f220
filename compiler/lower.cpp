#include "compiler/lower.hpp"

#include "ir/error.hpp"
#include "ir/node.hpp"
#include "ir/rng.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <unordered_map>
#include <unordered_set>

namespace kiln {

namespace {

using kir::Op;
using CT = ComputeType;

struct Lowerer {
    const Stage& st;
    LowerOptions opts;
    kir::Kernel k;
    LoweredStage out;
    int n = 0;                                      // domain rank
    bool needs_coords = false;                      // some instruction reads a coordinate: no dim merging
    std::vector<std::vector<int64_t>> dstrides;     // per buffer: strides over the domain
    std::unordered_map<const Node*, int> buf_of;
    std::unordered_map<const Node*, int> param_of;
    std::unordered_map<const Node*, int> acc_of;
    std::unordered_map<const Node*, std::pair<int, int>> rand_slots;
    std::unordered_map<const Node*, int> memo;      // per block
    int cur = -1;                                   // current block

    Lowerer(const Stage& s, const LowerOptions& o) : st(s), opts(o), n((int)s.domain.size()) {
        k.rank = n;
        k.reduced = s.reduced;
    }

    // ---- instruction helpers
    int emit(kir::Instr in) {
        k.instrs.push_back(in);
        int id = (int)k.instrs.size() - 1;
        k.blocks[cur].instrs.push_back(id);
        return id;
    }
    int op1(Op op, CT t, int a) { kir::Instr i{op, t}; i.a[0] = a; return emit(i); }
    int op2(Op op, CT t, int a, int b) { kir::Instr i{op, t}; i.a[0] = a; i.a[1] = b; return emit(i); }
    int op3(Op op, CT t, int a, int b, int c) { kir::Instr i{op, t}; i.a[0] = a; i.a[1] = b; i.a[2] = c; return emit(i); }
    // A constant of compute type t (an f32 one rounded to float, an i32 one wrapped to int32).
    int cf(double v, CT t = CT::F32) {
        kir::Instr i{Op::ConstF, t};
        i.fimm = t == CT::F32 ? (double)(float)v : v;
        return emit(i);
    }
    int ci(int64_t v, CT t = CT::I32) {
        kir::Instr i{Op::ConstI, t};
        i.iimm = t == CT::I32 ? (int64_t)(int32_t)(uint32_t)(uint64_t)v : v;
        return emit(i);
    }
    CT type_of(int id) const { return k.instrs[id].type; }

    // Value `v` re-expressed in dtype `t`'s representation (the wrap-around of a store).
    int convert(int v, DType t) {
        const CT from = type_of(v), to = compute_type(t);
        if (t == DType::Bool) return op1(Op::ToBool, CT::I32, v);
        if (from != to) {
            // (The 32-bit conversions keep their own ops, so that kernels without 64-bit values
            // keep their texts and keys.)
            if (from == CT::I32 && to == CT::F32) v = op1(Op::ToF32, CT::F32, v);
            else if (from == CT::F32 && to == CT::I32) v = op1(Op::ToI32, CT::I32, v);
            else v = op1(Op::Convert, to, v);
        }
        return is_float(t) ? v : wrap(v, t);
    }
    int wrap(int v, DType t) {
        switch (t) {
        case DType::Int8: return op1(Op::WrapI8, CT::I32, v);
        case DType::UInt8: return op1(Op::WrapU8, CT::I32, v);
        case DType::Int16: return op1(Op::WrapI16, CT::I32, v);
        case DType::UInt16: return op1(Op::WrapU16, CT::I32, v);
        case DType::UInt32: return op1(Op::WrapU32, CT::I64, v);
        case DType::Bool: return op1(Op::ToBool, CT::I32, v);
        default: return v;
        }
    }

    // uint64 values are their bits in i64 arithmetic: addition, multiplication, the bitwise ops
    // and left shifts are the same; comparison, division, right shifts and conversions to and
    // from floats are unsigned here. flip() maps unsigned order onto signed order (x ^ 2^63).
    int flip(int x) { return op2(Op::Xor, CT::I64, x, ci(INT64_MIN, CT::I64)); }
    // Value `v` of dtype `from` in dtype `to`'s representation: convert(), unsigned where one
    // side is uint64.
    int convert_from(int v, DType from, DType to) {
        if (from == DType::UInt64 && is_float(to)) {
            // Below 2^63 the signed conversion; above, half the value with its lowest bit kept
            // sticky (so that rounding sees it), converted, doubled (exact).
            const CT ft = compute_type(to);
            const int half = op2(Op::Or, CT::I64, op2(Op::Shr, CT::I64, v, ci(1, CT::I64)), op2(Op::And, CT::I64, v, ci(1, CT::I64)));
            const int big = op2(Op::Mul, ft, op1(Op::Convert, ft, half), cf(2.0, ft));
            return op3(Op::Select, ft, op2(Op::Lt, CT::I32, v, ci(0, CT::I64)), big, op1(Op::Convert, ft, v));
        }
        if (to == DType::UInt64 && is_float(type_of(v))) {
            // Truncated toward zero: from 2^63 on, as the signed conversion of x - 2^63 with the top
            // bit set (saturating at 2^64 - 1); below, the signed conversion (a negative value wraps,
            // as in the other integer dtypes; NaN gives 0).
            const CT ft = type_of(v);
            const int two63 = cf(9223372036854775808.0, ft);
            const int high = flip(op1(Op::Convert, CT::I64, op2(Op::Sub, ft, v, two63)));
            return op3(Op::Select, CT::I64, op2(Op::Ge, CT::I32, v, two63), high, op1(Op::Convert, CT::I64, v));
        }
        return convert(v, to);
    }
    // Unsigned a < b of two uint64 values (an i32 truth value).
    int ult(int a, int b) { return op2(Op::Lt, CT::I32, flip(a), flip(b)); }

    // +0.0 or -0.0 with the sign bit of the float value `x`.
    int signed_zero(int x) {
        if (type_of(x) == CT::F64)
            return op1(Op::AsF64, CT::F64, op2(Op::And, CT::I64, op1(Op::AsI64, CT::I64, x), ci(INT64_MIN, CT::I64)));
        return op1(Op::AsF32, CT::F32, op2(Op::And, CT::I32, op1(Op::AsI32, CT::I32, x), ci(INT32_MIN)));
    }

    // NumPy's floor_divide, remainder and fmod of a and b (already in dtype t's compute type),
    // step for step as compiler/divmod.hpp writes them on the host (canonicalise folds with it).
    int division(OpKind op, int a, int b, DType t) {
        const CT ct = compute_type(t);
        if (is_float(ct)) {
            const int mod = op2(Op::Fmod, ct, a, b);   // exact; NaN for b == 0 or a = +-inf
            if (op == OpKind::Fmod) return mod;
            // A nonzero remainder on the other side of 0 than b moves to b's side (mod + b); a
            // NaN stays NaN either way.
            const int zero = cf(0.0f, ct);
            const int nonzero = op2(Op::Ne, CT::I32, mod, zero);
            const int move = op2(Op::And, CT::I32, nonzero,
                                 op2(Op::Ne, CT::I32, op2(Op::Lt, CT::I32, b, zero), op2(Op::Lt, CT::I32, mod, zero)));
            if (op == OpKind::Mod) {
                const int moved = op3(Op::Select, ct, move, op2(Op::Add, ct, mod, b), mod);
                return op3(Op::Select, ct, nonzero, moved, signed_zero(b));  // a zero has b's sign
            }
            // Quotient: (a - mod) / b, one less where the remainder moved, floored and snapped to
            // the nearest integer (it is one up to rounding); a zero quotient has a / b's sign.
            // A zero divisor gives a / b itself: +-inf, or NaN for 0 / 0 and NaN / 0.
            const int q = op2(Op::Div, ct, a, b);
            int div = op2(Op::Div, ct, op2(Op::Sub, ct, a, mod), b);
            div = op3(Op::Select, ct, move, op2(Op::Sub, ct, div, cf(1.0f, ct)), div);
            int fl = op1(Op::Floor, ct, div);
            const int snap = op2(Op::Gt, CT::I32, op2(Op::Sub, ct, div, fl), cf(0.5f, ct));
            fl = op3(Op::Select, ct, snap, op2(Op::Add, ct, fl, cf(1.0f, ct)), fl);
            const int r = op3(Op::Select, ct, op2(Op::Ne, CT::I32, div, zero), fl, signed_zero(q));
            return op3(Op::Select, ct, op2(Op::Eq, CT::I32, b, zero), q, r);
        }
        if (t == DType::UInt64) return unsigned_division(op, a, b);
        // Integers. IDiv/IRem are undefined for b == 0 and for MIN / -1: those divide by 1
        // instead (remainder 0, as NumPy's) and the quotient is replaced below: 0 for b == 0,
        // -a (wrapping, so MIN stays MIN) for b == -1.
        const int zero = ci(0, ct);
        const int by_zero = op2(Op::Eq, CT::I32, b, zero);
        const int by_minus_one = op2(Op::Eq, CT::I32, b, ci(-1, ct));
        const int d = op3(Op::Select, ct, op2(Op::Or, CT::I32, by_zero, by_minus_one), ci(1, ct), b);
        const int rem = op2(Op::IRem, ct, a, d);
        if (op == OpKind::Fmod) return rem;
        // A nonzero remainder whose sign differs from b's moves to b's side, and the truncated
        // quotient rounds down by one (the results stay within the operands' range).
        const int move = op2(Op::And, CT::I32, op2(Op::Ne, CT::I32, rem, zero),
                             op2(Op::Lt, CT::I32, op2(Op::Xor, ct, rem, b), zero));
        if (op == OpKind::Mod) return op2(Op::Add, ct, rem, op3(Op::Select, ct, move, b, zero));
        int quot = op2(Op::Sub, ct, op2(Op::IDiv, ct, a, d), ct == CT::I32 ? move : op1(Op::Convert, ct, move));
        quot = op3(Op::Select, ct, by_minus_one, op1(Op::Neg, ct, a), quot);
        quot = op3(Op::Select, ct, by_zero, zero, quot);
        return wrap(quot, t);  // int8: -128 // -1 = 128 wraps to -128
    }

    // uint64 a / b (floor_divide) or a % b (remainder, fmod), 0 for b == 0 as for the signed
    // integers. A divisor of 2^63 or more goes into a once or not at all. A smaller one divides
    // a / 2 (within int64) with signed division: q = 2 ((a >> 1) / b) is the quotient or one
    // below it, as a - q b < 2 b says.
    int unsigned_division(OpKind op, int a, int b) {
        const CT t = CT::I64;
        const int by_zero = op2(Op::Eq, CT::I32, b, ci(0, t));
        const int big = op2(Op::Lt, CT::I32, b, ci(0, t));
        const int d = op3(Op::Select, t, op2(Op::Or, CT::I32, by_zero, big), ci(1, t), b);
        int q = op2(Op::Shl, t, op2(Op::IDiv, t, op2(Op::Shr, t, a, ci(1, t)), d), ci(1, t));
        const int r = op2(Op::Sub, t, a, op2(Op::Mul, t, q, d));
        q = op2(Op::Add, t, q, op1(Op::Convert, t, op2(Op::Xor, CT::I32, ult(r, d), ci(1))));
        q = op3(Op::Select, t, big, op1(Op::Convert, t, op2(Op::Xor, CT::I32, ult(a, b), ci(1))), q);
        q = op3(Op::Select, t, by_zero, ci(0, t), q);
        if (op == OpKind::FloorDiv) return q;
        return op3(Op::Select, t, by_zero, ci(0, t), op2(Op::Sub, t, a, op2(Op::Mul, t, q, b)));
    }

    // x ** e of integers (NumPy's power on integer dtypes), wrapping as multiplication does: square
    // and multiply over e's bits. A negative exponent gives the integer part of the true power:
    // 1 for x = 1, +-1 for x = -1 (by e's parity), else 0 (NumPy raises; the standard leaves it).
    int int_power(int x, int e, DType t) {
        const CT ct = compute_type(t);
        const int bits = t == DType::UInt64 ? 64 : ct == CT::I64 ? 63 : 31;
        int result = ci(1, ct), base = x;
        for (int b = 0; b < bits; ++b) {
            const int bit = op2(Op::And, ct, op2(Op::Shr, ct, e, ci(b, ct)), ci(1, ct));
            result = op3(Op::Select, ct, op2(Op::Ne, CT::I32, bit, ci(0, ct)), op2(Op::Mul, ct, result, base), result);
            if (b + 1 < bits) base = op2(Op::Mul, ct, base, base);
        }
        if (t == DType::UInt64) return result;   // (no negative exponents)
        const int odd = op2(Op::Ne, CT::I32, op2(Op::And, ct, e, ci(1, ct)), ci(0, ct));
        const int minus_one = op3(Op::Select, ct, odd, ci(-1, ct), ci(1, ct));
        const int negative = op3(Op::Select, ct, op2(Op::Eq, CT::I32, x, ci(1, ct)), ci(1, ct),
                                 op3(Op::Select, ct, op2(Op::Eq, CT::I32, x, ci(-1, ct)), minus_one, ci(0, ct)));
        return wrap(op3(Op::Select, ct, op2(Op::Lt, CT::I32, e, ci(0, ct)), negative, result), t);
    }

    // ---- buffers
    std::vector<int64_t> map_strides(const Shape& shape, const Strides& strides) {
        std::vector<int64_t> s(n, 0);
        int off = n - (int)shape.size();
        for (int d = 0; d < n; ++d) {
            int j = d - off;
            if (j >= 0 && shape[j] != 1) s[d] = strides[j];
        }
        return s;
    }
    int add_buffer(DType dt, bool output, std::vector<int64_t> strides, BufferSource src) {
        k.buffers.push_back({dt, output, {}});
        dstrides.push_back(std::move(strides));
        out.sources.push_back(std::move(src));
        return (int)k.buffers.size() - 1;
    }
    int buffer_for(const Node& nd) {
        if (auto it = buf_of.find(&nd); it != buf_of.end()) return it->second;
        int b;
        if (auto t = st.inputs_from_temps.find(&nd); t != st.inputs_from_temps.end()) {
            BufferSource src;
            src.is_temp = true;
            src.temp = t->second;
            b = add_buffer(nd.dtype, false, map_strides(nd.shape, contiguous_strides(nd.shape)), src);
        } else {
            KILN_CHECK_INTERNAL(nd.op == OpKind::Leaf, "buffer_for on {}", node_str(nd));
            BufferSource src;
            src.view = nd.view;
            b = add_buffer(nd.dtype, false, map_strides(nd.shape, nd.view.strides), src);
        }
        buf_of[&nd] = b;
        return b;
    }
    int param(const Node& nd) {
        CT t = compute_type(nd.dtype);
        auto it = param_of.find(&nd);
        int slot;
        if (it != param_of.end()) slot = it->second;
        else if (t == CT::F64) {
            // Two float slots holding the double's bits, low word first.
            uint32_t w[2];
            const double d = nd.value;
            std::memcpy(w, &d, 8);
            slot = k.num_fparams;
            k.num_fparams += 2;
            for (uint32_t x : w) {
                float f;
                std::memcpy(&f, &x, 4);
                out.args.fparams.push_back(f);
            }
            param_of[&nd] = slot;
        } else if (t == CT::I64) {
            const int64_t v = scalar_i64(nd);
            slot = k.num_iparams;
            k.num_iparams += 2;
            out.args.iparams.push_back((int32_t)(uint32_t)(uint64_t)v);
            out.args.iparams.push_back((int32_t)(uint32_t)((uint64_t)v >> 32));
            param_of[&nd] = slot;
        } else if (t == CT::F32) {
            slot = k.num_fparams++;
            out.args.fparams.push_back((float)nd.value);
            param_of[&nd] = slot;
        } else {
            slot = k.num_iparams++;
            // Integer scalars are in int32's range when made (ir/expr.cpp); saturate all the same.
            out.args.iparams.push_back(std::isnan(nd.value) ? 0 : (int32_t)std::clamp(nd.value, -2147483648.0, 2147483647.0));
            param_of[&nd] = slot;
        }
        kir::Instr i{is_float(t) ? Op::ParamF : Op::ParamI, t};
        i.index = slot;
        return emit(i);
    }
    // An int64 scalar's value: exact from the node's integer value, saturated from its double.
    static int64_t scalar_i64(const Node& nd) {
        if (!is_float(nd.dtype)) return nd.ivalue;
        if (std::isnan(nd.value)) return 0;
        if (nd.value >= 9223372036854775807.0) return INT64_MAX;
        if (nd.value <= -9223372036854775808.0) return INT64_MIN;
        return (int64_t)nd.value;
    }
    int new_iparam(int32_t v) {
        out.args.iparams.push_back(v);
        return k.num_iparams++;
    }
    int iparam(int slot) { kir::Instr i{Op::ParamI, CT::I32}; i.index = slot; return emit(i); }

    // ---- nodes
    // The operands compute() reads through value(): none for what is loaded or accumulated.
    static std::span<const NodePtr> operands(const Node& nd, bool loaded) {
        if (loaded || is_reduction(nd.op)) return {};
        if (nd.op == OpKind::Take) return {&nd.inputs[1], 1};  // the source is a buffer
        return nd.inputs;
    }

    // The node's value in the current block. Operands are computed first, depth-first on an
    // explicit stack, so compute() finds them memoised: an expression's depth costs memory,
    // not call stack.
    int value(const NodePtr& np) {
        if (auto it = memo.find(np.get()); it != memo.end()) return it->second;
        std::vector<std::pair<const Node*, size_t>> stack{{np.get(), 0}};
        while (!stack.empty()) {
            const Node* nd = stack.back().first;
            auto ops = operands(*nd, st.inputs_from_temps.count(nd) || nd->op == OpKind::Leaf);
            size_t& i = stack.back().second;
            while (i < ops.size() && memo.count(ops[i].get())) ++i;
            if (i < ops.size()) {
                stack.push_back({ops[i].get(), 0});
                continue;
            }
            memo[nd] = compute(*nd);
            stack.pop_back();
        }
        return memo.at(np.get());
    }

    int coord_linear(const Node& nd) {
        // Row-major index over the node's own shape (it may be broadcast in the domain). A
        // rank-0 rand() draws per point of the domain: `A[:] = rand()` fills A with distinct draws.
        if (nd.shape == st.domain || (nd.op == OpKind::Rand && nd.rank() == 0)) {
            kir::Instr i{Op::LinearId, CT::I32};
            return emit(i);
        }
        needs_coords = true;
        int off = n - nd.rank();
        int lin = ci(0);
        int64_t mult = 1;
        for (int j = nd.rank() - 1; j >= 0; --j) {
            if (nd.shape[j] != 1) {
                kir::Instr c{Op::Coord, CT::I32};
                c.index = j + off;
                int cv = emit(c);
                lin = op2(Op::Add, CT::I32, lin, op2(Op::Mul, CT::I32, cv, ci((int32_t)(uint32_t)mult)));
            }
            mult *= nd.shape[j];
        }
        return lin;
    }

    int philox(const Node& nd) {
        auto it = rand_slots.find(&nd);
        if (it == rand_slots.end()) {
            int seed = new_iparam(0), ctr = new_iparam(0);
            it = rand_slots.emplace(&nd, std::make_pair(seed, ctr)).first;
            out.rands.push_back({nd.serial, seed, ctr});
        }
        int x0 = philox_bits(coord_linear(nd), it->second.first, it->second.second);
        int top = op2(Op::Shr, CT::I32, x0, ci(8));
        return op2(Op::Mul, CT::F32, op1(Op::ToF32, CT::F32, top), cf(1.0f / 16777216.0f));
    }

    // Philox-2x32 (ir/rng.hpp) of (linear index, the counter in iparam `ctr_slot`) keyed by
    // the seed in iparam `seed_slot`: 32 random bits.
    int philox_bits(int linear, int seed_slot, int ctr_slot) {
        int x0 = linear;
        int x1 = iparam(ctr_slot);
        int key = iparam(seed_slot);
        int m = ci((int32_t)kPhiloxM), w = ci((int32_t)kPhiloxW);
        for (int r = 0; r < kPhiloxRounds; ++r) {
            int hi = op2(Op::MulHi, CT::I32, x0, m);
            int lo = op2(Op::Mul, CT::I32, x0, m);
            x0 = op2(Op::Xor, CT::I32, op2(Op::Xor, CT::I32, hi, key), x1);
            x1 = lo;
            if (r + 1 < kPhiloxRounds) key = op2(Op::Add, CT::I32, key, w);
        }
        return x0;
    }

    // Stochastic rounding of the float32 value `v` stored to 16-bit float dtype `t`: a uniform
    // random integer below 2^drop is added to its bits, which are then truncated at bit `drop`
    // (the bits below the kept mantissa), so the value lands on one of its two neighbours on
    // the kept grid with probabilities that make the expectation exact. Carries ripple into
    // the exponent (and to inf past the largest finite value). In the float16 subnormal range
    // the grid is the subnormals' (drop grows as the exponent falls); below it, and for NaN
    // and inf, the value is left to the store's round to nearest.
    int stochastic_round(int v, DType t, uint64_t serial) {
        const int keep = t == DType::BFloat16 ? std::min(opts.stochastic_round_bits, 7) : opts.stochastic_round_bits;
        const int seed = new_iparam(0), ctr = new_iparam(0);
        out.rands.push_back({serial, seed, ctr});
        const int bits = philox_bits(emit(kir::Instr{Op::LinearId, CT::I32}), seed, ctr);
        const int u = op1(Op::AsI32, CT::I32, v);
        const int e = op2(Op::And, CT::I32, op2(Op::Shr, CT::I32, u, ci(23)), ci(0xff));
        int drop = ci(23 - keep);
        if (t == DType::Float16)   // float16 normals start at 2^-14: biased float32 exponent 113
            drop = op2(Op::Add, CT::I32, drop, op2(Op::Maximum, CT::I32, ci(0), op2(Op::Sub, CT::I32, ci(113), e)));
        const int ok = op2(Op::And, CT::I32, op2(Op::Ne, CT::I32, e, ci(0xff)), op2(Op::Le, CT::I32, drop, ci(23)));
        const int mask = op2(Op::Sub, CT::I32, op2(Op::Shl, CT::I32, ci(1), drop), ci(1));
        const int sum = op2(Op::Add, CT::I32, u, op2(Op::And, CT::I32, bits, mask));
        const int cut = op2(Op::And, CT::I32, sum, op2(Op::Xor, CT::I32, mask, ci(-1)));
        return op3(Op::Select, CT::F32, ok, op1(Op::AsF32, CT::F32, cut), v);
    }

    int gather(const Node& nd) {
        const Node& src = *nd.inputs[0];
        int axis = nd.axis;
        int idx_rank = nd.rank() - src.rank() + 1;
        // The source is a tensor view or a temporary an earlier stage wrote (contiguous).
        BufferSource bs;
        Strides src_strides;
        if (auto t = st.inputs_from_temps.find(&src); t != st.inputs_from_temps.end()) {
            bs.is_temp = true;
            bs.temp = t->second;
            src_strides = contiguous_strides(src.shape);
        } else {
            KILN_CHECK_INTERNAL(src.op == OpKind::Leaf, "take from a computed operand that is not in memory");
            bs.view = src.view;
            src_strides = src.view.strides;
        }
        // Strides over the domain: source dims before the axis line up with the result's
        // first dims, those after it with the result's last dims; the indices' dims read 0.
        Strides s(nd.rank(), 0);
        for (int j = 0; j < src.rank(); ++j) {
            if (j == axis || src.shape[j] == 1) continue;
            int rj = j < axis ? j : j + idx_rank - 1;
            s[rj] = src_strides[j];
        }
        int b = add_buffer(src.dtype, false, map_strides(nd.shape, s), bs);
        int len = new_iparam((int32_t)src.shape[axis]);
        if (src_strides[axis] != (int32_t)src_strides[axis])
            fail(Error::Kind::Value,
                 "take: the source {} {} has a stride of {} elements along axis {}; take reads at strides of at most "
                 "2^31 - 1 elements (take from a copy with that axis last)",
                 dtype_name(src.dtype), shape_str(src.shape), src_strides[axis], axis);
        int stride = new_iparam((int32_t)src_strides[axis]);
        // Negative indices count from the end; out-of-range ones are clipped into [0, len).
        int i = value(nd.inputs[1]);
        if (nd.inputs[1]->dtype == DType::UInt64)   // (one past 2^63 is past the end too)
            i = op3(Op::Select, CT::I64, op2(Op::Lt, CT::I32, i, ci(0, CT::I64)), ci(INT64_MAX, CT::I64), i);
        if (type_of(i) == CT::I64)   // 64-bit and uint32 indices: clipped into int32's range first
            i = op2(Op::Minimum, CT::I64, op2(Op::Maximum, CT::I64, i, ci(INT32_MIN, CT::I64)), ci(INT32_MAX, CT::I64));
        i = convert(i, DType::Int32);
        int L = iparam(len);
        int neg = op2(Op::Lt, CT::I32, i, ci(0));
        i = op3(Op::Select, CT::I32, neg, op2(Op::Add, CT::I32, i, L), i);
        i = op2(Op::Maximum, CT::I32, i, ci(0));
        i = op2(Op::Minimum, CT::I32, i, op2(Op::Sub, CT::I32, L, ci(1)));
        kir::Instr g{Op::Gather, compute_type(src.dtype)};
        g.a[0] = i;
        g.index = b;
        g.aux = stride;
        return emit(g);
    }

    int compute(const Node& nd) {
        if (st.inputs_from_temps.count(&nd) || nd.op == OpKind::Leaf) {
            kir::Instr i{Op::Load, compute_type(nd.dtype)};
            i.index = buffer_for(nd);
            return emit(i);
        }
        if (is_reduction(nd.op)) {
            auto it = acc_of.find(&nd);
            KILN_CHECK_INTERNAL(it != acc_of.end(), "reduction %{} read before its pass", nd.id);
            kir::Instr i{Op::AccResult, (nd.op == OpKind::ArgMax || nd.op == OpKind::ArgMin) ? CT::I32 : k.accums[it->second].type};
            i.index = it->second;
            const int r = emit(i);
            // A uint32 sum or product accumulates in i64 and wraps at 32 bits once read; a uint64
            // max or min was taken of flipped values (run below).
            if (nd.dtype == DType::UInt64 && (nd.op == OpKind::Max || nd.op == OpKind::Min)) return flip(r);
            return nd.dtype == DType::UInt32 && (nd.op == OpKind::Sum || nd.op == OpKind::Prod) ? wrap(r, nd.dtype) : r;
        }
        const DType t = nd.dtype;
        const CT ct = compute_type(t);
        auto in = [&](int i) { return value(nd.inputs[i]); };
        auto in_as = [&](int i, DType dt) { return convert_from(in(i), nd.inputs[i]->dtype, dt); };
        const bool u64 = t == DType::UInt64;
        switch (nd.op) {
        case OpKind::Scalar: return param(nd);
        case OpKind::Rand: return philox(nd);
        case OpKind::Iota: {
            if (nd.shape[nd.axis] == 1) return ci(0);  // broadcast along its own axis: always 0
            needs_coords = true;
            kir::Instr c{Op::Coord, CT::I32};
            c.index = n - nd.rank() + nd.axis;
            return emit(c);
        }
        case OpKind::Take: return gather(nd);
        case OpKind::Neg: return wrap(op1(Op::Neg, ct, in_as(0, t)), t);
        case OpKind::Abs: return t == DType::Bool || u64 ? in(0) : wrap(op1(Op::Abs, ct, in_as(0, t)), t);
        case OpKind::Square: { int x = in_as(0, t); return wrap(op2(Op::Mul, ct, x, x), t); }
        case OpKind::Sqrt: return op1(Op::Sqrt, ct, in_as(0, t));
        case OpKind::Exp: return op1(Op::Exp, ct, in_as(0, t));
        case OpKind::Exp2: return op1(Op::Exp2, ct, in_as(0, t));
        case OpKind::Log: return op1(Op::Log, ct, in_as(0, t));
        case OpKind::Log2: return op1(Op::Log2, ct, in_as(0, t));
        case OpKind::Tanh: return op1(Op::Tanh, ct, in_as(0, t));
#define KILN_MATH(K, name, c_function, host) \
        case OpKind::K: return op1(Op::K, ct, in_as(0, t));
#define KILN_MATH2(K, name, c_function, host) \
        case OpKind::K: return op2(Op::K, ct, in_as(0, t), in_as(1, t));
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
        case OpKind::SafeLog:
            return op1(Op::Log, ct, op2(Op::Maximum, ct, in_as(0, t), cf(std::exp(-50.0), ct)));
        case OpKind::Sig: case OpKind::Sig2: {
            int x = op1(Op::Neg, ct, in_as(0, t));
            int e = op1(nd.op == OpKind::Sig ? Op::Exp : Op::Exp2, ct, x);
            return op2(Op::Div, ct, cf(1.0, ct), op2(Op::Add, ct, cf(1.0, ct), e));
        }
        case OpKind::Tanh2:  // (2^(2x) - 1) / (2^(2x) + 1) == tanh(x ln 2), without the overflow
            return op1(Op::Tanh, ct, op2(Op::Mul, ct, in_as(0, t), cf(std::log(2.0), ct)));
        case OpKind::Reciprocal: return op2(Op::Div, ct, cf(1.0, ct), in_as(0, t));
        case OpKind::Sgn:
            if (u64) return op1(Op::Convert, ct, op2(Op::Ne, CT::I32, in(0), ci(0, ct)));
            return op1(Op::Sgn, ct, in_as(0, t));
        case OpKind::Rint: return op1(Op::Rint, ct, in_as(0, t));
        case OpKind::Floor: return op1(Op::Floor, ct, in_as(0, t));
        case OpKind::Finite: {
            int x = in(0);
            return is_float(type_of(x)) ? op1(Op::Finite, CT::I32, x) : ci(1);
        }
        case OpKind::Cast: return convert_from(in(0), nd.inputs[0]->dtype, t);
        // Bitwise ops on the values widened to int32 (sign-extended: in range again after and,
        // or and xor); ~ of a bool is not.
        case OpKind::Invert:
            return t == DType::Bool ? op2(Op::Xor, CT::I32, in_as(0, t), ci(1)) : wrap(op2(Op::Xor, ct, in_as(0, t), ci(-1, ct)), t);
        case OpKind::BitAnd: return op2(Op::And, ct, in_as(0, t), in_as(1, t));
        case OpKind::BitOr: return op2(Op::Or, ct, in_as(0, t), in_as(1, t));
        case OpKind::BitXor: return op2(Op::Xor, ct, in_as(0, t), in_as(1, t));
        // Shifts of the values widened to int32, by amounts in [0, 31]; an int8 or uint8 result
        // wraps, which gives NumPy's 0 (left) and sign (right) for amounts from its width to 31.
        // Amounts outside [0, 31] give those directly. The right shift is arithmetic: the
        // logical shift of x ^ sign, then ^ sign.
        case OpKind::Shl: case OpKind::Shr: {
            const int x = in_as(0, t), s = in_as(1, t);
            const int last = ct == CT::I64 ? 63 : 31;
            const int wide = op2(Op::Or, CT::I32, op2(Op::Lt, CT::I32, s, ci(0, ct)), op2(Op::Gt, CT::I32, s, ci(last, ct)));
            if (nd.op == OpKind::Shl) return wrap(op3(Op::Select, ct, wide, ci(0, ct), op2(Op::Shl, ct, x, s)), t);
            const int sign = u64 ? ci(0, ct) : op3(Op::Select, ct, op2(Op::Lt, CT::I32, x, ci(0, ct)), ci(-1, ct), ci(0, ct));
            const int shifted = op2(Op::Xor, ct, op2(Op::Shr, ct, op2(Op::Xor, ct, x, sign), s), sign);
            return op3(Op::Select, ct, wide, sign, shifted);
        }
        case OpKind::Add: return wrap(op2(Op::Add, ct, in_as(0, t), in_as(1, t)), t);
        case OpKind::Sub: return wrap(op2(Op::Sub, ct, in_as(0, t), in_as(1, t)), t);
        case OpKind::Mul: return wrap(op2(Op::Mul, ct, in_as(0, t), in_as(1, t)), t);
        case OpKind::Div: return op2(Op::Div, ct, in_as(0, t), in_as(1, t));
        case OpKind::NextAfter: return op2(Op::NextAfter, ct, in_as(0, t), in_as(1, t));
        case OpKind::FloorDiv: case OpKind::Mod: case OpKind::Fmod: return division(nd.op, in_as(0, t), in_as(1, t), t);
        case OpKind::Pow: return is_float(ct) ? op2(Op::Pow, ct, in_as(0, t), in_as(1, t)) : int_power(in_as(0, t), in_as(1, t), t);
        case OpKind::Maximum: case OpKind::Minimum: {
            const Op op = nd.op == OpKind::Maximum ? Op::Maximum : Op::Minimum;
            if (u64) return flip(op2(op, ct, flip(in_as(0, t)), flip(in_as(1, t))));
            return op2(op, ct, in_as(0, t), in_as(1, t));
        }
        case OpKind::Eq: case OpKind::Ne: case OpKind::Gt: case OpKind::Ge: case OpKind::Lt: case OpKind::Le: {
            // Compared in the compute type, never narrowed: an int8 tensor compared with the
            // literal 200 compares against 200 (NumPy 2), not against a wrapped -56.
            DType ot = result_type(Expr(nd.inputs[0]), Expr(nd.inputs[1]));
            const Op op = nd.op == OpKind::Eq ? Op::Eq : nd.op == OpKind::Ne ? Op::Ne : nd.op == OpKind::Gt ? Op::Gt
                        : nd.op == OpKind::Ge ? Op::Ge : nd.op == OpKind::Lt ? Op::Lt : Op::Le;
            if (ot == DType::UInt64 && op != Op::Eq && op != Op::Ne) {   // unsigned order
                const int a = flip(in_as(0, ot)), b = flip(in_as(1, ot));
                return op2(op, CT::I32, a, b);
            }
            if (is_integer(ot) && ot != DType::UInt64) ot = compute_type(ot) == CT::I64 ? DType::Int64 : DType::Int32;
            else if (is_float(ot)) ot = ot == DType::Float64 ? DType::Float64 : DType::Float32;
            return op2(op, CT::I32, in_as(0, ot), in_as(1, ot));
        }
        case OpKind::Where: {
            int c = op1(Op::ToBool, CT::I32, in(0));
            return op3(Op::Select, ct, c, in_as(1, t), in_as(2, t));
        }
        // Leaves and reductions are read above; a reshape is a view by the time a stage is
        // lowered. Listed rather than a default, so that a new OpKind without a lowering is a
        // -Wswitch warning here.
        case OpKind::Leaf: case OpKind::Reshape:
        case OpKind::Sum: case OpKind::Max: case OpKind::Min: case OpKind::ArgMax: case OpKind::ArgMin: case OpKind::Prod: break;
        }
        throw InternalError(fmt::format("lower: no lowering for {}", node_str(nd)));
    }

    // ---- reduction levels: a reduction's pass comes after every reduction it depends on.
    std::unordered_map<const Node*, int> levels;
    void compute_levels() {
        for (const Node* nd : stage_postorder()) {
            int lv = 0;
            if (!st.inputs_from_temps.count(nd) && nd->op != OpKind::Leaf) {
                for (auto& i : nd->inputs) lv = std::max(lv, levels.at(i.get()));
                if (is_reduction(nd->op)) ++lv;
            }
            levels[nd] = lv;
        }
    }
    int level_of(const Node* nd) const { return levels.at(nd); }

    // The nodes of every root the kernel stores (the stage's, then its siblings'), operands
    // before their users, each once.
    std::vector<const Node*> stage_postorder() const {
        // Not below what an earlier stage computed: a chain of N stages lowers in O(N), not O(N^2).
        auto computed = [this](const Node* nd) { return st.inputs_from_temps.count(nd) != 0; };
        std::vector<const Node*> order = postorder(st.root, computed);
        if (st.siblings.empty()) return order;
        std::unordered_set<const Node*> seen(order.begin(), order.end());
        for (const Stage::Sibling& sib : st.siblings)
            for (const Node* nd : postorder(sib.root, computed))
                if (seen.insert(nd).second) order.push_back(nd);
        return order;
    }

    void open_block(bool loop) {
        k.blocks.push_back({});
        k.blocks.back().loop = loop;
        cur = (int)k.blocks.size() - 1;
        memo.clear();
    }

    int add_output(const StageOutput& o, std::vector<int64_t>& ostrides) {
        BufferSource osrc;
        if (o.is_temp) {
            osrc.is_temp = true;
            osrc.temp = o.temp;
            ostrides = map_strides(o.shape, contiguous_strides(o.shape));
        } else {
            osrc.view = o.view;
            ostrides = map_strides(o.view.shape, o.view.strides);
        }
        return add_buffer(o.dtype, true, ostrides, osrc);
    }

    void run() {
        // Outputs first, so that the stage's is buffer 0 of every kernel (its siblings' follow).
        std::vector<std::pair<const NodePtr*, const StageOutput*>> outs{{&st.root, &st.out}};
        for (const Stage::Sibling& sib : st.siblings) outs.push_back({&sib.root, &sib.out});
        std::vector<int> obufs;
        std::vector<std::vector<int64_t>> ostrides(outs.size());
        for (size_t i = 0; i < outs.size(); ++i) obufs.push_back(add_output(*outs[i].second, ostrides[i]));

        // Reductions fused into this stage, by level, in postfix order.
        compute_levels();
        int levels_total = 0;
        for (auto& [root, o] : outs) levels_total = std::max(levels_total, level_of(root->get()));
        std::vector<std::vector<const Node*>> by_level(levels_total + 1);
        for (const Node* nd : stage_postorder()) {
            if (st.inputs_from_temps.count(nd)) continue;
            if (is_reduction(nd->op)) by_level[level_of(nd)].push_back(nd);
        }
        for (int lv = 1; lv <= levels_total; ++lv) {
            open_block(true);
            for (const Node* r : by_level[lv]) {
                int v = value(r->inputs[0]);
                kir::AccKind kind = r->op == OpKind::Sum ? kir::AccKind::Sum : r->op == OpKind::Max ? kir::AccKind::Max
                                  : r->op == OpKind::Min ? kir::AccKind::Min : r->op == OpKind::ArgMax ? kir::AccKind::ArgMax
                                  : r->op == OpKind::Prod ? kir::AccKind::Prod : kir::AccKind::ArgMin;
                // int8 sums and products accumulate as int32; uint64 extremes are taken of flipped
                // values (signed order), flipped back where read.
                if (kind == kir::AccKind::Sum || kind == kir::AccKind::Prod) v = convert_from(v, r->inputs[0]->dtype, r->dtype);
                else if (r->inputs[0]->dtype == DType::UInt64) v = flip(v);
                k.accums.push_back({kind, type_of(v), v});
                k.blocks[cur].accums.push_back((int)k.accums.size() - 1);
                acc_of[r] = (int)k.accums.size() - 1;
            }
        }
        // A Point block stores once per P point, when no output varies along a reduced dim.
        bool point_store = levels_total > 0;
        for (size_t i = 0; i < outs.size(); ++i)
            for (int d = 0; d < n; ++d)
                if (st.reduced[d] && ostrides[i][d] != 0 && st.domain[d] != 1) point_store = false;
        open_block(!point_store);
        for (size_t i = 0; i < outs.size(); ++i) {
            const StageOutput& o = *outs[i].second;
            const NodePtr& root = *outs[i].first;
            int v = convert_from(value(root), root->dtype, o.dtype);
            if (opts.stochastic_round_bits > 0 && (o.dtype == DType::Float16 || o.dtype == DType::BFloat16))
                v = stochastic_round(v, o.dtype, rounding_serial(o, i));
            k.blocks[cur].stores.push_back({obufs[i], v});
            k.buffers[obufs[i]].output = true;
            if (opts.hist.bins > 0 && !o.is_temp && is_float(o.dtype) && o.dtype != DType::Float64) {
                k.buffers[obufs[i]].hist = true;
                k.hist = opts.hist;
            }
        }
    }

    // Each stored output rounds with draws of its own: temporaries by their index, the
    // destination (0) and its siblings past every temporary's serial.
    static uint64_t rounding_serial(const StageOutput& o, size_t output) {
        if (o.is_temp) return kRoundingSerial + (uint64_t)o.temp + 1;
        return kRoundingSerial + (output == 0 ? 0 : (uint64_t(1) << 32) + output);
    }

    void finish(const std::string& target) {
        // Sizes and strides of this launch, then dims merged where every buffer allows it.
        std::vector<int64_t> sizes(st.domain.begin(), st.domain.end());
        std::vector<bool> red = st.reduced;
        std::vector<int> keep;
        for (int d = 0; d < n; ++d) keep.push_back(d);
        if (!needs_coords) {
            std::vector<int> kept;
            for (int d : keep)
                if (sizes[d] != 1) kept.push_back(d);
            keep = kept;
        }
        std::vector<int64_t> msizes;
        std::vector<bool> mred;
        std::vector<std::vector<int64_t>> ms(dstrides.size());
        for (int d : keep) {
            bool merge = !needs_coords && !msizes.empty() && mred.back() == red[d];
            // The group so far is outer to `d`: it merges when its innermost stride steps over
            // exactly one run of `d` in every buffer.
            if (merge)
                for (size_t b = 0; b < ms.size(); ++b)
                    if (ms[b].back() != dstrides[b][d] * sizes[d]) { merge = false; break; }
            if (merge) {
                msizes.back() *= sizes[d];
                for (size_t b = 0; b < ms.size(); ++b) ms[b].back() = dstrides[b][d];
            } else {
                msizes.push_back(sizes[d]);
                mred.push_back(red[d]);
                for (size_t b = 0; b < ms.size(); ++b) ms[b].push_back(dstrides[b][d]);
            }
        }
        bool any_p = false, any_r = false;
        for (bool r : mred) (r ? any_r : any_p) = true;
        bool two_step = k.blocks.size() == 2 && k.blocks[0].loop && !k.blocks[1].loop;
        if (any_r && !any_p && !two_step) {
            // Several passes over all of the data (var of a single row): not a two-step full
            // reduction, so keep one parallel dim of size 1 to run the passes in order.
            msizes.insert(msizes.begin(), 1);
            mred.insert(mred.begin(), false);
            for (auto& b : ms) b.insert(b.begin(), 0);
            any_p = true;
        }
        k.rank = (int)msizes.size();
        k.reduced = mred;
        k.full_reduce = any_r && !any_p;
        out.args.sizes = msizes;
        out.args.strides.clear();
        for (size_t b = 0; b < ms.size(); ++b) {
            k.buffers[b].layout.clear();
            for (int64_t s : ms[b]) {
                k.buffers[b].layout.push_back(s == 0 ? kir::StrideKind::Zero : s == 1 ? kir::StrideKind::One : kir::StrideKind::Any);
                out.args.strides.push_back(s);
            }
        }
        out.args.buffers.assign(k.buffers.size(), nullptr);
        out.key = key_material(k, target);
        k.name = kernel_name_for(out.key);
        out.kernel = std::move(k);
    }

};

} // namespace

LoweredStage lower(const Stage& stage, const std::string& target, const LowerOptions& opts) {
    Lowerer l(stage, opts);
    l.run();
    l.finish(target);
    return std::move(l.out);
}

} // namespace kiln
