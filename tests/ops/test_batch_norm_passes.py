"""Batch norm training's Numba passes (kernels/batchnorm.py via numerics/batchnorm.py), bit for bit:
against the element-by-element oracles of tests/naive.py (the float32 sums whole and split over cores in the
drawn arrival orders, the float32 chains), and against the ops' own numpy formulation (forced by turning the
passes off) for every compute dtype, overflow mode, subnormal mode, core split and memory layout, with the
order generator left where the numpy path leaves it; an Inf or NaN sends the op to the numpy path with the
generator put back."""
import numpy as np
import pytest

import naive
from ascend_emu.numerics import batchnorm as nbn
from ascend_emu.numerics.multicore import Launch, MultiCoreModel
from ascend_emu.numerics.policy import bfloat16
from ascend_emu.ops import OPS, OpContext

MODEL = MultiCoreModel(reduce_min_chunk=16)


def _launch(seed):
    return Launch("reduce", "bn", 3, seed, 24, 48, MODEL)


def _nchw(a):
    """``a`` (NHWC) stored NCHW, seen as NHWC: the torch path's view."""
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_batch_norm_passes_match_the_naive_oracles(split, layout):
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((2, 6, 6, 3)) * 2 + 0.5).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    sc, off = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    xa, dya = (_nchw(x), _nchw(dy)) if layout == "nchw" else (x, dy)
    ctx = OpContext(dtype="float32", multicore=_launch(1) if split else None)
    twin = _launch(1)
    bounds = twin.reduce_bounds(3, 72) if split else None
    assert (bounds is not None) == split
    y, _, _, bmean, bvar, _ = OPS["FusedBatchNormV3"](xa, sc, off, rm, rv, ctx=ctx, epsilon=1e-3, is_training=True,
                                                      exponential_avg_factor=0.1)
    orders = [twin.row_orders(3, len(bounds) - 1), twin.row_orders(3, len(bounds) - 1)] if split else None
    wy, wmean, wvar = naive.batch_norm_training32(x, sc, off, 1e-3, orders, None if bounds is None else list(bounds))
    np.testing.assert_array_equal(_bits(y), _bits(wy))
    np.testing.assert_array_equal(_bits(bmean), _bits(wmean))
    np.testing.assert_array_equal(_bits(bvar), _bits(wvar))
    dx, dscale, doffset, _, _ = OPS["FusedBatchNormGradV3"](dya, xa, sc, bmean, bvar, ctx=ctx, epsilon=1e-3,
                                                            is_training=True)
    orders = [twin.row_orders(3, len(bounds) - 1), twin.row_orders(3, len(bounds) - 1)] if split else None
    wdx, wds, wdo = naive.batch_norm_grad32(dy, x, sc, wmean, wvar, 1e-3, orders,
                                            None if bounds is None else list(bounds))
    np.testing.assert_array_equal(_bits(dx), _bits(wdx))
    np.testing.assert_array_equal(_bits(dscale), _bits(wds))
    np.testing.assert_array_equal(_bits(doffset), _bits(wdo))
    assert ctx.status == 0
    if split:
        assert ctx.multicore.rng.random() == twin.rng.random()      # the same draws, no more


def _run(x, dy, dtype, sub, ov, split, seed):
    ctx = OpContext(dtype=dtype, subnormals=sub, overflow_mode=ov, multicore=_launch(seed) if split else None)
    c = x.shape[3]
    sc, off = np.linspace(-1, 2, c).astype(np.float32), np.linspace(0.5, -0.5, c).astype(np.float32)
    fwd = OPS["FusedBatchNormV3"](x, sc, off, np.zeros(c, np.float32), np.ones(c, np.float32), ctx=ctx,
                                  epsilon=1e-3, is_training=True, exponential_avg_factor=0.1)
    bwd = OPS["FusedBatchNormGradV3"](dy, x, sc, fwd[3], fwd[4], ctx=ctx, epsilon=1e-3, is_training=True)
    after = ctx.multicore.rng.random() if split else None
    return fwd + bwd, ctx.status, after


