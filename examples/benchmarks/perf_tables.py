"""Writes docs/PERFORMANCE.md's tables from the benchmarks' JSON.

    python examples/benchmarks/perf_tables.py vs_torch.json [vs_torch2.json ...] [--doc docs/PERFORMANCE.md] [--command "..."]
    python examples/benchmarks/perf_tables.py fusion.json --date D --commit C [--doc ...] [--command "..."]
    python examples/benchmarks/perf_tables.py cpu_fusion.json --date D --commit C [--doc ...] [--command "..."]
    python examples/benchmarks/perf_tables.py gemm.json --date D --commit C --device "..." [--doc ...] [--command "..."]
    python examples/benchmarks/perf_tables.py py1.json [py2.json ...] --date D --commit C [--doc ...] [--command "..."]

vs_torch.py's JSON (kiln beside PyTorch) fills what stands between `<!-- vs_torch:begin -->` and
`<!-- vs_torch:end -->` (summary and misses) and vs_torch_cases.md beside the document (every case); kiln-bench-fusion's JSON (the CUDA backend alone: large cases and
latency against the fused-kernel targets; it records no date or commit, so they are given)
fills `<!-- fusion:begin -->` .. `<!-- fusion:end -->`; kiln-bench-cpu-fusion's (the CPU backend
against an unfused evaluation; no date or commit either) `<!-- cpu_fusion:begin -->` ..
`<!-- cpu_fusion:end -->`; kiln-bench-gemm's (JSON lines; no device, date or commit) `<!-- gemm:begin -->` ..
`<!-- gemm:end -->` (per dtype) and gemm_shapes.md beside the document (per product); python_dispatch.py's (one or several runs, each row the median of the runs)
`<!-- python:begin -->` .. `<!-- python:end -->`; conv.py's (kiln beside cuDNN) `<!-- conv:begin -->` ..
`<!-- conv:end -->` (per network) and conv_layers.md beside the document (per layer); convnets.py's (whole
networks beside PyTorch) `<!-- convnets:begin -->` .. `<!-- convnets:end -->` and convnets_layers.md beside it;
layers.py's (the memory-bound layers beside PyTorch) `<!-- layers:begin -->` .. `<!-- layers:end -->`;
collectives.py's (kiln.distributed beside torch.distributed)
`<!-- collectives:begin -->` .. `<!-- collectives:end -->`; hist_cost.py's (named-tensor histograms)
`<!-- hist:begin -->` .. `<!-- hist:end -->`. A section without its markers is added
at the end of the document, so the document always shows the last run's numbers with that
run's device, date, commit and method.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

BEGIN, END = "<!-- vs_torch:begin -->", "<!-- vs_torch:end -->"
FUSION_BEGIN, FUSION_END = "<!-- fusion:begin -->", "<!-- fusion:end -->"
CPU_BEGIN, CPU_END = "<!-- cpu_fusion:begin -->", "<!-- cpu_fusion:end -->"
GEMM_BEGIN, GEMM_END = "<!-- gemm:begin -->", "<!-- gemm:end -->"
PY_BEGIN, PY_END = "<!-- python:begin -->", "<!-- python:end -->"
CONV_BEGIN, CONV_END = "<!-- conv:begin -->", "<!-- conv:end -->"
COLL_BEGIN, COLL_END = "<!-- collectives:begin -->", "<!-- collectives:end -->"
HIST_BEGIN, HIST_END = "<!-- hist:begin -->", "<!-- hist:end -->"
CONVNETS_BEGIN, CONVNETS_END = "<!-- convnets:begin -->", "<!-- convnets:end -->"
LAYERS_BEGIN, LAYERS_END = "<!-- layers:begin -->", "<!-- layers:end -->"
TRAIN_BEGIN = "<!-- torch_train:begin -->"
TRAIN_END = "<!-- torch_train:end -->"
LAYERS_TARGET_PCT = 85.0   # the layers issue's target: memory-bound layers at >= 85% of the copy bandwidth

# kiln-bench-fusion's latency measures against the fused-kernel issue's targets: (label, key, unit, target).
LATENCY = [
    ("host dispatch of a cached expression", "dispatch_us", "us", 3.0),
    ("(the same, expression built once)", "dispatch_prebuilt_us", "us", None),
    ("(driver floor: cuLaunchKernelEx, programmatic, empty kernel)", "launch_floor_programmatic_us", "us", None),
    ("(driver floor: cuLaunchKernel, empty kernel)", "launch_floor_us", "us", None),
    ("tiny 128x32 batch norm end to end (assign + synchronize)", "tiny_us", "us", 5.0),
    ("(driver floor: empty kernel launched, then synchronize)", "launch_sync_floor_us", "us", None),
    ("a new plan for a loaded kernel, end to end (an elementwise assignment's new shape)", "jit.resized_us", "us", 10.0),
    ("(the same, until the assignment returns: the kernel launched, not waited for)", "jit.resized_host_us", "us", None),
    ("(an elementwise assignment's second shape, planned by the passes)", "jit.memory_us", "us", None),
    ("(a row reduction's new batch size, resized)", "jit.resized_row_us", "us", None),
    ("(a row reduction's new batch size, planned by the passes)", "jit.memory_row_us", "us", None),
    ("cold compile of a new row reduction, median of 9", "jit.cold_ms", "ms", 40.0),
    ("(NVRTC's part of it, median)", "jit.nvrtc_ms", "ms", None),
    ("(a new elementwise structure, median of 9)", "jit.cold_elementwise_ms", "ms", None),
    ("(NVRTC's part of the elementwise ones, median)", "jit.nvrtc_elementwise_ms", "ms", None),
    ("(NVRTC floor: a one-line kernel, a new one named apart each time, compiled the same way)", "jit.nvrtc_floor_ms", "ms", None),
    ("disk hit, median of 18", "jit.disk_ms", "ms", 1.0),
]


def provenance(where, date, commit, command, method, dated=""):
    """The lines every table opens with: where it ran, when, at which commit, how and by what method."""
    return [f"- {where}", f"- Date: {date}. Commit: {commit}.{dated}", f"- Command: {command}", f"- Method: {method}"]


def render_fusion(r, command, date, commit):
    def get(key):
        v = r
        for part in key.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        return v
    out = [FUSION_BEGIN, ""] + provenance(
        f"Device: {r['device']}; copy bandwidth measured in the run: {r['copy_gbs']:.0f} GB/s (the larger of the "
        f"driver's device-to-device memcpy of 1 GiB, {r.get('driver_copy_gbs', 0):.0f} GB/s, and kiln's `dst = src` "
        f"on 256 MiB, {r.get('kiln_copy_gbs', 0):.0f} GB/s).", date, commit,
        f"`{command}` (a fresh cache directory).",
        "host clock around back-to-back calls bracketed by synchronize(), median of 7 batches after warm-up; "
        "latencies are host µs per call, medians. Bytes: every input read once and every output written once; "
        "`max err` against float64 on the host.") + ["", "| target | measured | |", "| --- | ---: | --- |"]
    for label, key, unit, target in LATENCY:
        v = get(key)
        if v is None or v < 0:
            continue
        shown = f"{v:.2f} {unit}" if unit == "us" else f"{v:.{1 if v >= 10 else 3}f} {unit}"
        verdict = "" if target is None else ("met" if v <= target else "not met")
        out.append(f"| {label}{'' if target is None else f' <= {target:g} {unit}'} | {shown} | {verdict} |")
    out += ["", "| expression | dtype | shape | ms | GB/s | % of copy | max err |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for c in r["cases"]:
        out.append(f"| {c['expr']} | {c['dtype']} | {c['shape']} | {c['ms']:.4f} | {c['gbs']:.0f} | "
                   f"{c['pct_copy']:.1f}% | {c['max_err']:.1e} |")
    out += ["", FUSION_END]
    return "\n".join(out)


def render_cpu(r, command, date, commit):
    out = [CPU_BEGIN, ""] + provenance(
        f"Machine: {r['machine']}, {r['hardware_threads']} hardware threads (kiln runs on all of them).", date, commit,
        f"`{command}` (release build).",
        f"{r['method']}. kiln: one JIT-compiled kernel per expression. Baseline: the same expressions evaluated as "
        "NumPy does, one pass per operation with a freshly allocated temporary for each result, single-threaded, "
        "compiled in the same build (part of the same program).") + [
        "", "| expression | shape | kiln ms | unfused ms | speedup |", "| --- | --- | ---: | ---: | ---: |"]
    for c in r["cases"]:
        out.append(f"| {c['expr']} | {c['M']}x{c['N']} | {c['kiln_ms']:.3f} | {c['unfused_ms']:.3f} | "
                   f"{c['unfused_ms'] / c['kiln_ms']:.1f}x |")
    out += ["", CPU_END]
    return "\n".join(out)


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


GEMM_SHAPES = "gemm_shapes.md"   # beside the document: the per-product rows of the GEMM run


def render_gemm(rows, command, date, commit, device):
    """kiln-bench-gemm's rows (a product's times, then the host's cost of issuing it): the section
    (per-dtype summary) and the per-product document it links to."""
    products = [x for x in rows if "kiln_ms" in x]
    host = {(x["dtype"], x["m"], x["n"], x["k"]): x["host_us"] for x in rows if "host_us" in x}
    head = provenance(
        f"Device: {device}.", date, commit, f"`{command}`.",
        "CUDA events on kiln's stream (cuBLAS on the same stream) around batches of back-to-back calls, each batch "
        "queued whole behind a gate so that the times are the GPU's; median of 7 batches after warm-up, the calls "
        "taking turns. Operands uniform in [-1, 1). `ratio`: kiln's TFLOP/s over cuBLAS's (`cublasGemmEx`); "
        "`bias+relu vs cuBLASLt`: kiln's fused epilogue against cuBLASLt's RELU_BIAS epilogue; `+bsum over plain`: "
        "bias + ReLU + row sums over the plain product; `host us a call`: the host's time to issue a call (kiln, "
        "cuBLAS).")
    summary = []
    for dt in dict.fromkeys(x["dtype"] for x in products):
        mine = [x for x in products if x["dtype"] == dt]
        ratio = lambda x: x["cublas_ms"] / x["kiln_ms"]
        small = [ratio(x) for x in mine if x["n"] <= 128]
        squares = ", ".join(f"{x['m']}^3 {ratio(x):.2f}" for x in mine if x["m"] == x["n"] == x["k"] and x["m"] >= 4096)
        summary.append(f"{dt}: geometric mean {geomean([ratio(x) for x in mine]):.2f}"
                       + (f", N <= 128 {geomean(small):.2f}" if small else "") + (f", {squares}" if squares else ""))
    out = [GEMM_BEGIN, ""] + head + ["", "kiln over cuBLAS (time ratio) by dtype: " + "; ".join(summary) + ".", "",
                                     f"Every product of the run: [{GEMM_SHAPES}]({GEMM_SHAPES}).", "", GEMM_END]
    shapes = ["# GEMM beside cuBLAS, product by product", "",
              "Written by `python3 examples/benchmarks/perf_tables.py gemm.json` with the GEMM section of "
              "PERFORMANCE.md, from the same run.", ""] + head + ["",
              "| dtype | M x N x K | op | GPU: kiln TFLOP/s | cuBLAS | ratio | bias+relu vs cuBLASLt | +bsum over plain "
              "| host us a call: kiln, cuBLAS | kernel chosen |",
              "|---|---|---|---:|---:|---:|---:|---:|---|---|"]
    for x in products:
        h = host.get((x["dtype"], x["m"], x["n"], x["k"]))
        lt = x["cublaslt_bias_relu_ms"]   # -1 where cuBLASLt had no such epilogue
        shapes.append(f"| {x['dtype']} | {x['m']}x{x['n']}x{x['k']} | {x['op']} | {x['kiln_tflops']:.1f} | "
                      f"{x['cublas_tflops']:.1f} | {x['cublas_ms'] / x['kiln_ms']:.2f} | "
                      + (f"{lt / x['kiln_bias_relu_ms']:.2f}" if lt > 0 else "n/a") + " | "
                      f"{100 * (x['kiln_bias_relu_bsum_ms'] / x['kiln_ms'] - 1):+.1f}% | "
                      + (f"{h[0]:.1f}, {h[3]:.1f}" if h else "") + f" | `{x['kernel']}` |")
    return "\n".join(out), "\n".join(shapes) + "\n"


def render_python(runs, command, date, commit):
    """python_dispatch.py's runs: per expression the median of the runs, and their range."""
    out = [PY_BEGIN, ""] + provenance(
        f"Device: {runs[0]['device']}.", date, commit, f"`{command}`, {len(runs)} run(s).",
        f"128x32 float32 (the kernels take a few µs, so the host side is what is measured); each expression "
        f"assigned {runs[0]['calls']} times after warm-up, wall time per call including one final `synchronize()`, "
        "median of 7 repetitions; below, the median of the runs and their range. PyTorch runs the same expressions "
        "op by op on the same GPU in the same process; its per-op figure is its per-expression time over the ops "
        "it launches.") + ["",
           "| expression (Python-level ops) | kiln µs per expression | torch µs per expression | torch ops "
           "| torch µs per op |", "| --- | ---: | ---: | ---: | ---: |"]
    for row in runs[0]["rows"]:
        same = [next(x for x in r["rows"] if x["expr"] == row["expr"]) for r in runs]
        kiln = [x["kiln_us_per_expr"] for x in same]
        cells = [f"{row['expr']} ({row['kiln_python_ops']})",
                 f"{statistics.median(kiln):.2f} ({min(kiln):.2f}-{max(kiln):.2f})"]
        if all("torch_us_per_expr" in x for x in same):
            mid = statistics.median(x["torch_us_per_expr"] for x in same)
            cells += [f"{mid:.2f}", str(row["torch_ops"]), f"{mid / row['torch_ops']:.2f}"]
        else:
            cells += ["", "", ""]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", PY_END]
    return "\n".join(out)


