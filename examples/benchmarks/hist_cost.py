"""What numerics histograms of named tensors cost (docs/neon.md): the same assignment uncounted,
counted in the fused kernels' store path (hist_named on, the destination tagged), and counted
by a second pass (the assignment, then kiln.hist of its result), on the same GPU in one run.
Random data; warm-up, then the median of batches of back-to-back calls timed on the host clock
up to a synchronize (bench_common.median_time_ms). Floor: the bytes the assignment reads and
writes over the device-to-device copy bandwidth measured at the start of the run.

    python3 examples/benchmarks/hist_cost.py [--json hist_cost.json]
"""
import argparse
import datetime
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402
import kiln  # noqa: E402

CASES = [
    # (name, expression of x, shape, dtypes)
    ("tanh-scale", lambda x: kiln.tanh(x) * 2.0, (8192, 8192), ("float32", "float16", "bfloat16")),
    ("softmax", lambda x: kiln.nn.softmax(x, axis=1), (65536, 1024), ("float32", "float16")),
    ("row sum", lambda x: kiln.sum(x, axis=1, keepdims=True), (65536, 1024), ("float32",)),
    ("column sum", lambda x: kiln.sum(x, axis=0, keepdims=True), (16384, 4096), ("float16",)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ctx = kiln.default_context()
    if ctx.backend != "cuda":
        print(f"hist_cost: kiln's default context runs on {ctx.backend}, not CUDA; nothing measured")
        return 0
    sync = ctx.synchronize
    rng = np.random.default_rng(3)
    big = kiln.asarray(rng.standard_normal(1 << 27, dtype=np.float32))
    dst = kiln.empty_like(big)

    def copy():
        dst[...] = big

    copy_ms = bench_common.median_time_ms(copy, sync)
    copy_gbs = 2 * big.nbytes / copy_ms / 1e6
    rows = []
    for name, fn, shape, dtypes in CASES:
        for dt in dtypes:
            x = kiln.empty(shape, dtype=dt)
            x[...] = kiln.asarray(rng.standard_normal(shape, dtype=np.float32) * 4)
            out = kiln.empty(fn(x).shape, dtype=dt)
            moved = x.nbytes + out.nbytes
            kiln.set_hist_tag(out, "out")

            def assign():
                out[...] = fn(x)

            def second_pass():
                out[...] = fn(x)
                kiln.hist(out, "out")

            times = {}
            for label, on, call in (("off", False, assign), ("store", True, assign), ("pass", False, second_pass)):
                ctx.hist_named = on
                times[label] = bench_common.median_time_ms(call, sync)
                ctx.hist_named = False
                ctx._dump_hist_data()   # the slots the timing took
            # The store path's counts are those of a pass over the result.
            ctx.hist_named = True
            assign()
            ctx.hist_named = False
            kiln.hist(out, "check")
            counts, tags = ctx._dump_hist_data()
            counts = np.asarray(counts)
            same = bool((counts[0] == counts[1]).all()) and int(counts[0].sum()) == out.size
            floor = moved / copy_gbs / 1e6
            rows.append({"case": name, "dtype": dt, "shape": list(shape), "bytes": moved, "floor_ms": floor,
                         "off_ms": times["off"], "store_ms": times["store"], "pass_ms": times["pass"],
                         "store_over_off": times["store"] / times["off"], "pass_over_off": times["pass"] / times["off"],
                         "counts_match": same})
            print(f"{name:11s} {dt:9s} {str(shape):14s} off {times['off']:.4f} ms  store {times['store']:.4f} ms "
                  f"({times['store'] / times['off']:.3f}x)  pass {times['pass']:.4f} ms "
                  f"({times['pass'] / times['off']:.3f}x)  floor {floor:.4f} ms  counts {'ok' if same else 'DIFFER'}")
    result = {"device": ctx.description, "date": datetime.date.today().isoformat(), "commit": bench_common.git_commit(),
              "copy_gbs": copy_gbs, "hist": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all(r["counts_match"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
