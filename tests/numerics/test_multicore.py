"""Non-deterministic multi-core accumulation (NUMERICS.md section 11) against independent oracles.

The oracles are plain Python loops over numpy float32 scalars (every add one IEEE float32 rounding)
and ``naive.round_f64`` for the one rounding to a 16-bit format; the permutation they use is drawn
from a fresh :class:`Launch` with the same seed words, so they reproduce the kernel's order without
sharing its code.
"""
import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.numerics.cube import matmul
from ascend_emu.numerics.multicore import Launch, MultiCoreModel, even_bounds, resolve_level, segment_add
from ascend_emu.numerics.reduction import reduce
from ascend_emu.ops import OPS, OpContext
from ascend_emu.ops.multicore import MULTICORE_OPS

from tests.naive import round_f64, to_f64

rng = np.random.default_rng(20261124)
F32 = np.float32


def launch(seed=3, kind="reduce", cores=32, launch_no=0, name="op/x", **model):
    return Launch(kind, name, seed, launch_no, cores, cores, MultiCoreModel(**model))


def oracle_split_sum(row32, bounds, perm, acc16_fmt=None, scale=None):
    """((+0 + p_perm0) + p_perm1) + ... with p_c the in-order float32 partial of chunk c (each step
    rounded to the 16-bit format too when ``acc16_fmt``); ``scale``: multiply every element first."""
    def r16(v):
        if acc16_fmt is None:
            return F32(v)
        return F32(to_f64(round_f64(np.float64(v), acc16_fmt)[0], acc16_fmt))

    total = F32(0.0)
    for c in perm:
        vals = [F32(v) for v in row32[bounds[c]:bounds[c + 1]]]
        if scale is not None:
            vals = [r16(F32(v * scale)) for v in vals]
        p = vals[0]
        for v in vals[1:]:
            p = r16(F32(p + v))
        total = r16(F32(total + p))
    return total


@pytest.mark.parametrize("rows,inner", [(1, 5000), (3, 1111), (7, 4096)])
def test_split_sum_f32_matches_oracle(rows, inner):
    x = (rng.standard_normal((rows, inner)) * np.exp(rng.uniform(-8, 8, (rows, inner)))).astype(F32)
    got, st = reduce("sum", x, axis=1, dtype="float32", multicore=launch())
    bounds = launch().reduce_bounds(rows, inner)
    assert bounds is not None and len(bounds) > 2
    perms = launch().row_orders(rows, len(bounds) - 1)
    want = np.array([oracle_split_sum(x[r], bounds, perms[r]) for r in range(rows)], dtype=F32)
    assert st == 0
    assert got.tobytes() == want.tobytes()


def test_split_mean_f32_scales_as_the_op_model_says():
    x = rng.standard_normal((2, 3000)).astype(F32)
    L = launch()
    bounds = L.reduce_bounds(2, 3000)
    perms = launch().row_orders(2, len(bounds) - 1)
    exact, _ = reduce("mean", x, axis=1, dtype="float32", op_model="exact", multicore=launch())
    want = np.array([F32(oracle_split_sum(x[r], bounds, perms[r]) / F32(3000)) for r in range(2)], dtype=F32)
    assert exact.tobytes() == want.tobytes()
    tbe, _ = reduce("mean", x, axis=1, dtype="float32", op_model="tbe_v220", multicore=launch())
    cof = F32(1.0) / F32(3000)
    want = np.array([oracle_split_sum(x[r], bounds, perms[r], scale=cof) for r in range(2)], dtype=F32)
    assert tbe.tobytes() == want.tobytes()


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("acc16", [False, True])
def test_split_sum_16bit_matches_oracle(fmt, acc16):
    import ml_dtypes

    dt = np.float16 if fmt == "float16" else ml_dtypes.bfloat16
    x = rng.uniform(-4, 4, (3, 2600)).astype(dt)
    got, _ = reduce("sum", x, axis=1, dtype=fmt, accumulate=fmt if acc16 else "float32", multicore=launch())
    bounds = launch().reduce_bounds(3, 2600)
    perms = launch().row_orders(3, len(bounds) - 1)
    x32 = x.astype(F32)
    want = [round_f64(np.float64(oracle_split_sum(x32[r], bounds, perms[r], fmt if acc16 else None)), fmt)[0]
            for r in range(3)]
    assert got.view(np.uint16).tolist() == [int(w) for w in want]


def test_orders_differ_between_seeds_and_repeat_for_one_seed():
    x = rng.standard_normal((1, 20000)).astype(F32)
    outs = {reduce("sum", x, axis=1, dtype="float32", multicore=launch(seed=s))[0].tobytes() for s in range(12)}
    assert len(outs) > 1                                   # the order changes the float result
    again = {reduce("sum", x, axis=1, dtype="float32", multicore=launch(seed=5))[0].tobytes() for _ in range(3)}
    assert len(again) == 1                                 # same seed, same bits
    other_op = reduce("sum", x, axis=1, dtype="float32", multicore=launch(seed=5, name="op/y"))[0]
    other_step = reduce("sum", x, axis=1, dtype="float32", multicore=launch(seed=5, launch_no=1))[0]
    assert len({other_op.tobytes(), other_step.tobytes(), next(iter(again))}) > 1


