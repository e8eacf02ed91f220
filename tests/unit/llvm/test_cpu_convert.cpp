// CPU backend, storage conversions: float16 and bfloat16 exhaustively against references built
// on double arithmetic, int8/uint8/bool loads and stores.
#include "tests/support/catch.hpp"
#include "tests/unit/llvm/cpu_support.hpp"

#include <cmath>
#include <limits>

using namespace kiln;
using namespace kiln::test;

namespace {

struct Half {
    int exp_bits, mant_bits;  // float16: 5, 10; bfloat16: 8, 7
    int bias() const { return (1 << (exp_bits - 1)) - 1; }
    uint16_t exp_mask() const { return (uint16_t)(((1 << exp_bits) - 1) << mant_bits); }
    uint16_t mant_mask() const { return (uint16_t)((1 << mant_bits) - 1); }
    bool is_nan(uint16_t h) const { return (h & exp_mask()) == exp_mask() && (h & mant_mask()); }
};
const Half kF16{5, 10};
const Half kBF16{8, 7};

double decode(const Half& t, uint16_t h) {
    int e = (h & t.exp_mask()) >> t.mant_bits;
    int m = h & t.mant_mask();
    double sign = (h & 0x8000) ? -1 : 1;
    if (e == (1 << t.exp_bits) - 1) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
    if (e == 0) return sign * std::ldexp((double)m, 1 - t.bias() - t.mant_bits);
    return sign * std::ldexp((double)(m | (1 << t.mant_bits)), e - t.bias() - t.mant_bits);
}

// Round to nearest even with the default rounding mode of nearbyint; NaN is returned as 0x7fff
// (the caller only checks NaN-ness).
uint16_t encode(const Half& t, float f) {
    if (std::isnan(f)) return 0x7fff;
    const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    const double a = std::fabs((double)f);
    const int emin = 1 - t.bias();
    const uint16_t inf = t.exp_mask();
    if (std::isinf(a)) return sign | inf;
    if (a < std::ldexp(1.0, emin)) {  // subnormal: units of 2^(emin - mant_bits); 2^mant_bits is the smallest normal
        double q = std::nearbyint(std::ldexp(a, t.mant_bits - emin));
        return sign | (uint16_t)q;
    }
    int e;
    std::frexp(a, &e);  // a in [2^(e-1), 2^e)
    double q = std::nearbyint(std::ldexp(a, t.mant_bits + 1 - e));  // in [2^mant_bits, 2^(mant_bits+1)]
    int be = e - 1 + t.bias();
    if (q == std::ldexp(1.0, t.mant_bits + 1)) {
        q /= 2;
        ++be;
    }
    if (be >= (1 << t.exp_bits) - 1) return sign | inf;
    return sign | (uint16_t)(be << t.mant_bits) | (uint16_t)((int64_t)q - (1 << t.mant_bits));
}

std::vector<float> run_load(DType dt, const std::vector<uint16_t>& in) {
    KernelBuilder kb(std::string("cvt_load_") + std::string(dtype_name(dt)), "P");
    int o = kb.buffer(DType::Float32, {SK::One}, true);
    int i = kb.buffer(dt, {SK::One});
    kb.loop();
    kb.store(o, kb.load(i));
    std::vector<float> out(in.size());
    run(kb.kernel(), Launch({(int64_t)in.size()}).buffer(out.data(), {1}).buffer(in.data(), {1}));
    return out;
}

std::vector<uint16_t> run_store(DType dt, const std::vector<float>& in) {
    KernelBuilder kb(std::string("cvt_store_") + std::string(dtype_name(dt)), "P");
    int o = kb.buffer(dt, {SK::One}, true);
    int i = kb.buffer(DType::Float32, {SK::One});
    kb.loop();
    kb.store(o, kb.load(i));
    std::vector<uint16_t> out(in.size());
    run(kb.kernel(), Launch({(int64_t)in.size()}).buffer(out.data(), {1}).buffer(in.data(), {1}));
    return out;
}

void check_16bit_float(DType dt, const Half& t) {
    std::vector<uint16_t> all(65536);
    for (int h = 0; h < 65536; ++h) all[h] = (uint16_t)h;

    // Loads: every bit pattern, exactly.
    std::vector<float> loaded = run_load(dt, all);
    int bad_load = 0;
    for (int h = 0; h < 65536; ++h) {
        double want = decode(t, (uint16_t)h);
        bool ok = std::isnan(want) ? std::isnan(loaded[h]) : (double)loaded[h] == want &&
                                                                 std::signbit(loaded[h]) == std::signbit(want);
        if (!ok && bad_load++ < 5) UNSCOPED_INFO("load 0x" << std::hex << h << " gave " << loaded[h]);
    }
    CHECK(bad_load == 0);

    // Round trip of every pattern: the identity, NaN staying NaN.
    std::vector<uint16_t> trip = run_store(dt, loaded);
    int bad_trip = 0;
    for (int h = 0; h < 65536; ++h) bad_trip += t.is_nan((uint16_t)h) ? !t.is_nan(trip[h]) : trip[h] != h;
    CHECK(bad_trip == 0);

    // Stores: every midpoint between neighbours (including the one between the largest finite
    // value and the next power of two, which rounds to inf) and the floats just around it, then
    // random floats over the whole range.
    std::vector<float> in;
    int inexact = 0;
    for (int h = 1; h < 65536; ++h) {
        if ((h & 0x7fff) == 0 || (h & 0x7fff) > t.exp_mask()) continue;  // a sign change, NaN
        double lo = decode(t, (uint16_t)(h - 1)), hi = decode(t, (uint16_t)h);
        if (std::isinf(hi)) hi = lo + (lo - decode(t, (uint16_t)(h - 2)));  // where inf would be
        float mid = (float)((lo + hi) / 2);
        inexact += (double)mid != (lo + hi) / 2;
        in.push_back(mid);
        in.push_back(std::nextafter(mid, 0.0f));
        in.push_back(std::nextafter(mid, mid < 0 ? -INFINITY : INFINITY));
    }
    CHECK(inexact == 0);
    std::mt19937 rng(11);
    for (int i = 0; i < 100000; ++i) in.push_back(float_of(rng()));
    std::vector<uint16_t> stored = run_store(dt, in);
    int bad_store = 0;
    for (size_t i = 0; i < in.size(); ++i) {
        uint16_t want = encode(t, in[i]);
        bool ok = std::isnan(in[i]) ? t.is_nan(stored[i]) : stored[i] == want;
        if (!ok && bad_store++ < 5)
            UNSCOPED_INFO("store of " << in[i] << " (0x" << std::hex << bits_of(in[i]) << ") gave 0x" << stored[i]
                                      << ", want 0x" << want);
    }
    CHECK(bad_store == 0);
}

} // namespace

