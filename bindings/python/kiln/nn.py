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
    soft) or, for p of shape (rows, classes), an integer tensor of class indices (rows,).
    -sum(target * log(p)) over axis (log clamped at exp(-50)), then the mean or the sum over rows."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"cross_entropy: reduction={reduction!r}; it is 'mean' or 'sum'")
    return _kiln._cross_entropy(p, target, axis, reduction == "mean")
