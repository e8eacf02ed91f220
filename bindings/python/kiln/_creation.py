"""Tensor factories with NumPy's spellings (array, asarray, zeros, arange, ...), host data in,
and zero-copy import from other libraries (DLPack, __cuda_array_interface__)."""
import functools
import inspect
import math
import operator

import numpy as np

from . import _dtypes, _kiln
from ._kiln import DType, Expr, Tensor

_INTEGERS = (DType.int64, DType.int32, DType.int16, DType.int8, DType.uint64, DType.uint32, DType.uint16, DType.uint8)


_MISSING = object()


def _array_type_error(op, name, value):
    return _kiln.DTypeError(f"{op}: {name} is of type {type(value).__name__}; it is a kiln Tensor or Expr "
                            "(kiln.asarray converts other values)")


def _takes_arrays(*names):
    """Decorator: the parameters `names` are kiln arrays (Tensor or Expr). Anything else is a
    DTypeError naming the function, the parameter and its type, raised before the body would fail
    on an attribute of it."""
    def wrap(fn):
        params = list(inspect.signature(fn).parameters)
        where = [(params.index(n), n) for n in names]
        op = fn.__name__

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            for i, n in where:
                v = args[i] if i < len(args) else kwargs.get(n, _MISSING)
                if v is not _MISSING and not isinstance(v, (Tensor, Expr)):
                    raise _array_type_error(op, n, v)
            return fn(*args, **kwargs)
        return checked
    return wrap


def _each_array(arrays, op):
    """The operands of a function of *arrays, each a kiln Tensor or Expr (else a DTypeError)."""
    for i, a in enumerate(arrays):
        if not isinstance(a, (Tensor, Expr)):
            raise _kiln.DTypeError(f"{op}: arrays[{i}] is of type {type(a).__name__}; every one is a kiln Tensor or "
                                   "Expr (kiln.asarray converts other values)")
    return arrays


def _ctx(ctx, device=None, op=None, of=None):
    """The context an operation makes its arrays in: ctx, or the one for the Array API's device=
    (_context.device_context; a device that is kiln array `of`'s own is its context), else the
    default context. A ctx that is not a kiln.Context is a DTypeError naming op."""
    if ctx is not None and not isinstance(ctx, _kiln._Context):
        raise _kiln.DTypeError(f"{op or 'ctx'}: ctx is of type {type(ctx).__name__}; it must be a kiln.Context, or None "
                               "for the default context")
    if device is not None and ctx is None and isinstance(of, (Tensor, Expr)) and device == of.device:
        return of.ctx
    if device is not None:
        from ._context import device_context

        return device_context(device, op, ctx)
    if ctx is None:
        from ._context import default_context

        return default_context()
    return ctx


def _is_int(v):
    """A Python or NumPy integer: not a bool, not a float."""
    return hasattr(type(v), "__index__") and not isinstance(v, (bool, np.bool_))


def _index(v, name, op):
    """An int argument (_is_int); a DTypeError naming op, the parameter and the type for anything else."""
    if not _is_int(v):
        raise _kiln.DTypeError(f"{op}: {name} must be an int, got {type(v).__name__}")
    return operator.index(v)


def _shape(shape, op="shape", name="shape"):
    """A shape argument: an int or a sequence of ints (a float, even 2.0, is an error, as in NumPy)."""
    if _is_int(shape):
        return (operator.index(shape),)
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise _kiln.DTypeError(f"{op}: {name} must be an int or a sequence of ints, got {type(shape).__name__}")
    dims = tuple(shape)
    for d in dims:
        if not _is_int(d):
            raise _kiln.DTypeError(f"{op}: {name} must be an int or a sequence of ints; {dims!r} holds a {type(d).__name__}")
    return tuple(operator.index(d) for d in dims)


def exact_ints(obj, a, dt, op="array"):
    """a = np.asarray(obj), re-read where NumPy made float64 of Python ints past int64 (which
    rounds them) and kiln dtype dt is a 64-bit integer: as that dtype, exactly. Values beyond it
    raise InvalidArgument; data with NaN keeps the float path."""
    if a.dtype.kind != "f" or dt not in (DType.int64, DType.uint64) or isinstance(obj, np.ndarray):
        return a
    host = _dtypes.host_dtype(dt)
    try:
        return np.asarray(obj, dtype=host)
    except OverflowError:
        info = np.iinfo(host)
        raise _kiln.InvalidArgument(
            f"{op}: values of the {type(obj).__name__} do not fit {host.name} (range [{info.min}, {info.max}])"
        ) from None
    except ValueError:
        return a


