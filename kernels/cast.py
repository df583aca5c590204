"""Float format conversions of the Ascend vector unit (Cast with CAST_* round modes).

Every narrowing conversion is one integer rounding, generic over the target's
mantissa width and bias: the source is decoded to an integer significand ``m`` and
an unbiased exponent ``e``, shifted right to the target's quantum, and rounded by
the remainder, so even float64 sources are rounded once. :func:`narrow_bits` does it
for any source (float64 casts); :func:`f32bits_narrow` is its branch-free twin for
float32 sources and 16-bit targets, the hot path that vectorises. Codes are those of
``kernels/codes.py``: rounding rint=0 round=1 floor=2 ceil=3 trunc=4 odd=5,
overflow inf_nan=0 saturation=1, subnormals keep=0 flush=1.

Status bits returned (``kernels/codes.py``): 0x100 when a finite input
overflows the target format, 0x20 when the input is Inf or NaN, 0 otherwise.
16-bit floats travel as ``uint16`` bit patterns (Numba has no float16 on CPU).
"""
from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import binding as _llvm
from llvmlite import ir as _ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .codes import (BF16_BIAS, BF16_EB, BF16_MT, CEIL, F16_BIAS, F16_EB, F16_MT, F32_BIAS, F32_EB,  # noqa: F401
                    F32_MT, FLOOR, FLUSH, INF_NAN, KEEP, ODD, RINT, ROUND, SATURATION, ST_CONVERSION_OVERFLOW,
                    ST_FP_OVERFLOW, TRUNC)
from .hf32 import hf32_span
from .parallel import or_all

_CHUNK = 1 << 16


def _hardware_half() -> bool:
    """Whether LLVM lowers float32 <-> fp16 conversions to instructions on this host
    (x86 F16C, or any AArch64), so the fp16 fast paths need no soft-float library calls."""
    if numba.config.CPU_NAME not in (None, "host"):
        return False  # a portable build: the target may lack the instructions
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return True
    return machine in ("x86_64", "amd64") and bool(_llvm.get_host_cpu_features().get("f16c", False))


#: the fp16 fast paths (hardware IEEE conversions) are used when True
HW_HALF = _hardware_half()


