"""kiln.dot / compound_dot / batched_dot (and ng.* and @) against NumPy on a CPU context, and kiln's
GPU kernels on a CUDA context (skipped without a device)."""
import numpy as np
import pytest

import kiln


@pytest.fixture(scope="module")
def cpu():
    return kiln.Context("cpu")


def data(rng, shape, dtype=np.float32):
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def operand(cpu, host, layout, dtype=None):
    """host as a kiln tensor: row-major, a transposed view, or a window of a padded tensor."""
    if layout == "T":
        return cpu.array(np.ascontiguousarray(host.T), dtype=dtype).T
    if layout == "pad":
        big = cpu.zeros((host.shape[0] + 2, host.shape[1] + 3), dtype=dtype)
        view = big[1:1 + host.shape[0], 2:2 + host.shape[1]]
        view[...] = host
        return view
    return cpu.array(host, dtype=dtype)


@pytest.mark.parametrize("mnk", [(1, 1, 1), (7, 1, 5), (1, 7, 3), (7, 129, 13), (130, 33, 257), (1003, 17, 70)])
@pytest.mark.parametrize("la", ["N", "T", "pad"])
@pytest.mark.parametrize("lb", ["N", "T", "pad"])
def test_compound_dot_layouts(cpu, mnk, la, lb):
    m, n, k = mnk
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a, b = data(rng, (m, k)), data(rng, (k, n))
    C = cpu.empty((m, n))
    r = kiln.compound_dot(operand(cpu, a, la), operand(cpu, b, lb), C)
    assert r is C
    np.testing.assert_allclose(C.get(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@pytest.mark.parametrize("relu,slope", [(False, 0.0), (True, 0.0), (True, 0.2)])
def test_epilogue(cpu, relu, slope):
    rng = np.random.default_rng(3)
    a, b, c0, bias = data(rng, (37, 41)), data(rng, (41, 29)), data(rng, (37, 29)), data(rng, (29,))
    C = cpu.array(c0)
    bsum = cpu.empty((37, 1))
    cpu.compound_dot(cpu.array(a), cpu.array(b), C, alpha=0.75, beta=-0.5, relu=relu, slope=slope,
                     bias=cpu.array(bias), bsum=bsum)
    x = 0.75 * (a.astype(np.float64) @ b) + bias
    if relu:
        x = np.where(x > 0, x, slope * x)
    want = x - 0.5 * c0
    np.testing.assert_allclose(C.get(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bsum.get()[:, 0], C.get().astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [("float16", 2e-3), ("bfloat16", 1.6e-2)])
def test_16bit(cpu, dtype, tol):
    rng = np.random.default_rng(5)
    A = cpu.array(data(rng, (65, 300)), dtype=dtype)
    B = cpu.array(data(rng, (300, 33)), dtype=dtype)
    C = kiln.dot(A, B)
    assert C.dtype == kiln.dtype(dtype) or str(C.dtype) == dtype
    want = A.astype(np.float32).get().astype(np.float64) @ B.astype(np.float32).get()
    got = np.asarray(C.astype(np.float32))
    assert np.abs(got - want).max() / np.abs(want).max() < tol


def test_dot_vectors_and_matmul(cpu):
    rng = np.random.default_rng(7)
    a, b, v = data(rng, (6, 4)), data(rng, (4, 3)), data(rng, (4,))
    A, B, V = cpu.array(a), cpu.array(b), cpu.array(v)
    np.testing.assert_allclose((A @ B).get(), a @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kiln.dot(A, V).get(), a @ v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kiln.dot(V, B).get(), v @ b, rtol=1e-5, atol=1e-6)
    assert (V @ V).shape == () and abs(float(V @ V) - float(v @ v)) < 1e-5
    out = cpu.empty((6, 3))
    assert kiln.dot(A, B, out=out) is out
    np.testing.assert_allclose(out.get(), a @ b, rtol=1e-5, atol=1e-6)
    # an expression operand is evaluated first
    np.testing.assert_allclose(kiln.dot(A * 2, B).get(), 2 * a @ b, rtol=1e-5, atol=1e-6)


def test_batched_dot(cpu):
    rng = np.random.default_rng(9)
    a, b = data(rng, (4, 6, 9)), data(rng, (9, 5))
    C = cpu.empty((4, 6, 5))
    bsum = cpu.empty((4, 6))
    kiln.batched_dot(cpu.array(a), cpu.array(b), C, bsum=bsum)
    np.testing.assert_allclose(C.get(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bsum.get(), C.get().sum(axis=2), rtol=1e-5, atol=1e-5)


def test_batched_dot_into_an_operand(cpu):
    h = np.arange(32, dtype=np.float32).reshape(2, 4, 4) / 10
    for a, b, c in ((lambda X: X, lambda X: X[0], lambda X: X), (lambda X: X[::-1], lambda X: X, lambda X: X),
                    (lambda X: X, lambda X: X, lambda X: X[::-1])):
        X = cpu.array(h.copy())
        want = np.matmul(a(h), b(h))
        out = c(X)
        kiln.batched_dot(a(X), b(X), out)
        np.testing.assert_allclose(out.get(), want, rtol=1e-6)


def test_misuse(cpu):
    A, B, C = cpu.ones((4, 3)), cpu.ones((5, 2)), cpu.empty((4, 2))
    with pytest.raises(kiln.InvalidArgument, match=r"A's columns \(3\) must equal B's rows \(5\)"):
        kiln.compound_dot(A, B, C)
    with pytest.raises(kiln.DTypeError, match="float32, float16 or bfloat16"):
        kiln.compound_dot(cpu.ones((4, 3), dtype="int32"), cpu.ones((3, 2)), C)
    with pytest.raises(kiln.InvalidArgument, match="needs relu=true"):
        kiln.compound_dot(A, cpu.ones((3, 2)), C, slope=0.1)
    with pytest.raises(kiln.DTypeError, match="C must be a kiln tensor"):
        kiln.compound_dot(A, cpu.ones((3, 2)), np.zeros((4, 2)))
    with pytest.raises(kiln.InvalidArgument, match="vectors or matrices"):
        kiln.dot(cpu.ones((2, 2, 2)), cpu.ones((2, 2)))
    with pytest.raises(kiln.InvalidArgument, match=r"out is float32 \(3, 3\), but the result is \(4, 2\)"):
        kiln.dot(A, cpu.ones((3, 2)), out=cpu.empty((3, 3)))


@pytest.fixture(scope="module")
def gpu():
    try:
        return kiln.Context("cuda")
    except kiln.Error as e:
        pytest.skip(f"needs a CUDA device: {e}")


@pytest.mark.parametrize("dtype,tol", [("float16", 2e-3), ("bfloat16", 1.6e-2), ("float32", 1e-5), ("tf32", 3e-3)])
@pytest.mark.parametrize("la", ["N", "T", "pad"])
@pytest.mark.parametrize("lb", ["N", "T", "pad"])
def test_cuda_kernels_against_numpy(gpu, dtype, tol, la, lb):
    """kiln's own GPU kernels: every dtype (tf32 when the context allows it), every layout,
    the whole epilogue, checked against NumPy in float64."""
    rng = np.random.default_rng(11)
    m, n, k = 133, 70, 301
    gpu.allow_tf32 = dtype == "tf32"
    dt = "float32" if dtype == "tf32" else dtype
    a, b, c0, bias = data(rng, (m, k)), data(rng, (k, n)), data(rng, (m, n)), data(rng, (n,))
    A, B = operand(gpu, a, la, dt), operand(gpu, b, lb, dt)
    C = gpu.array(c0, dtype=dt)
    c_stored = C.get().astype(np.float64)
    bsum = gpu.zeros((m, 1))
    gpu.compound_dot(A, B, C, alpha=0.5, beta=0.25, relu=True, slope=0.1, bias=gpu.array(bias), bsum=bsum)
    gpu.allow_tf32 = False
    a64, b64 = A.get().astype(np.float64), B.get().astype(np.float64)
    x = 0.5 * (a64 @ b64) + bias
    want = np.where(x > 0, x, 0.1 * x) + 0.25 * c_stored
    scale = np.abs(a64) @ np.abs(b64)
    np.testing.assert_array_less(np.abs(C.get().astype(np.float64) - want), tol * (np.abs(want) + scale) + 1e-6)
    # bsum: the row sums of C as stored (rounded to C's dtype), to float32's precision.
    stored = C.get().astype(np.float64)
    np.testing.assert_array_less(np.abs(bsum.get()[:, 0] - stored.sum(axis=1)), 1e-5 * np.abs(stored).sum(axis=1) + 1e-6)
