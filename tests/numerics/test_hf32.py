"""HF32 rounding of float32 cube operands: every float32 bit pattern, in both widths (10 and 11 stored
significand bits) and the three roundings, against oracles written from the cited definitions, not from the
kernel:

- nearest even (SetHF32 transMode 0) and toward zero: the format's definition (float64 arithmetic on the value's
  grid of N + 1 significant bits, the subnormal binades sharing 2^-(126 + N); no bit manipulation);
- nearest with ties away (transMode 1): hicann/ops-nn's golden ``simulate_hf32_precision``
  (conv/convolution_forward/tests/assets/golden.py) as it is written: on the int32 view of the pattern, shift
  right by 22 - N, add 1, shift right by 1, shift left by 23 - N (11 stored bits on the Ascend910B: shifts 11
  and 12; 10 on the 950: 12 and 13); its saturation mode against the definition, and the dense windows against
  both.

Saturation (which differs from inf_nan only where a value rounds past the largest HF32) is checked on every
pattern of the top binade; subnormal flushing on every subnormal."""
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
WIDTHS = (10, 11)
ORACLE_ROUNDINGS = ("rint", "trunc", "round")
#: the largest finite HF32 value of each width: N + 1 significant bits at float32's largest exponent
HF32_MAX = np.array([(2.0 - 2.0 ** -n) * 2.0 ** 127 for n in WIDTHS])
N_CHUNKS = 16                    # over the 2**31 magnitudes; each chunk also runs their negatives
CHUNK = 2 ** 31 // N_CHUNKS
SLICE = 2 ** 17                  # the kernel's twelve outputs of a slice stay in cache
TOP_BINADE = 0x7F000000          # [2^127, 2^128): the only binade whose values can round past the largest HF32


@njit(cache=True)
def grid(v: float, n: int):
    """(v / quantum, quantum) for a finite positive value ``v`` (a float32 value, as float64): the quantum of
    n + 1 significant bits in v's binade, the subnormal binades sharing 2^-(126 + n). Float arithmetic, no bit
    patterns."""
    _, e = math.frexp(v)                             # v = m 2^e with 0.5 <= m < 1: v's binade is 2^(e-1)
    q = math.ldexp(1.0, max(e - 1, -126) - n)
    return v / q, q                                  # exact: a power-of-two scaling


@njit(cache=True)
def binade(v: float):
    """[start, end): the values sharing ``grid``'s quantum with v (v's binade; all below 2^-125 for the
    subnormals' shared one)."""
    _, e = math.frexp(v)
    if e - 1 <= -126:
        return 0.0, math.ldexp(1.0, -125)
    return math.ldexp(1.0, e - 1), math.ldexp(1.0, e)


@njit(cache=True)
def oracle(k: float, q: float, rounding: int, top: float) -> float:
    """HF32 of the value k q (``grid``'s): k rounded to an integer (0 nearest even, 1 toward zero, 2 nearest
    with ties away), times q; +inf past the largest HF32 value ``top``."""
    m = math.floor(k)
    frac = k - m
    if rounding == 0:
        if frac > 0.5 or (frac == 0.5 and m % 2.0 == 1.0):
            m += 1.0
    elif rounding == 2:
        if frac >= 0.5:
            m += 1.0
    r = m * q
    return math.inf if r > top else r


@njit(cache=True)
def golden(bits, n: int):
    """ops-nn's ``simulate_hf32_precision`` for n stored bits, on the int32 view of float32 pattern ``bits``:
    ``np.left_shift(np.right_shift(np.right_shift(x, 22 - n) + 1, 1), 23 - n)`` (arithmetic shifts)."""
    x = np.int64(np.int32(bits))
    r = ((x >> (22 - n)) + 1) >> 1 << (23 - n)
    return np.uint32(r & 0xFFFFFFFF)


