"""tests/array_api/run_conformance.py's own rules: which of the conformance suite's tests count as
the core, how the known-failures list is read, and that it says SKIPPED without the suite."""
import importlib.util
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parent.parent / "array_api" / "run_conformance.py"
spec = importlib.util.spec_from_file_location("run_conformance", RUNNER)
rc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rc)


def test_core_leaves_out_the_extensions_and_complex_special_cases():
    assert rc.is_core("array_api_tests/test_sorting_functions.py::test_sort")
    assert rc.is_core("array_api_tests/test_special_cases.py::test_binary[floor_divide(x1_i is +0) -> +0]")
    assert not rc.is_core("array_api_tests/test_linalg.py::test_vecdot")
    assert not rc.is_core("array_api_tests/test_fft.py::test_fft")
    assert not rc.is_core("array_api_tests/test_has_names.py::test_has_names[linalg-cholesky]")
    assert rc.is_core("array_api_tests/test_has_names.py::test_has_names[sorting-sort]")
    assert not rc.is_core("array_api_tests/test_special_cases.py::test_unary[exp(real(x_i) is +0 and imag(x_i) is +0) -> 1 + 0j]")


def test_every_known_failure_has_a_reason_and_runs_once():
    listed = rc.read_xfails(RUNNER.parent / "xfails.txt")
    assert listed and all(reason for reason in listed.values())
    assert all(rc.is_core(n) for n in listed)
    lines = [ln for ln in (RUNNER.parent / "xfails.txt").read_text().splitlines() if ln.startswith("array_api_tests")]
    assert len(lines) == len(set(lines))


def test_without_the_suite_it_says_skipped(tmp_path):
    out = subprocess.run([sys.executable, str(RUNNER), "--suite", str(tmp_path / "none")], capture_output=True, text=True)
    assert out.returncode == 0
    assert "array-api conformance: SKIPPED (no suite at" in out.stdout


def test_extension_signatures_are_outside_the_core():
    assert not rc.is_core("array_api_tests/test_signatures.py::test_extension_func_signature[linalg.cholesky]")
    assert not rc.is_core("array_api_tests/test_signatures.py::test_extension_func_signature[fft.fft]")
    assert rc.is_core("array_api_tests/test_signatures.py::test_func_signature[matmul]")
