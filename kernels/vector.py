"""Elementwise ops of the Ascend vector unit, rounded once to the compute dtype.

16-bit compute dtypes (fp16, bf16) travel as ``uint16`` patterns; ``bf16`` flags
which. Each element is decoded exactly to float32, the op is evaluated in float32
(``+ - * /``, sqrt and the exact ops: correctly rounded there, then rounded once more
to the 16-bit format, which is still correct because float32 carries at least
2p + 2 bits, see NUMERICS.md section 2) or in float64 (transcendentals, the
``high_precision`` model), and rounded to nearest-even with the overflow and
subnormal codes of ``kernels/codes.py``. The float32 compute dtype uses float32
arithmetic for the basic ops and float64-then-round for transcendentals.

Kernels return the OR of the conversion statuses of their results; any non-zero
value means some result was Inf or NaN, which the wrappers report as 0x20.
``arith_f16_hw`` is the same model for fp16 + - * / with the decode and the rounding
done by the CPU's IEEE fp16 conversions (hosts with ``cast.HW_HALF`` only).

The sourced kernels (codes from ``GELU_TBE_V100`` on; NUMERICS.md section 2, "Sourced
kernels") are CANN's Gelu, Tanh, Sigmoid, Exp and Rsqrt instruction by instruction: every
step one float32 operation (:mod:`.sourced`: ``eval_steps32``; the fused multiply-add of
Ascend C's tanh exactly, ``fma_f32``), the result rounded once more to the 16-bit format as
CAST_RINT does; their status also reports an Inf or NaN in any step. The op codes are in
``kernels/codes.py``.

One idea: the same model (evaluate, round once) for the two 16-bit formats and for float32, unary
and binary, as plain loops LLVM vectorises. The float32 and float64 evaluators are one body
(:func:`_evaluators`), the parallel drivers one factory; the spans are kept together so the
variants stay visibly alike.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .cast import (FLUSH, RINT, SATURATION, bits16_to_f32, fmt16,  # noqa: F401 (fmt16: re-exported)
                   f16_to_f32_hw, f32_to_f16_hw, f32bits_narrow, f64bits_narrow, finish_f16_hw)
from .codes import (ABS, ADD, ERF, ERFC, EXP, EXP_F32, EXPM1, FIRST_STEPPED, FIRST_TRANSCENDENTAL,  # noqa: F401
                    FLT_MAX, GELU, GELU_ASCENDC, GELU_TANH, GELU_TBE_V100, GELU_TBE_V220, LEAKY_RELU, LOG, LOG1P,
                    MAXIMUM, MINIMUM, MUL, NEG, POW, REALDIV, RECIPROCAL, RELU, RELU6, RSQRT, RSQRT_F32, SIGMOID,
                    SIGMOID_ASCENDC, SIGMOID_TBE, SOFTPLUS, SOFTSIGN, SQRT, SQUARE, SQUARED_DIFFERENCE, SUB,
                    TANH, TANH_ASCENDC, TANH_TBE)
from .exp32 import exp_span
from .sourced import eval_steps32, fma_f32  # noqa: F401
from .parallel import or_all

_CHUNK = 1 << 15
_SQRT_HALF = 0.7071067811865476
_SQRT_2_OVER_PI = 0.7978845608028654
_F32_TINY = np.float32(1.1754943508222875e-38)
_F32_MAX = FLT_MAX


def _evaluators(ft):
    """(eval_unary, eval_binary) evaluating in the float type ``ft`` (np.float32 or np.float64): one body
    for both widths, every constant typed ``ft`` so that nothing widens (math.* of a float32 is libm's
    float32 function); the integer op is a run-time argument."""
    @njit(cache=True, error_model="numpy")
    def eval_unary(op, x, alpha):
        one = ft(1.0)
        zero = ft(0.0)
        if op == NEG:
            return -x
        if op == ABS:
            return abs(x)
        if op == SQUARE:
            return x * x
        if op == SQRT:
            return np.sqrt(x)
        if op == RECIPROCAL:
            return one / x
        if op == RELU:
            return x if (x > zero or x != x) else zero
        if op == RELU6:
            return x if x != x else (min(x, ft(6.0)) if x > zero else zero)
        if op == LEAKY_RELU:
            return x if x >= zero else x * alpha
        if op == RSQRT:
            return one / np.sqrt(x)
        if op == EXP:
            return math.exp(x)
        if op == EXPM1:
            return math.expm1(x)
        if op == LOG:
            return np.log(x)
        if op == LOG1P:
            return np.log1p(x)
        if op == TANH:
            return math.tanh(x)
        if op == SIGMOID:
            return one / (one + math.exp(-x))
        if op == ERF:
            return math.erf(x)
        if op == ERFC:
            return math.erfc(x)
        if op == SOFTPLUS:
            return max(x, zero) + np.log1p(math.exp(-abs(x))) if x == x else x
        if op == SOFTSIGN:
            return x / (one + abs(x))
        if op == GELU:
            # erfc form: no cancellation for negative x, where 1 + erf(x/sqrt2) would lose it all
            return ft(0.5) * x * math.erfc(-x * ft(_SQRT_HALF))
        if op == GELU_TANH:
            # 0.5 x (1 + tanh u) written as x / (1 + exp(-2u)): no cancellation for negative x
            return x / (one + math.exp(ft(-2.0 * _SQRT_2_OVER_PI) * (x + ft(0.044715) * x * x * x)))
        return ft(np.nan)

    @njit(cache=True, error_model="numpy")
    def eval_binary(op, a, b):
        if op == ADD:
            return a + b
        if op == SUB:
            return a - b
        if op == MUL:
            return a * b
        if op == REALDIV:
            return a / b
        if op == MAXIMUM:  # numpy's rule: NaN propagates, ties keep a
            return a if (a >= b or a != a) else b
        if op == MINIMUM:
            return a if (a <= b or a != a) else b
        if op == POW:
            return a ** b
        return ft(np.nan)

    width = "float32 (libm float32 functions for transcendentals; POW through float32 libm)" \
        if ft is np.float32 else "float64"
    eval_unary.__doc__ = f"y = op(x) evaluated in {width}."
    eval_binary.__doc__ = f"c = a op b evaluated in {width}."
    return eval_unary, eval_binary


eval_unary32, eval_binary32 = _evaluators(np.float32)
eval_unary64, eval_binary64 = _evaluators(np.float64)


@njit(cache=True)
def round16_f32(c, mt, bias, eb, overflow, subnormal):
    """(bits, st) = round-to-nearest-even of float32 c to the (mt, bias, eb) format."""
    # no branch on the format here: a select between two calls would stop vectorisation
    return f32bits_narrow(np.float32(c).view(np.uint32), mt, bias, eb, RINT, overflow, subnormal)


@njit(cache=True)
def round16_f64(c, mt, bias, eb, overflow, subnormal):
    """(bits, st) = round-to-nearest-even of float64 c to the (mt, bias, eb) format, one rounding."""
    return f64bits_narrow(np.float64(c).view(np.uint64), mt, bias, eb, RINT, overflow, subnormal)


@njit(cache=True)
def finish32(c, overflow, subnormal):
    """(y, st) = float32 result c under the overflow and subnormal codes; st != 0 if c is Inf/NaN."""
    bad = not (abs(c) <= _F32_MAX)
    if bad and overflow == SATURATION:
        c = np.float32(0.0) if c != c else (_F32_MAX if c > 0 else -_F32_MAX)
    if subnormal == FLUSH and abs(c) < _F32_TINY:
        c = c * np.float32(0.0)
    return c, np.int64(bad)


# ---------------------------------------------------------------- 16-bit spans (serial; vectorisable)

# One small function per op: a loop holding a branch on the op (or several loops behind
# one) is not vectorised by LLVM, a plain loop is. The factories below make one kernel per op;
# each closes over an integer op code only, which Numba folds as a constant (the other branches
# are pruned before typing) and which keeps the on-disk cache valid across processes (a closure
# over another jitted function would be keyed by that function's per-process identity).

def _arith16_kernel(op):
    """The span kernel out[i] = round16(x[i] op y[i]) for one of + - * / (one float32 op)."""
    @njit(cache=True, error_model="numpy")
    def span(x, y, out, bf16, overflow, subnormal):
        mt, bias, eb = fmt16(bf16)
        acc = np.int64(0)
        for i in range(out.size):
            a = bits16_to_f32(x[i], bf16, subnormal)
            b = bits16_to_f32(y[i], bf16, subnormal)
            if op == ADD:
                c = a + b
            elif op == SUB:
                c = a - b
            elif op == MUL:
                c = a * b
            else:
                c = a / b
            r, s = round16_f32(c, mt, bias, eb, overflow, subnormal)
            out[i] = np.uint16(r)
            acc |= s
        return acc
    return span


_add16, _sub16, _mul16, _div16 = (_arith16_kernel(op) for op in (ADD, SUB, MUL, REALDIV))


@njit(cache=True, error_model="numpy")
def _sqdiff16(x, y, out, bf16, overflow, subnormal):
    """out[i] = round16(d * d), d = round16(x[i] - y[i]): TBE's vsub then vmul, each rounded (the _sub16 and
    _mul16 steps composed); returns the OR of statuses."""
    mt, bias, eb = fmt16(bf16)
    acc = np.int64(0)
    for i in range(out.size):
        d, s1 = round16_f32(bits16_to_f32(x[i], bf16, subnormal) - bits16_to_f32(y[i], bf16, subnormal), mt, bias,
                            eb, overflow, subnormal)
        t = bits16_to_f32(np.uint16(d), bf16, subnormal)
        r, s2 = round16_f32(t * t, mt, bias, eb, overflow, subnormal)
        out[i] = np.uint16(r)
        acc |= s1 | s2
    return acc


@njit(cache=True, error_model="numpy")
def _arith16_span(op, x, y, out, bf16, overflow, subnormal):
    """out[i] = round16(x[i] op y[i]) for op in + - * / (float32 evaluation); returns the OR of statuses."""
    if op == ADD:
        return _add16(x, y, out, bf16, overflow, subnormal)
    if op == SUB:
        return _sub16(x, y, out, bf16, overflow, subnormal)
    if op == MUL:
        return _mul16(x, y, out, bf16, overflow, subnormal)
    return _div16(x, y, out, bf16, overflow, subnormal)


@njit(cache=True)
def _load_f16_hw(b, flush):
    """float32 value of fp16 bits b by the hardware conversion; subnormals -> signed zero if flush."""
    b = np.int64(b)
    sub = np.int64((b & 0x7C00) == 0) & flush
    return f16_to_f32_hw(np.uint16(b & ~(sub * 0x7FFF)))


def _arith_f16_hw_kernel(op):
    """The span kernel out[i] = fp16(x[i] op y[i]) for one of + - * / with hardware conversions."""
    @njit(cache=True, error_model="numpy")
    def span(x, y, out, overflow, subnormal):
        fl = np.int64(subnormal == FLUSH)
        acc = np.int64(0)
        for i in range(out.size):
            a = _load_f16_hw(x[i], fl)
            b = _load_f16_hw(y[i], fl)
            if op == ADD:
                c = a + b
            elif op == SUB:
                c = a - b
            elif op == MUL:
                c = a * b
            else:
                c = a / b
            r, bad = finish_f16_hw(f32_to_f16_hw(c), 0, overflow, subnormal)
            out[i] = np.uint16(r)
            acc |= bad
        return acc
    return span


_add_f16_hw, _sub_f16_hw, _mul_f16_hw, _div_f16_hw = (_arith_f16_hw_kernel(op) for op in (ADD, SUB, MUL, REALDIV))


@njit(cache=True, error_model="numpy")
def _sqdiff_f16_hw(x, y, out, overflow, subnormal):
    """out[i] = fp16(d * d), d = fp16(x[i] - y[i]), with hardware conversions; returns the OR of statuses."""
    # _binary16_span's SQUARED_DIFFERENCE is its SUB then its MUL of d by itself, each exactly the
    # _sub16 / _mul16 step; these are the hardware spans' SUB and MUL steps composed the same way
    fl = np.int64(subnormal == FLUSH)
    acc = np.int64(0)
    for i in range(out.size):
        d, bad1 = finish_f16_hw(f32_to_f16_hw(_load_f16_hw(x[i], fl) - _load_f16_hw(y[i], fl)), 0, overflow,
                                subnormal)
        t = _load_f16_hw(np.uint16(d), fl)
        r, bad2 = finish_f16_hw(f32_to_f16_hw(t * t), 0, overflow, subnormal)
        out[i] = np.uint16(r)
        acc |= bad1 | bad2
    return acc


@njit(cache=True, error_model="numpy")
def _arith_f16_hw_span(op, x, y, out, overflow, subnormal):
    """out[i] = fp16(x[i] op y[i]) for op in + - * / and squared difference with hardware conversions;
    returns the OR of statuses."""
    # the model of _arith16_span (exact decode, one float32 op, one RNE rounding) with the
    # conversions done by vcvtph2ps / vcvtps2ph (HW_HALF hosts only)
    if op == ADD:
        return _add_f16_hw(x, y, out, overflow, subnormal)
    if op == SUB:
        return _sub_f16_hw(x, y, out, overflow, subnormal)
    if op == MUL:
        return _mul_f16_hw(x, y, out, overflow, subnormal)
    if op == SQUARED_DIFFERENCE:
        return _sqdiff_f16_hw(x, y, out, overflow, subnormal)
    return _div_f16_hw(x, y, out, overflow, subnormal)


@njit(cache=True)
def _relu_grad16_span(dy, x, out, lim):
    """out[i] = dy[i] if x[i] > 0 else dy[i] & 0x8000; returns 1 if some dy[i] is Inf or NaN, else 0."""
    ok = True   # a boolean accumulator: an integer count holds the loop to fewer lanes (2.5x slower)
    for i in range(np.uintp(out.size)):
        d = np.int32(dy[i])
        v = np.int32(x[i])
        pos = (v > 0) & (v <= lim)  # sign clear, not zero, not NaN
        out[i] = np.uint16(d if pos else d & 0x8000)
        ok &= (d & 0x7FFF) < lim
    return np.int64(not ok)


@njit(cache=True, parallel=True)
def relu_grad16(dy, x, out, bf16):
    """out[i] = dy[i] if x[i] > 0 else dy[i] * +0 (dy's sign, zero) over flat 16-bit patterns; returns non-zero
    if some dy[i] is Inf or NaN, for which out is not this (the caller computes those in float32)."""
    # for finite dy both results are exact 16-bit values: the float32 product and its rounding change
    # nothing, so ReluGrad is a select on the bit patterns
    n = out.size
    lim = np.int32(0x7F80) if bf16 else np.int32(0x7C00)
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        lo = c * _CHUNK
        hi = min(n, lo + _CHUNK)
        st[c] = _relu_grad16_span(dy[lo:hi], x[lo:hi], out[lo:hi], lim)
    return or_all(st)


@njit(cache=True, parallel=True)
def relu_grad16_bcast(dy, x, out, mid, cols, bf16):
    """``relu_grad16`` with dy repeated over a block of axes (a broadcast view's distinct values): x and out
    (outer, mid, cols) flattened, dy (outer, cols) flattened, out[(o * mid + m) * cols + c] = dy[o * cols + c] if
    x there > 0 else its signed zero, as ``relu_grad16`` gives it on the materialized dy; returns non-zero if some
    dy[i] is Inf or NaN (out is then not this: the caller computes in float32)."""
    lim = np.int32(0x7F80) if bf16 else np.int32(0x7C00)
    ok = True
    for i in range(dy.size):
        ok &= (np.int32(dy[i]) & 0x7FFF) < lim
    if not ok:
        return np.int64(1)
    outer = dy.size // cols
    for o in prange(outer):
        d = dy[o * cols:(o + 1) * cols]
        for m in range(mid):
            lo = (o * mid + m) * cols
            xr = x[lo:lo + cols]
            orow = out[lo:lo + cols]
            for c in range(cols):
                v = np.int32(xr[c])
                dd = np.int32(d[c])
                orow[c] = np.uint16(dd if (v > 0) & (v <= lim) else dd & 0x8000)
    return np.int64(0)


@njit(cache=True, error_model="numpy")
def _binary16_span(op, x, y, out, bf16, overflow, subnormal, use64):
    """out[i] = round16(x[i] op y[i]) for any binary op; returns the OR of statuses."""
    if op <= REALDIV:
        return _arith16_span(op, x, y, out, bf16, overflow, subnormal)
    if op == SQUARED_DIFFERENCE:    # a loop of its own, which LLVM vectorises
        return _sqdiff16(x, y, out, bf16, overflow, subnormal)
    mt, bias, eb = fmt16(bf16)
    acc = np.int64(0)
    for i in range(out.size):
        a = bits16_to_f32(x[i], bf16, subnormal)
        c = bits16_to_f32(y[i], bf16, subnormal)
        if op == POW and use64:
            v = eval_binary64(op, np.float64(a), np.float64(c))
            b, s = round16_f64(v, mt, bias, eb, overflow, subnormal)
        else:
            b, s = round16_f32(eval_binary32(op, a, c), mt, bias, eb, overflow, subnormal)
        out[i] = np.uint16(b)
        acc |= s
    return acc


@njit(cache=True, error_model="numpy")
def _sigmoid16_tbe_span(x, out, bf16, overflow, subnormal, use64):
    """TBE Sigmoid in the 16-bit format: out = vrec(vadds(vexp(-x), 1)), each step rounded; returns the OR
    of statuses. vexp and vrec are modelled correctly rounded (exp: float32 libm unless use64)."""
    mt, bias, eb = fmt16(bf16)
    acc = np.int64(0)
    for i in range(out.size):
        n = -bits16_to_f32(x[i], bf16, subnormal)
        if use64:
            e, s1 = round16_f64(math.exp(np.float64(n)), mt, bias, eb, overflow, subnormal)
        else:
            e, s1 = round16_f32(math.exp(n), mt, bias, eb, overflow, subnormal)
        d, s2 = round16_f32(bits16_to_f32(e, bf16, subnormal) + np.float32(1.0), mt, bias, eb, overflow, subnormal)
        b, s3 = round16_f32(np.float32(1.0) / bits16_to_f32(d, bf16, subnormal), mt, bias, eb, overflow, subnormal)
        out[i] = np.uint16(b)
        acc |= s1 | s2 | s3
    return acc


@njit(cache=True, error_model="numpy")
def _unary16_span(op, x, out, bf16, overflow, subnormal, use64, alpha):
    """out[i] = round16(op(x[i])); returns the OR of statuses."""
    mt, bias, eb = fmt16(bf16)
    acc = np.int64(0)
    if op == SIGMOID_TBE:
        return _sigmoid16_tbe_span(x, out, bf16, overflow, subnormal, use64)
    if op >= FIRST_STEPPED:
        tiny = np.float32(alpha)
        for i in range(out.size):
            r, bad = eval_steps32(op, bits16_to_f32(x[i], bf16, subnormal), use64, overflow, tiny)
            b, s = round16_f32(r, mt, bias, eb, overflow, subnormal)
            out[i] = np.uint16(b)
            acc |= s | np.int64(bad)
    elif use64 and op >= FIRST_TRANSCENDENTAL:
        a64 = np.float64(alpha)
        for i in range(out.size):
            v = np.float64(bits16_to_f32(x[i], bf16, subnormal))
            b, s = round16_f64(eval_unary64(op, v, a64), mt, bias, eb, overflow, subnormal)
            out[i] = np.uint16(b)
            acc |= s
    else:
        a32 = np.float32(alpha)
        for i in range(out.size):
            v = bits16_to_f32(x[i], bf16, subnormal)
            b, s = round16_f32(eval_unary32(op, v, a32), mt, bias, eb, overflow, subnormal)
            out[i] = np.uint16(b)
            acc |= s
    return acc


@njit(cache=True, error_model="numpy")
def _select16_span(cond, x, y, out, bf16):
    """out[i] = x[i] if cond[i] else y[i]; returns non-zero if an output is Inf/NaN."""
    acc = np.int64(0)
    lim = np.int64(0x7F80) if bf16 else np.int64(0x7C00)
    for i in range(out.size):
        v = x[i] if cond[i] else y[i]
        out[i] = v
        acc |= np.int64((np.int64(v) & 0x7FFF) >= lim)
    return acc


# ---------------------------------------------------------------- float32 spans

@njit(cache=True, error_model="numpy")
def _binary32_span(op, x, y, out, overflow, subnormal, use64):
    """out[i] = x[i] op y[i] in float32 (POW: float64 then one rounding if use64); returns the OR of statuses."""
    acc = np.int64(0)
    flush = subnormal == FLUSH
    for i in range(out.size):
        a = x[i]
        c = y[i]
        if flush:
            a = a * np.float32(0.0) if abs(a) < _F32_TINY else a
            c = c * np.float32(0.0) if abs(c) < _F32_TINY else c
        if op == SQUARED_DIFFERENCE:
            d, s1 = finish32(a - c, overflow, subnormal)
            r, s = finish32(d * d, overflow, subnormal)
            s |= s1
        elif op == POW and use64:
            r, s = finish32(np.float32(eval_binary64(op, np.float64(a), np.float64(c))), overflow, subnormal)
        else:
            r, s = finish32(eval_binary32(op, a, c), overflow, subnormal)
        out[i] = r
        acc |= s
    return acc


@njit(cache=True, error_model="numpy")
def _unary32_span(op, x, out, overflow, subnormal, use64, alpha):
    """out[i] = op(x[i]) in float32 (transcendentals: float64 then one rounding if use64; sourced kernels
    step by step, ``alpha`` their constant); returns the OR of statuses."""
    flush = subnormal == FLUSH
    if use64 and (op == EXP or op == EXP_F32):
        # float32(exp(float64(x))) either way (_st then finish32 is finish32): the vectorised span
        return exp_span(x, out, overflow, flush)
    acc = np.int64(0)
    a32 = np.float32(alpha)
    a64 = np.float64(alpha)
    for i in range(out.size):
        a = x[i]
        if flush:
            a = a * np.float32(0.0) if abs(a) < _F32_TINY else a
        if op >= FIRST_STEPPED:
            v, bad = eval_steps32(op, a, use64, overflow, a32)
            r, s = finish32(v, overflow, subnormal)
            s |= np.int64(bad)
        elif use64 and op >= FIRST_TRANSCENDENTAL:
            r, s = finish32(np.float32(eval_unary64(op, np.float64(a), a64)), overflow, subnormal)
        else:
            r, s = finish32(eval_unary32(op, a, a32), overflow, subnormal)
        out[i] = r
        acc |= s
    return acc


# ---------------------------------------------------------------- parallel drivers over flat arrays

# A driver runs its span kernel on chunks of _CHUNK elements in parallel and ORs their statuses.
# The factories close over an integer naming the span (a constant: the other calls are pruned
# before typing), never over the span itself, so the drivers load from the on-disk cache.
_B16, _B16_HW, _B32, _U16, _U32 = range(5)


def _binary_driver(span, doc):
    def drive(op, x, y, out, *params):
        n = out.size
        nch = (n + _CHUNK - 1) // _CHUNK
        st = np.zeros(nch, dtype=np.int64)
        for c in prange(nch):
            lo = c * _CHUNK
            hi = min(n, lo + _CHUNK)
            if span == _B16:
                st[c] = _binary16_span(op, x[lo:hi], y[lo:hi], out[lo:hi], *params)
            elif span == _B16_HW:
                st[c] = _arith_f16_hw_span(op, x[lo:hi], y[lo:hi], out[lo:hi], *params)
            else:
                st[c] = _binary32_span(op, x[lo:hi], y[lo:hi], out[lo:hi], *params)
        return or_all(st)
    drive.__doc__ = doc
    return njit(cache=True, parallel=True)(drive)


def _unary_driver(span, doc):
    def drive(op, x, out, *params):
        n = out.size
        nch = (n + _CHUNK - 1) // _CHUNK
        st = np.zeros(nch, dtype=np.int64)
        for c in prange(nch):
            lo = c * _CHUNK
            hi = min(n, lo + _CHUNK)
            if span == _U16:
                st[c] = _unary16_span(op, x[lo:hi], out[lo:hi], *params)
            else:
                st[c] = _unary32_span(op, x[lo:hi], out[lo:hi], *params)
        return or_all(st)
    drive.__doc__ = doc
    return njit(cache=True, parallel=True)(drive)


binary16 = _binary_driver(_B16, """binary16(op, x, y, out, bf16, overflow, subnormal, use64): out = round16(x op y)
    elementwise over equal-size flat uint16 arrays; returns the OR of statuses.""")
arith_f16_hw = _binary_driver(_B16_HW, """arith_f16_hw(op, x, y, out, overflow, subnormal): out = fp16(x op y) for op in
    + - * / and squared difference over flat fp16 bits (hardware conversions; HW_HALF hosts only).""")
binary_f32 = _binary_driver(_B32, """binary_f32(op, x, y, out, overflow, subnormal, use64): out = x op y elementwise
    over equal-size flat float32 arrays; returns the OR of statuses.""")
unary16 = _unary_driver(_U16, """unary16(op, x, out, bf16, overflow, subnormal, use64, alpha): out = round16(op(x))
    elementwise over flat uint16 arrays; returns the OR of statuses.""")
unary_f32 = _unary_driver(_U32, """unary_f32(op, x, out, overflow, subnormal, use64, alpha): out = op(x) elementwise
    over flat float32 arrays; returns the OR of statuses.""")


@njit(cache=True, parallel=True)
def select16(cond, x, y, out, bf16):
    """out = where(cond, x, y) over flat uint16 arrays; returns non-zero if an output is Inf/NaN."""
    n = out.size
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        lo = c * _CHUNK
        hi = min(n, lo + _CHUNK)
        st[c] = _select16_span(cond[lo:hi], x[lo:hi], y[lo:hi], out[lo:hi], bf16)
    return or_all(st)
