"""The cube unit against the slow oracle (tests/naive_cube.py), bit for bit, and against TensorFlow."""
from __future__ import annotations

import zlib

import ml_dtypes
import numba
import numpy as np
import pytest

from ascend_emu.numerics import policy as config
from ascend_emu.numerics import cube
from ascend_emu.numerics.policy import CubeModel
from ascend_emu.errors import AscendEmuError
from ascend_emu.kernels import cast as _kcast
from ascend_emu.kernels import cube as kcube

try:
    from . import naive_cube as naive
except ImportError:
    import naive_cube as naive

BF16 = ml_dtypes.bfloat16
DT = {"float16": np.float16, "bfloat16": BF16, "float32": np.float32}


# ---------------------------------------------------------------- helpers

def assert_same_bits(ours, ref, what=""):
    """Equal bit patterns everywhere; NaN matches NaN (payloads are not modelled)."""
    ours = np.asarray(ours)
    ref = np.asarray(ref)
    assert ours.dtype == ref.dtype, (ours.dtype, ref.dtype)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    u = np.uint16 if ours.dtype.itemsize == 2 else np.uint32
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        o64 = ours.astype(np.float64)
        r64 = ref.astype(np.float64)
    nan_o, nan_r = np.isnan(o64), np.isnan(r64)
    assert (nan_o == nan_r).all(), f"{what}: NaN positions differ at {np.argwhere(nan_o != nan_r)[:5].tolist()}"
    ob = ours.view(u)[~nan_o]
    rb = ref.view(u)[~nan_r]
    bad = np.flatnonzero(ob != rb)
    assert bad.size == 0, (f"{what}: {bad.size} of {ob.size} differ, first: ours {o64[~nan_o][bad[:4]]} "
                           f"ref {r64[~nan_r][bad[:4]]}")


def fp16_values(rng, shape, kind):
    """fp16 test operands of one family."""
    if kind == "normal":
        x = rng.standard_normal(shape)
    elif kind == "wide":  # every binade from subnormals to the top, both signs
        x = rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-25.0, 15.9, shape))
    elif kind == "tiny":
        x = rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-24.0, -10.0, shape))
    elif kind == "big":  # sums overflow the fp16 output
        x = rng.uniform(100.0, 400.0, shape) * rng.choice([-1.0, 1.0, 1.0, 1.0], shape)
    else:
        raise ValueError(kind)
    return x.astype(np.float16)


def cancelling(rng, M, K, N, dtype=np.float16):
    """Operands whose K terms come in exactly cancelling pairs (+big, -big) in different blocks, plus small terms."""
    h = K // 2
    a_big = (rng.choice([-1.0, 1.0], (M, h)) * np.exp2(rng.integers(6, 15, (M, h))) * rng.uniform(1, 2, (M, h)))
    b_big = rng.standard_normal((h, N)) * 8
    a = np.concatenate([a_big, a_big], axis=1)
    b = np.concatenate([b_big, -b_big], axis=0)
    if K % 2:
        a = np.concatenate([a, rng.standard_normal((M, 1)) * 1e-3], axis=1)
        b = np.concatenate([b, rng.standard_normal((1, N))], axis=0)
    # sprinkle small terms so the exact sums are small but not zero
    small = rng.random((M, K)) < 0.25
    a = np.where(small, rng.standard_normal((M, K)) * 2.0 ** -8, a)
    perm = rng.permutation(K)
    return a[:, perm].astype(dtype), b[perm, :].astype(dtype)


def check_matmul(a, b, bias=None, **kw):
    ours, st = cube.matmul(a, b, bias=bias, **kw)
    ref, rst = naive.matmul(a, b, bias=bias, **kw)
    assert_same_bits(ours, ref, f"matmul {a.shape}x{b.shape} {kw}")
    assert st == rst, f"status 0x{st:x} != oracle 0x{rst:x} ({kw})"
    return ours, st


# ---------------------------------------------------------------- default model, bit for bit

SHAPES = [(5, 1, 3), (3, 15, 4), (4, 16, 5), (7, 17, 6), (6, 40, 9), (5, 73, 8), (3, 0, 2)]


