"""The Ascend950's 8-bit formats: encoding and the MX matmul, against what a user would reach for instead.

Encoding float32 to FP8 E4M3FN (rint, Inf/NaN kept) against ml_dtypes' ``astype(float8_e4m3fn)`` (the same
rounding; ml_dtypes gives no status), to HiFloat8 (no other implementation exists: against our own
float32 -> fp16 cast, the nearest 16-bit conversion), and the MXFP8 matmul (quantize both operands, then the
cube) against numpy's float32 matmul of the same shape. Million elements per second, or GFLOP/s.
"""
from __future__ import annotations

import numpy as np

from ascend_emu.numerics import cast
from ascend_emu.numerics.lowfloat import encode, mx_matmul, mx_quantize

from .common import row, side_by_side


def run(quick: bool = False) -> list[dict]:
    import ml_dtypes

    n = 1 << 20 if quick else 1 << 24
    repeat = 3 if quick else 5
    rng = np.random.default_rng(0)
    x32 = (rng.standard_normal(n) * 10).astype(np.float32)
    size = f"{n >> 20}M"

    def mps(seconds):
        return n / seconds / 1e6

    encode(x32[:64], "float8_e4m3fn", overflow_mode="inf_nan")
    encode(x32[:64], "hifloat8")
    cast(x32[:64], "float16")
    rows = []
    t_ours, t_base = side_by_side(lambda: encode(x32, "float8_e4m3fn", overflow_mode="inf_nan"),
                                  lambda: x32.astype(ml_dtypes.float8_e4m3fn), repeat)
    rows.append(row("lowfloat", f"fp32->fp8 e4m3fn rint + status, {size}", mps(t_ours), mps(t_base),
                    "ml_dtypes astype(float8_e4m3fn)", "Melem/s"))
    t_ours, t_base = side_by_side(lambda: encode(x32, "hifloat8"), lambda: cast(x32, "float16"), repeat)
    rows.append(row("lowfloat", f"fp32->hifloat8 round + status, {size}", mps(t_ours), mps(t_base),
                    "our fp32->fp16 cast (no other HiF8 encoder)", "Melem/s"))
    m = k = nn = 256 if quick else 512
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, nn)).astype(np.float32)

    def mx():
        ac, asc = mx_quantize(a, "float8_e4m3fn", axis=1)
        bc, bsc = mx_quantize(b, "float8_e4m3fn", axis=0)
        return mx_matmul(ac, asc, bc, bsc, "float8_e4m3fn", "float8_e4m3fn")

    mx()
    t_ours, t_base = side_by_side(mx, lambda: a @ b, repeat)
    flops = 2.0 * m * k * nn / 1e9
    rows.append(row("lowfloat", f"MXFP8 matmul (quantize + cube) {m}^3", flops / t_ours, flops / t_base,
                    "numpy float32 matmul (OpenBLAS sgemm)", "GFLOP/s"))
    return rows
