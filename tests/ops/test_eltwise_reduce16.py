"""An fp16 elementwise op read by a float32 reduction over the leading axes in one pass
(``numerics/eltwise_reduce.eltwise_reduce_f16``, ``kernels/eltwise_reduce16``): ``Mean(SquaredDifference(x, m))`` and
``Sum(Mul(a, b))`` against the two ops run one by one through the registry (the float32 operand cast to fp16 first,
as the device inserts the cast; the reduction in float32 reading the fp16 result) and against an oracle written
from the definition (numpy, step by step), bit for bit, on hostile fp16 data: every finite fp16 value, signed zeros,
subnormals, squares and products that overflow fp16 (None), ties of the fp16 rounding; every mean model. The test
fails on a one-step change (``test_one_step_change_fails``).
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.kernels import cast as _kc
from ascend_emu.numerics.eltwise_reduce import eltwise_reduce_f16
from ascend_emu.numerics.vector import cast
from ascend_emu.ops.registry import OpContext, run_op

pytestmark = pytest.mark.skipif(not _kc.HW_HALF, reason="the one-pass kernel needs hardware fp16 conversions")

C = 16
F16, F32 = np.float16, np.float32
AX = np.array([0, 1], np.int32)
MODELS = ("tbe_v220", "ascendc", "exact")


def _r16(v):
    with np.errstate(all="ignore"):
        return np.asarray(v).astype(F16).astype(F32)


def _oracle(elt, red, a, b, model):
    """The definition step by step: the element's float32 operation and fp16 rounding, then per column a running
    float32 sum from its first element in row order (the mean's 1/n per element first for TBE (n = 240: 1/n inexact), after for Ascend C,
    the exact / n); None where an element or the result is Inf or NaN."""
    with np.errstate(all="ignore"):
        a32 = a.astype(F32)
        if elt == "squared_difference":
            d = _r16(a32 - _r16(b))
            e = _r16(d * d)
            steps = [a32 - _r16(b), d * d]
        else:
            steps = [a32 * b.astype(F32)]
            e = _r16(steps[0])
        if not np.isfinite(e).all():
            return None
        n = e.shape[0] * e.shape[1]
        cols = e.reshape(n, -1)
        cof = F32(1.0) / F32(n)
        if red == "mean" and model.startswith("tbe"):
            cols = cols * cof
        acc = cols[0].copy()
        for j in range(1, n):
            acc = acc + cols[j]
        if red == "mean" and model == "ascendc":
            acc = acc * cof
        elif red == "mean" and model == "exact":
            acc = acc / F32(n)
    if not np.isfinite(acc).all():
        return None
    return acc.reshape((1, 1) + a.shape[2:])


def _ops(elt, red, a, b, model):
    """The two ops one by one as the device runs them: (float32 result, OR of the statuses)."""
    status = 0
    if b.dtype != F16:
        b, st = cast(b, "float16")
        status |= st
    ctx = OpContext(dtype="float16", op_model=model)
    (e,) = run_op({"squared_difference": "SquaredDifference", "mul": "Mul"}[elt], a, b, ctx=ctx)
    status |= ctx.status
    ctx = OpContext(dtype="float32", op_model=model)
    (y,) = run_op({"mean": "Mean", "sum": "Sum"}[red], e, AX, ctx=ctx, keep_dims=True)
    return y, status | ctx.status


def _finite_fp16():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = bits[(bits & 0x7C00) != 0x7C00]
    return bits.view(F16).reshape(-1, 2, C)


def _cases():
    rng = np.random.default_rng(46)
    full = _finite_fp16()
    shuffled = full.reshape(-1)[rng.permutation(full.size)].reshape(full.shape)
    small = (rng.standard_normal((60, 4, C)) * 2).astype(F16)
    small[:2] = [[[2.0 ** -24] * C] * 4, [[-0.0] * C] * 4]
    small[2, 0] = 1.0 + 2.0 ** -10          # ties of the rounding once m (0.5 + 2^-11 ... ) is subtracted
    tiny = (rng.standard_normal((60, 4, C)) * 2.0 ** -12).astype(F16)       # subnormal squares and products
    m = (rng.standard_normal((1, 1, C)) * 2).astype(F32)
    m[0, 0, :5] = [0.0, -0.0, 2.0 ** -20, -(2.0 ** -130), 0.5 + 2.0 ** -11]
    big = np.full((8, 2, C), 200.0, F16)
    out = []
    for model in MODELS:
        out += [("squared_difference", "mean", small, m, model), ("squared_difference", "mean", tiny, m * 1e-3, model),
                ("squared_difference", "mean", small, F32(0.25), model),
                ("mul", "sum", small, (rng.standard_normal(small.shape) * 3).astype(F16), model),
                ("mul", "sum", tiny, tiny[::-1].copy(), model), ("mul", "mean", small, small[::-1].copy(), model),
                ("squared_difference", "sum", small, m[0, 0].astype(F16), model)]
    # every finite fp16 value (squares and products that overflow: None), and scaled down into range
    out += [("squared_difference", "mean", full, m, "tbe_v220"), ("mul", "sum", full, shuffled, "tbe_v220"),
            ("mul", "sum", (full.astype(F32) * 2.0 ** -8).astype(F16), (shuffled.astype(F32) * 2.0 ** -10).astype(F16),
             "tbe_v220"),
            ("squared_difference", "mean", (full.astype(F32) * 2.0 ** -9).astype(F16), m, "tbe_v220")]
    # 255.9^2 fits fp16, 256^2 = 65536 rounds to Inf (None); a float32 mean whose cast overflows; an Inf in the data
    out += [("squared_difference", "mean", big, np.full((1, 1, C), -55.875, F32), "tbe_v220"),
            ("squared_difference", "mean", big, np.full((1, 1, C), -56.0, F32), "tbe_v220"),
            ("squared_difference", "mean", small, np.full((1, 1, C), 1e6, F32), "tbe_v220"),
            ("mul", "sum", np.where(small == small[5, 1, 3], F16(np.inf), small), small, "tbe_v220")]
    return out


@pytest.mark.parametrize("case", range(len(_cases())))
def test_eltwise_reduce_matches_the_ops(case):
    elt, red, a, b, model = _cases()[case]
    want = _oracle(elt, red, a, b, model)
    got = eltwise_reduce_f16(elt, red, a, b, AX, keepdims=True, op_model=model)
    if want is None:
        assert got is None
        return
    ops, status = _ops(elt, red, a, b, model)
    assert got is not None and got.dtype == F32 and got.shape == ops.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(got.view(np.uint32), ops.view(np.uint32))
    assert status == 0


def test_the_hostile_cases_exercise_both_outcomes():
    cases = _cases()
    results = [_oracle(*c) is None for c in cases]
    assert any(results) and not all(results)
    assert not results[-4] and results[-3]        # 255.875^2 = 65472 fits, 256^2 overflows
    # the subnormal case's elements: subnormal fp16 squares and products, some rounded to signed zeros
    _, _, tiny, _, _ = cases[1]
    e = _r16(tiny.astype(F32) * tiny[::-1].astype(F32))
    assert ((np.abs(e) < 2.0 ** -14) & (e != 0)).any() and (np.signbit(e) & (e == 0)).any()


def test_forms_it_does_not_take():
    a = np.ones((8, 2, C), F16)
    m = np.ones((1, 1, C), F32)
    assert eltwise_reduce_f16("squared_difference", "mean", a.astype(F32), m, AX) is None     # fp32 data
    assert eltwise_reduce_f16("squared_difference", "mean", a, np.ones((8, 1, C), F32), AX) is None  # not constant
    assert eltwise_reduce_f16("squared_difference", "mean", a, m, np.array([1, 2])) is None   # not the leading axes
    assert eltwise_reduce_f16("squared_difference", "mean", a, m, np.array([0, 1, 2])) is None  # all axes
    assert eltwise_reduce_f16("mul", "sum", a, a[:4], AX) is None                            # two shapes
    assert eltwise_reduce_f16("mul", "max", a, a, AX) is None
    assert eltwise_reduce_f16("mul", "sum", np.ones((8, 2, 1), F16), np.ones((8, 2, 1), F16), AX) is None  # one column


def test_one_step_change_fails():
    """The comparison sees a one-step change: the mean's 1/n after the sum instead of TBE's before, and the
    square of the unrounded difference, give other bits on the first case."""
    elt, red, a, b, model = _cases()[0]
    want = _oracle(elt, red, a, b, model)
    assert not np.array_equal(_oracle(elt, red, a, b, "ascendc").view(np.uint32), want.view(np.uint32))
    with np.errstate(all="ignore"):
        d = a.astype(F32) - _r16(b)
        e = _r16(d * d).reshape(-1, C)
        acc = e[0] * (F32(1.0) / F32(e.shape[0]))
        for j in range(1, e.shape[0]):
            acc = acc + e[j] * (F32(1.0) / F32(e.shape[0]))
    assert not np.array_equal(acc.reshape(want.shape).view(np.uint32), want.view(np.uint32))
