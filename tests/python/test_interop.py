"""Zero-copy exchange with other array libraries: DLPack with NumPy on the CPU (memory shared
both ways), NumPy's copy semantics, kiln.asarray on NumPy data, and -- on a CUDA context --
PyTorch, CuPy and JAX (skipped, with the reason, elsewhere)."""
import ctypes
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from conftest import host_random

KILN_DTYPES = [np.float32, np.float16, np.int32, np.int8, np.uint8, np.bool_]


def dtid(d):
    return np.dtype(d).name


cpu_only = pytest.mark.skipif(kiln.default_context().backend != "cpu",
                              reason="host memory sharing needs a CPU context (the default context is on CUDA)")


def capsule_name(cap):
    f = ctypes.pythonapi.PyCapsule_GetName
    f.restype = ctypes.c_char_p
    f.argtypes = [ctypes.py_object]
    return f(cap).decode()


# =============================================================================================
# kiln -> NumPy


@cpu_only
@pytest.mark.parametrize("dtype", KILN_DTYPES, ids=dtid)
def test_numpy_from_dlpack_shares_memory(dtype):
    h = host_random((3, 4), dtype, seed=1)
    t = kiln.array(h)
    n = np.from_dlpack(t)
    assert n.dtype == np.dtype(dtype) and n.shape == (3, 4)
    assert n.ctypes.data == t._data_ptr
    np.testing.assert_array_equal(n, h)
    # kiln writes, NumPy sees
    t[1] = 1 if dtype != np.bool_ else False
    assert np.all(n[1] == (1 if dtype != np.bool_ else False))
    # NumPy writes, kiln sees
    n[2, 3] = 5 if dtype != np.bool_ else True
    assert t.get()[2, 3] == (5 if dtype != np.bool_ else True)
    assert t[2, 3].item() == n[2, 3].item()


@cpu_only
def test_numpy_from_dlpack_of_views():
    h = np.arange(30, dtype=np.float32).reshape(5, 6)
    t = kiln.array(h)
    for key in [(slice(None, None, 2), slice(1, None)), (slice(None, None, -1),), (slice(None), slice(None, None, -2)),
                (1,), (Ellipsis, 3), (None, slice(1, 3))]:
        v = t[key]
        n = np.from_dlpack(v)
        np.testing.assert_array_equal(n, h[key])
        assert n.strides == h[key].strides
    nt = np.from_dlpack(t.T)
    np.testing.assert_array_equal(nt, h.T)
    nt[0, 4] = -1.0  # writes through the transposed view into t
    assert t.get()[4, 0] == -1.0


@cpu_only
def test_numpy_from_dlpack_of_expression_evaluates():
    h = host_random((4, 3), np.float32, seed=2)
    t = kiln.asarray(h)
    np.testing.assert_allclose(np.from_dlpack(t * 2 + 1), h * 2 + 1, rtol=1e-6)


@cpu_only
def test_dlpack_device_and_capsules():
    t = kiln.zeros((2, 2))
    assert t.__dlpack_device__() == (1, 0)
    assert (t + 1).__dlpack_device__() == (1, 0)
    assert capsule_name(t.__dlpack__()) == "dltensor"
    assert capsule_name(t.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(t.__dlpack__(max_version=(1, 3))) == "dltensor_versioned"
    assert capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"
    t.__dlpack__(dl_device=(1, 0))  # the tensor's own device is fine


@cpu_only
def test_dlpack_export_errors():
    t = kiln.zeros((2, 2))
    with pytest.raises(BufferError, match="stream"):
        t.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="device"):
        t.__dlpack__(dl_device=(2, 0))


@cpu_only
def test_numpy_from_dlpack_copy_true_copies():
    t = kiln.asarray(np.arange(4, dtype=np.float32))
    n = np.from_dlpack(t, copy=True)
    assert n.ctypes.data != t._data_ptr
    n[0] = 100
    assert t.get()[0] == 0


@cpu_only
@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (1,)], ids=str)
def test_numpy_from_dlpack_0d_and_empty(shape):
    t = kiln.full(shape, 2.5)
    n = np.from_dlpack(t)
    assert n.shape == shape and n.dtype == np.float32
    np.testing.assert_array_equal(n, np.full(shape, 2.5, np.float32))


@cpu_only
def test_export_keeps_the_memory_alive():
    t = kiln.asarray(np.arange(1000, dtype=np.float32)) * 3
    t = t.eval()
    n = np.from_dlpack(t)
    del t
    gc.collect()
    junk = [kiln.full((1000,), -1.0) for _ in range(4)]  # reuse of freed memory would show here
    np.testing.assert_array_equal(n, np.arange(1000, dtype=np.float32) * 3)
    del junk


