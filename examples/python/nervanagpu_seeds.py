"""The seeds' NervanaGPU README examples, verbatim but for the imports, checked against NumPy.

    python examples/python/nervanagpu_seeds.py            # the default device (GPU when present)
    KILN_BACKEND=cpu python examples/python/nervanagpu_seeds.py
"""
import numpy as np

import kiln
from kiln import NervanaGPU

# initialize factory class
ng = NervanaGPU(stochastic_round=False)
print(f"kiln {kiln.__version__} on {ng.description}")

m, n, k = 10, 20, 10
for dtype in (np.float32, np.float16):
    # create matrices on host
    cpuA = np.random.randn(k, m)

    # transfer to device
    devA = ng.array(cpuA, dtype=dtype)
    devC = ng.empty((m, 1), dtype=dtype)

    # variance along an axis: one kernel
    devC[:] = ng.mean(ng.square(devA - ng.mean(devA, axis=1)), axis=1)

    a = devA.get().astype(np.float64)
    want = a.var(axis=1, keepdims=True)
    err = np.abs(devC.get() - want).max() / np.abs(want).max()
    tol = 1e-5 if dtype == np.float32 else 2e-3
    print(f"variance   {np.dtype(dtype).name:8s} max rel err {err:.2e}  {'ok' if err < tol else 'FAIL'}")
    assert err < tol

    # batch normalisation
    eps = .001
    A = ng.empty((128, 32), dtype=dtype)
    A[:] = ng.rand()  # generate uniform random on device between 0 and 1
    x = A.get().astype(np.float64)

    # Normalize batch data by batch mean and variance,
    A[:] = ng.reciprocal(ng.sqrt(ng.var(A, axis=1) + eps)) * (A - ng.mean(A, axis=1))

    want = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + eps)
    err = np.abs(A.get() - want).max() / np.abs(want).max()
    tol = 1e-5 if dtype == np.float32 else 2e-3
    print(f"batch norm {np.dtype(dtype).name:8s} max rel err {err:.2e}  {'ok' if err < tol else 'FAIL'}")
    assert err < tol

c = ng.counters()
print(f"{c['compiles']} kernels compiled, {c['memory_hits'] + c['disk_hits']} kernel cache hits, "
      f"{c['assignments']} assignments")
