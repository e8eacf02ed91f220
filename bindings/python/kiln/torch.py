"""kiln.torch: kiln's kernels inside PyTorch (importable when PyTorch is).

Each function is a torch.library custom op in the namespace "kiln" with an autograd formula and
a fake (meta) kernel, so it runs eagerly, under autograd and inside torch.compile graphs without
graph breaks:

    linear(x, weight, bias=None, activation=None)   kiln's GEMM with its epilogue: torch's
        F.linear followed by the activation ("relu", "leaky_relu"), in one kernel;
    conv1d, conv2d, conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, activation=None)
        kiln's convolution with the same epilogue (channels-last tensors are used in place);
    op(fn)   any kiln expression of tensors as an op: fn receives kiln tensors and returns a kiln
        expression (or a tuple of them); the forward pass is the fused kernel kiln compiles for
        it, the backward pass the fused kernel of its derivative (kiln.grad);
    Linear, Conv1d, Conv2d, Conv3d   drop-in subclasses of torch.nn's modules.

Tensors are shared, never copied (a convolution copies an input that is not channels-last
into that layout; an input with PyTorch's negative bit set is materialised first). On CUDA, kiln's work waits for what PyTorch has queued on its
current stream and PyTorch's later work waits for kiln's.
"""
import contextlib
import itertools
import math
import re
from typing import Optional

import torch
import torch.nn.functional

import kiln
from . import _kiln

__all__ = ["linear", "conv1d", "conv2d", "conv3d", "op", "Linear", "Conv1d", "Conv2d", "Conv3d", "to_kiln", "context_for"]

_contexts = {}


def context_for(device):
    """The kiln context running on a torch device (the default context where it is that device)."""
    ctx = _contexts.get(device)
    if ctx is not None:
        return ctx
    device = torch.device(device)
    if device.type == "cuda":
        key = f"cuda:{torch.cuda.current_device() if device.index is None else device.index}"
    elif device.type == "cpu":
        key = "cpu"
    else:
        raise ValueError(f"kiln.torch: tensors on {device} cannot be used; kiln runs on the CPU and on CUDA GPUs")
    ctx = _contexts.get(key)
    if ctx is None:
        default = kiln.default_context()
        ctx = default if default.device == key else kiln.Context(key)
        _contexts[key] = ctx
    if device.type == "cpu" or device.index is not None:
        _contexts[device] = ctx
    return ctx


_KILN_DTYPES = {}
_TORCH_DTYPES = {}


def _kiln_dtype(dtype):
    k = _KILN_DTYPES.get(dtype)
    if k is None:
        k = _kiln._dtype_from_name(str(dtype).removeprefix("torch."))
        if k is None:
            raise TypeError(f"kiln.torch: {dtype} tensors cannot be shared with kiln; its dtypes are float64, float32, "
                            "float16, bfloat16, int64, int32, int16, int8, uint64, uint32, uint16, uint8 and bool")
        _KILN_DTYPES[dtype] = k
    return k


def _torch_dtype(kiln_dtype):
    t = _TORCH_DTYPES.get(kiln_dtype)
    if t is None:
        t = _TORCH_DTYPES[kiln_dtype] = getattr(torch, getattr(kiln_dtype, "name", None) or str(kiln_dtype))
    return t


def to_kiln(t, ctx=None):
    """The kiln tensor sharing a torch tensor's memory (its shape and strides; the torch tensor is
    kept alive while kiln uses it). No stream is synchronised: kiln.torch's ops order the streams
    themselves; kiln.from_dlpack(t) is the general, synchronising form. A tensor with PyTorch's negative
bit set (a lazy negation) is refused: its memory holds the negatives of its values."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kiln.torch: expected a torch.Tensor, got {type(t).__name__}")
    if t.is_neg():
        raise ValueError("kiln.torch.to_kiln: the tensor is a lazy negation (its negative bit is set, so its memory "
                         "holds the values' negatives); call t.resolve_neg() first")
    dev = t.device
    if ctx is None:
        ctx = context_for(dev)
    return _kiln._wrap(ctx, t.data_ptr(), _kiln_dtype(t.dtype), tuple(t.shape), tuple(t.stride()), t,
                       dev.type == "cuda", dev.index or 0)


def _resolved(*ts):
    """Operands as kiln reads them: a lazily negated tensor (PyTorch's negative bit, which its custom ops
    receive as is) materialised, queued on PyTorch's stream before kiln waits for it; None stays None."""
    return tuple(t.resolve_neg() if t is not None else None for t in ts)


