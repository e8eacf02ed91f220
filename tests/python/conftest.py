"""Shared fixtures and helpers of kiln's Python test suite.

Run with the package built in build/:

    PYTHONPATH=/work/main/build/bindings/python/pkg python3 -m pytest tests/python -q

The central helper is :func:`numpy_kiln_allclose`, in the style of CuPy's
``testing.numpy_cupy_allclose``: the decorated test body takes an ``xp`` argument, runs once
with ``xp=numpy`` and once with ``xp=kiln`` and the two results are compared (kiln results go
through ``np.asarray``), with tolerances that depend on the dtypes involved. Data comes from
:func:`shaped_random`, seeded, so both runs see the same values.
"""
import atexit
import functools
import inspect
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

# A kernel cache of this test run's own, as in the C++ tests: what one run stores (CPU objects,
# cubins) never turns the next run's compiles into disk hits, and the user's cache is neither
# read nor written. Set before kiln creates a context (each reads KILN_CACHE_DIR then).
_cache_dir = tempfile.mkdtemp(prefix="kiln-pytest-cache-")
os.environ["KILN_CACHE_DIR"] = _cache_dir
atexit.register(shutil.rmtree, _cache_dir, True)

try:
    import kiln
except ImportError:  # pragma: no cover - run without PYTHONPATH set
    _pkg = os.path.join(os.path.dirname(__file__), "..", "..", "build", "bindings", "python", "pkg")
    sys.path.insert(0, os.path.abspath(_pkg))
    import kiln


# ---------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture
def ctx():
    """kiln's default context (CPU here; KILN_BACKEND=cuda on a GPU machine)."""
    return kiln.default_context()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def ng():
    """A fresh context with the seeds' constructor spelling (neon conventions)."""
    return kiln.NervanaGPU(stochastic_round=False, default_dtype=np.float32, device_id=0, bench=False)


def on_cuda():
    return kiln.default_context().backend == "cuda"


# ---------------------------------------------------------------------------------------------
# dtypes

FLOAT_DTYPES = [np.float32, np.float16]
INT_DTYPES = [np.int32, np.int8, np.uint8]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [np.bool_]
NUMERIC_DTYPES = FLOAT_DTYPES + INT_DTYPES

BF16 = "bfloat16"  # the parameter value standing for kiln.bfloat16 (NumPy has no such dtype)


def dtype_id(d):
    return d if isinstance(d, str) else np.dtype(d).name


def is_bf16(d):
    return isinstance(d, str) and d == BF16 or d is kiln.bfloat16


def kiln_dtype(d):
    """The dtype argument kiln takes for a test dtype parameter."""
    return kiln.bfloat16 if is_bf16(d) else d


def is_float_dtype(d):
    return is_bf16(d) or np.dtype(d).kind == "f"


def round_to_bfloat16(x):
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32: what a
    NumPy reference sees for kiln's bfloat16 data."""
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).reshape(a.shape)


def capped_result_dtype(np_dtype):
    """The dtype kiln gives where NumPy gives np_dtype from kiln's 32-bit and narrower dtypes:
    NumPy's promotion, with float64 -> float32 and 64-bit integers -> int32 (kiln keeps 32-bit
    arithmetic 32-bit where NumPy widens it)."""
    d = np.dtype(np_dtype)
    if d.kind == "f":
        return np.dtype(np.float16) if d.itemsize == 2 else np.dtype(np.float32)
    if d.kind in "iu":
        if d.itemsize <= 2:
            return d
        return np.dtype(np.int32)
    return d


# ---------------------------------------------------------------------------------------------
# data


def host_random(shape, dtype=np.float32, seed=0, low=None, high=None, nonzero=False, positive=False):
    """Seeded NumPy data of `dtype` (bfloat16: float32 values that are exact bfloat16s). Never
    all zeros: floats are uniform in [low, high) (default [-2, 2)), integers span negative and
    positive values where the dtype has them."""
    r = np.random.default_rng(seed + 7919 * len(shape) + 31 * int(np.prod(shape, dtype=np.int64)))
    shape = tuple(shape)
    if is_float_dtype(dtype):
        lo = (0.25 if positive else -2.0) if low is None else low
        hi = 2.0 if high is None else high
        a = r.uniform(lo, hi, size=shape).astype(np.float32)
        if nonzero:
            a = np.where(np.abs(a) < 0.125, np.float32(0.5), a).astype(np.float32)
        if is_bf16(dtype):
            return round_to_bfloat16(a)
        return a.astype(dtype)
    d = np.dtype(dtype)
    if d.kind == "b":
        if nonzero or positive:
            return np.ones(shape, dtype=bool)
        return r.random(shape) < 0.5 if shape else np.array(True)
    if d.kind == "u":
        lo = (1 if positive or nonzero else 0) if low is None else low
        hi = 12 if high is None else high
    else:
        lo = (1 if positive else -9) if low is None else low
        hi = 10 if high is None else high
    a = r.integers(lo, hi, size=shape).astype(d)
    if nonzero:
        a = np.where(a == 0, d.type(3), a).astype(d)
    return a


def shaped_random(shape, xp, dtype=np.float32, seed=0, **kw):
    """host_random's data as a NumPy array (xp is numpy) or a kiln tensor (xp is kiln)."""
    a = host_random(shape, dtype, seed, **kw)
    if xp is np:
        return a
    if is_bf16(dtype):
        return kiln.asarray(a, dtype=kiln.bfloat16)
    t = kiln.asarray(a)  # shares the NumPy buffer (a CPU context) or copies it to the device
    assert t.shape == a.shape and t.dtype == a.dtype, f"kiln.asarray made {t.shape} {t.dtype} of {a.shape} {a.dtype}"
    return t


