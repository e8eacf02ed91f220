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


# A 5 x 7 pixel font for the plot's labels: each glyph's rows, top first, as 5-bit masks.
_GLYPHS = {
    "0": (14, 17, 19, 21, 25, 17, 14), "1": (4, 12, 4, 4, 4, 4, 14), "2": (14, 17, 1, 2, 4, 8, 31),
    "3": (31, 2, 4, 2, 1, 17, 14), "4": (2, 6, 10, 18, 31, 2, 2), "5": (31, 16, 30, 1, 1, 17, 14),
    "6": (6, 8, 16, 30, 17, 17, 14), "7": (31, 1, 2, 4, 8, 8, 8), "8": (14, 17, 17, 14, 17, 17, 14),
    "9": (14, 17, 17, 15, 1, 2, 12), ".": (0, 0, 0, 0, 0, 12, 12), "-": (0, 0, 0, 31, 0, 0, 0),
    "+": (0, 4, 4, 31, 4, 4, 0), " ": (0,) * 7, "a": (0, 0, 14, 1, 15, 17, 15), "b": (16, 16, 22, 25, 17, 17, 30),
    "c": (0, 0, 14, 16, 16, 17, 14), "e": (0, 0, 14, 17, 31, 16, 14), "f": (6, 9, 8, 28, 8, 8, 8),
    "h": (16, 16, 22, 25, 17, 17, 17), "i": (4, 0, 12, 4, 4, 4, 14), "l": (12, 4, 4, 4, 4, 4, 14),
    "o": (0, 0, 14, 17, 17, 17, 14), "p": (0, 0, 30, 17, 30, 16, 16), "s": (0, 0, 14, 16, 14, 1, 30),
    "t": (8, 8, 28, 8, 8, 9, 6),
}


def _text(pixels, x, y, text, colour=(0, 0, 0), scale=2):
    """text with its top left corner at (x, y); characters outside _GLYPHS are left blank."""
    for k, ch in enumerate(text):
        for r, bits in enumerate(_GLYPHS.get(ch, _GLYPHS[" "])):
            for c in range(5):
                if bits >> (4 - c) & 1:
                    for dy in range(scale):
                        for dx in range(scale):
                            px, py = x + (6 * k + c) * scale + dx, y + r * scale + dy
                            if 0 <= py < len(pixels) and 0 <= px < len(pixels[0]):
                                pixels[py][px] = colour


def plot(path, curves, w=720, h=440):
    """Loss (log scale; grey lines and labels at powers of ten) against step, one colour per
    curve, with a legend."""
    left, right, top, bottom = 80, 20, 20, 50
    pixels = [[(255, 255, 255)] * w for _ in range(h)]
    values = [v for c, _ in curves.values() for v in c if v > 0]
    lo, hi = np.log10(min(values)), np.log10(max(values))
    steps = max(len(c) for c, _ in curves.values())
    to_x = lambda i: left + int((w - left - right) * i / max(steps - 1, 1))
    to_y = lambda v: h - bottom - int((h - top - bottom) * (np.log10(max(v, 1e-30)) - lo) / max(hi - lo, 1e-9))
    for d in range(int(np.floor(lo)), int(np.ceil(hi)) + 1):
        y = to_y(10.0 ** d)
        if top <= y <= h - bottom:
            for x in range(left, w - right):
                pixels[y][x] = (220, 220, 220)
            label = f"{10.0 ** d:g}"
            _text(pixels, left - 8 - 12 * len(label), y - 7, label)
    for x in range(left, w - right):
        pixels[h - bottom][x] = (0, 0, 0)
    for y in range(top, h - bottom + 1):
        pixels[y][left] = (0, 0, 0)
    tick = 10 ** int(np.floor(np.log10(max(steps - 1, 1))))
    while tick > 1 and (steps - 1) // tick < 3:
        tick //= 2
    for i in range(0, steps, tick):
        x = to_x(i)
        for y in range(h - bottom, h - bottom + 5):
            pixels[y][x] = (0, 0, 0)
        _text(pixels, x - 6 * len(str(i)), h - bottom + 8, str(i))
    _text(pixels, (w - left - right) // 2 + left - 24, h - 20, "step")
    _text(pixels, 8, top, "loss")
    for values, colour in curves.values():
        pts = [(to_x(i), to_y(v)) for i, v in enumerate(values)]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            n = max(abs(x1 - x0), abs(y1 - y0), 1)
            for t in range(n + 1):
                x, y = x0 + (x1 - x0) * t // n, y0 + (y1 - y0) * t // n
                for dy in (0, 1):
                    if 0 <= y + dy < h and 0 <= x < w:
                        pixels[y + dy][x] = colour
    # The legend: a colour swatch and the curve's name per curve, top right, in the order given.
    for k, (name, (_, colour)) in enumerate(curves.items()):
        x0, y0 = w - right - 12 * len(name) - 40, top + 6 + 20 * k
        for y in range(y0 + 2, y0 + 12):
            for x in range(x0, x0 + 24):
                pixels[y][x] = colour
        _text(pixels, x0 + 32, y0, name)
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