@pytest.mark.parametrize("kind", ["normal", "wide", "tiny", "big"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_default_model_matches_oracle(kind, shape):
    M, K, N = shape
    rng = np.random.default_rng(zlib.crc32(repr((kind, shape)).encode()))
    a = fp16_values(rng, (M, K), kind)
    b = fp16_values(rng, (K, N), kind)
    bias = (rng.standard_normal(N) * 4).astype(np.float32)
    for out_dtype in ("float16", "float32", "bfloat16"):
        for overflow_mode in ("inf_nan", "saturation"):
            check_matmul(a, b, out_dtype=out_dtype, overflow_mode=overflow_mode)
    check_matmul(a, b, bias=bias)
    check_matmul(a, b, bias=bias, out_dtype="float32", subnormals="flush")


@pytest.mark.parametrize("K", [16, 31, 48, 67])
def test_cancelling_terms_match_oracle(K):
    rng = np.random.default_rng(K)
    a, b = cancelling(rng, 6, K, 7)
    bias = (rng.standard_normal(7) * 1e3).astype(np.float32)
    ours, _ = check_matmul(a, b, out_dtype="float32")
    check_matmul(a, b, bias=bias, out_dtype="float32")
    check_matmul(a, b, bias=bias)
    # the exact sums are tiny next to the partial sums, so the order matters: the test can tell models apart
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(ours - exact).max() > 0


def test_fp16_output_overflow_status_and_saturation():
    a = np.full((2, 20), 200.0, np.float16)
    b = np.full((20, 3), 30.0, np.float16)  # 20 * 6000 = 120000 > 65504
    b[:, 1] = -30.0
    b[:, 2] = 0.5
    out, st = check_matmul(a, b)
    assert st == 0x100 and np.isinf(out[:, :2]).all() and (out[:, 2] == 2000).all()
    out, st = check_matmul(a, b, overflow_mode="saturation")
    assert st == 0x100 and (out[:, 0] == 65504).all() and (out[:, 1] == -65504).all()


def test_accumulator_overflow_bf16():
    """bf16 operands reach fp32's range: the accumulator overflows (0x400) and Inf - Inf makes NaN."""
    rng = np.random.default_rng(7)
    a = (np.exp2(rng.uniform(95, 100, (4, 37))) * rng.choice([-1, 1, 1], (4, 37))).astype(BF16)
    b = (np.exp2(rng.uniform(25, 28, (37, 5)))).astype(BF16)
    for out_dtype in ("float32", "float16", "bfloat16"):
        for mode in ("inf_nan", "saturation"):
            out, st = check_matmul(a, b, operand_dtype="bfloat16", out_dtype=out_dtype, overflow_mode=mode)
            assert st & 0x400
            if mode == "saturation":
                assert np.isfinite(out.astype(np.float64)).all()
    # bias near FLT_MAX plus positive products
    bias = np.full(5, 3.3e38, np.float32)
    pos = np.abs(a.astype(np.float32)).astype(BF16)
    out, st = check_matmul(pos, b, bias=bias, operand_dtype="bfloat16", out_dtype="float32")
    assert st == 0x400 and np.isposinf(out).all()
    out, st = check_matmul(pos, b, bias=bias, operand_dtype="bfloat16", out_dtype="float32",
                           overflow_mode="saturation")
    assert st == 0x400 and (out == np.finfo(np.float32).max).all()


def test_bf16_products_leave_fp32_range():
    """bf16 x bf16 can underflow or overflow fp32: the product is rounded to fp32 first."""
    a = np.array([[2.0 ** -100, 2.0 ** 100, 3.0 * 2.0 ** -70, 1.0]], dtype=BF16)
    b = np.array([[2.0 ** -40], [2.0 ** 30], [2.0 ** -70], [1.0]], dtype=BF16)
    for mode in ("inf_nan", "saturation"):
        check_matmul(a, b, operand_dtype="bfloat16", out_dtype="float32", overflow_mode=mode)
        check_matmul(a, b, operand_dtype="bfloat16", out_dtype="float32", subnormals="flush")


def test_inf_nan_operands():
    rng = np.random.default_rng(3)
    a = fp16_values(rng, (4, 20), "normal")
    b = fp16_values(rng, (20, 6), "normal")
    a[0, 3] = np.inf
    a[1, 5] = np.nan
    a[2, 1], a[2, 18] = np.inf, -np.inf
    b[7, 4] = -np.inf
    for out_dtype in ("float16", "float32"):
        for mode in ("inf_nan", "saturation"):
            _, st = check_matmul(a, b, out_dtype=out_dtype, overflow_mode=mode)
            assert st & 0x400


def test_signed_zeros_and_bias():
    """-0 bias with -0 products: a full 16-block tree keeps -0, a padded partial block gives +0."""
    a = np.full((1, 32), -0.0, np.float16)
    b = np.ones((32, 1), np.float16)
    bias = np.array([-0.0], np.float32)
    out, _ = check_matmul(a, b, bias=bias, out_dtype="float32")
    assert np.signbit(out[0, 0])
    out, _ = check_matmul(a[:, :20], b[:20], bias=bias, out_dtype="float32")
    assert not np.signbit(out[0, 0])


def test_float32_inputs_are_rounded_to_the_operand_dtype():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((5, 21)).astype(np.float32)
    b = (rng.standard_normal((21, 4)) * 3).astype(np.float32)
    a[0, 0] = 1e5  # overflows fp16: 0x100
    a[1, 1] = np.nan  # 0x20
    a[2, 2] = 3e-8  # fp16 subnormal
    for op in ("float16", "bfloat16"):
        for mode in ("inf_nan", "saturation"):
            for sub in ("keep", "flush"):
                out, st = check_matmul(a, b, operand_dtype=op, overflow_mode=mode, subnormals=sub,
                                       out_dtype="float32")
                assert (st & 0x120) == (0x120 if op == "float16" else 0x20)  # 1e5 overflows fp16 only
    # float64 inputs round once to fp16
    check_matmul(a.astype(np.float64) * (1 + 2.0 ** -30), b.astype(np.float64), out_dtype="float32")


def test_float32_operand_path():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 35)).astype(np.float32)
    b = rng.standard_normal((35, 5)).astype(np.float32)
    for out_dtype in ("float32", "float16"):
        check_matmul(a, b, operand_dtype="float32", out_dtype=out_dtype)
    check_matmul(a.astype(np.float64), b, operand_dtype="float32", out_dtype="float32", subnormals="flush")


def test_output_subnormals_flush():
    a = np.full((2, 3), 2.0 ** -12, np.float16)
    b = np.full((3, 2), 2.0 ** -5, np.float16)  # 3 * 2^-17: fp16 subnormal
    out, _ = check_matmul(a, b)
    assert out[0, 0] != 0
    out, _ = check_matmul(a, b, subnormals="flush")
    assert (out == 0).all()


def test_tiles_and_odd_rows_match_oracle():
    """More columns than one column tile (512), an odd row count (the single-row path), several row chunks."""
    rng = np.random.default_rng(1)
    a = fp16_values(rng, (3, 33), "normal")
    b = fp16_values(rng, (33, kcube.NC + 19), "wide")
    check_matmul(a, b, out_dtype="float32")


@pytest.mark.parametrize("M, K, N", [(2 * kcube.MC + 7, 301, kcube.NC + 45), (kcube.NC + 77, 101, 40)])
def test_large_product_sampled_against_oracle(M, K, N):
    """Products spanning many row chunks and column tiles (both orientations): random elements vs the oracle."""
    rng = np.random.default_rng(M)
    a = fp16_values(rng, (M, K), "normal")
    b = fp16_values(rng, (K, N), "normal")
    bias = rng.standard_normal(N).astype(np.float32)
    out, _ = cube.matmul(a, b, bias=bias, out_dtype="float32")
    av, bv = a.astype(np.float64), b.astype(np.float64)
    for i, j in zip(rng.integers(0, M, 60), rng.integers(0, N, 60)):
        ref = naive.dot(av[i], bv[:, j], float(bias[j]))
        assert np.float32(ref).view(np.uint32) == out[i, j].view(np.uint32), (i, j)


