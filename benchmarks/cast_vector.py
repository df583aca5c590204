"""Casts, vector ops and reductions through the public API, against numpy on the same data.

Throughput in million elements per second (higher is better). Our side includes
output allocation, argument checks and the status reduction; numpy's float16
ufuncs are the baseline the issue names.
"""
from __future__ import annotations

import numpy as np

from ascend_emu.numerics import cast, reduce, vector

from .common import best_time, row


def run(quick: bool = False) -> list[dict]:
    n = 1 << 20 if quick else 1 << 24
    repeat = 3 if quick else 5
    rng = np.random.default_rng(0)
    x32 = (rng.standard_normal(n) * 100).astype(np.float32)
    a = rng.standard_normal(n).astype(np.float16)
    b = rng.standard_normal(n).astype(np.float16)
    size = f"{n >> 20}M"

    def mps(seconds):
        return n / seconds / 1e6

    rows = []
    # warm the JIT caches outside the timings
    cast(x32[:16], "float16")
    vector("add", a[:16], b[:16])
    vector("mul", a[:16], b[:16])
    vector("exp", a[:16])
    reduce("sum", a[:16])

    ours = mps(best_time(lambda: cast(x32, "float16"), repeat))
    base = mps(best_time(lambda: x32.astype(np.float16), repeat))
    rows.append(row("cast", f"fp32->fp16 rint + status, {size}", ours, base, "numpy astype(float16)",
                    "Melem/s", target=1.0))
    ours = mps(best_time(lambda: cast(x32, "bfloat16", rounding="round"), repeat))
    rows.append(row("cast", f"fp32->bf16 round + status, {size}", ours, base, "numpy astype(float16)", "Melem/s"))
    for op, ufunc in (("add", np.add), ("mul", np.multiply)):
        ours = mps(best_time(lambda: vector(op, a, b), repeat))
        base = mps(best_time(lambda: ufunc(a, b), repeat))
        rows.append(row("vector", f"fp16 {op} + status, {size}", ours, base, f"numpy float16 {ufunc.__name__}",
                        "Melem/s", target=3.0))
    ours = mps(best_time(lambda: vector("exp", a), repeat))
    base = mps(best_time(lambda: np.exp(a), repeat))
    rows.append(row("vector", f"fp16 exp (float64, round once), {size}", ours, base, "numpy float16 exp",
                    "Melem/s", note="correctly rounded model vs numpy's float32-then-round"))
    ours = mps(best_time(lambda: reduce("sum", a), repeat))
    base = mps(best_time(lambda: np.sum(a, dtype=np.float32), repeat))
    rows.append(row("reduce", f"fp16 sum, fp32 accumulator, {size}", ours, base, "numpy sum(dtype=float32)",
                    "Melem/s", note="ours is one sequential chain (documented order); numpy sums pairwise"))
    return rows
