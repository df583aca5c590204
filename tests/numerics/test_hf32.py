"""HF32 rounding of float32 cube operands: every float32 bit pattern against an oracle from the format's
definition (float64 arithmetic on the value's HF32 grid; no bit manipulation), in the three roundings and
both overflow modes, and subnormal flushing."""
from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit

import ascend_emu as ae
from ascend_emu import AscendEmuError
from ascend_emu.kernels import cast as kh
from ascend_emu.numerics import policy as config

RC, OC, SC = config.ROUNDING_MODES, config.OVERFLOW_MODES, config.SUBNORMAL_MODES
#: the largest finite HF32 value: 11 significant bits at float32's largest exponent
HF32_MAX = (2.0 - 2.0 ** -10) * 2.0 ** 127
N_CHUNKS = 16                    # over the 2**31 magnitudes; each chunk also runs their negatives
CHUNK = 2 ** 31 // N_CHUNKS
SLICE = 2 ** 17                  # the kernel's twelve outputs of a slice stay in cache


@njit(cache=True)
def grid(v: float):
    """(v / quantum, quantum) for a finite positive value ``v`` (a float32 value, as float64): the quantum of 11
    significant bits in v's binade, the subnormal binades sharing 2^-136. Float arithmetic, no bit patterns."""
    _, e = math.frexp(v)                             # v = m 2^e with 0.5 <= m < 1: v's binade is 2^(e-1)
    q = math.ldexp(1.0, max(e - 1, -126) - 10)
    return v / q, q                                  # exact: a power-of-two scaling


@njit(cache=True)
def binade(v: float):
    """[start, end): the values ``grid`` gives v's quantum (v's binade; all below 2^-125 for the subnormals'
    shared one)."""
    _, e = math.frexp(v)
    if e - 1 <= -126:
        return 0.0, math.ldexp(1.0, -125)
    return math.ldexp(1.0, e - 1), math.ldexp(1.0, e)


@njit(cache=True)
def oracle(n: float, q: float, rounding: int) -> float:
    """HF32 of the value n q (``grid``'s): n rounded to an integer (0 nearest even, 1 toward zero, 2 nearest
    with ties away), times q; +inf past the largest HF32 value."""
    k = math.floor(n)
    frac = n - k
    if rounding == 0:
        if frac > 0.5 or (frac == 0.5 and k % 2.0 == 1.0):
            k += 1.0
    elif rounding == 2:
        if frac >= 0.5:
            k += 1.0
    r = k * q
    return math.inf if r > HF32_MAX else r


@njit(cache=True)
def mismatches(mags, got):
    """Compare the kernel's outputs ``got[r, s, g]`` (rounding r of ORACLE_ROUNDINGS; overflow s: inf_nan,
    saturation; sign g: +, -) for the non-negative finite patterns ``mags`` with the oracle. Returns (the
    first mismatching (i, r, s, g) or -1s, overflow seen per rounding)."""
    vals = mags.view(np.float32)
    want = np.empty(1, dtype=np.float32)
    wbits = want.view(np.uint32)
    over = np.zeros(3, dtype=np.bool_)
    start, end, q = 0.0, 0.0, 1.0                    # grid's quantum q is that of every value in [start, end)
    for i in range(mags.size):
        v = np.float64(vals[i])
        if start <= v < end:                         # runs of values share a binade: grid's division alone
            n = v / q
        elif v != 0.0:
            n, q = grid(v)
            start, end = binade(v)
        else:
            n, q = 0.0, 1.0
        for r in range(3):
            x = oracle(n, q, r)
            for s in range(2):
                y = x
                if y == math.inf:
                    over[r] = True
                    if s == 1:
                        y = HF32_MAX
                want[0] = y                          # exact: y is on the HF32 grid (or inf)
                for g in range(2):
                    b = wbits[0] | (np.uint32(0x80000000) if g == 1 else np.uint32(0))
                    if got[r, s, g, i] != b:
                        return (i, r, s, g), over
    return (-1, -1, -1, -1), over


ORACLE_ROUNDINGS = ("rint", "trunc", "round")


