"""The seeds' API: kiln.NervanaGPU (neon's backend conventions) and the nervanagpu README's
examples, verbatim except for the imports, checked against NumPy."""
import numpy as np
import pytest

import kiln
from kiln import NervanaGPU


def tol(dtype):
    return {np.float32: dict(rtol=1e-4, atol=1e-5), np.float16: dict(rtol=5e-3, atol=5e-3)}[dtype]


# =============================================================================================
# the README's examples


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=lambda d: np.dtype(d).name)
def test_readme_matrix_setup_and_transfer(dtype):
    # initialize factory class
    ng = NervanaGPU(stochastic_round=False)

    m, n, k = 10, 20, 10

    # create matrices on host
    np.random.seed(0)
    cpuA = np.random.randn(k, m)
    cpuB = np.random.randn(k, n)

    # transfer to device
    devA = ng.array(cpuA, dtype=dtype)
    devB = ng.array(cpuB, dtype=dtype)
    devC = ng.empty((m, n), dtype=dtype)

    assert devA.shape == (k, m) and devA.dtype == np.dtype(dtype)
    assert devB.shape == (k, n) and devB.dtype == np.dtype(dtype)
    assert devC.shape == (m, n) and devC.dtype == np.dtype(dtype)
    # get from device
    np.testing.assert_array_equal(devA.get(), cpuA.astype(dtype))
    np.testing.assert_array_equal(devB.get(), cpuB.astype(dtype))


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=lambda d: np.dtype(d).name)
def test_readme_variance(dtype):
    ng = NervanaGPU(stochastic_round=False)
    m, n, k = 10, 20, 10
    np.random.seed(1)
    cpuA = np.random.randn(k, m)
    devA = ng.array(cpuA, dtype=dtype)
    devC = ng.empty((m, n), dtype=dtype)

    devC[:] = ng.mean(ng.square(devA - ng.mean(devA, axis=1)), axis=1)

    # the (k, 1) variance broadcast over devC's (m, n), as neon's assignment does
    a = cpuA.astype(dtype).astype(np.float64)
    want = np.broadcast_to(a.var(axis=1, keepdims=True), (m, n))
    np.testing.assert_allclose(devC.get().astype(np.float64), want, **tol(dtype))

    devV = ng.empty((k, 1), dtype=dtype)
    devV[:] = ng.mean(ng.square(devA - ng.mean(devA, axis=1)), axis=1)
    np.testing.assert_allclose(devV.get().astype(np.float64), a.var(axis=1, keepdims=True), **tol(dtype))
    # and the same through ng.var
    devV2 = ng.empty((k, 1), dtype=dtype)
    devV2[:] = ng.var(devA, axis=1)
    np.testing.assert_allclose(devV2.get().astype(np.float64), a.var(axis=1, keepdims=True), **tol(dtype))


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=lambda d: np.dtype(d).name)
def test_readme_variance_is_one_kernel(dtype):
    ng = NervanaGPU(stochastic_round=False)
    devA = ng.array(np.random.RandomState(2).randn(10, 10), dtype=dtype)
    devC = ng.empty((10, 1), dtype=dtype)
    ng.reset_counters()
    devC[:] = ng.mean(ng.square(devA - ng.mean(devA, axis=1)), axis=1)
    c = ng.counters()
    assert c["assignments"] == 1
    assert c["launches"] == 1, f"the variance took {c['launches']} kernel launches, the README promises one kernel"


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=lambda d: np.dtype(d).name)
def test_readme_batch_norm(dtype):
    ng = NervanaGPU(stochastic_round=False)
    ng.seed(3)

    eps = .001
    A = ng.empty((128, 32), dtype=dtype)
    A[:] = ng.rand()  # generate uniform random on device between 0 and 1

    A0 = A.get()
    assert A0.dtype == np.dtype(dtype)
    assert A0.min() >= 0 and A0.max() <= 1
    assert abs(A0.astype(np.float64).mean() - 0.5) < 0.02
    assert len(np.unique(A0)) > 1000, "ng.rand() must draw one value per element"

    ng.reset_counters()
    # Normalize batch data by batch mean and variance,
    A[:] = ng.reciprocal(ng.sqrt(ng.var(A, axis=1) + eps)) * (A - ng.mean(A, axis=1))
    c = ng.counters()

    a = A0.astype(np.float64)
    want = (a - a.mean(axis=1, keepdims=True)) / np.sqrt(a.var(axis=1, keepdims=True) + eps)
    got = A.get().astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=tol(dtype)["rtol"] * 2, atol=tol(dtype)["atol"] * 2)
    # each row is now normalised
    np.testing.assert_allclose(got.mean(axis=1), 0, atol=5e-3 if dtype == np.float16 else 1e-5)
    assert c["launches"] == 1, f"the batch norm took {c['launches']} launches; the README promises a single kernel"


