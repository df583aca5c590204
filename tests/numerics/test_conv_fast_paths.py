"""The convolution gradients' fast paths against the paths they replace, bit for bit, on hostile data.

- ``conv2d_backprop_input``: one product per pixel class over dy made planar and padded once, packed from
  dy's bits (``dx_class_packed``), the Fixpipe writing the NHWC output in place (``finish_grid``); what it
  replaces is the stride-1 VALID ``conv2d`` of the zero-inserted dy (its definition).
- ``conv2d_backprop_filter`` of a float32 (or float64) x under fp16 operands: x rounded once, its status
  ORed over the pixels the taps read; what it replaces is the generic matmul of the numpy-built patches.
- ``finish_grid`` against ``finish_to_16`` / ``finish_f32`` (the Fixpipe passes it stands for), and
  ``widen_bits`` against ``cast.bits16_to_f32`` on every 16-bit pattern.

Hostile: NaN, +-Inf, -0, fp16 subnormals, sums overflowing fp16, saturation, flush, odd shapes, strides
1 to 3, SAME / VALID / cropping pads, dilations, Cout not a multiple of 16, both K orders, a bias.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from ascend_emu.numerics import cube
from ascend_emu.numerics.policy import CubeModel
from ascend_emu.kernels.cast import bits16_to_f32
from ascend_emu.kernels.cube import finish_f32, finish_grid, finish_to_16
from ascend_emu.kernels.cube.conv import widen_bits

from tests.numerics.test_cube import assert_same_bits
from tests.numerics.test_cube_backprop import _check, _dz_pads, _geometry, _patches

BF16 = ml_dtypes.bfloat16
C1HWC0 = CubeModel(conv_k_order="c1hwc0")


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Every kernel buffer starts as all-ones bytes (NaN in float32 and the 16-bit formats), so an element
    a kernel should write but does not (a +0 of the K padding, say) shows in the result."""
    from ascend_emu.kernels import alloc

    empty = alloc.empty

    def poisoned(shape, dtype, **kw):
        a = empty(shape, dtype, **kw)
        a.view(np.uint8).reshape(-1)[:] = 0xFF
        return a
    monkeypatch.setattr(alloc, "empty", poisoned)


def hostile(rng, shape, dtype=np.float16, big=False):
    """Values of every kind: normal, fp16 subnormals, signed zeros, a few Inf / NaN, and (big) values whose
    sums overflow fp16. float32 data also holds values that overflow or underflow fp16 on rounding."""
    x = rng.standard_normal(shape) * (300.0 if big else 1.0)
    kind = rng.random(shape)
    sub = rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-24.5, -14.0, shape))
    x = np.where(kind < 0.15, sub, x)
    x = np.where((kind >= 0.15) & (kind < 0.2), -0.0, x)
    x = np.where((kind >= 0.2) & (kind < 0.23), 0.0, x)
    if dtype == np.float32:
        x = np.where((kind >= 0.23) & (kind < 0.25), rng.choice([-1.0, 1.0], shape) * 1e5, x)   # fp16 overflow
        x = np.where((kind >= 0.25) & (kind < 0.27), 1e-9, x)                                   # fp16 underflow
    x = x.astype(dtype)
    flat = x.reshape(-1)
    if flat.size >= 8:
        flat[rng.choice(flat.size, 3, replace=False)] = [np.inf, -np.inf, np.nan]
    return x


# ------------------------------------------------------------------------------ input gradient

INPUT_GEOMETRIES = [
    # (x shape, KH, KW, Cout, strides, padding, dilations)
    ((2, 9, 7, 5), 3, 3, 6, (2, 2), "SAME", (1, 1)),
    ((1, 8, 8, 3), 3, 3, 4, (2, 2), "VALID", (1, 1)),      # cropping pads (the last row and column)
    ((2, 7, 10, 2), 3, 2, 3, (1, 1), "SAME", (1, 1)),      # stride 1: one class
    ((1, 11, 9, 4), 3, 3, 17, (3, 2), "SAME", (2, 1)),     # stride 3 x 2, dilated rows, Cout past 16
    ((2, 6, 5, 3), 1, 1, 2, (2, 3), "VALID", (1, 1)),      # classes that no tap reaches: +0
    ((1, 10, 10, 16), 3, 3, 32, (2, 2), "SAME", (1, 1)),   # the benchmark's second layer, smaller
]


