#include "runtime/kir_interpreter.hpp"

#include "ir/error.hpp"
#include "ir/half.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace kiln {

namespace {

using kir::Op;

using CT = kir::ComputeType;

// One value of the kernel: the member of its instruction's compute type.
union Val {
    float f;
    int32_t i;
    double d;
    int64_t l;
};

struct AccState {
    Val v;
    int32_t pos;
    bool seen;
};

Val load(DType t, const char* p) {
    Val v{};
    switch (t) {
    case DType::Float32: std::memcpy(&v.f, p, 4); break;
    case DType::Float16: { uint16_t h; std::memcpy(&h, p, 2); v.f = f16_to_float(h); break; }
    case DType::BFloat16: { uint16_t h; std::memcpy(&h, p, 2); v.f = bf16_to_float(h); break; }
    case DType::Float64: std::memcpy(&v.d, p, 8); break;
    case DType::Int32: std::memcpy(&v.i, p, 4); break;
    case DType::Int8: v.i = *reinterpret_cast<const int8_t*>(p); break;
    case DType::UInt8: v.i = *reinterpret_cast<const uint8_t*>(p); break;
    case DType::Int16: { int16_t h; std::memcpy(&h, p, 2); v.i = h; break; }
    case DType::UInt16: { uint16_t h; std::memcpy(&h, p, 2); v.i = h; break; }
    case DType::Bool: v.i = *reinterpret_cast<const uint8_t*>(p) != 0; break;
    case DType::Int64: case DType::UInt64: std::memcpy(&v.l, p, 8); break;
    case DType::UInt32: { uint32_t u; std::memcpy(&u, p, 4); v.l = u; break; }
    }
    return v;
}
void store(DType t, char* p, Val v) {
    switch (t) {
    case DType::Float32: std::memcpy(p, &v.f, 4); return;
    case DType::Float16: { uint16_t h = float_to_f16(v.f); std::memcpy(p, &h, 2); return; }
    case DType::BFloat16: { uint16_t h = float_to_bf16(v.f); std::memcpy(p, &h, 2); return; }
    case DType::Float64: std::memcpy(p, &v.d, 8); return;
    case DType::Int32: std::memcpy(p, &v.i, 4); return;
    case DType::Int8: case DType::UInt8: *reinterpret_cast<uint8_t*>(p) = (uint8_t)(v.i & 0xff); return;
    case DType::Int16: case DType::UInt16: { const uint16_t h = (uint16_t)(v.i & 0xffff); std::memcpy(p, &h, 2); return; }
    case DType::Bool: *reinterpret_cast<uint8_t*>(p) = v.i != 0; return;
    case DType::Int64: case DType::UInt64: std::memcpy(p, &v.l, 8); return;
    case DType::UInt32: { const uint32_t u = (uint32_t)(uint64_t)v.l; std::memcpy(p, &u, 4); return; }
    }
}

// Truncation toward zero, saturating at I's range, NaN -> 0.
template <class I, class F>
I to_int(F f) {
    if (std::isnan(f)) return 0;
    if (f <= (F)std::numeric_limits<I>::min()) return std::numeric_limits<I>::min();
    if (f >= -(F)std::numeric_limits<I>::min()) return std::numeric_limits<I>::max();
    return (I)f;
}

// A value of any compute type as a double or an int64 (exact for every integer value).
double as_double(CT t, Val v) { return t == CT::F32 ? v.f : t == CT::F64 ? v.d : t == CT::I32 ? (double)v.i : (double)v.l; }
int64_t as_int64(CT t, Val v) { return t == CT::I32 ? v.i : v.l; }

// Value conversion (kir::Op::Convert, and the 32-bit ToF32 / ToI32).
Val convert(CT from, CT to, Val v) {
    Val r{};
    if (from == to) return v;
    switch (to) {
    case CT::F32: r.f = from == CT::F64 ? (float)v.d : from == CT::I32 ? (float)v.i : (float)v.l; break;
    case CT::F64: r.d = from == CT::F32 ? (double)v.f : from == CT::I32 ? (double)v.i : (double)v.l; break;
    case CT::I32:
        r.i = from == CT::F32 ? to_int<int32_t>(v.f) : from == CT::F64 ? to_int<int32_t>(v.d) : (int32_t)(uint32_t)(uint64_t)v.l;
        break;
    case CT::I64: r.l = from == CT::F32 ? to_int<int64_t>(v.f) : from == CT::F64 ? to_int<int64_t>(v.d) : (int64_t)v.i; break;
    }
    return r;
}

template <class F>
bool better_f(bool mx, F cand, F best) {
    if (std::isnan(best)) return false;
    if (std::isnan(cand)) return true;
    return mx ? cand > best : cand < best;
}
bool better(kir::AccKind kind, CT t, Val cand, Val best) {
    bool mx = kind == kir::AccKind::Max || kind == kir::AccKind::ArgMax;
    switch (t) {
    case CT::F32: return better_f(mx, cand.f, best.f);
    case CT::F64: return better_f(mx, cand.d, best.d);
    case CT::I32: return mx ? cand.i > best.i : cand.i < best.i;
    case CT::I64: return mx ? cand.l > best.l : cand.l < best.l;
    }
    return false;
}

// Wrapping integer arithmetic (through the unsigned type of the same width).
template <class I>
I wrap_add(I x, I y) { using U = std::make_unsigned_t<I>; return (I)((U)x + (U)y); }
template <class I>
I wrap_sub(I x, I y) { using U = std::make_unsigned_t<I>; return (I)((U)x - (U)y); }
template <class I>
I wrap_mul(I x, I y) { using U = std::make_unsigned_t<I>; return (I)((U)x * (U)y); }

struct Exec {
    const kir::Kernel& k;
    const kir::LaunchArgs& a;
    std::vector<Val> vals;
    std::vector<AccState> acc;
    std::vector<int64_t> coord;

