"""HF32: float32 operands of the cube rounded to 1 sign, 8 exponent and 10 stored significand bits.

The HF32 format keeps float32's exponent range with 11 significant bits (the 910B, 910_93 and 950 cube's
float32 path; ASCEND-FACTS.md section 12). Rounding a float32 to HF32 is one integer rounding of its bit
pattern at bit 13: the 13 low bits are dropped, the kept part rounded by them (a carry into the exponent is
the next binade, or Inf past the largest HF32 value (2 - 2^-10) 2^127), which is also right for subnormals
(whose quantum 2^-136 is fixed). Codes: rounding ``RINT`` (nearest even, mode 0), ``TRUNC`` (toward zero) or
``ROUND`` (nearest, ties away), overflow inf_nan=0 saturation=1, subnormals keep=0 flush=1.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .codes import FLUSH, RINT, ROUND, SATURATION, ST_CONVERSION_OVERFLOW

#: the bits HF32 drops, their half and the last bit it keeps
DROP = np.uint32(0x1FFF)
HALF = np.uint32(0x1000)
LAST = np.uint32(0x2000)
#: the largest finite HF32 magnitude, (2 - 2^-10) 2^127
HF32_MAX_BITS = np.uint32(0x7F7FE000)


@njit(cache=True)
def hf32_bits(b, rounding, overflow, subnormal):
    """(HF32 value of float32 bits b as float32 bits, status): NaN stays NaN (quieted, its payload's kept
    bits), Inf stays Inf; a finite value rounding past the largest HF32 is Inf (saturation: the largest
    HF32, same sign) with status 0x100; with subnormal=FLUSH a subnormal input is a zero of its sign."""
    sign = b & np.uint32(0x80000000)
    mag = b & np.uint32(0x7FFFFFFF)
    if mag >= np.uint32(0x7F800000):
        if mag > np.uint32(0x7F800000):
            return (b & ~DROP) | np.uint32(0x00400000), 0
        return b, 0
    if subnormal == FLUSH and mag < np.uint32(0x00800000):
        return sign, 0
    low = mag & DROP
    kept = mag - low
    if rounding == RINT:
        if low > HALF or (low == HALF and (kept & LAST) != 0):
            kept += LAST
    elif rounding == ROUND:
        if low >= HALF:
            kept += LAST
    # TRUNC (toward zero): the dropped bits are simply gone
    if kept >= np.uint32(0x7F800000):
        if overflow == SATURATION:
            return sign | HF32_MAX_BITS, ST_CONVERSION_OVERFLOW
        return sign | np.uint32(0x7F800000), ST_CONVERSION_OVERFLOW
    return sign | kept, 0


@njit(cache=True)
def hf32_span(src, out, rounding, overflow, subnormal):
    """out[i] = hf32_bits(src[i]) over uint32 float32 bit patterns; returns the OR of the statuses (the
    parallel driver is ``cast.round_hf32``)."""
    st = 0
    for i in range(src.size):
        out[i], s = hf32_bits(src[i], rounding, overflow, subnormal)
        st |= s
    return st