@contextlib.contextmanager
def _ordered(ctx, device):
    """kiln's work between PyTorch's: after what its current stream holds, before what follows."""
    if device.type != "cuda":
        yield
        return
    stream = torch.cuda.current_stream(device).cuda_stream
    ctx.wait_for(stream)
    try:
        yield
    finally:
        ctx.order_before(stream)


def _is_float(kiln_dtype):
    return (getattr(kiln_dtype, "name", None) or str(kiln_dtype)) in ("float16", "bfloat16", "float32", "float64")


def _same_device(op, *tensors):
    devices = {t.device for t in tensors if t is not None}
    if len(devices) > 1:
        raise ValueError(f"kiln.{op}: the tensors are on different devices ({', '.join(sorted(map(str, devices)))})")


def _check_tensors(op, x, weight, bias):
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"kiln.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


def _check_alike(op, x, weight, bias):
    """One dtype and one device for a layer's operands."""
    dtypes = {t.dtype for t in (x, weight, bias) if t is not None}
    if len(dtypes) > 1:
        raise TypeError(f"kiln.{op}: x, weight and bias must share a dtype; got {', '.join(sorted(map(str, dtypes)))}")
    _same_device(op, x, weight, bias)


def _activation(activation, negative_slope):
    """(relu, slope) for the epilogue; activation is None, 'relu' or 'leaky_relu'."""
    if activation is None:
        return False, 0.0
    if activation == "relu":
        return True, 0.0
    if activation == "leaky_relu":
        slope = float(negative_slope)
        if not 0.0 <= slope < 1.0:
            raise ValueError(f"kiln.torch: negative_slope={negative_slope!r}; it must be in [0, 1)")
        return True, slope
    raise ValueError(f"kiln.torch: activation={activation!r}; valid: None, 'relu', 'leaky_relu'")


def _relu_backward(y, grad, relu, slope):
    """The gradient before the activation, from its output y (y > 0 exactly where its input is)."""
    if not relu:
        return grad
    return _kiln.bprop_relu(None, y, grad, None, slope)


# ============================================================================================
# linear: kiln's GEMM and its epilogue


def _linear_forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], relu: bool,
                    slope: float) -> torch.Tensor:
    out_features, in_features = weight.shape
    x, weight, bias = _resolved(x, weight, bias)
    x2 = x.reshape(math.prod(x.shape[:-1]), in_features)
    out = torch.empty((x2.shape[0], out_features), dtype=x.dtype, device=x.device)
    if out.numel() and in_features == 0:   # an empty sum: the bias alone
        out.copy_(bias.expand_as(out) if bias is not None else torch.zeros_like(out))
        if relu:
            out = torch.nn.functional.leaky_relu(out, slope)
    elif out.numel():
        ctx = context_for(x.device)
        with _ordered(ctx, x.device):
            kx, kw, ko = to_kiln(x2, ctx), to_kiln(weight, ctx), to_kiln(out, ctx)
            kb = to_kiln(bias, ctx) if bias is not None else None
            if x.dtype == torch.float64:   # no GEMM: kiln's fused sum of products
                y = kiln.matmul(kx, kw.T)
                if kb is not None:
                    y = y + kb
                if relu:
                    y = kiln.maximum(y, 0) + slope * kiln.minimum(y, 0)
                ko[...] = y
            else:
                _kiln.compound_dot(kx, kw.T, ko, relu=relu, slope=slope, bias=kb)
    return out.reshape(*x.shape[:-1], out_features)


