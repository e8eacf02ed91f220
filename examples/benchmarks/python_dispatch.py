"""Python-side cost of one cached fused expression, beside PyTorch eager's per-op cost.

    python examples/benchmarks/python_dispatch.py [--json out.json] [--calls N]

Each case assigns a small fused expression (128x32 float32: the kernel itself takes a few
microseconds, so the host side dominates) N times after warm-up and reports the wall time
per call including a final synchronize, the median of 7 repetitions. PyTorch (when importable,
on the same device) runs the same expressions op by op; its per-op figure is its per-expression
time divided by the number of ops it launches.
"""
import argparse
import json
import statistics
import time

import numpy as np

import kiln


def timeit(fn, sync, calls, reps=7):
    for _ in range(max(50, calls // 10)):
        fn()
    sync()
    per = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()

    ng = kiln.NervanaGPU()
    rng = np.random.default_rng(1)
    host = rng.standard_normal((128, 32)).astype(np.float32)
    A = ng.array(host)
    C = ng.empty((128, 1))
    B = ng.empty((128, 32))
    eps = 1e-3

    def variance():
        C[:] = ng.mean(ng.square(A - ng.mean(A, axis=1)), axis=1)

    def batchnorm():
        B[:] = ng.reciprocal(ng.sqrt(ng.var(A, axis=1) + eps)) * (A - ng.mean(A, axis=1))

    def axpy():
        B[:] = A * 2.0 + B

    rows = []
    cases = [("variance", variance, 4), ("batchnorm", batchnorm, 7), ("axpy", axpy, 2)]
    torch = None
    try:
        import torch as _torch

        dev = "cuda" if ng.backend == "cuda" else "cpu"
        if dev == "cpu" or _torch.cuda.is_available():
            torch = _torch
    except ImportError:
        pass
    if torch is not None:
        tA = torch.tensor(host, device=dev)
        tC = torch.empty((128, 1), device=dev)
        tB = torch.zeros((128, 32), device=dev)
        sync_t = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

        def t_variance():
            torch.mean(torch.square(tA - tA.mean(1, keepdim=True)), 1, keepdim=True, out=tC)

        def t_batchnorm():
            m = tA.mean(1, keepdim=True)
            v = torch.var(tA, 1, keepdim=True, unbiased=False)
            torch.mul(torch.reciprocal(torch.sqrt(v + eps)), tA - m, out=tB)

        def t_axpy():
            torch.add(tA * 2.0, tB, out=tB)

        torch_cases = {"variance": (t_variance, 4), "batchnorm": (t_batchnorm, 6), "axpy": (t_axpy, 2)}
    for name, fn, nops in cases:
        us = timeit(fn, ng.synchronize, args.calls)
        row = {"expr": name, "device": ng.device, "kiln_us_per_expr": round(us, 3), "kiln_python_ops": nops}
        if torch is not None:
            tfn, tops = torch_cases[name]
            tus = timeit(tfn, sync_t, args.calls)
            row.update({"torch_us_per_expr": round(tus, 3), "torch_ops": tops, "torch_us_per_op": round(tus / tops, 3)})
        rows.append(row)
    c = ng.counters()
    print(f"device: {ng.description}; kiln {kiln.__version__}; compiles during the run: {c['compiles']}")
    print(f"{'expression':10s} {'kiln us/expr':>13s} {'torch us/expr':>14s} {'torch ops':>9s} {'torch us/op':>12s}")
    for r in rows:
        t = (f"{r['torch_us_per_expr']:14.2f} {r['torch_ops']:9d} {r['torch_us_per_op']:12.2f}" if "torch_us_per_expr" in r
             else f"{'-':>14s} {'-':>9s} {'-':>12s}")
        print(f"{r['expr']:10s} {r['kiln_us_per_expr']:13.2f} {t}")
    out = {"device": ng.description, "calls": args.calls, "rows": rows}
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
