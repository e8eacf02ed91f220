"""examples/benchmarks: vs_torch.py's error measure and perf_tables.py's rewrite of the document.

No GPU or PyTorch needed: the table writer reads a JSON written here, and vs_torch.py without
PyTorch says so and exits 0.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BENCH = os.path.join(ROOT, "examples", "benchmarks")
sys.path.insert(0, BENCH)

import perf_tables  # noqa: E402


def perf_tables_cli(*args):
    """perf_tables.py run as the command line runs it, on these arguments."""
    return subprocess.run([sys.executable, os.path.join(BENCH, "perf_tables.py"), *map(str, args)],
                          capture_output=True, text=True)


def run_without_pytorch(module):
    """A benchmark's main() where PyTorch cannot be imported: its exit status and output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", f"import sys; sys.modules['torch'] = None; sys.argv = ['{module}.py'];"
                           f"sys.path.insert(0, {BENCH!r}); import {module}; sys.exit({module}.main())"],
                          capture_output=True, text=True, env=env)


def run_json(cases):
    return {"device": "Test GPU", "date": "2026-01-01", "commit": "abc1234", "copy_gbs": 4000.0, "torch": "2.x",
            "method": "host clock", "cases": cases,
            "geomean_vs_compile_by_dtype": {"float32": 1.5}}


def case(name, ms, compile_ms, nbytes=128 << 20):
    return {"case": name, "dtype": "float32", "shape": [4096, 8192], "kiln_ms": ms, "compile_ms": compile_ms,
            "vs_compile": compile_ms / ms, "bytes": nbytes, "kiln_gbs": nbytes / ms / 1e6,
            "kiln_pct_copy": 100 * nbytes / ms / 1e6 / 4000, "error": {"kiln": 1e-7}}


def test_runs_of_one_commit_split_by_shape_merge_into_one_table(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n" + perf_tables.BEGIN + "\nold\n" + perf_tables.END + "\n")
    first, second = run_json([case("variance", 0.05, 0.10)]), run_json([case("softmax", 0.20, 0.10)])
    second["copy_gbs"] = 4100.0
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(second))
    assert perf_tables_cli(a, b, "--doc", doc).returncode == 0
    text = doc.read_text()
    # each run's bandwidth named; the geometric mean over both runs' cases (2.0x and 0.5x: 1.0x)
    assert "4000, 4100 GB/s" in text and "**1.00x** (float32 1.00x)" in text
    assert "| softmax | float32 | 4096x8192 | 0.2000 |" in text
    every = (tmp_path / "vs_torch_cases.md").read_text()
    assert "| variance |" in every and "| softmax |" in every
    # another commit, or a case run twice: refused, the document left as it was
    second["commit"] = "def5678"
    b.write_text(json.dumps(second))
    r = perf_tables_cli(a, b, "--doc", doc)
    assert r.returncode == 2 and "differ in device, commit" in r.stderr
    b.write_text(json.dumps(first))
    assert perf_tables_cli(a, b, "--doc", doc).returncode == 2
    assert doc.read_text() == text


def test_the_table_replaces_what_stands_between_the_markers(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n\nbefore\n" + perf_tables.BEGIN + "\nold table\n" + perf_tables.END + "\nafter\n")
    js = tmp_path / "r.json"
    js.write_text(json.dumps(run_json([case("variance", 0.05, 0.10), case("softmax", 0.20, 0.10)])))
    subprocess.run([sys.executable, os.path.join(BENCH, "perf_tables.py"), str(js), "--doc", str(doc)], check=True,
                   capture_output=True)
    text = doc.read_text()
    assert "old table" not in text
    assert text.startswith("# Performance\n\nbefore\n") and text.rstrip().endswith("after")
    # the misses (below 0.95x) in the document, every case beside it
    assert "| softmax | float32 | 4096x8192 | 0.2000 |" in text and "| variance |" not in text
    every = (tmp_path / "vs_torch_cases.md").read_text()
    assert "| variance | float32 | 4096x8192 | 0.0500 |" in every and "| softmax | float32 | 4096x8192 | 0.2000 |" in every
    assert "Commit: abc1234" in every and "](vs_torch_cases.md)" in text
    # geometric mean of 2.0 and 0.5 is 1.0; the worst case is named
    assert "**1.00x**" in text and "worst softmax float32 4096x8192 0.50x" in text
    assert "Commit: abc1234" in text and "Test GPU" in text
    # a second run replaces the first table rather than adding one
    subprocess.run([sys.executable, os.path.join(BENCH, "perf_tables.py"), str(js), "--doc", str(doc)], check=True,
                   capture_output=True)
    assert doc.read_text().count(perf_tables.BEGIN) == 1


def test_a_document_without_markers_gets_a_section(tmp_path):
    doc = tmp_path / "P.md"
    doc.write_text("# Performance\n")
    js = tmp_path / "r.json"
    js.write_text(json.dumps(run_json([case("gelu", 0.1, 0.1)])))
    subprocess.run([sys.executable, os.path.join(BENCH, "perf_tables.py"), str(js), "--doc", str(doc)], check=True,
                   capture_output=True)
    text = doc.read_text()
    assert "## CUDA backend beside PyTorch" in text and perf_tables.BEGIN in text and perf_tables.END in text


def test_vs_torch_error_measure():
    torch = pytest.importorskip("torch")
    import vs_torch
    x = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.25, -1.0]], dtype=torch.float64)
    ref = vs_torch.variance(vs_torch.TorchOps(torch), x)
    assert vs_torch.check("variance", ref.clone(), ref, x) == 0
    assert vs_torch.check("variance", ref * (1 + 1e-3), ref, x) == pytest.approx(1e-3, rel=1e-6)
    idx = torch.tensor([[2], [0]], dtype=torch.int32)
    assert vs_torch.check("argmax", idx, None, x) == 0
    assert vs_torch.check("argmax", torch.tensor([[0], [0]]), None, x) == pytest.approx(2.0)


