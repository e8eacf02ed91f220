"""The seeds' batch norm, softmax and ReLU helpers (ng.compound_fprop_bn, compound_bprop_bn,
fprop_softmax, fprop_relu, bprop_relu) and kiln.nn against NumPy on a CPU context."""
import numpy as np
import pytest

import kiln


@pytest.fixture(scope="module")
def cpu():
    return kiln.Context("cpu")


def test_batch_norm_forward_and_backward(cpu):
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 3, (4, 3, 5, 6)).astype(np.float32)
    gamma, beta = rng.uniform(0.5, 2, (6, 1)).astype(np.float32), rng.uniform(-1, 1, (6, 1)).astype(np.float32)
    X, G, B = cpu.array(x), cpu.array(gamma), cpu.array(beta)
    xsum, xvar, gmean, gvar, Y = cpu.empty((6, 1)), cpu.empty((6, 1)), cpu.zeros((6, 1)), cpu.ones((6, 1)), cpu.empty(x.shape)
    assert cpu.compound_fprop_bn(X, xsum, xvar, gmean, gvar, G, B, Y, 1e-3, 0.9, True, relu=True) is Y
    x2 = x.reshape(-1, 6).astype(np.float64)
    mean, var = x2.mean(0), x2.var(0)
    y = np.maximum((x2 - mean) / np.sqrt(var + 1e-3) * gamma.reshape(6) + beta.reshape(6), 0)
    np.testing.assert_allclose(Y.get().reshape(-1, 6), y, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(xsum.get().reshape(6), x2.sum(0), rtol=1e-5)
    np.testing.assert_allclose(gmean.get().reshape(6), 0.1 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gvar.get().reshape(6), 0.9 + 0.1 * var, rtol=1e-5)
    d = rng.uniform(-1, 1, x.shape).astype(np.float32)
    dX, dG, dB = cpu.empty(x.shape), cpu.empty((6, 1)), cpu.empty((6, 1))
    kiln.compound_bprop_bn(dX, dG, dB, cpu.array(d), X, xsum, xvar, G, 1e-3)
    d2, n = d.reshape(-1, 6).astype(np.float64), x2.shape[0]
    xhat = (x2 - mean) / np.sqrt(var + 1e-3)
    gg, gb = (d2 * xhat).sum(0), d2.sum(0)
    dx = gamma.reshape(6) * (d2 - (xhat * gg + gb) / n) / np.sqrt(var + 1e-3)
    np.testing.assert_allclose(dG.get().reshape(6), gg, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dB.get().reshape(6), gb, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dX.get().reshape(-1, 6), dx, rtol=1e-4, atol=1e-5)
    with pytest.raises(kiln.Error, match="binary=True"):
        kiln.compound_fprop_bn(X, xsum, xvar, gmean, gvar, G, B, Y, 1e-3, 0.9, True, binary=True)
    with pytest.raises(kiln.Error, match="it must be \\(6,\\) or \\(6, 1\\)"):
        kiln.compound_fprop_bn(X, xsum, xvar, gmean, gvar, cpu.ones((5,)), B, Y, 1e-3, 0.9, True)


def test_softmax_cross_entropy_relu(cpu):
    rng = np.random.default_rng(2)
    z = rng.uniform(-20, 20, (6, 9)).astype(np.float32)
    Z = cpu.array(z)
    e = np.exp(z - z.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(np.asarray(kiln.nn.softmax(Z)), p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(cpu.fprop_softmax(Z, axis=0)), np.exp(z - z.max(0)) / np.exp(z - z.max(0)).sum(0),
                               rtol=1e-5, atol=1e-7)
    labels = np.array([0, 8, 3, 3, 5, 1], dtype=np.int32)
    P = cpu.array(p)
    want = -np.log(p[np.arange(6), labels]).mean()
    assert float(np.asarray(kiln.nn.cross_entropy(P, cpu.array(labels)))) == pytest.approx(want, rel=1e-5)
    for bad in (-1, 9, 2**32):   # outside the classes, or wrapping onto class 0 in int32: NaN, not a zero row
        wrong = np.array([0, 8, bad, 3, 5, 1], dtype=np.int64)
        assert np.isnan(float(np.asarray(kiln.nn.cross_entropy(P, cpu.array(wrong, dtype=np.int64)))))
        assert np.isnan(float(np.asarray(kiln.nn.cross_entropy(P, cpu.array(wrong, dtype=np.int64), reduction="sum"))))
    onehot = np.eye(9, dtype=np.float32)[labels]
    got_sum = float(np.asarray(kiln.nn.cross_entropy(P, cpu.array(onehot), reduction="sum")))
    assert got_sum == pytest.approx(6 * want, rel=1e-5)
    with pytest.raises(ValueError, match="reduction='max'"):
        kiln.nn.cross_entropy(P, cpu.array(onehot), reduction="max")
    x = np.array([-2.0, 0.0, 3.0], dtype=np.float32)
    X = cpu.array(x)
    np.testing.assert_allclose(np.asarray(kiln.nn.relu(X, slope=0.1)), [-0.2, 0.0, 3.0], rtol=1e-6)
    deltas = cpu.empty((3,))
    assert cpu.bprop_relu(None, X, cpu.array(np.ones(3, np.float32)), deltas, 0.5) is deltas
    np.testing.assert_array_equal(deltas.get(), [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(np.asarray(cpu.fprop_relu(None, X)), [0.0, 0.0, 3.0])
    y = np.array([0.25, -0.5], dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(kiln.nn.sigmoid_grad(cpu.array(y))), y * (1 - y))
    np.testing.assert_array_equal(np.asarray(kiln.nn.tanh_grad(cpu.array(y))), 1 - y * y)


def test_pooling_neon_and_functional(cpu):
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (2, 7, 6, 3)).astype(np.float32)
    layer = cpu.pool_layer(np.float32, "max", 2, 3, H=7, W=6, R=3, S=3, pad_h=1, pad_w=1, str_h=2, str_w=2)
    assert layer.dimI == (2, 7, 6, 3) and layer.dimO == (2, 4, 3, 3) and layer.op == "max"
    X, O, A = cpu.array(x), cpu.empty(layer.dimO), cpu.empty(layer.dimO, np.int32)
    kiln.fprop_pool(layer, X, O, argmax=A)
    xp = np.pad(x.astype(np.float64), [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=-np.inf)
    want = np.full(layer.dimO, -np.inf)
    for r in range(3):
        for s in range(3):
            want = np.maximum(want, xp[:, r:r + 8:2, s:s + 6:2, :])
    np.testing.assert_array_equal(O.get(), want.astype(np.float32))
    E = cpu.array(rng.uniform(-1, 1, layer.dimO).astype(np.float32))
    G = cpu.empty(layer.dimI)
    kiln.bprop_pool(layer, E, G, argmax=A)
    # Each window's gradient goes to its maximum: the sum over the input is the sum of E.
    assert float(G.get().sum()) == pytest.approx(float(E.get().sum()), rel=1e-5)
    avg = kiln.nn.pool(X, 2, op="avg")
    assert avg.shape == (2, 3, 3, 3)
    np.testing.assert_allclose(avg.get(), x[:, :6, :6, :].reshape(2, 3, 2, 3, 2, 3).mean(axis=(2, 4)), rtol=1e-6)
    with pytest.raises(kiln.Error, match="op='min'"):
        kiln.pool_layer(np.float32, "min", 1, 1, W=4, S=2)
    with pytest.raises(kiln.Error, match="max pooling's gradient needs fprop_pool's argmax"):
        kiln.bprop_pool(layer, E, G)


def test_lrn(cpu):
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, (2, 3, 4, 7)).astype(np.float32)
    layer = cpu.lrn_layer(np.float32, 2, 7, H=3, W=4, J=3)
    assert layer.op == "lrn" and layer.dimI == (2, 3, 4, 7)
    X, O, D = cpu.array(x), cpu.empty(x.shape), cpu.empty(x.shape)
    kiln.fprop_lrn(layer, X, O, D, ascale=0.5, bpower=0.75)
    sq = np.pad(x.astype(np.float64) ** 2, [(0, 0)] * 3 + [(1, 1)])
    denom = 1 + 0.5 * (sq[..., :-2] + sq[..., 1:-1] + sq[..., 2:])
    np.testing.assert_allclose(D.get(), denom, rtol=1e-6)
    np.testing.assert_allclose(O.get(), x * denom ** -0.75, rtol=1e-5, atol=1e-7)
    delta = cpu.empty(x.shape)
    assert kiln.bprop_lrn(layer, X, O, cpu.ones(x.shape), delta, D, ascale=0.5, bpower=0.75) is delta
    with pytest.raises(kiln.Error, match="J=2; the window of channels is centred"):
        kiln.lrn_layer(np.float32, 1, 4, J=2)
