"""kiln.linalg: the Array API's linalg extension as far as it maps onto kiln's GEMM and fused
reductions, against NumPy; the decompositions and solvers raise NotImplementedError by name."""
import math

import numpy as np
import pytest

import kiln


def _a(h, dtype=None):
    return kiln.asarray(h, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_norms_trace_diagonal_outer_cross(dtype):
    rng = np.random.default_rng(3)
    h = rng.standard_normal((2, 4, 5)).astype(dtype)
    x = _a(h, dtype)
    rtol = 1e-5 if dtype == "float32" else 1e-13
    for ord_ in (2, 1, math.inf, -math.inf, 0, 3):
        got = np.asarray(kiln.linalg.vector_norm(x, axis=-1, ord=ord_))
        np.testing.assert_allclose(got, np.linalg.norm(h, ord=ord_, axis=-1), rtol=rtol)
    np.testing.assert_allclose(np.asarray(kiln.linalg.vector_norm(x)), np.linalg.norm(h.ravel()), rtol=rtol)
    for ord_ in ("fro", 1, -1, math.inf, -math.inf):
        got = np.asarray(kiln.linalg.matrix_norm(x, ord=ord_))
        np.testing.assert_allclose(got, np.linalg.norm(h, ord=ord_, axis=(-2, -1)), rtol=rtol)
    assert kiln.linalg.matrix_norm(x, keepdims=True).shape == (2, 1, 1)
    for k in (0, 1, -2, 7):
        np.testing.assert_allclose(np.asarray(kiln.linalg.trace(x, offset=k)), np.trace(h, offset=k, axis1=-2, axis2=-1),
                                   rtol=rtol)
        np.testing.assert_array_equal(np.asarray(kiln.linalg.diagonal(x, offset=k)),
                                      np.diagonal(h, offset=k, axis1=-2, axis2=-1))
    u, v = h[0, 0], h[1, 1, :3]
    np.testing.assert_allclose(np.asarray(kiln.linalg.outer(_a(u, dtype), _a(v, dtype))), np.outer(u, v), rtol=rtol)
    a3, b3 = h[:, :, :3], h[:, ::-1, 2:]
    np.testing.assert_allclose(np.asarray(kiln.linalg.cross(_a(a3.copy(), dtype), _a(b3.copy(), dtype))), np.cross(a3, b3),
                               rtol=rtol, atol=1e-6 if dtype == "float32" else 1e-14)


def test_matrix_power_and_the_products():
    h = np.array([[1.0, 2.0], [0.5, -1.0]])
    x = _a(h, "float64")
    for n in (0, 1, 2, 5):
        np.testing.assert_allclose(np.asarray(kiln.linalg.matrix_power(x, n)), np.linalg.matrix_power(h, n), rtol=1e-14)
    assert kiln.linalg.matmul is kiln.matmul and kiln.linalg.vecdot is kiln.vecdot
    i = np.arange(24, dtype=np.int64).reshape(2, 3, 4) - 5
    j = np.arange(12, dtype=np.int64).reshape(4, 3)
    got = kiln.tensordot(_a(i, "int64"), _a(j, "int64"), axes=1)   # integers: a sum of products, not the GEMM
    assert got.dtype == np.int64
    np.testing.assert_array_equal(np.asarray(got), np.tensordot(i, j, axes=1))


def test_what_kiln_does_not_compute_says_so():
    x = _a(np.eye(3), "float64")
    for name in ("cholesky", "det", "eig", "eigh", "eigvals", "eigvalsh", "inv", "matrix_rank", "pinv", "qr", "slogdet",
                 "svd", "svdvals"):
        with pytest.raises(NotImplementedError, match=f"linalg.{name}: not implemented by kiln"):
            getattr(kiln.linalg, name)(x)
    with pytest.raises(NotImplementedError, match="linalg.solve: not implemented by kiln"):
        kiln.linalg.solve(x, x)
    with pytest.raises(NotImplementedError, match=r"linalg.matrix_norm: ord='nuc' needs singular values"):
        kiln.linalg.matrix_norm(x, ord="nuc")
    with pytest.raises(NotImplementedError, match="linalg.matrix_power: a negative power needs an inverse"):
        kiln.linalg.matrix_power(x, -1)
    with pytest.raises(kiln.InvalidArgument, match=r"linalg.trace: x has shape \(3,\); it needs 2 or more dimensions"):
        kiln.linalg.trace(_a(np.ones(3)))
    with pytest.raises(kiln.InvalidArgument, match="linalg.cross: shapes"):
        kiln.linalg.cross(_a(np.ones(4)), _a(np.ones(4)))
    with pytest.raises(kiln.DTypeError, match="linalg.vector_norm: x is int32; it takes float dtypes"):
        kiln.linalg.vector_norm(_a(np.arange(3, dtype=np.int32)))
