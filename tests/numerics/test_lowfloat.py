"""The 950's 8- and 4-bit formats against oracles written from their published definitions.

Decoding: every code of every format against a decoder that reads the bit fields as strings (HiF8's dot prefix,
sign-magnitude exponent with its implicit 1, the denormals 2^(m-23); the IEEE-like fields of OCP FP8 / FP4 and
E8M0), and ml_dtypes where it has the format. Encoding: every float16 and every bfloat16 pattern, in every
rounding, overflow mode and keep-NaN setting the 950 documents, against a value-table oracle (float64 nearest /
directed search over the format's decoded values with the tie rule; HiF8's hybrid rule from its value-domain
reading: the fraction of the way between the two neighbours, in 14 or 2 bits, against the threshold), and FP8
against ml_dtypes wherever ml_dtypes rounds the same way. A float32 sweep of HiF8 in chunks. Cube: HiF8/FP8
matmul and MX matmul against float64 oracles of the definitions.
"""
from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from numba import njit

import ascend_emu as ae
from ascend_emu import AscendEmuError
from ascend_emu.kernels import lowfloat as kl
from ascend_emu.numerics import lowfloat as lf
from ascend_emu.numerics import policy as config

# widening NaN payloads and the oracle's arithmetic on the virtual value past the max warn; the checks are exact
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
ALL16 = np.arange(1 << 16, dtype=np.uint16)
F16 = ALL16.view(np.float16)
BF16 = ALL16.view(ml_dtypes.bfloat16)
INF_NAN_OV = ("inf_nan", "saturation")


# ----------------------------------------------------------------------------- decoding oracle (bit strings)

def hif8_def(c: int) -> float:
    """HiFloat8 (arXiv 2409.16626; ASCEND-FACTS.md section 12) read from the code's bit string."""
    if c == 0x80:
        return math.nan
    if c & 0x7F == 0x6F:
        return -math.inf if c & 0x80 else math.inf
    s, rest = f"{c:08b}"[0], f"{c:08b}"[1:]
    sign = -1 if s == "1" else 1
    if rest == "0000000":
        return 0.0
    for dot, ebits in (("11", 4), ("10", 3), ("01", 2), ("001", 1), ("0001", 0)):
        if rest.startswith(dot):
            e = rest[len(dot):len(dot) + ebits]
            m = rest[len(dot) + ebits:]
            mag = int("1" + e[1:], 2) if ebits else 0
            exp = -mag if ebits and e[0] == "1" else mag
            return sign * float((1 + Fraction(int(m, 2), 2 ** len(m))) * Fraction(2) ** exp)
    return sign * float(Fraction(2) ** (int(rest[4:], 2) - 23))      # dot 0000: denormal 2^(m-23)


#: (exponent bits, mantissa bits, bias, has Inf, NaN rule) of the IEEE-like formats (OCP OFP8; FP4 per asc-devkit)
IEEE_DEF = {"float8_e4m3fn": (4, 3, 7), "float8_e5m2": (5, 2, 15), "float4_e2m1fn": (2, 1, 1),
            "float4_e1m2": (1, 2, 1)}


def ieee_def(c: int, fmt: str) -> float:
    if fmt == "float8_e8m0":
        return math.nan if c == 0xFF else float(Fraction(2) ** (c - 127))
    eb, mb, bias = IEEE_DEF[fmt]
    bits = f"{c:0{1 + eb + mb}b}"
    sign = -1.0 if bits[0] == "1" else 1.0
    e, m = int(bits[1:1 + eb], 2), int(bits[1 + eb:], 2)
    if fmt == "float8_e4m3fn" and e == 15 and m == 7:
        return math.nan
    if fmt == "float8_e5m2" and e == 31:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * float(Fraction(m, 2 ** mb) * Fraction(2) ** (1 - bias))
    return sign * float((1 + Fraction(m, 2 ** mb)) * Fraction(2) ** (e - bias))


def definition(fmt: str) -> np.ndarray:
    n = 16 if fmt.startswith("float4") else 256
    return np.array([hif8_def(c) if fmt == "hifloat8" else ieee_def(c, fmt) for c in range(n)])


