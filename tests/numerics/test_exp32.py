"""The float32 exp without libm (kernels/exp32.py) against the path it replaces: float32(exp(float64(x))),
the C library's float64 exp rounded once, called per element exactly as the kernels did before.

The exhaustive test walks every float32 pattern (the NUMERICS.md argument, proven on this machine's C
library); the others run hostile values through the vector unit's float32 exp, Softmax and the sourced
kernels in every overflow and subnormal mode, and would fail if the guard or the fallback broke.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit, prange

from ascend_emu.kernels import exp32 as ke
from ascend_emu.kernels import sourced as ks
from ascend_emu.numerics import vector

_F32_MAX = np.float32(np.finfo(np.float32).max)
_TINY = np.float32(np.finfo(np.float32).tiny)


@njit(cache=True)
def _libm(x):
    """The replaced path: the C library's float64 exp, rounded once to float32."""
    return np.float32(math.exp(np.float64(x)))


def libm_exp(x):
    """float32(exp(float64(x))) elementwise, one libm call each (the old kernel's arithmetic)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return _libm_array(x.ravel()).reshape(x.shape)


@njit(cache=True)
def _libm_array(x):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = _libm(x[i])
    return out


def oracle(x, overflow_mode, subnormals):
    """(y, status) of the vector unit's float32 exp from the replaced path: input flush, one rounding,
    saturation of Inf/NaN, output flush."""
    x = np.array(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        return _oracle(x, overflow_mode, subnormals)


def _oracle(x, overflow_mode, subnormals):
    if subnormals == "flush":
        x = np.where(np.abs(x) < _TINY, x * np.float32(0.0), x)
    y = libm_exp(x)
    bad = ~(np.abs(y) <= _F32_MAX)
    if overflow_mode == "saturation":
        y = np.where(np.isnan(y), np.float32(0.0), np.where(np.isinf(y), _F32_MAX, y))
    if subnormals == "flush":
        y = np.where(np.abs(y) < _TINY, y * np.float32(0.0), y)
    return y.astype(np.float32), 0x20 if bad.any() else 0


# ------------------------------------------------------------------ exhaustive: every float32 input

N_CHUNKS = 16
_BLOCK = 4096


@njit(cache=True)
def _bits(v):
    return np.float32(v).view(np.uint32)


@njit(cache=True, parallel=True)
def _check_range(lo, n):
    """Mismatches of (the guard's sure values, exp_f32_64, exp_span in three modes) against the replaced
    path over patterns lo .. lo + n - 1: (count, first pattern or -1, unsure count)."""
    nb = n // _BLOCK
    bad = np.zeros(nb, dtype=np.int64)
    first = np.full(nb, -1, dtype=np.int64)
    unsure = np.zeros(nb, dtype=np.int64)
    for b in prange(nb):
        x = np.empty(_BLOCK, dtype=np.float32)
        ref = np.empty(_BLOCK, dtype=np.float32)
        o = np.empty((5, _BLOCK), dtype=np.float32)
        sure = np.empty(_BLOCK, dtype=np.bool_)
        for j in range(_BLOCK):
            x[j] = np.uint32(lo + b * _BLOCK + j).view(np.float32)
        for j in range(_BLOCK):         # the oracle, once per input
            ref[j] = _libm(x[j])
        # the kernels, each in a loop of its own (the pure arithmetic of exp_fast vectorises there)
        ke.exp_span(x, o[0], 0, False)
        ke.exp_span(x, o[1], 1, False)
        ke.exp_span(x, o[2], 0, True)
        for j in range(_BLOCK):
            o[3, j], sure[j] = ke.exp_fast(x[j])
        for j in range(_BLOCK):
            o[4, j] = ke.exp_f32_64(x[j])
        for j in range(_BLOCK):
            a = x[j]
            ref_j = ref[j]
            rb = _bits(ref_j)
            unsure[b] += np.int64(not sure[j])
            wrong = (sure[j] and _bits(o[3, j]) != rb) or _bits(o[4, j]) != rb
            wrong = wrong or _bits(o[0, j]) != rb
            sat = ref_j if abs(ref_j) <= _F32_MAX else (np.float32(0.0) if ref_j != ref_j else _F32_MAX)
            wrong = wrong or _bits(o[1, j]) != _bits(sat)
            # flushing moves only subnormal inputs: the oracle again for those alone
            fr = _libm(a * np.float32(0.0)) if abs(a) < _TINY else ref_j
            fr = fr * np.float32(0.0) if abs(fr) < _TINY else fr
            wrong = wrong or _bits(o[2, j]) != _bits(fr)
            if wrong:
                if bad[b] == 0:
                    first[b] = lo + b * _BLOCK + j
                bad[b] += 1
    f = -1
    for b in range(nb):
        if first[b] >= 0:
            f = first[b]
            break
    return bad.sum(), f, unsure.sum()


@pytest.mark.exhaustive
@pytest.mark.parametrize("chunk", range(N_CHUNKS))
def test_every_float32_input(chunk):
    """Bit for bit (NaN payloads included) in inf_nan, saturation and flush, on all 2^32 patterns."""
    per = 2 ** 32 // N_CHUNKS
    count, first, _ = _check_range(chunk * per, per)
    assert count == 0, f"{count} mismatches, the first at pattern {first:#010x}"


def test_sampled_ranges():
    """A quick stand-in for the exhaustive walk: the binades where softmax's exponents live, the
    overflow and underflow edges, and the NaN patterns."""
    for lo in (0x3F800000, 0x40000000, 0x41000000, 0x42AE0000, 0xC0000000, 0xC2AE0000, 0xC2CE0000,
               0x7F800000, 0xFFC00000 - 2 ** 20):
        count, first, _ = _check_range(lo, 2 ** 20)
        assert count == 0, f"{count} mismatches, the first at pattern {first:#010x}"


# ------------------------------------------------------------------ hostile data through the ops

def _unsure_inputs(k=24):
    """Inputs whose float64 polynomial value lies within the guard's bracket of a float32 midpoint
    (the fallback's cases), from the binade [2, 4) and its negatives."""
    found = []
    for lo in (0x40000000, 0xC0000000):
        x = (np.arange(lo, lo + 2 ** 23, dtype=np.uint64).astype(np.uint32)).view(np.float32)
        found.append(x[_unsure_mask(x)][:k // 2])
    return np.concatenate(found)


@njit(cache=True)
def _unsure_mask(x):
    m = np.zeros(x.size, dtype=np.bool_)
    for i in range(x.size):
        m[i] = not ke.exp_fast(x[i])[1]
    return m


def hostile_inputs():
    """NaNs with payloads, +-Inf, +-0, subnormals, the overflow/subnormal/zero edges of e^x, masked
    softmax values, the guard's unsure inputs, random patterns; spread over several 32K chunks."""
    u = np.uint32
    f = np.float32
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA5A5A5, 0xFFFFFFFF, 0x7FBFFFFF], dtype=u).view(f)
    special = np.array([np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754942e-38, -1.1754942e-38,
                        1.1754944e-38, -1e9, -3.4028235e38, 3.4028235e38, -1e4, -65504.0, 88.0, 89.0, -104.0,
                        -103.0, -87.0, -88.0, 0.5, -0.5, 1.0, -1.0], dtype=f)

    def around(v, k=64):
        c = np.float32(v).view(u)
        return np.arange(c - k, c + k, dtype=np.uint64).astype(u).view(f)

    edges = np.concatenate([around(88.72283935546875), around(-87.33654022216797), around(-103.97208404541016),
                            around(-103.27893829345703), around(89.0), around(-104.0)])
    rng = np.random.default_rng(20261125)
    rand = rng.integers(0, 2 ** 32, 2 ** 17, dtype=np.uint64).astype(u).view(f)
    normal = (rng.standard_normal(2 ** 17) * 8).astype(f)
    x = np.concatenate([rand, normal])
    pieces = [nans, special, edges, _unsure_inputs()]
    # each piece goes into a different 32K chunk of the kernel driver, and also at its very end
    for k, p in enumerate(pieces):
        at = (k + 1) * (1 << 15) - 7 - p.size // 2
        x[at:at + p.size] = p
    return np.concatenate([x, np.concatenate(pieces)])


@pytest.mark.parametrize("op_model", ["tbe_v220", "ascendc", "exact"])
@pytest.mark.parametrize("overflow_mode,subnormals", [("inf_nan", "keep"), ("saturation", "keep"),
                                                      ("inf_nan", "flush"), ("saturation", "flush")])
def test_float32_exp_hostile(op_model, overflow_mode, subnormals):
    x = hostile_inputs()
    y, st = vector("exp", x, dtype="float32", overflow_mode=overflow_mode, subnormals=subnormals,
                   impl_mode="high_precision", op_model=op_model)
    want, wst = oracle(x, overflow_mode, subnormals)
    got, ref = y.view(np.uint32), want.view(np.uint32)
    if not np.array_equal(got, ref):
        i = np.flatnonzero(got != ref)[:5]
        raise AssertionError(f"{np.count_nonzero(got != ref)} mismatches, e.g. x={x[i]!r} (bits "
                             f"{x[i].view(np.uint32)}) got {got[i]} want {ref[i]}")
    assert st == wst


def test_unsure_inputs_exist_and_take_the_fallback():
    """The guard fires on real inputs, the span recomputes exactly those (a missing second pass would
    leave its NaN marks), and NaN payloads come out as the C library returns them."""
    xs = _unsure_inputs()
    assert xs.size >= 8
    out = np.empty_like(xs)
    ke.exp_span(xs, out, 0, False)
    assert np.array_equal(out.view(np.uint32), libm_exp(xs).view(np.uint32))
    nan = np.array([0x7FA5A5A5, 0xFFC00001], dtype=np.uint32).view(np.float32)
    ke.exp_span(nan, out[:2], 0, False)
    assert np.array_equal(out[:2].view(np.uint32), libm_exp(nan).view(np.uint32))


def test_guard_catches_values_near_a_midpoint():
    """rounds_alike is False within 2^-45 (relative) of a float32 rounding boundary (a midpoint, the
    overflow threshold, a subnormal midpoint) and True at float32 values and a quarter-ulp off them."""
    rng = np.random.default_rng(11)
    f = np.concatenate([rng.uniform(-100, 88, 512).astype(np.float32), np.float32([1.0, 2.0, 1.5])])
    f = np.exp(f.astype(np.float64)).astype(np.float32)
    f = np.concatenate([f, np.float32([1e-40, 3e-45, 1.4e-45, np.finfo(np.float32).max, 1.1754944e-38])])
    ulp = np.ldexp(1.0, np.maximum(np.frexp(f.astype(np.float64))[1] - 24, -149))
    nxt = f.astype(np.float64) + ulp                                    # the next float32 (2^128 after the largest)
    mid = (f.astype(np.float64) + nxt) / 2                              # exact in float64
    for m in mid:
        for t in (0.0, 2.0 ** -46, -(2.0 ** -46), 2.0 ** -45.5, -(2.0 ** -45.5)):
            assert not ke.rounds_alike(m * (1.0 + t)), (m, t)
    for v, w in zip(f.astype(np.float64), nxt):
        assert ke.rounds_alike(v) and ke.rounds_alike(v + (w - v) / 4), v


def test_table_entries_are_the_nearest_float64():
    """EXP2_TABLE[j] is 2^(j/32) rounded to nearest (exactly: t - ulp/2 <= 2^(j/32) <= t + ulp/2, raised to
    the 32nd power in rational arithmetic), the table error NUMERICS.md's bound assumes."""
    from fractions import Fraction

    assert ke.EXP2_TABLE.shape == (32,) and ke.EXP2_TABLE.dtype == np.float64
    for j, t in enumerate(ke.EXP2_TABLE):
        half = Fraction(math.ulp(float(t))) / 2
        assert (Fraction(float(t)) - half) ** 32 <= 2 ** j <= (Fraction(float(t)) + half) ** 32, j


def test_polynomial_error_within_the_bound():
    """exp_poly64 stays within the relative 2^-47 NUMERICS.md proves (against the C library's float64 exp,
    itself within 2^-52), and the clamping makes e^x's float32 edges exact."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(-104, 89, 2 ** 16), np.linspace(-104, 89, 4097)]).astype(np.float32)
    y = np.array([ke.exp_poly64(v) for v in x])
    ref = np.exp(x.astype(np.float64))
    assert np.max(np.abs(y / ref - 1.0)) < 2.0 ** -47 - 2.0 ** -52
    assert ke.exp_f32_64(np.float32(-np.inf)) == 0 and ke.exp_f32_64(np.float32(np.inf)) == np.inf


@njit(cache=True)
def _sourced_exp(x):
    from_sourced = np.empty_like(x)
    for i in range(x.size):
        from_sourced[i] = ks.exp_f32(x[i], True)
    return from_sourced


def test_sourced_steps_use_the_same_exp():
    """The float32 exp step of the sourced kernels (Gelu, Tanh, Sigmoid, Exp; kernels/sourced.py) gives the
    replaced path's bits, so their step chains are unchanged."""
    x = hostile_inputs()
    assert np.array_equal(_sourced_exp(x).view(np.uint32), libm_exp(x).view(np.uint32))
