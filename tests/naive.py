"""Slow, obvious float64 oracles for casts, vector ops and reductions.

Written independently of ``kernels/``: no bit shifting of significands, no shared
code. A value is rounded to a 16-bit format by bracketing it between the two
adjacent representable magnitudes ``lo <= |x| <= hi`` (found from numpy's / ml_dtypes'
round-to-nearest result and the fact that adjacent positive magnitudes have adjacent
bit patterns), then choosing one of them with exact comparisons against the
midpoint. Magnitudes above the largest finite value bracket against the pattern of
Inf, which stands for ``2**(emax+1)``, the next value with an unbounded exponent; a
choice of that pattern is an overflow.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
from numba import njit

ROUNDINGS = ("rint", "round", "floor", "ceil", "trunc", "odd")
FORMATS = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
# (Inf pattern, largest finite, 2**(emax+1), mantissa bits)
_PARAMS = {"float16": (0x7C00, 65504.0, 2.0 ** 16, 10),
           "bfloat16": (0x7F80, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 2.0 ** 128, 7)}


def _tables(fmt):
    inf, _, top, _ = _PARAMS[fmt]
    bits = np.arange(65536, dtype=np.uint16)
    with np.errstate(invalid="ignore"):
        val64 = bits.view(FORMATS[fmt]).astype(np.float64)
    hi64 = val64.copy()
    hi64[inf] = top  # the magnitude just above the largest finite, with unbounded exponent
    mid64 = np.full(65536, np.nan)
    mid64[:inf] = (hi64[:inf] + hi64[1:inf + 1]) / 2  # exact: one more bit than the format
    with np.errstate(invalid="ignore"):
        val32, mid32 = val64.astype(np.float32), mid64.astype(np.float32)
    return {"val32": val32, "val64": val64, "mid32": mid32, "mid64": mid64}


TABLES = {fmt: _tables(fmt) for fmt in FORMATS}


def bracket(a, fmt):
    """Bracket finite magnitudes ``a`` (float32 or float64 array, >= 0, no NaN/Inf).

    Returns ``(lo, hi, nearest_even, tie)``: bit patterns of the representable
    magnitudes just below/above ``a`` (equal when exact; the Inf pattern stands for
    ``2**(emax+1)``), the round-to-nearest-even choice and whether ``a`` is a midpoint.
    Magnitudes of a whole ulp beyond the largest finite value (every mode overflows)
    and below half the smallest subnormal (nearest is 0, the next is the smallest
    subnormal) are decided directly; numpy's and ml_dtypes' casts would only be slow
    there, raising floating-point flags element by element.
    """
    inf, _, top, _ = _PARAMS[fmt]
    t = TABLES[fmt]
    wide = a.dtype == np.float64
    val = t["val64"] if wide else t["val32"]
    mid = t["mid64"] if wide else t["mid32"]
    lo = np.zeros(a.shape, dtype=np.uint16)
    hi = np.zeros(a.shape, dtype=np.uint16)
    rne = np.zeros(a.shape, dtype=np.uint16)
    tie = np.zeros(a.shape, dtype=bool)
    if wide or top <= float(np.finfo(np.float32).max):
        big = a >= top
    else:
        big = np.zeros(a.shape, dtype=bool)  # no finite float32 reaches 2**128
    tiny = a < mid[0]
    inside = ~(big | tiny)
    lo[big] = hi[big] = rne[big] = inf
    hi[tiny & (a > 0)] = 1
    if inside.all():
        sel, ai = slice(None), a
    elif inside.any():
        sel = inside
        ai = a[sel]
    else:
        return lo, hi, rne, tie
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        r = ai.astype(FORMATS[fmt]).view(np.uint16)
    rf = val[r]
    li = (r - (rf > ai)).astype(np.uint16)
    hi[sel] = r + (rf < ai)
    m = mid[li]
    lo[sel] = li
    tie[sel] = ai == m
    if wide:
        # library double -> 16-bit casts may round twice; decide from the midpoint instead
        rne[sel] = np.where(ai < m, li, np.where(ai > m, hi[sel], np.where(li & 1, hi[sel], li)))
    else:
        rne[sel] = r  # numpy / ml_dtypes single-rounding float32 casts: the independent reference
    return lo, hi, rne, tie


def choose(rounding, negative, lo, hi, rne, tie):
    """Magnitude bits chosen by a rounding mode for values of one sign."""
    if rounding == "rint":
        return rne
    if rounding == "round":
        return np.where(tie, hi, rne)
    if rounding == "trunc":
        return lo
    if rounding == "floor":
        return hi if negative else lo
    if rounding == "ceil":
        return lo if negative else hi
    if rounding == "odd":
        return np.where(lo & 1, lo, hi)
    raise ValueError(rounding)


def finish(mag, rounding, negative, fmt, overflow_mode="inf_nan", subnormals="keep"):
    """Apply overflow, flush and the sign to chosen magnitudes; returns (bits, any overflow)."""
    inf, _, _, mt = _PARAMS[fmt]
    over = mag == inf
    any_over = bool(over.any())
    to_inf = rounding in ("rint", "round") or (rounding == "ceil" and not negative) or (
        rounding == "floor" and negative)
    out = mag | np.uint16(0x8000) if negative else mag.copy()
    if any_over and (overflow_mode == "saturation" or not to_inf):
        out[over] = (inf - 1) | (0x8000 if negative else 0)
    if subnormals == "flush":
        sub = (mag > 0) & (mag < (1 << mt))
        if sub.any():
            out[sub] = 0x8000 if negative else 0
    return out, any_over


def cast_bits(x, fmt, rounding="rint", overflow_mode="inf_nan", subnormals="keep"):
    """Oracle bits and status of casting float32/float64 ``x`` to ``fmt``."""
    x = np.asarray(x)
    assert x.dtype in (np.float32, np.float64)
    flat = x.ravel()
    inf, _, _, mt = _PARAMS[fmt]
    out = np.zeros(flat.size, dtype=np.uint16)
    status = 0
    neg = np.signbit(flat)
    nan = np.isnan(flat)
    infs = np.isinf(flat)
    fin = ~(nan | infs)
    for negative in (False, True):
        sel = fin & (neg == negative)
        a = np.abs(flat[sel])
        lo, hi, rne, tie = bracket(a, fmt)
        mag = choose(rounding, negative, lo, hi, rne, tie)
        bits, over = finish(mag, rounding, negative, fmt, overflow_mode, subnormals)
        out[sel] = bits
        if over:
            status |= 0x100
    sat = overflow_mode == "saturation"
    out[infs] = (inf - 1 if sat else inf) | np.where(neg[infs], 0x8000, 0)
    out[nan] = 0 if sat else inf | (1 << (mt - 1))  # a quiet NaN; any NaN pattern compares equal
    if (nan | infs).any():
        status |= 0x20
    return out.reshape(x.shape), status


# ------------------------------------------------------------------ the float32 sweeps' oracle, compiled
#
# The same bracketing as ``bracket``/``choose``/``finish``, by float64 arithmetic on the value instead of
# numpy's casts, so that the 2^32 sweeps spend their time in the kernels: a float32 magnitude (exact in float64)
# divided by the quantum of its binade (a power of two: exact) is k + f with k an integer and 0 <= f < 1; the
# representable neighbours are k and k + 1 quanta, and f against 1/2 places the value between them. The pattern
# of k quanta in binade 2**E (E >= emin, k <= 2**(mt+1)) is (E - emin) * 2**mt + k by the format's definition
# (a subnormal is E = emin with k < 2**mt; k = 2**(mt+1) is the next binade's first value; Inf's pattern is
# 2**(emax+1)'s). ``test_compiled_oracle_is_the_numpy_oracle`` ties the two oracles together.

#: (mantissa bits, emin, emax) of the 16-bit formats
GEOMETRY = {"float16": (10, -14, 15), "bfloat16": (7, -126, 127)}
EXACT, BELOW_HALF, HALF, ABOVE_HALF = range(4)


@njit(cache=True)
def bracket32(mags, mt, emin, emax, lo, hi, where):
    """For finite float32 magnitude patterns ``mags``: ``lo``/``hi`` the patterns of the representable
    magnitudes (``mt`` mantissa bits, exponents ``emin`` .. ``emax``) around each value (equal when exact),
    ``where`` the value's place between them (EXACT, BELOW_HALF, HALF, ABOVE_HALF); 2**(emax+1) and above
    bracket as Inf's pattern on both sides."""
    vals = mags.view(np.float32)
    quanta = 2 ** mt
    top = math.ldexp(1.0, emax + 1)
    inf = (emax + 2 - emin) * quanta
    E, start, end, scale = emin, 0.0, 0.0, 1.0      # binade 2**E holds [start, end); scale: 1 / its quantum
    for i in range(mags.size):
        a = np.float64(vals[i])
        if a >= top:
            lo[i] = hi[i] = inf
            where[i] = EXACT
            continue
        if not (start <= a < end):                  # a new binade (runs of values share one)
            # 2**E <= a < 2**(E+1); emin below 2**emin and for 0 (whose frexp exponent is 0)
            E = max(math.frexp(a)[1] - 1, emin) if a > 0 else emin
            start = 0.0 if E == emin else math.ldexp(1.0, E)
            end = math.ldexp(1.0, E + 1)
            scale = math.ldexp(1.0, mt - E)
        n = a * scale                               # a in quanta: exact
        k = math.floor(n)
        f = n - k
        lo[i] = (E - emin) * quanta + np.int64(k)
        hi[i] = lo[i] + (1 if f > 0 else 0)
        where[i] = EXACT if f == 0 else (BELOW_HALF if f < 0.5 else (HALF if f == 0.5 else ABOVE_HALF))


