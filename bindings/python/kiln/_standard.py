"""Array API standard functions that are compositions of kiln's own: dtype queries (isdtype,
can_cast), the matrix creators (eye, tril, triu, linspace, meshgrid), axis manipulation
(permute_dims, matrix_transpose, moveaxis, flip, roll, unstack) and a few elementwise names
(positive, pow, round; conj, real and imag of kiln's real dtypes). Each returns what its parts do: views where kiln slices or transposes,
lazy expressions that fuse into the assignment using them, new tensors where data is joined."""
import math

import numpy as np

from . import _creation, _dtypes, _kiln
from ._kiln import DType, Expr, Tensor

_KIND_OF = {DType.bool: "bool", DType.int8: "signed integer", DType.int16: "signed integer",
            DType.int32: "signed integer", DType.int64: "signed integer", DType.uint8: "unsigned integer",
            DType.uint16: "unsigned integer", DType.uint32: "unsigned integer",
            DType.uint64: "unsigned integer", DType.float64: "real floating",
            DType.float32: "real floating", DType.float16: "real floating", DType.bfloat16: "real floating"}
_KINDS = {"bool": ("bool",), "signed integer": ("signed integer",), "unsigned integer": ("unsigned integer",),
          "integral": ("signed integer", "unsigned integer"), "real floating": ("real floating",),
          "complex floating": (), "numeric": ("signed integer", "unsigned integer", "real floating")}


