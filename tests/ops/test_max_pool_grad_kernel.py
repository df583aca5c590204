"""MaxPoolGrad's kernel (kernels/pool.py ``max_pool_grad_f32``) against the naive oracle of its definition
(tests/naive.py ``max_pool_grad``), bit for bit: ties (the first maximum), NaN (the first NaN), -inf and padding,
signed zeros, overlapping windows (several gradients added into one pixel tap by tap), every compute dtype
and overflow mode, subnormals flushed, and NCHW arrays read through their NHWC view (the torch path: no copy)."""
import numpy as np
import pytest

import naive
from ascend_emu.numerics.policy import bfloat16
from ascend_emu.ops import OPS, OpContext
from ascend_emu.ops.grad_ops import _pool_geometry

VALUES = np.array([0.0, -0.0, 1.0, -1.0, 2.0, np.inf, -np.inf, np.nan], np.float32)


def _cases():
    rng = np.random.default_rng(11)
    for trial in range(60):
        shape = tuple(int(v) for v in (rng.integers(1, 3), rng.integers(1, 8), rng.integers(1, 8), rng.integers(1, 4)))
        kind = trial % 3
        if kind == 0:
            x = rng.standard_normal(shape)
        elif kind == 1:     # mostly ties
            x = rng.integers(-1, 2, shape).astype(np.float64)
        else:               # NaN, signed zeros, infinities
            x = rng.choice(VALUES, shape)
        k = tuple(int(v) for v in rng.integers(1, 4, 2))
        s = tuple(int(v) for v in rng.integers(1, 3, 2))    # strides below the window: overlapping windows
        yield trial, x.astype(np.float32), k, s, rng


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_max_pool_grad_matches_the_naive_oracle(padding):
    checked = 0
    for trial, x, k, s, rng in _cases():
        if padding == "VALID" and (x.shape[1] < k[0] or x.shape[2] < k[1]):
            continue
        attrs = dict(ksize=[1, *k, 1], strides=[1, *s, 1], padding=padding)
        _, _, _, _, oh, ow, pt, pl = _pool_geometry(x.shape, attrs["ksize"], attrs["strides"], padding)
        dy = rng.standard_normal((x.shape[0], oh, ow, x.shape[3])).astype(np.float32)
        dy[rng.random(dy.shape) < 0.1] = -0.0
        if trial % 4 == 3:
            dy *= np.float32(1e-39)       # float32 subnormals: kept, or read as signed zeros under flush
        for dtype in ("float32", "float16", "bfloat16"):
            xd, dyd = x.astype(dtype if dtype != "bfloat16" else bfloat16), dy.astype(dtype if dtype != "bfloat16"
                                                                                       else bfloat16)
            for nchw in (False, True):
                xa, dya = xd, dyd
                if nchw:
                    xa = np.ascontiguousarray(xd.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
                    dya = np.ascontiguousarray(dyd.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
                for sub in ("keep", "flush"):
                    g = dyd.astype(np.float32)
                    if sub == "flush":
                        g = np.where(np.abs(g) < np.finfo(np.float32).tiny, g * np.float32(0), g)
                    want = naive.max_pool_grad(xd.astype(np.float32), g, *k, *s, pt, pl)
                    for mode in ("inf_nan", "saturation"):
                        ctx = OpContext(dtype=dtype, overflow_mode=mode, subnormals=sub)
                        (got,) = OPS["MaxPoolGrad"](xa, None, dya, ctx=ctx, **attrs)
                        assert got.shape == x.shape
                        if dtype == "float32":
                            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
                            assert ctx.status == 0
                        else:
                            bits, _ = naive.round_f64(want.astype(np.float64), dtype, mode, sub)
                            assert naive.bits_equal(got.view(np.uint16), bits.astype(np.uint16), dtype).all()
                        checked += 1
    assert checked > 500


def test_max_pool_grad_refuses_a_gradient_of_the_wrong_shape():
    from ascend_emu.errors import AscendEmuError

    x = np.zeros((1, 4, 4, 2), np.float32)
    with pytest.raises(AscendEmuError, match="MaxPoolGrad: grad of shape"):
        OPS["MaxPoolGrad"](x, None, np.zeros((1, 3, 3, 2), np.float32), ctx=OpContext(dtype="float32"),
                           ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="VALID")


def test_max_pool_grad_adds_tap_by_tap():
    """TBE max_pool_grad.py adds the selected gradients one tap at a time over the whole plane, so the gradients
    reaching a pixel add in the order of their winning taps, not of their windows: x = [0, 0, 9, 0, 0], windows
    of 3 at stride 1 all pick the 9 (at taps 2, 1, 0), dy = [1, 2^-24, 2^-24]: (2^-24 + 2^-24) + 1 = 1 + 2^-23,
    where the windows' order gives (1 + 2^-24) + 2^-24 = 1."""
    x = np.array([0, 0, 9, 0, 0], np.float32).reshape(1, 1, 5, 1)
    dy = np.array([1, 2.0 ** -24, 2.0 ** -24], np.float32).reshape(1, 1, 3, 1)
    (got,) = OPS["MaxPoolGrad"](x, None, dy, ctx=OpContext(dtype="float32"), ksize=[1, 1, 3, 1],
                                strides=[1, 1, 1, 1], padding="VALID")
    assert got[0, 0, 2, 0] == np.float32(1 + 2.0 ** -23)
    np.testing.assert_array_equal(got, naive.max_pool_grad(x, dy, 1, 3, 1, 1, 0, 0))
