"""The one-pass kernel of standalone fp16 UB chains (numerics/chain.py, kernels/chain.py) against the path
it replaces (``_chain``'s float32 steps, then ``_round_to``), bit for bit and status for status, on hostile
data: NaN, Inf, signed zeros, fp16 and float32 subnormals, fp16 overflow of the result, float32 overflow
inside the chain, values on the fp16 rounding boundaries, in both overflow modes and both subnormal modes.
On finite data the one-pass kernel must be the path taken (so these tests see it), and wherever it cannot
promise the same bits it must hand the chain back.
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from ascend_emu.kernels import cast as _kc
from ascend_emu.numerics import chain as nchain
from ascend_emu.ops import OPS, OpContext
from ascend_emu.ops import fused_ops

pytestmark = pytest.mark.skipif(not _kc.HW_HALF, reason="the one-pass kernel needs hardware fp16 conversions")

rng = np.random.default_rng(20261125)


def _step(op, *args):
    return {"op": op, "args": list(args), "attrs": {}, "name": op.lower()}


BN_RELU = [_step("Mul", 0, 1), _step("AddV2", -1, 2), _step("Relu", -1)]
BN_GRAD = [_step("RealDiv", 0, 1), _step("Mul", 2, -1), _step("Mul", -1, 3)]
OTHERS = [_step("Sub", 1, 0), _step("BiasAdd", -1, 1), _step("Relu6", -1), _step("Div", -1, 2), _step("Add", -1, 0)]


def _run(chain, xs, **kw):
    ctx = OpContext(**kw)
    (y,) = OPS["_EltwiseChain"](*xs, ctx=ctx, chain=chain)
    return y, ctx.status


def _reference(chain, xs, **kw):
    """The path before the one-pass kernel: the float32 steps (numpy or the ops), one rounding."""
    ctx = OpContext(**kw)
    y = fused_ops._round_to(ctx, fused_ops._chain(ctx, None, xs, chain), ctx.dtype_name)
    return y, ctx.status


def _hostile(shape, dt, specials=False, scale=1.0, big=True):
    """Normal values mixed with signed zeros, subnormals of fp16 and of float32, and (if ``big``) values on
    fp16's rounding boundaries and at its largest; Inf and NaN too if ``specials``."""
    x = np.clip(rng.standard_normal(shape), -3.0, 3.0) * scale
    pick = rng.integers(0, 10, shape)
    x = np.where(pick == 1, rng.choice([0.0, -0.0], shape), x)
    x = np.where(pick == 2, rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-25, -14, shape)), x)  # fp16 subn.
    x = np.where(pick == 3, rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-149, -126, shape)), x)  # f32 subn.
    if big:
        x = np.where(pick == 4, rng.choice([65504.0, -65504.0, 65519.0, 0.5 + 2.0 ** -11, 1.0 + 2.0 ** -11], shape), x)
    if specials:
        x = np.where(pick == 5, rng.choice([np.inf, -np.inf, np.nan], shape), x)
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dt)


def _check(chain, xs, expect_fast=None):
    for ov in ("inf_nan", "saturation"):
        for sub in ("keep", "flush"):
            kw = dict(dtype="float16", overflow_mode=ov, subnormals=sub)
            got, st = _run(chain, xs, **kw)
            want, wst = _reference(chain, xs, **kw)
            assert got.dtype == want.dtype and got.shape == want.shape, (chain, kw)
            np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=f"{chain} {kw}")
            assert st == wst, (chain, kw)
    if expect_fast is not None:
        fast = fused_ops._chain_one_pass(OpContext(dtype="float16"), xs, chain)
        assert (fast is not None) == expect_fast


