"""Host-side conveniences of kiln.Tensor and kiln.Expr: NumPy conversion (get, __array__),
printing, Python scalars, iteration, and assignment from host data. An Expr is evaluated
first: these are the places where "a value is needed"."""
import numpy as np

from . import _dtypes, _kiln
from ._kiln import Expr, Tensor


def _get(self):
    """A NumPy copy of the tensor (waits for pending work)."""
    dt = self._dtype
    out = np.empty(self.shape, dtype=_dtypes.host_dtype(dt))
    if out.size:
        self._download(out.ctypes.data, _dtypes.host_transfer_dtype(dt))
    return out


def _array(self, dtype=None, copy=None):
    if copy is False:
        if self.ctx.backend != "cpu":
            raise ValueError(f"np.asarray(copy=False): the tensor is in {self.device} memory; a host copy is needed")
        a = np.from_dlpack(self)
    else:
        a = self.get()
    return a if dtype is None else a.astype(dtype, copy=False)


def _repr(self):
    name = type(self).__name__
    dt = str(self.dtype)
    try:
        value = self.get()
    except _kiln.Error as e:
        return f"kiln.{name}(<{str(e).split(':', 1)[-1].strip()}>, shape={self.shape}, dtype={dt})"
    body = np.array2string(value, separator=", ", prefix=f"kiln.{name}(", threshold=1000)
    where = f", device='{self.device}'" if isinstance(self, Tensor) else ""
    return f"kiln.{name}({body}, dtype={dt}{where})"


def _str(self):
    return str(self.get())


def _item(self, *args):
    return self.get().item(*args)


def _tolist(self):
    return self.get().tolist()


def _iter_tensor(self):
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    for i in range(self.shape[0]):
        yield self[i]


def _iter_expr(self):
    return iter(self.eval())


def _scalar(kind):
    def convert(self):
        if self.size != 1:
            if kind is bool:
                raise ValueError(f"the truth value of a kiln value with {self.size} elements is ambiguous; "
                                 "use kiln.any/all on the host (np.asarray(x).any()) or compare explicitly")
            raise TypeError(f"only size-1 kiln values can be converted to Python {kind.__name__}s (size {self.size})")
        return kind(self.get().reshape(()).item())
    return convert


def _index(self):
    if self._dtype in (_kiln.DType.bool, _kiln.DType.float64, _kiln.DType.float32, _kiln.DType.float16,
                       _kiln.DType.bfloat16) or self.size != 1:
        raise TypeError("only size-1 integer kiln values can be used as an index")
    return int(self.get().reshape(()).item())


def _format(self, spec):
    if self.size == 1 and spec:
        return format(self.get().reshape(()).item(), spec)
    return format(str(self), spec)


def assign_host(target, value):
    """target[...] = host data (anything np.asarray takes), broadcast to target's shape."""
    a = np.asarray(value)
    if a.dtype == object:
        raise _kiln.DTypeError(f"assign: cannot assign {type(value).__name__} data of NumPy dtype object")
    if a.dtype.kind == "c":   # NumPy would drop the imaginary parts, with a warning only
        raise _kiln.DTypeError(f"assign: kiln cannot hold complex numbers (NumPy dtype {a.dtype.str!r})")
    from ._creation import exact_ints, upload, write_host

    a = exact_ints(value, a, target._dtype, "assign")

    if a.shape == tuple(target.shape):
        write_host(target, a)
        return
    target[...] = upload(a, dtype=target.dtype, ctx=target.ctx)


def _expr_value(method):
    def f(self, *args, **kwargs):
        return method(self.eval(), *args, **kwargs)
    f.__name__ = method.__name__
    f.__doc__ = method.__doc__
    return f


for _cls in (Tensor, Expr):
    _cls.__repr__ = _repr
    _cls.__str__ = _str
    _cls.__float__ = _scalar(float)
    _cls.__int__ = _scalar(int)
    _cls.__bool__ = _scalar(bool)
    _cls.__complex__ = _scalar(complex)
    _cls.__index__ = _index
    _cls.__format__ = _format
    _cls.item = _item
    _cls.tolist = _tolist

Tensor.get = _get
Tensor.hist = lambda self, tag: _kiln.hist(self, tag)   # neon's Tensor.hist(tag)
Tensor.name = property(lambda self: _kiln.hist_tag(self) or None,
                       lambda self, tag: _kiln.set_hist_tag(self, "" if tag is None else str(tag)),
                       doc="neon's tensor name: the histogram tag of its memory (kiln.set_hist_tag), or None.")
Tensor.__array__ = _array
Tensor.__iter__ = _iter_tensor
Expr.get = _expr_value(_get)
Expr.__array__ = _expr_value(_array)
Expr.__iter__ = _iter_expr
Expr.__dlpack__ = _expr_value(Tensor.__dlpack__)
Expr.__dlpack_device__ = lambda self: (2, int(self.ctx.device[5:])) if self.ctx.backend == "cuda" else (1, 0)
Expr.device = property(lambda self: self.ctx.device)
