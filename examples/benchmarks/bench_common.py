"""What the Python benchmarks beside PyTorch share: whether both sides have a GPU, the commit
they report, and the timing (host clock around back-to-back calls bracketed by synchronize)."""
import os
import statistics
import subprocess
import time

import kiln


def torch_beside_kiln(name):
    """(torch, kiln's default context) when both run on a CUDA GPU; otherwise None, having said why."""
    try:
        import torch
    except ImportError:
        print(f"{name}: PyTorch is not importable; nothing to compare against")
        return None
    if not torch.cuda.is_available():
        print(f"{name}: no CUDA device visible to PyTorch; skipped")
        return None
    ctx = kiln.default_context()
    if ctx.backend != "cuda":
        print(f"{name}: kiln's default context runs on {ctx.backend}, not CUDA; skipped")
        return None
    return torch, ctx


def copy_bandwidth(torch):
    """PyTorch's device-to-device copy of 1 GiB (events, median of 20): read + write bytes per second."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    del a, b
    return 2 * n / (statistics.median(times) * 1e-3) / 1e9


def git_commit():
    """KILN_COMMIT, else the checkout's short hash, else 'unknown'."""
    if os.environ.get("KILN_COMMIT"):
        return os.environ["KILN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def median_time_ms(fn, sync, target_ms=5.0, batches=7, warmup=3, most_calls=2000, least_calls=3):
    """Milliseconds per call of fn: `warmup` calls, then batches of about target_ms (at least
    least_calls, at most most_calls calls each), each timed on the host clock up to sync(); the
    median batch."""
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = max((time.perf_counter() - t0) * 1e3, 1e-3)
    calls = int(min(most_calls, max(least_calls, target_ms / once)))
    return statistics.median(batch_ms(fn, sync, calls) for _ in range(batches))


def batch_ms(fn, sync, calls):
    """Milliseconds per call of `calls` back-to-back calls of fn, timed on the host clock up to sync()."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e3 / calls