    Exec(const kir::Kernel& kk, const kir::LaunchArgs& aa) : k(kk), a(aa), vals(kk.instrs.size()), acc(kk.accums.size()),
                                                             coord(kk.rank, 0) {}

    const char* addr(int b, int64_t extra = 0) const {
        int64_t off = extra;
        for (int d = 0; d < k.rank; ++d) off += coord[d] * a.strides[b * k.rank + d];
        return static_cast<const char*>(a.buffers[b]) + off * (int64_t)dtype_size(k.buffers[b].dtype);
    }

    // A 64-bit parameter from two 32-bit slots, low word first.
    template <class W, class T>
    static T wide_param(const std::vector<W>& words, int index) {
        uint32_t w[2];
        std::memcpy(&w[0], &words[index], 4);
        std::memcpy(&w[1], &words[index + 1], 4);
        T v;
        std::memcpy(&v, w, 8);
        return v;
    }

    void exec(int id) {
        const kir::Instr& in = k.instrs[id];
        Val& r = vals[id];
        auto A = [&](int i) { return vals[in.a[i]]; };
        const CT t = in.type;
        const CT ta = in.a[0] >= 0 ? k.instrs[in.a[0]].type : t;   // the first operand's type
        // One expression per compute type: x and y are the operands as that type's member.
#define PER_TYPE1(FE, IE)                                                                       \
    switch (t) {                                                                                \
    case CT::F32: { const float x = A(0).f; (void)x; r.f = (FE); break; }                                \
    case CT::F64: { const double x = A(0).d; (void)x; r.d = (FE); break; }                               \
    case CT::I32: { const int32_t x = A(0).i; (void)x; r.i = (IE); break; }                              \
    case CT::I64: { const int64_t x = A(0).l; (void)x; r.l = (IE); break; }                              \
    }
#define PER_TYPE2(FE, IE)                                                                       \
    switch (t) {                                                                                \
    case CT::F32: { const float x = A(0).f, y = A(1).f; (void)x, (void)y; r.f = (FE); break; }                    \
    case CT::F64: { const double x = A(0).d, y = A(1).d; (void)x, (void)y; r.d = (FE); break; }                   \
    case CT::I32: { const int32_t x = A(0).i, y = A(1).i; (void)x, (void)y; r.i = (IE); break; }                  \
    case CT::I64: { const int64_t x = A(0).l, y = A(1).l; (void)x, (void)y; r.l = (IE); break; }                  \
    }
#define PER_FLOAT1(E) PER_TYPE1(E, 0)
#define PER_FLOAT2(E) PER_TYPE2(E, 0)
        switch (in.op) {
        case Op::ConstF: if (t == CT::F32) r.f = (float)in.fimm; else r.d = in.fimm; break;
        case Op::ConstI: if (t == CT::I32) r.i = (int32_t)in.iimm; else r.l = in.iimm; break;
        case Op::ParamF: if (t == CT::F32) r.f = a.fparams[in.index]; else r.d = wide_param<float, double>(a.fparams, in.index); break;
        case Op::ParamI: if (t == CT::I32) r.i = a.iparams[in.index]; else r.l = wide_param<int32_t, int64_t>(a.iparams, in.index); break;
        case Op::Load: r = load(k.buffers[in.index].dtype, addr(in.index)); break;
        case Op::Gather: r = load(k.buffers[in.index].dtype, addr(in.index, (int64_t)A(0).i * a.iparams[in.aux])); break;
        case Op::Coord: r.i = (int32_t)coord[in.index]; break;
        case Op::LinearId: {
            int64_t lin = 0;
            for (int d = 0; d < k.rank; ++d) lin = lin * a.sizes[d] + coord[d];
            r.i = (int32_t)(uint32_t)(uint64_t)lin;
            break;
        }
        case Op::AccResult: {
            const AccState& s = acc[in.index];
            kir::AccKind kind = k.accums[in.index].kind;
            r = (kind == kir::AccKind::ArgMax || kind == kir::AccKind::ArgMin) ? Val{.i = s.pos} : s.v;
            break;
        }
        case Op::Neg: PER_TYPE1(-x, wrap_sub<std::remove_const_t<decltype(x)>>(0, x)) break;
        case Op::Abs: PER_TYPE1(std::fabs(x), x < 0 ? wrap_sub<std::remove_const_t<decltype(x)>>(0, x) : x) break;
        case Op::Sqrt: PER_FLOAT1(std::sqrt(x)) break;
        case Op::Exp: PER_FLOAT1(std::exp(x)) break;
        case Op::Exp2: PER_FLOAT1(std::exp2(x)) break;
        case Op::Log: PER_FLOAT1(std::log(x)) break;
        case Op::Log2: PER_FLOAT1(std::log2(x)) break;
        case Op::Tanh: PER_FLOAT1(std::tanh(x)) break;
#define KILN_MATH(K, name, c_function, host) \
        case Op::K: PER_FLOAT1(host(x)) break;
#define KILN_MATH2(K, name, c_function, host) \
        case Op::K: PER_FLOAT2(host(x, y)) break;
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
        case Op::Rint: PER_FLOAT1(std::nearbyint(x)) break;
        case Op::Sgn: PER_TYPE1(std::isnan(x) ? x : (std::remove_const_t<decltype(x)>)((x > 0) - (x < 0)), (std::remove_const_t<decltype(x)>)((x > 0) - (x < 0))) break;
        case Op::Finite: r.i = ta == CT::F32 ? std::isfinite(A(0).f) : std::isfinite(A(0).d); break;
        case Op::ToF32: case Op::ToI32: case Op::Convert: r = convert(ta, t, A(0)); break;
        case Op::WrapI8: r.i = (int8_t)(uint8_t)(A(0).i & 0xff); break;
        case Op::WrapU8: r.i = A(0).i & 0xff; break;
        case Op::WrapI16: r.i = (int16_t)(uint16_t)(A(0).i & 0xffff); break;
        case Op::WrapU16: r.i = A(0).i & 0xffff; break;
        case Op::WrapU32: r.l = A(0).l & 0xffffffffLL; break;
        case Op::ToBool: {
            const Val x = A(0);
            r.i = ta == CT::F32 ? (x.f != 0 || std::isnan(x.f)) : ta == CT::F64 ? (x.d != 0 || std::isnan(x.d))
                : ta == CT::I32 ? x.i != 0 : x.l != 0;
            break;
        }
        case Op::Add: PER_TYPE2(x + y, wrap_add(x, y)) break;
        case Op::Sub: PER_TYPE2(x - y, wrap_sub(x, y)) break;
        case Op::Mul: PER_TYPE2(x * y, wrap_mul(x, y)) break;
        case Op::Maximum: PER_TYPE2((x > y || std::isnan(x)) ? x : y, x > y ? x : y) break;
        case Op::Minimum: PER_TYPE2((x < y || std::isnan(x)) ? x : y, x < y ? x : y) break;
        case Op::Div: PER_FLOAT2(x / y) break;
        case Op::Pow: PER_FLOAT2(std::pow(x, y)) break;
        case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: {
            const Val x = A(0), y = A(1);
            int c;   // -1, 0, 1; 2 when unordered (a NaN)
            if (is_float(ta)) {
                const double dx = as_double(ta, x), dy = as_double(ta, y);
                c = std::isnan(dx) || std::isnan(dy) ? 2 : dx < dy ? -1 : dx > dy ? 1 : 0;
            } else {
                const int64_t ix = as_int64(ta, x), iy = as_int64(ta, y);
                c = ix < iy ? -1 : ix > iy ? 1 : 0;
            }
            switch (in.op) {
            case Op::Eq: r.i = c == 0; break;
            case Op::Ne: r.i = c != 0; break;
            case Op::Lt: r.i = c == -1; break;
            case Op::Le: r.i = c == -1 || c == 0; break;
            case Op::Gt: r.i = c == 1; break;
            default: r.i = c == 1 || c == 0; break;
            }
            break;
        }
        case Op::And: PER_TYPE2(0, x & y) break;
        case Op::Or: PER_TYPE2(0, x | y) break;
        case Op::Xor: PER_TYPE2(0, x ^ y) break;
        case Op::Shl:
            if (t == CT::I32) r.i = (int32_t)((uint32_t)A(0).i << (A(1).i & 31));
            else r.l = (int64_t)((uint64_t)A(0).l << (A(1).l & 63));
            break;
        case Op::Shr:
            if (t == CT::I32) r.i = (int32_t)((uint32_t)A(0).i >> (A(1).i & 31));
            else r.l = (int64_t)((uint64_t)A(0).l >> (A(1).l & 63));
            break;
        case Op::MulHi: r.i = (int32_t)(uint32_t)(((uint64_t)(uint32_t)A(0).i * (uint32_t)A(1).i) >> 32); break;
        case Op::Select: r = A(0).i ? A(1) : A(2); break;
        case Op::AsI32: { const float f = A(0).f; std::memcpy(&r.i, &f, 4); break; }
        case Op::AsF32: { const int32_t i = A(0).i; std::memcpy(&r.f, &i, 4); break; }
        case Op::AsI64: { const double d = A(0).d; std::memcpy(&r.l, &d, 8); break; }
        case Op::AsF64: { const int64_t l = A(0).l; std::memcpy(&r.d, &l, 8); break; }
        case Op::Floor: PER_FLOAT1(std::floor(x)) break;
        case Op::Fmod: PER_FLOAT2(std::fmod(x, y)) break;
        case Op::NextAfter: PER_FLOAT2(std::nextafter(x, y)) break;
        case Op::IDiv: case Op::IRem: {
            const int64_t x = as_int64(t, A(0)), y = as_int64(t, A(1));
            const int64_t lo = t == CT::I32 ? INT32_MIN : INT64_MIN;
            KILN_CHECK_INTERNAL(y != 0 && !(x == lo && y == -1), "kir interpreter: {} {} by {} is undefined",
                                kir::op_name(in.op), x, y);
            const int64_t q = in.op == Op::IDiv ? x / y : x % y;
            if (t == CT::I32) r.i = (int32_t)q; else r.l = q;
            break;
        }
        }
#undef PER_FLOAT2
#undef PER_FLOAT1
#undef PER_TYPE2
#undef PER_TYPE1
    }

