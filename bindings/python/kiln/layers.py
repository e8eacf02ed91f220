"""kiln.layers: network layers as objects, as nervanagpu's benchmarks had them, and a Network of them.

Activations are channels-last, (N, H, W, C) or (N, features), in the network's dtype on its
context. Each layer is configured with its input shape (``configure``: output shape, FLOPs,
nothing allocated), allocates its parameters on first use, and has ``fprop(x) -> y`` and
``bprop(error, input_grad=True) -> the input's gradient`` (filling its parameters' gradients; with
input_grad=False bprop gives None and skips the input's gradient where it is separate work, as for
a network's first layer, whose input is data: batch norm's comes from the kernel that gives its
parameters' gradients). The operations are
kiln's: ``fprop_conv`` / ``bprop_conv`` / ``update_conv`` (bias and ReLU in the convolution's
epilogue), ``fprop_pool`` / ``bprop_pool``, ``fprop_lrn`` / ``bprop_lrn``, ``compound_fprop_bn`` /
``compound_bprop_bn``, ``compound_dot`` and the expressions of ``kiln.nn``. With
``Network(..., conv_sums=True)`` a Conv without ReLU followed by a BatchNorm adds up the batch
norm's per-channel sums in its epilogue (fprop_conv's bsum), and the batch norm does not read its
input for them; ``Network.train()`` / ``eval()`` switch batch norms between the batch's and the
running statistics.

    net = kiln.layers.Network([Conv(16, 3, pad=1, relu=True), Pool("max", 2), FC(10)],
                              (32, 28, 28, 1), dtype=kiln.float32, ctx=ctx)
    loss = net.train_step(x, labels, lr=0.1)        # fprop, softmax cross-entropy, bprop, SGD
"""
import math

import numpy as np

from . import _kiln
from . import nn as _nn
from ._dtypes import float32 as _float32


def _numel(shape):
    return int(np.prod(shape)) if shape else 1


class Layer:
    """A layer: configure(in_shape) -> out_shape, fprop, bprop, params()."""

    flops = 0.0

    def configure(self, in_shape, dtype, ctx, rng):
        self.in_shape, self.dtype, self.ctx, self.rng = tuple(in_shape), dtype, ctx, rng
        self.out_shape = self._configure(self.in_shape)
        return self.out_shape

    def _configure(self, in_shape):
        return in_shape

    def params(self):
        """(parameter, gradient) pairs, allocated on first use."""
        return []

    def _through_relu(self, e):
        """The error before a fused ReLU (relu set): e where the output is positive, else 0."""
        if not getattr(self, "relu", False):
            return e
        g = self.ctx.empty(self.out_shape, self.dtype)
        g[...] = _nn.relu_grad(self.y, e)
        return g

    def __repr__(self):
        return f"{type(self).__name__}{getattr(self, 'in_shape', '')}->{getattr(self, 'out_shape', '')}"


def _as4(shape):
    """A layer's shape as (N, H, W, C): kiln gives a layer's tensors in its spatial rank."""
    shape = tuple(shape)
    return shape if len(shape) == 4 else (shape[0], 1) + shape[1:] if len(shape) == 3 else shape[:1] + shape[2:]


def _spatial(in_shape, name):
    if len(in_shape) != 4:
        raise ValueError(f"{name}: input {in_shape}; it takes (N, H, W, C) activations")
    return in_shape


