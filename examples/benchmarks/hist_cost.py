"""What numerics histograms of named tensors cost (docs/neon.md): the same call (an assignment, a
product) uncounted, counted in its kernels' store path (hist_named on, the output tagged), and
counted by a second pass (the call, then kiln.hist of its result), on the same GPU in one run:
fused expressions, products, max pooling and a convolution.
Random data; warm-up, then the median of batches of back-to-back calls timed on the host clock
up to a synchronize (bench_common.median_time_ms). Floor: the bytes the assignment reads and
writes over the device-to-device copy bandwidth measured at the start of the run (products:
their flops over the dtype's dense peak, H200: 989 TFLOP/s for 16-bit inputs, 67 for float32).

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
PRODUCTS = [((4096, 4096, 4096), "float16"), ((8192, 8192, 8192), "bfloat16"), ((2048, 2048, 2048), "float32")]
PEAK_TFLOPS = {"float16": 989.0, "bfloat16": 989.0, "float32": 67.0}


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

    def measure(name, dt, shape, call, out, floor):
        kiln.set_hist_tag(out, "out")

        def second_pass():
            call()
            kiln.hist(out, "out")

        times = {}
        for label, on, fn in (("off", False, call), ("store", True, call), ("pass", False, second_pass)):
            ctx.hist_named = on
            times[label] = bench_common.median_time_ms(fn, sync)
            ctx.hist_named = False
            ctx._dump_hist_data()   # the slots the timing took
        # The store path's counts are those of a pass over the result.
        ctx.hist_named = True
        call()
        ctx.hist_named = False
        kiln.hist(out, "check")
        counts, tags = ctx._dump_hist_data()
        counts = np.asarray(counts)
        same = bool((counts[0] == counts[1]).all()) and int(counts[0].sum()) == out.size
        rows.append({"case": name, "dtype": dt, "shape": list(shape), "floor_ms": floor, "off_ms": times["off"],
                     "store_ms": times["store"], "pass_ms": times["pass"], "store_over_off": times["store"] / times["off"],
                     "pass_over_off": times["pass"] / times["off"], "counts_match": same})
        print(f"{name:11s} {dt:9s} {str(shape):18s} off {times['off']:.4f} ms  store {times['store']:.4f} ms "
              f"({times['store'] / times['off']:.3f}x)  pass {times['pass']:.4f} ms "
              f"({times['pass'] / times['off']:.3f}x)  floor {floor:.4f} ms  counts {'ok' if same else 'DIFFER'}")

    for name, fn, shape, dtypes in CASES:
        for dt in dtypes:
            x = kiln.empty(shape, dtype=dt)
            x[...] = kiln.asarray(rng.standard_normal(shape, dtype=np.float32) * 4)
            out = kiln.empty(fn(x).shape, dtype=dt)

            def assign():
                out[...] = fn(x)

            measure(name, dt, shape, assign, out, (x.nbytes + out.nbytes) / copy_gbs / 1e6)
    for (m, n, k), dt in PRODUCTS:
        a, b = kiln.empty((m, k), dtype=dt), kiln.empty((k, n), dtype=dt)
        a[...] = kiln.asarray(rng.standard_normal((m, k), dtype=np.float32))
        b[...] = kiln.asarray(rng.standard_normal((k, n), dtype=np.float32))
        c = kiln.empty((m, n), dtype=dt)

        def product():
            kiln.compound_dot(a, b, c)

        measure("compound_dot", dt, (m, n, k), product, c, 2.0 * m * n * k / (PEAK_TFLOPS[dt] * 1e9))
    # Precompiled layer kernels, float16: max pooling 3x3 / 2 and a 3x3 convolution's fprop.
    n, hw, ch = 64, 56, 256
    x = kiln.empty((n, hw, hw, ch), dtype="float16")
    x[...] = kiln.asarray(rng.standard_normal((n, hw, hw, ch), dtype=np.float32))
    layer = kiln.pool_layer("float16", "max", n, ch, H=hw, W=hw, R=3, S=3, pad_h=1, pad_w=1, str_h=2, str_w=2)
    y = kiln.empty(layer.dimO, dtype="float16")
    measure("fprop_pool max", "float16", layer.dimI, lambda: kiln.fprop_pool(layer, x, y), y,
            (x.nbytes + y.nbytes) / copy_gbs / 1e6)
    w = kiln.empty((ch, 3, 3, ch), dtype="float16")
    w[...] = kiln.asarray(rng.standard_normal((ch, 3, 3, ch), dtype=np.float32) / 48)
    o = kiln.empty((n, hw, hw, ch), dtype="float16")
    measure("conv fprop", "float16", (n, hw, hw, ch, 3, 3, ch), lambda: kiln.conv(x, w, padding=1, out=o), o,
            2.0 * n * hw * hw * ch * 9 * ch / (PEAK_TFLOPS["float16"] * 1e9))
    result = {"device": ctx.description, "date": datetime.date.today().isoformat(), "commit": bench_common.git_commit(),
              "copy_gbs": copy_gbs, "hist": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all(r["counts_match"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