SHAPES = [(4, 16, 16, 16),      # one work item of whole blocks
          (8, 32, 32, 16),      # several work items (both threads)
          (5, 37, 48),          # a block of 21 channel rows, a partial last block
          (3, 2, 1500)]         # channels wider than a block


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dt", [np.float16, np.float32])
def test_finite_chains_take_the_one_pass_kernel_with_the_same_bits(shape, dt):
    c = shape[-1]
    # the results stay within fp16: largest inputs times factors below one, small addends
    small = dict(scale=0.3, big=False)   # |x| < 0.9
    cases = [
        (BN_RELU, [_hostile(shape, np.float16), _hostile((c,), np.float32, **small), _hostile((1, 1, c), dt, **small)]),
        (BN_GRAD, [_hostile(shape, np.float32), np.asarray(1024.0, np.float32), np.asarray(-2.5, dt),
                   _hostile(shape, np.float16, big=False)]),
        (OTHERS, [_hostile(shape, dt, big=False), _hostile((c,), np.float16), np.asarray([3.0], np.float32)]),
    ]
    for chain, xs in cases:
        _check(chain, xs, expect_fast=True)


def test_results_on_the_fp16_rounding_boundaries():
    # every fp16 pattern once, times one and halfway values between neighbours: the rounding of the
    # product by the hardware conversion against the cast kernel
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h)]
    x = np.concatenate([h.astype(np.float32), h.astype(np.float32) * np.float32(1.0 + 2.0 ** -11),
                        h.astype(np.float32) * np.float32(1.0 - 2.0 ** -12)])
    x = x[: x.size // 16 * 16].reshape(-1, 16)
    x = x[np.abs(x).max(axis=1) < 65504]
    _check([_step("Mul", 0, 1), _step("AddV2", -1, 2)], [x, np.ones(16, np.float32), np.zeros(16, np.float32)],
           expect_fast=True)


@pytest.mark.parametrize("chain", [BN_RELU, BN_GRAD, OTHERS], ids=["bn_relu", "bn_grad", "others"])
def test_inf_and_nan_anywhere_go_back_to_the_full_path(chain):
    shape = (4, 16, 16, 16)
    xs = {id(BN_RELU): [_hostile(shape, np.float16, True), _hostile((16,), np.float32, True),
                        _hostile((16,), np.float32)],
          id(BN_GRAD): [_hostile(shape, np.float32, True), np.asarray(0.0, np.float32), np.asarray(1.0, np.float32),
                        _hostile(shape, np.float16, True)],
          id(OTHERS): [_hostile(shape, np.float16, True), _hostile((16,), np.float16), np.asarray([0.0], np.float32)]}[id(chain)]
    _check(chain, xs, expect_fast=False)


def test_fp16_overflow_of_the_result_goes_back_to_the_full_path():
    xs = [_hostile((4, 16, 16, 16), np.float16, scale=2e4), np.full(16, 8.0, np.float32), np.zeros(16, np.float32)]
    _check(BN_RELU, xs, expect_fast=False)


def test_a_float32_overflow_hidden_by_a_later_step_still_raises_its_status():
    # the product overflows float32 to Inf, and 1 / Inf = 0 is finite: only the full path's per-step
    # status reports it
    big = np.full((4, 16, 16, 16), 3e38, np.float32)
    chain = [_step("Mul", 0, 1), _step("RealDiv", 2, -1)]
    xs = [big, np.full(16, 10.0, np.float32), np.asarray(1.0, np.float32)]
    _check(chain, xs, expect_fast=False)
    assert _run(chain, xs, dtype="float16")[1] != 0


def test_layouts_and_dtypes_it_does_not_take():
    full = _hostile((4, 16, 16, 16), np.float16)
    ctx = OpContext(dtype="float16")
    # a broadcast that is neither per channel nor one value, a float64 or bf16 input, a step it has not,
    # a bf16 or float32 result, flushed subnormals
    assert fused_ops._chain_one_pass(ctx, [full, _hostile((1, 16, 1, 16), np.float32)], [_step("Mul", 0, 1)]) is None
    assert fused_ops._chain_one_pass(ctx, [full, np.ones(16)], [_step("Mul", 0, 1)]) is None
    assert fused_ops._chain_one_pass(ctx, [full], [_step("Rsqrt", 0)]) is None
    assert fused_ops._chain_one_pass(OpContext(dtype="float32"), [full, full], [_step("Mul", 0, 1)]) is None
    assert fused_ops._chain_one_pass(OpContext(dtype="float16", subnormals="flush"), [full, full],
                                     [_step("Mul", 0, 1)]) is None
    # an input no step reads, a step reading the running value before there is one, too few elements
    assert nchain.chain_to_f16([full, full], [("mul", 0, 0)]) is None
    assert nchain.chain_to_f16([full], [("mul", -1, 0)]) is None
    assert nchain.chain_to_f16([full[:1, :1]], [("relu", 0, -2)]) is None
    assert nchain.chain_to_f16([full], [("relu", 0, -2)]) is not None


# ---------------------------------------------------------------- fp16 binary ops with a broadcast operand

def _vector_reference(op, a, b, **kw):
    nv = importlib.import_module("ascend_emu.numerics.vector")

    saved = dict(nv._ONE_PASS_F16)
    nv._ONE_PASS_F16.clear()
    try:
        return nv.vector(op, a, b, **kw)
    finally:
        nv._ONE_PASS_F16.update(saved)


def _check_binary_one_pass(op, finite, hostile, monkeypatch, expect_taken):
    """vector(op) on each pair of operands, in both overflow and subnormal modes, against the 16-bit
    kernels' bits and status; ``expect_taken(k)``: whether the finite pair k must take the one-pass kernel."""
    nv = importlib.import_module("ascend_emu.numerics.vector")
    taken = []
    real = nchain.chain_to_f16

    def spy(*a):
        y = real(*a)
        taken.append(y is not None)
        return y
    monkeypatch.setattr(nchain, "chain_to_f16", spy)
    for k, (a, b) in enumerate(finite + hostile):
        for ov in ("inf_nan", "saturation"):
            for sub in ("keep", "flush"):
                kw = dict(dtype="float16", overflow_mode=ov, subnormals=sub)
                taken.clear()
                got, st = nv.vector(op, a, b, **kw)
                want, wst = _vector_reference(op, a, b, **kw)
                assert got.shape == want.shape and got.dtype == want.dtype
                np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=f"{op} {k} {kw}")
                assert st == wst, (op, k, kw)
                if k < len(finite) and sub == "keep" and expect_taken(k):
                    assert taken == [True], (op, k, kw)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "realdiv", "maximum", "minimum", "squared_difference"])
