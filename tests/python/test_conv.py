"""The seeds' convolution from Python (ng.conv_layer, fprop_conv, bprop_conv, update_conv,
deconv_layer, with neon's names and keywords) and kiln.conv, against a NumPy reference written
from the definition, on a CPU context; the misuse messages."""
import numpy as np
import pytest

import kiln


@pytest.fixture(scope="module")
def cpu():
    return kiln.Context("cpu")


def windows(x, filt, pad, stride, dil):
    """x (N, D, H, W, C) float64 -> the patches (N, M, P, Q, T, R, S, C) each output position reads."""
    xp = np.pad(x, [(0, 0)] + [(p, p) for p in pad] + [(0, 0)])
    out = [(xp.shape[1 + a] - dil[a] * (filt[a] - 1) - 1) // stride[a] + 1 for a in range(3)]
    patches = np.zeros((x.shape[0], *out, *filt, x.shape[-1]))
    for t in range(filt[0]):
        for r in range(filt[1]):
            for s in range(filt[2]):
                d0, h0, w0 = t * dil[0], r * dil[1], s * dil[2]
                patches[:, :, :, :, t, r, s, :] = xp[:, d0:d0 + stride[0] * out[0]:stride[0],
                                                     h0:h0 + stride[1] * out[1]:stride[1],
                                                     w0:w0 + stride[2] * out[2]:stride[2], :]
    return patches


def ref_fprop(x, f, pad, stride, dil):
    return np.einsum("nmpqtrsc,ktrsc->nmpqk", windows(x, f.shape[1:4], pad, stride, dil), f)


def ref_update(x, e, filt, pad, stride, dil):
    return np.einsum("nmpqtrsc,nmpqk->ktrsc", windows(x, filt, pad, stride, dil), e)


def ref_bprop(f, e, image, pad, stride, dil):
    """The adjoint of fprop: the gradient with respect to x of sum(fprop(x) * e)."""
    n = e.shape[0]
    grad = np.zeros((n, image[0] + 2 * pad[0], image[1] + 2 * pad[1], image[2] + 2 * pad[2], f.shape[-1]))
    contrib = np.einsum("nmpqk,ktrsc->nmpqtrsc", e, f)
    out = e.shape[1:4]
    for t in range(f.shape[1]):
        for r in range(f.shape[2]):
            for s in range(f.shape[3]):
                d0, h0, w0 = t * dil[0], r * dil[1], s * dil[2]
                grad[:, d0:d0 + stride[0] * out[0]:stride[0], h0:h0 + stride[1] * out[1]:stride[1],
                     w0:w0 + stride[2] * out[2]:stride[2], :] += contrib[:, :, :, :, t, r, s, :]
    return grad[:, pad[0]:pad[0] + image[0], pad[1]:pad[1] + image[1], pad[2]:pad[2] + image[2], :]


GEOMETRIES = [
    # N, C, K, (D, H, W), (T, R, S), pad, stride, dilation
    (2, 3, 4, (1, 1, 11), (1, 1, 3), (0, 0, 1), (1, 1, 2), (1, 1, 1)),
    (2, 5, 3, (1, 7, 6), (1, 3, 2), (0, 1, 0), (1, 2, 1), (1, 1, 2)),
    (1, 2, 3, (5, 4, 4), (2, 3, 3), (1, 1, 1), (1, 1, 2), (2, 1, 1)),
]
TOL = {np.float32: 1e-5, np.float16: 3e-3, kiln.bfloat16: 2e-2}


def five(a):
    """A tensor's values as (N, D, H, W, C) float64, whatever spatial rank it was given in."""
    a = np.asarray(a, dtype=np.float64)
    return a.reshape(a.shape[0], *([1] * (5 - a.ndim)), *a.shape[1:])


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["1d", "2d", "3d"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, kiln.bfloat16], ids=["f32", "f16", "bf16"])
def test_fprop_bprop_update(cpu, geometry, dtype):
    n, c, k, image, filt, pad, stride, dil = geometry
    layer = cpu.conv_layer(dtype, n, c, k, *image, *filt, *pad, *stride, *dil)
    assert (layer.N, layer.C, layer.K) == (n, c, k)
    assert (layer.D, layer.H, layer.W, layer.T, layer.R, layer.S) == (*image, *filt)
    rng = np.random.default_rng(sum(image) * 7 + k)
    I = cpu.array(rng.uniform(-1, 1, layer.dimI), dtype=dtype)
    F = cpu.array(rng.uniform(-1, 1, layer.dimF), dtype=dtype)
    E = cpu.array(rng.uniform(-1, 1, layer.dimO), dtype=dtype)
    i, f, e = five(I.get()), five(F.get()), five(E.get())
    scale = np.sqrt(np.prod(filt) * c)
    O = cpu.empty(layer.dimO, dtype)
    assert cpu.fprop_conv(layer, I, F, O) is O
    want = ref_fprop(i, f, pad, stride, dil)
    assert (layer.M, layer.P, layer.Q) == want.shape[1:4]
    np.testing.assert_allclose(five(O.get()), want, rtol=TOL[dtype], atol=TOL[dtype] * scale)
    gI = cpu.empty(layer.dimI, np.float32)
    kiln.bprop_conv(layer, F, E, gI)
    np.testing.assert_allclose(five(gI.get()), ref_bprop(f, e, image, pad, stride, dil), rtol=1e-5, atol=1e-4 * scale)
    gF = cpu.empty(layer.dimF, np.float32)
    kiln.update_conv(layer, I, E, gF)
    np.testing.assert_allclose(five(gF.get()), ref_update(i, e, filt, pad, stride, dil), rtol=1e-5, atol=1e-4 * scale)
    assert layer.flops == 2 * n * k * c * layer.M * layer.P * layer.Q * np.prod(filt)


