"""kiln.torch: kiln's GEMM, convolution and any kiln expression as PyTorch custom ops, checked
against PyTorch's own ops (values and gradients; torch.autograd.gradcheck in float64 on the CPU
where kiln computes float64), eagerly and inside torch.compile graphs (fullgraph: no graph
breaks), and the drop-in modules. On a CUDA context the same run on the GPU."""
import os

import numpy as np
import pytest

# Compiled graphs are not reused from an earlier process: their cache keys leave out the custom
# ops' definitions, which change with kiln.
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

torch = pytest.importorskip("torch", reason="PyTorch is not installed (kiln.torch needs it)")
import torch.nn.functional as F  # noqa: E402

import kiln  # noqa: E402
import kiln.torch as kt  # noqa: E402

CUDA = kiln.default_context().backend == "cuda"
DEVICE = "cuda" if CUDA else "cpu"
if CUDA and not torch.cuda.is_available():
    pytest.skip("kiln runs on CUDA but this PyTorch has no CUDA", allow_module_level=True)
# PyTorch's float32 convolutions on CUDA may round their operands to tf32 by default; the
# references here are float32 products.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False

TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.float16: dict(rtol=2e-2, atol=2e-2),
       torch.bfloat16: dict(rtol=5e-2, atol=5e-2), torch.float64: dict(rtol=1e-12, atol=1e-12)}


def _rand(*shape, dtype=torch.float32, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=DEVICE)
    return t.requires_grad_(grad)


def _grads(loss_fn, *tensors):
    for t in tensors:
        t.grad = None
    loss_fn().backward()
    return [t.grad.clone() if t.grad is not None else None for t in tensors]


def _compare(kiln_fn, torch_fn, tensors, dtype, seed=1):
    """Values and gradients (of sum(y * r), r random) of kiln_fn against torch_fn."""
    y, ref = kiln_fn(*tensors), torch_fn(*tensors)
    assert y.shape == ref.shape and y.dtype == ref.dtype
    torch.testing.assert_close(y, ref, **TOL[dtype])
    r = _rand(*ref.shape, dtype=dtype, grad=False, seed=seed)
    got = _grads(lambda: (kiln_fn(*tensors) * r).sum(), *tensors)
    want = _grads(lambda: (torch_fn(*tensors) * r).sum(), *tensors)
    for a, b in zip(got, want):
        assert a is not None and b is not None
        torch.testing.assert_close(a, b, **{k: v * 4 for k, v in TOL[dtype].items()})


# ============================================================================================
# linear