@intrinsic
def f32_to_f16_hw(typingctx, x):
    """bits = IEEE fp16 round-to-nearest-even of float32 x (one vcvtps2ph / fcvt; Inf on overflow)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        if not HW_HALF:     # (see _soft_f32_to_f16)
            return context.compile_internal(builder, _soft_f32_to_f16, sig, args)
        return builder.bitcast(builder.fptrunc(args[0], _ir.HalfType()), _ir.IntType(16))
    return types.uint16(types.float32), codegen


@intrinsic
def f16_to_f32_hw(typingctx, b):
    """x = float32 value of fp16 bits b (exact; one vcvtph2ps / fcvt)."""
    if b != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        if not HW_HALF:     # (see _soft_f32_to_f16)
            return context.compile_internal(builder, _soft_f16_to_f32, sig, args)
        return builder.fpext(builder.bitcast(args[0], _ir.HalfType()), _ir.FloatType())
    return types.float32(types.uint16), codegen


def _soft_f32_to_f16(x):
    """f32_to_f16_hw where HW_HALF is False (no F16C, or a portable build: ``NUMBA_CPU_NAME``): LLVM lowers an
    fp16 conversion there to a soft-float library call (``__truncsfhf2`` / ``__extendhfsf2``) that Numba's JIT
    cannot link, and the process aborts while compiling; the fast paths are only taken on HW_HALF hosts, but
    their kernels take ``hw`` as an argument and compile both branches. The software rounding (round to nearest
    even, Inf on overflow, a quiet NaN) in its place."""
    return np.uint16(f32bits_narrow(np.int64(np.float32(x).view(np.uint32)), 10, 15, 5, RINT, INF_NAN, KEEP)[0])


def _soft_f16_to_f32(b):
    """f16_to_f32_hw where HW_HALF is False (see _soft_f32_to_f16): the exact widening."""
    return f16_bits_to_f32(b)


@njit(cache=True)
def finish_f16_hw(b, special, overflow, subnormal):
    """(bits, over) = fp16 RNE bits b under the overflow and subnormal codes; over: b is Inf/NaN."""
    # special: the source was Inf/NaN (so an Inf/NaN result is not an overflow of a finite value)
    b = np.int64(b)
    mag = b & 0x7FFF
    sign = b & 0x8000
    bad = np.int64(mag >= 0x7C00)
    sat = np.int64(overflow == SATURATION)
    nan = np.int64(mag > 0x7C00)
    # saturation: Inf -> +-65504, NaN -> +0
    mag = mag - (sat & bad & (1 - nan)) * (mag - 0x7BFF)
    sign = sign * (1 - (sat & nan))
    mag = mag * (1 - (sat & nan))
    flush = np.int64(subnormal == FLUSH) & np.int64(mag < 0x400)
    mag = mag * (1 - flush)
    return sign | mag, bad & (1 - special)


@njit(cache=True)
def narrow_bits(sign, m, e, srcmant, mt, bias, expbits, rounding, overflow, subnormal):
    """bits = round(m * 2**(e - srcmant)) to the (mt, bias, expbits) format; returns (bits, status)."""
    # m: int64 significand (implicit bit included for normal sources), m != 0; value is finite.
    sbit = np.int64(sign) << (mt + expbits)
    emin = 1 - bias
    infbits = ((np.int64(1) << expbits) - 1) << mt
    s = (srcmant - mt) + max(0, emin - e)
    if s > 62:
        q = np.int64(0)
        r = m
        half = np.int64(1) << 62  # m < 2**62, so the remainder is below half
    elif s > 0:
        q = m >> s
        r = m & ((np.int64(1) << s) - 1)
        half = np.int64(1) << (s - 1)
    else:  # widening or same width: exact
        q = m << (-s)
        r = np.int64(0)
        half = np.int64(1)
    if rounding == RINT:
        if r > half or (r == half and (q & 1) == 1):
            q += 1
    elif rounding == ROUND:
        if r >= half:
            q += 1
    elif rounding == FLOOR:
        if sign != 0 and r != 0:
            q += 1
    elif rounding == CEIL:
        if sign == 0 and r != 0:
            q += 1
    elif rounding == ODD:
        if r != 0:
            q |= 1
    # trunc: no increment
    # q carries the implicit bit for normal results, so a mantissa carry bumps the exponent
    out = (np.int64(max(e - emin, 0)) << mt) + q
    if out >= infbits:
        if overflow == SATURATION:
            return sbit | (infbits - 1), ST_CONVERSION_OVERFLOW
        to_inf = rounding == RINT or rounding == ROUND or (rounding == CEIL and sign == 0) or (
            rounding == FLOOR and sign != 0)
        if to_inf:
            return sbit | infbits, ST_CONVERSION_OVERFLOW
        return sbit | (infbits - 1), ST_CONVERSION_OVERFLOW
    if subnormal == FLUSH and out < (np.int64(1) << mt):
        return sbit, 0
    return sbit | out, 0


@njit(cache=True)
def _special_bits(sign, is_nan, mt, expbits, overflow):
    """bits of Inf/NaN after a narrowing cast: IEEE in inf_nan, +-max / +0 in saturation."""
    sbit = np.int64(sign) << (mt + expbits)
    infbits = ((np.int64(1) << expbits) - 1) << mt
    if overflow == SATURATION:
        if is_nan:
            return np.int64(0)
        return sbit | (infbits - 1)
    if is_nan:
        return sbit | infbits | (np.int64(1) << (mt - 1))
    return sbit | infbits


@njit(cache=True)
def f32bits_narrow(u, mt, bias, expbits, rounding, overflow, subnormal):
    """bits = cast(float32 bit pattern u) to the (mt <= 22, bias, expbits) format; returns (bits, status)."""
    # Branch-free twin of narrow_bits for float32 sources: every choice (mode, overflow,
    # flush, Inf/NaN) is integer arithmetic on 0/1 masks, so loops over it vectorise even
    # with runtime codes. Significands fit in 24 bits: a shift of 25 already leaves q = 0
    # and r = m below half, and int64 lanes never overflow.
    u = np.int64(u) & 0xFFFFFFFF
    sign = u >> 31
    pos = 1 - sign
    E = (u >> 23) & 0xFF
    F = u & 0x7FFFFF
    m = F | (np.int64(E != 0) << 23)
    e = max(E, 1) - 127
    emin = 1 - bias
    infbits = ((np.int64(1) << expbits) - 1) << mt
    s = min((23 - mt) + max(0, emin - e), 25)
    q = m >> s
    r = m & ((np.int64(1) << s) - 1)
    half = np.int64(1) << (s - 1)
    odd = q & 1
    nz = np.int64(r != 0)
    is_rint = np.int64(rounding == RINT)
    is_round = np.int64(rounding == ROUND)
    is_floor = np.int64(rounding == FLOOR)
    is_ceil = np.int64(rounding == CEIL)
    is_odd = np.int64(rounding == ODD)
    inc = (is_rint & (np.int64(r > half) | (np.int64(r == half) & odd))) | (is_round & np.int64(r >= half)) | (
        is_floor & sign & nz) | (is_ceil & pos & nz) | (is_odd & nz & (1 - odd))
    out = (max(e - emin, 0) << mt) + q + inc
    special = np.int64(E == 0xFF)
    over = np.int64(out >= infbits) & (1 - special)
    # IEEE 754 overflow goes to Inf when rounding away from zero, else to the largest finite
    away = is_rint | is_round | (is_ceil & pos) | (is_floor & sign)
    sat = np.int64(overflow == SATURATION)
    big = infbits - (sat | (1 - away))
    out = out + over * (big - out)
    flush = np.int64(subnormal == FLUSH) & np.int64(out < (np.int64(1) << mt))
    out = out * (1 - flush)
    # Inf / NaN inputs: IEEE in inf_nan; +-max and +0 in saturation
    nan = special & np.int64(F != 0)
    spec = (infbits - sat) | (((1 - sat) & nan) << (mt - 1))
    out = out + special * (spec - out)
    res = ((sign << (mt + expbits)) | out) * (1 - (nan & sat))
    st = over * ST_CONVERSION_OVERFLOW | special * ST_FP_OVERFLOW
    return res, st


@njit(cache=True)
def f64bits_narrow(u, mt, bias, expbits, rounding, overflow, subnormal):
    """bits = cast(float64 bit pattern u) to the (mt, bias, expbits) format in one rounding; returns (bits, status)."""
    u = np.uint64(u)
    sign = np.int64(u >> np.uint64(63))
    E = np.int64((u >> np.uint64(52)) & np.uint64(0x7FF))
    F = np.int64(u & np.uint64(0xFFFFFFFFFFFFF))
    if E == 0x7FF:
        return _special_bits(sign, F != 0, mt, expbits, overflow), ST_FP_OVERFLOW
    if E == 0:
        if F == 0:
            return sign << (mt + expbits), 0
        return narrow_bits(sign, F, -1022, 52, mt, bias, expbits, rounding, overflow, subnormal)
    return narrow_bits(sign, F | (np.int64(1) << 52), E - 1023, 52, mt, bias, expbits, rounding, overflow,
                       subnormal)


# ---------------------------------------------------------------- scalar API (callable from other @njit kernels)

@njit(cache=True)
def fmt16(bf16):
    """(mantissa bits, bias, exponent bits) of bf16 if bf16 else fp16."""
    if bf16:
        return BF16_MT, BF16_BIAS, BF16_EB
    return F16_MT, F16_BIAS, F16_EB


def _scalar_to16(src64):
    """The scalar cast (bits, status) = fp16 (bf16 if bf16) of x under the codes, from float64 (one
    rounding, no double rounding through float32) if src64 else from float32."""
    @njit(cache=True)
    def to16(x, bf16, rounding, overflow, subnormal):
        mt, bias, eb = fmt16(bf16)
        if src64:
            b, st = f64bits_narrow(np.float64(x).view(np.uint64), mt, bias, eb, rounding, overflow, subnormal)
        else:
            b, st = f32bits_narrow(np.float32(x).view(np.uint32), mt, bias, eb, rounding, overflow, subnormal)
        return np.uint16(b), np.int32(st)
    to16.__doc__ = f"""(bits, status) = fp16 (bf16 if bf16) of float{64 if src64 else 32} x under the rounding /
    overflow / subnormal codes{", rounded once" if src64 else ""}."""
    return to16


f32_to_16_bits, f64_to_16_bits = _scalar_to16(False), _scalar_to16(True)


@njit(cache=True)
def f16_bits_to_f32_bits(b, subnormal):
    """float32 bits of the fp16 pattern b (exact; subnormal inputs -> signed zero under flush)."""
    h = np.int64(b) & 0xFFFF
    sign = (h & 0x8000) << 16
    E = (h >> 10) & 0x1F
    F = h & 0x3FF
    normal = ((E + 112) << 23) | (F << 13)
    infnan = 0x7F800000 | (F << 13)
    # a subnormal is F * 2**-24: exact and normal in float32, so no denormal arithmetic
    sub = np.int64(np.float32(np.float32(F) * np.float32(5.960464477539063e-08)).view(np.uint32))
    sub = sub * (1 - np.int64(subnormal == FLUSH))
    is_sub = np.int64(E == 0)
    is_inf = np.int64(E == 0x1F)
    mag = normal + is_inf * (infnan - normal) + is_sub * (sub - normal)
    return np.uint32(sign | mag)


@njit(cache=True)
def bf16_bits_to_f32_bits(b, subnormal):
    """float32 bits of the bf16 pattern b (exact; subnormal inputs -> signed zero under flush)."""
    u = (np.int64(b) & 0xFFFF) << 16
    fl = np.int64(subnormal == FLUSH) & np.int64((u & 0x7F800000) == 0)
    return np.uint32(u & ~(fl * 0x7FFFFFFF))


@njit(cache=True)
def bits16_to_f32(b, bf16, subnormal):
    """float32 value of the 16-bit pattern b: bf16 if bf16 else fp16 (exact)."""
    x = np.int64(bf16_bits_to_f32_bits(b, subnormal))
    y = np.int64(f16_bits_to_f32_bits(b, subnormal))
    k = np.int64(bf16 != 0)
    return np.uint32(y + k * (x - y)).view(np.float32)


@njit(cache=True)
def f16_bits_to_f32(b):
    """float32 value of the fp16 bit pattern b (exact)."""
    return np.uint32(f16_bits_to_f32_bits(b, KEEP)).view(np.float32)


@njit(cache=True)
def bf16_bits_to_f32(b):
    """float32 value of the bf16 bit pattern b (exact)."""
    return np.uint32(bf16_bits_to_f32_bits(b, KEEP)).view(np.float32)


# ---------------------------------------------------------------- array kernels

# Serial spans with the target format as compile-time constants, looping over a whole
# (sliced) array so indices are provably non-negative: LLVM then vectorises them. The
# parallel kernels hand them chunks.

def _narrow_kernel(src64, mt, bias, expbits):
    """The span kernel out[i] = (mt, bias, expbits)-format bits of float64 (src64) or float32 bits src[i],
    the format a compile-time constant; it returns the OR of the statuses."""
    @njit(cache=True)
    def span(src, out, rounding, overflow, subnormal):
        acc = np.int64(0)
        for i in range(src.size):
            if src64:
                b, s = f64bits_narrow(src[i], mt, bias, expbits, rounding, overflow, subnormal)
            else:
                b, s = f32bits_narrow(src[i], mt, bias, expbits, rounding, overflow, subnormal)
            out[i] = b
            acc |= s
        return acc
    return span


_f64_to_f16_span, _f64_to_bf16_span, _f64_to_f32_span = (
    _narrow_kernel(True, *fmt) for fmt in ((F16_MT, F16_BIAS, F16_EB), (BF16_MT, BF16_BIAS, BF16_EB),
                                           (F32_MT, F32_BIAS, F32_EB)))


def _f32_to_f16_kernel(rounding):
    """The span kernel out[i] = fp16(float32 bits src[i]) for one rounding mode (a compile-time constant)."""
    # f32bits_narrow with the mode folded in (a compile-time constant, as the bf16 spans have it) on uint32
    # values: every quantity fits (a 24-bit significand, a shift of at most 25, an exponent offset below
    # 2**18), and every constant is a uint32 so that nothing widens to int64 needlessly. 2^24 values take
    # 49 ms against the generic span's 75 (one core).
    @njit(cache=True)
    def span(src, out, overflow, subnormal):
        zero, one = np.uint32(0), np.uint32(1)
        inf = np.uint32(0x7C00)
        ebias = np.uint32(113)   # float32's biased exponent of fp16's smallest normal binade, 2**-14
        sat = np.uint32(overflow == SATURATION)
        keep = np.uint32(subnormal != FLUSH)
        acc = np.uint32(0)
        for i in range(src.size):
            u = np.uint32(src[i])
            sign = u >> np.uint32(31)
            mag = u & np.uint32(0x7FFFFFFF)
            E = mag >> np.uint32(23)
            m = (mag & np.uint32(0x7FFFFF)) | (np.uint32(E != zero) << np.uint32(23))
            e = max(E, one)
            # down to fp16's quantum: 13 bits for normal results, more below 2**-14, at most 25 (q = 0, r < half)
            s = min(np.uint32(13) + ((ebias - e) if e < ebias else zero), np.uint32(25))
            q = m >> s
            r = m & ((one << s) - one)
            half = one << (s - one)
            nz = np.uint32(r != zero)
            if rounding == RINT:
                inc = np.uint32(r > half) | (np.uint32(r == half) & q & one)
                away = one
            elif rounding == ROUND:
                inc = np.uint32(r >= half)
                away = one
            elif rounding == FLOOR:
                inc = sign & nz
                away = sign
            elif rounding == CEIL:
                inc = (one - sign) & nz
                away = one - sign
            elif rounding == TRUNC:
                inc = zero
                away = zero
            else:  # ODD
                inc = nz & (one - (q & one))
                away = zero
            # q carries the implicit bit for normal results, so a mantissa carry bumps the exponent
            o = (((e - ebias) if e > ebias else zero) << np.uint32(10)) + q + inc
            special = np.uint32(E == np.uint32(0xFF))
            over = np.uint32(o >= inf) & (one - special)
            # IEEE 754 overflow goes to Inf when rounding away from zero, else to the largest finite
            o = (inf - (sat | (one - away))) if over else o
            o = o if (keep | np.uint32(o >= np.uint32(0x400))) else zero
            # Inf / NaN inputs: IEEE (quiet NaN) in inf_nan; +-max and +0 in saturation
            nan = np.uint32(mag > np.uint32(0x7F800000))
            o = ((inf - sat) | (((one - sat) & nan) << np.uint32(9))) if special else o
            res = (sign << np.uint32(15)) | o
            out[i] = np.uint16(zero if (nan & sat) else res)
            acc |= (over * np.uint32(ST_CONVERSION_OVERFLOW)) | (special * np.uint32(ST_FP_OVERFLOW))
        return np.int64(acc)
    return span


_f16_rint, _f16_round, _f16_floor, _f16_ceil, _f16_trunc, _f16_odd = (
    _f32_to_f16_kernel(r) for r in (RINT, ROUND, FLOOR, CEIL, TRUNC, ODD))


@njit(cache=True)
def _f32_to_f16_span(src, out, rounding, overflow, subnormal):
    """out[i] = fp16(float32 bits src[i]); returns the OR of the statuses (f32bits_narrow's bits and status)."""
    if rounding == RINT:
        return _f16_rint(src, out, overflow, subnormal)
    if rounding == ROUND:
        return _f16_round(src, out, overflow, subnormal)
    if rounding == FLOOR:
        return _f16_floor(src, out, overflow, subnormal)
    if rounding == CEIL:
        return _f16_ceil(src, out, overflow, subnormal)
    if rounding == TRUNC:
        return _f16_trunc(src, out, overflow, subnormal)
    return _f16_odd(src, out, overflow, subnormal)


def _f32_to_bf16_kernel(rounding):
    """The span kernel out[i] = bf16(float32 bits src[i]) for one rounding mode (a compile-time constant)."""
    # bf16 keeps float32's exponent range: every finite float32 magnitude rounds at bit 16 (subnormals
    # too), so rounding is one add and shift on the magnitude and the carry runs into the exponent as
    # f32bits_narrow's does. 32-bit lanes and the mode folded in: twice the lanes, a quarter of the work.
    @njit(cache=True)
    def span(src, out, overflow, subnormal):
        one = np.uint32(1)
        sat = np.uint32(overflow == SATURATION)
        keep = np.uint32(subnormal != FLUSH)
        acc = np.uint32(0)
        for i in range(src.size):
            u = np.uint32(src[i])
            sign = u >> np.uint32(31)
            mag = u & np.uint32(0x7FFFFFFF)
            q = mag >> np.uint32(16)
            nz = np.uint32((mag & np.uint32(0xFFFF)) != 0)
            if rounding == RINT:
                o = (mag + np.uint32(0x7FFF) + (q & one)) >> np.uint32(16)
                away = one
            elif rounding == ROUND:
                o = (mag + np.uint32(0x8000)) >> np.uint32(16)
                away = one
            elif rounding == FLOOR:
                o = q + (sign & nz)
                away = sign
            elif rounding == CEIL:
                o = q + ((one - sign) & nz)
                away = one - sign
            elif rounding == TRUNC:
                o = q
                away = np.uint32(0)
            else:  # ODD
                o = q | nz
                away = np.uint32(0)
            special = np.uint32(mag >= np.uint32(0x7F800000))
            over = np.uint32(o >= np.uint32(0x7F80)) & (one - special)
            # IEEE 754 overflow goes to Inf when rounding away from zero, else to the largest finite
            o = (np.uint32(0x7F80) - (sat | (one - away))) if over else o
            o = o if (keep | np.uint32(o >= np.uint32(0x80))) else np.uint32(0)
            # Inf / NaN inputs: IEEE (quiet NaN) in inf_nan; +-max and +0 in saturation
            nan = np.uint32(mag > np.uint32(0x7F800000))
            o = ((np.uint32(0x7F80) - sat) | (((one - sat) & nan) << np.uint32(6))) if special else o
            res = (sign << np.uint32(15)) | o
            out[i] = np.uint16(np.uint32(0) if (nan & sat) else res)
            acc |= (over * np.uint32(ST_CONVERSION_OVERFLOW)) | (special * np.uint32(ST_FP_OVERFLOW))
        return np.int64(acc)
    return span


_bf16_rint, _bf16_round, _bf16_floor, _bf16_ceil, _bf16_trunc, _bf16_odd = (
    _f32_to_bf16_kernel(r) for r in (RINT, ROUND, FLOOR, CEIL, TRUNC, ODD))


@njit(cache=True)
def _f32_to_bf16_span(src, out, rounding, overflow, subnormal):
    """out[i] = bf16(float32 bits src[i]); returns the OR of the statuses (f32bits_narrow's bits and status)."""
    if rounding == RINT:
        return _bf16_rint(src, out, overflow, subnormal)
    if rounding == ROUND:
        return _bf16_round(src, out, overflow, subnormal)
    if rounding == FLOOR:
        return _bf16_floor(src, out, overflow, subnormal)
    if rounding == CEIL:
        return _bf16_ceil(src, out, overflow, subnormal)
    if rounding == TRUNC:
        return _bf16_trunc(src, out, overflow, subnormal)
    return _bf16_odd(src, out, overflow, subnormal)


@njit(cache=True)
def _f32_to_f16_rint_hw_span(src, out, overflow, subnormal):
    """out[i] = fp16 rint of float32 bits src[i] by the hardware conversion; returns the OR of statuses."""
    if subnormal == KEEP:
        # the conversion alone, and one flag: whether any result is Inf or NaN. Without one, the overflow
        # and subnormal codes change nothing and nothing raised a status; with one, the full loop below
        bad = False
        for i in range(src.size):
            b = f32_to_f16_hw(np.uint32(src[i]).view(np.float32))
            out[i] = b
            bad |= (b & 0x7FFF) >= 0x7C00
        if not bad:
            return np.int64(0)
    acc = np.int64(0)
    for i in range(src.size):
        u = np.int64(src[i]) & 0x7FFFFFFF
        special = np.int64(u >= 0x7F800000)
        b, over = finish_f16_hw(f32_to_f16_hw(np.uint32(src[i]).view(np.float32)), special, overflow, subnormal)
        out[i] = np.uint16(b)
        acc |= over * ST_CONVERSION_OVERFLOW | special * ST_FP_OVERFLOW
    return acc


@njit(cache=True)
def _widen_span(src, out, bf16, subnormal):
    """out[i] = float32 bits of the 16-bit pattern src[i] (exact)."""
    if bf16:
        for i in range(src.size):
            out[i] = bf16_bits_to_f32_bits(src[i], subnormal)
    else:
        for i in range(src.size):
            out[i] = f16_bits_to_f32_bits(src[i], subnormal)
    return np.int64(0)


@njit(cache=True)
def _f16_to_f32_hw_span(src, out, subnormal):
    """out[i] = float32 bits of the fp16 pattern src[i] by the CPU's conversion (exact), Inf and NaN patterns
    (a signalling NaN's quiet bit) by f16_bits_to_f32_bits, as _widen_span gives them all."""
    # a 512 x 512 gradient: 179 us by the integer widening (int64 lanes), 40-60 this way (one thread)
    flush = subnormal == FLUSH
    for b0 in range(0, src.size, 256):
        b1 = min(src.size, b0 + 256)
        nbad = np.uint32(0)
        for i in range(np.uintp(b0), np.uintp(b1)):
            b = np.uint16(src[i])
            v = np.float32(f16_to_f32_hw(b)).view(np.uint32)
            e = b & np.uint16(0x7C00)
            out[i] = (v & np.uint32(0x80000000)) if (flush and e == 0) else v
            nbad |= np.uint32(e == np.uint16(0x7C00))
        if nbad != 0:
            for i in range(b0, b1):
                if (src[i] & 0x7C00) == 0x7C00:
                    out[i] = f16_bits_to_f32_bits(src[i], subnormal)
    return np.int64(0)


# One parallel driver for the seven array casts: it runs a span on chunks of _CHUNK elements and ORs
# their statuses. The factory closes over an integer naming the cast (a constant: the other calls are
# pruned before typing), never over a span, so the drivers load from the on-disk cache.
_F32_16, _F32_F16_HW, _F64_16, _F64_F32, _WIDEN, _F32_HF32, _F16_F32_HW = range(7)


def _cast_driver(kind, doc):
    def drive(src, out, *params):
        n = src.size
        nch = (n + _CHUNK - 1) // _CHUNK
        st = np.zeros(nch, dtype=np.int64)
        for c in prange(nch):
            lo = c * _CHUNK
            hi = min(n, lo + _CHUNK)
            x, y = src[lo:hi], out[lo:hi]
            if kind == _F32_16:
                bf16, modes = params[0], params[1:]
                st[c] = _f32_to_bf16_span(x, y, *modes) if bf16 else _f32_to_f16_span(x, y, *modes)
            elif kind == _F64_16:
                bf16, modes = params[0], params[1:]
                st[c] = _f64_to_bf16_span(x, y, *modes) if bf16 else _f64_to_f16_span(x, y, *modes)
            elif kind == _F64_F32:
                st[c] = _f64_to_f32_span(x, y, *params)
            elif kind == _F32_F16_HW:
                st[c] = _f32_to_f16_rint_hw_span(x, y, *params)
            elif kind == _F32_HF32:
                st[c] = hf32_span(x, y, *params)
            elif kind == _F16_F32_HW:
                st[c] = _f16_to_f32_hw_span(x, y, *params)
            else:
                st[c] = _widen_span(x, y, *params)
        return or_all(st)
    drive.__doc__ = doc
    return njit(cache=True, parallel=True)(drive)


cast_f32_to_16 = _cast_driver(_F32_16, """cast_f32_to_16(src, out, bf16, rounding, overflow, subnormal): out[i] = fp16
    (bf16 if bf16) of float32 bits src[i]; returns the OR of all statuses.""")
cast_f32_to_f16_rint_hw = _cast_driver(_F32_F16_HW, """cast_f32_to_f16_rint_hw(src, out, overflow, subnormal): out[i] =
    fp16 rint of float32 bits src[i] (hardware conversion; HW_HALF hosts only); returns the OR of statuses.""")
round_hf32 = _cast_driver(_F32_HF32, """round_hf32(src, out, rounding, overflow, subnormal, mant): out[i] = HF32
    (mant stored significand bits) of float32 bits src[i] as float32 bits (kernels/hf32.py's branch-free span);
    returns the OR of all statuses.""")
cast_f64_to_16 = _cast_driver(_F64_16, """cast_f64_to_16(src, out, bf16, rounding, overflow, subnormal): out[i] = fp16
    (bf16 if bf16) of float64 bits src[i] in one rounding; returns the OR of all statuses.""")
cast_f64_to_f32 = _cast_driver(_F64_F32, """cast_f64_to_f32(src, out, rounding, overflow, subnormal): out[i] = float32
    bits of float64 bits src[i] under the codes; returns the OR of all statuses.""")
cast_f16_to_f32_hw = _cast_driver(_F16_F32_HW, """cast_f16_to_f32_hw(src, out, subnormal): out[i] = float32 bits
    of fp16 bits src[i] by the CPU's conversion (HW_HALF hosts only; cast_16_to_f32's bits); returns 0.""")
cast_16_to_f32 = _cast_driver(_WIDEN, """cast_16_to_f32(src, out, bf16, subnormal): out[i] = float32 bits of fp16 (bf16
    if bf16) bits src[i] (exact); returns 0.""")

#: two of the casts above on one span, without the parallel region: for small arrays, whose work costs less
#: than starting the region (2 us against 0.3 us for 16 values on one thread); the same bits and status
span_f32_to_f16_rint_hw = _f32_to_f16_rint_hw_span
span_16_to_f32 = _widen_span
span_f16_to_f32_hw = _f16_to_f32_hw_span
