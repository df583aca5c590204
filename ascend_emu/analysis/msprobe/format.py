"""msprobe's dump format as ascend-emu reads and writes it: names, dtype spellings, statistics, tensor files."""
from __future__ import annotations

import hashlib
import math
import os
import re
import shutil

import ml_dtypes
import numpy as np

from ...errors import AscendEmuError
from ...fileio import O_NOFOLLOW, open_in_dump
from ..dump import Dump, StatsOnly, _dtype_from_name

#: what msprobe accepts in an API name (its dump key check)
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_.:/-]+$")
#: the API prefix our ops are exported under (msprobe's prefix for torch.nn.functional calls)
PREFIX = "Functional"
#: the file beside dump.json holding what msprobe's format cannot: original names and the manifest
SIDECAR = "ascend_emu.json"
SIDECAR_FORMAT = "ascend-emu-msprobe-export"
DATA_DIR = "dump_tensor_data"
TENSOR_FORMATS = ("npy", "pt")
#: what an export writes: ``graph``, one ``Functional.<name>.0.forward`` key per op of a graph replay (.npy by
#: default); ``pytorch``, msprobe's PyTorch dump of a torch script (.pt files, a torch run's API keys kept,
#: ``.backward`` entries with ``input``/``output``)
FRAMEWORKS = ("graph", "pytorch")
#: msprobe's API prefixes (26.2, ``pytorch/dump/api_dump/api_register.py``, facts 13.6)
API_PREFIXES = ("Tensor", "Torch", "Functional", "NPU", "VF", "Aten", "Distributed", "MindSpeed", "Triton")
#: an op name that already is an msprobe API key, ``{Prefix}.{api}.{count}.forward|backward`` (a torch run's)
API_KEY = re.compile(r"^(?:" + "|".join(API_PREFIXES) + r")\.[A-Za-z0-9_.:/-]+\.[0-9]+\.(forward|backward)$")
RULES = ("ascend-emu", "msprobe")
_MAX_NAME = 160   # longest exported name: key + ".output.NN.npy" stays well under 255 bytes
_MAX_KEY = 200    # longest op name kept as a whole key (the same bound on its file names)

#: numpy/ml_dtypes name -> msprobe's (torch's) dtype spelling
TORCH_DTYPES = {
    "float16": "torch.float16", "bfloat16": "torch.bfloat16", "float32": "torch.float32",
    "float64": "torch.float64", "int8": "torch.int8", "uint8": "torch.uint8", "int16": "torch.int16",
    "uint16": "torch.uint16", "int32": "torch.int32", "uint32": "torch.uint32", "int64": "torch.int64",
    "uint64": "torch.uint64", "bool": "torch.bool", "complex64": "torch.complex64",
    "complex128": "torch.complex128", "float8_e4m3fn": "torch.float8_e4m3fn", "float8_e5m2": "torch.float8_e5m2",
    "float8_e4m3fnuz": "torch.float8_e4m3fnuz", "float8_e5m2fnuz": "torch.float8_e5m2fnuz",
}
_FROM_TORCH = {v: k for k, v in TORCH_DTYPES.items()}
#: MindSpore's spellings (msprobe's MindSpore dumps), lower-cased
_FROM_MINDSPORE = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "float64": "float64",
                   "int8": "int8", "uint8": "uint8", "int16": "int16", "uint16": "uint16", "int32": "int32",
                   "uint32": "uint32", "int64": "int64", "uint64": "uint64", "bool": "bool", "bool_": "bool"}


def torch_dtype(name: str) -> str:
    """msprobe's spelling of a dtype (``float16`` -> ``torch.float16``)."""
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise AscendEmuError(f"dtype {name!r} has no msprobe (torch) spelling; msprobe dumps hold "
                             f"{', '.join(sorted(TORCH_DTYPES))}") from None


def numpy_dtype_name(spelling: str) -> str:
    """The numpy/ml_dtypes name of a dtype as msprobe writes it (torch or MindSpore spelling)."""
    s = str(spelling)
    if s in _FROM_TORCH:
        return _FROM_TORCH[s]
    low = s.split(".")[-1].lower()
    if low in _FROM_MINDSPORE:
        return _FROM_MINDSPORE[low]
    raise AscendEmuError(f"msprobe dtype {spelling!r} is not one ascend-emu reads; supported: "
                         f"{', '.join(sorted(TORCH_DTYPES.values()))} and their MindSpore spellings")


# --------------------------------------------------------------------------- names

def msprobe_name(name: str) -> str:
    """``name`` in msprobe's allowed characters, as an API name inside a dump key.

    ``/`` (TensorFlow's scope separator) becomes ``.`` (msprobe's), any other character outside
    ``[A-Za-z0-9_-]`` becomes ``_``; runs of dots collapse. Not injective by itself: use
    :func:`msprobe_names`, which makes the names of one dump unique.
    """
    s = name.replace("/", ".")
    s = re.sub(r"[^A-Za-z0-9_.\-]", "_", s)
    s = re.sub(r"\.{2,}", ".", s).strip(".") or "op"
    if len(s) > _MAX_NAME:
        s = s[:_MAX_NAME - 9] + "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return s


