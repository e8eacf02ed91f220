"""Train a small convnet with SGD through kiln alone, in float32, bfloat16 and float16 with
stochastic rounding, on synthetic data; plot the three loss curves.

The task: 16 x 16 RGB images of noise, each with one brighter 4 x 4 square in one of four
quadrants; the class is the quadrant. The network: Conv(16, 3x3) + BatchNorm + ReLU, max pool,
Conv(32, 3x3, ReLU), average pool, a residual block, FC(64, ReLU), FC(4). Every run starts from
the same weights and sees the same batches; the 16-bit runs keep their weights and activations
in 16 bits (float16 stores rounded stochastically, as the seeds trained). Runs on kiln's default
context (the GPU where there is one; KILN_BACKEND=cpu forces the CPU).

    python3 examples/train_convnet.py [--steps 150] [--png loss.png] [--json loss.json]
"""
import argparse
import json
import struct
import sys
import zlib

import numpy as np

import kiln
from kiln.layers import BatchNorm, Conv, FC, Network, Pool, Residual


def batch(rng, n, hw=16):
    x = rng.normal(0, 1, (n, hw, hw, 3)).astype(np.float32)
    labels = rng.integers(0, 4, n).astype(np.int32)
    half = hw // 2
    for i, c in enumerate(labels):
        y0 = (c // 2) * half + rng.integers(0, half - 4)
        x0 = (c % 2) * half + rng.integers(0, half - 4)
        x[i, y0:y0 + 4, x0:x0 + 4, :] += 2.0
    return x, labels


def network(ctx, dtype, n):
    layers = [Conv(16, 3, pad=1, bias=False), BatchNorm(relu=True), Pool("max", 2),
              Conv(32, 3, pad=1, relu=True), Pool("avg", 2),
              Residual([Conv(32, 3, pad=1, bias=False), BatchNorm(relu=True), Conv(32, 3, pad=1, bias=False),
                        BatchNorm()]),
              FC(64, relu=True), FC(4)]
    return Network(layers, (n, 16, 16, 3), dtype=dtype, ctx=ctx, seed=7)


def train(name, ctx, dtype, steps, n, lr):
    net = network(ctx, dtype, n)
    rng = np.random.default_rng(11)   # the same batches for every run
    losses = []
    eye = np.eye(4, dtype=np.float32)
    for step in range(steps):
        x, labels = batch(rng, n)
        loss = net.train_step(ctx.array(x, dtype), ctx.array(labels, kiln.int32), ctx.array(eye[labels]), lr)
        losses.append(loss)
        if step % 25 == 0 or step == steps - 1:
            print(f"  {name:<22} step {step:4d}  loss {loss:.4f}", flush=True)
    # Accuracy on fresh data.
    x, labels = batch(np.random.default_rng(99), n)
    logits = np.asarray(net.fprop(ctx.array(x, dtype)).astype(kiln.float32))
    accuracy = float((logits.argmax(1) == labels).mean())
    return losses, accuracy


# ---- a small PNG line plot (no plotting library needed) ------------------------------------

def _png(path, pixels):
    h, w = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def plot(path, curves, w=640, h=400, margin=40):
    """Loss against step, one colour per curve, on a log scale; grey grid lines at powers of ten."""
    pixels = [[(255, 255, 255)] * w for _ in range(h)]
    values = [v for c, _ in curves.values() for v in c if v > 0]
    lo, hi = np.log10(min(values)), np.log10(max(values))
    steps = max(len(c) for c, _ in curves.values())
    to_x = lambda i: margin + int((w - 2 * margin) * i / max(steps - 1, 1))
    to_y = lambda v: h - margin - int((h - 2 * margin) * (np.log10(max(v, 1e-30)) - lo) / max(hi - lo, 1e-9))
    for d in range(int(np.floor(lo)), int(np.ceil(hi)) + 1):
        y = to_y(10.0 ** d)
        if margin <= y < h - margin:
            for x in range(margin, w - margin):
                pixels[y][x] = (220, 220, 220)
    for x in range(margin, w - margin):
        pixels[h - margin][x] = (0, 0, 0)
    for y in range(margin, h - margin + 1):
        pixels[y][margin] = (0, 0, 0)
    for values, colour in curves.values():
        pts = [(to_x(i), to_y(v)) for i, v in enumerate(values)]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            n = max(abs(x1 - x0), abs(y1 - y0), 1)
            for t in range(n + 1):
                x, y = x0 + (x1 - x0) * t // n, y0 + (y1 - y0) * t // n
                for dy in (0, 1):
                    if 0 <= y + dy < h and 0 <= x < w:
                        pixels[y + dy][x] = colour
    # The legend: a colour swatch per curve in the top right corner, in the order given.
    for k, (_, colour) in enumerate(curves.values()):
        for y in range(8 + 14 * k, 18 + 14 * k):
            for x in range(w - 30, w - 10):
                pixels[y][x] = colour
    _png(path, pixels)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--png", default="train_convnet.png")
    ap.add_argument("--json", default="train_convnet.json")
    args = ap.parse_args()
    device = kiln.default_context().backend
    runs = {
        "float32": (kiln.Context(device), kiln.float32, (31, 119, 180)),
        "bfloat16": (kiln.Context(device, default_dtype=kiln.bfloat16), kiln.bfloat16, (255, 127, 14)),
        "float16 + stochastic": (kiln.Context(device, default_dtype=kiln.float16, stochastic_round=True), kiln.float16,
                                 (44, 160, 44)),
    }
    print(f"training on {device}: {args.steps} steps of {args.batch} images, SGD lr {args.lr}")
    curves, result = {}, {"device": device, "steps": args.steps, "batch": args.batch, "lr": args.lr, "runs": {}}
    for name, (ctx, dtype, colour) in runs.items():
        losses, accuracy = train(name, ctx, dtype, args.steps, args.batch, args.lr)
        curves[name] = (losses, colour)
        first, last = float(np.mean(losses[:10])), float(np.mean(losses[-10:]))
        result["runs"][name] = {"loss": losses, "accuracy": accuracy, "first10": first, "last10": last}
        print(f"  {name:<22} mean loss of the first 10 steps {first:.4f}, of the last 10 {last:.4f}; "
              f"accuracy on fresh data {accuracy:.2f}")
    plot(args.png, curves)
    with open(args.json, "w") as f:
        json.dump(result, f)
    print(f"loss curves: {args.png} (blue float32, orange bfloat16, green float16 + stochastic rounding); "
          f"numbers: {args.json}")
    ok = all(r["last10"] < 0.5 * r["first10"] for r in result["runs"].values())
    print("every run's loss fell by more than half" if ok else "a run's loss did not fall by half")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
