"""The Array API functions composed of kiln's own (kiln/_standard.py), against NumPy."""
import math

import numpy as np
import pytest

import kiln

DTYPES = ["float32", "float16", "bfloat16", "int32", "int8", "uint8", "bool"]


def host(t):
    return np.asarray(t).astype(np.float64) if np.asarray(t).dtype.kind == "V" else np.asarray(t)


def _values(shape, dtype, seed=0):
    r = np.random.default_rng(seed)
    if dtype == "bool":
        return r.random(shape) < 0.5
    if dtype in ("int32", "int8"):
        return r.integers(-50, 50, shape).astype(dtype)
    if dtype == "uint8":
        return r.integers(0, 100, shape).astype(dtype)
    return r.standard_normal(shape).astype(np.float32)


def _kiln(a, dtype):
    return kiln.asarray(a, dtype=dtype)


def test_constants():
    assert kiln.e == math.e and kiln.pi == math.pi and kiln.inf == math.inf and math.isnan(kiln.nan)
    assert kiln.newaxis is None
    x = kiln.asarray(np.arange(3, dtype=np.float32))
    assert x[:, kiln.newaxis].shape == (3, 1)


def test_isdtype_and_can_cast():
    assert kiln.isdtype(kiln.float32, "real floating") and kiln.isdtype("bfloat16", "numeric")
    assert kiln.isdtype(kiln.int8, "signed integer") and kiln.isdtype(kiln.uint8, ("bool", "unsigned integer"))
    assert not kiln.isdtype(kiln.bool, "numeric") and not kiln.isdtype(kiln.float16, "complex floating")
    assert kiln.isdtype(kiln.int32, kiln.int32) and not kiln.isdtype(kiln.int32, kiln.int8)
    assert kiln.isdtype(kiln.int32, "integral") and not kiln.isdtype(kiln.float32, "integral")
    with pytest.raises(ValueError, match="isdtype: kind='floating'; the kinds are 'bool', 'signed integer'"):
        kiln.isdtype(kiln.float32, "floating")
    assert kiln.can_cast(kiln.int8, kiln.int32) and kiln.can_cast(kiln.uint8, kiln.uint8)
    assert kiln.can_cast(kiln.float16, kiln.float32) and not kiln.can_cast(kiln.float32, kiln.float16)
    assert not kiln.can_cast(kiln.int32, kiln.float32)   # another kind: the standard does not promote
    assert not kiln.can_cast(kiln.bool, kiln.int8) and not kiln.can_cast(kiln.int32, kiln.int8)
    assert kiln.can_cast(kiln.asarray(np.zeros(2, np.int8)), kiln.int32)


@pytest.mark.parametrize("n,m,k", [(3, None, 0), (3, 5, 1), (4, 2, -1), (2, 3, 7), (0, 3, 0), (1, 1, 0)])
def test_eye(n, m, k):
    np.testing.assert_array_equal(host(kiln.eye(n, m, k=k)), np.eye(n, m, k=k, dtype=np.float32))
    assert kiln.eye(n, m, k=k, dtype=kiln.int8).dtype == kiln.int8
    with pytest.raises(kiln.InvalidArgument, match="eye: n_rows=-1, n_cols=2; sizes are 0 or more"):
        kiln.eye(-1, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [-2, 0, 1, 9])
def test_tril_triu(dtype, k):
    a = _values((2, 3, 5), dtype)
    x = _kiln(a, dtype)
    want_l, want_u = np.tril(a, k), np.triu(a, k)
    lo, up = kiln.tril(x, k=k), kiln.triu(x, k=k)
    assert lo.dtype == x.dtype and up.dtype == x.dtype
    np.testing.assert_array_equal(host(lo), host(_kiln(want_l, dtype)))
    np.testing.assert_array_equal(host(up), host(_kiln(want_u, dtype)))


def test_tril_needs_a_matrix():
    with pytest.raises(kiln.InvalidArgument, match=r"tril: x has shape \(4,\); it needs 2 or more dimensions"):
        kiln.tril(kiln.zeros(4))


@pytest.mark.parametrize("start,stop,num,endpoint", [(0, 1, 5, True), (-2, 3, 7, False), (1, 1, 3, True),
                                                     (0, 10, 1, True), (0, 10, 1, False), (2, -4, 0, True)])
