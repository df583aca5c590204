"""The dump format on disk: file names, constants, how dtypes and JSON values are stored.

Shared by the writer and the reader (:mod:`.writer`, :mod:`.reader`); the manifest's
schema is :mod:`ascend_emu.analysis.schema`.
"""
from __future__ import annotations

import hashlib
import math
import re

import ml_dtypes
import numpy as np

FORMAT = "ascend-emu-dump"
VERSION = 1
MANIFEST = "manifest.json"
MARKER = "INCOMPLETE"
_TMP_MANIFEST = ".manifest.json.tmp"
LOCK = ".ascend-emu.lock"
_MARKER_HEAD = "dump being written by ascend-emu; files created:\n"
#: the name of a tensor file the writer makes: sanitised stem ("~k" if it collides), output index, .npy
_TENSOR_FILE = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-~]*\.[0-9]+\.npy$")
KINDS = ("npu", "bench")
#: elements per chunk when statistics stream over a tensor in float64 (fits in L2 cache)
CHUNK = 1 << 16
#: longest sanitised op name used in a file name (file systems allow 255 bytes)
_MAX_STEM = 120
#: ml_dtypes types np.save cannot describe, stored as unsigned ints of the same width
_ML_DTYPES = {name: np.dtype(getattr(ml_dtypes, name)) for name in (
    "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz")
    if hasattr(ml_dtypes, name)}
_STAT_FIELDS = ("max", "min", "mean", "l2norm")
#: formats no numpy or ml_dtypes type holds (the 950's HiFloat8, FP4 E1M2, the E8M0 scale): a tensor of one is
#: stored as its uint8 codes and read back widened exactly to float32 (numerics.lowfloat.decode)
CODED_FORMATS = ("hifloat8", "float4_e1m2", "float8_e8m0")


class Coded:
    """An output the writer stores as codes of ``fmt`` (one of :data:`CODED_FORMATS`): ``values`` holds the
    format's values exactly (float16 or float32); ``codes``, if the maker has them, their uint8 codes (else the
    writer encodes the values)."""

    __slots__ = ("values", "fmt", "codes")

    def __init__(self, values, fmt: str, codes=None):
        if fmt not in CODED_FORMATS:
            raise ValueError(f"not a coded format: {fmt!r}")
        self.values, self.fmt, self.codes = values, fmt, codes


#: largest manifest read (the manifest of a very large model is a few MB)
MAX_MANIFEST_BYTES = 256 << 20


# --------------------------------------------------------------------------- JSON helpers

#: the dtype recorded for a TF variant output (a TensorList), which has no tensor file
VARIANT = "variant"

def _encode_float(x: float):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


# how JSON holds non-finite floats (_encode_float writes them, _decode_float reads them back)
_NONFINITE = ("nan", "inf", "-inf")


def _decode_float(x):
    if isinstance(x, str) and x in _NONFINITE:
        return float(x)
    return x


def json_safe(value):
    """``value`` made JSON-serialisable: numpy scalars to Python, non-finite floats to strings,
    tuples to lists, small numpy arrays to lists; anything else unrepresentable becomes ``None``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return _encode_float(float(value))
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, np.ndarray) and value.size <= 64 and value.dtype.kind in "biuf":
        return json_safe(value.astype(np.float64 if value.dtype.kind == "f" else object).tolist())
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _attrs_subset(attrs: dict | None) -> dict:
    """The JSON-able part of an op's attributes (large tensors such as a Const's value are dropped)."""
    out = {}
    for k, v in (attrs or {}).items():
        if isinstance(v, np.ndarray) and v.size > 64:
            continue
        if isinstance(v, type):
            try:
                v = np.dtype(v).name
            except TypeError:
                continue
        enc = json_safe(v)
        if enc is None and v is not None:
            continue
        out[str(k)] = enc
    return out


_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def _stem(name: str) -> str:
    s = _UNSAFE.sub("_", name).strip(".") or "op"
    if len(s) > _MAX_STEM:
        s = s[:_MAX_STEM - 9] + "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return s


def _storage(arr: np.ndarray) -> tuple[np.ndarray, str]:
    """(array as np.save can describe it, the manifest's dtype name)."""
    name = arr.dtype.name
    # C order always, so readers can stream files in flat order
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)  # (never for 0-d arrays, which it would make 1-d)
    if name in _ML_DTYPES:
        return arr.view(np.dtype(f"u{arr.dtype.itemsize}")), name
    return arr, name


def _is_variant(arr: np.ndarray) -> bool:
    """A TensorFlow variant (a TensorList object of a loop), not a tensor of strings."""
    return arr.dtype == object and arr.ndim == 0 and not isinstance(arr.item(), (bytes, str))


def _is_string(arr: np.ndarray) -> bool:
    """Strings (bytes, str or objects, as TensorFlow hands back tf.string) rather than numbers."""
    return arr.dtype.kind in "OSU" or (arr.dtype.kind == "V" and arr.dtype.name not in _ML_DTYPES)


def _dtype_from_name(name: str) -> np.dtype:
    if name in CODED_FORMATS:
        return np.dtype(np.uint8)
    if name in _ML_DTYPES:
        return _ML_DTYPES[name]
    return np.dtype(name)
