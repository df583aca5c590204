"""torch_npu's fused aclnn kernels (_RmsNorm, _SwiGlu, _RotaryMul) against oracles written from ASCEND-FACTS.md
13.4/13.5: float32 inside, one rounding to the input dtype."""
import ml_dtypes
import numpy as np
import pytest

from ascend_emu.ops import OpContext, run_op

DTYPES = [np.float16, ml_dtypes.bfloat16]


def half_interval(v):
    """Oracle of ReduceSumHalfInterval on a float32 row: fold the tail past the largest power of two, then add
    the two halves until one element is left (every addition a float32 one)."""
    v = [np.float32(a) for a in v]
    p = 1
    while p * 2 <= len(v):
        p *= 2
    head = v[:p]
    for i, t in enumerate(v[p:]):
        head[i] = np.float32(head[i] + t)
    while len(head) > 1:
        h = len(head) // 2
        head = [np.float32(head[i] + head[i + h]) for i in range(h)]
    return head[0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 100])
def test_rms_norm_float32_inside_one_rounding(dtype, d):
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((3, d)) * 4).astype(dtype)
    g = rng.standard_normal(d).astype(dtype)
    y, rstd = run_op("_RmsNorm", x, g, ctx=OpContext(dtype=np.dtype(dtype).name), epsilon=1e-6)
    f32 = np.float32
    for r in range(3):
        row = x[r].astype(f32)
        ss = half_interval(row * row)
        rs = f32(1.0) / np.sqrt(f32(ss * f32(1.0 / d) + f32(1e-6)))
        assert rstd[r, 0] == rs
        want = ((row * rs) * g.astype(f32)).astype(dtype)     # numpy's cast: nearest even (RINT)
        assert np.array_equal(y[r].view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_one_rounding(dtype):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 64)) * 3).astype(dtype)
    (y,) = run_op("_SwiGlu", x, ctx=OpContext(dtype=np.dtype(dtype).name), dim=-1)
    a, b = x[:, :32].astype(np.float64), x[:, 32:].astype(np.float64)
    exact = a / (1 + np.exp(-a)) * b
    want = exact.astype(np.float32).astype(dtype)
    # float32 steps (the vector unit's exp) against the exact value: the same rounding but at a boundary
    unit = np.maximum(np.abs(want.astype(np.float64)), 2.0 ** -14) * (2.0 ** -10 if dtype == np.float16 else 2.0 ** -7)
    assert np.all(np.abs(y.astype(np.float64) - want.astype(np.float64)) <= unit)
    assert np.mean(y.astype(np.float64) == want.astype(np.float64)) > 0.98
    # not two roundings (silu rounded, then the product): that differs somewhere
    two = (((a / (1 + np.exp(-a))).astype(dtype).astype(np.float64)) * b).astype(dtype)
    assert not np.array_equal(two.astype(np.float64), y.astype(np.float64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_mul_one_rounding(dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 4, 8, 16)).astype(dtype)
    ang = rng.uniform(0, 6, (8, 16))
    cos, sin = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
    (y,) = run_op("_RotaryMul", x, cos, sin, ctx=OpContext(dtype=np.dtype(dtype).name))
    f = np.float32
    xf, c, s = x.astype(f), cos.astype(f), sin.astype(f)
    rot = np.concatenate([-xf[..., 8:], xf[..., :8]], -1)
    want = (xf * c + rot * s).astype(dtype)
    assert np.array_equal(y.view(np.uint16), want.view(np.uint16))
