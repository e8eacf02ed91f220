"""Whole networks through kiln.layers against PyTorch with cuDNN (channels_last, eager and
torch.compile) on the same GPU in one run.

AlexNet and Overfeat (N=128), VGG-A (N=64) and ResNet-50 (N=256) as examples/convnets.py defines
them, float16 and bfloat16: fprop, and fprop+bprop (every parameter's gradient: the filters',
the biases', batch norm's; not the input image's, which neither side computes: kiln's first layer
skips it, input_grad=False, and PyTorch's input does not require grad) per iteration, host clock around back-to-back iterations bracketed by
synchronize, median of batches after warm-up; then a per-layer breakdown (each layer's fprop and
bprop timed alone, kiln beside the same PyTorch module in eager mode). Before timing, one iteration
of each network at a small batch, from the same weights and input, is checked against PyTorch in
float64, kiln's float32 and PyTorch's float32 alike: the logits and every parameter's gradient
(check_float32 says how). Prints tables and writes JSON.

    PYTHONPATH=... python3 examples/benchmarks/convnets.py [--nets alexnet,resnet50] [--dtypes float16]
        [--no-compile] [--no-layers] [--check-only] [--json convnets.json]
"""
import argparse
import datetime
import json
import math
import os
import sys

import importlib.util

import numpy as np

import kiln
from bench_common import git_commit, median_time_ms, torch_beside_kiln
from kiln.layers import FC, BatchNorm, Conv, Pool, ReLU, Residual

# examples/convnets.py, the networks as kiln.layers (loaded by path: this file has its name).
_spec = importlib.util.spec_from_file_location(
    "convnet_definitions", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "convnets.py"))
networks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(networks)

NETS = ("alexnet", "overfeat", "vgg_a", "resnet50")


def torch_network(torch, net):
    """The PyTorch twin of a configured kiln.layers Network: the same layers in order, on NCHW
    tensors (channels_last in memory), FC flattening in kiln's NHWC order; weights not set."""
    nn = torch.nn

    class FlattenNHWC(nn.Module):
        def forward(self, x):
            return x.permute(0, 2, 3, 1).flatten(1) if x.dim() == 4 else x

    class ResidualBlock(nn.Module):
        def __init__(self, branch, shortcut):
            super().__init__()
            self.branch, self.shortcut = branch, shortcut

        def forward(self, x):
            return torch.relu(self.branch(x) + self.shortcut(x))

    def module(layer):
        if isinstance(layer, Conv):
            C = layer.in_shape[3]
            conv = nn.Conv2d(C, layer.K, (layer.R, layer.S), stride=layer.stride, padding=layer.pad, bias=layer.use_bias)
            return nn.Sequential(conv, nn.ReLU()) if layer.relu else conv
        if isinstance(layer, Pool):
            if layer.op == "max":
                return nn.MaxPool2d(layer.window, layer.stride, layer.pad)
            if layer.op == "avg" and layer.pad == 0:
                return nn.AvgPool2d(layer.window, layer.stride)
            raise ValueError(f"convnets: no PyTorch twin for {layer.op} pooling with padding {layer.pad}")
        if isinstance(layer, BatchNorm):
            bn = nn.BatchNorm2d(layer.in_shape[-1], eps=layer.eps, momentum=1 - layer.rho)
            return nn.Sequential(bn, nn.ReLU()) if layer.relu else bn
        if isinstance(layer, FC):
            fc = nn.Linear(int(np.prod(layer.in_shape[1:])), layer.K, bias=layer.use_bias)
            seq = [FlattenNHWC(), fc] + ([nn.ReLU()] if layer.relu else [])
            return nn.Sequential(*seq)
        if isinstance(layer, ReLU):
            return nn.ReLU()
        if isinstance(layer, Residual):
            return ResidualBlock(nn.Sequential(*map(module, layer.branch)), nn.Sequential(*map(module, layer.shortcut)))
        raise ValueError(f"convnets: no PyTorch twin for {type(layer).__name__}")

    return nn.Sequential(*map(module, net.layers))


def leaves(layers):
    """kiln layers in execution order, Residual blocks opened (branch, then shortcut)."""
    for layer in layers:
        if isinstance(layer, Residual):
            yield from leaves(layer.branch)
            yield from leaves(layer.shortcut)
        else:
            yield layer


def copy_weights(torch, net, model):
    """kiln's parameters into the twin: filters KRSC -> KCRS, FC weights as they are (the twin
    flattens NHWC), batch norm's gamma and beta."""
    params = [p for layer in leaves(net.layers) for p in layer.params()]
    tensors = [t for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear, torch.nn.BatchNorm2d))
               for t in ([m.weight] + ([m.bias] if m.bias is not None else []))]
    if len(params) != len(tensors):
        raise RuntimeError(f"convnets: kiln has {len(params)} parameters, the twin {len(tensors)}")
    with torch.no_grad():
        for (p, _), t in zip(params, tensors):
            v = torch.from_numpy(np.asarray(p, dtype=np.float32).copy())
            if v.dim() == 4:
                v = v.permute(0, 3, 1, 2)
            t.copy_(v.reshape(t.shape))


