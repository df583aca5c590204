"""The convolutions' padded input: a 16-bit input widened straight into the zero-padded float32 buffer
(kernels/cube/conv.py widen_padded) holds the bits of the operand widening followed by np.pad, for every
16-bit pattern, both formats, kept or flushed subnormals and padding on every side and channel."""
import numpy as np
import pytest

from ascend_emu.numerics.cube import _operand_values, _padded_input, _policy
from ascend_emu.numerics.policy import bfloat16


@pytest.mark.parametrize("subnormals", ["keep", "flush"])
@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_widened_into_padding_equals_widen_then_pad(fmt, subnormals):
    rng = np.random.default_rng(5)
    dtype = np.float16 if fmt == "float16" else bfloat16
    pol = _policy(fmt, "float16", "inf_nan", subnormals, None)
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype).reshape(4, 64, 32, 8)
    cases = [(every, ((0, 0), (1, 2), (0, 1), (0, 0)))]
    for _ in range(25):
        shape = tuple(int(v) for v in rng.integers(1, 9, 4))
        pads = ((0, 0), tuple(int(v) for v in rng.integers(0, 3, 2)), tuple(int(v) for v in rng.integers(0, 3, 2)),
                (0, int(rng.integers(0, 3))))
        cases.append((rng.integers(0, 1 << 16, shape).astype(np.uint16).view(dtype), pads))
    for x, pads in cases:
        got, status = _padded_input(x, pol, pads)
        values, want_status = _operand_values(x, pol)
        want = np.pad(values, pads)
        assert status == want_status == 0 and got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), pads


@pytest.mark.parametrize("hw", [True, False])
@pytest.mark.parametrize("subnormals", ["keep", "flush"])
@pytest.mark.parametrize("pad_c", [0, 3])
def test_widen_padded_fp16_against_numpy(hw, subnormals, pad_c):
    """widen_padded of every fp16 pattern, by the CPU's conversion (hw, where the host has it) and by the integer
    widening, against numpy's float16 -> float32 (NaN payloads kept), subnormals made signed zeros under flush,
    then np.pad: one contiguous span per row (no channel padding) and pixel by pixel (channels padded)."""
    from ascend_emu.kernels.cast import HW_HALF
    from ascend_emu.kernels.cube import widen_padded
    from ascend_emu.numerics.policy import SUBNORMAL_MODES
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(4, 64, 32, 8)
    want = bits.view(np.float16).astype(np.float32)
    if subnormals == "flush":
        sub = ((bits & 0x7C00) == 0) & ((bits & 0x3FF) != 0)
        want = np.where(sub, np.copysign(np.float32(0), want), want)
    pads = ((0, 0), (2, 1), (1, 2), (0, pad_c))
    want = np.pad(want, pads).view(np.uint32)
    got = np.full(want.shape, 0xDEADBEEF, dtype=np.uint32)
    widen_padded(bits, got, 2, 1, False, SUBNORMAL_MODES[subnormals], hw and HW_HALF)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} differ, first at {tuple(bad[0])}: {got[tuple(bad[0])]:#x} != {want[tuple(bad[0])]:#x}"
