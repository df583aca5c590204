"""matmul_tree16_gather's products of at most 16 columns (kernels/cube/implicit.py ``_tree16_8x1``: four row pairs a
block, the last 0-3 pairs one by one; the CNN's input gradient with 16 in-channels, its first filter gradient with 16
out-channels) bit for bit:

- against the same kernel on the same operands with a 17th column (a whole 32-column group, the 2x2 block route the
  narrow products took before): the first 16 columns, NaN payloads included on this host's build (each element's
  nodes and operand order are the same code's; on the 8-lane AVX2 build the machine code may pick the other of two
  meeting NaNs, and every caller keeps NaN operands off this kernel);
- against an independent numpy oracle (float32 step by step: the products, the 16-leaf tree's pairs level by level,
  the accumulator plus the tree per K block from the bias), NaN compared as NaN.

Hostile data: +-Inf, NaN of both signs, -0, float32 and fp16 subnormals, values past 65504, float32 overflow in the
sums, rounding ties; every row count 1..40 (0-3 pairs left after the blocks of four, an odd last row), rows per work
item 1..MC, bias per column or per row, out_rows, both first levels (fma for exact fp16 products).
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.kernels import cube as kc
from ascend_emu.numerics.cube_core import _tiles

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")


def _hostile(rng, n, fp16):
    v = rng.standard_normal(n) * 4.0
    idx = rng.choice(n, n // 6, replace=False)
    pool = [np.inf, -np.inf, -0.0, 0.0, 65504.0, -65504.0, 70000.0, 6e-8, -6e-8, 2.0 ** -24, 1.5, 2.5, -3.5]
    if not fp16:
        pool += [1e-42, -1e-42, 3e38, -3e38, 1e-39]
    v[idx] = rng.choice(pool, idx.size)
    return v.astype(np.float16).astype(np.float32) if fp16 else v.astype(np.float32)


def _oracle(A, B, bias_full):
    """out[i, j] = bias, then per K block q: acc = fl32(acc + tree16(A[i, 16q:], B[16q:, j])), in numpy float32."""
    M, K = A.shape
    acc = bias_full.astype(np.float32).copy()
    with np.errstate(all="ignore"):
        for q in range(K // 16):
            level = [A[:, 16 * q + l, None] * B[None, 16 * q + l, :] for l in range(16)]   # (M, N) float32 each
            while len(level) > 1:
                level = [np.add(level[2 * m], level[2 * m + 1], dtype=np.float32) for m in range(len(level) // 2)]
            acc = np.add(acc, level[0], dtype=np.float32)
    return acc


def _same(x, y):
    """Bit for bit, except that any NaN equals any NaN (numpy's NaN propagation is not the kernel's)."""
    nx, ny = np.isnan(x), np.isnan(y)
    return np.array_equal(nx, ny) and np.array_equal(x[~nx].view(np.uint32), y[~ny].view(np.uint32))


@pytest.mark.parametrize("fp16", [True, False])
@pytest.mark.parametrize("bias_rows", [False, True])
def test_narrow_gather_is_the_two_half_groups_product_and_the_oracle(fp16, bias_rows):
    rng = np.random.default_rng(816 + 2 * fp16 + bias_rows)
    narrow = 0
    for M in range(1, 41):
        nkb = int(rng.integers(1, 4))
        N = int(rng.choice([1, 7, 15, 16]))
        width = int(rng.choice([16, 32, 48, 64]))
        mc = int(rng.choice([1, 2, 3, 5, 8, 9, 16, 17, 40, kc.MC]))
        fma = fp16 and bool(rng.integers(2))   # (the fused first level: exact products only)
        # A's rows scattered in a (gaps between them, K blocks at their own offsets), B's blocks in b at b_q
        a = _hostile(rng, 64 * M * nkb + 64, fp16)
        a_q = (np.arange(nkb) * 16 + rng.integers(0, 5, nkb)).astype(np.uintp)
        a_rows = rng.permutation(M * 3)[:M].astype(np.uintp) * np.uintp(16 * nkb + 8)
        a = np.concatenate([a, np.zeros(int(a_rows.max() + a_q.max()) + 32, np.float32)])
        if rng.integers(2):   # NaNs of both signs in A (the 17-column comparison only: payloads)
            a[rng.choice(a.size, 3, replace=False)] = np.array([np.nan, -np.nan, np.nan], np.float32)
        b = _hostile(rng, nkb * 16 * width + 15 * width + 64, fp16)
        b_q = (np.arange(nkb) * 16 * width).astype(np.uintp)
        b_g = np.zeros(1, np.uintp)
        nan_free = not np.isnan(a).any()
        q, l, j = np.meshgrid(np.arange(nkb), np.arange(16), np.arange(17), indexing="ij")
        B = b[(b_q[q].astype(np.int64) + width * l + j)].reshape(16 * nkb, 17)
        Af = a[(a_rows.astype(np.int64)[:, None, None] + a_q.astype(np.int64)[None, :, None]
                + np.arange(16)[None, None, :])].reshape(M, 16 * nkb)
        bias = rng.standard_normal((1, max(M, 17))).astype(np.float32)
        bias[0, rng.integers(0, bias.shape[1])] = -0.0
        outs = []
        for n in (N, 17):
            out = np.full((M, n), 7.0, np.float32)
            kc.matmul_tree16_gather(a, a_rows, a_q, b, b_q, b_g, width, bias, bias_rows, out, _tiles(), fma, mc)
            outs.append(out)
        got, wide = outs
        narrow += M >= 8
        assert np.array_equal(got.view(np.uint32), wide[:, :N].view(np.uint32)), (M, N, nkb, width, mc, fma)
        full = np.broadcast_to(bias[0, :M, None] if bias_rows else bias[0, None, :N], (M, N))
        if nan_free:
            assert _same(got, _oracle(Af, B[:, :N], full)), (M, N, nkb, width, mc, fma)
        # out_rows: each row to its own row of a bigger output, nothing else touched
        rows = rng.permutation(M + 5)[:M].astype(np.uintp)
        big = np.full((M + 5, N), 7.0, np.float32)
        kc.matmul_tree16_gather(a, a_rows, a_q, b, b_q, b_g, width, bias, bias_rows, big, _tiles(), fma, mc, None,
                                rows)
        assert np.array_equal(big[rows.astype(np.int64)].view(np.uint32), got.view(np.uint32))
        assert (np.delete(big, rows.astype(np.int64), axis=0) == 7.0).all()
    assert narrow > 20


def test_narrow_gather_of_the_cnn_input_gradient_geometry():
    """The CNN's Conv2DBackpropInput geometry (dy 2x8x16x32 -> dx 2x16x32x16, stride 2, 3x3) through the
    pixel-rows route (the gather, 16 columns) against the numpy oracle of the transposed convolution's classes: the
    route's bits are conv2d's of the zero-inserted dy (tests/numerics/test_conv_pixel_rows.py compares the routes);
    here the kernel's rows per work item vary (row_block) and every pixel is checked."""
    from ascend_emu.numerics import conv as nconv
    from ascend_emu.numerics import conv_grad as ngrad

    rng = np.random.default_rng(46)
    dy = (rng.standard_normal((2, 8, 16, 32)) * 2).astype(np.float16)
    dy.reshape(-1)[rng.choice(dy.size, 60, replace=False)] = rng.choice(
        np.array([65504, -65504, 0.0, -0.0, 6e-8, -6e-8], np.float16), 60)
    w = (rng.standard_normal((3, 3, 16, 32)) * 0.5).astype(np.float16)
    calls = []
    real = nconv._k.matmul_tree16_gather

    def spy(*a):
        calls.append(a[9].shape[1])
        return real(*a)

    nconv._k.matmul_tree16_gather = spy
    try:
        got = ngrad.conv2d_backprop_input(dy, w, (2, 2), ((1, 2), (1, 2)), (1, 1), out_dtype="float32")[0]
    finally:
        nconv._k.matmul_tree16_gather = real
    assert calls == [16] * 4, calls   # the four pixel classes, 16 columns each
    # the oracle: dx = VALID conv of the zero-inserted, padded dy with the rotated filter, K in (kh, kw, c) order
    dz = ngrad.zero_inserted(dy, 2, 2, (1, 2), (1, 2)).astype(np.float32)
    wr = w[::-1, ::-1].transpose(0, 1, 3, 2).astype(np.float32)   # (3, 3, 32, 16)
    N, Hz, Wz, C = dz.shape
    H, W = Hz - 2, Wz - 2
    cols = np.stack([dz[:, i:i + H, j:j + W, :] for i in range(3) for j in range(3)], axis=3).reshape(N * H * W, 9 * C)
    want = _oracle(cols, wr.reshape(9 * C, 16), np.zeros((N * H * W, 16), np.float32))
    assert _same(got.reshape(-1, 16), want)