def test_no_split_when_rows_fill_the_cores_or_chunks_are_short():
    L = launch()
    assert L.reduce_bounds(32, 100000) is None              # rows >= cores: one row per core
    assert L.reduce_bounds(1, 511) is None                  # < 2 chunks of reduce_min_chunk
    assert list(L.reduce_bounds(1, 512)) == [0, 256, 512]
    assert L.splitk_bounds(1, 16, 16, 999) is None          # K < MIN_SPLITK_K
    assert L.splitk_bounds(1, 257, 16, 5000) is None        # M above M_THRESHOLD
    assert list(L.splitk_bounds(1, 16, 16, 1000)) == [0, 336, 672, 1000]
    assert np.diff(L.splitk_bounds(1, 1, 1, 100000))[:-1].tolist() == [3136] * 31   # 32 cores, 16-aligned
    assert list(L.batch_bounds(5, 10)) == [0, 10, 20, 30, 40, 50]
    assert list(launch(cores=2).batch_bounds(5, 10)) == [0, 30, 50]
    x = np.arange(100.0, dtype=F32).reshape(1, 100)
    y, _ = reduce("max", np.tile(x, (1, 100)), axis=1, dtype="float32", multicore=L)   # max never splits
    assert y[0] == 99.0
    assert list(even_bounds(10, 3)) == [0, 4, 8, 10]


def test_split_k_matmul_matches_oracle():
    a = rng.standard_normal((5, 3000)).astype(F32)
    b = rng.standard_normal((3000, 7)).astype(F32)
    bias = rng.standard_normal(7).astype(F32)
    L = launch(kind="splitk")
    bounds = L.splitk_bounds(1, 5, 7, 3000)
    perm = launch(kind="splitk").order(len(bounds) - 1)
    for out in ("float32", "float16"):
        got, _ = matmul(a, b, bias=bias, operand_dtype="float16", out_dtype=out, multicore=launch(kind="splitk"))
        parts = [matmul(a[:, bounds[c]:bounds[c + 1]], b[bounds[c]:bounds[c + 1]], bias=bias if c == 0 else None,
                        operand_dtype="float16", out_dtype="float32")[0] for c in range(len(bounds) - 1)]
        acc = np.zeros((5, 7), F32)
        for c in perm:
            acc = (acc + parts[c]).astype(F32)
        want = acc if out == "float32" else round_f64(acc.astype(np.float64), "float16")[0].view(np.float16)
        assert got.tobytes() == np.asarray(want).tobytes()


def test_conv2d_backprop_filter_splits_the_batch():
    x = rng.standard_normal((6, 9, 9, 3)).astype(F32)
    dy = rng.standard_normal((6, 9, 9, 4)).astype(F32)
    kw = dict(strides=[1, 1, 1, 1], padding="SAME")
    sizes = np.array([3, 3, 3, 4], np.int32)
    det = OPS["Conv2DBackpropFilter"](x, sizes, dy, ctx=OpContext(), **kw)[0]
    runs = {OPS["Conv2DBackpropFilter"](x, sizes, dy, ctx=OpContext(multicore=launch(seed=s, kind="batch")),
                                        **kw)[0].tobytes() for s in range(6)}
    assert len(runs) > 1
    # every run is the same sum up to float32 reassociation
    for r in runs:
        np.testing.assert_allclose(np.frombuffer(r, F32).reshape(det.shape), det, rtol=1e-5, atol=1e-4)


def test_segment_add_matches_oracle_and_keeps_each_cores_order():
    ids = rng.integers(-1, 5, 300)
    rows = rng.standard_normal((300, 3)).astype(F32)
    L = launch(kind="atomic")
    order = L.arrival(300)
    assert sorted(order.tolist()) == list(range(300))
    core = np.arange(300) * 32 // 300
    pos = np.empty(300, int)
    pos[order] = np.arange(300)
    for c in range(32):
        assert np.all(np.diff(pos[core == c]) > 0)             # a core issues its own adds in order
    got = segment_add(np.zeros((5, 3), F32), rows, ids, order)
    want = np.zeros((5, 3), F32)
    for i in order:
        if ids[i] >= 0:
            want[ids[i]] = (want[ids[i]] + rows[i]).astype(F32)
    assert got.tobytes() == want.tobytes()
    assert launch(cores=1).arrival(10) is None


def test_deterministic_level_resolution():
    assert resolve_level(None, None) == 1
    assert resolve_level(False, None) == 0
    assert resolve_level(True, 2) == 2
    assert resolve_level(None, 0) == 0
    for bad in [(False, 2), (True, 0), (None, 3), (2, None), ("yes", None)]:
        with pytest.raises(AscendEmuError):
            resolve_level(*bad)
    with pytest.raises(AscendEmuError):
        MultiCoreModel(aicore_num=0)


