"""A small convolutional classifier trained twice side by side: once with kiln's PyTorch modules
(kiln.torch.Conv2d and Linear with their ReLU in the kernel's epilogue, and a layer norm written
as a kiln expression whose backward pass kiln derives), once in pure PyTorch, from the same
initial weights on the same batches with the same optimiser, and the time per training step of
each is printed. The loss curves must agree (exit status 1 otherwise): training amplifies every
rounding difference, so kiln's distance from PyTorch's curve is held to four times the distance
between PyTorch's and the same PyTorch model on channels_last tensors (convolutions that round in
another order), or --tolerance where that is larger.

    PYTHONPATH=... python3 examples/python/torch_train.py [--steps 60] [--batch 64] [--compile] [--json out.json]

The data are 16x16 single-channel images labelled by a fixed random "teacher" network, so the
task is learnable and needs no download. Runs where kiln's default context does (KILN_BACKEND).
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import kiln
import kiln.torch as kt


@kt.op
def layer_norm(x, gain, shift):
    """Layer norm over the last axis, one fused kiln kernel forward and one backward."""
    mu = kiln.mean(x, axis=-1, keepdims=True)
    return (x - mu) / kiln.sqrt(kiln.var(x, axis=-1, keepdims=True) + 1e-5) * gain + shift


class Net(torch.nn.Module):
    def __init__(self, use_kiln, device):
        super().__init__()
        conv = kt.Conv2d if use_kiln else torch.nn.Conv2d
        lin = kt.Linear if use_kiln else torch.nn.Linear
        relu = {"activation": "relu"} if use_kiln else {}
        self.use_kiln = use_kiln
        self.c1 = conv(1, 16, 3, padding=1, device=device, **relu)
        self.c2 = conv(16, 32, 3, stride=2, padding=1, device=device, **relu)
        self.fc1 = lin(32 * 8 * 8, 128, device=device, **relu)
        self.gain = torch.nn.Parameter(torch.ones(128, device=device))
        self.shift = torch.nn.Parameter(torch.zeros(128, device=device))
        self.fc2 = lin(128, 10, device=device)

    def forward(self, x):
        if self.use_kiln:
            h = self.c2(self.c1(x))
            h = self.fc1(h.flatten(1))
            h = layer_norm(h, self.gain, self.shift)
        else:
            h = F.relu(self.c2(F.relu(self.c1(x))))
            h = F.relu(self.fc1(h.flatten(1)))
            h = F.layer_norm(h, (128,), self.gain, self.shift, eps=1e-5)
        return self.fc2(h)


def batches(steps, batch, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(10, 256, generator=g)
    out = []
    for _ in range(steps):
        x = torch.randn(batch, 1, 16, 16, generator=g)
        y = (x.flatten(1) @ teacher.T).argmax(1)
        out.append((x.to(device), y.to(device)))
    return out


def train(model, data, compile_step, device):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    if compile_step:
        step = torch.compile(step)
    losses, times = [], []
    for x, y in data:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(x, y)
        lv = float(loss.detach())   # waits for the step
        times.append(time.perf_counter() - t0)
        losses.append(lv)
    return losses, times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--compile", action="store_true", help="torch.compile both training steps")
    ap.add_argument("--tolerance", type=float, default=2e-3, help="largest loss difference allowed (relative)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    backend = kiln.default_context().backend
    device = torch.device("cuda" if backend == "cuda" else "cpu")
    torch.manual_seed(0)
    ref = Net(False, device)
    net = Net(True, device)
    net.load_state_dict(ref.state_dict())
    data = batches(args.steps, args.batch, device)

    # The yardstick: the same PyTorch model on channels_last tensors, whose convolutions round in
    # another order. Training amplifies any rounding difference, so kiln's curve is held to the
    # distance between these two.
    ref_cl = Net(False, device).to(memory_format=torch.channels_last)
    ref_cl.load_state_dict(ref.state_dict())

    kiln_loss, kiln_t = train(net, data, args.compile, device)
    torch_loss, torch_t = train(ref, data, args.compile, device)
    cl_loss, _ = train(ref_cl, [(x.contiguous(memory_format=torch.channels_last), y) for x, y in data], args.compile, device)

    warm = min(10, args.steps // 2)   # first steps compile kernels (kiln's and torch.compile's)
    tk = statistics.median(kiln_t[warm:]) * 1e3
    tt = statistics.median(torch_t[warm:]) * 1e3
    def distance(a, b):
        return max(abs(u - v) / max(abs(v), 1e-6) for u, v in zip(a, b))

    worst, yardstick = distance(kiln_loss, torch_loss), distance(cl_loss, torch_loss)
    print(f"device: {device} ({backend}), batch {args.batch}, {args.steps} steps, "
          f"{'torch.compile' if args.compile else 'eager'}")
    print(f"{'step':>5} {'kiln loss':>10} {'torch loss':>10}")
    for i in sorted({0, 1, args.steps // 4, args.steps // 2, args.steps - 1}):
        print(f"{i:>5} {kiln_loss[i]:>10.5f} {torch_loss[i]:>10.5f}")
    print(f"time per step (median after {warm} warm-up steps): kiln {tk:.3f} ms, PyTorch {tt:.3f} ms")
    allowed = max(args.tolerance, 4 * yardstick)
    print(f"largest relative loss difference from PyTorch: kiln {worst:.2e}, PyTorch channels_last {yardstick:.2e} "
          f"(allowed: {allowed:.1e})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "batch": args.batch, "steps": args.steps, "compile": args.compile,
                       "kiln_loss": kiln_loss, "torch_loss": torch_loss, "kiln_ms": tk, "torch_ms": tt,
                       "max_rel_loss_diff": worst, "channels_last_max_rel_loss_diff": yardstick}, f, indent=1)
    if worst > allowed or not kiln_loss[-1] < kiln_loss[0]:
        print("FAILED: the loss curves differ (or kiln's did not fall)")
        sys.exit(1)


if __name__ == "__main__":
    main()
