#include "runtime/kir_interpreter.hpp"

#include "ir/error.hpp"
#include "ir/half.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace kiln {

namespace {

using kir::Op;

union Val {
    float f;
    int32_t i;
};

struct AccState {
    Val v;
    int32_t pos;
    bool seen;
};

float load_f(DType t, const char* p) {
    switch (t) {
    case DType::Float32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::Float16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_float(h); }
    case DType::BFloat16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_float(h); }
    default: break;
    }
    throw InternalError("interpreter: float load of an integer buffer");
}
int32_t load_i(DType t, const char* p) {
    switch (t) {
    case DType::Int32: { int32_t i; std::memcpy(&i, p, 4); return i; }
    case DType::Int8: return *reinterpret_cast<const int8_t*>(p);
    case DType::UInt8: return *reinterpret_cast<const uint8_t*>(p);
    case DType::Bool: return *reinterpret_cast<const uint8_t*>(p) != 0;
    default: break;
    }
    throw InternalError("interpreter: integer load of a float buffer");
}
void store(DType t, char* p, Val v) {
    switch (t) {
    case DType::Float32: std::memcpy(p, &v.f, 4); return;
    case DType::Float16: { uint16_t h = float_to_f16(v.f); std::memcpy(p, &h, 2); return; }
    case DType::BFloat16: { uint16_t h = float_to_bf16(v.f); std::memcpy(p, &h, 2); return; }
    case DType::Int32: std::memcpy(p, &v.i, 4); return;
    case DType::Int8: case DType::UInt8: *reinterpret_cast<uint8_t*>(p) = (uint8_t)(v.i & 0xff); return;
    case DType::Bool: *reinterpret_cast<uint8_t*>(p) = v.i != 0; return;
    }
}

int32_t to_i32(float f) {
    if (std::isnan(f)) return 0;
    if (f <= -2147483648.0f) return INT32_MIN;
    if (f >= 2147483648.0f) return INT32_MAX;
    return (int32_t)f;
}

