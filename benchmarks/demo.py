"""The first ``make demo`` after an install: what it runs with an empty Numba cache, as on a fresh clone (the
warm-up of the demo's kernel signatures, ``python -m ascend_emu.tools.warmup --demo``, one process per core,
then ``ascend-emu demo``), then the demo again with that cache warm. Issue 34's budget for the first run is
60 s; there is no other tool to compare with, so the row's baseline is that budget.

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


def _seconds(argv: list, cache_dir: str) -> float:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, TF_CPP_MIN_LOG_LEVEL="2")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", *argv], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def run(quick: bool = False) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="ae-demo-bench-") as tmp:
        cache = os.path.join(tmp, "numba-cache")
        warmup = _seconds(["ascend_emu.tools.warmup", "--demo"], cache)
        cold = _seconds(["ascend_emu.cli", "demo", "--quiet", "--out", os.path.join(tmp, "cold")], cache)
        warm = _seconds(["ascend_emu.cli", "demo", "--quiet", "--out", os.path.join(tmp, "warm")], cache)
    note = (f"one run each, fresh processes: the warm-up {warmup:.1f} s (one process per core), then the demo "
            f"{cold:.1f} s; the demo again with that Numba cache: {warm:.1f} s (Python, TensorFlow and the model's "
            "build are in each demo)")
    return [
        row("demo", "first make demo: warm-up --demo + ascend-emu demo, empty Numba cache", warmup + cold, BUDGET_S,
            "issue 34's budget", "s", target=1.0, higher_is_better=False, note=note),
        row("demo", "ascend-emu demo, warm Numba cache", warm, BUDGET_S, "issue 34's budget", "s",
            target=1.0, higher_is_better=False, note=note),
    ]
