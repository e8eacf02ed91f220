"""kiln's dtypes and how they meet NumPy's.

kiln stores float64, float32, float16, bfloat16, int64, int32, int16, int8, uint64, uint32, uint16,
uint8 and bool (arithmetic on 16-bit floats happens in float32). The dtype names are NumPy's scalar types, so ``kiln.float16 == np.float16``
and either spelling is accepted wherever a dtype is. NumPy has no bfloat16: with the package
``ml_dtypes`` installed, kiln.bfloat16 is ml_dtypes.bfloat16 and host copies keep it; without it,
kiln.bfloat16 is kiln's own marker and host copies of bfloat16 tensors are float32 arrays.
"""
import numpy as np

from . import _kiln
from ._kiln import DType

try:  # pragma: no cover - depends on the environment
    import ml_dtypes as _ml_dtypes

    bfloat16 = _ml_dtypes.bfloat16
    _BF16_DTYPE = np.dtype(bfloat16)
    _BF16_HOST = _BF16_DTYPE
except ImportError:
    _ml_dtypes = None

    class bfloat16:  # noqa: N801 - named as the dtype it stands for
        """bfloat16 (8 exponent bits, 7 mantissa bits). NumPy has no such dtype: host copies of
        bfloat16 tensors are float32 arrays unless the package ml_dtypes is installed."""

        name = "bfloat16"
        itemsize = 2

        def __init__(self, *args, **kwargs):
            raise TypeError("kiln.bfloat16 is a dtype marker, not a scalar type (install ml_dtypes for bfloat16 scalars)")

    class _BFloat16DType:
        name = "bfloat16"
        itemsize = 2
        kind = "V"
        type = bfloat16

        def __eq__(self, other):
            return other is self or other is bfloat16 or (isinstance(other, str) and other.lower() in ("bfloat16", "bf16"))

        def __ne__(self, other):
            return not self.__eq__(other)

        def __hash__(self):
            return hash("bfloat16")

        def __repr__(self):
            return "dtype('bfloat16')"

        def __str__(self):
            return "bfloat16"

    _BF16_DTYPE = _BFloat16DType()
    _BF16_HOST = np.dtype(np.float32)

float32 = np.float32
float16 = np.float16
int32 = np.int32
int8 = np.int8
uint8 = np.uint8
bool_ = np.bool_
float64 = np.float64
int64 = np.int64
int16 = np.int16
uint16 = np.uint16
uint32 = np.uint32
uint64 = np.uint64

# By DType value: what tensor.dtype reports, and the NumPy dtype of host copies.
_WIDE = [np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.int16), np.dtype(np.uint16), np.dtype(np.uint32),
         np.dtype(np.uint64)]
_REPORTED = [np.dtype(np.float32), np.dtype(np.float16), _BF16_DTYPE, np.dtype(np.int32), np.dtype(np.int8),
             np.dtype(np.uint8), np.dtype(np.bool_)] + _WIDE
_HOST = [np.dtype(np.float32), np.dtype(np.float16), _BF16_HOST, np.dtype(np.int32), np.dtype(np.int8),
         np.dtype(np.uint8), np.dtype(np.bool_)] + _WIDE
_ALL = [DType.float32, DType.float16, DType.bfloat16, DType.int32, DType.int8, DType.uint8, DType.bool,
        DType.float64, DType.int64, DType.int16, DType.uint16, DType.uint32, DType.uint64]
_VALID = "float64, float32, float16, bfloat16, int64, int32, int16, int8, uint64, uint32, uint16, uint8, bool"
_cache = {}


def dtype(x):
    """The kiln DType for any dtype spelling: kiln.DType, NumPy dtypes and scalar types
    (np.float32, np.dtype('f2')), strings ('float16', 'half', 'bf16'), or float/int/bool."""
    if isinstance(x, DType):
        return x
    try:
        return _cache[x]
    except (KeyError, TypeError):
        pass
    d = _parse(x)
    try:
        _cache[x] = d
    except TypeError:
        pass
    return d


def _parse(x):
    if x is bfloat16 or x is _BF16_DTYPE:
        return DType.bfloat16
    if x is float:
        return DType.float32
    if x is int:
        return DType.int32
    if x is bool:
        return DType.bool
    if isinstance(x, str):
        if x.lower() == "bf16":
            return DType.bfloat16
        d = _kiln._dtype_from_name(x.lower())
        if d is not None:
            return d
    try:
        name = np.dtype(x).name
    except TypeError:
        raise _kiln.DTypeError(f"{x!r} is not a dtype; kiln's dtypes: {_VALID}") from None
    d = _kiln._dtype_from_name(name)
    if d is None:
        raise _kiln.DTypeError(f"kiln has no {name} dtype; valid: {_VALID}")
    return d


def host_dtype(d):
    """The NumPy dtype a host copy of a kiln DType has."""
    return _HOST[d.value]


def host_transfer_dtype(d):
    """The DType the bytes of a host copy are in (float32 for bfloat16 without ml_dtypes)."""
    if d == DType.bfloat16 and _ml_dtypes is None:
        return DType.float32
    return d


def from_host(np_dtype):
    """The kiln DType that NumPy data of np_dtype becomes when no dtype is asked for: the same
    for float32, float16, bfloat16, int32, int8, uint8 and bool; float64 -> float32 and other
    integers -> int32, kiln's default float and integer dtypes (ask for float64, int64, int16,
    uint16, uint32 or uint64 by dtype=)."""
    k = np_dtype.kind
    if np_dtype.name == "bfloat16":
        return DType.bfloat16
    if k == "f":
        return DType.float16 if np_dtype.itemsize == 2 else DType.float32
    if k == "b":
        return DType.bool
    if k in "iu":
        if np_dtype.itemsize == 1:
            return DType.int8 if k == "i" else DType.uint8
        return DType.int32
    kinds = {"U": "strings", "S": "bytes", "O": "Python objects", "c": "complex numbers", "M": "datetimes",
             "m": "timedeltas", "V": "structured or void records"}
    what = kinds.get(k, "NumPy dtype")
    raise _kiln.DTypeError(f"kiln cannot hold {what} (NumPy dtype {np_dtype.str!r}); valid dtypes: {_VALID}")


_kiln._set_dtypes(list(_REPORTED), dtype)
