"""All-reduce bus bandwidth of kiln.distributed beside torch.distributed (both NCCL), and the
data-parallel example's scaling efficiency. One process per GPU:

    python -m kiln.distributed --nproc 2 examples/benchmarks/collectives.py [--json collectives.json]

Method (the same for both sides, in the same processes): float32 and bfloat16 tensors of random
values; for each size, warm-up calls, then 7 batches of back-to-back in-place all-reduces (sum)
for each side, kiln's and torch's batches interleaved, each timed on the host clock up to a
synchronize; the median batch. Every rank makes the same
number of calls (counts follow from the size alone). Bus bandwidth = 2 (n - 1) / n x bytes /
time, NCCL's own measure. The floor: the ring moves 2 (n - 1) / n x bytes through each GPU's
link, so the time cannot be below that over the link bandwidth, measured here as a timed copy
from GPU 0 to GPU 1 (PyTorch). Scaling: seconds per SGD step of examples/data_parallel.py's
network with the same per-GPU batch on one GPU (no communicator) and on all of them; efficiency =
one-GPU time / n-GPU time.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kiln  # noqa: E402
import kiln.distributed as kdist  # noqa: E402
from bench_common import batch_ms, git_commit  # noqa: E402


def side_by_side(a, b, sync_a, sync_b, calls, batches=7, warmup=3):
    """Milliseconds per call of a and of b, their batches interleaved (a, b, a, b, ...) so that
    clocks and temperature drift alike for both; the median batch of each."""
    for fn, sync in ((a, sync_a), (b, sync_b)):
        for _ in range(warmup):
            fn()
        sync()
    per = ([], [])
    for _ in range(batches):
        per[0].append(batch_ms(a, sync_a, calls))
        per[1].append(batch_ms(b, sync_b, calls))
    return statistics.median(per[0]), statistics.median(per[1])


def timed(fn, sync, calls, batches=7, warmup=3):
    """Milliseconds per call: warm-up, then the median of `batches` batches of `calls` calls (a
    count given, not measured: every rank must make the same number of collectives)."""
    for _ in range(warmup):
        fn()
    sync()
    return statistics.median(batch_ms(fn, sync, calls) for _ in range(batches))


def calls_for(nbytes):
    """Calls per batch from the size alone (the same on every rank): about 10 ms at 200 GB/s."""
    est_ms = 0.02 + nbytes / 200e9 * 1e3
    return int(min(500, max(5, 10.0 / est_ms)))


def link_gbs(torch, nbytes=256 << 20):
    """GB/s of a copy from GPU 0 to GPU 1 (PyTorch), the link a ring all-reduce crosses."""
    a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda:0").normal_()
    b = torch.empty_like(a, device="cuda:1")
    def sync():
        torch.cuda.synchronize("cuda:0")
        torch.cuda.synchronize("cuda:1")
    ms = min(timed(lambda: b.copy_(a), sync, 10) for _ in range(3))   # the best of three: the link's rate
    return nbytes / ms / 1e6


def main():
    ap = argparse.ArgumentParser(description="kiln.distributed all-reduce beside torch.distributed")
    ap.add_argument("--json", default="collectives.json")
    ap.add_argument("--max-mib", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20, help="timed SGD steps for the scaling measurement")
    ap.add_argument("--batch", type=int, default=1024, help="per-GPU batch for the scaling measurement")
    a = ap.parse_args()
    import torch
    import torch.distributed as tdist

    # The link first, before any communicator has touched the GPUs' peer mappings.
    rank_env = int(os.environ.get("RANK", "0"))
    link = link_gbs(torch) if rank_env == 0 and torch.cuda.device_count() > 1 else 0.0
    comm = kdist.Communicator.from_env()
    ctx, rank, n = comm.context, comm.rank, comm.size
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    tdist.init_process_group("nccl", rank=rank, world_size=n, device_id=torch.device("cuda", torch.cuda.current_device()))
    factor = 2.0 * (n - 1) / n
    rng = np.random.default_rng(rank)

    rows = []
    sizes = [1 << s for s in range(13, 31, 2) if (1 << s) <= a.max_mib << 20]
    for dtype, tdtype, npd in (("float32", torch.float32, np.float32), ("bfloat16", torch.bfloat16, np.float32)):
        for nbytes in sizes:
            count = nbytes // (2 if dtype == "bfloat16" else 4)
            host = rng.standard_normal(count).astype(npd)
            kt = ctx.array(host, getattr(kiln, dtype))
            tt = torch.from_numpy(host).to(f"cuda:{torch.cuda.current_device()}").to(tdtype)
            calls = calls_for(nbytes)
            k_ms, t_ms = side_by_side(lambda: comm.all_reduce(kt), lambda: tdist.all_reduce(tt), comm.synchronize,
                                      torch.cuda.synchronize, calls)
            row = {"dtype": dtype, "bytes": nbytes, "kiln_ms": k_ms, "torch_ms": t_ms,
                   "kiln_busbw_gbs": factor * nbytes / k_ms / 1e6, "torch_busbw_gbs": factor * nbytes / t_ms / 1e6}
            row["ratio"] = row["kiln_busbw_gbs"] / row["torch_busbw_gbs"]
            if link:
                row["floor_ms"] = factor * nbytes / link / 1e6
            rows.append(row)
    # Correctness of what was timed: the sum of every rank's values, checked on a fresh tensor.
    probe = ctx.array(np.full(1000, rank + 1, np.float32))
    comm.all_reduce(probe)
    assert np.allclose(np.asarray(probe), n * (n + 1) / 2), "all_reduce gave a wrong sum"

    # Scaling of the data-parallel example: the same per-GPU batch alone and over n GPUs.
    import data_parallel as dp
    x, labels = dp.batch(np.random.default_rng(0), a.batch)
    feeds = dp.inputs(ctx, x, labels)
    alone = dp.DataParallel(dp.network(ctx, a.batch), None)
    together = dp.DataParallel(dp.network(ctx, a.batch), comm)
    step_alone = timed(lambda: alone.step(*feeds, 0.01), ctx.synchronize, a.steps, batches=7)
    tdist.barrier()
    step_together = timed(lambda: together.step(*feeds, 0.01), ctx.synchronize, a.steps, batches=7)
    scaling = {"gpus": n, "per_gpu_batch": a.batch, "one_gpu_ms": step_alone, "n_gpu_ms": step_together,
               "efficiency": step_alone / step_together}

    if rank == 0:
        big = [r["ratio"] for r in rows if r["bytes"] >= 64 << 20]
        summary = {"min_ratio_ge_64mib": min(big) if big else None, "link_gbs": link}
        out = {"benchmark": "collectives", "device": torch.cuda.get_device_name(), "gpus": n,
               "commit": git_commit(), "date": time.strftime("%Y-%m-%d"), "nccl_version": kdist.nccl_info()["version"],
               "torch_nccl_version": ".".join(map(str, torch.cuda.nccl.version())), "allreduce": rows,
               "scaling": scaling, "summary": summary}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"all-reduce (sum, in place) over {n} x {out['device']}; link {link:.0f} GB/s; kiln NCCL "
              f"{out['nccl_version']}, torch NCCL {out['torch_nccl_version']}")
        print(f"{'dtype':<9} {'bytes':>10} {'kiln ms':>9} {'torch ms':>9} {'kiln GB/s':>10} {'torch GB/s':>10} {'ratio':>6} "
              f"{'floor ms':>9}")
        for r in rows:
            print(f"{r['dtype']:<9} {r['bytes']:>10} {r['kiln_ms']:>9.4f} {r['torch_ms']:>9.4f} {r['kiln_busbw_gbs']:>10.1f} "
                  f"{r['torch_busbw_gbs']:>10.1f} {r['ratio']:>6.3f} {r.get('floor_ms', 0):>9.4f}")
        print(f"data-parallel step, {a.batch} images per GPU: one GPU {step_alone:.2f} ms, {n} GPUs {step_together:.2f} ms, "
              f"scaling efficiency {scaling['efficiency']:.3f}")
        print(f"smallest kiln/torch bus-bandwidth ratio at >= 64 MiB: {summary['min_ratio_ge_64mib']}")
    comm.close()
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
