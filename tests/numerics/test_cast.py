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
from ascend_emu.kernels import cube as kcube
from ascend_emu.kernels.cube import epilogue as kepi
from ascend_emu.numerics import cast

ROUNDINGS = naive.ROUNDINGS
FMTS = ("float16", "bfloat16")
MODES = (("inf_nan", "keep"), ("saturation", "keep"), ("inf_nan", "flush"))   # (overflow, subnormals)
CONFIGS = [(r, ov, sub) for ov, sub in MODES for r in ROUNDINGS]

RC, OC, SC = config.ROUNDING_MODES, config.OVERFLOW_MODES, config.SUBNORMAL_MODES

# chunks of the 2**31 magnitudes (each also runs their negatives): 5-6 s each on one core
N_CHUNKS = {"float16": 64, "bfloat16": 32}
SLICE = 2 ** 18                # small enough for the kernels' and the oracle's arrays to stay in cache


def _assert_bits(got, want, fmt, what, x=None):
    eq = naive.bits_equal(got, want, fmt)
    if not eq.all():
        i = np.flatnonzero(~eq)[:5]
        gx = "" if x is None else f" inputs {np.asarray(x).ravel()[i]!r} (bits {np.asarray(x).ravel()[i].view(np.uint32 if np.asarray(x).dtype == np.float32 else np.uint64)})"
        raise AssertionError(f"{what}: {np.count_nonzero(~eq)} mismatches, e.g. at {i}{gx}: "
                             f"got {np.asarray(got).view(np.uint16).ravel()[i]} want {np.asarray(want).ravel()[i]}")


@njit   # not cached: Numba's cache would keep the kernel's code as it was when this was first compiled
def _fixpipe(src, out, stat, bf16):
    """out[i], stat[i] = the cube's Fixpipe conversion (rint, inf_nan, keep) of float32 bits src[i]."""
    vals = src.view(np.float32)
    for i in range(src.size):
        out[i], stat[i] = kcube.to16(vals[i], bf16, 0, 0)


@njit(cache=True)
def _statuses_are_overflows(out, stat, inf):
    """Whether stat[i] is 0x100 exactly where out[i] is +-Inf (the pattern ``inf`` with either sign)."""
    for i in range(out.size):
        if stat[i] != (0x100 if (out[i] & 0x7FFF) == inf else 0):
            return False
    return True


def _epilogue(src, out, fmt, ov):
    """The fused cube ops' one-pass epilogue with an empty chain: its own rounding of float32 bits src."""
    n = src.size
    res = out
    if n % 16:   # it takes (rows, 16) blocks: zeros (rounded to +0, no status) fill the last row
        src = np.concatenate([src, np.zeros(16 - n % 16, np.uint32)])
        res = np.empty(src.size, np.uint16)
    kind = kepi.OUT_F16 if fmt == "float16" else kepi.OUT_BF16
    st = kepi.epilogue(src.view(np.float32), False, src.size // 16, 16, 128, np.zeros((0, 5), np.int64),
                       np.zeros((1, 2048), np.float32), (np.zeros(1, np.float32),), (np.zeros(1, np.uint16),),
                       np.zeros(1, np.int64), res, np.zeros(1, np.float32), kind, OC[ov], kepi.HW_HALF, 0x100)
    out[:n] = res[:n]
    return st


def _kernels(fmt, rounding, ov, sub):
    """(name, run) of every kernel rounding float32 to ``fmt`` in this mode; run(src, out, stat) returns the
    OR of the statuses, or None when it wrote one per element into stat."""
    bf16 = fmt == "bfloat16"
    ks = [("cast", lambda u, o, s: kc.cast_f32_to_16(u, o, bf16, RC[rounding], OC[ov], SC[sub]))]
    if rounding == "rint" and not bf16 and kc.HW_HALF:  # the hardware path cast() takes
        ks.append(("cast hw", lambda u, o, s: kc.cast_f32_to_f16_rint_hw(u, o, OC[ov], SC[sub])))
    if rounding == "rint" and sub == "keep":
        ks.append(("epilogue", lambda u, o, s: _epilogue(u, o, fmt, ov)))
        if ov == "inf_nan":
            ks.append(("fixpipe", lambda u, o, s: _fixpipe(u, o, s, bf16)))
    return ks


