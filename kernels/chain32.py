"""A program of float32 elementwise steps with several outputs, in one pass (an optimizer's update chain).

An optimizer update (Adam's m, v and variable, SGD momentum's accumulator and variable, RMSProp's) is a
chain of float32 ops over the variable's elements whose operands are full-size arrays (the gradient, the
slots, the variable) or single values (the learning rate, the betas, bias corrections), and whose results
are several new arrays. Run op by op, each step is a pass over memory and a Python dispatch; here each
element goes through every step while it is in cache.

The program: ``prog[s] = (code, ka, ia, kb, ib, kr, ir)`` computes ``code(a, b)`` into the value ``(kr, ir)``,
where an operand ``(k, i)`` is a single value ``scal[i]`` (k 0) or a row of the block (k 1: row ``i``). A step
whose result is a single value (both operands single values) runs once, before the element loop. Full-size
input ``k`` is laid into row ``fill[k]`` at each block; output ``k`` is row ``out_rows[k]`` at the end of each
block. Each step is one IEEE float32 operation as numpy's float32 ufuncs compute it: ``+ - * /`` (ADD, SUB,
MUL, REALDIV), negation, ``x * x`` and the correctly rounded square root (CHAIN_NEG, CHAIN_SQUARE,
CHAIN_SQRT; ``b`` is ignored). The kernel does not model overflow: it returns non-zero when any step result
is Inf or NaN, and its outputs are then not the program's (the caller runs the ops one by one, which raise
the status and apply the overflow mode).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from .codes import ADD, CHAIN_NEG, CHAIN_SQUARE, FLT_MAX, MUL, REALDIV, SUB

#: elements per block: the rows of a program of a dozen steps stay within L1 and L2
BLOCK = 1024
_CHUNK = 1 << 15


def _at(a, j):
    """a[j] of a row, or a itself for a single value."""
    raise NotImplementedError("compiled only")


@overload(_at)
def _at_impl(a, j):
    if isinstance(a, types.Array):
        return lambda a, j: a[j]
    return lambda a, j: a


@njit(cache=True, error_model="numpy")
def _op(code, x, y):
    """code(x, y) for two float32 values, one IEEE float32 operation."""
    if code == ADD:
        return x + y
    if code == SUB:
        return x - y
    if code == MUL:
        return x * y
    if code == REALDIV:
        return x / y
    if code == CHAIN_NEG:
        return -x
    if code == CHAIN_SQUARE:
        return x * x
    return np.sqrt(x)      # CHAIN_SQRT


@njit(cache=True, error_model="numpy")
def _step(code, x, y, r, m):
    """r[:m] = code(x, y) elementwise in float32 (x, y rows or single values: one compiled loop per
    combination, the code chosen outside the loop); returns True if every result is finite."""
    # a boolean accumulator: an int64 one holds the loops to four lanes (kernels/chain.py)
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
    elif code == CHAIN_NEG:
        for j in range(m):
            v = -_at(x, j)
            r[j] = v
            good &= abs(v) <= FLT_MAX
    elif code == CHAIN_SQUARE:
        for j in range(m):
            v = _at(x, j)
            v = v * v
            r[j] = v
            good &= abs(v) <= FLT_MAX
    else:
        for j in range(m):
            v = np.sqrt(_at(x, j))
            r[j] = v
            good &= abs(v) <= FLT_MAX
    return good


@njit(cache=True, parallel=True, error_model="numpy")
def chain_f32(full, fill, scal, prog, outs, out_rows, n, nrows, blk):
    """outs[k][i] = the program's value out_rows[k] at element i (float32 steps on the full-size inputs
    ``full`` and the single values ``scal``, which receives the single-valued step results); returns
    non-zero if some step result is Inf or NaN (the outputs are then not the program's)."""
    ns = prog.shape[0]
    for s in range(ns):
        if prog[s, 5] == 0:
            v = _op(prog[s, 0], scal[prog[s, 2]], scal[prog[s, 4]])
            scal[prog[s, 6]] = v
            if not abs(v) <= FLT_MAX:
                return np.int64(1)
    nf = fill.shape[0]
    no = out_rows.shape[0]
    per = max(1, _CHUNK // blk)          # blocks per work item
    nblk = (n + blk - 1) // blk
    nitem = (nblk + per - 1) // per
    bad = np.zeros(nitem, dtype=np.int64)
    for it in prange(nitem):
        rows = np.empty((nrows, blk), dtype=np.float32)
        good = True
        for b in range(it * per, min(nblk, (it + 1) * per)):
            lo = b * blk
            m = min(blk, n - lo)
            for k in range(nf):
                src = full[k][lo:lo + m]
                dst = rows[fill[k]]
                for j in range(m):
                    dst[j] = src[j]
            for s in range(ns):
                if prog[s, 5] == 0:
                    continue
                code, ka, ia, kb, ib, ir = prog[s, 0], prog[s, 1], prog[s, 2], prog[s, 3], prog[s, 4], prog[s, 6]
                if ka == 1 and kb == 1:
                    good &= _step(code, rows[ia], rows[ib], rows[ir], m)
                elif ka == 1:
                    good &= _step(code, rows[ia], scal[ib], rows[ir], m)
                else:
                    good &= _step(code, scal[ia], rows[ib], rows[ir], m)
            for k in range(no):
                dst = outs[k][lo:lo + m]
                src = rows[out_rows[k]]
                for j in range(m):
                    dst[j] = src[j]
        bad[it] = np.int64(not good)
    r = np.int64(0)
    for it in range(nitem):
        r |= bad[it]
    return r