def test_np_asarray_copies():
    h = host_random((3, 3), np.float32, seed=3)
    t = kiln.array(h)
    n = np.asarray(t)
    assert isinstance(n, np.ndarray) and n.dtype == np.float32
    np.testing.assert_array_equal(n, h)
    n[0, 0] = 1234.0
    assert t.get()[0, 0] == h[0, 0], "np.asarray(tensor) must be a copy"
    a = np.array(t)
    a[1, 1] = -99.0
    assert t.get()[1, 1] == h[1, 1]
    n2 = np.asarray(t, dtype=np.float64)
    assert n2.dtype == np.float64
    np.testing.assert_array_equal(n2, h.astype(np.float64))
    e = np.asarray(t + 1)
    np.testing.assert_allclose(e, h + 1, rtol=1e-6)


@cpu_only
def test_np_asarray_copy_false_shares():
    t = kiln.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    n = np.asarray(t, copy=False)
    assert n.ctypes.data == t._data_ptr
    n[0, 0] = 42.0
    assert t.get()[0, 0] == 42.0


def test_get_and_asnumpy_copy():
    t = kiln.asarray(np.arange(5, dtype=np.int8))
    g = t.get()
    g[0] = 9
    assert t.get()[0] == 0
    g2 = kiln.asnumpy(t)
    g2[1] = 9
    assert t.get()[1] == 1


# =============================================================================================
# NumPy -> kiln


@cpu_only
@pytest.mark.parametrize("dtype", KILN_DTYPES, ids=dtid)
def test_kiln_from_dlpack_shares_memory(dtype):
    h = host_random((4, 5), dtype, seed=4)
    orig = h.copy()
    t = kiln.from_dlpack(h)
    assert isinstance(t, kiln.Tensor)
    assert t.dtype == np.dtype(dtype) and t.shape == (4, 5)
    assert t._data_ptr == h.ctypes.data
    np.testing.assert_array_equal(t.get(), orig)
    # NumPy writes, kiln sees
    h[0, 0] = 3 if dtype != np.bool_ else not h[0, 0]
    assert t.get()[0, 0] == h[0, 0]
    # kiln writes, NumPy sees
    t[2:] = 1 if dtype != np.bool_ else True
    assert np.all(h[2:] == (1 if dtype != np.bool_ else True))


@cpu_only
@pytest.mark.parametrize("dtype", KILN_DTYPES, ids=dtid)
def test_kiln_asarray_shares_numpy_memory(dtype):
    h = host_random((3, 4), dtype, seed=5)
    t = kiln.asarray(h)
    assert t._data_ptr == h.ctypes.data, "kiln.asarray(ndarray) copied on a CPU context"
    t[...] = t * 0 if dtype != np.bool_ else False
    assert not np.any(h), "a kiln write did not reach the NumPy array"


@cpu_only
def test_kiln_asarray_computes_in_place_on_numpy_data():
    h = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    want = np.tanh(h) * 2
    t = kiln.asarray(h)
    t[...] = kiln.tanh(t) * 2
    np.testing.assert_allclose(h, want, rtol=1e-6)


@pytest.mark.parametrize("np_dtype,kiln_dtype", [(np.float64, np.float32), (np.int64, np.int32), (np.int16, np.int32),
                                                 (np.uint16, np.int32)], ids=lambda d: np.dtype(d).name)
def test_kiln_asarray_converts_other_dtypes_by_copying(np_dtype, kiln_dtype):
    h = np.arange(6).reshape(2, 3).astype(np_dtype)
    t = kiln.asarray(h)
    assert t.dtype == np.dtype(kiln_dtype) and t.shape == (2, 3)
    np.testing.assert_array_equal(t.get(), h.astype(kiln_dtype))
    h[0, 0] = 77
    assert t.get()[0, 0] == 0


@cpu_only
def test_kiln_asarray_with_dtype_converts():
    h = np.arange(6, dtype=np.float32)
    t = kiln.asarray(h, dtype=np.float16)
    assert t.dtype == np.float16
    np.testing.assert_array_equal(t.get(), h.astype(np.float16))
    t[...] = 0
    assert h[3] == 3, "a converted array is a new tensor"


