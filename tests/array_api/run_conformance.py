"""Runs the Array API conformance suite (data-apis/array-api-tests, third-party and unmodified,
kept outside the project at ../shared/array-api-tests) against kiln on the CPU backend, and
reports the pass rate: every test, and the core tests (the standard's main namespace: not the
fft and linalg extensions, whose functions kiln does not claim).

    python tests/array_api/run_conformance.py [--suite DIR] [--max-examples N] [--json OUT]

The suite is copied to a scratch directory (its stubs expect a spec directory that the snapshot
does not carry, and its own files stay untouched) and run with pytest, derandomised (the same
examples every run), without Hypothesis's per-example deadline (a first call compiles a
kernel), complex skipped (kiln has no complex dtype: __array_namespace_info__ says so).

tests/array_api/xfails.txt lists the core tests known to fail, each under a comment giving the
reason. The run fails (exit 1) when a core test outside that list fails, when a listed test
passes (the list is kept exact), or when the core pass rate is below --min-core (percent);
failures outside the core are counted, not listed. Without the
suite, or without its Python requirements, it says so and exits 0: the suite is outside input.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
EXTENSIONS = ("test_fft.py", "test_linalg.py")   # the standard's extensions, not its core
SKIP_DTYPES = "complex64,complex128"


def is_core(nodeid):
    """A test of the core standard on real dtypes: not one of the extension modules, nor a check
    of an extension's names or signatures (ids [linalg-...], [fft.fft]), nor a special case of a complex argument
    (test_special_cases draws those from xp.complex128 whatever ARRAY_API_TESTS_SKIP_DTYPES says)."""
    if any(f"/{m}::" in nodeid for m in EXTENSIONS):
        return False
    if nodeid.startswith("array_api_tests/test_special_cases.py") and ("real(x" in nodeid or "imag(x" in nodeid):
        return False
    return not any(f"[{ext}{sep}" in nodeid for ext in ("fft", "linalg") for sep in "-.")


def read_xfails(path):
    """The listed test ids, each with the reason (the comment above it)."""
    out, reason = {}, ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            reason = line.lstrip("# ")
            continue
        out[line] = reason
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=os.environ.get("ARRAY_API_TESTS_DIR", str(ROOT.parent / "shared" / "array-api-tests")))
    ap.add_argument("--max-examples", type=int, default=5)
    ap.add_argument("--workers", default="auto", help="pytest-xdist workers")
    ap.add_argument("--json", help="write the summary (counts, pass rates, failures) here")
    ap.add_argument("--min-core", type=float, default=0.0, help="fail below this core pass rate (percent)")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (e.g. -k NAME)")
    args = ap.parse_args()

    suite = Path(args.suite)
    if not (suite / "array_api_tests").is_dir():
        print(f"array-api conformance: SKIPPED (no suite at {suite}; set ARRAY_API_TESTS_DIR or --suite)")
        return 0
    missing = [m for m in ("hypothesis", "ndindex", "pytest_jsonreport", "xdist") if _missing(m)]
    if missing:
        print(f"array-api conformance: SKIPPED (missing Python packages: {', '.join(missing)}; "
              "pip install hypothesis ndindex pytest-json-report pytest-xdist)")
        return 0

    xfails = read_xfails(HERE / "xfails.txt")
    with tempfile.TemporaryDirectory(prefix="kiln-array-api-") as tmp:
        work = Path(tmp) / "suite"
        shutil.copytree(suite, work, ignore=shutil.ignore_patterns(".git", "__pycache__"))
        (work / "array-api" / "spec" / "2025.12" / "API_specification").mkdir(parents=True, exist_ok=True)
        report = Path(tmp) / "report.json"
        env = dict(os.environ, ARRAY_API_TESTS_MODULE="kiln", ARRAY_API_TESTS_SKIP_DTYPES=SKIP_DTYPES,
                   KILN_BACKEND="cpu")
        cmd = [sys.executable, "-m", "pytest", "array_api_tests", "--disable-extension", "fft", "-q",
               "-p", "no:cacheprovider",
               f"--max-examples={args.max_examples}", "--derandomize", "--disable-deadline",
               "--json-report", f"--json-report-file={report}", "-n", args.workers, "--disable-warnings",
               f"--xfails-file={HERE / 'xfails.txt'}",
               *args.pytest_args]
        proc = subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if not report.exists():
            print(proc.stdout[-4000:])
            print("array-api conformance: the suite did not run (no report)")
            return 1
        tests = json.loads(report.read_text())["tests"]

    outcome = {t["nodeid"]: t["outcome"] for t in tests}
    messages = {t["nodeid"]: (t.get("call") or t.get("setup") or {}).get("crash", {}).get("message", "")[:300]
                for t in tests if t["outcome"] == "failed"}
    skip_reasons = {}   # the suite's own skips of core tests (dtypes kiln lacks, ...), by reason
    for t in tests:
        if t["outcome"] == "skipped" and is_core(t["nodeid"]):
            why = "?"
            for phase in ("setup", "call"):
                rep = str(t.get(phase, {}).get("longrepr") or "")
                if "Skipped: " in rep:
                    why = rep.rsplit("Skipped: ", 1)[-1].strip().rstrip("')\"")
                    break
            skip_reasons[why] = skip_reasons.get(why, 0) + 1
    counts = {"all": {}, "core": {}}
    for nodeid, o in outcome.items():
        for scope in ("all", "core") if is_core(nodeid) else ("all",):
            counts[scope][o] = counts[scope].get(o, 0) + 1

    def rate(c):
        ran = c.get("passed", 0) + c.get("failed", 0) + c.get("xfailed", 0) + c.get("xpassed", 0)
        return 100.0 * c.get("passed", 0) / ran if ran else 0.0

    unexpected = sorted(n for n, o in outcome.items() if o == "failed" and is_core(n))
    outside = sorted(n for n, o in outcome.items() if o == "failed" and not is_core(n))
    fixed = sorted(n for n, o in outcome.items() if o == "xpassed")
    stale = sorted(x for x in xfails if x not in outcome) if not args.pytest_args else []
    summary = {
        "counts": counts,
        "pass_rate_all": round(rate(counts["all"]), 1),
        "pass_rate_core": round(rate(counts["core"]), 1),
        "max_examples": args.max_examples,
        "unexpected_failures": {n: messages.get(n, "") for n in unexpected},
        "failures_outside_the_core": len(outside),
        "listed_but_passing": fixed,
        "listed_but_not_run": stale,
        "xfails": xfails,
        "skip_reasons": skip_reasons,
    }
    for scope in ("core", "all"):
        c = counts[scope]
        print(f"array-api conformance ({scope}): {c.get('passed', 0)} passed, {c.get('xfailed', 0)} known failures, "
              f"{c.get('failed', 0)} failures not listed, {c.get('xpassed', 0)} listed but passing, "
              f"{c.get('skipped', 0)} skipped; pass rate {rate(c):.1f}%")
    for n in unexpected:
        print(f"  unexpected failure: {n}")
    if outside:
        print(f"  ({len(outside)} failures outside the core: the fft and linalg extensions' names, complex special "
              "cases, which draw from xp.complex128)")
    for why, n in sorted(skip_reasons.items(), key=lambda kv: -kv[1]):
        print(f"  core tests skipped by the suite ({n}): {why}")
    for n in fixed:
        print(f"  listed in xfails.txt but passing (remove it): {n}")
    for n in stale:
        print(f"  listed in xfails.txt but not run (remove it): {n}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    ok = not unexpected and not fixed and rate(counts["core"]) >= args.min_core
    return 0 if ok else 1


def _missing(module):
    try:
        __import__(module)
        return False
    except ImportError:
        return True


if __name__ == "__main__":
    sys.exit(main())
