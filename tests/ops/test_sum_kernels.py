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


def _cumsum16_oracle(x, exclusive=False, reverse=False):
    """CumsumComputer._cal_data (canndev dynamic/cum_computer.py) on fp16 along the last axis: the first element
    copied, then vadd(last_res, x) in fp16, each running sum the exact sum rounded once (float64 then fp16)."""
    y = x[..., ::-1] if reverse else x
    out = np.empty(y.shape, np.float16)
    acc = y[..., 0].copy()
    out[..., 0] = 0 if exclusive else acc
    bad = False
    with np.errstate(all="ignore"):
        for i in range(1, y.shape[-1]):
            if exclusive:
                out[..., i] = acc
            acc = (acc.astype(np.float64) + y[..., i].astype(np.float64)).astype(np.float16)
            bad |= bool((~np.isfinite(acc)).any())
            if not exclusive:
                out[..., i] = acc
    return (out[..., ::-1] if reverse else out), bad


@pytest.mark.parametrize("exclusive,reverse", [(False, False), (True, False), (False, True), (True, True)])
def test_cumsum_fp16_is_the_fp16_running_sum(exclusive, reverse):
    """TBE Cumsum on fp16 (910, 910B): every fp16 pattern as the middle of three-element rows (the others random),
    and rows of 300 random values: bits (NaN matching NaN) and status against the fp16 adds one by one."""
    r = np.random.default_rng(43)
    rows = np.stack([r.standard_normal(65536).astype(np.float16), EVERY16.view(np.float16),
                     (r.standard_normal(65536) * 1000).astype(np.float16)], axis=1)
    long = (r.standard_normal((64, 300)) * np.exp2(r.integers(-8, 8, (64, 300)))).astype(np.float16)
    for x in (rows, long):
        ctx = OpContext(dtype="float16")
        (ours,) = run_op("Cumsum", x, np.int32(1), ctx=ctx, exclusive=exclusive, reverse=reverse)
        ref, bad = _cumsum16_oracle(x, exclusive, reverse)
        _same16(ours, ref)
        assert bool(ctx.status & 0x20) == bad


def test_cumsum_fp16_rounds_every_step_and_other_models_do_not():
    """2048 ones: the fp16 running sum sticks at 2048 (2048 + 1 is a tie to even); the float32 sum of the 950's
    kernel (op_model ascendc) and of op_model exact reaches 4096 at the end."""
    x = np.ones((1, 4096), np.float16)
    (tbe,) = run_op("Cumsum", x, np.int32(1), ctx=OpContext(dtype="float16"))
    (ac,) = run_op("Cumsum", x, np.int32(1), ctx=OpContext(dtype="float16", op_model="ascendc"))
    assert tbe[0, -1] == 2048 and ac[0, -1] == 4096
    f = np.random.default_rng(44).standard_normal((8, 50)).astype(F32)
    (c32,) = run_op("Cumsum", f, np.int32(1), ctx=OpContext(dtype="float32"))
    np.testing.assert_array_equal(c32, np.cumsum(f, axis=1, dtype=F32))     # numpy's cumsum is sequential


def test_tensor_scatter_add_fp16_adds_each_update_in_fp16():
    """TensorScatterAdd = TensorMove + ScatterNdAdd (canndev scatter_nd_add.py: vec_add of each update into var in
    var's dtype): fp16 rows with repeated indices against the adds one by one in index order (each the exact sum
    rounded once to fp16), bits and status; 1 + 2^-11 + 2^-11 stays 1."""
    r = np.random.default_rng(45)
    t = (r.standard_normal((40, 6)) * 10).astype(np.float16)
    idx = r.integers(0, 40, (300, 1)).astype(np.int32)
    upd = (r.standard_normal((300, 6)) * np.exp2(r.integers(-12, 4, (300, 6)))).astype(np.float16)
    upd[7] = np.float16(60000)
    want = t.copy()
    bad = False
    with np.errstate(all="ignore"):
        for k in range(300):
            want[idx[k, 0]] = (want[idx[k, 0]].astype(np.float64) + upd[k].astype(np.float64)).astype(np.float16)
            bad |= bool((~np.isfinite(want[idx[k, 0]])).any())
    ctx = OpContext(dtype="float16")
    (ours,) = run_op("TensorScatterAdd", t, idx, upd, ctx=ctx)
    _same16(ours, want)
    assert bool(ctx.status & 0x20) == bad
    one = np.ones((1, 1), np.float16)
    (y,) = run_op("TensorScatterAdd", one, np.zeros((2, 1), np.int32), np.full((2, 1), 2.0 ** -11, np.float16),
                  ctx=OpContext(dtype="float16"))
    assert y[0, 0] == 1
