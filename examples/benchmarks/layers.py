"""The memory-bound layers (pooling, LRN, batch norm) beside PyTorch with cuDNN, on one GPU in one
process, against the copy bandwidth measured in the same run.

    PYTHONPATH=... python3 examples/benchmarks/layers.py [--dtypes float16,bfloat16,float32] [--json layers.json]

Each case is a layer of the seeds' networks at a batch whose input is 64 MiB or more: max pooling
3x3 stride 2 (ResNet's first), average pooling 2x2, LRN across 5 channels (AlexNet's), batch
norm's normalisation alone (inference: the running statistics) and batch norm in training (the
batch statistics, then the normalisation), forward and backward. kiln runs neon's functions
(fprop_pool, bprop_pool with max pooling's stored winners, fprop_lrn / bprop_lrn,
compound_fprop_bn / compound_bprop_bn) into tensors made once; PyTorch the same layer on
channels_last tensors (its backward through autograd.grad on a graph kept for it). Bytes: the
tensors each side must read and write, once each (kiln's LRN also writes the denominator its
backward pass reads; max pooling's backward reads the winners). Timing: host clock around
back-to-back calls bracketed by synchronize, median of batches after warm-up, the same for both.
Forward results are checked against PyTorch's (exit status 1 past a few units in the last place).
Prints a table and writes JSON (examples/benchmarks/perf_tables.py renders it into
docs/PERFORMANCE.md).
"""
import argparse
import datetime
import json
import sys

import numpy as np

import kiln
from bench_common import copy_bandwidth, git_commit, median_time_ms, torch_beside_kiln

DTYPES = ["float16", "bfloat16", "float32"]
# The largest forward error (relative to PyTorch's largest value) each dtype may carry: a few
# units in the last place, from rounding in a different order.
TOLERANCE = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 2e-5}
# The layers issue's bandwidth target covers these forward passes, which read their input once:
# pooling, LRN and batch norm's normalisation. Batch norm's training forward (statistics, then
# the normalisation) and the backward passes must read some tensors more than once.
TARGETED = {("max pool 3x3/2", "fprop"), ("avg pool 2x2/2", "fprop"), ("lrn 5", "fprop"), ("batch norm apply", "fprop")}
ASCALE, BPOWER, J = 1e-4, 0.75, 5
EPS = 1e-5


