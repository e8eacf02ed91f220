"""kiln.Context: the factory of tensors and the place expressions run (kiln.NervanaGPU, in
_neon.py, is the same with neon's constructor and method signatures).

    ng = kiln.Context(stochastic_round=False, default_dtype=np.float32, device_id=0, bench=False)
    A = ng.array(np.random.randn(128, 32), dtype=np.float16)
    C = ng.empty((128, 1))
    C[:] = ng.mean(ng.square(A - ng.mean(A, axis=1)), axis=1)   # one fused kernel

Its operation methods follow neon's backend (reductions keep dimensions; each returns a lazy
expression unless out= is given); the module functions (kiln.mean, ...) follow NumPy.
"""
import operator
import os

import numpy as np

from . import _creation, _dtypes, _kiln


def _seed_value(seed, op):
    """A random stream's seed: None (0) or an integer in [0, 2**64), as NumPy's generators take."""
    if seed is None:
        return 0
    try:
        s = operator.index(seed)
    except TypeError:
        raise _kiln.DTypeError(f"{op}: a seed is an int, got {type(seed).__name__}") from None
    if not 0 <= s < 2**64:
        raise _kiln.InvalidArgument(f"{op}: seed {s} is out of range; valid: 0 to 2**64 - 1")
    return s


def _named(t, name):
    """t with its memory tagged `name` for the numerics histograms (None: untouched)."""
    if name is not None:
        _kiln.set_hist_tag(t, str(name))
    return t


class Context(_kiln._Context):
    """A device (CUDA GPU or CPU), its memory, kernel caches and random stream.

    device: None (KILN_BACKEND=cpu|cuda, else the GPU when one is usable, else the CPU), 'cpu',
        'cuda' or 'cuda:N'. device_id: the GPU to use when the context runs on CUDA.
    default_dtype: the dtype of new tensors when none is given (np.float32).
    stochastic_round: mantissa bits kept by stochastic rounding of float16/bfloat16 stores
        (True: 10; False/0: round to nearest).
    rng_seed / seed: the random stream's seed (0 when None).
    bench: the seeds' bench mode: every call that runs kernels (assignments, GEMMs, convolutions,
        layers) is timed on the device (CUDA events), waited for and printed as one line on stderr
        with its GB/s or TFLOP/s; bench_log() returns them.
    deterministic: accepted for neon compatibility; kiln's reductions are always deterministic.
    allow_tf32: float32 GEMMs may use tf32 tensor cores (several times faster, 10-bit mantissa
        products); off by default.
    kernel_cache_capacity: the most compiled kernels kept in memory (least recently used
        evicted); None: KILN_KERNEL_CACHE, else 1024.
    num_devices: neon's multi-GPU keyword: this context and num_devices - 1 more on the GPUs
        that follow it, in `devices`; communicators() joins them for collectives
        (kiln.distributed).
    """

    def __init__(self, device=None, *, default_dtype=np.float32, stochastic_round=False, rng_seed=None, seed=None,
                 device_id=None, bench=False, deterministic=None, allow_tf32=False, kernel_cache_capacity=None,
                 num_devices=None):
        if device is None and device_id:
            if os.environ.get("KILN_BACKEND", "") != "cpu":
                device = f"cuda:{int(device_id)}"
        if isinstance(stochastic_round, bool):
            bits = 10 if stochastic_round else 0
        else:
            bits = int(stochastic_round)
        s = _seed_value(rng_seed if rng_seed is not None else seed, "Context")
        if not -2**31 <= bits < 2**31:  # within int's range the context itself says what is valid
            raise _kiln.InvalidArgument(f"Context: stochastic_round = {bits} is out of range; valid: 1 to 10 "
                                        "mantissa bits (True = 10), or 0 / False for round to nearest")
        capacity = 0 if kernel_cache_capacity is None else operator.index(kernel_cache_capacity)
        if capacity < 0 or (kernel_cache_capacity is not None and capacity == 0):
            raise _kiln.InvalidArgument(f"Context: kernel_cache_capacity must be a positive number of kernels, got {capacity}")
        super().__init__(device or "", s, _dtypes.dtype(default_dtype), bits, bool(bench), capacity)
        self.allow_tf32 = bool(allow_tf32)
        self.devices = [self]
        self._communicators = None
        if num_devices is not None:
            if isinstance(num_devices, bool) or not hasattr(num_devices, "__index__") or num_devices.__index__() < 1:
                raise _kiln.InvalidArgument(f"Context: num_devices = {num_devices!r}; valid: a number of GPUs, at least 1")
            n = num_devices.__index__()
            if n > 1 and self.backend != "cuda":
                raise _kiln.InvalidArgument(f"Context: num_devices = {n} needs CUDA devices; this context runs on "
                                            f"{self.device}")
            first = int(self.device.split(":")[1]) if n > 1 else 0
            for i in range(1, n):
                self.devices.append(Context(f"cuda:{first + i}", default_dtype=default_dtype, stochastic_round=bits,
                                            seed=s, bench=bench, allow_tf32=allow_tf32,
                                            kernel_cache_capacity=kernel_cache_capacity))

    @property
    def num_devices(self):
        return len(self.devices)

    def communicators(self, timeout=None):
        """One kiln.distributed.Communicator per context of `devices` (made on first call):
        collectives between them go inside `with kiln.distributed.group():`."""
        if self._communicators is None:
            from . import distributed

            self._communicators = distributed.init_all(self.devices, timeout=timeout)
        return self._communicators

    def __repr__(self):
        return f"kiln.Context(device='{self.device}', default_dtype={self.default_dtype})"

    # ---- the random stream's state (neon's rng_get_state / rng_set_state / rng_reset / gen_rng)
    def dump_hist_data(self):
        """neon's dump_hist_data: the histogram slots taken by kiln.hist since the last dump (or
        set_hist_buffers), which it discards. Returns (counts, tags): counts a NumPy int32 array of
        one row of hist_bins counts per hist call, in call order; tags maps each tag to its row (a
        tag used again: its last row)."""
        counts, tags = self._dump_hist_data()
        return counts.get(), {t: i for i, t in enumerate(tags)}

    def rng_get_state(self):
        """The random stream's state, (seed, draws so far): rng_set_state returns to it, and the
        draws from it are the same on every backend."""
        return self._rng_state()

    def rng_set_state(self, state):
        """Returns the random stream to a state rng_get_state gave."""
        ok = isinstance(state, tuple) and len(state) == 2 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v < 2**32 for v in state)
        if not ok:
            raise _kiln.InvalidArgument(f"rng_set_state: state {state!r}; it is a (seed, counter) tuple of two ints in "
                                        "[0, 2**32) as rng_get_state returns")
        self._set_rng_state(int(state[0]), int(state[1]))

    def rng_reset(self):
        """Back to the state right after the last seeding (the constructor's seed, or seed())."""
        self._rng_reset()

    def seed(self, seed):
        """Restarts the random stream from seed (None: 0; an int in [0, 2**64))."""
        super().seed(_seed_value(seed, "Context.seed"))

    def gen_rng(self, seed=None):
        """Seeds the random stream (None: 0) and returns its state, as neon's gen_rng."""
        self.seed(_seed_value(seed, "gen_rng"))
        return self.rng_get_state()

    # ---- tensors (the seeds' factories; dtype None means the context's default dtype)
    def array(self, ary, dtype=None, name=None):
        """A tensor with a copy of host data (or of any array-like), converted to dtype
        (default: the context's default dtype for float data). name: its histogram tag (neon's
        tensor name; kiln.set_hist_tag)."""
        if dtype is None and isinstance(ary, (_kiln.Tensor, _kiln.Expr)):
            return _named(_creation.array(ary, ctx=self), name)
        return _named(_creation.upload(ary, dtype=dtype, ctx=self, default_float=self._default_dtype), name)

    def asarray(self, obj, dtype=None):
        return _creation.asarray(obj, dtype=dtype, ctx=self)

    def from_dlpack(self, x, *, copy=None):
        return _creation.from_dlpack(x, copy=copy, ctx=self)

    def empty(self, shape, dtype=None, name=None):
        return _named(_creation.empty(shape, dtype, ctx=self), name)

    def zeros(self, shape, dtype=None, name=None):
        return _named(_creation.zeros(shape, dtype, ctx=self), name)

    def ones(self, shape, dtype=None, name=None):
        return _named(_creation.ones(shape, dtype, ctx=self), name)

    def full(self, shape, fill_value, dtype=None, *, name=None):
        return _named(_creation.full(shape, fill_value, dtype, ctx=self), name)

    def empty_like(self, other_ary, dtype=None, *, name=None):
        return _named(_creation.empty(other_ary.shape, other_ary.dtype if dtype is None else dtype, ctx=self), name)

    def zeros_like(self, other_ary, dtype=None, *, name=None):
        return _named(_creation.zeros(other_ary.shape, other_ary.dtype if dtype is None else dtype, ctx=self), name)

    def ones_like(self, other_ary, dtype=None, *, name=None):
        return _named(_creation.ones(other_ary.shape, other_ary.dtype if dtype is None else dtype, ctx=self), name)

    def arange(self, start, stop=None, step=1, dtype=None):
        return _creation.arange(start, stop, step, dtype, ctx=self)

    def fill_normal(self, ary, mean=0.0, stdv=1.0):
        """Fills ary with normally distributed numbers (neon's fill_normal)."""
        from . import random

        ary[...] = random._normal_expr(ary.shape, mean, stdv, self)
        return ary


