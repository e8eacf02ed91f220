"""kiln.NervanaGPU's neon methods (kiln/_neon.py): neon's constructor and argument orders, and the
methods kiln's Context lacks, each checked against NumPy (CPU; the GPU with KILN_BACKEND=cuda)."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import _neon


def host(x):
    return np.asarray(x).astype(np.float64)


def test_constructor_takes_neons_order_and_warns_once_about_keywords_without_effect():
    ng = kiln.NervanaGPU(7, np.float16)
    assert ng.rng_get_state() == (7, 0) and ng.default_dtype == np.float16
    assert isinstance(ng, kiln.Context)
    _neon._warned.clear()
    with pytest.warns(UserWarning, match="enable_winograd has no effect in kiln"):
        kiln.NervanaGPU(enable_winograd=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kiln.NervanaGPU(enable_winograd=False)   # once per process
        kiln.NervanaGPU(scratch_size=1 << 20, hist_bins=32, hist_offset=-20)   # keywords that select something
        kiln.NervanaGPU(hist_bins=64, hist_offset=-48, enable_winograd=True, num_devices=1)   # neon's defaults
    with pytest.warns(UserWarning, match="compat_mode has no effect"):
        kiln.NervanaGPU(compat_mode="caffe")


def test_compound_dot_in_neons_order_with_bsum_repeat_and_size(ng, rng):
    a, b = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    c0 = rng.standard_normal((6, 4)).astype(np.float32)
    A, B, C, bsum = ng.array(a), ng.array(b), ng.array(c0), ng.zeros((6, 1))
    ng.compound_dot(A, B, C, 2.0, 1.0, False, bsum, 3)      # C = 2AB + C, three times
    want = c0 + 3 * 2.0 * (a @ b)
    assert np.allclose(host(C), want, rtol=1e-4, atol=1e-4)
    assert np.allclose(host(bsum)[:, 0], want.sum(1), rtol=1e-4, atol=1e-3)
    _neon._warned.clear()
    with pytest.warns(UserWarning, match="compound_dot's size has no effect"):
        ng.compound_dot(A, B, C, size=32)
    with pytest.raises(ValueError, match="repeat = 0; valid: a number of runs, at least 1"):
        ng.compound_dot(A, B, C, repeat=0)
    out = ng.empty((6, 4))
    ng.dot(A, B, out, relu=True)
    assert np.allclose(host(out), np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
    assert np.allclose(host(ng.dot(A, B)), a @ b, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="relu=True writes into out"):
        ng.dot(A, B, relu=True)


def test_xnor_compound_dot_is_the_product_of_signs(ng, rng):
    a, b = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 3)).astype(np.float32)
    c0 = rng.standard_normal((8, 3)).astype(np.float32)
    C = ng.array(c0)
    ng.xnor_compound_dot(ng.array(a), ng.array(b), C, beta=0.5)
    sign = lambda x: np.where(x >= 0, 1.0, -1.0)  # noqa: E731
    assert np.allclose(host(C), sign(a) @ sign(b) + 0.5 * c0, atol=1e-4)


def test_reductions_take_partial_positionally(ng, rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    out = ng.empty((4, 1))
    ng.sum(ng.array(x), 1, None, out)
    assert np.allclose(host(out)[:, 0], x.sum(1), atol=1e-5)
    _neon._warned.clear()
    with pytest.warns(UserWarning, match="partial= has no effect"):
        r = ng.mean(ng.array(x), 0, ng.empty((1, 6)))
    assert np.allclose(host(r), x.mean(0, keepdims=True), atol=1e-6)
    assert np.allclose(host(ng.var(ng.array(x), axis=1)), x.var(1, keepdims=True), atol=1e-5)
    assert np.allclose(host(ng.max(ng.array(x), axis=None)), x.max(), atol=0)


def test_make_binary_mask_and_binarize_draw_from_the_stream(ng, rng):
    mask = ng.empty((200, 100))
    ng.make_binary_mask(mask, keepthresh=0.3)
    m = host(mask)
    assert set(np.unique(m)) <= {0.0, 1.0} and abs(m.mean() - 0.3) < 0.02
    x = rng.standard_normal((50, 40)).astype(np.float32)
    out = ng.empty((50, 40))
    ng.binarize(ng.array(x), out, stochastic=False)
    assert np.array_equal(host(out), np.where(x >= 0, 1.0, -1.0))
    half = ng.full((200, 100), 0.5)
    ng.binarize(half, out := ng.empty((200, 100)), stochastic=True)   # +1 with probability 0.75
    o = host(out)
    assert set(np.unique(o)) <= {-1.0, 1.0} and abs(o.mean() - 0.5) < 0.03


def test_shift_by_powers_of_two(ng, rng):
    x = rng.standard_normal((5, 7)).astype(np.float32)
    s = (rng.standard_normal((5, 7)) * 4).astype(np.float32)
    s[s == 0] = 1
    got = host(ng.shift(ng.array(x), ng.array(s), value=True, out=ng.empty((5, 7))))
    assert np.allclose(got, x * np.sign(s) * 2.0 ** np.rint(np.log2(np.abs(s))), rtol=1e-6)
    e = np.array([[-2, 0, 3]], np.float32)
    got = host(ng.shift(ng.array(np.ones((2, 3), np.float32)), ng.array(e), value=False, out=ng.empty((2, 3))))
    assert np.array_equal(got, np.broadcast_to(2.0 ** e, (2, 3)))


def test_compensated_sum_keeps_what_float16_rounding_drops(ng):
    total = ng.full((64,), 1.0, dtype=np.float16)
    plain = ng.full((64,), 1.0, dtype=np.float16)
    carry = ng.zeros((64,), dtype=np.float16)
    step = ng.full((64,), 1e-4, dtype=np.float16)
    for _ in range(300):
        ng.compensated_sum(total, carry, step)
        plain[:] = plain + step
    assert np.all(host(plain) == 1.0)                  # each 1e-4 is below float16's half-ulp at 1
    assert np.allclose(host(total), 1.0 + 300 * float(np.float16(1e-4)), atol=2e-3)


def test_copy_transpose_and_fc_bias(ng, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    out = ng.empty((4, 2, 3))
    ng.copy_transpose(ng.array(x), out, axes=(2, 0, 1))
    assert np.array_equal(host(out), np.transpose(x, (2, 0, 1)))
    m = rng.standard_normal((3, 5)).astype(np.float32)
    out2 = ng.empty((5, 3))
    ng.copy_transpose(ng.array(m), out2, repeat=2)
    assert np.array_equal(host(out2), m.T)
    acts, bias = ng.array(m), rng.standard_normal((3, 1)).astype(np.float32)
    ng.add_fc_bias(acts, ng.array(bias))
    assert np.allclose(host(acts), m + bias, atol=1e-6)
    grad = ng.empty((3, 1))
    ng.update_fc_bias(ng.array(m), grad)
    assert np.allclose(host(grad), m.sum(1, keepdims=True), atol=1e-5)


def test_timing_marks(ng):
    start, end = ng.init_mark(), ng.init_mark()
    ng.record_mark(start)
    a = ng.ones((256, 256))
    for _ in range(5):
        a[:] = a * 2
    ng.record_mark(end)
    ng.synchronize_mark(end)
    ms = ng.get_time(start, end)
    assert 0 < ms < 60000 and end.recorded
    with pytest.raises(ValueError, match="get_time: the end mark was never recorded"):
        ng.get_time(start, ng.init_mark())
    with pytest.raises(ValueError, match="record_mark: the mark is empty or of another context"):
        ng.record_mark(kiln.NervanaGPU().init_mark())


def test_plumbing(ng, rng):
    ng.begin(0, 1)
    ng.end(0, 1)
    assert ng.is_mkl() is False
    assert ng.output_dim(224, 11, 2, 4) == 55 and ng.output_dim(27, 3, 1, 1, dilation=2) == 25
    assert ng.output_dim(55, 3, 0, 2, pooling=True) == 27 and not ng.check_caffe_compat()
    ng.set_caffe_compat()
    assert ng.check_caffe_compat() and ng.output_dim(56, 3, 0, 2, pooling=True) == 28
    with pytest.raises(ValueError, match="padding 3 is not smaller than the window 3"):
        ng.output_dim(10, 3, 3, 1, pooling=True)
    a, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    C = ng.empty((4, 2))
    ng.cublas_dot(ng.array(a), ng.array(b), C)
    assert np.allclose(host(C), a @ b, atol=1e-5)
    ng.cleanup_backend()


def test_model_plumbing_buffers_data_and_scratch_memory(ng, rng):
    assert kiln.NervanaGPU.backend_choices() == ["cpu", "gpu"]
    other = kiln.NervanaGPU.allocate_backend("cpu", rng_seed=3)
    assert other.device == "cpu" and other.rng_get_state() == (3, 0)
    with pytest.raises(ValueError, match=r"allocate_backend: backend must be one of \('cpu', 'gpu'\); got 'tpu'"):
        kiln.NervanaGPU.allocate_backend("tpu")
    # iobuf: neon's shapes for the batch size, zeroed; x returned as it is; a shared buffer's head.
    with pytest.raises(ValueError, match="iobuf: the batch size is not set"):
        ng.iobuf(10)
    ng.bsz = 4
    assert ng.iobuf(10).shape == (10, 4) and ng.iobuf((3, 5)).shape == (3, 20) and ng.iobuf((2, 3, 5)).shape == (30, 4)
    assert not np.asarray(ng.iobuf(10)).any()
    x = ng.ones((2, 2))
    assert ng.iobuf(10, x=x) is x
    shared = ng.ones((100,))
    buf = ng.iobuf((3, 5), shared=shared)
    assert buf.shape == (3, 20) and not np.asarray(shared)[:60].any() and np.asarray(shared)[60:].all()
    with pytest.raises(ValueError, match=r"iobuf: the shared buffer holds 100 elements; \(30, 4\) needs 120"):
        ng.iobuf((2, 3, 5), shared=shared)
    assert ng.shared_iobuf_size((3, 4), "Data") == 12 and ng.shared_iobuf_size((3, 4), None) == 12 * ng.num_devices
    # Single-device data movement: nothing to do.
    t = ng.ones((2, 3))
    assert ng.distribute_data(t, "Data") is None and ng.revert_tensor(t) is None
    assert ng.convert_data(t, False) is None and ng.clean_data(t, True) is None
    assert ng.allocate_new_deltas(t, (2, 3), "Data") is t

    class Layer:
        def allocate(self, shared_outputs=None):
            self.shared = shared_outputs
    layer = Layer()
    ng.allocate_new_outputs(layer, t)
    assert layer.shared is t
    # consume: the host batch transposed onto the device, made on first use.
    host_batches = [rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)]
    dev = [None, None]
    ng.consume(1, host_batches, dev)
    assert dev[0] is None and dev[1].shape == (3, 5)
    np.testing.assert_array_equal(np.asarray(dev[1]), host_batches[1].T)
    kept = dev[1]
    ng.consume(1, [None, host_batches[0]], dev)
    assert dev[1] is kept
    np.testing.assert_array_equal(np.asarray(dev[1]), host_batches[0].T)
    with pytest.raises(ValueError, match="consume: buf_index = 2; valid: 0 or 1"):
        ng.consume(2, host_batches, dev)
    # execute: an expression's value; a tensor itself.
    np.testing.assert_array_equal(np.asarray(ng.execute(t * 3 + 1)), np.full((2, 3), 4.0))
    assert ng.execute(t) is t
    start, end = ng.get_events()
    assert ng.get_events() == (start, end)
    ng.record_mark(start)
    ng.record_mark(end)
    ng.synchronize_mark(end)
    assert ng.get_time(start, end) >= 0
    # Scratch memory: sizes rounded up to 128 bytes, growing only; pieces carved in order.
    ng.set_scratch_size(100, 200)
    first = ng.scratch_buffer(64)
    assert first.shape == (128,) and first.dtype == kiln.uint8
    ng.set_scratch_size(16)   # smaller: no change
    assert ng.scratch_buffer_offset(128).shape == (128,) and ng.scratch_buffer_offset(100).shape == (128,)
    with pytest.raises(ValueError, match=r"scratch_buffer_offset: 128 bytes at offset 384 pass the scratch memory's 384"):
        ng.scratch_buffer_offset(1)
    ng.scratch_buffer_init()
    assert ng.scratch_buffer_offset(384).shape == (384,)
    with pytest.raises(ValueError, match=r"scratch_buffer: 512 bytes requested, the scratch memory holds 384"):
        ng.scratch_buffer(512)
    ng.scratch_buffer_reset()
    with pytest.raises(ValueError, match="holds 0"):
        ng.scratch_buffer(1)
    assert kiln.NervanaGPU(device="cpu", scratch_size=1000).scratch_buffer(1000).shape == (1024,)


class _Rectlin:
    """neon's Transform shape: __call__ on the input, bprop on the output."""

    def __call__(self, x):
        return kiln.maximum(x, 0.0)

    def bprop(self, y):
        return kiln.where(y > 0, 1.0, 0.0)


