"""What a dump records of a tensor besides its bytes: statistics, and the size of a dump on disk."""
from __future__ import annotations

import math
import os

import numpy as np

from .format import CHUNK

def tensor_stats(arr: np.ndarray) -> dict:
    """max, min, mean, l2norm of the finite values of ``arr`` in float64, and nan / inf counts.

    One pass of a Numba kernel (``kernels/stats.py``) with float64 accumulators in
    element order. Empty tensors give ``None`` statistics. A tensor with no finite value
    gives ``None`` mean and l2norm and shows what it holds in max and min: ``inf``/``-inf``
    for the largest/smallest infinity present, ``nan`` if it holds only NaN (so a report
    never shows an empty max for an all-Inf tensor). Booleans count as 0/1, integers as
    their values.
    """
    from ...kernels.stats import finite_stats

    arr = np.asarray(arr)
    flat = np.ascontiguousarray(arr).reshape(-1)
    if arr.dtype == np.float16 or arr.dtype.name == "bfloat16":
        vmax, vmin, total, sq, count, nnan, ninf = finite_stats(flat.view(np.uint16),
                                                                int(arr.dtype.name == "bfloat16"))
    elif arr.dtype in (np.float32, np.float64):
        vmax, vmin, total, sq, count, nnan, ninf = finite_stats(flat, -1)
    elif arr.dtype.kind in "biu" and flat.size:
        f = flat.astype(np.float64)
        vmax, vmin, total, sq, count, nnan, ninf = float(f.max()), float(f.min()), float(f.sum()), \
            float(f @ f), f.size, 0, 0
    else:
        vmax, vmin, total, sq, count, nnan, ninf = finite_stats(flat.astype(np.float64), -1)
    if count == 0:
        vmax = vmin = None
        if flat.size:
            pos, neg = _infinities(flat) if ninf else (False, False)
            vmax = math.inf if pos else (-math.inf if neg else math.nan)
            vmin = -math.inf if neg else (math.inf if pos else math.nan)
        return {"max": vmax, "min": vmin, "mean": None, "l2norm": None, "nan": int(nnan), "inf": int(ninf)}
    return {"max": float(vmax), "min": float(vmin), "mean": float(total) / count, "l2norm": math.sqrt(sq),
            "nan": int(nnan), "inf": int(ninf)}


def _infinities(flat: np.ndarray) -> tuple[bool, bool]:
    """(any +inf, any -inf) in a flat float tensor, chunk by chunk in float64."""
    pos = neg = False
    for s in range(0, flat.size, CHUNK):
        c = flat[s:s + CHUNK].astype(np.float64)
        pos = pos or bool((c == math.inf).any())
        neg = neg or bool((c == -math.inf).any())
    return pos, neg


def dump_bytes(path) -> int:
    """Total size in bytes of the files under ``path``."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def fmt_bytes(n) -> str:
    """``1536`` -> ``"1.5 KB"``."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


#: about how many bytes of the manifest one op output takes (its op's entry shared among its outputs: name,
#: types, precision decision, statistics, digest), measured at 920 bytes a output for a small CNN's training
#: step and 1,280 for a small dense model's replay (ops with one output each, digests included)
STATS_OUTPUT_BYTES = 1536

def graph_dump_bytes(nodes, batch_size: int, *, stats_only: bool = False, select=None) -> int:
    """About how many bytes a dump of one run of the graph ``nodes`` takes: every output with a recorded
    shape (``node.output_shapes``; an unknown dimension counts as ``batch_size``) at its dtype's width (4 bytes
    when unknown), or :data:`STATS_OUTPUT_BYTES` for an output whose tensor is not kept (``stats_only``, or
    an op ``select(name, tf_type)`` leaves out). An upper estimate: ops the device fuses are not dumped and
    fp16 outputs take half as much, while the casts the device inserts and the manifest come on top."""
    total = 0
    for node in nodes:
        keep = not stats_only and (select is None or bool(select(node.name, node.op)))
        for shape, dtype in zip(node.output_shapes or [], node.output_dtypes or []):
            total += STATS_OUTPUT_BYTES
            if not keep or shape is None:
                continue
            n = 1
            for d in shape:
                n *= int(batch_size) if d is None or d < 0 else int(d)
            try:
                width = np.dtype(dtype).itemsize
            except TypeError:
                width = 4
            total += n * width
    return total


#: a dump estimated above this many bytes is announced before it is written
ANNOUNCE_BYTES = 1 << 30


def check_disk_space(nbytes: int, target, what: str, *, fix: str) -> str | None:
    """Before writing about ``nbytes`` under ``target``: an error (one line) when the file system that will
    hold ``target`` (its nearest existing ancestor's) has less free space; else the line to show when the
    estimate passes :data:`ANNOUNCE_BYTES`, or None. ``what`` describes the estimate, ``fix`` how to write less."""
    import shutil

    from ...errors import AscendEmuError

    probe = os.path.abspath(os.fspath(target))
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        free = None    # a file system that does not say: the write itself will tell
    if free is not None and nbytes > free:
        raise AscendEmuError(f"{what} would take about {fmt_bytes(nbytes)} but the file system of "
                             f"{os.fspath(target)} has {fmt_bytes(free)} free; nothing was written: {fix}")
    if nbytes > ANNOUNCE_BYTES:
        return f"{what} will take about {fmt_bytes(nbytes)} in {os.fspath(target)}"
    return None
