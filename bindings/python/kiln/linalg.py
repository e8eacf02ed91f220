"""The Array API's linalg extension, as far as it maps onto kiln's GEMM and fused reductions:
matmul, tensordot, vecdot, matrix_transpose, outer, diagonal, trace, vector_norm, matrix_norm
(Frobenius, 1, -1, inf, -inf) and cross are lazy expressions or GEMM calls. The decompositions
and solvers (cholesky, det, eig, eigh, inv, qr, solve, svd and the functions built on them) are
not kiln's: each raises NotImplementedError naming itself."""
import math

import numpy as np

from . import _creation, _kiln, _standard
from ._kiln import DType

matmul = _standard.matmul
tensordot = _standard.tensordot
vecdot = _standard.vecdot
matrix_transpose = _standard.matrix_transpose

_FLOATS = (DType.float64, DType.float32, DType.float16, DType.bfloat16)


def _need_matrix(x, op):
    if x.ndim < 2:
        raise _kiln.InvalidArgument(f"linalg.{op}: x has shape {tuple(x.shape)}; it needs 2 or more dimensions "
                                    "(the last two are the matrix)")


def _mask(x, offset):
    """True on diagonal `offset` of x's last two axes (0 the main one, > 0 above it)."""
    n = x.ndim
    return _kiln._iota(tuple(x.shape), n - 1) - _kiln._iota(tuple(x.shape), n - 2) == offset


@_creation._takes_arrays("x1", "x2")
def outer(x1, x2, /):
    """The outer product of two 1-d arrays (lazy): x1[i] * x2[j]."""
    if x1.ndim != 1 or x2.ndim != 1:
        raise _kiln.InvalidArgument(f"linalg.outer: shapes {tuple(x1.shape)} and {tuple(x2.shape)}; both are 1-d")
    return x1.reshape((x1.shape[0], 1)) * x2.reshape((1, x2.shape[0]))


@_creation._takes_arrays("x")
def diagonal(x, /, *, offset=0):
    """Diagonal `offset` of the last two axes (a gather of x's elements, as a new tensor)."""
    _need_matrix(x, "diagonal")
    offset = _creation._index(offset, "offset", "diagonal")
    rows, cols = x.shape[-2], x.shape[-1]
    first_row, first_col = max(0, -offset), max(0, offset)
    length = max(0, min(rows - first_row, cols - first_col))
    batch = tuple(x.shape[:-2])
    if length == 0:
        return _creation.empty(batch + (0,), x._dtype, ctx=x.ctx)
    flat = x.reshape(batch + (rows * cols,))
    index = (np.arange(length, dtype=np.int32) + first_row) * cols + first_col + np.arange(length, dtype=np.int32)
    return _kiln.take(flat, _creation.asarray(index, ctx=x.ctx), axis=-1)


@_creation._takes_arrays("x")
def trace(x, /, *, offset=0, dtype=None):
    """The sum of diagonal `offset` of the last two axes (a fused masked sum)."""
    _need_matrix(x, "trace")
    zero = False if x._dtype == DType.bool else 0
    r = _kiln.sum(_kiln.where(_mask(x, _creation._index(offset, "offset", "trace")), x, zero), axis=(-2, -1))
    return r if dtype is None else _kiln.astype(r, dtype)


@_creation._takes_arrays("x")
def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):  # noqa: A002 - the standard's name
    """The vector p-norm over axis (None: all of x): ord a number, inf or -inf (max/min of |x|),
    0 (how many are not zero). A fused reduction, in x's float dtype."""
    if x._dtype not in _FLOATS:
        raise _kiln.DTypeError(f"linalg.vector_norm: x is {x.dtype}; it takes float dtypes")
    a = _kiln.absolute(x)
    if ord == math.inf:
        return _kiln.max(a, axis=axis, keepdims=keepdims)
    if ord == -math.inf:
        return _kiln.min(a, axis=axis, keepdims=keepdims)
    if ord == 0:
        return _kiln.astype(_kiln.sum(x != 0, axis=axis, keepdims=keepdims), x._dtype)
    if ord == 1:
        return _kiln.sum(a, axis=axis, keepdims=keepdims)
    if ord == 2:
        return _kiln.sqrt(_kiln.sum(a * a, axis=axis, keepdims=keepdims))
    p = float(ord)
    return _kiln.power(_kiln.sum(_kiln.power(a, p), axis=axis, keepdims=keepdims), 1.0 / p)