def test_layer_handles_skip_nodes_transforms_and_merges(ng, rng):
    assert ng.relu_layer() is None and ng.batchnorm_layer((3, 4)) is None and ng.mergesum_layer(1) is None
    assert ng.mergebroadcast_layer(2) is None and ng.bibnrnn_layer(None, None, None, None, 3, 4) is None
    x, y = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    Y = ng.array(y)
    ng.fprop_skipnode(ng.array(x), Y, 0.5)
    np.testing.assert_allclose(host(Y), y * 0.5 + x, rtol=1e-6)
    D = ng.array(y)
    ng.bprop_skipnode(ng.array(x), D, 2.0, 0.25)
    np.testing.assert_allclose(host(D), y * 0.25 + 2 * x, rtol=1e-6)
    out, deltas = ng.empty((3, 4)), ng.empty((3, 4))
    ng.fprop_transform(None, _Rectlin(), ng.array(x), out)
    np.testing.assert_array_equal(host(out), np.maximum(x, 0))
    ng.bprop_transform(None, _Rectlin(), out, ng.array(y), deltas, False)
    np.testing.assert_array_equal(host(deltas), np.where(x > 0, y, 0))

    calls = []

    class Branch:
        def __init__(self, k):
            self.k = k

        def fprop(self, inputs, inference=False, beta=None):
            calls.append(("f", self.k, beta))

        def bprop(self, error, alpha=1.0, beta=0.0):
            calls.append(("b", self.k, alpha, beta))
    branches = [Branch(0), Branch(1), Branch(2)]
    ng.fprop_mergesum(None, None, False, branches, None, None)
    ng.bprop_mergesum(None, 0.5, 0.0, branches, None, None)
    assert calls == [("f", 0, 0), ("f", 1, 1), ("f", 2, 1), ("b", 2, 0.5, 0.0), ("b", 1, 0.5, 1), ("b", 0, 0.5, 1)]
    calls.clear()
    betas = [1, 1, 0]
    ng.fprop_mergebroadcast(None, None, True, None, branches, None)
    ng.bprop_mergebroadcast(None, branches, ["e0", "e1", "e2"], None, None, None, 2.0, 0.5, [1, 2, 3], betas)
    assert betas == [1, 1, 0.5]
    assert calls == [("f", 0, None), ("f", 1, None), ("f", 2, None), ("b", 2, 6.0, 0.5), ("b", 1, 4.0, 1),
                     ("b", 0, 2.0, 1)]


