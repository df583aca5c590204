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
def _flag16(big, h):
    """big with bit 15 set if the fp16 bits h are Inf or NaN (|h| >= 0x7C00: + 0x400 carries into bit 15), kept in
    16 bits (an OR of comparisons widened to int64 lanes took twice as long: 0.11-0.14 against 0.065 ms for LayerNorm's
    output loop over 262,144 values)."""
    return np.uint16(big | np.uint16(np.uint16(h & np.uint16(0x7FFF)) + np.uint16(0x0400)))


@njit(cache=True, error_model="numpy")
def _flagged16(big):
    """1 if _flag16 saw an Inf or NaN."""
    return np.int64(big >> np.uint16(15))


@njit(cache=True, error_model="numpy")
def _ln_terms_bad(x, mean, cof):
    """1 if some term x[j] cof (mean None) or some d = x[j] - mean, d d or d d cof is Inf or NaN (the sums'
    terms, checked apart from the sums so that this loop vectorises)."""
    bad = np.int64(0)
    if mean is None:
        for j in range(x.size):
            bad |= _bad(x[j] * cof)
    else:
        for j in range(x.size):
            d = x[j] - mean
            q = d * d
            bad |= _bad(d) | _bad(q) | _bad(q * cof)
    return bad


@njit(cache=True, error_model="numpy")
def _ln_finish(x, g, b, out, mean, var, eps, rstd_mode):
    """rstd from var, out = (x - mean) rstd (g) (+ b); returns 1 if some step was Inf or NaN."""
    n = x.size
    rstd, bad = _ln_rstd(mean, var, eps, rstd_mode)
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


@njit(cache=True, error_model="numpy")
def _layer_norm_row(x, g, b, out, cof, eps, rstd_mode):
    """One row: mean = sum(x cof), d = x - mean, var = sum((d d) cof), rstd, out = d rstd (g) (+ b);
    returns 1 if some step was Inf or NaN."""
    mean, var = _ln_row_sums(x, cof)
    bad = _ln_terms_bad(x, None, cof) | _ln_terms_bad(x, mean, cof)
    return bad | _ln_finish(x, g, b, out, mean, var, eps, rstd_mode)


@njit(cache=True, error_model="numpy")
def _layer_norm_rows8(x, r, g, b, out, cof, eps, rstd_mode, mv):
    """_layer_norm_row for the 8 rows x[r:r+8]: the sums by _ln_sums8 (into the scratch mv, (2, 8) float32)."""
    _ln_sums8(x, r, cof, mv)
    bad = np.int64(0)
    for k in range(8):
        bad |= _ln_terms_bad(x[r + k], None, cof) | _ln_terms_bad(x[r + k], mv[0, k], cof)
        bad |= _ln_finish(x[r + k], g, b, out[r + k], mv[0, k], mv[1, k], eps, rstd_mode)
    return bad


@njit(cache=True)
def _layer_norm_chunk(x, r, r1, g, b, out, cof, eps, rstd_mode):
    """LayerNorm of rows r..r1 of x into out: eight rows at a time, then one by one; 1 if some step was bad."""
    k = np.int64(0)
    mv = np.empty((2, 8), np.float32)
    while r + 8 <= r1:
        k |= _layer_norm_rows8(x, r, g, b, out, cof, eps, rstd_mode, mv)
        r += 8
    for t in range(r, r1):
        k |= _layer_norm_row(x[t], g, b, out[t], cof, eps, rstd_mode)
    return k


@njit(cache=True, parallel=True)
def layer_norm_rows(x, g, b, out, cof, eps, rstd_mode):
    """out[r] = LayerNorm of the float32 row x[r] with gamma g and beta b (each of the row's length, or
    empty), every step float32; True when no step of any row was Inf or NaN (else out is not to be used)."""
    rows = x.shape[0]
    nch = (rows + _ROWS - 1) // _ROWS
    bad = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        bad[c] = _layer_norm_chunk(x, c * _ROWS, min(rows, (c + 1) * _ROWS), g, b, out, cof, eps, rstd_mode)
    return bad.sum() == 0


