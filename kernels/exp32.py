"""The correctly rounded float32 exp model (float64 exp rounded once) without a libm call per element.

``float32(exp(float64(x)))``, the ``high_precision`` exp of the float32 vector unit, calls the C
library's float64 ``exp`` once per element, which no compiler vectorises. Here e^x is computed in
float64 arithmetic alone (Cody-Waite reduction x = k ln2 + r, a degree-13 Taylor polynomial of e^r,
an exact scaling by 2^k), which LLVM vectorises, and rounded once to float32. That value is within a
relative 2^-47 of e^x and the C library's within 2^-52 (NUMERICS.md section 2, "The float32 exp
without libm"), so both round to the same float32 whenever the float32 roundings of y (1 - 2^-44)
and y (1 + 2^-44) agree (rounding is monotonic); the few elements where they do not (about one in
2^19), and NaN inputs (whose payload the C library passes through), are recomputed the old way.
``tests/numerics/test_exp32.py`` proves the equality on every float32 input.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .codes import FLT_MAX, SATURATION

_INV_LN2 = 1.4426950408889634               # 1/ln2 rounded to float64
_SHIFT = 6755399441055744.0                 # 1.5 * 2^52: adding it rounds to an integer, kept in the low bits
_SHIFT_BITS = np.int64(0x4338000000000000)  # the bits of _SHIFT
_LN2_HI = 6.93147180369123816490e-01        # ln2 to 32 bits (low 21 bits zero): k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10        # ln2 - _LN2_HI to float64
_LO = np.float32(-104.0)                    # e^x < 2^-150 below: float32 +0
_HI = np.float32(89.0)                      # e^x > 2^128 above: float32 +Inf
_DELTA_DN = 1.0 - 2.0 ** -44                # the rounding guard's bracket
_DELTA_UP = 1.0 + 2.0 ** -44
_F32_MAX = FLT_MAX
_F32_TINY = np.float32(1.1754943508222875e-38)
# 1/j! for j = 2..13 (Taylor coefficients of e^r; |r| <= 0.3466 leaves a remainder below 2^-56)
_C2, _C3, _C4, _C5 = 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120
_C6, _C7, _C8, _C9 = 1.0 / 720, 1.0 / 5040, 1.0 / 40320, 1.0 / 362880
_C10, _C11, _C12, _C13 = 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800


@njit(cache=True, error_model="numpy")
def exp_poly64(x):
    """y = e^x within a relative 2^-47, for float32 x clamped to [-104, 89] (float64 arithmetic only)."""
    x = np.float64(x if x > _LO else _LO)    # NaN -> _LO too: the caller recomputes NaN inputs
    x = x if x < np.float64(_HI) else np.float64(_HI)
    kd = x * _INV_LN2 + _SHIFT
    k = np.float64(kd).view(np.int64) - _SHIFT_BITS
    kf = kd - _SHIFT
    r = (x - kf * _LN2_HI) - kf * _LN2_LO      # the first difference is exact
    p = _C12 + r * _C13
    p = _C11 + r * p
    p = _C10 + r * p
    p = _C9 + r * p
    p = _C8 + r * p
    p = _C7 + r * p
    p = _C6 + r * p
    p = _C5 + r * p
    p = _C4 + r * p
    p = _C3 + r * p
    p = _C2 + r * p
    p = 1.0 + r * p
    p = 1.0 + r * p
    return p * np.int64((k + 1023) << 52).view(np.float64)    # 2^k, k in [-151, 129]: exact


@njit(cache=True, error_model="numpy")
def rounds_alike(y):
    """True when every value within a relative 2^-44 of float64 y > 0 rounds to the same float32 (the
    roundings of the bracket's ends agree, and rounding is monotonic)."""
    return np.float32(y * _DELTA_DN) == np.float32(y * _DELTA_UP)


@njit(cache=True, error_model="numpy")
def exp_fast(x):
    """(r, sure): r = float32(y) for y = exp_poly64(x); sure when r is float32(exp(float64(x))) by the guard."""
    y = exp_poly64(x)
    return np.float32(y), rounds_alike(y) & (x == x)


@njit(cache=True, error_model="numpy")
def exp_f32_64(x):
    """e^x of float32 x: the float64 exp rounded once to float32 (the C library's value, without its call
    for all but the guarded few)."""
    r, sure = exp_fast(x)
    if sure:
        return r
    return np.float32(math.exp(np.float64(x)))


@njit(cache=True, error_model="numpy")
def _finish(r, overflow, flush):
    """(y, bad): float32 result r under the overflow mode and output flush; bad if r is Inf or NaN."""
    bad = not (abs(r) <= _F32_MAX)
    if bad and overflow == SATURATION:
        r = np.float32(0.0) if r != r else _F32_MAX
    if flush and abs(r) < _F32_TINY:
        r = r * np.float32(0.0)
    return r, bad


@njit(cache=True, error_model="numpy")
def exp_span(x, out, overflow, flush):
    """out[i] = exp(x[i]) as the vector unit's float32 exp (inputs flushed first if flush); returns
    the OR of statuses."""
    # pass 1 has no call, so it vectorises: unsure elements get a NaN mark and are counted
    unsure = np.int64(0)
    bad = np.int64(0)
    for i in range(out.size):
        a = x[i]
        if flush:
            a = a * np.float32(0.0) if abs(a) < _F32_TINY else a
        r, sure = exp_fast(a)
        f, b = _finish(r, overflow, flush)
        out[i] = f if sure else np.float32(np.nan)
        bad |= np.int64(b & sure)
        unsure += np.int64(not sure)
    if unsure:
        for i in range(out.size):
            if out[i] != out[i]:
                a = x[i]
                if flush:
                    a = a * np.float32(0.0) if abs(a) < _F32_TINY else a
                r = np.float32(math.exp(np.float64(a)))
                f, b = _finish(r, overflow, flush)
                out[i] = f
                bad |= np.int64(b)
    return bad