def _linear_backward_impl(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, has_bias: bool,
                          relu: bool, slope: float, need_x: bool,
                          need_w: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad x, grad weight, grad bias); each not asked for is an empty tensor."""
    out_features, in_features = weight.shape
    grad, x, weight, y = _resolved(grad, x, weight, y)
    x2 = x.reshape(math.prod(x.shape[:-1]), in_features)
    g2 = grad.reshape(x2.shape[0], out_features)
    alloc = torch.empty_like if g2.numel() else torch.zeros_like   # kiln writes every element (beta 0)
    gx = alloc(x2, memory_format=torch.contiguous_format) if need_x else x.new_empty((0,))
    gw = alloc(weight, memory_format=torch.contiguous_format) if need_w else x.new_empty((0,))
    gb = (torch.empty if g2.numel() else torch.zeros)((out_features if has_bias else 0,), dtype=weight.dtype,
                                                      device=weight.device)
    if g2.numel():
        ctx = context_for(x.device)
        y2 = y.reshape(x2.shape[0], out_features) if relu else None   # PyTorch's work before kiln waits
        with _ordered(ctx, x.device):
            kg = to_kiln(g2, ctx)
            if relu:
                kg = _relu_backward(to_kiln(y2, ctx), kg, relu, slope).eval()
            if in_features and need_x:
                kw, kgx = to_kiln(weight, ctx), to_kiln(gx, ctx)
                if x.dtype == torch.float64:
                    kgx[...] = kiln.matmul(kg, kw)
                else:
                    _kiln.compound_dot(kg, kw, kgx)
            if in_features and need_w:
                kx, kgw = to_kiln(x2, ctx), to_kiln(gw, ctx)
                if x.dtype == torch.float64:
                    kgw[...] = kiln.matmul(kg.T, kx)
                else:
                    _kiln.compound_dot(kg.T, kx, kgw)
            if has_bias:
                to_kiln(gb, ctx)[...] = kiln.sum(kg, axis=0)
    return (gx.reshape(x.shape) if need_x else gx), gw, gb


_linear_op = torch.library.custom_op("kiln::linear", mutates_args=())(_linear_forward)
_linear_backward_op = torch.library.custom_op("kiln::linear_backward", mutates_args=())(_linear_backward_impl)


@_linear_op.register_fake
def _(x, weight, bias, relu, slope):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@_linear_backward_op.register_fake
def _(grad, x, weight, y, has_bias, relu, slope, need_x, need_w):
    return (torch.empty_like(x, memory_format=torch.contiguous_format) if need_x else x.new_empty((0,)),
            torch.empty_like(weight, memory_format=torch.contiguous_format) if need_w else x.new_empty((0,)),
            weight.new_empty((weight.shape[0] if has_bias else 0,)))


def _linear_setup(ctx, inputs, output):
    x, weight, bias, relu, slope = inputs
    ctx.save_for_backward(x, weight, output if relu else None)
    ctx.has_bias, ctx.relu, ctx.slope = bias is not None, relu, slope


def _linear_grads(ctx, grad, backward):
    x, weight, y = ctx.saved_tensors
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    gx, gw, gb = backward(grad, x, weight, y if y is not None else grad, ctx.has_bias, ctx.relu, ctx.slope, need_x,
                          need_w)
    return (gx if need_x else None), (gw if need_w else None), (gb if ctx.has_bias else None), None, None


_linear_op.register_autograd(lambda ctx, grad: _linear_grads(ctx, grad, torch.ops.kiln.linear_backward),
                             setup_context=_linear_setup)


class _LinearFunction(torch.autograd.Function):
    """The eager path: the same kernels without the custom op's dispatch (torch.compile takes
    the custom op)."""

    @staticmethod
    def forward(ctx, x, weight, bias, relu, slope):
        y = _linear_forward(x, weight, bias, relu, slope)
        _linear_setup(ctx, (x, weight, bias, relu, slope), y)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        return _linear_grads(ctx, grad, _linear_backward_impl)


def linear(x, weight, bias=None, activation=None, negative_slope=0.01):
    """activation(x @ weight.T + bias), as torch.nn.functional.linear followed by the activation
    (None, "relu", "leaky_relu" with negative_slope), computed by kiln's GEMM with the bias and
    the activation in its epilogue. x is (..., in_features), weight (out_features, in_features),
    bias (out_features,); float32, float16, bfloat16 (and float64, as kiln's fused sum of
    products rather than its GEMM)."""
    relu, slope = _activation(activation, negative_slope)
    _check_tensors("linear", x, weight, bias)
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"kiln.linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not match; weight is "
                         f"(out_features, in_features) and x's last dimension is in_features")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"kiln.linear: bias is {tuple(bias.shape)}; it must be ({weight.shape[0]},), one value per "
                         "output feature")
    _check_alike("linear", x, weight, bias)
    if torch.compiler.is_compiling():
        return _linear_op(x, weight, bias, relu, slope)
    return _LinearFunction.apply(x, weight, bias, relu, slope)


# ============================================================================================
# conv1d / conv2d / conv3d: kiln's convolution (channels innermost) on PyTorch's (N, C, ...) tensors


def _per_axis(v, rank, op, name, least):
    vals = (v,) * rank if isinstance(v, int) and not isinstance(v, bool) else tuple(v)
    if len(vals) != rank or not all(isinstance(i, int) and not isinstance(i, bool) and i >= least for i in vals):
        raise ValueError(f"kiln.{op}: {name}={v!r}; give an int or {rank} ints >= {least}")
    return list(vals)


def _last(t):
    """t (N, C, ...) seen as (N, ..., C): a view of a channels-last tensor, else a copy."""
    return t.permute(0, *range(2, t.dim()), 1).contiguous()


def _channels_last_empty(shape, like):
    """An empty (N, C, ...) tensor whose memory is (N, ..., C), as kiln writes it."""
    n, c, *spatial = shape
    t = torch.empty((n, *spatial, c), dtype=like.dtype, device=like.device)
    return t.permute(0, t.dim() - 1, *range(1, t.dim() - 1))


def _conv_layer(x, weight, stride, padding, dilation, kx):
    lead = 3 - (x.dim() - 2)   # kiln's layer is 3D: depth, height, width
    image = (1,) * lead + tuple(x.shape[2:])
    filt = (1,) * lead + tuple(weight.shape[2:])
    pads, strides, dils = [0] * lead + list(padding), [1] * lead + list(stride), [1] * lead + list(dilation)
    return _kiln.conv_layer(kx.dtype, x.shape[0], x.shape[1], weight.shape[0], *image, *filt, *pads, *strides, *dils)


def _conv_out_shape(x, weight, stride, padding, dilation):
    out = [(i + 2 * p - d * (f - 1) - 1) // s + 1
           for i, f, s, p, d in zip(x.shape[2:], weight.shape[2:], stride, padding, dilation)]
    return (x.shape[0], weight.shape[0], *out)


def _conv_forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int],
                  padding: list[int], dilation: list[int], relu: bool, slope: float) -> torch.Tensor:
    x, weight, bias = _resolved(x, weight, bias)
    out = _channels_last_empty(_conv_out_shape(x, weight, stride, padding, dilation), x)
    if out.numel():
        ctx = context_for(x.device)
        xh, wh = _last(x), _last(weight)   # PyTorch's copies, queued before kiln waits for them
        with _ordered(ctx, x.device):
            kx, kw = to_kiln(xh, ctx), to_kiln(wh, ctx)
            layer = _conv_layer(x, weight, stride, padding, dilation, kx)
            kb = to_kiln(bias, ctx) if bias is not None else None
            _kiln.fprop_conv(layer, kx, kw, to_kiln(_last(out), ctx), bias=kb, relu=relu, slope=slope)
    return out


def _conv_backward_impl(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor,
                        stride: list[int], padding: list[int], dilation: list[int], has_bias: bool, relu: bool,
                        slope: float, need_x: bool, need_w: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad x, grad weight, grad bias), channels-last; each not asked for is an empty tensor."""
    grad, x, weight, y = _resolved(grad, x, weight, y)
    writes = grad.numel() and x.numel()   # kiln writes every element; otherwise they are zeros

    def alloc(like):
        t = _channels_last_empty(like.shape, like)
        return t if writes else t.zero_()

    gx = alloc(x) if need_x else x.new_empty((0,))
    gw = alloc(weight) if need_w else x.new_empty((0,))
    gb = (torch.empty if grad.numel() else torch.zeros)((weight.shape[0] if has_bias else 0,), dtype=weight.dtype,
                                                        device=weight.device)
    if grad.numel():
        ctx = context_for(x.device)
        # PyTorch's copies into kiln's layout, queued (and kept alive) before kiln waits for them.
        gh = _last(grad)
        yh = _last(y) if relu else None
        wh = _last(weight) if need_x and x.numel() else None
        xh = _last(x) if need_w and x.numel() else None
        with _ordered(ctx, x.device):
            kg = to_kiln(gh, ctx)
            if relu:
                kg = _relu_backward(to_kiln(yh, ctx), kg, relu, slope).eval()
            layer = _conv_layer(x, weight, stride, padding, dilation, kg)
            if wh is not None:
                _kiln.bprop_conv(layer, to_kiln(wh, ctx), kg, to_kiln(_last(gx), ctx))
            if xh is not None:
                _kiln.update_conv(layer, to_kiln(xh, ctx), kg, to_kiln(_last(gw), ctx))
            if has_bias:
                to_kiln(gb, ctx)[...] = kiln.sum(kg.reshape(-1, weight.shape[0]), axis=0)
    return gx, gw, gb


