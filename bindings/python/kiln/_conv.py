"""kiln.conv: the NumPy-style form of the seeds' convolution (conv_layer + fprop_conv), and in
kiln.nn its transpose and gradients (deconv_layer, bprop_conv, update_conv)."""
import operator

from . import _kiln

_MAX_INT32 = 2**31 - 1


def _int(v):
    """v as a Python int where it is an integer (NumPy's too), else None; bools are not."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _per_axis(value, rank, name, least, fn="conv"):
    """One int per spatial axis, padded on the left to depth, height, width."""
    one = _int(value)
    if one is None and not isinstance(value, (tuple, list)):
        raise TypeError(f"{fn}: {name}={value!r}; give an int or a tuple of {rank} ints (one per spatial axis)")
    values = (one,) * rank if one is not None else tuple(_int(v) for v in value)
    if len(values) != rank or any(v is None for v in values):
        raise ValueError(f"{fn}: {name}={value!r}; give an int or a tuple of {rank} ints (one per spatial axis)")
    if any(v < least for v in values):
        raise ValueError(f"{fn}: {name}={value!r}; every entry must be at least {least}")
    if any(v > _MAX_INT32 for v in values):
        raise ValueError(f"{fn}: {name}={value!r}; every entry is at most 2**31 - 1")
    return (least if least == 1 else 0,) * (3 - rank) + values


def _geometry(fn, act, act_is, filt, filt_is, stride, padding, dilation):
    """(spatial sizes of the activations, of the filters, pads, strides, dilations), each 3 long,
    of activation shape act (N, [D, [H,]] W, C) and filter shape filt (K, [T, [R,]] S, C);
    act_is and filt_is say what they are in the error."""
    rank = len(act) - 2
    if rank < 1 or rank > 3 or len(filt) != len(act):
        raise ValueError(f"{fn}: {act_is} and {filt_is}; both need 1 to 3 spatial axes between batch (or output "
                         "channels) and channels, the same number in each")
    strides = _per_axis(stride, rank, "stride", 1, fn)
    pads = _per_axis(padding, rank, "padding", 0, fn)
    dils = _per_axis(dilation, rank, "dilation", 1, fn)
    return (1,) * (3 - rank) + tuple(act[1:-1]), (1,) * (3 - rank) + tuple(filt[1:-1]), pads, strides, dils


def _tensor(fn, name, t):
    if not isinstance(t, _kiln.Tensor):
        raise TypeError(f"{fn}: {name} must be a kiln tensor; got {type(t).__name__}")
    return t


def conv_transpose(x, w, *, stride=1, padding=0, dilation=1, bias=None, relu=False, slope=0.0, bsum=None, out=None):
    """The transposed convolution (deconvolution) of x (N, [M, [P,]] Q, K) with filters
    w (K, [T, [R,]] S, C): conv's gradient with respect to its input, as a layer. The output is
    (N, [D, [H,]] W, C), each size (input - 1) * stride - 2 * padding + dilation * (filter - 1) + 1;
    bias (C values) and relu (slope: leaky) after it; bsum as conv's. A new tensor of x's dtype,
    or `out`."""
    _tensor("conv_transpose", "x", x)
    _tensor("conv_transpose", "w", w)
    inp, filt, pads, strides, dils = _geometry("conv_transpose", x.shape, f"x is {x.shape}", w.shape, f"w is {w.shape}",
                                               stride, padding, dilation)
    layer = _kiln.deconv_layer(x.dtype, x.shape[0], w.shape[-1], w.shape[0], *inp, *filt, *pads, *strides, *dils)
    if out is None:
        out = x.ctx.empty(layer.dimO, x.dtype)
    return _kiln.fprop_conv(layer, x, w, out, bias=bias, relu=relu, slope=slope, bsum=bsum)


def conv_grad_input(e, w, input_shape, *, stride=1, padding=0, dilation=1, out=None):
    """The gradient of conv(x, w, ...) with respect to x, for x of input_shape (N, [D, [H,]] W, C),
    from e, the gradient of conv's output. A new tensor of e's dtype, or `out`."""
    _tensor("conv_grad_input", "e", e)
    _tensor("conv_grad_input", "w", w)
    shape = tuple(input_shape)
    image, filt, pads, strides, dils = _geometry("conv_grad_input", shape, f"input_shape={shape}", w.shape,
                                                 f"w is {w.shape}", stride, padding, dilation)
    layer = _kiln.conv_layer(e.dtype, shape[0], shape[-1], w.shape[0], *image, *filt, *pads, *strides, *dils)
    if out is None:
        out = e.ctx.empty(layer.dimI, e.dtype)
    return _kiln.bprop_conv(layer, w, e, out)


def conv_grad_weight(x, e, weight_shape, *, stride=1, padding=0, dilation=1, out=None, bias=False):
    """The gradient of conv(x, w, ...) with respect to w of weight_shape (K, [T, [R,]] S, C), from
    e, the gradient of conv's output: a new float32 tensor (or `out`); with bias=True also the
    bias's gradient (e summed over every axis but the channel, float32 (K,))."""
    _tensor("conv_grad_weight", "x", x)
    _tensor("conv_grad_weight", "e", e)
    shape = tuple(weight_shape)
    image, filt, pads, strides, dils = _geometry("conv_grad_weight", x.shape, f"x is {x.shape}", shape,
                                                 f"weight_shape={shape}", stride, padding, dilation)
    layer = _kiln.conv_layer(x.dtype, x.shape[0], x.shape[-1], shape[0], *image, *filt, *pads, *strides, *dils)
    if out is None:
        out = x.ctx.empty(shape, _kiln.DType.float32)
    gb = x.ctx.empty((shape[0],), _kiln.DType.float32) if bias else None
    _kiln.update_conv(layer, x, e, out, grad_bias=gb)
    return (out, gb) if bias else out


def conv(x, w, *, stride=1, padding=0, dilation=1, groups=1, bias=None, relu=False, slope=0.0, bsum=None, out=None):
    """Convolution of x (N, [D, [H,]] W, C) with filters w (K, [T, [R,]] S, C), channels innermost.

    One to three spatial axes; stride, padding and dilation are an int or one int per spatial
    axis; bias holds one value per output channel; relu (with slope: leaky) applies after it;
    bsum, where given ((K,) or (K, 1)), receives the output's per-channel sums. Returns a new
    tensor (N, [M, [P,]] Q, K) of x's dtype on x's context, or fills `out`.
    Grouped convolution (groups > 1) is not supported.
    """
    if groups != 1:
        raise NotImplementedError(f"conv: groups={groups!r}; kiln's convolution is not grouped: split the channels of x "
                                  "and w into groups and call conv once per group")
    _tensor("conv", "x", x)
    _tensor("conv", "w", w)
    image, filt, pads, strides, dils = _geometry("conv", x.shape, f"x is {x.shape}", w.shape, f"w is {w.shape}", stride,
                                                 padding, dilation)
    layer = _kiln.conv_layer(x.dtype, x.shape[0], x.shape[-1], w.shape[0], *image, *filt, *pads, *strides, *dils)
    if out is None:
        out = x.ctx.empty(layer.dimO, x.dtype)
    return _kiln.fprop_conv(layer, x, w, out, bias=bias, relu=relu, slope=slope, bsum=bsum)