@njit(cache=True)
def _widen_rows_f16(xb, r0, x):
    """x[r] = the float32 value of the fp16 bits xb[r0 + r] (exact; the CPU's conversion)."""
    for r in range(x.shape[0]):
        src = xb[r0 + r]
        dst = x[r]
        for j in range(dst.size):
            dst[j] = f16_to_f32_hw(src[j])


@njit(cache=True)
def _round_rows_f16(y, ob, r0):
    """ob[r0 + r] = fp16 bits of float32 y[r] rounded to nearest even (the CPU's conversion); 1 if one
    rounded to Inf (an overflow whose status and saturation the caller's path decides)."""
    over = np.int64(0)
    for r in range(y.shape[0]):
        src = y[r]
        dst = ob[r0 + r]
        for j in range(src.size):
            h = f32_to_f16_hw(src[j])
            over |= np.int64((h & np.uint16(0x7FFF)) >= np.uint16(0x7C00))
            dst[j] = h
    return over


@njit(cache=True, error_model="numpy")
def _ln_rstd(mean, var, eps, rstd_mode):
    """(rstd, 1 if mean, var, var + eps or a step of rstd is Inf or NaN): _ln_finish's per-row part. Two of those
    are implied by others and not tested: var (an Inf or NaN var makes ve = var + eps Inf or NaN) and sqrt(ve)
    (Inf only for an Inf ve; NaN only for a NaN or negative ve, whose 1 / NaN makes rstd NaN)."""
    ve = var + eps
    bad = _bad(mean) | _bad(ve)
    if rstd_mode == RSTD_DIV:
        rstd = np.float32(1.0) / np.sqrt(ve)
    else:
        if rstd_mode == RSTD_EXPLOG64:
            lg = np.float32(np.log(np.float64(ve)))
        else:
            lg = np.log(ve)
        m = lg * np.float32(-0.5)
        rstd = exp_f32(m, rstd_mode == RSTD_EXPLOG64)
        bad |= _bad(lg) | _bad(m)
    return rstd, bad | _bad(rstd)


@njit(cache=True, error_model="numpy")
def _ln_out_f16(x, g, b, ob, mean, rstd):
    """ob = fp16 bits of ((x - mean) rstd (g)) (+ b), each step float32 as _ln_finish, rounded to nearest even by the
    CPU's conversion; 1 if some result's fp16 is Inf or NaN. That one check is _ln_finish's per step and
    _round_rows_f16's: a float32 product or sum with an Inf or NaN operand is Inf or NaN, so a step that went bad
    leaves y Inf or NaN, whose fp16 is Inf or NaN, as is the fp16 of a finite y that rounds past 65504. One loop per
    case of gamma and beta (y + 0 would turn -0 into +0; a branch inside would stop vectorisation)."""
    n = x.size
    big = np.uint16(0)
    if g.size > 0 and b.size > 0:
        for j in range(n):
            h = f32_to_f16_hw(((x[j] - mean) * rstd) * g[j] + b[j])
            big = _flag16(big, h)
            ob[j] = h
    elif g.size > 0:
        for j in range(n):
            h = f32_to_f16_hw(((x[j] - mean) * rstd) * g[j])
            big = _flag16(big, h)
            ob[j] = h
    elif b.size > 0:
        for j in range(n):
            h = f32_to_f16_hw((x[j] - mean) * rstd + b[j])
            big = _flag16(big, h)
            ob[j] = h
    else:
        for j in range(n):
            h = f32_to_f16_hw((x[j] - mean) * rstd)
            big = _flag16(big, h)
            ob[j] = h
    return _flagged16(big)