def test_vs_torch_without_pytorch_says_so():
    r = run_without_pytorch("vs_torch")
    assert r.returncode == 0, r.stderr
    assert "PyTorch is not importable" in r.stdout


def fusion_json():
    return {"device": "Test GPU", "copy_gbs": 4000.0, "driver_copy_gbs": 3990.0, "kiln_copy_gbs": 4000.0,
            "cases": [{"expr": "variance", "dtype": "float32", "shape": "4096x16384", "ms": 0.1, "gbs": 2684.4,
                       "pct_copy": 67.1, "max_err": 2.4e-07}],
            "dispatch_us": 4.3, "dispatch_prebuilt_us": 3.5, "launch_floor_us": 3.1,
            "launch_floor_programmatic_us": 2.5, "tiny_us": 4.5, "launch_sync_floor_us": 3.9,
            "jit": {"cold_ms": 64.6, "nvrtc_ms": 63.9, "cold_elementwise_ms": 31.2, "nvrtc_elementwise_ms": 30.8,
                    "nvrtc_floor_ms": 27.5, "disk_ms": 0.12, "memory_us": 29.3, "resized_us": 9.6,
                    "resized_host_us": 5.2, "memory_row_us": 33.1, "resized_row_us": 11.2, "disk_hits": 18}, "new_batch_compiles": 0}


def test_the_fusion_benchmark_fills_its_own_section_with_the_given_date_and_commit(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n\n" + perf_tables.BEGIN + "\nkept\n" + perf_tables.END + "\n\n" +
                   perf_tables.FUSION_BEGIN + "\nstale table\n" + perf_tables.FUSION_END + "\nafter\n")
    js = tmp_path / "fusion.json"
    js.write_text(json.dumps(fusion_json()))
    subprocess.run([sys.executable, os.path.join(BENCH, "perf_tables.py"), str(js), "--doc", str(doc),
                    "--date", "2026-01-02", "--commit", "def5678"], check=True, capture_output=True)
    text = doc.read_text()
    assert "stale table" not in text and "kept" in text and text.endswith("after\n")
    assert "Date: 2026-01-02. Commit: def5678." in text
    assert "| host dispatch of a cached expression <= 3 us | 4.30 us | not met |" in text
    assert "| tiny 128x32 batch norm end to end (assign + synchronize) <= 5 us | 4.50 us | met |" in text
    assert "| (driver floor: empty kernel launched, then synchronize) | 3.90 us |  |" in text
    assert ("| a new plan for a loaded kernel, end to end (an elementwise assignment's new shape) <= 10 us | 9.60 us "
            "| met |") in text
    assert "| (the same, until the assignment returns: the kernel launched, not waited for) | 5.20 us |  |" in text
    assert "| (an elementwise assignment's second shape, planned by the passes) | 29.30 us |  |" in text
    assert "| (a row reduction's new batch size, resized) | 11.20 us |  |" in text
    assert "| (a row reduction's new batch size, planned by the passes) | 33.10 us |  |" in text
    assert "| cold compile of a new row reduction, median of 9 <= 40 ms | 64.6 ms | not met |" in text
    assert "| (a new elementwise structure, median of 9) | 31.2 ms |  |" in text
    assert "| variance | float32 | 4096x16384 | 0.1000 | 2684 | 67.1% | 2.4e-07 |" in text


