# Lays out an importable `kiln` package in the build tree (links to the Python sources, the
# built extension and kiln-warmup), so tests can run against a build without installing it:
#   PYTHONPATH=<build>/bindings/python/pkg python -m pytest tests/python
import os
import sys

out, inputs = sys.argv[1], sys.argv[2:]
pkg = os.path.join(out, "kiln")
os.makedirs(pkg, exist_ok=True)
for f in inputs:
    dst = os.path.join(pkg, os.path.basename(f))
    if os.path.lexists(dst):
        os.remove(dst)
    os.symlink(os.path.abspath(f), dst)
os.utime(out)
