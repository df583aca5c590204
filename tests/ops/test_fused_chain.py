"""The numpy evaluation of UB fusion chains (ops/fused_ops.py ``_chain_numpy``) against the chain's own ops.

The fast evaluation must give the bits and status of running every step through its registered op
(``numerics.vector.vector`` in float32) and rounding once: on finite data it is the same numpy
arithmetic, and anything else (an Inf or NaN anywhere, flushed subnormals, another kind of step) falls
back to the ops themselves.
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.ops import OPS, OpContext
from ascend_emu.ops import fused_ops

rng = np.random.default_rng(1125)


def _run(chain, xs, monkeypatch=None, **ctx_kw):
    ctx = OpContext(**ctx_kw)
    (y,) = OPS["_EltwiseChain"](*xs, ctx=ctx, chain=chain)
    return y, ctx.status


def _reference(chain, xs, monkeypatch, **ctx_kw):
    with monkeypatch.context() as m:
        m.setattr(fused_ops, "_chain_numpy", lambda *a: None)
        return _run(chain, xs, **ctx_kw)


def _step(op, *args):
    return {"op": op, "args": list(args), "attrs": {}, "name": op.lower()}


BN_RELU = [_step("Mul", 0, 1), _step("AddV2", -1, 2), _step("Relu", -1)]
BN_GRAD = [_step("RealDiv", 0, 1), _step("Mul", 2, -1), _step("Mul", -1, 3)]
OTHERS = [_step("Sub", 1, 0), _step("BiasAdd", -1, 1), _step("Relu6", -1), _step("Mul", -1, 2)]


def _data(kind, shape, dt):
    if kind == "normal":
        x = rng.standard_normal(shape) * 3
    elif kind == "tiny":   # fp16 subnormals and signed zeros
        x = rng.choice([-1.0, 1.0, 0.0, -0.0], shape) * np.exp2(rng.uniform(-24, -12, shape))
    else:                  # products overflow fp16 and float32 sums of them stay finite
        x = rng.uniform(-6e4, 6e4, shape)
    return np.asarray(x).astype(dt)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("kind", ["normal", "tiny", "big"])
def test_chains_match_their_ops(dtype, kind, monkeypatch):
    dt = np.float16 if dtype == "float16" else np.float32
    big = (4, 16, 16, 16)   # 16384 elements: the 16-bit inputs widen through the cast kernel
    cases = [
        (BN_RELU, [_data(kind, big, dt), _data("normal", (16,), dt), _data(kind, (16,), dt)]),
        (BN_GRAD, [_data(kind, big, dt), np.asarray(1.0 / 1024, dt), np.asarray(-2.5, dt), _data("normal", big, dt)]),
        (OTHERS, [_data(kind, big, dt), _data(kind, (16,), dt), _data("normal", (1, 16, 1, 16), dt)]),
    ]
    for chain, xs in cases:
        for ov in ("inf_nan", "saturation"):
            for sub in ("keep", "flush"):
                kw = dict(dtype=dtype, overflow_mode=ov, subnormals=sub)
                got, st = _run(chain, xs, **kw)
                want, wst = _reference(chain, xs, monkeypatch, **kw)
                assert got.dtype == want.dtype and got.shape == want.shape
                np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"{chain} {kw}")
                assert st == wst


def test_non_finite_steps_fall_back_to_the_ops(monkeypatch):
    x = _data("normal", (3, 5, 16), np.float16)
    x[0, 0, :4] = [np.inf, -np.inf, np.nan, 0.0]
    xs = [x, _data("normal", (16,), np.float16), _data("normal", (16,), np.float16)]
    assert fused_ops._chain_numpy(OpContext(dtype="float16"), None, xs, BN_RELU) is None
    for ov in ("inf_nan", "saturation"):
        got, st = _run(BN_RELU, xs, dtype="float16", overflow_mode=ov)
        want, wst = _reference(BN_RELU, xs, monkeypatch, dtype="float16", overflow_mode=ov)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
        assert st == wst != 0


def test_an_overflow_hidden_by_a_later_step_still_raises_its_status(monkeypatch):
    """-Inf made by a mul and turned into 0 by a relu, an Inf divisor making 0: the ops' status and bits."""
    big = np.full((2, 16), 1e30, np.float32)
    x = _data("normal", (2, 16), np.float32)
    chains = [
        ([_step("Mul", 0, 1), _step("Relu", -1)], [-big, big]),
        ([_step("Mul", 0, 1), _step("RealDiv", 2, -1)], [big, big, x]),
        ([_step("Mul", 0, 1), _step("Mul", -1, 2), _step("Sub", -1, 2), _step("Relu", -1)], [big, big, x]),
    ]
    for chain, xs in chains:
        for ov in ("inf_nan", "saturation"):
            got, st = _run(chain, xs, dtype="float16", overflow_mode=ov)
            want, wst = _reference(chain, xs, monkeypatch, dtype="float16", overflow_mode=ov)
            np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
            assert st == wst != 0


def test_only_known_steps_take_the_numpy_path():
    xs = [_data("normal", (2, 16), np.float32)]
    assert fused_ops._chain_numpy(OpContext(), None, xs, [_step("Relu", 0)]) is not None
    assert fused_ops._chain_numpy(OpContext(), None, xs, [_step("Exp", 0)]) is None
    assert fused_ops._chain_numpy(OpContext(subnormals="flush"), None, xs, [_step("Relu", 0)]) is None
    for op in fused_ops._NUMPY_STEPS:   # each is the vector unit's op of that name
        assert OPS[op].eltwise in ("add", "sub", "mul", "realdiv", "relu", "relu6")