@njit(cache=True)
def choose32(lo, hi, where, rounding, negative, mag):
    """mag[i] = ``choose``'s pick between the bracketed lo[i] and hi[i] for ``rounding`` (an index of
    ROUNDINGS) and the sign ``negative``."""
    # one comparison per element, so the loop vectorises: hi when ``where`` reaches ``up_from``, or on a tie
    # with an odd lo (rint), or whenever lo is even (odd; hi is lo when exact)
    r = rounding
    one = np.uint32(1)
    up_from = np.uint32(3 if r == 0 else 2 if r == 1 else 1 if (r == 2 and negative) or (r == 3 and not negative)
                        else 4)
    tie_odd = np.uint32(r == 0)
    to_odd = np.uint32(r == 5)
    for i in range(np.uintp(0), np.uintp(mag.size)):   # unsigned: no wraparound test, so it vectorises
        w = np.uint32(where[i])
        lw = np.uint32(lo[i])
        odd = lw & one
        up = np.uint32(w >= up_from) | (tie_odd & np.uint32(w == 2) & odd) | (to_odd & (one - odd))
        mag[i] = lw + up * (np.uint32(hi[i]) - lw)


@njit(cache=True)
def check32(mag, got, rounding, negative, saturate, flush, mt, inf):
    """Compare ``got`` (16-bit patterns a kernel gave, with the sign ``negative``) with ``finish`` of the
    chosen magnitudes ``mag``. Returns (whether any differs, whether any value overflowed)."""
    r = rounding
    # IEEE overflow goes to Inf when the rounding is away from zero, else to the largest finite value
    to_inf = r <= 1 or (r == 3 and not negative) or (r == 2 and negative)
    big = np.uint32(inf - 1 if (saturate or not to_inf) else inf)
    sign = np.uint32(0x8000 if negative else 0)
    least = np.uint32(2 ** mt if flush else 0)     # results below it are flushed to zero
    inf = np.uint32(inf)
    zero = np.uint32(0)
    diff = zero
    over = zero
    for i in range(np.uintp(0), np.uintp(got.size)):   # unsigned: no wraparound test, so it vectorises
        m = np.uint32(mag[i])
        o = m == inf
        over |= np.uint32(o)
        m = big if o else m
        m = m if m >= least else zero
        diff |= np.uint32(got[i]) ^ (m | sign)
    return diff != 0, over != 0


