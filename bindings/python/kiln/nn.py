"""kiln.nn: NumPy-style functional forms of the network layers.

Convolution runs at once (kiln.conv); the others return lazy kiln expressions that fuse with
whatever they are assigned into. The seeds' (neon's) forms are Context methods and module
functions of kiln: compound_fprop_bn, compound_bprop_bn, fprop_softmax, fprop_relu, bprop_relu,
conv_layer, fprop_conv, bprop_conv, update_conv, pool_layer, fprop_pool, bprop_pool, lrn_layer,
fprop_lrn, bprop_lrn. Here: softmax, cross_entropy, relu and the activations' derivatives
(expressions); conv, conv_transpose, conv_grad_input, conv_grad_weight, pool / pool_grad, lrn / lrn_grad, batch_norm / batch_norm_grad (new tensors).
"""
from . import _kiln
from ._conv import _tensor
from ._conv import conv, conv_grad_input, conv_grad_weight, conv_transpose  # noqa: F401 - re-exported


def softmax(x, axis=-1):
    """exp(x - max(x)) / sum(exp(x - max(x))) along axis."""
    return _kiln.fprop_softmax(x, axis)


def relu(x, slope=0.0):
    """max(x, 0), or with slope the leaky ReLU max(x, 0) + slope * min(x, 0)."""
    return _kiln.fprop_relu(None, x, slope)


def relu_grad(x, error, slope=0.0):
    """error times ReLU's derivative at x: (x > 0) + slope * (x < 0)."""
    return _kiln.bprop_relu(None, x, error, None, slope)


def sigmoid_grad(y):
    """The logistic function's derivative from its output y: y (1 - y)."""
    return _kiln._activation_grad(y, "sigmoid")


def tanh_grad(y):
    """tanh's derivative from its output y: 1 - y^2."""
    return _kiln._activation_grad(y, "tanh")


def cross_entropy(p, target, axis=-1, reduction="mean"):
    """Cross-entropy of probabilities p against target: a distribution of p's shape (one-hot or
    soft) or, for p of shape (rows, classes), an integer tensor of class indices (rows,); a class
    index outside [0, classes) makes the result NaN.
    -sum(target * log(p)) over axis (log clamped at exp(-50)), then the mean or the sum over rows."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"cross_entropy: reduction={reduction!r}; it is 'mean' or 'sum'")
    return _kiln._cross_entropy(p, target, axis, reduction == "mean")


def _pool_geometry(name, x, window, stride, padding, op, channels, channel_stride, channel_padding):
    """The pool_layer for x (N, [D, [H,]] W, C) and the window's sizes (an int or one per spatial axis)."""
    _tensor(name, "x", x)
    rank = x.ndim - 2
    if rank < 1 or rank > 3:
        raise ValueError(f"{name}: x is {x.shape}; it needs 1 to 3 spatial axes between batch and channels")

    def per_axis(v, what, least):
        try:
            vals = (v,) * rank if isinstance(v, int) and not isinstance(v, bool) else tuple(v)
        except TypeError:   # (neither an int nor a sequence)
            vals = ()
        if len(vals) != rank or not all(isinstance(i, int) and not isinstance(i, bool) and least <= i < 2**31 for i in vals):
            raise ValueError(f"{name}: {what}={v!r}; give an int or {rank} ints >= {least} (one per spatial axis), "
                             f"each below 2^31")
        return (1 if least else 0,) * (3 - rank) + vals

    def one(v, what, least):
        if not isinstance(v, int) or isinstance(v, bool) or not least <= v < 2**31:
            raise ValueError(f"{name}: {what}={v!r}; it is an int >= {least}, below 2^31")
        return v

    win = per_axis(window, "window", 1)
    st = per_axis(window if stride is None else stride, "stride", 1)
    pad = per_axis(padding, "padding", 0)
    J = one(channels, "channels", 1)
    str_c = one(J if channel_stride is None else channel_stride, "channel_stride", 1)
    pad_c = one(channel_padding, "channel_padding", 0)
    image = (1,) * (3 - rank) + tuple(x.shape[1:-1])
    return _kiln.pool_layer(x.dtype, op, x.shape[0], x.shape[-1], *image, J, *win, pad_c, *pad, str_c, *st)


def pool(x, window, stride=None, padding=0, op="max", *, channels=1, channel_stride=None, channel_padding=0,
         return_indices=False):
    """Max, average ('avg') or L2 pooling of x (N, [D, [H,]] W, C) over spatial windows; window,
    stride (default: the window) and padding are an int or one int per spatial axis; `channels`
    (with channel_stride, default channels, and channel_padding) pools across that many feature
    maps too. A new tensor; with return_indices (max only) also the winning taps (int32, the
    output's shape), for pool_grad."""
    if return_indices and op != "max":
        raise ValueError(f"pool: return_indices=True is for op='max' (the winning taps); op is {op!r}")
    layer = _pool_geometry("pool", x, window, stride, padding, op, channels, channel_stride, channel_padding)
    out = x.ctx.empty(layer.dimO, x.dtype)
    indices = x.ctx.empty(layer.dimO, _kiln.DType.int32) if return_indices else None
    _kiln.fprop_pool(layer, x, out, argmax=indices)
    return (out, indices) if return_indices else out


