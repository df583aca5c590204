"""HF32 as CANN defines it (issue 42): in precision_mode_v2 ``origin``, an identity-weight MatMul and a 1x1 Conv2D
built with TensorFlow return each float32 input rounded to HF32, 11 stored significand bits on the Ascend910B,
10 on the Ascend950, the matmul with ties away from zero (MatMulV3's SetHF32(true, 1)) and the convolution
nearest even (transMode 0); checked against naive_cube.hf32, written from the format's definition."""
from __future__ import annotations

import numpy as np
import pytest

import naive_cube

C = 32


@pytest.fixture(scope="module")
def identity_fns():
    tf = pytest.importorskip("tensorflow")
    eye = np.eye(C, dtype=np.float32)

    @tf.function(input_signature=[tf.TensorSpec([8, C], tf.float32)])
    def matmul(x):
        return tf.matmul(x, tf.constant(eye))

    @tf.function(input_signature=[tf.TensorSpec([2, 2, 2, C], tf.float32)])
    def conv(x):
        return tf.nn.conv2d(x, tf.constant(eye.reshape(1, 1, C, C)), strides=1, padding="VALID")
    return matmul, conv


def _inputs(shape):
    """float32 values with bits below both widths, with ties of both (where the tie rules part), both signs,
    from 2^-120 to 2^120 (normal values whose HF32 neither overflows nor underflows)."""
    rng = np.random.default_rng(42)
    n = int(np.prod(shape))
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-120, 120, n))).astype(np.float32)
    k = np.arange(n // 4)
    x[: n // 4] = 1 + (2 * k + 1) * 2.0 ** -12            # ties of 11 stored bits
    x[n // 4: n // 2] = -(1 + (2 * k + 1) * 2.0 ** -11)   # ties of 10 stored bits
    return x.reshape(shape)


@pytest.mark.parametrize("soc,bits", [("Ascend910B", 11), ("Ascend950", 10)])
def test_identity_matmul_and_1x1_conv_return_hf32_inputs(identity_fns, soc, bits):
    from ascend_emu import Device

    matmul, conv = identity_fns
    x = _inputs((8, C))
    got = Device(precision_mode_v2="origin", soc=soc, allow_hf32="conv,matmul").replay(matmul, {"x": x}, progress=False)
    want = naive_cube.hf32(x, bits, "round")
    np.testing.assert_array_equal(np.asarray(got.outputs[next(iter(got.outputs))]).view(np.uint32), want.view(np.uint32))
    # the other rule and the other width give other values on these inputs: the check above tells them apart
    assert not np.array_equal(want, naive_cube.hf32(x, bits, "rint"))
    assert not np.array_equal(want, naive_cube.hf32(x, 21 - bits, "round"))

    y = _inputs((2, 2, 2, C))
    dev = Device(precision_mode_v2="origin", soc=soc)                  # the SoC's default allow_hf32: conv
    assert dev.allow_hf32 == ("conv",)
    got = dev.replay(conv, {"x": y}, progress=False)
    want = naive_cube.hf32(y, bits, "rint")
    np.testing.assert_array_equal(np.asarray(got.outputs[next(iter(got.outputs))]).view(np.uint32), want.view(np.uint32))
    assert not np.array_equal(want, naive_cube.hf32(y, bits, "round"))
    assert not np.array_equal(want, naive_cube.hf32(y, 21 - bits, "rint"))
