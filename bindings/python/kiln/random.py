"""Random numbers from the context's counter-based (Philox) stream: reproducible for a seed, the
same on the CPU and the GPU.

normal() uses the Box-Muller transform on two uniform draws with 24-bit resolution, so its
samples lie within about 5.8 standard deviations of the mean."""
import math

from . import _context, _creation, _kiln

__all__ = ["seed", "uniform", "normal", "rand", "randn"]


def _ctx(ctx, op="random"):
    return _creation._ctx(ctx, op=op)


def _size(size):
    return () if size is None else _creation._shape(size, "random: size")


def seed(seed, ctx=None):
    """Restarts the random stream of ctx (the default context) from seed."""
    _ctx(ctx, "random.seed").seed(_context._seed_value(seed, "seed"))


def uniform(low=0.0, high=1.0, size=None, dtype=None, ctx=None):
    """Samples from the uniform distribution on [low, high)."""
    c = _ctx(ctx, "random.uniform")
    shape = _size(size)
    out = _creation.empty(shape, dtype, ctx=c)
    out[...] = low + (high - low) * _kiln._rand(shape, c)
    return out


# cos(2 pi v) for v in [-1/2, 1/2] as its Taylor series in x = 2 pi v up to x^20 (truncation
# error below 1e-10 on [-pi, pi]), built from multiplies and adds so it fuses into the kernel.
_COS_TERMS = [(-1) ** k / math.factorial(2 * k) for k in range(11)]


def _cos_2pi(v):
    x2 = (2 * math.pi) ** 2 * (v * v)
    p = _COS_TERMS[-1]
    for c in reversed(_COS_TERMS[:-1]):
        p = p * x2 + c
    return p


def _normal_expr(shape, loc, scale, ctx):
    u1 = 1.0 - _kiln._rand(shape, ctx)  # (0, 1]: log is finite
    u2 = _kiln._rand(shape, ctx)
    r = _kiln.sqrt(-2.0 * _kiln.log(u1))
    z = -r * _cos_2pi(u2 - 0.5)  # cos(2 pi u2) = -cos(2 pi (u2 - 1/2))
    return loc + scale * z


def normal(loc=0.0, scale=1.0, size=None, dtype=None, ctx=None):
    """Samples from the normal distribution N(loc, scale^2)."""
    c = _ctx(ctx, "random.normal")
    shape = _size(size)
    out = _creation.empty(shape, dtype, ctx=c)
    out[...] = _normal_expr(shape, loc, scale, c)
    return out


def rand(*shape, ctx=None):
    """Uniform [0, 1) samples of the given shape (NumPy's random.rand)."""
    return uniform(size=shape, ctx=ctx)


def randn(*shape, ctx=None):
    """Standard normal samples of the given shape (NumPy's random.randn)."""
    return normal(size=shape, ctx=ctx)