def _check_slice(mags, fmt, out):
    """Every config, both signs, for float32 magnitude patterns: every kernel of ``_kernels`` against the oracle.

    Finite magnitudes go through the compiled oracle (naive.bracket32, choose32, check32), Inf and NaN through the
    general one; the kernels are called directly into reused buffers (the ``cast`` wrapper is covered by
    the other tests and by the Inf/NaN patterns) so the sweep's time goes into the comparison.
    """
    special = mags[mags >= 0x7F800000]
    if special.size:
        _check_specials(special, fmt)
        mags = mags[mags < 0x7F800000]
        out = out[:mags.size]
    mt, emin, emax = naive.GEOMETRY[fmt]
    inf = (emax + 2 - emin) << mt
    n = mags.size
    lo, hi, where = np.empty(n, np.uint16), np.empty(n, np.uint16), np.empty(n, np.uint8)
    naive.bracket32(mags, mt, emin, emax, lo, hi, where)
    stat, mag = np.empty(n, np.int32), np.empty(n, np.uint16)
    for negative in (False, True):
        u = mags | np.uint32(0x80000000) if negative else mags
        for rounding in ROUNDINGS:
            naive.choose32(lo, hi, where, ROUNDINGS.index(rounding), negative, mag)
            for ov, sub in MODES:
                for name, kernel in _kernels(fmt, rounding, ov, sub):
                    st = kernel(u, out, stat)
                    bad, over = naive.check32(mag, out, ROUNDINGS.index(rounding), negative, ov == "saturation",
                                              sub == "flush", mt, inf)
                    what = f"{fmt} {rounding} {ov} {sub} negative={negative} {name}"
                    if bad:
                        pick = naive.choose(rounding, negative, *naive.bracket(mags.view(np.float32), fmt))
                        want, _ = naive.finish(pick, rounding, negative, fmt, ov, sub)
                        _assert_bits(out, want, fmt, what, u.view(np.float32))
                        raise AssertionError(f"{what}: the compiled oracle differs, the numpy one does not")
                    if st is None:  # one status per element: 0x100 exactly where the value overflowed (to Inf)
                        assert _statuses_are_overflows(out, stat, inf), what
                    else:
                        assert st == (0x100 if over else 0), (what, hex(st))


def _check_specials(mags, fmt):
    """Inf and NaN magnitudes, both signs, every config: cast() against the general oracle, and the Fixpipe
    conversion bit for bit as the cast kernel (status 0x20 on each); the epilogue declines them (the caller's
    path then runs the cast)."""
    bf16 = fmt == "bfloat16"
    out, ref, stat = (np.empty(mags.size, t) for t in (np.uint16, np.uint16, np.int32))
    for negative in (False, True):
        x = (mags | np.uint32(0x80000000) if negative else mags).view(np.float32)
        for rounding, ov, sub in CONFIGS:
            got, st = cast(x, fmt, rounding, ov, sub)
            want, wst = naive.cast_bits(x, fmt, rounding, ov, sub)
            _assert_bits(got, want, fmt, f"{fmt} {rounding} {ov} {sub}", x)
            assert st == wst, (fmt, rounding, ov, sub, hex(st), hex(wst))
        _fixpipe(x.view(np.uint32), out, stat, bf16)
        kc.cast_f32_to_16(x.view(np.uint32), ref, bf16, RC["rint"], OC["inf_nan"], SC["keep"])
        assert np.array_equal(out, ref) and (stat == 0x20).all(), (fmt, negative)


@pytest.mark.exhaustive
@pytest.mark.parametrize("fmt, chunk", [(fmt, c) for fmt in FMTS for c in range(N_CHUNKS[fmt])],
                         ids=[f"{fmt}-{c}" for fmt in FMTS for c in range(N_CHUNKS[fmt])])
