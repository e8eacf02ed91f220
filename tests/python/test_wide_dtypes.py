"""float64, int64, uint64, int16, uint16 and uint32: values against NumPy, computed in the dtype's
own width (float64 arithmetic, 64-bit wrap-around, unsigned order and division, NumPy's
promotion), on the context's backend."""
import numpy as np
import pytest

import kiln

WIDE = ["float64", "int64", "uint64", "int16", "uint16", "uint32"]
INTS = ["int64", "uint64", "int16", "uint16", "uint32"]


def _cuda():
    return kiln.default_context().backend == "cuda"


def _data(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "float64":
        return rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def _run(expr, dtype):
    out = kiln.empty(expr.shape, dtype=dtype)
    out[...] = expr
    return out.get()


@pytest.mark.parametrize("name", WIDE)
def test_round_trip_keeps_every_value(name):
    a = _data(name, (7, 33))
    t = kiln.asarray(a, dtype=name)
    assert t.dtype == np.dtype(name)
    assert t.get().dtype == np.dtype(name)
    np.testing.assert_array_equal(t.get(), a)


def test_float64_arithmetic_is_float64():
    a, b = _data("float64", (5, 41), 1), _data("float64", (5, 41), 2)
    x, y = kiln.asarray(a, dtype="float64"), kiln.asarray(b, dtype="float64")
    got = _run(x * 0.1 + y / 3.0 - x * y, "float64")
    np.testing.assert_allclose(got, a * 0.1 + b / 3.0 - a * b, rtol=1e-15, atol=0)
    # 0.1 stays the double 0.1: float32 arithmetic would be off by 1e-9 relative.
    one = kiln.asarray(np.full(3, 1.0), dtype="float64")
    assert _run(one * 0.1, "float64")[0] == 0.1
    assert _run(one + 1e-12, "float64")[0] == 1.0 + 1e-12


@pytest.mark.parametrize("fn", ["sin", "cos", "exp", "log", "sqrt", "tanh", "arctan", "floor", "expm1", "log1p"])
def test_float64_functions_match_numpy(fn):
    a = np.abs(_data("float64", (3, 50), 3)) + 0.5
    got = _run(getattr(kiln, fn)(kiln.asarray(a, dtype="float64")), "float64")
    np.testing.assert_allclose(got, getattr(np, fn)(a), rtol=4e-16, atol=0)


def test_float64_division_family_and_specials():
    a = np.array([7.5, -7.5, 0.0, -0.0, np.inf, np.nan, 1e300, 5e-324, 3.0])
    b = np.array([2.0, 2.0, -3.0, 3.0, 2.0, 1.0, 1e-10, 2.0, 0.0])
    x, y = kiln.asarray(a, dtype="float64"), kiln.asarray(b, dtype="float64")
    with np.errstate(all="ignore"):
        for got, want in [(_run(x // y, "float64"), a // b), (_run(x % y, "float64"), a % b),
                          (_run(kiln.fmod(x, y), "float64"), np.fmod(a, b)), (_run(x / y, "float64"), a / b)]:
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_equal(_run(kiln.maximum(x, y), "float64"), np.maximum(a, b))
        np.testing.assert_array_equal(_run(x < y, "bool"), a < b)


def test_int64_wraps_and_divides_as_numpy():
    big = np.array([2**62, -2**63, 2**63 - 1, -7, 7, 0, 123456789012345], dtype=np.int64)
    d = np.array([3, -1, -1, 2, -2, 5, -1000003], dtype=np.int64)
    x, y = kiln.asarray(big, dtype="int64"), kiln.asarray(d, dtype="int64")
    with np.errstate(all="ignore"):
        for got, want in [(_run(x + x, "int64"), big + big), (_run(x * y, "int64"), big * d),
                          (_run(x - y, "int64"), big - d), (_run(x // y, "int64"), big // d),
                          (_run(x % y, "int64"), big % d), (_run(-x, "int64"), -big)]:
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_run(x & 0xFFFF, "int64"), big & 0xFFFF)
    np.testing.assert_array_equal(_run(x ^ y, "int64"), big ^ d)
    np.testing.assert_array_equal(_run(kiln.bitwise_invert(x), "int64"), ~big)
    s = kiln.asarray(np.array([0, 1, 40, 63, 64, -1, 100], dtype=np.int64), dtype="int64")
    one = kiln.asarray(np.full(7, 3, dtype=np.int64), dtype="int64")
    np.testing.assert_array_equal(_run(one << s, "int64")[:5], np.array([3, 6, 3 << 40, -(2**63), 0]))
    np.testing.assert_array_equal(_run(x >> 3, "int64"), big >> 3)
    # Literals beyond int32 meet int64 tensors exactly (up to 2^53).
    np.testing.assert_array_equal(_run(x + 2**50, "int64"), big + 2**50)
    np.testing.assert_array_equal(_run(x > 2**40, "bool"), big > 2**40)


@pytest.mark.parametrize("name", ["int16", "uint16", "uint32", "uint64"])
def test_narrow_and_unsigned_integers_wrap(name):
    a, b = _data(name, (4, 25), 4), _data(name, (4, 25), 5)
    x, y = kiln.asarray(a, dtype=name), kiln.asarray(b, dtype=name)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_run(x + y, name), a + b)
        np.testing.assert_array_equal(_run(x * y, name), a * b)
        np.testing.assert_array_equal(_run(x - y, name), a - b)
        nz = np.where(b == 0, 1, b).astype(name)
        z = kiln.asarray(nz, dtype=name)
        np.testing.assert_array_equal(_run(x // z, name), a // nz)
        np.testing.assert_array_equal(_run(x % z, name), a % nz)
    np.testing.assert_array_equal(_run(x < y, "bool"), a < b)
    np.testing.assert_array_equal(_run(kiln.maximum(x, y), name), np.maximum(a, b))


@pytest.mark.parametrize("a,b,want", [
    ("int8", "uint8", "int16"), ("int16", "uint16", "int32"), ("int32", "uint32", "int64"),
    ("int64", "uint32", "int64"), ("uint8", "uint32", "uint32"), ("int16", "int64", "int64"),
    ("float32", "float64", "float64"), ("float16", "float64", "float64"), ("int64", "float64", "float64"),
    ("bool", "uint16", "uint16"), ("uint64", "uint8", "uint64"), ("uint64", "int8", "float64"),
    ("uint64", "int64", "float64"), ("uint64", "float32", "float32"), ("uint64", "float64", "float64"),
])
def test_promotion_is_numpys(a, b, want):
    assert kiln.result_type(a, b) == np.dtype(want)
    x = kiln.asarray(np.ones(3, dtype=a), dtype=a)
    y = kiln.asarray(np.ones(3, dtype=b), dtype=b)
    assert (x + y).dtype == np.dtype(want)


def test_conversions_saturate_round_and_wrap():
    f = np.array([1e300, -1e300, np.nan, 2.5, -2.5, 3e9, 70000.7])
    x = kiln.asarray(f, dtype="float64")
    np.testing.assert_array_equal(_run(x, "int64"),
                                  [2**63 - 1, -2**63, 0, 2, -2, 3000000000, 70000])
    np.testing.assert_array_equal(_run(x, "float32"), f.astype(np.float32))
    np.testing.assert_array_equal(_run(x, "int32"), [2**31 - 1, -2**31, 0, 2, -2, 2**31 - 1, 70000])
    i = np.array([2**62 + 1, -3, 2**33 + 5, 65537], dtype=np.int64)
    y = kiln.asarray(i, dtype="int64")
    np.testing.assert_array_equal(_run(y, "int32"), i.astype(np.int32))
    np.testing.assert_array_equal(_run(y, "int16"), i.astype(np.int16))
    np.testing.assert_array_equal(_run(y, "uint32"), i.astype(np.uint32))
    np.testing.assert_array_equal(_run(y, "float64"), i.astype(np.float64))
    np.testing.assert_array_equal(_run(y, "float32"), i.astype(np.float32))
    np.testing.assert_array_equal(_run(y, "bool"), i != 0)


@pytest.mark.parametrize("name", WIDE)
def test_reductions(name):
    a = _data(name, (6, 37), 6)
    if name == "float64":
        a = a / 1e3
    x = kiln.asarray(a, dtype=name)
    with np.errstate(all="ignore"):
        if name in ("float64", "int64", "uint64"):
            np.testing.assert_allclose(np.asarray(kiln.sum(x, axis=1)).ravel(), a.sum(axis=1), rtol=1e-13)
            np.testing.assert_allclose(np.asarray(kiln.sum(x)).ravel(), [a.sum()], rtol=1e-13)
        np.testing.assert_array_equal(np.asarray(kiln.max(x, axis=1)).ravel(), a.max(axis=1))
        np.testing.assert_array_equal(np.asarray(kiln.min(x, axis=0)).ravel(), a.min(axis=0))
        np.testing.assert_array_equal(np.asarray(kiln.argmax(x, axis=1)).ravel(), a.argmax(axis=1))
        np.testing.assert_array_equal(np.asarray(kiln.argmin(x, axis=0)).ravel(), a.argmin(axis=0))
    if name == "float64":
        np.testing.assert_allclose(np.asarray(kiln.var(x, axis=1)).ravel(), a.var(axis=1), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(kiln.mean(x)).ravel(), [a.mean()], rtol=1e-13)


def test_int64_sum_wraps_at_64_bits():
    a = np.full((2, 5), 2**62, dtype=np.int64)
    x = kiln.asarray(a, dtype="int64")
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.asarray(kiln.sum(x, axis=1, dtype="int64")).ravel(), a.sum(axis=1))


def test_dlpack_and_namespace_know_the_new_dtypes():
    info = kiln.__array_namespace_info__()
    assert info.dtypes(kind="real floating") == {"float32": kiln.float32, "float64": kiln.float64}
    assert set(info.dtypes(kind="signed integer")) == {"int8", "int16", "int32", "int64"}
    assert set(info.dtypes(kind="unsigned integer")) == {"uint8", "uint16", "uint32", "uint64"}
    for name in WIDE:
        a = _data(name, (3, 4), 7)
        t = kiln.asarray(a, dtype=name)
        if _cuda():   # NumPy takes host memory only; kiln takes its own CUDA capsule back
            assert t.__dlpack_device__()[0] == 2
            np.testing.assert_array_equal(np.asarray(kiln.from_dlpack(t)), a)
        else:
            np.testing.assert_array_equal(np.from_dlpack(t), a)
        assert kiln.isdtype(t.dtype, "real floating" if name == "float64" else "integral")


def test_matmul_of_float64_and_integers_is_a_sum_of_products_in_their_arithmetic():
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((3, 4, 5)), rng.standard_normal((5, 2))
    got = kiln.matmul(kiln.asarray(a, dtype="float64"), kiln.asarray(b, dtype="float64"))
    assert got.dtype == np.float64 and got.shape == (3, 4, 2)
    np.testing.assert_allclose(np.asarray(got), a @ b, rtol=1e-14, atol=1e-15)   # (five terms of about 1)
    i, j = np.arange(12, dtype=np.int64).reshape(3, 4) * 2**33, np.arange(4, dtype=np.int64)
    got = kiln.matmul(kiln.asarray(i, dtype="int64"), kiln.asarray(j, dtype="int64"))
    assert got.dtype == np.int64 and got.shape == (3,)
    np.testing.assert_array_equal(np.asarray(got), i @ j)
    k = np.arange(6, dtype=np.int8).reshape(2, 3) * 20
    got = kiln.matmul(kiln.asarray(k), kiln.asarray(k.T.copy()))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.asarray(got), k @ k.T)   # wraps at int8, as NumPy


def test_gemm_and_convolution_refuse_float64_naming_the_valid_dtypes():
    a = kiln.asarray(np.ones((4, 4)), dtype="float64")
    with pytest.raises(kiln.DTypeError, match=r"dot: A is float64 \(4, 4\); GEMM operands are float32, float16 or bfloat16"):
        kiln.dot(a, a)
    with pytest.raises(kiln.DTypeError, match="conv_layer: dtype float64; convolution runs in float32, float16 or bfloat16"):
        kiln.conv_layer("float64", 1, 8, 8, H=4, W=4, R=3, S=3)


def test_uint32_sums_wrap_at_32_bits_where_they_are_read():
    x = kiln.asarray(np.array([2**31, 2**31, 5], dtype=np.uint32), dtype="uint32")
    s = kiln.sum(x[:2])
    assert s.dtype == np.uint32 and int(np.asarray(s)) == 0
    assert bool(np.asarray(s == 0))                                        # fused: the comparison sees 0
    assert float(np.asarray(kiln.astype(s, "float64"))) == 0.0


def test_literals_into_and_against_64_bit_integers():
    u = kiln.empty((2,), dtype="uint32")
    u[...] = 4294967295.0                      # a float literal into uint32 goes through float64
    np.testing.assert_array_equal(u.get(), [4294967295, 4294967295])
    i = kiln.empty((2,), dtype="int64")
    i[...] = 16777217.0
    np.testing.assert_array_equal(i.get(), [16777217, 16777217])
    x = kiln.asarray(np.array([-5, 0, 2**62], dtype=np.int64), dtype="int64")
    np.testing.assert_array_equal(np.asarray(x == 2**64), [False, False, False])   # true values, as NumPy 2
    np.testing.assert_array_equal(np.asarray(x < 2**64), [True, True, True])
    np.testing.assert_array_equal(np.asarray(x > -2**70), [True, True, True])
    with pytest.raises(kiln.InvalidArgument, match="out of range for int64"):
        x + 2**63


def test_int64_division_and_means_are_float64_and_indices_clip():
    big = np.array([2**40 + 1, -3], dtype=np.int64)
    x = kiln.asarray(big, dtype="int64")
    q = x / 1
    assert q.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(q), big / 1)
    if not _cuda():
        assert kiln.mean(x).dtype == np.float64
        assert float(np.asarray(kiln.mean(x))) == big.mean()
    t = kiln.asarray(np.arange(5, dtype=np.float32))
    idx = kiln.asarray(np.array([2**32, -(2**32 - 1), 1], dtype=np.int64), dtype="int64")
    np.testing.assert_array_equal(np.asarray(kiln.take(t, idx)), [4, 0, 1])   # clipped, not wrapped


def test_int64_literals_are_exact_past_2_to_the_53():
    big = 2**53 + 1
    x = kiln.asarray(np.array([1, 2, -3]), dtype="int64")
    np.testing.assert_array_equal(np.asarray(x + big), np.array([1, 2, -3]) + big)
    np.testing.assert_array_equal(np.asarray(x * 0 + (2**62 + 7)), np.full(3, 2**62 + 7))
    np.testing.assert_array_equal(np.asarray(x + 2**53 == big), [True, False, False])
    np.testing.assert_array_equal(np.asarray(kiln.full((2,), 2**63 - 1, dtype="int64")), np.full(2, 2**63 - 1))
    np.testing.assert_array_equal(np.asarray(kiln.full((2,), -2**63, dtype="int64")), np.full(2, -2**63))
    t = kiln.zeros((2,), dtype="int64")
    t[...] = 2**60 + 3
    np.testing.assert_array_equal(np.asarray(t), np.full(2, 2**60 + 3))
    u = kiln.asarray(np.array([1, 2]), dtype="uint32")
    np.testing.assert_array_equal(np.asarray(u + 4294967290), [4294967291, 4294967292])
    for bad in (2**63, -2**63 - 1):
        with pytest.raises(ValueError, match="out of range for int64 .*valid: -9223372036854775808 to 9223372036854775807"):
            x + bad
        with pytest.raises(ValueError, match="out of range for int64"):
            kiln.full((2,), bad, dtype="int64")
    with pytest.raises(ValueError, match="out of range for uint32"):
        kiln.full((2,), 2**32, dtype="uint32")


def test_int64_literals_sharing_a_double_are_not_confused():
    t = kiln.zeros((3,), dtype="int64")
    for v in (2**60 + 3, 2**60 + 4, 2**53 + 1, 2**53):   # the same kernel, a new exact parameter each time
        t[...] = v
        np.testing.assert_array_equal(np.asarray(t), np.full(3, v))
    x = kiln.asarray(np.array([2**63 - 1, 0, -2**63]), dtype="int64")
    np.testing.assert_array_equal(np.asarray(x == 2**63 - 1), [True, False, False])
    np.testing.assert_array_equal(np.asarray(x < 2**63 - 1), [False, True, True])
    np.testing.assert_array_equal(np.asarray(x == -2**63), [False, False, True])
    np.testing.assert_array_equal(np.asarray(x < 2**63), [True, True, True])   # beyond int64: every value is below
    with pytest.raises(ValueError, match=r"cast: the integer literal 92233720368547758\d+ is out of range for int64"):
        kiln.astype(2**63 + 5, "int64")
    f = kiln.asarray(np.array([0.0]), dtype="float64")
    np.testing.assert_array_equal(np.asarray(f + (-2**63 - 1)), [float(-2**63 - 1)])


def test_uint64_is_unsigned_past_2_to_the_63():
    rng = np.random.default_rng(11)
    a = rng.integers(0, 2**64, (6, 40), dtype=np.uint64, endpoint=False)
    b = rng.integers(1, 2**64, (6, 40), dtype=np.uint64, endpoint=False)
    a[0, :6] = [0, 1, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1]
    b[0, :6] = [2**63, 2**64 - 1, 3, 2**63 + 7, 1, 2]
    small = rng.integers(1, 5000, (6, 40), dtype=np.uint64)
    x, y, s = (kiln.asarray(v, dtype="uint64") for v in (a, b, small))
    with np.errstate(all="ignore"):
        for got, want in [(x // y, a // b), (x % y, a % b), (x // s, a // small), (x % s, a % small),
                          (kiln.maximum(x, y), np.maximum(a, b)), (kiln.minimum(x, y), np.minimum(a, b)),
                          (x >> (s % 64), a >> (small % 64)), (x << (s % 64), a << (small % 64)),
                          (x >> (s + 64), np.zeros_like(a)), (x ** (s % 7), a ** (small % 7)),
                          (kiln.abs(x), a), (kiln.sign(x), np.sign(a)), (-x, -a), (~x, ~a)]:
            assert got.dtype == np.uint64
            np.testing.assert_array_equal(_run(got, "uint64"), want)
    for op in ("__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
        np.testing.assert_array_equal(_run(getattr(x, op)(y), "bool"), getattr(a, op)(b))
    # Conversions: to floats correctly rounded, from floats truncated (2^64 and up saturate).
    np.testing.assert_array_equal(_run(x, "float64"), a.astype(np.float64))
    np.testing.assert_array_equal(_run(x, "float32"), a.astype(np.float32))
    np.testing.assert_array_equal(_run(x, "int64"), a.astype(np.int64))
    np.testing.assert_array_equal(_run(x, "uint32"), a.astype(np.uint32))
    np.testing.assert_array_equal(_run(x, "int8"), a.astype(np.int8))
    f = np.array([0.0, 2.5, 2.0**63, 2.0**63 + 4096, 1.8e19, 2.0**64, 1e300, np.inf, np.nan])
    np.testing.assert_array_equal(_run(kiln.asarray(f, dtype="float64"), "uint64"),
                                  np.array([0, 2, 2**63, 2**63 + 4096, 18000000000000000000] + [2**64 - 1] * 3 + [0],
                                           dtype=np.uint64))
    np.testing.assert_array_equal(_run(kiln.sqrt(x), "float64"), np.sqrt(a))
    # Reductions: sums wrap at 64 bits, extremes in unsigned order.
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.asarray(kiln.sum(x, axis=1, keepdims=False)), a.sum(axis=1))
        np.testing.assert_array_equal(np.asarray(kiln.prod(x, axis=0, keepdims=False)), a.prod(axis=0))
    np.testing.assert_array_equal(np.asarray(kiln.max(x, axis=1, keepdims=False)), a.max(axis=1))
    np.testing.assert_array_equal(np.asarray(kiln.min(x, axis=0, keepdims=False)), a.min(axis=0))
    np.testing.assert_array_equal(np.asarray(kiln.max(x, keepdims=False)), a.max())
    np.testing.assert_array_equal(np.asarray(kiln.argmax(x, axis=1, keepdims=False)), a.argmax(axis=1))
    np.testing.assert_array_equal(np.asarray(kiln.argmin(x, axis=0, keepdims=False)), a.argmin(axis=0))


def test_uint64_literals_and_values_are_exact():
    a = np.array([0, 5, 2**63, 2**64 - 2], dtype=np.uint64)
    x = kiln.asarray(a, dtype="uint64")
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_run(x + (2**63 + 1), "uint64"), a + np.uint64(2**63 + 1))
        np.testing.assert_array_equal(_run(x * np.uint64(3), "uint64"), a * np.uint64(3))
    np.testing.assert_array_equal(_run(x > 2**63 - 1, "bool"), a > 2**63 - 1)
    np.testing.assert_array_equal(_run(x >= -1, "bool"), [True] * 4)      # every value is above -1
    np.testing.assert_array_equal(_run(x < 2**70, "bool"), [True] * 4)    # and below 2^70
    np.testing.assert_array_equal(_run(x == 2**64 - 2, "bool"), a == 2**64 - 2)
    full = kiln.full((3,), 2**64 - 1, dtype="uint64")
    np.testing.assert_array_equal(full.get(), np.full(3, 2**64 - 1, dtype=np.uint64))
    t = kiln.empty((2,), dtype="uint64")
    t[...] = 2**64 - 3
    np.testing.assert_array_equal(t.get(), [2**64 - 3] * 2)
    assert kiln.iinfo(kiln.uint64).max == 2**64 - 1 and kiln.iinfo("uint64").min == 0
    with pytest.raises(ValueError, match=r"out of range for uint64 \(valid: 0 to 18446744073709551615\)"):
        t[...] = -1
    with pytest.raises(ValueError, match="out of range for uint64"):
        t[...] = 2**64
    with pytest.raises(ValueError, match="out of range for uint64"):
        x + (-1)
    with pytest.raises(ValueError, match="out of range for int64"):
        kiln.asarray(np.zeros(2, np.int64), dtype="int64") + 2**63
    # The wrapped view of a uint64 literal never reaches an int64 operand.
    assert (x + kiln.asarray(np.ones(4, np.int64), dtype="int64")).dtype == np.float64


def test_typed_scalars_wrap_into_uint64_and_back():
    t = kiln.zeros((2,), dtype=kiln.uint64)
    t[...] = np.int32(-1)                                   # NumPy: 2^64 - 1
    np.testing.assert_array_equal(t.get(), [2**64 - 1] * 2)
    i = kiln.zeros((2,), dtype=kiln.int64)
    i[...] = kiln.astype(kiln.full((1,), 2**64 - 2, dtype="uint64"), "int64")   # as its bits: -2
    np.testing.assert_array_equal(i.get(), [-2, -2])
    t[...] = 1e19                                           # a float from 2^63 on keeps its value
    np.testing.assert_array_equal(t.get(), [10**19] * 2)
    np.testing.assert_array_equal(_run(t * 0 + kiln.full((2,), 1e19, dtype="uint64"), "uint64"), [10**19] * 2)


def test_python_lists_of_64_bit_integers_are_exact():
    # NumPy reads ints past int64 as float64; with dtype= asked, kiln reads them as that dtype.
    np.testing.assert_array_equal(kiln.asarray([2**64 - 1, 2**63 + 1, 3], dtype="uint64").get(),
                                  np.array([2**64 - 1, 2**63 + 1, 3], dtype=np.uint64))
    np.testing.assert_array_equal(kiln.asarray([2**62 + 1, 3.0], dtype="int64").get(), [2**62 + 1, 3])
    x = kiln.asarray(np.array([5, 2**64 - 1, 2**63], dtype=np.uint64), dtype="uint64")
    np.testing.assert_array_equal(kiln.asarray(x.get().tolist(), dtype="uint64").get(), x.get())
    with pytest.raises(kiln.InvalidArgument, match=r"values in \[-1, 1\] do not fit uint64"):
        kiln.asarray([-1, 1], dtype="uint64")
    with pytest.raises(kiln.InvalidArgument, match=r"values of the list do not fit int64 \(range"):
        kiln.asarray([2**64 - 1, 1], dtype="int64")
    # Assigned, the same (same shape, and broadcast).
    t = kiln.zeros((2,), dtype=kiln.uint64)
    t[...] = [2**64 - 1, 2**63 + 1]
    np.testing.assert_array_equal(t.get(), np.array([2**64 - 1, 2**63 + 1], dtype=np.uint64))
    t[...] = [2**63 + 5]
    np.testing.assert_array_equal(t.get(), np.array([2**63 + 5] * 2, dtype=np.uint64))
    i = kiln.zeros((2,), dtype=kiln.int64)
    i[...] = [2**62 + 1, 3.0]
    np.testing.assert_array_equal(i.get(), [2**62 + 1, 3])
    with pytest.raises(kiln.InvalidArgument, match=r"assign: values of the list do not fit int64"):
        i[...] = [2**63, 1]
