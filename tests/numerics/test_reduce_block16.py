"""fp16 reductions in float32 over a block of axes, widened by the CPU (kernels/reduce_lead.py's
``reduce_lead_f16_hw``, taken by numerics.reduce) against the path it replaces: the widening cast and
the float32 reduction of the widened array, bit for bit, statuses included, on hostile data."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.kernels import cast as kc
from ascend_emu.kernels import reduce_lead as krl
from ascend_emu.numerics import cast, reduce

pytestmark = pytest.mark.skipif(not kc.HW_HALF, reason="the kernel needs hardware fp16 conversions")
rng = np.random.default_rng(20261125)


def _hostile(shape, nan_columns=0):
    """fp16 values of every kind but NaN: normals up to 65504 (float32 sums that overflow only in fp16
    terms, products that overflow float32), subnormals, signed zeros, Inf of both signs; then signalling
    and quiet NaNs of several payloads in ``nan_columns`` columns (the last axis)."""
    bits = rng.integers(0, 1 << 16, shape).astype(np.uint16) & np.uint16(0xFBFF)   # no Inf/NaN
    flat = bits.reshape(-1)
    sub = rng.random(flat.size) < 0.1
    flat[sub] &= np.uint16(0x83FF)               # subnormals and signed zeros
    flat[rng.random(flat.size) < 0.002] = 0x7C00   # +Inf
    flat[rng.random(flat.size) < 0.002] = 0xFC00   # -Inf
    x = bits.view(np.float16)
    for c in range(nan_columns):
        col = x[..., c].reshape(-1).view(np.uint16)
        k = rng.choice(col.size, max(1, col.size // 7), replace=False)
        col[k] = rng.choice([0x7C01, 0xFD23, 0x7E00, 0x7DFF, 0xFE01], k.size).astype(np.uint16)
        x[..., c] = col.view(np.float16).reshape(x[..., c].shape)
    return x


def _tiny(shape):
    """fp16 subnormals and signed zeros only: their float32 sums and means are exact and small, so a
    dropped or flushed subnormal shows."""
    return (rng.integers(0, 1 << 16, shape).astype(np.uint16) & np.uint16(0x83FF)).view(np.float16)


def _finite(shape):
    """Ordinary activations: the case the fast path is for (no Inf or NaN anywhere)."""
    return (rng.standard_normal(shape) * 4).astype(np.float16)


CASES = [((6, 5, 7, 16), (0, 1, 2)), ((3, 4, 5, 32), (1, 2)), ((2, 3, 4, 5, 6), (1, 2)), ((7, 9, 3), (0,)),
         ((5, 8, 3), (0, 1)), ((1, 1, 1, 16), (0, 1, 2)), ((4, 1, 1, 8), (1, 2)), ((300, 600), (0,)),
         # BN's sums over N, H, W of 16 channels and a global average pool's over H, W (the kernel's four-row passes)
         ((16, 8, 9, 16), (0, 1, 2)), ((9, 6, 7, 32), (1, 2))]


def _compare(x, axes, op, op_model, ov, keep):
    kw = dict(axis=axes, dtype="float32", op_model=op_model, keepdims=keep, overflow_mode=ov)
    got, st = reduce(op, x, **kw)
    want, wst = reduce(op, cast(x, "float32")[0], **kw)   # the widening cast, then the float32 reduction
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{op} {axes} {kw}")
    assert st == wst, (op, axes, kw)


@pytest.mark.parametrize("shape,axes", CASES)
@pytest.mark.parametrize("data", ["finite", "tiny", "hostile", "nans"])
def test_block_reduction_equals_the_reduction_of_the_widened_array(shape, axes, data):
    x = {"finite": _finite, "tiny": _tiny, "hostile": _hostile, "nans": lambda s: _hostile(s, nan_columns=2)}[data](shape)
    for op in ("sum", "mean", "prod"):
        for op_model in ("tbe_v220", "ascendc", "exact"):
            for ov in ("inf_nan", "saturation"):
                _compare(x, axes, op, op_model, ov, keep=op_model == "exact")


def test_a_lone_signalling_nan_comes_out_as_the_cast_gives_it():
    """One element per output: the sum is that element, a signalling NaN as the widening cast keeps it
    (the CPU's conversion would quieten it; the wrapper falls back to the exact kernel)."""
    x = _finite((1, 1, 1, 16))
    x.view(np.uint16)[0, 0, 0, 3] = 0x7C01
    x.view(np.uint16)[0, 0, 0, 9] = 0xFD23
    for ov in ("inf_nan", "saturation"):
        _compare(x, (0, 1, 2), "sum", "tbe_v220", ov, keep=True)
        _compare(x, (0, 1, 2), "prod", "tbe_v220", ov, keep=False)


def test_the_fast_kernel_runs_on_finite_data_and_declines_nans(monkeypatch):
    """The comparisons above test the fast kernel: it runs (and answers) on NaN-free data, over leading
    axes and over a middle block, and answers -1 (fall back) when a result is NaN."""
    calls = []
    real = krl.reduce_lead_f16_hw

    def spy(*args):
        calls.append(real(*args))
        return calls[-1]
    monkeypatch.setattr(krl, "reduce_lead_f16_hw", spy)
    reduce("mean", _finite((4, 6, 6, 16)), axis=(0, 1, 2), dtype="float32")
    reduce("sum", _hostile((4, 6, 6, 16)), axis=(1, 2), dtype="float32")
    reduce("sum", _hostile((4, 6, 6, 16), nan_columns=1), axis=(0, 1, 2), dtype="float32")
    reduce("sum", _finite((4, 6, 6, 16)), axis=(0, 1, 2), dtype="float32", subnormals="flush")   # declined
    reduce("max", _finite((4, 6, 6, 16)), axis=(0, 1, 2), dtype="float32")                      # declined
    assert len(calls) == 3 and calls[0] == 0 and calls[1] >= 0 and calls[2] == -1