@njit(cache=True, error_model="numpy")
def _ln_sums8(x, r, cof, mv):
    """mv[0, k], mv[1, k] = _layer_norm_row's mean and var of row x[r + k], k < 8: each row's two sums in its own
    order, the 8 rows' sums interleaved (8 independent chains of float32 adds)."""
    n = x.shape[1]
    x0, x1, x2, x3, x4, x5, x6, x7 = x[r], x[r + 1], x[r + 2], x[r + 3], x[r + 4], x[r + 5], x[r + 6], x[r + 7]
    a0, a1, a2, a3 = x0[0] * cof, x1[0] * cof, x2[0] * cof, x3[0] * cof
    a4, a5, a6, a7 = x4[0] * cof, x5[0] * cof, x6[0] * cof, x7[0] * cof
    for j in range(1, n):
        a0 = a0 + x0[j] * cof
        a1 = a1 + x1[j] * cof
        a2 = a2 + x2[j] * cof
        a3 = a3 + x3[j] * cof
        a4 = a4 + x4[j] * cof
        a5 = a5 + x5[j] * cof
        a6 = a6 + x6[j] * cof
        a7 = a7 + x7[j] * cof
    m0, m1, m2, m3, m4, m5, m6, m7 = a0, a1, a2, a3, a4, a5, a6, a7
    d0, d1, d2, d3 = x0[0] - m0, x1[0] - m1, x2[0] - m2, x3[0] - m3
    d4, d5, d6, d7 = x4[0] - m4, x5[0] - m5, x6[0] - m6, x7[0] - m7
    a0, a1, a2, a3 = (d0 * d0) * cof, (d1 * d1) * cof, (d2 * d2) * cof, (d3 * d3) * cof
    a4, a5, a6, a7 = (d4 * d4) * cof, (d5 * d5) * cof, (d6 * d6) * cof, (d7 * d7) * cof
    for j in range(1, n):
        d0 = x0[j] - m0
        d1 = x1[j] - m1
        d2 = x2[j] - m2
        d3 = x3[j] - m3
        d4 = x4[j] - m4
        d5 = x5[j] - m5
        d6 = x6[j] - m6
        d7 = x7[j] - m7
        a0 = a0 + (d0 * d0) * cof
        a1 = a1 + (d1 * d1) * cof
        a2 = a2 + (d2 * d2) * cof
        a3 = a3 + (d3 * d3) * cof
        a4 = a4 + (d4 * d4) * cof
        a5 = a5 + (d5 * d5) * cof
        a6 = a6 + (d6 * d6) * cof
        a7 = a7 + (d7 * d7) * cof
    mv[0, 0], mv[0, 1], mv[0, 2], mv[0, 3], mv[0, 4], mv[0, 5], mv[0, 6], mv[0, 7] = m0, m1, m2, m3, m4, m5, m6, m7
    mv[1, 0], mv[1, 1], mv[1, 2], mv[1, 3], mv[1, 4], mv[1, 5], mv[1, 6], mv[1, 7] = a0, a1, a2, a3, a4, a5, a6, a7


@njit(cache=True, error_model="numpy")
def _ln_row_sums(x, cof):
    """_layer_norm_row's mean and var of the one row x."""
    n = x.size
    acc = x[0] * cof
    for j in range(1, n):
        acc = acc + x[j] * cof
    mean = acc
    d = x[0] - mean
    acc = (d * d) * cof
    for j in range(1, n):
        d = x[j] - mean
        acc = acc + (d * d) * cof
    return mean, acc


