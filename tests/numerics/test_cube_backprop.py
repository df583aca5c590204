"""The backprop convolutions' direct cube paths against the generic matmul of an im2col, bit for bit.

``cube.conv2d_backprop_filter`` packs the patches of x straight into the tree-16 kernel's slabs; its
oracle is the definition it implements: the patch matrix built with numpy (pad, one view per tap,
stack) times dy through ``cube.matmul(..., transpose_a=True)`` (itself proven against
tests/naive_cube.py), and, for small cases, the slow oracle directly.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu.numerics import conv, cube
from ascend_emu.numerics.multicore import Launch, MultiCoreModel
from ascend_emu.numerics.policy import CubeModel

from tests.numerics.test_cube import assert_same_bits, fp16_values

try:
    from . import naive_cube as naive
except ImportError:
    import naive_cube as naive

BF16 = ml_dtypes.bfloat16


def _geometry(xs, KH, KW, strides, padding, dil):
    w = np.zeros((KH, KW, xs[3], 1), np.float16)
    _, _, pads, (OH, OW) = cube._conv_geometry("t", np.zeros(xs, np.float16), w, strides, padding, dil)
    return pads, OH, OW


def _patches(x, KH, KW, strides, pads, dil, OH, OW):
    """The im2col matrix (N*OH*OW, KH*KW*C): rows (n, oh, ow), columns (kh, kw, c)."""
    (sh, sw), (dh, dw) = strides, dil
    xp = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    taps = [xp[:, i * dh:i * dh + (OH - 1) * sh + 1:sh, j * dw:j * dw + (OW - 1) * sw + 1:sw, :]
            for i in range(KH) for j in range(KW)]
    return np.stack(taps, axis=3).reshape(-1, KH * KW * x.shape[3])


def _launch(seed, cores=32):
    return Launch("batch", "grad/Conv2DBackpropFilter", seed, 0, cores, cores, MultiCoreModel())


def _check(x, dy, KH, KW, strides, pads, dil, multicore_seed=None, **kw):
    OH, OW = dy.shape[1:3]
    mc = (lambda: _launch(multicore_seed)) if multicore_seed is not None else (lambda: None)
    ours, st = cube.conv2d_backprop_filter(x, dy, (KH, KW), strides, pads, dil, multicore=mc(), **kw)
    cols = _patches(x, KH, KW, strides, pads, dil, OH, OW)
    ref, rst = cube.matmul(cols, dy.reshape(-1, dy.shape[3]), transpose_a=True, multicore=mc(),
                           samples=x.shape[0], **kw)
    ref = ref.reshape(KH, KW, x.shape[3], dy.shape[3])
    assert_same_bits(ours, ref, f"backprop filter x {x.shape} dy {dy.shape} {kw}")
    assert st == rst, (hex(st), hex(rst))
    return ours, st


CASES = [
    # (x shape, KH, KW, Cout, strides, padding, dilations)
    ((2, 7, 6, 3), 3, 2, 5, (1, 1), "VALID", (1, 1)),
    ((1, 8, 9, 4), 3, 3, 2, (2, 2), "SAME", (1, 1)),
    ((2, 9, 7, 3), 3, 3, 3, (1, 2), "SAME", (1, 1)),
    ((1, 10, 9, 2), 3, 2, 3, (1, 1), "SAME", (2, 3)),
    ((1, 7, 8, 5), 2, 3, 4, (2, 1), [[1, 2], [0, 3]], (1, 1)),
    ((3, 6, 6, 7), 1, 1, 40, (1, 1), "VALID", (1, 1)),
    ((1, 11, 10, 2), 5, 5, 2, (3, 2), "SAME", (1, 1)),
    ((2, 9, 9, 70), 3, 3, 6, (2, 2), "SAME", (1, 1)),       # 630 columns: two column tiles of the kernel
    ((3, 16, 16, 3), 3, 3, 16, (1, 1), "SAME", (1, 1)),     # the benchmark CNN's first layer, smaller batch
]

def _case(k, rng, x_kind, dy_kind):
    """CASES[k]'s data: fp16 x and dy of the given fp16_values kinds, and its geometry:
    ``x, dy, KH, KW, CO, strides, pads, dil, (OH, OW)``."""
    xs, KH, KW, CO, strides, padding, dil = CASES[k]
    pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    x = fp16_values(rng, xs, x_kind)
    dy = fp16_values(rng, (xs[0], OH, OW, CO), dy_kind)
    return x, dy, KH, KW, CO, strides, pads, dil, (OH, OW)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_backprop_filter_matches_im2col_matmul(case):
    rng = np.random.default_rng(700 + case)
    x, dy, KH, KW, CO, strides, pads, dil, (OH, OW) = _case(case, rng, "wide", "normal")
    _check(x, dy, KH, KW, strides, pads, dil)
    _check(x, dy, KH, KW, strides, pads, dil, out_dtype="float32")
    _check(x, dy, KH, KW, strides, pads, dil, subnormals="flush")
    _check(x, dy, KH, KW, strides, pads, dil, multicore_seed=case)
    _check(x.astype(np.float32), dy.astype(np.float32), KH, KW, strides, pads, dil, operand_dtype="float32",
           out_dtype="float32")
    _check(x.astype(BF16), dy.astype(BF16), KH, KW, strides, pads, dil, operand_dtype="bfloat16",
           out_dtype="bfloat16")


@pytest.mark.parametrize("case", [0, 1, 4, 6])
def test_backprop_filter_matches_naive_oracle(case):
    rng = np.random.default_rng(800 + case)
    x, dy, KH, KW, CO, strides, pads, dil, (OH, OW) = _case(case, rng, "normal", "wide")
    ours, st = cube.conv2d_backprop_filter(x, dy, (KH, KW), strides, pads, dil, out_dtype="float32")
    cols = _patches(x, KH, KW, strides, pads, dil, OH, OW)
    ref, rst = naive.matmul(cols.T, dy.reshape(-1, CO), out_dtype="float32")
    assert_same_bits(ours, ref.reshape(ours.shape), f"case {case}")
    assert st == rst


def test_backprop_filter_specials_and_status():
    """Inf, NaN, signed zeros and an fp16 output overflow: same bits and status as the generic path."""
    rng = np.random.default_rng(5)
    x, dy, KH, KW, CO, strides, pads, dil, (OH, OW) = _case(1, rng, "big", "big")
    x.reshape(-1)[rng.choice(x.size, 6, replace=False)] = [np.inf, -np.inf, np.nan, -0.0, 0.0, -0.0]
    _, st = _check(x, dy, KH, KW, strides, pads, dil)
    assert st != 0
    _check(x, dy, KH, KW, strides, pads, dil, overflow_mode="saturation")
    z = -np.zeros_like(x)
    _check(z, dy, KH, KW, strides, pads, dil)


def test_backprop_filter_float32_input_rounds_like_the_patches():
    """float32 x and dy with fp16 operands: x rounded once, its status ORed over the pixels the taps read only."""
    rng = np.random.default_rng(6)
    xs, KH, KW, CO, strides, padding, dil = ((1, 10, 10, 2), 3, 3, 3, (2, 2), "VALID", (1, 1))
    pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    x = rng.standard_normal(xs).astype(np.float32)
    x[0, 9, 9, 0] = 1e6   # outside every window (stride 2, VALID): its overflow raises no status
    dy = rng.standard_normal((1, OH, OW, CO)).astype(np.float32)
    _, st = _check(x, dy, KH, KW, strides, pads, dil)
    assert st == 0


def test_backprop_filter_other_cube_models():
    rng = np.random.default_rng(7)
    x, dy, KH, KW, CO, strides, pads, dil, (OH, OW) = _case(2, rng, "normal", "normal")
    for model in (CubeModel(block_size=8), CubeModel(block_sum="aligned")):
        _check(x, dy, KH, KW, strides, pads, dil, out_dtype="float32", model=model)


# ---------------------------------------------------------------- input gradient

def _dz_pads(xs, KH, KW, strides, padding, dil, OH, OW):
    """The pads of the zero-inserted dy, as ops/grad_ops.py derives them from the forward convolution."""
    pads, _, _ = _geometry(xs, KH, KW, strides, padding, dil)
    (pt, _), (pl, _) = pads
    (sh, sw), (dh, dw) = strides, dil
    khe, kwe = (KH - 1) * dh + 1, (KW - 1) * dw + 1
    return ((khe - 1 - pt, xs[1] - 1 + pt - (OH - 1) * sh), (kwe - 1 - pl, xs[2] - 1 + pl - (OW - 1) * sw))


def _check_input(dy, w, strides, dzp, dil, **kw):
    ours, st = cube.conv2d_backprop_input(dy, w, strides, dzp, dil, **kw)
    dz = cube.zero_inserted(dy, strides[0], strides[1], dzp[0], dzp[1])
    ref, rst = cube.conv2d(dz, np.ascontiguousarray(w[::-1, ::-1].transpose(0, 1, 3, 2)), strides=(1, 1),
                           padding="VALID", dilations=dil, **kw)
    assert_same_bits(ours, ref, f"backprop input dy {dy.shape} w {w.shape} {kw}")
    assert st == rst, (hex(st), hex(rst))
    return ours, st


INPUT_CASES = CASES + [
    ((1, 8, 8, 3), 3, 3, 4, (2, 2), "VALID", (1, 1)),       # stride 2 VALID: the last row and column are cropped
    ((2, 13, 11, 20), 3, 3, 33, (3, 2), "SAME", (1, 2)),    # Cout past 16 and 32, Cin past 16
    ((2, 9, 8, 5), 1, 1, 3, (2, 2), "VALID", (1, 1)),       # pixel classes that no tap reaches: +0
    ((2, 12, 12, 16), 3, 3, 32, (2, 2), "SAME", (1, 1)),    # the benchmark CNN's second layer, smaller
]


@pytest.mark.parametrize("case", range(len(INPUT_CASES)))
def test_backprop_input_matches_conv_of_zero_inserted_dy(case):
    xs, KH, KW, CO, strides, padding, dil = INPUT_CASES[case]
    rng = np.random.default_rng(900 + case)
    _, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    dzp = _dz_pads(xs, KH, KW, strides, padding, dil, OH, OW)
    dy = fp16_values(rng, (xs[0], OH, OW, CO), "wide")
    w = fp16_values(rng, (KH, KW, xs[3], CO), "normal")
    ours, _ = _check_input(dy, w, strides, dzp, dil)
    assert ours.shape == xs
    _check_input(dy, w, strides, dzp, dil, out_dtype="float32")
    _check_input(dy, w, strides, dzp, dil, subnormals="flush", model=CubeModel(conv_k_order="c1hwc0"))
    _check_input(dy.astype(np.float32), w.astype(np.float32), strides, dzp, dil, operand_dtype="float32",
                 out_dtype="float32")
    _check_input(dy.astype(BF16), w.astype(BF16), strides, dzp, dil, operand_dtype="bfloat16", out_dtype="bfloat16")
    _check_input(dy, w, strides, dzp, dil, out_dtype="float32", model=CubeModel(block_size=8))


def test_backprop_input_specials_status_and_chunks(monkeypatch):
    """Inf/NaN/signed zeros, fp16 overflow, float32 dy (the generic path), and pixels in several chunks."""
    rng = np.random.default_rng(11)
    xs, KH, KW, CO, strides, padding, dil = ((3, 17, 15, 5), 3, 3, 6, (2, 2), "SAME", (1, 1))
    _, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    dzp = _dz_pads(xs, KH, KW, strides, padding, dil, OH, OW)
    dy = fp16_values(rng, (xs[0], OH, OW, CO), "big")
    w = fp16_values(rng, (KH, KW, xs[3], CO), "big")
    dy.reshape(-1)[rng.choice(dy.size, 6, replace=False)] = [np.inf, -np.inf, np.nan, -0.0, 0.0, -0.0]
    _, st = _check_input(dy, w, strides, dzp, dil)
    assert st != 0
    _check_input(dy, w, strides, dzp, dil, overflow_mode="saturation")
    _check_input(-np.zeros_like(dy), w, strides, dzp, dil)
    _check_input(dy, -np.zeros_like(w), strides, dzp, dil)
    w_inf = w.copy()
    w_inf[1, 2, 3, 4] = np.inf        # an Inf weight makes NaN of the zeros between pixels: every block is kept
    _, st = _check_input(fp16_values(rng, dy.shape, "normal"), w_inf, strides, dzp, dil)
    assert st != 0
    _check_input(dy.astype(np.float32) * 300, w, strides, dzp, dil)
    monkeypatch.setattr(conv, "_IM2COL_BYTES", 4 * 64 * 400)   # chunks of 512 pixels: 765 pixels in 2 chunks
    _check_input(fp16_values(rng, dy.shape, "normal"), w, strides, dzp, dil)
