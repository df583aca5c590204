"""Casts: bit for bit against the independent oracle in tests/naive.py.

The exhaustive tests walk every float32 bit pattern through fp32 -> fp16 and
fp32 -> bf16 in every rounding mode, both overflow modes, and with subnormal
flushing; the float16/bfloat16 -> float32 tests walk all 65,536 patterns.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba import njit

import naive
from ascend_emu import AscendEmuError
from ascend_emu.numerics import policy as config
from ascend_emu.kernels import cast as kc
from ascend_emu.numerics import cast

ROUNDINGS = naive.ROUNDINGS
FMTS = ("float16", "bfloat16")
CONFIGS = [(r, ov, "keep") for r in ROUNDINGS for ov in ("inf_nan", "saturation")] + [
    (r, "inf_nan", "flush") for r in ROUNDINGS]

RC, OC, SC = config.ROUNDING_MODES, config.OVERFLOW_MODES, config.SUBNORMAL_MODES

N_CHUNKS = 32                 # 2**31 magnitudes, each chunk also runs their negatives
CHUNK = 2 ** 31 // N_CHUNKS
SLICE = 2 ** 24


def _assert_bits(got, want, fmt, what, x=None):
    eq = naive.bits_equal(got, want, fmt)
    if not eq.all():
        i = np.flatnonzero(~eq)[:5]
        gx = "" if x is None else f" inputs {np.asarray(x).ravel()[i]!r} (bits {np.asarray(x).ravel()[i].view(np.uint32 if np.asarray(x).dtype == np.float32 else np.uint64)})"
        raise AssertionError(f"{what}: {np.count_nonzero(~eq)} mismatches, e.g. at {i}{gx}: "
                             f"got {np.asarray(got).view(np.uint16).ravel()[i]} want {np.asarray(want).ravel()[i]}")


def _check_slice(mags, fmt, out):
    """Every config, both signs, for one slice of float32 magnitude patterns.

    Calls the array kernel directly into a reused buffer (the ``cast`` wrapper is
    covered by the other tests) so the sweep's time goes into the comparison.
    """
    bf16 = fmt == "bfloat16"
    finite = mags < 0x7F800000
    if not finite.all():  # the slice holding Inf and the NaNs: the general oracle handles them
        for negative in (False, True):
            x = (mags | np.uint32(0x80000000) if negative else mags).view(np.float32)
            for rounding, ov, sub in CONFIGS:
                got, st = cast(x, fmt, rounding, ov, sub)
                want, wst = naive.cast_bits(x, fmt, rounding, ov, sub)
                _assert_bits(got, want, fmt, f"{fmt} {rounding} {ov} {sub}", x)
                assert st == wst, (fmt, rounding, ov, sub, hex(st), hex(wst))
        return
    lo, hi, rne, tie = naive.bracket(mags.view(np.float32), fmt)
    for negative in (False, True):
        u = mags | np.uint32(0x80000000) if negative else mags
        for rounding, ov, sub in CONFIGS:
            mag = naive.choose(rounding, negative, lo, hi, rne, tie)
            want, over = naive.finish(mag, rounding, negative, fmt, ov, sub)
            kernels = [lambda: kc.cast_f32_to_16(u, out, bf16, RC[rounding], OC[ov], SC[sub])]
            if rounding == "rint" and not bf16 and kc.HW_HALF:  # the hardware path cast() takes
                kernels.append(lambda: kc.cast_f32_to_f16_rint_hw(u, out, OC[ov], SC[sub]))
            for k, kernel in enumerate(kernels):
                st = kernel()
                if not np.array_equal(out, want):
                    _assert_bits(out, want, fmt, f"{fmt} {rounding} {ov} {sub} negative={negative} kernel {k}",
                                 u.view(np.float32))
                assert st == (0x100 if over else 0), (fmt, rounding, ov, sub, negative, k, hex(st))


@pytest.mark.exhaustive
@pytest.mark.parametrize("chunk", range(N_CHUNKS))
@pytest.mark.parametrize("fmt", FMTS)
def test_f32_to_16_every_pattern(fmt, chunk):
    out = np.empty(SLICE, dtype=np.uint16)
    for start in range(chunk * CHUNK, (chunk + 1) * CHUNK, SLICE):
        _check_slice(np.arange(start, start + SLICE, dtype=np.uint32), fmt, out)


def test_f32_to_16_slice_sampler():
    """A quick stand-in for the exhaustive sweep: dense windows around every binade edge."""
    edges = []
    for e in range(0, 256, 3):
        base = e << 23
        edges.append(np.arange(max(base - 2048, 0), min(base + 2048, 0x7FFFFFFF), dtype=np.uint32))
    mags = np.unique(np.concatenate(edges + [np.arange(0x7F7FF000, 0x7F800000, dtype=np.uint32)]))
    for fmt in FMTS:
        _check_slice(mags, fmt, np.empty(mags.size, dtype=np.uint16))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("src", ["float32", "float64"])
def test_random_patterns_all_modes(fmt, src):
    rng = np.random.default_rng(7)
    if src == "float32":
        x = rng.integers(0, 2 ** 32, 2 ** 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    else:
        x = np.concatenate([rng.integers(0, 2 ** 64, 2 ** 17, dtype=np.uint64).view(np.float64),
                            rng.standard_normal(2 ** 17) * np.exp2(rng.integers(-160, 140, 2 ** 17))])
    for rounding in ROUNDINGS:
        for ov in ("inf_nan", "saturation"):
            for sub in ("keep", "flush"):
                got, st = cast(x, fmt, rounding, ov, sub)
                want, wst = naive.cast_bits(x, fmt, rounding, ov, sub)
                _assert_bits(got, want, fmt, f"{src}->{fmt} {rounding} {ov} {sub}", x)
                assert st == wst


def test_float64_single_rounding():
    """float64 -> 16-bit rounds once: going through float32 first would round twice."""
    x = np.array([1 + 2 ** -11 + 2 ** -40, -(1 + 2 ** -11 + 2 ** -40)])
    direct, _ = cast(x, "float16")
    via32, _ = cast(x.astype(np.float32), "float16")
    assert list(direct.view(np.uint16)) == [0x3C01, 0xBC01]
    assert list(via32.view(np.uint16)) == [0x3C00, 0xBC00]
    assert direct[0] == np.float16(1 + 2 ** -10)
    y = np.array([1 + 2 ** -8 + 2 ** -40])
    assert cast(y, "bfloat16")[0].view(np.uint16)[0] == 0x3F81
    assert cast(y.astype(np.float32), "bfloat16")[0].view(np.uint16)[0] == 0x3F80
    # float64 -> float32 through the same routine
    z = np.array([1 + 2 ** -24 + 2 ** -40, 1 + 2 ** -24])
    got, st = cast(z, "float32")
    assert got.tolist() == [np.float32(1 + 2 ** -23), np.float32(1.0)] and st == 0


@pytest.mark.parametrize("fmt", FMTS)
def test_16_to_f32_every_pattern(fmt):
    bits = np.arange(65536, dtype=np.uint16)
    x = bits.view(naive.FORMATS[fmt])
    with np.errstate(invalid="ignore"):
        ref = x.astype(np.float32)
    nan = np.isnan(ref)
    got, st = cast(x, "float32")
    assert st == 0 and got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32)[~nan], ref.view(np.uint32)[~nan])
    assert np.isnan(got[nan]).all()
    flushed, _ = cast(x, "float32", subnormals="flush")
    sub = (np.abs(ref) < float(ml_dtypes.finfo(naive.FORMATS[fmt]).smallest_normal)) & (ref != 0)
    assert sub.sum() == 2 * (2 ** naive._PARAMS[fmt][3] - 1)
    assert np.array_equal(flushed.view(np.uint32)[sub], ref.view(np.uint32)[sub] & 0x80000000)
    assert np.array_equal(flushed.view(np.uint32)[~sub & ~nan], ref.view(np.uint32)[~sub & ~nan])
    wide, _ = cast(x, "float64")
    assert np.array_equal(wide[~nan], ref[~nan].astype(np.float64))


def test_16_to_16_rounds_once():
    bits = np.arange(65536, dtype=np.uint16)
    for src, dst in (("float16", "bfloat16"), ("bfloat16", "float16")):
        x = bits.view(naive.FORMATS[src])
        for rounding in ROUNDINGS:
            for overflow in ("saturation", "inf_nan"):
                got, st = cast(x, dst, rounding, overflow)
                want, wst = naive.cast_bits(naive.to_f64(bits, src), dst, rounding, overflow)
                _assert_bits(got, want, dst, f"{src}->{dst} {rounding} {overflow}")
                assert st == wst
    # under flush the source's subnormals are read as signed zeros on the way in (the widening step),
    # even an fp16 subnormal that bf16 could hold
    sub = np.array([2.0 ** -20, -(2.0 ** -24)], np.float16)
    got, _ = cast(sub, "bfloat16", subnormals="flush")
    assert np.all(got.astype(np.float32) == 0) and list(np.signbit(got.astype(np.float32))) == [False, True]


def test_overflow_modes_and_status():
    x = np.array([60000.0, 65519.0, 65520.0, 1e6, -1e6, np.inf, -np.inf, np.nan], dtype=np.float32)
    got, st = cast(x, "float16")
    assert got[:5].tolist() == [60000.0, 65504.0, np.inf, np.inf, -np.inf]
    assert np.isnan(got[7]) and st == 0x120
    got, st = cast(x, "float16", overflow_mode="saturation")
    assert got.tolist()[:7] == [60000.0, 65504.0, 65504.0, 65504.0, -65504.0, 65504.0, -65504.0]
    assert got.view(np.uint16)[7] == 0 and st == 0x120
    assert cast(x[:2], "float16")[1] == 0
    t, st = cast(np.float32([70000.0, -70000.0]), "float16", rounding="trunc")
    assert t.tolist() == [65504.0, -65504.0] and st == 0x100
    c, st = cast(np.float32([65505.0, -65505.0]), "float16", rounding="ceil")
    assert c.tolist() == [np.inf, -65504.0] and st == 0x100
    f, st = cast(np.float32([65505.0]), "float16", rounding="floor")
    assert f.tolist() == [65504.0] and st == 0  # floor(65505) = 65504 is in range: no overflow


def test_rounding_modes_examples():
    x = np.float32([1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 2 ** -11), 1 + 2 ** -12])
    ulp = 2 ** -10
    expect = {
        "rint": [1, 1 + 2 * ulp, -1, 1],
        "round": [1 + ulp, 1 + 2 * ulp, -(1 + ulp), 1],
        "floor": [1, 1 + ulp, -(1 + ulp), 1],
        "ceil": [1 + ulp, 1 + 2 * ulp, -1, 1 + ulp],
        "trunc": [1, 1 + ulp, -1, 1],
        "odd": [1 + ulp, 1 + ulp, -(1 + ulp), 1 + ulp],
    }
    for rounding, want in expect.items():
        got, st = cast(x, "float16", rounding)
        assert got.astype(np.float64).tolist() == want, rounding
        assert st == 0


def test_subnormal_flush():
    tiny = np.float32([2.0 ** -20, -(2.0 ** -20), 2.0 ** -14, -(2.0 ** -30)])
    got, _ = cast(tiny, "float16", subnormals="flush")
    assert got.view(np.uint16).tolist() == [0, 0x8000, 0x0400, 0x8000]
    # rounding up to the smallest normal is not a subnormal result
    edge = np.float32([2.0 ** -14 - 2.0 ** -26])
    assert cast(edge, "float16", subnormals="flush")[0].view(np.uint16)[0] == 0x0400
    # floor of a tiny negative is -smallest subnormal, then flushed to -0
    assert cast(np.float32([-1e-30]), "float16", "floor")[0].view(np.uint16)[0] == 0x8001
    assert cast(np.float32([-1e-30]), "float16", "floor", subnormals="flush")[0].view(np.uint16)[0] == 0x8000


def test_identity_and_integer_inputs():
    x = np.float32([1.5, np.inf, np.nan, 1e-45])
    y, st = cast(x, "float32", overflow_mode="saturation", subnormals="flush")
    assert st == 0 and y is not x and np.array_equal(y.view(np.uint32), x.view(np.uint32))
    h = np.float16([1, 2])
    assert cast(h, np.float16)[0] is not h
    got, st = cast(np.array([1, 70000, -3], dtype=np.int32), "float16")
    assert got.tolist() == [1.0, np.inf, -3.0] and st == 0x100
    got, st = cast(np.array([True, False]), "bfloat16")
    assert got.astype(np.float32).tolist() == [1.0, 0.0] and st == 0
    assert cast(2.5, "float16")[0].shape == ()


def test_scalar_kernels_agree_with_array_kernel():
    """The scalar functions other kernels call give the same bits and status."""
    @njit
    def run(x, rounding, overflow, subnormal):
        n = x.size
        h = np.empty(n, np.uint16)
        b = np.empty(n, np.uint16)
        hs = np.empty(n, np.int32)
        bs = np.empty(n, np.int32)
        back = np.empty(n, np.float32)
        for i in range(n):
            h[i], hs[i] = kc.f32_to_16_bits(x[i], False, rounding, overflow, subnormal)
            b[i], bs[i] = kc.f32_to_16_bits(x[i], True, rounding, overflow, subnormal)
            back[i] = kc.f16_bits_to_f32(h[i]) + kc.bf16_bits_to_f32(b[i])
        return h, hs, b, bs, back

    rng = np.random.default_rng(3)
    x = rng.integers(0, 2 ** 32, 2 ** 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for rc, rounding in enumerate(ROUNDINGS):
        for oc, ov in enumerate(("inf_nan", "saturation")):
            h, hs, b, bs, back = run(x, rc, oc, 0)
            wh, sh = naive.cast_bits(x, "float16", rounding, ov)
            wb, sb = naive.cast_bits(x, "bfloat16", rounding, ov)
            _assert_bits(h, wh, "float16", rounding)
            _assert_bits(b, wb, "bfloat16", rounding)
            assert np.bitwise_or.reduce(hs) == sh and np.bitwise_or.reduce(bs) == sb
            with np.errstate(invalid="ignore", over="ignore"):
                ref = h.view(np.float16).astype(np.float32) + b.view(ml_dtypes.bfloat16).astype(np.float32)
            assert np.array_equal(np.isnan(back), np.isnan(ref))
            assert np.array_equal(back[~np.isnan(ref)], ref[~np.isnan(ref)])
    y = rng.standard_normal(1000) * 1e3
    for i in range(1000):
        assert kc.f64_to_16_bits(y[i], False, 0, 0, 0)[0] == np.float16(y[i]).view(np.uint16)
        assert kc.f64_to_16_bits(y[i], True, 0, 0, 0)[0] == naive.cast_bits(y[i:i + 1], "bfloat16")[0][0]


@pytest.mark.parametrize("kwargs, match", [
    ({"dtype": "float8"}, "unsupported cast target dtype 'float8'; choose one of: float16, bfloat16, float32, float64"),
    ({"dtype": np.int32}, "unsupported cast target dtype <class 'numpy.int32'>; choose one of: float16, bfloat16"),
    ({"dtype": "float16", "rounding": "nearest"}, "unknown rounding mode 'nearest'; choose one of: rint, round"),
    ({"dtype": "float16", "overflow_mode": "wrap"}, "unknown overflow_mode 'wrap'; choose one of: inf_nan, saturation"),
    ({"dtype": "float16", "subnormals": "daz"}, "unknown subnormals mode 'daz'; choose one of: keep, flush"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(AscendEmuError, match=match):
        cast(np.ones(3, np.float32), **kwargs)


def test_non_numeric_inputs():
    for x in (np.array(["a", "b"]), np.array([1 + 2j]), np.array([object()], dtype=object)):
        with pytest.raises(AscendEmuError, match="must be a real numeric array"):
            cast(x, "float16")
    with pytest.raises(AscendEmuError, match="beyond 2\\*\\*53"):
        cast(np.array([2 ** 60 + 1], dtype=np.int64), "float16")
    with pytest.raises(ValueError):  # AscendEmuError is a ValueError
        cast(np.ones(2), "float16", rounding="bankers")


@pytest.mark.parametrize("fmt", FMTS)
def test_small_arrays_take_the_one_span_kernels_with_the_same_bits(fmt):
    """cast() runs arrays of at most 4,096 values on one span (no parallel region): every fp16/bf16 pattern
    widened 4,096 at a time, and hostile float32 values narrowed in pieces of 0 to 4,097, against the oracle."""
    bits = np.arange(65536, dtype=np.uint16)
    whole, _ = cast(bits.view(naive.FORMATS[fmt]), "float32")
    for sub in ("keep", "flush"):
        want = cast(bits.view(naive.FORMATS[fmt]), "float32", subnormals=sub)[0].view(np.uint32)
        pieces = [cast(bits[i:i + 4096].view(naive.FORMATS[fmt]), "float32", subnormals=sub)
                  for i in range(0, 65536, 4096)]
        assert all(st == 0 for _, st in pieces)
        assert np.array_equal(np.concatenate([p.view(np.uint32) for p, _ in pieces]), want)
    rng = np.random.default_rng(3)
    x = rng.integers(0, 2 ** 32, 40000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x[::7] = rng.choice(np.array([65504.0, 65520.0, -65536.0, np.inf, -np.inf, np.nan, 6e-8, -3e-5, 0.0],
                                 np.float32), x[::7].size)
    start = 0
    for n in (0, 1, 2, 7, 100, 4095, 4096, 4097, 1, 4096):
        piece = x[start:start + n]
        start += n
        for ov in ("inf_nan", "saturation"):
            for sub in ("keep", "flush"):
                got, st = cast(piece, fmt, "rint", ov, sub)
                want, wst = naive.cast_bits(piece, fmt, "rint", ov, sub)
                _assert_bits(got, want, fmt, f"{n} values rint {ov} {sub}", piece)
                assert st == wst and got.shape == piece.shape
