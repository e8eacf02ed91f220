"""Collectives between GPUs through NCCL: all-reduce, all-gather, reduce-scatter, broadcast.

One process per GPU, started as torchrun starts them (or by this module's launcher):

    python -m kiln.distributed --nproc 2 train.py        # sets RANK, WORLD_SIZE, LOCAL_RANK, ...

    comm = kiln.distributed.Communicator.from_env()     # a context on cuda:LOCAL_RANK
    ctx = comm.context
    g = ctx.array(...)
    comm.all_reduce(g, "avg")                           # on ctx's stream
    g[:] = g * 0.5                                      # ordered after it, no host wait

One process driving several GPUs: ``comms = init_all([Context("cuda:0"), Context("cuda:1")])``
and every collective over them inside ``with group():``.

NCCL is loaded at run time: KILN_NCCL_LIBRARY (a path), else libnccl.so.2 from the loader's
path, else the one of an installed nvidia-nccl wheel (PyTorch's). A collective that does not
finish within the timeout (a rank that exited or never called it) aborts the communicator and
raises kiln.RuntimeError instead of hanging; so does any error NCCL reports.
"""
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from . import _kiln

OPS = ("sum", "prod", "max", "min", "avg")


def _find_library():
    """Points KILN_NCCL_LIBRARY at an installed nvidia-nccl wheel's library when neither the
    variable nor the loader's path gives one."""
    if os.environ.get("KILN_NCCL_LIBRARY") or _kiln._nccl_info()["available"]:
        return
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations if spec and spec.submodule_search_locations else []):
        path = os.path.join(root, "lib", "libnccl.so.2")
        if os.path.exists(path):
            os.environ["KILN_NCCL_LIBRARY"] = path
            return


def nccl_info():
    """The NCCL this process would use: {'available', 'version' (e.g. 22809), 'library', 'why_not'}."""
    _find_library()
    return _kiln._nccl_info()


def is_available():
    return nccl_info()["available"]


def new_id():
    """A new NCCL id (hex). The calling process hosts the rendezvous: it must live until every
    rank has joined."""
    _find_library()
    return _kiln._nccl_new_id()


def _timeout(timeout):
    if timeout is None:
        return 0.0
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise _kiln.DTypeError(f"Communicator: timeout must be a number of seconds, got {type(timeout).__name__}")
    return float(timeout)


def _op(op):
    if not isinstance(op, str):
        raise _kiln.DTypeError(f"collective: op must be one of {', '.join(map(repr, OPS))}, got {type(op).__name__}")
    return op


class Pending:
    """An all_reduce_async in flight: wait() orders the context's later work after it."""

    def __init__(self, p):
        self._p = p

    def wait(self):
        self._p.wait()

    @property
    def done(self):
        return self._p.done


