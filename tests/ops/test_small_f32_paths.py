"""The small float32 paths of the Keras step's BN and loss nodes: ``_EltwiseChain`` on small float32 operands in one
go (ops/fused_ops._chain_small_f32: add, sub, mul, div, relu, relu6 and the sourced Rsqrt) and DivNoNan's TBE
instructions in numpy (ops/activation_grad_ops._div_no_nan_small_f32). Each gives the bits, dtype, shape and status
of the op-by-op path (the path switched off) on hostile data (Inf, NaN, -0, float32 subnormals, zeros, negative
Rsqrt inputs, results that overflow) under every context that must decline it (flushed subnormals, cce_ftz,
saturation, the exact op model's Rsqrt); and, where taken, an independent oracle: each float32 instruction as the
float64 result rounded once to float32 (exact for + - * / sqrt: float64 holds the result to within a rounding that
cannot create a float32 tie)."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.ops import activation_grad_ops, fused_ops
from ascend_emu.ops.registry import OpContext

F = np.float32


def _hostile(rng, shape, positive=False):
    x = np.asarray(rng.standard_normal(shape).astype(F) * F(2.0) ** rng.integers(-140, 100, shape).astype(F), F)
    if positive:
        x = np.asarray(np.abs(x), F)
    flat = x.reshape(-1)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 1.1754942e-38, 3.4028235e38, -1.0], F)
    if flat.size > 1:
        idx = rng.integers(0, flat.size, max(1, flat.size // 8))
        flat[idx] = special[rng.integers(0, special.size, idx.size)]
    return x


def _finite(rng, shape, positive=False, lo=-20, hi=20):
    x = np.asarray(rng.standard_normal(shape).astype(F) * F(2.0) ** rng.integers(lo, hi, shape).astype(F), F)
    return np.asarray(np.abs(x), F) if positive else x   # 0-d: an array, as the replay hands them over


def _step(op, *args):
    return {"op": op, "args": list(args), "attrs": {}, "name": op.lower()}


#: the chains of the Keras CNN's BN (variance + eps, then Rsqrt; mean * scale subtracted from the offset) and others
CHAINS = {
    "add_rsqrt": ([_step("AddV2", 0, 1), _step("Rsqrt", -1)], lambda rng, f: (f(rng, (16,), True), np.array(F(1e-3)))),
    "mul_sub": ([_step("Mul", 0, 1), _step("Sub", 2, -1)],
                lambda rng, f: (f(rng, (32,)), f(rng, (32,)), f(rng, (32,)))),
    "div_mul_relu": ([_step("RealDiv", 0, 1), _step("Mul", -1, 2), _step("Relu", -1)],
                     lambda rng, f: (f(rng, (4, 8)), f(rng, (8,)), f(rng, ()))),
    "rsqrt_div_relu6": ([_step("Rsqrt", 0), _step("RealDiv", 1, -1), _step("Relu6", -1)],
                        lambda rng, f: (f(rng, (5,), True), f(rng, (3, 5)))),
    "scalars": ([_step("Mul", 0, 1), _step("Rsqrt", -1), _step("Sub", -1, 2), _step("Relu", -1), _step("Relu6", -1)],
                lambda rng, f: (f(rng, (), True), f(rng, (), True), f(rng, ()))),
}
CONTEXTS = [{}, {"overflow_mode": "saturation"}, {"subnormals": "flush"}, {"ftz": True}, {"op_model": "exact"},
            {"op_model": "ascendc"}, {"op_model": "tbe_v220", "overflow_mode": "saturation"}]


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype == F and a.shape == b.shape
    assert np.array_equal(np.ascontiguousarray(a).view(np.uint32), np.ascontiguousarray(b).view(np.uint32))


def _chain_both(monkeypatch, xs, chain, ctx_kw):
    ctx = OpContext(dtype="float32", **ctx_kw)
    got = fused_ops.eltwise_chain(*xs, ctx=ctx, chain=chain)
    with monkeypatch.context() as m:
        m.setattr(fused_ops, "_chain_small_f32", lambda *a: None)
        ref_ctx = OpContext(dtype="float32", **ctx_kw)
        want = fused_ops.eltwise_chain(*xs, ctx=ref_ctx, chain=chain)
    return got, ctx.status, want, ref_ctx.status


@pytest.mark.parametrize("name", CHAINS)
@pytest.mark.parametrize("ctx_kw", CONTEXTS, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "default")
def test_small_chain_is_the_op_by_op_path(name, ctx_kw, monkeypatch):
    chain, make = CHAINS[name]
    rng = np.random.default_rng(len(name) * 31 + len(ctx_kw))
    for f in (_hostile, _finite, _hostile, _finite):
        got, st, want, want_st = _chain_both(monkeypatch, make(rng, f), chain, ctx_kw)
        _same(got, want)
        assert st == want_st


def _oracle_chain(xs, chain):
    """Each step in float64 rounded once to float32 (Rsqrt: the float32 sqrt, then 1 / it)."""
    v = None
    r = lambda z: np.asarray(z, np.float64).astype(F)  # noqa: E731
    for step in chain:
        a = [v if k == -1 else xs[k] for k in step["args"]]
        a64 = [np.asarray(z, np.float64) for z in a]
        op = step["op"]
        if op == "Rsqrt":
            v = r(1.0 / r(np.sqrt(a64[0])).astype(np.float64))
        elif op == "Relu":
            v = r(np.where(a64[0] > 0, a64[0], 0.0))
        elif op == "Relu6":
            v = r(np.where(a64[0] > 0, np.minimum(a64[0], 6.0), 0.0))
        else:
            v = r({"AddV2": np.add, "Sub": np.subtract, "Mul": np.multiply, "RealDiv": np.divide}[op](*a64))
    return v


@pytest.mark.parametrize("name", CHAINS)
def test_small_chain_taken_and_oracle(name, monkeypatch):
    chain, make = CHAINS[name]
    rng = np.random.default_rng(7)
    xs = make(rng, _finite)
    calls = []
    monkeypatch.setattr(fused_ops, "_chain", lambda *a: calls.append(a))
    ctx = OpContext(dtype="float32", op_model="tbe_v100")
    got = fused_ops.eltwise_chain(*xs, ctx=ctx, chain=chain)
    assert calls == [] and ctx.status == 0
    _same(got, _oracle_chain(xs, chain))


def _div_both(monkeypatch, x, y, ctx_kw):
    ctx = OpContext(dtype="float32", **ctx_kw)
    got = activation_grad_ops.div_no_nan(x, y, ctx=ctx)
    with monkeypatch.context() as m:
        m.setattr(activation_grad_ops, "_div_no_nan_small_f32", lambda *a: None)
        ref_ctx = OpContext(dtype="float32", **ctx_kw)
        want = activation_grad_ops.div_no_nan(x, y, ctx=ref_ctx)
    return got, ctx.status, want, ref_ctx.status


@pytest.mark.parametrize("ctx_kw", CONTEXTS, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "default")
def test_small_div_no_nan_is_the_op_by_op_path(ctx_kw, monkeypatch):
    rng = np.random.default_rng(11 + len(ctx_kw))
    zeros = np.array([0.0, -0.0, 1e-45, -3e-39, 1.0, 2.0], F)
    pairs = [(_hostile(rng, (40,)), _hostile(rng, (40,))), (_finite(rng, (6,)), zeros),
             (_finite(rng, ()), np.array(F(0))), (_finite(rng, ()), _finite(rng, ())),
             (np.float32(3.5), np.float32(32.0)), (_finite(rng, (3, 4)), _finite(rng, (4,))),
             (np.full(3, 3e38, F), np.full(3, 1e-3, F))]
    for x, y in pairs:
        got, st, want, want_st = _div_both(monkeypatch, x, y, ctx_kw)
        _same(got, want)
        assert st == want_st


def test_small_div_no_nan_taken_and_oracle(monkeypatch):
    """div_no_nan.py's float32 instructions, each the float64 result rounded once: idx = min(|y|, 2^-126) 2^38 2^44
    2^44; x / (y + (idx - 1)) * idx."""
    rng = np.random.default_rng(5)
    x = _finite(rng, (64,))
    y = _finite(rng, (64,), lo=-90, hi=20)
    y[:4] = [0.0, -0.0, 1e-45, -1e-40]
    import ascend_emu.ops.math_ops as math_ops
    calls = []
    real = math_ops.vec
    monkeypatch.setattr(math_ops, "vec", lambda *a, **k: calls.append(a) or real(*a, **k))
    ctx = OpContext(dtype="float32", op_model="tbe_v220")
    got = activation_grad_ops.div_no_nan(x, y, ctx=ctx)
    assert calls == [] and ctx.status == 0
    r = lambda z: np.asarray(z, np.float64).astype(F).astype(np.float64)  # noqa: E731
    idx = r(r(r(np.minimum(np.abs(y.astype(np.float64)), 2.0 ** -126) * 2.0 ** 38) * 2.0 ** 44) * 2.0 ** 44)
    q = r(x.astype(np.float64) / r(y.astype(np.float64) + r(idx - 1.0)))
    _same(got, r(q * idx).astype(F))
    assert np.all(got[y == 0] == 0)


#: float32 binary ops with broadcast-view operands (BN's gradient ``mean_grad / n`` on a BroadcastTo): ops/math_ops.vec
#: computes them on the views' distinct values (``_f32_on_distinct``) instead of through ``vector``'s dispatch
_VIEWS = {
    "view_by_scalar": lambda rng, f: (np.broadcast_to(f(rng, (1, 1, 1, 16)), (4, 5, 3, 16)), f(rng, ())),
    "scalar_by_view": lambda rng, f: (f(rng, ()), np.broadcast_to(f(rng, (16,)), (6, 16))),
    "two_views": lambda rng, f: (np.broadcast_to(f(rng, (3, 1)), (3, 8)), np.broadcast_to(f(rng, (1, 8)), (3, 8))),
    "view_and_full": lambda rng, f: (np.broadcast_to(f(rng, (8,)), (5, 8)), f(rng, (5, 8))),
}


@pytest.mark.parametrize("op", ["add", "sub", "mul", "realdiv"])
@pytest.mark.parametrize("name", _VIEWS)
@pytest.mark.parametrize("ctx_kw", CONTEXTS, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "default")
def test_broadcast_view_binary_is_vectors_path(op, name, ctx_kw, monkeypatch):
    from ascend_emu.ops import math_ops

    rng = np.random.default_rng(len(name) * 7 + len(op) + len(ctx_kw))
    for f in (_hostile, _finite, _hostile, _finite):
        x, y = _VIEWS[name](rng, f)
        ctx = OpContext(dtype="float32", **ctx_kw)
        got = math_ops.vec(ctx, op, x, y)
        with monkeypatch.context() as m:
            m.setattr(math_ops, "_f32_on_distinct", lambda *a: None)
            ref_ctx = OpContext(dtype="float32", **ctx_kw)
            want = math_ops.vec(ref_ctx, op, x, y)
        _same(got, want)
        assert ctx.status == ref_ctx.status
        assert (0 in np.asarray(got).strides) == (0 in np.asarray(want).strides)
        if f is _finite and not ctx_kw.get("ftz") and ctx_kw.get("subnormals") != "flush":
            # the oracle: the float64 operation rounded once to float32, element by element
            fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "realdiv": np.divide}[op]
            _same(got, fn(np.asarray(x, np.float64), np.asarray(y, np.float64)).astype(F))


def test_broadcast_view_binary_skips_vector(monkeypatch):
    """Finite float32 operands with a broadcast view never reach ``vector``; a result no smaller than the output
    does."""
    from ascend_emu.ops import math_ops

    calls = []
    real = math_ops.vector
    monkeypatch.setattr(math_ops, "vector", lambda *a, **k: calls.append(1) or real(*a, **k))
    rng = np.random.default_rng(5)
    x = np.broadcast_to(_finite(rng, (1, 16)), (64, 16))
    math_ops.vec(OpContext(dtype="float32"), "realdiv", x, _finite(rng, ()))
    assert calls == []
    math_ops.vec(OpContext(dtype="float32"), "mul", x, _finite(rng, (64, 16)))
    assert calls == [1]
