"""kiln.assign_together: sibling reductions into several tensors by one kernel, anything else in
order as separate assignments would run, and what it says of misuse (CPU context)."""
import numpy as np
import pytest

import kiln


@pytest.fixture(scope="module")
def cpu():
    return kiln.Context("cpu")


def launches(ctx):
    return ctx.counters()["launches"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_column_sums_in_one_kernel(cpu, dtype):
    rng = np.random.default_rng(3)
    x = rng.uniform(-2, 3, (513, 29)).astype(np.float32)
    X = cpu.array(x).astype(dtype).eval()   # a tensor holding the values rounded to dtype
    xv = X.get().astype(np.float64)
    s, q, m = cpu.empty((1, 29)), cpu.empty((29,)), cpu.empty((1, 29), dtype=dtype)
    xf = X.astype("float32")
    before = launches(cpu)
    kiln.assign_together([(s, kiln.sum(xf, axis=0, keepdims=True)),
                          (q, kiln.sum((xf - 0.5) ** 2, axis=0)),
                          (m, kiln.max(X, axis=0, keepdims=True))])
    assert launches(cpu) - before == 1
    np.testing.assert_allclose(s.get().reshape(29), xv.sum(0), rtol=1e-5)
    np.testing.assert_allclose(q.get(), ((xv - 0.5) ** 2).sum(0), rtol=1e-5)
    np.testing.assert_array_equal(m.get().astype(np.float64).reshape(29), xv.max(0))


def test_in_order_where_one_kernel_cannot(cpu):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    X = cpu.array(x)
    rows, cols = cpu.empty((3, 1)), cpu.empty((1, 4))
    before = launches(cpu)
    kiln.assign_together([(rows, kiln.sum(X, axis=1, keepdims=True)), (cols, kiln.sum(X, axis=0, keepdims=True))])
    assert launches(cpu) - before == 2
    np.testing.assert_array_equal(rows.get(), x.sum(1, keepdims=True))
    np.testing.assert_array_equal(cols.get(), x.sum(0, keepdims=True))
    # A value that reads an earlier destination sees what was written there.
    a, b = cpu.zeros((1, 4)), cpu.empty((1, 4))
    kiln.assign_together([(a, kiln.sum(X, axis=0, keepdims=True)), (b, a * 2.0)])
    np.testing.assert_array_equal(b.get(), 2 * x.sum(0, keepdims=True))
    # Scalars and an empty list.
    kiln.assign_together([(a, 1.5), (b, 2)])
    assert (a.get() == 1.5).all() and (b.get() == 2).all()
    kiln.assign_together([])


def test_misuse(cpu):
    X = cpu.array(np.ones((3, 4), np.float32))
    a = cpu.empty((1, 4))
    with pytest.raises(TypeError, match=r"assign_together: takes a list of \(tensor, value\) pairs, not int"):
        kiln.assign_together(3)
    with pytest.raises(TypeError, match=r"assign_together: each item must be a \(tensor, value\) pair; got 3"):
        kiln.assign_together([3])
    with pytest.raises(TypeError, match=r"each item must be a \(tensor, value\) pair"):
        kiln.assign_together([(kiln.sum(X), a)])
    with pytest.raises(ValueError, match=r"cannot assign a float32 expression of shape \(3, 4\) to a destination of shape \(1, 4\)"):
        kiln.assign_together([(a, X), (cpu.empty((1, 4)), kiln.sum(X, axis=0, keepdims=True))])
    other = kiln.Context("cpu")
    with pytest.raises(ValueError, match="every destination must belong to one context"):
        kiln.assign_together([(a, kiln.sum(X, axis=0, keepdims=True)), (other.empty((1, 4)), 1.0)])