def _input_check(dy, w, strides, dzp, dil, bias=None, **kw):
    """conv2d_backprop_input against the conv2d of the zero-inserted dy: same bits, same status."""
    ours, st = cube.conv2d_backprop_input(dy, w, strides, dzp, dil, bias=bias, **kw)
    dz = cube.zero_inserted(dy, strides[0], strides[1], dzp[0], dzp[1])
    ref, rst = cube.conv2d(dz, np.ascontiguousarray(w[::-1, ::-1].transpose(0, 1, 3, 2)), strides=(1, 1),
                           padding="VALID", dilations=dil, bias=bias, **kw)
    assert_same_bits(ours, ref, f"backprop input dy {dy.shape} w {w.shape} {kw}")
    assert st == rst, (hex(st), hex(rst))
    return st


@pytest.mark.parametrize("case", range(len(INPUT_GEOMETRIES)))
def test_backprop_input_classes_match_the_zero_inserted_conv(case):
    xs, KH, KW, CO, strides, padding, dil = INPUT_GEOMETRIES[case]
    rng = np.random.default_rng(1200 + case)
    _, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    dzp = _dz_pads(xs, KH, KW, strides, padding, dil, OH, OW)
    dy = hostile(rng, (xs[0], OH, OW, CO), big=True)
    w = hostile(rng, (KH, KW, xs[3], CO))
    w_fin = np.where(np.isfinite(w), w, np.float16(0.5))     # a finite filter: blocks of zeros are dropped
    statuses = set()
    for ww in (w_fin, w):
        for kw in ({}, {"overflow_mode": "saturation"}, {"subnormals": "flush"}, {"out_dtype": "float32"},
                   {"out_dtype": "float32", "subnormals": "flush", "overflow_mode": "saturation"},
                   {"model": C1HWC0}):
            statuses.add(_input_check(dy, ww, strides, dzp, dil, **kw))
    assert len(statuses) > 1     # the modes are told apart by their statuses
    finite = np.where(np.isfinite(dy), dy, np.float16(-0.0))
    _input_check(finite, w_fin, strides, dzp, dil, bias=rng.standard_normal(xs[3]).astype(np.float32))
    _input_check(-np.zeros_like(dy), w_fin, strides, dzp, dil)
    _input_check(finite.astype(BF16), w_fin.astype(BF16), strides, dzp, dil, operand_dtype="bfloat16",
                 out_dtype="bfloat16")
    _input_check(finite.astype(np.float32), w_fin.astype(np.float32), strides, dzp, dil, operand_dtype="float32",
                 out_dtype="float32", subnormals="flush")


def test_backprop_input_plan_is_per_geometry():
    """The cached class geometry of one call is never reused for another: alternating geometries."""
    rng = np.random.default_rng(1300)
    for _ in range(2):
        for xs, KH, KW, CO, strides, padding, dil in INPUT_GEOMETRIES[:3]:
            _, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
            dzp = _dz_pads(xs, KH, KW, strides, padding, dil, OH, OW)
            dy = hostile(rng, (xs[0], OH, OW, CO))
            w = rng.standard_normal((KH, KW, xs[3], CO)).astype(np.float16)
            _input_check(dy, w, strides, dzp, dil)


# ------------------------------------------------------------------------------ filter gradient

FILTER_GEOMETRIES = [
    ((2, 9, 8, 3), 3, 3, 16, (1, 1), "SAME", (1, 1)),      # the benchmark's first layer, smaller
    ((1, 10, 10, 2), 3, 3, 3, (2, 2), "VALID", (1, 1)),    # the last row and column are read by no tap
    ((2, 11, 9, 5), 3, 2, 4, (2, 3), "SAME", (1, 2)),      # odd shapes, dilated columns
    ((1, 12, 12, 1), 2, 2, 6, (3, 3), "VALID", (1, 1)),    # stride past the filter: every third pixel unread
    ((2, 8, 8, 16), 3, 3, 32, (2, 2), "SAME", (1, 1)),     # the benchmark's second layer, smaller
]


