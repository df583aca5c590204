"""The Ascend 950's 8- and 4-bit float formats on integer codes: decode to float32, encode from float32 / fp16 bits.

Formats by index (``kernels/codes.py``): HIF8 (HiFloat8), E4M3FN, E5M2 (OCP FP8), E2M1, E1M2 (FP4, the code in
the low 4 bits of a uint8), E8M0 (the MX scale). Roundings are ``codes.ROUNDING``'s plus ``HYBRID``; overflow
inf_nan=0 saturation=1. Status bits as ``kernels/cast.py``: 0x100 when a finite input overflows the format,
0x20 when the input is Inf or NaN. NUMERICS.md section 14 gives the source of every rule.

HiFloat8 follows the published pseudocode of asc-devkit's Reg ``Cast`` (``float`` and ``half`` to
``hifloat8_t``) bit for bit: the exponent ``Ev`` of the input picks how many mantissa bits HiF8 keeps (3 for
|Ev| <= 3, 2 for 4..7, 1 for 8..15, the denormal powers of two for -22..-16), the next bit ("TA bit") rounds half
away from zero, and ``HYBRID`` instead rounds up when the 14 (fp16: 2) bits below the kept ones, read as an
integer ``frac``, are >= a threshold ``thr`` made of the input's own lowest mantissa bits; |Ev| <= 3 always rounds
half away.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .codes import (CEIL, E1M2, E2M1, E4M3FN, E5M2, E8M0, FLOOR, HIF8, HIF8_INF, HIF8_MAX_CODE, HIF8_NAN, HYBRID,
                    LOW_IEEE, RINT, ROUND, SATURATION, ST_CONVERSION_OVERFLOW, ST_FP_OVERFLOW, TRUNC)
from .parallel import or_all

_IEEE = np.array(LOW_IEEE, dtype=np.int64)


@njit(cache=True)
def hif8_value(c: int) -> float:
    """Value of HiFloat8 code ``c``: sign, dot field (11: 4e1m, 10: 3e2m, 01: 2e3m, 001: 1e3m, 0001: 0e3m,
    0000: denormal 2^(m-23)), sign-magnitude exponent with an implicit leading 1; 0x80 NaN, 0x6F/0xEF +-Inf."""
    if c == HIF8_NAN:
        return math.nan
    sign = -1.0 if c & 0x80 else 1.0
    if c & 0x7F == HIF8_INF:
        return sign * math.inf
    if c & 0x7F == 0:
        return 0.0
    if c & 0x60 == 0x60:
        eb, mb = 4, 1
    elif c & 0x60 == 0x40:
        eb, mb = 3, 2
    elif c & 0x60 == 0x20:
        eb, mb = 2, 3
    elif c & 0x10:
        eb, mb = 1, 3
    elif c & 0x08:
        eb, mb = 0, 3
    else:
        return sign * math.ldexp(1.0, (c & 7) - 23)
    m = c & ((1 << mb) - 1)
    e = 0
    if eb > 0:
        field = (c >> mb) & ((1 << eb) - 1)
        e = (field & ((1 << (eb - 1)) - 1)) | (1 << (eb - 1))
        if field >> (eb - 1):
            e = -e
    return sign * math.ldexp(1.0 + m / (1 << mb), e)


@njit(cache=True)
def ieee_value(c: int, fmt: int) -> float:
    """Value of code ``c`` of an IEEE-like format (E4M3FN, E5M2, E2M1, E1M2: sign, exponent, mantissa with
    subnormals; E4M3FN's S.1111.111 and E5M2's all-ones exponent are NaN / Inf) or of E8M0 (2^(c-127), 0xFF NaN)."""
    mb, bias, _, inf_code, nan_code = _IEEE[fmt]
    if fmt == E8M0:
        return math.nan if c == nan_code else math.ldexp(1.0, c - bias)
    sb = 3 if fmt == E2M1 or fmt == E1M2 else 7
    sign = -1.0 if (c >> sb) & 1 else 1.0
    mag = c & ((1 << sb) - 1)
    if nan_code >= 0 and (mag == nan_code or (inf_code >= 0 and mag > inf_code)):
        return math.nan
    if mag == inf_code:
        return sign * math.inf
    ef = mag >> mb
    m = mag & ((1 << mb) - 1)
    if ef == 0:
        return sign * math.ldexp(float(m), 1 - bias - mb)
    return sign * math.ldexp(float(m + (1 << mb)), ef - bias - mb)


@njit(cache=True)
def decode_table(fmt: int) -> np.ndarray:
    """float32 value of every code of ``fmt`` (16 codes for FP4, 256 otherwise), exact."""
    n = 16 if fmt == E2M1 or fmt == E1M2 else 256
    out = np.empty(n, dtype=np.float32)
    for c in range(n):
        out[c] = hif8_value(c) if fmt == HIF8 else ieee_value(c, fmt)
    return out


@njit(cache=True)
def _hif8_pack(s: int, ev: int, m: int) -> int:
    """HiF8 code of sign ``s``, exponent ``ev`` (-15..15) and mantissa ``m`` (as many bits as |ev|'s class keeps)."""
    a = -ev if ev < 0 else ev
    neg = 1 if ev < 0 else 0
    if a == 0:
        c = 0x08 | m
    elif a == 1:
        c = 0x10 | (neg << 3) | m
    elif a <= 3:
        c = 0x20 | (((neg << 1) | (a - 2)) << 3) | m
    elif a <= 7:
        c = 0x40 | (((neg << 2) | (a - 4)) << 2) | m
    else:
        c = 0x60 | (((neg << 3) | (a - 8)) << 1) | m
    return (s << 7) | c


@njit(cache=True)
def hif8_round(s: int, ev: int, mf: int, w: int, f: int, thr: int, rounding: int, strict: bool) -> int:
    """HiF8 code (0x6F/0xEF on overflow) of the finite value (-1)^s 1.mf 2^ev, ``mf`` a ``w``-bit fraction, as
    the Cast pseudocode rounds it: half away (ROUND) or HYBRID (up when the ``f`` bits below the kept ones are
    >= ``thr``, or > with ``strict``); |ev| <= 3 rounds half away in both modes."""
    if ev > 15:
        return (s << 7) | HIF8_INF
    if ev < -23:
        return 0
    if ev == -23:
        frac = (1 << (f - 1)) | (mf >> (w - f + 1))
        up = rounding == ROUND or (frac > thr if strict else frac >= thr)
        return ((s << 7) | 1) if up else 0
    a = -ev if ev < 0 else ev
    mb = 0 if ev <= -16 else (3 if a <= 3 else (2 if a <= 7 else 1))
    m = mf >> (w - mb) if ev > -16 else ev + 23
    ta = (mf >> (w - 1 - mb)) & 1
    frac = (mf >> (w - f - mb)) & ((1 << f) - 1)
    if a <= 3:
        up = ta == 1
    elif rounding == ROUND:
        up = ta == 1
    else:
        up = frac > thr if strict else frac >= thr
    if ev <= -16:
        if up:
            ev += 1
        if ev == -15:
            return _hif8_pack(s, -15, 0)
        return (s << 7) | (ev + 23)
    if up:
        m += 1
        if m == 1 << mb:
            m = 0
            ev += 1
    if ev == 16:
        return (s << 7) | HIF8_INF
    return _hif8_pack(s, ev, m)


@njit(cache=True)
def _hif8_special(code: int, finite: bool, overflow: int):
    """(final code, status) of a HiF8 result ``code``: Inf kept or saturated to +-max, NaN kept or made 0."""
    if code == HIF8_NAN:
        return (0 if overflow == SATURATION else HIF8_NAN), ST_FP_OVERFLOW
    if code & 0x7F == HIF8_INF:
        st = ST_CONVERSION_OVERFLOW if finite else ST_FP_OVERFLOW
        if overflow == SATURATION:
            return (code & 0x80) | HIF8_MAX_CODE, st
        return code, st
    return code, 0


@njit(cache=True)
def hif8_from_f32(u: int, rounding: int, overflow: int, strict: bool):
    """(HiF8 code, status) of float32 bits ``u`` by the ``float -> hifloat8_t`` pseudocode (thr = bits 13..0)."""
    s = u >> 31
    ef = (u >> 23) & 0xFF
    mf = u & 0x7FFFFF
    if ef == 0xFF:
        return _hif8_special(HIF8_NAN if mf != 0 else (s << 7) | HIF8_INF, False, overflow)
    return _hif8_special(hif8_round(s, ef - 127, mf, 23, 14, mf & 0x3FFF, rounding, strict), True, overflow)


@njit(cache=True)
def hif8_from_f16(h: int, rounding: int, overflow: int, strict: bool):
    """(HiF8 code, status) of fp16 bits ``h`` by the ``half -> hifloat8_t`` pseudocode (thr = {bit 0, 1});
    a subnormal fp16 is first normalised (its exact value, the fraction shifted left with zeros)."""
    s = h >> 15
    ef = (h >> 10) & 0x1F
    mf = h & 0x3FF
    if ef == 0x1F:
        return _hif8_special(HIF8_NAN if mf != 0 else (s << 7) | HIF8_INF, False, overflow)
    if ef == 0:
        if mf == 0:
            return 0, 0
        ev = -14
        while mf < 0x400:
            mf <<= 1
            ev -= 1
        mf &= 0x3FF
    else:
        ev = ef - 15
    return _hif8_special(hif8_round(s, ev, mf, 10, 2, ((mf & 1) << 1) | 1, rounding, strict), True, overflow)


@njit(cache=True)
def ieee_from_f32(u: int, fmt: int, rounding: int, overflow: int, keep_nan: bool):
    """(code, status) of float32 bits ``u`` in E4M3FN / E5M2 / E2M1 / E1M2: one integer rounding of the
    significand to the format's quantum (rint, round, floor, ceil, trunc); overflow and Inf/NaN as the 950 does
    (FP8 inf_nan: Inf, or NaN for E4M3FN; saturation: +-max, NaN 0 unless ``keep_nan``; FP4: +-max, NaN 0)."""
    mb, bias, maxc, inf_code, nan_code = _IEEE[fmt]
    fp4 = fmt == E2M1 or fmt == E1M2
    sb = 3 if fp4 else 7
    s = u >> 31
    sbit = s << sb
    ef = (u >> 23) & 0xFF
    mf = u & 0x7FFFFF
    if ef == 0xFF:
        if mf != 0:
            if fp4 or (overflow == SATURATION and not keep_nan):
                return 0, ST_FP_OVERFLOW
            return sbit | nan_code, ST_FP_OVERFLOW
        if fp4 or overflow == SATURATION:
            return sbit | maxc, ST_FP_OVERFLOW
        return sbit | (inf_code if inf_code >= 0 else nan_code), ST_FP_OVERFLOW
    e = -126 if ef == 0 else ef - 127
    sig = mf if ef == 0 else mf | 0x800000
    emin = 1 - bias
    sh = 23 - mb + (emin - e if e < emin else 0)
    if sh > 40:
        sh = 40
    n = sig >> sh
    r = sig & ((1 << sh) - 1)
    half = 1 << (sh - 1)
    if rounding == RINT:
        if r > half or (r == half and n & 1):
            n += 1
    elif rounding == ROUND:
        if r >= half:
            n += 1
    elif rounding == FLOOR:
        if s == 1 and r != 0:
            n += 1
    elif rounding == CEIL:
        if s == 0 and r != 0:
            n += 1
    code = n + ((e - emin) << mb if e > emin else 0)
    if code > maxc:
        if fp4 or overflow == SATURATION:
            return sbit | maxc, ST_CONVERSION_OVERFLOW
        return sbit | (inf_code if inf_code >= 0 else nan_code), ST_CONVERSION_OVERFLOW
    return sbit | code, 0


@njit(cache=True)
def e8m0_from_f32(u: int, rounding: int):
    """(code, status) of |float32 bits u| as an E8M0 exponent: floor(log2|x|) + 127 (TRUNC) or ceil (CEIL),
    clamped to 0..0xFE; Inf -> 0xFE, NaN -> 0xFF, zero -> 0."""
    ef = (u >> 23) & 0xFF
    mf = u & 0x7FFFFF
    if ef == 0xFF:
        return (0xFF if mf != 0 else 0xFE), ST_FP_OVERFLOW
    if ef == 0 and mf == 0:
        return 0, 0
    if ef == 0:
        e = -126                                   # mf 2^-149 = 1.f 2^(-126 - shifts)
        while mf < 0x800000:
            mf <<= 1
            e -= 1
        mf &= 0x7FFFFF
    else:
        e = ef - 127
    if rounding == CEIL and mf != 0:
        e += 1
    if e > 127:
        return 0xFE, ST_CONVERSION_OVERFLOW
    return (e + 127 if e >= -127 else 0), 0


_CHUNK = 1 << 16


@njit(cache=True)
def _encode_span(src, out, fmt: int, rounding: int, overflow: int, keep_nan: bool, strict: bool) -> int:
    """out[i] = code of float32 bits src[i] in ``fmt`` (one loop per format); returns the OR of the statuses."""
    st = 0
    if fmt == HIF8:
        for i in range(src.size):
            c, s = hif8_from_f32(np.int64(src[i]), rounding, overflow, strict)
            out[i] = c
            st |= s
    elif fmt == E8M0:
        for i in range(src.size):
            c, s = e8m0_from_f32(np.int64(src[i]), rounding)
            out[i] = c
            st |= s
    else:
        for i in range(src.size):
            c, s = ieee_from_f32(np.int64(src[i]), fmt, rounding, overflow, keep_nan)
            out[i] = c
            st |= s
    return st


@njit(cache=True)
def _hif8_f16_span(src, out, rounding: int, overflow: int, strict: bool) -> int:
    st = 0
    for i in range(src.size):
        c, s = hif8_from_f16(np.int64(src[i]), rounding, overflow, strict)
        out[i] = c
        st |= s
    return st


@njit(cache=True, parallel=True)
def encode_f32(src, out, fmt: int, rounding: int, overflow: int, keep_nan: bool, strict: bool) -> int:
    """out[i] = code of float32 bits src[i] in ``fmt``; returns the OR of the status bits."""
    n = src.size
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        lo = c * _CHUNK
        hi = min(n, lo + _CHUNK)
        st[c] = _encode_span(src[lo:hi], out[lo:hi], fmt, rounding, overflow, keep_nan, strict)
    return or_all(st)


@njit(cache=True, parallel=True)
def encode_hif8_f16(src, out, rounding: int, overflow: int, strict: bool) -> int:
    """out[i] = HiF8 code of fp16 bits src[i] (the ``half -> hifloat8_t`` rule); returns the OR of the status bits."""
    n = src.size
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        lo = c * _CHUNK
        hi = min(n, lo + _CHUNK)
        st[c] = _hif8_f16_span(src[lo:hi], out[lo:hi], rounding, overflow, strict)
    return or_all(st)


__all__ = ["E1M2", "E2M1", "E4M3FN", "E5M2", "E8M0", "HIF8", "HYBRID", "TRUNC", "decode_table",
           "encode_f32", "encode_hif8_f16", "hif8_value", "ieee_value"]