class Conv(Layer):
    """K filters of R x S (x C), padding, stride; bias and ReLU fused into the convolution."""

    def __init__(self, K, R, S=None, pad=0, stride=1, relu=False, bias=True):
        self.K, self.R, self.S = K, R, S if S is not None else R
        self.pad, self.stride, self.relu, self.use_bias = pad, stride, relu, bias
        self.F = None
        self.sums_for = None   # the BatchNorm after it, whose per-channel sums its epilogue adds up

    def _configure(self, in_shape):
        N, H, W, C = _spatial(in_shape, "Conv")
        self.layer = _kiln.conv_layer(self.dtype, N, C, self.K, H=H, W=W, R=self.R, S=self.S, pad_h=self.pad,
                                      pad_w=self.pad, str_h=self.stride, str_w=self.stride)
        self.flops = self.layer.flops
        return _as4(self.layer.dimO)

    def params(self):
        if self.F is None:
            C = self.in_shape[3]
            fan_in = C * self.R * self.S
            w = self.rng.normal(0, math.sqrt(2.0 / fan_in), (self.K, self.R, self.S, C)).astype(np.float32)
            self.F, self.dF = self.ctx.array(w, self.dtype), self.ctx.zeros(w.shape, self.dtype)
            self.b, self.db = self.ctx.zeros((self.K,), _float32), self.ctx.zeros((self.K,), _float32)
        return [(self.F, self.dF)] + ([(self.b, self.db)] if self.use_bias else [])

    def fprop(self, x):
        self.params()
        self.x = x
        self.y = self.ctx.empty(self.out_shape, self.dtype)
        bsum = None
        if self.sums_for is not None and self.sums_for.training:
            self.sums_for.params()   # (its xsum allocated)
            bsum = self.sums_for.xsum
        _kiln.fprop_conv(self.layer, x, self.F, self.y, bias=self.b if self.use_bias else None, relu=self.relu, bsum=bsum)
        return self.y

    def bprop(self, e, input_grad=True):
        e = self._through_relu(e)
        _kiln.update_conv(self.layer, self.x, e, self.dF, grad_bias=self.db if self.use_bias else None)
        if not input_grad:
            return None
        gx = self.ctx.empty(self.in_shape, self.dtype)
        _kiln.bprop_conv(self.layer, self.F, e, gx)
        return gx


class Pool(Layer):
    """op ('max', 'avg' or 'l2') over window x window positions, stride (default: the window);
    with J > 1 also across J feature maps (channel stride str_c, default J; padding pad_c)."""

    def __init__(self, op, window, stride=None, pad=0, J=1, str_c=None, pad_c=0):
        self.op, self.window, self.stride, self.pad = op, window, stride or window, pad
        self.J, self.str_c, self.pad_c = J, str_c, pad_c

    def _configure(self, in_shape):
        N, H, W, C = _spatial(in_shape, "Pool")
        self.layer = _kiln.pool_layer(self.dtype, self.op, N, C, H=H, W=W, J=self.J, R=self.window, S=self.window,
                                      pad_c=self.pad_c, pad_h=self.pad, pad_w=self.pad, str_c=self.str_c,
                                      str_h=self.stride, str_w=self.stride)
        return _as4(self.layer.dimO)

    def fprop(self, x):
        self.x = x
        self.y = self.ctx.empty(self.out_shape, self.dtype)
        self.argmax = self.ctx.empty(self.out_shape, _kiln_int32()) if self.op == "max" else None
        _kiln.fprop_pool(self.layer, x, self.y, argmax=self.argmax)
        return self.y

    def bprop(self, e, input_grad=True):
        if not input_grad:
            return None
        gx = self.ctx.empty(self.in_shape, self.dtype)
        _kiln.bprop_pool(self.layer, e, gx, argmax=self.argmax, X=self.x, Y=self.y)
        return gx


def _kiln_int32():
    from ._dtypes import int32
    return int32


class LRN(Layer):
    """Local response normalisation across J channels: x (1 + ascale * window sum of x^2)^-bpower."""

    def __init__(self, J=5, ascale=1e-4, bpower=0.75):
        self.J, self.ascale, self.bpower = J, ascale, bpower

    def _configure(self, in_shape):
        N, H, W, C = _spatial(in_shape, "LRN")
        self.layer = _kiln.lrn_layer(self.dtype, N, C, H=H, W=W, J=self.J)
        return in_shape

    def fprop(self, x):
        self.x = x
        self.y = self.ctx.empty(self.out_shape, self.dtype)
        self.denom = self.ctx.empty(self.out_shape, self.dtype)
        _kiln.fprop_lrn(self.layer, x, self.y, self.denom, ascale=self.ascale, bpower=self.bpower)
        return self.y

    def bprop(self, e, input_grad=True):
        if not input_grad:
            return None
        gx = self.ctx.empty(self.in_shape, self.dtype)
        _kiln.bprop_lrn(self.layer, self.x, self.y, e, gx, self.denom, ascale=self.ascale, bpower=self.bpower)
        return gx


