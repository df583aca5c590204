"""Where a sensitivity run's findings are kept for a dump, and the line ``compare`` and ``report`` print.

``ascend-emu sensitivity MODEL --dump DIR`` writes ``DIR.sensitivity.json`` beside the dump (not inside it: a
dump directory holds only what the dump writer made, so ``--overwrite`` can replace it). It is read back only
when it describes the same inputs as the dump (``inputs_sha256``).
"""
from __future__ import annotations

import json
import os

from ..errors import printable

#: the conclusions of a sensitivity run, in the order they are printed
ORDER = ("first_divergent", "first_overflow", "output_cosine", "float_status", "loss_curve", "skipped_steps")


#: the largest sidecar read (a real one is a few KB per variant)
MAX_SIDECAR_BYTES = 16 << 20


def _well_formed(data) -> bool:
    """The shape ``robust_line`` reads: conclusions {name: {robust: bool, moved_by: [{parameters: [str]}]}},
    variants a list."""
    if not isinstance(data, dict) or not isinstance(data.get("conclusions"), dict):
        return False
    if not isinstance(data.get("variants", []), list):
        return False
    for v in data["conclusions"].values():
        if not isinstance(v, dict) or not isinstance(v.get("robust", False), bool):
            return False
        moved = v.get("moved_by", [])
        if not isinstance(moved, list) or not all(
                isinstance(m, dict) and isinstance(m.get("parameters", []), list)
                and all(isinstance(p, str) for p in m.get("parameters", [])) for m in moved):
            return False
    return True


def sidecar(dump) -> str:
    """Where the sensitivity of ``dump``'s conclusions is kept: ``<dump>.sensitivity.json`` beside it."""
    return os.path.normpath(os.fspath(getattr(dump, "path", dump))) + ".sensitivity.json"


def read_sidecar(dump) -> dict | None:
    """The sensitivity JSON written for ``dump`` (a path or a loaded Dump), or None when there is none, it is
    unreadable, or it was made from another model or other inputs than the dump's."""
    path = sidecar(dump)
    # a file beside the dump is as hostile as the dump: never through a link, never a huge one, checked in shape
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    try:
        if os.path.getsize(path) > MAX_SIDECAR_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    if not _well_formed(data):
        return None
    if not hasattr(dump, "manifest"):
        try:
            from .dump import load_dump

            dump = load_dump(dump)
        except Exception:   # noqa: BLE001 - an unreadable dump: the caller reports it its own way
            return None
    # tied to the dump by its model and its inputs: a sidecar of another model or other inputs is not shown
    fingerprint = dump.model.get("fingerprint") if isinstance(dump.model, dict) else None
    if not (data.get("inputs_sha256") and data.get("inputs_sha256") == dump.inputs_sha256
            and data.get("model_fingerprint") and data.get("model_fingerprint") == fingerprint):
        return None
    return data


def robust_line(data: dict) -> str:
    """One line: which conclusions hold in every variant of the assumed parameters, which move and by what."""
    c = data.get("conclusions") or {}
    c = {k: c[k] for k in sorted(c, key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))}
    good = [k for k, v in c.items() if v.get("robust")]
    bad = [k for k, v in c.items() if not v.get("robust")]
    n = len(data.get("variants") or [])
    line = f"sensitivity ({n} variants of the assumed parameters): robust: {', '.join(good) or 'none'}"
    if bad:
        movers = sorted({p for k in bad for m in c[k].get("moved_by", []) for p in m.get("parameters", [])})
        line += f"; moved: {', '.join(bad)} (by {', '.join(movers) or '?'})"
    return printable(line)    # names from a file beside the dump: one line, no terminal sequences