@njit(cache=True, parallel=True)
def layer_norm_rows_f16(xb, g, b, ob, cof, eps, rstd_mode):
    """layer_norm_rows of fp16 rows given as their bits (rows, n) uint16, widened exactly, the result
    rounded to fp16 (nearest even) into ``ob``, a block of rows at a time in the thread's own float32
    rows; True when no step was Inf or NaN and no result rounded to Inf (else ob is not to be used). Hosts
    with the CPU's fp16 conversion (kernels/cast.HW_HALF) only.

    The same float32 operations as layer_norm_rows, with fewer checks: on fp16 data (|x| <= 65504) the sums'
    terms x cof, x - mean, its square and that times cof cannot be Inf or NaN unless x is (|x - mean| <= 2 x
    65504 with a finite mean, checked per row, (2 x 65504)^2 < 2^35), and an x that is Inf or NaN needs no check
    of its own: its term x cof is Inf or NaN (Inf 0 included), so the in-order sum that is the mean is Inf or NaN
    (an add with an Inf or NaN operand gives Inf or NaN), which _ln_rstd checks; so _ln_terms_bad's two passes
    are no pass at all. The output's steps are checked on its fp16 bits (_ln_out_f16)."""
    rows, n = xb.shape
    nch = (rows + _ROWS - 1) // _ROWS
    bad = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        r0 = c * _ROWS
        nr = min(rows, r0 + _ROWS) - r0
        x = np.empty((nr, n), dtype=np.float32)
        mv = np.empty((2, 8), dtype=np.float32)
        _widen_rows_f16(xb, r0, x)
        k = np.int64(0)
        r = 0
        while r < nr:
            if r + 8 <= nr:
                _ln_sums8(x, r, cof, mv)
                m = 8
            else:
                mv[0, 0], mv[1, 0] = _ln_row_sums(x[r], cof)
                m = 1
            for t in range(m):
                rstd, kb = _ln_rstd(mv[0, t], mv[1, t], eps, rstd_mode)
                k |= kb | _ln_out_f16(x[r + t], g, b, ob[r0 + r + t], mv[0, t], rstd)
            r += m
        bad[c] = k
    return bad.sum() == 0


@njit(cache=True, error_model="numpy")
def _softmax_exp(x, m, d, out, sub_mode, exp64, tab):
    """d = x - m (rounded to the 16-bit format for SUB_F16 / SUB_BF16), out = exp(d); returns 1 if some
    step was Inf or NaN or x holds a NaN. ``tab`` (16-bit modes; empty for none): exp of every 16-bit
    pattern (:func:`softmax_exp_table`), read instead of computing exp(d).

    Only d is tested, for ``m`` the row's maximum by ``v > m`` (_softmax_row, _softmax_rows8). A NaN x needs no
    test of its own: x - m is then NaN, and so its rounding. Nor does exp(d): if every d is finite, no x is NaN
    (above) or +Inf (then m = +Inf and Inf - Inf is NaN) or -Inf (x - m = -Inf), so m is the largest of finite
    values, each x - m <= 0 and its rounding too, and exp of a finite d <= 0 is in [0, 1] (computed, a table entry
    or exp_span's), finite; if some d is not, the row goes back to the steps anyway."""
    n = x.size
    bad = np.int64(0)
    if tab.size == 65536 and sub_mode != SUB_F32:
        # the 16-bit patterns of d into d's own memory (a loop that vectorises), then their exp read
        dbits = d.view(np.uint32)
        if sub_mode == SUB_F16_HW:
            for j in range(n):
                h = f32_to_f16_hw(x[j] - m)   # RNE to fp16, Inf on overflow
                bad |= _bad(f16_to_f32_hw(h))
                dbits[j] = np.uint32(h)
        else:
            bf16 = sub_mode == SUB_BF16
            mt, bias, eb = fmt16(bf16)
            for j in range(n):
                bits, st = round16_f32(x[j] - m, mt, bias, eb, INF_NAN, KEEP)
                bad |= np.int64(st != 0) | _bad(bits16_to_f32(bits, bf16, KEEP))
                dbits[j] = np.uint32(bits)
        for j in range(n):
            out[j] = tab[dbits[j]]
        return bad
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
            out[j] = math.exp(d[j])
    return bad