def test_linspace(start, stop, num, endpoint):
    got = host(kiln.linspace(start, stop, num, endpoint=endpoint))
    want = np.linspace(start, stop, num, endpoint=endpoint, dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if num > 1 and endpoint:
        assert got[-1] == np.float32(stop)   # the end point exactly


def test_linspace_misuse():
    with pytest.raises(kiln.InvalidArgument, match="linspace: num=-1; it is 0 or more"):
        kiln.linspace(0, 1, -1)
    with pytest.raises(kiln.InvalidArgument, match="linspace: start and stop must be finite, got 0, inf"):
        kiln.linspace(0, math.inf, 3)


@pytest.mark.parametrize("indexing", ["xy", "ij"])
def test_meshgrid(indexing):
    a, b, c = np.arange(3, dtype=np.float32), np.arange(4, dtype=np.float32) * 2, np.arange(2, dtype=np.float32)
    got = kiln.meshgrid(kiln.asarray(a), kiln.asarray(b), kiln.asarray(c), indexing=indexing)
    want = np.meshgrid(a, b, c, indexing=indexing)
    assert len(got) == 3
    for g, w in zip(got, want):
        np.testing.assert_array_equal(host(g), w)
    one = kiln.meshgrid(kiln.asarray(a), indexing=indexing)
    np.testing.assert_array_equal(host(one[0]), a)
    with pytest.raises(ValueError, match="meshgrid: indexing='xz'; it is 'xy' or 'ij'"):
        kiln.meshgrid(kiln.asarray(a), indexing="xz")
    with pytest.raises(kiln.InvalidArgument, match=r"meshgrid: array 1 has shape \(2, 2\); every one is 1-d"):
        kiln.meshgrid(kiln.asarray(a), kiln.zeros((2, 2)))
    with pytest.raises(kiln.DTypeError, match="meshgrid: the arrays' dtypes differ"):
        kiln.meshgrid(kiln.asarray(a), kiln.asarray(a, dtype=kiln.int32))


def test_axis_permutations():
    a = _values((2, 3, 4, 5), "float32")
    x = kiln.asarray(a)
    np.testing.assert_array_equal(host(kiln.permute_dims(x, (2, 0, 3, 1))), np.transpose(a, (2, 0, 3, 1)))
    np.testing.assert_array_equal(host(kiln.permute_dims(x + 1, (3, 2, 1, 0))), np.transpose(a + 1, (3, 2, 1, 0)))
    np.testing.assert_array_equal(host(kiln.matrix_transpose(x)), np.swapaxes(a, -1, -2))
    for src, dst in [(0, -1), (-1, 0), ((0, 1), (3, 2)), ((2, 0), (0, 3)), (1, 1)]:
        np.testing.assert_array_equal(host(kiln.moveaxis(x, src, dst)), np.moveaxis(a, src, dst))
    with pytest.raises(kiln.InvalidArgument, match=r"permute_dims: axes \(0, 1\) for 4 dimensions"):
        kiln.permute_dims(x, (0, 1))
    with pytest.raises(kiln.InvalidArgument, match=r"permute_dims: repeated axes \(0, 0, 1, 2\)"):
        kiln.permute_dims(x, (0, 0, 1, 2))
    with pytest.raises(kiln.InvalidArgument, match="moveaxis: axis 4 is out of range for 4 dimensions"):
        kiln.moveaxis(x, 4, 0)
    with pytest.raises(kiln.InvalidArgument, match="moveaxis: 2 source axes and 1 destinations"):
        kiln.moveaxis(x, (0, 1), 2)
    with pytest.raises(kiln.InvalidArgument, match=r"matrix_transpose: x has shape \(3,\)"):
        kiln.matrix_transpose(kiln.zeros(3))


@pytest.mark.parametrize("dtype", ["float32", "int8", "bool"])
def test_flip_roll_unstack(dtype):
    a = _values((3, 4, 5), dtype, seed=1)
    x = _kiln(a, dtype)
    for axis in (None, 0, -1, (0, 2)):
        np.testing.assert_array_equal(host(kiln.flip(x, axis=axis)), np.flip(a, axis))
    np.testing.assert_array_equal(host(kiln.flip(kiln.logical_not(x) if dtype == "bool" else x + 1, axis=1)),
                                  np.flip(np.logical_not(a) if dtype == "bool" else a + 1, 1))
    for shift, axis in [(1, None), (-7, None), (2, 1), (-1, 0), (5, 2), (0, 1), ((1, -2), (0, 2)), (13, -1)]:
        np.testing.assert_array_equal(host(kiln.roll(x, shift, axis=axis)), np.roll(a, shift, axis))
    r = kiln.roll(x, 0, axis=0)   # a new tensor even when nothing moves
    assert r._data_ptr != x._data_ptr
    for axis in (0, 1, -1):
        parts = kiln.unstack(x, axis=axis)
        assert len(parts) == a.shape[axis]
        for p, w in zip(parts, [np.take(a, i, axis) for i in range(a.shape[axis])]):
            np.testing.assert_array_equal(host(p), w)
    with pytest.raises(kiln.InvalidArgument, match=r"roll: 1 shifts for 2 axes"):
        kiln.roll(x, (1,), axis=(0, 1))
    with pytest.raises(kiln.InvalidArgument, match="unstack: axis 3 is out of range for 3 dimensions"):
        kiln.unstack(x, axis=3)


def test_positive_pow_round():
    a = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.7], dtype=np.float32)
    x = kiln.asarray(a)
    np.testing.assert_array_equal(host(kiln.round(x)), np.round(a))
    np.testing.assert_array_equal(host(kiln.round(kiln.asarray(np.array([3, -4], np.int32)))), [3, -4])
    np.testing.assert_array_equal(host(kiln.positive(x)), a)
    np.testing.assert_allclose(host(kiln.pow(kiln.abs(x), 1.5)), np.abs(a) ** 1.5, rtol=1e-6)
    # Integer powers wrap as products do; a negative exponent gives the power's integer part.
    i = np.array([2, 3, -3, 1, -1, 0, 7], np.int32)
    np.testing.assert_array_equal(host(kiln.pow(kiln.asarray(i), 3)), i ** 3)
    np.testing.assert_array_equal(host(kiln.pow(kiln.asarray(i), 31)), i ** 31)   # wraps at int32
    np.testing.assert_array_equal(host(kiln.pow(kiln.asarray(i), -2)), [0, 0, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(host(kiln.pow(kiln.asarray(i), -3)), [0, 0, 0, 1, -1, 0, 0])
    b = np.array([[3, 5, 200]], np.uint8)
    e = np.array([[4], [9]], np.uint8)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(host(kiln.asarray(b) ** kiln.asarray(e)), b ** e)
        big = np.array([3, -7, 2**40 + 1], np.int64)
        np.testing.assert_array_equal(host(kiln.pow(kiln.asarray(big, dtype="int64"), 5)), big ** 5)
    assert (kiln.asarray(np.array([True])) ** kiln.asarray(np.array([True]))).dtype == np.int8   # as NumPy
    with pytest.raises(kiln.DTypeError, match="positive: x is bool; positive takes numeric dtypes"):
        kiln.positive(kiln.asarray(np.array([True])))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "uint8"])
