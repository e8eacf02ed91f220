"""kiln.grad: reverse-mode derivatives of kiln expressions, checked against central differences of
the same expressions evaluated by kiln in float64, and its errors."""
import numpy as np
import pytest

import kiln

# Central differences in float64, on the default context (the GPU under KILN_BACKEND=cuda).
CTX = kiln.default_context()

# (name, function of kiln values, input shapes, the inputs' range)
CASES = [
    ("arithmetic", lambda a, b: a * b + a / b - b, [(3, 4), (3, 4)], (0.5, 2.0)),
    ("broadcast", lambda a, b: a * b - b, [(3, 4), (4,)], (0.5, 2.0)),
    ("broadcast_column", lambda a, b: a / b + a, [(3, 4), (3, 1)], (0.5, 2.0)),
    ("scalar_literal", lambda a: 3.0 * a * a + 0.5 / a, [(5,)], (0.5, 2.0)),
    ("exp_log", lambda a: kiln.exp(a) + kiln.log(a) + kiln.exp2(a) + kiln.log2(a) + kiln.log10(a), [(2, 3)], (0.5, 2.0)),
    ("sqrt_square_recip", lambda a: kiln.sqrt(a) + kiln.square(a) + kiln.reciprocal(a), [(2, 3)], (0.5, 2.0)),
    ("activations", lambda a: kiln.tanh(a) + kiln.sig(a) + kiln.sig2(a) + kiln.tanh2(a), [(2, 3)], (-2.0, 2.0)),
    ("safelog", lambda a: kiln.safelog(a), [(2, 3)], (0.5, 2.0)),
    ("abs_neg", lambda a: kiln.abs(a) - a, [(7,)], (-2.0, 2.0)),
    ("trig", lambda a: kiln.sin(a) + kiln.cos(a) + kiln.tan(a) + kiln.atan(a), [(2, 3)], (-1.0, 1.0)),
    ("inverse_trig", lambda a: kiln.asin(a) + kiln.acos(a) + kiln.atanh(a), [(2, 3)], (-0.8, 0.8)),
    ("hyperbolic", lambda a: kiln.sinh(a) + kiln.cosh(a) + kiln.asinh(a), [(2, 3)], (-1.5, 1.5)),
    ("acosh", lambda a: kiln.acosh(a), [(2, 3)], (1.2, 3.0)),
    ("erf_expm1_log1p", lambda a: kiln.erf(a) + kiln.erfc(a) * 2 + kiln.expm1(a) + kiln.log1p(a), [(2, 3)], (-0.5, 1.5)),
    ("pow", lambda a, b: kiln.pow(a, b), [(2, 3), (2, 3)], (0.5, 2.0)),
    ("pow_literal", lambda a: a ** 3 + a ** 0.5, [(2, 3)], (0.5, 2.0)),
    ("atan2_hypot", lambda a, b: kiln.atan2(a, b) + kiln.hypot(a, b), [(2, 3), (2, 3)], (0.5, 2.0)),
    ("copysign", lambda a, b: kiln.copysign(a, b), [(2, 3), (2, 3)], (-2.0, 2.0)),
    ("remainder_fmod", lambda a, b: a % b + kiln.fmod(a, b), [(2, 3), (2, 3)], (1.1, 3.0)),
    ("maximum_minimum", lambda a, b: kiln.maximum(a, b) * 2 + kiln.minimum(a, b), [(3, 4), (3, 4)], (-1.0, 1.0)),
    ("where", lambda a, b: kiln.where(a > b, a * a, b * 3), [(3, 4), (3, 4)], (-1.0, 1.0)),
    ("sum_mean", lambda a: kiln.sum(a * a, axis=1) + kiln.mean(a, axis=0).sum(), [(3, 4)], (-1.0, 1.0)),
    ("keepdims_softmax", lambda a: kiln.exp(a - kiln.max(a, axis=1, keepdims=True))
        / kiln.sum(kiln.exp(a - kiln.max(a, axis=1, keepdims=True)), axis=1, keepdims=True), [(3, 5)], (-2.0, 2.0)),
    ("var_std", lambda a: kiln.var(a, axis=1, keepdims=True) + kiln.std(a, axis=0, keepdims=True), [(3, 4)], (-1.0, 1.0)),
    ("max_min_all", lambda a: kiln.max(a) + kiln.min(a, axis=0), [(3, 4)], (-1.0, 1.0)),
    ("prod", lambda a: kiln.prod(a, axis=1), [(3, 4)], (0.5, 1.5)),
    ("reshape", lambda a: kiln.reshape(a * 2, (4, 3)) * a.reshape(4, 3) + kiln.sum(a, axis=1), [(3, 4)], (-1.0, 1.0)),
    ("broadcast_view", lambda a: kiln.broadcast_to(a, (2, 3, 4)) * a, [(3, 1)], (-1.0, 1.0)),
    ("layer_norm", lambda a, g: (a - kiln.mean(a, axis=1, keepdims=True))
        / kiln.sqrt(kiln.var(a, axis=1, keepdims=True) + 1e-5) * g, [(4, 6), (6,)], (-1.0, 1.0)),
    ("gelu_tanh", lambda a: 0.5 * a * (1 + kiln.tanh(0.7978845608 * (a + 0.044715 * a ** 3))), [(8,)], (-3.0, 3.0)),
]