def test_batch_norm_passes_match_the_numpy_chain(monkeypatch):
    rng = np.random.default_rng(8)
    checked = 0
    for trial in range(24):
        shape = (int(rng.integers(1, 4)), int(rng.integers(2, 9)), int(rng.integers(2, 9)), int(rng.integers(1, 4)))
        x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
        dy = rng.standard_normal(shape).astype(np.float32)
        kind = trial % 6
        if kind == 1:
            x.flat[int(rng.integers(x.size))] = np.nan           # the numpy path: NaN
        elif kind == 2:
            dy.flat[-1] = np.inf
        elif kind == 3:
            x *= np.float32(1e-39)                               # subnormals: kept or flushed
            dy *= np.float32(1e-39)
        elif kind == 4:
            x *= np.float32(3e19)                                # x * x overflows float32
        for dt in (np.float32, np.float16, bfloat16):
            with np.errstate(all="ignore"):
                xd, dyd = x.astype(dt), dy.astype(dt)
            if trial % 2:
                xd, dyd = _nchw(xd), _nchw(dyd)
            for sub in ("keep", "flush"):
                for ov in ("inf_nan", "saturation"):
                    for split in (False, True):
                        got = _run(xd, dyd, np.dtype(dt).name, sub, ov, split, trial)
                        with monkeypatch.context() as m:
                            m.setattr(nbn, "sums", lambda *a, **k: None)
                            want = _run(xd, dyd, np.dtype(dt).name, sub, ov, split, trial)
                        assert got[1] == want[1] and got[2] == want[2]
                        for g, w in zip(got[0], want[0]):
                            assert g.shape == w.shape and g.dtype == w.dtype
                            np.testing.assert_array_equal(_bits(g), _bits(w))
                        checked += 1
    assert checked == 24 * 3 * 8


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_bias_add_grad_pass_of_16_bit_gradients_matches_the_reduction(monkeypatch, dtype):
    """BiasAddGrad of fp16/bf16 dy: widened, summed in float32 in one pass, rounded once, as the 16-bit reduction
    with a float32 accumulator; a sum past the 16-bit range, Inf/NaN, an fp16 accumulator or flushed subnormals
    take the reduction's path (the order generator put back)."""
    rng = np.random.default_rng(9)
    dt = np.float16 if dtype == "float16" else bfloat16
    for trial in range(12):
        dy = rng.standard_normal((2, 6, 7, 3)).astype(np.float32)
        if trial % 4 == 1:
            dy.flat[7] = np.nan
        elif trial % 4 == 2:
            dy *= np.float32(6e-5 if dtype == "float16" else 1e-39)     # 16-bit subnormals
        elif trial % 4 == 3:
            dy[..., 0] = np.float32(3000.0 if dtype == "float16" else 3e37)     # a sum past the range
        dyd = dy.astype(dt)
        dya = _nchw(dyd) if trial % 2 else dyd
        for split in (False, True):
            for sub in ("keep", "flush"):
                for ov in ("inf_nan", "saturation"):
                    for acc in ("float32", "float16"):
                        kw = dict(dtype=dtype, subnormals=sub, overflow_mode=ov, reduce_accumulate=acc)
                        got_ctx = OpContext(**kw, multicore=_launch(trial) if split else None)
                        (got,) = OPS["BiasAddGrad"](dya, ctx=got_ctx)
                        with monkeypatch.context() as m:
                            m.setattr(nbn, "sums", lambda *a, **k: None)
                            want_ctx = OpContext(**kw, multicore=_launch(trial) if split else None)
                            (want,) = OPS["BiasAddGrad"](dya, ctx=want_ctx)
                        assert got.dtype == want.dtype
                        np.testing.assert_array_equal(_bits(got), _bits(want))
                        assert got_ctx.status == want_ctx.status
                        if split:
                            assert got_ctx.multicore.rng.random() == want_ctx.multicore.rng.random()


