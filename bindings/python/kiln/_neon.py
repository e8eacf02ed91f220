"""kiln.NervanaGPU: neon's NervanaGPU backend, method for method (docs/neon.md).

A Context whose constructor takes neon's arguments in neon's order, and whose methods add neon's
that kiln's Context does not have under those names or argument orders: compound_dot's (alpha,
beta, relu, bsum, repeat, size), dot with relu, the reductions' partial=, make_binary_mask,
shift, binarize, compensated_sum, copy_transpose, add_fc_bias, update_fc_bias,
xnor_compound_dot, and neon's model plumbing (iobuf, consume, scratch memory, the data hooks).
Keywords that mean nothing in kiln are accepted and warned about once.
"""
import warnings

import numpy as np

from . import _kiln
from ._context import Context
from ._dtypes import float32, int32

_warned = set()


def _no_effect(what, why):
    """Warns once per process that a neon keyword has no effect in kiln."""
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"NervanaGPU: {what} has no effect in kiln ({why})", stacklevel=3)


def _repeat(n, op):
    if isinstance(n, bool) or not hasattr(n, "__index__") or n.__index__() < 1:
        raise _kiln.InvalidArgument(f"{op}: repeat = {n!r}; valid: a number of runs, at least 1")
    return n.__index__()


class NervanaGPU(Context):
    """neon's NervanaGPU(rng_seed=None, default_dtype=np.float32, stochastic_round=False,
    deterministic=None, device_id=0, bench=False, scratch_size=0, hist_bins=64, hist_offset=-48,
    compat_mode=None, enable_winograd=True, num_devices=1), plus kiln's device= (None: the GPU when
    there is one; 'cpu', 'cuda:N'), allow_tf32= and kernel_cache_capacity= as keywords.

    deterministic: kiln's reductions are always deterministic. scratch_size, enable_winograd and
    compat_mode ('caffe' changed neon's conv and pool output sizes) select nothing in kiln: each is
    accepted and warned about once when it differs from neon's default. hist_bins / hist_offset are
    the numerics histograms' bins (set_hist_buffers, kiln.hist, dump_hist_data).
    """

    def __init__(self, rng_seed=None, default_dtype=np.float32, stochastic_round=False, deterministic=None,
                 device_id=0, bench=False, scratch_size=0, hist_bins=64, hist_offset=-48, compat_mode=None,
                 enable_winograd=True, num_devices=1, *, device=None, allow_tf32=False, kernel_cache_capacity=None):
        if compat_mode is not None:
            _no_effect("compat_mode", "conv_layer and pool_layer take their output sizes from their arguments")
        if enable_winograd is not True:
            _no_effect("enable_winograd", "kiln's convolutions are implicit and explicit GEMMs, never Winograd")
        super().__init__(device, default_dtype=default_dtype, stochastic_round=stochastic_round, rng_seed=rng_seed,
                         device_id=device_id, bench=bench, deterministic=deterministic, allow_tf32=allow_tf32,
                         kernel_cache_capacity=kernel_cache_capacity, num_devices=num_devices)
        if hist_bins != 64 or hist_offset != -48:
            self.set_hist_buffers(hist_bins, hist_offset)
        self.bsz = None            # neon's batch size, which its model sets; iobuf needs it
        self._scratch_size = 0
        self._scratch_offset = 0
        self._scratch = None
        self._events = None
        if scratch_size:
            self.set_scratch_size(scratch_size)

    def __repr__(self):
        return f"kiln.NervanaGPU(device='{self.device}', default_dtype={self.default_dtype})"

    # ---- neon's backend plumbing
    _caffe_compat = False

    def begin(self, block, identifier):
        """neon's start of a block of repeated computation: nothing to do in kiln."""

    def end(self, block, identifier):
        """neon's end of a block of repeated computation: nothing to do in kiln."""

    def is_mkl(self):
        return False

    def cleanup_backend(self):
        """Finishes the work given so far (neon released its buffers here)."""
        self.synchronize()

    # ---- neon's model plumbing: buffers, data movement, scratch memory
    @staticmethod
    def backend_choices():
        """The backends allocate_backend makes: 'cpu' and 'gpu' (kiln's CUDA contexts)."""
        return ["cpu", "gpu"]

    @staticmethod
    def allocate_backend(name, **kargs):
        """A new NervanaGPU on the named backend ('cpu' or 'gpu'), made with kargs."""
        if name not in ("cpu", "gpu"):
            raise _kiln.InvalidArgument(f"allocate_backend: backend must be one of ('cpu', 'gpu'); got {name!r}")
        return NervanaGPU(device="cpu" if name == "cpu" else "cuda", **kargs)

    def iobuf(self, dim0, x=None, dtype=None, name=None, persist_values=True, shared=None, parallelism=None):
        """neon's layer buffer for the batch size bsz, zeroed: (dim0[0], dim0[1] * bsz) for a pair,
        (prod(dim0), bsz) for a longer shape, (dim0, bsz) for a number; x itself when given. shared:
        a larger buffer whose first elements become this one (neon's shared output buffers). name
        and persist_values select nothing in kiln."""
        if x is not None:
            return x
        if self.bsz is None:
            raise _kiln.InvalidArgument("iobuf: the batch size is not set; set ng.bsz (neon's model sets it) first")
        if isinstance(dim0, tuple):
            shape = (dim0[0], dim0[1] * self.bsz) if len(dim0) == 2 else (int(np.prod(dim0)), self.bsz)
        else:
            shape = (dim0, self.bsz)
        if shared is not None:
            if tuple(shared.shape) == shape:
                buf = shared
            else:
                n = int(np.prod(shape))
                if n > shared.size:
                    raise _kiln.InvalidArgument(f"iobuf: the shared buffer holds {shared.size} elements; {shape} needs {n}")
                buf = shared.reshape(-1)[:n].reshape(shape)
        else:
            buf = self.empty(shape, dtype)
        buf[...] = 0
        return buf

    def shared_iobuf_size(self, shape, parallelism):
        """The elements a buffer of `shape` shared between layers needs: one copy per device,
        except for data- and model-parallel layers."""
        devices = 1 if parallelism in ("Data", "Model") else self.num_devices
        return devices * int(np.prod(shape))

    def distribute_data(self, tensor, layer_parallelism):
        """neon's distribution across devices: one device per NervanaGPU here, nothing to move."""
        return None

    def revert_tensor(self, tensor):
        """Undoes distribute_data: nothing to undo."""

    def convert_data(self, tensor, layer_mkl):
        """neon's MKL layout conversion: kiln has one layout, nothing to convert."""

    def clean_data(self, tensor, layer_mkl):
        """neon's MKL clean-up: nothing to clean."""

    def allocate_new_deltas(self, delta, in_shape, parallelism):
        """neon's MKL delta buffers: the given one serves."""
        return delta

    def allocate_new_outputs(self, layer, share_output):
        """Has the layer allocate its outputs, sharing share_output (neon's Layer.allocate)."""
        layer.allocate(shared_outputs=share_output)

    def consume(self, buf_index, hostlist, devlist):
        """neon's double-buffered data loading: devlist[buf_index] = hostlist[buf_index].T on the
        device (made on first use, with the host array's dtype)."""
        if buf_index not in (0, 1):
            raise _kiln.InvalidArgument(f"consume: buf_index = {buf_index!r}; valid: 0 or 1 (two buffers)")
        host = np.ascontiguousarray(np.asarray(hostlist[buf_index]).T)
        if devlist[buf_index] is None:
            devlist[buf_index] = self.empty(host.shape, host.dtype)
        devlist[buf_index][...] = host

    def execute(self, optree):
        """Evaluates a kiln expression (neon's op-tree) and returns the tensor holding it; a tensor
        is returned as it is."""
        return optree.eval() if isinstance(optree, _kiln.Expr) else optree

    def get_events(self):
        """neon's pair of start and end events: two timing marks of this context, the same pair
        on every call (record_mark, synchronize_mark, get_time)."""
        if self._events is None:
            self._events = (self.init_mark(), self.init_mark())
        return self._events

    @staticmethod
    def _round_scratch(size):
        if isinstance(size, bool) or not hasattr(size, "__index__") or size.__index__() < 0:
            raise _kiln.InvalidArgument(f"scratch: size = {size!r}; valid: a number of bytes, at least 0")
        size = size.__index__()
        return size + (-size) % 128

    def set_scratch_size(self, *args):
        """Grows the scratch memory to the sum of the sizes (bytes, each rounded up to 128);
        never shrinks it."""
        total = sum(self._round_scratch(a) for a in args)
        if total > self._scratch_size:
            self._scratch_size = total
            self._scratch = None

    def scratch_buffer_init(self):
        """Carving starts again at the scratch memory's start."""
        self._scratch_offset = 0

    def _scratch_view(self, start, size):
        if self._scratch is None:
            self._scratch = self.empty((self._scratch_size,), np.uint8)
        return self._scratch[start:start + size]

    def scratch_buffer(self, size):
        """The scratch memory's first `size` bytes (rounded up to 128), as a uint8 tensor (neon
        returned the address); later scratch_buffer_offset pieces follow it."""
        size = self._round_scratch(size)
        if size > self._scratch_size:
            raise _kiln.InvalidArgument(f"scratch_buffer: {size} bytes requested, the scratch memory holds "
                                        f"{self._scratch_size} (set_scratch_size)")
        self._scratch_offset = size
        return self._scratch_view(0, size)

    def scratch_buffer_offset(self, size):
        """The next `size` bytes of the scratch memory, as a uint8 tensor."""
        size = self._round_scratch(size)
        if size + self._scratch_offset > self._scratch_size:
            raise _kiln.InvalidArgument(f"scratch_buffer_offset: {size} bytes at offset {self._scratch_offset} pass the "
                                        f"scratch memory's {self._scratch_size} (set_scratch_size)")
        view = self._scratch_view(self._scratch_offset, size)
        self._scratch_offset += size
        return view

    def scratch_buffer_reset(self):
        """Releases the scratch memory; its size starts from 0 again."""
        self._scratch_size = self._scratch_offset = 0
        self._scratch = None

    # ---- neon's layer methods beyond the convolution, pooling, LRN and batch-norm ones
    def relu_layer(self):
        """neon's handle for MKL's ReLU layer: None here, as on neon's GPU backend."""

    def batchnorm_layer(self, in_shape):
        """neon's handle for MKL's batch-norm layer: None here, as on neon's GPU backend."""

    def mergesum_layer(self, layer_num):
        """neon's handle for MKL's merge-sum layer: None here, as on neon's GPU backend."""

    def mergebroadcast_layer(self, layer_num):
        """neon's handle for MKL's merge-broadcast layer: None here, as on neon's GPU backend."""

    def bibnrnn_layer(self, h_buffer_all, h_ff_buffer, W_recur_f, W_recur_b, nsteps, nout):
        """neon's handle for MKL's bidirectional RNN layer: None here, as on neon's GPU backend."""

    def fprop_skipnode(self, x, y, beta):
        """y = y * beta + x."""
        y[...] = y * beta + x

    def bprop_skipnode(self, error, deltas, alpha, beta):
        """deltas = deltas * beta + alpha * error."""
        deltas[...] = deltas * beta + error * alpha

    def fprop_transform(self, ngLayer, transform, inputs, outputs, relu=False):
        """outputs = transform(inputs), transform being a callable on kiln expressions (neon's
        Transform); ngLayer and relu select nothing, as on neon's GPU backend."""
        outputs[...] = transform(inputs)

    def bprop_transform(self, ngLayer, transform, outputs, error, deltas, relu):
        """deltas = transform.bprop(outputs) * error: the derivative from the activation's output."""
        deltas[...] = transform.bprop(outputs) * error

    def fprop_mergesum(self, ngLayer, inputs, inference, layers, outputs, out_shape):
        """The branches' sum into their shared output: the first branch overwrites it (beta=0),
        the others add to it (beta=1)."""
        for layer in layers:
            layer.fprop(inputs, inference, beta=0 if layer is layers[0] else 1)

    def bprop_mergesum(self, ngLayer, alpha, beta, layers, error, deltas):
        """Each branch's gradient into the shared deltas, last branch first: it takes the
        caller's beta, the others add (beta=1)."""
        for layer in reversed(layers):
            layer.bprop(error, alpha=alpha, beta=beta if layer is layers[-1] else 1)

    def fprop_mergebroadcast(self, ngLayer, inputs, inference, outputs, layers, out_shape):
        """Each branch's fprop: the branches write their slices of the concatenated output."""
        for layer in layers:
            layer.fprop(inputs, inference)

    def bprop_mergebroadcast(self, ngLayer, layers, error_views, error, delta, out_shape, alpha, beta, alphas, betas):
        """Each branch's bprop on its view of the error, last branch first, scaled by alphas[i] *
        alpha; betas[-1] becomes beta (as neon, in the list given), so that the last branch
        overwrites the shared deltas and the others add."""
        betas[-1] = beta
        for i in reversed(range(len(layers))):
            layers[i].bprop(error_views[i], alpha=alphas[i] * alpha, beta=betas[i])

    def compound_bprop_lut(self, nin, inputs, error, error_t, dW, pad_idx, alpha=1.0, beta=0):
        """A lookup table's weight gradient: dW[w, :] += the sum of error[:, j] over the tokens j
        whose id inputs[0, j] is w, padding (pad_idx) left out. error_t, (tokens, dim), receives
        error transposed (neon's scratch). Deterministic: one product of the tokens' one-hot
        matrix and error_t."""
        vocab = dW.shape[0]
        ids = inputs.reshape(1, -1)
        error_t[...] = error.T
        hit = self.arange(vocab, dtype=int32).reshape(vocab, 1) == ids
        onehot = self.empty((vocab, ids.shape[1]), dW.dtype)
        onehot[...] = _kiln.where(hit, 1.0 if pad_idx is None else _kiln.where(ids != pad_idx, 1.0, 0.0), 0.0)
        _kiln.compound_dot(onehot, error_t, dW, 1.0, 1.0)

    def compound_rnn_unroll_fprop(self, W_recur, h_prev_s, h_ff_s, h_s, bias, nout, num_steps, num_used_steps,
                                  activation, reverse=False):
        """An RNN over its steps (lists of (nout, batch) views): h = activation(W_recur . h_prev +
        h_ff + bias), in step order (reversed when reverse), over the first num_used_steps."""
        steps = range(num_used_steps)
        for t in (reversed(steps) if reverse else steps):
            z = self.empty(h_s[t].shape, float32)
            _kiln.compound_dot(W_recur, h_prev_s[t], z)
            h_s[t][...] = activation(z + h_ff_s[t] + bias)

    def compound_rnn_unroll_bprop(self, W_recur, delta_prev_s, delta_s, h_s, nout, num_steps, num_used_steps,
                                  activation, reverse=True):
        """The RNN's backward pass: delta_t = activation.bprop(h_t) * delta_t, then delta_prev_t
        += W_recur . delta_t (W_recur: the transposed recurrent weights, as neon's callers pass),
        last step first (first step first when not reverse)."""
        steps = range(num_used_steps)
        for t in (reversed(steps) if reverse else steps):
            delta_s[t][...] = activation.bprop(h_s[t]) * delta_s[t]
            _kiln.compound_dot(W_recur, delta_s[t], delta_prev_s[t], 1.0, 1.0)

    def compound_rnn_unroll_fprop_bibnrnn(self, ngLayer, h_buffer_all, h_ff_buffer, W_recur_f, h_prev, h_ff_f, h_f, b_f,
                                          W_recur_b, h_next, h_ff_b, h_b, b_b, nout, nsteps, used_nsteps, activation):
        """A bidirectional RNN: forward over the steps with W_recur_f, backward with W_recur_b."""
        self.compound_rnn_unroll_fprop(W_recur_f, h_prev, h_ff_f, h_f, b_f, nout, nsteps, used_nsteps, activation, False)
        self.compound_rnn_unroll_fprop(W_recur_b, h_next, h_ff_b, h_b, b_b, nout, nsteps, used_nsteps, activation, True)

    def compound_rnn_unroll_bprop_bibnrnn(self, ngLayer, error, in_deltas_f, prev_in_deltas, in_deltas_b, next_in_deltas,
                                          W_recur_f, W_recur_b, h_f, h_b, nout, nsteps, used_nsteps, activation,
                                          h_buffer_all):
        """The bidirectional RNN's backward pass: each direction's, with its transposed weights."""
        self.compound_rnn_unroll_bprop(W_recur_f.T, prev_in_deltas, in_deltas_f, h_f, nout, nsteps, used_nsteps,
                                       activation, True)
        self.compound_rnn_unroll_bprop(W_recur_b.T, next_in_deltas, in_deltas_b, h_b, nout, nsteps, used_nsteps,
                                       activation, False)

    # ROI pooling and NMS, with neon's rules, counted on the host (NumPy): their work is small and
    # irregular beside the convolutions they follow.
    @staticmethod
    def _roi_bins(rois, n, pooled_height, pooled_width, spatial_scale, H, W):
        """ROI n's batch index and, per output bin, its [hstart, hend) x [wstart, wend) window."""
        f = np.float32
        away = lambda v: f(np.sign(v) * np.floor(np.abs(v) + f(0.5)))   # CUDA's round: halves away from 0
        b, x1, y1, x2, y2 = (f(v) for v in rois[n])
        sw, sh = int(away(x1 * f(spatial_scale))), int(away(y1 * f(spatial_scale)))
        ew, eh = int(away(x2 * f(spatial_scale))), int(away(y2 * f(spatial_scale)))
        bh, bw = f(max(eh - sh + 1, 1)) / f(pooled_height), f(max(ew - sw + 1, 1)) / f(pooled_width)
        clip = lambda v, hi: min(max(v, 0), hi)
        bins = {}
        for i in range(pooled_height):
            hs, he = clip(int(np.floor(f(i) * bh)) + sh, H), clip(int(np.ceil(f(i + 1) * bh)) + sh, H)
            for j in range(pooled_width):
                ws, we = clip(int(np.floor(f(j) * bw)) + sw, W), clip(int(np.ceil(f(j + 1) * bw)) + sw, W)
                bins[i, j] = (hs, he, ws, we)
        return int(b), bins

    def roipooling_fprop(self, I, rois, O, argmax, roi_count, fm_channel, fm_height, fm_width, pooled_height,
                         pooled_width, spatial_scale):
        """neon's ROI max pooling: I (C, H, W, N) feature maps, rois (roi_count, 5) rows of (batch
        index, x1, y1, x2, y2) in image coordinates scaled by spatial_scale; O and argmax (C,
        pooled_height, pooled_width, roi_count): each bin's maximum and where it is (h * W * N + w
        * N + batch index; -1 and 0 for an empty bin). The first maximum in h-then-w order wins."""
        x, r = np.asarray(I).astype(np.float32), np.asarray(rois).astype(np.float32).reshape(-1, 5)
        C, H, W, N = x.shape
        out = np.zeros((C, pooled_height, pooled_width, roi_count), np.float32)
        arg = np.full(out.shape, -1, np.int32)
        for n in range(roi_count):
            b, bins = self._roi_bins(r, n, pooled_height, pooled_width, spatial_scale, H, W)
            for (i, j), (hs, he, ws, we) in bins.items():
                if he <= hs or we <= ws:
                    continue
                window = x[:, hs:he, ws:we, b].reshape(C, -1)
                k = window.argmax(1)
                out[:, i, j, n] = window[np.arange(C), k]
                h, w = hs + k // (we - ws), ws + k % (we - ws)
                arg[:, i, j, n] = h * W * N + w * N + b
        O[...] = out
        argmax[...] = arg

    def roipooling_bprop(self, I, rois, O, argmax, roi_count, fm_channel, fm_height, fm_width, pooled_height,
                         pooled_width, spatial_scale):
        """The gradient of roipooling_fprop: I the pooled output's gradient (C, pooled_height,
        pooled_width, roi_count), O the feature maps' (C, H, W, N), overwritten: each bin's
        gradient goes to the position its argmax names."""
        e, arg = np.asarray(I).astype(np.float32), np.asarray(argmax).astype(np.int64)
        C, H, W, N = O.shape
        grad = np.zeros((C, H * W * N), np.float32)
        c = np.broadcast_to(np.arange(C).reshape(C, 1, 1, 1), arg.shape)
        hit = arg >= 0
        np.add.at(grad, (c[hit], arg[hit]), e[hit])
        O[...] = grad.reshape(C, H, W, N)

    def nms(self, detections, threshold, normalized=False):
        """neon's non-maximum suppression: detections (count, 5) rows of (x1, y1, x2, y2, score),
        sorted by score, highest first; a box is kept unless an earlier kept box overlaps it by an
        IoU above threshold, or its score is 0. Widths and heights count pixels (+1) unless
        normalized. Returns the kept rows' indices."""
        d = np.asarray(detections).astype(np.float32).reshape(-1, 5)
        off = np.float32(0 if normalized else 1)
        area = (d[:, 2] - d[:, 0] + off) * (d[:, 3] - d[:, 1] + off)
        removed = np.zeros(len(d), bool)
        keep = []
        for i in range(len(d)):
            if removed[i] or d[i, 4] == 0:
                continue
            keep.append(i)
            w = np.maximum(np.minimum(d[i, 2], d[i + 1:, 2]) - np.maximum(d[i, 0], d[i + 1:, 0]) + off, 0)
            h = np.maximum(np.minimum(d[i, 3], d[i + 1:, 3]) - np.maximum(d[i, 1], d[i + 1:, 1]) + off, 0)
            inter = w * h
            removed[i + 1:] |= inter / (area[i] + area[i + 1:] - inter) > threshold
        return keep

    def set_caffe_compat(self):
        """neon's caffe mode: pooling output sizes round up in output_dim."""
        self._caffe_compat = True

    def check_caffe_compat(self):
        return self._caffe_compat

    def output_dim(self, X, S, padding, strides, pooling=False, dilation=1):
        """The output size of a convolution or pooling over X with filter S (dilated), as neon
        computes it (rounding up for pooling in caffe mode)."""
        if strides < 1 or dilation < 1:
            raise _kiln.InvalidArgument(f"output_dim: strides={strides}, dilation={dilation}; both must be at least 1")
        S = dilation * (S - 1) + 1
        if pooling and padding >= S:
            raise _kiln.InvalidArgument(f"output_dim: padding {padding} is not smaller than the window {S}")
        if self._caffe_compat and pooling:
            size = -(-(X - S + 2 * padding) // strides) + 1
            if padding > 0 and (size - 1) * strides >= X + padding:
                size -= 1
        else:
            size = (X - S + 2 * padding) // strides + 1
        if size < 1:
            raise _kiln.InvalidArgument(f"output_dim: a window of {S} with padding {padding} does not fit {X}")
        return size

    def cublas_dot(self, A, B, C, alpha=1.0, beta=0.0):
        """neon's cuBLAS fallback: the same product on kiln's own GEMM kernels."""
        return _kiln.compound_dot(A, B, C, alpha, beta)

    # ---- GEMM with neon's argument order
    def compound_dot(self, A, B, C, alpha=1.0, beta=0.0, relu=False, bsum=None, repeat=1, size=None, *, slope=0.0,
                     bias=None):
        """C = alpha * A . B + beta * C (ReLU when relu), bsum the rows' sums; repeat runs it that
        many times (neon's benchmarking); size (neon's tile choice) is ignored: kiln's selector
        picks the kernel."""
        if size is not None:
            _no_effect("compound_dot's size", "the kernel selector picks the tile")
        for _ in range(_repeat(repeat, "compound_dot")):
            _kiln.compound_dot(A, B, C, alpha, beta, relu, slope, bias, bsum)
        return C

    def batched_dot(self, A, B, C, alpha=1.0, beta=0.0, relu=False, repeat=1, size=None):
        if size is not None:
            _no_effect("batched_dot's size", "the kernel selector picks the tile")
        for _ in range(_repeat(repeat, "batched_dot")):
            _kiln.batched_dot(A, B, C, alpha, beta, relu)
        return C

    def dot(self, a, b, out=None, relu=False):
        """The matrix product into out (returned); relu as nervanagpu's README calls it."""
        if relu:
            if out is None:
                raise _kiln.InvalidArgument("dot: relu=True writes into out; give out")
            return _kiln.compound_dot(a, b, out, relu=True)
        return _kiln.dot(a, b, out)

    def xnor_compound_dot(self, A, B, C, beta=0.0, bsum=None):
        """neon's binary GEMM: C = sign(A) . sign(B) + beta * C, with sign(x) = +1 for x >= 0 and
        -1 below (the values an XNOR-popcount kernel multiplies), bsum the rows' sums."""
        signs = []
        for X in (A, B):
            s = self.empty(X.shape, X.dtype)
            s[...] = (X >= 0) * 2.0 - 1.0
            signs.append(s)
        return _kiln.compound_dot(signs[0], signs[1], C, 1.0, beta, bsum=bsum)

    # ---- reductions with neon's partial=
    def _reduce(self, name, a, axis, partial, out, keepdims):
        if partial is not None:
            _no_effect("partial=", "kiln reduces in one fused kernel and keeps no partial sums")
        return getattr(Context, name)(self, a, axis=axis, out=out, keepdims=keepdims)

    def sum(self, a, axis=None, partial=None, out=None, keepdims=True):
        return self._reduce("sum", a, axis, partial, out, keepdims)

    def mean(self, a, axis=None, partial=None, out=None, keepdims=True):
        return self._reduce("mean", a, axis, partial, out, keepdims)

    def max(self, a, axis=None, partial=None, out=None, keepdims=True):
        return self._reduce("max", a, axis, partial, out, keepdims)

    def min(self, a, axis=None, partial=None, out=None, keepdims=True):
        return self._reduce("min", a, axis, partial, out, keepdims)

    def var(self, a, axis=None, partial=None, out=None, keepdims=True, binary=False):
        if binary:
            _no_effect("var's binary", "it selected neon's binary-network kernels")
        return self._reduce("var", a, axis, partial, out, keepdims)

    def std(self, a, axis=None, partial=None, out=None, keepdims=True):
        return self._reduce("std", a, axis, partial, out, keepdims)

    # ---- the other neon methods
    def make_binary_mask(self, out, keepthresh=0.5):
        """out = 1 where a uniform draw of the context's random stream is below keepthresh, else 0
        (a dropout keep mask)."""
        out[...] = self.rand() < keepthresh
        return out

    def shift(self, ary, shift_ary, value=True, out=None):
        """ary times a power of two: with value, shift_ary's values rounded to the nearest power of
        two (sign kept; neon's AP2); without, 2 ** shift_ary."""
        if value:
            p2 = _kiln.sgn(shift_ary) * _kiln.exp2(_kiln.rint(_kiln.log2(_kiln.abs(shift_ary))))
        else:
            p2 = _kiln.exp2(shift_ary)
        return self.multiply(ary, p2, out=out)

    def binarize(self, ary, out, stochastic=True):
        """out = +1 or -1: deterministically the sign (>= 0 gives +1); stochastically +1 with
        probability clip((ary + 1) / 2, 0, 1), drawn from the context's random stream."""
        if stochastic:
            p = _kiln.clip((ary + 1.0) * 0.5, 0.0, 1.0)
            out[...] = (self.rand() <= p) * 2.0 - 1.0
        else:
            out[...] = (ary >= 0) * 2.0 - 1.0
        return out

    def compensated_sum(self, sum_tensor, cmp_tensor, add_tensor, cmp_scale=1.0, add_scale=1.0):
        """Kahan summation (neon's 16-bit weight updates): sum += add_scale * add_tensor, with the
        rounding error carried in cmp_tensor (scaled by cmp_scale first)."""
        y = self.empty(sum_tensor.shape, cmp_tensor.dtype)
        y[...] = add_scale * add_tensor - cmp_scale * cmp_tensor
        t = self.empty(sum_tensor.shape, sum_tensor.dtype)
        t[...] = sum_tensor + y                                # rounded to the sum's dtype
        cmp_tensor[...] = (t - sum_tensor) - y                 # what that rounding lost
        sum_tensor[...] = t
        return sum_tensor

    def copy_transpose(self, a, out, axes=None, repeat=1):
        """out = a transposed (axes as numpy.transpose; None reverses them)."""
        for _ in range(_repeat(repeat, "copy_transpose")):
            out[...] = a.transpose(axes) if axes is not None else a.T
        return out

    def add_fc_bias(self, inputs, bias):
        """inputs += bias, in neon's (features, batch) layout: bias is (features, 1)."""
        inputs[...] = inputs + bias
        return inputs

    def update_fc_bias(self, err, out):
        """out = the sum of err over the batch (axis 1 in neon's layout), as (features, 1)."""
        out[...] = Context.sum(self, err, axis=1, keepdims=True)
        return out
