"""kiln.layers on a CPU context: every layer's bprop against finite differences of the network's
loss, the seeds' networks' shapes and FLOPs (examples/convnets.py), the training example, and
the layers' misuse messages."""
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln.layers import FC, LRN, BatchNorm, Conv, CrossEntropy, Network, Pool, ReLU, Residual, Softmax

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


@pytest.fixture(scope="module")
def cpu():
    return kiln.Context("cpu")


def small_net(cpu, n=6):
    layers = [Conv(6, 3, pad=1, relu=True), Pool("avg", 2), LRN(3, ascale=0.05), BatchNorm(relu=True),
              Conv(8, 3, pad=1, stride=2), ReLU(), Pool("l2", 2, stride=1),
              Residual([Conv(8, 1), BatchNorm(relu=True), Conv(8, 3, pad=1)], [Conv(8, 1, bias=False)]),
              FC(10, relu=True), FC(3)]
    return Network(layers, (n, 8, 8, 2), ctx=cpu, seed=3)


def test_bprop_matches_finite_differences(cpu):
    net = small_net(cpu)
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, net.layers[0].in_shape).astype(np.float32)
    labels = rng.integers(0, 3, 6).astype(np.int32)
    X, L, OH = cpu.array(x), cpu.array(labels, kiln.int32), cpu.array(np.eye(3, dtype=np.float32)[labels])

    def loss():
        return net.loss(net.fprop(X), L)

    loss()
    gx = net.bprop(net.bprop_loss(OH)).get()
    grads = [(p, g.get()) for p, g in net.params()]
    # The input's gradient and a few entries of every parameter, by central differences.
    checks = [(X, gx)] + grads
    eps, bad, checked = 2e-3, [], 0
    for t, (p, g) in enumerate(checks):
        base = p.get()
        for k in rng.choice(base.size, size=min(3, base.size), replace=False):
            idx = np.unravel_index(k, base.shape)
            for sign in (1, -1):
                v = base.copy()
                v[idx] += sign * eps
                p[...] = cpu.array(v)
                if sign == 1:
                    up = loss()
                else:
                    down = loss()
            p[...] = cpu.array(base)
            fd = (up - down) / (2 * eps)
            checked += 1
            if abs(fd - g[idx]) > 0.05 * abs(fd) + 1e-3:
                bad.append((t, idx, fd, float(g[idx])))
    assert checked > 40
    assert not bad, bad