_conv_op = torch.library.custom_op("kiln::conv", mutates_args=())(_conv_forward)
_conv_backward_op = torch.library.custom_op("kiln::conv_backward", mutates_args=())(_conv_backward_impl)


@_conv_op.register_fake
def _(x, weight, bias, stride, padding, dilation, relu, slope):
    return _channels_last_empty(_conv_out_shape(x, weight, stride, padding, dilation), x)


@_conv_backward_op.register_fake
def _(grad, x, weight, y, stride, padding, dilation, has_bias, relu, slope, need_x, need_w):
    return (_channels_last_empty(x.shape, x) if need_x else x.new_empty((0,)),
            _channels_last_empty(weight.shape, weight) if need_w else x.new_empty((0,)),
            weight.new_empty((weight.shape[0] if has_bias else 0,)))


def _conv_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, relu, slope = inputs
    ctx.save_for_backward(x, weight, output if relu else None)
    ctx.geometry = (stride, padding, dilation)
    ctx.has_bias, ctx.relu, ctx.slope = bias is not None, relu, slope


def _conv_grads(ctx, grad, backward):
    x, weight, y = ctx.saved_tensors
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    gx, gw, gb = backward(grad, x, weight, y if y is not None else grad, *ctx.geometry, ctx.has_bias, ctx.relu,
                          ctx.slope, need_x, need_w)
    return (gx if need_x else None), (gw if need_w else None), (gb if ctx.has_bias else None), None, None, None, None, None


