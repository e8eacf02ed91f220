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
    with pytest.warns(UserWarning, match="scratch_size has no effect in kiln"):
        kiln.NervanaGPU(scratch_size=1 << 20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kiln.NervanaGPU(scratch_size=1 << 20)   # once per process
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


def test_docs_neon_md_is_current():
    import os
    import re

    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "neon.md")).read()
    rows = re.findall(r"^\| `([a-z_0-9]+)` \| (yes|no) \|", doc, re.M)
    assert len(rows) > 100
    ng = kiln.NervanaGPU(device="cpu")
    for name, status in rows:
        assert hasattr(ng, name) == (status == "yes"), f"docs/neon.md says {name}: {status}"
