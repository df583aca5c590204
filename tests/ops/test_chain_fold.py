"""The one-pass chain kernel's folded prefix (numerics/chain._fold_prefix): a fused chain's leading steps on
one-value and per-channel operands only (BN's gradient ``mean_grad / n * 2`` before it multiplies the full-size
centred input) are worked out once on the distinct values and enter the kernel as one per-channel input. Against
the path before the one-pass kernel (``_chain``'s float32 steps, then ``_round_to``), bit for bit and status for
status, in both overflow and subnormal modes, on hostile data: signed zeros, fp16 and float32 subnormals, a
folded value that is Inf or NaN (a division by a zero channel, a NaN channel), operands given as zero-stride
broadcast views (as the replay's BroadcastTo hands them over), an input read both in the prefix and after it.
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.kernels import cast as _kc
from ascend_emu.numerics import chain as nchain
from ascend_emu.ops import OPS, OpContext
from ascend_emu.ops import fused_ops

pytestmark = pytest.mark.skipif(not _kc.HW_HALF, reason="the one-pass kernel needs hardware fp16 conversions")

rng = np.random.default_rng(20261206)


def _step(op, *args):
    return {"op": op, "args": list(args), "attrs": {}, "name": op.lower()}


def _hostile(shape, dt, specials=False, scale=0.3):
    x = np.clip(rng.standard_normal(shape), -3.0, 3.0) * scale
    pick = rng.integers(0, 8, shape)
    x = np.where(pick == 1, rng.choice([0.0, -0.0], shape), x)
    x = np.where(pick == 2, rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-25, -14, shape)), x)
    x = np.where(pick == 3, rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-149, -126, shape)), x)
    if specials:
        x = np.where(pick == 4, rng.choice([np.inf, -np.inf, np.nan], shape), x)
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dt)


def _channel(shape, dt, view, **kw):
    """A per-channel operand: (C,) values, or (as the replay's BroadcastTo gives it) a zero-stride view of them."""
    c = shape[-1]
    v = _hostile((1,) * (len(shape) - 1) + (c,), dt, **kw)
    return np.broadcast_to(v, shape) if view else v.reshape(c)


def _check(chain, xs, folds):
    seen = []
    real = nchain._fold_prefix

    def spy(inputs, steps, *a):
        r = real(inputs, steps, *a)
        seen.append(r is None or r[1] is not steps)
        return r
    for ov in ("inf_nan", "saturation"):
        for sub in ("keep", "flush"):
            kw = dict(dtype="float16", overflow_mode=ov, subnormals=sub)
            ctx = OpContext(**kw)
            nchain._fold_prefix = spy
            try:
                (got,) = OPS["_EltwiseChain"](*xs, ctx=ctx, chain=chain)
            finally:
                nchain._fold_prefix = real
            ref = OpContext(**kw)
            want = fused_ops._round_to(ref, fused_ops._chain(ref, None, xs, chain), ref.dtype_name)
            assert got.dtype == want.dtype and got.shape == want.shape, (chain, kw)
            np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=f"{chain} {kw}")
            assert ctx.status == ref.status, (chain, kw)
    assert any(seen) == folds


BN_GRAD = [_step("RealDiv", 0, 1), _step("Mul", 2, -1), _step("Mul", -1, 3)]
SHAPES = [(8, 16, 16, 16), (5, 37, 48), (3, 2, 1500)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("view", [True, False], ids=["view", "channel"])
def test_bn_gradient_prefix_folded(shape, view):
    xs = [_channel(shape, np.float16, view), np.asarray(1024.0, np.float32), np.asarray(-2.5, np.float16),
          _hostile(shape, np.float16)]
    _check(BN_GRAD, xs, folds=True)


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_longer_prefixes_and_inputs_read_again(shape):
    c = shape[-1]
    full = _hostile(shape, np.float16)
    ch32 = _channel(shape, np.float32, False)
    # two folded steps, then the full-size tensor and a relu
    _check([_step("Mul", 0, 1), _step("Sub", -1, 2), _step("Mul", -1, 3), _step("Relu", -1)],
           [ch32, np.asarray(0.75, np.float32), _channel(shape, np.float16, True), full], folds=True)
    # the per-channel input read in the prefix and again after it
    _check([_step("Mul", 0, 1), _step("Mul", -1, 2), _step("AddV2", -1, 0)],
           [_channel(shape, np.float16, True), np.asarray(3.0, np.float16), full], folds=True)
    # a running value read as the second operand after the prefix; a (1, C) operand
    _check([_step("Sub", 1, 0), _step("RealDiv", 2, -1), _step("Add", 0, -1)],
           [_hostile((1, c), np.float32), np.asarray(1.5, np.float32), full], folds=True)


def test_nothing_to_fold():
    shape = SHAPES[0]
    full = _hostile(shape, np.float16)
    # the prefix would be the whole chain (its broadcast view shapes the result): no fold
    _check([_step("Mul", 0, 1), _step("AddV2", -1, 1)],
           [_channel(shape, np.float16, True), np.asarray(2.0, np.float32)], folds=False)
    # the first step reads the full-size tensor: no prefix
    _check([_step("Mul", 0, 1), _step("AddV2", -1, 1)], [full, _channel(shape, np.float32, False)], folds=False)


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_inf_and_nan_in_the_folded_values_go_back_to_the_full_path(shape):
    full = _hostile(shape, np.float16, specials=False)
    c = shape[-1]
    zero_channel = np.broadcast_to(np.where(np.arange(c) % 3 == 0, np.float32(0), np.float32(0.5)), shape)
    # 1 / 0 = Inf in the folded value (times a zero of the full tensor: NaN, or saturated)
    _check([_step("RealDiv", 1, 0), _step("Mul", -1, 2)], [zero_channel, np.asarray(1.0, np.float32), full], folds=True)
    # a NaN and Infs in a channel operand
    _check(BN_GRAD, [_channel(shape, np.float16, True, specials=True), np.asarray(8.0, np.float32),
                     np.asarray(0.5, np.float16), full], folds=True)
    # a folded value that overflows float32
    _check(BN_GRAD, [_channel(shape, np.float32, False), np.asarray(1e-38, np.float32), np.asarray(3e38, np.float32),
                     full], folds=True)


@pytest.mark.parametrize("c", [np.float16(2), np.float32(3e38)], ids=["fp16", "float32-max"])
def test_an_inf_inside_the_prefix_made_finite_again_goes_back_to_the_full_path(c):
    # 1 / 0 = Inf, then c / Inf = 0: the prefix's last value is finite, its second step's was not; the kernel
    # checks every step (status 0x20, and saturation turns the Inf into FLT_MAX: c / FLT_MAX is not 0). Found by
    # session 17's review: the fold checked only its last value
    full = np.linspace(-3, 3, 8192).astype(np.float16).reshape(2, 4096)
    _check([_step("RealDiv", 0, 1), _step("RealDiv", 2, -1), _step("Mul", 3, -1)],
           [np.asarray(1, c.dtype), np.asarray(0, c.dtype), np.asarray(c), full], folds=True)


def test_an_outer_broadcast_of_small_inputs_computes_no_prefix(monkeypatch):
    # (4096, 1) + (1, 4096): both inputs small, the result full size; nothing is folded, so nothing is computed
    calls = []
    monkeypatch.setitem(nchain._FOLD, "add", lambda x, y: calls.append(1) or np.add(x, y))
    a = _hostile((4096, 1), np.float16)
    b = _hostile((1, 4096), np.float16)
    _check([_step("AddV2", 0, 1), _step("Mul", -1, 0)], [a, b], folds=False)
    assert calls == []
