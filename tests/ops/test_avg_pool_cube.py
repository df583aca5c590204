"""AvgPool on fp16 as GE runs it: AvgPoolFusionPass (canndev avg_pool_pass.cpp) gives the TBE AvgPool a depthwise
filter, fp16(1/(kh*kw)) for VALID or ones for SAME followed by a Mul by fp16(1/area) per output position, and the
kernel runs it as a depthwise convolution on the cube. The oracle is tests/naive_cube.py's depthwise conv2d (fp16
products exact, float32 accumulation under the cube model, the fixpipe's rounding), then the exact product of two
fp16 values rounded once to fp16; output width 1 keeps the float64 mean."""
import numpy as np
import pytest

import naive_cube
from ascend_emu.ops import OpContext, run_op


def _area16(a):
    return np.float16(np.float32(1.0 / a))


@pytest.mark.parametrize("padding", ["VALID", "SAME"])
@pytest.mark.parametrize("k,s", [((2, 2), (2, 2)), ((3, 3), (1, 1)), ((3, 2), (2, 1))])
def test_fp16_avg_pool_is_the_depthwise_cube_convolution(padding, k, s):
    r = np.random.default_rng(sum(k) * 10 + sum(s))
    x = (r.standard_normal((2, 7, 6, 3)) * 8).astype(np.float16)
    ctx = OpContext(dtype="float16")
    (ours,) = run_op("AvgPool", x, ctx=ctx, ksize=[1, *k, 1], strides=[1, *s, 1], padding=padding)
    w = np.full((*k, 3, 1), _area16(k[0] * k[1]) if padding == "VALID" else np.float16(1), np.float16)
    want, st = naive_cube.conv2d(x, w, s, padding, (1, 1), model=ctx.cube_model, depthwise=True)
    if padding == "SAME":
        (pt, _), (pl, _) = naive_cube.conv_pads(padding, 7, 6, *k, s, (1, 1))
        area = np.empty(want.shape[1:3])
        for i in range(area.shape[0]):
            for j in range(area.shape[1]):
                h0, w0 = i * s[0] - pt, j * s[1] - pl
                area[i, j] = (min(h0 + k[0], 7) - max(h0, 0)) * (min(w0 + k[1], 6) - max(w0, 0))
        coffe = np.vectorize(_area16, otypes=[np.float16])(area)[None, :, :, None]
        want = (want.astype(np.float64) * coffe.astype(np.float64)).astype(np.float16)
    assert ours.dtype == np.float16 and ours.shape == want.shape
    np.testing.assert_array_equal(ours.view(np.uint16), want.view(np.uint16))


def test_fp16_avg_pool_differs_from_the_mean_and_keeps_it_for_width_one():
    """The cube form against the float64 mean (op_model exact): 1/9 is not an fp16, so VALID 3x3 outputs differ;
    a pooling whose output width is 1 is left to the vector kernel (the mean, here)."""
    x = (np.random.default_rng(3).standard_normal((1, 9, 9, 4)) * 8).astype(np.float16)
    kw = dict(ksize=[1, 3, 3, 1], strides=[1, 1, 1, 1], padding="VALID")
    (cube,) = run_op("AvgPool", x, ctx=OpContext(dtype="float16"), **kw)
    (mean,) = run_op("AvgPool", x, ctx=OpContext(dtype="float16", op_model="exact"), **kw)
    assert (cube != mean).mean() > 0.1
    g = dict(ksize=[1, 9, 9, 1], strides=[1, 1, 1, 1], padding="VALID")
    (a,) = run_op("AvgPool", x, ctx=OpContext(dtype="float16"), **g)
    (b,) = run_op("AvgPool", x, ctx=OpContext(dtype="float16", op_model="exact"), **g)
    np.testing.assert_array_equal(a, b)


def test_a_stride_over_63_is_left_to_the_vector_kernel():
    """AvgPoolFusionPass (avg_pool_pass.cc) returns without a filter when stridesH or stridesW is above 63: such a
    pooling keeps the vector kernel's model (the mean here), while stride 63 still takes the cube form."""
    x = (np.random.default_rng(5).standard_normal((1, 130, 130, 2)) * 8).astype(np.float16)
    for stride, cube in ((64, False), (63, True)):
        kw = dict(ksize=[1, 3, 3, 1], strides=[1, stride, stride, 1], padding="VALID")
        (ours,) = run_op("AvgPool", x, ctx=OpContext(dtype="float16"), **kw)
        (mean,) = run_op("AvgPool", x, ctx=OpContext(dtype="float16", op_model="exact"), **kw)
        assert ours.shape[2] > 1
        assert (ours != mean).any() == cube, stride