def check_float32(torch, name, N):
    """One iteration of network `name` at batch N, from the same weights and input: kiln in float32
    and PyTorch in float32, each against PyTorch in float64. Per result (the logits, each parameter's
    gradient) two errors: normwise, |a - ref| / |ref| (2-norms), and the largest element's,
    max |a - ref| / max |ref|; reported: the logits' and the worst parameter's. The elementwise
    measure sees a single ReLU whose float32 pre-activation lands on the other side of zero (its
    gradient element then differs by all of its value), which either float32 side may meet;
    the normwise one weighs it by its share of the whole."""
    import copy
    ctx = kiln.default_context()
    net = networks.build(name, dtype=kiln.float32, ctx=ctx, N=N, seed=3)
    model = torch_network(torch, net).cuda().to(memory_format=torch.channels_last)
    copy_weights(torch, net, model)   # (params() allocates kiln's, He-initialised, on first use)
    model64 = copy.deepcopy(model).double()
    rng = np.random.default_rng(4)
    x = rng.standard_normal(net.layers[0].in_shape).astype(np.float32)
    e = (rng.standard_normal(net.out_shape) / N).astype(np.float32)
    y = net.fprop(ctx.array(x, kiln.float32))
    net.bprop(ctx.array(e, kiln.float32), input_grad=False)

    def torch_run(m, dt):
        tx = torch.from_numpy(x).cuda().to(dt).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        m.train()
        ty = m(tx)
        ty.backward(torch.from_numpy(e).cuda().to(dt))
        grads = []
        for mod in m.modules():
            if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear, torch.nn.BatchNorm2d)):
                for t in [mod.weight] + ([mod.bias] if mod.bias is not None else []):
                    g = t.grad.detach().double().cpu()
                    grads.append((g.permute(0, 2, 3, 1) if g.dim() == 4 else g).numpy())
        return ty.detach().double().cpu().numpy(), grads

    ref_y, ref_g = torch_run(model64, torch.float64)
    t_y, t_g = torch_run(model, torch.float32)
    k_g = [np.asarray(g, dtype=np.float64) for layer in leaves(net.layers) for _, g in layer.params()]
    if len(k_g) != len(ref_g):
        raise RuntimeError(f"convnets: kiln has {len(k_g)} gradients, the twin {len(ref_g)}")

    def errors(a, b):
        a, b = np.asarray(a, dtype=np.float64).reshape(b.shape), np.asarray(b, dtype=np.float64)
        return (float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)),
                float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)))

    out = {}
    for who, ys, gs in (("kiln", y, k_g), ("torch32", t_y, t_g)):
        out[f"{who}_logits"], _ = errors(ys, ref_y)
        per = [errors(g, r) for g, r in zip(gs, ref_g)]
        out[f"{who}_grads"] = max(p[0] for p in per)
        out[f"{who}_grads_max"] = max(p[1] for p in per)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-layers", action="store_true", help="skip the per-layer breakdown")
    ap.add_argument("--check-batch", type=int, default=8, help="the float32 check's batch size")
    ap.add_argument("--check-only", action="store_true", help="only the float32 check against float64, no timing")
    ap.add_argument("--conv-sums", action="store_true",
                    help="batch norms take their sums from the convolution before them (Network's conv_sums)")
    ap.add_argument("--json", default="convnets.json")
    args = ap.parse_args()
    both = torch_beside_kiln("convnets")
    if both is None:
        return 0
    torch, ctx = both
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False

    def sync():
        ctx.synchronize()
        torch.cuda.synchronize()

    timing = dict(target_ms=50.0, batches=5, warmup=2, most_calls=50, least_calls=2)
    dev = torch.cuda.get_device_name()
    result = {"device": dev, "date": datetime.date.today().isoformat(), "commit": git_commit(),
              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "kiln": kiln.__version__,
              "conv_sums": args.conv_sums,
              "method": "host clock around back-to-back iterations bracketed by synchronize, median of 5 batches "
                        "after warm-up; PyTorch channels_last with cudnn.benchmark, eager and torch.compile; "
                        "kiln.layers NHWC",
              "checks": [], "networks": [], "layers": []}
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}
    kdt = {"float16": kiln.float16, "bfloat16": kiln.bfloat16}
    for name in args.nets.split(","):
        c = check_float32(torch, name, args.check_batch)
        result["checks"].append({"net": name, "N": args.check_batch, **c})
        print(f"{name}: float32 against float64 at N={args.check_batch}: logits kiln {c['kiln_logits']:.1e} "
              f"(PyTorch float32 {c['torch32_logits']:.1e}); worst gradient kiln {c['kiln_grads']:.1e} "
              f"({c['torch32_grads']:.1e}), its largest element kiln {c['kiln_grads_max']:.1e} "
              f"({c['torch32_grads_max']:.1e})", flush=True)
    timed = [] if args.check_only else args.nets.split(",")
    if timed:
        print(f"\n{'net':<9} {'dtype':<8} {'pass':<11} {'kiln ms':>9} {'eager ms':>9} {'compile ms':>10} "
              f"{'vs eager':>8} {'vs compile':>10} {'kiln img/s':>10}")
    for name in timed:
        for dt in args.dtypes.split(","):
            net = networks.build(name, dtype=kdt[dt], ctx=ctx, seed=1, conv_sums=args.conv_sums)
            N = net.layers[0].in_shape[0]
            x = ctx.array(np.random.default_rng(2).standard_normal(net.layers[0].in_shape).astype(np.float32), kdt[dt])
            e = ctx.array((np.random.default_rng(5).standard_normal(net.out_shape) / N).astype(np.float32), kdt[dt])
            model = torch_network(torch, net).cuda().to(dtype=tdt[dt], memory_format=torch.channels_last)
            tx = torch.randn(N, 3, *net.layers[0].in_shape[1:3], device="cuda", dtype=tdt[dt]).contiguous(
                memory_format=torch.channels_last)
            te = torch.randn(*net.out_shape, device="cuda", dtype=tdt[dt]) / N

            def torch_step(m, backward):
                def step():
                    if backward:
                        for p in model.parameters():
                            p.grad = None
                        m(tx).backward(te)
                    else:
                        with torch.no_grad():
                            m(tx)
                return step

            runs = {"fprop": (lambda: net.fprop(x), torch_step(model, False)),
                    "fprop+bprop": (lambda: (net.fprop(x), net.bprop(e, input_grad=False)), torch_step(model, True))}
            compiled = None if args.no_compile else torch.compile(model)
            for pass_, (run_kiln, run_eager) in runs.items():
                k_ms = median_time_ms(run_kiln, sync, **timing)
                t_ms = median_time_ms(run_eager, sync, **timing)
                c_ms = (median_time_ms(torch_step(compiled, pass_ != "fprop"), sync, **timing)
                        if compiled is not None else None)
                row = {"net": name, "dtype": dt, "pass": pass_, "N": N, "flops": net.flops * (3 if pass_ != "fprop" else 1),
                       "kiln_ms": k_ms, "eager_ms": t_ms, "compile_ms": c_ms, "vs_eager": t_ms / k_ms,
                       "vs_compile": c_ms / k_ms if c_ms else None}
                result["networks"].append(row)
                cs = f"{c_ms:10.2f}" if c_ms else f"{'-':>10}"
                vc = f"{row['vs_compile']:9.2f}x" if c_ms else f"{'-':>10}"
                print(f"{name:<9} {dt:<8} {pass_:<11} {k_ms:9.2f} {t_ms:9.2f} {cs} {row['vs_eager']:7.2f}x {vc} "
                      f"{N / k_ms * 1e3:10.0f}", flush=True)
            if not args.no_layers:
                layer_breakdown(torch, net, model, x, tx, sync, name, dt, result)
            del net, model, compiled, x, e, tx, te
            torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