def test_readme_batch_norm_matches_module_functions():
    ng = NervanaGPU()
    h = np.random.RandomState(4).rand(16, 8).astype(np.float32)
    A = ng.array(h)
    B = kiln.array(h)
    eps = 1e-3
    A[:] = ng.reciprocal(ng.sqrt(ng.var(A, axis=1) + eps)) * (A - ng.mean(A, axis=1))
    B[:] = (B - kiln.mean(B, axis=1, keepdims=True)) / kiln.sqrt(kiln.var(B, axis=1, keepdims=True) + eps)
    np.testing.assert_allclose(A.get(), B.get(), rtol=1e-5, atol=1e-5)


# =============================================================================================
# neon's reductions: keepdims=True by default, argmax along axis 1


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "var", "std"])
def test_reductions_keep_dims_by_default(ng, name):
    h = np.random.RandomState(5).randn(6, 7).astype(np.float32)
    a = ng.array(h)
    ref = getattr(np, name)
    for axis in (0, 1, -1):
        r = getattr(ng, name)(a, axis=axis)
        assert isinstance(r, kiln.Expr)
        want = ref(h.astype(np.float64), axis=axis, keepdims=True)
        assert r.shape == want.shape
        np.testing.assert_allclose(np.asarray(r), want, rtol=1e-4, atol=1e-5)
        r2 = getattr(ng, name)(a, axis=axis, keepdims=False)
        assert r2.shape == ref(h, axis=axis).shape
    r = getattr(ng, name)(a, axis=1)
    assert r.shape == (6, 1)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "var", "std"])
def test_reductions_over_all_axes(ng, name):
    # neon: axis=None (the default) reduces over all dimensions, keeping them: shape (1, 1).
    h = np.random.RandomState(6).randn(4, 5).astype(np.float32)
    a = ng.array(h)
    want = getattr(np, name)(h.astype(np.float64), keepdims=True)
    r = getattr(ng, name)(a)
    assert r.shape == (1, 1)
    np.testing.assert_allclose(np.asarray(r), want, rtol=1e-4, atol=1e-5)
    r = getattr(ng, name)(a, axis=None)
    assert r.shape == (1, 1)
    np.testing.assert_allclose(np.asarray(r), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_default_axis_is_1(ng, name):
    h = np.random.RandomState(7).randn(5, 8).astype(np.float32)
    a = ng.array(h)
    r = getattr(ng, name)(a)
    assert r.shape == (5, 1)
    assert r.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(r), getattr(np, name)(h, axis=1)[:, None])
    r0 = getattr(ng, name)(a, axis=0)
    assert r0.shape == (1, 8)
    np.testing.assert_array_equal(np.asarray(r0), getattr(np, name)(h, axis=0)[None, :])
    r0 = getattr(ng, name)(a, axis=0, keepdims=False)
    assert r0.shape == (8,)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_axis_none_is_flat(ng, name):
    h = np.random.RandomState(8).randn(5, 8).astype(np.float32)
    r = getattr(ng, name)(ng.array(h), axis=None)
    assert r.shape == (1, 1)
    assert int(r) == int(getattr(np, name)(h))


def test_argmax_ties_first_index(ng):
    h = np.array([[3, 1, 3], [0, 0, 0], [1, 2, 2]], dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(ng.argmax(ng.array(h))), [[0], [0], [1]])
    np.testing.assert_array_equal(np.asarray(ng.argmin(ng.array(h))), [[1], [0], [0]])


def test_module_functions_drop_dims_where_context_keeps_them(ng):
    h = np.random.RandomState(9).randn(3, 4).astype(np.float32)
    a = ng.array(h)
    assert kiln.sum(a, axis=1).shape == (3,)
    assert ng.sum(a, axis=1).shape == (3, 1)
    assert kiln.argmax(a).shape == ()
    assert ng.argmax(a).shape == (3, 1)
    assert a.sum(axis=0).shape == (4,)


