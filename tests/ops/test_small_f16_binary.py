"""Small fp16 add / sub / mul / div in numpy (ops/math_ops._f16_small) against the vector kernel and the definition.

Every fp16 value (all 65,536 patterns, in chunks the path takes) meets scalars of every kind, a full-size random
operand and broadcast views, in the seven contexts: the bits, dtype, shape, view-ness and status are ``vector``'s (the
path switched off); where every result is finite under the default context, they are also the float64 result rounded
once to fp16 (the definition: float32 carries 2p + 2 bits, so its correctly rounded result rounded again to fp16 is
the correctly rounded fp16 result).
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.ops import math_ops
from ascend_emu.ops.registry import OpContext

H = np.float16
ALL = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(H)
SCALARS = np.array([0.0, -0.0, 1.0, -1.5, 3.0, 0.1, 1e-7, -6e-8, 65504.0, 2.0 ** -14, 255.9, np.inf, np.nan], H)
CONTEXTS = [{}, {"overflow_mode": "saturation"}, {"subnormals": "flush"}, {"ftz": True}, {"op_model": "exact"},
            {"op_model": "ascendc"}, {"op_model": "tbe_v220", "overflow_mode": "saturation"}]
FN = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "realdiv": np.divide}


def _both(monkeypatch, op, x, y, ctx_kw):
    ctx = OpContext(dtype="float16", **ctx_kw)
    got = math_ops.vec(ctx, op, x, y)
    with monkeypatch.context() as m:
        m.setattr(math_ops, "_f16_small", lambda *a: None)
        ref_ctx = OpContext(dtype="float16", **ctx_kw)
        want = math_ops.vec(ref_ctx, op, x, y)
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype == H and got.shape == want.shape
    assert np.array_equal(np.ascontiguousarray(got).view(np.uint16), np.ascontiguousarray(want).view(np.uint16))
    assert ctx.status == ref_ctx.status
    assert (0 in got.strides) == (0 in want.strides)
    return got, ctx.status


def _oracle(op, x, y):
    with np.errstate(all="ignore"):
        return FN[op](np.asarray(x, np.float64), np.asarray(y, np.float64)).astype(H)


@pytest.mark.parametrize("op", list(FN))
@pytest.mark.parametrize("ctx_kw", CONTEXTS, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "default")
def test_every_fp16_value_is_vectors(op, ctx_kw, monkeypatch):
    rng = np.random.default_rng(len(op) + 3 * len(ctx_kw))
    chunks = ALL.reshape(16, 4096) if not ctx_kw else ALL.reshape(16, 4096)[rng.choice(16, 3, replace=False)]
    for x in chunks:
        finite = x[np.isfinite(x)]
        for s in SCALARS if not ctx_kw else SCALARS[rng.choice(SCALARS.size, 4, replace=False)]:
            for a, b in ((x, np.array(s, H)), (np.array(s, H), x)):
                got, st = _both(monkeypatch, op, a, b, ctx_kw)
                if not ctx_kw and st == 0:
                    assert np.array_equal(got.view(np.uint16), _oracle(op, a, b).view(np.uint16))
        y = rng.permutation(finite)[:x.size]
        xs = x[:y.size]
        got, st = _both(monkeypatch, op, xs, y, ctx_kw)
        if not ctx_kw and st == 0:
            assert np.array_equal(got.view(np.uint16), _oracle(op, xs, y).view(np.uint16))


@pytest.mark.parametrize("op", list(FN))
def test_broadcast_views_and_sizes(op, monkeypatch):
    """Broadcast views (the global average pool's gradient: a BroadcastTo by a scalar) give vector's read-only view;
    more than 4,096 values go to vector (its chain kernel), and so does an overflow."""
    rng = np.random.default_rng(7)
    v = (rng.standard_normal((1, 1, 1, 32)) * 8).astype(H)
    cases = [(np.broadcast_to(v, (32, 16, 16, 32)), np.array(H(256.0))),
             (np.broadcast_to(v, (4, 3, 2, 32)),
              np.broadcast_to(np.array([3.0, 0.5, -2.0, 0.0], H).reshape(4, 1, 1, 1), (4, 1, 1, 32))),
             ((rng.standard_normal((65, 64)) * 4).astype(H), (rng.standard_normal(64) * 4).astype(H)),
             (np.full((8,), 60000.0, H), np.array(H(60000.0)))]
    for x, y in cases:
        for ctx_kw in CONTEXTS:
            _both(monkeypatch, op, x, y, ctx_kw)
    calls = []
    real = math_ops.vector
    monkeypatch.setattr(math_ops, "vector", lambda *a, **k: calls.append(1) or real(*a, **k))
    math_ops.vec(OpContext(dtype="float16"), op, *cases[0])
    assert calls == []
    math_ops.vec(OpContext(dtype="float16"), op, *cases[2])
    assert calls == [1]


@pytest.mark.parametrize("dt", ["float16", "float32"])
@pytest.mark.parametrize("kw", [dict(overflow_mode="bogus"), dict(impl_mode="bogus"), dict(op_model="bogus")])
def test_an_unknown_mode_in_the_context_is_refused_as_vector_refuses_it(dt, kw):
    """The fast paths take only contexts vector would take: an unknown mode raises there, as in vector."""
    from ascend_emu.errors import AscendEmuError

    a = np.ones(8, dt)
    with pytest.raises(AscendEmuError):
        math_ops.vec(OpContext(dtype=dt, **kw), "add", a, a)