def _filter_check(x, dy, KH, KW, strides, pads, dil, **kw):
    """conv2d_backprop_filter against the generic matmul of the numpy-built patches."""
    OH, OW = dy.shape[1:3]
    ours, st = cube.conv2d_backprop_filter(x, dy, (KH, KW), strides, pads, dil, **kw)
    cols = _patches(x, KH, KW, strides, pads, dil, OH, OW)
    ref, rst = cube.matmul(cols, dy.reshape(-1, dy.shape[3]), transpose_a=True, **kw)
    assert_same_bits(ours, ref.reshape(ours.shape), f"backprop filter x {x.shape} {x.dtype} dy {dy.dtype} {kw}")
    assert st == rst, (hex(st), hex(rst))
    return st


@pytest.mark.parametrize("case", range(len(FILTER_GEOMETRIES)))
def test_backprop_filter_fast_paths_match_the_patch_matmul(case):
    xs, KH, KW, CO, strides, padding, dil = FILTER_GEOMETRIES[case]
    rng = np.random.default_rng(1400 + case)
    pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    dy = hostile(rng, (xs[0], OH, OW, CO), big=True)
    statuses = set()
    for x in (hostile(rng, xs, np.float32), hostile(rng, xs)):   # float32 x rounded once; fp16 x as bits
        for kw in ({}, {"overflow_mode": "saturation"}, {"subnormals": "flush"}, {"out_dtype": "float32"},
                   {"out_dtype": "bfloat16", "overflow_mode": "saturation"}):
            statuses.add(_filter_check(x, dy, KH, KW, strides, pads, dil, **kw))
        _filter_check(x.astype(np.float64), dy.astype(np.float32), KH, KW, strides, pads, dil)
    assert len(statuses) > 1
    xb = hostile(rng, xs).astype(BF16)
    _filter_check(xb, dy.astype(BF16), KH, KW, strides, pads, dil, operand_dtype="bfloat16", subnormals="flush")


def test_backprop_filter_float32_x_over_cube_cores():
    """A float32 x split over the cube cores by samples: the partials and their arrival order as the generic path's."""
    xs, KH, KW, CO, strides, padding, dil = FILTER_GEOMETRIES[2]
    rng = np.random.default_rng(1450)
    pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    x = hostile(rng, (5,) + xs[1:], np.float32)
    dy = hostile(rng, (5, OH, OW, CO), big=True)
    for seed in (1, 2):
        _check(x, dy, KH, KW, strides, pads, dil, multicore_seed=seed)
        _check(x, dy, KH, KW, strides, pads, dil, multicore_seed=seed, overflow_mode="saturation")


def test_backprop_filter_status_only_from_the_pixels_the_taps_read():
    """A float32 x overflowing fp16 only where no tap reads it raises nothing; where a tap reads it, 0x...."""
    xs, KH, KW, CO, strides, padding, dil = FILTER_GEOMETRIES[3]
    rng = np.random.default_rng(1500)
    pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    x = rng.standard_normal(xs).astype(np.float32)
    dy = rng.standard_normal((xs[0], OH, OW, CO)).astype(np.float16)
    x[0, 2, 5, 0] = 1e6      # row 2 is read by no tap (stride 3, 2 taps)
    x[0, 11, 0, 0] = -1e6    # the last row too
    assert _filter_check(x, dy, KH, KW, strides, pads, dil) == 0
    x[0, 4, 4, 0] = 1e6      # read by a tap
    assert _filter_check(x, dy, KH, KW, strides, pads, dil) != 0


# ------------------------------------------------------------------------------ kernels

