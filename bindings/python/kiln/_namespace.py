"""The Python Array API standard's entry points: an array names its namespace
(``x.__array_namespace__()``, which is the kiln module), and ``kiln.__array_namespace_info__()``
describes it: kiln's devices, its dtypes by kind, its default dtypes and its capabilities. kiln's
dtypes are float64, float32, float16, bfloat16, int64, int32, int16, int8, uint64, uint32, uint16,
uint8 and bool; the info lists the standard's among them (float16 and bfloat16 are kiln's own
extensions; the complex dtypes are not kiln's)."""
import sys

from . import _dtypes
from ._context import default_context

# The standard's revisions an api_version argument may name.
_REVISIONS = ("2021.12", "2022.12", "2023.12", "2024.12", "2025.12")

_KINDS = {
    "bool": ("bool",),
    "signed integer": ("int8", "int16", "int32", "int64"),
    "unsigned integer": ("uint8", "uint16", "uint32", "uint64"),
    "integral": ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"),
    "real floating": ("float32", "float64"),
    "complex floating": (),
    "numeric": ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64"),
}
_BY_NAME = {"bool": _dtypes.bool_, "int8": _dtypes.int8, "int16": _dtypes.int16, "int32": _dtypes.int32,
            "int64": _dtypes.int64, "uint8": _dtypes.uint8, "uint16": _dtypes.uint16, "uint32": _dtypes.uint32,
            "uint64": _dtypes.uint64, "float32": _dtypes.float32, "float64": _dtypes.float64}


def array_namespace(self, api_version=None):
    """The kiln module, the namespace of this array's functions. api_version: None or a revision
    of the standard ('2021.12' ... '2025.12')."""
    if api_version is not None and api_version not in _REVISIONS:
        raise ValueError(f"__array_namespace__: api_version={api_version!r}; kiln answers to None or one of "
                         f"{', '.join(_REVISIONS)}")
    return sys.modules["kiln"]


def _check_device(device, what):
    if device is not None and device not in _Info().devices():
        raise ValueError(f"{what}: device={device!r}; this process's devices are {_Info().devices()}")


class _Info:
    """What kiln's namespace holds (the standard's __array_namespace_info__ object)."""

    def capabilities(self):
        # A boolean mask indexes, and nonzero and the unique family have results whose shapes
        # depend on the data (kiln/_host_functions.py: computed on the host, as no kernel's
        # shape can); ranks are not limited.
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": None}

    def default_device(self):
        return default_context().device

    def devices(self):
        here = default_context().device
        return ("cpu",) if here == "cpu" else ("cpu", here)

    def default_dtypes(self, *, device=None):
        _check_device(device, "default_dtypes")
        return {"real floating": _dtypes.float32, "complex floating": None, "integral": _dtypes.int32,
                "indexing": _dtypes.int32}

    def dtypes(self, *, device=None, kind=None):
        _check_device(device, "dtypes")
        kinds = (kind,) if isinstance(kind, str) or kind is None else tuple(kind)
        names = []
        for k in kinds:
            if k is None:
                names += [n for n in _BY_NAME]
                continue
            if k not in _KINDS:
                raise ValueError(f"dtypes: kind={k!r}; the kinds are {', '.join(repr(x) for x in _KINDS)}")
            names += list(_KINDS[k])
        return {n: _BY_NAME[n] for n in _BY_NAME if n in names}


def array_namespace_info():
    """The standard's inspection object for kiln's namespace: capabilities(), default_device(),
    devices(), default_dtypes() and dtypes()."""
    return _Info()
