"""CANN's published vector kernels, instruction by instruction (NUMERICS.md section 2, "Sourced kernels").

Gelu (TBE for Ascend910 and Ascend910B, Ascend C), Tanh (TBE, Ascend C), Sigmoid, Exp and
Rsqrt: every vector instruction of the kernel is one float32 step, rounded (and saturated)
on its own (:func:`eval_steps32`); Ascend C's tanh uses a fused multiply-add, modelled
exactly (:func:`fma_f32`). The spans of :mod:`.vector` widen 16-bit inputs exactly and cast
the result back with CAST_RINT.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .exp32 import exp_f32_64
from .codes import (EXP_F32, FLT_MAX, GELU_ASCENDC, GELU_TBE_V100, GELU_TBE_V220, RSQRT_F32, SATURATION,
                    SIGMOID_ASCENDC, SIGMOID_TBE, TANH_ASCENDC, TANH_TBE)

_F32_MAX = FLT_MAX

# The sourced kernels of NUMERICS.md section 2 ("Sourced kernels"): each vector instruction of
# CANN's implementation is one float32 step, rounded (and saturated) on its own.
_C_CS = np.float32(0.044715)                        # TBE gelu: CSVALUE
_C_Y = np.float32(1.5957691)                        # TBE gelu: 2 sqrt(2/pi)
_C_NEG_Y = np.float32(-1.5957691)
_C_AC_NEG = np.float32(-1.595769121 * 0.044715)     # Ascend C gelu: NEG_SQRT_EIGHT_OVER_PI
_C_AC_INV = np.float32(1.0 / 0.044715)              # Ascend C gelu: TANH_APPROX_FACTOR
_T_P0 = np.float32(0.0157396831)                    # Ascend C tanh polynomial
_T_P1 = np.float32(-0.0523039624)
_T_P2 = np.float32(0.133152977)
_T_P3 = np.float32(-0.333327681)
_T_SAT = np.float32(9.010913848876953125)
_T_SMALL = np.float32(0.6)


@njit(cache=True, error_model="numpy")
def _st(v, overflow):
    """(v, bad): one float32 step under the overflow mode; bad if v is Inf or NaN."""
    bad = not (abs(v) <= _F32_MAX)
    if bad and overflow == SATURATION:
        v = np.float32(0.0) if v != v else (_F32_MAX if v > 0 else -_F32_MAX)
    return v, bad


@njit(cache=True, error_model="numpy")
def exp_f32(x, exp64):
    """e^x in float32: the float64 exp rounded once (exp64), else float32 libm expf."""
    if exp64:
        return exp_f32_64(x)
    return math.exp(x)


@njit(cache=True, error_model="numpy")
def fma_f32(a, b, c):
    """a*b + c rounded once to float32 (a fused multiply-add)."""
    p = np.float64(a) * np.float64(b)   # exact: 24 + 24 bits
    cc = np.float64(c)
    s = p + cc
    if not (abs(s) <= 1.7976931348623157e308):
        return np.float32(s)
    # round s to odd with the exact error of the addition (TwoSum): 53 >= 24 + 2 bits, so the
    # float32 rounding of the odd-rounded sum is the rounding of the exact a*b + c
    bb = s - p
    err = (p - (s - bb)) + (cc - bb)
    if err != 0.0:
        bits = np.float64(s).view(np.int64)
        if (bits & 1) == 0:
            bits += 1 if (err > 0.0) == (s > 0.0) else -1
            s = np.int64(bits).view(np.float64)
    return np.float32(s)


@njit(cache=True, error_model="numpy")
def eval_steps32(op, x, exp64, overflow, tiny):
    """(y, bad) = the sourced kernel ``op`` on float32 x, every step a float32 operation;
    ``tiny`` is TBE tanh's MIN_FP_DATA; bad if any step was Inf or NaN."""
    one = np.float32(1.0)
    zero = np.float32(0.0)
    if op == EXP_F32:
        return _st(exp_f32(x, exp64), overflow)
    if op == RSQRT_F32:
        s, b0 = _st(np.sqrt(x), overflow)
        r, b1 = _st(one / s, overflow)
        return r, b0 | b1
    if op == SIGMOID_TBE or op == SIGMOID_ASCENDC:
        e, b0 = _st(exp_f32(-x, exp64), overflow)
        d, b1 = _st(e + one, overflow)
        r, b2 = _st(one / d, overflow)
        return r, b0 | b1 | b2
    if op == GELU_TBE_V100 or op == GELU_TBE_V220:
        sq, b0 = _st(x * x, overflow)
        cub, b1 = _st(sq * x, overflow)
        m1, b2 = _st(cub * _C_CS, overflow)
        p, b3 = _st(x + m1, overflow)
        bad = b0 | b1 | b2 | b3
        if op == GELU_TBE_V220:
            m, b4 = _st(p * _C_NEG_Y, overflow)
            e, b5 = _st(exp_f32(m, exp64), overflow)
            d, b6 = _st(e + one, overflow)
            r, b7 = _st(x / d, overflow)
            return r, bad | b4 | b5 | b6 | b7
        y, b4 = _st(p * _C_Y, overflow)
        right, b5 = _st(exp_f32(y if y < zero else zero, exp64), overflow)
        e, b6 = _st(exp_f32(-abs(y), exp64), overflow)
        d, b7 = _st(e + one, overflow)
        left, b8 = _st(x / d, overflow)
        r, b9 = _st(left * right, overflow)
        return r, bad | b4 | b5 | b6 | b7 | b8 | b9
    if op == GELU_ASCENDC:
        sq, b0 = _st(x * x, overflow)
        cub, b1 = _st(sq * x, overflow)
        t, b2 = _st(x * _C_AC_INV, overflow)
        t, b3 = _st(t + cub, overflow)
        u, b4 = _st(t * _C_AC_NEG, overflow)
        e, b5 = _st(exp_f32(u, exp64), overflow)
        d, b6 = _st(e + one, overflow)
        r, b7 = _st(x / d, overflow)
        return r, b0 | b1 | b2 | b3 | b4 | b5 | b6 | b7
    if op == TANH_TBE:
        a = abs(x)
        p, b0 = _st(a * np.float32(-2.0), overflow)
        e, b1 = _st(exp_f32(p, exp64), overflow)
        ex, b2 = _st(e * x, overflow)
        up, b3 = _st(x - ex, overflow)
        xa, b4 = _st(a + tiny, overflow)
        d1, b5 = _st(e + one, overflow)
        down, b6 = _st(d1 * xa, overflow)
        r, b7 = _st(up / down, overflow)
        return r, b0 | b1 | b2 | b3 | b4 | b5 | b6 | b7
    if op == TANH_ASCENDC:
        sq, b0 = _st(x * x, overflow)
        o, b1 = _st(sq * _T_P0, overflow)
        o, b2 = _st(o + _T_P1, overflow)
        o, b3 = _st(fma_f32(o, sq, _T_P2), overflow)
        o, b4 = _st(fma_f32(o, sq, _T_P3), overflow)
        o, b5 = _st(o * sq, overflow)
        o, b6 = _st(fma_f32(o, x, x), overflow)
        a = abs(x)
        m, b7 = _st(a * np.float32(2.0), overflow)
        m, b8 = _st(exp_f32(m, exp64), overflow)
        m, b9 = _st(m + one, overflow)
        m, b10 = _st(one / m, overflow)
        m, b11 = _st(m * np.float32(-2.0), overflow)
        m, b12 = _st(m + one, overflow)
        if a >= _T_SAT:
            m = one
        if x < zero or (x == zero and math.copysign(1.0, x) < 0.0):
            m = -m                      # the sign bit of x ORed into m (m >= 0 here)
        bad = b0 | b1 | b2 | b3 | b4 | b5 | b6 | b7 | b8 | b9 | b10 | b11 | b12
        return (m if a >= _T_SMALL else o), bad
    return np.float32(np.nan), True