def test_f32_to_16_every_pattern(fmt, chunk):
    """Every float32 pattern through every kernel that rounds float32 to fp16 / bf16 (``_kernels``: the cast
    in each mode, its hardware rint path, the cube's Fixpipe conversion and the fused epilogue's rounding)."""
    size = 2 ** 31 // N_CHUNKS[fmt]
    out = np.empty(SLICE, dtype=np.uint16)
    for start in range(chunk * size, (chunk + 1) * size, SLICE):
        _check_slice(np.arange(start, start + SLICE, dtype=np.uint32), fmt, out)


def _windows():
    """Dense windows of float32 magnitude patterns around every third binade edge and below Inf."""
    edges = []
    for e in range(0, 256, 3):
        base = e << 23
        edges.append(np.arange(max(base - 2048, 0), min(base + 2048, 0x7FFFFFFF), dtype=np.uint32))
    return np.unique(np.concatenate(edges + [np.arange(0x7F7FF000, 0x7F800000, dtype=np.uint32)]))


def test_f32_to_16_slice_sampler():
    """A quick stand-in for the exhaustive sweep: dense windows around every binade edge."""
    mags = _windows()
    for fmt in FMTS:
        _check_slice(mags, fmt, np.empty(mags.size, dtype=np.uint16))


@pytest.mark.parametrize("fmt", FMTS)
def test_compiled_oracle_is_the_numpy_oracle(fmt):
    """The sweep's compiled oracle (naive.bracket32, choose32, check32) decides as the numpy one (bracket, choose,
    finish) on dense windows and on every value and midpoint of the format that float32 holds; check32 finds a
    one-bit change."""
    t = naive.TABLES[fmt]
    inf = naive._PARAMS[fmt][0]
    mids = t["mid32"][:inf][t["mid32"][:inf].astype(np.float64) == t["mid64"][:inf]]
    mags = np.unique(np.concatenate([_windows(), t["val32"][:inf].view(np.uint32), mids.view(np.uint32)]))
    mags = mags[mags < 0x7F800000]
    mt, emin, emax = naive.GEOMETRY[fmt]
    lo, hi, where = np.empty(mags.size, np.uint16), np.empty(mags.size, np.uint16), np.empty(mags.size, np.uint8)
    naive.bracket32(mags, mt, emin, emax, lo, hi, where)
    L, H, rne, tie = naive.bracket(mags.view(np.float32), fmt)
    assert np.array_equal(lo, L) and np.array_equal(hi, H) and np.array_equal(where == naive.HALF, tie)
    assert (where == naive.HALF).sum() == mids.size and (where == naive.EXACT).sum() >= inf
    mag = np.empty(mags.size, np.uint16)
    for negative in (False, True):
        for r, rounding in enumerate(ROUNDINGS):
            naive.choose32(lo, hi, where, r, negative, mag)
            assert np.array_equal(mag, naive.choose(rounding, negative, L, H, rne, tie)), (rounding, negative)
            for ov, sub in MODES:
                want, over = naive.finish(mag, rounding, negative, fmt, ov, sub)
                args = (r, negative, ov == "saturation", sub == "flush", mt, inf)
                assert naive.check32(mag, want, *args) == (False, over), (rounding, negative, ov, sub)
                for i in (0, mags.size // 2, mags.size - 1):
                    bent = want.copy()
                    bent[i] ^= 1
                    assert naive.check32(mag, bent, *args)[0], (rounding, negative, ov, sub, i)


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


@pytest.mark.skipif(not kc.HW_HALF, reason="no hardware fp16 conversion on this host")
def test_f16_to_f32_hw_is_the_integer_widening():
    """The CPU's fp16 -> float32 conversion (cast() takes it on HW_HALF hosts) gives the integer widening's bits
    for all 65,536 patterns, NaN payloads and signalling NaNs included, subnormals kept or flushed; parallel
    driver and serial span alike."""
    bits = np.arange(65536, dtype=np.uint16)
    for sub in ("keep", "flush"):
        want = np.empty(bits.size, np.uint32)
        kc.cast_16_to_f32(bits, want, False, SC[sub])
        for kernel in (kc.cast_f16_to_f32_hw, kc.span_f16_to_f32_hw):
            got = np.empty(bits.size, np.uint32)
            assert kernel(bits, got, SC[sub]) == 0
            assert np.array_equal(got, want), sub


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