def is_nan_bits(b, fmt):
    inf = _PARAMS[fmt][0]
    return ((b & 0x7FFF) > inf)


def bits_equal(got, want, fmt) -> np.ndarray:
    """Elementwise bit equality of 16-bit patterns, any NaN equal to any NaN."""
    got = np.asarray(got).view(np.uint16)
    want = np.asarray(want).view(np.uint16)
    eq = got == want
    if not eq.all():
        eq |= is_nan_bits(got, fmt) & is_nan_bits(want, fmt)
    return eq


def round_f64(x, fmt, overflow_mode="inf_nan", subnormals="keep"):
    """Round float64 values once (nearest-even) to ``fmt`` bits; returns (bits, any Inf/NaN result).

    The vector-unit model: the op's float64 result is rounded once; a result that is
    Inf or NaN (before saturation) raises status 0x20.
    """
    x = np.asarray(x, dtype=np.float64)
    bits, _ = cast_bits(x, fmt, "rint", "inf_nan", subnormals)
    inf = _PARAMS[fmt][0]
    nonfinite = (bits & 0x7FFF) >= inf
    if overflow_mode == "saturation":
        bits = saturate_bits(bits, fmt)
    return bits, bool(nonfinite.any())


def saturate_bits(bits, fmt):
    """Saturation mode on 16-bit patterns: +-Inf -> +-max, NaN -> +0."""
    inf = _PARAMS[fmt][0]
    bits = bits.copy()
    mag = bits & 0x7FFF
    bits[mag == inf] -= 1
    bits[mag > inf] = 0
    return bits


def to_f64(bits, fmt):
    """float64 values of 16-bit patterns."""
    return TABLES[fmt]["val64"][np.asarray(bits).view(np.uint16)]


# ------------------------------------------------------------------ float64 models of the vector ops

_SQRT2 = math.sqrt(2.0)
_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _f(u):
    return np.asarray(u, dtype=np.float64)


def relu(x):
    return np.where(np.isnan(x), x, np.where(x > 0, x, 0.0))


