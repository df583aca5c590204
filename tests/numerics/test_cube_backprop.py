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

from ascend_emu.numerics import cube
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


@pytest.mark.parametrize("case", range(len(CASES)))
def test_backprop_filter_matches_im2col_matmul(case):
    xs, KH, KW, CO, strides, padding, dil = CASES[case]
    rng = np.random.default_rng(700 + case)
    pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    x = fp16_values(rng, xs, "wide")
    dy = fp16_values(rng, (xs[0], OH, OW, CO), "normal")
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
    xs, KH, KW, CO, strides, padding, dil = CASES[case]
    rng = np.random.default_rng(800 + case)
    pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    x = fp16_values(rng, xs, "normal")
    dy = fp16_values(rng, (xs[0], OH, OW, CO), "wide")
    ours, st = cube.conv2d_backprop_filter(x, dy, (KH, KW), strides, pads, dil, out_dtype="float32")
    cols = _patches(x, KH, KW, strides, pads, dil, OH, OW)
    ref, rst = naive.matmul(cols.T, dy.reshape(-1, CO), out_dtype="float32")
    assert_same_bits(ours, ref.reshape(ours.shape), f"case {case}")
    assert st == rst


def test_backprop_filter_specials_and_status():
    """Inf, NaN, signed zeros and an fp16 output overflow: same bits and status as the generic path."""
    rng = np.random.default_rng(5)
    xs, KH, KW, CO, strides, padding, dil = CASES[1]
    pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    x = fp16_values(rng, xs, "big")
    dy = fp16_values(rng, (xs[0], OH, OW, CO), "big")
    x.reshape(-1)[rng.choice(x.size, 6, replace=False)] = [np.inf, -np.inf, np.nan, -0.0, 0.0, -0.0]
    _, st = _check(x, dy, KH, KW, strides, pads, dil)
    assert st != 0
    _check(x, dy, KH, KW, strides, pads, dil, overflow_mode="saturation")
    z = -np.zeros_like(x)
    _check(z, dy, KH, KW, strides, pads, dil)


def test_backprop_filter_float32_input_rounds_like_the_patches():
    """float32 x and dy with fp16 operands (x rounded, statuses ORed over the patches): the generic path."""
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
    xs, KH, KW, CO, strides, padding, dil = CASES[2]
    pads, OH, OW = _geometry(xs, KH, KW, strides, padding, dil)
    x = fp16_values(rng, xs, "normal")
    dy = fp16_values(rng, (xs[0], OH, OW, CO), "normal")
    for model in (CubeModel(block_size=8), CubeModel(block_sum="aligned")):
        _check(x, dy, KH, KW, strides, pads, dil, out_dtype="float32", model=model)