@pytest.mark.parametrize("fmt", lf.LOW_FORMATS)
def test_decode_every_code(fmt):
    want = definition(fmt)
    codes = np.arange(want.size, dtype=np.uint8)
    got = lf.decode(codes, fmt)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.astype(np.float64), want)        # NaN matches NaN, -0 == 0 is checked next
    assert np.array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0]))
    wide, st = ae.cast(codes, "float32", source=fmt)
    assert st == 0 and np.array_equal(wide, got, equal_nan=True)
    f = config.LOW_FORMATS[fmt]
    if f.dtype is not None:                                             # ml_dtypes' own decoding agrees
        np.testing.assert_array_equal(codes.view(f.dtype).astype(np.float64), want)
        typed, _ = ae.cast(codes.view(f.dtype), "float32")
        assert np.array_equal(typed, got, equal_nan=True)
    assert np.nanmax(np.abs(want[np.isfinite(want)])) == f.max


def test_hif8_special_codes():
    v = lf.decode(np.array([0x00, 0x80, 0x6F, 0xEF, 0x6E, 0xEE, 0x01, 0x07, 0x08], np.uint8), "hifloat8")
    assert v[0] == 0 and np.isnan(v[1]) and v[2] == np.inf and v[3] == -np.inf
    assert list(v[4:]) == [2.0 ** 15, -2.0 ** 15, 2.0 ** -22, 2.0 ** -16, 1.0]


# ----------------------------------------------------------------------------- encoding oracle (value tables)

def _table(fmt):
    """(ascending finite non-negative values, their codes, the virtual value past the max and its code) of fmt."""
    vals = definition(fmt)
    sb = 3 if fmt.startswith("float4") else 7
    pos = [(v, c) for c, v in enumerate(vals) if not (c >> sb) & 1 and np.isfinite(v)]
    pos.sort()
    v, c = np.array([p[0] for p in pos]), np.array([p[1] for p in pos])
    virtual = {"hifloat8": (1.5 * 2 ** 15, 0x6F), "float8_e4m3fn": (480.0, 0x7F), "float8_e5m2": (65536.0, 0x7C),
               "float4_e2m1fn": (8.0, 0x8), "float4_e1m2": (2.0, 0x8)}[fmt]
    return np.append(v, virtual[0]), np.append(c, virtual[1])


def oracle(vals: np.ndarray, fmt: str, rounding: str, ov: str, keep_nan=False, thr=None, frac_bits=14):
    """Codes and per-element (overflow, special) flags of float64 values ``vals`` in fmt, from the value table."""
    tv, tc = _table(fmt)
    top = tv.size - 1                            # index of the virtual value
    fp4 = fmt.startswith("float4")
    sbit = 0x8 if fp4 else 0x80
    neg = np.signbit(vals)
    a = np.abs(vals)
    fin = np.isfinite(vals)
    af = np.where(fin, a, 0.0)
    lo = np.clip(np.searchsorted(tv, af, side="right") - 1, 0, top)
    hi = np.minimum(lo + 1, top)
    exact = tv[lo] == af
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.where(exact, 0.0, (af - tv[lo]) / (tv[hi] - tv[lo]))
    if rounding == "rint":
        up = (d > 0.5) | ((d == 0.5) & (tc[lo] & 1 == 1))
    elif rounding == "round":
        up = d >= 0.5
    elif rounding == "trunc":
        up = np.zeros_like(exact)
    elif rounding == "floor":
        up = neg & ~exact
    elif rounding == "ceil":
        up = ~neg & ~exact
    else:                                        # hifloat8 hybrid: |Ev| <= 3 half away; else frac >= thr, as published
        ev = np.floor(np.log2(np.where(af > 0, af, 1.0)))
        frac = np.floor(np.nan_to_num(d) * 2 ** frac_bits)
        up = np.where(np.abs(ev) <= 3, d >= 0.5, frac >= thr)
    idx = np.where(up, hi, lo)
    if fmt == "hifloat8":
        idx = np.where(af >= 2.0 ** 16, top, np.where(af < 2.0 ** -23, 0, idx))
    over = fin & (idx == top)
    if fp4:
        idx = np.where(over, top - 1, idx)
    codes = tc[idx].astype(np.int64)
    sat = ov == "saturation" or fp4
    if fmt == "hifloat8":
        mx, inf, nan = 0x6E, 0x6F, 0x80
    else:
        mx = tc[top - 1]
        inf = 0x7C if fmt == "float8_e5m2" else 0x7F
        nan = 0x7F
    codes = np.where(over, mx if sat else inf, codes)
    codes = np.where(np.isinf(vals), mx if sat else inf, codes)
    codes = np.where(neg & ((codes != 0) | (fmt != "hifloat8")), codes | sbit, codes)   # HiF8 has one zero
    nan_code = 0 if (sat and not keep_nan) else (nan if fmt == "hifloat8" else nan | np.where(neg, sbit, 0))
    codes = np.where(np.isnan(vals), nan_code, codes)
    status = (0x100 if over.any() else 0) | (0x20 if (~fin).any() else 0)
    return codes.astype(np.uint8), status