class BatchNorm(Layer):
    """Batch normalisation over every axis but the channels, gamma and beta learned, running
    statistics kept with rho; optional ReLU after it."""

    def __init__(self, eps=1e-5, rho=0.9, relu=False):
        self.eps, self.rho, self.relu = eps, rho, relu
        self.gamma = None
        self.training = True      # False: the running statistics normalise (Network.train / eval)
        self.sums_given = False   # the Conv before it adds up x's per-channel sums (xsum) as it stores x

    def params(self):
        if self.gamma is None:
            C = self.in_shape[-1]
            z = lambda: self.ctx.zeros((C,), _float32)
            self.gamma, self.beta = self.ctx.array(np.ones(C, np.float32), _float32), z()
            self.dgamma, self.dbeta = z(), z()
            self.xsum, self.xvar, self.gmean, self.gvar = z(), z(), z(), self.ctx.array(np.ones(C, np.float32), _float32)
        return [(self.gamma, self.dgamma), (self.beta, self.dbeta)]

    def fprop(self, x, residual=None, out=None, relu=None):
        """residual, when given, is added before the ReLU (relu overrides the layer's own) in the
        same kernel, and out (else a new tensor) receives the result: a residual block's end.
        bprop knows neither: the caller takes the gradient through that ReLU and to the residual
        (as Residual.bprop does)."""
        self.params()
        self.x = x
        self.y = out if out is not None else self.ctx.empty(self.out_shape, self.dtype)
        _kiln.compound_fprop_bn(x, self.xsum, self.xvar, self.gmean, self.gvar, self.gamma, self.beta, self.y,
                                self.eps, self.rho, not self.sums_given, relu=self.relu if relu is None else relu,
                                inference=not self.training, residual=residual)
        return self.y

    def bprop(self, e, input_grad=True):
        e = self._through_relu(e)
        gx = self.ctx.empty(self.in_shape, self.dtype)
        _kiln.compound_bprop_bn(gx, self.dgamma, self.dbeta, e, self.x, self.xsum, self.xvar, self.gamma, self.eps)
        return gx if input_grad else None


class FC(Layer):
    """Fully connected: y = relu?(x W^T + b) over the input flattened to (N, features)."""

    def __init__(self, K, relu=False, bias=True):
        self.K, self.relu, self.use_bias = K, relu, bias
        self.W = None

    def _configure(self, in_shape):
        self.N, self.features = in_shape[0], _numel(in_shape[1:])
        self.flops = 2.0 * self.N * self.features * self.K
        return (self.N, self.K)

    def params(self):
        if self.W is None:
            w = self.rng.normal(0, math.sqrt(2.0 / self.features), (self.K, self.features)).astype(np.float32)
            self.W, self.dW = self.ctx.array(w, self.dtype), self.ctx.zeros(w.shape, self.dtype)
            self.b, self.db = self.ctx.zeros((self.K,), _float32), self.ctx.zeros((self.K,), _float32)
        return [(self.W, self.dW)] + ([(self.b, self.db)] if self.use_bias else [])

    def fprop(self, x):
        self.params()
        self.x = x.reshape((self.N, self.features))
        self.y = self.ctx.empty(self.out_shape, self.dtype)
        _kiln.compound_dot(self.x, self.W.T, self.y, relu=self.relu, bias=self.b if self.use_bias else None)
        return self.y

    def bprop(self, e, input_grad=True):
        e = self._through_relu(e)
        if self.use_bias:
            self.db[...] = e.sum(axis=0)
        _kiln.compound_dot(e.T, self.x, self.dW)
        if not input_grad:
            return None
        gx = self.ctx.empty((self.N, self.features), self.dtype)
        _kiln.compound_dot(e, self.W, gx)
        return gx.reshape(self.in_shape)


class ReLU(Layer):
    def fprop(self, x):
        self.y = self.ctx.empty(self.out_shape, self.dtype)
        self.y[...] = _nn.relu(x)
        return self.y

    def bprop(self, e, input_grad=True):
        if not input_grad:
            return None
        gx = self.ctx.empty(self.in_shape, self.dtype)
        gx[...] = _nn.relu_grad(self.y, e)
        return gx


class Softmax(Layer):
    """The probabilities over the classes of logits (N, classes). Last in a Network, it pairs with
    the network's CrossEntropy cost: bprop_loss gives the gradient with respect to the logits,
    (p - onehot) / N, and the network's bprop starts below the Softmax."""

    def _configure(self, in_shape):
        if len(in_shape) != 2:
            raise ValueError(f"Softmax: input {in_shape}; it takes (N, classes) logits")
        return in_shape

    def fprop(self, x):
        self.y = self.ctx.empty(self.out_shape, self.dtype)
        self.y[...] = _nn.softmax(x)
        return self.y

    def bprop(self, e, input_grad=True):
        """The gradient with respect to the logits from e, the probabilities' gradient:
        y (e - sum(e y)) along the classes."""
        if not input_grad:
            return None
        gx = self.ctx.empty(self.in_shape, self.dtype)
        gx[...] = self.y * (e - (e * self.y).sum(axis=-1, keepdims=True))
        return gx


