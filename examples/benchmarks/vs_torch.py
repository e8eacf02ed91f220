"""kiln's fused expressions beside PyTorch eager and torch.compile, on one GPU in one process.

    python examples/benchmarks/vs_torch.py [--json vs_torch.json] [--cases a,b] [--dtypes float16,...]
                                           [--shapes 4096x16384,...] [--no-compile] [--quick]

First the device's copy bandwidth (torch device-to-device copy of 1 GiB, events), the yardstick.
Then every case of the suite, for every dtype and shape: the same expression written once for
kiln (module functions, assigned into an output tensor) and once for PyTorch (run eagerly, and
through torch.compile with the recompile limits raised so that no case silently falls back to
eager). All three read the same random input (kiln shares PyTorch's memory through DLPack) and
write outputs of the input's dtype (int32/int64 indices for argmax); every result is checked
against a float64 evaluation of the same expression.

Timing, the same for all three: after warm-up, `calls` back-to-back calls bracketed by
synchronising both kiln's stream and PyTorch's (host clock), per-call time = elapsed / calls;
the median of 7 such batches. `calls` is chosen so that a batch lasts about 5 ms. Bytes are the
ideal traffic: every input read once and every output written once. Prints a table and writes
JSON (docs/PERFORMANCE.md's fusion table is generated from it by examples/benchmarks/perf_tables.py).
"""
import argparse
import datetime
import json
import math
import sys

import numpy as np

import kiln
from bench_common import copy_bandwidth, git_commit, median_time_ms, torch_beside_kiln

EPS = 1e-5
SHAPES = ["128x32", "200000x96", "65536x1024", "8192x3000", "3000x5001", "4096x16384", "16384x16384", "1024x65536",
          "512x262144", "77x100003"]
DTYPES = ["float32", "float16", "bfloat16"]
# The largest error (relative to the reference's scale) each output dtype may carry: a few
# units of its last place, since every case computes in float32 and rounds once at the store.
TOLERANCE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


# ---- the suite: each case is (kiln expression, torch expression) over the same inputs, and the
# output's shape. `k` is the kiln module or the torch module through a tiny adapter, so each
# expression is written once.

class TorchOps:
    """The handful of kiln module functions the suite uses, on torch tensors."""

    def __init__(self, torch):
        self.t = torch

    def mean(self, x, axis, keepdims=True):
        return x.mean(axis, keepdim=keepdims)

    def sum(self, x, axis=None, keepdims=True):
        return x.sum() if axis is None else x.sum(axis, keepdim=keepdims)

    def max(self, x, axis, keepdims=True):
        return x.amax(axis, keepdim=keepdims)

    def argmax(self, x, axis, keepdims=True):
        return x.argmax(axis, keepdim=keepdims)

    def square(self, x):
        return x * x

    def sqrt(self, x):
        return self.t.sqrt(x)

    def reciprocal(self, x):
        return self.t.reciprocal(x)

    def exp(self, x):
        return self.t.exp(x)

    def tanh(self, x):
        return self.t.tanh(x)

    def abs(self, x):
        return self.t.abs(x)

    def maximum(self, x, y):
        return self.t.clamp_min(x, y) if isinstance(y, float) else self.t.maximum(x, y)


class KilnOps:
    def mean(self, x, axis, keepdims=True):
        return kiln.mean(x, axis=axis, keepdims=keepdims)

    def sum(self, x, axis=None, keepdims=True):
        return kiln.sum(x) if axis is None else kiln.sum(x, axis=axis, keepdims=keepdims)

    def max(self, x, axis, keepdims=True):
        return kiln.max(x, axis=axis, keepdims=keepdims)

    def argmax(self, x, axis, keepdims=True):
        return kiln.argmax(x, axis=axis, keepdims=keepdims)

    square = staticmethod(kiln.square)
    sqrt = staticmethod(kiln.sqrt)
    reciprocal = staticmethod(kiln.reciprocal)
    exp = staticmethod(kiln.exp)
    tanh = staticmethod(kiln.tanh)
    abs = staticmethod(kiln.abs)
    maximum = staticmethod(kiln.maximum)


def variance(k, x):
    return k.mean(k.square(x - k.mean(x, 1)), 1)


def batchnorm(k, x):  # the seeds' benchmark: normalise each row (no affine)
    mu = k.mean(x, 1)
    return k.reciprocal(k.sqrt(k.mean(k.square(x - mu), 1) + EPS)) * (x - mu)


def softmax(k, x):
    e = k.exp(x - k.max(x, 1))
    return e * k.reciprocal(k.sum(e, 1))