def pool_grad(error, x, window, stride=None, padding=0, op="max", *, channels=1, channel_stride=None, channel_padding=0,
              indices=None, y=None):
    """The gradient of pool(x, ...) with respect to x (a new tensor of x's shape and dtype), from
    `error`, the gradient of pool's output. Max pooling takes the winning taps pool gave
    (return_indices=True); L2 pooling the forward output y (and reads x)."""
    layer = _pool_geometry("pool_grad", x, window, stride, padding, op, channels, channel_stride, channel_padding)
    if op == "max" and indices is None:
        raise ValueError("pool_grad: op='max' needs indices, the winning taps from pool(..., return_indices=True)")
    if op == "l2" and y is None:
        raise ValueError("pool_grad: op='l2' needs y, pool's output")
    grad = x.ctx.empty(tuple(x.shape), x.dtype)
    _kiln.bprop_pool(layer, error, grad, argmax=indices, X=x if op == "l2" else None, Y=y if op == "l2" else None)
    return grad


def _lrn_layer(name, x, size):
    _tensor(name, "x", x)
    if x.ndim < 3 or x.ndim > 5:
        raise ValueError(f"{name}: x is {x.shape}; it needs 1 to 3 spatial axes between batch and channels")
    image = (1,) * (5 - x.ndim) + tuple(x.shape[1:-1])
    return _kiln.lrn_layer(x.dtype, x.shape[0], x.shape[-1], *image, size)


def lrn(x, size=5, ascale=1e-4, bpower=0.75, *, return_denom=False):
    """Local response normalisation across `size` channels (odd) of x (N, [D, [H,]] W, C):
    x * denom^-bpower with denom = 1 + ascale * (the window's sum of x^2). A new tensor; with
    return_denom also denom (x's shape and dtype), for lrn_grad."""
    layer = _lrn_layer("lrn", x, size)
    out, denom = x.ctx.empty(tuple(x.shape), x.dtype), x.ctx.empty(tuple(x.shape), x.dtype)
    _kiln.fprop_lrn(layer, x, out, denom, ascale=ascale, bpower=bpower)
    return (out, denom) if return_denom else out


def lrn_grad(error, x, y, denom, size=5, ascale=1e-4, bpower=0.75):
    """The gradient of lrn(x, ...) with respect to x (a new tensor), from `error`, the gradient of
    lrn's output y, and lrn's denom (return_denom=True)."""
    layer = _lrn_layer("lrn_grad", x, size)
    grad = x.ctx.empty(tuple(x.shape), x.dtype)
    _kiln.bprop_lrn(layer, x, y, error, grad, denom, ascale=ascale, bpower=bpower)
    return grad


def _channels(fn, x):
    """x's channel count (its last axis), x a kiln tensor of rank 1 or more."""
    _tensor(fn, "x", x)
    if len(x.shape) == 0:
        raise ValueError(f"{fn}: x is a 0-d tensor; it needs a channel axis (the last)")
    return x.shape[-1]


def batch_norm(x, gamma, beta, eps=1e-5, *, running_mean=None, running_var=None, rho=0.9, training=True, relu=False,
               return_stats=False):
    """Batch normalisation of x (..., C), channels last, per channel: (x - mean) / sqrt(var + eps)
    * gamma + beta (then ReLU where relu). Training: the batch's statistics, and running_mean /
    running_var (float32 (C,), where given) updated as rho * running + (1 - rho) * batch; with
    return_stats also (xsum, xvar), the batch's per-channel sum and variance, for batch_norm_grad.
    Not training: running_mean and running_var normalise. A new tensor of x's shape and dtype."""
    C = _channels("batch_norm", x)
    ctx = x.ctx
    if not training and (running_mean is None or running_var is None):
        raise ValueError("batch_norm: training=False normalises by running_mean and running_var; give both")
    if return_stats and not training:
        raise ValueError("batch_norm: return_stats gives the batch's statistics, which training=False does not compute")
    stats = lambda: ctx.zeros((C,), _kiln.DType.float32)
    xsum, xvar = stats(), stats()
    gmean = running_mean if running_mean is not None else stats()
    gvar = running_var if running_var is not None else stats()
    y = ctx.empty(tuple(x.shape), x.dtype)
    _kiln.compound_fprop_bn(x, xsum, xvar, gmean, gvar, gamma, beta, y, eps, rho, True, relu=relu,
                            inference=not training)
    return (y, xsum, xvar) if return_stats else y


def batch_norm_grad(error, x, gamma, xsum, xvar, eps=1e-5):
    """The gradients of batch_norm(x, gamma, beta, eps) in training, from `error` (the gradient of
    its output) and the batch's xsum and xvar (return_stats=True): (grad_x, grad_gamma,
    grad_beta), new tensors (grad_x of x's shape and dtype; the others float32 (C,))."""
    _tensor("batch_norm_grad", "error", error)
    C = _channels("batch_norm_grad", x)
    ctx = x.ctx
    gx = ctx.empty(tuple(x.shape), x.dtype)
    gg, gb = ctx.empty((C,), _kiln.DType.float32), ctx.empty((C,), _kiln.DType.float32)
    _kiln.compound_bprop_bn(gx, gg, gb, error, x, xsum, xvar, gamma, eps)
    return gx, gg, gb