@pytest.mark.parametrize("activation", [None, "relu", "leaky_relu"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch_values_and_gradients(activation, bias):
    x, w = _rand(2, 5, 24), _rand(16, 24, seed=2)
    b = _rand(16, seed=3) if bias else None
    act = {None: lambda v: v, "relu": F.relu, "leaky_relu": lambda v: F.leaky_relu(v, 0.1)}[activation]
    ts = (x, w) + ((b,) if bias else ())
    _compare(lambda *t: kt.linear(t[0], t[1], t[2] if bias else None, activation, negative_slope=0.1),
             lambda *t: act(F.linear(t[0], t[1], t[2] if bias else None)), ts, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_in_16_bit_floats(dtype):
    x, w, b = _rand(33, 64, dtype=dtype), _rand(40, 64, dtype=dtype, seed=2), _rand(40, dtype=dtype, seed=3)
    y = kt.linear(x, w, b, "relu")
    ref = F.relu(F.linear(x.float(), w.float(), b.float())).to(dtype)
    torch.testing.assert_close(y, ref, **TOL[dtype])


def test_linear_gradcheck_in_float64():
    x, w, b = _rand(3, 4, dtype=torch.float64), _rand(5, 4, dtype=torch.float64, seed=2), _rand(5, dtype=torch.float64, seed=3)
    assert torch.autograd.gradcheck(lambda *t: kt.linear(*t, activation="leaky_relu", negative_slope=0.2), (x, w, b))


def test_linear_inside_torch_compile_without_graph_breaks():
    x, w, b = _rand(8, 32), _rand(16, 32, seed=2), _rand(16, seed=3)
    step = torch.compile(lambda x, w, b: (kt.linear(x, w, b, "relu") * 2).sum(), fullgraph=True)
    got = _grads(lambda: step(x, w, b), x, w, b)
    want = _grads(lambda: (F.relu(F.linear(x, w, b)) * 2).sum(), x, w, b)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)


def test_linear_empty_batch_and_empty_features():
    w, b = _rand(4, 3, seed=2), _rand(4, seed=3)
    assert kt.linear(_rand(0, 3), w, b).shape == (0, 4)
    gw, gb = _grads(lambda: kt.linear(_rand(0, 3), w, b, "relu").sum(), w, b)   # an empty batch: zero gradients
    assert torch.equal(gw, torch.zeros_like(w)) and torch.equal(gb, torch.zeros_like(b))
    x0, w0 = _rand(2, 0), _rand(4, 0, seed=2)
    torch.testing.assert_close(kt.linear(x0, w0, b, "relu"), F.relu(b).expand(2, 4))


def test_linear_misuse_names_the_problem():
    x, w = _rand(2, 3, grad=False), _rand(4, 3, grad=False)
    with pytest.raises(ValueError, match=r"kiln.linear: x \(2, 5\) and weight \(4, 3\) do not match"):
        kt.linear(_rand(2, 5, grad=False), w)
    with pytest.raises(ValueError, match=r"bias is \(3,\); it must be \(4,\)"):
        kt.linear(x, w, _rand(3, grad=False))
    with pytest.raises(TypeError, match="must share a dtype; got torch.float16, torch.float32"):
        kt.linear(x, w.half())
    with pytest.raises(ValueError, match="activation='gelu'; valid: None, 'relu', 'leaky_relu'"):
        kt.linear(x, w, activation="gelu")
    with pytest.raises(ValueError, match=r"negative_slope=-1; it must be in \[0, 1\)"):
        kt.linear(x, w, activation="leaky_relu", negative_slope=-1)
    with pytest.raises(TypeError, match="kiln.linear: x must be a torch.Tensor, got ndarray"):
        kt.linear(np.ones((2, 3)), w)


# ============================================================================================
# conv2d


@pytest.mark.parametrize("stride,padding,dilation", [(1, 1, 1), (2, 0, 1), (1, "same", 2), ((2, 1), (1, 2), 1)])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_conv2d_matches_torch_values_and_gradients(stride, padding, dilation, activation):
    x, w, b = _rand(2, 8, 9, 11), _rand(6, 8, 3, 3, seed=2), _rand(6, seed=3)
    act = F.relu if activation else (lambda v: v)
    _compare(lambda x, w, b: kt.conv2d(x, w, b, stride, padding, dilation, activation),
             lambda x, w, b: act(F.conv2d(x, w, b, stride, padding, dilation)), (x, w, b), torch.float32)


@pytest.mark.parametrize("rank,shape,filt,stride,padding,dilation", [
    (1, (2, 6, 17), (5, 6, 3), 1, 1, 1), (1, (2, 6, 17), (5, 6, 5), 2, "valid", 2),
    (3, (2, 4, 5, 6, 7), (3, 4, 3, 3, 3), 1, "same", 1), (3, (1, 3, 6, 7, 8), (2, 3, 2, 3, 1), (2, 1, 2), (1, 0, 1), 1)])
def test_conv1d_and_conv3d_match_torch(rank, shape, filt, stride, padding, dilation):
    x, w, b = _rand(*shape), _rand(*filt, seed=2), _rand(filt[0], seed=3)
    kfn, tfn = (kt.conv1d, F.conv1d) if rank == 1 else (kt.conv3d, F.conv3d)
    _compare(lambda x, w, b: kfn(x, w, b, stride, padding, dilation, "relu"),
             lambda x, w, b: F.relu(tfn(x, w, b, stride, padding, dilation)), (x, w, b), torch.float32)


def test_conv_modules_of_every_rank_are_drop_in():
    for kmod, tmod, shape in ((kt.Conv1d, torch.nn.Conv1d, (2, 3, 9)), (kt.Conv2d, torch.nn.Conv2d, (2, 3, 6, 6)),
                              (kt.Conv3d, torch.nn.Conv3d, (2, 3, 4, 5, 6))):
        ref = tmod(3, 4, 3, padding=1).to(DEVICE)
        mod = kmod(3, 4, 3, padding=1, device=DEVICE)
        mod.load_state_dict(ref.state_dict())
        assert mod.weight.permute(0, *range(2, mod.weight.dim()), 1).is_contiguous()   # channels last
        assert type(mod).__name__ == tmod.__name__ and isinstance(mod, tmod)
        xi = _rand(*shape)
        torch.testing.assert_close(mod(xi), ref(xi), rtol=1e-5, atol=1e-5)


def test_conv2d_reads_channels_last_in_place_and_returns_channels_last():
    x = _rand(2, 16, 8, 8, grad=False).contiguous(memory_format=torch.channels_last)
    w = _rand(8, 16, 1, 1, grad=False, seed=2).contiguous(memory_format=torch.channels_last)
    assert kt.to_kiln(x.permute(0, 2, 3, 1))._data_ptr == x.data_ptr()
    y = kt.conv2d(x, w)
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, F.conv2d(x, w), rtol=1e-5, atol=1e-5)


def test_conv2d_inside_torch_compile_without_graph_breaks():
    x, w, b = _rand(2, 4, 8, 8), _rand(5, 4, 3, 3, seed=2), _rand(5, seed=3)
    step = torch.compile(lambda x, w, b: kt.conv2d(x, w, b, padding=1, activation="relu").square().sum(), fullgraph=True)
    got = _grads(lambda: step(x, w, b), x, w, b)
    want = _grads(lambda: F.relu(F.conv2d(x, w, b, padding=1)).square().sum(), x, w, b)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-3)