bool better(kir::AccKind kind, kir::ComputeType t, Val cand, Val best) {
    bool mx = kind == kir::AccKind::Max || kind == kir::AccKind::ArgMax;
    if (t == kir::ComputeType::F32) {
        if (std::isnan(best.f)) return false;
        if (std::isnan(cand.f)) return true;
        return mx ? cand.f > best.f : cand.f < best.f;
    }
    return mx ? cand.i > best.i : cand.i < best.i;
}

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

    void exec(int id) {
        const kir::Instr& in = k.instrs[id];
        Val& r = vals[id];
        auto A = [&](int i) { return vals[in.a[i]]; };
        bool F = in.type == kir::ComputeType::F32;
        bool FA = in.a[0] >= 0 && k.instrs[in.a[0]].type == kir::ComputeType::F32;
        switch (in.op) {
        case Op::ConstF: r.f = in.fimm; break;
        case Op::ConstI: r.i = in.iimm; break;
        case Op::ParamF: r.f = a.fparams[in.index]; break;
        case Op::ParamI: r.i = a.iparams[in.index]; break;
        case Op::Load: {
            const char* p = addr(in.index);
            if (F) r.f = load_f(k.buffers[in.index].dtype, p); else r.i = load_i(k.buffers[in.index].dtype, p);
            break;
        }
        case Op::Gather: {
            const char* p = addr(in.index, (int64_t)A(0).i * a.iparams[in.aux]);
            if (F) r.f = load_f(k.buffers[in.index].dtype, p); else r.i = load_i(k.buffers[in.index].dtype, p);
            break;
        }
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
        case Op::Neg: if (F) r.f = -A(0).f; else r.i = (int32_t)(0u - (uint32_t)A(0).i); break;
        case Op::Abs: if (F) r.f = std::fabs(A(0).f); else r.i = A(0).i < 0 ? (int32_t)(0u - (uint32_t)A(0).i) : A(0).i; break;
        case Op::Sqrt: r.f = std::sqrt(A(0).f); break;
        case Op::Exp: r.f = std::exp(A(0).f); break;
        case Op::Exp2: r.f = std::exp2(A(0).f); break;
        case Op::Log: r.f = std::log(A(0).f); break;
        case Op::Log2: r.f = std::log2(A(0).f); break;
        case Op::Tanh: r.f = std::tanh(A(0).f); break;
#define KILN_MATH(K, name, c_function, host) \
        case Op::K: r.f = host(A(0).f); break;
#define KILN_MATH2(K, name, c_function, host) \
        case Op::K: r.f = host(A(0).f, A(1).f); break;
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
        case Op::Rint: r.f = std::nearbyint(A(0).f); break;
        case Op::Sgn:
            if (F) r.f = std::isnan(A(0).f) ? A(0).f : (float)((A(0).f > 0) - (A(0).f < 0));
            else r.i = (A(0).i > 0) - (A(0).i < 0);
            break;
        case Op::Finite: r.i = std::isfinite(A(0).f); break;
        case Op::ToF32: r.f = (float)A(0).i; break;
        case Op::ToI32: r.i = to_i32(A(0).f); break;
        case Op::WrapI8: r.i = (int8_t)(uint8_t)(A(0).i & 0xff); break;
        case Op::WrapU8: r.i = A(0).i & 0xff; break;
        case Op::ToBool: r.i = FA ? (A(0).f != 0 || std::isnan(A(0).f)) : A(0).i != 0; break;
#define BIN(OPN, FE, IE) case Op::OPN: if (F) { float x = A(0).f, y = A(1).f; r.f = (FE); } else { int32_t x = A(0).i, y = A(1).i; r.i = (IE); } break;
        BIN(Add, x + y, (int32_t)((uint32_t)x + (uint32_t)y))
        BIN(Sub, x - y, (int32_t)((uint32_t)x - (uint32_t)y))
        BIN(Mul, x * y, (int32_t)((uint32_t)x * (uint32_t)y))
        BIN(Maximum, (x > y || std::isnan(x)) ? x : y, x > y ? x : y)
        BIN(Minimum, (x < y || std::isnan(x)) ? x : y, x < y ? x : y)
#undef BIN
        case Op::Div: r.f = A(0).f / A(1).f; break;
        case Op::Pow: r.f = std::pow(A(0).f, A(1).f); break;
#define CMP(OPN, E) case Op::OPN: if (FA) { float x = A(0).f, y = A(1).f; r.i = (E); } else { int32_t x = A(0).i, y = A(1).i; r.i = (E); } break;
        CMP(Eq, x == y) CMP(Ne, x != y) CMP(Lt, x < y) CMP(Le, x <= y) CMP(Gt, x > y) CMP(Ge, x >= y)
#undef CMP
        case Op::And: r.i = A(0).i & A(1).i; break;
        case Op::Or: r.i = A(0).i | A(1).i; break;
        case Op::Xor: r.i = A(0).i ^ A(1).i; break;
        case Op::Shl: r.i = (int32_t)((uint32_t)A(0).i << (A(1).i & 31)); break;
        case Op::Shr: r.i = (int32_t)((uint32_t)A(0).i >> (A(1).i & 31)); break;
        case Op::MulHi: r.i = (int32_t)(uint32_t)(((uint64_t)(uint32_t)A(0).i * (uint32_t)A(1).i) >> 32); break;
        case Op::Select: r = A(0).i ? A(1) : A(2); break;
        case Op::AsI32: { const float f = A(0).f; std::memcpy(&r.i, &f, 4); break; }
        case Op::AsF32: { const int32_t i = A(0).i; std::memcpy(&r.f, &i, 4); break; }
        case Op::Floor: r.f = std::floor(A(0).f); break;
        case Op::Fmod: r.f = std::fmod(A(0).f, A(1).f); break;
        case Op::IDiv: case Op::IRem: {
            const int32_t x = A(0).i, y = A(1).i;
            KILN_CHECK_INTERNAL(y != 0 && !(x == INT32_MIN && y == -1), "kir interpreter: {} {} by {} is undefined",
                                kir::op_name(in.op), x, y);
            r.i = in.op == Op::IDiv ? x / y : x % y;
            break;
        }
        }
    }

    void reset_acc(const kir::Block& b) {
        for (int ai : b.accums) {
            const kir::Accum& ac = k.accums[ai];
            AccState& s = acc[ai];
            s.pos = 0;
            s.seen = false;
            bool f = ac.type == kir::ComputeType::F32;
            switch (ac.kind) {
            case kir::AccKind::Sum: if (f) s.v.f = 0; else s.v.i = 0; break;
            case kir::AccKind::Prod: if (f) s.v.f = 1; else s.v.i = 1; break;
            case kir::AccKind::Max: case kir::AccKind::ArgMax:
                if (f) s.v.f = -std::numeric_limits<float>::infinity(); else s.v.i = INT32_MIN; break;
            case kir::AccKind::Min: case kir::AccKind::ArgMin:
                if (f) s.v.f = std::numeric_limits<float>::infinity(); else s.v.i = INT32_MAX; break;
            }
        }
    }

    void run_block(const kir::Block& b, int32_t rpos) {
        for (int id : b.instrs) exec(id);
        for (int ai : b.accums) {
            const kir::Accum& ac = k.accums[ai];
            AccState& s = acc[ai];
            Val v = vals[ac.value];
            bool f = ac.type == kir::ComputeType::F32;
            if (ac.kind == kir::AccKind::Sum) {
                if (f) s.v.f += v.f; else s.v.i = (int32_t)((uint32_t)s.v.i + (uint32_t)v.i);
            } else if (ac.kind == kir::AccKind::Prod) {
                if (f) s.v.f *= v.f; else s.v.i = (int32_t)((uint32_t)s.v.i * (uint32_t)v.i);
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
