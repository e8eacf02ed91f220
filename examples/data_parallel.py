"""Data-parallel training of a kiln.layers convnet on several GPUs, one process per GPU.

Each step takes a global batch; rank r trains on its slice. The gradients are averaged over the
ranks by NCCL all-reduces in buckets of about --bucket-mb, each started (on the communicator's
own stream) as soon as the layers that make it have been back-propagated, so the reduction of
the last layers' gradients overlaps the backward pass of the first ones. With --check, rank 0
also trains the same network on the whole global batch on its GPU alone and compares after every
step: over the first steps the weights agree within float32 tolerance (1e-4 of the largest
weight); later the two runs drift apart as any two float32 runs that sum in another order do, once
a rounding difference flips a max-pool choice or a ReLU.

    python -m kiln.distributed --nproc 2 examples/data_parallel.py [--steps 40] [--batch 256] [--check]

Also runs as one process (WORLD_SIZE unset): then it trains on one GPU with no communicator.
"""
import argparse
import os
import sys

import numpy as np

import kiln
import kiln.distributed as dist
from kiln.layers import Conv, FC, Network, Pool

HW, CLASSES = 32, 4


def batch(rng, n):
    """Noise images with one bright 6 x 6 square; the class is the quadrant it is in."""
    x = rng.normal(0, 1, (n, HW, HW, 3)).astype(np.float32)
    labels = rng.integers(0, CLASSES, n).astype(np.int32)
    half = HW // 2
    for i, c in enumerate(labels):
        y0 = (c // 2) * half + rng.integers(0, half - 6)
        x0 = (c % 2) * half + rng.integers(0, half - 6)
        x[i, y0:y0 + 6, x0:x0 + 6, :] += 1.5
    return x, labels


def network(ctx, n, dtype=kiln.float32):
    """The same weights for every n and rank (seeded); no batch norm, whose statistics would
    differ between a slice and the whole batch."""
    layers = [Conv(32, 3, pad=1, relu=True), Pool("max", 2), Conv(64, 3, pad=1, relu=True), Pool("max", 2),
              Conv(128, 3, pad=1, relu=True), Pool("avg", 2), FC(256, relu=True), FC(CLASSES)]
    return Network(layers, (n, HW, HW, 3), dtype=dtype, ctx=ctx, seed=3)


class DataParallel:
    """SGD steps of `net` with its gradients averaged over `comm`'s ranks (None: one GPU)."""

    def __init__(self, net, comm, bucket_mb=1.0, overlap=True):
        self.net, self.comm, self.overlap = net, comm, overlap
        self.bucket_bytes = int(bucket_mb * 2**20)

    def step(self, x, labels, onehot, lr):
        net, comm = self.net, self.comm
        loss = net.loss(net.fprop(x), labels)
        pending, bucket, size = [], [], 0

        def on_grads(pairs):
            nonlocal bucket, size
            for _, g in pairs:
                bucket.append(g)
                size += g.nbytes
            if comm is not None and self.overlap and size >= self.bucket_bytes:
                pending.append(comm.all_reduce_async(bucket, "avg"))
                bucket, size = [], 0

        net.bprop(net.bprop_loss(onehot), on_grads, input_grad=False)
        if comm is not None and not self.overlap:
            comm.all_reduce(bucket, "avg")   # every gradient at once, after the backward pass
        elif comm is not None:
            if bucket:
                pending.append(comm.all_reduce_async(bucket, "avg"))
            for p in pending:
                p.wait()
        for p, g in net.params():
            p[...] = p - g * lr
        return loss


def difference(net, ref):
    """The largest difference between two networks' weights over the largest weight."""
    worst = 0.0
    for (p, _), (q, _) in zip(net.params(), ref.params()):
        a, b = np.asarray(p).astype(np.float64), np.asarray(q).astype(np.float64)
        worst = max(worst, float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)))
    return worst


def inputs(ctx, x, labels):
    eye = np.eye(CLASSES, dtype=np.float32)
    return ctx.array(x), ctx.array(labels, kiln.int32), ctx.array(eye[labels])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=256, help="the global batch, split over the ranks")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--bucket-mb", type=float, default=1.0)
    ap.add_argument("--no-overlap", action="store_true", help="reduce every gradient after the backward pass instead")
    ap.add_argument("--check", action="store_true", help="rank 0 compares with one GPU training on the global batch")
    a = ap.parse_args()

    if "WORLD_SIZE" in os.environ:
        comm = dist.Communicator.from_env()
        ctx, rank, world = comm.context, comm.rank, comm.size
    else:
        comm, ctx, rank, world = None, kiln.Context(), 0, 1
    if a.batch % world:
        sys.exit(f"--batch {a.batch} does not split over {world} ranks")
    local = a.batch // world
    trainer = DataParallel(network(ctx, local), comm, a.bucket_mb, overlap=not a.no_overlap)
    reference = DataParallel(network(ctx, a.batch), None) if a.check and rank == 0 else None
    rng = np.random.default_rng(5)   # every rank draws the same global batches
    drift = []
    for step in range(a.steps):
        x, labels = batch(rng, a.batch)
        part = slice(rank * local, (rank + 1) * local)
        loss = trainer.step(*inputs(ctx, x[part], labels[part]), a.lr)
        if reference is not None:
            ref_loss = reference.step(*inputs(ctx, x, labels), a.lr)
            drift.append(difference(trainer.net, reference.net))
        if rank == 0 and (step % 10 == 0 or step == a.steps - 1):
            extra = f"  one-GPU loss {ref_loss:.4f}" if reference is not None else ""
            print(f"step {step:3d}  rank-0 loss {loss:.4f}{extra}", flush=True)
    if reference is not None:
        early = max(drift[:3])
        ok = early < 1e-4
        print(f"weights on {world} GPUs vs one GPU, largest difference over the largest weight: {early:.2e} after "
              f"the first {min(3, a.steps)} steps ({'within' if ok else 'OUTSIDE'} 1e-4), {drift[-1]:.2e} after "
              f"{a.steps}; final loss {loss:.4f} (rank 0's slice) vs {ref_loss:.4f}", flush=True)
        if not ok:
            sys.exit(1)
    if comm is not None:
        comm.close()


if __name__ == "__main__":
    main()
