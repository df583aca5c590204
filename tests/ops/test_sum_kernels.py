"""Ops that add several values, as their CANN kernels order and round the adds, bit for bit.

AddN: TBE add_n_compute (canndev ops/built-in/tbe/impl/dynamic/add_n.py): fp16 and bf16 inputs cast to float32
(the 910 and 910B have a float32 vadd), vadd in input order, one cast back (nearest-even); the oracle below is that
list written in numpy float32.
"""
import numpy as np
import pytest

from ascend_emu.numerics.policy import bfloat16
from ascend_emu.ops import OpContext, run_op

F32 = np.float32
EVERY16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)


def _add_n_oracle(xs, dtype):
    with np.errstate(all="ignore"):
        acc = xs[0].astype(F32)
        sums = [acc]
        for x in xs[1:]:
            acc = (acc + x.astype(F32)).astype(F32)
            sums.append(acc)
        out = acc.astype(dtype)
    return out, any((~np.isfinite(s)).any() for s in sums) or bool((~np.isfinite(out)).any())


def _same16(ours, ref):
    ours, ref = ours.view(np.uint16), ref.view(np.uint16)
    nan = lambda b: ((b & 0x7FFF) > 0x7C00) if ref.dtype == np.uint16 else None   # noqa: E731
    no, nr = nan(ours), nan(ref)
    np.testing.assert_array_equal(no, nr)
    np.testing.assert_array_equal(ours[~no], ref[~nr])


def test_add_n_fp16_every_pattern():
    """Every fp16 pattern as the first of three and of five inputs (the others random, some large): the float32 sum
    rounded once, bits (NaN matching NaN) and status; large arrays take the chain kernel, small ones the steps."""
    r = np.random.default_rng(41)
    x0 = EVERY16.view(np.float16)
    for n in (3, 5):
        others = [(r.standard_normal(65536) * np.exp2(r.integers(-20, 15, 65536))).astype(np.float16)
                  for _ in range(n - 1)]
        for size in (65536, 100):
            xs = [x0[:size]] + [o[:size] for o in others]
            ctx = OpContext(dtype="float16")
            (ours,) = run_op("AddN", *xs, ctx=ctx)
            ref, bad = _add_n_oracle(xs, np.float16)
            assert ours.dtype == np.float16
            _same16(ours, ref)
            assert bool(ctx.status & 0x20) == bad


def test_add_n_rounds_once_not_per_add():
    """1 + 2^-11 + 2^-11: rounding each partial sum to fp16 gives 1 (two ties to even), the float32 sum 1 + 2^-10."""
    xs = [np.array([1.0], np.float16), np.array([2.0 ** -11], np.float16), np.array([2.0 ** -11], np.float16)]
    (y,) = run_op("AddN", *xs, ctx=OpContext(dtype="float16"))
    assert y[0] == np.float16(1 + 2.0 ** -10)


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_add_n_bf16_and_overflow(mode):
    """bf16: the same float32 sum rounded once; a float32 sum past the 16-bit range overflows at the cast (status,
    then the overflow mode)."""
    r = np.random.default_rng(42)
    xs = [(r.standard_normal(4096) * 100).astype(bfloat16) for _ in range(4)]
    (y,) = run_op("AddN", *xs, ctx=OpContext(dtype="bfloat16", overflow_mode=mode))
    ref, _ = _add_n_oracle(xs, bfloat16)
    np.testing.assert_array_equal(y.view(np.uint16), ref.view(np.uint16))
    big = [np.full(3, 60000, np.float16)] * 3
    ctx = OpContext(dtype="float16", overflow_mode=mode)
    (z,) = run_op("AddN", *big, ctx=ctx)
    assert ctx.status & 0x20 and (np.isinf(z).all() if mode == "inf_nan" else (z == 65504).all())
