"""Writes docs/PERFORMANCE.md's fusion table from vs_torch.py's JSON.

    python examples/benchmarks/perf_tables.py vs_torch.json [--doc docs/PERFORMANCE.md] [--command "..."]

The table replaces what stands between the markers `<!-- vs_torch:begin -->` and
`<!-- vs_torch:end -->` (added at the end of the document when it has none), so the document
always shows the last run's numbers with that run's device, date, commit and method.
"""
import argparse
import json
import math
import re
import sys

BEGIN, END = "<!-- vs_torch:begin -->", "<!-- vs_torch:end -->"


def render(r, command):
    cases = r["cases"]
    out = [BEGIN, "",
           f"- Device: {r['device']}; copy bandwidth measured in the run: {r['copy_gbs']:.0f} GB/s "
           "(PyTorch device-to-device copy of 1 GiB, events).",
           f"- Date: {r['date']}. Commit: {r['commit']}. PyTorch {r['torch']}.",
           f"- Command: `{command}`.",
           f"- Method: {r['method']}. Bytes: every input read once and every output written once. "
           "Every result checked against float64 (`err`: largest error relative to the result's scale).",
           ""]
    ratios = [c["vs_compile"] for c in cases if "vs_compile" in c]
    if ratios:
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        worst = min((c for c in cases if "vs_compile" in c), key=lambda c: c["vs_compile"])
        by = ", ".join(f"{d} {v:.2f}x" for d, v in r.get("geomean_vs_compile_by_dtype", {}).items())
        big = [c for c in cases if c["bytes"] >= 64 << 20]
        out += [f"Geometric mean of torch.compile ms / kiln ms: **{gm:.2f}x** ({by}); ahead (>= 1.0x) in "
                f"{sum(x >= 1.0 for x in ratios)} of {len(ratios)}, below 0.95x in {sum(x < 0.95 for x in ratios)}; "
                f"worst {worst['case']} {worst['dtype']} {worst['shape'][0]}x{worst['shape'][1]} "
                f"{worst['vs_compile']:.2f}x. Cases moving >= 64 MiB at >= 90% of the copy bandwidth: "
                f"{sum(c['kiln_pct_copy'] >= 90 for c in big)} of {len(big)}.", ""]
    has_eager = any("eager_ms" in c for c in cases)
    head = "| case | dtype | shape | kiln ms | " + ("eager ms | " if has_eager else "") + \
           "torch.compile ms | kiln GB/s | % of copy | vs torch.compile | err |"
    out += [head, "|" + " --- |" * 3 + " ---: |" * (head.count("|") - 4)]
    for c in cases:
        cells = [c["case"], c["dtype"], f"{c['shape'][0]}x{c['shape'][1]}", f"{c['kiln_ms']:.4f}"]
        if has_eager:
            cells.append(f"{c['eager_ms']:.4f}" if "eager_ms" in c else "")
        cells += [f"{c['compile_ms']:.4f}" if "compile_ms" in c else "", f"{c['kiln_gbs']:.0f}",
                  f"{c['kiln_pct_copy']:.0f}%", f"{c['vs_compile']:.2f}x" if "vs_compile" in c else "",
                  f"{c['error']['kiln']:.1e}"]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", END]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--doc", default="docs/PERFORMANCE.md")
    ap.add_argument("--command", default="python3 examples/benchmarks/vs_torch.py --json vs_torch.json")
    args = ap.parse_args()
    with open(args.json) as f:
        r = json.load(f)
    table = render(r, args.command)
    with open(args.doc) as f:
        doc = f.read()
    if BEGIN in doc and END in doc:
        doc = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: table, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n## CUDA backend beside PyTorch: fused expressions (examples/benchmarks/vs_torch.py)\n\n" \
            + table + "\n"
    with open(args.doc, "w") as f:
        f.write(doc)
    print(f"{args.doc}: {len(r['cases'])} cases from {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
