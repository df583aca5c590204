"""Reductions of the vector unit: sum, mean, max, min, prod over the rows of a 2-D array.

Each row is reduced sequentially from its first element to its last (the wrappers
lay the reduced axes out last, in row-major order), in an accumulator that is
either float32 (``acc16 = False``: every step rounded to float32, one rounding of
the total to the 16-bit output) or the 16-bit compute format itself (``acc16 =
True``: every step rounded to it, as fp16 ReduceSum does when left in fp16). Rows are
independent, so the row loop is parallel and the result does not depend on the
thread count. Kernels return the OR of the rounding statuses; non-zero means a
result or an accumulator step was Inf or NaN. Mean comes in three forms: the sum
divided by n (``MEAN``), and CANN's two (``MEAN_SCALE_FIRST``, ``MEAN_SCALE_LAST``).

A row split over C cores (``reduce_split16``, ``reduce_split_f32``; NUMERICS.md section 11,
:mod:`.multicore`): core c reduces its chunk ``row[bounds[c]:bounds[c+1]]`` as above, from its
first element, giving a partial ``p_c``; the partials reach the output, which starts at +0, in
the order ``perm`` (one permutation per row): ``acc = ((+0 + p_perm[0]) + p_perm[1]) + ...``,
every add rounded to the accumulator's format. A whole row and a split one share the chunk loop
(:func:`_partial16`, :func:`_partial32`), the mean's last step and the parallel row driver.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cast import bits16_to_f32
from .parallel import or_all
from .vector import finish32, fmt16, round16_f32

SUM, MEAN, MAX, MIN, PROD = 0, 1, 2, 3, 4
# ReduceMean as CANN's kernels compute it (NUMERICS.md section 2): TBE scales every element by
# cof = 1/n (a float32 constant, or the 16-bit format's when it accumulates there) and sums the
# products; the Ascend C kernel sums, then multiplies the sum by cof. MEAN divides the sum by n.
MEAN_SCALE_FIRST, MEAN_SCALE_LAST = 5, 6


@njit(cache=True)
def _empty(op):
    """The reduction of an empty row: prod 1, every mean NaN, the others 0."""
    if op == PROD:
        return np.float32(1.0)
    if op == MEAN or op == MEAN_SCALE_FIRST or op == MEAN_SCALE_LAST:
        return np.float32(np.nan)
    return np.float32(0.0)


@njit(cache=True, error_model="numpy")
def _step(op, acc, v):
    """acc (op) v in float32; max/min propagate NaN and keep the earlier of equal values."""
    if op == SUM or op == MEAN or op == MEAN_SCALE_FIRST or op == MEAN_SCALE_LAST:
        return acc + v
    if op == PROD:
        return acc * v
    if acc != acc:
        return acc
    if op == MAX:
        return v if (v > acc or v != v) else acc
    return v if (v < acc or v != v) else acc


@njit(cache=True, error_model="numpy")
def _in16(v, bf16, overflow, subnormal):
    """(v', st): float32 v rounded to the 16-bit format and widened back (one rounded 16-bit step)."""
    mt, bias, eb = fmt16(bf16)
    b, s = round16_f32(v, mt, bias, eb, overflow, subnormal)
    return bits16_to_f32(b, bf16, subnormal), s


@njit(cache=True, error_model="numpy")
def _elem16(op, b, cof, bf16, acc16, overflow, subnormal):
    """(v, st): the 16-bit pattern b as an operand of the sum (times cof for MEAN_SCALE_FIRST, that
    product rounded to the 16-bit format if acc16)."""
    v = bits16_to_f32(b, bf16, subnormal)
    if op == MEAN_SCALE_FIRST:
        v = v * cof
        if acc16:
            return _in16(v, bf16, overflow, subnormal)
    return v, np.int64(0)


@njit(cache=True, error_model="numpy")
def _partial16(op, row, lo, hi, cof, bf16, acc16, overflow, subnormal):
    """(acc, st): row[lo:hi] of 16-bit patterns reduced sequentially from its first element, every step
    rounded to the 16-bit format if acc16."""
    acc, st = _elem16(op, row[lo], cof, bf16, acc16, overflow, subnormal)
    for k in range(lo + 1, hi):
        v, s = _elem16(op, row[k], cof, bf16, acc16, overflow, subnormal)
        acc = _step(op, acc, v)
        st |= s
        if acc16:
            acc, s = _in16(acc, bf16, overflow, subnormal)
            st |= s
    return acc, st


@njit(cache=True, error_model="numpy")
def _elem32(op, v, cof, flush):
    """The float32 v as an operand of the sum: a subnormal flushed to signed zero if flush, times cof
    for MEAN_SCALE_FIRST."""
    if flush and abs(v) < np.float32(1.1754943508222875e-38):
        v = v * np.float32(0.0)
    if op == MEAN_SCALE_FIRST:
        v = v * cof
    return v


@njit(cache=True, error_model="numpy")
def _partial32(op, row, lo, hi, cof, flush):
    """Sequential float32 reduction of row[lo:hi]."""
    acc = _elem32(op, row[lo], cof, flush)
    for j in range(lo + 1, hi):
        acc = _step(op, acc, _elem32(op, row[j], cof, flush))
    return acc


@njit(cache=True, error_model="numpy")
def _scaled(op, acc, n, cof):
    """The mean's last step on the sum acc of n elements (MEAN: / n, MEAN_SCALE_LAST: * cof); else acc."""
    if op == MEAN:
        return acc / np.float32(n)
    if op == MEAN_SCALE_LAST:
        return acc * cof
    return acc


@njit(cache=True, error_model="numpy")
def _row16(op, row, bounds, perm, bf16, acc16, overflow, subnormal):
    """(bits, st) = reduction of one row of 16-bit patterns: whole if perm is empty, else chunk by chunk
    with the partials added to +0 in ``perm`` order in the same accumulator."""
    mt, bias, eb = fmt16(bf16)
    n = row.size
    if n == 0:
        b, s = round16_f32(_empty(op), mt, bias, eb, overflow, subnormal)
        return np.uint16(b), s
    cof = np.float32(1.0) / np.float32(n)
    if acc16 and op == MEAN_SCALE_FIRST:
        cof = _in16(cof, bf16, overflow, subnormal)[0]  # the constant in the 16-bit format
    if perm.size == 0:
        total, st = _partial16(op, row, 0, n, cof, bf16, acc16, overflow, subnormal)
    else:
        total = np.float32(0.0)
        st = np.int64(0)
        for j in range(perm.size):
            acc, s = _partial16(op, row, bounds[perm[j]], bounds[perm[j] + 1], cof, bf16, acc16, overflow, subnormal)
            total = total + acc
            st |= s
            if acc16:
                total, s = _in16(total, bf16, overflow, subnormal)
                st |= s
    b, s = round16_f32(_scaled(op, total, n, cof), mt, bias, eb, overflow, subnormal)
    return np.uint16(b), st | s


@njit(cache=True, error_model="numpy")
def _row32(op, row, bounds, perm, overflow, subnormal):
    """(y, st) = reduction of one float32 row in a float32 accumulator: whole if perm is empty, else chunk
    by chunk with the partials added to +0 in ``perm`` order."""
    n = row.size
    if n == 0:
        return finish32(_empty(op), overflow, subnormal)
    cof = np.float32(1.0) / np.float32(n)
    flush = subnormal == 1
    if perm.size == 0:
        total = _partial32(op, row, 0, n, cof, flush)
    else:
        total = np.float32(0.0)
        for j in range(perm.size):
            total = total + _partial32(op, row, bounds[perm[j]], bounds[perm[j] + 1], cof, flush)
    return finish32(_scaled(op, total, n, cof), overflow, subnormal)


# One parallel driver over the rows for the four kernels; the factory closes over an integer naming
# the row kind (a constant: the other calls are pruned before typing), so the drivers load from the
# on-disk cache. A whole row passes an empty perm.
_R16, _R32, _S16, _S32 = range(4)
_WHOLE = np.zeros(0, dtype=np.int64)


def _rows_driver(kind, doc):
    def drive(op, x, out, *params):
        rows = x.shape[0]
        st = np.zeros(rows, dtype=np.int64)
        for r in prange(rows):
            if kind == _R16:
                y, s = _row16(op, x[r], _WHOLE, _WHOLE, *params)
            elif kind == _R32:
                y, s = _row32(op, x[r], _WHOLE, _WHOLE, *params)
            elif kind == _S16:
                y, s = _row16(op, x[r], params[0], params[1][r], *params[2:])
            else:
                y, s = _row32(op, x[r], params[0], params[1][r], *params[2:])
            out[r] = y
            st[r] = s
        return or_all(st)
    drive.__doc__ = doc
    return njit(cache=True, parallel=True)(drive)


reduce16 = _rows_driver(_R16, """reduce16(op, x, out, bf16, acc16, overflow, subnormal): out[r] = reduce(op, x[r, :])
    over 16-bit patterns; returns the OR of statuses.""")
reduce_f32 = _rows_driver(_R32, """reduce_f32(op, x, out, overflow, subnormal): out[r] = reduce(op, x[r, :]) over
    float32 rows; returns the OR of statuses.""")
reduce_split16 = _rows_driver(_S16, """reduce_split16(op, x, out, bounds, perm, bf16, acc16, overflow, subnormal):
    out[r] = the 16-bit pattern of row r reduced chunk by chunk, partials combined in perm[r] order.""")
reduce_split_f32 = _rows_driver(_S32, """reduce_split_f32(op, x, out, bounds, perm, overflow, subnormal): out[r] = sum
    over j of partial(x[r, bounds[perm[r, j]]:bounds[perm[r, j] + 1]]) from +0, in j order.""")