UNARY64 = {
    "neg": lambda x: -x,
    "abs": np.abs,
    "square": lambda x: x * x,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "reciprocal": lambda x: 1.0 / x,
    "exp": np.exp,
    "expm1": np.expm1,
    "log": np.log,
    "log1p": np.log1p,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": relu,
    "relu6": lambda x: np.where(np.isnan(x), x, np.minimum(relu(x), 6.0)),
    "erf": lambda x: _f(_erf(x)),
    "erfc": lambda x: _f(_erfc(x)),
    "softplus": lambda x: np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x))),
    "softsign": lambda x: x / (1.0 + np.abs(x)),
    "gelu": lambda x: 0.5 * x * _f(_erfc(-x / _SQRT2)),
    # 0.5 x (1 + tanh u) = x / (1 + exp(-2u)), the form without cancellation for x < 0
    "gelu_tanh": lambda x: x / (1.0 + np.exp(-2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
}


def _quiet(x):
    """x with every NaN made quiet (the quiet bit set, sign and payload kept), as the CPU's widening of a
    16-bit value through float32 leaves it: the emulator does not model signalling NaNs, and which NaN a pow
    special case sees must not depend on the host's pow (glibc gives NaN for pow(1, sNaN), 1 for a quiet NaN)."""
    x = np.asarray(x, np.float64)
    return np.where(np.isnan(x), (x.view(np.uint64) | np.uint64(1 << 51)).view(np.float64), x)


BINARY64 = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "realdiv": np.divide,
    "maximum": lambda a, b: np.where((a >= b) | np.isnan(a), a, b),
    "minimum": lambda a, b: np.where((a <= b) | np.isnan(a), a, b),
    "pow": lambda a, b: np.power(_quiet(a), _quiet(b)),   # C99 / IEEE 754 pow: pow(x, 0) = pow(1, y) = 1, NaN too
}


def vector16(op, fmt, *bits, overflow_mode="inf_nan", **attrs):
    """Oracle for a vector op over 16-bit inputs: exact float64 model, rounded once.

    ``squared_difference`` is two vector instructions (sub, then square), each
    rounded; ``leaky_relu`` multiplies by ``alpha`` first rounded to ``fmt``.
    Returns (bits, status).
    """
    with np.errstate(all="ignore"):
        xs = [to_f64(b, fmt) for b in bits]
        if op == "squared_difference":
            d, s1 = round_f64(xs[0] - xs[1], fmt, overflow_mode)
            d = to_f64(d, fmt)
            out, s2 = round_f64(d * d, fmt, overflow_mode)
            return out, 0x20 if (s1 or s2) else 0
        if op == "leaky_relu":
            alpha = float(to_f64(cast_bits(np.array([attrs.get("alpha", 0.2)]), fmt)[0], fmt)[0])
            x = xs[0]
            y = np.where(x >= 0, x, x * alpha)
        elif op == "gelu" and attrs.get("approximate", False):
            y = UNARY64["gelu_tanh"](xs[0])
        elif op in UNARY64:
            y = UNARY64[op](xs[0])
        else:
            y = BINARY64[op](*xs)
    out, st = round_f64(y, fmt, overflow_mode)
    return out, 0x20 if st else 0


# ------------------------------------------------------------------ the sourced CANN kernels, step by step
#
# Written from the cited kernels (NUMERICS.md section 2, "Sourced kernels"): every vector
# instruction is one numpy float32 operation (IEEE, correctly rounded), saturated on its own
# under saturation; fp32 exp is either the correctly rounded model (numpy's float64 exp
# rounded to float32) or the C library's expf, called through ctypes.

_F32 = np.float32
_F32_MAX = float(np.finfo(np.float32).max)
_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.expf.restype = ctypes.c_float
_libm.expf.argtypes = [ctypes.c_float]


def _rn32_exact(q: Fraction):
    """The float32 nearest to the rational q, ties to even (q finite, in range)."""
    f = np.float32(float(q))
    best = f
    for c in (np.nextafter(f, _F32(-np.inf)), np.nextafter(f, _F32(np.inf))):
        if not np.isfinite(c):
            continue
        dc, db = abs(Fraction(float(c)) - q), abs(Fraction(float(best)) - q)
        if dc < db or (dc == db and int(np.float32(c).view(np.uint32)) % 2 == 0):
            best = c
    return best


def fma32(a, b, c):
    """a*b + c rounded once to float32 (arrays)."""
    a, b = np.asarray(a, _F32), np.asarray(b, _F32)
    c = np.broadcast_to(np.asarray(c, _F32), a.shape)
    with np.errstate(all="ignore"):
        s = a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)
        out = s.astype(_F32)
        # the float64 sum differs from the exact one by its own rounding, which moves the float32
        # rounding only when it lands exactly on a float32 midpoint: decide those exactly
        lo = np.where(out.astype(np.float64) > s, np.nextafter(out, _F32(-np.inf)), out)
        hi = np.nextafter(lo, _F32(np.inf))
        tie = np.isfinite(s) & np.isfinite(hi) & (s == (lo.astype(np.float64) + hi.astype(np.float64)) / 2)
    for i in np.flatnonzero(tie):
        out.flat[i] = _rn32_exact(Fraction(float(a.flat[i])) * Fraction(float(b.flat[i])) + Fraction(float(c.flat[i])))
    return out


