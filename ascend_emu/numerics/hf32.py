"""HF32 (fp32 range, N + 1 significant bits): what the 910B, 910_93 and 950 cube does to float32 operands.

N, the stored significand bits, is the SoC's (``SoC.hf32_bits``: 11 on the Ascend910B and Ascend910_93, 10
assumed on the Ascend950); the tie rule is the kernel family's (matmul ties away, convolutions nearest even).
With HF32 on (``allow_hf32``; the SoC's default: convolutions), float32 operands in L0A/L0B are rounded to HF32
before the cube's products; the products of two HF32 values (at most 24 significant bits) are exact in float32
unless they leave its range, so the cube model's float32 path applied to the rounded operands is the HF32
cube. NUMERICS.md section 13 has the sources and what is assumed.
"""
from __future__ import annotations

import numpy as np

from . import policy as config
from ..errors import AscendEmuError
from ..kernels import cast as _k


def to_hf32(x, rounding: str = "rint", overflow_mode: str = "inf_nan", subnormals: str = "keep", bits: int = 11):
    """Round float32 values to HF32 (1 sign, 8 exponent, ``bits`` stored significand bits), as float32.

    Parameters
    ----------
    x : array_like
        Float values; anything but float32 is first converted to float32 (nearest even).
    rounding : {"rint", "trunc", "round"}
        ``rint`` nearest with ties to even (SetHF32 transMode 0, the convolutions'); ``round`` nearest with ties
        away from zero (transMode 1, MatMulV3's); ``trunc`` toward zero (an older reading of mode 1).
    overflow_mode : {"inf_nan", "saturation"}
        A finite value that rounds past the largest HF32 value ((2 - 2^-bits) 2^127) becomes Inf, or under
        ``saturation`` that largest value with its sign.
    subnormals : {"keep", "flush"}
        ``flush`` turns subnormal inputs into zeros of their sign; kept, they round on the fixed quantum
        2^-(126 + bits) of the subnormal range.
    bits : {10, 11}
        Stored significand bits (default 11: the Ascend910B's and Ascend910_93's; the Ascend950's is assumed 10).

    Returns
    -------
    (numpy.ndarray, int)
        float32 values on the HF32 grid (same shape) and the status: 0x100 if a finite value overflowed.
        NaN stays NaN (quieted), Inf stays Inf.
    """
    if bits not in config.HF32_BITS:
        raise AscendEmuError(f"unknown HF32 width {bits!r}; choose stored significand bits "
                             f"{' or '.join(map(str, config.HF32_BITS))}")
    if rounding not in config.HF32_ROUNDINGS:
        raise AscendEmuError(f"unknown HF32 rounding {rounding!r}; choose one of: {', '.join(config.HF32_ROUNDINGS)}")
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiub" and arr.dtype != config.bfloat16:
        raise AscendEmuError(f"to_hf32: dtype {arr.dtype} is not a real number type; pass a float array")
    src = np.ascontiguousarray(arr, dtype=np.float32)
    out = np.empty(arr.shape, dtype=np.float32)    # (ascontiguousarray makes a 0-d array 1-d)
    st = _k.round_hf32(src.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint32),
                       config.rounding_code(rounding), config.overflow_code(overflow_mode),
                       config.subnormal_code(subnormals), int(bits))
    return out, int(st)