@njit(cache=True)
def mismatches(mags, got, sat, tops, both):
    """Compare the kernel's outputs ``got[w, r, g]`` (width w of WIDTHS; rounding r of ORACLE_ROUNDINGS; sign
    g: +, -) for the non-negative finite patterns ``mags`` with the oracles; ``sat``: the outputs are the
    saturation mode's (an overflow is the largest HF32 value ``tops[w]``, not inf); ``both``: ties away against
    the definition as well as the golden. Returns (the first
    mismatching (i, w, r, g, which oracle) or -1s, overflow seen per (w, r))."""
    vals = mags.view(np.float32)
    want = np.empty(1, dtype=np.float32)
    wbits = want.view(np.uint32)
    over = np.zeros((2, 3), dtype=np.bool_)
    start, end, q = 0.0, 0.0, 1.0                    # grid's quantum q (10 bits) is that of every value in [start, end)
    for i in range(mags.size):
        v = np.float64(vals[i])
        if start <= v < end:                         # runs of values share a binade: grid's division alone
            k = v / q
        elif v != 0.0:
            k, q = grid(v, 10)
            start, end = binade(v)
        else:
            k, q = 0.0, 1.0
        for w in range(2):
            n = 10 + w
            # 11 bits: the same binade's quantum halved (exact scalings)
            kw, qw = (k, q) if w == 0 else (2.0 * k, 0.5 * q)
            for r in range(3):
                if r == 2 and not sat:
                    # ties away, inf_nan: the golden, on each sign's own pattern (its carry past the largest
                    # HF32 lands on the Inf pattern)
                    for g in range(2):
                        b = golden(mags[i] | (np.uint32(0x80000000) if g == 1 else np.uint32(0)), n)
                        if (b & np.uint32(0x7FFFFFFF)) == np.uint32(0x7F800000):
                            over[w, r] = True
                        if got[w, r, g, i] != b:
                            return (i, w, r, g, 1), over
                    if not both:
                        continue
                y = oracle(kw, qw, r, tops[w])
                if y == math.inf:
                    over[w, r] = True
                    if sat:
                        y = tops[w]
                want[0] = y                          # exact: y is on the HF32 grid (or inf)
                if got[w, r, 0, i] != wbits[0] or got[w, r, 1, i] != wbits[0] | np.uint32(0x80000000):
                    return (i, w, r, 0 if got[w, r, 0, i] != wbits[0] else 1, 0), over
    return (-1, -1, -1, -1, -1), over


def _check(mags: np.ndarray, got: np.ndarray, overflow: str = "inf_nan", both: bool = False):
    """Every width, rounding and sign of the array kernel on ``mags`` (``got``: a reused buffer)."""
    sts = {}
    srcs = (mags, mags | np.uint32(0x80000000))
    for w, n in enumerate(WIDTHS):
        for r, rounding in enumerate(ORACLE_ROUNDINGS):
            for g, src in enumerate(srcs):
                sts[w, r, g] = kh.round_hf32(src, got[w, r, g, :mags.size], RC[rounding], OC[overflow], SC["keep"], n)
    (i, w, r, g, which), over = mismatches(mags, got, overflow == "saturation", HF32_MAX, both)
    if i >= 0:
        raise AssertionError(f"input {mags[i] | (0x80000000 if g else 0):#010x} {WIDTHS[w]} bits "
                             f"{ORACLE_ROUNDINGS[r]} {overflow}: got {got[w, r, g, i]:#010x}, against the "
                             f"{('format definition', 'ops-nn golden')[which]}")
    for (w, r, g), st in sts.items():
        assert st == (0x100 if over[w, r] else 0), (WIDTHS[w], ORACLE_ROUNDINGS[r], g, overflow, hex(st))


@pytest.mark.exhaustive
@pytest.mark.parametrize("chunk", range(N_CHUNKS))
def test_every_float32_pattern(chunk):
    """All 2^32 patterns: the finite ones against the oracles (inf_nan), the top binade's in saturation too;
    Inf and NaN in the last chunk."""
    got = np.empty((2, 3, 2, SLICE), dtype=np.uint32)
    top = min((chunk + 1) * CHUNK, 0x7F800000)
    for start in range(chunk * CHUNK, top, SLICE):
        mags = np.arange(start, min(start + SLICE, top), dtype=np.uint32)
        _check(mags, got)
        if start >= TOP_BINADE:
            _check(mags, got, "saturation")
    if chunk == N_CHUNKS - 1:
        _specials()


def _specials():
    """Inf stays Inf, every NaN stays NaN and is quiet, with no status, in every mode and width."""
    mags = np.arange(0x7F800000, 0x80000000, dtype=np.uint64).astype(np.uint32)
    out = np.empty(mags.size, dtype=np.uint32)
    for n in WIDTHS:
        for rounding in config.HF32_ROUNDINGS:
            for ov in ("inf_nan", "saturation"):
                for sign in (0, 0x80000000):
                    src = mags | np.uint32(sign)
                    st = kh.round_hf32(src, out, RC[rounding], OC[ov], SC["keep"], n)
                    assert st == 0
                    assert out[0] == src[0]                                  # Inf
                    nan = out[1:]
                    assert (nan & 0x7FC00000 == 0x7FC00000).all() and (nan & 0x80000000 == sign).all()
                    assert (nan & ((1 << (23 - n)) - 1) == 0).all()


