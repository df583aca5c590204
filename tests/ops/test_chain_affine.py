"""The one-pass-per-element form of the fp16 chain kernel (``kernels/chain.affine_to_f16``, chosen by
``numerics/chain._affine_form``): BN's ``Mul, AddV2, Relu`` and the other chains of an optional multiplication, an
optional addition or subtraction (per-channel or one-value operands) on a full-size fp16 tensor, then a rounding to
fp16 and a square (SquaredDifference) or the addition of another full-size fp16 tensor (an AddN), then an optional
relu / relu6. Against an oracle written from the definition (each step one IEEE float32 operation as numpy computes it,
the fp16 result by numpy's round-to-nearest-even conversion, None wherever a step result, a relu's operand or the
fp16 output is Inf or NaN), on every finite fp16 value of the tensor, and against the step-by-step kernel it stands
in for.
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.kernels import cast as _kc
from ascend_emu.numerics import chain as nchain

pytestmark = pytest.mark.skipif(not _kc.HW_HALF, reason="the one-pass kernel needs hardware fp16 conversions")

C = 16
_BIN = {"add": np.add, "sub": np.subtract, "mul": np.multiply}


def _oracle(xs, steps):
    """fp16 bits of the chain computed step by step in float32 by numpy, or None where any step result, a relu's
    operand or the fp16 output is Inf or NaN."""
    shape = np.broadcast_shapes(*(np.shape(x) for x in xs))
    with np.errstate(all="ignore"):
        vals = [np.broadcast_to(np.asarray(x).astype(np.float32), shape) for x in xs]
        cur = None
        for name, a, b in steps:
            x = cur if a == -1 else vals[a]
            if name == "round16":
                cur = x.astype(np.float16).astype(np.float32)
            elif name in ("relu", "relu6"):
                if not np.isfinite(x).all():
                    return None
                v = np.minimum(x, np.float32(6)) if name == "relu6" else x
                cur = np.where(v > 0, v, np.float32(0)).astype(np.float32)
            else:
                cur = _BIN[name](x, cur if b == -1 else vals[b])
            if not np.isfinite(cur).all():
                return None
        out = cur.astype(np.float16)
    return out.view(np.uint16) if np.isfinite(out).all() else None


def _finite_fp16():
    """Every finite fp16 value once (63,488 patterns), as (3968, 16): each value meets one channel's operands (a
    special operand: 1/16 of the values)."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = bits[(bits & 0x7C00) != 0x7C00]
    return bits.view(np.float16).reshape(-1, C)


def _channel(dt, rng, scale):
    """Per-channel operands: normal values, signed zeros, an fp16 and a float32 subnormal, +-1."""
    v = rng.standard_normal(C) * scale
    v[:6] = [0.0, -0.0, 2.0 ** -20, -(2.0 ** -130), 1.0, -1.0]
    return v.astype(dt)


# (steps, inputs' roles): 0 the full-size fp16 tensor, 1 and 2 the small operands, 3 another full-size fp16 tensor
FORMS = [
    [("sub", 0, 2), ("round16", -1, -2), ("mul", -1, -1)],                      # SquaredDifference
    [("mul", 0, 1), ("add", -1, 2), ("round16", -1, -2), ("mul", -1, -1), ("relu6", -1, -2)],
    [("add", 0, 2), ("add", -1, 3)],                                            # an AddN
    [("mul", 1, 0), ("add", 3, -1), ("relu", -1, -2)],
    [("mul", 0, 1), ("add", -1, 2), ("relu", -1, -2)],      # BN's forward and the ReLU
    [("mul", 1, 0), ("add", 2, -1)],                        # the operands the other way round
    [("mul", 0, 1), ("sub", -1, 2), ("relu6", -1, -2)],
    [("add", 0, 2), ("relu", -1, -2)],                      # BiasAdd + Relu on the vector unit
    [("sub", 0, 2), ("relu6", -1, -2)],
    [("mul", 0, 1), ("relu", -1, -2)],
    [("mul", 0, 1)],                                        # one step: BN's gradient x * scale
    [("sub", 0, 2)],                                        # x - mean
    [("add", 2, 0)],                                        # a bias, the operands the other way round
    [("add", 2, 0), ("mul", -1, 1)],                        # not the form: the step-by-step kernel
    [("sub", 2, 0), ("relu", -1, -2)],                      # the running value second: not the form
    [("sub", 0, 2), ("round16", -1, -2), ("relu", -1, -2)],  # a rounding without the square: not the form
    [("add", 0, 3), ("relu", -1, -2)],                      # two full-size tensors first: not the form
]
IN_FORM = 13
IDS = ["sqdiff", "bn_square_relu6", "add_n", "mul_plus_relu", "bn_relu", "swapped", "sub_relu6", "add_relu",
       "sub_relu6_only", "mul_relu", "mul", "sub", "add", "not_add_mul", "not_rsub", "not_round_relu", "not_two_full"]


def _inputs(steps, x, p, q, z=None):
    used = sorted({k for _, a, b in steps for k in (a, b) if k >= 0})
    remap = {k: i for i, k in enumerate(used)}
    prog = [(n, remap.get(a, a), remap.get(b, b)) for n, a, b in steps]
    return [(x, p, q, z)[k] for k in used], prog


def _other(x, rng):
    """A second full-size fp16 tensor: ``x``'s values shuffled and scaled by 2^-8 (sums stay inside fp16)."""
    return (rng.permutation(x.reshape(-1)).astype(np.float32) / 256).astype(np.float16).reshape(x.shape)