def test_epilogue_keywords(cpu):
    layer = kiln.conv_layer(np.float32, 2, 3, 4, H=6, W=5, R=3, S=3, pad_h=1, pad_w=1)
    rng = np.random.default_rng(5)
    I, F = cpu.array(rng.uniform(-1, 1, layer.dimI)), cpu.array(rng.uniform(-1, 1, layer.dimF))
    X, O0 = rng.uniform(-1, 1, layer.dimO), rng.uniform(-1, 1, layer.dimO)
    bias = rng.uniform(-1, 1, (4, 1))
    conv = ref_fprop(five(I.get()), five(F.get()), (0, 1, 1), (1, 1, 1), (1, 1, 1)).reshape(layer.dimO)
    O, bsum = cpu.array(O0), cpu.empty((4, 1))
    kiln.fprop_conv(layer, I, F, O, X=cpu.array(X), bias=cpu.array(bias), bsum=bsum, alpha=0.5, beta=2.0, relu=True,
                    slope=0.1)
    v = 0.5 * conv + bias.reshape(4)
    want = np.where(v > 0, v, 0.1 * v) + 2.0 * X
    np.testing.assert_allclose(O.get(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bsum.get().reshape(4), want.reshape(-1, 4).sum(0), rtol=1e-5, atol=1e-4)
    # brelu over O's own previous values (X defaults to the output), and repeat re-runs it.
    O = cpu.array(O0)
    kiln.fprop_conv(layer, I, F, O, brelu=True, slope=0.25)
    np.testing.assert_allclose(O.get(), np.where(O0 > 0, conv, np.where(O0 < 0, 0.25 * conv, 0)), rtol=1e-5, atol=1e-5)
    G = cpu.zeros(layer.dimF)
    kiln.update_conv(layer, I, cpu.array(X), G, alpha=1.0, beta=1.0, repeat=3)
    once = ref_update(five(I.get()), five(X), (1, 3, 3), (0, 1, 1), (1, 1, 1), (1, 1, 1)).reshape(layer.dimF)
    np.testing.assert_allclose(G.get(), 3 * once, rtol=1e-5, atol=1e-4)


def test_neon_update_keywords_grad_bias_and_layer_op(cpu):
    """neon's full signatures: update_conv(..., repeat, grad_bias, layer_op); layer_op on every op."""
    layer = kiln.conv_layer(np.float16, 2, 3, 4, H=6, W=5, R=3, S=3, pad_h=1, pad_w=1)
    rng = np.random.default_rng(8)
    I, F = cpu.array(rng.uniform(-1, 1, layer.dimI), dtype=np.float16), cpu.array(rng.uniform(-1, 1, layer.dimF), dtype=np.float16)
    E = cpu.array(rng.uniform(-1, 1, layer.dimO), dtype=np.float16)
    gF, gB = cpu.empty(layer.dimF, np.float32), cpu.full((4, 1), 3.0)
    assert kiln.update_conv(layer, I, E, gF, 1.0, 0.0, 1, gB, object()) is gF
    np.testing.assert_allclose(gB.get().reshape(4), E.get().astype(np.float64).reshape(-1, 4).sum(0), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gF.get(), ref_update(five(I.get()), five(E.get()), (1, 3, 3), (0, 1, 1), (1, 1, 1),
                                                    (1, 1, 1)).reshape(layer.dimF), rtol=1e-4, atol=1e-3)
    O, gI = cpu.empty(layer.dimO, np.float16), cpu.empty(layer.dimI, np.float32)
    kiln.fprop_conv(layer, I, F, O, layer_op="neon's layer object")
    kiln.bprop_conv(layer, F, E, gI, layer_op=None)
    with pytest.raises(ValueError, match=r"update_conv: grad_bias is float32 \(3,\); it holds one value per output channel"):
        kiln.update_conv(layer, I, E, gF, grad_bias=cpu.zeros((3,)))


def test_deconv_is_the_transposed_conv(cpu):
    d = kiln.deconv_layer(np.float32, 2, 2, 3, 1, 4, 5, R=3, S=3, pad_h=1, pad_w=1, str_h=2, str_w=2)
    assert d.deconv and (d.D, d.H, d.W) == (1, 7, 9) and d.dimI == (2, 4, 5, 3) and d.dimO == (2, 7, 9, 2)
    c = kiln.conv_layer(np.float32, 2, 2, 3, H=7, W=9, R=3, S=3, pad_h=1, pad_w=1, str_h=2, str_w=2)
    rng = np.random.default_rng(9)
    X, F = cpu.array(rng.uniform(-1, 1, d.dimI)), cpu.array(rng.uniform(-1, 1, d.dimF))
    O, ref = cpu.empty(d.dimO), cpu.empty(c.dimI)
    kiln.fprop_conv(d, X, F, O)
    kiln.bprop_conv(c, F, X, ref)
    np.testing.assert_allclose(O.get(), ref.get(), rtol=1e-6, atol=1e-6)


def test_kiln_conv_functional(cpu):
    rng = np.random.default_rng(3)
    x = cpu.array(rng.uniform(-1, 1, (2, 9, 8, 3)))
    w = cpu.array(rng.uniform(-1, 1, (5, 3, 2, 3)))
    b = cpu.array(rng.uniform(-1, 1, (5,)))
    y = kiln.conv(x, w, stride=(2, 1), padding=1, dilation=(1, 2), bias=b, relu=True)
    v = ref_fprop(five(x.get()), five(w.get()), (0, 1, 1), (1, 2, 1), (1, 1, 2)) + b.get()
    assert y.shape == (2, 5, 8, 5) and y.dtype == np.float32
    np.testing.assert_allclose(five(y.get()), np.maximum(v, 0), rtol=1e-5, atol=1e-5)
    y1 = kiln.conv(cpu.array(rng.uniform(-1, 1, (1, 10, 2))), cpu.array(rng.uniform(-1, 1, (3, 4, 2))))
    assert y1.shape == (1, 7, 3)


def test_chwn_conversions(cpu):
    chwn = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)   # C, H, W, N
    nhwc = kiln.from_chwn(cpu.array(chwn))
    assert nhwc.shape == (5, 3, 4, 2)
    np.testing.assert_array_equal(nhwc.get(), chwn.transpose(3, 1, 2, 0))
    np.testing.assert_array_equal(kiln.to_chwn(nhwc).get(), chwn)