class CrossEntropy:
    """The cost: cross-entropy of probabilities p (N, classes) against class indices, the mean
    (or with reduction='sum' the sum) over the batch."""

    def __init__(self, reduction="mean"):
        if reduction not in ("mean", "sum"):
            raise ValueError(f"CrossEntropy: reduction={reduction!r}; it is 'mean' or 'sum'")
        self.reduction = reduction

    def _scale(self, p):
        if self.reduction == "mean" and p.shape[0] == 0:
            raise ValueError("CrossEntropy: a batch of 0 rows has no mean loss")
        return 1.0 / p.shape[0] if self.reduction == "mean" else 1.0

    def fprop(self, p, labels):
        """The loss (a float) of probabilities p against int class indices labels (N,)."""
        return float(np.asarray(_nn.cross_entropy(p, labels, reduction=self.reduction)))

    def bprop(self, p, onehot):
        """The gradient with respect to p: -onehot / p (p clamped at exp(-50), as the loss's log),
        over N for the mean; a new float32 tensor."""
        g = p.ctx.empty(tuple(p.shape), _float32)
        g[...] = -onehot / _kiln.maximum(p, float(np.exp(-50.0))) * self._scale(p)
        return g

    def bprop_logits(self, p, onehot):
        """The gradient with respect to the logits of p = softmax(logits): (p - onehot), over N
        for the mean (softmax's and cross-entropy's gradients in one step); a new float32 tensor."""
        g = p.ctx.empty(tuple(p.shape), _float32)
        g[...] = (p - onehot) * self._scale(p)
        return g


def _bprop_chain(layers, e, input_grad, on_grads=None):
    """e back through layers in reverse order; the first of them gives its input's gradient only
    with input_grad (an empty chain, an identity, gives e); on_grads(pairs), when given, gets each
    layer's (param, grad) pairs as soon as its bprop has been given."""
    for i in reversed(range(len(layers))):
        e = layers[i].bprop(e, input_grad=input_grad or i > 0)
        if on_grads is not None:
            pairs = layers[i].params()
            if pairs:
                on_grads(pairs)
    return e


def _chain_sums(layers):
    """A Conv without ReLU followed by a BatchNorm: the convolution's epilogue adds up the batch
    norm's per-channel sums as it stores its output (the seeds' bsum), which the batch norm then
    does not read its input for."""
    for a, b in zip(layers, layers[1:]):
        if isinstance(a, Conv) and not a.relu and isinstance(b, BatchNorm):
            a.sums_for, b.sums_given = b, True


def _each_layer(layers):
    for layer in layers:
        yield layer
        if isinstance(layer, Residual):
            yield from _each_layer(layer.branch + layer.shortcut)


class Residual(Layer):
    """y = relu(branch(x) + shortcut(x)): ResNet's block; shortcut is the identity or a projection
    (a list of layers, e.g. a strided 1x1 Conv and BatchNorm)."""

    def __init__(self, branch, shortcut=()):
        self.branch, self.shortcut = list(branch), list(shortcut)

    def _configure(self, in_shape):
        shape = in_shape
        for layer in self.branch:
            shape = layer.configure(shape, self.dtype, self.ctx, self.rng)
        short = in_shape
        for layer in self.shortcut:
            short = layer.configure(short, self.dtype, self.ctx, self.rng)
        if tuple(short) != tuple(shape):
            raise ValueError(f"Residual: the branch gives {shape} and the shortcut {short}; they must agree")
        self.flops = sum(layer.flops for layer in self.branch + self.shortcut)
        return shape

    def params(self):
        return [p for layer in self.branch + self.shortcut for p in layer.params()]

    def fprop(self, x):
        # A branch ending in batch norm (ResNet's) ends in one kernel: relu(bn(b) + shortcut), the
        # branch's normalised output never written on its own. Its bprop is unchanged: the batch
        # norm, without a ReLU of its own, takes the block's gradient through the block's ReLU.
        last = self.branch[-1] if self.branch else None
        fused = isinstance(last, BatchNorm) and not last.relu
        b = x
        for layer in self.branch[:-1] if fused else self.branch:
            b = layer.fprop(b)
        s = x
        for layer in self.shortcut:
            s = layer.fprop(s)
        self.y = self.ctx.empty(self.out_shape, self.dtype)
        if fused:
            last.fprop(b, residual=s, out=self.y, relu=True)
        else:
            self.y[...] = _nn.relu(b + s)
        return self.y

    def bprop(self, e, input_grad=True):
        g = self.ctx.empty(self.out_shape, self.dtype)
        g[...] = _nn.relu_grad(self.y, e)
        b = _bprop_chain(self.branch, g, input_grad)
        s = _bprop_chain(self.shortcut, g, input_grad)
        if not input_grad:
            return None
        gx = self.ctx.empty(self.in_shape, self.dtype)
        gx[...] = b + s
        return gx


