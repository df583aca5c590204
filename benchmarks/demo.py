"""The first ``make demo`` after an install: ``ascend-emu demo`` with an empty Numba cache (every kernel it uses
compiled on the way, as on a fresh clone), then again with that cache warm. Issue 34's budget for the first
run is 60 s; there is no other tool to compare with, so the row's baseline is that budget.

Each run is a fresh process in a temporary directory (``--out`` there, ``NUMBA_CACHE_DIR`` there), so nothing
of the developer's own cache or output is read or replaced.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from .common import row

BUDGET_S = 60.0


def _demo_seconds(cache_dir: str, out_dir: str) -> float:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, TF_CPP_MIN_LOG_LEVEL="2")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ascend_emu.cli", "demo", "--quiet", "--out", out_dir], env=env,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def run(quick: bool = False) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="ae-demo-bench-") as tmp:
        cache = os.path.join(tmp, "numba-cache")
        cold = _demo_seconds(cache, os.path.join(tmp, "cold"))
        warm = _demo_seconds(cache, os.path.join(tmp, "warm"))
    note = (f"one run each, fresh process; the second with the first's Numba cache: {warm:.1f} s "
            f"(Python, TensorFlow and the model's build are in both)")
    return [
        row("demo", "ascend-emu demo, empty Numba cache (first run)", cold, BUDGET_S, "issue 34's budget",
            "s", target=1.0, higher_is_better=False, note=note),
        row("demo", "ascend-emu demo, warm Numba cache", warm, BUDGET_S, "issue 34's budget", "s",
            target=1.0, higher_is_better=False, note=note),
    ]