def exp32(x, impl_mode="high_precision"):
    x = np.asarray(x, _F32)
    if impl_mode == "high_precision":
        with np.errstate(all="ignore"):
            return np.exp(x.astype(np.float64)).astype(_F32)
    return np.array([_libm.expf(float(v)) for v in x.ravel()], dtype=_F32).reshape(x.shape)


class _Steps:
    """float32 steps that remember whether any was Inf/NaN and saturate each under saturation."""

    def __init__(self, overflow_mode):
        self.sat = overflow_mode == "saturation"
        self.bad = False

    def __call__(self, v):
        v = np.asarray(v, _F32)
        nonfinite = ~np.isfinite(v)
        if nonfinite.any():
            self.bad = True
            if self.sat:
                v = np.where(np.isnan(v), _F32(0), np.clip(v, -_F32_MAX, _F32_MAX)).astype(_F32)
        return v


def steps32(op, x, overflow_mode="inf_nan", impl_mode="high_precision", tiny=2.0 ** -126):
    """The sourced kernel ``op`` on float32 ``x``: (float32 result, any step Inf/NaN)."""
    x = np.asarray(x, _F32)
    s = _Steps(overflow_mode)
    one = _F32(1)
    with np.errstate(all="ignore"):
        if op == "exp":
            y = s(exp32(x, impl_mode))
        elif op == "rsqrt":                          # vsqrt, then vdiv(1, .)
            y = s(one / s(np.sqrt(x)))
        elif op == "sigmoid":                        # vmuls(-1), vexp, vadds(1), vdiv(1, .)
            y = s(one / s(s(exp32(-x, impl_mode)) + one))
        elif op in ("gelu_v100", "gelu_v220"):       # x + 0.044715 x^3 as vmul, vmul, vmuls, vadd
            p = s(x + s(s(s(x * x) * x) * _F32(0.044715)))
            if op == "gelu_v220":                    # x / (exp(-1.5957691 p) + 1)
                y = s(x / s(s(exp32(s(p * _F32(-1.5957691)), impl_mode)) + one))
            else:                                    # x / (exp(-|y|) + 1) * exp(min(y, 0)), y = 1.5957691 p
                t = s(p * _F32(1.5957691))
                right = s(exp32(np.where(t < 0, t, _F32(0)), impl_mode))
                left = s(x / s(s(exp32(-np.abs(t), impl_mode)) + one))
                y = s(left * right)
        elif op == "gelu_ascendc":                   # x / (1 + exp(-1.5957691*0.044715 (x/0.044715 + x^3)))
            cub = s(s(x * x) * x)
            t = s(s(x * _F32(1 / 0.044715)) + cub)
            y = s(x / s(s(exp32(s(t * _F32(-1.595769121 * 0.044715)), impl_mode)) + one))
        elif op == "tanh_tbe":                       # (x - e x) / ((e + 1)(|x| + tiny)), e = exp(-2|x|)
            a = np.abs(x)
            e = s(exp32(s(a * _F32(-2)), impl_mode))
            y = s(s(x - s(e * x)) / s(s(e + one) * s(a + _F32(tiny))))
        elif op == "tanh_ascendc":                   # odd polynomial below 0.6, 1 - 2/(e^2|x| + 1) above
            sq = s(x * x)
            o = s(s(sq * _F32(0.0157396831)) + _F32(-0.0523039624))
            o = s(fma32(o, sq, _F32(0.133152977)))
            o = s(fma32(o, sq, _F32(-0.333327681)))
            o = s(fma32(s(o * sq), x, x))
            a = np.abs(x)
            m = s(s(one / s(s(exp32(s(a * _F32(2)), impl_mode)) + one)) * _F32(-2))
            m = s(m + one)
            m = np.where(a >= _F32(9.010913848876953125), one, m)
            m = np.where(np.signbit(x), -m, m).astype(_F32)
            y = np.where(a >= _F32(0.6), m, o).astype(_F32)
        elif op in ("sin_tbe", "cos_tbe"):          # canndev tbe/impl/dynamic/sin.py, cos.py
            y = _trig_tbe(op == "sin_tbe", x, s)
        else:
            raise ValueError(op)
    return y, s.bad


