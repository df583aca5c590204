"""Broadcast views (np.broadcast_to, the BroadcastTo op's output): numerics.vector, numerics.cast and the
one-pass chain compute on their distinct values. Each against the path it replaces, the same call on the
view copied out to a contiguous array: bits, statuses and shapes, on hostile data (NaN, Inf, -0,
subnormals, overflow, saturation mode, several broadcast shapes)."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.numerics import cast, vector
from ascend_emu.numerics.chain import chain_to_f16
from ascend_emu.ops import OPS
from ascend_emu.ops.registry import OpContext

rng = np.random.default_rng(7)
SHAPE = (4, 6, 5, 16)
BIG = (8, 8, 8, 16)   # past numerics.chain.MIN_ELEMENTS: the one-pass kernel runs


def _hostile(shape, dtype):
    """Normals across the range (products and sums that overflow fp16 and float32), subnormals of both
    formats, signed zeros, Inf and NaN (quiet and signalling payloads)."""
    v = rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-30, 20, shape))
    flat = v.reshape(-1)
    k = max(1, flat.size // 8)
    flat[rng.choice(flat.size, k, replace=False)] = rng.choice(
        [np.inf, -np.inf, np.nan, -0.0, 0.0, 65504.0, 7e4, 3e-8, -6e-5, 1e-40, 3e38], k)
    with np.errstate(over="ignore"):
        a = v.astype(dtype)
    if dtype == np.float32 and a.size > 3:
        a.reshape(-1).view(np.uint32)[:2] = (0x7F800001, 0xFFA00000)   # signalling NaNs
    return a


def _same(got, want):
    (g, gs), (w, ws) = got, want
    assert g.shape == w.shape and g.dtype == w.dtype and gs == ws
    np.testing.assert_array_equal(np.ascontiguousarray(g).view(np.uint8), w.view(np.uint8))


# (the compact operand shape, the shape it is broadcast to)
VIEWS = [((1, 1, 1, 16), SHAPE), ((16,), SHAPE), ((), SHAPE), ((4, 1, 1, 16), SHAPE), ((1, 6, 1, 1), SHAPE)]
MODES = [dict(overflow_mode=o, subnormals=s) for o in ("inf_nan", "saturation") for s in ("keep", "flush")]


@pytest.mark.parametrize("small,full", VIEWS)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "realdiv", "squared_difference", "maximum", "neg", "sqrt",
                                "rsqrt", "exp", "relu", "select"])
def test_vector_on_broadcast_views_equals_it_on_their_copies(small, full, dtype, op):
    for src in (np.float16, np.float32):
        a = np.broadcast_to(_hostile(small, src), full)
        b = np.broadcast_to(_hostile((1, 1, 1, 16), np.float32), full)   # both operands views
        c = _hostile((16,), np.float16)                                    # a view and a small operand
        for mode in MODES:
            if op in ("neg", "sqrt", "rsqrt", "exp", "relu"):
                calls = [(a,)]
            elif op == "select":
                cond = np.broadcast_to(rng.random(small) < 0.5, full)
                calls = [(cond, a, b), (cond, c, a)]
            else:
                calls = [(a, b), (b, a), (a, c), (c, a)]
            for args in calls:
                got = vector(op, *args, dtype=dtype, **mode)
                want = vector(op, *(np.ascontiguousarray(x) for x in args), dtype=dtype, **mode)
                _same(got, want)
                assert not got[0].flags.writeable   # a view of the distinct values' result


@pytest.mark.parametrize("small,full", VIEWS)
@pytest.mark.parametrize("src,dst", [("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32"),
                                     ("float32", "float64"), ("float16", "bfloat16")])
def test_cast_of_a_broadcast_view_equals_the_cast_of_its_copy(small, full, src, dst):
    a = np.broadcast_to(_hostile(small, np.dtype(src)), full)
    for mode in MODES:
        for rounding in ("rint", "round", "trunc"):
            _same(cast(a, dst, rounding, **mode), cast(np.ascontiguousarray(a), dst, rounding, **mode))


def test_views_of_nothing_and_views_that_repeat_nothing():
    """An empty broadcast and a view whose zero strides repeat nothing (length-1 axes) take the plain path."""
    empty = np.broadcast_to(np.float32(3e38), (0, 16))
    _same(vector("mul", empty, np.float32(10), dtype="float32"), vector("mul", np.zeros((0, 16), np.float32),
                                                                        np.float32(10), dtype="float32"))
    one = np.broadcast_to(np.float32([7e4]), (1, 1))
    _same(cast(one, "float16"), cast(np.ascontiguousarray(one), "float16"))


@pytest.mark.parametrize("layout", [(1, 1, 1, 16), (), (8, 1, 1, 16)])
def test_one_pass_chain_reads_a_broadcast_view_as_its_copy(layout):
    """chain_to_f16 with a view operand (per channel, one value, or a shape it must copy out) against the
    same chain on the copy; an Inf in a step gives None on both."""
    x = (rng.standard_normal(BIG) * 3).astype(np.float16)
    ran = 0
    for v in (_hostile(layout, np.float32), (rng.standard_normal(layout) * 3).astype(np.float32)):
        view = np.broadcast_to(v, BIG)
        for steps in ([("sub", 0, 1)], [("realdiv", 1, 0), ("round16", -1, -2), ("mul", -1, -1)],
                      [("add", 0, 1), ("relu", -1, -2)]):
            got = chain_to_f16([x, view], steps)
            want = chain_to_f16([x, np.ascontiguousarray(view)], steps)
            assert (got is None) == (want is None)
            if got is not None:
                ran += 1
                np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert ran >= 2


def test_broadcast_to_op_gives_a_view_that_ops_read_as_its_copy():
    """The BroadcastTo op's view through AddN (the one-pass chain), RealDiv, Sub and ReluGrad (the ops of a BN
    gradient), against the same ops on the copied-out tensor, statuses included."""
    x, y = _hostile(BIG, np.float16), (rng.standard_normal(BIG)).astype(np.float16)
    tame = (rng.standard_normal(BIG)).astype(np.float16)
    for mean in (_hostile((1, 1, 1, 16), np.float32), rng.standard_normal((1, 1, 1, 16)).astype(np.float32)):
        view = OPS["BroadcastTo"](mean, np.array(BIG, np.int32), ctx=OpContext(dtype="float32"))[0]
        assert view.shape == BIG and 0 in view.strides and not view.flags.writeable
        full = np.ascontiguousarray(view)
        for mode, a in [(m, x) for m in MODES] + [(MODES[0], tame)]:
            for op, args in (("AddN", lambda v: (a, cast(v, "float16")[0], y)),
                             ("RealDiv", lambda v: (v, np.float32(3))),
                             ("Sub", lambda v: (a, cast(v, "float16")[0])),
                             ("ReluGrad", lambda v: (cast(v, "float16")[0], a))):
                c1, c2 = OpContext(dtype="float16", **mode), OpContext(dtype="float16", **mode)
                got = OPS[op](*args(view), ctx=c1)[0]
                want = OPS[op](*args(full), ctx=c2)[0]
                assert c1.status == c2.status, (op, mode)
                np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8), want.view(np.uint8))