def test_lookup_table_gradient_and_rnn_unrolling(ng, rng):
    vocab, dim, tokens = 7, 5, 12
    ids = rng.integers(0, vocab, (1, tokens)).astype(np.int32)
    error = rng.standard_normal((dim, tokens)).astype(np.float32)
    dw0 = rng.standard_normal((vocab, dim)).astype(np.float32)
    dW, error_t = ng.array(dw0), ng.empty((tokens, dim))
    ng.compound_bprop_lut(tokens, ng.array(ids), ng.array(error), error_t, dW, pad_idx=3)
    want = dw0.astype(np.float64).copy()
    for j, w in enumerate(ids[0]):
        if w != 3:
            want[w] += error[:, j]
    np.testing.assert_allclose(host(dW), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(host(error_t), error.T)

    nout, bsz, steps = 4, 3, 5
    Wr = rng.standard_normal((nout, nout)).astype(np.float32) * 0.5
    bias = rng.standard_normal((nout, 1)).astype(np.float32)
    hff = rng.standard_normal((nout, steps * bsz)).astype(np.float32)
    H = ng.zeros((nout, (steps + 1) * bsz))   # step t's output at columns (t + 1) * bsz: h_prev of step t + 1
    HFF = ng.array(hff)
    h_s = [H[:, (t + 1) * bsz:(t + 2) * bsz] for t in range(steps)]
    h_prev_s = [H[:, t * bsz:(t + 1) * bsz] for t in range(steps)]
    ff_s = [HFF[:, t * bsz:(t + 1) * bsz] for t in range(steps)]
    ng.compound_rnn_unroll_fprop(ng.array(Wr), h_prev_s, ff_s, h_s, ng.array(bias), nout, steps, steps, _Rectlin())
    h = np.zeros((nout, (steps + 1) * bsz))
    for t in range(steps):
        h[:, (t + 1) * bsz:(t + 2) * bsz] = np.maximum(
            Wr.astype(np.float64) @ h[:, t * bsz:(t + 1) * bsz] + hff[:, t * bsz:(t + 1) * bsz] + bias, 0)
    np.testing.assert_allclose(host(H), h, rtol=1e-5, atol=1e-5)
    # Back through the steps, last first: delta_t = relu'(h_t) * delta_t; delta_prev_t += W^T delta_t.
    d0 = rng.standard_normal((nout, (steps + 1) * bsz)).astype(np.float32)
    D = ng.array(d0)
    d_s = [D[:, (t + 1) * bsz:(t + 2) * bsz] for t in range(steps)]
    dp_s = [D[:, t * bsz:(t + 1) * bsz] for t in range(steps)]
    ng.compound_rnn_unroll_bprop(ng.array(np.ascontiguousarray(Wr.T)), dp_s, d_s, h_s, nout, steps, steps, _Rectlin())
    d = d0.astype(np.float64)
    for t in reversed(range(steps)):
        cur = slice((t + 1) * bsz, (t + 2) * bsz)
        d[:, cur] = (h[:, cur] > 0) * d[:, cur]
        d[:, t * bsz:(t + 1) * bsz] += Wr.T.astype(np.float64) @ d[:, cur]
    np.testing.assert_allclose(host(D), d, rtol=1e-5, atol=1e-5)


def _roi_reference(x, rois, ph, pw, scale):
    """ROI max pooling by neon's formulas, element by element."""
    C, H, W, N = x.shape
    out = np.zeros((C, ph, pw, len(rois)), np.float32)
    arg = np.full(out.shape, -1, np.int64)
    rnd = lambda v: int(np.floor(abs(v) + 0.5) * np.sign(v))
    for n, (b, x1, y1, x2, y2) in enumerate(rois):
        sw, sh, ew, eh = (rnd(np.float32(v) * np.float32(scale)) for v in (x1, y1, x2, y2))
        bh = np.float32(max(eh - sh + 1, 1)) / np.float32(ph)
        bw = np.float32(max(ew - sw + 1, 1)) / np.float32(pw)
        for c in range(C):
            for i in range(ph):
                for j in range(pw):
                    hs = min(max(int(np.floor(i * bh)) + sh, 0), H)
                    he = min(max(int(np.ceil((i + 1) * bh)) + sh, 0), H)
                    ws = min(max(int(np.floor(j * bw)) + sw, 0), W)
                    we = min(max(int(np.ceil((j + 1) * bw)) + sw, 0), W)
                    best = None
                    for hh in range(hs, he):
                        for ww in range(ws, we):
                            if best is None or x[c, hh, ww, int(b)] > best:
                                best, pos = x[c, hh, ww, int(b)], hh * W * N + ww * N + int(b)
                    if best is not None:
                        out[c, i, j, n], arg[c, i, j, n] = best, pos
    return out, arg


def test_roi_pooling_and_nms_follow_neon(ng, rng):
    C, H, W, N, ph, pw = 3, 9, 11, 2, 3, 2
    x = rng.standard_normal((C, H, W, N)).astype(np.float32)
    rois = np.array([[0, 0, 0, 15, 11], [1, 4, 2, 20, 17], [0, 30, 30, 40, 40], [1, 6, 6, 6, 6]], np.float32)
    O, A = ng.empty((C, ph, pw, 4)), ng.empty((C, ph, pw, 4), np.int32)
    ng.roipooling_fprop(ng.array(x), ng.array(rois), O, A, 4, C, H, W, ph, pw, 0.5)
    want, warg = _roi_reference(x, rois, ph, pw, 0.5)
    np.testing.assert_array_equal(host(O), want)
    np.testing.assert_array_equal(np.asarray(A), warg)
    assert (warg[:, :, :, 2] == -1).all()   # past the image: empty bins
    e = rng.standard_normal((C, ph, pw, 4)).astype(np.float32)
    G = ng.empty((C, H, W, N))
    ng.roipooling_bprop(ng.array(e), ng.array(rois), G, A, 4, C, H, W, ph, pw, 0.5)
    grad = np.zeros(C * H * W * N)
    for c, i, j, n in np.ndindex(e.shape):
        if warg[c, i, j, n] >= 0:
            grad[c * H * W * N + warg[c, i, j, n]] += e[c, i, j, n]
    np.testing.assert_allclose(host(G).ravel(), grad, rtol=1e-6, atol=1e-6)

    boxes = np.array([[0, 0, 10, 10, 0.9], [1, 1, 11, 11, 0.8], [20, 20, 30, 30, 0.7], [0, 0, 10, 10, 0.0],
                      [21, 19, 31, 29, 0.6], [50, 50, 52, 52, 0.5]], np.float32)
    assert ng.nms(ng.array(boxes), 0.5) == [0, 2, 5]
    assert ng.nms(ng.array(boxes), 0.9) == [0, 1, 2, 4, 5]
    # normalized: no +1 on widths; boxes 0 and 1 then overlap by 81/119 = 0.68.
    assert ng.nms(ng.array(boxes), 0.7, normalized=True) == [0, 1, 2, 4, 5]
    assert ng.nms(ng.array(boxes), 0.6, normalized=True) == [0, 2, 5]


def test_docs_neon_md_is_current():
    import os
    import re

    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "neon.md")).read()
    rows = re.findall(r"^\| `([a-z_0-9]+)` \| (yes|no) \|", doc, re.M)
    assert len(rows) > 100
    ng = kiln.NervanaGPU(device="cpu")
    for name, status in rows:
        assert hasattr(ng, name) == (status == "yes"), f"docs/neon.md says {name}: {status}"