def test_bias_add_grad_pass_matches_the_oracle_and_the_reduction(monkeypatch):
    """BiasAddGrad of float32 (N, H, W, C): the one-pass sum against naive.split_sum32 (whole and split, the
    drawn orders) and against the reduction it replaces, in every overflow and subnormal mode, with Inf and NaN
    (the reduction's path) and subnormals."""
    rng = np.random.default_rng(3)
    for trial in range(12):
        dy = rng.standard_normal((2, 6, 7, 3)).astype(np.float32)
        if trial % 4 == 1:
            dy.flat[5] = np.nan
        elif trial % 4 == 2:
            dy[..., 1] *= np.float32(1e-39)
        elif trial % 4 == 3:
            dy[0, 0, 0, 2] = np.inf
        dya = _nchw(dy) if trial % 2 else dy
        for split in (False, True):
            for sub in ("keep", "flush"):
                for ov in ("inf_nan", "saturation"):
                    got_ctx = OpContext(dtype="float32", subnormals=sub, overflow_mode=ov,
                                        multicore=_launch(trial) if split else None)
                    (got,) = OPS["BiasAddGrad"](dya, ctx=got_ctx)
                    with monkeypatch.context() as m:
                        m.setattr(nbn, "sums", lambda *a, **k: None)
                        want_ctx = OpContext(dtype="float32", subnormals=sub, overflow_mode=ov,
                                             multicore=_launch(trial) if split else None)
                        (want,) = OPS["BiasAddGrad"](dya, ctx=want_ctx)
                    np.testing.assert_array_equal(_bits(got), _bits(want))
                    assert got_ctx.status == want_ctx.status
                    if split:
                        assert got_ctx.multicore.rng.random() == want_ctx.multicore.rng.random()
                    if trial % 4 == 0 and sub == "keep":
                        twin = _launch(trial)
                        bounds = twin.reduce_bounds(3, 84) if split else None
                        assert (bounds is not None) == split
                        orders = twin.row_orders(3, len(bounds) - 1) if split else [None] * 3
                        oracle = [naive.split_sum32(list(dy[..., c].reshape(-1)),
                                                    None if bounds is None else list(bounds), orders[c])
                                  for c in range(3)]
                        np.testing.assert_array_equal(_bits(got), _bits(np.asarray(oracle, np.float32)))


@pytest.mark.parametrize("channels", [16, 40])
def test_channels_side_by_side_match_the_numpy_chain_and_the_channel_loop(monkeypatch, channels):
    """NHWC inputs of more channels than one side-by-side block holds (16; 40 = 16 + 16 + 8): the batch norm ops'
    sums by ``bn_sums_f32_rows`` and chains by ``bn_apply_f32_rows`` against their numpy formulation, whole and split over cores, subnormals kept and
    flushed, and each sum's bits against the channel-by-channel kernel's."""
    from ascend_emu.kernels import batchnorm as kb

    rng = np.random.default_rng(channels)
    shape = (3, 5, 7, channels)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    x[0, 0, :, 3] *= np.float32(1e-39)                          # subnormals in one channel of each block
    dy[1, 2, :, 17 % channels] *= np.float32(1e-39)
    calls, applied = [], []
    real, real_apply = kb.bn_sums_f32_rows, kb.bn_apply_f32_rows
    monkeypatch.setattr(kb, "bn_sums_f32_rows", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(kb, "bn_apply_f32_rows", lambda *a: applied.append(1) or real_apply(*a))
    for sub in ("keep", "flush"):
        for split in (False, True):
            got = _run(x, dy, "float32", sub, "inf_nan", split, channels)
            with monkeypatch.context() as m:
                m.setattr(nbn, "sums", lambda *a, **k: None)
                want = _run(x, dy, "float32", sub, "inf_nan", split, channels)
            assert got[1] == want[1] and got[2] == want[2]
            for g, w in zip(got[0], want[0]):
                np.testing.assert_array_equal(_bits(g), _bits(w))
            mu, rs = rng.standard_normal(channels).astype(np.float32), rng.random(channels).astype(np.float32)
            for mode in (nbn.FORWARD, nbn.BACKWARD, nbn.SUM):
                g_ = dy if mode == nbn.BACKWARD else None
                a = nbn.sums(mode, x, g_, mu, rs, overflow_mode="inf_nan", subnormals=sub,
                             multicore=_launch(5) if split else None)
                with monkeypatch.context() as m:
                    m.setattr(kb, "bn_sums_f32_rows", kb.bn_sums_f32)
                    b = nbn.sums(mode, x, g_, mu, rs, overflow_mode="inf_nan", subnormals=sub,
                                 multicore=_launch(5) if split else None)
                for u, v in zip(a, b):
                    np.testing.assert_array_equal(_bits(u), _bits(v))
    assert len(calls) >= 4 * 2 + 4 * 3 and len(applied) == 4 * 2    # BN's y and dx: the rows kernel