def upload(obj, dtype=None, ctx=None, default_float=None):
    """A new tensor holding host data (anything np.asarray takes), converted to dtype."""
    ctx = _ctx(ctx, op="asarray")
    a = np.asarray(obj)
    if a.dtype == object:
        raise _kiln.DTypeError(f"array: cannot make a tensor from {type(obj).__name__} data of NumPy dtype object")
    if dtype is None:
        dt = _dtypes.from_host(a.dtype)
        if a.dtype.kind == "f" and default_float is not None:
            dt = default_float
    else:
        dt = _dtypes.dtype(dtype)
    host = _dtypes.host_dtype(dt)
    a = exact_ints(obj, a, dt)
    if a.dtype != host:
        if dt in _INTEGERS and a.dtype.kind in "iu" and a.size:
            info = np.iinfo(host)
            lo, hi = a.min(), a.max()
            if lo < info.min or hi > info.max:
                raise _kiln.InvalidArgument(
                    f"array: values in [{lo}, {hi}] do not fit {host.name} (range [{info.min}, {info.max}])")
        a = a.astype(host)
    t = ctx._empty(a.shape, dt)
    write_host(t, a)
    return t


def write_host(t, a):
    """Copies NumPy data of t's shape into t, converted to t's host dtype (no range check)."""
    dt = t._dtype
    a = np.asarray(a, dtype=_dtypes.host_dtype(dt))
    if not a.flags.c_contiguous:
        a = a.copy(order="C")  # np.ascontiguousarray would make 0-d data 1-d
    if a.size:
        t._upload(a.ctypes.data, _dtypes.host_transfer_dtype(dt))