_conv_op.register_autograd(lambda ctx, grad: _conv_grads(ctx, grad, torch.ops.kiln.conv_backward),
                           setup_context=_conv_setup)


class _ConvFunction(torch.autograd.Function):
    """The eager path (see _LinearFunction)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, relu, slope):
        y = _conv_forward(x, weight, bias, stride, padding, dilation, relu, slope)
        _conv_setup(ctx, (x, weight, bias, stride, padding, dilation, relu, slope), y)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        return _conv_grads(ctx, grad, _conv_backward_impl)


def _conv(rank, x, weight, bias, stride, padding, dilation, activation, negative_slope):
    op = f"conv{rank}d"
    relu, slope = _activation(activation, negative_slope)
    _check_tensors(op, x, weight, bias)
    dims = "DHW"[3 - rank:]
    if x.dim() != rank + 2 or weight.dim() != rank + 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"kiln.{op}: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not match; x is "
                         f"(N, C, {', '.join(dims)}) and weight (K, C, {', '.join(dims)} of the filter) with the same C "
                         "(groups are not supported)")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"kiln.{op}: bias is {tuple(bias.shape)}; it must be ({weight.shape[0]},)")
    _check_alike(op, x, weight, bias)
    stride, dilation = _per_axis(stride, rank, op, "stride", 1), _per_axis(dilation, rank, op, "dilation", 1)
    if padding == "valid":
        padding = [0] * rank
    elif padding == "same":
        span = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
        if stride != [1] * rank or any(v % 2 for v in span):
            raise ValueError(f"kiln.{op}: padding='same' needs stride 1 and an odd dilated filter; got stride "
                             f"{tuple(stride)}, filter {tuple(weight.shape[2:])}, dilation {tuple(dilation)}")
        padding = [v // 2 for v in span]
    else:
        padding = _per_axis(padding, rank, op, "padding", 0)
    if x.shape[1] == 0:
        raise ValueError(f"kiln.{op}: x {tuple(x.shape)} has no channels; kiln's convolution needs at least one")
    out = _conv_out_shape(x, weight, stride, padding, dilation)[2:]
    if any(o < 1 for o in out):
        raise ValueError(f"kiln.{op}: the output would be {'x'.join(map(str, out))}: the input {tuple(x.shape[2:])} "
                         f"padded by {tuple(padding)} on each side is smaller than the filter {tuple(weight.shape[2:])} "
                         f"dilated by {tuple(dilation)}")
    if torch.compiler.is_compiling():
        return _conv_op(x, weight, bias, stride, padding, dilation, relu, slope)
    return _ConvFunction.apply(x, weight, bias, stride, padding, dilation, relu, slope)


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, activation=None, negative_slope=0.01):
    """conv2d's one-dimensional form: x (N, C, W), weight (K, C, S)."""
    return _conv(1, x, weight, bias, stride, padding, dilation, activation, negative_slope)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, activation=None, negative_slope=0.01):
    """activation(torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation)) by kiln's
    convolution, the bias and activation in its epilogue. x (N, C, H, W), weight (K, C, R, S), as
    PyTorch's; the result is channels_last. padding: ints, 'valid' or 'same' (stride 1)."""
    return _conv(2, x, weight, bias, stride, padding, dilation, activation, negative_slope)