def test_fp16_binary_ops_with_a_broadcast_operand(op, monkeypatch):
    shape = (6, 20, 20, 16)
    finite = [(_hostile(shape, np.float16, big=False), _hostile((1, 1, 1, 16), np.float32, big=False)),
              (_hostile((16,), np.float16, big=False), _hostile(shape, np.float16, big=False)),
              (_hostile(shape, np.float16, big=False), np.asarray(0.7, np.float32)),
              (_hostile(shape, np.float16, big=False), np.asarray([[1e-6]], np.float16))]
    hostile = [(_hostile(shape, np.float16, specials=True), _hostile((16,), np.float32, specials=True)),
               (_hostile(shape, np.float16), np.asarray(7e4, np.float32)),      # a cast overflow of the operand
               (_hostile(shape, np.float16), _hostile((16,), np.float16, scale=300.0))]
    # x / tiny overflows: a division takes the kernel only by the one-value operand 0.7
    _check_binary_one_pass(op, finite, hostile, monkeypatch, lambda k: op != "realdiv" or k == 2)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "maximum", "minimum"])
def test_fp16_binary_ops_with_an_operand_over_trailing_axes(op, monkeypatch):
    """An operand spanning the last two or three axes (an EinsumDense bias (heads, dim) over (batch, time, heads,
    dim), with or without leading ones, either side): one value per position of that block, the one-pass kernel
    where finite, the 16-bit kernels' bits and statuses either way; a block that is not trailing, or two
    different blocks, is not taken."""
    shape = (4, 40, 4, 8)   # above chain.MIN_ELEMENTS
    finite = [(_hostile(shape, np.float16, big=False), _hostile((4, 8), np.float16, big=False)),
              (_hostile((1, 4, 8), np.float32, big=False), _hostile(shape, np.float16, big=False)),
              (_hostile(shape, np.float16, big=False), _hostile((40, 4, 8), np.float16, big=False))]
    hostile = [(_hostile(shape, np.float16, specials=True), _hostile((4, 8), np.float16, specials=True)),
               (_hostile(shape, np.float16), _hostile((4, 8), np.float32, scale=3e4))]
    _check_binary_one_pass(op, finite, hostile, monkeypatch, lambda k: True)
    full = _hostile(shape, np.float16, big=False)
    assert nchain.chain_to_f16([full, _hostile((4, 1), np.float16)], [("add", 0, 1)]) is None
    assert nchain.chain_to_f16([full, _hostile((40, 1, 8), np.float16)], [("add", 0, 1)]) is None
    assert nchain.chain_to_f16([full, _hostile((4, 8), np.float16), _hostile((40, 4, 8), np.float16)],
                               [("add", 0, 1), ("add", -1, 2)]) is None


