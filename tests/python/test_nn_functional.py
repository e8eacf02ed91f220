"""kiln.nn's functional forms of the layers (pool / pool_grad with windows across channels and
the winning taps, lrn / lrn_grad, batch_norm / batch_norm_grad with running statistics) against
NumPy references and their adjoints, on a CPU context."""
import numpy as np
import pytest

import kiln


@pytest.fixture(scope="module")
def cpu():
    return kiln.Context("cpu")


def windows(x, win, stride, pad, fill):
    """x (N, H, W, C) -> (N, P, Q, C, R*S) values of each window (fill where padded)."""
    n, h, w, c = x.shape
    xp = np.full((n, h + 2 * pad[0], w + 2 * pad[1], c), fill)
    xp[:, pad[0]:pad[0] + h, pad[1]:pad[1] + w] = x
    P, Q = (h + 2 * pad[0] - win[0]) // stride[0] + 1, (w + 2 * pad[1] - win[1]) // stride[1] + 1
    out = np.empty((n, P, Q, c, win[0] * win[1]))
    for r in range(win[0]):
        for s in range(win[1]):
            out[..., r * win[1] + s] = xp[:, r:r + stride[0] * P:stride[0], s:s + stride[1] * Q:stride[1]]
    return out


def test_pool_and_its_gradient(cpu):
    rng = np.random.default_rng(3)
    # Distinct values at least 0.01 apart: the maximum of every window is unique, and a step of
    # 1e-3 along v moves no window's winner.
    x = (rng.permutation(2 * 7 * 8 * 5) * 0.01 - 3.5).reshape(2, 7, 8, 5)
    X = cpu.array(x)
    y, idx = kiln.nn.pool(X, 3, stride=2, padding=1, return_indices=True)
    assert y.shape == (2, 4, 4, 5) and idx.dtype == kiln.int32
    np.testing.assert_allclose(y.get(), windows(x, (3, 3), (2, 2), (1, 1), -np.inf).max(-1), rtol=1e-6)
    e = rng.uniform(-1, 1, y.shape)
    g = kiln.nn.pool_grad(cpu.array(e), X, 3, stride=2, padding=1, indices=idx)
    assert g.shape == x.shape and g.dtype == X.dtype
    v = rng.uniform(-1, 1, x.shape)
    moved = kiln.nn.pool(cpu.array(x + 1e-3 * v), 3, stride=2, padding=1).get().astype(np.float64)
    # max pooling is linear near x: <grad, v> = <e, d pool(x + t v) / dt>
    assert float((g.get() * v).sum()) == pytest.approx(float((e * (moved - y.get()) / 1e-3).sum()), rel=2e-3)
    # Average pooling (a linear map) across 3 channels (stride 2, padding 1) and 2x2 windows: its
    # gradient is its adjoint.
    ya = kiln.nn.pool(X, (2, 3), op="avg", channels=3, channel_stride=2, channel_padding=1)
    assert ya.shape == (2, 3, 2, 3)
    ea = rng.uniform(-1, 1, ya.shape)
    ga = kiln.nn.pool_grad(cpu.array(ea), X, (2, 3), op="avg", channels=3, channel_stride=2, channel_padding=1)
    va = rng.uniform(-1, 1, x.shape)
    lhs = float((ga.get() * va).sum())
    rhs = float((ea * kiln.nn.pool(cpu.array(va), (2, 3), op="avg", channels=3, channel_stride=2, channel_padding=1).get()).sum())
    assert lhs == pytest.approx(rhs, rel=1e-5)
    # L2 pooling needs the forward output; max pooling the taps.
    y2 = kiln.nn.pool(X, 2, op="l2")
    np.testing.assert_allclose(y2.get(), np.sqrt((windows(x, (2, 2), (2, 2), (0, 0), 0.0) ** 2).sum(-1)), rtol=1e-5)
    e2 = rng.uniform(-1, 1, y2.shape)
    g2 = kiln.nn.pool_grad(cpu.array(e2), X, 2, op="l2", y=y2).get()
    np.testing.assert_allclose(g2[:, :6, :8], (np.repeat(np.repeat(e2 / y2.get(), 2, 1), 2, 2) * x[:, :6, :8]), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError, match="op='max' needs indices"):
        kiln.nn.pool_grad(cpu.array(e), X, 3, stride=2, padding=1)
    with pytest.raises(ValueError, match="op='l2' needs y"):
        kiln.nn.pool_grad(cpu.array(e2), X, 2, op="l2")
    with pytest.raises(ValueError, match="return_indices=True is for op='max'"):
        kiln.nn.pool(X, 2, op="avg", return_indices=True)
    with pytest.raises(ValueError, match="pool: channels=0; it is an int >= 1"):
        kiln.nn.pool(X, 2, channels=0)


