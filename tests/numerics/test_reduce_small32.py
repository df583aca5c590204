"""Small float32 sums and means in numpy (numerics/reduction._small_sum32) against the definition, bit for bit.

The oracle is NUMERICS.md's reduction written out on numpy float32 scalars: each output's elements in row-major
order over the reduced axes, the first element then one float32 addition per further element; TBE's mean (the
default op model) multiplies every element by the float32 1/n first, Ascend C's multiplies the sum by it, the exact
model divides the sum by n. A result that is Inf or NaN is the kernel's business (its status and overflow mode):
there the fast path must hand over and give what the row kernel gives.
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.kernels import reduce as kr
from ascend_emu.kernels import reduce_lead as krl
from ascend_emu.numerics import reduction
from ascend_emu.numerics.reduction import reduce

rng = np.random.default_rng(20261207)


def _oracle(op, x, axis, op_model):
    """(float32 array of the kept shape, status) from the definition, on numpy float32 scalars."""
    nd = x.ndim
    axes = tuple(range(nd)) if axis is None else tuple(sorted(a % nd for a in ((axis,) if np.isscalar(axis)
                                                                             else axis)))
    kept = tuple(d for d in range(nd) if d not in axes)
    x2 = np.transpose(x, kept + axes).reshape(int(np.prod([x.shape[d] for d in kept])), -1)
    n = x2.shape[1]
    cof = np.float32(1.0) / np.float32(n)
    out, bad = [], False
    with np.errstate(all="ignore"):
        for row in x2:
            first = op == "mean" and op_model in ("tbe_v220", "tbe_v100")
            acc = np.float32(row[0] * cof) if first else np.float32(row[0])
            for v in row[1:]:
                acc = np.float32(acc + (np.float32(v * cof) if first else v))
            if op == "mean" and op_model == "exact":
                acc = np.float32(acc / np.float32(n))
            elif op == "mean" and op_model == "ascendc":
                acc = np.float32(acc * cof)
            bad |= not np.isfinite(acc)
            out.append(acc)
    return np.array(out, np.float32).reshape([x.shape[d] for d in kept]), 0x20 if bad else 0


def _data(shape, kind):
    if kind == "normal":
        return (rng.standard_normal(shape) * 3).astype(np.float32)
    # wide: every float32 exponent, subnormals and signed zeros; sums that cancel and sums that overflow
    x = rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-149, 127.99, shape))
    x = np.asarray(x, np.float32)
    x[rng.random(shape) < 0.05] = -0.0
    return x


CASES = [((), None), ((), ()), ((1,), 0), ((32,), 0), ((32,), None), ((32, 10), 0), ((32, 10), 1), ((32, 10), -1),
         ((32, 10), (0, 1)), ((2, 3, 4), (0, 2)), ((2, 3, 4), (1,)), ((5, 7, 3), (0, 1)), ((4096,), 0),
         ((64, 64), (1,))]


@pytest.mark.parametrize("op_model", ["tbe_v220", "ascendc", "exact"])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_small_sums_match_the_definition(op, op_model):
    for kind in ("normal", "wide"):
        for shape, axis in CASES:
            for _ in range(2):
                x = _data(shape, kind)
                ref0, rst = _oracle(op, x, axis, op_model)
                for keep in (False, True):
                    y, st = reduce(op, x, axis=axis, keepdims=keep, dtype="float32", op_model=op_model)
                    ref = ref0
                    if keep:
                        ax = range(x.ndim) if axis is None else ((axis,) if np.isscalar(axis) else axis)
                        ref = np.expand_dims(ref, tuple(a % max(x.ndim, 1) for a in ax)) if x.ndim else ref
                    assert y.dtype == np.float32 and y.shape == ref.shape, (shape, axis, keep)
                    assert st == rst, (shape, axis, kind)
                    if rst == 0:
                        assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), (shape, axis, kind, x)


def test_inf_and_nan_results_are_the_kernels(monkeypatch):
    """An overflowing sum or a NaN input goes to the row kernel: its status, its saturation."""
    x = np.array([[3e38, 3e38, 1.0], [1.0, 2.0, np.nan], [1.0, 2.0, 3.0]], np.float32)
    fast = [reduce("sum", x, axis=1, dtype="float32", overflow_mode=m) for m in ("inf_nan", "saturation")]
    monkeypatch.setattr(reduction, "SMALL", 0)
    slow = [reduce("sum", x, axis=1, dtype="float32", overflow_mode=m) for m in ("inf_nan", "saturation")]
    for (a, sa), (b, sb) in zip(fast, slow):
        assert sa == sb == 0x20
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert fast[1][0][0] == np.finfo(np.float32).max and fast[1][0][1] == 0.0


def test_the_fast_path_runs_no_kernel_and_keeps_its_bounds(monkeypatch):
    """Finite small float32 sums never reach the row kernel; flushed subnormals, max, a split launch and more than
    SMALL elements do."""
    calls = []
    real = kr.reduce_f32
    monkeypatch.setattr(kr, "reduce_f32", lambda *a: calls.append(1) or real(*a))
    # the sum over the leading axis would take the leading-axes kernel: spied on too
    real_lead = krl.reduce_lead_f32
    monkeypatch.setattr(krl, "reduce_lead_f32", lambda *a: calls.append(2) or real_lead(*a))
    x = _data((32, 10), "normal")
    reduce("sum", x, axis=0, dtype="float32")
    reduce("mean", x, axis=1, dtype="float32")
    assert calls == []
    reduce("sum", x, axis=1, dtype="float32", subnormals="flush")
    reduce("max", x, axis=1, dtype="float32")
    reduce("sum", _data((reduction.SMALL + 1,), "normal"), axis=0, dtype="float32")
    assert len(calls) == 3
    monkeypatch.setattr(reduction, "SMALL", 0)
    reduce("sum", x, axis=0, dtype="float32")   # the spy sees the leading-axes kernel when the fast path is off
    assert calls[3:] == [2]