@pytest.mark.parametrize("op", ["add", "sub", "mul", "realdiv", "maximum", "minimum", "squared_difference"])
def test_fp16_binary_ops_on_operands_of_one_shape(op, monkeypatch):
    """Two full-size fp16 operands: the one-pass kernel where every value is finite, the 16-bit kernels
    (status, overflow mode) where not; the bits and statuses of the 16-bit kernels either way."""
    shape = (6, 20, 20, 16)
    finite = [(_hostile(shape, np.float16, big=False), _hostile(shape, np.float16, big=False))]
    hostile = [(_hostile(shape, np.float16, specials=True), _hostile(shape, np.float16, specials=True)),
               (_hostile(shape, np.float16), _hostile(shape, np.float16, scale=300.0))]
    _check_binary_one_pass(op, finite, hostile, monkeypatch, lambda k: op != "realdiv")   # x / tiny overflows


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_fp16_maximum_minimum_with_a_scalar_every_input(op, monkeypatch):
    """Every fp16 pattern against one-value operands (hardswish's 0 and 6, signed zeros, the extremes, a
    subnormal), either side, in both overflow modes: the float64 oracle's bits and status (tests/naive.py:
    NaN propagates, ties keep the first operand); the finite patterns in the one-pass kernel, all 65,536
    (NaN, Inf) back through the 16-bit kernel."""
    import naive
    nv = importlib.import_module("ascend_emu.numerics.vector")

    taken = []
    real = nchain.chain_to_f16

    def spy(*a):
        y = real(*a)
        taken.append(y is not None)
        return y
    monkeypatch.setattr(nchain, "chain_to_f16", spy)
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = every[np.isfinite(every.view(np.float16))]
    for s in (0.0, -0.0, 6.0, -3.0, 65504.0, -65504.0, 2.0 ** -24, 1.0 + 2.0 ** -10):
        one = np.asarray(s, np.float16)
        for bits in (finite, every):
            x = bits.view(np.float16)
            for pair in ((x, one), (one.reshape(1, 1), x.reshape(1, -1))):
                shape = np.broadcast_shapes(*(p.shape for p in pair))
                obits = [np.broadcast_to(p.view(np.uint16), shape) for p in pair]
                for ov in ("inf_nan", "saturation"):
                    taken.clear()
                    got, st = nv.vector(op, *pair, dtype="float16", overflow_mode=ov)
                    want, wst = naive.vector16(op, "float16", *obits, overflow_mode=ov)
                    eq = naive.bits_equal(got, want, "float16")
                    assert got.shape == shape and eq.all(), (op, s, ov, np.flatnonzero(~eq.ravel())[:5])
                    assert st == wst, (op, s, ov)
                    assert taken == [bits is finite], (op, s, ov, taken)


