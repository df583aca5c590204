"""The small-product path of the cube (kernels/cube/tree16.matmul_tree16_small, taken by numerics.cube_core._acc
for products of at most _SMALL_TERMS terms) against the path it replaces (matmul_tree16 over packed, padded,
possibly transposed operands): same bits and same status on hostile data (NaN, Inf, -0, fp16 subnormals,
overflowing products and sums, saturation), odd shapes, transposes, batches, bias, every operand dtype. The
small path must really run (it is counted), so a fast path that is never taken fails here too."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.numerics import cube, cube_core
from ascend_emu.numerics.policy import bfloat16

rng = np.random.default_rng(20261125)


def _values(kind, shape, scale=1.0):
    x = rng.standard_normal(shape) * scale
    flat = x.reshape(-1)
    if kind == "hostile":
        idx = rng.choice(flat.size, size=max(1, flat.size // 12), replace=False)
        flat[idx] = rng.choice([np.inf, -np.inf, np.nan, 0.0, -0.0, 6e-8, -3e-8, 6e4, -6e4, 1e-5], size=idx.size)
    elif kind == "tiny":    # fp16 subnormal operands, signed zeros, products far below fp16's range
        x *= 2.0 ** -18
        flat[::5] = -0.0
    elif kind == "big":     # sums overflow fp16 (and float32 for float32 operands at 1e20)
        x *= 300.0
    elif kind == "zeros":   # all -0: the bias (or +0) decides the sign
        x[...] = -0.0
    return x


class _Count:
    def __init__(self, monkeypatch):
        self.n = 0
        orig = cube_core._k.matmul_tree16_small

        def small(*a):
            self.n += 1
            return orig(*a)
        monkeypatch.setattr(cube_core._k, "matmul_tree16_small", small)


def _both(fn, monkeypatch, *args, **kw):
    count = _Count(monkeypatch)
    got, st = fn(*args, **kw)
    assert count.n >= 1, "the small-product path did not run"
    with monkeypatch.context() as m:
        m.setattr(cube_core, "_SMALL_TERMS", -1)
        want, wst = fn(*args, **kw)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))
    assert st == wst, (hex(st), hex(wst))
    return got


SHAPES = [(32, 32, 10), (32, 10, 32), (1, 1, 1), (3, 17, 5), (7, 33, 9), (40, 16, 20), (2, 100, 3), (9, 15, 64)]
MODES = [dict(), dict(overflow_mode="saturation"), dict(out_dtype="float32"), dict(operand_dtype="bfloat16"),
         dict(operand_dtype="bfloat16", out_dtype="bfloat16", overflow_mode="saturation"),
         dict(operand_dtype="float32", out_dtype="float32"), dict(subnormals="flush")]


@pytest.mark.parametrize("kind", ["normal", "hostile", "tiny", "big", "zeros"])
@pytest.mark.parametrize("mode", range(len(MODES)))
def test_small_matmul_is_the_packed_kernels(kind, mode, monkeypatch):
    kw = MODES[mode]
    for (M, K, N) in SHAPES:
        for ta in (False, True):
            for tb in (False, True):
                for dt in (np.float16, np.float32, np.float64):
                    a = _values(kind, (K, M) if ta else (M, K)).astype(dt)
                    b = _values(kind, (N, K) if tb else (K, N), 0.5).astype(dt)
                    bias = None if tb else _values(kind if kind != "zeros" else "normal", (N,), 2.0).astype(np.float32)
                    _both(cube.matmul, monkeypatch, a, b, transpose_a=ta, transpose_b=tb, bias=bias, **kw)


@pytest.mark.parametrize("kind", ["normal", "hostile"])
def test_small_batch_matmul_broadcasts_as_the_packed_kernels(kind, monkeypatch):
    a = _values(kind, (3, 1, 5, 20)).astype(np.float16)
    b = _values(kind, (1, 4, 20, 7), 0.5).astype(bfloat16)
    for kw in MODES[:3]:
        _both(cube.batch_matmul, monkeypatch, a, b, bias=_values("normal", (7,)).astype(np.float32), **kw)
        _both(cube.batch_matmul, monkeypatch, a, np.swapaxes(b, -1, -2), adj_y=True, **kw)


def test_tree_order_is_observable_here():
    """A product whose value depends on the tree's grouping and the K blocks (so the comparisons above
    can fail): 2**24 + 1 - 2**24 in different orders."""
    a = np.ones((1, 18), dtype=np.float32)
    b = np.zeros((18, 1), dtype=np.float32)
    b[0, 0], b[1, 0], b[2, 0], b[16, 0] = 2.0 ** 24, 1.0, -(2.0 ** 24), 1.0
    y, _ = cube.matmul(a, b, operand_dtype="float32", out_dtype="float32")
    # block 0: ((2**24 + 1) + (-2**24 + 0)) + ... = 0 (2**24 + 1 rounds to 2**24); block 1 adds 1
    assert y[0, 0] == 1.0