def fast_kernel(a, b, bias, bias_rows=False, fma=False, mc=kcube.MC, aligned=True):
    """(out, slab width) of kcube.matmul_tree16 on (1, M, Kp) @ (1, Kp, N) float32 stacks; aligned=False
    packs B into a plain np.empty (the kernel must not rely on alignment)."""
    M, N = a.shape[1], b.shape[2]
    shape = kcube.slab_shape(1, N, b.shape[1])
    Bp = kcube.empty_slabs(shape) if aligned else np.empty(shape, np.float32)
    kcube.pack_b(b, Bp)
    tiles = kcube.empty_slabs((numba.config.NUMBA_NUM_THREADS, kcube.TILE))
    out = np.empty((1, M, N), np.float32)
    z = np.zeros(1, np.int64)
    kcube.matmul_tree16(a, Bp, bias, bias_rows, z, z, out, tiles, fma, mc)
    return out, Bp.shape[4]


def generic_kernel(a, b, bias, bias_rows, K):
    """kcube.matmul_blocked under the default model (tree of 16), the reference for the fast kernel."""
    out = np.empty((1, a.shape[1], b.shape[2]), np.float32)
    z = np.zeros(1, np.int64)
    kcube.matmul_blocked(a, b, bias, bias_rows, z, z, out, K, 16, kcube.TREE, 3, kcube.NORM_TRUNCATE)
    return out


def test_fast_kernel_equals_generic_kernel_on_large_inputs():
    """The blocked tree16 kernel and the generic block-step kernel agree bit for bit at scale."""
    rng = np.random.default_rng(4)
    M, K, N = 77, 400, 600
    a, b = cancelling(rng, M, K, N, np.float32)
    a = a.astype(np.float16).astype(np.float32)
    b = b.astype(np.float16).astype(np.float32)
    A, B = np.ascontiguousarray(a[None]), np.ascontiguousarray(b[None])  # the fast kernel's layout
    bias = rng.standard_normal(N).astype(np.float32)
    for bias_rows in (False, True):
        b2 = bias[None, :M] if bias_rows else bias[None]
        fast, _ = fast_kernel(A, B, b2, bias_rows, aligned=False)
        assert_same_bits(fast, generic_kernel(A, B, b2, bias_rows, K))


@pytest.mark.parametrize("fma", [False, True])
def test_fast_kernel_every_slab_width_and_column_tail(fma):
    """Every slab width of the micro-kernel and every column tail (N mod 32) agree with the generic kernel."""
    rng = np.random.default_rng(5)
    widths = set()
    for M, K, N in [(3, 16, 1), (4, 40, 31), (5, 33, 33), (2, 20, 64), (7, 48, 65), (1, 17, 128), (6, 32, 129),
                    (3, 64, 256), (9, 16, 257), (4, 50, 511), (5, 31, 513), (3, 16, 1100)]:
        kp = -(-K // 16) * 16
        a = np.zeros((1, M, kp), np.float32)
        b = np.zeros((1, kp, N), np.float32)
        a[0, :, :K] = fp16_values(rng, (M, K), "wide")
        b[0, :K] = fp16_values(rng, (K, N), "wide")
        bias = rng.standard_normal((1, N)).astype(np.float32)
        fast, width = fast_kernel(a, b, bias, fma=fma)
        widths.add(width)
        assert_same_bits(fast, generic_kernel(a, b, bias, False, K))
    assert widths == set(kcube.SLABS)


def test_fast_kernel_bits_do_not_depend_on_the_row_blocking():
    """Rows per work item (row_block's load balancing) only regroup outputs, never their additions."""
    rng = np.random.default_rng(6)
    M, K, N = 37, 48, 70
    a = np.ascontiguousarray(fp16_values(rng, (1, M, K), "wide").astype(np.float32))
    b = fp16_values(rng, (1, K, N), "wide").astype(np.float32)
    bias = rng.standard_normal((1, M)).astype(np.float32)
    outs = [fast_kernel(a, b, bias, True, True, mc)[0] for mc in (1, 2, 7, 19, kcube.MC)]
    for out in outs[1:]:
        assert_same_bits(out, outs[0])
    assert kcube.row_block(392, 1, 2) == 98 and kcube.row_block(4096, 1, 2) == kcube.MC
    with pytest.raises(ValueError, match="mc"):
        fast_kernel(a, b, bias, True, True, kcube.MC + 1)


# ---------------------------------------------------------------- other block models

MODELS = [
    CubeModel(block_sum="sequential"),
    CubeModel(block_size=1),
    CubeModel(block_size=4),
    CubeModel(block_size=5),
    CubeModel(block_size=8),
    CubeModel(block_size=32),
    CubeModel(block_sum="aligned"),
    CubeModel(block_sum="aligned", normalize="rne"),
    CubeModel(block_sum="aligned", extra_bits=0),
    CubeModel(block_sum="aligned", extra_bits=0, normalize="rne"),
    CubeModel(block_sum="aligned", extra_bits=8, block_size=8),
    CubeModel(block_sum="aligned", extra_bits=2, block_size=4, normalize="rne"),
]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: f"{m.block_sum}-{m.block_size}-{m.extra_bits}-{m.normalize}")
def test_models_match_oracle(model):
    rng = np.random.default_rng(zlib.crc32(repr(model).encode()))
    for K in (7, 16, 37):
        for kind in ("normal", "wide"):
            a = fp16_values(rng, (4, K), kind)
            b = fp16_values(rng, (K, 5), kind)
            check_matmul(a, b, out_dtype="float32", model=model)
        a, b = cancelling(rng, 4, K, 5)
        bias = (rng.standard_normal(5) * 100).astype(np.float32)
        check_matmul(a, b, bias=bias, out_dtype="float32", model=model)
        check_matmul(a, b, bias=bias, model=model, overflow_mode="saturation")
    # fp32 range: overflow, Inf - Inf, underflow into fp32 subnormals
    a = (np.exp2(rng.uniform(-120, 100, (3, 23))) * rng.choice([-1, 1], (3, 23))).astype(BF16)
    b = np.exp2(rng.uniform(-30, 28, (23, 4))).astype(BF16)
    for mode in ("inf_nan", "saturation"):
        check_matmul(a, b, operand_dtype="bfloat16", out_dtype="float32", model=model, overflow_mode=mode)
    tiny = (np.exp2(rng.uniform(-75, -62, (3, 19))) * rng.choice([-1, 1], (3, 19))).astype(BF16)
    check_matmul(tiny, tiny.T.copy(), operand_dtype="bfloat16", out_dtype="float32", model=model)


