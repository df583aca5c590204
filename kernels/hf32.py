"""HF32: float32 operands of the cube rounded to 1 sign, 8 exponent and N stored significand bits (N = 11 on the
Ascend910B and Ascend910_93, 10 assumed on the Ascend950; NUMERICS.md section 13).

The HF32 format keeps float32's exponent range with N + 1 significant bits. Rounding a float32 to HF32 is one
integer rounding of its bit pattern at bit 23 - N: the 23 - N low bits are dropped, the kept part rounded by
them (a carry into the exponent is the next binade, or Inf past the largest HF32 value (2 - 2^-N) 2^127),
which is also right for subnormals (whose quantum 2^-(126 + N) is fixed): the conversion the ops-nn goldens'
``simulate_hf32_precision`` writes as integer shifts of the bit pattern. Codes: rounding ``RINT`` (nearest
even, SetHF32 transMode 0), ``ROUND`` (nearest, ties away: transMode 1) or ``TRUNC`` (toward zero), overflow
inf_nan=0 saturation=1, subnormals keep=0 flush=1; ``mant`` the stored significand bits N (1..22).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .codes import FLUSH, RINT, ROUND, SATURATION, ST_CONVERSION_OVERFLOW


@njit(cache=True)
def hf32_bits(b, rounding, overflow, subnormal, mant):
    """(HF32 value of float32 bits b with ``mant`` stored significand bits, as float32 bits, status): NaN stays
    NaN (quieted, its payload's kept bits), Inf stays Inf; a finite value rounding past the largest HF32 is Inf
    (saturation: the largest HF32, same sign) with status 0x100; with subnormal=FLUSH a subnormal input is a
    zero of its sign."""
    last = np.uint32(1) << np.uint32(23 - mant)     # the last bit kept
    drop = last - np.uint32(1)                      # the bits dropped
    half = last >> np.uint32(1)
    sign = b & np.uint32(0x80000000)
    mag = b & np.uint32(0x7FFFFFFF)
    if mag >= np.uint32(0x7F800000):
        if mag > np.uint32(0x7F800000):
            return (b & ~drop) | np.uint32(0x00400000), 0
        return b, 0
    if subnormal == FLUSH and mag < np.uint32(0x00800000):
        return sign, 0
    low = mag & drop
    kept = mag - low
    if rounding == RINT:
        if low > half or (low == half and (kept & last) != 0):
            kept += last
    elif rounding == ROUND:
        if low >= half:
            kept += last
    # TRUNC (toward zero): the dropped bits are simply gone
    if kept >= np.uint32(0x7F800000):
        if overflow == SATURATION:
            return sign | (np.uint32(0x7F800000) - last), ST_CONVERSION_OVERFLOW
        return sign | np.uint32(0x7F800000), ST_CONVERSION_OVERFLOW
    return sign | kept, 0


@njit(cache=True)
def hf32_span(src, out, rounding, overflow, subnormal, mant):
    """out[i] = hf32_bits(src[i]) over uint32 float32 bit patterns; returns the OR of the statuses (the
    parallel driver is ``cast.round_hf32``).

    The same steps as :func:`hf32_bits` written as selects, not branches (a branch on the dropped bits of random
    data is mispredicted half the time; the selects vectorise): nearest even adds half - 1 plus the last kept
    bit and cuts the dropped bits, ties away adds half, toward zero adds nothing; a flushed subnormal, an
    overflow, an Inf or NaN then replace the result."""
    last = np.uint32(1) << np.uint32(23 - mant)
    drop = last - np.uint32(1)
    half = last >> np.uint32(1)
    keep = ~drop
    shift = np.uint32(23 - mant)
    inf = np.uint32(0x7F800000)
    top = inf - last if overflow == SATURATION else inf
    flush = subnormal == FLUSH
    st = np.int64(0)
    for i in range(src.size):
        b = np.uint32(src[i])
        sign = b & np.uint32(0x80000000)
        mag = b & np.uint32(0x7FFFFFFF)
        if rounding == RINT:
            add = half - np.uint32(1) + ((mag >> shift) & np.uint32(1))
        elif rounding == ROUND:
            add = half
        else:
            add = np.uint32(0)
        kept = (mag + add) & keep
        special = mag >= inf
        over = (kept >= inf) and not special
        r = sign | (top if over else kept)
        r = sign if (flush and mag < np.uint32(0x00800000)) else r
        nan = (b & keep) | np.uint32(0x00400000)
        r = (nan if mag > inf else b) if special else r
        out[i] = r
        st |= np.int64(over) * ST_CONVERSION_OVERFLOW
    return st
