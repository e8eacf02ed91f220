"""kiln.conv: the NumPy-style form of the seeds' convolution (conv_layer + fprop_conv)."""
from . import _kiln


def _per_axis(value, rank, name, least):
    """One int per spatial axis, padded on the left to depth, height, width."""
    if isinstance(value, bool) or not isinstance(value, (int, tuple, list)):
        raise TypeError(f"conv: {name}={value!r}; give an int or a tuple of {rank} ints (one per spatial axis)")
    values = (value,) * rank if isinstance(value, int) else tuple(value)
    if len(values) != rank or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"conv: {name}={value!r}; give an int or a tuple of {rank} ints (one per spatial axis)")
    if any(v < least for v in values):
        raise ValueError(f"conv: {name}={value!r}; every entry must be at least {least}")
    return (least if least == 1 else 0,) * (3 - rank) + values


def conv(x, w, *, stride=1, padding=0, dilation=1, groups=1, bias=None, relu=False, slope=0.0, out=None):
    """Convolution of x (N, [D, [H,]] W, C) with filters w (K, [T, [R,]] S, C), channels innermost.

    One to three spatial axes; stride, padding and dilation are an int or one int per spatial
    axis; bias holds one value per output channel; relu (with slope: leaky) applies after it.
    Returns a new tensor (N, [M, [P,]] Q, K) of x's dtype on x's context, or fills `out`.
    Grouped convolution (groups > 1) is not supported.
    """
    if groups != 1:
        raise NotImplementedError(f"conv: groups={groups!r}; kiln's convolution is not grouped: split the channels of x "
                                  "and w into groups and call conv once per group")
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, _kiln.Tensor):
            raise TypeError(f"conv: {name} must be a kiln tensor; got {type(t).__name__}")
    rank = x.ndim - 2
    if rank < 1 or rank > 3 or w.ndim != x.ndim:
        raise ValueError(f"conv: x is {x.shape} and w is {w.shape}; both need 1 to 3 spatial axes between batch (or "
                         "output channels) and channels, the same number in each")
    image = (1,) * (3 - rank) + tuple(x.shape[1:-1])
    filt = (1,) * (3 - rank) + tuple(w.shape[1:-1])
    strides = _per_axis(stride, rank, "stride", 1)
    pads = _per_axis(padding, rank, "padding", 0)
    dils = _per_axis(dilation, rank, "dilation", 1)
    layer = _kiln.conv_layer(x.dtype, x.shape[0], x.shape[-1], w.shape[0], *image, *filt, *pads, *strides, *dils)
    if out is None:
        out = x.ctx.empty(layer.dimO, x.dtype)
    return _kiln.fprop_conv(layer, x, w, out, bias=bias, relu=relu, slope=slope)