@pytest.mark.parametrize("n", [3, 4])
def test_fp16_add_n_in_one_pass_is_the_float32_sum(n, monkeypatch):
    """AddN of fp16 tensors (TBE add_n_compute): the float32 running sum rounded once, in one pass, against the
    float32 steps (ops._util.f32_steps, which take every set the one pass declines)."""
    from ascend_emu.ops._util import f32_steps

    taken = []
    real = nchain.chain_to_f16

    def spy(*a):
        y = real(*a)
        taken.append(y is not None)
        return y
    monkeypatch.setattr(nchain, "chain_to_f16", spy)
    shape = (6, 20, 20, 16)
    sets = [[_hostile(shape, np.float16, big=False) for _ in range(n)],              # finite: one pass
            [_hostile(shape, np.float16, specials=True) for _ in range(n)],           # Inf / NaN: the adds
            [np.full(shape, 4e4, np.float16) for _ in range(n)]]                       # the sums overflow fp16
    for k, xs in enumerate(sets):
        for ov in ("inf_nan", "saturation"):
            for sub in ("keep", "flush"):
                kw = dict(dtype="float16", overflow_mode=ov, subnormals=sub)
                taken.clear()
                ctx = OpContext(**kw)
                (got,) = OPS["AddN"](*xs, ctx=ctx)
                fast = list(taken)
                wctx = OpContext(**kw)

                def adds(st, *vs):
                    acc = vs[0]
                    for v in vs[1:]:
                        acc = st(acc + v)
                    return acc
                want = f32_steps(wctx, adds, *xs)
                np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=f"{k} {kw}")
                assert ctx.status == wctx.status
                # one try of the one pass under keep: taken for the finite set, declined for the others
                assert fast == ([k == 0] if sub == "keep" else [])


@pytest.mark.parametrize("op", ["add", "sub", "mul", "realdiv", "maximum", "minimum", "squared_difference"])
def test_every_finite_fp16_value_against_a_per_channel_operand(op):
    """Every finite fp16 pattern as the full operand, against per-channel fp16 operands chosen so that no
    result overflows (the one-pass kernel then takes the whole call): its bits against the 16-bit kernels'."""
    nv = importlib.import_module("ascend_emu.numerics.vector")
    a = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    a = a[np.isfinite(a)]
    if op == "squared_difference":
        a = a[np.abs(a) < 240]   # (240 + 15.5) ** 2 < 65504
    a = a[: a.size // 16 * 16].reshape(-1, 16)
    sub = np.float16(2.0 ** -24)
    chans = {"add": [-15.5, -1.0, -0.0, 0.0, sub, -sub, 0.333, 1e-3, 7.0, 2.0 ** -14, 0.5, -0.5, 3.0, 9.75, 1.0, 2.0],
             "mul": [-1.0, -0.0, 0.0, sub, -sub, 0.333, 1e-3, 0.999, 2.0 ** -14, 0.5, -0.5, 0.75, -0.9995, 1.0, 0.1, -0.25]}
    chans["sub"] = chans["add"]
    chans["squared_difference"] = chans["maximum"] = chans["minimum"] = chans["add"]
    chans["realdiv"] = [1.0, -1.0, 1.001, 3.0, -7.0, 1024.0, 65504.0, -2.5, 1.5, 10.0, 1.25, -1.125, 2.0, 4.0, 100.0, -3.0]
    b = np.asarray(chans[op], np.float16)
    for ov in ("inf_nan", "saturation"):
        kw = dict(dtype="float16", overflow_mode=ov)
        for x, y in ((a, b), (b, a)) if op != "realdiv" else ((a, b),):
            got, st = nv.vector(op, x, y, **kw)
            want, wst = _vector_reference(op, x, y, **kw)
            np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=f"{op} {ov}")
            assert st == wst == 0
    assert nchain.chain_to_f16([a, b], nv._ONE_PASS_F16[op]) is not None