def test_conj_real_imag_of_real_arrays(dtype):
    a = np.array([[-2.5, 0.0, 3.0], [np.inf, -np.inf, 7.0]] if dtype.startswith("float") else [[1, 2, 3], [4, 5, 6]],
                 dtype=dtype)
    x = kiln.asarray(a)
    for name in ("conj", "real", "imag"):
        got = host(getattr(kiln, name)(x))
        want = getattr(np, name)(a)
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    for name in ("conj", "real", "imag"):
        with pytest.raises(kiln.DTypeError, match=f"{name}: x is bool; {name} takes numeric dtypes"):
            getattr(kiln, name)(kiln.asarray(np.array([True])))


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
                                   ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
                                   ((2, 3, 4), (4,)), ((3, 0), (0, 2)), ((0, 3), (3, 2))])
def test_matmul(sa, sb):
    a, b = _values(sa, "float32", 2), _values(sb, "float32", 3)
    got = kiln.matmul(kiln.asarray(a), kiln.asarray(b))
    want = np.matmul(a, b)
    assert tuple(got.shape) == want.shape
    np.testing.assert_allclose(host(got), want, rtol=1e-5, atol=1e-5)


def test_matmul_dtypes_and_misuse():
    a, b = _values((3, 4), "float32", 4), _values((4, 2), "float32", 5)
    got = kiln.matmul(kiln.asarray(a, dtype=kiln.float16), kiln.asarray(b))   # promoted to float32
    assert got.dtype == kiln.float32
    np.testing.assert_allclose(host(got), a.astype(np.float16).astype(np.float32) @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(kiln.matmul(kiln.asarray(a) + 1, kiln.asarray(b))), (a + 1) @ b, rtol=1e-5, atol=1e-5)
    with pytest.raises(kiln.InvalidArgument, match=r"matmul: shapes \(3, 4\) and \(3, 2\) do not chain: 4 columns "
                                                   r"against 3 rows"):
        kiln.matmul(kiln.asarray(a), kiln.zeros((3, 2)))
    with pytest.raises(kiln.InvalidArgument, match="matmul: operands of shapes"):
        kiln.matmul(kiln.asarray(a), kiln.asarray(np.float32(2)))
    with pytest.raises(kiln.InvalidArgument, match="matmul: the batch axes of"):
        kiln.matmul(kiln.zeros((2, 3, 4)), kiln.zeros((3, 4, 2)))
    # Integers (and float64) are a sum of products in their own arithmetic, not the GEMM.
    i = np.arange(6, dtype=np.int32).reshape(2, 3) - 2
    got = kiln.matmul(kiln.asarray(i), kiln.asarray(i.T.copy()))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(got), i @ i.T)


