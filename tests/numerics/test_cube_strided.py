"""A 16-bit second operand whose stacks merge only by a copy (an Einsum's transposed keys or values) is widened
and packed into the fast kernel's slabs from its strides (kernels/cube/operands.pack_b16): the oracle's bits
(tests/naive_cube.py), per stack, as for its contiguous copy."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu.numerics import cube, cube_core

try:
    from . import naive_cube as naive
except ImportError:
    import naive_cube as naive


def _operand(rng, shape, dtype):
    # every binade from subnormals to the top, both signs, and a few infinities
    x = (rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-25.0, 15.9, shape))).astype(np.float16)
    x = x.astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.random(flat.size) < 0.01] = np.inf
    flat[rng.random(flat.size) < 0.01] = -np.inf
    return x.astype(dtype)


# (4-D memory, its transposition to (B, N, K, columns), M): keys as the attention scores read them (B S N H ->
# B N H S: K the unit-stride axis, the columns strided; packed from the strides)
CASES = [((2, 260, 2, 16), (0, 2, 3, 1), 8), ((2, 17, 2, 300), (0, 2, 3, 1), 6), ((2, 257, 2, 17), (0, 2, 3, 1), 4),
         ((2, 40, 2, 20), (0, 2, 3, 1), 50)]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=["keys", "long_k", "odd_k", "more_rows"])
def test_strided_second_operand_matches_oracle(monkeypatch, case, dtype):
    shape, perm, M = case
    rng = np.random.default_rng(sum(shape) + M)
    y = _operand(rng, shape, dtype)
    bt = y.transpose(perm)                         # (B, N, K, columns): does not merge to (B*N, K, columns)
    B, N, K, _ = bt.shape
    a = _operand(rng, (B, N, M, K), dtype)
    packed = []
    real = cube_core._pack_strided
    monkeypatch.setattr(cube_core, "_pack_strided", lambda *x: packed.append(1) or real(*x))
    operand = "float16" if dtype == np.float16 else "bfloat16"
    for kw in ({}, {"out_dtype": "float32", "subnormals": "flush"}, {"overflow_mode": "saturation"}):
        packed.clear()
        ours, st = cube.batch_matmul(a, bt, operand_dtype=operand, **kw)
        assert packed == [1]                       # read through its strides, no contiguous copy first
        rst = 0
        for i in range(B):
            for j in range(N):
                ref, s = naive.matmul(a[i, j], np.ascontiguousarray(bt[i, j]), operand_dtype=operand, **kw)
                naive.assert_same_bits(ours[i, j], ref, f"stack {i},{j} {kw}")
                rst |= s
        assert st == rst


@pytest.mark.parametrize("nan_in", ["none", "a", "b"])
def test_strided_operand_keeps_the_orientation_of_its_copy(nan_in):
    """More rows than 8..255 columns: NaN-free operands take C = A B (cube_core._nan_free), a NaN in either keeps the
    transposed product of the contiguous copy; the bits (NaN payloads too) and status are the copy's."""
    rng = np.random.default_rng(11)
    y = _operand(rng, (2, 40, 2, 20), np.float16)
    a = _operand(rng, (2, 2, 60, 20), np.float16)
    if nan_in == "a":
        a[1, 0, 7, 3] = np.nan
    elif nan_in == "b":
        y[0, 5, 1, 2] = np.nan
    bt = y.transpose(0, 2, 3, 1)                   # (B, N, K 20, 40 strided columns): M 60 > 40 columns
    assert cube_core._transposed(60, 40)
    for kw in ({}, {"out_dtype": "float32"}):
        ours, st = cube.batch_matmul(a, bt, **kw)
        copy, st_copy = cube.batch_matmul(a, np.ascontiguousarray(bt), **kw)
        u = np.uint16 if ours.itemsize == 2 else np.uint32
        assert st == st_copy and np.array_equal(ours.view(u), copy.view(u))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("M, K, N", [(32, 20, 80), (5, 33, 260), (100, 17, 40)], ids=["dense_dx", "wide", "tall"])
