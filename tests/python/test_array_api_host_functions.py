"""The Array API's sorting and data-dependent functions (kiln/_host_functions.py), boolean masks,
and the smaller standard pieces around them (clip's signature, can_cast's lattice,
broadcast_shapes, to_device, mT, nextafter, integer powers), against NumPy."""
import numpy as np
import pytest

import kiln


def _a(values, dtype=None):
    return kiln.asarray(np.asarray(values), dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "uint8", "int16"])
def test_sort_and_argsort_are_stable_both_ways(dtype):
    h = np.array([[3, 1, 2, 1, 3, 0], [5, 5, 4, 4, 6, 6]]).astype(dtype)
    x = _a(h, dtype)
    np.testing.assert_array_equal(np.asarray(kiln.sort(x)), np.sort(h, kind="stable"))
    np.testing.assert_array_equal(np.asarray(kiln.sort(x, axis=0, descending=True)), -np.sort(-h.astype(np.int64), axis=0))
    np.testing.assert_array_equal(np.asarray(kiln.argsort(x)), np.argsort(h, kind="stable"))
    idx = np.asarray(kiln.argsort(x, descending=True))
    assert idx.dtype == np.int32
    # Descending, equal elements keep their order: row 0 is 3, 3, 2, 1, 1, 0 from 0, 4, 2, 1, 3, 5.
    np.testing.assert_array_equal(idx[0], [0, 4, 2, 1, 3, 5])


def test_nonzero_unique_isin_searchsorted():
    h = np.array([[0, 2, 2], [7, 0, 2]], dtype=np.int64)
    x = _a(h, "int64")
    for got, want in zip(kiln.nonzero(x), np.nonzero(h)):
        np.testing.assert_array_equal(np.asarray(got), want)
    values, counts = kiln.unique_counts(x)
    np.testing.assert_array_equal(np.asarray(values), [0, 2, 7])
    np.testing.assert_array_equal(np.asarray(counts), [2, 3, 1])
    u = kiln.unique_all(x)
    np.testing.assert_array_equal(np.asarray(u.indices), [0, 1, 3])
    np.testing.assert_array_equal(np.asarray(u.inverse_indices), [[0, 1, 1], [2, 0, 1]])
    assert u.values.dtype == np.int64 and u.counts.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(kiln.unique_values(_a([1.0, np.nan, np.nan, 1.0]))), [1.0, np.nan, np.nan])
    np.testing.assert_array_equal(np.asarray(kiln.isin(x, _a([2, 9], "int64"))), np.isin(h, [2, 9]))
    np.testing.assert_array_equal(np.asarray(kiln.isin(x, _a([2, 9], "int64"), invert=True)), ~np.isin(h, [2, 9]))
    s = _a([1.0, 2.0, 2.0, 5.0], "float64")
    np.testing.assert_array_equal(np.asarray(kiln.searchsorted(s, _a([2.0, 6.0], "float64"), side="right")), [3, 4])
    assert int(kiln.searchsorted(_a(np.array([1, 2, 3], np.int32)), 2.5)) == 2   # a scalar keeps its own value
    with pytest.raises(kiln.InvalidArgument, match="nonzero: x is 0-d"):
        kiln.nonzero(_a(3.0))
    with pytest.raises(ValueError, match="searchsorted: side='middle'"):
        kiln.searchsorted(s, s, side="middle")


def test_cumulative_sum_and_prod():
    h = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int8)
    x = _a(h)
    got = kiln.cumulative_sum(x, axis=1)
    assert got.dtype == np.int32   # kiln's default integer, as its sums
    np.testing.assert_array_equal(np.asarray(got), np.cumsum(h, axis=1))
    got = kiln.cumulative_prod(x, axis=0, include_initial=True)
    np.testing.assert_array_equal(np.asarray(got), [[1, 1, 1], [1, 2, 3], [4, 10, 18]])
    f = _a([0.5, 0.25, 2.0], "float64")
    np.testing.assert_array_equal(np.asarray(kiln.cumulative_sum(f, include_initial=True)), [0, 0.5, 0.75, 2.75])
    with pytest.raises(kiln.InvalidArgument, match="cumulative_sum: x has 2 dimensions; give axis="):
        kiln.cumulative_sum(x)


def test_boolean_masks_select_and_store():
    h = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    x = _a(h)
    m = h % 3 == 0
    np.testing.assert_array_equal(np.asarray(x[_a(m)]), h[m])
    np.testing.assert_array_equal(np.asarray(x[_a(np.array([True, False, True]))]), h[[0, 2]])
    x[_a(m)] = -1.0                       # a scalar: a fused where
    h[m] = -1.0
    np.testing.assert_array_equal(np.asarray(x), h)
    x[_a(m)] = _a(np.arange(m.sum(), dtype=np.float32))   # one value per selected element
    h[m] = np.arange(m.sum())
    np.testing.assert_array_equal(np.asarray(x), h)
    x[_a(m)] = np.arange(m.sum()) * 2.0                     # the same, from host data
    h[m] = np.arange(m.sum()) * 2.0
    np.testing.assert_array_equal(np.asarray(x), h)
    with pytest.raises(IndexError, match=r"getitem: a boolean index of shape \(2,\) for an array of shape \(3, 4\)"):
        x[_a(np.array([True, False]))]


def test_clip_can_cast_broadcast_shapes_to_device_mT_nextafter_and_integer_power():
    x = _a(np.array([-3, 0, 5, 9]), "int16")
    np.testing.assert_array_equal(np.asarray(kiln.clip(x, min=0)), [0, 0, 5, 9])
    np.testing.assert_array_equal(np.asarray(kiln.clip(x, max=4)), [-3, 0, 4, 4])
    np.testing.assert_array_equal(np.asarray(kiln.clip(x, 0, 4)), [0, 0, 4, 4])   # NumPy's positional bounds
    assert kiln.clip(x, min=0).dtype == np.int16
    assert kiln.can_cast(kiln.uint8, kiln.int16) and kiln.can_cast(kiln.int32, kiln.int64)
    assert not kiln.can_cast(kiln.int64, kiln.float64) and not kiln.can_cast(kiln.uint32, kiln.int32)
    assert kiln.broadcast_shapes((3, 1), (1, 4), ()) == (3, 4)
    with pytest.raises(kiln.InvalidArgument, match=r"broadcast_shapes: shapes \(3,\), \(4,\) do not broadcast"):
        kiln.broadcast_shapes((3,), (4,))
    t = _a(np.ones((2, 3), np.float32))
    assert t.to_device(t.device) is t
    assert t.mT.shape == (3, 2) and kiln.meshgrid(t[0], t[1])[0].shape == (3, 3)
    a, b = np.array([1.0, 0.0, -2.0], np.float32), np.array([2.0, -1.0, -2.0], np.float32)
    np.testing.assert_array_equal(np.asarray(kiln.nextafter(_a(a), _a(b))), np.nextafter(a, b))
    np.testing.assert_array_equal(np.asarray(kiln.nextafter(_a(a, "float64"), 5.0)), np.nextafter(a.astype(np.float64), 5.0))
    with pytest.raises(kiln.DTypeError, match="nextafter: integer and bool operands are not supported"):
        kiln.nextafter(x, x)
    assert kiln.__array_api_version__ == "2025.12"
