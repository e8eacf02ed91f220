"""The Array API's functions that sort, or whose result's shape depends on the data (sort,
argsort, searchsorted, nonzero, the unique family, isin) and the cumulative sums and
products: computed by NumPy on a host copy of the operands, the results uploaded to the
operands' context as new tensors. A kernel's shape is fixed before it runs, so none of these is
a fused expression; they cost a device round trip on a GPU, and they are right on every dtype
kiln has. Results keep the standard's dtypes (indices in int32, kiln's default integer)."""
import operator

import numpy as np

from . import _creation, _dtypes, _kiln
from ._kiln import DType, Expr, Tensor


def _host(x, op):
    if not isinstance(x, (Tensor, Expr)):
        raise _kiln.DTypeError(f"{op}: x is a {type(x).__name__}; it takes a kiln tensor or expression "
                               "(kiln.asarray makes one)")
    return np.asarray(x)


def _back(a, like, dtype=None):
    """NumPy result `a` as a new tensor of `like`'s context, of dtype (default: `like`'s)."""
    dt = like._dtype if dtype is None else dtype
    a = np.asarray(a).astype(_dtypes.host_dtype(dt), copy=False)
    return _creation.array(a if a.flags.c_contiguous else a.copy(), dtype=dt, ctx=like.ctx)


def _indices(a, like):
    return _back(a.astype(np.int64), like, DType.int32)


def _axis(x, axis, op):
    n = x.ndim
    ax = operator.index(axis)
    if not -n <= ax < max(n, 1):
        raise _kiln.InvalidArgument(f"{op}: axis {axis} is out of range for {n} dimensions")
    return ax


def sort(x, /, *, axis=-1, descending=False, stable=True):
    """x sorted along axis (ascending, or descending), NaN last as in NumPy; a stable sort."""
    a = _host(x, "sort")
    ax = _axis(x, axis, "sort")
    if x.ndim == 0:
        return _back(a, x if isinstance(x, Tensor) else x.eval())
    out = np.take_along_axis(a, _argsort_desc(a, ax), axis=ax) if descending else np.sort(a, axis=ax, kind="stable")
    return _back(out, x if isinstance(x, Tensor) else x.eval())


# Descending, equal elements in their original order: the stable ascending order of the
# reversed data, reversed, as indices of the data.
def _argsort_desc(a, ax):
    n = a.shape[ax]
    flipped = np.flip(a, axis=ax)
    idx = np.flip(np.argsort(flipped, axis=ax, kind="stable"), axis=ax)
    return (n - 1) - idx


def argsort(x, /, *, axis=-1, descending=False, stable=True):
    """The indices (int32) that sort x along axis; equal elements keep their order (stable)."""
    a = _host(x, "argsort")
    ax = _axis(x, axis, "argsort")
    like = x if isinstance(x, Tensor) else x.eval()
    if x.ndim == 0:
        return _indices(np.zeros((), np.int64), like)
    idx = _argsort_desc(a, ax) if descending else np.argsort(a, axis=ax, kind="stable")
    return _indices(idx, like)


def searchsorted(x1, x2, /, *, side="left", sorter=None):
    """Where the values of x2 would go in the sorted 1-d x1 (int32 indices), as NumPy."""
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side={side!r}; it is 'left' or 'right'")
    a = _host(x1, "searchsorted")
    if a.ndim != 1:
        raise _kiln.InvalidArgument(f"searchsorted: x1 has shape {a.shape}; it is 1-d")
    v = np.asarray(x2)
    s = None if sorter is None else np.asarray(sorter)
    like = x1 if isinstance(x1, Tensor) else x1.eval()
    return _indices(np.searchsorted(a, v, side=side, sorter=s), like)


def nonzero(x, /):
    """A tuple of int32 index arrays, one per axis, of the elements of x that are not zero."""
    a = _host(x, "nonzero")
    if a.ndim == 0:
        raise _kiln.InvalidArgument("nonzero: x is 0-d; it needs 1 or more dimensions")
    like = x if isinstance(x, Tensor) else x.eval()
    return tuple(_indices(i, like) for i in np.nonzero(a))


def _unique(x, op, **kw):
    a = _host(x, op).reshape(-1)
    like = x if isinstance(x, Tensor) else x.eval()
    return a, like, np.unique(a, equal_nan=False, **kw)


def unique_values(x, /):
    """The distinct values of x, sorted (NaNs each distinct), as a 1-d tensor."""
    _, like, vals = _unique(x, "unique_values")
    return _back(vals, like)


def unique_counts(x, /):
    """(values, counts): the distinct values of x and how many times each occurs (int32)."""
    _, like, (vals, counts) = _unique(x, "unique_counts", return_counts=True)
    return _UniqueCounts(_back(vals, like), _indices(counts, like))


def unique_inverse(x, /):
    """(values, inverse_indices): the distinct values of x and, for each element of x, the index
    of its value among them (int32, x's shape)."""
    a = _host(x, "unique_inverse")
    like = x if isinstance(x, Tensor) else x.eval()
    vals, inv = np.unique(a.reshape(-1), return_inverse=True, equal_nan=False)
    return _UniqueInverse(_back(vals, like), _indices(inv.reshape(a.shape), like))


def unique_all(x, /):
    """(values, indices, inverse_indices, counts): unique_inverse and unique_counts together,
    with each value's first index in the flattened x."""
    a = _host(x, "unique_all")
    like = x if isinstance(x, Tensor) else x.eval()
    vals, first, inv, counts = np.unique(a.reshape(-1), return_index=True, return_inverse=True, return_counts=True,
                                         equal_nan=False)
    return _UniqueAll(_back(vals, like), _indices(first, like), _indices(inv.reshape(a.shape), like),
                      _indices(counts, like))