def test_conv2d_misuse_names_the_problem():
    x, w = _rand(1, 3, 5, 5, grad=False), _rand(2, 3, 3, 3, grad=False)
    with pytest.raises(ValueError, match=r"x \(1, 4, 5, 5\) and weight \(2, 3, 3, 3\) do not match"):
        kt.conv2d(_rand(1, 4, 5, 5, grad=False), w)
    with pytest.raises(ValueError, match="padding='same' needs stride 1"):
        kt.conv2d(x, w, stride=2, padding="same")
    with pytest.raises(ValueError, match=r"stride=0; give an int or 2 ints >= 1"):
        kt.conv2d(x, w, stride=0)
    with pytest.raises(ValueError, match=r"the output would be 0x0: the input \(2, 2\)"):
        kt.conv2d(_rand(1, 3, 2, 2, grad=False), w)
    with pytest.raises(ValueError, match="has no channels"):
        kt.conv2d(_rand(1, 0, 5, 5, grad=False), _rand(2, 0, 3, 3, grad=False))
    with pytest.raises(ValueError, match="groups=2; kiln's convolution is not grouped"):
        kt.Conv2d(4, 4, 3, groups=2)
    with pytest.raises(ValueError, match="padding_mode='reflect'"):
        kt.Conv2d(4, 4, 3, padding_mode="reflect")


# ============================================================================================
# op: any kiln expression


