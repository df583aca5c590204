"""Float32 reductions over the leading axes: :func:`.reduce.reduce_f32` with the rows as columns.

``x`` is (inner, rows): column r holds the elements of output r in the order the row kernel reads
them (a C-contiguous array reduced over its first axes, the kept axes last, needs no transposed
copy). Every output runs the row kernel's steps in the row kernel's order (its first element,
then one float32 step per further element, the mean's scaling, the final check), so the bits and
statuses are :func:`.reduce.reduce_f32`'s; the loop over columns is innermost, so the steps of
neighbouring outputs are vectorised instead of waiting on one accumulator's latency.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .parallel import or_all
from .reduce import _elem32, _empty, _scaled, _step
from .vector import finish32

_COLS = 256  # outputs per work item


@njit(cache=True, error_model="numpy")
def _cols32(op, x, c0, c1, acc, flush):
    """acc[:c1 - c0] = reduce.py's _partial32 of columns c0..c1 of x, all rows, stepped together (``flush``:
    subnormal elements read as signed zeros; a loop invariant, so LLVM compiles the loop once per value)."""
    n = x.shape[0]
    cof = np.float32(1.0) / np.float32(n)
    w = c1 - c0
    for c in range(w):
        acc[c] = _elem32(op, x[0, c0 + c], cof, flush)
    for j in range(1, n):
        for c in range(w):
            acc[c] = _step(op, acc[c], _elem32(op, x[j, c0 + c], cof, flush))


@njit(cache=True, parallel=True)
def reduce_lead_f32(op, x, out, overflow, subnormal):
    """out[r] = reduce(op, x[:, r]) over float32 columns, as reduce_f32 of x.T; returns the OR of statuses."""
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
            _cols32(op, x, c0, c1, acc, subnormal == 1)
        s = np.int64(0)
        for c in range(c1 - c0):
            a = acc[c] if n == 0 else _scaled(op, acc[c], n, np.float32(1.0) / np.float32(n))
            y, s1 = finish32(a, overflow, subnormal)
            out[c0 + c] = y
            s |= s1
        st[ch] = s
    return or_all(st)