def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, activation=None, negative_slope=0.01):
    """conv2d's three-dimensional form: x (N, C, D, H, W), weight (K, C, T, R, S); the result is
    channels_last_3d."""
    return _conv(3, x, weight, bias, stride, padding, dilation, activation, negative_slope)


# ============================================================================================
# op: any kiln expression as a custom op


class _Probe:
    """Kiln tensors of given shapes and dtypes without their memory (every element is one
    element), to learn an expression's result shapes for the fake kernels."""
    _ctx = None
    _cells = {}

    @classmethod
    def tensor(cls, shape, dtype):
        if cls._ctx is None:
            cls._ctx = kiln.Context("cpu")
        name = str(dtype).removeprefix("torch.")
        cell = cls._cells.get(name)
        if cell is None:
            cell = cls._cells[name] = kiln.zeros((1,), dtype=name, ctx=cls._ctx)
        shape = tuple(int(d) for d in shape)
        return _kiln._wrap(cls._ctx, cell._data_ptr, cell._dtype, shape, (0,) * len(shape), cell, False, 0)


def _outputs(fn, args, name):
    ys = fn(*args)
    many = isinstance(ys, (tuple, list))
    ys = list(ys) if many else [ys]
    for y in ys:
        if not isinstance(y, (_kiln.Expr, _kiln.Tensor)):
            raise TypeError(f"kiln.torch.op({name}): the function must return kiln expressions (or a tuple of them); "
                            f"got {type(y).__name__}")
    return ys