@pytest.mark.parametrize("steps", FORMS, ids=IDS)
@pytest.mark.parametrize("dt", ["float16", "float32"])
def test_every_finite_fp16_value(steps, dt, monkeypatch):
    """Every finite fp16 value of the tensor through the chain with per-channel operands of either dtype (and
    one-value ones, and a broadcast view): the oracle's bits; the form takes the one-pass kernel, the rest the
    step-by-step one, and both give the same bits."""
    rng = np.random.default_rng(46)
    x = _finite_fp16()
    if any(name == "round16" for name, _, _ in steps):
        # squares stay inside fp16: every fp16 value of magnitude below 128 (45,056 patterns)
        x = x.reshape(-1)[np.abs(x.reshape(-1).astype(np.float32)) < 128].reshape(-1, C)
    p, q = _channel(dt, rng, 0.5), _channel(dt, rng, 2.0)
    z = _other(x, rng)
    in_form = steps in FORMS[:IN_FORM]
    calls = []
    real = nchain._kch.affine_to_f16
    monkeypatch.setattr(nchain._kch, "affine_to_f16", lambda *a: calls.append(1) or real(*a))
    for p_, q_ in ((p, q), (np.asarray(p[7]), np.asarray(q[9])), (np.broadcast_to(p, x.shape), q)):
        xs, prog = _inputs(steps, x, p_, q_, z)
        want = _oracle(xs, prog)
        assert want is not None
        got = nchain.chain_to_f16(xs, prog)
        np.testing.assert_array_equal(got.view(np.uint16).reshape(-1), want.reshape(-1), err_msg=str(steps))
        with monkeypatch.context() as m:
            m.setattr(nchain, "_affine_form", lambda *a: None)
            step = nchain.chain_to_f16(xs, prog)
        np.testing.assert_array_equal(step.view(np.uint16), got.view(np.uint16))
    # a lone step by one value takes the step-by-step kernel (faster there); by a per-channel vector the one pass
    assert len(calls) == ((2 if len(steps) == 1 else 3) if in_form else 0)


@pytest.mark.parametrize("steps", FORMS[:IN_FORM], ids=IDS[:IN_FORM])
def test_a_partial_last_block(steps, monkeypatch):
    """A tensor whose size is no multiple of the kernel's 2,048-value block (63,440 values, the last block 2,000;
    44,008 with the squares, the last block 1,000):
    the oracle's bits from the one-pass kernel."""
    rng = np.random.default_rng(11)
    x = _finite_fp16()
    if any(name == "round16" for name, _, _ in steps):
        x = x[np.abs(x.astype(np.float32)).max(axis=1) < 128]
    x = x[:-3]
    assert x.size % 2048
    p, q = _channel(np.float32, rng, 0.5), _channel(np.float32, rng, 2.0)
    calls = []
    real = nchain._kch.affine_to_f16
    monkeypatch.setattr(nchain._kch, "affine_to_f16", lambda *a: calls.append(1) or real(*a))
    xs, prog = _inputs(steps, x, p, q, _other(x, rng))
    want = _oracle(xs, prog)
    got = nchain.chain_to_f16(xs, prog)
    assert want is not None and calls == [1]
    np.testing.assert_array_equal(got.view(np.uint16).reshape(-1), want.reshape(-1), err_msg=str(steps))


@pytest.mark.parametrize("steps", FORMS[:IN_FORM], ids=IDS[:IN_FORM])
def test_inf_nan_and_overflow_hand_the_chain_back(steps):
    """An Inf or NaN in the tensor or an operand, a float32 product or sum that overflows, an fp16 result that
    overflows (a relu would not hide an Inf before it): None, as the oracle says, where the relu and relu6 would
    make every output finite."""
    rng = np.random.default_rng(7)
    base = (rng.standard_normal((8, 32, C)) * 3).astype(np.float16)
    p, q = _channel(np.float32, rng, 0.5), _channel(np.float32, rng, 2.0)
    cases = []
    for special in (np.inf, -np.inf, np.nan):
        x = base.copy()
        x[3, 5, 2] = special
        cases.append((x, p, q))
        pp = p.copy()
        pp[4] = special
        cases.append((base, pp, q))
        qq = q.copy()
        qq[11] = special
        cases.append((base, p, qq))
    big = base.copy()
    big[1, 1, 1] = 60000.0
    cases.append((big, np.full(C, 3e34, np.float32), q))        # float32 overflow of the product
    cases.append((big, np.full(C, 2.0, np.float32), q))         # fp16 overflow of the result
    low = base.copy()
    low[1, 1, 1] = -60000.0
    cases.append((low, np.full(C, 5e33, np.float32), np.full(C, -3.4e38, np.float32)))  # a finite product (-3e38),
    #                                                           # a sum of -6.4e38: -Inf (relu would make it 0)
    z = _other(base, rng)
    zz = z.copy()
    zz[2, 2, 2] = np.nan
    cases.append((base, p, q, zz))                              # a NaN in the second tensor
    cases.append((base * np.float16(60), p, q, z))              # squares overflow fp16 at the rounding's square
    seen = 0
    for x, p_, q_, *rest in cases:
        xs, prog = _inputs(steps, x, p_, q_, rest[0] if rest else z)
        want = _oracle(xs, prog)
        got = nchain.chain_to_f16(xs, prog)
        assert (got is None) == (want is None), (steps, x.max(), p_, q_)
        if want is not None:
            np.testing.assert_array_equal(got.view(np.uint16).reshape(-1), want.reshape(-1))
        seen += want is None
    assert seen >= 6