def test_readonly_numpy_array_is_copied():
    h = np.arange(5, dtype=np.float32)
    h.flags.writeable = False
    t = kiln.asarray(h)
    assert t._data_ptr != h.ctypes.data
    np.testing.assert_array_equal(t.get(), h)
    t[...] = t * 10  # kiln tensors are writable; the read-only array is untouched
    np.testing.assert_array_equal(h, np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(t.get(), np.arange(5) * 10)
    t2 = kiln.from_dlpack(h)
    assert t2._data_ptr != h.ctypes.data
    np.testing.assert_array_equal(t2.get(), h)


@cpu_only
def test_readonly_from_dlpack_copy_false_raises():
    h = np.ones(3, dtype=np.float32)
    h.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        kiln.from_dlpack(h, copy=False)


def test_from_dlpack_of_a_dtype_kiln_lacks_raises_dtype_error():
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.from_dlpack(np.ones((2, 2), dtype=np.complex128))
    msg = str(ei.value)
    assert "complex128" in msg and "uint64" in msg and "float64" in msg and "from_dlpack" in msg
    assert isinstance(ei.value, TypeError)
    with pytest.raises(kiln.DTypeError, match="complex64"):
        kiln.from_dlpack(np.ones(3, dtype=np.complex64))


@cpu_only
def test_from_dlpack_shares_float64_and_int64():
    for h in (np.linspace(0, 1, 6).reshape(2, 3), np.arange(6, dtype=np.int64) * 2**40):
        t = kiln.from_dlpack(h)
        assert t.dtype == h.dtype
        h.flat[0] = 7
        assert t.get().flat[0] == 7   # the same memory


@cpu_only
@pytest.mark.parametrize("key", [(slice(None, None, 2), slice(1, None)), (slice(None, None, -1),),
                                 (slice(None), slice(None, None, -2)), (slice(None, None, -2), slice(None, None, -3)),
                                 (Ellipsis, 2), (slice(1, 4), None)], ids=str)
def test_strided_numpy_views_via_dlpack(key):
    base = np.arange(42, dtype=np.float32).reshape(6, 7)
    v = base[key]
    t = kiln.from_dlpack(v)
    assert t.shape == v.shape
    assert t.strides == v.strides
    assert t._data_ptr == v.ctypes.data
    np.testing.assert_array_equal(t.get(), v)
    np.testing.assert_allclose(np.asarray(kiln.sum(t, axis=-1)), v.sum(axis=-1))
    # a write through the kiln view lands at the view's places in the base
    t[...] = t * -1
    want = np.arange(42, dtype=np.float32).reshape(6, 7)
    want[key] *= -1
    np.testing.assert_array_equal(base, want)


@cpu_only
def test_fortran_order_numpy_array():
    h = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    t = kiln.asarray(h)
    assert t._data_ptr == h.ctypes.data and not t.is_contiguous
    np.testing.assert_array_equal(t.get(), h)
    np.testing.assert_array_equal(np.asarray(t + 1), h + 1)


@cpu_only
def test_round_trip_kiln_numpy_kiln_is_the_same_memory():
    t = kiln.asarray(np.arange(8, dtype=np.float32))
    n = np.from_dlpack(t)
    t2 = kiln.from_dlpack(n)
    assert t2._data_ptr == t._data_ptr
    t2[...] = 3.0
    assert np.all(t.get() == 3.0) and np.all(n == 3.0)


def test_from_dlpack_of_a_tensor():
    t = kiln.zeros(3)
    assert kiln.from_dlpack(t) is t
    c = kiln.from_dlpack(t, copy=True)
    assert c is not t and c._data_ptr != t._data_ptr


@cpu_only
def test_imported_memory_outlives_the_numpy_name():
    h = np.arange(100, dtype=np.float32)
    t = kiln.from_dlpack(h)
    del h
    gc.collect()
    np.testing.assert_array_equal(t.get(), np.arange(100, dtype=np.float32))


@cpu_only
def test_from_dlpack_device_argument():
    h = np.ones(3, dtype=np.float32)
    assert kiln.from_dlpack(h, device="cpu")._data_ptr == h.ctypes.data
    with pytest.raises(BufferError):
        kiln.from_dlpack(h, device="cuda:0")


def test_cuda_array_interface_absent_on_cpu():
    c = kiln.Context("cpu")
    t = c.zeros((2, 3))
    with pytest.raises(AttributeError, match="host memory"):
        t.__cuda_array_interface__
    assert not hasattr(t, "__cuda_array_interface__")


@cpu_only
def test_no_leak_warnings_at_exit_with_live_exports():
    # An exported array still alive at interpreter exit must not make nanobind report leaks.
    code = textwrap.dedent("""
        import numpy as np, kiln
        t = kiln.zeros(3)
        n = np.from_dlpack(t)
        cap = t.__dlpack__(max_version=(1, 0))
        m = np.asarray(t, copy=False)
    """)
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "leaked" not in r.stderr, r.stderr


# =============================================================================================
# GPU libraries (a CUDA context only)


@pytest.fixture
def cuda_ctx():
    ctx = kiln.default_context()
    if ctx.backend != "cuda":
        pytest.skip(f"GPU interop needs a CUDA context; the default context runs on '{ctx.backend}' "
                    "(KILN_BACKEND=cuda on a machine with an NVIDIA GPU)")
    return ctx


@pytest.fixture
def torch(cuda_ctx):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    return torch


@pytest.fixture
def cupy(cuda_ctx):
    return pytest.importorskip("cupy", reason="CuPy is not installed")


@pytest.fixture
def jax(cuda_ctx):
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU device")
    return jax


def test_cuda_array_interface_on_gpu(cuda_ctx):
    t = kiln.arange(12, dtype=np.float32).reshape(3, 4)
    cai = t.__cuda_array_interface__
    assert cai["shape"] == (3, 4) and cai["typestr"] == "<f4" and cai["version"] == 3
    assert cai["data"][0] == t._data_ptr and cai["data"][1] is False
    assert cai["strides"] is None
    assert t.T.__cuda_array_interface__["strides"] == (4, 16)
    assert t.__dlpack_device__() == (2, int(cuda_ctx.device.split(":")[1]))
    for name in ("float64", "int64", "int16", "uint16", "uint32", "float16", "int8", "uint8", "bool"):
        assert kiln.zeros((2,), dtype=name).__cuda_array_interface__["typestr"][1:] == np.dtype(name).str[1:]


def test_kiln_asarray_of_numpy_copies_on_gpu(cuda_ctx):
    h = np.arange(6, dtype=np.float32)
    t = kiln.asarray(h)
    t[...] = 0
    assert h[5] == 5


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "int8", "uint8", "bool"])
def test_torch_to_kiln_shares_memory(torch, dtype):
    tdt = getattr(torch, dtype)
    x = torch.arange(12, device="cuda").reshape(3, 4).to(tdt)
    k = kiln.from_dlpack(x)
    assert k.shape == (3, 4) and k._data_ptr == x.data_ptr()
    if dtype != "bool":
        k[...] = k * 2
        kiln.default_context().synchronize()
        assert torch.equal(x, (torch.arange(12, device="cuda").reshape(3, 4) * 2).to(tdt))
    x.zero_()
    torch.cuda.synchronize()
    assert not np.asarray(k.astype(np.float32)).any()


