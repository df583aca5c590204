"""A product with a transposed 16-bit B (MatMul's transpose_b of a weight: a Dense layer's input gradient dY W^T) and
a few rows of A runs as C^T = B^T A^T (numerics/cube_core._flip_ok): the oracle's bits and status (tests/naive_cube.py),
and the bits and status of the C = A B route it replaced (_flip_ok off) on hostile operands; a NaN operand keeps C = A B."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu.numerics import cube, cube_core

try:
    from . import naive_cube as naive
except ImportError:
    import naive_cube as naive

KWS = [{}, {"out_dtype": "float32"}, {"out_dtype": "float32", "subnormals": "flush"}, {"overflow_mode": "saturation"},
       {"subnormals": "flush", "overflow_mode": "saturation"}]


def _hostile(rng, shape, dtype, big=False):
    """Binades from below fp16's subnormals up to 2**6, both signs, signed zeros, fp16 rounding ties (float32 only),
    infinities in the first row only (the other rows' sums stay finite), values past 65504 in the second (``big``)."""
    x = (rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-26.0, 6.0, shape))).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.random(flat.size) < 0.03] = 0.0
    flat[rng.random(flat.size) < 0.03] = -0.0
    if dtype == np.float32:   # halfway between two fp16 neighbours: ties to even
        t = rng.random(flat.size) < 0.05
        h = flat[t].astype(np.float16)
        flat[t] = (h.astype(np.float64) + np.spacing(np.abs(h)).astype(np.float64) / 2 * np.sign(h)).astype(np.float32)
    if big:   # past fp16's largest in row 1: 65519 rounds to 65504, 65520 (the tie) and beyond overflow to Inf
        row = x.reshape(-1, shape[-1])[1]
        row[[2, 4, 6, 8]] = [65519.0, -65520.0, 7.0e4, -3.0e38]
    x = x.astype(dtype)
    x.reshape(shape[0], -1)[0, 3] = np.inf
    x.reshape(shape[0], -1)[0, 5] = -np.inf
    return x


def _count_flips(monkeypatch):
    flips = []
    real = cube_core._acc

    def acc(*a, **k):
        flips.append(bool(a[11]) if len(a) > 11 else bool(k.get("flip", False)))
        return real(*a, **k)
    monkeypatch.setattr(cube_core, "_acc", acc)
    return flips


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("a32", [False, True], ids=["a16", "a32"])
def test_flipped_product_matches_oracle(monkeypatch, dtype, a32):
    M, K, N = 8, 256, 64
    rng = np.random.default_rng(46 + a32)
    w = _hostile(rng, (N, K), dtype)
    a = _hostile(rng, (M, K), np.float32 if a32 else dtype, big=a32)
    bias = rng.normal(size=N).astype(np.float32)
    operand = "float16" if dtype == np.float16 else "bfloat16"
    flips = _count_flips(monkeypatch)
    for kw in KWS + [{"bias": bias}]:
        ref, rst = naive.matmul(a, np.ascontiguousarray(w.T), operand_dtype=operand, **kw)
        flips.clear()
        ours, st = cube.matmul(a, w, transpose_b=True, operand_dtype=operand, **kw)
        assert flips == [True]
        naive.assert_same_bits(ours, ref, f"{kw}")
        assert st == rst, kw


@pytest.mark.parametrize("M, K, N, stacks", [(32, 512, 512, 0), (16, 300, 1024, 0), (8, 256, 64, 3)],
                         ids=["dense_dx", "odd_k", "stacks"])
def test_flipped_product_is_the_old_routes(monkeypatch, M, K, N, stacks):
    """The Dense layer's shape and others, fp16 and float32 A (rounded, overflowing past 65504, ties), fp16
    outputs overflowing: the C = A B route's bits and status."""
    rng = np.random.default_rng(M + K + N)
    flips = _count_flips(monkeypatch)
    lead = (stacks,) if stacks else ()
    for adt in (np.float16, np.float32):
        w = _hostile(rng, lead + (N, K), np.float16)
        a = _hostile(rng, lead + (M, K), adt, big=adt == np.float32)
        a[..., 2, :] = 30000.0   # a row whose fp16 outputs overflow
        for kw in KWS:
            def run(flip_ok):
                monkeypatch.setattr(cube_core, "_flip_ok", flip_ok)
                if stacks:
                    return cube.batch_matmul(a, w, adj_y=True, **kw)
                return cube.matmul(a, w, transpose_b=True, **kw)
            flips.clear()
            old = run(lambda *x: False)
            assert flips == [False]
            ours = run(_FLIP_OK)
            assert flips == [False, True]
            naive.assert_same_bits(ours[0], old[0], f"{adt} {kw}")
            u = np.uint16 if old[0].dtype.itemsize == 2 else np.uint32
            assert np.array_equal(ours[0].view(u), old[0].view(u)), kw     # the old route's bits, NaN payloads too
            assert ours[1] == old[1], kw
            if kw == {}:
                assert old[1] & 0x100 and np.isinf(old[0][..., 2, :]).any()   # fp16 outputs overflowed


_FLIP_OK = cube_core._flip_ok


@pytest.mark.parametrize("nan_in", ["a", "b"])
def test_a_nan_operand_keeps_the_product_unflipped(monkeypatch, nan_in):
    rng = np.random.default_rng(7)
    w = _hostile(rng, (512, 512), np.float16)
    a = _hostile(rng, (32, 512), np.float16)
    (a if nan_in == "a" else w)[9, 17] = np.nan
    flips = _count_flips(monkeypatch)
    for kw in ({}, {"out_dtype": "float32"}):
        flips.clear()
        ours = cube.matmul(a, w, transpose_b=True, **kw)
        assert flips == [False]
        monkeypatch.setattr(cube_core, "_flip_ok", lambda *x: False)   # the C = A B route of _pack_strided
        old = cube.matmul(a, w, transpose_b=True, **kw)
        u = np.uint16 if old[0].itemsize == 2 else np.uint32
        assert np.array_equal(ours[0].view(u), old[0].view(u)) and ours[1] == old[1]   # NaN payloads too
        monkeypatch.setattr(cube_core, "_flip_ok", _FLIP_OK)
    assert cube_core._flip_ok(w.T[None], cube_core._policy("float16", "float16", "inf_nan", "keep", None), 1, 32, 512,
                              512)


def test_flip_rule_bounds():
    pol = cube_core._policy("float16", "float16", "inf_nan", "keep", None)
    wt = np.zeros((1, 1024, 512), np.float16).transpose(0, 2, 1)   # (1, K 512, N 1024), transposed
    assert cube_core._flip_ok(wt, pol, 1, 32, 1024, 512)
    assert not cube_core._flip_ok(wt, pol, 1, 4, 1024, 512)        # fewer rows than _FEW_COLS
    assert not cube_core._flip_ok(wt, pol, 1, 128, 1024, 512)      # more than _FLIP_ROWS
    assert not cube_core._flip_ok(np.ascontiguousarray(wt), pol, 1, 32, 1024, 512)   # contiguous B: packed as is
    assert not cube_core._flip_ok(wt.astype(np.float32), pol, 1, 32, 1024, 512)      # B to be rounded
    assert not cube_core._flip_ok(wt, cube_core._policy("float32", "float32", "inf_nan", "keep", None), 1, 32, 1024,
                                  512)