def _to_int32(v, ceil=False):
    """vconv float32 -> int32 (rint, or ceil), as float64 integers: saturating, NaN -> 0 (assumed)."""
    v = np.asarray(v, np.float64)
    r = np.ceil(v) if ceil else np.rint(v)
    return np.where(np.isnan(r), 0.0, np.clip(r, -2.0 ** 31, 2.0 ** 31 - 1))


def _trig_tbe(sin, x, s):
    """TBE Sin / Cos on float32 x, the steps of sin_compute / cos_compute; ``s`` rounds (and saturates)."""
    pi = 3.14159265358979
    if sin:   # k = round(x / pi), x' = x - k pi in [-pi/2, pi/2], Taylor to x^11, sign by k's parity
        k = _to_int32(s(x * _F32(1 / pi))).astype(_F32)
        r = s(x - s(k * _F32(pi)))
        p = s(r * r)
        t = s(s(p * _F32(-1.0 / 6.0)) * r)
        y = s(r + t)
        for i in (5, 7, 9, 11):
            t = s(s(p * t) * _F32(-1.0 / (i * (i - 1))))
            y = s(y + t)
        c2 = (2 * _to_int32(k * _F32(0.5), ceil=True)).astype(_F32)
        odd = _F32(1) - s(c2 - k)
        return s(y * (odd + (odd - _F32(1))))
    k = _to_int32(s(x * _F32(1 / (2 * pi)))).astype(_F32)   # cos: x' = x - k 2pi in [-pi, pi], Taylor to x^14
    r = s(x - s(k * _F32(2 * pi)))
    p = s(r * r)
    t = s(p * _F32(-0.5))
    y = s(_F32(1) + t)
    for i in (4, 6, 8, 10, 12, 14):
        t = s(s(p * t) * _F32(-1.0 / (i * (i - 1))))
        y = s(y + t)
    return y


def steps16(op, fmt, bits, overflow_mode="inf_nan", impl_mode="high_precision"):
    """The sourced kernel ``op`` on 16-bit inputs: widened exactly, float32 steps, cast back with
    CAST_RINT. Returns (bits, status): 0x20 if any step or the result was Inf or NaN."""
    with np.errstate(invalid="ignore"):   # NaN payloads
        x = to_f64(bits, fmt).astype(_F32)
    tiny = 2.0 ** -14 if (op == "tanh_tbe" and fmt == "float16") else 2.0 ** -126
    y, bad = steps32(op, x, overflow_mode, impl_mode, tiny)
    out, st = round_f64(y.astype(np.float64), fmt, overflow_mode)
    return out, 0x20 if (bad or st) else 0


def sigmoid16_tbe(fmt, bits, overflow_mode="inf_nan", impl_mode="high_precision"):
    """TBE Sigmoid on 16-bit data, every step in the 16-bit format: vmuls(-1), vexp, vadds(1), vrec,
    the exp and the reciprocal modelled as correctly rounded (exp through float32 expf under
    high_performance). Returns (bits, status)."""
    x = to_f64(bits, fmt)
    with np.errstate(all="ignore"):
        if impl_mode == "high_precision":
            e, s1 = round_f64(np.exp(-x), fmt, overflow_mode)
        else:
            e, s1 = round_f64(exp32(-x.astype(_F32), "high_performance").astype(np.float64), fmt, overflow_mode)
        d, s2 = round_f64(to_f64(e, fmt) + 1.0, fmt, overflow_mode)
        r, s3 = round_f64(1.0 / to_f64(d, fmt), fmt, overflow_mode)
    return r, 0x20 if (s1 or s2 or s3) else 0


def _seq_sum32(v, axes):
    """float32 sum over ``axes`` (keepdims), element by element in row-major order of the reduced axes."""
    axes = tuple(a % v.ndim for a in axes)
    kept = tuple(d for d in range(v.ndim) if d not in axes)
    rows = np.transpose(v, kept + axes).reshape(-1, int(np.prod([v.shape[a] for a in axes])))
    with np.errstate(all="ignore"):
        s = np.add.accumulate(rows, axis=1, dtype=_F32)[:, -1]
    return s.reshape(tuple(v.shape[d] for d in kept)).reshape(tuple(1 if d in axes else v.shape[d]
                                                                     for d in range(v.ndim)))


def _log32(x, impl_mode):
    if impl_mode == "high_precision":
        with np.errstate(all="ignore"):
            return np.log(x.astype(np.float64)).astype(_F32)
    _libm.logf.restype = ctypes.c_float
    _libm.logf.argtypes = [ctypes.c_float]
    return np.array([_libm.logf(float(v)) for v in x.ravel()], dtype=_F32).reshape(x.shape)