def _evaluate(fn, arrays, dy):
    """sum(dy * fn(inputs)) in float64, by kiln."""
    ts = [kiln.asarray(a, dtype="float64", ctx=CTX) for a in arrays]
    y = np.asarray(fn(*ts), dtype=np.float64)
    return float(np.sum(dy * y))


@pytest.mark.parametrize("name,fn,shapes,domain", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_central_differences(name, fn, shapes, domain):
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    arrays = [rng.uniform(*domain, size=s) for s in shapes]
    if name == "maximum_minimum":   # ties split the derivative evenly
        arrays[1][0, :2] = arrays[0][0, :2]
    ts = [kiln.asarray(a, dtype="float64", ctx=CTX) for a in arrays]
    y = fn(*ts)
    dy = rng.standard_normal(y.shape)
    grads = kiln.grad(y, ts, kiln.asarray(dy, dtype="float64", ctx=CTX))
    assert len(grads) == len(ts)
    for k, (a, g) in enumerate(zip(arrays, grads)):
        got = np.asarray(g)
        assert got.shape == a.shape and got.dtype == np.float64
        want = np.zeros_like(a)
        h = 1e-6
        for i in np.ndindex(a.shape):
            if name == "maximum_minimum" and k < 2 and i[0] == 0 and i[1] < 2:
                continue   # not differentiable at a tie; checked below
            up = [x.copy() for x in arrays]
            down = [x.copy() for x in arrays]
            up[k][i] += h
            down[k][i] -= h
            want[i] = (_evaluate(fn, up, dy) - _evaluate(fn, down, dy)) / (2 * h)
        if name == "maximum_minimum":
            # d/da of 2 max(a, b) + min(a, b) at a tie: half of each, as PyTorch
            np.testing.assert_allclose(got[0, :2], 1.5 * dy[0, :2], rtol=1e-12)
            got[0, :2] = want[0, :2]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"{name}: input {k}")


def test_gradient_of_float32_and_float16_keeps_their_dtypes():
    rng = np.random.default_rng(1)
    a = rng.uniform(0.5, 2, (4, 8))
    for dtype, tol in (("float32", 1e-5), ("float16", 2e-2), ("bfloat16", 4e-2)):
        x = kiln.asarray(a, dtype=dtype)
        g = kiln.grad(kiln.sum(kiln.exp(x) * x, axis=1), x)
        assert g.dtype == np.dtype(dtype) if dtype != "bfloat16" else g.dtype == kiln.bfloat16
        xs = np.asarray(x.astype("float32"), dtype=np.float64)
        np.testing.assert_allclose(np.asarray(g.astype("float32")), np.exp(xs) * (xs + 1), rtol=tol)


def test_casts_pass_the_derivative_through_in_each_dtype():
    x = kiln.asarray(np.array([0.5, -1.25, 3.0]), dtype="float64", ctx=CTX)
    dy = kiln.asarray(np.array([1.0, 2.0, -3.0]), dtype="float64", ctx=CTX)
    g = kiln.grad((x.astype("float32") * 2).astype("float64"), x, dy)
    assert g.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(g), [2.0, 4.0, -6.0])


def test_mixed_precision_operands_get_their_own_dtypes():
    a = kiln.asarray(np.full((3,), 2.0), dtype="float16")
    b = kiln.asarray(np.full((3,), 3.0), dtype="float32")
    ga, gb = kiln.grad(a * b, [a, b])
    assert ga.dtype == np.float16 and gb.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(ga), [3, 3, 3])
    np.testing.assert_array_equal(np.asarray(gb), [2, 2, 2])


