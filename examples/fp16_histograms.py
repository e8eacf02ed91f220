"""Train train_convnet.py's network in float16 (stochastic rounding) and plot how its activations
and gradients spread over powers of two against float16's range, with kiln's numerics
histograms (the seeds' hist_bins / hist_offset / dump_hist_data).

After every step each layer's output and each parameter's gradient is counted by
round(log2|x|) (tensor.hist(tag)); the counts of all steps are summed per tag. The PNG has one
row per tag, the bins from 2^-48 to 2^15 left to right, darker for more values (log scale), and
red lines at float16's limits: its smallest subnormal 2^-24, its smallest normal 2^-14 and its
largest value (about 2^16). The text output gives, per tag, the share of values that float16
holds only as subnormals or not at all (flushed to zero).

    python3 examples/fp16_histograms.py [--steps 30] [--png fp16_histograms.png]
"""
import argparse
import os
import sys

import numpy as np

import kiln

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_convnet import _png, batch, network  # noqa: E402

BINS, OFFSET = 64, -48


def train(ctx, steps, n, lr):
    net = network(ctx, kiln.float16, n)
    rng = np.random.default_rng(11)
    eye = np.eye(4, dtype=np.float32)
    totals, losses = {}, []
    names = [f"{i}:{type(layer).__name__}" for i, layer in enumerate(net.layers)]
    for step in range(steps):
        x, labels = batch(rng, n)
        xs, onehot = ctx.array(x, kiln.float16), ctx.array(eye[labels])
        losses.append(net.loss(net.fprop(xs), ctx.array(labels, kiln.int32)))
        for name, layer in zip(names, net.layers):
            layer.y.hist(f"act {name}")
        e = net.bprop_loss(onehot)
        for i in reversed(range(len(net.layers))):
            e = net.layers[i].bprop(e, input_grad=i > 0)   # the first layer's input is data
            for j, (_, g) in enumerate(net.layers[i].params()):
                g.hist(f"grad {names[i]}.{j}")
        for p, g in net.params():
            p[...] = p - g * lr
        counts, tags = ctx.dump_hist_data()
        for tag, row in tags.items():
            totals[tag] = totals.get(tag, 0) + counts[row].astype(np.int64)
    return totals, losses


def plot(path, totals, cell=10, row_h=12, margin=8):
    tags = list(totals)
    w, h = margin * 2 + BINS * cell, margin * 2 + len(tags) * row_h
    pixels = [[(255, 255, 255)] * w for _ in range(h)]
    for r, tag in enumerate(tags):
        c = totals[tag]
        level = np.log1p(c) / max(np.log1p(c).max(), 1e-9)
        for b in range(BINS):
            shade = int(255 * (1 - level[b]))
            for y in range(margin + r * row_h, margin + r * row_h + row_h - 2):
                for x in range(margin + b * cell, margin + (b + 1) * cell - 1):
                    pixels[y][x] = (shade, shade, 255 if c[b] else shade)
    for limit in (-24, -14, 16):   # float16's smallest subnormal, smallest normal, largest value
        x = margin + (limit - OFFSET) * cell
        if 0 <= x < w:
            for y in range(h):
                pixels[y][x] = (220, 30, 30)
    _png(path, pixels)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--png", default="fp16_histograms.png")
    args = ap.parse_args()
    ctx = kiln.Context(kiln.default_context().backend, default_dtype=kiln.float16, stochastic_round=True)
    ctx.set_hist_buffers(BINS, OFFSET)
    totals, losses = train(ctx, args.steps, args.batch, args.lr)
    print(f"trained {args.steps} steps in float16 on {ctx.device}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"{'tensor':<28} {'values':>10} {'0/tiny':>7} {'< 2^-24':>8} {'subnormal':>9} {'> 2^15':>7}")
    for tag, c in totals.items():
        exps = np.arange(BINS) + OFFSET
        total = c.sum()
        share = lambda m: c[m].sum() / max(total, 1)
        # 0/tiny: bin 0, the zeros and every value below 2^-48; < 2^-24: flushed to zero in float16.
        print(f"{tag:<28} {total:>10} {share(exps == OFFSET):>7.1%} {share((exps > OFFSET) & (exps < -24)):>8.1%} "
              f"{share((exps >= -24) & (exps < -14)):>9.1%} {share(exps > 15):>7.1%}")
    plot(args.png, totals)
    print(f"histograms: {args.png} (rows in the order above; red: 2^-24, 2^-14, 2^16)")


if __name__ == "__main__":
    main()