@pytest.mark.parametrize("first", ["conv", "residual", "pool", "lrn", "batchnorm", "relu", "fc"])
def test_bprop_without_the_inputs_gradient(cpu, monkeypatch, first):
    # input_grad=False: the first layer gives None and skips its input's gradient; every
    # parameter's gradient is the same as with it.
    head = {"conv": lambda: Conv(4, 3, pad=1, relu=True), "residual": lambda: Residual([Conv(2, 3, pad=1), BatchNorm()]),
            "pool": lambda: Pool("max", 2, stride=1), "lrn": lambda: LRN(3, ascale=0.05),
            "batchnorm": lambda: BatchNorm(relu=True), "relu": ReLU, "fc": lambda: FC(12, relu=True)}[first]
    rng = np.random.default_rng(2)
    x = cpu.array(rng.normal(0, 1, (3, 5, 5, 2)).astype(np.float32))
    e = None
    runs = []
    calls = []
    real = kiln.layers._kiln.bprop_conv
    monkeypatch.setattr(kiln.layers._kiln, "bprop_conv", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    for input_grad in (True, False):
        tail = [FC(4)] if first == "fc" else [Conv(3, 3, pad=1), FC(4)]
        net = Network([head()] + tail, (3, 5, 5, 2), ctx=cpu, seed=4)
        y = net.fprop(x)
        if e is None:
            e = cpu.array(rng.normal(0, 1, y.shape).astype(np.float32))
        del calls[:]
        gx = net.bprop(e, input_grad=input_grad)
        assert (gx is not None) == input_grad
        if input_grad:
            assert gx.shape == (3, 5, 5, 2)
        runs.append(([g.get() for _, g in net.params()], len(calls)))
    for with_gx, without in zip(runs[0][0], runs[1][0]):
        np.testing.assert_array_equal(with_gx, without)
    first_convs = {"conv": 1, "residual": 1}.get(first, 0)
    assert runs[0][1] - runs[1][1] == first_convs


def test_sgd_steps_lower_the_loss_in_every_dtype(cpu):
    rng = np.random.default_rng(8)
    x = rng.normal(0, 1, (6, 8, 8, 2)).astype(np.float32)
    labels = rng.integers(0, 3, 6).astype(np.int32)
    for ctx, dt in ((cpu, kiln.float32), (kiln.Context("cpu", default_dtype=kiln.bfloat16), kiln.bfloat16),
                    (kiln.Context("cpu", default_dtype=kiln.float16, stochastic_round=True), kiln.float16)):
        net = Network(small_net(cpu).layers, (6, 8, 8, 2), dtype=dt, ctx=ctx, seed=3)
        X, L = ctx.array(x, dt), ctx.array(labels, kiln.int32)
        OH = ctx.array(np.eye(3, dtype=np.float32)[labels])
        losses = [net.train_step(X, L, OH, 0.05) for _ in range(12)]
        assert losses[-1] < 0.5 * losses[0], (dt, losses)
        assert net.layers[0].F.dtype == dt


def test_the_seeds_networks(cpu):
    sys.path.insert(0, EXAMPLES)
    try:
        import convnets
    finally:
        sys.path.pop(0)
    expect = {"alexnet": ((128, 1000), 1.43), "overfeat": ((128, 1000), 5.60), "vgg_a": ((64, 1000), 15.22),
              "resnet50": ((256, 1000), 8.18)}
    for name, (shape, gflop) in expect.items():
        net = convnets.build(name, ctx=cpu)
        assert net.out_shape == shape
        assert net.flops / 1e9 / shape[0] == pytest.approx(gflop, abs=0.01)
        assert all(getattr(layer, "F", None) is None for layer in net.layers)   # nothing allocated yet
    # A small batch of ResNet-50 runs end to end: 53 convolutions, batch norms and residual adds.
    net = convnets.build("resnet50", dtype=kiln.float32, ctx=cpu, N=1)
    x = cpu.array(np.random.default_rng(1).normal(0, 1, (1, 224, 224, 3)).astype(np.float32))
    y = net.fprop(x).get()
    assert y.shape == (1, 1000) and np.isfinite(y).all()
    # And back through it: every parameter's gradient and the input's, finite; the same network
    # with each batch norm's sums from the convolution before it gives the same logits.
    gx = net.bprop(cpu.array(np.full((1, 1000), 1e-3, np.float32)))
    assert gx.shape == (1, 224, 224, 3) and np.isfinite(gx.get()).all()
    assert all(np.isfinite(g.get()).all() for _, g in net.params())
    chained = convnets.build("resnet50", dtype=kiln.float32, ctx=cpu, N=1, conv_sums=True)
    np.testing.assert_allclose(chained.fprop(x).get(), y, rtol=1e-4, atol=1e-4)


def test_training_example_runs_and_plots(tmp_path):
    png, js = tmp_path / "loss.png", tmp_path / "loss.json"
    env = dict(os.environ, KILN_BACKEND="cpu")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "train_convnet.py"), "--steps", "40", "--batch", "32",
                        "--png", str(png), "--json", str(js)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every run's loss fell by more than half" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_histogram_example_runs_and_plots(tmp_path):
    png = tmp_path / "hist.png"
    env = dict(os.environ, KILN_BACKEND="cpu")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "fp16_histograms.py"), "--steps", "2", "--batch", "8",
                        "--png", str(png)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "act 0:Conv" in r.stdout and "grad 0:Conv.0" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_misuse(cpu):
    with pytest.raises(ValueError, match=r"Conv: input \(4, 10\); it takes \(N, H, W, C\) activations"):
        Network([Conv(4, 3)], (4, 10), ctx=cpu)
    with pytest.raises(ValueError, match=r"Network: the last layer gives \(2, 4, 4, 3\); a network ends in logits"):
        Network([Conv(3, 1)], (2, 4, 4, 3), ctx=cpu)
    with pytest.raises(ValueError, match="Residual: the branch gives .* and the shortcut"):
        Network([Residual([Conv(5, 1)]), FC(2)], (2, 4, 4, 3), ctx=cpu)


