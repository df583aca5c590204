"""The fused cube op's epilogue in one pass: Fixpipe of the float32 accumulator, the UB chain of
float32 elementwise steps, and the one rounding to the output dtype.

What it replaces (``ascend_emu.ops.fused_ops``): :func:`.fixpipe.finish_f32` on the accumulator, then
each chain step as a numpy float32 operation (numpy broadcasting), then the cast to the output dtype.
Here each block of rows of the (R, C) result goes through all of them while it sits in the cache.

A program row is ``(op, kind_a, index_a, kind_b, index_b)``; an operand is the running value
(``RUN``), a row of ``tiles`` (a per-last-axis vector or a scalar, repeated to the block's rows:
``tiles[index, :B]``), a float32 array of the result's shape (``F32``: ``f32s[index]``, flat) or a
16-bit one (``F16``: ``f16s[index]``'s bits, bf16 if ``f16bf[index]``, widened exactly). Every step
is one IEEE float32 operation per element, as numpy's float32 ufuncs compute it (no fast-math, so
no contraction or reassociation; ``error_model="numpy"``: x / 0 is IEEE). Relu is ``x > 0 ? x : +0``
and Relu6 ``relu(min(x, 6))``: numpy's ``maximum(x, 0) + 0`` and ``minimum`` on non-NaN x.

The fast path holds only where every running value is finite (after the Fixpipe, after every
step): anywhere else the kernel returns -1 and the caller runs the chain op by op (the ops' own
overflow handling and status). Otherwise it returns the status bits: 0x400 (a non-finite
accumulator, mapped to +-FLT_MAX / 0 under saturation) and ``st_round`` where the rounding overflowed
(0x20 for a fused op, whose ``finish`` reports the cast's 0x100 so; 0x100 for the plain Fixpipe, which
an empty program is: :func:`.fixpipe.finish_to_16` / ``finish_f32`` of a C^T product read in place).
Subnormals are kept (the caller's condition).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..codes import F16_BIAS, F16_EB, F16_MT, FLT_MAX, KEEP, RINT, SATURATION
from ..cast import (HW_HALF, bf16_bits_to_f32_bits, f16_bits_to_f32_bits, f32_to_f16_hw,  # noqa: F401
                    f32bits_narrow)
from ..parallel import or_all_or_fail
from .fixpipe import _fixpipe_f32

# operand kinds and step op codes of a program row
RUN, TILE, F32, F16 = 0, 1, 2, 3
ADD, SUB, MUL, DIV, RELU, RELU6 = 0, 1, 2, 3, 4, 5
# output kinds
OUT_F32, OUT_F16, OUT_BF16 = 0, 1, 2
#: elements per parallel work item (whole blocks of rows)
_WORK = 1 << 16


@njit(cache=True)
def _bad(v):
    """1 if float32 v is Inf or NaN, else 0, as a uint32 to OR (branch-free: vectorises)."""
    return np.uint32(not abs(v) <= FLT_MAX)


@njit(cache=True)
def _nonfinite(x, nb):
    """Whether any of x[:nb] is Inf or NaN."""
    f = np.uint32(0)
    for k in range(np.uintp(nb)):
        f |= _bad(x[k])
    return f != 0


@njit(cache=True, error_model="numpy")
def _operand(kind, idx, buf, scratch, tiles, f32s, f16s, f16bf, base, nb):
    """The operand (kind, idx) of the block [base, base + nb) as a float32 array of nb elements."""
    if kind == RUN:
        return buf[:nb]
    if kind == TILE:
        return tiles[idx, :nb]
    if kind == F32:
        return f32s[idx][base:base + nb]
    src = f16s[idx]
    d = scratch.view(np.uint32)
    if f16bf[idx]:
        for k in range(np.uintp(nb)):
            d[k] = bf16_bits_to_f32_bits(src[base + k], KEEP)
    else:
        for k in range(np.uintp(nb)):
            d[k] = f16_bits_to_f32_bits(src[base + k], KEEP)
    return scratch[:nb]


@njit(cache=True, error_model="numpy")
def _binary(op, x, y):
    """One IEEE float32 operation of the arithmetic step ``op`` (op is loop-invariant: unswitched)."""
    if op == ADD:
        return x + y
    if op == SUB:
        return x - y
    if op == MUL:
        return x * y
    return x / y


@njit(cache=True, error_model="numpy")
def _step_loop(op, a, b, buf, nb, a_run, b_run):
    """buf[k] = op(a[k], b[k]) for an arithmetic op, reading the running value from ``buf`` itself where
    ``a_run`` / ``b_run`` say a / b is it: two arrays in the loop, not three that may alias, so LLVM
    vectorises it without runtime alias checks. Returns whether a result is Inf or NaN."""
    f = np.uint32(0)
    if a_run and b_run:
        for k in range(np.uintp(nb)):
            x = buf[k]
            v = _binary(op, x, x)
            buf[k] = v
            f |= _bad(v)
    elif a_run:
        for k in range(np.uintp(nb)):
            v = _binary(op, buf[k], b[k])
            buf[k] = v
            f |= _bad(v)
    elif b_run:
        for k in range(np.uintp(nb)):
            v = _binary(op, a[k], buf[k])
            buf[k] = v
            f |= _bad(v)
    else:
        for k in range(np.uintp(nb)):
            v = _binary(op, a[k], b[k])
            buf[k] = v
            f |= _bad(v)
    return f != 0


@njit(cache=True, error_model="numpy")
def _step(op, a, b, buf, nb, a_run=False, b_run=False):
    """buf[k] = op(a[k], b[k]) for k < nb (b unused by the unary ops); returns whether a result of the
    arithmetic ops is Inf or NaN (relu's operand is checked by the caller). ``a_run`` / ``b_run``: a / b
    is ``buf`` (the running value)."""
    if op == ADD:
        return _step_loop(ADD, a, b, buf, nb, a_run, b_run)
    if op == SUB:
        return _step_loop(SUB, a, b, buf, nb, a_run, b_run)
    if op == MUL:
        return _step_loop(MUL, a, b, buf, nb, a_run, b_run)
    if op == DIV:
        return _step_loop(DIV, a, b, buf, nb, a_run, b_run)
    if op == RELU:
        for k in range(np.uintp(nb)):
            v = a[k]
            buf[k] = v if v > np.float32(0.0) else np.float32(0.0)
    else:  # RELU6
        for k in range(np.uintp(nb)):
            v = min(a[k], np.float32(6.0))
            buf[k] = v if v > np.float32(0.0) else np.float32(0.0)
    return False


@njit(cache=True)
def _act(v, fin):
    """v, relu(v) (fin 1) or relu6(v) (fin 2) for a finite float32 v, as _step computes them."""
    if fin == 1:
        return v if v > np.float32(0.0) else np.float32(0.0)
    w = min(v, np.float32(6.0))
    return w if w > np.float32(0.0) else np.float32(0.0)


@njit(cache=True)
def _f16_hw(buf, out16, base, nb, sat16, fin):
    """out16[base + k] = fp16 RNE bits of act(buf[k]) (act by ``fin``: none, relu, relu6) by the CPU's
    conversion; returns 1 if one overflowed. The values are finite: the conversion gives Inf exactly on
    overflow (cast.finish_f16_hw's rule); saturation takes the largest finite of its sign, Inf's bits - 1."""
    fl = np.uint16(0)
    if fin == 0:
        for k in range(np.uintp(nb)):
            h = f32_to_f16_hw(buf[k])
            over = np.uint16((h & np.uint16(0x7FFF)) == np.uint16(0x7C00))
            out16[base + k] = h - (over & sat16)
            fl |= over
    elif fin == 1:
        for k in range(np.uintp(nb)):
            h = f32_to_f16_hw(_act(buf[k], 1))
            over = np.uint16((h & np.uint16(0x7FFF)) == np.uint16(0x7C00))
            out16[base + k] = h - (over & sat16)
            fl |= over
    else:   # relu6: at most 6, never an overflow
        for k in range(np.uintp(nb)):
            out16[base + k] = f32_to_f16_hw(_act(buf[k], 2))
    return np.int64(fl)


@njit(cache=True, parallel=True, error_model="numpy")
def epilogue(acc, transposed, R, C, rb, prog, tiles, f32s, f16s, f16bf, out16, out32, out_kind, overflow, hw,
             st_round):
    """out = round(chain(fixpipe(acc))) over the (R, C) result, rb rows per block; returns the status
    bits, or -1 where a running value is not finite (nothing then is to be trusted in out).

    ``acc`` is the flat float32 accumulator, (R, C) row-major, or (C, R) if ``transposed`` (the
    cube's C^T: read column by column into row-major blocks). ``out16`` (fp16 / bf16 bits) or
    ``out32`` receives the flat (R, C) result, as ``out_kind`` says; ``overflow`` is the code of the
    overflow mode (saturation: Fixpipe maps a non-finite accumulator, the rounding saturates); ``hw``: round
    to fp16 by the CPU's conversion (``cast.HW_HALF``); ``st_round``: the status bit a rounding overflow
    raises (0x20 as a fused op's ``finish`` reports it, 0x100 as the plain Fixpipe's cast does)."""
    B = rb * C
    nblk = (R + rb - 1) // rb
    per = max(1, _WORK // max(B, 1))
    nw = (nblk + per - 1) // per
    st = np.zeros(nw, dtype=np.int64)
    sat = overflow == SATURATION
    sat_u = np.uint32(sat)
    bf16 = out_kind == OUT_BF16
    S = prog.shape[0]
    # a last Relu / Relu6 of the running value (finite: checked) goes into the rounding loop
    fin = 0
    S_run = S
    if S > 0 and prog[S - 1, 0] >= RELU and prog[S - 1, 1] == RUN and (out_kind == OUT_F32 or (
            out_kind == OUT_F16 and hw)):
        fin = prog[S - 1, 0] - RELU + 1
        S_run = S - 1
    # a first step adding a tile to the running value (a bias add) in the Fixpipe's copy loop: one pass over the
    # block less (the CNN's conv2d + bias epilogues: ~410 -> ~320 and ~200 -> ~155 us, benchmarks/RESULTS.md
    # session 20). The same float32 adds of the same operands in the same order; a block with a non-finite sum
    # (a non-finite accumulator makes one) takes the separate passes again
    fuse = S_run > 0 and prog[0, 0] == ADD and not transposed and (
        (prog[0, 1] == RUN and prog[0, 3] == TILE) or (prog[0, 1] == TILE and prog[0, 3] == RUN))
    run_a = prog[0, 1] == RUN if fuse else True
    ti = (prog[0, 4] if run_a else prog[0, 2]) if fuse else 0
    for w in prange(nw):
        buf = np.empty(B, dtype=np.float32)
        sa = np.empty(B, dtype=np.float32)
        sb = np.empty(B, dtype=np.float32)
        bufu = buf.view(np.uint32)
        s = np.int64(0)
        for blk in range(w * per, min(nblk, (w + 1) * per)):
            r0 = blk * rb
            nr = min(R, r0 + rb) - r0
            nb = nr * C
            base = np.uintp(r0 * C)   # unsigned indices: no wraparound test, so the loops vectorise
            step0 = 0
            if fuse:
                tk = tiles[ti]
                g = np.uint32(0)
                if run_a:
                    for k in range(np.uintp(nb)):
                        y = acc[base + k] + tk[k]
                        buf[k] = y
                        g |= _bad(y)
                else:
                    for k in range(np.uintp(nb)):
                        y = tk[k] + acc[base + k]
                        buf[k] = y
                        g |= _bad(y)
                if g == 0:   # (a non-finite accumulator makes a non-finite sum)
                    step0 = 1
            # Fixpipe: the accumulator into the block
            f = np.uint32(0)
            if step0 == 1:
                pass
            elif transposed:
                # row by row (contiguous writes; the C column streams each advance in order): twice
                # as fast as column by column's scattered writes
                for r in range(np.uintp(nr)):
                    for j in range(np.uintp(C)):
                        v = acc[np.uintp(j * R + r0) + r]
                        buf[r * C + j] = v
                        f |= _bad(v)
            else:
                for k in range(np.uintp(nb)):
                    v = acc[base + k]
                    buf[k] = v
                    f |= _bad(v)
            if f != 0:
                if not sat:
                    s = -1
                    break
                for k in range(np.uintp(nb)):
                    v, s1 = _fixpipe_f32(buf[k], True)
                    buf[k] = v
                    s |= s1
            bad = False
            for i in range(step0, S_run):
                op = prog[i, 0]
                a = _operand(prog[i, 1], prog[i, 2], buf, sa, tiles, f32s, f16s, f16bf, base, nb)
                b = _operand(prog[i, 3], prog[i, 4], buf, sb, tiles, f32s, f16s, f16bf, base, nb)
                # relu's operand (the running value or another input) is checked, as every result is
                if op >= RELU and prog[i, 1] != RUN and _nonfinite(a, nb):
                    bad = True
                    break
                if _step(op, a, b, buf, nb, prog[i, 1] == RUN, prog[i, 3] == RUN):
                    bad = True
                    break
            if bad:
                s = -1
                break
            # the one rounding to the output dtype, branch-free (the values are finite): fp16 by the CPU's
            # conversion (hw: HW_HALF hosts, the cast kernel's fast path) or the cast's generic rounding,
            # bf16 by RNE at bit 16 (it keeps float32's exponent range, subnormals too)
            nover = 0
            if out_kind == OUT_F32:
                if fin == 0:
                    for k in range(np.uintp(nb)):
                        out32[base + k] = buf[k]
                else:
                    for k in range(np.uintp(nb)):
                        out32[base + k] = _act(buf[k], fin)
            elif out_kind == OUT_F16 and hw:
                nover += _f16_hw(buf, out16, base, nb, np.uint16(sat), fin)
            elif out_kind == OUT_F16:
                for k in range(np.uintp(nb)):
                    h, s2 = f32bits_narrow(bufu[k], F16_MT, F16_BIAS, F16_EB, RINT, overflow, KEEP)
                    out16[base + k] = np.uint16(h)
                    nover += s2
            else:
                for k in range(np.uintp(nb)):
                    u = bufu[k]
                    mag = u & np.uint32(0x7FFFFFFF)
                    o = (mag + np.uint32(0x7FFF) + ((mag >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
                    over = np.uint32(o >= np.uint32(0x7F80))
                    o = (np.uint32(0x7F80) - sat_u) if over else o
                    out16[base + k] = np.uint16(((u >> np.uint32(16)) & np.uint32(0x8000)) | o)
                    nover += over
            if nover > 0:
                s |= st_round
        st[w] = s
    return or_all_or_fail(st)