def test_kiln_to_torch_shares_memory(torch):
    k = kiln.asarray(np.arange(20, dtype=np.float32).reshape(4, 5))
    x = torch.from_dlpack(k)
    assert x.is_cuda and x.data_ptr() == k._data_ptr and tuple(x.shape) == (4, 5)
    x.mul_(3)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(k.get(), np.arange(20).reshape(4, 5) * 3)
    v = torch.from_dlpack(k.T[1:, ::2])
    np.testing.assert_array_equal(v.cpu().numpy(), k.get().T[1:, ::2])


def test_torch_streams(torch):
    # The producer orders its pending work before the consumer's stream (DLPack's rule).
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.ones((2048, 2048), device="cuda")
        for _ in range(20):
            x = x * 1.0001 + 0.5
    k = kiln.from_dlpack(x)  # kiln passes its stream: no host synchronisation needed
    v = 1.0
    for _ in range(20):
        v = v * 1.0001 + 0.5
    want = v * 2048 * 2048  # computed on the host: reading x on torch's stream would be its own race
    assert abs(float(kiln.sum(k)) - want) / abs(want) < 1e-4
    k2 = kiln.full((1024,), 2.0)
    k2[...] = k2 * 3
    with torch.cuda.stream(s):
        y = torch.from_dlpack(k2)  # torch passes s: kiln orders its assignment before it
        z = (y + 1).sum().item()
    assert z == 1024 * 7


def test_torch_strided_and_offset_tensors(torch):
    x = torch.arange(60, dtype=torch.float32, device="cuda").reshape(6, 10)[1:5, ::3]
    k = kiln.from_dlpack(x)
    np.testing.assert_array_equal(k.get(), x.cpu().numpy())
    k[...] = -1
    kiln.default_context().synchronize()
    assert bool((x == -1).all())


def test_cupy_round_trip(cupy):
    c = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
    k = kiln.from_dlpack(c)
    assert k._data_ptr == c.data.ptr
    k[...] = k + 1
    kiln.default_context().synchronize()
    assert bool((c == cupy.arange(1, 13, dtype=cupy.float32).reshape(3, 4)).all())
    back = cupy.from_dlpack(k)
    back *= 2
    cupy.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(k.get(), np.arange(1, 13).reshape(3, 4) * 2)
    via_cai = cupy.asarray(k)  # __cuda_array_interface__
    assert via_cai.data.ptr == k._data_ptr
    k2 = kiln.asarray(c)
    assert k2._data_ptr == c.data.ptr