def test_misuse_messages(cpu):
    layer = kiln.conv_layer(np.float32, 2, 3, 4, H=6, W=6, R=3, S=3)
    I, F, O = cpu.zeros(layer.dimI), cpu.zeros(layer.dimF), cpu.empty(layer.dimO)
    with pytest.raises(kiln.Error, match=r"along height the padded input \(2 \+ 2 x 0 = 2\)"):
        kiln.conv_layer(np.float32, 1, 3, 4, H=2, W=2, R=3, S=3)
    with pytest.raises(kiln.Error, match=r"it must be \(2, 1, 6, 6, 3\) or \(2, 6, 6, 3\)"):
        kiln.fprop_conv(layer, cpu.zeros((2, 6, 6, 5)), F, O)
    with pytest.raises(kiln.Error, match="but the layer was made for float32"):
        kiln.fprop_conv(layer, cpu.zeros(layer.dimI, np.float16), F, O)
    with pytest.raises(kiln.Error, match="O must be a kiln tensor"):
        kiln.fprop_conv(layer, I, F, np.zeros(layer.dimO))
    with pytest.raises(kiln.Error, match="bias must be a kiln tensor or None"):
        kiln.fprop_conv(layer, I, F, O, bias=[1, 2, 3, 4])
    with pytest.raises(kiln.Error, match="repeat=0"):
        kiln.update_conv(layer, I, O, cpu.empty(layer.dimF), repeat=0)
    with pytest.raises(TypeError):
        kiln.fprop_conv(layer, I, F, O, gamma=1)
    with pytest.raises(ValueError, match="stride=.1, 2, 3.; give an int or a tuple of 2 ints"):
        kiln.conv(I, F, stride=(1, 2, 3))
    with pytest.raises(ValueError, match="padding=-1; every entry must be at least 0"):
        kiln.conv(I, F, padding=-1)
    with pytest.raises(NotImplementedError, match="groups=2; kiln's convolution is not grouped"):
        kiln.conv(I, F, groups=2)
    with pytest.raises(TypeError, match="conv: w must be a kiln tensor"):
        kiln.conv(I, np.zeros((4, 3, 3, 3)))
    # Python ints past what a layer's arithmetic holds: refused by name, never wrapped.
    with pytest.raises(kiln.Error, match=r"along height image size=6, filter=3, pad=4611686018427387904, .* at most 2\^31 - 1"):
        kiln.conv_layer(np.float32, 2, 3, 4, H=6, W=6, R=3, S=3, pad_h=2**62)
    with pytest.raises(kiln.Error, match=r"N=9223372036854775807, C=3, K=4: the batch and the channel counts are at most"):
        kiln.conv_layer(np.float32, 2**63 - 1, 3, 4, H=6, W=6)
    with pytest.raises(kiln.Error, match=r"a kiln tensor has at most 2\^60"):
        kiln.deconv_layer(np.float32, 2**30, 2**30, 4, M=2**20, P=2**20, Q=1)
    with pytest.raises((TypeError, OverflowError)):
        kiln.conv_layer(np.float32, 2**64, 3, 4)


