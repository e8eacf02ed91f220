"""The Array API's keywords on kiln's functions: device= on the creation functions, copy= on
asarray, astype and reshape, and reshape's shape= (NumPy's older newshape= still works)."""
import numpy as np
import pytest

import kiln


def _host(t):
    return np.asarray(t)


def test_device_selects_the_context_of_that_device():
    here = kiln.default_context().device
    for make in (lambda d: kiln.zeros((2, 3), device=d), lambda d: kiln.ones(4, device=d),
                 lambda d: kiln.empty((1,), device=d), lambda d: kiln.full((2,), 7, device=d),
                 lambda d: kiln.arange(5, device=d), lambda d: kiln.asarray([1.0, 2.0], device=d)):
        assert make(here).device == here
        assert make(None).device == here
        cpu = make("cpu")
        assert cpu.device == "cpu"
    np.testing.assert_array_equal(_host(kiln.full((2,), 7, device="cpu")), [7, 7])
    np.testing.assert_array_equal(_host(kiln.arange(1, 7, 2, device="cpu")), [1, 3, 5])
    x = kiln.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    for like in (kiln.zeros_like, kiln.ones_like, kiln.empty_like):
        y = like(x, device=x.device)
        assert y.shape == (2, 3) and y.dtype == kiln.float32 and y.device == x.device
    np.testing.assert_array_equal(_host(kiln.full_like(x, 2.5, device="cpu")), np.full((2, 3), 2.5, np.float32))
    # a device named by a context, and by the namespace info's own list
    assert kiln.zeros(3, device=kiln.default_context()).device == here
    for d in kiln.__array_namespace_info__().devices():
        assert kiln.zeros(3, device=d).device == d


def test_device_misuse_names_the_op_and_the_devices():
    with pytest.raises(kiln.InvalidArgument, match=r"zeros: device='cuda:7'; this process's devices are \[.*'cpu'"):
        kiln.zeros(3, device="cuda:7")
    with pytest.raises(kiln.DTypeError, match="arange: device= takes a device name such as x.device gives"):
        kiln.arange(3, device=3)
    ctx = kiln.default_context()
    with pytest.raises(kiln.InvalidArgument, match=r"ones: device='cuda:9', but ctx= runs on"):
        kiln.ones(2, ctx=ctx, device="cuda:9")


def test_asarray_copy():
    x = kiln.asarray(np.arange(4, dtype=np.float32))
    assert kiln.asarray(x) is x
    assert kiln.asarray(x, copy=False) is x
    y = kiln.asarray(x, copy=True)
    assert y is not x and y._data_ptr != x._data_ptr
    y[0] = 5.0
    assert _host(x)[0] == 0.0
    with pytest.raises(ValueError, match="asarray: copy=False, but casting float32 to int32 copies"):
        kiln.asarray(x, dtype=kiln.int32, copy=False)
    with pytest.raises(ValueError, match="asarray: copy=False, but an expression has no memory of its own"):
        kiln.asarray(x + 1, copy=False)
    with pytest.raises(ValueError, match=r"asarray: copy=False, but list data .*a copy is needed"):
        kiln.asarray([1.0, 2.0], copy=False)
    with pytest.raises(kiln.DTypeError, match="asarray: copy= takes True, False or None, got 'yes'"):
        kiln.asarray(x, copy="yes")
    h = np.arange(3, dtype=np.float32)
    if kiln.default_context().device == "cpu":   # NumPy data shares a CPU context's memory
        shared = kiln.asarray(h, copy=False)
        h[1] = 9.0
        assert _host(shared)[1] == 9.0
        copied = kiln.asarray(h, copy=True)
        h[2] = 8.0
        assert _host(copied)[2] == 2.0
    else:
        with pytest.raises(ValueError, match="asarray: copy=False"):
            kiln.asarray(h, copy=False)


def test_asarray_device_moves_and_copy_false_refuses():
    x = kiln.asarray(np.arange(3, dtype=np.float32))
    assert kiln.asarray(x, device=x.device) is x
    if x.device != "cpu":
        moved = kiln.asarray(x, device="cpu")
        assert moved.device == "cpu"
        np.testing.assert_array_equal(_host(moved), [0, 1, 2])
        with pytest.raises(ValueError, match="asarray: copy=False, but the data is on cuda"):
            kiln.asarray(x, device="cpu", copy=False)


