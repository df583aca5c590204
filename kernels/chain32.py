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

Adam's update (Keras 3's formulation, the benchmark MLP's optimizer) is recognised in the program and run
in one pass with every value in registers: the same IEEE float32 operations in the same order, so the same
bits; the blocked steps (``_blocked``) make twelve passes over L1 rows (RESULTS "Session 18: the Adam MLP
step": a 512 x 512 weight's update 676 -> 176 us alone). Its status needs only the steps whose non-finite value
could vanish: every step here passes an Inf or NaN operand on to its result except a division's divisor
(x / Inf = 0), so a value is non-finite somewhere in the chain exactly when the last step's or the divisor's
is (``_adam_pass``). Any other program's blocked steps test only the steps that argument leaves (``_tested_steps``:
those no later step reads other than as a divisor), the same status as testing every step.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from .codes import ADD, CHAIN_NEG, CHAIN_SQRT, CHAIN_SQUARE, FLT_MAX, MUL, REALDIV, SUB

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
def _step(code, x, y, r, m, check):
    """r[:m] = code(x, y) elementwise in float32 (x, y rows or single values: one compiled loop per
    combination, the code chosen outside the loop); returns True if every result is finite or ``check`` is
    False (a step whose Inf or NaN a later tested step shows: :func:`_tested_steps`)."""
    if not check:
        if code == ADD:
            for j in range(m):
                r[j] = _at(x, j) + _at(y, j)
        elif code == SUB:
            for j in range(m):
                r[j] = _at(x, j) - _at(y, j)
        elif code == MUL:
            for j in range(m):
                r[j] = _at(x, j) * _at(y, j)
        elif code == REALDIV:
            for j in range(m):
                r[j] = _at(x, j) / _at(y, j)
        elif code == CHAIN_NEG:
            for j in range(m):
                r[j] = -_at(x, j)
        elif code == CHAIN_SQUARE:
            for j in range(m):
                v = _at(x, j)
                r[j] = v * v
        else:
            for j in range(m):
                r[j] = np.sqrt(_at(x, j))
        return True
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


#: Keras 3 Adam (keras/src/optimizers/adam.py ``update_step``: ``m += (g - m) * (1 - beta_1)``,
#: ``v += (square(g) - v) * (1 - beta_2)``, ``w -= (m * alpha) / (sqrt(v) + epsilon)``) as the program's
#: full-size steps, in order: ``(code, a, b)`` where an operand is an earlier step of the template (0-11), a
#: full-size input (100 g, 101 m, 102 v, 103 w) or a single value (200 + i); a unary step repeats ``a``
_ADAM = np.array([
    (SUB, 100, 101), (MUL, 0, 200), (ADD, 101, 1),                            # 2: m
    (CHAIN_SQUARE, 100, 100), (SUB, 3, 102), (MUL, 4, 201), (ADD, 102, 5),    # 6: v
    (MUL, 2, 202), (CHAIN_SQRT, 6, 6), (ADD, 8, 203), (REALDIV, 7, 9),        # 10: the step
    (SUB, 103, 10)], dtype=np.int64)                                            # 11: w
#: the template steps the outputs may be: m, v, w
_ADAM_OUT = (2, 6, 11)


@njit(cache=True, error_model="numpy")
def _adam_match(fill, prog, out_rows, nrows):
    """How the program is Adam's (``_ADAM``), or None: (the full-size input of g, m, v, w; the single values'
    slots; the output of m, v, w). Follows the value each row holds, so the rows' reuse does not matter."""
    held = np.full(max(nrows, 1), -1, np.int64)       # 1000 + input k, or 2000 + template step
    for k in range(fill.shape[0]):
        held[fill[k]] = 1000 + k
    ins = np.full(4, -1, np.int64)
    sc = np.full(4, -1, np.int64)
    t = 0
    for s in range(prog.shape[0]):
        if prog[s, 5] == 0:
            continue
        if t == _ADAM.shape[0] or prog[s, 0] != _ADAM[t, 0]:
            return None
        for o in range(2):
            kind, at, ref = prog[s, 1 + 2 * o], prog[s, 2 + 2 * o], _ADAM[t, 1 + o]
            if ref >= 200:
                if kind != 0 or (sc[ref - 200] >= 0 and sc[ref - 200] != at):
                    return None
                sc[ref - 200] = at
            elif ref >= 100:
                if kind != 1 or not 1000 <= held[at] < 2000:
                    return None
                if ins[ref - 100] >= 0 and ins[ref - 100] != held[at] - 1000:
                    return None
                ins[ref - 100] = held[at] - 1000
            elif kind != 1 or held[at] != 2000 + ref:
                return None
        held[prog[s, 6]] = 2000 + t
        t += 1
    if t != _ADAM.shape[0] or out_rows.shape[0] != 3:
        return None
    outk = np.full(3, -1, np.int64)
    for k in range(3):
        for q in range(3):
            if held[out_rows[k]] == 2000 + _ADAM_OUT[q]:
                outk[q] = k
    for q in range(3):
        if outk[q] < 0:
            return None
    return ins, sc, outk