class UnfusedResidual(Residual):
    """The block as written out: every layer of the branch, then relu(b + s) as a kernel of its own."""

    def fprop(self, x):
        b = x
        for layer in self.branch:
            b = layer.fprop(b)
        s = x
        for layer in self.shortcut:
            s = layer.fprop(s)
        self.y = self.ctx.empty(self.out_shape, self.dtype)
        self.y[...] = kiln.nn.relu(b + s)
        return self.y


def test_a_residual_block_ending_in_batch_norm_ends_in_one_kernel_and_keeps_its_gradients(cpu):
    # relu(bn(branch) + shortcut): the branch's last batch norm adds the shortcut and applies the
    # block's ReLU itself. The block's output must equal the formula, and every gradient the
    # unfused block's.
    def build(block):
        proj = block([Conv(6, 1), BatchNorm(relu=True), Conv(6, 3, pad=1, bias=False), BatchNorm()],
                     [Conv(6, 1, bias=False), BatchNorm()])
        ident = block([Conv(6, 1, bias=False), BatchNorm()])
        return Network([Conv(6, 3, pad=1), proj, ident, FC(3)], (4, 5, 5, 2), ctx=cpu, seed=7)

    rng = np.random.default_rng(9)
    x = rng.normal(0, 1, (4, 5, 5, 2)).astype(np.float32)
    labels = rng.integers(0, 3, 4).astype(np.int32)
    X, L, OH = cpu.array(x), cpu.array(labels, kiln.int32), cpu.array(np.eye(3, dtype=np.float32)[labels])
    grads = []
    for block in (Residual, UnfusedResidual):
        net = build(block)
        net.loss(net.fprop(X), L)
        if block is Residual:
            proj, ident = net.layers[1], net.layers[2]
            for res, shortcut in ((proj, proj.shortcut[-1].y), (ident, net.layers[1].y)):
                bn = res.branch[-1]
                assert bn.y is res.y   # the batch norm wrote the block's output: one kernel
                b = bn.x.get().reshape(-1, 6).astype(np.float64)
                ref = (b - b.mean(axis=0)) / np.sqrt(b.var(axis=0) + bn.eps) * bn.gamma.get().reshape(6) + \
                    bn.beta.get().reshape(6)
                ref = np.maximum(ref + shortcut.get().reshape(-1, 6), 0)
                np.testing.assert_allclose(res.y.get().reshape(-1, 6), ref, rtol=1e-4, atol=1e-5)
        gx = net.bprop(net.bprop_loss(OH)).get()
        grads.append([gx] + [g.get() for _, g in net.params()])
    for fused, unfused in zip(*grads):
        np.testing.assert_allclose(fused, unfused, rtol=1e-4, atol=1e-6)


def test_conv_sums_feed_batch_norm_and_eval_uses_the_running_statistics(cpu):
    """conv_sums=True: a Conv without ReLU before a BatchNorm (also inside a Residual) gives the
    batch norm its per-channel sums from the convolution's epilogue; the outputs and gradients are
    those of the network without it. eval() normalises by the running statistics."""
    def net(conv_sums):
        layers = [Conv(6, 3, pad=1), BatchNorm(relu=True),
                  Residual([Conv(6, 1), BatchNorm(relu=True), Conv(6, 3, pad=1), BatchNorm()], [Conv(6, 1), BatchNorm()]),
                  FC(3)]
        return Network(layers, (4, 6, 6, 2), ctx=cpu, seed=5, conv_sums=conv_sums)
    a, b = net(False), net(True)
    first, bn = b.layers[0], b.layers[1]
    assert first.sums_for is bn and bn.sums_given and a.layers[0].sums_for is None
    res = b.layers[2]
    assert res.branch[0].sums_for is res.branch[1] and res.branch[2].sums_for is res.branch[3]
    assert res.shortcut[0].sums_for is res.shortcut[1]
    x = cpu.array(np.random.default_rng(6).normal(size=(4, 6, 6, 2)))
    ya, yb = a.fprop(x).get(), b.fprop(x).get()
    np.testing.assert_allclose(yb, ya, rtol=1e-4, atol=1e-5)
    conv_out = first.y.get().astype(np.float64).reshape(-1, 6)
    np.testing.assert_allclose(bn.xsum.get(), conv_out.sum(0), rtol=1e-5, atol=1e-5)
    e = cpu.array(np.random.default_rng(7).normal(size=(4, 3)))
    a.bprop(e)
    b.bprop(e)
    for (_, ga), (_, gb) in zip(a.params(), b.params()):
        np.testing.assert_allclose(gb.get(), ga.get(), rtol=1e-3, atol=1e-5)
    # eval(): the running statistics (after one training step's update) normalise, and no
    # statistics move.
    b.eval()
    assert not bn.training and not res.branch[1].training
    gmean, gvar = bn.gmean.get().copy(), bn.gvar.get().copy()
    b.fprop(x)
    np.testing.assert_array_equal(bn.gmean.get(), gmean)
    conv_out = first.y.get().astype(np.float64).reshape(-1, 6)
    want = np.maximum((conv_out - gmean) / np.sqrt(gvar + bn.eps) * bn.gamma.get() + bn.beta.get(), 0)
    np.testing.assert_allclose(bn.y.get().reshape(-1, 6), want, rtol=1e-4, atol=1e-5)
    assert b.train() is b and bn.training


