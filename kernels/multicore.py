"""Accumulations split over several AI Cores, combined in a given order (NUMERICS.md section 11).

A reduction split over C cores: core c reduces its chunk ``x[bounds[c]:bounds[c+1]]`` of a row
sequentially from its first element (as :mod:`.reduce` does for a whole row), giving a partial
``p_c``; the partials reach the output, which starts at +0, by atomic adds in the order
``perm`` (one permutation per row): ``acc = ((+0 + p_perm[0]) + p_perm[1]) + ...``, every add
rounded to the accumulator's format. The identity order is not the unsplit sum: each core starts
its chunk from its first element, not from the previous chunk's total.

Atomic accumulation into rows (UnsortedSegmentSum): ``out[ids[i]] += rows[i]`` for i in
``order``, each add rounded to float32.

16-bit data travels as ``uint16`` patterns. Kernels return the OR of the rounding statuses
(non-zero: a result or a step was Inf or NaN).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cast import bits16_to_f32
from .reduce import MEAN, MEAN_SCALE_FIRST, MEAN_SCALE_LAST, _empty, _step
from .vector import finish32, fmt16, round16_f32


@njit(cache=True, error_model="numpy")
def _chunk32(op, row, lo, hi, cof, flush):
    """Sequential float32 partial of row[lo:hi] (elements scaled by cof first for MEAN_SCALE_FIRST)."""
    tiny = np.float32(1.1754943508222875e-38)
    acc = row[lo]
    if flush and abs(acc) < tiny:
        acc = acc * np.float32(0.0)
    if op == MEAN_SCALE_FIRST:
        acc = acc * cof
    for j in range(lo + 1, hi):
        v = row[j]
        if flush and abs(v) < tiny:
            v = v * np.float32(0.0)
        if op == MEAN_SCALE_FIRST:
            v = v * cof
        acc = _step(op, acc, v)
    return acc


@njit(cache=True, error_model="numpy")
def _split_row32(op, row, bounds, perm, overflow, subnormal):
    """(y, st): the float32 row reduced chunk by chunk, partials added to +0 in ``perm`` order."""
    n = row.size
    if n == 0:
        return finish32(_empty(op), overflow, subnormal)
    cof = np.float32(1.0) / np.float32(n)
    flush = subnormal == 1
    acc = np.float32(0.0)
    for j in range(perm.size):
        c = perm[j]
        acc = acc + _chunk32(op, row, bounds[c], bounds[c + 1], cof, flush)
    if op == MEAN:
        acc = acc / np.float32(n)
    elif op == MEAN_SCALE_LAST:
        acc = acc * cof
    return finish32(acc, overflow, subnormal)


@njit(cache=True, parallel=True)
def reduce_split_f32(op, x, out, bounds, perm, overflow, subnormal):
    """out[r] = sum over j of partial(x[r, bounds[perm[r, j]]:bounds[perm[r, j] + 1]]) from +0, in j order."""
    rows = x.shape[0]
    st = np.zeros(rows, dtype=np.int64)
    for r in prange(rows):
        y, s = _split_row32(op, x[r], bounds, perm[r], overflow, subnormal)
        out[r] = y
        st[r] = s
    acc = np.int64(0)
    for r in range(rows):
        acc |= st[r]
    return acc


@njit(cache=True, error_model="numpy")
def _split_row16(op, row, bounds, perm, bf16, acc16, overflow, subnormal):
    """(bits, st): a 16-bit row reduced chunk by chunk (float32 or 16-bit accumulator), partials
    added to +0 in ``perm`` order in the same accumulator, one rounding to the 16-bit format."""
    mt, bias, eb = fmt16(bf16)
    n = row.size
    st = np.int64(0)
    if n == 0:
        return round16_f32(_empty(op), mt, bias, eb, overflow, subnormal)
    cof = np.float32(1.0) / np.float32(n)
    if acc16 and op == MEAN_SCALE_FIRST:
        cb, s = round16_f32(cof, mt, bias, eb, overflow, subnormal)
        cof = bits16_to_f32(cb, bf16, subnormal)
    total = np.float32(0.0)
    for j in range(perm.size):
        c = perm[j]
        lo = bounds[c]
        hi = bounds[c + 1]
        acc = bits16_to_f32(row[lo], bf16, subnormal)
        if op == MEAN_SCALE_FIRST:
            acc = acc * cof
            if acc16:
                b, s = round16_f32(acc, mt, bias, eb, overflow, subnormal)
                acc = bits16_to_f32(b, bf16, subnormal)
                st |= s
        for k in range(lo + 1, hi):
            v = bits16_to_f32(row[k], bf16, subnormal)
            if op == MEAN_SCALE_FIRST:
                v = v * cof
                if acc16:
                    b, s = round16_f32(v, mt, bias, eb, overflow, subnormal)
                    v = bits16_to_f32(b, bf16, subnormal)
                    st |= s
            acc = _step(op, acc, v)
            if acc16:
                b, s = round16_f32(acc, mt, bias, eb, overflow, subnormal)
                acc = bits16_to_f32(b, bf16, subnormal)
                st |= s
        total = total + acc
        if acc16:
            b, s = round16_f32(total, mt, bias, eb, overflow, subnormal)
            total = bits16_to_f32(b, bf16, subnormal)
            st |= s
    if op == MEAN:
        total = total / np.float32(n)
    elif op == MEAN_SCALE_LAST:
        total = total * cof
    b, s = round16_f32(total, mt, bias, eb, overflow, subnormal)
    return b, st | s


@njit(cache=True, parallel=True)
def reduce_split16(op, x, out, bounds, perm, bf16, acc16, overflow, subnormal):
    """out[r] = the 16-bit pattern of row r reduced chunk by chunk, partials combined in perm[r] order."""
    rows = x.shape[0]
    st = np.zeros(rows, dtype=np.int64)
    for r in prange(rows):
        b, s = _split_row16(op, x[r], bounds, perm[r], bf16, acc16, overflow, subnormal)
        out[r] = np.uint16(b)
        st[r] = s
    acc = np.int64(0)
    for r in range(rows):
        acc |= st[r]
    return acc


@njit(cache=True, error_model="numpy")
def combine_f32(partials, perm, out):
    """out = ((+0 + partials[perm[0]]) + partials[perm[1]]) + ..., elementwise in float32."""
    n = out.size
    for i in range(n):
        out[i] = np.float32(0.0)
    for j in range(perm.size):
        p = partials[perm[j]]
        for i in range(n):
            out[i] = out[i] + p[i]


@njit(cache=True, error_model="numpy")
def segment_add_f32(rows, ids, order, out):
    """out[ids[i]] += rows[i] in float32 for i in ``order`` (rows with a negative id dropped)."""
    d = rows.shape[1]
    for t in range(order.size):
        i = order[t]
        s = ids[i]
        if s < 0:
            continue
        for j in range(d):
            out[s, j] = out[s, j] + rows[i, j]