@pytest.mark.parametrize("sa,sb,axis", [((3, 4), (3, 4), -1), ((2, 3, 4), (4,), -1), ((2, 3, 4), (2, 3, 4), 0),
                                        ((5, 3), (5, 3), -2), ((2, 5, 3), (5, 1), 1)])
def test_vecdot(sa, sb, axis):
    a, b = _values(sa, "float32", 6), _values(sb, "float32", 7)
    got = kiln.vecdot(kiln.asarray(a), kiln.asarray(b), axis=axis)
    n = max(a.ndim, b.ndim)
    ax = axis - n if axis >= 0 else axis
    want = np.sum(a * b, axis=ax)
    np.testing.assert_allclose(host(got), want, rtol=1e-5, atol=1e-5)


def test_vecdot_misuse():
    with pytest.raises(kiln.InvalidArgument, match=r"vecdot: shapes \(3, 4\) and \(3, 5\) differ along axis -1"):
        kiln.vecdot(kiln.zeros((3, 4)), kiln.zeros((3, 5)))
    with pytest.raises(kiln.InvalidArgument, match="vecdot: axis 2 is out of range for 2 dimensions"):
        kiln.vecdot(kiln.zeros((3, 4)), kiln.zeros((3, 4)), axis=2)


@pytest.mark.parametrize("sa,sb,axes", [((3, 4, 5), (4, 5, 2), 2), ((3, 4), (4, 5), 1), ((2, 3), (4, 5), 0),
                                        ((3, 4, 5), (5, 3, 2), ([0, 2], [1, 0])), ((4, 3), (3, 4), ((1, 0), (0, 1)))])
def test_tensordot(sa, sb, axes):
    a, b = _values(sa, "float32", 8), _values(sb, "float32", 9)
    got = kiln.tensordot(kiln.asarray(a), kiln.asarray(b), axes=axes)
    want = np.tensordot(a, b, axes=axes)
    assert tuple(got.shape) == want.shape
    np.testing.assert_allclose(host(got), want, rtol=1e-5, atol=1e-5)


def test_tensordot_misuse():
    with pytest.raises(kiln.InvalidArgument, match=r"tensordot: axis 1 of \(3, 4\) and axis 0 of \(5, 2\) differ"):
        kiln.tensordot(kiln.zeros((3, 4)), kiln.zeros((5, 2)), axes=1)
    with pytest.raises(kiln.InvalidArgument, match="tensordot: axes=3 for operands of 2 and 2 dimensions"):
        kiln.tensordot(kiln.zeros((3, 4)), kiln.zeros((4, 3)), axes=3)
    with pytest.raises(kiln.InvalidArgument, match="tensordot: 2 axes of x1 against 1 of x2"):
        kiln.tensordot(kiln.zeros((3, 4)), kiln.zeros((4, 3)), axes=([0, 1], [0]))