@kt.op
def gelu(x):
    return 0.5 * x * (1 + kiln.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


@kt.op
def layer_norm(x, g, b):
    mu = kiln.mean(x, axis=-1, keepdims=True)
    return (x - mu) / kiln.sqrt(kiln.var(x, axis=-1, keepdims=True) + 1e-5) * g + b


@kt.op
def softmax(x):
    e = kiln.exp(x - kiln.max(x, axis=-1, keepdims=True))
    return e / kiln.sum(e, axis=-1, keepdims=True)


@kt.op
def scaled_and_shifted(x, y):   # two outputs
    return x * y, kiln.sin(x) + y


def test_op_gradcheck_in_float64():
    d = torch.float64
    assert torch.autograd.gradcheck(gelu, (_rand(3, 5, dtype=d),))
    assert torch.autograd.gradcheck(layer_norm, (_rand(4, 6, dtype=d), _rand(6, dtype=d, seed=2), _rand(6, dtype=d, seed=3)))
    assert torch.autograd.gradcheck(softmax, (_rand(3, 7, dtype=d),))
    assert torch.autograd.gradcheck(scaled_and_shifted, (_rand(3, 4, dtype=d), _rand(4, dtype=d, seed=2)))


def test_op_matches_torch_in_float32():
    x = _rand(16, 64)
    _compare(gelu, lambda x: F.gelu(x, approximate="tanh"), (x,), torch.float32)
    _compare(softmax, lambda x: torch.softmax(x, -1), (x,), torch.float32)
    g, b = _rand(64, seed=2), _rand(64, seed=3)
    _compare(layer_norm, lambda x, g, b: F.layer_norm(x, (64,), g, b, eps=1e-5), (x, g, b), torch.float32)


def test_op_inside_torch_compile_without_graph_breaks():
    x, g, b = _rand(8, 32), _rand(32, seed=2), _rand(32, seed=3)

    def model(x, g, b):
        return (softmax(layer_norm(x, g, b)) * gelu(x)).sum()

    compiled = torch.compile(model, fullgraph=True)
    got = _grads(lambda: compiled(x, g, b), x, g, b)
    want = _grads(lambda: model(x, g, b), x, g, b)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)


def test_op_with_two_outputs_and_an_unused_one():
    x, y = _rand(3, 4), _rand(4, seed=2)
    a, b = scaled_and_shifted(x, y)
    torch.testing.assert_close(a, x * y)
    gx, gy = _grads(lambda: scaled_and_shifted(x, y)[1].sum(), x, y)
    torch.testing.assert_close(gx, torch.cos(x))
    torch.testing.assert_close(gy, torch.full((4,), 3.0, device=DEVICE))


def test_op_given_the_same_tensor_twice_gives_each_use_its_derivative():
    @kt.op
    def mul(a, b):
        return a * b * b

    x = _rand(5)
    (gx,) = _grads(lambda: mul(x, x).sum(), x)
    torch.testing.assert_close(gx, 3 * x.detach() ** 2)


def test_op_integer_inputs_get_no_gradient_and_dtypes_follow_kiln():
    @kt.op
    def pick(x, i):
        return kiln.where(i > 0, x * 2, x)

    x = _rand(6)
    i = torch.tensor([0, 1, 0, 1, 1, 0], dtype=torch.int32, device=DEVICE)
    y = pick(x, i)
    assert y.dtype == torch.float32
    (gx,) = _grads(lambda: pick(x, i).sum(), x)
    torch.testing.assert_close(gx, torch.tensor([1.0, 2, 1, 2, 2, 1], device=DEVICE))


def test_op_works_on_non_contiguous_and_broadcast_inputs():
    @kt.op
    def scale_add(a, b):
        return kiln.tanh(a) * 3 + b

    x, b0 = _rand(6, 4), _rand(1, 6, seed=2)
    r = _rand(4, 6, grad=False, seed=3)
    y = scale_add(x.t(), b0.expand(4, 6))   # a transposed view and a stride-0 broadcast
    torch.testing.assert_close(y, torch.tanh(x.t()) * 3 + b0)
    got = _grads(lambda: (scale_add(x.t(), b0.expand(4, 6)) * r).sum(), x, b0)
    want = _grads(lambda: ((torch.tanh(x.t()) * 3 + b0.expand(4, 6)) * r).sum(), x, b0)
    for a, c in zip(got, want):
        assert a is not None
        torch.testing.assert_close(a, c)


