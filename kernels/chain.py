"""A chain of float32 elementwise steps in one pass, rounded once to fp16 (the UB fusion's fast path).

The chain is a small program: ``steps[s] = (code, a, b)`` computes ``code(value_a, value_b)`` into
the running value, where an argument ``k >= 0`` is input ``k`` and ``-1`` the running value. Inputs
are fp16 bit patterns (``h16``, widened exactly by the hardware conversion) or float32 (``f32``);
``src[k] = (which tuple: 0 h16 / 1 f32, index in it, layout)`` with layout 0 (one value per output
element), 1 (one value per channel: element i reads ``i % c``, a vector broadcast along the last
axis) or 2 (one value for all). Every step is one IEEE float32 operation (``+ - * /``, or an exact
selection: maximum and minimum by the vector kernel's rule, relu ``x > 0 ? x : +0``, relu6 ``min(x, 6)``
then relu), as numpy's float32 ufuncs compute
them, or a rounding of the running value to fp16 (``CHAIN_ROUND16``: a 16-bit op's intermediate result),
and the result is rounded to nearest-even fp16 by the hardware conversion.

Elements are handled in blocks of ``blk`` (a multiple of ``c``): a per-channel or one-value input is laid
out once per work item as a float32 row of the block (tiled), a full-size input is read in place (fp16
widened as each step reads it), and each step is one plain loop over the block, which LLVM vectorises
(one compiled loop per kind of its operands: a float32 row, an fp16 input, a float32 input). The kernel
does not model overflow: it returns non-zero when any step result or output is Inf or NaN, and its output
is then not the chain's (the caller reruns the chain on its full path, which raises the status and applies
the overflow mode). Hosts with ``cast.HW_HALF`` only.

:func:`affine_to_f16` runs the commonest chains (BN's ``Mul, AddV2, Relu`` per channel, SquaredDifference, an AddN of
a per-channel term and a tensor; a lone per-channel Mul, Sub or Add) as one loop per element instead: the step loops' L1 passes cost as much again as the
memory-bound first step (a three-step chain ~2.5x a one-step one).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from .cast import f16_to_f32_hw, f32_to_f16_hw
from .codes import ADD, CHAIN_RELU, CHAIN_RELU6, CHAIN_ROUND16, FLT_MAX, MAXIMUM, MINIMUM, MUL, REALDIV, SUB

_CHUNK = 1 << 15


def _at(a, j):
    """The float32 value of a[j]: fp16 bits (uint16) widened by the hardware conversion, a float32 as it is."""
    raise NotImplementedError("compiled only")


@overload(_at)
def _at_impl(a, j):
    if isinstance(a, types.Array) and a.dtype == types.uint16:
        return lambda a, j: f16_to_f32_hw(a[j])
    return lambda a, j: a[j]


@njit(cache=True, error_model="numpy")
def _fill(h16, f32, src, k, row, lo, m, c):
    """row[:m] = input k's float32 values at output elements lo .. lo + m - 1 (a full-size float32 input, a
    per-channel one: element i reads ``i % c``, or one value)."""
    which, idx, layout = src[k, 0], src[k, 1], src[k, 2]
    if layout == 0:
        # a slice indexed from 0: provably non-negative indices, so LLVM vectorises the loop
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


@njit(cache=True)
def _put(post, r, j, v):
    """Write step result v to element j of r as ``post`` says; True if what it checks is finite: 0 r[j] = v
    (a float32 row), 1 r[j] = v rounded to fp16 and widened (a following CHAIN_ROUND16 step taken in), 2
    r[j] = the fp16 bits of v (r the output: the last step and the output's rounding in one loop)."""
    if post == 0:
        r[j] = v
        return abs(v) <= FLT_MAX
    if post == 1:
        w = f16_to_f32_hw(f32_to_f16_hw(v))
        r[j] = w
        return abs(w) <= FLT_MAX
    h = f32_to_f16_hw(v)
    r[j] = h
    return (h & np.uint16(0x7FFF)) < np.uint16(0x7C00)


def _step_kernel(post):
    """The step kernel writing its results as ``_put``'s ``post`` says (a compile-time constant: the loops
    hold no branch on it). What it checks covers the separate steps' checks: an Inf or NaN step result
    stays one when rounded to fp16, and a finite one that overflows fp16 is caught by the check of the
    rounded value, as the separate rounding step or the output check would."""
    @njit(cache=True, error_model="numpy")
    def step(code, x, y, r, m):
        # a boolean accumulator: an int64 one holds the loops to four lanes (half the speed)
        good = True
        if code == ADD:
            for j in range(m):
                good &= _put(post, r, j, _at(x, j) + _at(y, j))
        elif code == SUB:
            for j in range(m):
                good &= _put(post, r, j, _at(x, j) - _at(y, j))
        elif code == MUL:
            for j in range(m):
                good &= _put(post, r, j, _at(x, j) * _at(y, j))
        elif code == REALDIV:
            for j in range(m):
                good &= _put(post, r, j, _at(x, j) / _at(y, j))
        elif code == MAXIMUM:
            # the vector kernel's rule (numpy's): a NaN propagates (and fails the check), ties keep x
            for j in range(m):
                a, b = _at(x, j), _at(y, j)
                good &= _put(post, r, j, a if (a >= b or a != a) else b)
        elif code == MINIMUM:
            for j in range(m):
                a, b = _at(x, j), _at(y, j)
                good &= _put(post, r, j, a if (a <= b or a != a) else b)
        elif code == CHAIN_RELU:
            for j in range(m):
                v = _at(x, j)
                good &= abs(v) <= FLT_MAX
                good &= _put(post, r, j, v if v > np.float32(0.0) else np.float32(0.0))
        elif code == CHAIN_ROUND16:
            for j in range(m):
                good &= _put(post, r, j, f16_to_f32_hw(f32_to_f16_hw(_at(x, j))))
        else:  # CHAIN_RELU6
            for j in range(m):
                v = _at(x, j)
                good &= abs(v) <= FLT_MAX
                v = v if v < np.float32(6.0) else np.float32(6.0)
                good &= _put(post, r, j, v if v > np.float32(0.0) else np.float32(0.0))
        return np.int64(not good)
    step.__doc__ = ("r[:m] = code(x[:m], y[:m]) in float32, written as _put's post %d says; returns 1 if a result "
                    "is Inf or NaN. x and y are float32 rows or fp16 inputs widened as they are read: one "
                    "compiled loop per combination." % post)
    return step


_step_row, _step_round16, _step_out = (_step_kernel(post) for post in range(3))


@njit(cache=True, error_model="numpy")
def _step_y(code, post, x, kb, row, hy, r, o, m):
    """One step on x and its second operand chosen by kind: kb 0 the float32 row ``row``, 1 the fp16 input
    slice ``hy``, 2 none (a unary step: x again); written to the row r (post 0 or 1) or the output o (2)."""
    if post == 2:
        if kb == 0:
            return _step_out(code, x, row, o, m)
        if kb == 1:
            return _step_out(code, x, hy, o, m)
        return _step_out(code, x, x, o, m)
    if post == 1:
        if kb == 0:
            return _step_round16(code, x, row, r, m)
        if kb == 1:
            return _step_round16(code, x, hy, r, m)
        return _step_round16(code, x, x, r, m)
    if kb == 0:
        return _step_row(code, x, row, r, m)
    if kb == 1:
        return _step_row(code, x, hy, r, m)
    return _step_row(code, x, x, r, m)


@njit(cache=True, parallel=True, error_model="numpy")
def chain_to_f16(h16, f32, src, steps, c, blk, out):
    """out[i] = fp16 RNE of the chain ``steps`` on the inputs at element i (float32 steps); returns
    non-zero if some step result or output is Inf or NaN (out is then not the chain's)."""
    n = out.size
    k_in = src.shape[0]
    ns = steps.shape[0]
    per = max(1, _CHUNK // blk)          # blocks per work item
    nblk = (n + blk - 1) // blk
    nitem = (nblk + per - 1) // per
    bad = np.zeros(nitem, dtype=np.int64)
    none16 = h16[0][0:0]
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
            o = out[lo:lo + m]
            for k in range(k_in):
                if src[k, 2] == 0 and src[k, 0] == 1:   # a full-size float32 input: copied to its row
                    _fill(h16, f32, src, k, rows[k], lo, m, c)
            cur = k_in
            s = 0
            while s < ns:
                a, bb = steps[s, 1], steps[s, 2]
                # an operand is a row (the running value, a float32 input, or a per-channel / one-value
                # input laid out once) or a full-size fp16 input read in place at this block
                ha = a >= 0 and src[a, 2] == 0 and src[a, 0] == 0
                kb = 2 if bb == -2 else (1 if bb >= 0 and src[bb, 2] == 0 and src[bb, 0] == 0 else 0)
                hy = h16[src[bb, 1]][lo:lo + m] if kb == 1 else none16
                row = rows[cur if bb < 0 else bb]
                # a rounding of this result to fp16 next is taken into this step; the last step writes out
                r16 = s + 1 < ns and steps[s + 1, 0] == CHAIN_ROUND16 and steps[s + 1, 1] < 0
                skip = 2 if r16 else 1
                post = 2 if s + skip >= ns else (1 if r16 else 0)
                nxt = 2 * k_in + 1 - cur
                if ha:
                    acc |= _step_y(steps[s, 0], post, h16[src[a, 1]][lo:lo + m], kb, row, hy, rows[nxt], o, m)
                else:
                    acc |= _step_y(steps[s, 0], post, rows[cur if a < 0 else a], kb, row, hy, rows[nxt], o, m)
                cur = nxt
                s += skip
        bad[it] = acc
    r = np.int64(0)
    for it in range(nitem):
        r |= bad[it]
    return r


PLAIN, SQUARE, PLUS = 0, 1, 2   # affine_to_f16's modes: what follows x * p + q


@njit(cache=True, parallel=True, error_model="numpy")
def affine_to_f16(x, p, q, mode, z, lo, hi, out):
    """out[i] = fp16 RNE of ``v = x[i] * p[j] + q[j]``, then by ``mode`` PLAIN nothing, SQUARE ``v = round16(v);
    v = v * v``, PLUS ``v = v + z[i]``, then ``v = min(v, hi); v = v > lo ? v : +0``, in float32, fp16 bits widened,
    j = i % p.size; returns non-zero if a step's result (the product, the sum, the rounding, the square, the addition
    of z) is Inf or NaN, or the output is (out is then not the chain's).

    One pass per element for the chains :func:`chain_to_f16` runs in one loop per step (BN's ``Mul, AddV2, Relu``,
    SquaredDifference's ``Sub, round16, Mul``, an AddN): a missing step is its exact identity (``* 1``, ``+ -0``, a
    subtraction the addition of the negated row, ``hi`` +Inf, ``lo`` -Inf), so one loop serves each mode. p and q are
    rows of a block (a multiple of the channels); z a full-size fp16 input (PLUS only).

    Only the last step's result is checked (with the output): an Inf or NaN operand of an IEEE addition or
    multiplication gives an Inf or NaN (Inf - Inf and Inf * 0 a NaN), and an fp16 rounding keeps one, so a step
    result that is Inf or NaN makes every later one Inf or NaN; a rounding that overflows fp16 gives an Inf that the
    square keeps. One check instead of two or three per element: 13-15% of the loop (the mask compares share
    one port with the conversions)."""
    n = out.size
    blk = p.size
    per = max(1, _CHUNK // blk)          # blocks per work item
    nblk = (n + blk - 1) // blk
    nitem = (nblk + per - 1) // per
    bad = np.zeros(nitem, dtype=np.int64)
    zero = np.float32(0.0)
    for it in prange(nitem):
        good = True
        for b in range(it * per, min(nblk, (it + 1) * per)):
            lo0 = b * blk
            m = min(blk, n - lo0)
            xs = x[lo0:lo0 + m]
            o = out[lo0:lo0 + m]
            # one loop per mode, the branch outside it (LLVM vectorises each)
            if mode == SQUARE:
                for j in range(m):
                    v = f16_to_f32_hw(f32_to_f16_hw(f16_to_f32_hw(xs[j]) * p[j] + q[j]))
                    v = v * v
                    good &= abs(v) <= FLT_MAX
                    v = v if v < hi else hi
                    h = f32_to_f16_hw(v if v > lo else zero)
                    o[j] = h
                    good &= (h & np.uint16(0x7FFF)) < np.uint16(0x7C00)
            elif mode == PLUS:
                zs = z[lo0:lo0 + m]
                for j in range(m):
                    v = f16_to_f32_hw(xs[j]) * p[j] + q[j] + f16_to_f32_hw(zs[j])
                    good &= abs(v) <= FLT_MAX
                    v = v if v < hi else hi
                    h = f32_to_f16_hw(v if v > lo else zero)
                    o[j] = h
                    good &= (h & np.uint16(0x7FFF)) < np.uint16(0x7C00)
            else:
                for j in range(m):
                    v = f16_to_f32_hw(xs[j]) * p[j] + q[j]
                    good &= abs(v) <= FLT_MAX
                    v = v if v < hi else hi
                    h = f32_to_f16_hw(v if v > lo else zero)
                    o[j] = h
                    good &= (h & np.uint16(0x7FFF)) < np.uint16(0x7C00)
        bad[it] = not good
    r = np.int64(0)
    for it in range(nitem):
        r |= bad[it]
    return r