def test_cupy_streams(cupy):
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        c = cupy.ones((1 << 20,), dtype=cupy.float32)
        for _ in range(10):
            c = c * 2
    k = kiln.from_dlpack(c)
    assert float(kiln.sum(k)) == float(1 << 20) * 1024


def test_jax_round_trip(jax):
    import jax.numpy as jnp

    a = jnp.arange(12, dtype=jnp.float32).reshape(3, 4) * 2
    k = kiln.from_dlpack(a)  # shared, or copied when JAX marks its (immutable) buffer read-only
    np.testing.assert_array_equal(k.get(), np.arange(12).reshape(3, 4) * 2)
    np.testing.assert_array_equal(np.asarray(kiln.sum(k, axis=0)), (np.arange(12).reshape(3, 4) * 2).sum(axis=0))
    k2 = (kiln.asarray(np.arange(6, dtype=np.float32)) + 1).eval()
    j = jnp.from_dlpack(k2)
    assert j.unsafe_buffer_pointer() == k2._data_ptr
    np.testing.assert_array_equal(np.asarray(j), np.arange(6) + 1)


def test_cuda_array_interface_import(cupy):
    # A producer with only __cuda_array_interface__ (as Numba's device arrays): shared, and
    # kiln's stream waits for the producer's stream.
    c = cupy.arange(10, dtype=cupy.float32) * 3

    class OnlyCAI:
        def __init__(self, a):
            self.a = a

        @property
        def __cuda_array_interface__(self):
            return self.a.__cuda_array_interface__

    k = kiln.asarray(OnlyCAI(c))
    assert k._data_ptr == c.data.ptr and k.shape == (10,)
    np.testing.assert_array_equal(k.get(), np.arange(10) * 3)
    k[...] = k + 1
    kiln.default_context().synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(c), np.arange(10) * 3 + 1)
    strided = OnlyCAI(cupy.arange(20, dtype=cupy.float32).reshape(4, 5)[:, ::2])
    np.testing.assert_array_equal(kiln.asarray(strided).get(), np.arange(20).reshape(4, 5)[:, ::2])


def test_wrap_pointer_keeps_its_owner_alive():
    # The path __cuda_array_interface__ imports take, exercised on host memory: a raw pointer
    # with row-major (None) or explicit strides, the owner kept alive by the tensor.
    ctx = kiln.Context("cpu")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = kiln._kiln._wrap(ctx, a.ctypes.data, kiln.DType.float32, a.shape, None, a, False, 0)
    s = kiln._kiln._wrap(ctx, a.ctypes.data, kiln.DType.float32, (4, 3), (1, 4), a, False, 0)  # a.T
    del a
    import gc

    gc.collect()
    np.testing.assert_array_equal(t.get(), np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(s.get(), np.arange(12).reshape(3, 4).T)
    t[...] = t * 2
    np.testing.assert_array_equal(s.get(), 2 * np.arange(12).reshape(3, 4).T)


def test_torch_takes_a_reversed_view_as_a_copy():
    pytest.importorskip("torch", reason="PyTorch is not installed")
    # PyTorch's from_dlpack aborts the process on negative strides: run it apart
    code = textwrap.dedent("""
        import numpy as np, torch, kiln
        h = np.arange(6, dtype=np.float32).reshape(2, 3)
        t = kiln.asarray(h)
        print(torch.from_dlpack(t[:, ::-1]).cpu().tolist())
        print(torch.from_dlpack(t[::-1, 1]).cpu().tolist())
        try:
            torch.from_dlpack(t[:, ::-1], copy=False)
            print("no error")
        except BufferError as e:
            print(e)
        print(np.from_dlpack(t[:, ::-1]).strides if kiln.default_context().device == "cpu" else (-4,))   # NumPy: a view
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "[[2.0, 1.0, 0.0], [5.0, 4.0, 3.0]]"
    assert lines[1] == "[4.0, 1.0]"
    assert "PyTorch cannot take a view with negative strides" in lines[2]
    assert "-4" in lines[3]


def test_dlpack_arguments_of_the_wrong_type_are_type_errors():
    t = kiln.asarray(np.ones((2, 2), np.float32))
    for kw, what in (({"dl_device": "cpu"}, "dl_device= is of type str"), ({"max_version": 1}, "max_version= is of type int"),
                     ({"copy": "yes"}, "copy= is of type str")):
        with pytest.raises(TypeError, match=what):
            t.__dlpack__(**kw)
