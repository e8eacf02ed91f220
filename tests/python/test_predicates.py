"""isnan, isinf, all, any, finfo and iinfo against NumPy; misuse names what is valid."""
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
    for name in ("int32", "int8", "uint8"):
        i, n = kiln.iinfo(name), np.iinfo(name)
        assert (i.bits, i.max, i.min) == (n.bits, n.max, n.min)
        assert i.dtype == np.dtype(name)


def test_finfo_and_iinfo_refuse_the_other_kind():
    with pytest.raises(TypeError, match=r"finfo: int32 is not a float dtype; valid: float32, float16, bfloat16"):
        kiln.finfo("int32")
    with pytest.raises(TypeError, match=r"iinfo: float16 is not an integer dtype; valid: int32, int8, uint8"):
        kiln.iinfo(np.float16)
    with pytest.raises(kiln.DTypeError, match="kiln has no float64 dtype"):
        kiln.finfo(np.float64)
