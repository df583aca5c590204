"""Batch norm's input gradient in fp16 (the backward's four full-size nodes per layer) in one pass.

Keras' batch normalization under a mixed-precision policy computes its input gradient as four full-size fp16
vector ops, each a pass over the tensor (RESULTS "Session 20": ~3 ms of the benchmark CNN's step):

    A = Mul(g, s)                     dy * scale            (g fp16 full-size, s per channel)
    S = Sub(x, m)                     x - mean              (x fp16 full-size, m per channel)
    C = _EltwiseChain(... , S)        (B / n * k) * S       (the per-channel factor p = B / n * k, then * S)
    D = AddN(A, t, C)                 A + t + C             (t per channel)

Each op computes in float32 on its operands widened (a 16-bit op: one float32 operation, rounded to
nearest-even fp16; the chain: its float32 steps, one rounding; AddN: a float32 running sum in input order, one
rounding). :func:`bn_dx_to_f16` runs exactly those operations per element, in that order, from the per-channel
operands as the ops meet them (the caller rounds them to fp16 as the device's inserted casts do and folds the
chain's per-channel prefix p in float32, as ``numerics/chain._fold_prefix`` does):

    A = rn16(g * s);  S = rn16(x - m);  C = rn16(p * S);  D = rn16((A + t) + C)

The kernel does not model overflow: it returns non-zero when any float32 step result or any fp16 rounding is Inf
or NaN (an fp16 overflow included), and its output is then not the ops' (the caller runs the ops one by one, which
raise the status and apply the overflow mode). It tests the output alone: every step passes an Inf or NaN operand on
to its result (``+ - *`` of an Inf or NaN and a finite value or another Inf or NaN is Inf or NaN: Inf * 0 and
Inf - Inf are NaN; the rounding to fp16 keeps it; there is no division), and every step's result reaches the output,
so a value is Inf or NaN somewhere exactly when the output is (a finite sum that overflows fp16 included). Hosts with ``cast.HW_HALF`` only (the hardware conversions round to
nearest-even and keep subnormals).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cast import f16_to_f32_hw, f32_to_f16_hw

_CHUNK = 1 << 15


@njit(cache=True, parallel=True, error_model="numpy")
def bn_dx_to_f16(g, x, s, m, p, t, out):
    """out[i] = rn16((rn16(g[i] * s[j]) + t[j]) + rn16(p[j] * rn16(x[i] - m[j]))), j = i % s.size, in float32 with
    fp16 bits widened exactly; returns non-zero if any step's result or rounding is Inf or NaN (out is then not the
    ops'). g, x, out: fp16 bits (uint16) of one size; s, m, p, t: float32 rows of a block (one size, a multiple of
    the channels, each the channel values tiled)."""
    n = out.size
    blk = s.size
    per = max(1, _CHUNK // blk)          # blocks per work item
    nblk = (n + blk - 1) // blk
    nitem = (nblk + per - 1) // per
    bad = np.zeros(nitem, dtype=np.int64)
    for it in prange(nitem):
        # a boolean accumulator: an int64 one holds the loop to four lanes (kernels/chain.py)
        good = True
        for b in range(it * per, min(nblk, (it + 1) * per)):
            lo0 = b * blk
            k = min(blk, n - lo0)
            gs = g[lo0:lo0 + k]
            xs = x[lo0:lo0 + k]
            o = out[lo0:lo0 + k]
            for j in range(k):
                # (no test between the steps: every step passes an Inf or NaN on, see the module's docstring)
                a = f16_to_f32_hw(f32_to_f16_hw(f16_to_f32_hw(gs[j]) * s[j]))
                d = f16_to_f32_hw(f32_to_f16_hw(f16_to_f32_hw(xs[j]) - m[j]))
                c = f16_to_f32_hw(f32_to_f16_hw(p[j] * d))
                h = f32_to_f16_hw((a + t[j]) + c)
                o[j] = h
                good &= (h & np.uint16(0x7FFF)) < np.uint16(0x7C00)
        bad[it] = not good
    r = np.int64(0)
    for it in range(nitem):
        r |= bad[it]
    return r
