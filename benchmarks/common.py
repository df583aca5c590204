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


def side_by_side(ours, base, rounds: int, warmup: int = 1, pause: float = 0.0):
    """Best wall times of ``ours()`` and ``base()`` over ``rounds`` alternating runs (seconds):
    a load change on a shared machine hits both sides alike. ``pause`` seconds of sleep after
    each run let the other side's worker threads stop spinning (OpenBLAS's busy-wait for the
    next call lasts ~0.1 s and halved the emulator's matmul measured right after it)."""
    for _ in range(warmup):
        ours()
        base()
    t_ours = t_base = float("inf")
    for _ in range(rounds):
        t_ours = min(t_ours, best_time(ours, repeat=1, warmup=0))
        time.sleep(pause)
        t_base = min(t_base, best_time(base, repeat=1, warmup=0))
        time.sleep(pause)
    return t_ours, t_base


def row(group, name, ours, baseline, baseline_name, unit, target=None, higher_is_better=True, note=""):
    ratio = ours / baseline if higher_is_better else baseline / ours
    return {"group": group, "name": name, "ours": ours, "baseline": baseline, "baseline_name": baseline_name,
            "unit": unit, "ratio": ratio, "target": target,
            "ok": None if target is None else bool(ratio >= target), "note": note}