def load_json(path):
    """One JSON document, or JSON lines (kiln-bench-gemm) as a list."""
    with open(path) as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    # A one-line file of kiln-bench-gemm (its rows have no "cases"/"rows" key) is still a list.
    return [doc] if isinstance(doc, dict) and ("kiln_ms" in doc or "host_us_per_call" in doc) else doc


VS_TORCH_CASES = "vs_torch_cases.md"   # beside the document: every case of the vs_torch run


def render(r, command):
    """The vs_torch section (summary, and the cases below 0.95x torch.compile) and the document of
    every case it links to."""
    cases = r["cases"]
    bw = r["copy_gbs"]
    bw_text = (f"measured in the run: {bw:.0f} GB/s" if not isinstance(bw, list) else
               f"measured in each of {len(bw)} runs of the suite's shapes: " + ", ".join(f"{x:.0f}" for x in bw) +
               " GB/s (each case's % of copy against its own run's)")
    head = provenance(
        f"Device: {r['device']}; copy bandwidth {bw_text} (PyTorch "
        "device-to-device copy of 1 GiB, events).", r["date"], r["commit"], f"`{command}`.",
        f"{r['method']}. Bytes: every input read once and every output written once. Every result checked "
        "against float64 (`err`: largest error relative to the result's scale).", f" PyTorch {r['torch']}.")
    out = [BEGIN, ""] + head + [""]
    ratios = [c["vs_compile"] for c in cases if "vs_compile" in c]
    if ratios:
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        worst = min((c for c in cases if "vs_compile" in c), key=lambda c: c["vs_compile"])
        by = ", ".join(f"{d} {v:.2f}x" for d, v in r.get("geomean_vs_compile_by_dtype", {}).items())
        big = [c for c in cases if c["bytes"] >= 64 << 20]
        out += [f"Geometric mean of torch.compile ms / kiln ms: **{gm:.2f}x** ({by}); ahead (>= 1.0x) in "
                f"{sum(x >= 1.0 for x in ratios)} of {len(ratios)}, below 0.95x in {sum(x < 0.95 for x in ratios)}; "
                f"worst {worst['case']} {worst['dtype']} {worst['shape'][0]}x{worst['shape'][1]} "
                f"{worst['vs_compile']:.2f}x. Cases moving >= 64 MiB at >= 90% of the copy bandwidth: "
                f"{sum(c['kiln_pct_copy'] >= 90 for c in big)} of {len(big)}.", ""]
    has_eager = any("eager_ms" in c for c in cases)
    table_head = "| case | dtype | shape | kiln ms | " + ("eager ms | " if has_eager else "") + \
                 "torch.compile ms | kiln GB/s | % of copy | vs torch.compile | err |"
    table_head = [table_head, "|" + " --- |" * 3 + " ---: |" * (table_head.count("|") - 4)]

    def row(c):
        cells = [c["case"], c["dtype"], f"{c['shape'][0]}x{c['shape'][1]}", f"{c['kiln_ms']:.4f}"]
        if has_eager:
            cells.append(f"{c['eager_ms']:.4f}" if "eager_ms" in c else "")
        cells += [f"{c['compile_ms']:.4f}" if "compile_ms" in c else "", f"{c['kiln_gbs']:.0f}",
                  f"{c['kiln_pct_copy']:.0f}%", f"{c['vs_compile']:.2f}x" if "vs_compile" in c else "",
                  f"{c['error']['kiln']:.1e}"]
        return "| " + " | ".join(cells) + " |"

    misses = sorted((c for c in cases if c.get("vs_compile", 1.0) < 0.95), key=lambda c: c["vs_compile"])
    if misses:
        out += ["The cases below 0.95x torch.compile, slowest first:", ""] + table_head + [row(c) for c in misses] + [""]
    out += [f"Every case of the run: [{VS_TORCH_CASES}]({VS_TORCH_CASES}).", "", END]
    every = ["# kiln beside PyTorch, case by case", "",
             "Written by `python3 examples/benchmarks/perf_tables.py vs_torch.json` with the fused-expression "
             "section of PERFORMANCE.md, from the same run.", ""] + head + [""] + table_head + [row(c) for c in cases]
    return "\n".join(out), "\n".join(every) + "\n"


