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

Elements are handled in blocks of ``blk`` (a multiple of ``c``): every input is laid out as a float32
row of the block (a per-channel input once per work item, tiled), and each step is one plain loop over
the block, which LLVM vectorises. The kernel does not model overflow: it returns non-zero when any step
result or output is Inf or NaN, and its output is then not the chain's (the caller reruns the chain on
its full path, which raises the status and applies the overflow mode). Hosts with ``cast.HW_HALF`` only.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cast import f16_to_f32_hw, f32_to_f16_hw
from .codes import ADD, CHAIN_RELU, CHAIN_RELU6, CHAIN_ROUND16, FLT_MAX, MUL, REALDIV, SUB

_CHUNK = 1 << 15


@njit(cache=True, error_model="numpy")
def _fill(h16, f32, src, k, row, lo, m, c):
    """row[:m] = input k's float32 values at output elements lo .. lo + m - 1."""
    which, idx, layout = src[k, 0], src[k, 1], src[k, 2]
    if layout == 0:
        # slices indexed from 0: provably non-negative indices, so LLVM vectorises the loops
        if which == 0:
            a = h16[idx][lo:lo + m]
            for j in range(m):
                row[j] = f16_to_f32_hw(a[j])
        else:
            b = f32[idx][lo:lo + m]
            for j in range(m):
                row[j] = b[j]
    elif layout == 1:
        for j in range(m):
            q = (lo + j) % c
            row[j] = f16_to_f32_hw(h16[idx][q]) if which == 0 else f32[idx][q]
    else:
        v = f16_to_f32_hw(h16[idx][0]) if which == 0 else f32[idx][0]
        for j in range(m):
            row[j] = v


@njit(cache=True, error_model="numpy")
def _step(code, x, y, r, m):
    """r[:m] = code(x[:m], y[:m]) in float32; returns 1 if a result is Inf or NaN."""
    # a boolean accumulator: an int64 one holds the loops to four lanes (half the speed)
    good = True
    if code == ADD:
        for j in range(m):
            v = x[j] + y[j]
            r[j] = v
            good &= abs(v) <= FLT_MAX
    elif code == SUB:
        for j in range(m):
            v = x[j] - y[j]
            r[j] = v
            good &= abs(v) <= FLT_MAX
    elif code == MUL:
        for j in range(m):
            v = x[j] * y[j]
            r[j] = v
            good &= abs(v) <= FLT_MAX
    elif code == REALDIV:
        for j in range(m):
            v = x[j] / y[j]
            r[j] = v
            good &= abs(v) <= FLT_MAX
    elif code == CHAIN_RELU:
        for j in range(m):
            v = x[j]
            r[j] = v if v > np.float32(0.0) else np.float32(0.0)
            good &= abs(v) <= FLT_MAX
    elif code == CHAIN_ROUND16:
        for j in range(m):
            v = f16_to_f32_hw(f32_to_f16_hw(x[j]))
            r[j] = v
            good &= abs(v) <= FLT_MAX
    else:  # CHAIN_RELU6
        for j in range(m):
            v = x[j]
            good &= abs(v) <= FLT_MAX
            v = v if v < np.float32(6.0) else np.float32(6.0)
            r[j] = v if v > np.float32(0.0) else np.float32(0.0)
    return np.int64(not good)


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
                _fill(h16, f32, src, k, rows[k], 0, blk, c)
        acc = np.int64(0)
        for b in range(it * per, min(nblk, (it + 1) * per)):
            lo = b * blk
            m = min(blk, n - lo)
            for k in range(k_in):
                if src[k, 2] == 0:
                    _fill(h16, f32, src, k, rows[k], lo, m, c)
            cur = k_in
            for s in range(steps.shape[0]):
                a, bb = steps[s, 1], steps[s, 2]
                x = rows[cur] if a < 0 else rows[a]
                y = x if bb == -2 else (rows[cur] if bb < 0 else rows[bb])
                cur = 2 * k_in + 1 - cur
                acc |= _step(steps[s, 0], x, y, rows[cur], m)
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
