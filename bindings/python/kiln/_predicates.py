"""NumPy's and the Array API's predicates and type limits, composed of kiln's own ops.

isnan(x) is x != x and isinf(x) is |x| == inf (False for integers and bools, whose values are
never either); all and any reduce x != 0 with min and max, in bool; the logical functions
compare their operands' truth (x != 0) as bools; signbit copies x's sign onto 1. finfo and iinfo describe
kiln's dtypes with the Array API's fields (bfloat16's from its format: 8 exponent bits, 7
mantissa bits).
"""
from dataclasses import dataclass

import numpy as np

from . import _kiln
from . import _creation
from ._dtypes import _REPORTED
from ._dtypes import dtype as _dtype

_FLOATS = ("float64", "float32", "float16", "bfloat16")
_INTS = ("int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8")


def _name(x):
    """The kiln dtype name of a dtype spelling, of a tensor / expression's dtype, or of what an
    operand becomes (NumPy data as kiln.asarray takes it, Python scalars)."""
    return _creation.dtype_of(x).name


def isnan(x):
    """True where x is NaN (never for integers and bools)."""
    return _kiln.not_equal(x, x)


def isinf(x):
    """True where x is +inf or -inf (never for integers and bools)."""
    if _name(x) not in _FLOATS:
        return _kiln.not_equal(x, x)
    return _kiln.equal(_kiln.absolute(x), float("inf"))


def _truth(x, axis, keepdims, reduce, empty, op):
    t = _kiln.not_equal(x, 0)
    shape = tuple(t.shape)
    axes = range(len(shape)) if axis is None else _creation._shape(axis, op, "axis")
    axes = sorted({a + len(shape) if a < 0 else a for a in axes})
    if shape and any_empty(shape, axes):   # nothing to reduce: NumPy's True for all, False for any
        kept = tuple(1 if d in axes else n for d, n in enumerate(shape)) if keepdims else \
            tuple(n for d, n in enumerate(shape) if d not in axes)
        return _creation.full(kept, empty, dtype="bool")
    return reduce(t, axis=axis, keepdims=keepdims)


def any_empty(shape, axes):
    return 0 in [shape[a] for a in axes if 0 <= a < len(shape)]


def all(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's and the Array API's name
    """True where every element along `axis` (all of them by default) is nonzero; NaN counts as
    nonzero; True where there is none."""
    return _truth(x, axis, keepdims, _kiln.min, True, "all")


def any(x, axis=None, keepdims=False):  # noqa: A001
    """True where some element along `axis` (any of all by default) is nonzero; NaN counts as
    nonzero; False where there is none."""
    return _truth(x, axis, keepdims, _kiln.max, False, "any")


def logical_and(a, b):
    """a and b, elementwise, any dtype (nonzero and NaN are true)."""
    return _kiln.multiply(_kiln.not_equal(a, 0), _kiln.not_equal(b, 0))


def logical_or(a, b):
    """a or b, elementwise, any dtype (nonzero and NaN are true)."""
    return _kiln.maximum(_kiln.not_equal(a, 0), _kiln.not_equal(b, 0))


def logical_xor(a, b):
    """a != b as truth values, elementwise, any dtype (nonzero and NaN are true)."""
    return _kiln.not_equal(_kiln.not_equal(a, 0), _kiln.not_equal(b, 0))


def logical_not(a):
    """not a, elementwise, any dtype (nonzero and NaN are true)."""
    return _kiln.equal(a, 0)


def signbit(x):
    """True where x's sign bit is set (-0.0 and NaNs with the bit included; never for bools)."""
    name = _name(x)
    if name in _FLOATS:
        return _kiln.less(_kiln.copysign(1.0, x), 0)
    if name == "bool":
        return _kiln.not_equal(x, x)
    return _kiln.less(x, 0)


@dataclass(frozen=True)
class finfo_object:  # noqa: N801 - the Array API names the result type after the function
    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: object


@dataclass(frozen=True)
class iinfo_object:  # noqa: N801
    bits: int
    max: int
    min: int
    dtype: object


def finfo(type):  # noqa: A002 - the Array API's parameter name
    """Limits of a float dtype (a dtype spelling, or a tensor or expression of that dtype)."""
    name = _name(type)
    if name not in _FLOATS:
        raise TypeError(f"finfo: {name} is not a float dtype; valid: {', '.join(_FLOATS)} (iinfo describes integers)")
    d = _REPORTED[_dtype(name).value]
    if name == "bfloat16":
        return finfo_object(16, 2.0 ** -7, float.fromhex("0x1.fep127"), -float.fromhex("0x1.fep127"), 2.0 ** -126, d)
    f = np.finfo(np.dtype(name))
    return finfo_object(int(f.bits), float(f.eps), float(f.max), float(f.min), float(f.smallest_normal), d)


def iinfo(type):  # noqa: A002
    """Limits of an integer dtype (a dtype spelling, or a tensor or expression of that dtype)."""
    name = _name(type)
    if name not in _INTS:
        raise TypeError(f"iinfo: {name} is not an integer dtype; valid: {', '.join(_INTS)} (finfo describes floats)")
    i = np.iinfo(np.dtype(name))
    return iinfo_object(int(i.bits), int(i.max), int(i.min), _REPORTED[_dtype(name).value])