def test_unused_tensor_and_integer_paths_have_zero_gradient():
    x = kiln.asarray(np.arange(6.0).reshape(2, 3), dtype="float64", ctx=CTX)
    unused = kiln.asarray(np.ones(5), dtype="float64", ctx=CTX)
    y = kiln.floor(x) + (x > 2).astype("float64") + kiln.sign(x) + x.astype("int32").astype("float64")
    gx, gu = kiln.grad(y, [x, unused])
    np.testing.assert_array_equal(np.asarray(gx), np.zeros((2, 3)))
    np.testing.assert_array_equal(np.asarray(gu), np.zeros(5))


def test_default_dy_is_ones_and_a_tensor_alone_gives_one_expression():
    x = kiln.asarray(np.array([1.0, 2.0, 3.0]), dtype="float64", ctx=CTX)
    g = kiln.grad(x * x, x)
    assert isinstance(g, kiln.Expr)
    np.testing.assert_array_equal(np.asarray(g), [2, 4, 6])


def test_gradient_is_an_expression_that_fuses_with_more():
    x = kiln.asarray(np.array([1.0, 2.0]), dtype="float32")
    out = kiln.zeros((2,), dtype="float32")
    out[...] = x - 0.1 * kiln.grad(kiln.sum(x * x), x)   # one SGD step, one kernel
    np.testing.assert_allclose(np.asarray(out), [0.8, 1.6], rtol=1e-6)


def test_prod_with_zeros_follows_the_others_product():
    a = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]])
    x = kiln.asarray(a, dtype="float64", ctx=CTX)
    g = np.asarray(kiln.grad(kiln.prod(x, axis=1), x))
    np.testing.assert_array_equal(g, [[0, 6, 0], [0, 0, 0], [8, 4, 2]])


def test_errors_name_the_problem():
    x = kiln.asarray(np.arange(6.0), dtype="float32")
    with pytest.raises(ValueError, match="take .* no derivative"):
        kiln.grad(kiln.take(x, kiln.asarray(np.array([0, 2]), dtype="int32")), x)
    with pytest.raises(TypeError, match="grad: wrt must hold kiln tensors"):
        kiln.grad(x * 2, [x * 2])
    with pytest.raises(TypeError, match="grad: wrt must be a kiln tensor or a sequence"):
        kiln.grad(x * 2, 3)
    with pytest.raises(TypeError, match="grad: dy must be a float expression"):
        kiln.grad(x * 2, x, kiln.asarray(np.ones(6), dtype="int32"))
    with pytest.raises(ValueError, match=r"grad: dy \(4,\) does not broadcast to y's shape \(6,\)"):
        kiln.grad(x * 2, x, kiln.asarray(np.ones(4), dtype="float32"))
    m = kiln.asarray(np.ones((3, 3)), dtype="float32")
    with pytest.raises(ValueError, match="also through another view"):
        kiln.grad(m * m.T, m)


def test_random_draws_in_a_derivative_are_refused():
    x = kiln.asarray(np.ones(8), dtype="float32")
    with pytest.raises(ValueError, match=r"grad: the derivative depends on random draws \(rand\)"):
        kiln.grad(x * kiln._kiln._rand((8,), None), x)
    g = kiln.grad(x * 2 + kiln._kiln._rand((8,), None), x)   # a draw beside the input, not in its derivative
    np.testing.assert_array_equal(np.asarray(g), np.full(8, 2.0))


def test_integer_leaves_get_zeros_of_their_dtype():
    x = kiln.asarray(np.ones(3), dtype="float32")
    i = kiln.asarray(np.arange(3), dtype="int32")
    gx, gi = kiln.grad(x * i, [x, i])
    assert gi.dtype == np.int32 and gi.shape == (3,)
    np.testing.assert_array_equal(np.asarray(gi), [0, 0, 0])
    np.testing.assert_array_equal(np.asarray(gx), [0, 1, 2])


def test_max_shares_among_many_ties_in_float16():
    x = kiln.asarray(np.zeros(5000), dtype="float16")   # more ties than float16 counts exactly
    g = np.asarray(kiln.grad(kiln.max(kiln.maximum(x, 0)), x, kiln.asarray(np.array(5000.0), dtype="float32")))
    assert g.dtype == np.float16
    np.testing.assert_allclose(g.astype(np.float32), np.full(5000, 0.5), rtol=1e-3)   # half to the ties of maximum