CONV_LAYERS = "conv_layers.md"   # beside the document: the per-layer rows of the convolution run


def name_provenance(r, runs, rows, keys=("date", "commit")):
    """Each run's date and commit (`keys`), where the runs differ in them, with what they ran: the
    networks (`rows(run)`: its timed rows; "checks" where it timed none), with the dtype where a
    network's dtypes ran at different ones."""
    for key in keys:
        values = list(dict.fromkeys(x[key] for x in runs))
        split = {n for n in {c["net"] for x in runs for c in rows(x)}
                 if len({x[key] for x in runs for c in rows(x) if c["net"] == n}) > 1}
        label = lambda c: f"{c['net']} {c['dtype']}" if c["net"] in split else c["net"]
        if len(values) > 1:
            ran = {v: ", ".join(dict.fromkeys(label(c) for x in runs if x[key] == v for c in rows(x))) or "checks"
                   for v in values}
            r[key] = "; ".join(f"{v} ({ran[v]})" for v in values)


def merge_vs_torch_runs(runs):
    """Several vs_torch.py runs of one commit on one device (the suite's shapes split between them)
    as one: their cases in order, each case's % of copy against its own run's bandwidth, the
    geometric means recomputed over every case. None where the device, commit, versions or method
    differ, or where a case ran twice."""
    same = ("device", "commit", "torch", "kiln", "method")
    if any(x.get(k) != runs[0].get(k) for x in runs for k in same):
        return None
    r = dict(runs[0])
    r["cases"] = [c for x in runs for c in x["cases"]]
    keys = [(c["case"], c["dtype"], tuple(c["shape"])) for c in r["cases"]]
    if len(set(keys)) != len(keys):
        return None
    r["copy_gbs"] = [x["copy_gbs"] for x in runs]
    r["date"] = max(x["date"] for x in runs)
    by = {}
    for c in r["cases"]:
        if "vs_compile" in c:
            by.setdefault(c["dtype"], []).append(c["vs_compile"])
    r["geomean_vs_compile_by_dtype"] = {d: math.exp(statistics.fmean(map(math.log, v))) for d, v in by.items()}
    return r