# =============================================================================================
# out= and laziness


def test_elementwise_methods_are_lazy_without_out(ng):
    h = np.random.RandomState(10).randn(3, 4).astype(np.float32)
    a = ng.array(h)
    e = ng.add(a, 1)
    assert isinstance(e, kiln.Expr)
    np.testing.assert_allclose(np.asarray(e), h + 1, rtol=1e-6)
    e2 = ng.multiply(ng.exp(a), ng.sig(a))
    np.testing.assert_allclose(np.asarray(e2), np.exp(h) / (1 + np.exp(-h)), rtol=1e-5)


@pytest.mark.parametrize("name,ref", [
    ("add", np.add), ("subtract", np.subtract), ("multiply", np.multiply), ("divide", np.divide),
    ("maximum", np.maximum), ("minimum", np.minimum), ("power", np.power), ("greater", np.greater),
    ("less_equal", np.less_equal), ("equal", np.equal), ("not_equal", np.not_equal),
    ("floor_divide", np.floor_divide), ("remainder", np.remainder), ("mod", np.mod), ("fmod", np.fmod),
])
def test_binary_out(ng, name, ref):
    rs = np.random.RandomState(11)
    ha = rs.rand(4, 5).astype(np.float32) + 0.5
    hb = rs.rand(4, 5).astype(np.float32) + 0.5
    hb[0, :2] = ha[0, :2]
    out = ng.zeros((4, 5))
    r = getattr(ng, name)(ng.array(ha), ng.array(hb), out=out)
    assert r is out
    np.testing.assert_allclose(out.get(), ref(ha, hb).astype(np.float32), rtol=1e-5)