def msprobe_names(names) -> dict:
    """``{name: unique msprobe name}`` for the op names of one dump, in order.

    Names that collide (case-insensitively, as file names on some systems do) get ``_2``, ``_3``, ...
    """
    out, seen = {}, set()
    for n in names:
        base = msprobe_name(n)
        s, k = base, 1
        while s.lower() in seen:
            k += 1
            s = f"{base}_{k}"
        seen.add(s.lower())
        out[n] = s
    return out


def dump_key(safe_name: str, direction: str = "forward") -> str:
    return f"{PREFIX}.{safe_name}.0.{direction}"


def pytorch_keys(ops) -> dict:
    """``{op name: msprobe key}`` for an export in msprobe's PyTorch layout.

    An op name that already is an API key (``Aten.addmm.0.forward``, ``Functional.linear.1.backward``: a torch
    run's) is kept, so the export matches msprobe's own dump of the same script; any other op (a graph
    replay's) becomes ``Functional.<name>.0.forward``, or ``.backward`` for an op of a training step's
    backward phase, its name made unique as :func:`msprobe_names` does, against the kept keys too.
    """
    ops = list(ops)
    out, seen = {}, set()
    for op in ops:     # kept first (a name colliding case-insensitively with an earlier one is not kept)
        n = op["name"]
        if API_KEY.match(n) and len(n) <= _MAX_KEY and n.lower() not in seen:
            out[n] = n
            seen.add(n.lower())
    for op in ops:
        n = op["name"]
        if n in out:
            continue
        base, k = msprobe_name(n), 1
        direction = "backward" if op.get("phase") == "backward" else "forward"
        key = dump_key(base, direction)
        while key.lower() in seen:
            k += 1
            key = dump_key(f"{base}_{k}", direction)
        seen.add(key.lower())
        out[n] = key
    return {op["name"]: out[op["name"]] for op in ops}


# --------------------------------------------------------------------------- statistics

def _positive_negative_inf(dump: Dump, op: str, index: int) -> tuple[int, int]:
    pos = neg = 0
    for c in dump.chunks(op, index):
        f = c.astype(np.float64) if c.dtype.kind == "V" or c.dtype.name == "bfloat16" else c
        pos += int(np.count_nonzero(np.isposinf(f)))
        neg += int(np.count_nonzero(np.isneginf(f)))
    return pos, neg