def isdtype(dtype, kind):
    """Whether dtype is of kind: a dtype, one of the standard's kind names ('bool', 'signed
    integer', 'unsigned integer', 'integral', 'real floating', 'complex floating', 'numeric'),
    or a tuple of either."""
    d = _dtypes.dtype(dtype)
    if isinstance(kind, tuple):
        return any(isdtype(d, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"isdtype: kind={kind!r}; the kinds are {', '.join(repr(k) for k in _KINDS)}")
        return _KIND_OF[d] in _KINDS[kind]
    return d == _dtypes.dtype(kind)


def can_cast(from_, to):
    """Whether the standard's promotion lattice takes from_ (a dtype or an array) to `to`: within
    bool, within the integers (an unsigned one to a wider signed one too) or within the floats,
    `to` being the promoted dtype of the two."""
    f = from_._dtype if isinstance(from_, (Tensor, Expr)) else _dtypes.dtype(from_)
    t = _dtypes.dtype(to)
    if f == t:
        return True
    family = {"bool": 0, "signed integer": 1, "unsigned integer": 1, "real floating": 2}
    if family[_KIND_OF[f]] != family[_KIND_OF[t]]:
        return False
    return _kiln._promote(f, t) == t


def eye(n_rows, n_cols=None, k=0, dtype=None, ctx=None, *, device=None):
    """A 2-d tensor with ones on diagonal k (0 the main one, > 0 above it) and zeros elsewhere."""
    n, m = _creation._index(n_rows, "n_rows", "eye"), _creation._index(n_rows if n_cols is None else n_cols, "n_cols", "eye")
    k = _creation._index(k, "k", "eye")
    if n < 0 or m < 0:
        raise _kiln.InvalidArgument(f"eye: n_rows={n}, n_cols={m}; sizes are 0 or more")
    c = _creation._ctx(ctx, device, "eye")
    t = _creation.empty((n, m), dtype, ctx=c)
    if t.size:
        t[...] = _kiln._iota((n, m), 1) - _kiln._iota((n, m), 0) == k
    return t


def _triangle(x, k, keep_below, op):
    if x.ndim < 2:
        raise _kiln.InvalidArgument(f"{op}: x has shape {tuple(x.shape)}; it needs 2 or more dimensions (the last two "
                                    "are the matrix)")
    k = _creation._index(k, "k", op)
    col_minus_row = _kiln._iota(tuple(x.shape), x.ndim - 1) - _kiln._iota(tuple(x.shape), x.ndim - 2)
    keep = col_minus_row <= k if keep_below else col_minus_row >= k
    return _kiln.where(keep, x, False if x._dtype == DType.bool else 0)   # a weak 0 keeps x's dtype


@_creation._takes_arrays("x")
def tril(x, k=0):
    """x with the elements above diagonal k of its last two dimensions zeroed (lazy)."""
    return _triangle(x, k, True, "tril")


@_creation._takes_arrays("x")
def triu(x, k=0):
    """x with the elements below diagonal k of its last two dimensions zeroed (lazy)."""
    return _triangle(x, k, False, "triu")


def linspace(start, stop, num, dtype=None, ctx=None, *, device=None, endpoint=True):
    """num evenly spaced values from start to stop (stop included unless endpoint=False),
    computed on the device."""
    num = _creation._index(num, "num", "linspace")
    if num < 0:
        raise _kiln.InvalidArgument(f"linspace: num={num}; it is 0 or more")
    if not all(math.isfinite(v) for v in (start, stop)):
        raise _kiln.InvalidArgument(f"linspace: start and stop must be finite, got {start}, {stop}")
    c = _creation._ctx(ctx, device, "linspace")
    dt = _dtypes.dtype(dtype) if dtype is not None else c._default_dtype
    t = _creation.empty((num,), dt, ctx=c)
    if num:
        div = (num - 1) if endpoint else num
        step = (stop - start) / div if div > 0 else 0.0
        t[...] = _kiln.astype(_kiln._iota((num,), 0), dt) * step + start
        if endpoint and num > 1:
            t[num - 1] = stop
    return t


def meshgrid(*arrays, indexing="xy"):
    """Coordinate tensors from 1-d tensors, one per input, each of the shape all of them span
    ('xy': the first two axes swapped, as NumPy's default; 'ij': matrix indexing), as a tuple."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing={indexing!r}; it is 'xy' or 'ij'")
    _creation._each_array(arrays, "meshgrid")
    for i, a in enumerate(arrays):
        if a.ndim != 1:
            raise _kiln.InvalidArgument(f"meshgrid: array {i} has shape {tuple(a.shape)}; every one is 1-d")
    if arrays and len({a._dtype for a in arrays}) > 1:
        raise _kiln.DTypeError(f"meshgrid: the arrays' dtypes differ ({', '.join(str(a.dtype) for a in arrays)}); "
                               "the standard asks for one")
    sizes = [a.shape[0] for a in arrays]
    if indexing == "xy" and len(arrays) > 1:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for i, a in enumerate(arrays):
        axis = i
        if indexing == "xy" and len(arrays) > 1 and i < 2:
            axis = 1 - i
        shape = [1] * len(arrays)
        shape[axis] = sizes[axis]
        t = _creation.empty(tuple(sizes), a._dtype, ctx=a.ctx)
        if t.size:
            t[...] = a.reshape(tuple(shape))
        out.append(t)
    return tuple(out)


def _axes(x, axes, op):
    n = x.ndim
    out = []
    for a in axes:
        a = _creation._index(a, "axis", op)
        if not -n <= a < n:
            raise _kiln.InvalidArgument(f"{op}: axis {a} is out of range for {n} dimensions")
        out.append(a % n)
    if len(set(out)) != len(out):
        raise _kiln.InvalidArgument(f"{op}: repeated axes {tuple(axes)}")
    return out


@_creation._takes_arrays("x")
def permute_dims(x, axes):
    """x with its axes in the order `axes` (a view of a tensor, lazy for an expression)."""
    axes = _creation._shape(axes, "permute_dims", "axes")
    if len(axes) != x.ndim:
        raise _kiln.InvalidArgument(f"permute_dims: axes {axes} for {x.ndim} dimensions; give each axis once")
    return x.transpose(tuple(_axes(x, axes, "permute_dims")))


@_creation._takes_arrays("x")
def matrix_transpose(x):
    """x with its last two axes swapped."""
    if x.ndim < 2:
        raise _kiln.InvalidArgument(f"matrix_transpose: x has shape {tuple(x.shape)}; it needs 2 or more dimensions")
    order = list(range(x.ndim))
    order[-2], order[-1] = order[-1], order[-2]
    return x.transpose(tuple(order))


def moveaxis(x, source, destination):
    """x with axes `source` moved to positions `destination` (ints or tuples of them), the
    others keeping their order."""
    src = _axes(x, source if isinstance(source, tuple) else (source,), "moveaxis")
    dst = _axes(x, destination if isinstance(destination, tuple) else (destination,), "moveaxis")
    if len(src) != len(dst):
        raise _kiln.InvalidArgument(f"moveaxis: {len(src)} source axes and {len(dst)} destinations")
    order = [a for a in range(x.ndim) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return x.transpose(tuple(order))


@_creation._takes_arrays("x")
def flip(x, axis=None):
    """x with the order of its elements reversed along axis (None: every axis): a view of a
    tensor."""
    axes = range(x.ndim) if axis is None else _axes(x, axis if isinstance(axis, tuple) else (axis,), "flip")
    index = [slice(None)] * x.ndim
    for a in axes:
        index[a] = slice(None, None, -1)
    if isinstance(x, Expr):
        x = x.eval()
    return x[tuple(index)]


@_creation._takes_arrays("x")
def roll(x, shift, axis=None):
    """A new tensor of x's elements shifted by `shift` along axis (None: the flattened tensor,
    reshaped back), those pushed past the end coming back at the start."""
    if axis is None:
        flat = x.reshape((x.size,))
        return roll(flat, shift, 0).reshape(tuple(x.shape))
    axes = _axes(x, axis if isinstance(axis, tuple) else (axis,), "roll")
    shifts = shift if isinstance(shift, tuple) else (shift,) * len(axes)
    if len(shifts) != len(axes):
        raise _kiln.InvalidArgument(f"roll: {len(shifts)} shifts for {len(axes)} axes")
    out = x
    for a, s in zip(axes, shifts):
        n = x.shape[a]
        s = _creation._index(s, "shift", "roll") % n if n else 0
        if s == 0:
            continue
        head = [slice(None)] * x.ndim
        tail = [slice(None)] * x.ndim
        head[a], tail[a] = slice(n - s, None), slice(None, n - s)
        t = out.eval() if isinstance(out, Expr) else out
        out = _creation.concat([t[tuple(head)], t[tuple(tail)]], axis=a)
    return out if out is not x else x.copy() if isinstance(x, Tensor) else x


@_creation._takes_arrays("x")
def unstack(x, axis=0):
    """The slices of x along axis, as a tuple (views of a tensor)."""
    (a,) = _axes(x, (axis,), "unstack")
    if isinstance(x, Expr):
        x = x.eval()
    index = [slice(None)] * x.ndim
    out = []
    for i in range(x.shape[a]):
        index[a] = i
        out.append(x[tuple(index)])
    return tuple(out)


def _operand(x, dtype):
    """x as a tensor of dtype (expressions evaluated, other dtypes cast): GEMM operands."""
    if isinstance(x, Expr) or x._dtype != dtype:
        return _kiln.astype(x, dtype).eval()
    return x


@_creation._takes_arrays("x1", "x2")
def matmul(x1, x2):
    """The matrix product of the last two axes (kiln's GEMM), the leading ones broadcast as
    batches; a 1-d operand is a row (first) or a column (second) vector whose axis is dropped.
    Both operands go to their common dtype; GEMM takes float32, float16 and bfloat16, and the
    other dtypes (float64, the integers) are a fused sum of products, lazy, in their own
    arithmetic."""
    if x1.ndim == 0 or x2.ndim == 0:
        raise _kiln.InvalidArgument(f"matmul: operands of shapes {tuple(x1.shape)} and {tuple(x2.shape)}; 0-d ones "
                                    "have no matrix axes (multiply scales by a scalar)")
    dt = _dtypes.dtype(_creation.result_type(x1, x2))
    a, b = _operand(x1, dt), _operand(x2, dt)
    k1, k2 = a.shape[-1], b.shape[0] if b.ndim == 1 else b.shape[-2]
    if k1 != k2:
        raise _kiln.InvalidArgument(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not chain: {k1} "
                                    f"columns against {k2} rows")
    if dt not in (DType.float32, DType.float16, DType.bfloat16):
        a2 = a.reshape((1,) + tuple(a.shape)) if a.ndim == 1 else a
        b2 = b.reshape(tuple(b.shape) + (1,)) if b.ndim == 1 else b
        prod = _kiln.sum(_creation.expand_dims(a2, -1) * _creation.expand_dims(b2, -3), axis=-2, keepdims=False)
        if a.ndim == 1:
            prod = _creation.squeeze(prod, -2)
        if b.ndim == 1:
            prod = _creation.squeeze(prod, -1)
        return _kiln.astype(prod, dt) if prod.dtype != dt else prod
    if a.ndim <= 2 and b.ndim <= 2:
        return _kiln.dot(a, b)
    a2 = a.reshape((1,) + tuple(a.shape)) if a.ndim == 1 else a
    b2 = b.reshape(tuple(b.shape) + (1,)) if b.ndim == 1 else b
    try:
        batch = tuple(np.broadcast_shapes(tuple(a2.shape[:-2]), tuple(b2.shape[:-2])))
    except ValueError:
        raise _kiln.InvalidArgument(f"matmul: the batch axes of {tuple(a.shape)} and {tuple(b.shape)} do not "
                                    "broadcast") from None
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    nb = math.prod(batch)

    def batched(t, rows, cols):
        # A 2-d operand is shared by every batch; others are broadcast into a (batch, rows, cols) tensor.
        if t.ndim == 2:
            return t
        if tuple(t.shape[:-2]) == batch:
            return t.reshape((nb, rows, cols))
        full = _creation.empty(batch + (rows, cols), dt, ctx=t.ctx)
        full[...] = t
        return full.reshape((nb, rows, cols))

    out = _creation.empty((nb, m, n), dt, ctx=a.ctx)
    if out.size:
        if k == 0:
            out[...] = 0
        else:
            _kiln.batched_dot(batched(a2, m, k), batched(b2, k, n), out)
    shape = batch + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    return out.reshape(shape)


@_creation._takes_arrays("x1", "x2")
def vecdot(x1, x2, axis=-1):
    """The dot product of the vectors along axis (of the broadcast shape; both operands must
    have it, of one length), the other axes broadcast: lazy, a sum of products."""
    n = max(x1.ndim, x2.ndim)
    ax = _creation._index(axis, "axis", "vecdot")
    if not -n <= ax < n:
        raise _kiln.InvalidArgument(f"vecdot: axis {axis} is out of range for {n} dimensions")
    ax = ax - n if ax >= 0 else ax
    if x1.ndim < -ax or x2.ndim < -ax or x1.shape[ax] != x2.shape[ax]:
        raise _kiln.InvalidArgument(f"vecdot: shapes {tuple(x1.shape)} and {tuple(x2.shape)} differ along axis {axis}")
    r = _kiln.sum(x1 * x2, axis=ax)
    dt = _dtypes.dtype(_creation.result_type(x1, x2))
    return r if r._dtype == dt else _kiln.astype(r, dt)


@_creation._takes_arrays("x1", "x2")
def tensordot(x1, x2, axes=2):
    """Sums of products over axes of x1 and x2 (an int: x1's last ones and x2's first ones; or
    two sequences), through kiln's GEMM: the result has x1's other axes, then x2's."""
    if isinstance(axes, (int, np.integer)):
        n = _creation._index(axes, "axes", "tensordot")
        if n < 0 or n > min(x1.ndim, x2.ndim):
            raise _kiln.InvalidArgument(f"tensordot: axes={n} for operands of {x1.ndim} and {x2.ndim} dimensions")
        a_axes, b_axes = list(range(x1.ndim - n, x1.ndim)), list(range(n))
    else:
        if not isinstance(axes, (list, tuple)) or len(axes) != 2:
            raise _kiln.DTypeError(f"tensordot: axes={axes!r}; it is an int or a pair (x1's axes, x2's axes)")
        a_axes, b_axes = (list(v) if isinstance(v, (list, tuple)) else [v] for v in axes)
        if len(a_axes) != len(b_axes):
            raise _kiln.InvalidArgument(f"tensordot: {len(a_axes)} axes of x1 against {len(b_axes)} of x2")
        a_axes, b_axes = _axes(x1, a_axes, "tensordot"), _axes(x2, b_axes, "tensordot")
    for i, j in zip(a_axes, b_axes):
        if x1.shape[i] != x2.shape[j]:
            raise _kiln.InvalidArgument(f"tensordot: axis {i} of {tuple(x1.shape)} and axis {j} of {tuple(x2.shape)} "
                                        "differ in length")
    a_free = [i for i in range(x1.ndim) if i not in a_axes]
    b_free = [i for i in range(x2.ndim) if i not in b_axes]
    dt = _dtypes.dtype(_creation.result_type(x1, x2))
    a, b = _operand(x1, dt), _operand(x2, dt)
    k = math.prod(a.shape[i] for i in a_axes)
    m, n = math.prod(a.shape[i] for i in a_free), math.prod(b.shape[i] for i in b_free)
    shape = tuple(a.shape[i] for i in a_free) + tuple(b.shape[i] for i in b_free)
    am = a.transpose(tuple(a_free + a_axes)).reshape((m, k))
    bm = b.transpose(tuple(b_axes + b_free)).reshape((k, n))
    if m * n == 0 or k == 0:
        return _creation.zeros(shape, dt, ctx=a.ctx)
    return matmul(am, bm).reshape(shape)   # (the GEMM, or a sum of products for the other dtypes)


def broadcast_to(x, shape):
    """x broadcast to shape, lazily (an expression: nothing is copied until it is assigned)."""
    shape = _creation._shape(shape, "broadcast_to")
    try:
        ok = tuple(np.broadcast_shapes(tuple(x.shape), shape)) == shape
    except ValueError:
        ok = False
    if not ok:
        raise _kiln.InvalidArgument(f"broadcast_to: shape {tuple(x.shape)} does not broadcast to {shape}")
    if tuple(x.shape) == shape:
        return x
    if not shape:
        return x
    return _kiln.where(_kiln._iota(shape, 0) >= 0, x, x)


def broadcast_arrays(*arrays):
    """The arrays broadcast to their common shape (lazily), as a tuple."""
    _creation._each_array(arrays, "broadcast_arrays")
    try:
        shape = tuple(np.broadcast_shapes(*(tuple(a.shape) for a in arrays)))
    except ValueError:
        raise _kiln.InvalidArgument("broadcast_arrays: shapes " + ", ".join(str(tuple(a.shape)) for a in arrays) +
                                    " do not broadcast together") from None
    return tuple(broadcast_to(a, shape) for a in arrays)


def broadcast_shapes(*shapes):
    """The shape that arrays of the given shapes broadcast to together."""
    try:
        return tuple(np.broadcast_shapes(*(_creation._shape(s, "broadcast_shapes") for s in shapes)))
    except ValueError:
        raise _kiln.InvalidArgument("broadcast_shapes: shapes " + ", ".join(str(s) for s in shapes) +
                                    " do not broadcast together") from None


def clip(x, /, min=None, max=None, out=None, *, a_min=None, a_max=None):  # noqa: A002 - the standard's names
    """x limited to [min, max] (either may be None: no bound there; a bound is a scalar or an
    array broadcast against x), of x's dtype. NumPy's a_min= and a_max= name the same bounds."""
    x = _array(x, "clip")
    lo = min if min is not None else a_min
    hi = max if max is not None else a_max
    if lo is None and hi is None:
        r = _kiln.astype(x, x._dtype)
    else:
        r = _kiln.clip(x, lo, hi)
        if r._dtype != x._dtype:
            r = _kiln.astype(r, x._dtype)
    if out is not None:
        out[...] = r
        return out
    return r


def count_nonzero(x, axis=None, keepdims=False):
    """How many elements are not zero (NaN counts), over axis (None: all), as int32."""
    return _kiln.sum(x != 0, axis=axis, keepdims=keepdims)


def _check_elements(op, shape):
    """Refuses a result past kiln's element limit (2^60) before building it."""
    count = 1
    for d in shape:
        count *= d
    if count > 2**60:
        raise _kiln.InvalidArgument(f"{op}: the result {shape} has {count} elements; a kiln tensor has at most 2^60")


def tile(x, repetitions):
    """A new tensor of x repeated `repetitions` times along each axis (more repetitions than
    axes prepend axes of length 1 to x)."""
    reps = _creation._shape(repetitions, "tile", "repetitions")
    if any(r < 0 for r in reps):
        raise _kiln.InvalidArgument(f"tile: repetitions {reps}; each is 0 or more")
    n = max(len(reps), x.ndim)
    reps = (1,) * (n - len(reps)) + reps
    _check_elements("tile", tuple(d * r for d, r in zip((1,) * (n - x.ndim) + tuple(x.shape), reps)))
    t = x.reshape((1,) * (n - x.ndim) + tuple(x.shape))
    if isinstance(t, Expr):
        t = t.eval()
    joined = False
    for axis, r in enumerate(reps):
        if r != 1:
            t = _creation.concat([t] * r, axis=axis) if r else t[(slice(None),) * axis + (slice(0, 0),)]
            joined = joined or r > 1
    return t if joined else t.copy()   # a new tensor, as when it is joined


@_creation._takes_arrays("x")
def repeat(x, repeats, axis=None):
    """Each element of x repeated along axis (None: of the flattened tensor), `repeats` times (an
    int) or repeats[i] times for element i (an array or sequence): a gather (lazy)."""
    if axis is None:
        x = x.reshape((x.size,))
        axis = 0
    (a,) = _axes(x, (axis,), "repeat")
    n = x.shape[a]
    if isinstance(repeats, (int, np.integer)):
        r = _creation._index(repeats, "repeats", "repeat")
        if r < 0:
            raise _kiln.InvalidArgument(f"repeat: repeats={r}; it is 0 or more")
        _check_elements("repeat", (n * r,))
        index = np.repeat(np.arange(n, dtype=np.int32), r)
    else:
        counts = np.asarray(repeats)
        if counts.shape == (1,):   # one count for every element (it broadcasts)
            counts = np.broadcast_to(counts, (n,))
        if counts.dtype.kind not in "iu" or counts.shape != (n,) or (counts < 0).any():
            raise _kiln.InvalidArgument(f"repeat: repeats must be one count of 0 or more per element along axis {a} "
                                        f"({n} of them), got shape {counts.shape} of {counts.dtype}")
        _check_elements("repeat", (sum(int(c) for c in counts.tolist()),))
        index = np.repeat(np.arange(n, dtype=np.int32), counts)
    if index.size == 0:
        shape = list(x.shape)
        shape[a] = 0
        return _creation.empty(tuple(shape), x._dtype, ctx=x.ctx)
    return _kiln.take(x, _creation.asarray(index, ctx=x.ctx), axis=a)


@_creation._takes_arrays("x")
def diff(x, axis=-1, n=1, prepend=None, append=None):
    """The n-th forward difference along axis (prepend/append joined first)."""
    (a,) = _axes(x, (axis,), "diff")
    n = _creation._index(n, "n", "diff")
    if n < 0:
        raise _kiln.InvalidArgument(f"diff: n={n}; it is 0 or more")
    if prepend is not None or append is not None:
        parts = [p for p in (prepend, x, append) if p is not None]
        x = _creation.concat(parts, axis=a)
    elif isinstance(x, Expr):
        x = x.eval()
    for _ in range(min(n, x.shape[a])):   # (past the axis's length every difference is empty)
        lo, hi = [slice(None)] * x.ndim, [slice(None)] * x.ndim
        lo[a], hi[a] = slice(None, -1), slice(1, None)
        x = _kiln.subtract(x[tuple(hi)], x[tuple(lo)]).eval() if x.shape[a] > 1 else \
            _creation.empty(tuple(x.shape[:a]) + (0,) + tuple(x.shape[a + 1:]), x._dtype, ctx=x.ctx)
    return x


@_creation._takes_arrays("x", "indices")
def take_along_axis(x, indices, axis=-1):
    """x's elements at `indices` along axis (negative ones count from the end), the other axes
    matched position by position (broadcast where one has length 1): a gather (lazy)."""
    if indices.ndim != x.ndim:
        raise _kiln.InvalidArgument(f"take_along_axis: indices of shape {tuple(indices.shape)} for x of shape "
                                    f"{tuple(x.shape)}; they need as many dimensions")
    if not isdtype(indices._dtype, "integral"):
        raise _kiln.DTypeError(f"take_along_axis: indices are {indices.dtype}; they are integers")
    (a,) = _axes(x, (axis,), "take_along_axis")
    xs = list(x.shape)
    xs[a] = indices.shape[a]
    try:
        shape = tuple(np.broadcast_shapes(tuple(xs), tuple(indices.shape)))
    except ValueError:
        raise _kiln.InvalidArgument(f"take_along_axis: indices of shape {tuple(indices.shape)} do not match x of "
                                    f"shape {tuple(x.shape)} outside axis {a}") from None
    if any(s != d for i, (s, d) in enumerate(zip(shape, x.shape)) if i != a and d != 1):
        raise _kiln.InvalidArgument(f"take_along_axis: indices of shape {tuple(indices.shape)} reach past x of "
                                    f"shape {tuple(x.shape)} outside axis {a}")
    if isinstance(x, Expr) or not x.is_contiguous:
        x = x.copy() if isinstance(x, Tensor) else x.eval()
    # Negative indices count from the end; out-of-range ones are clipped into [0, n), as take
    # clips them (never into another row), in the indices' own width before the int32 cast.
    n = x.shape[a]
    if indices._dtype == DType.uint64:
        idx = _kiln.minimum(indices, n - 1)
    else:
        idx = indices if indices._dtype == DType.int64 else _kiln.astype(indices, DType.int64)
        idx = _kiln.clip(_kiln.where(idx < 0, idx + n, idx), 0, n - 1)
    idx = _kiln.astype(idx, DType.int32)
    linear = None
    stride = 1
    for d in reversed(range(x.ndim)):
        coord = idx if d == a else (_kiln._iota(shape, d) if x.shape[d] != 1 else None)
        if coord is not None:
            term = coord * stride if stride != 1 else coord
            linear = term if linear is None else linear + term
        stride *= x.shape[d]
    if linear is None:
        linear = _kiln._iota(shape, 0) * 0 if shape else _creation.zeros((), DType.int32, ctx=x.ctx)
    return _kiln.take(x.reshape((x.size,)), linear)


def logaddexp(x1, x2):
    """log(exp(x1) + exp(x2)) without overflow (lazy): the larger plus log1p(exp(-|x1 - x2|)),
    and x1 + log(2) where the two are equal (both infinities of one sign included)."""
    big = _kiln.maximum(x1, x2)
    return _kiln.where(x1 == x2, x1 + math.log(2.0), big + _kiln.log1p(_kiln.exp(-_kiln.abs(x1 - x2))))


def _array(x, op):
    """A unary function's operand: a tensor or expression as it is, a Python or NumPy scalar as a
    0-d tensor (as NumPy's functions take them)."""
    if isinstance(x, (Tensor, Expr)):
        return x
    if isinstance(x, (bool, int, float, np.generic)):
        return _creation.asarray(x)
    raise TypeError(f"{op}: x is of type {type(x).__name__}; it is a kiln Tensor or Expr, or a scalar "
                    "(kiln.asarray converts other values)")


def positive(x):
    """+x: x's values, lazily (numeric dtypes)."""
    x = _array(x, "positive")
    if x._dtype == DType.bool:
        raise _kiln.DTypeError("positive: x is bool; positive takes numeric dtypes")
    return _kiln.astype(x, x._dtype)


def conj(x):
    """The complex conjugate: for kiln's real dtypes (it has no complex ones) x's values, lazily."""
    x = _array(x, "conj")
    if x._dtype == DType.bool:
        raise _kiln.DTypeError("conj: x is bool; conj takes numeric dtypes")
    return _kiln.astype(x, x._dtype)


def real(x):
    """The real component: for kiln's real dtypes (it has no complex ones) x's values, lazily."""
    x = _array(x, "real")
    if x._dtype == DType.bool:
        raise _kiln.DTypeError("real: x is bool; real takes numeric dtypes")
    return _kiln.astype(x, x._dtype)


def imag(x):
    """The imaginary component: for kiln's real dtypes (it has no complex ones) zeros of x's shape
    and dtype, as NumPy's imag of a real array."""
    x = _array(x, "imag")
    if x._dtype == DType.bool:
        raise _kiln.DTypeError("imag: x is bool; imag takes numeric dtypes")
    return _creation.zeros_like(x)


def pow(x1, x2):  # noqa: A001 - the standard's name
    """x1 ** x2 (kiln.power)."""
    return _kiln.power(x1, x2)


def round(x):  # noqa: A001 - the standard's name
    """x rounded to the nearest integer, ties to even (kiln.rint); integers and bools unchanged
    (of their own dtype)."""
    x = _array(x, "round")
    if x._dtype not in (DType.float64, DType.float32, DType.float16, DType.bfloat16):
        return _kiln.astype(x, x._dtype)
    return _kiln.rint(x)


e = math.e
inf = math.inf
nan = math.nan
pi = math.pi
newaxis = None