def isin(x1, x2, /, *, invert=False):
    """Whether each element of x1 is among the elements of x2 (or not, with invert=True)."""
    a = _host(x1, "isin") if isinstance(x1, (Tensor, Expr)) else np.asarray(x1)
    b = np.asarray(x2)
    like = x1 if isinstance(x1, Tensor) else x1.eval() if isinstance(x1, Expr) else \
        (x2 if isinstance(x2, Tensor) else x2.eval())
    return _back(np.isin(a, b, invert=invert), like, DType.bool)


def _cumulative(x, axis, dtype, include_initial, op, fn, initial):
    a = _host(x, op)
    if axis is None:
        if x.ndim > 1:
            raise _kiln.InvalidArgument(f"{op}: x has {x.ndim} dimensions; give axis= (None is for 1-d)")
        axis = 0
    if x.ndim == 0:
        raise _kiln.InvalidArgument(f"{op}: x is 0-d; it needs 1 or more dimensions")
    ax = _axis(x, axis, op)
    dt = _dtypes.dtype(dtype) if dtype is not None else _accumulated(x._dtype)
    acc = fn(a.astype(_dtypes.host_dtype(dt)), axis=ax, dtype=_dtypes.host_dtype(dt))
    if include_initial:
        shape = list(acc.shape)
        shape[ax] = 1
        acc = np.concatenate([np.full(shape, initial, dtype=acc.dtype), acc], axis=ax)
    like = x if isinstance(x, Tensor) else x.eval()
    return _back(acc, like, dt)


def _accumulated(d):
    """The dtype kiln sums and multiplies d in: its own for floats, int64, uint32 and uint64, int32 (kiln's
    default integer) for the narrower integers and bool."""
    if d in (DType.float64, DType.float32, DType.float16, DType.bfloat16, DType.int64, DType.uint32,
             DType.uint64):
        return d
    return DType.int32


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
    """Running sums along axis (None: the only axis of a 1-d x), with a leading 0 when
    include_initial."""
    return _cumulative(x, axis, dtype, include_initial, "cumulative_sum", np.cumsum, 0)


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False):
    """Running products along axis (None: the only axis of a 1-d x), with a leading 1 when
    include_initial."""
    return _cumulative(x, axis, dtype, include_initial, "cumulative_prod", np.cumprod, 1)


class _UniqueCounts(tuple):
    def __new__(cls, values, counts):
        return super().__new__(cls, (values, counts))

    values = property(lambda self: self[0])
    counts = property(lambda self: self[1])


class _UniqueInverse(tuple):
    def __new__(cls, values, inverse_indices):
        return super().__new__(cls, (values, inverse_indices))

    values = property(lambda self: self[0])
    inverse_indices = property(lambda self: self[1])


class _UniqueAll(tuple):
    def __new__(cls, values, indices, inverse_indices, counts):
        return super().__new__(cls, (values, indices, inverse_indices, counts))

    values = property(lambda self: self[0])
    indices = property(lambda self: self[1])
    inverse_indices = property(lambda self: self[2])
    counts = property(lambda self: self[3])


def _is_mask(key):
    return isinstance(key, (Tensor, Expr)) and key._dtype == DType.bool


def _check_mask(x, mask, op):
    if tuple(mask.shape) != tuple(x.shape[:mask.ndim]):
        raise IndexError(f"{op}: a boolean index of shape {tuple(mask.shape)} for an array of shape {tuple(x.shape)}; "
                         "it must match the array's leading axes")


def mask_getitem(x, mask):
    """x[mask] for a boolean array matching x's leading axes: the selected elements (or
    sub-arrays), in row-major order, as a new tensor (a data-dependent shape: on the host)."""
    _check_mask(x, mask, "getitem")
    like = x if isinstance(x, Tensor) else x.eval()
    return _back(np.asarray(x)[np.asarray(mask)], like)


def mask_setitem(x, mask, value):
    """x[mask] = value: a value that broadcasts over one selected element (a scalar, or an
    array of the trailing axes' shape) is a fused `where` (no data-dependent shape); an array of
    one value per selected element goes through the host."""
    _check_mask(x, mask, "setitem")
    m = mask.reshape(tuple(mask.shape) + (1,) * (x.ndim - mask.ndim)) if mask.ndim else mask
    rest = tuple(x.shape[mask.ndim:])
    if not isinstance(value, (Tensor, Expr)) and np.ndim(value) > 0:   # host data (a list, a NumPy array)
        value = _creation.asarray(value, dtype=x._dtype, ctx=x.ctx)
    if not isinstance(value, (Tensor, Expr)) or _broadcasts(tuple(value.shape), rest):
        x[...] = _kiln.where(m, value, x)
        return
    h = np.asarray(x).copy()
    h[np.asarray(mask)] = np.asarray(value)
    x[...] = _creation.asarray(h, dtype=x._dtype, ctx=x.ctx)


def _broadcasts(shape, to):
    try:
        return np.broadcast_shapes(shape, to) == to
    except ValueError:
        return False


def host_getitem(x, key):
    """x[key] for a boolean mask or several integer arrays (the binding's __getitem__ sends these
    here)."""
    return mask_getitem(x, key) if _is_mask(key) else advanced_getitem(x, key)


def _is_array_index(k):
    return isinstance(k, (Tensor, Expr)) and k._dtype != DType.bool


def advanced_getitem(x, key):
    """x[key] for a key of several integer arrays (with integers, slices, None and ...), by
    NumPy's rules on a host copy, as a new tensor."""
    h = tuple(np.asarray(k) if _is_array_index(k) else k for k in key)
    like = x if isinstance(x, Tensor) else x.eval()
    return _back(np.asarray(x)[h], like)