TEST_CASE("cpu jit: float16 loads and stores, exhaustively") { check_16bit_float(DType::Float16, kF16); }

TEST_CASE("cpu jit: bfloat16 loads and stores, exhaustively") { check_16bit_float(DType::BFloat16, kBF16); }

TEST_CASE("cpu jit: int8, uint8 and bool loads extend, stores truncate") {
    // i8out = wrap_i8(a * 3 + b); u8out = a - b (truncated by the store); bout = (a + b) as bool,
    // i32out = a + b + flag (flag: a bool buffer holding bytes 0, 1 and 2).
    const int64_t n = 4099;
    KernelBuilder kb("cvt_small_ints", "P");
    int i8o = kb.buffer(DType::Int8, {SK::One}, true);
    int u8o = kb.buffer(DType::UInt8, {SK::One}, true);
    int bo = kb.buffer(DType::Bool, {SK::One}, true);
    int i32o = kb.buffer(DType::Int32, {SK::One}, true);
    int a = kb.buffer(DType::Int8, {SK::One});
    int b = kb.buffer(DType::UInt8, {SK::One});
    int flag = kb.buffer(DType::Bool, {SK::One});
    kb.loop();
    int la = kb.load(a), lb = kb.load(b), lf = kb.load(flag);
    int a3 = kb.op(Op::Mul, CT::I32, la, kb.consti(3));
    kb.store(i8o, kb.op(Op::WrapI8, CT::I32, kb.op(Op::Add, CT::I32, a3, lb)));
    kb.store(u8o, kb.op(Op::Sub, CT::I32, la, lb));
    int ab = kb.op(Op::Add, CT::I32, la, lb);
    kb.store(bo, ab);
    kb.store(i32o, kb.op(Op::Add, CT::I32, ab, lf));

    std::mt19937 rng(12);
    std::vector<int8_t> av(n);
    std::vector<uint8_t> bv(n), fv(n);
    for (int64_t i = 0; i < n; ++i) {
        av[i] = (int8_t)(rng() & 0xff);
        bv[i] = (uint8_t)(rng() & 0xff);
        fv[i] = (uint8_t)(i % 3);
    }
    av[0] = -128, bv[0] = 128;  // a + b == 0: bool false
    av[1] = 127, bv[1] = 255;
    std::vector<int8_t> i8(n);
    std::vector<uint8_t> u8(n), bl(n);
    std::vector<int32_t> i32(n);
    run(kb.kernel(), Launch({n})
                         .buffer(i8.data(), {1})
                         .buffer(u8.data(), {1})
                         .buffer(bl.data(), {1})
                         .buffer(i32.data(), {1})
                         .buffer(av.data(), {1})
                         .buffer(bv.data(), {1})
                         .buffer(fv.data(), {1}));
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
        int32_t x = av[i], y = bv[i];
        bad += i8[i] != (int8_t)(uint8_t)((x * 3 + y) & 0xff);
        bad += u8[i] != (uint8_t)((x - y) & 0xff);
        bad += bl[i] != (uint8_t)(x + y != 0);
        bad += i32[i] != x + y + (fv[i] != 0);
    }
    CHECK(bad == 0);
    CHECK(bl[0] == 0);
    CHECK(i8[1] == (int8_t)(uint8_t)((127 * 3 + 255) & 0xff));
}