def test_windows_of_many_taps_fold_in_pieces(cpu):
    # Past 32 taps a window's terms go into kernels 32 at a time (the result so far evaluated
    # between them): 7x7 = 49 taps, overlapping; a 1-D window of 300 over 1000; 40 channels.
    rng = np.random.default_rng(6)
    x = (rng.permutation(2 * 13 * 12 * 3) * 0.01 - 3.5).reshape(2, 13, 12, 3)   # distinct: one winner a window
    X = cpu.array(x)
    y, idx = kiln.nn.pool(X, 7, stride=2, padding=3, return_indices=True)
    w = windows(x, (7, 7), (2, 2), (3, 3), -np.inf)
    np.testing.assert_allclose(y.get(), w.max(-1), rtol=1e-6)
    np.testing.assert_array_equal(idx.get(), w.argmax(-1))
    e = rng.uniform(-1, 1, y.shape)
    g = kiln.nn.pool_grad(cpu.array(e), X, 7, stride=2, padding=3, indices=idx).get()
    ref = np.zeros((2, 19, 18, 3))   # each window's winner takes its error, windows overlapping
    for p in range(y.shape[1]):
        for q in range(y.shape[2]):
            k = w[:, p, q].argmax(-1)   # (N, C)
            for n in range(2):
                for c in range(3):
                    ref[n, 2 * p + k[n, c] // 7, 2 * q + k[n, c] % 7, c] += e[n, p, q, c]
    np.testing.assert_allclose(g, ref[:, 3:16, 3:15], rtol=1e-6, atol=1e-6)
    valid = windows(np.ones_like(x), (7, 7), (2, 2), (3, 3), 0.0).sum(-1)
    np.testing.assert_allclose(kiln.nn.pool(X, 7, stride=2, padding=3, op="avg").get(),
                               windows(x, (7, 7), (2, 2), (3, 3), 0.0).sum(-1) / valid, rtol=1e-5)
    np.testing.assert_allclose(kiln.nn.pool(X, 7, stride=2, padding=3, op="l2").get(),
                               np.sqrt((windows(x, (7, 7), (2, 2), (3, 3), 0.0) ** 2).sum(-1)), rtol=1e-5)
    z = rng.uniform(-1, 1, (1, 1000, 2))
    Z = cpu.array(z.reshape(1, 1, 1000, 2))
    ya = kiln.nn.pool(Z, (1, 300), stride=(1, 7), op="avg").get().reshape(-1, 2)
    ref = np.stack([z[0, i * 7:i * 7 + 300].mean(0) for i in range(101)])
    np.testing.assert_allclose(ya, ref, rtol=1e-5, atol=1e-6)
    ea = rng.uniform(-1, 1, (1, 1, 101, 2))
    va = rng.uniform(-1, 1, (1, 1, 1000, 2))
    ga = kiln.nn.pool_grad(cpu.array(ea), Z, (1, 300), stride=(1, 7), op="avg").get()
    assert float((ga * va).sum()) == pytest.approx(
        float((ea * kiln.nn.pool(cpu.array(va), (1, 300), stride=(1, 7), op="avg").get()).sum()), rel=1e-5)
    u = rng.uniform(-2, 2, (2, 3, 4, 45))
    d = 1 + 0.01 * sum(np.pad(u * u, [(0, 0)] * 3 + [(20, 20)])[..., i:i + 45] for i in range(41))
    np.testing.assert_allclose(kiln.nn.lrn(cpu.array(u), 41, ascale=0.01, bpower=0.75).get(), u * d ** -0.75, rtol=1e-5)


def test_lrn_and_its_gradient(cpu):
    rng = np.random.default_rng(4)
    x = rng.uniform(-2, 2, (2, 3, 4, 7))
    X = cpu.array(x)
    y, denom = kiln.nn.lrn(X, 5, ascale=0.2, bpower=0.75, return_denom=True)
    sq = np.pad(x * x, [(0, 0)] * 3 + [(2, 2)])
    d = 1 + 0.2 * sum(sq[..., i:i + 7] for i in range(5))
    np.testing.assert_allclose(denom.get(), d, rtol=1e-5)
    np.testing.assert_allclose(y.get(), x * d ** -0.75, rtol=1e-5)
    np.testing.assert_allclose(kiln.nn.lrn(X, 3, 0.5, 1.0).get(),
                               x / (1 + 0.5 * sum(np.pad(x * x, [(0, 0)] * 3 + [(1, 1)])[..., i:i + 7] for i in range(3))),
                               rtol=1e-5)
    e, v = rng.uniform(-1, 1, x.shape), rng.uniform(-1, 1, x.shape)
    g = kiln.nn.lrn_grad(cpu.array(e), X, y, denom, 5, ascale=0.2, bpower=0.75)

    def f(t):   # float64: <e, lrn(x + t v)>
        z = x + t * v
        zz = np.pad(z * z, [(0, 0)] * 3 + [(2, 2)])
        return float((e * z * (1 + 0.2 * sum(zz[..., i:i + 7] for i in range(5))) ** -0.75).sum())

    assert float((g.get() * v).sum()) == pytest.approx((f(1e-5) - f(-1e-5)) / 2e-5, rel=1e-4)


def test_batch_norm_and_its_gradient(cpu):
    rng = np.random.default_rng(5)
    x = rng.normal(0.5, 2.0, (4, 3, 5, 6))
    gamma, beta = rng.uniform(0.5, 1.5, 6), rng.uniform(-1, 1, 6)
    X, G, B = cpu.array(x), cpu.array(gamma), cpu.array(beta)
    rm, rv = cpu.zeros((6,)), cpu.full((6,), 1.0)
    y, xsum, xvar = kiln.nn.batch_norm(X, G, B, 1e-3, running_mean=rm, running_var=rv, rho=0.75, return_stats=True)
    flat = x.reshape(-1, 6)
    mean, var = flat.mean(0), flat.var(0)
    xhat = (flat - mean) / np.sqrt(var + 1e-3)
    np.testing.assert_allclose(y.get().reshape(-1, 6), xhat * gamma + beta, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(xsum.get(), flat.sum(0), rtol=1e-5)
    np.testing.assert_allclose(xvar.get(), var, rtol=1e-5)
    np.testing.assert_allclose(rm.get(), 0.25 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv.get(), 0.75 + 0.25 * var, rtol=1e-5)
    relu = kiln.nn.batch_norm(X, G, B, 1e-3, relu=True).get().reshape(-1, 6)
    np.testing.assert_allclose(relu, np.maximum(xhat * gamma + beta, 0), rtol=1e-4, atol=1e-5)
    # Inference: the running statistics normalise.
    inf = kiln.nn.batch_norm(X, G, B, 1e-3, running_mean=rm, running_var=rv, training=False).get().reshape(-1, 6)
    np.testing.assert_allclose(inf, (flat - rm.get()) / np.sqrt(rv.get() + 1e-3) * gamma + beta, rtol=1e-4, atol=1e-5)
    e = rng.uniform(-1, 1, x.shape)
    gx, gg, gb = kiln.nn.batch_norm_grad(cpu.array(e), X, G, xsum, xvar, 1e-3)
    ef = e.reshape(-1, 6)
    want = gamma / np.sqrt(var + 1e-3) * (ef - ef.mean(0) - xhat * (ef * xhat).mean(0))
    np.testing.assert_allclose(gx.get().reshape(-1, 6), want, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(gg.get(), (ef * xhat).sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gb.get(), ef.sum(0), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="training=False normalises by running_mean and running_var"):
        kiln.nn.batch_norm(X, G, B, training=False)
