"""Float32 reductions over leading axes (kernels/reduce_lead.py) against the row kernel, bit for bit.

``reduce_lead_f32`` on (inner, rows) must give what ``reduce_f32`` gives on the transposed copy
(rows, inner): same order of float32 steps per output, same mean scaling, same final check. The
wrapper takes it for a float32 reduction over leading axes; the naive float64 models of
tests/numerics/test_vector.py cover the wrapper's other paths.
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.kernels import reduce as kr
from ascend_emu.kernels.reduce_lead import reduce_lead_f32
from ascend_emu.numerics import reduce

rng = np.random.default_rng(20261125)
CODES = {"sum": kr.SUM, "mean": kr.MEAN, "max": kr.MAX, "min": kr.MIN, "prod": kr.PROD,
         "mean_scale_first": kr.MEAN_SCALE_FIRST, "mean_scale_last": kr.MEAN_SCALE_LAST}


def _data(inner, rows, kind):
    if kind == "wide":   # cancellation, overflow of the float32 sum, subnormals, signed zeros
        x = rng.choice([-1.0, 1.0], (inner, rows)) * np.exp2(rng.uniform(-140, 127.9, (inner, rows)))
        x[rng.random((inner, rows)) < 0.05] = -0.0
        return x.astype(np.float32)
    x = (rng.standard_normal((inner, rows)) * 3).astype(np.float32)
    if kind == "nans":   # NaNs of many payloads and both signs meeting in a column: which one comes out
        u = x.view(np.uint32)
        nan = rng.random((inner, rows)) < 0.3
        u[nan] = (rng.integers(0, 2, nan.sum()) << 31 | 0x7F800000 | rng.integers(1, 1 << 23, nan.sum())).astype(np.uint32)
    if kind == "special":
        flat = x.reshape(-1)
        k = min(8, flat.size)
        specials = [np.inf, -np.inf, np.nan, np.inf, -0.0, 0.0, np.nan, -np.inf]
        flat[rng.choice(flat.size, k, replace=False)] = specials[:k]
        x[:, 0] = 2.5   # ties for max and min
    return x


@pytest.mark.parametrize("shape", [(1, 3), (7, 16), (513, 300), (40, 1000)])
@pytest.mark.parametrize("kind", ["normal", "wide", "special", "nans"])
def test_lead_kernel_is_the_row_kernel_transposed(shape, kind):
    x = _data(*shape, kind)
    xt = np.ascontiguousarray(x.T)
    for name, code in CODES.items():
        for overflow in (0, 1):
            for subnormal in (0, 1):
                got = np.empty(shape[1], np.float32)
                want = np.empty(shape[1], np.float32)
                st = reduce_lead_f32(code, x, got, overflow, subnormal)
                wst = kr.reduce_f32(code, xt, want, overflow, subnormal)
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                              err_msg=f"{name} {shape} {kind} {overflow} {subnormal}")
                assert bool(st) == bool(wst)


@pytest.mark.parametrize("op_model", ["tbe_v220", "ascendc", "exact"])
def test_wrapper_over_leading_axes_equals_a_reduction_of_the_transposed_array(op_model):
    """numerics.reduce over NHWC's N, H, W (the leading-axes kernel) against the same reduction of the
    array with the channels moved first (the row kernel)."""
    x = _data(4 * 9 * 7, 16, "wide").reshape(4, 9, 7, 16)
    moved = np.ascontiguousarray(np.moveaxis(x, 3, 0))
    for op in ("sum", "mean", "max", "min", "prod"):
        got, st = reduce(op, x, axis=(0, 1, 2), dtype="float32", op_model=op_model, keepdims=True)
        want, wst = reduce(op, moved, axis=(1, 2, 3), dtype="float32", op_model=op_model)
        assert got.shape == (1, 1, 1, 16)
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))
        assert st == wst


def _f16_data(inner, rows, kind):
    """fp16 data: every kind of pattern (normals, subnormals, signed zeros, the largest values, Inf, NaN)."""
    bits = rng.integers(0, 1 << 16, (inner, rows)).astype(np.uint16)
    if kind == "finite":
        bits &= np.uint16(0xFBFF)   # exponent never all ones: no Inf or NaN
    elif kind == "small":          # subnormals, zeros and small normals only
        bits &= np.uint16(0x83FF) | np.uint16(0x0400)
    return bits.view(np.float16)


@pytest.mark.skipif(not __import__("ascend_emu.kernels.cast", fromlist=["HW_HALF"]).HW_HALF,
                    reason="the fp16 kernel needs hardware fp16 conversions")
@pytest.mark.parametrize("shape", [(1, 3), (7, 16), (513, 300), (2048, 16)])
@pytest.mark.parametrize("kind", ["finite", "small", "any"])
def test_fp16_lead_kernel_is_the_float32_one_on_the_widened_array(shape, kind):
    """reduce_lead_f16 reads fp16 where reduce_lead_f32 reads the widened float32: same bits and status,
    under flush too (the widening cast flushes fp16 subnormals, the fp16 kernel reads them as zeros)."""
    from ascend_emu.kernels.reduce_lead import reduce_lead_f16
    from ascend_emu.numerics import cast

    x = _f16_data(*shape, kind)
    for name, code in CODES.items():
        for overflow in (0, 1):
            for subnormal in (0, 1):
                wide = cast(x, "float32", subnormals=("keep", "flush")[subnormal])[0]
                got = np.empty(shape[1], np.float32)
                want = np.empty(shape[1], np.float32)
                st = reduce_lead_f16(code, x.view(np.uint16), got, overflow, subnormal)
                wst = reduce_lead_f32(code, wide, want, overflow, subnormal)
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                              err_msg=f"{name} {shape} {kind} {overflow} {subnormal}")
                assert st == wst


@pytest.mark.parametrize("op_model", ["tbe_v220", "ascendc", "exact"])
@pytest.mark.parametrize("axes", [(0, 1, 2), (0,), (0, 1), (1, 2), (0, 2)])
def test_wrapper_on_fp16_data_equals_the_reduction_of_its_widening(op_model, axes):
    """numerics.reduce of fp16 data in float32 (no widened copy over leading axes) against the same
    reduction of the widened array, statuses included, in both overflow and subnormal modes."""
    from ascend_emu.numerics import cast

    x = _f16_data(4 * 9 * 7, 16, "any").reshape(4, 9, 7, 16)
    for ov in ("inf_nan", "saturation"):
        for sub in ("keep", "flush"):
            wide = cast(x, "float32", subnormals=sub)[0]
            for op in ("sum", "mean", "max", "min", "prod"):
                for keep in (False, True):
                    kw = dict(axis=axes, dtype="float32", op_model=op_model, keepdims=keep, overflow_mode=ov,
                              subnormals=sub)
                    got, st = reduce(op, x, **kw)
                    want, wst = reduce(op, wide, **kw)
                    assert got.shape == want.shape and got.dtype == want.dtype
                    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{op} {kw}")
                    assert st == wst