def softmax_steps(x, fmt, model, impl_mode="high_precision"):
    """CANN softmax over the last axis of ``x`` (values of ``fmt`` or float32) as float32 before the final
    cast: TBE subtracts the maximum in ``fmt`` (one rounding there), the Ascend C kernel in float32."""
    x = np.asarray(x)
    with np.errstate(all="ignore"):
        m = np.max(x.astype(np.float64), axis=-1, keepdims=True)
        if model != "ascendc" and fmt != "float32":
            d = to_f64(cast_bits(x.astype(np.float64) - m, fmt)[0], fmt).astype(_F32)  # exact, then one rounding
        else:
            d = x.astype(_F32) - m.astype(_F32)
        e = exp32(d, impl_mode)
        return e / _seq_sum32(e, (-1,))


def layer_norm_steps(x, gamma, beta, eps, axes, model, impl_mode="high_precision"):
    """CANN LayerNorm in float32 steps: mean = sum(x * cof), var = sum((x - mean)^2 * cof), rstd by
    exp(-0.5 log(var + eps)) (TBE v100, or v220 under high_performance) or 1 / sqrt(var + eps)."""
    x = np.asarray(x).astype(_F32)
    n = int(np.prod([x.shape[a] for a in axes]))
    cof = _F32(_F32(1) / _F32(n)) if model == "ascendc" else _F32(1.0 / n)
    with np.errstate(all="ignore"):
        mean = _seq_sum32(x * cof, axes)
        d = x - mean
        ve = _seq_sum32((d * d) * cof, axes) + _F32(eps)
        if model == "tbe_v100" or (model == "tbe_v220" and impl_mode == "high_performance"):
            rstd = exp32(_log32(ve, impl_mode) * _F32(-0.5), impl_mode)
        else:
            rstd = _F32(1) / np.sqrt(ve)
        y = d * rstd
        if gamma is not None:
            y = y * np.asarray(gamma).astype(_F32)
        if beta is not None:
            y = y + np.asarray(beta).astype(_F32)
    return y


def batch_norm_steps(x, scale, offset, mean, var, eps, model):
    """CANN inference BatchNorm over the last axis in float32 steps: TBE folds scale / sqrt(var + eps) and
    offset - mult * mean first; the Ascend C kernel normalises with the correctly rounded rstd."""
    x, s, o, m, v = (np.asarray(a).astype(_F32) for a in (x, scale, offset, mean, var))
    with np.errstate(all="ignore"):
        ve = v + _F32(eps)
        if model == "ascendc":
            rstd = (1.0 / np.sqrt(ve.astype(np.float64))).astype(_F32)
            return ((x - m) * s) * rstd + o
        mult = s / np.sqrt(ve)
        return mult * x + (o - mult * m)


def max_pool_grad(x, dy, kh, kw, sh, sw, pt, pl):
    """MaxPoolGrad from its definition, one window at a time in Python: the window's taps in row-major order,
    a tap in the padding reading -inf, the first tap that is NaN (else the first of the largest values)
    receiving the window's gradient; the gradients reaching one input pixel added in float32, starting from
    +0, in the order of their winning taps (TBE max_pool_grad.py adds the selected gradients of the whole plane
    one tap at a time), windows of one tap row-major over the output. ``x``, ``dy`` NHWC float32; a float32
    array back."""
    n, h, w, c = x.shape
    _, oh, ow, _ = dy.shape
    acc = np.zeros((n, h, w, c), _F32)
    for b in range(n):
        for ch in range(c):
            picks = []
            for i in range(oh):
                for j in range(ow):
                    pick = None
                    best = None
                    for r in range(i * sh - pt, i * sh - pt + kh):
                        for q in range(j * sw - pl, j * sw - pl + kw):
                            v = float(x[b, r, q, ch]) if 0 <= r < h and 0 <= q < w else -math.inf
                            if math.isnan(v):
                                if best is None or not math.isnan(best):
                                    pick, best = (r, q), v
                                break
                            if best is None or v > best:
                                pick, best = (r, q), v
                        if best is not None and math.isnan(best):
                            break
                    tap = (pick[0] - (i * sh - pt)) * kw + (pick[1] - (j * sw - pl))
                    picks.append((tap, i, j, pick))
            for tap, i, j, (r, q) in sorted(picks, key=lambda e: e[0]):      # stable: row-major within a tap
                if 0 <= r < h and 0 <= q < w:
                    acc[b, r, q, ch] = _F32(acc[b, r, q, ch] + _F32(dy[b, i, j, ch]))
    return acc


def split_sum32(vals, bounds=None, order=None):
    """The vector unit's float32 Sum of the sequence ``vals`` (float32 scalars), in Python: from the first value
    one float32 add at a time; split at ``bounds`` (chunk boundaries), each chunk so, and the chunks' partials
    added to +0 in ``order``."""
    if bounds is None:
        bounds, order = [0, len(vals)], None
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        acc = _F32(vals[lo])
        for v in vals[lo + 1:hi]:
            acc = _F32(acc + _F32(v))
        parts.append(acc)
    if order is None:
        return parts[0]
    total = _F32(0.0)
    for j in order:
        total = _F32(total + parts[j])
    return total