class Communicator:
    """One rank of a clique of GPUs. Every rank calls the same collectives in the same order;
    each runs on the context's stream and returns at once.

    Communicator(ctx, world_size, rank, id, timeout=None): join with an id from new_id()
    (hex), given to every rank. from_env() and through_file() share the id for you.
    timeout: seconds (None: KILN_NCCL_TIMEOUT, else 600).
    """

    def __init__(self, ctx, world_size, rank, id, *, timeout=None, _impl=None):
        if _impl is None:
            _find_library()
            if isinstance(id, (bytes, bytearray)):
                id = bytes(id).hex()
            if not isinstance(id, str):
                raise _kiln.DTypeError(f"Communicator: id must be the hex string new_id() gives, got {type(id).__name__}")
            _impl = _kiln._Communicator.join(ctx, _int(world_size, "world_size"), _int(rank, "rank"), id,
                                             _timeout(timeout))
        self._c = _impl

    @classmethod
    def from_env(cls, ctx=None, *, timeout=None):
        """A process per GPU: RANK and WORLD_SIZE from the launcher (torchrun, python -m
        kiln.distributed), the id from KILN_NCCL_ID or through the file KILN_NCCL_ID_FILE; the
        context, when none is given, on cuda:LOCAL_RANK."""
        _find_library()
        if ctx is None:
            from ._context import Context
            local = os.environ.get("LOCAL_RANK", "0")
            if not local.isdigit():
                raise _kiln.InvalidArgument(f"Communicator.from_env: LOCAL_RANK is '{local}'; a GPU index (0, 1, ...)")
            ctx = Context(f"cuda:{int(local)}")
        return cls(None, 0, 0, None, _impl=_kiln._Communicator.from_env(ctx, _timeout(timeout)))

    @classmethod
    def through_file(cls, ctx, world_size, rank, path, *, timeout=None):
        """The id shared through the file `path` (fresh for each job): rank 0 writes it."""
        _find_library()
        return cls(None, 0, 0, None, _impl=_kiln._Communicator.through_file(
            ctx, _int(world_size, "world_size"), _int(rank, "rank"), os.fspath(path), _timeout(timeout)))

    rank = property(lambda self: self._c.rank)
    size = property(lambda self: self._c.size)
    context = property(lambda self: self._c.context)
    timeout = property(lambda self: self._c.timeout)
    error = property(lambda self: self._c.error, doc="Why the communicator failed; '' while it works.")

    def __repr__(self):
        return f"kiln.distributed.Communicator(rank={self.rank}, size={self.size}, device='{self.context.device}')"

    def all_reduce(self, tensor, op="sum", *, out=None):
        """The reduction over the ranks of tensor (in place, or into out). A list or tuple of
        tensors is reduced in place as one group (one launch)."""
        if isinstance(tensor, (list, tuple)):
            if out is not None:
                raise _kiln.InvalidArgument("all_reduce: a list of tensors is reduced in place; out= is for one tensor")
            self._c.all_reduce_many(tensor, _op(op))
            return tensor
        dst = tensor if out is None else out
        self._c.all_reduce(tensor, dst, _op(op))
        return dst

    def all_reduce_async(self, tensors, op="sum"):
        """The tensors reduced in place on the communicator's own stream while the context goes
        on; Pending.wait() orders the context's later work after it."""
        return Pending(self._c.all_reduce_async(tensors, _op(op)))

    def all_gather(self, tensor, *, out=None):
        """Every rank's tensor, stacked: out has shape (size,) + tensor.shape (or any shape with
        size * tensor.size elements)."""
        if out is None:
            out = self.context.empty((self.size,) + tuple(tensor.shape), tensor.dtype)
        self._c.all_gather(tensor, out)
        return out

    def reduce_scatter(self, tensor, op="sum", *, out=None):
        """Rank r gets the reduction of block r of tensor (its first axis split in size blocks)."""
        if out is None:
            shape = tuple(tensor.shape)
            if not shape or shape[0] % self.size:
                raise _kiln.InvalidArgument(f"reduce_scatter: the first axis of {shape} does not split into {self.size} "
                                            "blocks; give out= (size * out.size == tensor.size)")
            out = self.context.empty((shape[0] // self.size,) + shape[1:], tensor.dtype)
        self._c.reduce_scatter(tensor, out, _op(op))
        return out

    def broadcast(self, tensor, root=0, *, out=None):
        """Root's tensor on every rank (in place, or into out)."""
        dst = tensor if out is None else out
        self._c.broadcast(tensor, dst, _int(root, "root"))
        return dst

    def synchronize(self):
        """Waits for every collective given so far; raises when one failed or timed out."""
        self._c.synchronize()

    def abort(self):
        self._c.abort()

    def close(self):
        """Finishes the collectives in flight and frees the communicator."""
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _int(v, what):
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise _kiln.DTypeError(f"Communicator: {what} must be an int, got {type(v).__name__}")
    return v.__index__()


def init_all(contexts, *, timeout=None):
    """One process driving several GPUs: a communicator per context (rank i on contexts[i]).
    Give the collectives over them inside `with group():`."""
    _find_library()
    return [Communicator(None, 0, 0, None, _impl=c) for c in _kiln._Communicator.for_contexts(list(contexts),
                                                                                            _timeout(timeout))]


@contextlib.contextmanager
def group():
    """Collectives given inside launch together when it closes (NCCL's group calls)."""
    _find_library()
    g = _kiln._CollectiveGroup()
    try:
        yield
    finally:
        g.end()


# ---- the launcher: python -m kiln.distributed --nproc N script.py [args]

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv=None):
    """Starts N copies of a Python script, one per GPU, with torchrun's variables (RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and KILN_NCCL_ID_FILE, a
    fresh path; returns the first non-zero exit status (the others are stopped then), else 0."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kiln.distributed",
                                 description="Runs a script once per GPU, as torchrun does, for kiln.distributed.")
    ap.add_argument("--nproc", "--nproc-per-node", type=int, required=True, help="processes (one per GPU)")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if a.nproc < 1:
        ap.error(f"--nproc {a.nproc}: at least 1")
    tmp = tempfile.mkdtemp(prefix="kiln-dist-")
    port = _free_port()
    procs = []
    try:
        for r in range(a.nproc):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.nproc), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(a.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       KILN_NCCL_ID_FILE=os.path.join(tmp, "nccl-id"))
            procs.append(subprocess.Popen([sys.executable, a.script] + a.args, env=env))
        status = 0
        while procs and status == 0:
            for p in list(procs):
                rc = p.poll()
                if rc is None:
                    continue
                procs.remove(p)
                if rc != 0:
                    status = rc if rc > 0 else 128 - rc
                    print(f"kiln.distributed: a rank exited with status {rc}; stopping the others", file=sys.stderr)
            time.sleep(0.05)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        return status
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(launch())
