"""A chain of float32 elementwise steps in one pass, rounded once to fp16 (the UB fusion's fast path).

The chain is a small program: ``steps[s] = (code, a, b)`` computes ``code(value_a, value_b)`` into
the running value, where an argument ``k >= 0`` is input ``k`` and ``-1`` the running value. Inputs
are fp16 bit patterns (``h16``, widened exactly by the hardware conversion) or float32 (``f32``);
``src[k] = (which tuple: 0 h16 / 1 f32, index in it, layout)`` with layout 0 (one value per output
element), 1 (one value per channel: element i reads ``i % c``, a vector broadcast along the last
axis) or 2 (one value for all). Every step is one IEEE float32 operation (``+ - * /``, or an exact
selection: relu ``x > 0 ? x : +0``, relu6 ``min(x, 6)`` then relu), as numpy's float32 ufuncs compute
them, or a rounding of the running value to fp16 (``CHAIN_ROUND16``: a 16-bit op's intermediate result),
and the result is rounded to nearest-even fp16 by the hardware conversion.

Elements are handled in blocks of ``blk`` (a multiple of ``c``): a per-channel or one-value input is laid
out once per work item as a float32 row of the block (tiled), a full-size input is read in place (fp16
widened as each step reads it), and each step is one plain loop over the block, which LLVM vectorises
(one compiled loop per kind of its operands: a float32 row, an fp16 input, a float32 input). The kernel
does not model overflow: it returns non-zero when any step result or output is Inf or NaN, and its output is then not the chain's (the caller reruns the chain on
its full path, which raises the status and applies the overflow mode). Hosts with ``cast.HW_HALF`` only.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from .cast import f16_to_f32_hw, f32_to_f16_hw
from .codes import ADD, CHAIN_RELU, CHAIN_RELU6, CHAIN_ROUND16, FLT_MAX, MUL, REALDIV, SUB

_CHUNK = 1 << 15


def _at(a, j):
    """The float32 value of a[j]: fp16 bits (uint16) widened by the hardware conversion, a float32 as it is."""
    raise NotImplementedError("compiled only")


@overload(_at, inline="always")
def _at_impl(a, j):
    if isinstance(a, types.Array) and a.dtype == types.uint16:
        return lambda a, j: f16_to_f32_hw(a[j])
    return lambda a, j: a[j]


@njit(cache=True, error_model="numpy")
def _fill(h16, f32, src, k, row, m, c):
    """row[:m] = input k's float32 values at output elements 0 .. m - 1 of a block (m a multiple of c): a
    per-channel input (element i reads ``i % c``) or one value; the same row serves every block."""
    which, idx, layout = src[k, 0], src[k, 1], src[k, 2]
    if layout == 1:
        for j in range(m):
            q = j % c
            row[j] = f16_to_f32_hw(h16[idx][q]) if which == 0 else f32[idx][q]
    else:
        v = f16_to_f32_hw(h16[idx][0]) if which == 0 else f32[idx][0]
        for j in range(m):
            row[j] = v


@njit(cache=True, error_model="numpy")
def _step(code, x, y, r, m):
    """r[:m] = code(x[:m], y[:m]) in float32; returns 1 if a result is Inf or NaN. x and y are float32 rows or
    inputs (float32, or fp16 bits widened as they are read): one compiled loop per combination."""
    # a boolean accumulator: an int64 one holds the loops to four lanes (half the speed)
    good = True
    if code == ADD:
        for j in range(m):
            v = _at(x, j) + _at(y, j)
            r[j] = v
            good &= abs(v) <= FLT_MAX
    elif code == SUB:
        for j in range(m):
            v = _at(x, j) - _at(y, j)
            r[j] = v
            good &= abs(v) <= FLT_MAX
    elif code == MUL:
        for j in range(m):
            v = _at(x, j) * _at(y, j)
            r[j] = v
            good &= abs(v) <= FLT_MAX
    elif code == REALDIV:
        for j in range(m):
            v = _at(x, j) / _at(y, j)
            r[j] = v
            good &= abs(v) <= FLT_MAX
    elif code == CHAIN_RELU:
        for j in range(m):
            v = _at(x, j)
            r[j] = v if v > np.float32(0.0) else np.float32(0.0)
            good &= abs(v) <= FLT_MAX
    elif code == CHAIN_ROUND16:
        for j in range(m):
            v = f16_to_f32_hw(f32_to_f16_hw(_at(x, j)))
            r[j] = v
            good &= abs(v) <= FLT_MAX
    else:  # CHAIN_RELU6
        for j in range(m):
            v = _at(x, j)
            good &= abs(v) <= FLT_MAX
            v = v if v < np.float32(6.0) else np.float32(6.0)
            r[j] = v if v > np.float32(0.0) else np.float32(0.0)
    return np.int64(not good)


@njit(cache=True, error_model="numpy")
def _step_y(code, x, kb, row, h16, f32, ib, lo, m, r):
    """_step with its second operand chosen by kind: kb 0 the row ``row``, 1 fp16 input ``h16[ib]`` or 2
    float32 input ``f32[ib]`` read at elements lo .. lo + m - 1, 3 none (a unary step: x again)."""
    if kb == 0:
        return _step(code, x, row, r, m)
    if kb == 1:
        return _step(code, x, h16[ib][lo:lo + m], r, m)
    if kb == 2:
        return _step(code, x, f32[ib][lo:lo + m], r, m)
    return _step(code, x, x, r, m)


@njit(cache=True, parallel=True, error_model="numpy")
def chain_to_f16(h16, f32, src, steps, c, blk, out):
    """out[i] = fp16 RNE of the chain ``steps`` on the inputs at element i (float32 steps); returns
    non-zero if some step result or output is Inf or NaN (out is then not the chain's)."""
    n = out.size
    k_in = src.shape[0]
    per = max(1, _CHUNK // blk)          # blocks per work item
    nblk = (n + blk - 1) // blk
    nitem = (nblk + per - 1) // per
    bad = np.zeros(nitem, dtype=np.int64)
    for it in prange(nitem):
        # two rows for the running value: each step writes the one it does not read (a loop whose output
        # is its input is not vectorised: LLVM's overlap check fails and it takes the scalar loop)
        rows = np.empty((k_in + 2, blk), dtype=np.float32)
        for k in range(k_in):
            if src[k, 2] != 0:   # per channel or one value: the same row for every block (blk % c == 0)
                _fill(h16, f32, src, k, rows[k], blk, c)
        acc = np.int64(0)
        for b in range(it * per, min(nblk, (it + 1) * per)):
            lo = b * blk
            m = min(blk, n - lo)
            cur = k_in
            for s in range(steps.shape[0]):
                a, bb = steps[s, 1], steps[s, 2]
                # an operand is a row (the running value, or a per-channel / one-value input laid out
                # once) or a full-size input read in place at this block (no row filled from it)
                ka = 0 if a < 0 or src[a, 2] != 0 else 1 + src[a, 0]
                ra = cur if a < 0 else a
                ia = 0 if a < 0 else src[a, 1]
                kb = 3 if bb == -2 else (0 if bb < 0 or src[bb, 2] != 0 else 1 + src[bb, 0])
                rb = cur if bb < 0 else bb
                ib = 0 if bb < 0 else src[bb, 1]
                nxt = 2 * k_in + 1 - cur
                code = steps[s, 0]
                if ka == 0:
                    acc |= _step_y(code, rows[ra], kb, rows[rb], h16, f32, ib, lo, m, rows[nxt])
                elif ka == 1:
                    acc |= _step_y(code, h16[ia][lo:lo + m], kb, rows[rb], h16, f32, ib, lo, m, rows[nxt])
                else:
                    acc |= _step_y(code, f32[ia][lo:lo + m], kb, rows[rb], h16, f32, ib, lo, m, rows[nxt])
                cur = nxt
            run = rows[cur]
            o = out[lo:lo + m]
            ok = True
            for j in range(m):
                h = f32_to_f16_hw(run[j])
                o[j] = h
                ok &= (h & np.uint16(0x7FFF)) < np.uint16(0x7C00)
            acc |= np.int64(not ok)
        bad[it] = acc
    r = np.int64(0)
    for it in range(nitem):
        r |= bad[it]
    return r
