"""Fixpipe: the cube's float32 accumulator (L0C) to the output dtype.

A non-finite accumulator raises status 0x400 and, under saturation, becomes the largest
finite value (NaN: 0); the value is then rounded to fp16 or bf16 with RINT, through the CPU's
fp16 conversion where its result is finite (``finish_to_16``'s ``hw``), or an integer shortcut for
normal results (:func:`_fast16`) and fp16 zeros and subnormals (:func:`_tiny16`), and the cast kernel
otherwise.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ..cast import HW_HALF, f32_to_16_bits, f32_to_f16_hw
from ..codes import FLT_MAX, FLUSH, RINT, SATURATION, ST_CUBE_OVERFLOW
from ..parallel import or_all

_CHUNK = 1 << 15
_GRID = 256   # pixels per block of finish_grid


@njit(cache=True)
def _fixpipe_f32(x, saturate):
    """(value, status): a non-finite accumulator raises 0x400; saturation maps Inf -> +-FLT_MAX, NaN -> 0."""
    if np.isfinite(x):
        return x, 0
    if saturate:
        if np.isnan(x):
            return np.float32(0.0), ST_CUBE_OVERFLOW
        return (FLT_MAX if x > 0 else -FLT_MAX), ST_CUBE_OVERFLOW
    return x, ST_CUBE_OVERFLOW


@njit(cache=True, parallel=True)
def finish_f32(acc, saturate, flush):
    """acc[i] = fixpipe(acc[i]) in place, fp32 subnormals -> signed zero under flush; returns the OR of statuses."""
    n = acc.size
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int32)
    bits = acc.view(np.uint32)
    # exponent field all ones (Inf/NaN), or zero with a nonzero fraction (subnormal, only under flush)
    lo = np.uint32(0x00000001) if flush else np.uint32(0x00800000)
    for c in prange(nch):
        s = np.int32(0)
        for b0 in range(c * _CHUNK, min(n, (c + 1) * _CHUNK), 256):
            b1 = min(n, b0 + 256)
            nspecial = 0  # pass 1 (vectorised, read only): anything to do in this block?
            for i in range(np.uintp(b0), np.uintp(b1)):
                a = bits[i] & np.uint32(0x7FFFFFFF)
                nspecial += 1 if (a >= np.uint32(0x7F800000) or (a - lo) < np.uint32(0x00800000 - lo)) else 0
            if nspecial > 0:
                for i in range(b0, b1):
                    v, s1 = _fixpipe_f32(acc[i], saturate)
                    if flush and v != 0 and abs(v) < np.float32(1.1754943508222875e-38):
                        v = np.float32(-0.0) if v < 0 else np.float32(0.0)
                    acc[i] = v
                    s |= s1
        st[c] = s
    return or_all(st)


@njit(cache=True)
def _fast16(u, bf16):
    """(bits, ok): RNE of the float32 bit pattern u to fp16/bf16 by integer addition, ok when the result is normal."""
    a = u & np.uint32(0x7FFFFFFF)
    # ties go to even through the added lsb; the carry out of the mantissa bumps the exponent
    if bf16:
        b = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        ok = (a - np.uint32(0x00800000)) < np.uint32(0x7F7F8000 - 0x00800000)
    else:
        b = (((a - np.uint32(0x38000000)) + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1)))
             >> np.uint32(13)) | ((u >> np.uint32(16)) & np.uint32(0x8000))
        ok = (a - np.uint32(0x38800000)) < np.uint32(0x477FF000 - 0x38800000)
    return np.uint16(b), ok


@njit(cache=True)
def to16(v, bf16, overflow, subnormal):
    """(bits, status) = fp16 (or bf16) rint(float32 v): cast.f32_to_16_bits, with a shortcut for normal results."""
    b, ok = _fast16(np.uint32(np.float32(v).view(np.uint32)), bf16)
    if ok:
        return b, 0
    return f32_to_16_bits(v, bf16, RINT, overflow, subnormal)


@njit(cache=True)
def _tiny16(u, flush):
    """(fp16 bits, tiny) of the float32 bit pattern u: tiny when |u| < 2**-14, the bits then RNE's zero,
    subnormal or 2**-14 (signed; subnormals to a signed zero under ``flush``), as f32_to_16_bits gives them
    with no status; branch-free."""
    a = np.uint32(u & np.uint32(0x7FFFFFFF))
    # |u| + 0.5 in float32 rounds |u| to a multiple of 2**-24 (the fp16 subnormals' step: ulp(0.5)) to nearest
    # even, the multiple landing in the low bits (0x400 when it rounds up to 2**-14)
    m = np.uint32(np.float32(a.view(np.float32) + np.float32(0.5)).view(np.uint32) - np.uint32(0x3F000000))
    m &= np.uint32(0x400) if flush else np.uint32(0x7FF)   # flush: only 2**-14 itself stays
    return np.uint16(m | ((u >> np.uint32(16)) & np.uint32(0x8000))), a < np.uint32(0x38800000)


@njit(cache=True, parallel=True)
def finish_to_16(acc, out, bf16, overflow, subnormal, hw=HW_HALF):
    """out[i] = fp16 (or bf16) bits of fixpipe(acc[i]) rounded RNE; returns the OR of statuses. ``hw``: fp16 by
    the CPU's conversion (cast.HW_HALF hosts; the cast's and the epilogue's fast path) where its result is
    finite, else the integer shortcuts."""
    n = acc.size
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int32)
    sat = overflow == SATURATION
    flush = subnormal == FLUSH
    bits = acc.view(np.uint32)
    for c in prange(nch):
        s = np.int32(0)
        for b0 in range(c * _CHUNK, min(n, (c + 1) * _CHUNK), 256):
            b1 = min(n, b0 + 256)
            # pass 1, branch-free so it vectorises: the CPU's conversion, or the normal-result shortcut and for
            # fp16 the zeros and subnormals too (a ReLU layer's weight gradient: 7% zeros, 0.3% subnormal, spread
            # so that most blocks of 256 went through pass 2 for them: 3.7 ns an element, 0.9 without)
            nbad = 0
            if hw and not bf16:
                # IEEE RNE, subnormals included, Inf exactly where a finite value overflows (finish_f16_hw's
                # rule): every finite result is the cast's; an Inf or NaN one goes through pass 2 (262,144
                # normal values: 240 us by the shortcut, 34 by the conversion, one thread)
                for i in range(np.uintp(b0), np.uintp(b1)):
                    h = f32_to_f16_hw(acc[i])
                    keep = np.uint16(0x8000) if (flush and (h & np.uint16(0x7C00)) == 0) else np.uint16(0xFFFF)
                    out[i] = h & keep
                    nbad += 1 if (h & np.uint16(0x7FFF)) >= np.uint16(0x7C00) else 0
            elif bf16:
                for i in range(np.uintp(b0), np.uintp(b1)):  # unsigned: no wraparound test, so it vectorises
                    b, ok = _fast16(bits[i], True)
                    out[i] = b
                    nbad += 0 if ok else 1
            else:
                for i in range(np.uintp(b0), np.uintp(b1)):
                    b, ok = _fast16(bits[i], False)
                    t, tiny = _tiny16(bits[i], flush)
                    out[i] = t if tiny else b
                    nbad += 0 if (ok or tiny) else 1
            if nbad > 0:  # pass 2: overflow, subnormal and non-finite results through Fixpipe and the cast
                for i in range(b0, b1):
                    b, ok = _fast16(bits[i], bf16)
                    if hw and not bf16:
                        ok = (out[i] & np.uint16(0x7FFF)) < np.uint16(0x7C00)
                    if not ok and (bf16 or (bits[i] & np.uint32(0x7FFFFFFF)) >= np.uint32(0x38800000)):
                        v, s1 = _fixpipe_f32(acc[i], sat)
                        b, s2 = to16(v, bf16, overflow, subnormal)
                        out[i] = b
                        s |= s1 | s2
        st[c] = s
    return or_all(st)


def _convert_block(acc, abits, j0, nb, buf, bf16, overflow, sat, subnormal):
    """buf[c*_GRID + j] = the Fixpipe conversion of acc[c, j0 + j] for j < nb (C = acc.shape[0]); returns the OR
    of statuses. uint16 ``buf``: :func:`finish_to_16`'s elements; float32: :func:`finish_f32`'s (an overload)."""
    raise NotImplementedError("_convert_block is for Numba kernels")


@overload(_convert_block)
def _convert_block_impl(acc, abits, j0, nb, buf, bf16, overflow, sat, subnormal):
    if buf.dtype == types.uint16:
        def block16(acc, abits, j0, nb, buf, bf16, overflow, sat, subnormal):
            C, R = acc.shape
            af = abits.reshape(-1)
            nbad = 0  # pass 1: the normal-result shortcut everywhere, as finish_to_16's
            for c in range(C):
                a0 = np.uintp(c * R + j0)
                b0 = np.uintp(c * _GRID)
                for j in range(np.uintp(nb)):  # unsigned: no wraparound test, so it vectorises
                    b, ok = _fast16(af[a0 + j], bf16)
                    buf[b0 + j] = b
                    nbad += 0 if ok else 1
            s = 0
            if nbad > 0:  # pass 2: the rest through Fixpipe and the cast
                for c in range(C):
                    for j in range(nb):
                        b, ok = _fast16(abits[c, j0 + j], bf16)
                        if not ok:
                            v, s1 = _fixpipe_f32(acc[c, j0 + j], sat)
                            b, s2 = to16(v, bf16, overflow, subnormal)
                            buf[c * _GRID + j] = b
                            s |= s1 | s2
            return s
        return block16

    def block32(acc, abits, j0, nb, buf, bf16, overflow, sat, subnormal):
        C = acc.shape[0]
        s = 0
        for c in range(C):
            for j in range(nb):
                v, s1 = _fixpipe_f32(acc[c, j0 + j], sat)
                if subnormal == FLUSH and v != 0 and abs(v) < np.float32(1.1754943508222875e-38):
                    v = np.float32(-0.0) if v < 0 else np.float32(0.0)
                buf[c * _GRID + j] = v
                s |= s1
        return s
    return block32


@njit(cache=True, parallel=True)
def finish_grid(accT, out, r0, rows, Hc, Wc, H, W, oy, ox, sy, sx, bf16, overflow, subnormal):
    """Fixpipe of a transposed product straight into NHWC: for grid pixel p = r0 + j = (n*Hc + i)*Wc + m,
    j < rows, out[n, oy + sy*i, ox + sx*m, c] = the conversion of accT[c, j] as :func:`finish_to_16`
    (uint16 ``out``: fp16 or bf16 bits, ``subnormal`` the cast's code) or :func:`finish_f32` (float32
    ``out``; flush if ``subnormal`` is the flush code) converts each element; returns the OR of statuses."""
    C = accT.shape[0]
    nblk = (rows + _GRID - 1) // _GRID
    st = np.zeros(nblk, dtype=np.int32)
    sat = overflow == SATURATION
    of = out.reshape(-1)
    abits = accT.view(np.uint32)
    for b in prange(nblk):
        j0 = b * _GRID
        nb = min(rows, j0 + _GRID) - j0
        buf = np.empty(_GRID * C, dtype=of.dtype)   # the block, channel by channel
        st[b] = _convert_block(accT, abits, j0, nb, buf, bf16, overflow, sat, subnormal)
        p = r0 + j0   # the block's first pixel as (g, m) = (n*Hc + i, m), then stepped along
        g = p // Wc
        m = p % Wc
        row = ((g // Hc) * H + oy + sy * (g % Hc)) * W + ox   # out's pixel (n, oy + sy*i, ox)
        for j in range(nb):  # each pixel's C channels to its place in out
            d = np.uintp((row + sx * m) * C)
            for c in range(np.uintp(C)):
                of[d + c] = buf[c * _GRID + j]
            m += 1
            if m == Wc:
                m = 0
                g += 1
                row = ((g // Hc) * H + oy + sy * (g % Hc)) * W + ox
    return or_all(st)


@njit(cache=True, parallel=True)
def finish_grid_rows(acc, out, Hc, Wc, H, W, oy, ox, sy, sx, bf16, overflow, subnormal):
    """:func:`finish_grid` of a product stored pixel by pixel: acc (rows, C) float32, pixel p = (n*Hc + i)*Wc + m
    to out[n, oy + sy*i, ox + sx*m, :], each element converted as finish_grid converts it; returns the OR of
    statuses."""
    rows, C = acc.shape
    nblk = (rows + _GRID - 1) // _GRID
    st = np.zeros(nblk, dtype=np.int32)
    sat = overflow == SATURATION
    of = out.reshape(-1)
    flat = acc.reshape(1, rows * C)   # one "channel" of all the values: _convert_block's element by element
    fbits = flat.view(np.uint32)
    for b in prange(nblk):
        j0 = b * _GRID
        nb = min(rows, j0 + _GRID) - j0
        buf = np.empty(_GRID * C, dtype=of.dtype)   # the block, pixel by pixel
        st[b] = _convert_block(flat, fbits, j0 * C, nb * C, buf, bf16, overflow, sat, subnormal)
        g = j0 // Wc
        m = j0 % Wc
        row = ((g // Hc) * H + oy + sy * (g % Hc)) * W + ox
        for j in range(nb):  # each pixel's C channels to its place in out
            d = np.uintp((row + sx * m) * C)
            s0 = np.uintp(j * C)
            for c in range(np.uintp(C)):
                of[d + c] = buf[s0 + c]
            m += 1
            if m == Wc:
                m = 0
                g += 1
                row = ((g // Hc) * H + oy + sy * (g % Hc)) * W + ox
    return or_all(st)
