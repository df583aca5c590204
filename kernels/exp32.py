"""The correctly rounded float32 exp model (float64 exp rounded once) without a libm call per element.

``float32(exp(float64(x)))``, the ``high_precision`` exp of the float32 vector unit, calls the C
library's float64 ``exp`` once per element, which no compiler vectorises. Here e^x is computed in
float64 arithmetic alone (Cody-Waite reduction x = (32 m + j) ln2 / 32 + r, a table of 2^(j/32), a
degree-6 Taylor polynomial of e^r, an exact scaling by 2^m), which LLVM vectorises, and rounded once to
float32. That value is within a relative 2^-47 of e^x and the C library's within 2^-52 (NUMERICS.md
section 2, "The float32 exp without libm"), so both round to the same float32 whenever the float32
roundings of y (1 - 2^-44) and y (1 + 2^-44) agree (rounding is monotonic); the few elements where they
do not (about one in 2^19), and NaN inputs (whose payload the C library passes through), are recomputed
the old way.
``tests/numerics/test_exp32.py`` proves the equality on every float32 input.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .codes import FLT_MAX, SATURATION

_INV_LN2_32 = 46.16624130844683             # 32/ln2 rounded to float64
_SHIFT = 6755399441055744.0                 # 1.5 * 2^52: adding it rounds to an integer, kept in the low bits
_SHIFT_BITS = np.int64(0x4338000000000000)  # the bits of _SHIFT
# ln2/32 in two parts: the high part has 32 significant bits (k * _LN2_32_HI is exact for |k| < 2^21)
_LN2_32_HI = 6.93147180369123816490e-01 / 32
_LN2_32_LO = 1.90821492927058770002e-10 / 32
#: 2^(j/32), j = 0..31, each the float64 nearest (tests/numerics/test_exp32.py checks it exactly)
EXP2_TABLE = np.array([2.0 ** (j / 32) for j in range(32)])
_LO = np.float32(-104.0)                    # e^x < 2^-150 below: float32 +0
_HI = np.float32(89.0)                      # e^x > 2^128 above: float32 +Inf
_DELTA_DN = 1.0 - 2.0 ** -44                # the rounding guard's bracket
_DELTA_UP = 1.0 + 2.0 ** -44
_F32_MAX = FLT_MAX
_F32_TINY = np.float32(1.1754943508222875e-38)
_NAN32 = np.float32(np.nan)
# 1/j! for j = 2..6 (Taylor coefficients of e^r; |r| <= 0.01083 leaves a remainder below 2^-58)
_C2, _C3, _C4, _C5, _C6 = 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720


@njit(cache=True, error_model="numpy")
def exp_poly64(x):
    """y = e^x within a relative 2^-47, for float32 x clamped to [-104, 89] (float64 arithmetic only)."""
    x = np.float64(x if x > _LO else _LO)    # NaN -> _LO too: the caller recomputes NaN inputs
    x = x if x < np.float64(_HI) else np.float64(_HI)
    kd = x * _INV_LN2_32 + _SHIFT
    k = np.float64(kd).view(np.int64) - _SHIFT_BITS     # |k| <= 4832
    kf = kd - _SHIFT
    r = (x - kf * _LN2_32_HI) - kf * _LN2_32_LO         # the first difference is exact
    p = _C5 + r * _C6
    p = _C4 + r * p
    p = _C3 + r * p
    p = _C2 + r * p
    p = 1.0 + r * p
    p = 1.0 + r * p
    # k = 32 m + j: 2^(k/32) = 2^m 2^(j/32); 2^m (m in [-151, 129]) is exact
    return (EXP2_TABLE[k & 31] * p) * np.int64(((k >> 5) + 1023) << 52).view(np.float64)


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
def _flush_in(a):
    """Input flush: a subnormal float32 becomes a zero of its sign."""
    return a * np.float32(0.0) if abs(a) < _F32_TINY else a


@njit(cache=True, error_model="numpy")
def _exp_span_flush(x, out, overflow):
    """exp_span under subnormal flushing (inputs and results): exp_span's two passes on the flushed inputs,
    then a pass for the overflow mode and the output flush (each pass a loop LLVM vectorises)."""
    unsure = np.int64(0)
    for i in range(out.size):
        r, sure = exp_fast(_flush_in(x[i]))
        out[i] = r if sure else _NAN32
        unsure += np.int64(not sure)
    if unsure:
        for i in range(out.size):
            if out[i] != out[i]:
                out[i] = np.float32(math.exp(np.float64(_flush_in(x[i]))))
    bad = np.int64(0)
    for i in range(out.size):
        f, b = _finish(out[i], overflow, True)
        out[i] = f
        bad |= np.int64(b)
    return bad


@njit(cache=True, error_model="numpy")
def exp_span(x, out, overflow, flush):
    """out[i] = exp(x[i]) as the vector unit's float32 exp (inputs and results flushed if flush); returns
    the OR of statuses (non-zero if a result was Inf or NaN, before saturation). ``out`` must not share
    memory with ``x``: the second pass rereads x where the first marked out with a NaN."""
    if flush:
        return _exp_span_flush(x, out, overflow)
    # pass 1 has no call and no mode, so it vectorises: unsure elements get a NaN mark and are counted
    unsure = np.int64(0)
    inf = np.int64(0)
    for i in range(out.size):
        r, sure = exp_fast(x[i])
        out[i] = r if sure else _NAN32
        unsure += np.int64(not sure)
        inf |= np.int64(sure & (r > _F32_MAX))      # a sure r is finite or +Inf
    bad = inf
    if unsure:
        for i in range(out.size):
            if out[i] != out[i]:
                r = np.float32(math.exp(np.float64(x[i])))
                out[i] = r
                bad |= np.int64(not (abs(r) <= _F32_MAX))
    if bad and overflow == SATURATION:
        for i in range(out.size):
            out[i] = _finish(out[i], overflow, False)[0]
    return bad