    void reset_acc(const kir::Block& b) {
        for (int ai : b.accums) {
            const kir::Accum& ac = k.accums[ai];
            AccState& s = acc[ai];
            s.pos = 0;
            s.seen = false;
            double init = 0;
            switch (ac.kind) {
            case kir::AccKind::Sum: init = 0; break;
            case kir::AccKind::Prod: init = 1; break;
            case kir::AccKind::Max: case kir::AccKind::ArgMax: init = -std::numeric_limits<double>::infinity(); break;
            case kir::AccKind::Min: case kir::AccKind::ArgMin: init = std::numeric_limits<double>::infinity(); break;
            }
            switch (ac.type) {
            case CT::F32: s.v.f = (float)init; break;
            case CT::F64: s.v.d = init; break;
            case CT::I32: s.v.i = std::isinf(init) ? (init < 0 ? INT32_MIN : INT32_MAX) : (int32_t)init; break;
            case CT::I64: s.v.l = std::isinf(init) ? (init < 0 ? INT64_MIN : INT64_MAX) : (int64_t)init; break;
            }
        }
    }

    void run_block(const kir::Block& b, int32_t rpos) {
        for (int id : b.instrs) exec(id);
        for (int ai : b.accums) {
            const kir::Accum& ac = k.accums[ai];
            AccState& s = acc[ai];
            Val v = vals[ac.value];
            if (ac.kind == kir::AccKind::Sum || ac.kind == kir::AccKind::Prod) {
                const bool add = ac.kind == kir::AccKind::Sum;
                switch (ac.type) {
                case CT::F32: s.v.f = add ? s.v.f + v.f : s.v.f * v.f; break;
                case CT::F64: s.v.d = add ? s.v.d + v.d : s.v.d * v.d; break;
                case CT::I32: s.v.i = add ? wrap_add(s.v.i, v.i) : wrap_mul(s.v.i, v.i); break;
                case CT::I64: s.v.l = add ? wrap_add(s.v.l, v.l) : wrap_mul(s.v.l, v.l); break;
                }
            } else if (!s.seen || better(ac.kind, ac.type, v, s.v)) {
                s.v = v;
                s.pos = rpos;
            }
            s.seen = true;
        }
        for (auto& st : b.stores) store(k.buffers[st.buffer].dtype, const_cast<char*>(addr(st.buffer)), vals[st.value]);
    }