def test_op_misuse_names_the_problem():
    with pytest.raises(TypeError, match=r"kiln.torch.op\(gelu_\d+\): takes torch tensors"):
        gelu(np.ones(3))

    @kt.op
    def not_kiln(x):
        return 3

    with pytest.raises(TypeError, match="must return kiln expressions"):
        not_kiln(_rand(2, grad=False))
    with pytest.raises(ValueError, match="is not an identifier"):
        kt.op(lambda x: x, name="bad name")


# ============================================================================================
# modules and sharing


def test_modules_are_drop_in_replacements():
    torch.manual_seed(0)
    ref = torch.nn.Linear(12, 7).to(DEVICE)
    lin = kt.Linear(12, 7, device=DEVICE)
    lin.load_state_dict(ref.state_dict())
    x = _rand(3, 12)
    torch.testing.assert_close(lin(x), ref(x), rtol=1e-5, atol=1e-5)
    assert "activation='relu'" in repr(kt.Linear(2, 3, activation="relu"))

    cref = torch.nn.Conv2d(3, 5, 3, padding=1).to(DEVICE)
    conv = kt.Conv2d(3, 5, 3, padding=1, device=DEVICE)
    conv.load_state_dict(cref.state_dict())
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    xi = _rand(2, 3, 6, 6)
    torch.testing.assert_close(conv(xi), cref(xi), rtol=1e-5, atol=1e-5)
    assert [n for n, _ in conv.named_parameters()] == ["weight", "bias"]


def test_to_kiln_shares_memory():
    t = torch.arange(6, dtype=torch.float32, device=DEVICE).reshape(2, 3)
    k = kt.to_kiln(t)
    assert k._data_ptr == t.data_ptr() and k.shape == (2, 3)
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        kt.to_kiln([1, 2])
    neg = torch._neg_view(t)
    assert neg.is_neg()
    with pytest.raises(ValueError, match=r"lazy negation .*resolve_neg\(\) first"):
        kt.to_kiln(neg)
    np.testing.assert_array_equal(np.asarray(kt.to_kiln(neg.resolve_neg())), -t.cpu().numpy())


def test_ops_read_lazily_negated_tensors_as_their_values():
    # PyTorch hands a custom op a negative view as is (memory holding the negatives, the bit set)
    t = _rand(4, 6, grad=False)
    neg = torch._neg_view(t)
    torch.testing.assert_close(kt.op(lambda a: a * 2)(neg), -2 * t)
    w = _rand(3, 6, grad=False, seed=1)
    torch.testing.assert_close(kt.linear(t, torch._neg_view(w)), F.linear(t, -w), rtol=1e-5, atol=1e-5)
    x = _rand(2, 3, 6, 6, grad=False, seed=2)
    f = _rand(5, 3, 3, 3, grad=False, seed=3)
    torch.testing.assert_close(kt.conv2d(torch._neg_view(x), f, padding=1), F.conv2d(-x, f, padding=1),
                               rtol=1e-4, atol=1e-4)
    a = t.clone().requires_grad_()
    (kt.op(lambda u: u * u)(a) * torch._neg_view(torch.ones_like(t))).sum().backward()
    torch.testing.assert_close(a.grad, -2 * t)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA context (stream ordering)")
def test_cuda_work_is_ordered_with_torch_streams():
    s = torch.cuda.Stream()
    x = _rand(4096, 1024, grad=False)
    with torch.cuda.stream(s):
        big = x * 3          # queued on s
        y = gelu(big)        # kiln must wait for it, and s's later work for kiln
        z = y + 1
    s.synchronize()
    torch.testing.assert_close(z, F.gelu(x * 3, approximate="tanh") + 1, rtol=1e-5, atol=1e-5)