def merge_conv_runs(runs):
    """Several conv.py runs (one per network, say) on one device as one: their layers and summaries
    in order, the range of the peaks they measured, and each run's date and commit with the
    networks it ran where they differ. None where the device, versions or method differ."""
    same = ("device", "torch", "cudnn", "kiln", "method")
    if any(x.get(k) != runs[0].get(k) for x in runs for k in same):
        return None
    r = dict(runs[0])
    r["layers"] = [c for x in runs for c in x["layers"]]
    r["summary"] = [sm for x in runs for sm in x["summary"]]
    r["peak_tflops"] = [min(x["peak_tflops"] for x in runs), max(x["peak_tflops"] for x in runs)]
    name_provenance(r, runs, lambda x: x["layers"])
    return r


def merge_convnets_runs(runs):
    """Several convnets.py runs (one per network, say) on one device as one: their checks,
    networks and layers in order, the range of their dates, and each run's commit with the
    networks it ran where they differ. None where the device, versions or method differ."""
    same = ("device", "torch", "cudnn", "kiln", "method")
    if any(x.get(k) != runs[0].get(k) for x in runs for k in same):
        return None
    r = dict(runs[0])
    for key in ("networks", "layers"):
        r[key] = [c for x in runs for c in x.get(key, [])]
    checks = {}   # a network checked by several runs: the last run's check
    for x in runs:
        for c in x.get("checks", []):
            checks[c["net"]] = c
    r["checks"] = list(checks.values())
    dates = sorted(set(x["date"] for x in runs))
    r["date"] = " to ".join([dates[0], dates[-1]] if len(dates) > 1 else dates)
    name_provenance(r, runs, lambda x: x.get("networks", []), keys=("commit",))
    return r