def host(t):
    """A PyTorch tensor (kiln's output through the view that shares its memory, or PyTorch's own)
    as float64 NumPy."""
    return t.detach().double().cpu().numpy()


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--json", default="layers.json")
    args = ap.parse_args()
    both = torch_beside_kiln("layers")
    if both is None:
        return 0
    torch, ctx = both
    F = torch.nn.functional
    torch.backends.cudnn.benchmark = True

    def sync():
        ctx.synchronize()
        torch.cuda.synchronize()

    bw = copy_bandwidth(torch)
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; copy bandwidth {bw:.0f} GB/s (torch device-to-device copy of 1 GiB, events)")
    result = {"benchmark": "layers", "device": dev, "date": datetime.date.today().isoformat(), "commit": git_commit(),
              "copy_gbs": bw, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
              "method": "host clock around back-to-back calls bracketed by synchronize, median of 7 batches of ~5 ms "
                        "after warm-up, the same for kiln and PyTorch (channels_last)",
              "cases": []}
    print(f"{'layer':<22} {'pass':<6} {'dtype':<9} {'input':<16} {'kiln ms':>8} {'torch ms':>9} {'kiln GB/s':>9} "
          f"{'%copy':>6} {'vs torch':>8} {'err':>8}")
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    gen = torch.Generator(device="cuda").manual_seed(1)
    failures = []
    for dt in args.dtypes.split(","):
        kdt = getattr(kiln, dt)
        size = 2 if dt != "float32" else 4

        def tensor(shape):
            """A random NHWC tensor: kiln's view and PyTorch's NCHW (channels_last) view of the same memory."""
            t = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(tdt[dt])
            return kiln.from_dlpack(t), t.permute(0, 3, 1, 2)

        def empty(shape, dtype=None):
            t = torch.empty(shape, device="cuda", dtype=dtype or tdt[dt])
            return kiln.from_dlpack(t), (t.permute(0, 3, 1, 2) if t.dim() == 4 else t)

        def case(name, pass_, shape, bytes_moved, run_kiln, run_torch, check=None):
            err = check() if check else None
            k_ms = median_time_ms(run_kiln, sync)
            t_ms = median_time_ms(run_torch, sync)
            gbs = bytes_moved / (k_ms * 1e-3) / 1e9
            row = {"layer": name, "pass": pass_, "dtype": dt, "shape": list(shape), "bytes": bytes_moved,
                   "kiln_ms": k_ms, "torch_ms": t_ms, "kiln_gbs": gbs, "pct_copy": 100 * gbs / bw,
                   "vs_torch": t_ms / k_ms, "err": err, "targeted": (name, pass_) in TARGETED}
            if err is not None and not err <= TOLERANCE[dt]:
                failures.append(f"{name} {pass_} {dt}: error {err:.3g} against PyTorch (at most {TOLERANCE[dt]:g})")
            result["cases"].append(row)
            es = f"{err:8.1e}" if err is not None else f"{'-':>8}"
            print(f"{name:<22} {pass_:<6} {dt:<9} {'x'.join(map(str, shape)):<16} {k_ms:8.4f} {t_ms:9.4f} {gbs:9.0f} "
                  f"{row['pct_copy']:5.0f}% {row['vs_torch']:7.2f}x {es}", flush=True)

        # ---- pooling: ResNet's max 3x3/2 pad 1 on (128, 112, 112, 64); average 2x2 on (128, 56, 56, 256)
        for op, shape, window, stride, pad in (("max", (128, 112, 112, 64), 3, 2, 1), ("avg", (128, 56, 56, 256), 2, 2, 0)):
            N, H, W, C = shape
            layer = kiln.pool_layer(kdt, op, N, C, H=H, W=W, R=window, S=window, pad_h=pad, pad_w=pad, str_h=stride,
                                    str_w=stride)
            oshape = tuple(layer.dimO)
            kx, tx = tensor(shape)
            ky, ty = empty(oshape)
            karg = empty(oshape, torch.int32)[0] if op == "max" else None
            ke, te = tensor(oshape)
            kg, _ = empty(shape)
            pool = (lambda t: F.max_pool2d(t, window, stride, pad)) if op == "max" else (lambda t: F.avg_pool2d(t, window, stride))
            name = f"{op} pool {window}x{window}/{stride}"
            out_bytes = int(np.prod(oshape)) * size
            in_bytes = int(np.prod(shape)) * size
            arg_bytes = int(np.prod(oshape)) * 4 if op == "max" else 0
            case(name, "fprop", shape, in_bytes + out_bytes + arg_bytes,
                 lambda: kiln.fprop_pool(layer, kx, ky, argmax=karg), lambda: pool(tx),
                 lambda: (kiln.fprop_pool(layer, kx, ky, argmax=karg), sync(), rel_err(host(ty), host(pool(tx))))[-1])
            txg = tx.detach().requires_grad_(True)
            tyg = pool(txg)
            case(name, "bprop", shape, out_bytes + arg_bytes + in_bytes,
                 lambda: kiln.bprop_pool(layer, ke, kg, argmax=karg, X=kx, Y=ky),
                 lambda: torch.autograd.grad(tyg, txg, te, retain_graph=True))
            del kx, tx, ky, ty, ke, te, kg, txg, tyg, karg

        # ---- LRN across 5 channels on AlexNet's first map at N=128: (128, 55, 55, 96)
        shape = (128, 55, 55, 96)
        N, H, W, C = shape
        layer = kiln.lrn_layer(kdt, N, C, H=H, W=W, J=J)
        kx, tx = tensor(shape)
        ky, ty = empty(shape)
        kd, _ = empty(shape)
        ke, te = tensor(shape)
        kg, _ = empty(shape)
        nbytes = int(np.prod(shape)) * size
        lrn = lambda t: F.local_response_norm(t, J, alpha=ASCALE * J, beta=BPOWER, k=1.0)
        case("lrn 5", "fprop", shape, 3 * nbytes,
             lambda: kiln.fprop_lrn(layer, kx, ky, kd, ascale=ASCALE, bpower=BPOWER), lambda: lrn(tx),
             lambda: (kiln.fprop_lrn(layer, kx, ky, kd, ascale=ASCALE, bpower=BPOWER), sync(),
                      rel_err(host(ty), host(lrn(tx))))[-1])
        txg = tx.detach().requires_grad_(True)
        tyg = lrn(txg)
        case("lrn 5", "bprop", shape, 5 * nbytes,
             lambda: kiln.bprop_lrn(layer, kx, ky, ke, kg, kd, ascale=ASCALE, bpower=BPOWER),
             lambda: torch.autograd.grad(tyg, txg, te, retain_graph=True))
        del kx, tx, ky, ty, kd, ke, te, kg, txg, tyg

        # ---- batch norm on a ResNet map at N=128: (128, 56, 56, 256), per-channel statistics float32
        shape = (128, 56, 56, 256)
        C = shape[-1]
        kx, tx = tensor(shape)
        ky, ty = empty(shape)
        ke, te = tensor(shape)
        kg, _ = empty(shape)
        vec = lambda v: (kiln.from_dlpack(v), v)
        gamma = torch.rand(C, generator=gen, device="cuda") + 0.5
        beta = torch.randn(C, generator=gen, device="cuda")
        rmean = torch.randn(C, generator=gen, device="cuda") * 0.1
        rvar = torch.rand(C, generator=gen, device="cuda") + 0.5
        kgamma, kbeta = vec(gamma)[0], vec(beta)[0]
        kmean, kvar = vec(rmean.clone())[0], vec(rvar.clone())[0]
        ksum, kxvar = vec(torch.empty(C, device="cuda"))[0], vec(torch.empty(C, device="cuda"))[0]
        kdg, kdb = vec(torch.empty(C, device="cuda"))[0], vec(torch.empty(C, device="cuda"))[0]
        nbytes = int(np.prod(shape)) * size
        tgamma, tbeta = gamma, beta   # float32 parameters and statistics, as mixed precision keeps them

        def bn_apply():
            kiln.compound_fprop_bn(kx, ksum, kxvar, kmean, kvar, kgamma, kbeta, ky, EPS, 0.9, True, inference=True)

        t_apply = lambda: F.batch_norm(tx, rmean, rvar, tgamma, tbeta, training=False, eps=EPS)
        case("batch norm apply", "fprop", shape, 2 * nbytes, bn_apply, t_apply,
             lambda: (bn_apply(), sync(), rel_err(host(ty), host(t_apply())))[-1])
        tm, tv = rmean.clone(), rvar.clone()

        def bn_train():
            kiln.compound_fprop_bn(kx, ksum, kxvar, kmean, kvar, kgamma, kbeta, ky, EPS, 0.9, True)

        t_train = lambda: F.batch_norm(tx, tm, tv, tgamma, tbeta, training=True, momentum=0.1, eps=EPS)
        case("batch norm", "fprop", shape, 2 * nbytes, bn_train, t_train,
             lambda: (bn_train(), sync(), rel_err(host(ty), host(t_train())))[-1])
        txg = tx.detach().requires_grad_(True)
        tg, tb = tgamma.detach().requires_grad_(True), tbeta.detach().requires_grad_(True)
        tyg = F.batch_norm(txg, tm, tv, tg, tb, training=True, momentum=0.1, eps=EPS)
        bn_train()
        case("batch norm", "bprop", shape, 3 * nbytes,
             lambda: kiln.compound_bprop_bn(kg, kdg, kdb, ke, kx, ksum, kxvar, kgamma, EPS),
             lambda: torch.autograd.grad(tyg, (txg, tg, tb), te, retain_graph=True))
        del kx, tx, ky, ty, ke, te, kg, txg, tyg
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"json: {args.json}")
    for f in failures:
        print(f"layers: WRONG RESULT: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
