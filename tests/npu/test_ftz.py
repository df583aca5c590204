"""The Ascend950's --cce-ftz: Exp, Ln, Reciprocal, Sqrt, Rsqrt and Div read subnormals as zero and flush
subnormal results (NUMERICS.md section 13); the 910B keeps them."""
import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.numerics.policy import FTZ_OPS, SOCS, NumericsPolicy
from ascend_emu.ops import run_op
from ascend_emu.ops.registry import OpContext

TINY = np.float32(1e-40)        # a float32 subnormal


def _flush(a):
    a = np.array(a, dtype=np.float32)
    sub = (a != 0) & (np.abs(a) < np.finfo(np.float32).tiny)
    a[sub] = np.copysign(np.float32(0), a[sub])    # a flushed value keeps its sign: -tiny -> -0.0
    return a


def _sub32(n=257, seed=0):
    """float32 values spanning subnormals, normals near the boundary, and ordinary ones, both signs."""
    rng = np.random.default_rng(seed)
    bits = np.concatenate([rng.integers(1, 0x00800000, n), rng.integers(0x00800000, 0x01000000, n),
                           rng.integers(0x3e000000, 0x42000000, n)]).astype(np.uint32)
    v = bits.view(np.float32)
    return np.concatenate([v, -v])


def test_soc_rows_name_the_ftz_default():
    assert [n for n, c in SOCS.items() if c.ftz] == ["Ascend950"]
    assert NumericsPolicy(soc="Ascend950").cce_ftz is True
    assert NumericsPolicy(soc="Ascend950", cce_ftz=False).cce_ftz is False
    assert NumericsPolicy(soc="Ascend910B").cce_ftz is False
    assert NumericsPolicy(soc="Ascend910B", cce_ftz=True).to_dict()["cce_ftz"] is True
    assert SOCS["Ascend950"].row()["cce_ftz_default"] is True
    with pytest.raises(AscendEmuError, match="cce_ftz"):
        NumericsPolicy(soc="Ascend950", cce_ftz="yes")


@pytest.mark.parametrize("tf_type,fn", [("Exp", np.exp), ("Log", np.log), ("Reciprocal", np.reciprocal),
                                        ("Sqrt", np.sqrt), ("Rsqrt", lambda v: 1 / np.sqrt(v))])
def test_unary_ops_flush_inputs_and_results(tf_type, fn):
    x = _sub32()
    if tf_type == "Exp":
        x = np.concatenate([x, np.float32([-87.5, -100.0, -103.0])])
    keep = run_op(tf_type, x, ctx=OpContext(dtype="float32"))[0]
    flush = run_op(tf_type, x, ctx=OpContext(dtype="float32", ftz=True))[0]
    # with FTZ the op is the kept-subnormal op on the flushed input, its result flushed
    again = run_op(tf_type, _flush(x), ctx=OpContext(dtype="float32"))[0]
    np.testing.assert_array_equal(flush.view(np.uint32), _flush(again).view(np.uint32))
    sub = (x != 0) & (np.abs(x) < np.finfo(np.float32).tiny)
    assert sub.any()
    with np.errstate(all="ignore"):
        assert np.array_equal(flush[sub], fn(np.where(x[sub] > 0, np.float32(0), np.float32(-0.0))),
                              equal_nan=True)
    assert not (flush.view(np.uint32) == keep.view(np.uint32)).all()


def test_division_flushes_but_add_keeps():
    x, y = _sub32(seed=1), np.float32(3.0)
    d = run_op("RealDiv", x, np.full_like(x, y), ctx=OpContext(dtype="float32", ftz=True))[0]
    np.testing.assert_array_equal(d.view(np.uint32), _flush(_flush(x) / y).view(np.uint32))
    a = run_op("AddV2", x, np.zeros_like(x), ctx=OpContext(dtype="float32", ftz=True))[0]
    np.testing.assert_array_equal(a, x + np.float32(0))
    assert set(FTZ_OPS) == {"exp", "log", "reciprocal", "sqrt", "rsqrt", "realdiv"}


def test_fp16_exp_flushes_fp16_subnormals():
    x = np.array([-10.0, -12.0, -16.0, -17.5, 0.0], np.float16)   # exp: fp16 subnormals below 6.1e-5
    keep = run_op("Exp", x, ctx=OpContext(dtype="float16"))[0]
    flush = run_op("Exp", x, ctx=OpContext(dtype="float16", ftz=True))[0]
    small = np.abs(keep.astype(np.float32)) < np.finfo(np.float16).tiny
    assert small[:4].any() and (keep[small] != 0).any()
    assert (flush[small] == 0).all() and np.array_equal(flush[~small], keep[~small])


@pytest.fixture(scope="module")
def exp_div_fn():
    tf = pytest.importorskip("tensorflow")

    @tf.function(input_signature=[tf.TensorSpec([4], tf.float32)])
    def f(x):
        return tf.exp(x) + 0.0, (x * 2.0) / 3e38
    return f


@pytest.mark.parametrize("soc,ftz,flushed", [("Ascend950", None, True), ("Ascend910B", None, False),
                                             ("Ascend950", False, False), ("Ascend910B", True, True)])
def test_replay_exp_of_minus_100(exp_div_fn, soc, ftz, flushed):
    """float32 exp(-100) (3.78e-44, a subnormal) replays as 0 on the 950 and as the subnormal on the 910B; a
    division inside a fused elementwise chain flushes too."""
    from ascend_emu import Device

    x = np.float32([-100.0, -1.0, 0.5, 1e-3])
    dev = Device(precision_mode_v2="origin", soc=soc, cce_ftz=ftz)
    res = dev.replay(exp_div_fn, {"x": x}, progress=False)
    e, q = (np.asarray(v) for v in res.outputs.values())
    assert dev.config()["cce_ftz"] is flushed
    if flushed:
        assert e[0] == 0 and q[3] == 0
    else:
        assert e[0] == np.float32(3.783505853677006e-44) and e[0] != 0
        assert q[3] == np.float32(2e-3) / np.float32(3e38) != 0
    np.testing.assert_allclose(e[1:], np.exp(x[1:]), rtol=1e-6)   # ordinary values: the exp model as always