_counter = itertools.count()


def op(fn=None, *, name=None):
    """Wraps fn, a function of kiln tensors returning a kiln expression (or a tuple of them), as a
    PyTorch custom op taking torch tensors: @kiln.torch.op or kiln.torch.op(fn, name="gelu").

    The forward pass runs the fused kernel of fn's expression on the tensors' memory; the
    backward pass the fused kernel of its derivative (kiln.grad, which recomputes what it needs
    from the inputs rather than storing intermediates). Registered as kiln::<name>, with a fake
    kernel, so it works inside torch.compile. Inputs may be any kiln dtype; float inputs receive
    gradients. Non-tensor parameters are captured by fn (one op per function)."""
    if fn is None:
        return lambda f: op(f, name=name)
    base = name or re.sub(r"\W", "_", getattr(fn, "__name__", "fn")).strip("_") or "fn"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", base):
        raise ValueError(f"kiln.torch.op: name={name!r} is not an identifier")
    qual = f"kiln::{base}_{next(_counter)}" if name is None else f"kiln::{base}"
    label = qual.split("::")[1]

    def forward_impl(xs):
        device = xs[0].device if xs else torch.device("cpu")
        _same_device(f"torch.op({label})", *xs)
        ctx = context_for(device)
        ks = [to_kiln(x, ctx) for x in _resolved(*xs)]   # building the expressions queues no work
        ys = _outputs(fn, ks, label)
        outs = [torch.empty(tuple(y.shape), dtype=_torch_dtype(y.dtype), device=device) for y in ys]
        with _ordered(ctx, device):
            for y, out in zip(ys, outs):
                if out.numel():
                    to_kiln(out, ctx)[...] = y
        return outs

    def forward_fake(xs):
        ys = _outputs(fn, [_Probe.tensor(x.shape, x.dtype) for x in xs], label)
        device = xs[0].device if xs else torch.device("cpu")
        return [torch.empty(tuple(y.shape), dtype=_torch_dtype(y.dtype), device=device) for y in ys]

    def backward_impl(xs, grads):
        device = xs[0].device
        ctx = context_for(device)
        # An input sharing memory with an earlier one is read from a copy, so that each receives
        # its own derivative (PyTorch adds them).
        seen, xs, grads = set(), list(_resolved(*xs)), _resolved(*grads)
        for i, x in enumerate(xs):
            key = x.untyped_storage().data_ptr()
            if key in seen and x.numel():
                xs[i] = x.clone()
            seen.add(key)
        ks = [to_kiln(x, ctx) for x in xs]
        want = [i for i, x in enumerate(xs) if x.is_floating_point()]
        total = None
        for y, g in zip(_outputs(fn, ks, label), grads):
            if g is None or not _is_float(y.dtype):
                continue
            parts = kiln.grad(y, [ks[i] for i in want], to_kiln(g, ctx))
            total = parts if total is None else [a + b for a, b in zip(total, parts)]
        alloc = torch.zeros if total is None else torch.empty
        outs = [alloc(tuple(xs[i].shape), dtype=xs[i].dtype, device=device) for i in want]
        if total is not None:
            with _ordered(ctx, device):
                for out, g in zip(outs, total):
                    if out.numel():
                        to_kiln(out, ctx)[...] = g
        return outs

    def backward_fake(xs, grads):
        return [torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device) for x in xs if x.is_floating_point()]

    forward = torch.library.custom_op(qual, mutates_args=())(_typed_forward(forward_impl))
    forward.register_fake(_typed_forward(forward_fake))
    backward = torch.library.custom_op(qual + "_backward", mutates_args=())(_typed_backward(backward_impl))
    backward.register_fake(_typed_backward(backward_fake))

    def setup(ctx, inputs, output):
        (xs,) = inputs
        ctx.save_for_backward(*xs)
        ctx.floats = [x.is_floating_point() for x in xs]
        ctx.outputs = [(tuple(o.shape), o.dtype) for o in output]

    def autograd_backward(ctx, grads):
        xs = ctx.saved_tensors
        grads = [g if g is not None else torch.zeros(s, dtype=d, device=xs[0].device)
                 for g, (s, d) in zip(grads, ctx.outputs)]
        gs = iter(backward(list(xs), grads))
        return ([next(gs) if f else None for f in ctx.floats],)

    forward.register_autograd(autograd_backward, setup_context=setup)

    class Eager(torch.autograd.Function):
        """The eager path (see _LinearFunction)."""

        @staticmethod
        def forward(ctx, *xs):
            outs = forward_impl(list(xs))
            ctx.save_for_backward(*xs)
            ctx.floats = [x.is_floating_point() for x in xs]
            ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
            return tuple(outs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            gs = iter(backward_impl(list(ctx.saved_tensors), list(grads)))
            return tuple(next(gs) if f else None for f in ctx.floats)

    def call(*tensors):
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"kiln.torch.op({label}): takes torch tensors (capture other parameters in the "
                                f"function); got {type(t).__name__}")
        if not tensors:
            raise TypeError(f"kiln.torch.op({label}): takes at least one tensor")
        outs = forward(list(tensors)) if torch.compiler.is_compiling() else Eager.apply(*tensors)
        return outs[0] if len(outs) == 1 else tuple(outs)

    call.__name__ = getattr(fn, "__name__", label)
    call.__doc__ = getattr(fn, "__doc__", None)
    call.op = forward
    return call