def test_transposed_2d_operand_matches_oracle(monkeypatch, M, K, N, dtype):
    """MatMul's transpose_b of a 16-bit weight (a Dense layer's input gradient: dY W^T) and BatchMatMul's adj_y:
    the transposed view packed from its strides, the oracle's bits and status."""
    rng = np.random.default_rng(M + K + N)
    w = _operand(rng, (N, K), dtype)
    a = _operand(rng, (M, K), dtype)
    packed = []
    real = cube_core._pack_strided
    monkeypatch.setattr(cube_core, "_pack_strided", lambda *x: packed.append(1) or real(*x))
    operand = "float16" if dtype == np.float16 else "bfloat16"
    for kw in ({}, {"out_dtype": "float32", "subnormals": "flush"}, {"overflow_mode": "saturation"}):
        ref, rst = naive.matmul(a, np.ascontiguousarray(w.T), operand_dtype=operand, **kw)
        packed.clear()
        ours, st = cube.matmul(a, w, transpose_b=True, operand_dtype=operand, **kw)
        assert packed == [1]
        naive.assert_same_bits(ours, ref, f"matmul {kw}")
        assert st == rst
        ours, st = cube.batch_matmul(a[None], w[None], adj_y=True, operand_dtype=operand, **kw)
        naive.assert_same_bits(ours[0], ref, f"batch_matmul {kw}")
        assert st == rst


@pytest.mark.parametrize("fmt, flush", [("fp16", False), ("fp16", True), ("bf16", False), ("bf16", True)])
@pytest.mark.parametrize("N, K", [(256, 256), (300, 225)], ids=["square", "odd_k"])
def test_transposed_weight_packing_every_16_bit_pattern(fmt, flush, N, K):
    """A transposed C-contiguous weight (dY W^T: widened in its own layout, packed by pack_bt) holding every 16-bit
    pattern: each slab value is the pattern's float32 value (subnormals -> signed zero under flush), the rows past K
    and the columns past N up to the 2x2 block edge +0, and the NaN answer is whether a NaN pattern is there."""
    from ascend_emu.kernels import cube as kcube
    from ascend_emu.kernels.cube.tree16 import _tail_columns

    dt = np.float16 if fmt == "fp16" else ml_dtypes.bfloat16
    bits = np.arange(N * K, dtype=np.uint32) % (1 << 16)
    w = bits.astype(np.uint16).view(dt).reshape(N, K)
    pol = cube_core._policy(dt, dt, "inf_nan", "flush" if flush else "keep", None)
    Bp, nan = cube_core._pack_strided(w.T[None], pol, K, N)
    with np.errstate(invalid="ignore"):
        ref = w.T.astype(np.float64)
        if flush:
            tiny = 2.0 ** -14 if fmt == "fp16" else 2.0 ** -126
            ref = np.where((ref != 0) & (np.abs(ref) < tiny), np.copysign(0.0, ref), ref)
        ref = ref.astype(np.float32)
    Kp = -(-K // 16) * 16
    full = np.zeros((Kp, N), np.float32)
    full[:K] = ref
    assert nan() == bool(np.isnan(ref).any())
    for jt in range(Bp.shape[1]):
        j0 = jt * kcube.NC
        jn = min(N, j0 + kcube.NC) - j0
        tc = _tail_columns(jn)
        got = Bp[0, jt, :, :, :tc].reshape(Kp, tc)
        want = np.zeros((Kp, tc), np.float32)
        want[:, :jn] = full[:, j0:j0 + jn]
        naive.assert_same_bits(got, want, f"{fmt} flush={flush} slab {jt}")


@pytest.mark.parametrize("shape", [(4, 2048), (2, 3, 40, 300)], ids=["2-D", "4-D"])
def test_a_broadcast_second_operand_is_copied_not_packed_from_its_strides(shape):
    # a BroadcastTo's view (zero strides, the columns included) as MatMul's b: a weight-gradient product of a
    # Keras model's long_sum layer raised "slice step cannot be zero" in pack_b16 (session 17's whole suite)
    rng = np.random.default_rng(3)
    k = shape[-2]
    a = _operand(rng, shape[:-2] + (k, 24), np.float16)
    row = _operand(rng, shape[:-2] + (1, 1), np.float16)
    b = np.broadcast_to(row, shape)
    if len(shape) == 2:
        run = lambda bb: cube.matmul(a, bb, transpose_a=True)  # noqa: E731
    else:
        run = lambda bb: cube.batch_matmul(a, bb, adj_x=True)  # noqa: E731
    (ours, s1), (ref, s2) = run(b), run(np.ascontiguousarray(b))
    naive.assert_same_bits(ours, ref, shape)
    assert s1 == s2
