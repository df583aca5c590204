"""Sin and Cos (numerics/trig.py, kernels/trig.py) against the step-by-step oracle of the TBE kernels in
tests/naive.py (canndev tbe/impl/dynamic/sin.py and cos.py), bit for bit: every fp16 and bf16 input, and
random, raw-pattern and edge float32 inputs."""
from __future__ import annotations

import numpy as np
import pytest

import naive
from ascend_emu import AscendEmuError
from ascend_emu.numerics.trig import trig

ALL16 = np.arange(65536, dtype=np.uint16)
_F64 = {"sin": np.sin, "cos": np.cos}


def _assert_bits(got, want, fmt, what):
    eq = naive.bits_equal(got, want, fmt)
    bad = np.flatnonzero(~eq)
    assert not bad.size, f"{what}: {bad.size} mismatches, first input {int(ALL16[bad[0]]):#06x}"


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sin", "cos"])
def test_tbe_kernel_every_16bit_input(op, fmt):
    """The TBE kernel (both generations: the steps are the same) on every 16-bit pattern, both overflow
    modes, bits and status."""
    x = ALL16.view(naive.FORMATS[fmt])
    for ov in ("inf_nan", "saturation"):
        want, wst = naive.steps16(f"{op}_tbe", fmt, ALL16, ov)
        for model in ("tbe_v100", "tbe_v220"):
            got, st = trig(op, x, dtype=fmt, overflow_mode=ov, op_model=model)
            assert got.dtype == x.dtype
            _assert_bits(got, want, fmt, f"{op} {fmt} {ov} {model}")
            assert st == wst == 0x20       # Inf and NaN inputs give NaN


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sin", "cos"])
def test_ascendc_and_exact_models_every_16bit_input(op, fmt):
    """ascendc (the 950's DAG): the float32 sin/cos correctly rounded, then CAST_RINT; exact: the float64 value
    rounded once."""
    x = ALL16.view(naive.FORMATS[fmt])
    with np.errstate(invalid="ignore"):
        y64 = _F64[op](naive.to_f64(ALL16, fmt))
    want_ac, _ = naive.round_f64(y64.astype(np.float32).astype(np.float64), fmt)
    want_ex, _ = naive.round_f64(y64, fmt)
    _assert_bits(trig(op, x, dtype=fmt, op_model="ascendc")[0], want_ac, fmt, f"{op} {fmt} ascendc")
    _assert_bits(trig(op, x, dtype=fmt, op_model="exact")[0], want_ex, fmt, f"{op} {fmt} exact")


def _f32_inputs(rng):
    pi = np.float32(np.pi)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 3.4028235e38, -3.4028235e38,
                      pi, -pi, pi / 2, 2 * pi, 3 * pi / 2, 1.5e9, 7.0e9, -7.0e9, 1e20, 65504.0, -65504.0],
                     dtype=np.float32)
    normal = (rng.standard_normal(20000) * 20).astype(np.float32)
    raw = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([edges, normal, raw])


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_tbe_kernel_float32(op):
    """float32 compute: every step a float32 operation (range reduction, Taylor terms, the sign), both
    overflow modes; the int32 conversions saturate beyond |x| = 2^31 pi."""
    x = _f32_inputs(np.random.default_rng(42))
    for ov in ("inf_nan", "saturation"):
        got, st = trig(op, x, dtype="float32", overflow_mode=ov)
        want, bad = naive.steps32(f"{op}_tbe", x, ov)
        if ov == "saturation":
            want = np.where(np.isnan(want), np.float32(0), want)
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (op, ov, x[~same][:4], got[~same][:4], want[~same][:4])
        assert st == (0x20 if bad else 0) == 0x20


def test_tbe_kernel_is_not_the_exact_function():
    """What the sources imply, in numbers: the Taylor series to x^14 leaves cos off by up to ~4e-6 near |x'| = pi,
    sin's series to x^11 stays within 1e-7 of sin; both reduce by float32 pi, so an fp16 table of positions keeps
    to fp16 rounding of the true value; sin(-0) is +0 (x - 0 * pi)."""
    x = np.float32([3.1, -3.1, 3.14, 1.5])
    cos_tbe, _ = trig("cos", x, dtype="float32")
    assert np.abs(cos_tbe.astype(np.float64) - np.cos(x.astype(np.float64))).max() > 2e-6
    sin_tbe, _ = trig("sin", x, dtype="float32")
    assert np.abs(sin_tbe.astype(np.float64) - np.sin(x.astype(np.float64))).max() < 1e-7
    assert not np.signbit(trig("sin", np.float16([-0.0]), dtype="float16")[0][0])
    pos = np.arange(2048, dtype=np.float16)
    for op in ("sin", "cos"):
        y, _ = trig(op, pos, dtype="float16")
        assert np.abs(y.astype(np.float64) - _F64[op](pos.astype(np.float64))).max() <= 2 ** -11 + 4e-6


def test_bad_arguments_are_one_line():
    with pytest.raises(AscendEmuError, match="sin or cos"):
        trig("tan", np.float32([1.0]))
    with pytest.raises(AscendEmuError, match="op_model"):
        trig("sin", np.float32([1.0]), op_model="cuda")
