"""The float32 Mul handed an fp16 input (``OpDef.reads_half``: the device defers its widening cast) against the route
it replaces: the cast (``numerics.vector.cast``, the op's modes) then ``math_ops.vec`` on float32, bits, dtype, shape
and status, on hostile fp16 patterns (every class: NaN, Inf, -0, subnormals, 65504) times hostile float32 values
(underflow to subnormal and zero, overflow, 0, -0, Inf, NaN), in both overflow modes, both subnormal modes, cce_ftz
and the op models; the one-pass kernel (``kernels/scale16.py``, fp16 tensor times a 0-d float32) also against an
oracle: the float64 product (exact: 11 x 24 bits) rounded once to float32."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.kernels import scale16
from ascend_emu.numerics.vector import cast
from ascend_emu.ops import math_ops
from ascend_emu.ops.registry import OPS, OpContext

F = np.float32
CONTEXTS = [{}, {"overflow_mode": "saturation"}, {"subnormals": "flush"}, {"ftz": True}, {"op_model": "exact"},
            {"op_model": "ascendc"}, {"impl_mode": "high_performance"}]
_IDS = lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "default"   # noqa: E731
SCALES = [1 / 1024, 2.0 ** -24, 2.0 ** -140, 2.0 ** -149, 2.0 ** 110, 2.0 ** 127, 3.4028235e38, 0.0, -0.0, -1.5,
          0.3, np.inf, -np.inf, np.nan]


def _half(rng, shape, special=True):
    """fp16 values: random patterns (every class, NaN and Inf among them when ``special``) and finite normals."""
    bits = rng.integers(0, 1 << 16, shape, dtype=np.uint16)
    if not special:
        bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits).astype(np.uint16)
    x = bits.view(np.float16).copy()
    flat = x.reshape(-1)
    if flat.size > 4:
        flat[:4] = np.array([0.0, -0.0, 65504.0, 6e-8], np.float16)
    return x


def _old(ctx_kw, x, y):
    """The route before: each fp16 input cast to float32 as the device inserts it, then vec in float32."""
    ctx = OpContext(dtype="float32", **ctx_kw)
    a, b = ((cast(v, "float32", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals)[0]
             if v.dtype == np.float16 else v) for v in (x, y))
    return math_ops.vec(ctx, "mul", a, b), ctx.status


def _new(ctx_kw, x, y):
    ctx = OpContext(dtype="float32", **ctx_kw)
    (out,) = OPS["Mul"](x, y, ctx=ctx)
    return out, ctx.status


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype == F and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert np.array_equal(np.ascontiguousarray(a).view(np.uint32), np.ascontiguousarray(b).view(np.uint32))


def test_mul_reads_half():
    assert OPS["Mul"].reads_half


@pytest.mark.parametrize("ctx_kw", CONTEXTS, ids=_IDS)
@pytest.mark.parametrize("special", [True, False])
@pytest.mark.parametrize("shape", [(512, 64), (37,), (), (1,)])
def test_half_times_scalar(ctx_kw, special, shape):
    rng = np.random.default_rng(hash((shape, special)) % 1000)
    x = _half(rng, shape, special)
    for s in SCALES:
        y = np.array(s, F)
        out, st = _new(ctx_kw, x, y)
        ref, rst = _old(ctx_kw, x, y)
        _same(out, ref)
        assert st == rst, (s, st, rst)


@pytest.mark.parametrize("ctx_kw", CONTEXTS, ids=_IDS)
def test_other_operands(ctx_kw):
    """fp16 on the right, both fp16, fp16 times a float32 array, a non-contiguous fp16: the cast, then vec."""
    rng = np.random.default_rng(7)
    x = _half(rng, (64, 32))
    h = _half(rng, (64, 32))
    f = (rng.standard_normal((64, 32)) * 2.0 ** rng.integers(-140, 120, (64, 32))).astype(F)
    for a, b in [(np.array(0.25, F), x), (x, h), (x, f), (f, x), (x[:, ::2], np.array(3.0, F)),
                 (x, np.array([0.5], F))]:
        out, st = _new(ctx_kw, a, b)
        ref, rst = _old(ctx_kw, a, b)
        _same(out, ref)
        assert st == rst


def test_kernel_against_oracle(monkeypatch):
    """The one pass (taken: counted) against the float64 product rounded once, finite products; an Inf or NaN
    product makes it decline (the vector op runs)."""
    calls = []
    real = scale16.widen_mul

    def spy(*a):
        calls.append(1)
        return real(*a)
    monkeypatch.setattr(scale16, "widen_mul", spy)
    rng = np.random.default_rng(11)
    x = _half(rng, (256, 33), special=False)
    for s in [1 / 1024, 2.0 ** -24, 2.0 ** -140, 2.0 ** -149, -1.5, 0.3, 0.0, -0.0, 2.0 ** 100]:
        y = np.array(s, F)
        out, st = _new({}, x, y)
        want = (x.astype(np.float64) * np.float64(F(s))).astype(F)
        _same(out, want)
        assert st == 0
    assert len(calls) == 9
    for both in [(False, True), (True, False)]:
        # each kernel (the CPU's conversion and the integer widening) on its own
        for hw in both:
            fn = scale16._widen_mul_f32_hw if hw else scale16.widen_mul_f32
            if hw and not scale16.HW_HALF:
                continue
            o = np.empty(x.size, F)
            assert fn(x.view(np.uint16).reshape(-1), F(0.3), o)
            _same(o.reshape(x.shape), (x.astype(np.float64) * np.float64(F(0.3))).astype(F))
    o = np.empty(x.size, F)
    assert not scale16.widen_mul(x.view(np.uint16).reshape(-1), F(2.0 ** 127), o)
    x2 = x.copy()
    x2.reshape(-1)[5] = np.float16(np.nan)
    assert not scale16.widen_mul(x2.view(np.uint16).reshape(-1), F(1.0), np.empty(x.size, F))


@pytest.mark.parametrize("hw", [False, True])
def test_each_kernel_reports_a_non_finite_product(hw):
    """Review (session 20): both kernels called directly, whichever the host picks: an overflowing product, a NaN
    input and an Inf input make them report False; finite products True, each the float32 product."""
    from ascend_emu.kernels import cast as kc
    from ascend_emu.kernels import scale16

    if hw and not kc.HW_HALF:
        pytest.skip("no hardware fp16 conversion on this host")
    fn = scale16._widen_mul_f32_hw if hw else scale16.widen_mul_f32
    x = np.array([1.0, -2.5, 6e-8, -0.0, 65504.0], np.float16)
    out = np.empty(x.size, np.float32)
    assert fn(x.view(np.uint16), np.float32(0.75), out)
    np.testing.assert_array_equal(out.view(np.uint32), (x.astype(np.float32) * np.float32(0.75)).view(np.uint32))
    assert not fn(x.view(np.uint16), np.float32(2.0 ** 127), out)       # 65504 * 2^127 overflows float32
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[2] = bad
        assert not fn(y.view(np.uint16), np.float32(0.75), out)