def layer_breakdown(torch, net, model, x, tx, sync, name, dt, result):
    """Each top-level layer's fprop and bprop timed alone, kiln beside its PyTorch module (eager):
    the layer's input from one fprop of the network, a random error of its output's shape."""
    timing = dict(target_ms=10.0, batches=3, warmup=1, most_calls=100, least_calls=2)
    kin, tin = x, tx
    for i, (layer, mod) in enumerate(zip(net.layers, model)):
        kout = layer.fprop(kin)
        tin_l = tin.detach().requires_grad_(True)
        tout = mod(tin_l)
        ke = kiln.default_context().empty(kout.shape, kout.dtype)
        ke[...] = kout * 0.5
        te = torch.randn_like(tout) * 0.5

        def t_bprop():
            tin_l.grad = None
            for p in mod.parameters():
                p.grad = None
            mod(tin_l).backward(te)

        row = {"net": name, "dtype": dt, "index": i, "layer": repr(layer).split("(")[0],
               "shape": list(layer.out_shape), "flops": layer.flops,
               "kiln_fprop_ms": median_time_ms(lambda: layer.fprop(kin), sync, **timing),
               "eager_fprop_ms": median_time_ms(lambda: mod(tin_l), sync, **timing),
               "kiln_bprop_ms": median_time_ms(lambda: layer.bprop(ke), sync, **timing),
               "eager_fwd_bwd_ms": median_time_ms(t_bprop, sync, **timing)}
        row["eager_bprop_ms"] = max(row["eager_fwd_bwd_ms"] - row["eager_fprop_ms"], 0.0)
        result["layers"].append(row)
        print(f"   {name:<9} {dt:<8} {i:3d} {row['layer']:<9} fprop {row['kiln_fprop_ms']:7.3f} / "
              f"{row['eager_fprop_ms']:7.3f} ms  bprop {row['kiln_bprop_ms']:7.3f} / {row['eager_bprop_ms']:7.3f} ms",
              flush=True)
        kin, tin = kout, tout.detach()


if __name__ == "__main__":
    sys.exit(main())