_default = None
_cpu = None


def default_context():
    """The context the module functions use when none is given (created on first use)."""
    global _default
    if _default is None:
        _default = Context()
    return _default


def device_context(device, op, ctx=None):
    """The context that makes `op`'s arrays on `device` (the Array API's device=, a device as
    x.device names it, or a context): None is ctx, else the default context; a context is itself;
    the default context's device is that context; 'cpu' is a process-wide CPU context beside a
    GPU default. Given ctx too, the device must be ctx's."""
    global _cpu
    if device is None:
        return ctx if ctx is not None else default_context()
    if isinstance(device, _kiln._Context):
        if ctx is not None and device is not ctx:
            raise _kiln.InvalidArgument(f"{op}: device= is a context on {device.device} and ctx= another, on "
                                        f"{ctx.device}; give one")
        return device
    if not isinstance(device, str):
        raise _kiln.DTypeError(f"{op}: device= takes a device name such as x.device gives ('cpu', 'cuda:0'), "
                               f"got {type(device).__name__}")
    if ctx is not None:
        if device != ctx.device:
            raise _kiln.InvalidArgument(f"{op}: device={device!r}, but ctx= runs on {ctx.device}")
        return ctx
    here = default_context()
    if device == here.device:
        return here
    if device == "cpu":
        if _cpu is None:
            _cpu = Context("cpu", default_dtype=here.default_dtype)
        return _cpu
    devices = ["cpu"] if here.device == "cpu" else ["cpu", here.device]
    raise _kiln.InvalidArgument(f"{op}: device={device!r}; this process's devices are {devices}")