def _check(got, want, vals, what):
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{what}: {bad.size} mismatches, first {vals[bad[0]]!r}: got {got[bad[0]]:#04x} " \
                          f"want {want[bad[0]]:#04x}"


def _f32_low14(src: np.ndarray) -> np.ndarray:
    return (src.astype(np.float32).view(np.uint32) & 0x3FFF).astype(np.float64)


def _f16_thr(h: np.ndarray) -> np.ndarray:
    normal = (h & 0x7C00) != 0
    return (np.where(normal, h & 1, 0) * 2 + 1).astype(np.float64)


CASES = [("hifloat8", r, ov, False) for r in ("round", "hybrid") for ov in INF_NAN_OV] + [
    (f, "rint", ov, kn) for f in ("float8_e4m3fn", "float8_e5m2") for ov, kn in
    (("inf_nan", False), ("saturation", False), ("saturation", True))]


@pytest.mark.parametrize("src", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt,rounding,ov,keep_nan", CASES)
def test_encode_every_16bit_input(src, fmt, rounding, ov, keep_nan):
    x = F16 if src == "float16" else BF16
    vals = x.astype(np.float64)
    thr, fb = (None, 14)
    if rounding == "hybrid":   # HiF8: half -> hifloat8 has its own rule; bf16 goes through float -> hifloat8
        thr, fb = (_f16_thr(ALL16), 2) if src == "float16" else (_f32_low14(x), 14)
    want, wst = oracle(vals, fmt, rounding, ov, keep_nan, thr, fb)
    got, st = lf.encode(x, fmt, rounding, ov, keep_nan)
    _check(got, want, vals, f"{src}->{fmt} {rounding} {ov} keep_nan={keep_nan}")
    assert st == wst
    if src == "bfloat16":       # float32 input of the same values: the same path
        got32, st32 = lf.encode(x.astype(np.float32), fmt, rounding, ov, keep_nan)
        assert np.array_equal(got32, got) and st32 == st


@pytest.mark.parametrize("fmt", ["float4_e2m1fn", "float4_e1m2"])
@pytest.mark.parametrize("rounding", config.LOW_FORMATS["float4_e2m1fn"].roundings)
def test_encode_fp4_every_16bit_input(fmt, rounding):
    """bf16 -> FP4 directly; fp16 -> FP4 through bf16 in the same rounding (the 950 converts only bf16 to FP4):
    the oracle rounds to bf16's grid first (float64 arithmetic), then over the FP4 table."""
    vals = BF16.astype(np.float64)
    want, wst = oracle(vals, fmt, rounding, "saturation")
    got, st = lf.encode(BF16, fmt, rounding)
    _check(got, want, vals, f"bf16->{fmt} {rounding}")
    assert st == wst
    v16 = F16.astype(np.float64)
    via = _bf16_grid(v16, rounding)
    want16, wst16 = oracle(via, fmt, rounding, "saturation")
    got16, st16 = lf.encode(F16, fmt, rounding)
    _check(got16, want16, v16, f"fp16->{fmt} {rounding}")
    assert st16 == wst16


def _bf16_grid(v: np.ndarray, rounding: str) -> np.ndarray:
    """float64 values (within bf16's range) rounded to bfloat16's grid: 8 significant bits, quantum 2^(e-7)."""
    out = v.copy()
    fin = np.isfinite(v) & (v != 0)
    a = np.abs(v[fin])
    q = np.ldexp(1.0, np.maximum(np.floor(np.log2(a)), -126).astype(int) - 7)
    n, r = np.floor(a / q), a / q - np.floor(a / q)
    neg = v[fin] < 0
    up = {"rint": (r > 0.5) | ((r == 0.5) & (n % 2 == 1)), "round": r >= 0.5, "trunc": np.zeros_like(neg),
          "floor": neg & (r > 0), "ceil": ~neg & (r > 0)}[rounding]
    out[fin] = np.where(neg, -1, 1) * (n + up) * q
    return out


@pytest.mark.parametrize("src", ["float16", "bfloat16"])
@pytest.mark.parametrize("rounding", ["trunc", "ceil"])
def test_encode_e8m0_every_16bit_input(src, rounding):
    x = F16 if src == "float16" else BF16
    v = x.astype(np.float64)
    want = np.zeros(v.size, dtype=np.int64)
    wst = 0x20
    for i, val in enumerate(v):
        if math.isnan(val):
            want[i] = 0xFF
        elif math.isinf(val):
            want[i] = 0xFE
        elif val != 0:
            e = math.floor(math.log2(abs(val)))
            if rounding == "ceil" and abs(val) != 2.0 ** e:
                e += 1
            wst |= 0x100 if e > 127 else 0
            want[i] = min(max(e + 127, 0), 0xFE)
    got, st = lf.encode(x, "float8_e8m0", rounding)
    _check(got, want.astype(np.uint8), v, f"{src}->e8m0 {rounding}")
    assert st == wst


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"])
def test_agrees_with_ml_dtypes(fmt):
    """ml_dtypes rounds float32 to nearest even; its FP8 overflow is our inf_nan mode (E4M3FN -> NaN, E5M2 ->
    Inf), its FP4 clamps like the 950 (NaN differs: ml_dtypes gives -0, the 950 +0: NaN inputs left out). FP4 from
    bfloat16 only: from float16 / float32 the 950 rounds to bfloat16 first, ml_dtypes once."""
    f = config.LOW_FORMATS[fmt]
    fp4 = fmt.startswith("float4")
    for x in ((BF16,) if fp4 else (F16.astype(np.float32), BF16.astype(np.float32))):
        ref = x.astype(f.dtype)
        got, _ = ae.cast(x, f.dtype, rounding="rint", overflow_mode="inf_nan")
        assert got.dtype == f.dtype
        keep = ~np.isnan(x.astype(np.float32)) if fp4 else ~np.isnan(ref.astype(np.float32))
        assert np.array_equal(got.view(np.uint8)[keep], ref.view(np.uint8)[keep])
        assert np.isnan(got.astype(np.float32)[~keep]).all() or fp4


def test_hybrid_examples_and_compare_switch():
    """The published rule at face value: 16.0 (frac 0 >= thr 0) rounds up to 20 under >=, stays under >."""
    x = np.array([16.0, 17.0, 1.0625, 2.0 ** 15 * 1.25, 2.0 ** -23], np.float32)
    ge, _ = lf.encode(x, "hifloat8", "hybrid")
    gt, _ = lf.encode(x, "hifloat8", "hybrid", hybrid_compare=">")
    assert list(lf.decode(ge, "hifloat8")[:3]) == [20.0, 20.0, 1.125]      # |Ev| <= 3: half away
    assert list(lf.decode(gt, "hifloat8")[:3]) == [16.0, 20.0, 1.125]
    assert ge[3] & 0x7F == 0x6E and ge[4] == 0x01                         # saturated Inf; min denormal


def test_status_bits_and_modes():
    x = np.array([1.0, 5e4, np.inf, np.nan, -1e9], np.float32)
    c, st = lf.encode(x, "hifloat8", overflow_mode="inf_nan")
    assert list(c) == [0x08, 0x6F, 0x6F, 0x80, 0xEF] and st == 0x120
    c, st = lf.encode(x, "hifloat8")
    assert list(c) == [0x08, 0x6E, 0x6E, 0x00, 0xEE] and st == 0x120
    assert lf.encode(x[:1], "hifloat8")[1] == 0
    assert lf.encode(x[1:2], "hifloat8")[1] == 0x100 and lf.encode(x[2:4], "hifloat8")[1] == 0x20
    c, _ = lf.encode(x, "float8_e4m3fn", overflow_mode="inf_nan")
    assert list(c) == [0x38, 0x7F, 0x7F, 0x7F, 0xFF]
    c, _ = lf.encode(x, "float8_e4m3fn", keep_nan=True)
    assert list(c) == [0x38, 0x7E, 0x7E, 0x7F, 0xFE]
    c, st = lf.encode(x.astype(ml_dtypes.bfloat16), "float4_e1m2")
    assert list(c) == [0x4, 0x7, 0x7, 0x0, 0xF] and st == 0x120
    assert lf.encode(np.array([3.0e38], np.float32), "float4_e2m1fn")[1] == 0x100   # past bf16 too: finite


def test_cast_api_and_errors():
    x = np.array([0.5, -3.0], np.float32)
    codes, st = ae.cast(x, "hifloat8", rounding="hybrid", overflow_mode="saturation")
    assert codes.dtype == np.uint8 and st == 0
    assert list(ae.cast(codes, "float32", source="hifloat8")[0]) == [0.5, -3.0]
    c, _ = ae.cast(x, "float4_e1m2")
    w, _ = ae.cast(c, "float32", source="float4_e1m2")
    assert list(w) == [0.5, -1.75]
    assert ae.cast(c, "bfloat16", source="float4_e1m2")[0].dtype == config.bfloat16
    assert ae.cast(np.array([1.0], np.float32), "float32")[1] == 0          # the 16/32-bit casts are unchanged
    for call, msg in [(lambda: ae.cast(x, "hifloat8", rounding="rint"), "takes rounding"),
                      (lambda: ae.cast(x, "float8_e5m2", overflow_mode="wrap"), "unknown overflow_mode"),
                      (lambda: ae.cast(x, "hifloat8", keep_nan=True), "keep_nan"),
                      (lambda: ae.cast(x.astype(np.float64), "hifloat8"), "cast to float32 first"),
                      (lambda: ae.cast(codes, "float32", source="float7"), "unknown low-precision format"),
                      (lambda: ae.cast(np.array([16], np.uint8), "float32", source="float4_e2m1fn"), "0..15"),
                      (lambda: ae.cast(codes, "float16", source="float8_e8m0"), "widens exactly"),
                      (lambda: lf.encode(x, "hifloat8", "hybrid", hybrid_compare="<"), "hybrid_compare")]:
        with pytest.raises(AscendEmuError, match=msg) as e:
            call()
        assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- float32 sweep of HiF8

#: float32 -> hifloat8, round and hybrid: every 257th pattern of the 2^32 (16.7 M patterns, both signs; the odd
#: stride walks every value of the low 14 bits that make the hybrid threshold). All 2^32 do not fit the 10 s a
#: chunk may take: in 16 chunks of 2^28 patterns a dense chunk took 26.7 s, and interleaved (every 16th slice of
#: 2^22 patterns per chunk) 13 to 16 s, of which the two kernel calls alone are about 8 s.
STRIDE = 257
SLICE = 1 << 22
_TV, _TC = _table("hifloat8")


@njit(cache=True)
def _sweep_check(u, got_r, got_h, tv, tc) -> int:
    """Index of the first pattern u[i] whose kernel codes (round, hybrid; inf_nan) differ from the value-table
    oracle (float64 arithmetic), or -1."""
    buf = np.empty(1, dtype=np.uint32)
    fv = buf.view(np.float32)
    top = tv.size - 1
    for i in range(u.size):
        buf[0] = u[i] & np.uint32(0x7FFFFFFF)
        a = np.float64(fv[0])
        sign = 0x80 if u[i] >> 31 else 0
        if math.isnan(a):
            want_r = want_h = 0x80
        else:
            if a >= 65536.0:
                want_r = want_h = 0x6F
            elif a < 2.0 ** -23:
                want_r = want_h = 0
            else:
                lo = np.searchsorted(tv, a, side="right") - 1
                if lo == top:
                    want_r = want_h = tc[top]
                else:
                    d = (a - tv[lo]) / (tv[lo + 1] - tv[lo])
                    want_r = tc[lo + 1] if d >= 0.5 else tc[lo]
                    if abs(math.floor(math.log2(a))) <= 3:
                        want_h = want_r
                    else:
                        want_h = tc[lo + 1] if math.floor(d * 16384.0) >= (u[i] & 0x3FFF) else tc[lo]
            if want_r != 0:
                want_r |= sign
            if want_h != 0:
                want_h |= sign
        if got_r[i] != want_r or got_h[i] != want_h:
            return i
    return -1


def _sweep(u: np.ndarray, got_r: np.ndarray, got_h: np.ndarray):
    oc = config.OVERFLOW_MODES["inf_nan"]
    kl.encode_f32(u, got_r[:u.size], kl.HIF8, kl.ROUND, oc, False, False)
    kl.encode_f32(u, got_h[:u.size], kl.HIF8, kl.HYBRID, oc, False, False)
    bad = _sweep_check(u, got_r, got_h, _TV, _TC)
    assert bad < 0, f"float32 pattern {u[bad]:#010x}: round {got_r[bad]:#04x}, hybrid {got_h[bad]:#04x}"


def test_hif8_float32_strided_sweep():
    n_all = (1 << 32) // STRIDE + 1
    got_r, got_h = np.empty(SLICE, np.uint8), np.empty(SLICE, np.uint8)
    for start in range(0, n_all, SLICE):
        _sweep((np.arange(start, min(start + SLICE, n_all), dtype=np.uint64) * STRIDE).astype(np.uint32), got_r, got_h)


# ----------------------------------------------------------------------------- cube

def _rng_codes(rng, fmt, shape, lo=0.0, hi=np.inf, grid=None):
    """Random codes of fmt whose values are 0 or lie in lo <= |v| <= hi (finite; multiples of ``grid`` if given)."""
    vals = definition(fmt)
    a = np.abs(vals)
    ok = np.isfinite(vals) & ((a == 0) | (a >= lo) & (a <= hi))
    if grid is not None:
        ok &= np.isfinite(vals) & (np.nan_to_num(vals) / grid == np.round(np.nan_to_num(vals) / grid))
    return rng.choice(np.flatnonzero(ok), size=shape).astype(np.uint8)


@pytest.mark.parametrize("a_fmt,b_fmt", config.CUBE_LOW_PAIRS)
def test_matmul_lowfloat_against_float64(a_fmt, b_fmt):
    """Every product of two of these values is exact in float32; with K = 16 terms of a bounded range the float64
    sum, rounded once, is what the fp32 accumulation must give when the partial sums are exact: the oracle
    checks exactness of the float64 sum's float32 rounding on inputs built so that every partial sum is exact
    (all values multiples of 2^-6 and below 2^8), and a loose bound on full-range random codes."""
    rng = np.random.default_rng(30)
    a = _rng_codes(rng, a_fmt, (8, 16))
    b = _rng_codes(rng, b_fmt, (16, 5))
    av, bv = definition(a_fmt)[a], definition(b_fmt)[b]
    got = ae.matmul_lowfloat(a, b, a_fmt, b_fmt)
    assert got.dtype == np.float32 and got.shape == (8, 5)
    ref = av @ bv
    scale = np.abs(av) @ np.abs(bv)
    assert np.all(np.abs(got - ref) <= scale * 2.0 ** -19)
    # exact case: multiples of 2^-6 up to 8: products are multiples of 2^-12 below 64, sums of 32 below 2^11 (23 bits)
    a = _rng_codes(rng, a_fmt, (8, 32), hi=8.0, grid=2.0 ** -6)
    b = _rng_codes(rng, b_fmt, (32, 6), hi=8.0, grid=2.0 ** -6)
    av, bv = definition(a_fmt)[a], definition(b_fmt)[b]
    np.testing.assert_array_equal(ae.matmul_lowfloat(a, b, a_fmt, b_fmt), (av @ bv).astype(np.float32))


def test_mx_quantize_follows_the_ocp_definition():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 64)) * np.exp2(rng.integers(-20, 20, (4, 1)))).astype(np.float32)
    x[1, 32:] = 0.0
    for fmt in ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "float4_e1m2"):
        codes, scales = ae.mx_quantize(x, fmt, axis=1)
        assert codes.shape == x.shape and scales.shape == (4, 2) and scales.dtype == np.uint8
        f = config.LOW_FORMATS[fmt]
        for i in range(4):
            for j in range(2):
                blk = x[i, 32 * j:32 * j + 32].astype(np.float64)
                amax = np.abs(blk).max()
                e = -127 if amax == 0 else max(-127, math.floor(math.log2(amax)) - f.emax)
                assert scales[i, j] == e + 127
                want, _ = lf.encode(np.ldexp(blk, -e).astype(np.float32), fmt)
                assert np.array_equal(codes[i, 32 * j:32 * j + 32], want)
    codes, scales = ae.mx_quantize(x.T.copy(), "float8_e4m3fn", axis=0)
    assert scales.shape == (2, 4)
    bad = x.copy()
    bad[0, 3] = np.nan
    assert ae.mx_quantize(bad, "float8_e4m3fn")[1][0, 0] == 0xFF


