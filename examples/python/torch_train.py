"""A small convolutional classifier trained twice side by side: once with kiln's PyTorch modules
(kiln.torch.Conv2d and Linear with their ReLU in the kernel's epilogue, and a layer norm written
as a kiln expression whose backward pass kiln derives), once in pure PyTorch, from the same
initial weights on the same batches with the same optimiser, and the time per training step of
each is printed. The loss curves must agree (exit status 1 otherwise): training amplifies every
rounding difference, so kiln's distance from PyTorch's curve is held to four times the distance
between PyTorch's and the same PyTorch model on channels_last tensors (convolutions that round in
another order), or --tolerance where that is larger.

    PYTHONPATH=... python3 examples/python/torch_train.py [--steps 60] [--batch 64,512] [--modes eager,compile]
        [--json torch_train.json]

The data are 16x16 single-channel images labelled by a fixed random "teacher" network, so the
task is learnable and needs no download. Runs where kiln's default context does (KILN_BACKEND).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
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


def run(batch, steps, compile_step, device, tolerance):
    """Trains the three models on the same batches; returns the run's record and whether it passed."""
    torch.manual_seed(0)
    ref = Net(False, device)
    net = Net(True, device)
    net.load_state_dict(ref.state_dict())
    # The yardstick: the same PyTorch model on channels_last tensors, whose convolutions round in
    # another order. Training amplifies any rounding difference, so kiln's curve is held to the
    # distance between these two.
    ref_cl = Net(False, device).to(memory_format=torch.channels_last)
    ref_cl.load_state_dict(ref.state_dict())
    data = batches(steps, batch, device)

    kiln_loss, kiln_t = train(net, data, compile_step, device)
    torch_loss, torch_t = train(ref, data, compile_step, device)
    cl_loss, _ = train(ref_cl, [(x.contiguous(memory_format=torch.channels_last), y) for x, y in data], compile_step,
                       device)

    def distance(a, b):
        return max(abs(u - v) / max(abs(v), 1e-6) for u, v in zip(a, b))

    warm = min(10, steps // 2)   # first steps compile kernels (kiln's and torch.compile's)
    rec = {"batch": batch, "steps": steps, "mode": "torch.compile" if compile_step else "eager",
           "kiln_ms": statistics.median(kiln_t[warm:]) * 1e3, "torch_ms": statistics.median(torch_t[warm:]) * 1e3,
           "kiln_loss": kiln_loss, "torch_loss": torch_loss, "max_rel_loss_diff": distance(kiln_loss, torch_loss),
           "channels_last_max_rel_loss_diff": distance(cl_loss, torch_loss), "warmup_steps": warm}
    rec["allowed"] = max(tolerance, 4 * rec["channels_last_max_rel_loss_diff"])
    print(f"\nbatch {batch}, {steps} steps, {rec['mode']}")
    print(f"{'step':>5} {'kiln loss':>10} {'torch loss':>10}")
    for i in sorted({0, 1, steps // 4, steps // 2, steps - 1}):
        print(f"{i:>5} {kiln_loss[i]:>10.5f} {torch_loss[i]:>10.5f}")
    print(f"time per step (median after {warm} warm-up steps): kiln {rec['kiln_ms']:.3f} ms, "
          f"PyTorch {rec['torch_ms']:.3f} ms")
    print(f"largest relative loss difference from PyTorch: kiln {rec['max_rel_loss_diff']:.2e}, PyTorch channels_last "
          f"{rec['channels_last_max_rel_loss_diff']:.2e} (allowed: {rec['allowed']:.1e})")
    ok = rec["max_rel_loss_diff"] <= rec["allowed"] and kiln_loss[-1] < kiln_loss[0]
    if not ok:
        print("FAILED: the loss curves differ (or kiln's did not fall)")
    return rec, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", default="64", help="batch sizes, comma-separated")
    ap.add_argument("--modes", default="eager", help="eager and/or compile (torch.compile both training steps)")
    ap.add_argument("--tolerance", type=float, default=2e-3, help="the least loss difference allowed (relative)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    modes = args.modes.split(",")
    if any(m not in ("eager", "compile") for m in modes):
        ap.error(f"--modes {args.modes!r}: give eager and/or compile")

    backend = kiln.default_context().backend
    device = torch.device("cuda" if backend == "cuda" else "cpu")
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'} (kiln {backend}), "
          f"PyTorch {torch.__version__}")
    runs, ok = [], True
    for batch in (int(b) for b in args.batch.split(",")):
        for mode in modes:
            rec, passed = run(batch, args.steps, mode == "compile", device, args.tolerance)
            runs.append(rec)
            ok &= passed
    if args.json:
        commit = os.environ.get("KILN_COMMIT")
        if not commit:
            try:
                commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
            except OSError:
                commit = ""
        with open(args.json, "w") as f:
            json.dump({"benchmark": "torch_train", "device": torch.cuda.get_device_name() if device.type == "cuda"
                       else "cpu", "backend": backend, "torch": torch.__version__, "commit": commit or "unknown",
                       "date": datetime.date.today().isoformat(),
                       "method": "host clock around each training step (zero_grad, forward, cross-entropy, backward, "
                                 "SGD step) up to reading the loss, which waits for the GPU; median over the steps "
                                 "after warm-up; the same batches and initial weights for both",
                       "runs": runs}, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
