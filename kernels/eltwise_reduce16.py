"""An fp16 elementwise op read only by a float32 reduction over the leading axes, in one pass.

Keras' batch normalization under a mixed-precision policy computes two full-size fp16 tensors that only a float32
reduction over N, H, W reads (RESULTS "Session 20"):

    forward:   SquaredDifference(x, m) -> Mean   (moments/variance; m the per-channel mean, cast to fp16)
    backward:  Mul(a, b)               -> Sum    (batchnorm/mul_1: BiasAdd * ReluGrad)

Each fp16 element is computed as the elementwise op computes it (its operands widened exactly, one float32 operation,
rounded to nearest-even fp16; SquaredDifference: ``d = rn16(x - m)``, ``rn16(d * d)``, as the affine kernel's SQUARE
mode does) and fed, widened, to the float32 column steps of ``reduce_lead.reduce_lead_f16_hw`` in the same order
(each column's first element, then one float32 step per further row, four rows a pass; TBE's mean ``* 1/n`` per
element first, Ascend C's after, the exact mean's ``/ n``), so the result is the reduce op's on the op's output.

The kernel does not model Inf or NaN: an Inf or NaN fp16 element (an overflow of the op included) makes its
column's sum Inf or NaN (``+`` and ``* 1/n`` pass an Inf or NaN on), so a result that is not finite hands the
whole pair back (returns -1; the caller runs the two ops), as does a float32 sum that overflows. Hosts with
``cast.HW_HALF`` only (the hardware conversions round to nearest-even and keep subnormals).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cast import f16_to_f32_hw, f32_to_f16_hw
from .parallel import or_all_or_fail
from .reduce import MEAN, MEAN_SCALE_FIRST, MEAN_SCALE_LAST, SUM, _elem32, _scaled

_COLS = 256  # outputs per work item

#: the elementwise ops: SquaredDifference(a, m) with m a float32 row (per column, fp16 values widened), Mul(a, b)
SQDIFF = 0
MUL = 1
#: the reductions (kernels/reduce.py's codes)
OPS = (SUM, MEAN, MEAN_SCALE_FIRST, MEAN_SCALE_LAST)


def _fused_kernel(mode, op):
    """The column kernel of one (elementwise mode, reduction op) pair (both compile-time constants)."""
    @njit(cache=True, error_model="numpy")
    def elem(av, bv, mv):
        if mode == SQDIFF:
            d = f16_to_f32_hw(f32_to_f16_hw(f16_to_f32_hw(av) - mv))
            return f16_to_f32_hw(f32_to_f16_hw(d * d))
        return f16_to_f32_hw(f32_to_f16_hw(f16_to_f32_hw(av) * f16_to_f32_hw(bv)))

    @njit(cache=True, error_model="numpy")
    def cols(a, b, m, base, c0, n, rows, w, acc):
        cof = np.float32(1.0) / np.float32(n)
        mm = m[c0:c0 + w]
        r, q = a[base:base + w], b[base:base + w]
        for c in range(w):
            acc[c] = _elem32(op, elem(r[c], q[c], mm[c]), cof, False)
        j = 1
        # four rows a pass (reduce_lead._hw_kernel): each column's steps one after another in row order, held in a
        # register between them; rows as slices (indexing by a computed position kept the loop scalar: 3x slower)
        while j + 4 <= n:
            i0 = base + j * rows
            r0, q0 = a[i0:i0 + w], b[i0:i0 + w]
            r1, q1 = a[i0 + rows:i0 + rows + w], b[i0 + rows:i0 + rows + w]
            r2, q2 = a[i0 + 2 * rows:i0 + 2 * rows + w], b[i0 + 2 * rows:i0 + 2 * rows + w]
            r3, q3 = a[i0 + 3 * rows:i0 + 3 * rows + w], b[i0 + 3 * rows:i0 + 3 * rows + w]
            for c in range(w):
                x = acc[c]
                x = x + _elem32(op, elem(r0[c], q0[c], mm[c]), cof, False)
                x = x + _elem32(op, elem(r1[c], q1[c], mm[c]), cof, False)
                x = x + _elem32(op, elem(r2[c], q2[c], mm[c]), cof, False)
                acc[c] = x + _elem32(op, elem(r3[c], q3[c], mm[c]), cof, False)
            j += 4
        for j in range(j, n):
            i0 = base + j * rows
            r, q = a[i0:i0 + w], b[i0:i0 + w]
            for c in range(w):
                acc[c] = acc[c] + _elem32(op, elem(r[c], q[c], mm[c]), cof, False)
    cols.__doc__ = (f"acc[:w] = the float32 reduction (op {op}) of the elementwise op {mode}'s fp16 results of "
                    "a[base + j * rows + c] and b's (MUL) or m[c0 + c] (SQDIFF), j = 0..n-1, c = 0..w-1")
    return cols


_sq = tuple(_fused_kernel(SQDIFF, op) for op in OPS)
_mul = tuple(_fused_kernel(MUL, op) for op in OPS)
_sq_sum, _sq_mean, _sq_first, _sq_last = _sq
_mul_sum, _mul_mean, _mul_first, _mul_last = _mul


@njit(cache=True, parallel=True, error_model="numpy")
def eltwise_reduce_lead16(mode, op, a, b, m, outer, n, rows, out):
    """out[o * rows + r] = reduce(op, e[o, :, r]) in float32 of the fp16 elementwise results e = SquaredDifference(a, m)
    (mode SQDIFF; m float32, ``rows`` values; b read but unused: pass a) or Mul(a, b) (mode MUL; m ``rows`` values,
    unused) of fp16 bits a, b (outer, n, rows) flattened,
    n >= 1, as ``reduce_lead.reduce_lead_f16_hw`` reduces e; ``op`` one of OPS. Returns 0, or -1 if a result is not
    finite (an element or the sum was Inf or NaN: out is then not the ops')."""
    nch = (rows + _COLS - 1) // _COLS
    items = outer * nch
    st = np.zeros(items, dtype=np.int64)
    cof = np.float32(1.0) / np.float32(n)
    for it in prange(items):
        o = it // nch
        c0 = (it % nch) * _COLS
        w = min(rows, c0 + _COLS) - c0
        acc = np.empty(_COLS, dtype=np.float32)
        base = o * n * rows + c0
        if mode == SQDIFF:
            if op == SUM:
                _sq_sum(a, b, m, base, c0, n, rows, w, acc)
            elif op == MEAN:
                _sq_mean(a, b, m, base, c0, n, rows, w, acc)
            elif op == MEAN_SCALE_FIRST:
                _sq_first(a, b, m, base, c0, n, rows, w, acc)
            else:
                _sq_last(a, b, m, base, c0, n, rows, w, acc)
        else:
            if op == SUM:
                _mul_sum(a, b, m, base, c0, n, rows, w, acc)
            elif op == MEAN:
                _mul_mean(a, b, m, base, c0, n, rows, w, acc)
            elif op == MEAN_SCALE_FIRST:
                _mul_first(a, b, m, base, c0, n, rows, w, acc)
            else:
                _mul_last(a, b, m, base, c0, n, rows, w, acc)
        s = np.int64(0)
        for c in range(w):
            y = _scaled(op, acc[c], n, cof)
            if not (abs(y) <= np.float32(3.4028234663852886e38)):
                s = np.int64(-1)
                break
            out[o * rows + c0 + c] = y
        st[it] = s
    return or_all_or_fail(st)