def layernorm(k, x, g, b):
    mu = k.mean(x, 1)
    d = x - mu
    return d * k.reciprocal(k.sqrt(k.mean(k.square(d), 1) + EPS)) * g + b


def rmsnorm(k, x, g):
    return x * k.reciprocal(k.sqrt(k.mean(k.square(x), 1) + EPS)) * g


def gelu(k, x):
    return 0.5 * x * (1.0 + k.tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x))))


def chain10(k, x, z):  # ten elementwise operations on two inputs
    t = x * 1.5 + z
    t = t * t - x
    t = k.exp(-k.abs(t) * 0.5)
    return k.maximum(t * z + 0.25, 0.0)


def argmax_rows(k, x):
    return k.argmax(x, 1)


def colsum(k, x):
    return k.sum(x, 0)


def fullsum(k, x):
    return k.sum(x)


# name: (function, extra inputs ("row": a [1, N] vector, "full": another [M, N] tensor), output
# shape from (M, N), reduced length (for the error scale of sums))
CASES = {
    "variance": (variance, [], lambda m, n: (m, 1)),
    "batchnorm": (batchnorm, [], lambda m, n: (m, n)),
    "softmax": (softmax, [], lambda m, n: (m, n)),
    "layernorm": (layernorm, ["row", "row"], lambda m, n: (m, n)),
    "rmsnorm": (rmsnorm, ["row"], lambda m, n: (m, n)),
    "gelu": (gelu, [], lambda m, n: (m, n)),
    "chain10": (chain10, ["full"], lambda m, n: (m, n)),
    "argmax": (argmax_rows, [], lambda m, n: (m, 1)),
    "colsum": (colsum, [], lambda m, n: (1, n)),
    "fullsum": (fullsum, [], lambda m, n: ()),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="vs_torch.json")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out (kiln and eager only)")
    ap.add_argument("--no-eager", action="store_true", help="leave torch eager out")
    args = ap.parse_args()

    both = torch_beside_kiln("vs_torch")
    if both is None:
        return 0
    torch, ctx = both
    torch.backends.cuda.matmul.allow_tf32 = False
    if not args.no_compile:
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = 100000
        torch._dynamo.config.accumulated_cache_size_limit = 100000
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 100000
            torch._dynamo.config.accumulated_recompile_limit = 100000

    def sync():
        ctx.synchronize()
        torch.cuda.synchronize()

    bw = copy_bandwidth(torch)
    tk = TorchOps(torch)
    kk = KilnOps()
    dev_name = torch.cuda.get_device_name()
    print(f"device: {dev_name}; copy bandwidth {bw:.0f} GB/s (torch device-to-device copy of 1 GiB, events)")
    commit = git_commit()
    result = {"device": dev_name, "date": datetime.date.today().isoformat(), "commit": commit,
              "copy_gbs": bw, "torch": torch.__version__, "kiln": kiln.__version__,
              "method": "host clock around back-to-back calls bracketed by synchronize, median of 7 batches of ~5 ms "
                        "after warm-up; same for kiln, torch eager and torch.compile",
              "cases": []}
    header = (f"{'case':<10} {'dtype':<8} {'shape':<12} {'kiln ms':>9} {'eager ms':>9} {'compile ms':>10} "
              f"{'kiln GB/s':>9} {'%copy':>6} {'vs compile':>10} {'err':>8}")
    print(header)
    torch_dt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    gen = torch.Generator(device="cuda").manual_seed(1)
    failures = []
    for shape_s in args.shapes.split(","):
        m, n = (int(v) for v in shape_s.split("x"))
        for dt_name in args.dtypes.split(","):
            tdt = torch_dt[dt_name]
            base = torch.randn((m, n), generator=gen, device="cuda", dtype=torch.float32)
            x = base.to(tdt)
            del base
            for case in args.cases.split(","):
                fn, extras, out_shape = CASES[case]
                ins = [x]
                for e in extras:
                    shp = (1, n) if e == "row" else (m, n)
                    ins.append((torch.rand(shp, generator=gen, device="cuda") + 0.5).to(tdt))
                kins = [kiln.from_dlpack(t) for t in ins]
                oshape = out_shape(m, n)
                odt = torch.int32 if case == "argmax" else tdt
                out = torch.empty(oshape, device="cuda", dtype=odt)
                kout = kiln.from_dlpack(out)

                def run_kiln():
                    kout[...] = fn(kk, *kins)

                def run_eager():
                    return fn(tk, *ins)

                comp = None if args.no_compile else torch.compile(lambda *a: fn(tk, *a), dynamic=False)

                def run_compile():
                    return comp(*ins)

                row = {"case": case, "dtype": dt_name, "shape": [m, n]}
                # Correctness: all three against float64.
                ref = fn(tk, *[t.double() for t in ins])
                run_kiln()
                sync()
                got = {"kiln": out.reshape(oshape)}
                if not args.no_eager:
                    got["eager"] = run_eager()
                if comp is not None:
                    got["compile"] = run_compile()
                errs = {}
                for who, y in got.items():
                    errs[who] = check(case, y, ref, ins[0])
                row["error"] = errs
                ok = errs["kiln"] <= TOLERANCE[dt_name]
                row["ok"] = ok
                if not ok:
                    failures.append(f"{case} {dt_name} {shape_s}: error {errs['kiln']:.3g}")
                del got, ref
                row["kiln_ms"] = median_time_ms(run_kiln, sync)
                if not args.no_eager:
                    row["eager_ms"] = median_time_ms(run_eager, sync)
                if comp is not None:
                    row["compile_ms"] = median_time_ms(run_compile, sync)
                nbytes = sum(t.numel() * t.element_size() for t in ins) + out.numel() * out.element_size()
                row["bytes"] = nbytes
                row["kiln_gbs"] = nbytes / (row["kiln_ms"] * 1e-3) / 1e9
                row["kiln_pct_copy"] = 100 * row["kiln_gbs"] / bw
                if comp is not None:
                    row["compile_gbs"] = nbytes / (row["compile_ms"] * 1e-3) / 1e9
                    row["vs_compile"] = row["compile_ms"] / row["kiln_ms"]
                result["cases"].append(row)
                with open(args.json, "w") as f:   # after every case, so that a cut run keeps what it measured
                    json.dump(result, f, indent=1)
                print(f"{case:<10} {dt_name:<8} {shape_s:<12} {row['kiln_ms']:>9.4f} "
                      f"{row.get('eager_ms', float('nan')):>9.4f} {row.get('compile_ms', float('nan')):>10.4f} "
                      f"{row['kiln_gbs']:>9.0f} {row['kiln_pct_copy']:>5.0f}% {row.get('vs_compile', float('nan')):>9.2f}x "
                      f"{errs['kiln']:>8.1e}{'' if ok else ' FAIL'}", flush=True)
                del kins, kout, out, ins[1:]
            del x
            torch.cuda.empty_cache()
    ratios = [r["vs_compile"] for r in result["cases"] if "vs_compile" in r]
    if ratios:
        gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        worst = min(result["cases"], key=lambda r: r.get("vs_compile", math.inf))
        result["geomean_vs_compile"] = gm
        by_dt = {}
        for r in result["cases"]:
            by_dt.setdefault(r["dtype"], []).append(math.log(r["vs_compile"]))
        result["geomean_vs_compile_by_dtype"] = {d: math.exp(sum(v) / len(v)) for d, v in by_dt.items()}
        print(f"geometric mean vs torch.compile: {gm:.2f}x ("
              + ", ".join(f"{d} {v:.2f}x" for d, v in result["geomean_vs_compile_by_dtype"].items())
              + f"); worst: {worst['case']} {worst['dtype']} {worst['shape'][0]}x{worst['shape'][1]} "
              f"{worst['vs_compile']:.2f}x; ahead in {sum(r >= 1.0 for r in ratios)} of {len(ratios)}")
    big = [r for r in result["cases"] if r["bytes"] >= 64 << 20]
    if big:
        print(f"cases moving >= 64 MiB at >= 90% of copy bandwidth: {sum(r['kiln_pct_copy'] >= 90 for r in big)} of {len(big)}")
    result["failures"] = failures
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")
    if failures:
        print("WRONG RESULTS:\n  " + "\n  ".join(failures))
        return 1
    return 0


def check(case, y, ref, x):
    """Largest error of y against the float64 reference, relative to the reference's scale."""
    if case == "argmax":
        # Ties are possible in 16-bit data: the value at the chosen index must be the row's max.
        picked = x.double().gather(1, y.long().reshape(-1, 1))
        best = x.double().amax(1, keepdim=True)
        return float((picked - best).abs().max())
    y = y.double().reshape(ref.shape)
    scale = float(ref.abs().max())
    if case in ("colsum", "fullsum"):  # sums of random signs: their size is about the root of sum x^2
        xx = x.double().square()
        scale = max(scale, float((xx.sum(0) if case == "colsum" else xx.sum()).max()) ** 0.5)
    return float((y - ref).abs().max()) / max(scale, 1e-30)


if __name__ == "__main__":
    sys.exit(main())
