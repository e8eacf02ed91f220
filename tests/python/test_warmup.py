"""python -m kiln.warmup for the CPU backend: a manifest recorded on the CPU, warmed with
``--arch cpu`` into a fresh cache, lets a process that may not compile (KILN_ASSERT_NO_COMPILE)
run every kernel from disk; without the warm-up that process fails. Each step is a separate
process, as a deployment would run them."""
import json
import os
import subprocess
import sys

import pytest

from kiln import warmup

SCRIPT = """
import json, numpy as np, kiln
a = kiln.array(np.arange(96, dtype=np.float32).reshape(8, 12) / 7)
b = kiln.empty((8, 12))
b[...] = kiln.tanh(a * 0.5) * kiln.exp(-a) + kiln.sig(a)
m = kiln.empty((8, 1))
m[...] = kiln.mean(kiln.square(a - kiln.mean(a, axis=1, keepdims=True)), axis=1, keepdims=True)
print(json.dumps({"counters": kiln.default_context().counters(), "b": b.get().tolist(), "m": m.get().tolist()}))
"""


def run_script(cache_dir, **env):
    e = dict(os.environ, KILN_BACKEND="cpu", KILN_CACHE_DIR=str(cache_dir))
    e.update(env)
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=e)


def run_tool(*args):
    return subprocess.run([sys.executable, "-m", "kiln.warmup", *map(str, args)], capture_output=True, text=True)


@pytest.fixture
def tool():
    if warmup.tool() is None:
        pytest.skip("kiln-warmup is not beside this kiln package (pip install . or the build tree's pkg/ installs it)")
    return warmup.tool()


def test_arch_cpu_warms_a_cache_that_needs_no_compile(tool, tmp_path):
    manifest = tmp_path / "m.jsonl"
    recorded = run_script(tmp_path / "scratch", KILN_RECORD=str(manifest))
    assert recorded.returncode == 0, recorded.stderr
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert len(lines) >= 2 and all(line["backend"] == "cpu" for line in lines)
    first = json.loads(recorded.stdout)

    cache = tmp_path / "cache"
    refused = run_script(cache, KILN_ASSERT_NO_COMPILE="1")
    assert refused.returncode != 0 and "KILN_ASSERT_NO_COMPILE" in refused.stderr

    r = run_tool(manifest, "--arch", "cpu", "--cache-dir", cache)
    assert r.returncode == 0, r.stderr
    assert f"{len(lines)} kernels x archs: {len(lines)} compiled, 0 already cached, 0 failed" in r.stdout
    r = run_tool(manifest, "--arch", "cpu", "--cache-dir", cache, "--check")
    assert r.returncode == 0 and f"{len(lines)} cached, 0 missing" in r.stdout

    deployed = run_script(cache, KILN_ASSERT_NO_COMPILE="1")
    assert deployed.returncode == 0, deployed.stderr
    out = json.loads(deployed.stdout)
    assert out["counters"]["compiles"] == 0
    assert out["counters"]["disk_hits"] == len(lines)
    assert out["b"] == first["b"] and out["m"] == first["m"]   # the same machine code: the same bits