def _check(mags: np.ndarray, got: np.ndarray):
    """Every rounding, overflow mode and sign of the array kernel on ``mags`` (``got``: a reused buffer)."""
    sts = {}
    srcs = (mags, mags | np.uint32(0x80000000))
    for r, rounding in enumerate(ORACLE_ROUNDINGS):
        for s, ov in enumerate(("inf_nan", "saturation")):
            for g, src in enumerate(srcs):
                sts[r, s, g] = kh.round_hf32(src, got[r, s, g, :mags.size], RC[rounding], OC[ov], SC["keep"])
    (i, r, s, g), over = mismatches(mags, got)
    if i >= 0:
        raise AssertionError(f"input {mags[i] | (0x80000000 if g else 0):#010x} {ORACLE_ROUNDINGS[r]} "
                             f"{('inf_nan', 'saturation')[s]}: got {got[r, s, g, i]:#010x}")
    for (r, s, g), st in sts.items():
        assert st == (0x100 if over[r] else 0), (ORACLE_ROUNDINGS[r], s, g, hex(st))


@pytest.mark.exhaustive
@pytest.mark.parametrize("chunk", range(N_CHUNKS))
def test_every_float32_pattern(chunk):
    """All 2^32 patterns: the finite ones against the oracle; Inf and NaN in the last chunk."""
    got = np.empty((3, 2, 2, SLICE), dtype=np.uint32)
    top = min((chunk + 1) * CHUNK, 0x7F800000)
    for start in range(chunk * CHUNK, top, SLICE):
        _check(np.arange(start, min(start + SLICE, top), dtype=np.uint32), got)
    if chunk == N_CHUNKS - 1:
        _specials()


def _specials():
    """Inf stays Inf, every NaN stays NaN and is quiet, with no status, in every mode."""
    mags = np.arange(0x7F800000, 0x80000000, dtype=np.uint64).astype(np.uint32)
    out = np.empty(mags.size, dtype=np.uint32)
    for rounding in config.HF32_ROUNDINGS:
        for ov in ("inf_nan", "saturation"):
            for sign in (0, 0x80000000):
                src = mags | np.uint32(sign)
                st = kh.round_hf32(src, out, RC[rounding], OC[ov], SC["keep"])
                assert st == 0
                assert out[0] == src[0]                                  # Inf
                nan = out[1:]
                assert (nan & 0x7FC00000 == 0x7FC00000).all() and (nan & 0x80000000 == sign).all()
                assert (nan & 0x1FFF == 0).all()


def test_dense_windows_against_the_oracle():
    """A quick stand-in for the sweep (it runs in test-fast): every pattern in windows around every binade
    edge, the subnormals' ends and the overflow threshold."""
    starts = [e << 23 for e in range(0, 256, 3)] + [0x7F7FE000 - 4096, 0x7F7FFFFF - 8192]
    mags = np.unique(np.concatenate([np.arange(max(s - 8192, 0), min(s + 8192, 0x7F800000), dtype=np.uint32)
                                     for s in starts]))
    _check(mags, np.empty((3, 2, 2, mags.size), dtype=np.uint32))


def test_subnormal_flush():
    sub = np.arange(1, 1 << 23, dtype=np.uint32)
    for sign in (0, 0x80000000):
        src = sub | np.uint32(sign)
        got, st = ae.to_hf32(src.view(np.float32), subnormals="flush")
        assert st == 0 and (got.view(np.uint32) == sign).all()
    normal = np.arange(1 << 23, (1 << 23) + 10000, dtype=np.uint32).view(np.float32)
    assert np.array_equal(ae.to_hf32(normal, subnormals="flush")[0], ae.to_hf32(normal)[0])


def test_api_examples_and_errors():
    x = np.array([1.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -12, -(1 + 2 ** -11)], dtype=np.float32)
    assert ae.to_hf32(x)[0].tolist() == [1.0, 1.0, 1 + 2 ** -9, 1.0, -1.0]
    assert ae.to_hf32(x, "round")[0].tolist() == [1.0, 1 + 2 ** -10, 1 + 2 ** -9, 1.0, -(1 + 2 ** -10)]
    assert ae.to_hf32(x, "trunc")[0].tolist() == [1.0, 1.0, 1 + 2 ** -10, 1.0, -1.0]
    big = np.array([3.4028235e38], dtype=np.float32)
    got, st = ae.to_hf32(big)
    assert np.isposinf(got[0]) and st == 0x100
    assert ae.to_hf32(big, overflow_mode="saturation")[0][0] == np.float32(HF32_MAX)
    assert ae.to_hf32(np.float64(1 + 2 ** -11))[0] == 1.0            # float64 goes through float32 first
    with pytest.raises(AscendEmuError, match="HF32 rounding"):
        ae.to_hf32(x, "floor")
    with pytest.raises(AscendEmuError, match="overflow_mode"):
        ae.to_hf32(x, overflow_mode="wrap")
