"""kiln.nn: NumPy-style functional forms of the network layers.

Convolution runs at once (kiln.conv); the others return lazy kiln expressions that fuse with
whatever they are assigned into. The seeds' (neon's) forms are Context methods and module
functions of kiln: compound_fprop_bn, compound_bprop_bn, fprop_softmax, fprop_relu, bprop_relu,
conv_layer, fprop_conv, bprop_conv, update_conv.
"""
from . import _kiln
from ._conv import conv  # noqa: F401 - re-exported


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


def pool(x, window, stride=None, padding=0, op="max"):
    """Max, average ('avg') or L2 pooling of x (N, [D, [H,]] W, C) over spatial windows; window,
    stride (default: the window) and padding are an int or one int per spatial axis. A new tensor."""
    if not isinstance(x, _kiln.Tensor):
        raise TypeError(f"pool: x must be a kiln tensor; got {type(x).__name__}")
    rank = x.ndim - 2
    if rank < 1 or rank > 3:
        raise ValueError(f"pool: x is {x.shape}; it needs 1 to 3 spatial axes between batch and channels")

    def per_axis(v, name, least):
        try:
            vals = (v,) * rank if isinstance(v, int) and not isinstance(v, bool) else tuple(v)
        except TypeError:   # (neither an int nor a sequence)
            vals = ()
        if len(vals) != rank or not all(isinstance(i, int) and not isinstance(i, bool) and least <= i < 2**31 for i in vals):
            raise ValueError(f"pool: {name}={v!r}; give an int or {rank} ints >= {least} (one per spatial axis), "
                             f"each below 2^31")
        return (1 if least else 0,) * (3 - rank) + vals

    win = per_axis(window, "window", 1)
    st = per_axis(window if stride is None else stride, "stride", 1)
    pad = per_axis(padding, "padding", 0)
    image = (1,) * (3 - rank) + tuple(x.shape[1:-1])
    layer = _kiln.pool_layer(x.dtype, op, x.shape[0], x.shape[-1], *image, 1, *win, 0, *pad, None, *st)
    out = x.ctx.empty(layer.dimO, x.dtype)
    return _kiln.fprop_pool(layer, x, out)