def render_conv(r, command):
    """The convolution section (per-network summary) and the per-layer document it links to."""
    peak = r["peak_tflops"]
    peak = (f"in the run: {peak:.0f} TFLOP/s" if not isinstance(peak, list) else
            f"in each of the runs merged here: {peak[0]:.0f}-{peak[1]:.0f} TFLOP/s")
    head = provenance(
        f"Device: {r['device']}; 16-bit dense peak as cuBLAS reaches it (8192^3 float16 matmul) {peak}.",
        r["date"], r["commit"], f"`{command}`.",
        f"{r['method']}. `err`: kiln's largest error relative to the largest float32 cuDNN result.",
        f" PyTorch {r['torch']}, cuDNN {r['cudnn']}.")
    out = [CONV_BEGIN, ""] + head + [""]
    fused = any("fused_median" in sm for sm in r["summary"])
    pct = lambda v: f"{100 * v:+.1f}%"
    out += ["| net | dtype | fprop | bprop | update | network sum | worst layer |" +
            (" fused over plain fprop |" if fused else ""), "| --- | --- |" + " ---: |" * (6 if fused else 5)]
    for sm in r["summary"]:
        out.append(f"| {sm['net']} | {sm['dtype']} | {sm.get('fprop', 0):.2f}x | {sm.get('bprop', 0):.2f}x | "
                   f"{sm.get('update', 0):.2f}x | {sm['sum']:.2f}x | {sm['worst']:.2f}x |" +
                   ((f" {pct(sm['fused_median'])}, {pct(sm['fused_worst'])} |" if "fused_median" in sm else " - |")
                    if fused else ""))
    out += ["", "cuDNN ms / kiln ms (> 1: kiln faster): geometric mean over the network's layers per op; the "
            "network's time summed over layers times their count in it; its slowest layer" +
            ("; kiln's fprop with bias, ReLU and bsum over its plain fprop, median and worst layer" if fused else "") +
            f". Every layer of the run: [{CONV_LAYERS}]({CONV_LAYERS}).", "", CONV_END]
    layers = ["# Convolution beside cuDNN, layer by layer", "",
              "Written by `python3 examples/benchmarks/perf_tables.py conv.json` with the convolution section of "
              "PERFORMANCE.md, from the same run.", ""] + head + ["",
              "| net | layer | N C K | image | filter/pad/stride | dtype | op | kiln ms | cuDNN ms | kiln TFLOP/s | "
              "% of peak | vs cuDNN | err |" + (" fused over plain |" if fused else "") + " kiln path |",
              "| --- | --- | --- | --- | --- | --- | --- |" + " ---: |" * (7 if fused else 6) + " --- |"]
    for c in r["layers"]:
        layers.append(f"| {c['net']} | {c['layer']} | {c['N']} {c['C']} {c['K']} | {c['HW']}x{c['HW']} | "
                      f"{c['RS']}x{c['RS']}/{c['pad']}/{c['stride']} | {c['dtype']} | {c['op']} | {c['kiln_ms']:.3f} | "
                      f"{c['cudnn_ms']:.3f} | {c['kiln_tflops']:.0f} | {c['pct_peak']:.0f}% | {c['vs_cudnn']:.2f}x | "
                      f"{c['err']:.1e} |" +
                      ((f" {pct(c['fused_over_plain'])} |" if "fused_over_plain" in c else " - |") if fused else "") +
                      f" {c['kiln_path']}" +
                      (f" (fused: {c['fused_path']})" if c.get("fused_path", c["kiln_path"]) != c["kiln_path"] else "") +
                      " |")
    return "\n".join(out), "\n".join(layers) + "\n"


CONVNETS_LAYERS = "convnets_layers.md"   # beside the document: the per-layer breakdown of the networks' run