class Network:
    """Layers in order, ending in logits (N, classes) or in a Softmax; the cost (default
    CrossEntropy()) of the probabilities as the loss."""

    def __init__(self, layers, in_shape, dtype=_float32, ctx=None, seed=0, conv_sums=False, cost=None):
        self.layers, self.dtype = list(layers), dtype
        self.cost = cost if cost is not None else CrossEntropy()
        self._softmax_last = bool(self.layers) and isinstance(self.layers[-1], Softmax)
        self.ctx = ctx if ctx is not None else _kiln_default_context()
        self.rng = np.random.default_rng(seed)
        shape = tuple(in_shape)
        for layer in self.layers:
            shape = layer.configure(shape, dtype, self.ctx, self.rng)
        if len(shape) != 2:
            raise ValueError(f"Network: the last layer gives {shape}; a network ends in logits (N, classes)")
        if conv_sums:   # in every list of layers, a Residual's branch and shortcut too
            _chain_sums(self.layers)
            for layer in _each_layer(self.layers):
                if isinstance(layer, Residual):
                    _chain_sums(layer.branch)
                    _chain_sums(layer.shortcut)
        self.out_shape = shape
        self.flops = sum(layer.flops for layer in self.layers)

    def params(self):
        return [p for layer in self.layers for p in layer.params()]

    def train(self, mode=True):
        """Batch norms normalise by the batch's statistics and update the running ones (mode
        True, the default) or normalise by the running statistics (False); the network."""
        for layer in _each_layer(self.layers):
            if isinstance(layer, BatchNorm):
                layer.training = bool(mode)
        return self

    def eval(self):
        """train(False)."""
        return self.train(False)

    def fprop(self, x):
        for layer in self.layers:
            x = layer.fprop(x)
        return x

    def bprop(self, e, on_grads=None, input_grad=True):
        """Back-propagates e through the layers and gives the input's gradient (None with
        input_grad=False: the first layer then skips it, as a training step does, its input
        being data); on_grads(pairs), when given, is called with each layer's (param, grad) pairs
        as soon as its bprop has been given (a data-parallel trainer starts their all-reduce
        there, overlapping the layers still to come)."""
        # (A final Softmax's gradient comes with the cost's: bprop_loss gives the logits'.)
        return _bprop_chain(self.layers[:-1] if self._softmax_last else self.layers, e, input_grad, on_grads)

    def loss(self, out, labels):
        """The cost of the network's output against int32 class indices: of softmax(out) for
        logits, of out itself where the last layer is a Softmax; keeps the probabilities for
        bprop_loss."""
        if self._softmax_last:
            self.probs = out
        else:
            self.probs = self.ctx.empty(out.shape, _float32)
            self.probs[...] = _nn.softmax(out)
        return self.cost.fprop(self.probs, labels)

    def bprop_loss(self, labels_onehot):
        """The gradient of the cost with respect to the logits (the input of a final Softmax):
        (p - onehot) / N for the mean cross-entropy; what bprop takes."""
        e = self.ctx.empty(self.layers[-1].in_shape if self._softmax_last else self.out_shape, self.dtype)
        e[...] = self.cost.bprop_logits(self.probs, labels_onehot)
        return e

    def train_step(self, x, labels, onehot, lr):
        """One step of plain SGD; returns the loss before it."""
        loss = self.loss(self.fprop(x), labels)
        self.bprop(self.bprop_loss(onehot), input_grad=False)
        for p, g in self.params():
            p[...] = p - g * lr
        return loss


def _kiln_default_context():
    from ._context import default_context
    return default_context()