@pytest.mark.parametrize("a_fmt,b_fmt", [("float8_e4m3fn", "float8_e5m2"), ("float4_e2m1fn", "float4_e1m2"),
                                         ("float8_e5m2", "float4_e2m1fn")])
def test_mx_matmul_against_the_definition(a_fmt, b_fmt):
    """C[m, n] = sum_k (2^(sa[m, k/32] - 127) A[m, k]) (2^(sb[k/32, n] - 127) B[k, n]), float64 oracle. Scales are
    picked so that all terms share a window of < 24 bits: the float32 accumulation is then exact and the
    result must equal the float64 sum bit for bit; on wide random scales it agrees to float32 accumulation error."""
    rng = np.random.default_rng(3)
    M, K, N = 5, 96, 4
    for exact in (True, False):
        # exact: elements 0 or in [1/2, 4], scales 2^0..2^1 and 2^-1..2^0: terms are multiples of 2^-8 below 2^7,
        # sums of 96 below 2^13 (21 bits); else full-range elements and scales 2^-7..2^7
        rng_ = dict(lo=0.5, hi=4.0) if exact else {}
        a = _rng_codes(rng, a_fmt, (M, K), **rng_)
        b = _rng_codes(rng, b_fmt, (K, N), **rng_)
        av, bv = definition(a_fmt)[a], definition(b_fmt)[b]
        sa = (127 + (rng.integers(0, 2, (M, K // 32)) if exact else rng.integers(-7, 8, (M, K // 32)))).astype(np.uint8)
        sb = (127 - (rng.integers(0, 2, (K // 32, N)) if exact else rng.integers(-7, 8, (K // 32, N)))).astype(np.uint8)
        A = av * np.exp2(np.repeat(sa.astype(float) - 127, 32, axis=1))
        B = bv * np.exp2(np.repeat(sb.astype(float) - 127, 32, axis=0))
        ref = A @ B
        got = ae.mx_matmul(a, sa, b, sb, a_fmt, b_fmt)
        assert got.dtype == np.float32
        if exact:
            np.testing.assert_array_equal(got, ref.astype(np.float32))
        else:
            assert np.all(np.abs(got - ref) <= (np.abs(A) @ np.abs(B)) * 2.0 ** -16)
    x = rng.standard_normal((6, 64)).astype(np.float32)
    w = rng.standard_normal((64, 3)).astype(np.float32)
    ca, sa = ae.mx_quantize(x, "float8_e4m3fn", axis=1)
    cb, sb = ae.mx_quantize(w, "float8_e4m3fn", axis=0)
    y = ae.mx_matmul(ca, sa, cb, sb, "float8_e4m3fn", "float8_e4m3fn")
    assert np.abs(y - x.astype(np.float64) @ w).max() < 0.1 * np.abs(x).sum(1).max()
    with pytest.raises(AscendEmuError, match="multiple of 32"):
        ae.mx_quantize(x[:, :40], "float8_e4m3fn")
    with pytest.raises(AscendEmuError, match="scales must be"):
        ae.mx_matmul(ca, sa[:, :1], cb, sb, "float8_e4m3fn", "float8_e4m3fn")
    with pytest.raises(AscendEmuError, match="multiplies hifloat8"):
        ae.matmul_lowfloat(ca, cb, "float8_e4m3fn", "hifloat8")