@njit(cache=True, error_model="numpy")
def _softmax_div(out, s):
    """out = out / s; returns 1 if s or some quotient is Inf or NaN."""
    bad = _bad(s)
    for j in range(out.size):
        y = out[j] / s
        bad |= _bad(y)
        out[j] = y
    return bad


@njit(cache=True, error_model="numpy")
def _softmax_row(x, d, out, sub_mode, exp64, tab):
    """One row: m = max(x), d = x - m (rounded to the 16-bit format for SUB_F16 / SUB_BF16), e = exp(d),
    s = sum(e) in order, out = e / s; returns 1 if some step was Inf or NaN (a NaN input included)."""
    n = x.size
    m = x[0]
    for j in range(n):
        v = x[j]
        m = v if v > m else m
    bad = _softmax_exp(x, m, d, out, sub_mode, exp64, tab)
    s = out[0]
    for j in range(1, n):
        s = s + out[j]
    return bad | _softmax_div(out, s)


@njit(cache=True, error_model="numpy")
def _softmax_rows8(x, r, d, out, sub_mode, exp64, tab, ss):
    """_softmax_row for the 8 rows x[r:r+8]: each row's maximum and sum in its own order, the 8 rows'
    chains interleaved (8 independent chains of selections and of float32 adds instead of one); the sums into
    the scratch ss (8 float32)."""
    n = x.shape[1]
    x0, x1, x2, x3, x4, x5, x6, x7 = x[r], x[r + 1], x[r + 2], x[r + 3], x[r + 4], x[r + 5], x[r + 6], x[r + 7]
    m0, m1, m2, m3, m4, m5, m6, m7 = x0[0], x1[0], x2[0], x3[0], x4[0], x5[0], x6[0], x7[0]
    for j in range(1, n):
        v = x0[j]
        m0 = v if v > m0 else m0
        v = x1[j]
        m1 = v if v > m1 else m1
        v = x2[j]
        m2 = v if v > m2 else m2
        v = x3[j]
        m3 = v if v > m3 else m3
        v = x4[j]
        m4 = v if v > m4 else m4
        v = x5[j]
        m5 = v if v > m5 else m5
        v = x6[j]
        m6 = v if v > m6 else m6
        v = x7[j]
        m7 = v if v > m7 else m7
    ms = (m0, m1, m2, m3, m4, m5, m6, m7)
    bad = np.int64(0)
    for k in range(8):
        bad |= _softmax_exp(x[r + k], ms[k], d, out[r + k], sub_mode, exp64, tab)
    _sum8(out, r, ss)
    for k in range(8):
        bad |= _softmax_div(out[r + k], ss[k])
    return bad


@njit(cache=True)
def softmax_exp_table(bf16, exp64):
    """exp of every 16-bit pattern (bf16 if ``bf16`` else fp16) as :func:`_softmax_exp` computes exp(d) for
    such a d: the same function on the exactly widened patterns (d = x - 0 = x), one float32 per pattern."""
    x = np.empty(65536, dtype=np.float32)
    for b in range(65536):
        x[b] = bits16_to_f32(np.uint16(b), bf16, KEEP)
    d = np.empty(65536, dtype=np.float32)
    out = np.empty(65536, dtype=np.float32)
    _softmax_exp(x, np.float32(0.0), d, out, SUB_F32, exp64, np.zeros(0, dtype=np.float32))
    return out


@njit(cache=True)
def _softmax_chunk(x, r, r1, d, out, sub_mode, exp64, tab):
    """softmax of rows r..r1 of x into out: eight rows at a time, then one by one; 1 if some step was bad."""
    k = np.int64(0)
    ss = np.empty(8, np.float32)
    while r + 8 <= r1:
        k |= _softmax_rows8(x, r, d, out, sub_mode, exp64, tab, ss)
        r += 8
    for t in range(r, r1):
        k |= _softmax_row(x[t], d, out[t], sub_mode, exp64, tab)
    return k