def test_the_fusion_json_without_a_date_or_commit_is_refused(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n")
    js = tmp_path / "fusion.json"
    js.write_text(json.dumps(fusion_json()))
    r = subprocess.run([sys.executable, os.path.join(BENCH, "perf_tables.py"), str(js), "--doc", str(doc)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "give --date and --commit" in r.stderr
    assert doc.read_text() == "# Performance\n"


def test_the_cpu_benchmark_fills_its_own_section_and_needs_a_date_and_commit(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n\n" + perf_tables.CPU_BEGIN + "\nstale\n" + perf_tables.CPU_END + "\nafter\n")
    js = tmp_path / "cpu_fusion.json"
    js.write_text(json.dumps({"machine": "Test CPU", "hardware_threads": 2, "method": "host clock",
                              "cases": [{"expr": "variance", "M": 1024, "N": 1024, "kiln_ms": 0.25,
                                         "unfused_ms": 6.0}]}))
    script = os.path.join(BENCH, "perf_tables.py")
    r = subprocess.run([sys.executable, script, str(js), "--doc", str(doc)], capture_output=True, text=True)
    assert r.returncode == 2 and "give --date and --commit" in r.stderr
    subprocess.run([sys.executable, script, str(js), "--doc", str(doc), "--date", "2026-01-02", "--commit", "abc1234"],
                   check=True, capture_output=True)
    text = doc.read_text()
    assert "stale" not in text and text.endswith("after\n")
    assert "- Machine: Test CPU, 2 hardware threads" in text
    assert "Date: 2026-01-02. Commit: abc1234." in text
    assert "| variance | 1024x1024 | 0.250 | 6.000 | 24.0x |" in text


def test_the_gemm_benchmark_fills_its_own_section_from_json_lines(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n\n" + perf_tables.GEMM_BEGIN + "\nstale\n" + perf_tables.GEMM_END + "\n")
    rows = [{"dtype": "f16", "m": 4096, "n": 4096, "k": 4096, "op": "nn", "kiln_ms": 0.2, "cublas_ms": 0.22,
             "kiln_bias_relu_ms": 0.2, "cublaslt_bias_relu_ms": 0.21, "kiln_bias_relu_bsum_ms": 0.21,
             "kiln_tflops": 687.2, "cublas_tflops": 624.7, "max_rel_diff": 0.0, "kernel": "kiln_gemm_x"},
            {"dtype": "f16", "m": 4096, "n": 4096, "k": 4096, "host_us": [8.0, 8.1, 8.2, 20.0]},
            {"dtype": "f16", "m": 1760, "n": 16, "k": 1760, "op": "nn", "kiln_ms": 0.004, "cublas_ms": 0.006,
             "kiln_bias_relu_ms": 0.004, "cublaslt_bias_relu_ms": 0.006, "kiln_bias_relu_bsum_ms": 0.0044,
             "kiln_tflops": 24.8, "cublas_tflops": 16.5, "max_rel_diff": 1e-4, "kernel": "kiln_gemm_y"},
            {"host_us_per_call": 5.8}]
    js = tmp_path / "gemm.json"
    js.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    script = os.path.join(BENCH, "perf_tables.py")
    base = [sys.executable, script, str(js), "--doc", str(doc)]
    r = subprocess.run(base + ["--date", "2026-01-02", "--commit", "abc1234"], capture_output=True, text=True)
    assert r.returncode == 2 and "give --device" in r.stderr
    subprocess.run(base + ["--date", "2026-01-02", "--commit", "abc1234", "--device", "Test GPU"], check=True,
                   capture_output=True)
    text = doc.read_text()
    assert "stale" not in text
    assert "- Device: Test GPU." in text and "Date: 2026-01-02. Commit: abc1234." in text
    assert "f16: geometric mean 1.28, N <= 128 1.50, 4096^3 1.10." in text
    assert "[gemm_shapes.md](gemm_shapes.md)" in text
    # Every product in the document beside it, with the same provenance.
    shapes = (tmp_path / "gemm_shapes.md").read_text()
    assert "- Device: Test GPU." in shapes and "Date: 2026-01-02. Commit: abc1234." in shapes
    assert "| f16 | 4096x4096x4096 | nn | 687.2 | 624.7 | 1.10 | 1.05 | +5.0% | 8.0, 20.0 | `kiln_gemm_x` |" in shapes
    assert "`kiln_gemm_x`" not in text


def test_the_python_benchmark_fills_its_section_with_the_median_of_its_runs(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n\n" + perf_tables.PY_BEGIN + "\nstale\n" + perf_tables.PY_END + "\n")
    paths = []
    for i, us in enumerate([10.0, 12.0, 9.0]):
        js = tmp_path / f"py{i}.json"
        js.write_text(json.dumps({"device": "Test GPU", "calls": 2000, "rows": [
            {"expr": "variance", "kiln_us_per_expr": us, "kiln_python_ops": 4, "torch_us_per_expr": 4 * us,
             "torch_ops": 4, "torch_us_per_op": us}]}))
        paths.append(str(js))
    script = os.path.join(BENCH, "perf_tables.py")
    subprocess.run([sys.executable, script, *paths, "--doc", str(doc), "--date", "2026-01-02", "--commit", "abc1234"],
                   check=True, capture_output=True)
    text = doc.read_text()
    assert "stale" not in text and "3 run(s)" in text
    assert "| variance (4) | 10.00 (9.00-12.00) | 40.00 | 4 | 10.00 |" in text


def test_the_convolution_table(tmp_path):
    layer = {"net": "vgg_a", "layer": "conv3", "dtype": "float16", "op": "fprop", "N": 64, "C": 128, "K": 256,
             "HW": 56, "RS": 3, "pad": 1, "stride": 1, "count": 1, "flops": 1.0e11, "kiln_ms": 0.5, "cudnn_ms": 0.25,
             "kiln_tflops": 200.0, "cudnn_tflops": 400.0, "vs_cudnn": 0.5, "pct_peak": 25.0, "err": 3e-4,
             "kiln_path": "implicit-gemm kiln_conv_fprop_f16_256_s4"}
    run = {"device": "Test GPU", "date": "2026-01-02", "commit": "def5678", "torch": "2.x", "cudnn": 91900,
           "kiln": "0.1", "peak_tflops": 800.0, "method": "host clock", "layers": [layer],
           "summary": [{"net": "vgg_a", "dtype": "float16", "fprop": 0.5, "sum": 0.5, "worst": 0.5}]}
    doc, js = tmp_path / "P.md", tmp_path / "conv.json"
    doc.write_text("# Performance\n")
    js.write_text(json.dumps(run))
    subprocess.run([sys.executable, os.path.join(BENCH, "perf_tables.py"), str(js), "--doc", str(doc)], check=True,
                   capture_output=True)
    text = doc.read_text()
    assert "## Convolution beside cuDNN" in text and perf_tables.CONV_BEGIN in text
    assert "| vgg_a | float16 | 0.50x |" in text and "800 TFLOP/s" in text and "Commit: def5678" in text
    assert "](conv_layers.md)" in text and "| conv3 |" not in text
    layers = (tmp_path / "conv_layers.md").read_text()   # the per-layer rows, beside the document
    assert "Commit: def5678" in layers and "800 TFLOP/s" in layers
    assert "| vgg_a | conv3 | 64 128 256 | 56x56 | 3x3/1/1 | float16 | fprop | 0.500 | 0.250 | 200 | 25% | 0.50x |" in layers
    assert "implicit-gemm kiln_conv_fprop_f16_256_s4" in layers
    assert "fused" not in text and "fused" not in layers   # (a run without the fused fprop's times)
    # With them: the median and worst per network, each fprop layer's, and "-" for the other ops.
    run["layers"] = [dict(layer, fused_ms=0.51, fused_over_plain=0.02, fused_err=1e-6), dict(layer, op="update")]
    run["summary"][0].update(fused_median=0.02, fused_worst=0.031)
    js.write_text(json.dumps(run))
    subprocess.run([sys.executable, os.path.join(BENCH, "perf_tables.py"), str(js), "--doc", str(doc)], check=True,
                   capture_output=True)
    assert "| vgg_a | float16 | 0.50x | 0.00x | 0.00x | 0.50x | 0.50x | +2.0%, +3.1% |" in doc.read_text()
    layers = (tmp_path / "conv_layers.md").read_text()
    assert "| 0.50x | 3.0e-04 | +2.0% | implicit-gemm kiln_conv_fprop_f16_256_s4 |" in layers
    assert "| update | 0.500 | 0.250 | 200 | 25% | 0.50x | 3.0e-04 | - |" in layers
    # A fused fprop that takes another kernel (a narrow layer's bsum: one tile a block) names it.
    run["layers"][0]["fused_path"] = "implicit-gemm kiln_conv_fprop_f16_64_s4"
    js.write_text(json.dumps(run))
    subprocess.run([sys.executable, os.path.join(BENCH, "perf_tables.py"), str(js), "--doc", str(doc)], check=True,
                   capture_output=True)
    assert ("| +2.0% | implicit-gemm kiln_conv_fprop_f16_256_s4 (fused: implicit-gemm kiln_conv_fprop_f16_64_s4) |"
            in (tmp_path / "conv_layers.md").read_text())


def test_the_whole_network_table(tmp_path):
    run = {"device": "Test GPU", "date": "2026-01-03", "commit": "abc4321", "torch": "2.x", "cudnn": 91900, "kiln": "0.1",
           "method": "host clock", "checks": [{"net": "resnet50", "N": 8, "kiln_logits": 2e-6, "torch32_logits": 1.8e-6,
                                                       "kiln_grads": 3e-5, "torch32_grads": 2.5e-5, "kiln_grads_max": 0.15,
                                                       "torch32_grads_max": 0.12}],
           "networks": [{"net": "resnet50", "dtype": "float16", "pass": "fprop+bprop", "N": 256, "flops": 6e12,
                         "kiln_ms": 80.0, "eager_ms": 100.0, "compile_ms": None, "vs_eager": 1.25, "vs_compile": None}],
           "layers": [{"net": "resnet50", "dtype": "float16", "index": 0, "layer": "Conv", "shape": [256, 112, 112, 64],
                       "flops": 1e11, "kiln_fprop_ms": 1.5, "eager_fprop_ms": 0.6, "kiln_bprop_ms": 3.0,
                       "eager_fwd_bwd_ms": 4.0, "eager_bprop_ms": 3.4}]}
    doc, js = tmp_path / "P.md", tmp_path / "convnets.json"
    doc.write_text("# Performance\n")
    js.write_text(json.dumps(run))
    r = perf_tables_cli(js, "--doc", doc)
    assert r.returncode == 0, r.stderr
    text = doc.read_text()
    assert "## Whole networks beside PyTorch" in text and perf_tables.CONVNETS_BEGIN in text
    assert "| resnet50 | float16 | fprop+bprop | 256 | 80.00 | 100.00 | - | 1.25x | - | 3200 |" in text
    assert "| resnet50 | 8 | 2.0e-06 | 1.8e-06 | 3.0e-05 | 2.5e-05 | 1.5e-01 | 1.2e-01 |" in text
    assert "Commit: abc4321" in text
    assert "](convnets_layers.md)" in text and perf_tables.CONV_BEGIN not in text   # not taken for conv.py's JSON
    layers = (tmp_path / "convnets_layers.md").read_text()
    assert "| resnet50 | float16 | 0 | Conv | 256x112x112x64 | 1.500 | 0.600 | 3.000 | 3.400 |" in layers


def test_convolution_runs_per_network_are_merged(tmp_path):
    def run(net, peak, commit="def5678", dtype="float16"):
        layer = {"net": net, "layer": "conv1", "dtype": dtype, "op": "fprop", "N": 8, "C": 3, "K": 64,
                 "HW": 224, "RS": 7, "pad": 3, "stride": 2, "count": 1, "flops": 1.0e10, "kiln_ms": 1.0,
                 "cudnn_ms": 0.5, "kiln_tflops": 10.0, "cudnn_tflops": 20.0, "vs_cudnn": 0.5, "pct_peak": 1.0,
                 "err": 3e-4, "kiln_path": "im2col+gemm"}
        return {"device": "Test GPU", "date": "2026-01-02", "commit": commit, "torch": "2.x", "cudnn": 91900,
                "kiln": "0.1", "peak_tflops": peak, "method": "host clock", "layers": [layer],
                "summary": [{"net": net, "dtype": dtype, "fprop": 0.5, "sum": 0.5, "worst": 0.5}]}
    doc = tmp_path / "P.md"
    doc.write_text("# Performance\n")
    files = []
    for i, (net, peak) in enumerate([("alexnet", 700.0), ("resnet50", 750.0)]):
        files.append(tmp_path / f"c{i}.json")
        files[-1].write_text(json.dumps(run(net, peak)))
    tables = os.path.join(BENCH, "perf_tables.py")
    subprocess.run([sys.executable, tables, *map(str, files), "--doc", str(doc)], check=True, capture_output=True)
    text = doc.read_text()
    assert "| alexnet | float16 |" in text and "| resnet50 | float16 |" in text and "700-750 TFLOP/s" in text
    layers = (tmp_path / "conv_layers.md").read_text()
    assert "| alexnet | conv1 |" in layers and "| resnet50 | conv1 |" in layers
    # Runs of different commits name each commit with its networks; other devices are not one table.
    files[1].write_text(json.dumps(run("resnet50", 750.0, commit="0000000")))
    subprocess.run([sys.executable, tables, *map(str, files), "--doc", str(doc)], check=True, capture_output=True)
    assert "Commit: def5678 (alexnet); 0000000 (resnet50)." in doc.read_text()
    # (with the dtype where a network's dtypes ran at different commits)
    files[1].write_text(json.dumps(run("resnet50", 750.0)))
    files.append(tmp_path / "c2.json")
    files[2].write_text(json.dumps(run("resnet50", 750.0, commit="0000000", dtype="bfloat16")))
    subprocess.run([sys.executable, tables, *map(str, files), "--doc", str(doc)], check=True, capture_output=True)
    assert "Commit: def5678 (alexnet, resnet50 float16); 0000000 (resnet50 bfloat16)." in doc.read_text()
    files.pop().unlink()
    other = run("resnet50", 750.0)
    other["device"] = "Other GPU"
    files[1].write_text(json.dumps(other))
    r = subprocess.run([sys.executable, tables, *map(str, files), "--doc", str(doc)], capture_output=True, text=True)
    assert r.returncode == 2 and "differ in device, versions or method" in r.stderr


def test_conv_benchmark_without_a_gpu_says_so():
    r = subprocess.run([sys.executable, os.path.join(BENCH, "conv.py"), "--json", os.devnull], capture_output=True,
                       text=True, env=dict(os.environ, KILN_BACKEND="cpu"), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "conv:" in r.stdout and ("not importable" in r.stdout or "skipped" in r.stdout)


def test_convnets_benchmark_without_a_gpu_says_so():
    r = subprocess.run([sys.executable, os.path.join(BENCH, "convnets.py"), "--json", os.devnull], capture_output=True,
                       text=True, env=dict(os.environ, KILN_BACKEND="cpu"), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "convnets:" in r.stdout and ("not importable" in r.stdout or "skipped" in r.stdout)


def test_convnets_benchmark_walks_every_layer_with_parameters_in_order():
    # The PyTorch twin takes kiln's parameters in this order (Residual blocks: branch, then shortcut).
    # (Loaded under a name of its own: examples/convnets.py is the module `convnets`.)
    import importlib.util
    spec = importlib.util.spec_from_file_location("convnets_benchmark", os.path.join(BENCH, "convnets.py"))
    bench = importlib.util.module_from_spec(spec)
    sys.path.insert(0, BENCH)
    try:
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(BENCH)
    import kiln
    from kiln.layers import BatchNorm, Conv, Residual
    net = bench.networks.build("resnet50", ctx=kiln.Context("cpu"), N=1, dtype=kiln.float32)
    order = [type(layer).__name__ for layer in bench.leaves(net.layers)]
    assert len(order) == 109 and order[:3] == ["Conv", "BatchNorm", "Pool"] and order[-2:] == ["Pool", "FC"]
    assert not any(isinstance(layer, Residual) for layer in bench.leaves(net.layers))
    block = net.layers[3]   # the first bottleneck: three convolutions, then the projection
    assert [type(layer) for layer in bench.leaves([block])] == [Conv, BatchNorm] * 4


def test_the_collectives_benchmark_fills_its_own_section(tmp_path):
    doc = tmp_path / "PERF.md"
    doc.write_text("# Performance\n\n" + perf_tables.COLL_BEGIN + "\nstale\n" + perf_tables.COLL_END + "\nafter\n")
    rows = [{"dtype": "float32", "bytes": b, "kiln_ms": b / 3.0e8, "torch_ms": b / 3.1e8, "kiln_busbw_gbs": 300.0,
             "torch_busbw_gbs": 310.0, "ratio": 300 / 310, "floor_ms": b / 4.0e8} for b in (1 << 20, 64 << 20, 256 << 20)]
    run = {"benchmark": "collectives", "device": "NVIDIA H200", "gpus": 2, "commit": "abc1234", "date": "2026-11-30",
           "nccl_version": 22809, "torch_nccl_version": "2.28.9", "allreduce": rows,
           "scaling": {"gpus": 2, "per_gpu_batch": 256, "one_gpu_ms": 4.0, "n_gpu_ms": 4.2, "efficiency": 4.0 / 4.2},
           "summary": {"min_ratio_ge_64mib": 300 / 310, "link_gbs": 400.0}}
    js = tmp_path / "collectives.json"
    js.write_text(json.dumps(run))
    subprocess.run([sys.executable, os.path.join(BENCH, "perf_tables.py"), str(js), "--doc", str(doc)], check=True,
                   capture_output=True)
    text = doc.read_text()
    assert "stale" not in text and text.endswith("after\n")
    assert "Device: 2 x NVIDIA H200; GPU 0 -> GPU 1 copy measured in the run: 400 GB/s." in text
    assert "Smallest kiln / torch.distributed bus-bandwidth ratio at >= 64 MiB: 0.968 (target >= 0.95)" in text
    assert "scaling efficiency 0.952 (target >= 0.90)" in text
    assert "| float32 | 67108864 | 0.2237 | 0.2165 | 300.0 | 310.0 | 0.968 | 0.1678 | 1.33 |" in text


def test_convnets_runs_merge_naming_each_commit_and_other_devices_are_refused(tmp_path):
    def run(net, commit="abc4321"):
        return {"device": "Test GPU", "date": "2026-01-03", "commit": commit, "torch": "2.x", "cudnn": 91900,
                "kiln": "0.1", "method": "host clock",
                "checks": [{"net": net, "N": 8, "kiln_logits": 1e-6, "torch32_logits": 1e-6, "kiln_grads": 2e-6,
                            "torch32_grads": 3e-6, "kiln_grads_max": 4e-6, "torch32_grads_max": 5e-6}],
                "networks": [{"net": net, "dtype": "float16", "pass": "fprop", "N": 128, "flops": 1e12, "kiln_ms": 2.0,
                              "eager_ms": 3.0, "compile_ms": 1.0, "vs_eager": 1.5, "vs_compile": 0.5}],
                "layers": []}
    doc = tmp_path / "P.md"
    doc.write_text("# Performance\n")
    files = []
    for i, (net, commit) in enumerate((("alexnet", "abc4321"), ("vgg_a", "abc4321"), ("overfeat", "fff0000"))):
        files.append(tmp_path / f"r{i}.json")
        files[-1].write_text(json.dumps(run(net, commit)))
    ok = perf_tables_cli(files[0], files[1], "--doc", doc)
    assert ok.returncode == 0, ok.stderr
    text = doc.read_text()
    assert "| alexnet | float16 | fprop | 128 | 2.00 | 3.00 | 1.00 | 1.50x | 0.50x | 64000 |" in text
    assert "| vgg_a | float16 | fprop | 128 |" in text and "| vgg_a | 8 | 1.0e-06 |" in text
    assert "Commit: abc4321." in text
    two = perf_tables_cli(files[0], files[2], "--doc", doc)
    assert two.returncode == 0, two.stderr
    assert "Commit: abc4321 (alexnet); fff0000 (overfeat)." in doc.read_text()
    other = run("overfeat")
    other["device"] = "Other GPU"
    files[2].write_text(json.dumps(other))
    bad = perf_tables_cli(files[0], files[2], "--doc", doc)
    assert bad.returncode == 2 and "differ in device, versions or method" in bad.stderr


def test_convnets_checks_merge_by_network_and_old_checks_still_render(tmp_path):
    def run(date, networks, checks):
        return {"device": "Test GPU", "date": date, "commit": "abc4321", "torch": "2.x", "cudnn": 91900, "kiln": "0.1",
                "method": "host clock", "checks": checks, "networks": networks, "layers": []}
    check = lambda v: {"net": "alexnet", "N": 8, "kiln_logits": v, "torch32_logits": v, "kiln_grads": v,
                       "torch32_grads": v, "kiln_grads_max": v, "torch32_grads_max": v}
    timed = [{"net": "alexnet", "dtype": "float16", "pass": "fprop", "N": 128, "flops": 1e12, "kiln_ms": 2.0,
              "eager_ms": 3.0, "compile_ms": None, "vs_eager": 1.5, "vs_compile": None}]
    doc = tmp_path / "P.md"
    doc.write_text("# Performance\n")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(run("2026-01-05", timed, [check(1e-6)])))
    b.write_text(json.dumps(run("2026-01-04", [], [check(2e-6)])))   # a --check-only run, a day earlier
    r = perf_tables_cli(a, b, "--doc", doc)
    assert r.returncode == 0, r.stderr
    text = doc.read_text()
    assert text.count("| alexnet | 8 |") == 1 and "| alexnet | 8 | 2.0e-06 |" in text   # the last run's check
    assert "Date: 2026-01-04 to 2026-01-05." in text
    old = tmp_path / "old.json"
    old.write_text(json.dumps(run("2026-01-03", timed, [{"net": "alexnet", "N": 8, "logits": 2e-6, "grads": 3e-5}])))
    r = perf_tables_cli(old, "--doc", doc)
    assert r.returncode == 0, r.stderr
    assert "alexnet (N=8) logits 2.0e-06, gradients 3.0e-05" in doc.read_text()


def test_the_memory_bound_layers_table(tmp_path):
    case = lambda layer, pass_, pct, vs: {"layer": layer, "pass": pass_, "dtype": "float16", "shape": [128, 56, 56, 256],
                                          "bytes": 2e8, "kiln_ms": 0.06, "torch_ms": 0.06 * vs, "kiln_gbs": 40 * pct,
                                          "pct_copy": pct, "vs_torch": vs, "err": 1e-3 if pass_ == "fprop" else None,
                                          "targeted": pass_ == "fprop"}
    run = {"benchmark": "layers", "device": "Test GPU", "date": "2026-01-06", "commit": "abc4321", "copy_gbs": 4000.0,
           "torch": "2.x", "cudnn": 91900, "method": "host clock",
           "cases": [case("max pool 3x3/2", "fprop", 90.0, 1.5), case("batch norm", "bprop", 60.0, 0.5)]}
    doc, js = tmp_path / "P.md", tmp_path / "layers.json"
    doc.write_text("# Performance\n")
    js.write_text(json.dumps(run))
    r = perf_tables_cli(js, "--doc", doc)
    assert r.returncode == 0, r.stderr
    text = doc.read_text()
    assert "## Memory-bound layers beside PyTorch (examples/benchmarks/layers.py)" in text
    assert ("The forward passes that read their input once (pooling, LRN, batch norm's normalisation) at >= 85% of "
            "the copy bandwidth: 1 of 1; lowest max pool 3x3/2 fprop float16 at 90%.") in text
    assert "Geometric mean of PyTorch ms / kiln ms over every case: 0.87x." in text
    assert "| max pool 3x3/2 | fprop | float16 | 128x56x56x256 | 0.0600 | 0.0900 | 3600 | 90% | 1.50x | 1.0e-03 |" in text
    assert "| batch norm | bprop | float16 | 128x56x56x256 | 0.0600 | 0.0300 | 2400 | 60% | 0.50x | - |" in text


def test_the_layers_benchmark_says_why_it_skips_without_pytorch():
    r = run_without_pytorch("layers")
    assert r.returncode == 0, r.stderr
    assert "PyTorch is not importable" in r.stdout


def test_the_training_example_fills_its_own_section(tmp_path):
    run = {"batch": 64, "steps": 60, "mode": "eager", "kiln_ms": 2.0, "torch_ms": 1.0, "kiln_loss": [2.5, 2.0],
           "torch_loss": [2.5, 2.01], "max_rel_loss_diff": 5e-3, "channels_last_max_rel_loss_diff": 4e-3}
    r = {"benchmark": "torch_train", "device": "Test GPU", "backend": "cuda", "torch": "2.x", "commit": "abc1234",
         "date": "2026-01-01", "method": "host clock", "runs": [run]}
    (tmp_path / "t.json").write_text(json.dumps(r))
    doc = tmp_path / "PERF.md"
    doc.write_text("# perf\n")
    done = perf_tables_cli(tmp_path / "t.json", "--doc", doc)
    assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert perf_tables.TRAIN_BEGIN in text and "Commit: abc1234" in text
    assert "| 64 | eager | 2.000 | 1.000 | 0.50x | 5.0e-03 | 4.0e-03 | 2.0000 / 2.0100 |" in text


def test_a_fusion_json_without_the_new_plans_host_time_leaves_its_row_out(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text(perf_tables.FUSION_BEGIN + "\n" + perf_tables.FUSION_END + "\n")
    older = fusion_json()
    del older["jit"]["resized_host_us"]
    js = tmp_path / "fusion.json"
    js.write_text(json.dumps(older))
    subprocess.run([sys.executable, os.path.join(BENCH, "perf_tables.py"), str(js), "--doc", str(doc),
                    "--date", "2026-01-02", "--commit", "def5678"], check=True, capture_output=True)
    text = doc.read_text()
    assert "until the assignment returns" not in text
    assert "| (a row reduction's new batch size, resized) | 11.20 us |  |" in text
