"""Sin and Cos as CANN's TBE kernels compute them, instruction by instruction (NUMERICS.md section 2,
"Sourced kernels: Sin and Cos").

Sources (the TBE operator implementations the Ascend910 / Ascend910B run; hicann/ops-math has only the
Ascend950's kernels, math/sin/op_kernel/arch35/sin_dag.h and math/cos/op_kernel/arch35/cos_dag.h, whose
``Simt::Sin`` / ``Simt::Cos`` are unpublished: SIN_F64 / COS_F64 model them):

- Sin: canndev ``ops/built-in/tbe/impl/dynamic/sin.py`` (``sin_compute``, ``_sin``), read in the public mirror
  dengguojie/vue-element-admin. An fp16 input is cast to float32 (``has_improve_precision``: the SoC has a
  float32 ``vmul``); ``k = round(x * (1/PI))`` (``tbe.round``: float32 -> int32, the ``r`` vconv mode, ties to
  even), cast back to float32; ``x' = x - k * PI`` puts x' in [-pi/2, pi/2]; the Taylor series to x^11 with
  ``p = x'*x'``, ``t = (p * (-1/6)) * x'``, ``s = x' + t``, then for i = 5, 7, 9, 11 ``t = (p * t) * (-1/(i(i-1)))``,
  ``s = s + t``; the sign from k's parity, ``c = ceil(k/2)`` (int32), ``d = 2c - k``, ``(1 - d) + ((1 - d) - 1)``
  (1 for even k, -1 for odd), times s; the result cast back to fp16 (``cast_to``: CAST_RINT).
- Cos: canndev ``ops/built-in/tbe/impl/dynamic/cos.py`` (``cos_compute``): float32 as above; ``k = round(x *
  (1/(2 PI)))``, ``x' = x - k * 2PI`` in [-pi, pi]; ``p = x'*x'``, ``t = p * (-1/2)``, ``s = 1 + t``, then for
  i = 4, 6, ..., 14 ``t = (p * t) * (-1/(i(i-1)))``, ``s = s + t``; cast back with CAST_RINT.

Every ``vmul``/``vmuls``/``vadd``/``vsub`` is one float32 operation, rounded (and saturated under saturation) on
its own; a ``vmuls`` scalar is the Python constant in float32. The float32 -> int32 conversions (the round and
the ceil) saturate at the int32 range and take NaN to 0: not in the source (they matter only for |x| >= 2^31 pi
or NaN, whose result is NaN either way). bfloat16 (not in the TBE kernels' dtype lists; aclnnSin takes it on
the 910B) runs the same float32 steps and casts back with CAST_RINT, as the fp16 path and the Ascend950 DAG do.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .cast import FLUSH, bits16_to_f32, fmt16
from .codes import COS_F64, COS_TBE, SIN_F64, SIN_TBE
from .parallel import or_all
from .sourced import _st
from .vector import _F32_TINY, finish32, round16_f32

_PI = 3.14159265358979                         # sin.py: PI; cos.py: TWO_PI = 2 * 3.14159265358979
_INV_PI = np.float32(1.0 / _PI)
_PI32 = np.float32(_PI)
_INV_2PI = np.float32(1.0 / (2 * _PI))
_2PI32 = np.float32(2 * _PI)
_SIN_C = np.array([-1.0 / 6.0] + [-1.0 / (i * (i - 1)) for i in (5, 7, 9, 11)], dtype=np.float32)
_COS_C = np.array([-1.0 / 2.0] + [-1.0 / (i * (i - 1)) for i in (4, 6, 8, 10, 12, 14)], dtype=np.float32)
_I32_MAX = 2147483647.0
_I32_MIN = -2147483648.0
_CHUNK = 1 << 15


@njit(cache=True)
def _to_i32(v, ceil):
    """float32 v -> int32 (round to nearest even, or ceil), saturating; NaN -> 0 (assumed), as an int64."""
    if v != v:
        return np.int64(0)
    r = math.ceil(np.float64(v)) if ceil else np.rint(np.float64(v))
    r = min(max(r, _I32_MIN), _I32_MAX)
    return np.int64(r)


@njit(cache=True, error_model="numpy")
def trig_steps32(op, x, overflow):
    """(y, bad) = the TBE Sin (op SIN_TBE) or Cos (COS_TBE) of float32 x, each step one float32 operation;
    SIN_F64 / COS_F64: float32(sin/cos(float64 x)); bad if any step was Inf or NaN."""
    if op == SIN_F64:
        return _st(np.float32(math.sin(np.float64(x))), overflow)
    if op == COS_F64:
        return _st(np.float32(math.cos(np.float64(x))), overflow)
    one = np.float32(1.0)
    sin = op == SIN_TBE
    q, b0 = _st(x * (_INV_PI if sin else _INV_2PI), overflow)
    k = np.float32(_to_i32(q, False))
    m, b1 = _st(k * (_PI32 if sin else _2PI32), overflow)
    r, b2 = _st(x - m, overflow)
    p, b3 = _st(r * r, overflow)
    bad = b0 | b1 | b2 | b3
    if sin:
        t, b = _st(p * _SIN_C[0], overflow)
        bad |= b
        t, b = _st(t * r, overflow)
        bad |= b
        s, b = _st(r + t, overflow)
        bad |= b
        for j in range(1, _SIN_C.size):
            t, b = _st(p * t, overflow)
            bad |= b
            t, b = _st(t * _SIN_C[j], overflow)
            bad |= b
            s, b = _st(s + t, overflow)
            bad |= b
        # the sign of k's parity: ceil(k/2) as int32, times 2, back to float32, minus k
        half = k * np.float32(0.5)
        c2 = np.float32(2 * _to_i32(half, True))
        d, b = _st(c2 - k, overflow)
        bad |= b
        odd = one - d
        even = odd - one
        s, b = _st(s * (odd + even), overflow)
        return s, bad | b
    t, b = _st(p * _COS_C[0], overflow)
    bad |= b
    s, b = _st(one + t, overflow)
    bad |= b
    for j in range(1, _COS_C.size):
        t, b = _st(p * t, overflow)
        bad |= b
        t, b = _st(t * _COS_C[j], overflow)
        bad |= b
        s, b = _st(s + t, overflow)
        bad |= b
    return s, bad


@njit(cache=True, error_model="numpy")
def _span16(op, x, out, bf16, overflow, subnormal):
    """out[i] = rint16(op(widen(x[i]))) over uint16 bits; returns the OR of statuses."""
    mt, bias, eb = fmt16(bf16)
    acc = np.int64(0)
    for i in range(out.size):
        r, bad = trig_steps32(op, bits16_to_f32(x[i], bf16, subnormal), overflow)
        b, s = round16_f32(r, mt, bias, eb, overflow, subnormal)
        out[i] = np.uint16(b)
        acc |= s | np.int64(bad)
    return acc


@njit(cache=True)
def trig16_table(op, bf16, overflow, subnormal):
    """t[b] = status << 16 | result bits, for every 16-bit pattern b (the span's own result per input)."""
    x = np.arange(65536).astype(np.uint16)
    out = np.empty(65536, dtype=np.uint16)
    t = np.empty(65536, dtype=np.uint32)
    for b in range(65536):
        s = _span16(op, x[b:b + 1], out[b:b + 1], bf16, overflow, subnormal)
        t[b] = np.uint32((np.int64(s) << 16) | np.int64(out[b]))
    return t


@njit(cache=True, error_model="numpy")
def _span32(op, x, out, overflow, subnormal):
    """out[i] = op(x[i]) in float32; returns the OR of statuses."""
    acc = np.int64(0)
    for i in range(out.size):
        a = x[i]
        if subnormal == FLUSH and abs(a) < _F32_TINY:
            a = a * np.float32(0.0)
        v, bad = trig_steps32(op, a, overflow)
        r, s = finish32(v, overflow, subnormal)
        out[i] = r
        acc |= s | np.int64(bad)
    return acc


@njit(cache=True, parallel=True)
def trig_f32(op, x, out, overflow, subnormal):
    """out = op(x) over flat float32 arrays, in chunks on Numba's threads; returns the OR of statuses."""
    n = out.size
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        lo = c * _CHUNK
        hi = min(n, lo + _CHUNK)
        st[c] = _span32(op, x[lo:hi], out[lo:hi], overflow, subnormal)
    return or_all(st)
