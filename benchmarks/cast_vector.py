"""Casts, vector ops and reductions through the public API, against numpy on the same data.

Throughput in million elements per second (higher is better). Our side includes
output allocation, argument checks and the status reduction; numpy's float16
ufuncs are the baseline the issue names.
"""
from __future__ import annotations

import numpy as np

from ascend_emu.numerics import cast, reduce, vector

from .common import row, side_by_side


def run(quick: bool = False) -> list[dict]:
    n = 1 << 20 if quick else 1 << 24
    repeat = 3 if quick else 7
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

    t_ours, t_base = side_by_side(lambda: cast(x32, "float16"), lambda: x32.astype(np.float16), repeat)
    ours, base = mps(t_ours), mps(t_base)
    rows.append(row("cast", f"fp32->fp16 rint + status, {size}", ours, base, "numpy astype(float16)",
                    "Melem/s", target=1.0))
    import ml_dtypes

    t_ours, t_base = side_by_side(lambda: cast(x32, "bfloat16", rounding="round"),
                                   lambda: x32.astype(ml_dtypes.bfloat16), repeat)
    rows.append(row("cast", f"fp32->bf16 round + status, {size}", mps(t_ours), mps(t_base),
                    "ml_dtypes astype(bfloat16) (rint)", "Melem/s"))
    for op, ufunc in (("add", np.add), ("mul", np.multiply)):
        t_ours, t_base = side_by_side(lambda: vector(op, a, b), lambda: ufunc(a, b), repeat)
        ours, base = mps(t_ours), mps(t_base)
        rows.append(row("vector", f"fp16 {op} + status, {size}", ours, base, f"numpy float16 {ufunc.__name__}",
                        "Melem/s", target=3.0))
    t_ours, t_base = side_by_side(lambda: vector("exp", a), lambda: np.exp(a), repeat)
    ours, base = mps(t_ours), mps(t_base)
    rows.append(row("vector", f"fp16 exp (float64, round once), {size}", ours, base, "numpy float16 exp",
                    "Melem/s", note="correctly rounded model vs numpy's float32-then-round"))
    t_ours, t_base = side_by_side(lambda: reduce("sum", a), lambda: np.sum(a, dtype=np.float32), repeat)
    ours, base = mps(t_ours), mps(t_base)
    rows.append(row("reduce", f"fp16 sum, fp32 accumulator, {size}", ours, base, "numpy sum(dtype=float32)",
                    "Melem/s", note="ours is one sequential chain (documented order); numpy sums pairwise"))
    return rows