def test_models_give_different_results():
    """The model parameter is honoured: on cancelling sums the three block sums disagree somewhere."""
    rng = np.random.default_rng(9)
    a, b = cancelling(rng, 20, 64, 20)
    res = {}
    for m in (CubeModel(), CubeModel(block_sum="sequential"), CubeModel(block_sum="aligned", extra_bits=0)):
        res[m.block_sum] = cube.matmul(a, b, out_dtype="float32", model=m)[0].view(np.uint32)
    assert (res["tree"] != res["sequential"]).any()
    assert (res["tree"] != res["aligned"]).any()


def test_aligned_overflow_is_inf_under_truncation():
    big = np.array([[2.0 ** 127, 2.0 ** 127]], np.float32)
    one = np.ones((2, 1), np.float32)
    m = CubeModel(block_sum="aligned", normalize="truncate")
    out, st = check_matmul(big, one, operand_dtype="float32", out_dtype="float32", model=m)
    assert np.isposinf(out[0, 0]) and st == 0x400


# ---------------------------------------------------------------- transposes, batches

def test_transposes():
    rng = np.random.default_rng(6)
    a = fp16_values(rng, (9, 20), "normal")
    b = fp16_values(rng, (20, 11), "normal")
    ref, _ = cube.matmul(a, b)
    for ta in (False, True):
        for tb in (False, True):
            out, _ = cube.matmul(a.T if ta else a, b.T if tb else b, transpose_a=ta, transpose_b=tb)
            assert_same_bits(out, ref)