def test_every_table_op_is_registered_and_takes_the_launch():
    """The table is the one place: each listed op is registered and its result changes with the order."""
    x = rng.standard_normal((4, 600)).astype(F32)
    big = rng.standard_normal((2, 1500)).astype(F32)
    w = rng.standard_normal((1500, 8)).astype(F32)
    bn_x = rng.standard_normal((64, 4, 4, 2)).astype(F32)
    ones, zeros = np.ones(2, F32), np.zeros(2, F32)
    cases = {
        "Sum": lambda c: OPS["Sum"](x, np.int32(1), ctx=c),
        "Mean": lambda c: OPS["Mean"](x, np.int32(1), ctx=c),
        "BiasAddGrad": lambda c: OPS["BiasAddGrad"](x.T.copy(), ctx=c),
        "FusedBatchNormV3": lambda c: OPS["FusedBatchNormV3"](bn_x, ones, zeros, zeros, ones, ctx=c,
                                                              is_training=True)[3:5],
        "FusedBatchNormGradV3": lambda c: OPS["FusedBatchNormGradV3"](bn_x, bn_x * 0.5, ones, zeros, ones, ctx=c)[1:3],
        "UnsortedSegmentSum": lambda c: OPS["UnsortedSegmentSum"](big.T.copy(), np.arange(1500) % 3, np.int32(3),
                                                                  ctx=c),
        "MatMul": lambda c: OPS["MatMul"](big, w, ctx=c),
        "_FusedMatMul": lambda c: OPS["_FusedMatMul"](big, w, ctx=c, bias=np.ones(8, F32)),
        "BatchMatMulV2": lambda c: OPS["BatchMatMulV2"](big[None], w[None], ctx=c),
        "BatchMatMul": lambda c: OPS["BatchMatMul"](big[None], w[None], ctx=c),
        "BatchMatMulV3": lambda c: OPS["BatchMatMulV3"](big[None], w[None], ctx=c),
        "_FusedBatchMatMul": lambda c: OPS["_FusedBatchMatMul"](big[None], w[None], ctx=c, bias=np.ones(8, F32)),
        "Conv2DBackpropFilter": lambda c: OPS["Conv2DBackpropFilter"](
            bn_x, np.array([3, 3, 2, 2], np.int32), bn_x, ctx=c, strides=[1, 1, 1, 1], padding="SAME"),
    }
    assert set(cases) == set(MULTICORE_OPS)
    for t, run in cases.items():
        assert t in OPS, t
        kind = MULTICORE_OPS[t].kind

        def digest(mc):
            out = run(OpContext(dtype="float32", multicore=mc))
            return b"".join(np.asarray(o).tobytes() for o in (out if isinstance(out, tuple) else (out,)))
        canonical = digest(None)
        seen = {digest(launch(seed=s, kind=kind, name=t)) for s in range(8)}
        assert len(seen | {canonical}) > 1, f"{t}: the arrival order never changes its result"


def test_level_2_a_rows_result_does_not_depend_on_its_batch():
    """Strong consistency: a row alone and the same row inside a batch give the same bits; with determinism
    off they need not (the split depends on how many rows share the op), which this test shows too."""
    from ascend_emu.npu.device import Device

    w = rng.standard_normal((1500, 8)).astype(F32)
    rows = rng.standard_normal((300, 1500)).astype(F32)
    for level in (2, 0):
        dev = Device("must_keep_origin_dtype", deterministic_level=level, run_seed=1)

        def mm(a):
            return OPS["MatMul"](a, w, ctx=dev.context("float32", op="dense/MatMul", tf_type="MatMul"))[0]

        def sm(a):
            return OPS["Sum"](a, np.int32(1), ctx=dev.context("float32", op="loss/Sum", tf_type="Sum"))[0]
        batch_mm, batch_sm = mm(rows), sm(rows[:40])
        same = [mm(rows[i:i + 1])[0].tobytes() == batch_mm[i].tobytes() and
                sm(rows[i:i + 1])[0].tobytes() == batch_sm[i].tobytes() for i in range(12)]
        assert all(same) if level == 2 else not all(same), level


def test_device_gives_a_launch_only_to_table_ops_with_determinism_off():
    from ascend_emu.npu.device import Device

    d = Device()
    assert (d.deterministic, d.deterministic_level, d.config()["run_seed"]) == (True, 1, None)
    assert d.context("float32", op="m", tf_type="MatMul").multicore is None
    off = Device(deterministic=False, run_seed=7, soc="Ascend910B")
    mc = off.context("float32", op="m", tf_type="MatMul", launch=3).multicore
    assert (mc.kind, mc.run_seed, mc.launch, mc.cube_cores, mc.vector_cores) == ("splitk", 7, 3, 24, 48)
    assert off.context("float32", op="r", tf_type="Relu").multicore is None
    assert off.config()["run_seed"] == 7
    assert Device(deterministic=False, multicore=MultiCoreModel(aicore_num=8)).numerics.cores == (8, 8)
    with pytest.raises(AscendEmuError):
        Device(deterministic=False, deterministic_level=1)
