"""kiln: a runtime JIT compiler for tensor expressions.

Operators on kiln tensors build lazy expressions; assigning one (``t[:] = expr``) compiles it
into fused kernels (CUDA through NVRTC on a GPU, LLVM on the CPU), cached in memory and on disk.

    import numpy as np, kiln
    A = kiln.asarray(np.random.rand(128, 32).astype(np.float32))
    C = kiln.empty((128, 1))
    C[:] = kiln.mean(kiln.square(A - kiln.mean(A, axis=1, keepdims=True)), axis=1, keepdims=True)
    np.asarray(C)

Two APIs share the tensors: the module functions follow NumPy (reductions drop the reduced
axes unless keepdims=True), and kiln.NervanaGPU / kiln.Context methods follow the seeds' neon
backend (reductions keep them). KILN_BACKEND=cpu|cuda picks the device of the default context.
"""
from . import _kiln
# Every public name of the extension: the tensor and expression types, the errors, the
# reductions and products, and every elementwise function (kiln/elementwise.def and
# kiln/math_functions.def in the C++ library, with NumPy's other names for some).
from ._kiln import *  # noqa: F401,F403 - re-exported
from ._kiln import __version__  # noqa: F401
from ._dtypes import (bfloat16, bool_, dtype, float16, float32, float64, int8, int16, int32, int64,  # noqa: F401
                      uint8, uint16, uint32, uint64)
from ._context import Context, default_context  # noqa: F401
from ._neon import NervanaGPU  # noqa: F401
from ._conv import conv  # noqa: F401
from ._predicates import (  # noqa: F401,A004 - NumPy's names
    all, any, finfo, iinfo, isinf, isnan, logical_and, logical_not, logical_or, logical_xor, signbit,
)
from ._creation import (  # noqa: F401
    arange, array, asarray, asnumpy, astype, concat, empty, empty_like, expand_dims, from_dlpack, full, full_like,
    ones, ones_like, reshape, result_type, squeeze, stack, transpose, zeros, zeros_like,
)
from ._standard import (  # noqa: F401,A004 - the Array API's names
    broadcast_arrays, broadcast_shapes, broadcast_to, can_cast, clip, conj, count_nonzero, diff, e, eye, flip, imag,
    inf, isdtype, linspace, logaddexp, matmul, matrix_transpose, meshgrid, moveaxis, nan, newaxis, permute_dims, pi,
    positive, pow, real, repeat, roll, round, take_along_axis, tensordot, tile, tril, triu, unstack, vecdot,
)
from ._host_functions import (  # noqa: F401 - the Array API's data-dependent and sorting functions
    argsort, cumulative_prod, cumulative_sum, isin, nonzero, searchsorted, sort, unique_all, unique_counts,
    unique_inverse, unique_values,
)
from . import _host  # noqa: F401,E402 - adds get/__array__/repr to Tensor and Expr
from ._namespace import array_namespace as _array_namespace, array_namespace_info as __array_namespace_info__  # noqa: E402
from . import layers  # noqa: F401,E402
from . import linalg  # noqa: F401,E402
from . import nn  # noqa: F401,E402
from . import random  # noqa: F401,E402

ndarray = Tensor
concatenate = concat  # NumPy's name
bool = bool_  # noqa: A001 - NumPy 2 spells it np.bool too
Tensor.__array_namespace__ = _array_namespace
Expr.__array_namespace__ = _array_namespace
# The revision of the Array API standard kiln follows (tests/array_api measures how closely).
__array_api_version__ = "2025.12"


def _matmul_method(self, other, /):
    return matmul(self, other)


def _rmatmul_method(self, other, /):
    return matmul(other, self)


def _to_device(self, device, /, *, stream=None):
    """This array on `device` (one of __array_namespace_info__().devices()): itself when it is
    there already, else a copy in that device's context."""
    if stream is not None:
        raise ValueError("to_device: stream= is not supported; kiln orders work on each context's own stream")
    return asarray(self, device=device)


for _cls in (Tensor, Expr):
    _cls.__matmul__ = _matmul_method
    _cls.__rmatmul__ = _rmatmul_method
    _cls.to_device = _to_device
    _cls.mT = property(lambda self: matrix_transpose(self), doc="The transpose of the last two axes (matrix_transpose).")
del _cls