@pytest.mark.parametrize("shape", [(130, 17, 9), (70, 40, 33), (300, 20, 8)], ids=lambda s: "x".join(map(str, s)))
def test_few_columns_stay_untransposed_and_match_oracle(shape, monkeypatch):
    """More rows than 8..255 columns, past the small kernel: the fast kernel computes C = A B (the first kernel
    computed C^T = B^T A^T there); the oracle's bits, and the transposed product's bits to the last one
    (Inf operands too: only a NaN operand's choice between two NaNs depends on the orientation)."""
    from ascend_emu.numerics import cube_core

    M, K, N = shape
    rng = np.random.default_rng(zlib.crc32(repr(shape).encode()))
    a = fp16_values(rng, (M, K), "wide")
    b = fp16_values(rng, (K, N), "big")
    a[rng.random((M, K)) < 0.02] = np.inf
    b[rng.random((K, N)) < 0.02] = -np.inf          # Inf - Inf: NaN sums; Inf x 0 in the K padding: none
    bias = (rng.standard_normal(N) * 4).astype(np.float32)
    assert cube_core._transposed(M, N) and M * N * (-(-K // 16) * 16) > cube_core._SMALL_TERMS
    seen = []
    real = cube_core._nan_free
    monkeypatch.setattr(cube_core, "_nan_free", lambda v: seen.append(real(v)) or seen[-1])
    for kw in ({}, {"out_dtype": "float32"}, {"bias": bias, "overflow_mode": "saturation"}):
        seen.clear()
        ours, st = check_matmul(a, b, **kw)
        assert seen == [True, True]                   # both operands NaN-free: the direct product
        with monkeypatch.context() as m:
            m.setattr(cube_core, "_nan_free", lambda v: False)
            old, st_old = cube.matmul(a, b, **kw)
        assert st == st_old and np.array_equal(ours.view(np.uint16 if ours.itemsize == 2 else np.uint32),
                                               old.view(np.uint16 if old.itemsize == 2 else np.uint32))
    a[3, 5] = np.nan
    seen.clear()
    check_matmul(a, b)
    assert seen == [False]                            # a NaN operand: the orientation it always had


def test_batch_matmul_broadcasts_like_tf():
    rng = np.random.default_rng(8)
    a = fp16_values(rng, (2, 1, 5, 19), "normal")
    b = fp16_values(rng, (3, 19, 4), "normal")
    bias = rng.standard_normal(4).astype(np.float32)
    out, st = cube.batch_matmul(a, b, bias=bias, out_dtype="float32")
    assert out.shape == (2, 3, 5, 4) and st == 0
    for i in range(2):
        for j in range(3):
            ref, _ = naive.matmul(a[i, 0], b[j], bias=bias, out_dtype="float32")
            assert_same_bits(out[i, j], ref)
    out2, _ = cube.batch_matmul(np.swapaxes(a, -1, -2), np.swapaxes(b, -1, -2), adj_x=True, adj_y=True,
                                bias=bias, out_dtype="float32")
    assert_same_bits(out2, out)
    out3, _ = cube.batch_matmul(a[0, 0], b[0])  # rank 2 both
    assert_same_bits(out3, cube.matmul(a[0, 0], b[0])[0])


def test_deterministic():
    rng = np.random.default_rng(10)
    a, b = cancelling(rng, 70, 130, 90)
    r1, _ = cube.matmul(a, b, out_dtype="float32")
    r2, _ = cube.matmul(a.copy(), b.copy(), out_dtype="float32")
    assert_same_bits(r1, r2)


# ---------------------------------------------------------------- convolutions

CONV_CASES = [
    # (x shape, (KH, KW, Cout or multiplier), strides, padding, dilations)
    ((2, 7, 6, 3), (3, 2, 5), (1, 1), "VALID", (1, 1)),
    ((1, 8, 9, 4), (3, 3, 2), (2, 2), "SAME", (1, 1)),
    ((2, 9, 7, 3), (3, 3, 3), (1, 2), "SAME", (1, 1)),
    ((1, 10, 9, 2), (3, 2, 3), (1, 1), "SAME", (2, 3)),
    ((1, 7, 8, 5), (2, 3, 4), (2, 1), [[1, 2], [0, 3]], (1, 1)),
    ((1, 6, 6, 7), (1, 1, 3), (1, 1), "VALID", (1, 1)),
    ((1, 11, 10, 2), (5, 5, 2), (3, 2), "SAME", (1, 1)),
]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv2d_matches_oracle(case):
    xs, (KH, KW, CO), strides, padding, dil = CONV_CASES[case]
    rng = np.random.default_rng(100 + case)
    x = fp16_values(rng, xs, "normal")
    w = fp16_values(rng, (KH, KW, xs[3], CO), "wide")
    bias = rng.standard_normal(CO).astype(np.float32)
    for kw in (dict(out_dtype="float32"), dict(bias=bias), dict(out_dtype="float32", model=CubeModel(block_size=8)),
               dict(out_dtype="float32", model=CubeModel(block_sum="aligned"))):
        ours, st = cube.conv2d(x, w, strides=strides, padding=padding, dilations=dil, **kw)
        ref, rst = naive.conv2d(x, w, strides, padding, dil, **kw)
        assert_same_bits(ours, ref, f"conv2d case {case} {kw}")
        assert st == rst


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_depthwise_matches_oracle(case):
    xs, (KH, KW, mult), strides, padding, dil = CONV_CASES[case]
    mult = 1 + case % 3
    rng = np.random.default_rng(200 + case)
    x = fp16_values(rng, xs, "normal")
    w = fp16_values(rng, (KH, KW, xs[3], mult), "wide")
    bias = rng.standard_normal(xs[3] * mult).astype(np.float32)
    for kw in (dict(out_dtype="float32"), dict(bias=bias), dict(out_dtype="float32", model=CubeModel(block_size=4)),
               dict(out_dtype="float32", model=CubeModel(block_sum="sequential")),
               dict(bias=bias, model=CubeModel(block_sum="aligned", normalize="rne"))):
        ours, st = cube.depthwise_conv2d(x, w, strides=strides, padding=padding, dilations=dil, **kw)
        ref, rst = naive.conv2d(x, w, strides, padding, dil, depthwise=True, **kw)
        assert_same_bits(ours, ref, f"depthwise case {case} {kw}")
        assert st == rst


@pytest.mark.parametrize("k", [3, 5])
def test_depthwise_partial_block_keeps_the_signed_zero_rule(k):
    """A 3x3 (or 5x5) filter's last block holds 9 taps and 7 +0 padding products: the kernel sums only the 9
    (kernels/cube/conv.py _dw_tree9), which must give the 16-leaf tree's bits, where -0 + +0 is +0. All-(-0)
    products with a -0 bias give +0 through the tree (a plain sum of the nine would give -0)."""
    x = np.full((1, 6, 7, 4), -0.0, np.float16)
    w = np.abs(fp16_values(np.random.default_rng(7), (k, k, 4, 1), "wide"))
    bias = np.full(4, -0.0, np.float32)
    for kw in (dict(out_dtype="float32", bias=bias), dict(bias=bias)):
        ours, st = cube.depthwise_conv2d(x, w, strides=(1, 1), padding="VALID", dilations=(1, 1), **kw)
        ref, rst = naive.conv2d(x, w, (1, 1), "VALID", (1, 1), depthwise=True, **kw)
        assert_same_bits(ours, ref, f"depthwise {k}x{k} signed zeros {kw}")
        assert not np.signbit(np.asarray(ours, np.float32)).any() and st == rst
    rng = np.random.default_rng(8)
    x = fp16_values(rng, (2, 9, 8, 5), "normal")
    x[..., ::2] = -x[..., ::2] * 0     # a mix of -0 and +0 inputs beside ordinary ones
    w = fp16_values(rng, (k, k, 5, 1), "wide")
    ours, _ = cube.depthwise_conv2d(x, w, strides=(1, 1), padding="SAME", dilations=(1, 1), out_dtype="float32")
    ref, _ = naive.conv2d(x, w, (1, 1), "SAME", (1, 1), depthwise=True, out_dtype="float32")
    assert_same_bits(ours, ref, f"depthwise {k}x{k} mixed zeros")


C1HWC0 = CubeModel(conv_k_order="c1hwc0")


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv2d_c1hwc0_order_matches_oracle(case):
    """conv_k_order='c1hwc0': K in (cin // 16, kh, kw, cin % 16) over channels zero-padded to 16."""
    xs, (KH, KW, CO), strides, padding, dil = CONV_CASES[case]
    rng = np.random.default_rng(150 + case)
    x = fp16_values(rng, xs, "normal")
    w = fp16_values(rng, (KH, KW, xs[3], CO), "wide")
    bias = rng.standard_normal(CO).astype(np.float32)
    for kw in (dict(out_dtype="float32", model=C1HWC0), dict(bias=bias, model=C1HWC0),
               dict(out_dtype="float32", model=CubeModel(conv_k_order="c1hwc0", block_sum="sequential")),
               dict(out_dtype="float32", model=CubeModel(conv_k_order="c1hwc0", block_sum="aligned"))):
        ours, st = cube.conv2d(x, w, strides=strides, padding=padding, dilations=dil, **kw)
        ref, rst = naive.conv2d(x, w, strides, padding, dil, **kw)
        assert_same_bits(ours, ref, f"conv2d case {case} {kw}")
        assert st == rst


@pytest.mark.parametrize("cin, cout", [(37, 3), (32, 5), (20, 300)])
def test_conv2d_c1hwc0_many_channels_and_both_layouts(cin, cout):
    """Several channel groups, a partial last group, and the Cout >= 256 (untransposed) path."""
    rng = np.random.default_rng(cin + cout)
    x = fp16_values(rng, (1, 6, 5, cin), "normal")
    w = fp16_values(rng, (3, 3, cin, cout), "normal")
    ours, _ = cube.conv2d(x, w, padding="SAME", out_dtype="float32", model=C1HWC0)
    ref, _ = naive.conv2d(x, w, (1, 1), "SAME", (1, 1), out_dtype="float32", model=C1HWC0)
    assert_same_bits(ours, ref)


def test_conv2d_k_orders_differ_and_agree_with_tensorflow_bound():
    """With Cin = 32 both orders use the same 16-term blocks, in another order: other bits on cancelling
    sums, both within fp32 accumulation error of TensorFlow."""
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(31)
    a, b = cancelling(rng, 60, 3 * 3 * 32, 8)  # rows of a are pixels' im2col rows in (kh, kw, cin) order
    # 60 output pixels, each a VALID 3x3 window of its own, side by side: (1, 3, 180, 32), stride (1, 3)
    x = np.concatenate(list(a.reshape(60, 3, 3, 32)), axis=1)[None]
    w = b.reshape(3, 3, 32, 8)
    hwc, _ = cube.conv2d(x, w, strides=(1, 3), out_dtype="float32")
    c1, _ = cube.conv2d(x, w, strides=(1, 3), out_dtype="float32", model=C1HWC0)
    assert hwc.shape == c1.shape == (1, 1, 60, 8)
    assert np.any(hwc.view(np.uint32) != c1.view(np.uint32))
    exp = tf.nn.conv2d(tf.constant(x.astype(np.float32)), tf.constant(w.astype(np.float32)), strides=(1, 3),
                       padding="VALID").numpy()
    bound = _tf_bound(tf, tf.nn.conv2d, x, w, 3 * 3 * 32, strides=(1, 3), padding="VALID")
    for ours in (hwc, c1):
        assert np.all(np.abs(ours.astype(np.float64) - exp) <= bound)


def test_conv2d_large_channels_matches_oracle():
    """K = 3*3*37 = 333: many blocks, a partial last block, and a fast-kernel row chunk boundary."""
    rng = np.random.default_rng(12)
    x = fp16_values(rng, (1, 9, 8, 37), "normal")
    w = fp16_values(rng, (3, 3, 37, 3), "normal")
    ours, st = cube.conv2d(x, w, strides=[1, 1, 1, 1], padding=[[0, 0], [1, 1], [1, 1], [0, 0]],
                           dilations=[1, 1, 1, 1], out_dtype="float32")
    ref, _ = naive.conv2d(x, w, (1, 1), [[1, 1], [1, 1]], (1, 1), out_dtype="float32")
    assert_same_bits(ours, ref)


def test_conv2d_many_output_channels_matches_oracle():
    """Cout >= 256: im2col in (pixels, K) layout, output channels as the kernel's columns."""
    rng = np.random.default_rng(13)
    x = fp16_values(rng, (1, 4, 3, 3), "normal")
    w = fp16_values(rng, (2, 2, 3, 300), "normal")
    bias = rng.standard_normal(300).astype(np.float32)
    ours, _ = cube.conv2d(x, w, padding="SAME", bias=bias, out_dtype="float32")
    ref, _ = naive.conv2d(x, w, (1, 1), "SAME", (1, 1), bias=bias, out_dtype="float32")
    assert_same_bits(ours, ref)


def _tf_bound(tf, conv, x, w, K, **kw):
    """2 * gamma_K * sum|x||w|: both sides are fp32 accumulations of the same exact products."""
    ax = tf.constant(np.abs(x.astype(np.float32)))
    aw = tf.constant(np.abs(w.astype(np.float32)))
    mag = conv(ax, aw, **kw).numpy().astype(np.float64)
    u = 2.0 ** -24
    return 2 * (K * u / (1 - K * u)) * mag * (1 + 1e-6) + 1e-30


TF_CASES = [
    ((2, 17, 15, 8), (3, 3, 6), (1, 1), "SAME", (1, 1)),
    ((2, 16, 16, 5), (3, 3, 4), (2, 2), "SAME", (1, 1)),
    ((1, 15, 13, 6), (5, 3, 7), (1, 1), "VALID", (1, 1)),
    ((1, 14, 14, 4), (3, 3, 5), (1, 1), "SAME", (2, 2)),
    ((1, 12, 11, 3), (3, 2, 2), (1, 1), [[1, 2], [2, 0]], (1, 1)),
    ((3, 7, 7, 64), (1, 1, 32), (1, 1), "VALID", (1, 1)),
    ((1, 9, 9, 40), (3, 3, 16), (2, 2), "VALID", (1, 1)),
]


@pytest.mark.parametrize("case", range(len(TF_CASES)))
def test_conv2d_against_tensorflow(case):
    tf = pytest.importorskip("tensorflow")
    xs, (KH, KW, CO), strides, padding, dil = TF_CASES[case]
    rng = np.random.default_rng(300 + case)
    x = fp16_values(rng, xs, "normal")
    w = fp16_values(rng, (KH, KW, xs[3], CO), "normal")
    ours, st = cube.conv2d(x, w, strides=strides, padding=padding, dilations=dil, out_dtype="float32")
    tfpad = padding if isinstance(padding, str) else [[0, 0]] + padding + [[0, 0]]
    kw = dict(strides=[1, *strides, 1], padding=tfpad, dilations=[1, *dil, 1])
    ref = tf.nn.conv2d(tf.constant(x.astype(np.float32)), tf.constant(w.astype(np.float32)), **kw).numpy()
    assert ours.shape == ref.shape
    bound = _tf_bound(tf, tf.nn.conv2d, x, w, KH * KW * xs[3], **kw)
    err = np.abs(ours.astype(np.float64) - ref)
    assert (err <= bound).all(), f"max err {err.max()} vs bound {bound[err > bound][:3]}"
    assert st == 0


@pytest.mark.parametrize("case", range(len(TF_CASES)))
def test_depthwise_against_tensorflow(case):
    tf = pytest.importorskip("tensorflow")
    xs, (KH, KW, _), strides, padding, dil = TF_CASES[case]
    mult = 1 + case % 2
    if strides[0] != strides[1] or (max(strides) > 1 and max(dil) > 1):
        pytest.skip("TensorFlow's depthwise conv needs equal strides and no stride with dilation")
    rng = np.random.default_rng(400 + case)
    x = fp16_values(rng, xs, "normal")
    w = fp16_values(rng, (KH, KW, xs[3], mult), "normal")
    bias = rng.standard_normal(xs[3] * mult).astype(np.float32)
    ours, st = cube.depthwise_conv2d(x, w, strides=strides, padding=padding, dilations=dil, out_dtype="float32",
                                     bias=bias)
    xt = tf.constant(x.astype(np.float32))
    if not isinstance(padding, str):
        xt = tf.pad(xt, [[0, 0]] + padding + [[0, 0]])
    kw = dict(strides=[1, *strides, 1], padding=padding if isinstance(padding, str) else "VALID", dilations=dil)
    ref = tf.nn.depthwise_conv2d(xt, tf.constant(w.astype(np.float32)), **kw).numpy() + bias
    assert ours.shape == ref.shape

    def conv(ax, aw, **k):
        if not isinstance(padding, str):
            ax = tf.pad(ax, [[0, 0]] + padding + [[0, 0]])
        return tf.nn.depthwise_conv2d(ax, aw, **k)
    bound = _tf_bound(tf, conv, x, w, KH * KW, **kw) + 2 * 2.0 ** -24 * np.abs(ref)
    err = np.abs(ours.astype(np.float64) - ref)
    assert (err <= bound).all(), f"max err {err.max()}"
    assert st == 0


# ---------------------------------------------------------------- argument checking

def test_bad_arguments():
    a = np.ones((3, 4), np.float16)
    b = np.ones((4, 5), np.float16)
    with pytest.raises(AscendEmuError, match="float16, bfloat16, float32"):
        cube.matmul(a, b, operand_dtype="int8")
    with pytest.raises(AscendEmuError, match="float16, bfloat16, float32"):
        cube.matmul(a, b, out_dtype="float8")
    with pytest.raises(AscendEmuError, match="inf_nan, saturation"):
        cube.matmul(a, b, overflow_mode="wrap")
    with pytest.raises(AscendEmuError, match="keep, flush"):
        cube.conv2d(np.ones((1, 3, 3, 4)), np.ones((1, 1, 4, 2)), subnormals="denormal")
    with pytest.raises(AscendEmuError, match="CubeModel"):
        cube.matmul(a, b, model="tree")
    with pytest.raises(AscendEmuError, match=r"\(3, 4\).*\(5, 5\)"):
        cube.matmul(a, np.ones((5, 5)))
    with pytest.raises(AscendEmuError, match=r"\(3, 4\).*\(4, 5\)"):
        cube.matmul(a, b, transpose_a=True)
    with pytest.raises(AscendEmuError, match="not a real number type"):
        cube.matmul(np.array([["x", "y"]]), b)
    with pytest.raises(AscendEmuError, match="not a real number type"):
        cube.matmul(a, np.ones((4, 5), np.complex64))
    with pytest.raises(AscendEmuError, match="2-D"):
        cube.matmul(np.ones((2, 3, 4)), b)
    with pytest.raises(AscendEmuError, match=r"bias has shape \(4,\)"):
        cube.matmul(a, b, bias=np.ones(4))
    with pytest.raises(AscendEmuError, match=r"\(2, 3, 4\).*\(5, 4, 2\)"):
        cube.batch_matmul(np.ones((2, 3, 4)), np.ones((5, 4, 2)))
    with pytest.raises(AscendEmuError, match=r"\(1, 5, 5, 3\).*\(3, 3, 2, 4\)"):
        cube.conv2d(np.ones((1, 5, 5, 3)), np.ones((3, 3, 2, 4)))
    with pytest.raises(AscendEmuError, match="SAME, VALID"):
        cube.conv2d(np.ones((1, 5, 5, 3)), np.ones((3, 3, 3, 4)), padding="FULL")
    with pytest.raises(AscendEmuError, match="does not fit"):
        cube.conv2d(np.ones((1, 2, 2, 3)), np.ones((3, 3, 3, 4)))
    with pytest.raises(AscendEmuError, match="strides"):
        cube.depthwise_conv2d(np.ones((1, 5, 5, 3)), np.ones((3, 3, 3, 1)), strides=(0, 1))
    with pytest.raises(AscendEmuError, match="hwc, c1hwc0"):
        CubeModel(conv_k_order="nchw")
    with pytest.raises(AscendEmuError, match="62"):
        cube.matmul(a, b, model=CubeModel(block_sum="aligned", block_size=1024, extra_bits=30))


def test_kernel_codes_mirror_config():
    assert config.BLOCK_SUMS.index("tree") == kcube.TREE
    assert config.BLOCK_SUMS.index("sequential") == kcube.SEQUENTIAL
    assert config.BLOCK_SUMS.index("aligned") == kcube.ALIGNED
    assert config.NORMALIZE.index("rne") == kcube.NORM_RNE
    assert config.NORMALIZE.index("truncate") == kcube.NORM_TRUNCATE
    assert config.OVERFLOW_MODES["saturation"] == kcube.SATURATION
    assert config.ROUNDING_MODES["rint"] == kcube.RINT
    assert config.STATUS_CUBE_OVERFLOW == kcube.ST_CUBE_OVERFLOW


# ---------------------------------------------------------------- Fixpipe conversion shortcut

def _to16_mismatches():
    from numba import njit, prange

    from ascend_emu.kernels import cast as kcast

    @njit(parallel=True)
    def count(lo, hi, step, bf16, overflow, subnormal):
        """number of fp32 patterns lo, lo+step, ... < hi where kcube.to16 differs from the cast kernel."""
        bad = 0
        for q in prange((hi - lo + step - 1) // step):
            v = np.uint32(lo + q * step).view(np.float32)
            b, s = kcube.to16(v, bf16, overflow, subnormal)
            r, rs = kcast.f32_to_16_bits(v, bf16, 0, overflow, subnormal)
            if b != r or s != rs:
                bad += 1
        return bad
    return count


@pytest.mark.parametrize("bf16", [False, True], ids=["fp16", "bf16"])
def test_fixpipe_shortcut_matches_cast_at_boundaries(bf16):
    """The integer RNE shortcut equals the cast kernel on every mantissa of the binades at its edges."""
    count = _to16_mismatches()
    exps = (0, 1, 254, 255) if bf16 else (102, 112, 113, 142, 143, 255)
    for e in exps:
        for sign in (0, 1):
            lo = (sign << 31) | (e << 23)
            for ovf, sub in ((0, 0), (1, 1)):
                assert count(lo, lo + (1 << 23), 1, bf16, ovf, sub) == 0, (e, sign, ovf, sub)
    assert count(0, 1 << 32, 997, bf16, 0, 0) == 0


@numba.njit
def cast_reference(src, out, bf16, overflow, subnormal):
    """The cast kernel's scalar conversion element by element (the oracle the cast tests check): the bits and the
    OR of the statuses."""
    st = 0
    for i in range(src.size):
        b, s = _kcast.f32_to_16_bits(src[i], bf16, 0, overflow, subnormal)
        out[i] = b
        st |= s
    return st


@pytest.mark.parametrize("bf16, hw", [(False, False), (False, True), (True, False)], ids=["fp16", "fp16-hw", "bf16"])
def test_finish_to_16_matches_cast_on_tiny_results(bf16, hw):
    """finish_to_16's first pass (the normal shortcut, and for fp16 the zeros, subnormals and 2**-14 by the
    float32 ``|x| + 0.5`` rounding; or the CPU's conversion, ``hw``) equals the cast kernel bit for bit, status
    included, in every overflow / subnormal mode: every pattern of the binades where fp16 results turn subnormal,
    zero or 2**-14 (2**-25 to 2**-23 and 2**-15 to 2**-13), every 4099th of all finite ones, both signs; the
    largest finite values and the overflows around 65520."""
    from ascend_emu.kernels import cast as kcast

    if hw and not kcast.HW_HALF:
        pytest.skip("no hardware fp16 conversion on this host")

    dense = [np.arange(e << 23, (e + 1) << 23, dtype=np.uint32) for e in (102, 103, 112, 113)]
    sparse = np.arange(0, 0x7F800000, 4099, dtype=np.uint32)
    mags = np.concatenate(dense + [sparse, np.array([0, 1, 0x387FEFFF, 0x387FF000, 0x387FF001, 0x38800000,
                                                     0x33000000, 0x33000001, 0x337FFFFF, 0x32FFFFFF], np.uint32)])


    for sign in (0, 1):
        src = (mags | np.uint32(sign << 31)).view(np.float32)
        for ovf, sub in ((0, 0), (1, 1), (0, 1), (1, 0)):
            for lo in range(0, src.size, 1 << 22):
                chunk = src[lo:lo + (1 << 22)]
                got, want = np.empty(chunk.size, np.uint16), np.empty(chunk.size, np.uint16)
                st = kcube.finish_to_16(chunk, got, bf16, ovf, sub, hw)
                assert st == cast_reference(chunk, want, bf16, ovf, sub), (sign, ovf, sub, lo)
                bad = np.flatnonzero(got != want)
                assert bad.size == 0, (sign, ovf, sub, hex(chunk.view(np.uint32)[bad[0]]), hex(got[bad[0]]),
                                       hex(want[bad[0]]))
    # Inf and NaN accumulators (Fixpipe's 0x400, saturation's +-65504 and 0) as the path without the conversion
    special = np.array([0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF], np.uint32)
    special = np.concatenate([special, special | np.uint32(1 << 31), np.full(300, 0x3F800000, np.uint32)])
    for ovf, sub in ((0, 0), (1, 1)):
        got, want = np.empty(special.size, np.uint16), np.empty(special.size, np.uint16)
        st = kcube.finish_to_16(special.view(np.float32), got, bf16, ovf, sub, hw)
        assert st == kcube.finish_to_16(special.view(np.float32), want, bf16, ovf, sub, False)
        assert np.array_equal(got, want), (ovf, sub)


# Every float32 pattern through the Fixpipe conversion, bits and each one's status: in the cast sweep
# (tests/numerics/test_cast.py::test_f32_to_16_every_pattern), against the oracle the cast kernel meets there.


@pytest.mark.parametrize("bf16", [False, True], ids=["fp16", "bf16"])
def test_operand_rounding_matches_cast(bf16):
    """round_f32_operands (shortcut + cast fallback) equals the cast kernel then an exact widening."""
    rng = np.random.default_rng(14)
    exps = (0, 1, 254, 255) if bf16 else (102, 112, 113, 142, 143, 255)
    parts = [rng.integers(0, 2 ** 32, 1 << 20, dtype=np.uint64).astype(np.uint32)]
    for e in exps:
        parts.append((np.uint32(e << 23) | rng.integers(0, 1 << 23, 1 << 16, dtype=np.uint32)) ^ np.uint32(1 << 31))
        parts.append(np.uint32(e << 23) | np.arange(0, 1 << 23, 97, dtype=np.uint32))
    src = np.concatenate(parts).view(np.float32)
    dt = BF16 if bf16 else np.float16
    for ovf, sub in ((0, 0), (1, 1), (0, 1)):
        out = np.empty_like(src)
        st = kcube.round_f32_operands(src, out, bf16, ovf, sub)
        bits = np.empty(src.size, np.uint16)
        rst = cast_reference(src, bits, bf16, ovf, sub)
        assert_same_bits(out, bits.view(dt).astype(np.float32), f"ovf={ovf} sub={sub}")
        assert st == rst


@pytest.mark.parametrize("hw", [False, True], ids=["", "hw"])
@pytest.mark.parametrize("flush", [False, True], ids=["keep", "flush"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp16", "bf16"])
def test_operand_widening_every_pattern(bf16, flush, hw):
    """All 65,536 16-bit patterns widen exactly to float32 (subnormals to signed zeros under flush), by the integer
    path and by the CPU's conversion (``hw``, fp16 on HW_HALF hosts: the integer path's bits, NaNs included)."""
    from ascend_emu.kernels import cast as kcast

    if hw and not kcast.HW_HALF:
        pytest.skip("no hardware fp16 conversion on this host")
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(bits.size, np.uint32)
    kcube.widen_operands(bits, out, bf16, flush, hw)
    if hw:
        plain = np.empty(bits.size, np.uint32)
        kcube.widen_operands(bits, plain, bf16, flush, False)
        assert np.array_equal(out, plain)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        ref = bits.view(BF16 if bf16 else np.float16).astype(np.float64)
        if flush:
            tiny = 2.0 ** -126 if bf16 else 2.0 ** -14
            ref = np.where((ref != 0) & (np.abs(ref) < tiny), np.copysign(0.0, ref), ref)
        ref = ref.astype(np.float32)
    assert_same_bits(out.view(np.float32), ref)


def test_prefaulted_buffers_are_plain_arrays():
    from ascend_emu.kernels import alloc

    for shape, dtype in (((3, 1 << 19), np.float32), ((5,), np.uint16), ((2, 0), np.float32), ((1 << 20,), np.uint16)):
        a = alloc.empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
    s = kcube.empty_slabs((3, 1000))
    assert s.shape == (3, 1000) and s.ctypes.data % 64 == 0
