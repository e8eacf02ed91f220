"""python -m kiln.warmup: the kiln-warmup tool installed with the package (see docs/warmup.md).

    python -m kiln.warmup manifest.jsonl --arch sm_80,sm_90,cpu [--cache-dir DIR] [--jobs N] [--check] [--prune SIZE]

``--arch cpu`` compiles for this host's CPU (kiln's CPU backend), ``native`` for this host's CPU
and CUDA devices.
"""
import os
import shutil
import subprocess
import sys


def tool():
    """The kiln-warmup executable: inside this package (a wheel), else on PATH; None if absent."""
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kiln-warmup")
    if os.path.exists(exe):
        return exe
    return shutil.which("kiln-warmup")


def main(argv=None):
    exe = tool()
    if exe is None:
        print("kiln-warmup: the tool is not installed with this kiln (it is built when LLVM, for the CPU backend, or "
              "the CUDA toolkit's NVRTC is found)", file=sys.stderr)
        return 2
    return subprocess.call([exe] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
