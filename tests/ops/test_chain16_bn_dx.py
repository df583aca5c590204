"""Batch norm's fp16 input gradient in one pass (``numerics/chain.bn_dx_f16``, ``kernels/chain16.bn_dx_to_f16``):
``AddN(Mul(g, s), t, _EltwiseChain(b, n, k, Sub(x, m)))`` against the four ops run one by one through the registry
(their float32 operands cast to fp16 first, as the device inserts the casts) and against an oracle written from
the definition (numpy, step by step), bit for bit, on hostile fp16 data: every finite fp16 value as g and as x,
signed zeros, subnormals, values near 65504, ties of the fp16 rounding; None exactly where a step, a rounding or a
cast is Inf or NaN (the ops' overflow and status are theirs). The test fails on a one-step change of the kernel
(``test_one_step_change_fails``).
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.kernels import cast as _kc
from ascend_emu.numerics import chain as nchain
from ascend_emu.numerics.vector import cast
from ascend_emu.ops.registry import OpContext, run_op

pytestmark = pytest.mark.skipif(not _kc.HW_HALF, reason="the one-pass kernel needs hardware fp16 conversions")

C = 16
_CHAIN = [{"op": "RealDiv", "args": [0, 1]}, {"op": "Mul", "args": [2, -1]}, {"op": "Mul", "args": [-1, 3]}]
F16, F32 = np.float16, np.float32


def _r16(v):
    with np.errstate(all="ignore"):
        return np.asarray(v).astype(F16).astype(F32)


def _oracle(g, s, x, m, b, n, k, t):
    """The definition step by step (numpy float32 operations, numpy's round-to-nearest-even fp16): the fp16 bits,
    or None where any cast, step or rounding is Inf or NaN."""
    vals = []
    with np.errstate(all="ignore"):
        s16, m16, b16, n16, k16, t16 = (_r16(v) for v in (s, m, b, n, k, t))
        g32, x32 = g.astype(F32), x.astype(F32)
        a = g32 * s16
        vals.append(a)
        a = _r16(a)
        vals.append(a)
        d = x32 - m16
        vals.append(d)
        d = _r16(d)
        vals.append(d)
        p = b16 / n16
        vals.append(p)
        p = k16 * p
        vals.append(p)
        c = p * d
        vals.append(c)
        c = _r16(c)
        vals.append(c)
        v = a + t16
        vals.append(v)
        v = v + c
        vals.append(v)
        out = v.astype(F16)
        vals.append(out)
    if not all(np.isfinite(q).all() for q in vals + [s16, m16, b16, n16, k16, t16]):
        return None
    return out.view(np.uint16)


def _ops(g, s, x, m, b, n, k, t):
    """The four ops one by one, as the device runs them (inserted casts of float32 operands to fp16 first):
    (fp16 result, OR of every status)."""
    status = 0

    def c16(v):
        nonlocal status
        if v.dtype == F16:
            return v
        out, st = cast(v, "float16")
        status |= st
        return out

    def op(name, *xs, **kw):
        nonlocal status
        ctx = OpContext(dtype="float16")
        (y,) = run_op(name, *xs, ctx=ctx, **kw)
        status |= ctx.status
        return y

    a = op("Mul", g, c16(s))
    sub = op("Sub", x, c16(m))
    ch = op("_EltwiseChain", c16(b), c16(n), c16(k), sub, chain=_CHAIN)
    d = op("AddN", a, c16(t), ch)
    return d, status


def _finite_fp16():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = bits[(bits & 0x7C00) != 0x7C00]
    return bits.view(F16).reshape(-1, C)


def _channel(rng, scale, dt=F32):
    v = rng.standard_normal(C) * scale
    v[:6] = [0.0, -0.0, 2.0 ** -20, -(2.0 ** -130), 1.0, -1.0]
    return v.astype(dt)


def _cases():
    rng = np.random.default_rng(46)
    full = _finite_fp16()                    # every finite fp16 value, 1/16 of them per channel
    shuffled = full.reshape(-1)[rng.permutation(full.size)].reshape(full.shape)
    out = []
    for scale_g, scale_x in ((1.0, 1.0), (2.0 ** -10, 2.0 ** -14), (3.0, 1e3)):
        s = _channel(rng, scale_g)
        m = _channel(rng, scale_x)
        # BN's mean gradient: a broadcast view of one row, divided by a count, times the constant 2
        b = np.broadcast_to(_channel(rng, 1e-3).reshape(1, C), full.shape)
        t = np.broadcast_to(_channel(rng, 1e-2).reshape(1, C), full.shape)
        out.append((full, s, shuffled, m, b, F32(4096.0), F32(2.0), t))
        out.append((shuffled, s, full, m, b, F32(3.0), F32(-0.5), t))
    # moderate data (the fast path's own domain): BN-like values, fp16 per-channel operands, ties of the rounding
    g = (rng.standard_normal((256, C)) * 0.5).astype(F16)
    x = (rng.standard_normal((256, C)) * 4).astype(F16)
    g[:4] = [[2.0 ** -24] * C, [-(2.0 ** -24)] * C, [0.0] * C, [-0.0] * C]
    x[4] = 1.0 + 2.0 ** -11          # ties once m is subtracted exactly
    s16 = _channel(rng, 1.0, F16)
    out.append((g, s16, x, np.zeros(C, F16), np.broadcast_to(F32(1e-3), g.shape), F32(7.0), F32(2.0),
                np.broadcast_to(F32(0.0), g.shape)))
    out.append((g, F32(0.75), x, F32(-0.5), np.broadcast_to(_channel(rng, 1.0).reshape(1, 1, C), (1,) + g.shape)[0],
                F32(1.0), F32(2.0), _channel(rng, 1.0)))
    # AddN's order seen: (1024 + 2^-24) + -1024 is 0 in float32, (1024 + -1024) + 2^-24 is not (every other row: BN-like
    # data with the same operands)
    go, xo = g.copy(), x.copy()
    go[::2], xo[::2] = F16(1024.0), F16(-512.0)
    out.append((go, F32(1.0), xo, F32(0.0), np.full(C, 2.0, F32), F32(1.0), F32(1.0), np.full(C, 2.0 ** -24, F32)))
    # near the top of fp16: a sum of exactly 65504, and 65520, the tie that rounds to +Inf (None)
    big = np.full((256, C), 60000.0, F16)
    out.append((big, F32(1.0), big, F32(0.0), np.zeros(C, F32), F32(1.0), F32(2.0), np.full(C, 5504.0, F32)))
    out.append((big, F32(1.0), big, F32(0.0), np.zeros(C, F32), F32(1.0), F32(2.0), np.full(C, 5520.0, F32)))   # a tie: to +Inf
    # a float32 operand whose fp16 cast overflows, an Inf in the data, a NaN divisor
    out.append((g, F32(1e6), x, F32(0.0), np.zeros(C, F32), F32(1.0), F32(2.0), np.zeros(C, F32)))
    gi = g.copy()
    gi[7, 3] = np.inf
    out.append((gi, F32(1.0), x, F32(0.0), np.zeros(C, F32), F32(1.0), F32(2.0), np.zeros(C, F32)))
    out.append((g, F32(1.0), x, F32(0.0), np.zeros(C, F32), F32(0.0), F32(2.0), np.zeros(C, F32)))
    return out


@pytest.mark.parametrize("case", range(len(_cases())))
def test_bn_dx_f16_matches_the_ops(case):
    g, s, x, m, b, n, k, t = _cases()[case]
    want = _oracle(g, s, x, m, b, n, k, t)
    got = nchain.bn_dx_f16(g, s, x, m, b, n, k, t)
    ops, status = _ops(g, s, x, m, b, n, k, t)
    if want is None:
        assert got is None
        return
    assert got is not None and got.dtype == F16 and got.shape == g.shape
    np.testing.assert_array_equal(got.view(np.uint16), want)
    np.testing.assert_array_equal(got.view(np.uint16), ops.view(np.uint16))
    assert status == 0


def test_the_hostile_cases_exercise_both_outcomes():
    results = [_oracle(*c) is None for c in _cases()]
    assert any(results) and not all(results)
    # the fast path's result near 65504 is 65504 itself somewhere (no overflow yet)
    g, s, x, m, b, n, k, t = _cases()[9]
    got = nchain.bn_dx_f16(g, s, x, m, b, n, k, t)
    assert got is not None and (got == F16(65504.0)).any()


def test_forms_it_does_not_take():
    g = np.ones((64, C), F16)
    row = np.ones(C, F32)
    one = F32(1.0)
    assert nchain.bn_dx_f16(g.astype(F32), row, g, row, row, one, one, row) is None      # fp32 data
    assert nchain.bn_dx_f16(g, row, g[:32], row, row, one, one, row) is None             # two shapes
    assert nchain.bn_dx_f16(g, np.ones(C + 1, F32), g, row, row, one, one, row) is None  # not per channel
    assert nchain.bn_dx_f16(g, row, g, row, np.ones((64, C), F32), one, one, row) is None  # full-size operand
    assert nchain.bn_dx_f16(g, row, g, row, row, one, one, row.astype(np.float64)) is None


def test_one_step_change_fails(monkeypatch):
    """The comparison sees a one-step change: the AddN's order (A + C first, then t) gives other bits on the order
    case (the kernel changed so fails ``test_bn_dx_f16_matches_the_ops[8]``, and the chain's rounding left out fails
    cases 2, 6 and 7: both checked by hand, RESULTS session 20)."""
    g, s, x, m, b, n, k, t = _cases()[8]
    want = _oracle(g, s, x, m, b, n, k, t)
    assert want is not None
    t16, s16, m16 = _r16(t), _r16(s), _r16(m)
    with np.errstate(all="ignore"):
        p = _r16(k) * (_r16(b) / _r16(n))
        a = _r16(g.astype(F32) * s16)
        c = _r16(p * _r16(x.astype(F32) - m16))
        reordered = ((a + c) + t16).astype(F16).view(np.uint16)
    assert not np.array_equal(reordered, want)