def render_convnets(r, command):
    """The whole-network section (kiln.layers beside PyTorch eager and torch.compile, and the float32
    checks) and, where the run has it, the per-layer document it links to."""
    head = provenance(f"Device: {r['device']}. PyTorch {r['torch']}, cuDNN {r['cudnn']}.", r["date"], r["commit"],
                      f"`{command}`.", f"{r['method']}.")
    out = [CONVNETS_BEGIN, ""] + head + ["", "| net | dtype | pass | N | kiln ms | eager ms | torch.compile ms | "
                                         "vs eager | vs compile | kiln images/s |", "| --- | --- | --- |" + " ---: |" * 7]
    for n in r["networks"]:
        compiled = f"{n['compile_ms']:.2f}" if n.get("compile_ms") else "-"
        vs_c = f"{n['vs_compile']:.2f}x" if n.get("vs_compile") else "-"
        out.append(f"| {n['net']} | {n['dtype']} | {n['pass']} | {n['N']} | {n['kiln_ms']:.2f} | {n['eager_ms']:.2f} | "
                   f"{compiled} | {n['vs_eager']:.2f}x | {vs_c} | {n['N'] / n['kiln_ms'] * 1e3:.0f} |")
    out += ["", "PyTorch ms / kiln ms (> 1: kiln faster)."]
    old_checks = [c for c in r["checks"] if "kiln_logits" not in c]   # runs before the float64 reference
    if old_checks:
        out += ["", "One float32 iteration of each network against its PyTorch twin from the same weights and input "
                "(largest error relative to PyTorch's largest value): " +
                "; ".join(f"{c['net']} (N={c['N']}) logits {c['logits']:.1e}, gradients {c['grads']:.1e}"
                          for c in old_checks) + "."]
    if any("kiln_logits" in c for c in r["checks"]):
        out += ["", "One iteration of each network in float32, kiln and PyTorch alike, against PyTorch in float64 from "
                "the same weights and input: the logits' error and the worst parameter gradient's, normwise "
                "(|a - ref| / |ref|), and the worst over the gradients by their largest element (max |a - ref| / "
                "max |ref|), where a single ReLU input rounded to the other side of zero shows in full.", "",
                "| net | N | logits kiln | logits PyTorch | gradient kiln | gradient PyTorch | largest element kiln | "
                "largest element PyTorch |", "| --- | ---: |" + " ---: |" * 6]
        for c in (c for c in r["checks"] if "kiln_logits" in c):
            out.append(f"| {c['net']} | {c['N']} | {c['kiln_logits']:.1e} | {c['torch32_logits']:.1e} | "
                       f"{c['kiln_grads']:.1e} | {c['torch32_grads']:.1e} | {c['kiln_grads_max']:.1e} | "
                       f"{c['torch32_grads_max']:.1e} |")
    layers = None
    if r.get("layers"):
        out += ["", f"Each layer's fprop and bprop timed alone: [{CONVNETS_LAYERS}]({CONVNETS_LAYERS})."]
        layers = ["# Whole networks beside PyTorch, layer by layer", "",
                  "Written by `python3 examples/benchmarks/perf_tables.py convnets.json` with the network section of "
                  "PERFORMANCE.md, from the same run: each top-level layer's fprop and bprop timed alone, kiln beside "
                  "the same PyTorch module in eager mode (its bprop: forward and backward less forward).", ""] + head + [
                  "", "| net | dtype | # | layer | output | kiln fprop ms | eager fprop ms | kiln bprop ms | eager bprop ms |",
                  "| --- | --- | ---: | --- | --- |" + " ---: |" * 4]
        for c in r["layers"]:
            layers.append(f"| {c['net']} | {c['dtype']} | {c['index']} | {c['layer']} | {'x'.join(map(str, c['shape']))} | "
                          f"{c['kiln_fprop_ms']:.3f} | {c['eager_fprop_ms']:.3f} | {c['kiln_bprop_ms']:.3f} | "
                          f"{c['eager_bprop_ms']:.3f} |")
        layers = "\n".join(layers) + "\n"
    return "\n".join(out + ["", CONVNETS_END]), layers


def render_collectives(r, command):
    sm, sc = r["summary"], r["scaling"]
    out = [COLL_BEGIN, ""] + provenance(
        f"Device: {r['gpus']} x {r['device']}; GPU 0 -> GPU 1 copy measured in the run: {sm['link_gbs']:.0f} GB/s.",
        r["date"], r["commit"], f"`{command}`.",
        "in-place sum all-reduce of random values, one process per GPU; warm-up, then 7 batches of back-to-back calls "
        "(as many on every rank) for each side, kiln's and torch.distributed's batches interleaved in the same "
        "processes, each timed on the host clock up to a synchronize, the median batch. Bus bandwidth = 2 (n - 1) / n x bytes / time. Floor: "
        "2 (n - 1) / n x bytes over the measured copy bandwidth.",
        f" kiln's NCCL {r['nccl_version'] // 10000}.{r['nccl_version'] // 100 % 100}.{r['nccl_version'] % 100}, "
        f"PyTorch's NCCL {r['torch_nccl_version']}.") + [""]
    ratio = sm["min_ratio_ge_64mib"]
    out += [f"Smallest kiln / torch.distributed bus-bandwidth ratio at >= 64 MiB: "
            f"{'n/a' if ratio is None else f'{ratio:.3f}'} (target >= 0.95). Data-parallel SGD step of "
            f"examples/data_parallel.py's network, {sc['per_gpu_batch']} images per GPU: one GPU {sc['one_gpu_ms']:.2f} ms, "
            f"{sc['gpus']} GPUs {sc['n_gpu_ms']:.2f} ms, scaling efficiency {sc['efficiency']:.3f} (target >= 0.90).", "",
            "| dtype | bytes | kiln ms | torch ms | kiln GB/s | torch GB/s | kiln / torch | floor ms | kiln / floor |",
            "| --- |" + " ---: |" * 8]
    for c in r["allreduce"]:
        floor = c.get("floor_ms")
        out.append(f"| {c['dtype']} | {c['bytes']} | {c['kiln_ms']:.4f} | {c['torch_ms']:.4f} | {c['kiln_busbw_gbs']:.1f} | "
                   f"{c['torch_busbw_gbs']:.1f} | {c['ratio']:.3f} | {floor or 0:.4f} | "
                   f"{(c['kiln_ms'] / floor) if floor else 0:.2f} |")
    out += ["", COLL_END]
    return "\n".join(out)


def render_hist(r, command):
    out = [HIST_BEGIN, ""] + provenance(
        f"Device: {r['device']}; copy bandwidth measured in the run: {r['copy_gbs']:.0f} GB/s.", r["date"], r["commit"],
        f"`{command}`.",
        "each call uncounted (hist_named off), counted as hist_named counts it (on, the output tagged: in the "
        "kernels' store path, or after the call where docs/neon.md says so), and counted by a second pass (the call, then kiln.hist of its result), on random data; "
        "warm-up, then 7 batches of back-to-back calls timed on the host clock up to a synchronize, the median batch. "
        "Floor: the bytes an assignment reads and writes over the copy bandwidth; a product's flops over the dtype's "
        "dense peak. Counts: hist_named's equal the second pass's.") + [""]
    out += ["| call | dtype | shape | floor ms | off ms | hist_named ms | second pass ms | named / off | "
            "pass / off | counts |", "| --- | --- | --- |" + " ---: |" * 6 + " --- |"]
    for c in r["hist"]:
        out.append(f"| {c['case']} | {c['dtype']} | {'x'.join(map(str, c['shape']))} | {c['floor_ms']:.4f} | "
                   f"{c['off_ms']:.4f} | {c['store_ms']:.4f} | {c['pass_ms']:.4f} | {c['store_over_off']:.2f}x | "
                   f"{c['pass_over_off']:.2f}x | {'equal' if c['counts_match'] else 'DIFFER'} |")
    out += ["", HIST_END]
    return "\n".join(out)


