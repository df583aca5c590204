"""kernels/cube/conv.has_nan (the NaN test that keeps a convolution with a NaN operand on its packed route) against
numpy's isnan on the values: every fp16 and every bf16 bit pattern, float32's special patterns (quiet and
signalling NaNs of both signs, Inf, signed zeros, subnormals, the largest finite) and random bits, at the first,
a middle and the last element of arrays of several lengths, and arrays longer than the serial limit (the parallel
slices: a NaN in each slice, or none). numerics/conv._has_nan on the dtypes it takes, a filter-sized array included."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.kernels.cube import conv as _kc
from ascend_emu.kernels.cube import has_nan
from ascend_emu.numerics import policy as config
from ascend_emu.numerics.conv import _has_nan

_ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def _oracle16(bits: np.ndarray, bits16: int) -> np.ndarray:
    """Per pattern: whether the fp16 (1) / bf16 (2) bits are a NaN, by numpy's isnan on the values."""
    if bits16 == 1:
        return np.isnan(bits.view(np.float16))
    return np.isnan((bits.astype(np.uint32) << 16).view(np.float32))


def _filler16(n: int, bits16: int, rng) -> np.ndarray:
    """n non-NaN 16-bit patterns: every sign, Inf included (the largest magnitude that is no NaN)."""
    pool = _ALL16[~_oracle16(_ALL16, bits16)]
    return rng.choice(pool, n)


@pytest.mark.parametrize("bits16", [1, 2])
@pytest.mark.parametrize("n", [1, 2, 16, 33, 1000])
def test_every_16_bit_pattern(bits16, n):
    rng = np.random.default_rng(n * 3 + bits16)
    expect = _oracle16(_ALL16, bits16)
    base = _filler16(n, bits16, rng)
    assert not has_nan(base, bits16)
    for at in sorted({0, n // 2, n - 1}):
        got = np.empty(_ALL16.size, dtype=bool)
        x = base.copy()
        for p in range(_ALL16.size):
            x[at] = _ALL16[p]
            got[p] = has_nan(x, bits16)
        bad = np.flatnonzero(got != expect)
        assert bad.size == 0, f"pattern {int(_ALL16[bad[0]]):#06x} at {at} of {n}: {got[bad[0]]}"


_F32_SPECIAL = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF,
                         0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000000, 0x80000000, 0x00000001,
                         0x807FFFFF, 0x00800000, 0x3F800000], dtype=np.uint32)


@pytest.mark.parametrize("n", [1, 17, 4097])
def test_float32_patterns(n):
    rng = np.random.default_rng(n)
    bits = np.concatenate([_F32_SPECIAL, rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32),
                           0x7F800000 + rng.integers(1, 1 << 23, 200, dtype=np.uint32)])   # many NaN payloads
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    expect = np.isnan(bits.view(np.float32))
    base = rng.standard_normal(n).astype(np.float32)
    base[::3] = np.inf
    base[1::5] = -0.0
    base[2::7] = np.float32(1e-40)   # subnormal
    assert not has_nan(base)
    for at in sorted({0, n // 2, n - 1}):
        x = base.copy()
        xb = x.view(np.uint32)
        for p in range(bits.size):
            xb[at] = bits[p]
            assert has_nan(x) == expect[p], f"pattern {int(bits[p]):#010x} at {at} of {n}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_parallel_slices(dtype):
    """Arrays past the serial limit: a NaN in each slice (its first and last element) or in none."""
    per = _kc._NAN_SERIAL
    n = 2 * per + 37
    rng = np.random.default_rng(5)
    if dtype == "float32":
        x = rng.standard_normal(n).astype(np.float32)
        x[::1000] = -np.inf
        nan, args = np.float32(np.nan), ()
    else:
        bits16 = 1 if dtype == "float16" else 2
        x = _filler16(n, bits16, rng)
        nan, args = np.uint16(0x7E01 if bits16 == 1 else 0xFFC1), (bits16,)
    assert not has_nan(x, *args)
    for at in (0, per - 1, per, 2 * per - 1, 2 * per, n - 1):
        y = x.copy()
        y[at] = nan
        assert has_nan(y, *args), at


def test_numerics_has_nan_dtypes():
    """numerics/conv._has_nan: fp16 / bf16 tested on their bits (a filter-sized array and an activation), float32
    and float64 on their values; an integer array holds none."""
    rng = np.random.default_rng(9)
    for shape in [(3, 3, 3, 16), (4, 32, 32, 16)]:
        v = rng.standard_normal(shape)
        for dt in (np.float16, config.bfloat16, np.float32, np.float64):
            a = v.astype(dt)
            a.reshape(-1)[::11] = np.inf
            assert not _has_nan(a)
            for at in (0, a.size // 3, a.size - 1):
                b = a.copy()
                b.reshape(-1)[at] = -np.nan
                assert _has_nan(b)
                assert _has_nan(b[..., ::2]) == (at % a.shape[-1] % 2 == 0)   # a strided view: copied first
    assert not _has_nan(np.arange(10))