@njit(cache=True, parallel=True)
def softmax_rows(x, out, sub_mode, exp64, tab):
    """out[r] = softmax of the float32 row x[r] (16-bit data widened exactly) as CANN's kernel steps it;
    True when no step of any row was Inf or NaN (else out is not to be used). ``tab``: for the 16-bit
    modes, softmax_exp_table of that format and ``exp64`` (d = x - m is then one of its 65,536 patterns:
    its exp read, not computed, ~5x faster); empty to compute every exp."""
    rows, n = x.shape
    nch = (rows + _ROWS - 1) // _ROWS
    bad = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        d = np.empty(n, dtype=np.float32)
        bad[c] = _softmax_chunk(x, c * _ROWS, min(rows, (c + 1) * _ROWS), d, out, sub_mode, exp64, tab)
    return bad.sum() == 0


@njit(cache=True, error_model="numpy")
def _max16(row):
    """The fp16 bits of the largest value of the fp16 bits ``row``, on keys ordered as the values (a negative
    pattern's magnitude bits flipped), in a 16-bit maximum that vectorises (0.03 ms against 0.12 for the float32
    selections of 524,288 values). With NaN in the row the result is any pattern (x - max of the NaN is NaN: the row
    goes back to the steps anyway). The one difference from _softmax_row's ``v > m``: -0 orders below +0, which
    the float comparison calls equal, so a row whose maximum is a zero may get +0 where it got -0; x - max then
    differs only in the sign of a zero difference, whose exp is 1 either way (tab[0x0000] = tab[0x8000] = 1)."""
    m = np.int16(-32768)
    for j in range(row.size):
        h = row[j]
        k = np.int16(h ^ np.uint16(np.uint16(np.int16(h) >> np.int16(15)) & np.uint16(0x7FFF)))
        m = k if k > m else m
    return np.uint16(np.uint16(m) ^ np.uint16(np.uint16(m >> np.int16(15)) & np.uint16(0x7FFF)))


@njit(cache=True, error_model="numpy")
def _sum8(e, r, ss):
    """ss[k] = the in-order float32 sum of row e[r + k], k < 8 (the 8 rows' chains of adds interleaved)."""
    n = e.shape[1]
    o0, o1, o2, o3, o4, o5, o6, o7 = e[r], e[r + 1], e[r + 2], e[r + 3], e[r + 4], e[r + 5], e[r + 6], e[r + 7]
    s0, s1, s2, s3, s4, s5, s6, s7 = o0[0], o1[0], o2[0], o3[0], o4[0], o5[0], o6[0], o7[0]
    for j in range(1, n):
        s0 = s0 + o0[j]
        s1 = s1 + o1[j]
        s2 = s2 + o2[j]
        s3 = s3 + o3[j]
        s4 = s4 + o4[j]
        s5 = s5 + o5[j]
        s6 = s6 + o6[j]
        s7 = s7 + o7[j]
    ss[0], ss[1], ss[2], ss[3], ss[4], ss[5], ss[6], ss[7] = s0, s1, s2, s3, s4, s5, s6, s7


@njit(cache=True, error_model="numpy")
def _softmax_exp_f16_table(xbits, m, hb, out, tab):
    """_softmax_exp's SUB_F16_HW table path for one row: hb = fp16 bits of x - m (RNE), out = tab[hb], with ``tab``
    NaN at every Inf and NaN pattern (ops/sourced._exp_table_nonfinite_nan). No check here: a difference that is
    Inf or NaN (x NaN makes it NaN: no scan of x is needed) reads a NaN, and a finite one
    (<= 0, x - max) an exp in [0, 1]; the row's sum is NaN exactly when some difference was bad, and
    _softmax_div_f16 checks the sum."""
    n = xbits.size
    for j in range(n):
        hb[j] = f32_to_f16_hw(f16_to_f32_hw(xbits[j]) - m)   # x widened exactly, as _widen_rows_f16 does
    for j in range(n):
        out[j] = tab[hb[j]]