def render_layers(r, command):
    """layers.py: each memory-bound layer beside PyTorch, its GB/s against the run's copy bandwidth."""
    out = [LAYERS_BEGIN, ""] + provenance(
        f"Device: {r['device']}; copy bandwidth measured in the run: {r['copy_gbs']:.0f} GB/s (PyTorch device-to-device "
        f"copy of 1 GiB, events). PyTorch {r['torch']}, cuDNN {r['cudnn']}.", r["date"], r["commit"], f"`{command}`.",
        f"{r['method']}. Bytes: the tensors each side must read and write, once each.")
    cases = r["cases"]
    targeted = [c for c in cases if c.get("targeted", True)]
    if targeted:
        met = [c for c in targeted if c["pct_copy"] >= LAYERS_TARGET_PCT]
        low = min(targeted, key=lambda c: c["pct_copy"])
        out += ["", f"The forward passes that read their input once (pooling, LRN, batch norm's normalisation) at >= "
                f"{LAYERS_TARGET_PCT:g}% of the copy bandwidth: {len(met)} of {len(targeted)}; lowest {low['layer']} "
                f"{low['pass']} {low['dtype']} at {low['pct_copy']:.0f}%."]
    if cases:
        out += ["", f"Geometric mean of PyTorch ms / kiln ms over every case: "
                f"{math.exp(statistics.fmean(math.log(c['vs_torch']) for c in cases)):.2f}x."]
    out += ["", "| layer | pass | dtype | input | kiln ms | PyTorch ms | kiln GB/s | % of copy | vs PyTorch | err |",
            "| --- | --- | --- | --- |" + " ---: |" * 6]
    for c in cases:
        err = f"{c['err']:.1e}" if c.get("err") is not None else "-"
        out.append(f"| {c['layer']} | {c['pass']} | {c['dtype']} | {'x'.join(map(str, c['shape']))} | {c['kiln_ms']:.4f} | "
                   f"{c['torch_ms']:.4f} | {c['kiln_gbs']:.0f} | {c['pct_copy']:.0f}% | {c['vs_torch']:.2f}x | {err} |")
    return "\n".join(out + ["", LAYERS_END])


def render_torch_train(r, command):
    """examples/python/torch_train.py: one model trained with kiln.torch's modules and in PyTorch."""
    out = [TRAIN_BEGIN, ""] + provenance(
        f"Device: {r['device']} (kiln's {r['backend']} backend); PyTorch {r['torch']}.", r["date"], r["commit"],
        f"`{command}`.", f"{r['method']}. Loss: the largest relative difference from PyTorch's curve over the steps, "
        "beside that of the same PyTorch model on channels_last tensors (the yardstick it is held to, times four).")
    out += ["", "| batch | mode | kiln ms/step | PyTorch ms/step | PyTorch / kiln | kiln loss diff | channels_last "
            "loss diff | final loss kiln / PyTorch |", "| ---: | --- |" + " ---: |" * 6]
    for c in r["runs"]:
        out.append(f"| {c['batch']} | {c['mode']} | {c['kiln_ms']:.3f} | {c['torch_ms']:.3f} | "
                   f"{c['torch_ms'] / c['kiln_ms']:.2f}x | {c['max_rel_loss_diff']:.1e} | "
                   f"{c['channels_last_max_rel_loss_diff']:.1e} | {c['kiln_loss'][-1]:.4f} / {c['torch_loss'][-1]:.4f} |")
    return "\n".join(out + ["", TRAIN_END])