def test_softmax_layer_and_cross_entropy_cost(cpu):
    """A network ending in a Softmax: the same loss and gradients as the one ending in logits
    (softmax and cross-entropy's gradient in one step); the Softmax's and the cost's own bprop
    against their formulas; Pool across feature maps."""
    def net(softmax):
        layers = [Conv(4, 3, pad=1, relu=True), Pool("max", 2, J=2, str_c=2), FC(5)] + ([Softmax()] if softmax else [])
        return Network(layers, (3, 6, 6, 2), ctx=cpu, seed=9)
    a, b = net(False), net(True)
    assert a.layers[1].out_shape == (3, 3, 3, 2)   # 4 channels pooled in pairs
    rng = np.random.default_rng(10)
    x = cpu.array(rng.normal(size=(3, 6, 6, 2)))
    labels = np.array([4, 0, 2], dtype=np.int32)
    onehot = np.eye(5, dtype=np.float32)[labels]
    la, lb = a.loss(a.fprop(x), cpu.array(labels)), b.loss(b.fprop(x), cpu.array(labels))
    assert lb == pytest.approx(la, rel=1e-6)
    a.bprop(a.bprop_loss(cpu.array(onehot)))
    b.bprop(b.bprop_loss(cpu.array(onehot)))
    for (_, ga), (_, gb) in zip(a.params(), b.params()):
        np.testing.assert_allclose(gb.get(), ga.get(), rtol=1e-5, atol=1e-7)
    # The Softmax layer's own bprop and the cost's gradient with respect to p, chained: the
    # logits' gradient (p - onehot) / N.
    sm, p = b.layers[-1], b.layers[-1].y
    cost = CrossEntropy()
    gp = cost.bprop(p, cpu.array(onehot))
    np.testing.assert_allclose(gp.get(), -onehot / np.maximum(p.get(), np.exp(-50)) / 3, rtol=1e-6)
    np.testing.assert_allclose(sm.bprop(gp).get(), (p.get() - onehot) / 3, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(cost.bprop_logits(p, cpu.array(onehot)).get(), (p.get() - onehot) / 3, rtol=1e-6)
    total = CrossEntropy("sum")
    assert total.fprop(p, cpu.array(labels)) == pytest.approx(3 * cost.fprop(p, cpu.array(labels)), rel=1e-6)
    np.testing.assert_allclose(total.bprop_logits(p, cpu.array(onehot)).get(), p.get() - onehot, rtol=1e-6)
    with pytest.raises(ValueError, match="reduction='max'; it is 'mean' or 'sum'"):
        CrossEntropy("max")
    with pytest.raises(ValueError, match=r"Softmax: input \(3, 6, 6, 2\); it takes \(N, classes\) logits"):
        Network([Softmax()], (3, 6, 6, 2), ctx=cpu)
    # A training step through the Softmax lowers the loss.
    before = b.train_step(x, cpu.array(labels), cpu.array(onehot), 0.5)
    assert b.loss(b.fprop(x), cpu.array(labels)) < before