def batch_norm_training32(x, scale, offset, eps, orders=None, bounds=None):
    """BNTrainingReduce + BNTrainingUpdate on NHWC float32 ``x`` element by element (NUMERICS.md section 8):
    per channel the float32 sums of x and of x*x over (n, h, w) in row-major order (:func:`split_sum32`, the
    arrival orders ``orders[0][c]``, ``orders[1][c]`` when split), mean = s / n, var = sq / n - mean^2,
    mult = scale / sqrt(|var + eps|), y = mult * x + (offset - mult * mean), every step one float32 operation.
    Returns (y, mean, var)."""
    n_, h, w, c = x.shape
    f = _F32
    y = np.empty(x.shape, f)
    means, vars_ = np.empty(c, f), np.empty(c, f)
    for ch in range(c):
        vals = [f(v) for v in x[..., ch].reshape(-1)]
        s = split_sum32(vals, bounds, None if orders is None else orders[0][ch])
        sq = split_sum32([f(v * v) for v in vals], bounds, None if orders is None else orders[1][ch])
        n = f(len(vals))
        mean = f(s / n)
        var = f(f(sq / n) - f(mean * mean))
        mult = f(f(scale[ch]) / f(np.sqrt(f(abs(f(var + f(eps)))))))
        addend = f(f(offset[ch]) - f(mult * mean))
        for i, (a, b, d) in enumerate(np.ndindex(n_, h, w)):
            y[a, b, d, ch] = f(f(mult * f(x[a, b, d, ch])) + addend)
        means[ch], vars_[ch] = mean, var
    return y, means, vars_


def batch_norm_grad32(dy, x, scale, mean, var, eps, orders=None, bounds=None):
    """BNTrainingUpdateGrad + BNTrainingReduceGrad on NHWC float32 element by element (NUMERICS.md section 8):
    per channel d_scale = sum dy * ((x - mean) * rstd), rstd = 1 / sqrt(var + eps), d_offset = sum dy (float32,
    :func:`split_sum32`), then dx = ((dy + mult * x) + addend) * (scale / sqrt(var + eps)) with
    mult = (d_scale * -1/n) / sqrt(var + eps), addend = (mean / sqrt(var + eps)) * (d_scale / n) + d_offset * -1/n.
    Returns (dx, d_scale, d_offset)."""
    f = _F32
    c = x.shape[3]
    dx = np.empty(x.shape, f)
    ds, do = np.empty(c, f), np.empty(c, f)
    for ch in range(c):
        m, v = f(mean[ch]), f(var[ch])
        sv = f(np.sqrt(f(v + f(eps))))
        rstd = f(f(1.0) / sv)
        xs = [f(t) for t in x[..., ch].reshape(-1)]
        gs = [f(t) for t in dy[..., ch].reshape(-1)]
        d_scale = split_sum32([f(g * f(f(t - m) * rstd)) for g, t in zip(gs, xs)], bounds,
                              None if orders is None else orders[0][ch])
        d_offset = split_sum32(gs, bounds, None if orders is None else orders[1][ch])
        rn = f(1.0 / len(xs))
        mult = f(f(d_scale * -rn) / sv)
        addend = f(f(f(m / sv) * f(d_scale * rn)) + f(d_offset * -rn))
        k = f(f(scale[ch]) / sv)
        for i, idx in enumerate(np.ndindex(*x.shape[:3])):
            dx[idx + (ch,)] = f(f(f(gs[i] + f(mult * xs[i])) + addend) * k)
        ds[ch], do[ch] = d_scale, d_offset
    return dx, ds, do


def program32(inputs, steps, outputs):
    """A float32 step program (``numerics.chain.chain_f32``'s): each step ``(name, a, b)`` computed in float64
    from its float32 operands (values 0.. the inputs, then the steps' results) and rounded once to float32, which
    for + - * / and sqrt is the correctly rounded float32 result (float64 holds more than 2 * 24 + 2 bits: the
    double rounding is innocuous). The values ``outputs``, as float32 arrays."""
    vals = [np.asarray(x, np.float32) for x in inputs]
    with np.errstate(all="ignore"):
        for name, a, b in steps:
            x = vals[a].astype(np.float64)
            y = vals[b].astype(np.float64) if b >= 0 else None
            r = {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y, "realdiv": lambda: x / y,
                 "neg": lambda: -x, "square": lambda: x * x, "sqrt": lambda: np.sqrt(x)}[name]()
            vals.append(np.asarray(r).astype(np.float32))
    return [vals[o] for o in outputs]