@njit(cache=True, error_model="numpy")
def _softmax_div_f16(e, s, ob):
    """ob = fp16 bits of e / s (RNE, the CPU's conversion); 1 if s is Inf or NaN or some quotient's fp16 is (a
    quotient that is Inf or NaN, or that rounds past 65504: _softmax_div's check and _round_rows_f16's in one)."""
    big = np.uint16(0)
    for j in range(e.size):
        h = f32_to_f16_hw(e[j] / s)
        big = _flag16(big, h)
        ob[j] = h
    return _bad(s) | _flagged16(big)


@njit(cache=True, error_model="numpy")
def _softmax_f16_table_chunk(xb, r0, e, hb, ob, tab):
    """softmax_rows_f16's SUB_F16_HW table path for the rows xb[r0:r0 + len(e)]: exp into e (the thread's own
    rows), fp16 results into ob; 1 if some step was bad. The same float32 operations as _widen_rows_f16 +
    _softmax_chunk + _round_rows_f16 (x widened where it is read), with the maximum on the fp16 bits (_max16) and
    the checks on the row sums and the results' fp16 bits (_softmax_exp_f16_table, _softmax_div_f16)."""
    nr = e.shape[0]
    ss = np.empty(8, dtype=np.float32)
    k = np.int64(0)
    r = 0
    while r < nr:
        m = 8 if r + 8 <= nr else 1
        for t in range(m):
            row = xb[r0 + r + t]
            _softmax_exp_f16_table(row, f16_to_f32_hw(_max16(row)), hb, e[r + t], tab)
        if m == 8:
            _sum8(e, r, ss)
        else:
            row = e[r]
            sm = row[0]
            for j in range(1, row.size):
                sm = sm + row[j]
            ss[0] = sm
        for t in range(m):
            k |= _softmax_div_f16(e[r + t], ss[t], ob[r0 + r + t])
        r += m
    return k


@njit(cache=True, parallel=True)
def softmax_rows_f16(xb, ob, sub_mode, exp64, tab):
    """softmax_rows of fp16 rows given as their bits (rows, n) uint16, widened exactly, the result rounded
    to fp16 (nearest even) into ``ob``, a block of rows at a time in the thread's own float32 rows (one pass
    over the data, not three); True when no step was Inf or NaN and no result rounded to Inf (else ob is not
    to be used). Hosts with the CPU's fp16 conversion (kernels/cast.HW_HALF) only. ``tab`` for SUB_F16_HW:
    the fp16 exp table with NaN at the Inf and NaN patterns (ops/sourced._exp_table_nonfinite_nan)."""
    rows, n = xb.shape
    nch = (rows + _ROWS - 1) // _ROWS
    bad = np.zeros(nch, dtype=np.int64)
    # (the table must be the one with NaN at the Inf and NaN patterns: the plain one's exp(-Inf) = 0 would hide a bad
    # x - max; anything else runs the checked path)
    table = sub_mode == SUB_F16_HW and tab.size == 65536 and tab[0xFC00] != tab[0xFC00]
    for c in prange(nch):
        r0 = c * _ROWS
        nr = min(rows, r0 + _ROWS) - r0
        y = np.empty((nr, n), dtype=np.float32)
        if table:
            hb = np.empty(n, dtype=np.uint16)
            bad[c] = _softmax_f16_table_chunk(xb, r0, y, hb, ob, tab)
            continue
        x = np.empty((nr, n), dtype=np.float32)
        d = np.empty(n, dtype=np.float32)
        _widen_rows_f16(xb, r0, x)
        k = _softmax_chunk(x, 0, nr, d, y, sub_mode, exp64, tab)
        bad[c] = k | _round_rows_f16(y, ob, r0)
    return bad.sum() == 0