def test_dense_windows_against_the_oracle():
    """A quick stand-in for the sweep (it runs in test-fast): every pattern in windows around every binade
    edge, the subnormals' ends and the overflow thresholds of both widths, in both overflow modes."""
    starts = [e << 23 for e in range(0, 256, 3)] + [0x00800000, 0x7F7FE000 - 4096, 0x7F7FF000 - 4096, 0x7F7FFFFF - 8192]
    mags = np.unique(np.concatenate([np.arange(max(s - 8192, 0), min(s + 8192, 0x7F800000), dtype=np.uint32)
                                     for s in starts]))
    got = np.empty((2, 3, 2, mags.size), dtype=np.uint32)
    _check(mags, got, both=True)
    top = mags[mags >= TOP_BINADE]
    _check(top, got, "saturation")


@pytest.mark.parametrize("bits", WIDTHS)
def test_subnormal_flush(bits):
    sub = np.arange(1, 1 << 23, dtype=np.uint32)
    for sign in (0, 0x80000000):
        src = sub | np.uint32(sign)
        got, st = ae.to_hf32(src.view(np.float32), subnormals="flush", bits=bits)
        assert st == 0 and (got.view(np.uint32) == sign).all()
    normal = np.arange(1 << 23, (1 << 23) + 10000, dtype=np.uint32).view(np.float32)
    assert np.array_equal(ae.to_hf32(normal, subnormals="flush", bits=bits)[0], ae.to_hf32(normal, bits=bits)[0])


def test_api_examples_and_errors():
    # 11 stored bits (the default): the quantum at 1 is 2^-11, a tie is 2^-12 above a grid value
    x = np.array([1.0, 1 + 2 ** -12, 1 + 3 * 2 ** -12, 1 + 2 ** -13, -(1 + 2 ** -12)], dtype=np.float32)
    assert ae.to_hf32(x)[0].tolist() == [1.0, 1.0, 1 + 2 ** -10, 1.0, -1.0]
    assert ae.to_hf32(x, "round")[0].tolist() == [1.0, 1 + 2 ** -11, 1 + 2 ** -10, 1.0, -(1 + 2 ** -11)]
    assert ae.to_hf32(x, "trunc")[0].tolist() == [1.0, 1.0, 1 + 2 ** -11, 1.0, -1.0]
    # 10 stored bits: the quantum at 1 is 2^-10
    y = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -12], dtype=np.float32)
    assert ae.to_hf32(y, bits=10)[0].tolist() == [1.0, 1 + 2 ** -9, 1.0]
    assert ae.to_hf32(y, "round", bits=10)[0].tolist() == [1 + 2 ** -10, 1 + 2 ** -9, 1.0]
    assert ae.to_hf32(y, bits=11)[0].tolist() == [1 + 2 ** -11, 1 + 3 * 2 ** -11, 1.0]      # on 11 bits' grid
    big = np.array([3.4028235e38], dtype=np.float32)
    for bits, top in zip(WIDTHS, HF32_MAX):
        got, st = ae.to_hf32(big, bits=bits)
        assert np.isposinf(got[0]) and st == 0x100
        assert ae.to_hf32(big, overflow_mode="saturation", bits=bits)[0][0] == np.float32(top)
        assert ae.to_hf32(np.float32(top), bits=bits) == (np.float32(top), 0)         # the largest HF32 stays
    # subnormals round on the fixed quantum 2^-(126 + N): the smallest one is below half of it (0); 2^-137 is on
    # the 11-bit grid and a tie on the 10-bit one
    tiny = np.array([2.0 ** -149, 2.0 ** -137], dtype=np.float32)
    assert ae.to_hf32(tiny)[0].tolist() == [0.0, 2.0 ** -137]
    assert ae.to_hf32(tiny, bits=10)[0].tolist() == [0.0, 0.0]
    assert ae.to_hf32(tiny, "round", bits=10)[0].tolist() == [0.0, 2.0 ** -136]
    assert ae.to_hf32(np.float64(1 + 2 ** -12))[0] == 1.0            # float64 goes through float32 first
    with pytest.raises(AscendEmuError, match="HF32 rounding"):
        ae.to_hf32(x, "floor")
    with pytest.raises(AscendEmuError, match="overflow_mode"):
        ae.to_hf32(x, overflow_mode="wrap")
    with pytest.raises(AscendEmuError, match="HF32 width 12"):
        ae.to_hf32(x, bits=12)