@pytest.mark.parametrize("dtype", ["float32", "int8", "bool"])
def test_broadcasting_and_counting(dtype):
    a = _values((3, 1, 4), dtype, 10)
    x = _kiln(a, dtype)
    for shape in [(3, 1, 4), (2, 3, 5, 4), (3, 6, 4)]:
        got = kiln.broadcast_to(x, shape)
        assert tuple(got.shape) == shape and got.dtype == x.dtype
        np.testing.assert_array_equal(host(got), np.broadcast_to(a, shape))
    b = _values((5, 1), dtype, 11)
    got = kiln.broadcast_arrays(x, _kiln(b, dtype))
    for g, w in zip(got, np.broadcast_arrays(a, b)):
        np.testing.assert_array_equal(host(g), w)
    with pytest.raises(kiln.InvalidArgument, match=r"broadcast_to: shape \(3, 1, 4\) does not broadcast to \(3, 2\)"):
        kiln.broadcast_to(x, (3, 2))
    with pytest.raises(kiln.InvalidArgument, match="broadcast_arrays: shapes .* do not broadcast together"):
        kiln.broadcast_arrays(x, kiln.zeros((2, 3)))
    c = _values((4, 6), dtype, 12)
    y = _kiln(c, dtype)
    assert int(host(kiln.count_nonzero(y))) == np.count_nonzero(c)
    np.testing.assert_array_equal(host(kiln.count_nonzero(y, axis=1)), np.count_nonzero(c, axis=1))
    np.testing.assert_array_equal(host(kiln.count_nonzero(y, axis=0, keepdims=True)),
                                  np.count_nonzero(c, axis=0, keepdims=True))


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_tile_repeat_diff(dtype):
    a = _values((3, 4), dtype, 13)
    x = _kiln(a, dtype)
    for reps in [(2,), (2, 3), (2, 1, 3), (1, 1), (0, 2)]:
        np.testing.assert_array_equal(host(kiln.tile(x, reps)), np.tile(a, reps))
    assert kiln.tile(x, (1, 1))._data_ptr != x._data_ptr
    for repeats, axis in [(2, None), (3, 1), (0, 0), ([1, 0, 2], 0), (np.array([2, 1, 0, 1]), -1)]:
        np.testing.assert_array_equal(host(kiln.repeat(x, repeats, axis=axis)), np.repeat(a, repeats, axis))
    af = a.astype(np.float32)
    xf = kiln.asarray(af)
    for n, axis in [(1, -1), (2, 1), (1, 0), (0, 0), (5, 1)]:
        np.testing.assert_array_equal(host(kiln.diff(xf, axis=axis, n=n)), np.diff(af, n, axis))
    np.testing.assert_array_equal(host(kiln.diff(xf, axis=0, prepend=xf[:1], append=xf[2:])),
                                  np.diff(af, axis=0, prepend=af[:1], append=af[2:]))
    with pytest.raises(kiln.InvalidArgument, match=r"tile: repetitions \(2, -1\); each is 0 or more"):
        kiln.tile(x, (2, -1))
    with pytest.raises(kiln.InvalidArgument, match=r"repeat: repeats must be one count of 0 or more per element "
                                                   r"along axis 0 \(3 of them\), got shape \(2,\)"):
        kiln.repeat(x, [1, 2], axis=0)
    with pytest.raises(kiln.InvalidArgument, match="diff: n=-1; it is 0 or more"):
        kiln.diff(xf, n=-1)


def test_take_along_axis():
    a = _values((3, 4, 5), "float32", 14)
    x = kiln.asarray(a)
    r = np.random.default_rng(15)
    for axis in (0, 1, -1):
        n = a.shape[axis]
        shape = list(a.shape)
        shape[axis] = 6
        i = r.integers(-n, n, shape).astype(np.int32)
        want = np.take_along_axis(a, np.where(i < 0, i + n, i), axis)
        np.testing.assert_array_equal(host(kiln.take_along_axis(x, kiln.asarray(i), axis=axis)), want)
    i = np.argsort(a, axis=1)[:, :2, :].astype(np.int32)   # broadcast along a length-1 axis of indices
    np.testing.assert_array_equal(host(kiln.take_along_axis(x, kiln.asarray(i[:1]), axis=1)),
                                  np.take_along_axis(a, np.broadcast_to(i[:1], (3, 2, 5)), 1))
    np.testing.assert_array_equal(host(kiln.take_along_axis(x.T, kiln.asarray(i.T), axis=1)),
                                  np.take_along_axis(a.T, i.T, 1))   # a strided x
    with pytest.raises(kiln.InvalidArgument, match=r"take_along_axis: indices of shape \(3,\) for x of shape "
                                                   r"\(3, 4, 5\); they need as many dimensions"):
        kiln.take_along_axis(x, kiln.asarray(np.zeros(3, np.int32)))
    with pytest.raises(kiln.DTypeError, match="take_along_axis: indices are float32; they are integers"):
        kiln.take_along_axis(x, kiln.zeros((3, 4, 1)))
    with pytest.raises(kiln.InvalidArgument, match="take_along_axis: indices of shape .* outside axis 2"):
        kiln.take_along_axis(x, kiln.asarray(np.zeros((2, 4, 1), np.int32)), axis=2)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_logaddexp(dtype):
    inf, nan = np.inf, np.nan
    a = np.array([0.0, 1.0, -3.0, 80.0, -80.0, 1e4, inf, -inf, inf, -inf, nan, 2.0], dtype=np.float32)
    b = np.array([0.0, 2.0, 5.0, 79.0, -81.0, 1e4, inf, -inf, -inf, 3.0, 1.0, nan], dtype=np.float32)
    x, y = kiln.asarray(a, dtype=dtype), kiln.asarray(b, dtype=dtype)
    got = host(kiln.logaddexp(x, y)).astype(np.float64)
    want = np.logaddexp(host(x).astype(np.float64), host(y).astype(np.float64))
    tol = 1e-6 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert kiln.logaddexp(x, y).dtype == x.dtype