def replace_section(doc, begin, end, table, heading):
    if begin in doc and end in doc:
        return re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: table, doc, flags=re.S)
    return doc.rstrip("\n") + f"\n\n## {heading}\n\n" + table + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="+", help="one benchmark's JSON (python_dispatch.py, conv.py, convnets.py: one or more runs)")
    ap.add_argument("--doc", default="docs/PERFORMANCE.md")
    ap.add_argument("--command", default=None)
    ap.add_argument("--date", default=None, help="kiln-bench-fusion's and kiln-bench-cpu-fusion's JSON: the run's date")
    ap.add_argument("--commit", default=None, help="the same: the commit it ran")
    ap.add_argument("--device", default=None, help="kiln-bench-gemm's JSON: the GPU it ran on")
    args = ap.parse_args()
    runs = [load_json(p) for p in args.json]
    r = runs[0]
    python = isinstance(r, dict) and "calls" in r and "rows" in r
    if len(runs) > 1 and all(isinstance(x, dict) and "layers" in x and "networks" not in x for x in runs):
        r = merge_conv_runs(runs)
        if r is None:
            print("perf_tables: the conv.py runs differ in device, versions or method", file=sys.stderr)
            return 2
    elif len(runs) > 1 and all(isinstance(x, dict) and "networks" in x for x in runs):
        r = merge_convnets_runs(runs)
        if r is None:
            print("perf_tables: the convnets.py runs differ in device, versions or method", file=sys.stderr)
            return 2
    elif len(runs) > 1 and all(isinstance(x, dict) and "cases" in x and "copy_gbs" in x and "benchmark" not in x
                               for x in runs):
        r = merge_vs_torch_runs(runs)
        if r is None:
            print("perf_tables: the vs_torch.py runs differ in device, commit, versions or method, or repeat a case",
                  file=sys.stderr)
            return 2
    elif len(runs) > 1 and not python:
        print("perf_tables: several JSON files are taken from python_dispatch.py, vs_torch.py, conv.py and convnets.py only "
              "(one run of the others, layers.py's included)",
              file=sys.stderr)
        return 2
    with open(args.doc) as f:
        doc = f.read()
    gemm = isinstance(r, list)
    if (gemm or python or "dispatch_us" in r or "hardware_threads" in r) and (not args.date or not args.commit):
        print("perf_tables: this benchmark's JSON records no date or commit: give --date and --commit",
              file=sys.stderr)
        return 2
    if gemm and not args.device:
        print("perf_tables: kiln-bench-gemm's JSON records no device: give --device", file=sys.stderr)
        return 2
    if gemm:
        table, shapes = render_gemm(r, args.command or "kiln-bench-gemm --queued gemm.json", args.date, args.commit,
                                    args.device)
        doc = replace_section(doc, GEMM_BEGIN, GEMM_END, table,
                              "GEMM: kiln's kernels beside cuBLAS/cuBLASLt (examples/benchmarks/gemm.cpp)")
        with open(os.path.join(os.path.dirname(os.path.abspath(args.doc)), GEMM_SHAPES), "w") as f:
            f.write(shapes)
    elif python:
        table = render_python(runs, args.command or "python examples/benchmarks/python_dispatch.py --json out.json",
                              args.date, args.commit)
        doc = replace_section(doc, PY_BEGIN, PY_END, table,
                              "Python: cost of one cached fused expression (examples/benchmarks/python_dispatch.py)")
    elif isinstance(r, dict) and r.get("benchmark") == "layers":
        table = render_layers(r, args.command or "python3 examples/benchmarks/layers.py --json layers.json")
        doc = replace_section(doc, LAYERS_BEGIN, LAYERS_END, table,
                              "Memory-bound layers beside PyTorch (examples/benchmarks/layers.py)")
    elif isinstance(r, dict) and r.get("benchmark") == "torch_train":
        table = render_torch_train(r, args.command or "python3 examples/python/torch_train.py --json torch_train.json")
        doc = replace_section(doc, TRAIN_BEGIN, TRAIN_END, table,
                              "Training through kiln.torch beside PyTorch (examples/python/torch_train.py)")
    elif "allreduce" in r:
        table = render_collectives(r, args.command or "python -m kiln.distributed --nproc 2 "
                                   "examples/benchmarks/collectives.py --json collectives.json")
        doc = replace_section(doc, COLL_BEGIN, COLL_END, table,
                              "Collectives beside torch.distributed (examples/benchmarks/collectives.py)")
    elif "hist" in r:
        table = render_hist(r, args.command or "python3 examples/benchmarks/hist_cost.py --json hist_cost.json")
        doc = replace_section(doc, HIST_BEGIN, HIST_END, table,
                              "Numerics histograms of named tensors (examples/benchmarks/hist_cost.py)")
    elif "networks" in r:
        table, layers = render_convnets(r, args.command or "python3 examples/benchmarks/convnets.py --json convnets.json")
        doc = replace_section(doc, CONVNETS_BEGIN, CONVNETS_END, table,
                              "Whole networks beside PyTorch (examples/benchmarks/convnets.py)")
        if layers:
            with open(os.path.join(os.path.dirname(os.path.abspath(args.doc)), CONVNETS_LAYERS), "w") as f:
                f.write(layers)
    elif "layers" in r:
        table, layers = render_conv(r, args.command or "python3 examples/benchmarks/conv.py --json conv.json")
        doc = replace_section(doc, CONV_BEGIN, CONV_END, table,
                              "Convolution beside cuDNN (examples/benchmarks/conv.py)")
        with open(os.path.join(os.path.dirname(os.path.abspath(args.doc)), CONV_LAYERS), "w") as f:
            f.write(layers)
    elif "hardware_threads" in r:
        table = render_cpu(r, args.command or "kiln-bench-cpu-fusion cpu_fusion.json", args.date, args.commit)
        doc = replace_section(doc, CPU_BEGIN, CPU_END, table,
                              "CPU backend: fused expressions (examples/benchmarks/cpu_fusion.cpp)")
    elif "dispatch_us" in r:
        table = render_fusion(r, args.command or "kiln-bench-fusion fusion.json", args.date, args.commit)
        doc = replace_section(doc, FUSION_BEGIN, FUSION_END, table,
                              "CUDA backend: fused expressions and latency (examples/benchmarks/fusion.cpp)")
    else:
        table, every = render(r, args.command or "python3 examples/benchmarks/vs_torch.py --json vs_torch.json")
        doc = replace_section(doc, BEGIN, END, table,
                              "CUDA backend beside PyTorch: fused expressions (examples/benchmarks/vs_torch.py)")
        with open(os.path.join(os.path.dirname(os.path.abspath(args.doc)), VS_TORCH_CASES), "w") as f:
            f.write(every)
    with open(args.doc, "w") as f:
        f.write(doc)
    count = sum("kiln_ms" in x for x in r) if gemm else len(
        r["rows"] if python else r["runs"] if "runs" in r else r["networks"] if "networks" in r else r["layers"] if "layers" in r
        else r["allreduce"] if "allreduce" in r
        else r["hist"] if "hist" in r else r["cases"])
    print(f"{args.doc}: {count} {'products' if gemm else 'cases'} from {', '.join(args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
