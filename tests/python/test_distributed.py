"""kiln.distributed: misuse errors and the behaviour without NCCL (everywhere), the launcher,
and, on a GPU machine with NCCL, collectives between processes: correct results over 2 GPUs,
and a clear error instead of a hang when a rank exits or two ranks share one GPU."""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import kiln
import kiln.distributed as dist
from kiln.layers import FC, Network, ReLU

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def gpus():
    n = 0
    if os.environ.get("KILN_BACKEND") == "cpu":
        return 0
    while n < 16:
        try:
            kiln.Context(f"cuda:{n}")
        except Exception:
            break
        n += 1
    return n


def need_nccl():
    if gpus() == 0:
        pytest.skip("no usable CUDA device")
    info = dist.nccl_info()
    if not info["available"]:
        pytest.skip(f"NCCL not available: {info['why_not']}")


def run_ranks(tmp_path, body, nproc=2, timeout=180, env=None):
    """Runs `body` (Python source) in nproc processes through the launcher; (status, output)."""
    script = tmp_path / "rank.py"
    script.write_text("import os, sys, time\nimport numpy as np\nimport kiln\nimport kiln.distributed as dist\n"
                      + textwrap.dedent(body))
    e = dict(os.environ, **(env or {}))
    e.pop("KILN_BACKEND", None)
    p = subprocess.Popen([sys.executable, "-m", "kiln.distributed", "--nproc", str(nproc), str(script)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, _ = p.communicate()
        pytest.fail(f"the ranks did not finish within {timeout} s (a hang); their output:\n{out}")
    return p.returncode, out


# ---- everywhere (CI has neither a GPU nor, necessarily, NCCL)

def test_nccl_info_and_missing_library(monkeypatch):
    info = dist.nccl_info()
    assert set(info) == {"available", "version", "library", "why_not"}
    monkeypatch.setenv("KILN_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
    info = dist.nccl_info()
    assert not info["available"]
    assert "/nonexistent/libnccl.so.2" in info["why_not"] and "KILN_NCCL_LIBRARY" in info["why_not"]
    assert not dist.is_available()
    with pytest.raises(RuntimeError, match="Communicator::new_id: NCCL is not available"):
        dist.new_id()
    with pytest.raises(RuntimeError, match="CollectiveGroup: NCCL is not available"):
        with dist.group():
            pass


def test_misuse_errors():
    cpu = kiln.Context("cpu")
    with pytest.raises(ValueError, match="the context runs on cpu; collectives run between CUDA devices"):
        dist.Communicator(cpu, 1, 0, "00" * 128)
    with pytest.raises(ValueError, match="an id is 256 hex digits"):
        dist.Communicator(cpu, 1, 0, "abc")
    with pytest.raises(TypeError, match="id must be the hex string new_id"):
        dist.Communicator(cpu, 1, 0, 12)
    with pytest.raises(TypeError, match="world_size must be an int"):
        dist.Communicator(cpu, "2", 0, "00" * 128)
    with pytest.raises(TypeError, match="timeout must be a number"):
        dist.Communicator(cpu, 1, 0, "00" * 128, timeout="1m")
    with pytest.raises(ValueError, match="timeout -1 s"):
        dist.Communicator(cpu, 1, 0, "00" * 128, timeout=-1)
    with pytest.raises(IndexError, match="rank 3 of a world of 2"):
        dist.Communicator(cpu, 2, 3, "00" * 128)
    with pytest.raises(ValueError, match="the context runs on cpu"):
        dist.init_all([cpu])
    with pytest.raises(ValueError, match="no contexts"):
        dist.init_all([])
    with pytest.raises(ValueError, match="the context runs on cpu"):
        dist.Communicator.through_file(cpu, 2, 0, "/tmp/unused-kiln-id")


def test_from_env_names_every_missing_variable(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "KILN_NCCL_ID", "KILN_NCCL_ID_FILE"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(ValueError, match="WORLD_SIZE is not set; RANK is not set; neither KILN_NCCL_ID"):
        dist.Communicator.from_env(kiln.Context("cpu"))
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK is 'x'"):
        dist.Communicator.from_env()


def test_num_devices():
    ng = kiln.NervanaGPU(device="cpu", num_devices=1)
    assert ng.devices == [ng] and ng.num_devices == 1
    with pytest.raises(ValueError, match="num_devices = 2 needs CUDA devices; this context runs on cpu"):
        kiln.NervanaGPU(device="cpu", num_devices=2)
    with pytest.raises(ValueError, match="num_devices = 0"):
        kiln.NervanaGPU(device="cpu", num_devices=0)
    with pytest.raises(ValueError, match="the context runs on cpu"):
        kiln.NervanaGPU(device="cpu", num_devices=1).communicators()


def test_launcher_sets_torchrun_variables_and_stops_the_others(tmp_path):
    status, out = run_ranks(tmp_path, """
        e = os.environ   # one write per line: the ranks share the pipe
        sys.stdout.write(f"RANK {e['RANK']} {e['WORLD_SIZE']} {e['LOCAL_RANK']} {e['KILN_NCCL_ID_FILE']} {e['MASTER_PORT']}\\n")
        sys.stdout.flush()
    """, nproc=3)
    assert status == 0, out
    lines = sorted(line.split() for line in out.splitlines() if line.startswith("RANK "))
    assert [line[1:4] for line in lines] == [["0", "3", "0"], ["1", "3", "1"], ["2", "3", "2"]]
    assert len({line[4] for line in lines}) == 1 and len({line[5] for line in lines}) == 1
    t0 = time.time()
    status, out = run_ranks(tmp_path, """
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(120)
    """)
    assert status == 3, out
    assert "a rank exited with status 3; stopping the others" in out
    assert time.time() - t0 < 60


def test_launcher_usage():
    r = subprocess.run([sys.executable, "-m", "kiln.distributed", "--nproc", "0", "x.py"], capture_output=True, text=True)
    assert r.returncode == 2 and "--nproc 0: at least 1" in r.stderr


def test_data_parallel_example_runs_alone_on_one_device():
    e = dict(os.environ, KILN_BACKEND="cpu")
    for v in ("RANK", "WORLD_SIZE"):
        e.pop(v, None)
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "data_parallel.py"), "--steps", "3", "--batch", "8",
                        "--check"], capture_output=True, text=True, timeout=600, env=e)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0.00e+00 after the first 3 steps (within 1e-4)" in r.stdout, r.stdout


def test_bprop_reports_each_layers_gradients_in_reverse():
    cpu = kiln.Context("cpu")
    net = Network([FC(8, relu=True), ReLU(), FC(3)], (4, 5), ctx=cpu)
    seen = []
    net.loss(net.fprop(cpu.array(np.ones((4, 5), np.float32))), cpu.array(np.zeros(4, np.int32), kiln.int32))
    net.bprop(net.bprop_loss(cpu.array(np.eye(3, dtype=np.float32)[[0, 1, 2, 0]])), lambda pairs: seen.append(pairs))
    assert [len(p) for p in seen] == [2, 2]
    assert seen[0][0][0] is net.layers[2].W and seen[1][0][0] is net.layers[0].W


# ---- on a GPU with NCCL

def test_processes_on_gpus_reduce_gather_scatter_broadcast(tmp_path):
    need_nccl()
    if gpus() < 2:
        pytest.skip("one GPU: two ranks need two GPUs (see test_two_ranks_on_one_gpu_fail_clearly)")
    status, out = run_ranks(tmp_path, """
        comm = dist.Communicator.from_env(timeout=60)
        ctx, r, n = comm.context, comm.rank, comm.size
        for dt in (kiln.float32, kiln.float16, kiln.bfloat16):
            base = np.arange(4096, dtype=np.float32) % 7
            x = ctx.array(base + r, dt)
            s = comm.all_reduce(x, "sum", out=ctx.empty(x.shape, dt))
            s[:] = s * 2                      # ordered after the reduction, no host wait
            assert np.array_equal(np.asarray(s).astype(np.float32), 2 * (n * base + n * (n - 1) / 2)), dt
            mx = comm.all_reduce(x, "max", out=ctx.empty(x.shape, dt))
            assert np.array_equal(np.asarray(mx).astype(np.float32), base + n - 1)
            g = comm.all_gather(x)
            assert g.shape == (n, 4096)
            assert np.array_equal(np.asarray(g).astype(np.float32), np.stack([base + k for k in range(n)]))
            rs = comm.reduce_scatter(ctx.array(np.tile(base, (n, 1)) + r, dt), "avg")
            assert np.array_equal(np.asarray(rs).astype(np.float32), (base + (n - 1) / 2)[None, :])
            b = comm.broadcast(ctx.array(base * 0 + r, dt), root=n - 1)
            assert np.array_equal(np.asarray(b).astype(np.float32), base * 0 + n - 1)
        p = comm.all_reduce_async([ctx.array(np.full(100, r + 1.0, np.float32))], "sum")
        p.wait()
        comm.synchronize()
        print("RANK-OK", r, flush=True)
        comm.close()
    """)
    assert status == 0, out
    assert out.count("RANK-OK") == 2, out


def test_one_process_drives_every_gpu_through_num_devices():
    need_nccl()
    n = gpus()
    ng = kiln.NervanaGPU(device="cuda:0", num_devices=n)
    assert [c.device for c in ng.devices] == [f"cuda:{i}" for i in range(n)]
    comms = ng.communicators(timeout=60)
    assert [c.rank for c in comms] == list(range(n)) and ng.communicators() is comms
    xs = [c.array(np.full(1 << 16, i + 1.0, np.float32)) for i, c in enumerate(ng.devices)]
    with dist.group():
        for comm, x in zip(comms, xs):
            comm.all_reduce(x, "sum")
    for x in xs:
        x[:] = x * 2                            # on each device's stream, after its reduction
    for x in xs:
        assert np.all(np.asarray(x) == n * (n + 1))
    gathered = [None] * n
    with dist.group():
        for i, (comm, x) in enumerate(zip(comms, xs)):
            gathered[i] = comm.all_gather(x[:4])
    assert all(np.asarray(g).shape == (n, 4) for g in gathered)
    for comm in comms:
        comm.synchronize()


def test_a_rank_that_exits_gives_an_error_not_a_hang(tmp_path):
    need_nccl()
    if gpus() < 2:
        pytest.skip("one GPU: two ranks need two GPUs")
    t0 = time.time()
    status, out = run_ranks(tmp_path, """
        comm = dist.Communicator.from_env(timeout=10)
        x = comm.context.array(np.ones(1 << 20, np.float32))
        comm.all_reduce(x)
        comm.synchronize()
        if comm.rank == 1:
            os._exit(0)                       # gone without a word
        try:
            for _ in range(3):
                comm.all_reduce(x)
            comm.synchronize()
            print("NO-ERROR", flush=True)
        except RuntimeError as e:
            print("RANK0-ERROR", e, flush=True)
            sys.exit(0)
    """, timeout=120)
    assert "RANK0-ERROR" in out, out
    assert "failed" in out and ("timeout" in out or "ncclRemoteError" in out or "ncclSystemError" in out), out
    assert time.time() - t0 < 100


def test_a_rank_that_never_calls_gives_a_timeout_not_a_hang(tmp_path):
    need_nccl()
    if gpus() < 2:
        pytest.skip("one GPU: two ranks need two GPUs")
    t0 = time.time()
    status, out = run_ranks(tmp_path, """
        comm = dist.Communicator.from_env(timeout=5)
        if comm.rank == 1:
            time.sleep(40)                    # joined, but never makes the collective
            sys.exit(0)
        x = comm.context.array(np.ones(1 << 16, np.float32))
        t = time.time()
        try:
            comm.all_reduce(x)
            print("rank 0: all_reduce given", flush=True)
            comm.synchronize()
            print("NO-ERROR", flush=True)
        except RuntimeError as e:
            print(f"RANK0-ERROR after {time.time() - t:.1f} s:", e, flush=True)
    """, timeout=120)
    assert "RANK0-ERROR" in out, out
    assert "(timeout 5 s)" in out or "timeout of 5 s" in out, out
    assert time.time() - t0 < 100


def test_two_ranks_on_one_gpu_fail_clearly(tmp_path):
    need_nccl()
    status, out = run_ranks(tmp_path, """
        ctx = kiln.Context("cuda:0")
        try:
            dist.Communicator.from_env(ctx, timeout=20)
            print("JOINED", flush=True)
        except RuntimeError as e:
            print("REFUSED", e, flush=True)
    """, timeout=120)
    # NCCL does not put two ranks of one communicator on one GPU: each says so, none hangs.
    assert "JOINED" not in out, out
    assert out.count("REFUSED") >= 1, out
    assert "could not join" in out, out


def test_data_parallel_example_matches_one_gpu(tmp_path):
    need_nccl()
    n = min(gpus(), 2)
    if n < 2:
        pytest.skip("one GPU: the example's two-GPU comparison needs two")
    e = dict(os.environ)
    e.pop("KILN_BACKEND", None)
    r = subprocess.run([sys.executable, "-m", "kiln.distributed", "--nproc", str(n),
                        os.path.join(EXAMPLES, "data_parallel.py"), "--steps", "12", "--batch", "64", "--check"],
                       capture_output=True, text=True, timeout=600, env=e)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "within 1e-4" in r.stdout, r.stdout
