"""Float32 reductions over the leading axes: :func:`.reduce.reduce_f32` with the rows as columns.

``x`` is (inner, rows): column r holds the elements of output r in the order the row kernel reads
them (a C-contiguous array reduced over its first axes, the kept axes last, needs no transposed
copy). Every output runs the row kernel's steps in the row kernel's order (its first element,
then one float32 step per further element, the mean's scaling, the final check), so the bits and
statuses are :func:`.reduce.reduce_f32`'s; the loop over columns is innermost, so the steps of
neighbouring outputs are vectorised instead of waiting on one accumulator's latency.

``reduce_lead_f16`` reads fp16 bit patterns and widens each as the cast kernel does (exactly, NaN payloads
kept as they are: the CPU's conversion would quieten a signalling NaN) where the float32 kernel reads a
float32: its results are those of ``reduce_lead_f32`` on the widened array, without the widened copy.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cast import f16_bits_to_f32_bits, f16_to_f32_hw
from .codes import FLUSH, KEEP
from .parallel import or_all, or_all_or_fail
from .reduce import MAX, MEAN, MEAN_SCALE_FIRST, MEAN_SCALE_LAST, MIN, PROD, SUM, _elem32, _empty, _scaled, _step
from .vector import finish32

_COLS = 256  # outputs per work item


@njit(cache=True, error_model="numpy")
def _step_first_nan(op, acc, v):
    """reduce.py's _step with the NaN of the result fixed: an accumulator that is NaN stays that NaN
    (quietened: acc op acc), else a NaN v gives quietened v. x86 computes acc op v so, but LLVM may swap
    the operands of a commutative op, and which of two NaNs a swapped op returns differs; acc op acc
    leaves no choice."""
    if op == SUM or op == MEAN or op == MEAN_SCALE_FIRST or op == MEAN_SCALE_LAST:
        return acc + acc if acc != acc else acc + v
    if op == PROD:
        return acc * acc if acc != acc else acc * v
    return _step(op, acc, v)


@njit(cache=True)
def _widen(b, subnormal):
    """The float32 of fp16 bits b as the widening cast gives it (cast.py's f16_bits_to_f32_bits)."""
    return np.uint32(f16_bits_to_f32_bits(b, subnormal)).view(np.float32)


def _cols_kernel(op, src16):
    """The column kernel of one reduction (``op`` a compile-time constant: a loop holding the run-time
    branches on the op is not vectorised) over float32 (or, if ``src16``, fp16 bit pattern) columns."""
    @njit(cache=True, error_model="numpy")
    def cols(x, c0, c1, acc, flush):
        n = x.shape[0]
        cof = np.float32(1.0) / np.float32(n)
        w = c1 - c0
        if src16:   # fp16 bits widened as the cast kernel widens them (NaN payloads too; under flush a
            # subnormal reads as a signed zero)
            sub = FLUSH if flush else KEEP
            row = x[0, c0:c1]
            for c in range(w):
                acc[c] = _elem32(op, _widen(row[c], sub), cof, False)
            for j in range(1, n):
                row = x[j, c0:c1]
                for c in range(w):
                    acc[c] = _step_first_nan(op, acc[c], _elem32(op, _widen(row[c], sub), cof, False))
        else:
            row = x[0, c0:c1]
            for c in range(w):
                acc[c] = _elem32(op, row[c], cof, flush)
            for j in range(1, n):
                row = x[j, c0:c1]
                for c in range(w):
                    acc[c] = _step_first_nan(op, acc[c], _elem32(op, row[c], cof, flush))
    cols.__doc__ = (f"acc[:c1 - c0] = reduce.py's _partial32 (op {op}) of columns c0..c1 of "
                    f"{'fp16 bits, widened exactly,' if src16 else 'float32'} x, all rows, stepped together "
                    "(``flush``: subnormal elements read as signed zeros)")
    return cols


_OPS = (SUM, MEAN, MAX, MIN, PROD, MEAN_SCALE_FIRST, MEAN_SCALE_LAST)
_sum32, _mean32, _max32, _min32, _prod32, _first32, _last32 = (_cols_kernel(op, False) for op in _OPS)
_sum16, _mean16, _max16, _min16, _prod16, _first16, _last16 = (_cols_kernel(op, True) for op in _OPS)


@njit(cache=True, error_model="numpy")
def _cols32(op, x, c0, c1, acc, flush):
    """The float32 column kernel of the run-time op code."""
    if op == SUM:
        _sum32(x, c0, c1, acc, flush)
    elif op == MEAN:
        _mean32(x, c0, c1, acc, flush)
    elif op == MAX:
        _max32(x, c0, c1, acc, flush)
    elif op == MIN:
        _min32(x, c0, c1, acc, flush)
    elif op == PROD:
        _prod32(x, c0, c1, acc, flush)
    elif op == MEAN_SCALE_FIRST:
        _first32(x, c0, c1, acc, flush)
    else:
        _last32(x, c0, c1, acc, flush)


@njit(cache=True, error_model="numpy")
def _cols16(op, x, c0, c1, acc, flush):
    """The fp16 column kernel of the run-time op code."""
    if op == SUM:
        _sum16(x, c0, c1, acc, flush)
    elif op == MEAN:
        _mean16(x, c0, c1, acc, flush)
    elif op == MAX:
        _max16(x, c0, c1, acc, flush)
    elif op == MIN:
        _min16(x, c0, c1, acc, flush)
    elif op == PROD:
        _prod16(x, c0, c1, acc, flush)
    elif op == MEAN_SCALE_FIRST:
        _first16(x, c0, c1, acc, flush)
    else:
        _last16(x, c0, c1, acc, flush)


def _lead_driver(src16, doc):
    # closes over an integer only (the on-disk cache); the other call is pruned before typing
    def drive(op, x, out, overflow, subnormal):
        n, rows = x.shape
        nch = (rows + _COLS - 1) // _COLS
        st = np.zeros(nch, dtype=np.int64)
        for ch in prange(nch):
            c0 = ch * _COLS
            c1 = min(rows, c0 + _COLS)
            acc = np.empty(_COLS, dtype=np.float32)
            if n == 0:
                for c in range(c1 - c0):
                    acc[c] = _empty(op)
            else:
                if src16:
                    _cols16(op, x, c0, c1, acc, subnormal == FLUSH)
                else:
                    _cols32(op, x, c0, c1, acc, subnormal == FLUSH)
            s = np.int64(0)
            for c in range(c1 - c0):
                a = acc[c] if n == 0 else _scaled(op, acc[c], n, np.float32(1.0) / np.float32(n))
                y, s1 = finish32(a, overflow, subnormal)
                out[c0 + c] = y
                s |= s1
            st[ch] = s
        return or_all(st)
    drive.__doc__ = doc
    return njit(cache=True, parallel=True)(drive)


reduce_lead_f32 = _lead_driver(False, """reduce_lead_f32(op, x, out, overflow, subnormal): out[r] = reduce(op, x[:, r]) over
    float32 columns, as reduce_f32 of x.T; returns the OR of statuses.""")
reduce_lead_f16 = _lead_driver(True, """reduce_lead_f16(op, x, out, overflow, subnormal): out[r] = reduce(op, x[:, r]) over
    columns of fp16 bits widened exactly (under flush their subnormals read as signed zeros, as the widening
    cast gives them), in float32 as reduce_lead_f32; HW_HALF hosts only; returns the OR of statuses.""")


# ------------------------------------------------------------------ fp16 widened by the CPU, NaN-free rows

def _hw_kernel(op):
    """The column kernel of ``_cols16`` (op a compile-time constant) widening by the CPU's conversion,
    over x (outer, n, rows) flattened: columns c0..c0 + w of block o."""
    @njit(cache=True, error_model="numpy")
    def cols(x, base, n, rows, w, acc):
        cof = np.float32(1.0) / np.float32(n)
        r = x[base:base + w]
        for c in range(w):
            acc[c] = _elem32(op, f16_to_f32_hw(r[c]), cof, False)
        j = 1
        # four rows a pass: each column's steps are still one after another in row order (its value, then row j,
        # j + 1, ...), held in a register between them; a row a pass paid its loop's set-up (the overlap checks
        # of acc against x, acc's load and store) for 16-32 columns: BN's 16-channel sums 2-3x slower
        while j + 4 <= n:
            b = base + j * rows
            r0 = x[b:b + w]
            r1 = x[b + rows:b + rows + w]
            r2 = x[b + 2 * rows:b + 2 * rows + w]
            r3 = x[b + 3 * rows:b + 3 * rows + w]
            for c in range(w):
                a = acc[c]
                a = _step(op, a, _elem32(op, f16_to_f32_hw(r0[c]), cof, False))
                a = _step(op, a, _elem32(op, f16_to_f32_hw(r1[c]), cof, False))
                a = _step(op, a, _elem32(op, f16_to_f32_hw(r2[c]), cof, False))
                acc[c] = _step(op, a, _elem32(op, f16_to_f32_hw(r3[c]), cof, False))
            j += 4
        for j in range(j, n):
            b = base + j * rows
            r = x[b:b + w]
            for c in range(w):
                acc[c] = _step(op, acc[c], _elem32(op, f16_to_f32_hw(r[c]), cof, False))
    cols.__doc__ = (f"acc[:w] = the sequential float32 reduction (op {op}) of the n fp16 values x[base + j * rows + c], "
                    "widened by the CPU (exact but for a signalling NaN, which it quietens)")
    return cols


_hw_sum, _hw_mean, _hw_prod, _hw_first, _hw_last = (_hw_kernel(op) for op in (SUM, MEAN, PROD, MEAN_SCALE_FIRST,
                                                                               MEAN_SCALE_LAST))
#: the ops of ``reduce_lead_f16_hw``: those whose result is NaN whenever an element is
HW_OPS = (SUM, MEAN, PROD, MEAN_SCALE_FIRST, MEAN_SCALE_LAST)


@njit(cache=True, parallel=True, error_model="numpy")
def reduce_lead_f16_hw(op, x, outer, n, rows, out, overflow):
    """out[o * rows + r] = reduce(op, x[o, :, r]) of fp16 bits x (outer, n, rows) flattened, n >= 1, in float32
    as ``reduce_lead_f16`` (subnormals kept) but widened by the CPU (``cast.HW_HALF`` hosts only); ``op`` one
    of HW_OPS. Returns the OR of statuses, or -1 if a result is NaN before finishing: an element may have
    been a NaN, which the CPU's widening may quieten (the caller then runs the exact kernel). Without a NaN
    every widened value, hence every step, is the exact kernel's."""
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
        if op == SUM:
            _hw_sum(x, base, n, rows, w, acc)
        elif op == MEAN:
            _hw_mean(x, base, n, rows, w, acc)
        elif op == PROD:
            _hw_prod(x, base, n, rows, w, acc)
        elif op == MEAN_SCALE_FIRST:
            _hw_first(x, base, n, rows, w, acc)
        else:
            _hw_last(x, base, n, rows, w, acc)
        s = np.int64(0)
        for c in range(w):
            a = acc[c]
            if a != a:
                s = np.int64(-1)
                break
            y, s1 = finish32(_scaled(op, a, n, cof), overflow, KEEP)
            out[o * rows + c0 + c] = y
            s |= s1
        st[it] = s
    return or_all_or_fail(st)
