"""Timing helpers shared by the benchmark modules."""
from __future__ import annotations

import time


def best_time(fn, repeat: int = 5, warmup: int = 1) -> float:
    """Best wall time of ``fn()`` over ``repeat`` runs after ``warmup`` runs (seconds)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def row(group, name, ours, baseline, baseline_name, unit, target=None, higher_is_better=True, note=""):
    ratio = ours / baseline if higher_is_better else baseline / ours
    return {"group": group, "name": name, "ours": ours, "baseline": baseline, "baseline_name": baseline_name,
            "unit": unit, "ratio": ratio, "target": target,
            "ok": None if target is None else bool(ratio >= target), "note": note}