def test_conv_kernel_names_the_path(cpu):
    point = kiln.conv_layer(kiln.float16, 2, 16, 32, H=5, W=5)
    three = kiln.conv_layer(kiln.float16, 2, 16, 32, H=5, W=5, R=3, S=3, pad_h=1, pad_w=1)
    for op in ("fprop", "fprop+bsum", "bprop", "update"):
        assert kiln.conv_kernel(point, op, ctx=cpu) == "gemm"
        assert kiln.conv_kernel(three, op, ctx=cpu) == "im2col+gemm"
    with pytest.raises(kiln.Error, match="conv_kernel: op 'forward'; it is 'fprop', 'fprop\\+bsum', 'bprop' or 'update'"):
        kiln.conv_kernel(three, "forward", ctx=cpu)


def test_debug_log_names_the_path_each_op_takes():
    """KILN_LOG=debug prints, for each op, the path conv_kernel names (here the CPU's)."""
    import os
    import subprocess
    import sys
    script = (
        "import numpy as np, kiln\n"
        "ctx = kiln.Context('cpu')\n"
        "for R, name in ((3, 'a'), (1, 'b')):\n"
        "    L = kiln.conv_layer(np.float32, 2, 3, 4, H=5, W=5, R=R, S=R)\n"
        "    I, F, E = ctx.zeros(L.dimI), ctx.zeros(L.dimF), ctx.zeros(L.dimO)\n"
        "    kiln.fprop_conv(L, I, F, ctx.empty(L.dimO)); kiln.bprop_conv(L, F, E, ctx.empty(L.dimI))\n"
        "    kiln.update_conv(L, I, E, ctx.empty(L.dimF))\n"
        "    print(name, repr(L), *(kiln.conv_kernel(L, op, ctx) for op in ('fprop', 'bprop', 'update')), sep='|')\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env={**os.environ, "KILN_LOG": "debug"})
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2
    for line in r.stdout.splitlines():
        _, layer, *paths = line.split("|")
        for op, path in zip(("fprop", "bprop", "update"), paths):
            assert f"kiln[debug] conv: {op} {layer} -> {path}\n" in r.stderr, (op, layer, path, r.stderr[-2000:])


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_transpose_and_gradient_forms(cpu, dims):
    """kiln.nn.conv_transpose, conv_grad_input and conv_grad_weight: the adjoints of kiln.conv,
    against the NumPy references; conv_transpose is conv_grad_input with a layer's epilogue."""
    rng = np.random.default_rng(20 + dims)
    spatial = (7, 6, 5)[:dims]
    filt = (3, 2, 3)[:dims]
    stride, padding, dilation = (2, 1, 1)[:dims], (1, 0, 1)[:dims], (1, 2, 1)[:dims]
    x = cpu.array(rng.uniform(-1, 1, (2, *spatial, 3)))
    w = cpu.array(rng.uniform(-1, 1, (4, *filt, 3)))
    y = kiln.conv(x, w, stride=stride, padding=padding, dilation=dilation)
    e = cpu.array(rng.uniform(-1, 1, y.shape))
    gx = kiln.nn.conv_grad_input(e, w, x.shape, stride=stride, padding=padding, dilation=dilation)
    gw, gb = kiln.nn.conv_grad_weight(x, e, w.shape, stride=stride, padding=padding, dilation=dilation, bias=True)
    assert gx.shape == x.shape and gw.shape == w.shape and gb.shape == (4,)
    p3 = lambda v, fill: (fill,) * (3 - dims) + tuple(v)
    np.testing.assert_allclose(five(gx.get()), ref_bprop(five(w.get()), five(e.get()), p3(spatial, 1), p3(padding, 0),
                                                         p3(stride, 1), p3(dilation, 1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(five(gw.get()), ref_update(five(x.get()), five(e.get()), p3(filt, 1), p3(padding, 0),
                                                          p3(stride, 1), p3(dilation, 1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gb.get(), e.get().reshape(-1, 4).sum(0), rtol=1e-5, atol=1e-6)
    # <conv(x), e> = <x, conv_grad_input(e)> = <w, conv_grad_weight(x, e)>
    inner = float((y.get().astype(np.float64) * e.get()).sum())
    assert float((x.get() * gx.get()).sum()) == pytest.approx(inner, rel=1e-5)
    assert float((w.get() * gw.get()).sum()) == pytest.approx(inner, rel=1e-5)
    # conv_transpose of e: the input's gradient where the stride left no tail; bias and ReLU after it.
    t = kiln.nn.conv_transpose(e, w, stride=stride, padding=padding, dilation=dilation)
    cut = tuple(slice(0, n) for n in t.shape[1:-1])
    np.testing.assert_allclose(t.get(), gx.get()[(slice(None), *cut)], rtol=1e-5, atol=1e-6)
    b = cpu.array(rng.uniform(-1, 1, (3,)))
    sums = cpu.empty((3, 1))
    tr = kiln.nn.conv_transpose(e, w, stride=stride, padding=padding, dilation=dilation, bias=b, relu=True, bsum=sums)
    np.testing.assert_allclose(tr.get(), np.maximum(t.get() + b.get(), 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sums.get().reshape(3), tr.get().reshape(-1, 3).sum(0), rtol=1e-5, atol=1e-5)
    ysums = cpu.empty((4,))
    kiln.conv(x, w, stride=stride, padding=padding, dilation=dilation, bsum=ysums)
    np.testing.assert_allclose(ysums.get(), y.get().reshape(-1, 4).sum(0), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"conv_grad_input: stride=\(1, 2(, 3)?\); give an int or a tuple of \d ints"):
        kiln.nn.conv_grad_input(e, w, x.shape, stride=(1, 2) if dims != 2 else (1, 2, 3))
    with pytest.raises(TypeError, match="conv_transpose: w must be a kiln tensor"):
        kiln.nn.conv_transpose(e, np.zeros(w.shape))
    with pytest.raises(ValueError, match=r"conv_grad_weight: x is \(2, 7(, 6)?(, 5)?, 3\) and weight_shape=\(4, 3\); both need"):
        kiln.nn.conv_grad_weight(x, e, (4, 3))


def test_bprop_conv_keywords(cpu):
    """bprop_conv's epilogue keywords reach the operation: alpha, bias, leaky relu, beta over X, bsum."""
    layer = kiln.conv_layer(np.float32, 2, 3, 4, H=5, W=6, R=3, S=3, pad_h=1, pad_w=1)
    rng = np.random.default_rng(12)
    F, E = cpu.array(rng.uniform(-1, 1, layer.dimF)), cpu.array(rng.uniform(-1, 1, layer.dimO))
    X, bias = rng.uniform(-1, 1, layer.dimI), rng.uniform(-1, 1, (3,))
    plain = cpu.empty(layer.dimI)
    kiln.bprop_conv(layer, F, E, plain)
    g, sums = cpu.empty(layer.dimI), cpu.empty((3, 1))
    kiln.bprop_conv(layer, F, E, g, X=cpu.array(X), bias=cpu.array(bias), bsum=sums, alpha=0.5, beta=-1.0, relu=True,
                    slope=0.2)
    v = 0.5 * plain.get() + bias
    want = np.where(v > 0, v, 0.2 * v) - X
    np.testing.assert_allclose(g.get(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sums.get().reshape(3), want.reshape(-1, 3).sum(0), rtol=1e-5, atol=1e-5)


def test_long_filters_build_the_patch_matrix_a_block_at_a_time(cpu):
    """A 1-D filter of 2200 taps over 2 x 12000 samples: the CPU's patch matrix (rows x taps, 190 MB
    in float32 at once) is made and multiplied 64 MiB at a time, blocks crossing the images'
    boundary; fprop, bprop and update against float64 correlations, with stride and padding."""
    rng = np.random.default_rng(30)
    N, W, C, K, S, st, pad = 2, 12000, 2, 3, 1100, 2, 50
    x, w = rng.uniform(-1, 1, (N, W, C)), rng.uniform(-1, 1, (K, S, C))
    X, Wt = cpu.array(x.astype(np.float32)), cpu.array(w.astype(np.float32))
    x, w = X.get().astype(np.float64), Wt.get().astype(np.float64)
    xp = np.pad(x, [(0, 0), (pad, pad), (0, 0)])
    Q = (W + 2 * pad - S) // st + 1
    y = kiln.conv(X, Wt, stride=st, padding=pad)
    ref = np.stack([np.stack([sum(np.correlate(xp[n, :, c], w[k, :, c], "valid")[::st] for c in range(C))
                              for k in range(K)], -1) for n in range(N)])
    assert y.shape == (N, Q, K) and ref.shape == y.shape
    np.testing.assert_allclose(y.get(), ref, rtol=1e-4, atol=1e-3)
    e = rng.uniform(-1, 1, (N, Q, K))
    E = cpu.array(e.astype(np.float32))
    e = E.get().astype(np.float64)
    up = np.zeros((N, (Q - 1) * st + 1, K))
    up[:, ::st] = e
    gx = kiln.nn.conv_grad_input(E, Wt, X.shape, stride=st, padding=pad).get()
    full = np.stack([np.stack([sum(np.convolve(up[n, :, k], w[k, :, c]) for k in range(K)) for c in range(C)], -1)
                     for n in range(N)])   # the padded input's gradient, up to its last tapped sample
    gref = np.zeros((N, W + 2 * pad, C))
    gref[:, :full.shape[1]] = full
    np.testing.assert_allclose(gx, gref[:, pad:pad + W], rtol=1e-4, atol=1e-3)
    gw = kiln.nn.conv_grad_weight(X, E, Wt.shape, stride=st, padding=pad).get()
    wref = np.stack([np.stack([sum(np.correlate(xp[n, :, c], up[n, :, k], "valid")[:S] for n in range(N))
                               for c in range(C)], -1) for k in range(K)])
    np.testing.assert_allclose(gw, wref, rtol=1e-4, atol=1e-3)
