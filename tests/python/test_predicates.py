"""isnan, isinf, all, any, the logical functions, signbit, finfo, iinfo, result_type, concat and
stack against NumPy; misuse names what is valid."""
import numpy as np
import pytest

import kiln

FLOATS = ["float32", "float16"]


def _values(dtype):
    x = np.array([[0.0, 1.5, -np.inf, np.nan], [np.inf, -2.0, 0.0, 3.0], [1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", FLOATS + ["bfloat16"])
def test_isnan_isinf_follow_numpy(dtype):
    x = _values("float32")
    t = kiln.asarray(x, dtype=dtype)
    for name in ("isnan", "isinf"):
        got = np.asarray(kiln.asnumpy(getattr(kiln, name)(t)))
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, getattr(np, name)(x))


@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8", "bool"])
def test_isnan_isinf_are_false_for_integers_and_bools(dtype):
    x = np.array([[0, 1, 2], [3, 0, 1]]).astype(dtype)
    for name in ("isnan", "isinf"):
        got = np.asarray(kiln.asnumpy(getattr(kiln, name)(kiln.asarray(x))))
        np.testing.assert_array_equal(got, np.zeros(x.shape, dtype=bool))


@pytest.mark.parametrize("dtype", FLOATS + ["int32", "int8", "uint8", "bool"])
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_all_any_follow_numpy(dtype, axis, keepdims):
    x = _values("float32")
    if dtype not in FLOATS:
        x = np.nan_to_num(x, nan=7, posinf=5, neginf=-5)
    x = x.astype(dtype)
    t = kiln.asarray(x)
    for name in ("all", "any"):
        want = getattr(np, name)(x, axis=axis, keepdims=keepdims)
        got = np.asarray(kiln.asnumpy(getattr(kiln, name)(t, axis=axis, keepdims=keepdims)))
        assert got.dtype == np.bool_, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_finfo_and_iinfo_give_the_limits():
    for name in FLOATS:
        f, n = kiln.finfo(name), np.finfo(name)
        assert (f.bits, f.eps, f.max, f.min, f.smallest_normal) == (n.bits, float(n.eps), float(n.max), float(n.min),
                                                                    float(n.smallest_normal))
        assert f.dtype == np.dtype(name)
        assert kiln.finfo(kiln.zeros((2,), dtype=name)) == f   # a tensor's dtype
    b = kiln.finfo(kiln.bfloat16)
    assert (b.bits, b.eps, b.smallest_normal) == (16, 2.0 ** -7, 2.0 ** -126)
    assert b.max == -b.min == 3.3895313892515355e38
    for name in ("int64", "int32", "int16", "int8", "uint32", "uint16", "uint8"):
        i, n = kiln.iinfo(name), np.iinfo(name)
        assert (i.bits, i.max, i.min) == (n.bits, n.max, n.min)
        assert i.dtype == np.dtype(name)


def test_finfo_and_iinfo_refuse_the_other_kind():
    with pytest.raises(TypeError, match=r"finfo: int32 is not a float dtype; valid: float64, float32, float16, bfloat16"):
        kiln.finfo("int32")
    with pytest.raises(TypeError, match=r"iinfo: float16 is not an integer dtype; valid: int64, int32, int16, int8, uint64, "
                                        r"uint32, uint16, uint8"):
        kiln.iinfo(np.float16)
    with pytest.raises(kiln.DTypeError, match="kiln has no complex64 dtype"):
        kiln.iinfo(np.complex64)


@pytest.mark.parametrize("dtype", FLOATS + ["int32", "int8", "uint8", "bool"])
def test_logical_functions_and_signbit_follow_numpy(dtype):
    x = _values("float32")
    if dtype not in FLOATS:
        x = np.nan_to_num(x, nan=7, posinf=5, neginf=-5)
    x = x.astype(dtype)
    y = x[::-1].copy()
    if dtype in FLOATS:
        x[0, 0] = -0.0
    a, b = kiln.asarray(x), kiln.asarray(y)
    for name in ("logical_and", "logical_or", "logical_xor"):
        got = np.asarray(kiln.asnumpy(getattr(kiln, name)(a, b)))
        assert got.dtype == np.bool_, name
        np.testing.assert_array_equal(got, getattr(np, name)(x, y), err_msg=name)
    np.testing.assert_array_equal(kiln.asnumpy(kiln.logical_not(a)), np.logical_not(x))
    if dtype != "bool":   # NumPy has no signbit for bools; kiln's is False
        np.testing.assert_array_equal(kiln.asnumpy(kiln.signbit(a)), np.signbit(x))
    else:
        assert not np.asarray(kiln.asnumpy(kiln.signbit(a))).any()


@pytest.mark.parametrize("axis", [0, 1, -1, None])
def test_concat_and_stack_follow_numpy(axis):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.arange(12, 24, dtype=np.float32).reshape(3, 4)
    z = np.arange(8, dtype=np.int8).reshape(2, 4) if axis == 0 else np.arange(3, dtype=np.int8).reshape(3, 1) - 5
    a, b = kiln.asarray(x), kiln.asarray(y)
    got = kiln.concat([a, kiln.multiply(b, 2.0), kiln.asarray(z)], axis=axis) if axis in (0, -1) else None
    if got is not None:
        want = np.concatenate([x, y * 2, z], axis=axis)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(kiln.asnumpy(got), want)
    np.testing.assert_array_equal(kiln.asnumpy(kiln.concatenate([a, b], axis=axis)), np.concatenate([x, y], axis=axis))
    if axis is not None:
        np.testing.assert_array_equal(kiln.asnumpy(kiln.stack([a, b, a], axis=axis)), np.stack([x, y, x], axis=axis))


def test_result_type_follows_numpy_on_kilns_dtypes():
    a = kiln.zeros((2,), dtype="int8")
    assert kiln.result_type(a, np.uint8) == np.dtype(np.int16)   # as NumPy
    assert kiln.result_type("bfloat16", "float16") == np.dtype(np.float32)
    assert kiln.result_type(a, "float16") == np.dtype(np.float16)
    assert kiln.result_type("bool", "int32") == np.dtype(np.int32)
    assert kiln.result_type(kiln.float16, kiln.float32) == np.dtype(np.float32)


def test_concat_and_stack_refuse_mismatched_shapes():
    a, b = kiln.zeros((2, 3)), kiln.zeros((2, 4))
    with pytest.raises(kiln.InvalidArgument, match=r"concat: shapes \(2, 3\) and \(2, 4\) differ outside axis 0"):
        kiln.concat([a, b], axis=0)
    with pytest.raises(kiln.InvalidArgument, match=r"concat: axis 2 is out of range for arrays of rank 2"):
        kiln.concat([a, a], axis=2)
    with pytest.raises(kiln.InvalidArgument, match=r"stack: shapes \(2, 3\) and \(2, 4\) differ"):
        kiln.stack([a, b])
    with pytest.raises(kiln.InvalidArgument, match="concat: needs at least one array"):
        kiln.concat([])


@pytest.mark.parametrize("name", ["var", "std"])
def test_var_and_std_take_the_array_apis_correction(name):
    x = np.arange(20, dtype=np.float32).reshape(4, 5) ** 1.5
    t = kiln.asarray(x)
    for c in (0, 1, 0.5):
        got = kiln.asnumpy(getattr(kiln, name)(t, axis=1, correction=c))
        np.testing.assert_allclose(got, getattr(np, name)(x.astype(np.float64), axis=1, ddof=c), rtol=1e-5)
    with pytest.raises(ValueError, match=f"{name}: give ddof or correction, not both"):
        getattr(kiln, name)(t, ddof=1, correction=1)
    with pytest.raises(ValueError, match=f"{name}: ddof=5 needs more than 5 elements per reduction"):
        getattr(kiln, name)(t, axis=1, correction=5)


@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8", "bool"])
def test_bitwise_functions_and_operators_follow_numpy(dtype):
    r = np.random.default_rng(3)
    if dtype == "bool":
        x, y = r.random((5, 7)) < 0.5, r.random((5, 7)) < 0.5
    else:
        info = np.iinfo(dtype)
        x = r.integers(info.min, info.max, size=(5, 7), endpoint=True).astype(dtype)
        y = r.integers(info.min, info.max, size=(5, 7), endpoint=True).astype(dtype)
    a, b = kiln.asarray(x), kiln.asarray(y)
    cases = {
        "bitwise_and": (kiln.bitwise_and(a, b), x & y), "bitwise_or": (kiln.bitwise_or(a, b), x | y),
        "bitwise_xor": (kiln.bitwise_xor(a, b), x ^ y), "bitwise_invert": (kiln.bitwise_invert(a), ~x),
        "invert": (kiln.invert(a), np.invert(x)), "bitwise_not": (kiln.bitwise_not(a), np.bitwise_not(x)),
        "&": (a & b, x & y), "|": (a | b, x | y), "^": (a ^ b, x ^ y), "~": (~a, ~x),
        "& scalar": (a & True, x & True) if dtype == "bool" else (a & 1, x & 1),
        "scalar |": (False | a, False | x) if dtype == "bool" else (3 | a, 3 | x),
    }
    for name, (got, want) in cases.items():
        got = np.asarray(kiln.asnumpy(got))
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8"])
def test_shifts_follow_numpy(dtype):
    r = np.random.default_rng(5)
    info = np.iinfo(dtype)
    width = 8 * np.dtype(dtype).itemsize
    x = r.integers(info.min, info.max, size=(6, 9), endpoint=True).astype(dtype)
    s = r.integers(0, width - 1, size=(6, 9), endpoint=True).astype(dtype)
    a, b = kiln.asarray(x), kiln.asarray(s)
    cases = {
        "bitwise_left_shift": (kiln.bitwise_left_shift(a, b), np.left_shift(x, s)),
        "bitwise_right_shift": (kiln.bitwise_right_shift(a, b), np.right_shift(x, s)),
        "<<": (a << b, x << s), ">>": (a >> b, x >> s), "<< scalar": (a << 3, x << np.array(3, dtype)),
        "scalar >>": (100 >> b, np.array(100, dtype) >> s),
    }
    for name, (got, want) in cases.items():
        got = np.asarray(kiln.asnumpy(got))
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    # Amounts of the width or more: 0 to the left, the sign to the right (NumPy's results).
    big = kiln.asarray(np.full((6, 9), width, dtype))
    np.testing.assert_array_equal(kiln.asnumpy(a << big), np.zeros_like(x))
    np.testing.assert_array_equal(kiln.asnumpy(a >> big), np.where(x < 0, -1, 0).astype(dtype))


def test_in_place_bitwise_operators_write_into_the_array():
    x = np.array([1, 6, -8, 127], np.int32)
    want = ((((x << 2) >> 1) & 0xFF) | 1) ^ 3
    t = kiln.asarray(x, copy=True)
    t <<= 2
    t >>= 1
    t &= 0xFF
    t |= 1
    t ^= 3
    np.testing.assert_array_equal(kiln.asnumpy(t), want)
    with pytest.raises(TypeError, match=r"bitwise_left_shift: float operands are not supported .*shifts take integers"):
        kiln.bitwise_left_shift(kiln.zeros((2,), dtype="float32"), t[:2])


def test_bitwise_ops_promote_and_refuse_floats():
    a8, u8 = kiln.asarray(np.array([-1, 5], np.int8)), kiln.asarray(np.array([255, 3], np.uint8))
    got = kiln.asnumpy(kiln.bitwise_and(a8, u8))
    assert got.dtype == np.int16   # as NumPy
    np.testing.assert_array_equal(got, np.array([255, 1], np.int16))
    f = kiln.zeros((2,), dtype="float32")
    with pytest.raises(TypeError, match=r"bitwise_and: float operands are not supported \(float32.*int8.*\); bitwise ops "
                                        "take integers and bools"):
        kiln.bitwise_and(f, a8)
    with pytest.raises(TypeError, match=r"bitwise_invert: float operands are not supported \(got float32"):
        ~f


def test_all_any_of_nothing_and_predicates_refuse_host_data():
    z = kiln.zeros((0, 3))
    np.testing.assert_array_equal(kiln.asnumpy(kiln.all(z)), np.all(np.zeros((0, 3))))
    np.testing.assert_array_equal(kiln.asnumpy(kiln.any(z, axis=0)), np.any(np.zeros((0, 3)), axis=0))
    np.testing.assert_array_equal(kiln.asnumpy(kiln.all(z, axis=0, keepdims=True)),
                                  np.all(np.zeros((0, 3)), axis=0, keepdims=True))
    assert kiln.asnumpy(kiln.any(z, axis=1)).shape == (0,)
    # Host data is no operand (kiln copies nothing implicitly): the same message as every op's.
    with pytest.raises(kiln.DTypeError, match="kiln does not copy host data implicitly"):
        kiln.isinf(np.array([1.0, np.inf]))


def test_result_type_takes_python_scalars_as_weak():
    i8 = kiln.zeros((2,), dtype="int8")
    assert kiln.result_type(i8, 1) == np.dtype(np.int8)
    assert kiln.result_type(i8, 1.0) == np.dtype(np.float32)
    assert kiln.result_type(kiln.zeros((2,), dtype="float16"), 1.0) == np.dtype(np.float16)
    assert kiln.result_type(True, 1) == np.dtype(np.int32)
    assert kiln.result_type(2.5) == np.dtype(np.float32)
    assert kiln.result_type(kiln.float32, kiln.float64, 1.0) == np.dtype(np.float64)   # a float keeps float64
    assert kiln.result_type(kiln.uint64, 2**64 - 1) == np.dtype(np.uint64)