def test_astype_copy_and_device():
    x = kiln.asarray(np.array([1.5, -2.5], dtype=np.float32))
    assert kiln.astype(x, kiln.float32, copy=False) is x
    same = kiln.astype(x, kiln.float32)
    assert same is not x
    np.testing.assert_array_equal(_host(same), [1.5, -2.5])
    np.testing.assert_array_equal(_host(kiln.astype(x, kiln.int32)), [1, -2])
    np.testing.assert_array_equal(_host(kiln.astype(x, "float16", copy=False)), [1.5, -2.5])
    assert kiln.astype(x, kiln.float32, device="cpu").device == "cpu"
    with pytest.raises(kiln.DTypeError, match="astype: copy= takes True or False, got None"):
        kiln.astype(x, kiln.float32, copy=None)
    with pytest.raises(kiln.InvalidArgument, match="astype: device='cuda:7'"):
        kiln.astype(x, kiln.float32, device="cuda:7")


def test_reshape_shape_copy_and_newshape():
    x = kiln.asarray(np.arange(6, dtype=np.float32))
    v = kiln.reshape(x, (2, 3))
    assert v.shape == (2, 3) and v._data_ptr == x._data_ptr
    assert kiln.reshape(x, shape=(3, 2)).shape == (3, 2)
    assert kiln.reshape(x, newshape=(3, 2)).shape == (3, 2)
    assert kiln.reshape(x, (2, 3), copy=False)._data_ptr == x._data_ptr
    c = kiln.reshape(x, (2, 3), copy=True)
    assert c._data_ptr != x._data_ptr
    np.testing.assert_array_equal(_host(c), np.arange(6).reshape(2, 3))
    t = kiln.reshape(x, (2, 3)).T   # strides (4, 12) bytes: flattening it needs a copy
    flat = kiln.reshape(t, (6,))
    np.testing.assert_array_equal(_host(flat), np.arange(6).reshape(2, 3).T.reshape(6))
    with pytest.raises(ValueError, match=r"reshape: copy=False, but a tensor of shape \(3, 2\) and strides "
                                         r"\(4, 12\) cannot be viewed as shape \(6,\): a copy is needed"):
        kiln.reshape(t, (6,), copy=False)
    with pytest.raises(kiln.DTypeError, match="reshape: give the new shape once"):
        kiln.reshape(x)
    with pytest.raises(kiln.DTypeError, match="reshape: give the new shape once"):
        kiln.reshape(x, (6,), newshape=(6,))
    with pytest.raises(kiln.DTypeError, match="reshape: copy= takes True, False or None, got 1"):
        kiln.reshape(x, (6,), copy=1)
    e = kiln.reshape(x + 1, (3, 2), copy=False)   # an expression stays lazy
    np.testing.assert_array_equal(_host(e), np.arange(1, 7).reshape(3, 2))


def test_device_of_an_array_in_another_context_is_that_context():
    other = kiln.Context("cpu")
    x = other.asarray(np.arange(4, dtype=np.float32))
    assert kiln.asarray(x, device=x.device) is x
    assert kiln.asarray(x, device=x.device, copy=False) is x
    assert kiln.asarray(x, device=other) is x
    assert kiln.zeros_like(x, device=x.device).ctx is other
    assert kiln.astype(x, kiln.float32, copy=False, device=x.device) is x
    assert kiln.zeros(2, device=other).ctx is other
    here = kiln.default_context()
    moved = kiln.asarray(x, device=here)   # a context as the device: another one copies
    assert moved.ctx is here and moved is not x
    np.testing.assert_array_equal(_host(moved), [0, 1, 2, 3])
    with pytest.raises(ValueError, match="asarray: copy=False, but the data is on cpu and device="):
        kiln.asarray(x, device=here, copy=False)
    with pytest.raises(kiln.InvalidArgument, match="zeros: device= is a context on cpu and ctx= another"):
        kiln.zeros(2, ctx=here, device=other)
    assert kiln.astype(x + 1, kiln.float16, device=here).ctx is here   # an expression moves too


def test_copy_flags_take_numpy_bools_and_scalars_cast():
    x = kiln.asarray(np.arange(4, dtype=np.float32))
    assert kiln.asarray(x, copy=np.False_) is x
    assert kiln.astype(x, kiln.float32, copy=np.False_) is x
    with pytest.raises(kiln.DTypeError, match="asarray: copy= takes True, False or None, got 'yes'"):
        kiln.asarray(x, device="cpu", copy="yes")
    np.testing.assert_array_equal(_host(kiln.astype(2.5, kiln.float16)), np.float16(2.5))


def test_reshape_of_nothing():
    z = kiln.zeros((0, 3))
    assert kiln.reshape(z, (3, 0), copy=False).shape == (3, 0)
    assert kiln.reshape(z, (0,), copy=True).shape == (0,)