@njit(cache=True, parallel=True, error_model="numpy")
def _adam_pass(g, m, v, w, c1, c2, alpha, eps, mo, vo, wo, n):
    """Adam's steps (``_ADAM``) element by element, each an IEEE float32 operation (no contraction: with
    Numba's default float flags a product and a sum stay two roundings); returns non-zero if a step's value is Inf or
    NaN somewhere. Only the last step and the divisor are tested: each other step's Inf or NaN reaches one of
    them (an operand's Inf or NaN gives an Inf or NaN result in + - * sqrt and in a dividend)."""
    nitem = (n + _CHUNK - 1) // _CHUNK
    bad = np.zeros(nitem, dtype=np.int64)
    for it in prange(nitem):
        good = True
        for j in range(it * _CHUNK, min(n, (it + 1) * _CHUNK)):
            gj = g[j]
            mj = m[j]
            vj = v[j]
            m2 = mj + (gj - mj) * c1
            v2 = vj + (gj * gj - vj) * c2
            d = np.sqrt(v2) + eps
            w2 = w[j] - (m2 * alpha) / d
            mo[j] = m2
            vo[j] = v2
            wo[j] = w2
            good &= abs(d) <= FLT_MAX
            good &= abs(w2) <= FLT_MAX
        bad[it] = np.int64(not good)
    r = np.int64(0)
    for it in range(nitem):
        r |= bad[it]
    return r


@njit(cache=True, error_model="numpy")
def _tested_steps(prog, nrows):
    """Which full-size steps :func:`_blocked` tests for Inf and NaN: those whose value no later step reads
    other than as a divisor. Every other step's Inf or NaN reaches a tested one: a step reading it as an
    operand of + - * (x - Inf, Inf * 0 and Inf - Inf included), as a dividend, or as the operand of neg, square
    or sqrt has an Inf or NaN result, and following such readers ends at a step no later step reads that way;
    only a divisor can hide one (x / Inf = 0). So the chain has an Inf or NaN step result exactly when a tested
    step has: the status is the one testing every step gives (``_adam_pass`` is the same argument for Adam's
    program). Follows the value each row holds, so the rows' reuse does not matter."""
    ns = prog.shape[0]
    held = np.full(max(nrows, 1), -1, np.int64)     # the step whose value the row holds, -1 an input's
    passed = np.zeros(ns, dtype=np.bool_)           # some later step reads the value other than as a divisor
    for s in range(ns):
        if prog[s, 5] == 0:
            continue
        code = prog[s, 0]
        if prog[s, 1] == 1 and held[prog[s, 2]] >= 0:
            passed[held[prog[s, 2]]] = True
        binary = code != CHAIN_NEG and code != CHAIN_SQUARE and code != CHAIN_SQRT
        if binary and code != REALDIV and prog[s, 3] == 1 and held[prog[s, 4]] >= 0:
            passed[held[prog[s, 4]]] = True
        held[prog[s, 6]] = s
    test = np.zeros(ns, dtype=np.bool_)
    for s in range(ns):
        test[s] = prog[s, 5] == 1 and not passed[s]
    return test


@njit(cache=True, parallel=True, error_model="numpy")
def _blocked(full, fill, scal, prog, test, outs, out_rows, n, nrows, blk):
    """The program over blocks of ``blk`` elements, step by step over the block's rows (any program: what
    :func:`chain_f32` runs when it is not Adam's); only the steps ``test`` marks are tested for Inf and NaN."""
    ns = prog.shape[0]
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
                t = test[s]
                if ka == 1 and kb == 1:
                    good &= _step(code, rows[ia], rows[ib], rows[ir], m, t)
                elif ka == 1:
                    good &= _step(code, rows[ia], scal[ib], rows[ir], m, t)
                else:
                    good &= _step(code, scal[ia], rows[ib], rows[ir], m, t)
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


@njit(cache=True, error_model="numpy")
def chain_f32(full, fill, scal, prog, outs, out_rows, n, nrows, blk):
    """outs[k][i] = the program's value out_rows[k] at element i (float32 steps on the full-size inputs
    ``full`` and the single values ``scal``, which receives the single-valued step results); returns
    non-zero if some step result is Inf or NaN (the outputs are then not the program's)."""
    for s in range(prog.shape[0]):
        if prog[s, 5] == 0:
            v = _op(prog[s, 0], scal[prog[s, 2]], scal[prog[s, 4]])
            scal[prog[s, 6]] = v
            if not abs(v) <= FLT_MAX:
                return np.int64(1)
    adam = _adam_match(fill, prog, out_rows, nrows)
    if adam is not None:
        ins, sc, outk = adam
        return _adam_pass(full[ins[0]], full[ins[1]], full[ins[2]], full[ins[3]], scal[sc[0]], scal[sc[1]],
                          scal[sc[2]], scal[sc[3]], outs[outk[0]], outs[outk[1]], outs[outk[2]], n)
    return _blocked(full, fill, scal, prog, _tested_steps(prog, nrows), outs, out_rows, n, nrows, blk)
