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
    reduce("sum", a[:16])

    t_ours, t_base = side_by_side(lambda: cast(x32, "float16"), lambda: x32.astype(np.float16), repeat)
    ours, base = mps(t_ours), mps(t_base)
    rows.append(row("cast", f"fp32->fp16 rint + status, {size}", ours, base, "numpy astype(float16)",
                    "Melem/s", target=1.0))
    import ml_dtypes

    for rounding in ("rint", "round"):
        t_ours, t_base = side_by_side(lambda: cast(x32, "bfloat16", rounding=rounding),
                                       lambda: x32.astype(ml_dtypes.bfloat16), repeat)
        rows.append(row("cast", f"fp32->bf16 {rounding} + status, {size}", mps(t_ours), mps(t_base),
                        "ml_dtypes astype(bfloat16) (rint)", "Melem/s", target=2.0))
    from ascend_emu.numerics.hf32 import to_hf32

    to_hf32(x32[:16])
    t_ours, t_base = side_by_side(lambda: to_hf32(x32), lambda: _hf32_numpy(x32), repeat)
    rows.append(row("cast", f"fp32->HF32 (11 stored bits) rint + status, {size}", mps(t_ours), mps(t_base),
                    "numpy bit trick (round half even on the bits; no NaN, overflow or status)", "Melem/s"))
    for op, ufunc in (("add", np.add), ("mul", np.multiply)):
        t_ours, t_base = side_by_side(lambda: vector(op, a, b), lambda: ufunc(a, b), repeat)
        ours, base = mps(t_ours), mps(t_base)
        rows.append(row("vector", f"fp16 {op} + status, {size}", ours, base, f"numpy float16 {ufunc.__name__}",
                        "Melem/s", target=3.0))
    rows.extend(unary_rows(a, repeat, size))
    t_ours, t_base = side_by_side(lambda: reduce("sum", a), lambda: np.sum(a, dtype=np.float32), repeat)
    ours, base = mps(t_ours), mps(t_base)
    rows.append(row("reduce", f"fp16 sum, fp32 accumulator, {size}", ours, base, "numpy sum(dtype=float32)",
                    "Melem/s", note="ours is one sequential chain (documented order); numpy sums pairwise"))
    return rows


def _hf32_numpy(x):
    """The numpy expression a user would write for HF32 rounding to 11 stored bits (the A2's; to_hf32's default):
    add 0x7FF plus the last kept bit, clear the 12 dropped bits."""
    u = x.view(np.uint32)
    return ((u + np.uint32(0x7FF) + ((u >> np.uint32(12)) & np.uint32(1))) & np.uint32(0xFFFFF000)).view(np.float32)


def _gelu_tanh(x):
    return np.float16(0.5) * x * (np.float16(1) + np.tanh(np.float16(0.7979) * (x + np.float16(0.044715) * x * x * x)))


#: 16-bit unary ops against numpy's float16 (numpy has no erf: its tanh stands in, and the tanh form
#: of gelu for gelu)
UNARY_BASELINES = {
    "exp": (np.exp, "exp"), "log": (np.log, "log"), "tanh": (np.tanh, "tanh"),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), "1/(1+exp(-x))"), "erf": (np.tanh, "tanh (no erf in numpy)"),
    "gelu": (_gelu_tanh, "gelu tanh form"), "rsqrt": (lambda x: 1 / np.sqrt(x), "1/sqrt"),
}


def unary_rows(a, repeat, size) -> list[dict]:
    """fp16 unary ops (the 65,536-entry table path after the first call) against numpy float16."""
    rows = []
    with np.errstate(all="ignore"):
        for op, (base, what) in UNARY_BASELINES.items():
            vector(op, a[:1 << 16])  # builds the table outside the timing, as a model's first call does
            t_ours, t_base = side_by_side(lambda: vector(op, a), lambda: base(a), repeat)
            rows.append(row("vector", f"fp16 {op} (table of the exact model), {size}", a.size / t_ours / 1e6,
                            a.size / t_base / 1e6, f"numpy float16 {what}", "Melem/s", target=1.0,
                            note="ours: float64 model rounded once, tabulated; >= 2000 Melem/s is the absolute target"))
    return rows
    return rows