@pytest.mark.parametrize("name,ref", [
    ("sqrt", np.sqrt), ("exp", np.exp), ("log", np.log), ("square", np.square), ("negative", np.negative),
    ("absolute", np.abs), ("reciprocal", np.reciprocal), ("tanh", np.tanh), ("sgn", np.sign), ("rint", np.rint),
    ("finite", np.isfinite), ("exp2", np.exp2), ("log2", np.log2),
    ("sig", lambda x: 1 / (1 + np.exp(-x))), ("safelog", lambda x: np.log(np.maximum(x, np.exp(-50)))),
])
def test_unary_out(ng, name, ref):
    h = np.random.RandomState(12).rand(4, 5).astype(np.float32) * 3 + 0.1
    out = ng.empty((4, 5))
    r = getattr(ng, name)(ng.array(h), out=out)
    assert r is out
    np.testing.assert_allclose(out.get(), ref(h.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_reduction_out(ng):
    h = np.random.RandomState(13).randn(6, 4).astype(np.float32)
    a = ng.array(h)
    out = ng.empty((6, 1))
    assert ng.sum(a, axis=1, out=out) is out
    np.testing.assert_allclose(out.get(), h.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    out0 = ng.empty((1, 4))
    assert ng.max(a, axis=0, out=out0) is out0
    np.testing.assert_array_equal(out0.get(), h.max(axis=0, keepdims=True))
    iout = ng.empty((6, 1), dtype=np.int32)
    assert ng.argmax(a, out=iout) is iout
    np.testing.assert_array_equal(iout.get(), np.argmax(h, axis=1)[:, None])
    # a (6, 1) result broadcast into a (6, 4) out, as neon's assignment does
    big = ng.empty((6, 4))
    ng.mean(a, axis=1, out=big)
    np.testing.assert_allclose(big.get(), np.broadcast_to(h.mean(axis=1, keepdims=True), (6, 4)), rtol=1e-5)


def test_out_with_other_dtype_converts(ng):
    h = np.random.RandomState(14).randn(3, 3).astype(np.float32)
    out = ng.empty((3, 3), dtype=np.float16)
    ng.multiply(ng.array(h), 2, out=out)
    np.testing.assert_array_equal(out.get(), (h * 2).astype(np.float16))


def test_clip_where_take(ng):
    rs = np.random.RandomState(15)
    h = rs.randn(5, 6).astype(np.float32)
    a = ng.array(h)
    np.testing.assert_array_equal(np.asarray(ng.clip(a, -0.5, 0.5)), np.clip(h, -0.5, 0.5))
    np.testing.assert_array_equal(np.asarray(ng.where(a > 0, a, 0)), np.where(h > 0, h, 0))
    idx = np.array([4, 0, 2], dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(ng.take(a, idx, axis=0)), h[idx])
    np.testing.assert_array_equal(np.asarray(ng.take(a, ng.array(idx, dtype=np.int32), axis=1)), h[:, idx])
    out = ng.empty((5, 3))
    assert ng.take(a, idx, axis=1, out=out) is out
    np.testing.assert_array_equal(out.get(), h[:, idx])


# =============================================================================================
# onehot, rand, dropout, fill_normal


@pytest.mark.parametrize("out_dtype", [np.float32, np.float16, np.int32], ids=lambda d: np.dtype(d).name)
def test_onehot_with_out(ng, out_dtype):
    labels = np.array([3, 0, 9, 4, 4, 1, 7], dtype=np.int32)
    idx = ng.array(labels, dtype=np.int32)
    out = ng.empty((10, labels.size), dtype=out_dtype)  # classes along axis 0, as neon's targets
    r = ng.onehot(idx, axis=0, out=out)
    assert r is out
    np.testing.assert_array_equal(out.get(), np.eye(10, dtype=out_dtype)[labels].T)
    out1 = ng.empty((labels.size, 10), dtype=out_dtype)
    ng.onehot(idx, axis=1, out=out1)
    np.testing.assert_array_equal(out1.get(), np.eye(10, dtype=out_dtype)[labels])


def test_onehot_lazy_with_num_classes(ng):
    labels = np.array([2, 0, 1], dtype=np.int32)
    e = ng.onehot(ng.array(labels, dtype=np.int32), axis=0, num_classes=4)
    assert isinstance(e, kiln.Expr) and e.shape == (4, 3)
    np.testing.assert_array_equal(np.asarray(e), np.eye(4, dtype=np.float32)[labels].T)


def test_onehot_of_neon_row_labels(ng):
    # neon keeps labels as a (1, N) row; onehot along axis 0 fills a (classes, N) tensor.
    labels = np.array([[1, 0, 2, 2]], dtype=np.int32)
    out = ng.empty((3, 4))
    ng.onehot(ng.array(labels, dtype=np.int32), axis=0, out=out)
    np.testing.assert_array_equal(out.get(), np.eye(3, dtype=np.float32)[labels[0]].T)


def test_rand_is_a_per_element_draw(ng):
    ng.seed(20)
    A = ng.empty((200, 100))
    A[:] = ng.rand()
    h = A.get()
    assert h.min() >= 0 and h.max() < 1
    assert len(np.unique(h)) > 19000
    assert abs(h.mean() - 0.5) < 0.01
    B = ng.empty((200, 100))
    B[:] = ng.rand()
    assert not np.array_equal(h, B.get()), "two rand() assignments drew the same numbers"
    ng.seed(20)
    A2 = ng.empty((200, 100))
    A2[:] = ng.rand()
    np.testing.assert_array_equal(A2.get(), h)


def test_rand_in_an_expression(ng):
    ng.seed(21)
    A = ng.empty((1000, 10))
    A[:] = ng.rand() * 4 - 2
    h = A.get()
    assert h.min() >= -2 and h.max() < 2 and abs(h.mean()) < 0.05


def test_rand_out(ng):
    out = ng.empty((50, 50))
    assert ng.rand(out=out) is out
    h = out.get()
    assert 0 <= h.min() and h.max() < 1 and h.std() > 0.2


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.8])
def test_dropout_keep_ratio(ng, keep):
    ng.seed(22)
    mask = ng.empty((400, 250))
    mask[:] = ng.dropout(keep)
    h = mask.get()
    assert set(np.unique(h)) <= {0.0, 1.0}
    assert abs(h.mean() - keep) < 0.01
    out = ng.empty((400, 250))
    assert ng.dropout(keep=keep, out=out) is out
    assert abs(out.get().mean() - keep) < 0.01
    assert not np.array_equal(out.get(), h)


def test_dropout_applied_to_activations(ng):
    ng.seed(23)
    x = ng.array(np.full((100, 100), 3.0))
    x[:] = x * ng.dropout(0.25)
    h = x.get()
    assert set(np.unique(h)) == {0.0, 3.0}
    assert abs((h != 0).mean() - 0.25) < 0.02
    ones = ng.empty((10, 10))
    ones[:] = ng.dropout(1.0)
    assert np.all(ones.get() == 1)


def test_fill_normal(ng):
    ng.seed(24)
    a = ng.empty((300, 300))
    assert ng.fill_normal(a) is a
    h = a.get()
    assert abs(h.mean()) < 0.02 and abs(h.std() - 1) < 0.02
    ng.fill_normal(a, mean=5.0, stdv=0.1)
    h = a.get()
    assert abs(h.mean() - 5) < 0.01 and abs(h.std() - 0.1) < 0.005


def test_seed_reproducible_across_contexts():
    a = NervanaGPU(rng_seed=99)
    b = NervanaGPU(rng_seed=99)
    ta, tb = a.empty((64, 64)), b.empty((64, 64))
    ta[:] = a.rand()
    tb[:] = b.rand()
    np.testing.assert_array_equal(ta.get(), tb.get())
    c = NervanaGPU(rng_seed=100)
    tc = c.empty((64, 64))
    tc[:] = c.rand()
    assert not np.array_equal(ta.get(), tc.get())


def test_rng_state_get_set_reset_and_gen_rng():
    ng = NervanaGPU(rng_seed=7)
    t = ng.empty((32, 48))

    def draw():
        t[:] = ng.rand()
        return t.get().copy()

    first = draw()
    state = ng.rng_get_state()
    assert isinstance(state, tuple) and len(state) == 2
    second, third = draw(), draw()
    assert not np.array_equal(second, third)
    ng.rng_set_state(state)
    np.testing.assert_array_equal(draw(), second)   # the same draws from the same state
    ng.rng_reset()
    np.testing.assert_array_equal(draw(), first)    # back to right after the seeding
    # gen_rng seeds like a new context with that seed
    assert ng.gen_rng(100) == ng.rng_get_state()
    other = NervanaGPU(rng_seed=100)
    u = other.empty((32, 48))
    u[:] = other.rand()
    np.testing.assert_array_equal(draw(), u.get())
    ng.rng_reset()                                   # the last seeding is now gen_rng's
    np.testing.assert_array_equal(draw(), u.get())
    # a state moves between contexts, on any backend
    other.rng_set_state(state)
    u[:] = other.rand()
    np.testing.assert_array_equal(u.get(), second)
    for bad in [(1,), (1, 2, 3), (-1, 0), (0, 2**32), (1.5, 0), "state", (True, 0)]:
        with pytest.raises(kiln.Error, match=r"rng_set_state: state .*; it is a \(seed, counter\) tuple of two ints"):
            ng.rng_set_state(bad)
    with pytest.raises(kiln.Error, match="gen_rng: seed -1 is out of range"):
        ng.gen_rng(-1)


# =============================================================================================
# stochastic rounding


def test_stochastic_round_property():
    assert NervanaGPU(stochastic_round=False).stochastic_round == 0
    assert NervanaGPU(stochastic_round=True).stochastic_round == 10
    assert NervanaGPU(stochastic_round=7).stochastic_round == 7
    ng = NervanaGPU()
    assert ng.stochastic_round == 0
    ng.stochastic_round = True
    assert ng.stochastic_round == 10
    ng.stochastic_round = 3
    assert ng.stochastic_round == 3
    ng.stochastic_round = False
    assert ng.stochastic_round == 0


@pytest.mark.parametrize("bits,fraction", [(0, 0.0), (True, 0.25), (8, 2 ** -4)])
def test_stochastic_round_is_unbiased(bits, fraction):
    # 1 + 2^-12 lies a quarter of the way from 1 to the next float16 (1 + 2^-10): round to
    # nearest always gives 1; stochastic rounding to 10 bits gives 1 + 2^-10 a quarter of the
    # time (8 bits: 1 + 2^-8 one time in 16), so the mean stays 1 + 2^-12.
    ng = NervanaGPU(stochastic_round=bits)
    ng.seed(25)
    v = 1 + 2 ** -12
    src = ng.array(np.full(200000, v, dtype=np.float32))
    A = ng.empty((200000,), dtype=np.float16)
    A[:] = src * 1
    h = A.get().astype(np.float64)
    assert abs((h > 1).mean() - fraction) < 0.01
    if bits:
        assert abs(h.mean() - v) < 2e-5
        up = 1 + 2.0 ** -(bits if bits is not True else 10)
        assert set(np.unique(h)) == {1.0, up}
    else:
        assert np.all(h == 1.0)


def test_stochastic_round_leaves_float32_alone():
    ng = NervanaGPU(stochastic_round=True)
    h = np.random.RandomState(26).randn(1000).astype(np.float32)
    a = ng.empty((1000,))
    a[:] = ng.array(h) * 1
    np.testing.assert_array_equal(a.get(), h)


# =============================================================================================
# caches, counters, bench, synchronize


def test_counters_show_a_cache_hit_on_a_repeated_expression():
    ng = NervanaGPU()
    h = np.random.RandomState(27).randn(32, 16).astype(np.float32)
    A = ng.array(h)
    C = ng.empty((32, 1))
    keys = {"compiles", "memory_hits", "disk_hits", "plan_hits", "compile_ms", "launches", "assignments"}
    assert keys <= set(ng.counters())
    C[:] = ng.mean(ng.square(A - ng.mean(A, axis=1)), axis=1)
    first = ng.counters()
    C[:] = ng.mean(ng.square(A - ng.mean(A, axis=1)), axis=1)
    second = ng.counters()
    assert second["compiles"] == first["compiles"], "the second identical assignment compiled again"
    assert (second["plan_hits"] + second["memory_hits"] + second["disk_hits"]
            > first["plan_hits"] + first["memory_hits"] + first["disk_hits"])
    assert second["assignments"] == first["assignments"] + 1
    assert second["launches"] > first["launches"]
    np.testing.assert_allclose(C.get(), h.var(axis=1, keepdims=True), rtol=1e-4)


def test_a_new_size_compiles_nothing():
    # kernels are keyed without their sizes: the same expression on a new batch size reuses them
    ng = NervanaGPU()
    for n in (8, 24):
        A = ng.array(np.random.RandomState(n).randn(n, 5).astype(np.float32))
        C = ng.empty((n, 1))
        before = ng.counters()["compiles"]
        C[:] = ng.sum(ng.exp(A) * 3 - 1, axis=1)
        compiled = ng.counters()["compiles"] - before
        np.testing.assert_allclose(C.get(), (np.exp(A.get()) * 3 - 1).sum(axis=1, keepdims=True), rtol=1e-5)
    assert compiled == 0, f"the second size compiled {compiled} kernel(s)"


def test_reset_counters():
    ng = NervanaGPU()
    a = ng.ones((4, 4))
    a[:] = a + 1
    assert ng.counters()["assignments"] > 0
    ng.reset_counters()
    c = ng.counters()
    assert c["assignments"] == 0 and c["launches"] == 0 and c["compiles"] == 0


def test_bench_prints_a_line_per_assignment(capfd):
    ng = NervanaGPU(bench=True)
    assert ng.bench is True
    a = ng.array(np.arange(12, dtype=np.float32).reshape(3, 4))
    capfd.readouterr()
    a[:] = a * 2 + 1
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "kiln bench" in lines[0] and "ms" in lines[0] and "(3, 4)" in lines[0] and "float32" in lines[0]
    np.testing.assert_array_equal(a.get(), np.arange(12).reshape(3, 4) * 2 + 1)
    ng.bench = False
    a[:] = a * 2
    assert capfd.readouterr().err == ""


def test_bench_times_gemm_convolution_and_pooling_with_their_rates(capfd):
    ng = NervanaGPU(bench=True)
    rng = np.random.default_rng(3)
    A = ng.array(rng.standard_normal((16, 8)).astype(np.float32))
    B = ng.array(rng.standard_normal((8, 4)).astype(np.float32))
    C = ng.empty((16, 4))
    layer = ng.conv_layer(np.float32, 2, 3, 4, H=6, W=5, R=3, S=3, pad_h=1, pad_w=1)
    I = ng.array(rng.standard_normal((2, 6, 5, 3)).astype(np.float32))
    F = ng.array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    O = ng.empty(layer.dimO)
    pool = ng.pool_layer(np.float32, "max", 2, 3, H=6, W=5, R=2, S=2, str_h=2, str_w=2)
    P = ng.empty(pool.dimO)
    capfd.readouterr()
    ng.clear_bench_log()
    ng.compound_dot(A, B, C)
    ng.fprop_conv(layer, I, F, O)
    ng.fprop_pool(pool, I, P)
    err = capfd.readouterr().err
    log = ng.bench_log()
    top = [r for r in log if r["depth"] == 0]
    assert [r["op"] for r in top] == ["compound_dot", "fprop_conv", "fprop_pool"], log
    assert top[0]["flops"] == 2 * 16 * 4 * 8 and top[1]["flops"] == layer.flops and top[2]["bytes"] > 0
    assert all(r["ms"] >= 0 for r in log)
    lines = [ln for ln in err.splitlines() if ln.startswith("kiln bench: ")]
    assert len(lines) == len(log), err
    assert any(ln.startswith("kiln bench: compound_dot float32 (16, 8) x float32 (8, 4)") and "TFLOP/s" in ln for ln in lines)
    assert any(ln.startswith("kiln bench: fprop_conv ") and "TFLOP/s" in ln for ln in lines)
    assert any(ln.startswith("kiln bench: fprop_pool ") and "GB/s" in ln for ln in lines)
    # Calls made inside another timed call are indented under it.
    body = [ln[len("kiln bench: "):] for ln in lines]
    assert all(len(b) - len(b.lstrip(" ")) == 2 * r["depth"] for b, r in zip(body, log))
    assert any(r["depth"] > 0 for r in log)   # the convolution's own GEMM and copies
    np.testing.assert_allclose(C.get(), A.get() @ B.get(), rtol=1e-5, atol=1e-5)


def _ref_hist(x, bins, offset):
    x = np.abs(np.asarray(x, dtype=np.float64)).ravel()
    with np.errstate(divide="ignore", invalid="ignore"):
        b = np.rint(np.log2(x)) - offset
    b = np.where(np.isnan(x) | (x == 0), 0, np.clip(np.nan_to_num(b, posinf=bins - 1, neginf=0), 0, bins - 1))
    return np.bincount(b.astype(np.int64), minlength=bins)


def test_numerics_histograms_count_log2_magnitudes_into_named_slots():
    ng = NervanaGPU(hist_bins=16, hist_offset=-8)
    assert (ng.hist_bins, ng.hist_offset) == (16, -8)
    rng = np.random.default_rng(5)
    # Exponents a quarter away from the rounding points of log2, so that any log2 agrees.
    e = rng.integers(-14, 12, 1000) + rng.choice([-0.25, 0.25], 1000)
    x = (np.exp2(e) * rng.choice([-1, 1], 1000)).astype(np.float32)
    x[:3] = [0.0, np.nan, np.inf]
    for dt in (np.float32, np.float16):
        t = ng.array(x.astype(dt))
        slot = t.hist("act")
        assert slot.shape == (1, 16) and slot.dtype == kiln.int32
        np.testing.assert_array_equal(slot.get()[0], _ref_hist(x.astype(dt), 16, -8))
    ng.hist(ng.array(x[:10]), "grad")
    counts, tags = ng.dump_hist_data()
    assert counts.shape == (3, 16) and counts.dtype == np.int32
    assert tags == {"act": 1, "grad": 2}   # a tag used again: its last row
    assert counts[2].sum() == 10
    counts, tags = ng.dump_hist_data()
    assert counts.shape == (0, 16) and tags == {}
    ng.set_hist_buffers(64, -48)
    assert ng.hist_bins == 64
    with pytest.raises(TypeError, match="hist: x is int32"):
        ng.hist(ng.array(np.arange(3, dtype=np.int32)), "i")
    with pytest.raises(ValueError, match="hist_bins=0; valid: 1 to 4096"):
        ng.set_hist_buffers(0, 0)


def test_named_tensors_are_counted_after_every_write_while_hist_named():
    ng = NervanaGPU()
    y = ng.empty((4, 3), name="y")
    assert y.name == "y" and ng.zeros((2,)).name is None
    y[...] = 2.0
    assert ng.dump_hist_data()[1] == {}          # off by default
    ng.hist_named = True
    y[...] = 2.0
    a, b = ng.array(np.full((4, 5), 0.5, np.float32)), ng.array(np.full((5, 3), 2.0, np.float32))
    ng.compound_dot(a, b, y)                      # counted once, not also for its inner copies
    w = ng.ones((3,))
    w.name = "w"
    w[...] = w * 4
    counts, tags = ng.dump_hist_data()
    assert counts.shape == (3, 64) and list(tags) == ["y", "w"] and tags["y"] == 1
    assert counts[0, 48 + 1] == 12 and counts[1, 48 + 2] == 12 and counts[2, 48 + 2] == 3
    ng.hist_named = False
    y[...] = 1.0
    assert ng.dump_hist_data()[1] == {}


def test_no_bench_output_by_default(capfd):
    ng = NervanaGPU()
    a = ng.ones((2, 2))
    capfd.readouterr()
    a[:] = a + 1
    out = capfd.readouterr()
    assert out.err == "" and out.out == ""


def test_synchronize_and_context_properties(ng):
    a = ng.ones((8, 8))
    a[:] = a * 3
    assert ng.synchronize() is None
    assert np.all(a.get() == 3)
    assert ng.backend in ("cpu", "cuda")
    assert ng.device == "cpu" if ng.backend == "cpu" else ng.device.startswith("cuda:")
    assert isinstance(ng.description, str) and ng.description
    assert ng.default_dtype == np.float32
    assert "kiln.NervanaGPU(device=" in repr(ng) and "kiln.Context(device=" in repr(kiln.Context("cpu"))
    assert ng.stream_handle == 0 or ng.backend == "cuda"


# =============================================================================================
# factories


def test_default_dtype():
    ng = NervanaGPU(default_dtype=np.float16)
    assert ng.default_dtype == np.float16
    assert ng.empty((2, 2)).dtype == np.float16
    assert ng.zeros((2, 2)).dtype == np.float16
    assert ng.ones((2,)).dtype == np.float16
    assert ng.array(np.random.randn(3)).dtype == np.float16   # float data takes the default dtype
    assert ng.array(np.arange(3)).dtype == np.int32           # integer data keeps an integer dtype
    assert ng.array(np.random.randn(3), dtype=np.float32).dtype == np.float32


def test_factories(ng):
    z = ng.zeros((3, 4))
    o = ng.ones((3, 4), dtype=np.int8)
    f = ng.full((2, 2), 2.5)
    assert z.ctx is ng and o.ctx is ng
    np.testing.assert_array_equal(z.get(), np.zeros((3, 4), np.float32))
    np.testing.assert_array_equal(o.get(), np.ones((3, 4), np.int8))
    np.testing.assert_array_equal(f.get(), np.full((2, 2), 2.5, np.float32))
    zl, ol, el = ng.zeros_like(o), ng.ones_like(z), ng.empty_like(o)
    assert zl.dtype == np.int8 and ol.dtype == np.float32 and el.dtype == np.int8 and el.shape == (3, 4)
    np.testing.assert_array_equal(zl.get(), np.zeros((3, 4), np.int8))
    np.testing.assert_array_equal(ol.get(), np.ones((3, 4), np.float32))
    np.testing.assert_array_equal(ng.arange(5).get(), np.arange(5))
    np.testing.assert_allclose(ng.arange(1, 2, 0.25, dtype=np.float16).get(), [1, 1.25, 1.5, 1.75])
    t = ng.array([[1, 2], [3, 4]], dtype=np.float32)
    np.testing.assert_array_equal(t.get(), [[1, 2], [3, 4]])
    assert ng.array(t) is not t and ng.array(t).ctx is ng


def test_tensor_operators_with_the_context_api(ng):
    h = np.random.RandomState(28).randn(4, 6).astype(np.float32)
    a = ng.array(h)
    b = ng.empty((4, 6))
    b[:] = a * a - 2 * a + ng.mean(a, axis=0)
    np.testing.assert_allclose(b.get(), h * h - 2 * h + h.mean(axis=0, keepdims=True), rtol=1e-5, atol=1e-6)
    b[:] = ng.maximum(a, 0) + ng.minimum(a, 0) * 0.01
    np.testing.assert_allclose(b.get(), np.where(h > 0, h, h * 0.01), rtol=1e-6)


def test_scalars_only_use_the_context(ng):
    e = ng.add(1, 2)
    assert isinstance(e, kiln.Expr)
    assert float(e) == 3.0
    out = ng.empty((2, 2))
    ng.add(1.5, 2, out=out)
    np.testing.assert_array_equal(out.get(), np.full((2, 2), 3.5))


def test_explicit_cpu_context():
    c = kiln.Context("cpu")
    assert c.backend == "cpu" and c.device == "cpu"
    t = c.array(np.arange(4, dtype=np.float32))
    assert t.ctx is c and t.device == "cpu"
    np.testing.assert_array_equal((t * 2).get(), [0, 2, 4, 6])