# ---------------------------------------------------------------------------------------------
# NumPy / kiln comparison

# rtol, atol by the lowest-precision float dtype involved; (elementwise, reduction).
TOLERANCES = {
    "float32": ((1e-5, 1e-6), (1e-4, 1e-5)),
    "float16": ((1e-3, 1e-3), (2e-3, 2e-3)),
    "bfloat16": ((1e-2, 1e-2), (1e-2, 1e-2)),
}


def _precision_name(dtypes):
    names = set()
    for d in dtypes:
        if d is None:
            continue
        if is_bf16(d) or (hasattr(d, "name") and d.name == "bfloat16"):
            names.add("bfloat16")
            continue
        try:
            nd = np.dtype(d)
        except TypeError:
            continue
        if nd.kind == "f":
            names.add("float16" if nd.itemsize == 2 else "float32")
    for n in ("bfloat16", "float16"):
        if n in names:
            return n
    return "float32"


def tolerance(dtypes, reduction=False):
    return TOLERANCES[_precision_name(dtypes)][1 if reduction else 0]


def to_numpy(x):
    """A kiln result as NumPy data (np.asarray on tensors and expressions)."""
    if isinstance(x, (kiln.Tensor, kiln.Expr)):
        return np.asarray(x)
    return x


def assert_kiln_matches(k_result, np_result, rtol=None, atol=None, dtypes=(), reduction=False, type_check=True,
                        bf16=False):
    """Compares a kiln result (Tensor, Expr, or Python data) with NumPy's."""
    k_dtype = k_result.dtype if isinstance(k_result, (kiln.Tensor, kiln.Expr)) else None
    k = to_numpy(k_result)
    n = np.asarray(np_result)
    k = np.asarray(k)
    assert k.shape == n.shape, f"shape: kiln {k.shape}, NumPy {n.shape}"
    if type_check and k_dtype is not None:
        if bf16:
            if n.dtype.kind == "f":
                pass  # bfloat16 or float32 depending on the operation: checked by the tests themselves
            else:
                assert np.dtype(k_dtype) == capped_result_dtype(n.dtype), f"dtype: kiln {k_dtype}, NumPy {n.dtype}"
        else:
            want = capped_result_dtype(n.dtype)
            assert k_dtype == want, f"dtype: kiln {k_dtype}, NumPy {n.dtype} (kiln's expected {want})"
    if n.dtype.kind in "biu" and k.dtype.kind in "biu":
        np.testing.assert_array_equal(k, n.astype(k.dtype) if k.dtype != n.dtype else n)
        return
    d_rtol, d_atol = tolerance(list(dtypes) + [k_dtype, n.dtype if n.dtype.kind == "f" else None], reduction)
    np.testing.assert_allclose(k.astype(np.float64), n.astype(np.float64), rtol=d_rtol if rtol is None else rtol,
                               atol=d_atol if atol is None else atol, equal_nan=True)


def numpy_kiln_allclose(rtol=None, atol=None, reduction=False, type_check=True, accept_error=False, name="xp",
                        dtype_names=("dtype", "dtype1", "dtype2")):
    """Decorator (CuPy's numpy_cupy_allclose): runs the test body with xp=numpy and xp=kiln and
    compares the two results.

    rtol/atol default by dtype (see TOLERANCES) from the test's dtype parameters and the result
    dtypes; reduction=True picks the looser reduction tolerances. Integer and bool results must
    be equal. type_check: kiln's result dtype must be NumPy's capped at 32 bits.
    accept_error: an exception class (or tuple, or True for any): when NumPy raises one, kiln
    must raise an exception of the same class too."""

    def decorator(f):
        sig = inspect.signature(f)
        params = [p for p in sig.parameters.values() if p.name != name]

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            dtypes = [kwargs.get(d) for d in dtype_names if d in kwargs]
            bf16 = any(is_bf16(d) for d in dtypes)
            errors = (Exception if accept_error is True else accept_error) if accept_error else ()
            np_exc = k_exc = None
            try:
                with np.errstate(all="ignore"):  # log(0) = -inf is part of the comparison
                    np_res = f(*args, **kwargs, **{name: np})
            except errors as e:  # noqa: B030 - () catches nothing
                np_exc = e
            try:
                k_res = f(*args, **kwargs, **{name: kiln})
            except Exception as e:
                if np_exc is None:
                    raise
                k_exc = e
            if np_exc is not None:
                assert k_exc is not None, f"NumPy raised {type(np_exc).__name__}({np_exc}) but kiln did not"
                cls = type(np_exc) if accept_error is True else next(c for c in (
                    errors if isinstance(errors, tuple) else (errors,)) if isinstance(np_exc, c))
                assert isinstance(k_exc, cls), (
                    f"NumPy raised {type(np_exc).__name__}, kiln {type(k_exc).__name__}: {k_exc}")
                assert isinstance(k_exc, kiln.Error), f"kiln raised a non-kiln error: {k_exc!r}"
                return
            if isinstance(np_res, tuple):
                assert isinstance(k_res, tuple) and len(k_res) == len(np_res)
                for kr, nr in zip(k_res, np_res):
                    assert_kiln_matches(kr, nr, rtol, atol, dtypes, reduction, type_check and not bf16, bf16)
            else:
                assert_kiln_matches(k_res, np_res, rtol, atol, dtypes, reduction, type_check and not bf16, bf16)

        wrapper.__signature__ = sig.replace(parameters=params)
        del wrapper.__wrapped__
        return wrapper

    return decorator
