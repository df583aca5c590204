"""CANN's Softmax and LayerNorm (ops/sourced.py's step-by-step models) one row at a time.

The steps of :func:`ascend_emu.ops.sourced.softmax` and :func:`~ascend_emu.ops.sourced.layer_norm`
fused into one pass per row of the reduced trailing axes (rows in parallel): the same IEEE float32
operations in the same order (every sum sequential from the row's first element, as the vector unit's
ReduceSum; the 16-bit subtraction of TBE's softmax rounded to the 16-bit format as the vector unit
does; the exp the model's float32 exp), so the results are the step path's bits whenever no step gives
Inf or NaN: then no step raises a status and the overflow modes agree. When some step of some row does,
the kernel says so and the caller runs the steps (their status, their saturation). Subnormals kept only
(flushing happens at every step, a matter for the step path).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .cast import bits16_to_f32, f16_to_f32_hw, f32_to_f16_hw, fmt16
from .codes import FLT_MAX, INF_NAN, KEEP
from .exp32 import exp_span
from .sourced import exp_f32
from .vector import round16_f32

_F32_MAX = FLT_MAX
#: how LayerNorm's rstd is computed: 1 / sqrt(ve); exp(-0.5 log(ve)) with the float64 models of log and
#: exp rounded once (high_precision); the same with float32 libm logf / expf (high_performance)
RSTD_DIV, RSTD_EXPLOG64, RSTD_EXPLOG32 = 0, 1, 2
#: how softmax takes x - max: in float32 (Ascend C), or rounded to fp16 / bf16 (TBE on 16-bit data);
#: SUB_F16_HW is SUB_F16 with the CPU's fp16 conversions (hosts with cast.HW_HALF only)
SUB_F32, SUB_F16, SUB_BF16, SUB_F16_HW = 0, 1, 2, 3
_ROWS = 32          # rows per parallel work item


@njit(cache=True, error_model="numpy")
def _bad(v):
    """1 if float32 v is Inf or NaN."""
    return np.int64(not (abs(v) <= _F32_MAX))


@njit(cache=True, error_model="numpy")
def _layer_norm_row(x, g, b, out, cof, eps, rstd_mode):
    """One row: mean = sum(x cof), d = x - mean, var = sum((d d) cof), rstd, out = d rstd (g) (+ b);
    returns 1 if some step was Inf or NaN."""
    n = x.size
    bad = np.int64(0)
    acc = x[0] * cof
    bad |= _bad(acc)
    for j in range(1, n):
        t = x[j] * cof
        bad |= _bad(t)
        acc = acc + t
    mean = acc
    bad |= _bad(mean)
    d = x[0] - mean
    q = d * d
    acc = q * cof
    bad |= _bad(d) | _bad(q) | _bad(acc)
    for j in range(1, n):
        d = x[j] - mean
        q = d * d
        t = q * cof
        bad |= _bad(d) | _bad(q) | _bad(t)
        acc = acc + t
    var = acc
    ve = var + eps
    bad |= _bad(var) | _bad(ve)
    if rstd_mode == RSTD_DIV:
        s = np.sqrt(ve)
        rstd = np.float32(1.0) / s
        bad |= _bad(s)
    else:
        if rstd_mode == RSTD_EXPLOG64:
            lg = np.float32(np.log(np.float64(ve)))
        else:
            lg = np.log(ve)
        m = lg * np.float32(-0.5)
        rstd = exp_f32(m, rstd_mode == RSTD_EXPLOG64)
        bad |= _bad(lg) | _bad(m)
    bad |= _bad(rstd)
    hg = g.size > 0
    hb = b.size > 0
    for j in range(n):
        y = (x[j] - mean) * rstd
        bad |= _bad(y)
        if hg:
            y = y * g[j]
            bad |= _bad(y)
        if hb:
            y = y + b[j]
            bad |= _bad(y)
        out[j] = y
    return bad


@njit(cache=True, parallel=True)
def layer_norm_rows(x, g, b, out, cof, eps, rstd_mode):
    """out[r] = LayerNorm of the float32 row x[r] with gamma g and beta b (each of the row's length, or
    empty), every step float32; True when no step of any row was Inf or NaN (else out is not to be used)."""
    rows = x.shape[0]
    nch = (rows + _ROWS - 1) // _ROWS
    bad = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        k = np.int64(0)
        for r in range(c * _ROWS, min(rows, (c + 1) * _ROWS)):
            k |= _layer_norm_row(x[r], g, b, out[r], cof, eps, rstd_mode)
        bad[c] = k
    return bad.sum() == 0


@njit(cache=True, error_model="numpy")
def _softmax_row(x, d, out, sub_mode, exp64):
    """One row: m = max(x), d = x - m (rounded to the 16-bit format for SUB_F16 / SUB_BF16), e = exp(d),
    s = sum(e) in order, out = e / s; returns 1 if some step was Inf or NaN (a NaN input included)."""
    n = x.size
    bad = np.int64(0)
    m = x[0]
    for j in range(n):
        v = x[j]
        bad |= np.int64(v != v)
        m = v if v > m else m
    # one loop per mode (a branch inside would stop vectorisation)
    if sub_mode == SUB_F32:
        for j in range(n):
            c = x[j] - m
            bad |= _bad(c)
            d[j] = c
    elif sub_mode == SUB_F16_HW:
        for j in range(n):
            c = f16_to_f32_hw(f32_to_f16_hw(x[j] - m))   # RNE to fp16, Inf on overflow
            bad |= _bad(c)
            d[j] = c
    else:
        bf16 = sub_mode == SUB_BF16
        mt, bias, eb = fmt16(bf16)
        for j in range(n):
            bits, st = round16_f32(x[j] - m, mt, bias, eb, INF_NAN, KEEP)
            c = bits16_to_f32(bits, bf16, KEEP)
            bad |= np.int64(st != 0) | _bad(c)
            d[j] = c
    if exp64:
        bad |= np.int64(exp_span(d, out, INF_NAN, False) != 0)
    else:
        for j in range(n):
            e = math.exp(d[j])
            bad |= _bad(e)
            out[j] = e
    s = out[0]
    for j in range(1, n):
        s = s + out[j]
    bad |= _bad(s)
    for j in range(n):
        y = out[j] / s
        bad |= _bad(y)
        out[j] = y
    return bad


@njit(cache=True, parallel=True)
def softmax_rows(x, out, sub_mode, exp64):
    """out[r] = softmax of the float32 row x[r] (16-bit data widened exactly) as CANN's kernel steps it;
    True when no step of any row was Inf or NaN (else out is not to be used)."""
    rows, n = x.shape
    nch = (rows + _ROWS - 1) // _ROWS
    bad = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        d = np.empty(n, dtype=np.float32)
        k = np.int64(0)
        for r in range(c * _ROWS, min(rows, (c + 1) * _ROWS)):
            k |= _softmax_row(x[r], d, out[r], sub_mode, exp64)
        bad[c] = k
    return bad.sum() == 0