def array(obj, dtype=None, copy=True, ctx=None):
    """A new tensor with a copy of obj's data: host data (lists, NumPy arrays), a kiln tensor or
    expression, or any DLPack / __cuda_array_interface__ producer. Without dtype, NumPy data keeps
    its dtype where it is one kiln infers (float64 -> float32, other integers -> int32:
    _dtypes.from_host)."""
    if not copy:
        return asarray(obj, dtype=dtype, ctx=ctx)
    if isinstance(obj, (Tensor, Expr)):
        e = obj if dtype is None else _kiln.astype(obj, dtype)
        if ctx is not None and obj.ctx is not ctx:
            return upload(np.asarray(obj), dtype=dtype, ctx=ctx)
        return e.copy()
    if not isinstance(obj, np.ndarray) and (hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__")):
        try:
            return array(asarray(obj, ctx=ctx), dtype=dtype, ctx=ctx)
        except (BufferError, _kiln.Error):
            pass
    return upload(obj, dtype=dtype, ctx=ctx)


def asarray(obj, dtype=None, ctx=None, *, device=None, copy=None):
    """obj as a tensor, sharing memory where it can: a kiln tensor is returned as is (cast if
    dtype differs), an expression is evaluated, a DLPack or __cuda_array_interface__ producer on
    the context's device is shared without a copy (NumPy arrays on a CPU context too); anything
    else is copied from the host. device: the Array API's (x.device's names); copy: None shares
    where it can, True always copies, False never does (ValueError where a copy is needed)."""
    if copy is not None and not isinstance(copy, (bool, np.bool_)):
        raise _kiln.DTypeError(f"asarray: copy= takes True, False or None, got {copy!r}")
    if device is not None:
        c = _ctx(ctx, device, "asarray", of=obj)
        if isinstance(obj, (Tensor, Expr)) and obj.ctx is not c:
            return _moved(obj, c, dtype, copy, "asarray")
        ctx = c
    if copy is None:
        return _asarray(obj, dtype, ctx)
    if copy:
        return array(obj, dtype=dtype, ctx=ctx)
    return _asarray_no_copy(obj, dtype, _ctx(ctx, op="asarray"))


def _moved(x, c, dtype, copy, op):
    """A tensor or expression of another context, copied into context c (through the host)."""
    if copy is False:
        raise ValueError(f"{op}: copy=False, but the data is on {x.device} and device={c.device!r}: moving it copies")
    return upload(np.asarray(x), dtype=dtype if dtype is not None else x._dtype, ctx=c)


def _shared(obj, c):
    """obj's memory as a tensor of context c without a copy (a DLPack or __cuda_array_interface__
    producer on c's device), and None with why not where that is impossible."""
    why = "it is no DLPack or CUDA array producer"
    if hasattr(obj, "__dlpack__"):
        try:
            return from_dlpack(obj, ctx=c, copy=False), None
        except (BufferError, _kiln.Error, TypeError) as e:
            why = str(e)
    if c.backend == "cuda" and hasattr(obj, "__cuda_array_interface__"):
        t = _from_cuda_array_interface(obj, c)
        if t is not None:
            return t, None
        why = "its __cuda_array_interface__ cannot be wrapped"
    return None, why


def _asarray_no_copy(obj, dtype, c):
    if isinstance(obj, Expr):
        raise ValueError("asarray: copy=False, but an expression has no memory of its own: evaluating it makes a "
                         "new tensor")
    t = obj
    if not isinstance(obj, Tensor):
        t, why = _shared(obj, c)
        if t is None:
            raise ValueError(f"asarray: copy=False, but {type(obj).__name__} data ({why}) cannot be shared by a "
                             f"{c.device} context: a copy is needed")
    if dtype is not None and _dtypes.dtype(dtype) != t._dtype:
        raise ValueError(f"asarray: copy=False, but casting {t.dtype} to {_dtypes.dtype(dtype).name} copies")
    return t


def _asarray(obj, dtype, ctx):
    if isinstance(obj, Tensor):
        if dtype is None or _dtypes.dtype(dtype) == obj._dtype:
            return obj
        return _kiln.astype(obj, dtype).eval()
    if isinstance(obj, Expr):
        return (obj if dtype is None else _kiln.astype(obj, dtype)).eval()
    c = _ctx(ctx, op="asarray")
    shared, _ = _shared(obj, c)
    if shared is not None:
        if dtype is not None and _dtypes.dtype(dtype) != shared._dtype:
            return _kiln.astype(shared, dtype).eval()
        # Without dtype=, data of a dtype kiln infers as another (float64 as float32, wider
        # integers as int32: _dtypes.from_host) is copied as the other, its range checked.
        if dtype is not None or _dtypes.from_host(_dtypes.host_dtype(shared._dtype)) == shared._dtype:
            return shared
    return upload(obj, dtype=dtype, ctx=c)


def from_dlpack(x, *, device=None, copy=None, ctx=None):
    """A tensor sharing the memory of any DLPack producer (PyTorch, CuPy, JAX, NumPy, ...).
    The producer orders its pending work before the context's stream. copy=True copies,
    copy=False raises BufferError where sharing is impossible (other device, read-only data)."""
    if isinstance(x, Tensor):
        return x.copy() if copy else x
    c = _ctx(ctx, op="from_dlpack")
    if device is not None and str(device) != c.device:
        raise BufferError(f"from_dlpack: device={device!r}, but the context runs on {c.device}")
    if not (hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")):
        raise _kiln.DTypeError(f"from_dlpack: a {type(x).__name__} is not a DLPack producer "
                               "(it has no __dlpack__ and __dlpack_device__); kiln.asarray takes other array-likes")
    dev_type, dev_id = x.__dlpack_device__()
    here_cuda = c.backend == "cuda"
    same = (dev_type in (1, 3) and not here_cuda) or (dev_type in (2, 13) and here_cuda and f"cuda:{dev_id}" == c.device)
    if not same:
        if copy is False:
            raise BufferError(f"from_dlpack: the data is on DLPack device ({dev_type}, {dev_id}) and the context on "
                              f"{c.device}: sharing is impossible (copy=False)")
        if dev_type in (1, 3):
            h = np.from_dlpack(x)
            if _kiln._dtype_from_name(h.dtype.name) is None:  # a copy, but never a conversion
                raise _kiln.DTypeError(f"from_dlpack: {h.dtype.name} data cannot be imported; kiln's dtypes are "
                                       f"{_dtypes._VALID}: convert it first (e.g. x.astype('float32'))")
            return upload(h, ctx=c)
        raise BufferError(f"from_dlpack: the data is on DLPack device ({dev_type}, {dev_id}); a {c.device} context can "
                          "only copy host data: move it to the host first")
    stream = c.stream_handle if here_cuda else None
    try:
        cap = x.__dlpack__(stream=stream, max_version=(1, 0))
    except TypeError:  # a producer older than DLPack 1.0
        cap = x.__dlpack__(stream=stream) if here_cuda else x.__dlpack__()
    t, readonly = _kiln._import_capsule(cap, c)
    if readonly or copy:
        if copy is False:
            raise BufferError("from_dlpack: the producer's data is read-only and copy=False; kiln tensors are writable")
        return t.copy()
    return t


def _from_cuda_array_interface(obj, c):
    cai = obj.__cuda_array_interface__
    typestr = cai["typestr"]
    np_dt = np.dtype(typestr) if typestr[1] != "V" else None
    if np_dt is None:
        return None
    dt = _kiln._dtype_from_name(np_dt.name)
    if dt is None:
        return None
    ptr, readonly = cai["data"]
    if readonly:
        return None
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    if strides is not None:
        if any(s % np_dt.itemsize for s in strides):
            return None
        strides = tuple(s // np_dt.itemsize for s in strides)
    stream = cai.get("stream")
    if stream:
        c.wait_for(stream)  # the producer's pending work comes before ours (no host wait)
    device_index = int(c.device.split(":")[1])
    return _kiln._wrap(c, ptr, dt, shape, strides, obj, True, device_index)


def empty(shape, dtype=None, ctx=None, *, device=None):
    """An uninitialised tensor (reading it before writing raises kiln.InvalidArgument)."""
    c = _ctx(ctx, device, "empty")
    return c._empty(_shape(shape, "empty"), _dtypes.dtype(dtype) if dtype is not None else c._default_dtype)


def full(shape, fill_value, dtype=None, ctx=None, *, device=None):
    c = _ctx(ctx, device, "full")
    if dtype is None:
        dt = DType.bool if isinstance(fill_value, bool) else DType.int32 if isinstance(fill_value, int) else c._default_dtype
    else:
        dt = _dtypes.dtype(dtype)
    t = c._empty(_shape(shape, "full"), dt)
    t[...] = fill_value
    return t


def zeros(shape, dtype=None, ctx=None, *, device=None):
    c = _ctx(ctx, device, "zeros")
    return c._full(_shape(shape, "zeros"), 0.0, _dtypes.dtype(dtype) if dtype is not None else c._default_dtype)


def ones(shape, dtype=None, ctx=None, *, device=None):
    c = _ctx(ctx, device, "ones")
    return c._full(_shape(shape, "ones"), 1.0, _dtypes.dtype(dtype) if dtype is not None else c._default_dtype)


def _like_ctx(a, ctx, device, op):
    """The context of a *_like result. `a` is a kiln array, or a NumPy array (whose shape and dtype
    are taken; the default context, or ctx, holds the result)."""
    if not isinstance(a, (Tensor, Expr, np.ndarray)):
        raise _kiln.DTypeError(f"{op}: a is of type {type(a).__name__}; it is a kiln Tensor or Expr, or a NumPy array")
    if device is not None:
        return _ctx(ctx, device, op, of=a)
    if ctx is not None or isinstance(a, np.ndarray):
        return _ctx(ctx, None, op)
    return a.ctx


def empty_like(a, dtype=None, ctx=None, *, device=None):
    c = _like_ctx(a, ctx, device, "empty_like")
    return empty(a.shape, a.dtype if dtype is None else dtype, ctx=c)


def zeros_like(a, dtype=None, ctx=None, *, device=None):
    c = _like_ctx(a, ctx, device, "zeros_like")
    return zeros(a.shape, a.dtype if dtype is None else dtype, ctx=c)


def ones_like(a, dtype=None, ctx=None, *, device=None):
    c = _like_ctx(a, ctx, device, "ones_like")
    return ones(a.shape, a.dtype if dtype is None else dtype, ctx=c)


def full_like(a, fill_value, dtype=None, ctx=None, *, device=None):
    c = _like_ctx(a, ctx, device, "full_like")
    return full(a.shape, fill_value, a.dtype if dtype is None else dtype, ctx=c)


def arange(start, stop=None, step=1, dtype=None, ctx=None, *, device=None):
    """Evenly spaced values in [start, stop), as NumPy's arange (computed on the device)."""
    ctx = _ctx(ctx, device, "arange")
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise _kiln.InvalidArgument("arange: step must not be 0")
    if not all(math.isfinite(v) for v in (start, stop, step)):
        raise _kiln.InvalidArgument(f"arange: start, stop and step must be finite, got {start}, {stop}, {step}")
    n = max(0, math.ceil((stop - start) / step))
    if dtype is None:
        is_int = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
        dt = DType.int32 if is_int else _ctx(ctx, op="arange")._default_dtype
    else:
        dt = _dtypes.dtype(dtype)
    t = _ctx(ctx, op="arange")._empty((n,), dt)
    if n:
        t[...] = _kiln._iota((n,), 0) * step + start
    return t


def asnumpy(a):
    """A NumPy copy of a tensor or expression (NumPy data is returned as is)."""
    if isinstance(a, (Tensor, Expr)):
        return a.get()
    return np.asarray(a)


def reshape(a, shape=None, *, copy=None, newshape=None):
    """A view when a tensor's memory allows it, else a copy; lazy for expressions (which hold no
    memory, whatever copy says). shape (NumPy's older name: newshape); copy: None as said, True
    always copies, False never does (ValueError where a view is impossible)."""
    if (shape is None) == (newshape is None):
        raise _kiln.DTypeError("reshape: give the new shape once, as shape= (or NumPy's older newshape=)")
    s = _shape(shape if shape is not None else newshape, "reshape")
    if copy is not None and not isinstance(copy, (bool, np.bool_)):
        raise _kiln.DTypeError(f"reshape: copy= takes True, False or None, got {copy!r}")
    r = a.reshape(s)
    if copy is None or not isinstance(a, Tensor):
        return r
    view = r._data_ptr == a._data_ptr or a.size == 0
    if copy is False and not view:
        raise ValueError(f"reshape: copy=False, but a tensor of shape {tuple(a.shape)} and strides "
                         f"{tuple(a.strides)} cannot be viewed as shape {s}: a copy is needed")
    return r.copy() if copy and view else r


def astype(x, dtype, copy=True, *, device=None):
    """x converted to dtype, as the Array API's astype: a lazy expression (it fuses into the
    assignment that uses it), or with copy=False and dtype already x's, x itself. device: the
    result's device (x.device's names); another device copies the data there first."""
    if not isinstance(copy, (bool, np.bool_)):
        raise _kiln.DTypeError(f"astype: copy= takes True or False, got {copy!r}")
    if not isinstance(x, (Tensor, Expr)):   # a scalar or host data: cast as an expression
        return _kiln.astype(x if device is None else asarray(x, device=device), dtype)
    if device is not None:
        c = _ctx(None, device, "astype", of=x)
        if x.ctx is not c:
            x = _moved(x, c, None, None, "astype")
    if not copy and _dtypes.dtype(dtype) == x._dtype:
        return x
    return _kiln.astype(x, dtype)


@_takes_arrays("a")
def transpose(a, axes=None):
    return a.transpose() if axes is None else a.transpose(_shape(axes, "transpose", "axes"))


@_takes_arrays("a")
def squeeze(a, axis=None):
    return a.squeeze(axis)


@_takes_arrays("a")
def expand_dims(a, axis):
    shape = list(a.shape)
    axes = _shape(axis, "expand_dims", "axis")
    out_rank = len(shape) + len(axes)
    norm = []
    for ax in axes:
        if not -out_rank <= ax < out_rank:
            raise _kiln.InvalidArgument(f"expand_dims: axis {ax} is out of range for a result of rank {out_rank} "
                                        f"(valid: {-out_rank} to {out_rank - 1})")
        norm.append(ax + out_rank if ax < 0 else ax)
    if len(set(norm)) != len(norm):
        raise _kiln.InvalidArgument(f"expand_dims: axis {tuple(axes)} names a position of the result more than once")
    for ax in sorted(norm):
        shape.insert(ax, 1)
    return a.reshape(tuple(shape))


def dtype_of(x):
    """The kiln DType of a dtype spelling, of a tensor or expression, of host data as asarray
    takes it (float64 becomes float32), or of a Python scalar."""
    if isinstance(x, (Tensor, Expr)):
        return _dtypes.dtype(x.dtype)
    if isinstance(x, (type, np.dtype, str, DType)) or x is _dtypes.bfloat16:
        return _dtypes.dtype(x)
    if isinstance(x, (bool, np.bool_)):
        return DType.bool
    if isinstance(x, (int, float, np.generic, np.ndarray, list, tuple)):
        return _dtypes.from_host(np.asarray(x).dtype)
    return _dtypes.dtype(getattr(x, "dtype", x))


def result_type(*arrays_and_dtypes):
    """The dtype that tensors, expressions, host data, scalars and dtypes promote to together
    (NumPy's rules on kiln's dtypes), as the tensor's dtype is reported."""
    if not arrays_and_dtypes:
        raise _kiln.InvalidArgument("result_type: needs at least one array or dtype")
    # Python scalars are weak, as in NumPy 2: they take the others' kind when it holds them.
    weak = [x for x in arrays_and_dtypes if type(x) in (bool, int, float)]
    d = None
    for x in arrays_and_dtypes:
        if type(x) not in (bool, int, float):
            t = dtype_of(x)
            d = t if d is None else _kiln._promote(d, t)
    for x in weak:
        if d is None:
            d = dtype_of(x)
        elif type(x) is float and d not in (DType.float64, DType.float32, DType.float16, DType.bfloat16):
            d = DType.float32
        elif type(x) is int and d == DType.bool:
            d = DType.int32
    return _dtypes._REPORTED[d.value]


def _arrays(arrays, op):
    """concat's and stack's operands: a non-empty sequence of tensors and expressions (a tensor
    is the sequence of its rows, as NumPy's)."""
    if not isinstance(arrays, (Tensor, Expr)) and (isinstance(arrays, (str, bytes)) or not hasattr(arrays, "__iter__")):
        raise _kiln.DTypeError(f"{op}: arrays is of type {type(arrays).__name__}; it is a sequence of kiln Tensors or "
                               "Exprs")
    arrays = list(arrays)
    if not arrays:
        raise _kiln.InvalidArgument(f"{op}: needs at least one array")
    return _each_array(arrays, op)


def concat(arrays, axis=0, ctx=None):
    """A new tensor joining tensors or expressions along an existing axis (NumPy's concatenate);
    their common dtype (result_type); axis=None joins them flattened."""
    arrays = _arrays(arrays, "concat")
    if axis is None:
        arrays = [a.reshape((math.prod(a.shape),)) for a in arrays]
        axis = 0
    rank = len(arrays[0].shape)
    if rank == 0:
        raise _kiln.InvalidArgument("concat: zero-dimensional arrays cannot be joined along an axis (use stack)")
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < rank:
        raise _kiln.InvalidArgument(f"concat: axis {axis} is out of range for arrays of rank {rank}")
    first = tuple(arrays[0].shape)
    for a in arrays[1:]:
        s = tuple(a.shape)
        if len(s) != rank or s[:ax] + s[ax + 1:] != first[:ax] + first[ax + 1:]:
            raise _kiln.InvalidArgument(f"concat: shapes {first} and {s} differ outside axis {axis}; every array needs "
                                        f"rank {rank} and the same sizes on the other axes")
    shape = list(first)
    shape[ax] = sum(a.shape[ax] for a in arrays)
    out = empty(tuple(shape), result_type(*arrays), ctx=ctx if ctx is not None else getattr(arrays[0], "ctx", None))
    at = 0
    for a in arrays:
        n = a.shape[ax]
        if n:
            out[(slice(None),) * ax + (slice(at, at + n),)] = a
        at += n
    return out


def stack(arrays, axis=0, ctx=None):
    """A new tensor joining tensors or expressions of one shape along a new axis."""
    arrays = _arrays(arrays, "stack")
    first = tuple(arrays[0].shape)
    for a in arrays[1:]:
        if tuple(a.shape) != first:
            raise _kiln.InvalidArgument(f"stack: shapes {first} and {tuple(a.shape)} differ; every array needs the same shape")
    rank = len(first) + 1
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < rank:
        raise _kiln.InvalidArgument(f"stack: axis {axis} is out of range for a result of rank {rank}")
    return concat([expand_dims(a, ax) for a in arrays], axis=ax, ctx=ctx)