def msprobe_stats(out: dict, dump: Dump | None = None, op: str | None = None) -> dict:
    """msprobe's Max/Min/Mean/Norm of one output, from our manifest statistics.

    msprobe computes them over every element (``torch.max`` etc.), so a nan makes all four nan
    and an inf shows in Max/Min/Mean; ours are over the finite values with the nan/inf counts
    beside. The sign of the infs is read from the tensor when it was dumped; for a
    statistics-only output holding infs Max, Min and Mean are unknown (null) and Norm is inf.
    Booleans: Max = any, Min = all; integers: Max, Min; Mean and Norm null for both (msprobe).
    A 0-d tensor: all four are its value (msprobe's Norm of a scalar is the scalar).
    """
    dt = _dtype_from_name(out["dtype"])
    shape = out["shape"]
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    none = {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if size == 0:
        return none
    if dt.kind == "b":
        return {"Max": None if out["max"] is None else bool(out["max"]),
                "Min": None if out["min"] is None else bool(out["min"]), "Mean": None, "Norm": None}
    if dt.kind in "iu":
        return {"Max": None if out["max"] is None else int(out["max"]),
                "Min": None if out["min"] is None else int(out["min"]), "Mean": None, "Norm": None}
    nnan, ninf = int(out.get("nan", 0)), int(out.get("inf", 0))
    if nnan:
        return {k: math.nan for k in none}
    if ninf:
        if out.get("file") is None or dump is None:
            return {"Max": None, "Min": None, "Mean": None, "Norm": None if not shape else math.inf}
        pos, neg = _positive_negative_inf(dump, op, out["index"])
        vmax = math.inf if pos else (out["max"] if out["max"] is not None else -math.inf)
        vmin = -math.inf if neg else (out["min"] if out["min"] is not None else math.inf)
        mean = math.nan if pos and neg else (math.inf if pos else -math.inf)
        if not shape:
            return {"Max": vmax, "Min": vmax, "Mean": vmax, "Norm": vmax}
        return {"Max": vmax, "Min": vmin, "Mean": mean, "Norm": math.inf}
    if not shape:
        v = out["max"]
        return {"Max": v, "Min": v, "Mean": v, "Norm": v}
    return {"Max": out["max"], "Min": out["min"], "Mean": out["mean"], "Norm": out["l2norm"]}


def _num(v):
    """A statistic as msprobe's JSON holds it: number, bool, null, NaN/Infinity (or their strings)."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v.strip().lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(v.strip().lower().replace("infinity", "inf"))
    return None


def stats_from_msprobe(leaf: dict) -> StatsOnly:
    """Our statistics of a statistics-level msprobe tensor leaf.

    msprobe's values are kept as they are (they include inf and nan); the manifest's nan / inf
    counts are set to 1 when a statistic shows one (the exact count is not in the dump).
    """
    vals = [_num(leaf.get(k)) for k in ("Max", "Min", "Mean", "Norm")]
    vals = [float(v) if isinstance(v, bool) else v for v in vals]
    nan = int(any(v is not None and math.isnan(v) for v in vals))
    inf = int(not nan and any(v is not None and math.isinf(v) for v in vals))
    return StatsOnly(dtype=numpy_dtype_name(leaf.get("dtype")), shape=tuple(int(d) for d in leaf.get("shape") or ()),
                     max=vals[0], min=vals[1], mean=vals[2], l2norm=vals[3], nan=nan, inf=inf)


# --------------------------------------------------------------------------- tensor files

def _import_torch(why: str):
    try:
        import torch
    except ImportError:
        raise AscendEmuError(f"{why} needs PyTorch, which is not installed; pip install torch "
                             "(the CPU build is enough), or use .npy tensor files") from None
    return torch


def _file_array(arr: np.ndarray) -> np.ndarray:
    """What goes into a tensor file: ml_dtypes types (bfloat16, float8) widened exactly to float32."""
    if arr.dtype.name in ("bfloat16",) or arr.dtype.name.startswith("float8"):
        return arr.astype(np.float32)
    return np.asarray(arr, order="C")  # (ascontiguousarray would make a 0-d array 1-d)


def _write_tensor(path: str, arr: np.ndarray, fmt: str) -> None:
    """A new tensor file (never an existing one or a link: the export clears its directory first)."""
    if fmt == "pt":
        torch = _import_torch("writing .pt tensor files")
        t = torch.from_numpy(np.array(_file_array(arr)))
        if arr.dtype.name in TORCH_DTYPES and arr.dtype.name != t.dtype.__str__()[6:]:
            t = t.to(getattr(torch, arr.dtype.name))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, 0o666)
    with os.fdopen(fd, "wb") as f:
        if fmt == "npy":
            np.lib.format.write_array(f, _file_array(arr), allow_pickle=False)
        else:
            torch.save(t, f)


def _read_tensor(rdir: str, fname, dtype_name: str, shape) -> np.ndarray:
    """Tensor file ``fname`` of rank directory ``rdir`` (``.npy``, or ``.pt`` with PyTorch installed) as
    ``dtype_name``, checked against ``shape``. ``fname`` (a ``data_name`` of dump.json) is confined to
    ``rdir/dump_tensor_data`` by :func:`~ascend_emu.fileio.open_in_dump`, the rule of every dump read."""
    what = f"msprobe dump {rdir}: tensor file"
    hint = "copy the whole msprobe dump (dump_tensor_data included, without links), or import the statistics only"
    if isinstance(fname, str) and fname.endswith(".npy"):
        with open_in_dump(rdir, DATA_DIR, fname, what=what, hint=hint) as f:
            try:
                arr = np.load(f, allow_pickle=False)
            except (ValueError, OSError, EOFError) as e:
                raise AscendEmuError(f"{what} {fname} is corrupt or not a plain .npy ({e})") from None
    elif isinstance(fname, str) and fname.endswith(".pt"):
        torch = _import_torch(f"reading the .pt tensor file {fname}")
        with open_in_dump(rdir, DATA_DIR, fname, what=what, hint=hint) as f:
            try:
                t = torch.load(f, map_location="cpu", weights_only=True)
            except Exception as e:  # torch raises many kinds
                raise AscendEmuError(f"{what} {fname} could not be read by torch.load ({e})") from None
        if not isinstance(t, torch.Tensor):
            raise AscendEmuError(f"{what} {fname} holds a {type(t).__name__}, not a tensor")
        t = t.detach().cpu()
        if t.dtype == torch.bfloat16:
            arr = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        elif str(t.dtype)[6:] in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
            arr = t.view(torch.uint8).numpy().view(getattr(ml_dtypes, str(t.dtype)[6:]))
        else:
            arr = t.numpy()
    else:
        raise AscendEmuError(f"{what} {str(fname)[:80]!r} is neither .npy nor .pt")
    want = _dtype_from_name(dtype_name)
    if arr.dtype != want:
        # exact widenings only (our own export stores bfloat16 and float8 as float32)
        back = arr.astype(want)
        if arr.dtype.kind != "f" or not np.array_equal(back.astype(arr.dtype), arr, equal_nan=True):
            raise AscendEmuError(f"msprobe tensor file {fname} holds {arr.dtype} but dump.json says {dtype_name}")
        arr = back
    if list(arr.shape) != [int(d) for d in shape]:
        raise AscendEmuError(f"msprobe tensor file {fname} has shape {list(arr.shape)} but dump.json says "
                             f"{list(shape)}")
    return arr


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
