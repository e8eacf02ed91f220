"""kiln's convolution against cuDNN (through PyTorch, channels_last) on the same GPU in one run.

Every convolution layer of the seeds' convnet-benchmarks networks (AlexNet and Overfeat at
N=128, VGG-A at N=64) and ResNet-50 (N=256), float16 and bfloat16, fprop, bprop (gradient with
respect to the input) and update (gradient with respect to the filter) timed separately: host
clock around back-to-back calls bracketed by synchronize, median of 5 batches after warm-up,
cuDNN autotuned (torch.backends.cudnn.benchmark). The floor is the layer's FLOPs at the dense
16-bit rate cuBLAS reaches in the same run (an 8192^3 matmul). fprop is also timed with the
fused epilogue (bias, ReLU and bsum, the per-channel sums batch norm takes) against kiln's plain
fprop, its sums checked against the output's. With --fused-parts, each part of that epilogue is
timed alone too (bias; bias and ReLU; bsum), and the GPU kernels of a plain and of a fused call
are listed with their durations (PyTorch's profiler, which sees every kernel of the process), so
that what the fused epilogue costs can be placed: in the convolution's kernel, or in what runs
after it. Prints a table and writes JSON.

    PYTHONPATH=... python3 examples/benchmarks/conv.py [--nets alexnet,vgg] [--dtypes float16] [--json conv.json]
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys

import kiln
from bench_common import git_commit, median_time_ms, torch_beside_kiln

# (name, C, K, H=W, R=S, pad, stride, count in the network)
NETS = {
    "alexnet": (128, [
        ("conv1", 3, 64, 224, 11, 2, 4, 1), ("conv2", 64, 192, 27, 5, 2, 1, 1), ("conv3", 192, 384, 13, 3, 1, 1, 1),
        ("conv4", 384, 256, 13, 3, 1, 1, 1), ("conv5", 256, 256, 13, 3, 1, 1, 1)]),
    "overfeat": (128, [
        ("conv1", 3, 96, 231, 11, 0, 4, 1), ("conv2", 96, 256, 24, 5, 0, 1, 1), ("conv3", 256, 512, 12, 3, 1, 1, 1),
        ("conv4", 512, 1024, 12, 3, 1, 1, 1), ("conv5", 1024, 1024, 12, 3, 1, 1, 1)]),
    "vgg_a": (64, [
        ("conv1", 3, 64, 224, 3, 1, 1, 1), ("conv2", 64, 128, 112, 3, 1, 1, 1), ("conv3", 128, 256, 56, 3, 1, 1, 1),
        ("conv4", 256, 256, 56, 3, 1, 1, 1), ("conv5", 256, 512, 28, 3, 1, 1, 1), ("conv6", 512, 512, 28, 3, 1, 1, 1),
        ("conv7", 512, 512, 14, 3, 1, 1, 1), ("conv8", 512, 512, 14, 3, 1, 1, 1)]),
    "resnet50": (256, [
        ("conv1", 3, 64, 224, 7, 3, 2, 1),
        ("s2_1x1a", 64, 64, 56, 1, 0, 1, 1), ("s2_3x3", 64, 64, 56, 3, 1, 1, 3), ("s2_1x1b", 64, 256, 56, 1, 0, 1, 4),
        ("s2_1x1c", 256, 64, 56, 1, 0, 1, 2),
        ("s3_1x1a", 256, 128, 56, 1, 0, 1, 1), ("s3_3x3s2", 128, 128, 56, 3, 1, 2, 1), ("s3_1x1b", 128, 512, 28, 1, 0, 1, 4),
        ("s3_proj", 256, 512, 56, 1, 0, 2, 1), ("s3_1x1c", 512, 128, 28, 1, 0, 1, 3), ("s3_3x3", 128, 128, 28, 3, 1, 1, 3),
        ("s4_1x1a", 512, 256, 28, 1, 0, 1, 1), ("s4_3x3s2", 256, 256, 28, 3, 1, 2, 1), ("s4_1x1b", 256, 1024, 14, 1, 0, 1, 6),
        ("s4_proj", 512, 1024, 28, 1, 0, 2, 1), ("s4_1x1c", 1024, 256, 14, 1, 0, 1, 5), ("s4_3x3", 256, 256, 14, 3, 1, 1, 5),
        ("s5_1x1a", 1024, 512, 14, 1, 0, 1, 1), ("s5_3x3s2", 512, 512, 14, 3, 1, 2, 1), ("s5_1x1b", 512, 2048, 7, 1, 0, 1, 3),
        ("s5_proj", 1024, 2048, 14, 1, 0, 2, 1), ("s5_1x1c", 2048, 512, 7, 1, 0, 1, 2), ("s5_3x3", 512, 512, 7, 3, 1, 1, 2)]),
}
OPS = ("fprop", "bprop", "update")


def call_kernels(fn, sync, calls=10):
    """The GPU kernels one call of fn runs, [(name, mean microseconds a call)], from PyTorch's
    profiler over `calls` calls after a warm-up call, the costliest first."""
    from torch.profiler import DeviceType, ProfilerActivity, profile
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        sync()
    totals = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            totals[e.name] = totals.get(e.name, 0.0) + e.time_range.elapsed_us()
    return [(name, us / calls) for name, us in sorted(totals.items(), key=lambda kv: -kv[1])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--layers", default="", help="only these layer names (comma-separated)")
    ap.add_argument("--json", default="conv.json")
    ap.add_argument("--fused-parts", action="store_true",
                    help="fprop: also time each part of the fused epilogue and list the kernels of a call")
    args = ap.parse_args()
    if args.fused_parts:
        # The profiler's CUPTI torn down after each profile (PyTorch's Kineto keeps it otherwise in
        # some versions, which slows the kernels timed after it).
        os.environ.setdefault("TEARDOWN_CUPTI", "1")
    both = torch_beside_kiln("conv")
    if both is None:
        return 0
    torch, ctx = both
    import torch.nn.functional as tf
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False

    timing = dict(target_ms=20.0, batches=5, warmup=1, most_calls=200, least_calls=2)

    def sync():
        ctx.synchronize()
        torch.cuda.synchronize()

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    peak = 2 * 8192 ** 3 / (median_time_ms(lambda: a @ a, sync, **timing) * 1e-3) / 1e12
    del a
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; 16-bit dense peak as cuBLAS reaches it: {peak:.0f} TFLOP/s (8192^3 float16 matmul)")
    result = {"device": dev, "date": datetime.date.today().isoformat(),
              "commit": git_commit(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "kiln": kiln.__version__, "peak_tflops": peak,
              "method": "host clock around back-to-back calls bracketed by synchronize, median of 5 batches after "
                        "warm-up; cuDNN through PyTorch channels_last with cudnn.benchmark; kiln NHWC/KRSC through "
                        "DLPack views of the same tensors",
              "layers": []}
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}
    kdt = {"float16": kiln.float16, "bfloat16": kiln.bfloat16}
    only = set(filter(None, args.layers.split(",")))
    print(f"{'net':<9} {'layer':<9} {'dtype':<8} {'op':<6} {'kiln ms':>9} {'cudnn ms':>9} {'kiln TF/s':>9} "
          f"{'cudnn TF/s':>10} {'vs cudnn':>8} {'%peak':>6} {'err':>8} {'fused':>7}  kiln path")
    gen = torch.Generator(device="cuda").manual_seed(1)
    for net in args.nets.split(","):
        N, layers = NETS[net]
        for dt in args.dtypes.split(","):
            for name, C, K, HW, RS, pad, stride, count in layers:
                if only and name not in only:
                    continue
                PQ = (HW + 2 * pad - RS) // stride + 1
                flops = 2.0 * N * K * C * PQ * PQ * RS * RS
                x = torch.randn(N, C, HW, HW, device="cuda", generator=gen).to(tdt[dt]).to(
                    memory_format=torch.channels_last)
                w = (torch.randn(K, C, RS, RS, device="cuda", generator=gen) / math.sqrt(C * RS * RS)).to(
                    tdt[dt]).to(memory_format=torch.channels_last)
                e = torch.randn(N, K, PQ, PQ, device="cuda", generator=gen).to(tdt[dt]).to(
                    memory_format=torch.channels_last)
                nhwc = lambda t: kiln.from_dlpack(t.permute(0, 2, 3, 1))
                kI, kF, kE = nhwc(x), nhwc(w), nhwc(e)
                o = torch.empty(N, K, PQ, PQ, device="cuda", dtype=tdt[dt]).to(memory_format=torch.channels_last)
                gi = torch.empty_like(x)
                gw = torch.empty_like(w)
                kO, kGI, kGW = nhwc(o), nhwc(gi), nhwc(gw)
                bias = torch.randn(K, device="cuda", generator=gen)
                sums = torch.empty(K, device="cuda")
                kB, kS = kiln.from_dlpack(bias), kiln.from_dlpack(sums)
                layer = kiln.conv_layer(kdt[dt], N, C, K, H=HW, W=HW, R=RS, S=RS, pad_h=pad, pad_w=pad, str_h=stride,
                                        str_w=stride)
                paths = {op: kiln.conv_kernel(layer, op) for op in OPS}
                runs = {
                    "fprop": (lambda: kiln.fprop_conv(layer, kI, kF, kO),
                              lambda: tf.conv2d(x, w, stride=stride, padding=pad),
                              lambda: (o, tf.conv2d(x.float(), w.float(), stride=stride, padding=pad))),
                    "bprop": (lambda: kiln.bprop_conv(layer, kF, kE, kGI),
                              lambda: torch.ops.aten.convolution_backward(e, x, w, None, [stride] * 2, [pad] * 2,
                                                                          [1, 1], False, [0, 0], 1,
                                                                          [True, False, False]),
                              lambda: (gi, torch.ops.aten.convolution_backward(
                                  e.float(), x.float(), w.float(), None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0],
                                  1, [True, False, False])[0])),
                    "update": (lambda: kiln.update_conv(layer, kI, kE, kGW),
                               lambda: torch.ops.aten.convolution_backward(e, x, w, None, [stride] * 2, [pad] * 2,
                                                                           [1, 1], False, [0, 0], 1,
                                                                           [False, True, False]),
                               lambda: (gw, torch.ops.aten.convolution_backward(
                                   e.float(), x.float(), w.float(), None, [stride] * 2, [pad] * 2, [1, 1], False,
                                   [0, 0], 1, [False, True, False])[1])),
                }
                for op in args.ops.split(","):
                    run_kiln, run_cudnn, check = runs[op]
                    run_kiln()
                    sync()
                    paths[op] = kiln.conv_kernel(layer, op)   # after the first call: a tuned choice (KILN_AUTOTUNE=1)
                    got, ref = check()
                    err = ((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                    del ref
                    k_ms = median_time_ms(run_kiln, sync, **timing)
                    c_ms = median_time_ms(run_cudnn, sync, **timing)
                    row = {"net": net, "layer": name, "dtype": dt, "op": op, "N": N, "C": C, "K": K, "HW": HW, "RS": RS,
                           "pad": pad, "stride": stride, "count": count, "flops": flops, "kiln_ms": k_ms, "cudnn_ms": c_ms,
                           "kiln_tflops": flops / k_ms / 1e9, "cudnn_tflops": flops / c_ms / 1e9,
                           "vs_cudnn": c_ms / k_ms, "pct_peak": 100 * flops / k_ms / 1e9 / peak, "err": err,
                           "kiln_path": paths[op]}
                    fused = ""
                    if op == "fprop":   # bias + ReLU + bsum beside the plain fprop
                        run_fused = lambda: kiln.fprop_conv(layer, kI, kF, kO, bias=kB, relu=True, bsum=kS)
                        run_fused()
                        sync()
                        want = o.float().sum(dim=(0, 2, 3))
                        row["fused_err"] = ((sums - want).abs().max() / o.float().abs().sum(dim=(0, 2, 3)).max()).item()
                        row["fused_ms"] = median_time_ms(run_fused, sync, **timing)
                        row["fused_over_plain"] = row["fused_ms"] / k_ms - 1
                        fused = f"{100 * row['fused_over_plain']:+6.1f}%"
                        row["fused_path"] = kiln.conv_kernel(layer, "fprop+bsum")
                        if args.fused_parts:
                            parts = {
                                "bias": lambda: kiln.fprop_conv(layer, kI, kF, kO, bias=kB),
                                "bias+relu": lambda: kiln.fprop_conv(layer, kI, kF, kO, bias=kB, relu=True),
                                "bsum": lambda: kiln.fprop_conv(layer, kI, kF, kO, bsum=kS),
                            }
                            row["fused_parts"] = {part: median_time_ms(f, sync, **timing) / k_ms - 1
                                                  for part, f in parts.items()}
                            row["kernels"] = {"plain": call_kernels(run_kiln, sync),
                                              "fused": call_kernels(run_fused, sync)}
                        if row["fused_err"] > 1e-3:
                            print(f"conv: {net} {name} {dt}: bsum off from the output's sums by {row['fused_err']:.1e}")
                    result["layers"].append(row)
                    print(f"{net:<9} {name:<9} {dt:<8} {op:<6} {k_ms:9.3f} {c_ms:9.3f} {row['kiln_tflops']:9.1f} "
                          f"{row['cudnn_tflops']:10.1f} {row['vs_cudnn']:7.2f}x {row['pct_peak']:5.0f}% {err:8.1e} "
                          f"{fused:>7}  {paths[op]}"
                          + (f" (fused: {row['fused_path']})" if row.get("fused_path", paths[op]) != paths[op] else ""),
                          flush=True)
                    if "fused_parts" in row:
                        print("    fused parts over plain: " + ", ".join(f"{part} {100 * v:+.1f}%" for part, v in
                                                                       row["fused_parts"].items()), flush=True)
                        for who, ks in row["kernels"].items():
                            print(f"    {who} call's kernels: " + "; ".join(f"{k} {us:.1f} us" for k, us in ks),
                                  flush=True)
                del x, w, e, o, gi, gw, kI, kF, kE, kO, kGI, kGW, bias, sums, kB, kS
                torch.cuda.empty_cache()
    summary = []
    for net in args.nets.split(","):
        for dt in args.dtypes.split(","):
            rows = [r for r in result["layers"] if r["net"] == net and r["dtype"] == dt]
            if not rows:
                continue
            line = {"net": net, "dtype": dt}
            for op in args.ops.split(","):
                rs = [r for r in rows if r["op"] == op]
                line[op] = math.exp(sum(math.log(r["vs_cudnn"]) for r in rs) / len(rs))
            line["sum"] = sum(r["cudnn_ms"] * r["count"] for r in rows) / sum(r["kiln_ms"] * r["count"] for r in rows)
            line["worst"] = min(r["vs_cudnn"] for r in rows)
            fused = sorted(r["fused_over_plain"] for r in rows if "fused_over_plain" in r)
            if fused:
                line["fused_median"], line["fused_worst"] = statistics.median(fused), fused[-1]
            summary.append(line)
    result["summary"] = summary
    print("\nkiln vs cuDNN (>1: kiln faster): geometric mean per op; network time summed (layers x count)")
    for s in summary:
        ops = " ".join(f"{op} {s[op]:.2f}x" for op in args.ops.split(","))
        fused = (f"  fused bias+relu+bsum over plain fprop: median {100 * s['fused_median']:+.1f}%, worst "
                 f"{100 * s['fused_worst']:+.1f}%" if "fused_median" in s else "")
        print(f"  {s['net']:<9} {s['dtype']:<8} {ops}  sum {s['sum']:.2f}x  worst {s['worst']:.2f}x{fused}")
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
