"""The Array API standard's entry points: __array_namespace__ on arrays and expressions, and
__array_namespace_info__ describing kiln's devices, dtypes and capabilities as they are."""
import numpy as np
import pytest

import kiln


def test_arrays_and_expressions_name_the_kiln_namespace():
    x = kiln.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert x.__array_namespace__() is kiln
    assert (x + 1).__array_namespace__(api_version="2024.12") is kiln
    xp = x.__array_namespace__()
    np.testing.assert_array_equal(np.asarray(xp.sum(x, axis=1)), [3, 12])
    with pytest.raises(ValueError, match=r"api_version='2019.01'; kiln answers to None or one of 2021.12"):
        x.__array_namespace__(api_version="2019.01")


def test_namespace_info_lists_kilns_dtypes_by_kind():
    info = kiln.__array_namespace_info__()
    d = info.dtypes()
    assert set(d) == {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
                      "float64"}
    assert d["float32"] == kiln.float32 and d["int32"] == kiln.int32 and d["float64"] == kiln.float64
    assert set(info.dtypes(kind="integral")) == {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                                        "uint64"}
    assert set(info.dtypes(kind=("bool", "real floating"))) == {"bool", "float32", "float64"}
    assert info.dtypes(kind="complex floating") == {}
    # Each dtype listed makes arrays of that dtype.
    for name, dt in d.items():
        assert np.asarray(kiln.zeros((2,), dtype=dt)).dtype == np.dtype(dt), name
    with pytest.raises(ValueError, match=r"dtypes: kind='float'; the kinds are 'bool', 'signed integer'"):
        info.dtypes(kind="float")


def test_namespace_info_defaults_devices_and_capabilities():
    info = kiln.__array_namespace_info__()
    defaults = info.default_dtypes()
    assert defaults["real floating"] == kiln.float32 and defaults["integral"] == kiln.int32
    assert defaults["indexing"] == kiln.int32 and defaults["complex floating"] is None
    assert np.asarray(kiln.asarray([1.5])).dtype == np.dtype(defaults["real floating"])
    assert info.default_device() == kiln.default_context().device
    assert info.default_device() in info.devices() and "cpu" in info.devices()
    with pytest.raises(ValueError, match=r"default_dtypes: device='tpu:0'; this process's devices are"):
        info.default_dtypes(device="tpu:0")
    caps = info.capabilities()
    assert caps == {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": None}
    # What the capabilities say: a mask indexes (its result's shape depends on the data, as
    # nonzero's does), and a rank past 64 works.
    x = kiln.asarray(np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(x[kiln.asarray(np.array([True, False, True]))]), [0, 2])
    assert tuple(np.asarray(i).tolist() for i in kiln.nonzero(x)) == ([1, 2],)
    assert kiln.zeros((1,) * 70).ndim == 70