def _typed_forward(impl):
    def f(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return impl(xs)
    return f


def _typed_backward(impl):
    def f(xs: list[torch.Tensor], grads: list[torch.Tensor]) -> list[torch.Tensor]:
        return impl(xs, grads)
    return f


# ============================================================================================
# modules


class Linear(torch.nn.Linear):
    """torch.nn.Linear computed by kiln.torch.linear, with an optional activation ("relu",
    "leaky_relu") in the GEMM's epilogue. Parameters, initialisation and state_dict are
    torch.nn.Linear's."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, activation=None,
                 negative_slope=0.01):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        _activation(activation, negative_slope)
        self.activation, self.negative_slope = activation, negative_slope

    def forward(self, x):
        return linear(x, self.weight, self.bias, self.activation, self.negative_slope)

    def extra_repr(self):
        return super().extra_repr() + (f", activation={self.activation!r}" if self.activation else "")


def _conv_module(base, rank, fn):
    class Conv(base):
        __doc__ = (f"torch.nn.{base.__name__} computed by kiln.torch.conv{rank}d (groups=1, zero padding), with an "
                   "optional activation in the convolution's epilogue. The weight is kept channels-last, the layout "
                   f"kiln reads in place; parameters and state_dict are torch.nn.{base.__name__}'s.")

        def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                     bias=True, padding_mode="zeros", device=None, dtype=None, activation=None, negative_slope=0.01):
            if groups != 1:
                raise ValueError(f"kiln.torch.{base.__name__}: groups={groups!r}; kiln's convolution is not grouped")
            if padding_mode != "zeros":
                raise ValueError(f"kiln.torch.{base.__name__}: padding_mode={padding_mode!r}; kiln pads with zeros only")
            super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                             padding_mode, device=device, dtype=dtype)
            _activation(activation, negative_slope)
            self.activation, self.negative_slope = activation, negative_slope
            w = self.weight.data
            self.weight.data = _channels_last_empty(w.shape, w).copy_(w)

        def forward(self, x):
            return fn(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.activation,
                      self.negative_slope)

        def extra_repr(self):
            return super().extra_repr() + (f", activation={self.activation!r}" if self.activation else "")

    Conv.__name__ = Conv.__qualname__ = base.__name__
    return Conv


Conv1d = _conv_module(torch.nn.Conv1d, 1, conv1d)
Conv2d = _conv_module(torch.nn.Conv2d, 2, conv2d)
Conv3d = _conv_module(torch.nn.Conv3d, 3, conv3d)