    void point(const std::vector<int>& rdims) {
        for (auto& b : k.blocks) {
            if (!b.loop) {
                for (int d : rdims) coord[d] = 0;
                run_block(b, 0);
                continue;
            }
            reset_acc(b);
            int64_t total = 1;
            for (int d : rdims) total *= a.sizes[d];
            for (int d : rdims) coord[d] = 0;
            for (int64_t r = 0; r < total; ++r) {
                run_block(b, (int32_t)r);
                for (int i = (int)rdims.size() - 1; i >= 0; --i) {
                    if (++coord[rdims[i]] < a.sizes[rdims[i]]) break;
                    coord[rdims[i]] = 0;
                }
            }
        }
    }
};

} // namespace

void interpret(const kir::Kernel& k, const kir::LaunchArgs& args) {
    Exec e(k, args);
    std::vector<int> pdims, rdims;
    for (int d = 0; d < k.rank; ++d) (k.reduced[d] ? rdims : pdims).push_back(d);
    int64_t total = 1;
    for (int d : pdims) total *= args.sizes[d];
    for (int d : pdims) e.coord[d] = 0;
    for (int64_t p = 0; p < total; ++p) {
        e.point(rdims);
        for (int i = (int)pdims.size() - 1; i >= 0; --i) {
            if (++e.coord[pdims[i]] < args.sizes[pdims[i]]) break;
            e.coord[pdims[i]] = 0;
        }
    }
}

} // namespace kiln