def _readonly(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


def test_read_only_inputs_mixed_with_writable_ones():
    """Broadcast results, frozen constants and memory-mapped inputs are read-only; mixed with writable
    inputs they must take the one pass with the same bits (Numba once failed to type such a tuple)."""
    shape = (8, 32, 32, 16)
    c = shape[-1]
    small = dict(scale=0.3, big=False)
    xs = [_hostile(shape, np.float16), _readonly(_hostile((c,), np.float32, **small)),
          _readonly(_hostile((1, 1, c), np.float16, **small))]
    _check(BN_RELU, xs, expect_fast=True)
    xs = [_readonly(_hostile(shape, np.float32)), np.asarray(1024.0, np.float32), np.asarray(-2.5, np.float16),
          _hostile(shape, np.float16, big=False)]
    _check(BN_GRAD, xs, expect_fast=True)
    a, b = _hostile(shape, np.float16, big=False), _readonly(_hostile(shape, np.float16, big=False))
    y = nchain.chain_to_f16([a, b, a], [("add", 0, 1), ("add", -1, 2)])
    assert y is not None


# ---------------------------------------------------------------- the kernel's fused writes against numpy

def _oracle(xs, steps):
    """The chain by numpy, step by step in float32 (fp16 widened exactly, ``round16`` and the output by
    numpy's fp16 conversion, which rounds to nearest-even): None where the kernel must decline (a step result,
    a relu's operand or the fp16 output is Inf or NaN), else the fp16 bits."""
    with np.errstate(all="ignore"):
        vals = [np.broadcast_to(np.asarray(x).astype(np.float32), np.broadcast_shapes(*(x.shape for x in xs)))
                for x in xs]
        cur = None
        for name, a, b in steps:
            x = cur if a < 0 else vals[a]
            y = cur if b == -1 else (vals[b] if b >= 0 else None)
            if name in ("relu", "relu6"):
                if not np.isfinite(x).all():
                    return None
                v = np.minimum(x, np.float32(6)) if name == "relu6" else x
                cur = np.where(v > 0, v, np.float32(0)).astype(np.float32)
            elif name == "round16":
                cur = x.astype(np.float16).astype(np.float32)
            else:
                cur = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "realdiv": np.divide}[name](x, y)
            if not np.isfinite(cur).all():
                return None
        out = cur.astype(np.float16)
    return out.view(np.uint16) if np.isfinite(out).all() else None


@pytest.mark.parametrize("steps", [
    [("sub", 0, 1), ("round16", -1, -2), ("relu", -1, -2)],              # a rounding overflow a relu hides
    [("add", 0, 2), ("round16", -1, -2), ("realdiv", 2, -1)],            # ... that c / Inf = 0 hides
    [("add", 0, 1), ("round16", -1, -2)],                                # a rounding last
    [("add", 0, 1), ("round16", -1, -2), ("round16", -1, -2), ("mul", -1, 2)],
    [("relu6", 0, -2)],                                                  # a unary step on an input, last
    [("round16", 3, -2), ("add", 0, -1), ("round16", -1, -2), ("sub", -1, 1)],   # a float32 input rounded
    [("mul", 0, 1), ("add", -1, 2), ("relu", -1, -2)],
], ids=["relu_hides", "div_hides", "round_last", "two_rounds", "relu6_input", "f32_input", "bn_relu"])
def test_fused_writes_against_numpy(steps):
    """The last step writing the fp16 output and a following rounding taken into a step: the bits, and the
    hand-back wherever an unfused step would have seen an Inf or NaN, on values around fp16's overflow."""
    shape = (3, 33, 40, 16)
    used = {k for _, a, b in steps for k in (a, b) if k >= 0}
    declined = 0
    for trial in range(6):
        big = trial % 2 == 1
        # big: finite fp16 inputs (|x| <= 6e4) whose float32 sums and products overflow fp16 when rounded
        xs = [_hostile(shape, np.float16, specials=trial == 5, scale=2e4 if big else 1.0, big=big),
              _hostile((16,), np.float16, scale=2e4 if big else 1.0, big=big),
              np.asarray(30000.5 if big else 0.1, np.float32),   # no fp16 value: x + c is never 0
              _hostile(shape, np.float32, scale=7e4 if big else 1.0, big=big)]
        xs = [x for k, x in enumerate(xs) if k in used] if used != {0, 1, 2, 3} else xs
        remap = {k: i for i, k in enumerate(sorted(used))}
        prog = [(n, remap.get(a, a), remap.get(b, b)) for n, a, b in steps]
        want = _oracle(xs, prog)
        got = nchain.chain_to_f16(xs, prog)
        assert (got is None) == (want is None), (steps, trial)
        declined += want is None
        if want is not None:
            np.testing.assert_array_equal(got.view(np.uint16).reshape(-1), want.reshape(-1), err_msg=f"{steps} {trial}")
    assert 0 < declined < 6   # both outcomes seen
