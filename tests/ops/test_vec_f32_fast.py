"""ops.math_ops.vec's float32 fast path (add, sub, mul, realdiv of two float32 arrays, subnormals kept, no broadcast
view): the bits, dtype, shape and status numerics.vector.vector gives, on hostile data (Inf, NaN, -0, float32
subnormals, results that overflow, 0-d arrays, broadcasting, strided and zero-stride views) and under every context
that must decline it (flushed subnormals, the SoC's cce_ftz, saturation); and against an independent oracle, the
float64 result rounded once to float32 (exact for + - * /: float64 holds every such result to within a rounding
that cannot create a float32 tie)."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.numerics.vector import vector
from ascend_emu.ops import math_ops
from ascend_emu.ops.registry import OpContext

OPS = ["add", "sub", "mul", "realdiv"]
_NP64 = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "realdiv": np.divide}


def _hostile(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(2.0) ** rng.integers(-130, 128, shape)
    flat = x.reshape(-1)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 3.4028235e38,
                        -3.4028235e38, 1.0, -1.0], np.float32)
    if flat.size:
        idx = rng.integers(0, flat.size, min(flat.size, 24))
        flat[idx] = special[rng.integers(0, special.size, idx.size)]
    return x


def _pairs(rng):
    yield _hostile(rng, (257,)), _hostile(rng, (257,))
    yield _hostile(rng, (4, 33)), _hostile(rng, (33,))                       # broadcast by numpy
    yield _hostile(rng, ()), _hostile(rng, ())                               # 0-d
    yield _hostile(rng, (16,)), np.array(np.float32(3.0))                     # a 0-d operand
    yield _hostile(rng, (8, 6)).T, _hostile(rng, (6, 8))                     # strided
    yield np.broadcast_to(_hostile(rng, (5,)), (7, 5)), _hostile(rng, (7, 5))  # a zero-stride view
    yield np.full(9, 3e38, np.float32), np.full(9, 3e38, np.float32)         # every sum overflows
    yield (rng.standard_normal(64) * 1e-39).astype(np.float32), rng.standard_normal(64).astype(np.float32)


def _ctx(**kw):
    return OpContext(dtype="float32", **kw)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("ctx_kw", [{}, {"overflow_mode": "saturation"}, {"subnormals": "flush"}, {"ftz": True},
                                    {"overflow_mode": "saturation", "op_model": "tbe_v100"}])
def test_vec_fast_path_is_vector(op, ctx_kw):
    rng = np.random.default_rng(len(op) * 7 + len(ctx_kw))
    for x, y in _pairs(rng):
        ctx = _ctx(**ctx_kw)
        got = math_ops.vec(ctx, op, x, y)
        sub = "flush" if ctx.ftz and op in math_ops.FTZ_OPS else ctx.subnormals
        want, st = vector(op, x, y, dtype="float32", overflow_mode=ctx.overflow_mode, subnormals=sub,
                          impl_mode=ctx.impl_mode, op_model=ctx.op_model)
        assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(np.ascontiguousarray(got).view(np.uint32), np.ascontiguousarray(want).view(np.uint32))
        assert ctx.status == st


@pytest.mark.parametrize("op", OPS)
def test_vec_fast_path_taken_and_oracle(op, monkeypatch):
    """Finite results on plain float32 arrays never reach vector, and are the float64 result rounded once."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4096) * 2.0 ** rng.integers(-60, 60, 4096)).astype(np.float32)
    y = (rng.standard_normal(4096) * 2.0 ** rng.integers(-60, 60, 4096)).astype(np.float32)
    x[:5] = [0.0, -0.0, 1e-45, -1e-40, 1.0]
    y[:5] = [-2.0, 2.0, 3.0, 1e-41, -4.0]
    calls = []
    monkeypatch.setattr(math_ops, "vector", lambda *a, **k: calls.append(a) or vector(*a, **k))
    ctx = _ctx()
    got = math_ops.vec(ctx, op, x, y)
    assert calls == [] and ctx.status == 0
    with np.errstate(all="ignore"):
        oracle = _NP64[op](x.astype(np.float64), y.astype(np.float64)).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), oracle.view(np.uint32))
    # an Inf result: vector's kernel (its status and overflow mode)
    big = np.full(3, 3e38, np.float32)
    other = {"add": big, "sub": -big, "mul": big, "realdiv": np.full(3, 1e-30, np.float32)}[op]
    math_ops.vec(_ctx(), op, big, other)
    assert len(calls) == 1