def _special_acc(rng, n):
    """float32 accumulators of every kind: normal, fp16-subnormal and fp32-subnormal results, signed zeros,
    values rounding past fp16's and bf16's range, +-Inf, NaN."""
    a = rng.standard_normal(n).astype(np.float32) * np.exp2(rng.integers(-30, 20, n)).astype(np.float32)
    k = rng.integers(0, 10, n)
    a[k == 0] = np.float32(65520.0) * rng.choice([-1, 1], (k == 0).sum()).astype(np.float32)
    a[k == 1] = np.float32(3.4e38) * rng.choice([-1, 1], (k == 1).sum()).astype(np.float32)
    a[k == 2] = np.float32(1e-40) * rng.choice([-1, 1], (k == 2).sum()).astype(np.float32)
    a[k == 3] = -0.0
    a[k == 4] = rng.choice([np.inf, -np.inf, np.nan], (k == 4).sum()).astype(np.float32)
    return a


@pytest.mark.parametrize("out", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("overflow", [0, 1])
@pytest.mark.parametrize("subnormal", [0, 1])
def test_finish_grid_is_the_fixpipe_pass_in_place(out, overflow, subnormal):
    """finish_grid(accT) into a strided pixel grid of NHWC == finish_to_16 / finish_f32 of accT.T, scattered."""
    from ascend_emu.numerics.policy import OVERFLOW_MODES
    ov = [OVERFLOW_MODES["inf_nan"], OVERFLOW_MODES["saturation"]][overflow]
    rng = np.random.default_rng(1600 + overflow + 2 * subnormal)
    N, H, W, C, sy, sx, oy, ox = 2, 11, 9, 5, 2, 3, 1, 2
    Hc, Wc = len(range(oy, H, sy)), len(range(ox, W, sx))
    R = N * Hc * Wc
    accT = _special_acc(rng, C * (R + 7)).reshape(C, R + 7)   # columns past the pixels are not read
    r0, rows = 3, R - 5   # a chunk of the grid
    sel = np.arange(r0, r0 + rows)
    ref_in = np.ascontiguousarray(accT[:, :rows].T)
    if out == "float32":
        dst = np.full((N, H, W, C), 7.0, np.float32)
        st = finish_grid(accT, dst, r0, rows, Hc, Wc, H, W, oy, ox, sy, sx, False, ov, subnormal)
        ref = ref_in.copy()
        rst = finish_f32(ref.reshape(-1), ov == OVERFLOW_MODES["saturation"], subnormal == 1)
        view = dst.view(np.uint32)
        refb = ref.view(np.uint32)
    else:
        dst = np.full((N, H, W, C), 0x1234, np.uint16)
        st = finish_grid(accT, dst, r0, rows, Hc, Wc, H, W, oy, ox, sy, sx, out == "bfloat16", ov, subnormal)
        refb = np.empty(ref_in.shape, np.uint16)
        rst = finish_to_16(ref_in.reshape(-1), refb.reshape(-1), out == "bfloat16", ov, subnormal)
        view = dst
    n, i, m = sel // (Hc * Wc), (sel // Wc) % Hc, sel % Wc
    np.testing.assert_array_equal(view[n, oy + sy * i, ox + sx * m], refb)
    assert st == rst and st != 0
    untouched = np.ones((N, H, W), bool)
    untouched[n, oy + sy * i, ox + sx * m] = False
    assert (view[untouched] == (np.float32(7.0).view(np.uint32) if out == "float32" else 0x1234)).all()


@njit(cache=True)
def _both_widenings(bf16, subnormal):
    a = np.empty(65536, np.uint32)
    b = np.empty(65536, np.uint32)
    for i in range(65536):
        a[i] = np.float32(widen_bits(np.uint16(i), bf16, subnormal)).view(np.uint32)
        b[i] = np.float32(bits16_to_f32(np.uint16(i), bf16, subnormal)).view(np.uint32)
    return a, b


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("subnormal", [0, 1])
def test_widen_bits_is_bits16_to_f32_on_every_pattern(bf16, subnormal):
    a, b = _both_widenings(bf16, subnormal)
    np.testing.assert_array_equal(a, b)