@_creation._takes_arrays("x")
def matrix_norm(x, /, *, keepdims=False, ord="fro"):  # noqa: A002 - the standard's name
    """The matrix norm of the last two axes: 'fro', 1 / -1 (max / min column sum of |x|) and
    inf / -inf (max / min row sum). The 2-norms and the nuclear norm need singular values,
    which kiln does not compute."""
    _need_matrix(x, "matrix_norm")
    if x._dtype not in _FLOATS:
        raise _kiln.DTypeError(f"linalg.matrix_norm: x is {x.dtype}; it takes float dtypes")
    a = _kiln.absolute(x)
    if ord == "fro":
        return _kiln.sqrt(_kiln.sum(a * a, axis=(-2, -1), keepdims=keepdims))
    if ord in (1, -1, math.inf, -math.inf):
        along = -2 if ord in (1, -1) else -1   # column sums, or row sums
        sums = _kiln.sum(a, axis=along, keepdims=True).eval()
        pick = _kiln.max if ord in (1, math.inf) else _kiln.min
        other = -1 if along == -2 else -2
        r = pick(sums, axis=other, keepdims=True)
        return r if keepdims else r.reshape(tuple(x.shape[:-2]))
    if ord in (2, -2, "nuc"):
        raise NotImplementedError(f"linalg.matrix_norm: ord={ord!r} needs singular values, which kiln does not "
                                  "compute; 'fro', 1, -1, inf and -inf are supported")
    raise ValueError(f"linalg.matrix_norm: ord={ord!r}; valid: 'fro', 'nuc', 1, -1, 2, -2, inf, -inf")


@_creation._takes_arrays("x1", "x2")
def cross(x1, x2, /, *, axis=-1):
    """The cross product of 3-vectors along axis (lazy), the other axes broadcast."""
    n = max(x1.ndim, x2.ndim)
    ax = _creation._index(axis, "axis", "cross")
    if not -n <= ax < 0 and not 0 <= ax < n:
        raise _kiln.InvalidArgument(f"linalg.cross: axis {axis} is out of range for {n} dimensions")
    ax = ax - n if ax >= 0 else ax
    if x1.ndim < -ax or x2.ndim < -ax or x1.shape[ax] != 3 or x2.shape[ax] != 3:
        raise _kiln.InvalidArgument(f"linalg.cross: shapes {tuple(x1.shape)} and {tuple(x2.shape)}; both have 3 "
                                    f"elements along axis {axis}")

    def c(x, i):
        key = [slice(None)] * x.ndim
        key[x.ndim + ax] = slice(i, i + 1)
        return x[tuple(key)]

    parts = [c(x1, 1) * c(x2, 2) - c(x1, 2) * c(x2, 1), c(x1, 2) * c(x2, 0) - c(x1, 0) * c(x2, 2),
             c(x1, 0) * c(x2, 1) - c(x1, 1) * c(x2, 0)]
    return _creation.concat([p.eval() if hasattr(p, "eval") else p for p in parts], axis=ax)


@_creation._takes_arrays("x")
def matrix_power(x, n, /):
    """x multiplied by itself n times (n >= 0; n = 0 gives the identity), by repeated squaring
    with kiln's products. Negative n needs an inverse, which kiln does not compute."""
    _need_matrix(x, "matrix_power")
    n = _creation._index(n, "n", "matrix_power")
    if x.shape[-1] != x.shape[-2]:
        raise _kiln.InvalidArgument(f"linalg.matrix_power: x has shape {tuple(x.shape)}; the matrices are square")
    if n < 0:
        raise NotImplementedError("linalg.matrix_power: a negative power needs an inverse, which kiln does not compute")
    result = None
    base = x
    while True:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if not n:
            break
        base = matmul(base, base)
    if result is None:
        eye = _standard.eye(x.shape[-1], dtype=x._dtype, ctx=x.ctx)
        result = _standard.broadcast_to(eye, tuple(x.shape))
    return result if not hasattr(result, "eval") else result.eval()


def _not_kilns(name):
    def f(*args, **kwargs):
        raise NotImplementedError(f"linalg.{name}: not implemented by kiln (a decomposition or solver, which maps "
                                  "onto neither its GEMM nor its fused reductions)")
    f.__name__ = name
    f.__doc__ = f"Not implemented by kiln: raises NotImplementedError naming linalg.{name}."
    return f


cholesky = _not_kilns("cholesky")
det = _not_kilns("det")
eig = _not_kilns("eig")
eigh = _not_kilns("eigh")
eigvals = _not_kilns("eigvals")
eigvalsh = _not_kilns("eigvalsh")
inv = _not_kilns("inv")
matrix_rank = _not_kilns("matrix_rank")
pinv = _not_kilns("pinv")
qr = _not_kilns("qr")
slogdet = _not_kilns("slogdet")
solve = _not_kilns("solve")
svd = _not_kilns("svd")
svdvals = _not_kilns("svdvals")
