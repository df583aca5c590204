"""Convolution on the cube: im2col lowering to the matmul kernels, and the direct depthwise kernel.

:func:`im2col`, :func:`im2col_t` and :func:`im2col_packed` write the patch matrix in the
layouts of the matmul kernels (row-major, transposed, and :func:`.tree16.pack_b`'s
slabs); the K order of a patch is fixed by ``koff`` (``ascend_emu.numerics.conv._k_offsets``).
:func:`depthwise_tree16` sums each channel's taps by the tree16 of the default model.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from numba import types
from numba.extending import overload

from ..cast import HW_HALF, _widen_span, span_f16_to_f32_hw
from ..codes import FLUSH
from .tree16 import NC, _tail_columns, tree16


def operand_value(xf, i, bf16, subnormal):
    """xf[i] as the float32 operand value: a float32 array's element itself, or the exact widening of a
    uint16 array's 16-bit pattern (bf16 if bf16; subnormals -> signed zero under the flush code), as
    :func:`.operands.widen_operands` gives it. Compiled per array type (numba overload)."""
    raise NotImplementedError("operand_value is for Numba kernels")


@njit(cache=True)
def widen_bits(b, bf16, subnormal):
    """float32 value of the 16-bit pattern b (bf16 if bf16, else fp16; subnormals -> signed zero under the
    flush code): ``cast.bits16_to_f32``'s value, in uint32 arithmetic and selects so that loops vectorise."""
    h = np.uint32(b)
    a = h & np.uint32(0x7FFF)
    sign = (h ^ a) << np.uint32(16)
    flush = subnormal == FLUSH
    if bf16:
        r = a << np.uint32(16)
        r = np.uint32(0) if (flush and a < np.uint32(0x80)) else r
    else:
        # normal: exponent rebiased by 112; Inf / NaN (exponent 31) by 224 more, to 255
        r = (a << np.uint32(13)) + np.uint32(0x38000000)
        r = r + np.uint32(0x38000000) if a >= np.uint32(0x7C00) else r
        # subnormal (and zero): a * 2**-24, exact and normal in float32
        sub = np.float32(np.float32(np.int32(a)) * np.float32(5.960464477539063e-08)).view(np.uint32)
        r = (np.uint32(0) if flush else sub) if a < np.uint32(0x400) else r
    return np.uint32(sign | r).view(np.float32)


@overload(operand_value)
def _operand_value(xf, i, bf16, subnormal):
    if xf.dtype == types.uint16:
        def widen(xf, i, bf16, subnormal):
            return widen_bits(xf[i], bf16, subnormal)
        return widen
    return lambda xf, i, bf16, subnormal: xf[i]


@njit(cache=True, parallel=True)
def im2col(xp, koff, sh, sw, OH, OW, r0, out, bf16=False, subnormal=0):
    """out[r - r0, k] = xp.flat[offset of pixel (n, oh*sh, ow*sw, 0) + koff[k]], r = (n*OH + oh)*OW + ow; rest 0.
    A uint16 xp holds the 16-bit operands' bits, widened on the way (:func:`operand_value`). Returns how
    many of the values read are NaN."""
    # koff (column k -> flat offset of its tap and channel) fixes the K order: see ascend_emu.numerics.conv._k_offsets
    rows, Kp = out.shape
    K = koff.size
    po = pixel_offsets(xp, sh, sw, OH, OW, r0, rows)
    xf = xp.reshape(-1)
    nans = 0
    for rr in prange(rows):
        base = po[rr]
        m = 0
        for k in range(K):
            v = operand_value(xf, base + koff[k], bf16, subnormal)
            out[rr, k] = v
            m += 1 if v != v else 0
        for k in range(K, Kp):  # K padding: +0 products in the last block
            out[rr, k] = np.float32(0.0)
        nans += m
    return nans


@njit(cache=True, parallel=True)
def pixel_offsets(xp, sh, sw, OH, OW, r0, rows):
    """po[rr] = flat offset in xp of pixel (n, oh*sh, ow*sw, 0) for r = r0 + rr = (n*OH + oh)*OW + ow."""
    _, Hp, Wp, C = xp.shape
    po = np.empty(rows, dtype=np.uintp)
    for rr in prange(rows):
        r = r0 + rr
        n = r // (OH * OW)
        po[rr] = ((n * Hp + ((r // OW) % OH) * sh) * Wp + (r % OW) * sw) * C
    return po


def _nan_in(x, k0, k1, bits16):
    """Whether x[k0:k1] holds a NaN (x and ``bits16`` as :func:`has_nan`'s): the largest magnitude (the bits
    without the sign) above Inf's, by a max reduction in x's own lane width, which vectorises (an OR of per-element
    tests did not: 4-5x slower). Compiled per array type (numba overload)."""
    raise NotImplementedError("_nan_in is for Numba kernels")


@overload(_nan_in)
def _nan_in_impl(x, k0, k1, bits16):
    if x.dtype == types.float32:
        def f32(x, k0, k1, bits16):
            b = x.view(np.uint32)
            m = np.uint32(0)
            for k in range(np.uintp(k0), np.uintp(k1)):
                m = max(m, np.uint32(b[k] & np.uint32(0x7FFFFFFF)))
            return m > np.uint32(0x7F800000)
        return f32

    def bits(x, k0, k1, bits16):
        m = np.uint16(0)
        for k in range(np.uintp(k0), np.uintp(k1)):
            m = max(m, np.uint16(x[k] & np.uint16(0x7FFF)))
        return m > np.uint16(0x7C00 if bits16 == 1 else 0x7F80)
    return bits


#: has_nan tests arrays of at most this many elements on the calling thread (no parallel launch: the CNN's
#: activations, 0.1-0.5M elements, take 2-18 us so), larger ones in parallel slices of this size
_NAN_SERIAL = 1 << 21


@njit(cache=True, parallel=True)
def has_nan(x, bits16=0):
    """Whether the 1-D array x holds a NaN: float32 values, or (``bits16`` 1: fp16, 2: bf16) the bits of a
    uint16 array (only these two: a float64 array does not compile)."""
    n = x.size
    if n <= _NAN_SERIAL:
        return _nan_in(x, 0, n, bits16)
    nw = (n + _NAN_SERIAL - 1) // _NAN_SERIAL
    found = np.zeros(nw, dtype=np.uint8)
    for w in prange(nw):
        found[w] = _nan_in(x, w * _NAN_SERIAL, min(n, (w + 1) * _NAN_SERIAL), bits16)
    return found.any()


@njit(cache=True, parallel=True)
def im2col_t(xp, koff, sh, sw, OH, OW, r0, out):
    """im2col(...) transposed: out[k, r - r0] (K rows, pixels as columns)."""
    Kp, rows = out.shape
    K = koff.size
    po = pixel_offsets(xp, sh, sw, OH, OW, r0, rows)
    xf = xp.reshape(-1)
    for k in prange(Kp):
        if k < K:
            to = koff[k]
            for rr in range(np.uintp(rows)):
                out[k, rr] = xf[po[rr] + to]
        else:  # K padding: +0 products in the last block
            for rr in range(np.uintp(rows)):
                out[k, rr] = np.float32(0.0)


@njit(cache=True, parallel=True)
def im2col_packed(xp, koff, sh, sw, OH, OW, r0, rows, Bp, bf16=False, subnormal=0):
    """im2col_t(...) in pack_b's layout: Bp[0, jt, q, l, j] = column 16q + l of pixel r0 + jt*NC + j (+0 past K).
    A uint16 xp holds the 16-bit operands' bits, widened on the way (:func:`operand_value`)."""
    _, njt, nkb, _, Wd = Bp.shape
    K = koff.size
    po = pixel_offsets(xp, sh, sw, OH, OW, r0, rows)
    xf = xp.reshape(-1)
    bf = Bp.reshape(-1)
    for w in prange(njt * nkb):
        jt = w // nkb
        q = w % nkb
        j0 = np.uintp(jt * NC)
        jn = min(rows, jt * NC + NC) - jt * NC
        # slab row by slab row: contiguous writes, each a gather along the tile's pixels (2.5x faster than
        # pixel by pixel for a 3-channel input, as fast for 16 channels)
        for l in range(16):
            k = 16 * q + l
            d = np.uintp(((jt * nkb + q) * 16 + l) * Wd)
            if k < K:
                o = koff[k]
                for j in range(np.uintp(jn)):
                    bf[d + j] = operand_value(xf, po[j0 + j] + o, bf16, subnormal)
            else:  # K padding: +0 products in the last block
                for j in range(np.uintp(jn)):
                    bf[d + j] = np.float32(0.0)
            for j in range(np.uintp(jn), np.uintp(_tail_columns(jn))):  # +0 up to the 2x2 block edge, as pack_b
                bf[d + j] = np.float32(0.0)


@njit(cache=True)
def _widen_row(src, out, bf16, subnormal, hw):
    """out[i] = float32 bits of the 16-bit pattern src[i] (exact): fp16 by the CPU's conversion where ``hw``
    (cast.HW_HALF hosts; Inf and NaN patterns by the exact widening: the same bits), else the integer widening."""
    if hw and not bf16:
        span_f16_to_f32_hw(src, out, subnormal)
    else:
        _widen_span(src, out, bf16, subnormal)


@njit(cache=True, parallel=True)
def widen_padded(bits, out, pt, pl, bf16, subnormal, hw=HW_HALF):
    """out[n, pt + h, pl + w, c] = float32 bits of the 16-bit pattern bits[n, h, w, c] (exact; subnormals
    as cast's code says); every other element of out (the padding: rows, columns, channels) +0. ``hw``: fp16
    by the CPU's conversion (as widen_operands; the CNN's 16-channel activations ~20% faster: the float32 writes
    bound it)."""
    N, H, W, C = bits.shape
    _, Hp, Wp, Cp = out.shape
    for t in prange(N * Hp):
        n = t // Hp
        y = t % Hp - pt
        row = out[n, t % Hp].reshape(-1)
        if y < 0 or y >= H:
            row[:] = 0
            continue
        row[:pl * Cp] = 0
        row[(pl + W) * Cp:] = 0
        src = bits[n, y]
        if Cp == C:  # one contiguous span
            _widen_row(src.reshape(-1), row[pl * Cp:(pl + W) * Cp], bf16, subnormal, hw)
        else:
            for x in range(W):
                o = (pl + x) * Cp
                _widen_row(src[x], row[o:o + C], bf16, subnormal, hw)
                row[o + C:o + Cp] = 0


@njit(cache=True, parallel=True)
def dw_im2col_t(xp, KH, KW, sh, sw, dh, dw, OH, OW, r0, out):
    """out[c, kh*KW + kw, r - r0] = xp[n, oh*sh + kh*dh, ow*sw + kw*dw, c], r = (n*OH + oh)*OW + ow; rest 0."""
    C, Kp, rows = out.shape
    K = KH * KW
    for q in prange((rows + 15) // 16):
        for rr in range(q * 16, min(rows, q * 16 + 16)):
            r = r0 + rr
            n = r // (OH * OW)
            oh = (r // OW) % OH
            ow = r % OW
            for kk in range(K):
                y = oh * sh + (kk // KW) * dh
                x = ow * sw + (kk % KW) * dw
                for c in range(C):
                    out[c, kk, rr] = xp[n, y, x, c]
            for kk in range(K, Kp):
                for c in range(C):
                    out[c, kk, rr] = np.float32(0.0)


@njit(cache=True)
def _dw_tree9(of, ob, xf, o0, o1, o2, o3, o4, o5, o6, o7, o8, wf, k0, CM):
    """_dw_tree16 (mult 1) of a block whose taps 9..15 are the +0 padding (the last block of a 3x3 or 5x5 filter):
    tree16 with seven +0 products is the first eight's tree plus fl(p8 + +0), since a subtree of +0 products
    is +0 and x + +0 is x except -0 + +0 = +0; the same bits with 9 products of the 16."""
    for ch in range(np.uintp(CM)):
        s = ((((xf[o0 + ch] * wf[k0, ch] + xf[o1 + ch] * wf[k0 + 1, ch])
               + (xf[o2 + ch] * wf[k0 + 2, ch] + xf[o3 + ch] * wf[k0 + 3, ch]))
              + ((xf[o4 + ch] * wf[k0 + 4, ch] + xf[o5 + ch] * wf[k0 + 5, ch])
                 + (xf[o6 + ch] * wf[k0 + 6, ch] + xf[o7 + ch] * wf[k0 + 7, ch])))
             + (xf[o8 + ch] * wf[k0 + 8, ch] + np.float32(0.0)))
        of[ob + ch] = of[ob + ch] + s


@njit(cache=True)
def _dw_tree16(of, ob, xf, o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15,
               wf, k0, CM, mult):
    """of[ob + ch] += tree16(xf[o_l + ch // mult] for l < 16, wf[k0 + l, ch] for l < 16) for every channel ch."""
    if mult == 1:
        for ch in range(np.uintp(CM)):
            s = tree16(xf[o0 + ch], xf[o1 + ch], xf[o2 + ch], xf[o3 + ch], xf[o4 + ch], xf[o5 + ch], xf[o6 + ch],
                       xf[o7 + ch], xf[o8 + ch], xf[o9 + ch], xf[o10 + ch], xf[o11 + ch], xf[o12 + ch],
                       xf[o13 + ch], xf[o14 + ch], xf[o15 + ch],
                       wf[k0, ch], wf[k0 + 1, ch], wf[k0 + 2, ch], wf[k0 + 3, ch], wf[k0 + 4, ch], wf[k0 + 5, ch],
                       wf[k0 + 6, ch], wf[k0 + 7, ch], wf[k0 + 8, ch], wf[k0 + 9, ch], wf[k0 + 10, ch],
                       wf[k0 + 11, ch], wf[k0 + 12, ch], wf[k0 + 13, ch], wf[k0 + 14, ch], wf[k0 + 15, ch])
            of[ob + ch] = of[ob + ch] + s
    else:
        um = np.uintp(mult)
        for ch in range(np.uintp(CM)):
            c = ch // um
            s = tree16(xf[o0 + c], xf[o1 + c], xf[o2 + c], xf[o3 + c], xf[o4 + c], xf[o5 + c], xf[o6 + c],
                       xf[o7 + c], xf[o8 + c], xf[o9 + c], xf[o10 + c], xf[o11 + c], xf[o12 + c], xf[o13 + c],
                       xf[o14 + c], xf[o15 + c],
                       wf[k0, ch], wf[k0 + 1, ch], wf[k0 + 2, ch], wf[k0 + 3, ch], wf[k0 + 4, ch], wf[k0 + 5, ch],
                       wf[k0 + 6, ch], wf[k0 + 7, ch], wf[k0 + 8, ch], wf[k0 + 9, ch], wf[k0 + 10, ch],
                       wf[k0 + 11, ch], wf[k0 + 12, ch], wf[k0 + 13, ch], wf[k0 + 14, ch], wf[k0 + 15, ch])
            of[ob + ch] = of[ob + ch] + s


@njit(cache=True, parallel=True)
def depthwise_tree16(xp, wf, mult, bias, out, sh, sw, dh, dw, KH, KW):
    """out[n,y,x,c*mult+m] = bias += tree16 per 16-tap block of xp[n,y*sh+kh*dh,x*sw+kw*dw,c] * wf[kh*KW+kw,c*mult+m]."""
    # Taps past K (the partial last block) read the +0 pixel xp[n, Hp-1, 0] (a zero row the wrapper
    # appends) times a +0 weight row (wf is padded to a multiple of 16 rows): +0 products, as in
    # the matmul kernel; a last block of 9 taps (3x3, 5x5) skips its seven +0 products (_dw_tree9, the
    # same bits: measured 2.0-2.5x faster on MobileNetV2's depthwise shapes, 2 threads, AVX2).
    # Flat offsets keep slicing (an atomic refcount per view) out of the loops.
    N, Hp, Wp, C = xp.shape
    _, OH, OW, CM = out.shape
    K = KH * KW
    nkb = wf.shape[0] // 16
    xf = xp.reshape(-1)
    of = out.reshape(-1)
    for w in prange(N * OH):
        n = w // OH
        y = w % OH
        o = np.empty(16, dtype=np.uintp)
        for x in range(OW):
            ob = np.uintp(((n * OH + y) * OW + x) * CM)
            for ch in range(np.uintp(CM)):
                of[ob + ch] = bias[0, ch]
            for q in range(nkb):
                for l in range(16):
                    kk = 16 * q + l
                    if kk < K:
                        o[l] = ((n * Hp + y * sh + (kk // KW) * dh) * Wp + x * sw + (kk % KW) * dw) * C
                    else:
                        o[l] = ((n * Hp + Hp - 1) * Wp) * C
                if mult == 1 and K - 16 * q == 9:
                    _dw_tree9(of, ob, xf, o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], wf, 16 * q, CM)
                else:
                    _dw_tree16(of, ob, xf, o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9], o[10],
                               o[11], o[12], o[13], o[14], o[15], wf, 16 * q, CM, mult)


# ------------------------------------------------------------------------------ backprop convolutions

@njit(cache=True, parallel=True)
def patch_rows_packed(xp, koff, sh, sw, OH, OW, n0, rows, Bp):
    """Bp[0, jt, q, l, j] = xp.flat[offset of pixel (n0 + n, oh*sh, ow*sw, 0) + koff[jt*NC + j]] for the output
    pixel 16q + l = (n*OH + oh)*OW + ow < rows; +0 in the K padding rows and up to the 2x2 block edge."""
    # The im2col matrix of a weight gradient (pixels as K, taps x channels as columns) written straight
    # into pack_b's slab layout: with one column tile the slabs are a row-major (Kp, slab width) matrix.
    _, Hp, Wp, C = xp.shape
    _, njt, nkb, _, Wd = Bp.shape
    Kc = koff.size
    xf = xp.reshape(-1)
    bf = Bp.reshape(-1)
    tile = np.uintp(nkb * 16 * Wd)  # floats between column tiles
    for q in prange(nkb):
        # pixel 16q as (n, oh, ow), then stepped along: one set of divisions per 16 rows
        n = n0 + (16 * q) // (OH * OW)
        oh = ((16 * q) // OW) % OH
        ow = (16 * q) % OW
        for l in range(16):
            r = 16 * q + l
            row = np.uintp((q * 16 + l) * Wd)
            base = np.uintp(((n * Hp + oh * sh) * Wp + ow * sw) * C) if r < rows else np.uintp(0)
            ow += 1
            if ow == OW:
                ow = 0
                oh += 1
                if oh == OH:
                    oh = 0
                    n += 1
            for jt in range(njt):
                j0 = jt * NC
                jn = min(Kc, j0 + NC) - j0
                d = np.uintp(jt) * tile + row
                if r < rows:
                    for j in range(np.uintp(jn)):
                        bf[d + j] = xf[base + koff[j0 + j]]
                else:  # K padding: a +0 pixel
                    for j in range(np.uintp(jn)):
                        bf[d + j] = np.float32(0.0)
                for j in range(np.uintp(jn), np.uintp(_tail_columns(jn))):  # +0 to the 2x2 block edge, as pack_b
                    bf[d + j] = np.float32(0.0)


@njit(cache=True, parallel=True)
def rows_transposed(src, r0, rows, out, bf16=False, subnormal=0):
    """out[c, r] = src[r0 + r, c] for r < rows, +0 for rows <= r < out.shape[1] (the K padding).
    A uint16 src holds the 16-bit operands' bits, widened on the way (:func:`operand_value`)."""
    # the cube's A operand of a weight gradient: the output gradient's channels as rows, pixels as K
    CO, Kp = out.shape
    nb = (Kp + 127) // 128
    per = 8   # blocks of 128 rows per work item (one scratch block each)
    sf = src.reshape(-1)
    of = out.reshape(-1)
    for w in prange((nb + per - 1) // per):
        blk = np.empty(128 * CO, dtype=np.float32)   # a block's rows of src as operand values, contiguous
        for b in range(w * per, min(nb, (w + 1) * per)):
            lo = b * 128
            hi = min(Kp, lo + 128)
            n = max(0, min(rows, hi) - lo)
            s0 = np.uintp((r0 + lo) * CO)
            for i in range(np.uintp(n * CO)):
                blk[i] = operand_value(sf, s0 + i, bf16, subnormal)
            for c in range(np.uintp(CO)):
                d = c * np.uintp(Kp) + np.uintp(lo)
                for r in range(np.uintp(n)):
                    of[d + r] = blk[r * np.uintp(CO) + c]
                for r in range(np.uintp(n), np.uintp(hi - lo)):
                    of[d + r] = np.float32(0.0)


@njit(cache=True, parallel=True)
def planar_padded(src, out, pt, pl):
    """out[n, c, pt + h, pl + w] = src[n, h, w, c] (NHWC to planar, same dtype: 16-bit bits or float32);
    every other element of out (the padding rows and columns, and channels past src's) is 0."""
    N, H, W, C = src.shape
    _, Cp, Hp, Wp = out.shape
    for n in prange(N):
        o = out[n].reshape(-1)
        o[:] = 0
        s = src[n].reshape(-1)
        for h in range(H):
            for x in range(W):
                d = np.uintp((pt + h) * Wp + pl + x)
                b = np.uintp((h * W + x) * C)
                for c in range(np.uintp(C)):
                    o[d + c * np.uintp(Hp * Wp)] = s[b + c]


@njit(cache=True, parallel=True)
def planar_widened(src, out, pt, pl, bf16=False, subnormal=0):
    """planar_padded into a float32 ``out`` from 16-bit bits (or float32 values) ``src``: out[n, c, pt + h, pl + w]
    = the operand value of src[n, h, w, c] (:func:`operand_value`), every other element +0."""
    N, H, W, C = src.shape
    _, Cp, Hp, Wp = out.shape
    plane = np.uintp(Hp * Wp)
    if C >= 8:
        for n in prange(N):
            o = out[n].reshape(-1)
            o[:] = 0
            s = src[n].reshape(-1)
            for h in range(H):
                for x in range(W):
                    d = np.uintp((pt + h) * Wp + pl + x)
                    b = np.uintp((h * W + x) * C)
                    for c in range(np.uintp(C)):
                        o[d + c * np.uintp(Hp * Wp)] = operand_value(s, b + c, bf16, subnormal)
        return
    # a few channels (an RGB input): the loop above stores C values a plane apart per pixel and widens them one by
    # one. Here each input row is widened in one contiguous pass into a row buffer, then spread over the planes a
    # channel at a time along the plane's row; only the padding is zeroed, each element written once (the CNN's
    # 3 -> 16 input: 182 -> 75 us; at 32 channels the loop above measured faster: benchmarks/RESULTS.md session 20)
    WC = W * C
    for n in prange(N):
        o = out[n].reshape(-1)
        s = src[n].reshape(-1)
        buf = np.empty(WC, dtype=np.float32)
        for i in range(np.uintp(C) * plane, np.uintp(Cp) * plane):   # the channels past src's
            o[i] = 0
        for c in range(np.uintp(C)):
            p0 = c * plane
            for i in range(p0, p0 + np.uintp(pt * Wp)):
                o[i] = 0
            for i in range(p0 + np.uintp((pt + H) * Wp), p0 + plane):
                o[i] = 0
            for h in range(np.uintp(H)):
                r = p0 + (np.uintp(pt) + h) * np.uintp(Wp)
                for x in range(np.uintp(pl)):
                    o[r + x] = 0
                for x in range(np.uintp(pl + W), np.uintp(Wp)):
                    o[r + x] = 0
        for h in range(H):
            b = np.uintp(h * WC)
            for j in range(np.uintp(WC)):
                buf[j] = operand_value(s, b + j, bf16, subnormal)
            d = np.uintp((pt + h) * Wp + pl)
            for c in range(np.uintp(C)):
                r = d + c * plane
                for x in range(np.uintp(W)):
                    o[r + x] = buf[x * np.uintp(C) + c]


@njit(cache=True, parallel=True)
def dx_class_packed(dyp, koff, Hc, Wc, r0, rows, Bp, bf16=False, subnormal=0):
    """The patches of one pixel class of an input gradient in pack_b's layout: Bp[0, jt, q, l, j] =
    dyp.flat[base(p) + koff[16q + l]] for the grid pixel p = r0 + jt*NC + j = (n*Hc + i)*Wc + m < r0 + rows,
    base(p) = n*plane + i*Wp + m (plane = C*Hp*Wp of the planar padded dyp (N, C, Hp, Wp)); +0 where
    koff < 0 or past K, and up to the 2x2 block edge. A uint16 dyp holds the 16-bit operands' bits,
    widened on the way (:func:`operand_value`)."""
    # Within a class (y mod sh, x mod sw) every tap reads dy at a fixed offset from the pixel's
    # (i, m): a stride-1 gather, so a grid row of the tile is one contiguous run of dy's row
    N, C, Hp, Wp = dyp.shape
    _, njt, nkb, _, Wd = Bp.shape
    K = koff.size
    plane = C * Hp * Wp
    bf = Bp.reshape(-1)
    df = dyp.reshape(-1)
    for w in prange(njt * nkb):
        jt = w // nkb
        q = w % nkb
        p0 = r0 + jt * NC
        jn = min(r0 + rows, p0 + NC) - p0
        # the tile's pixels as runs along grid rows: (source offset of the first, first column j, length)
        runs = np.empty((jn // Wc + 2, 3), dtype=np.int64)
        nrun = 0
        p = p0
        while p < p0 + jn:
            m0 = p % Wc
            run = min(Wc - m0, p0 + jn - p)
            g = p // Wc
            runs[nrun, 0] = (g // Hc) * plane + (g % Hc) * Wp + m0
            runs[nrun, 1] = p - p0
            runs[nrun, 2] = run
            nrun += 1
            p += run
        for l in range(16):
            k = 16 * q + l
            d = np.uintp(((jt * nkb + q) * 16 + l) * Wd)
            if k >= K or koff[k] < 0:  # K padding, padded channels, taps between dy's pixels: +0
                for j in range(np.uintp(_tail_columns(jn))):
                    bf[d + j] = np.float32(0.0)
                continue
            o = koff[k]
            for r in range(nrun):
                s = np.uintp(runs[r, 0] + o)
                t = d + np.uintp(runs[r, 1])
                for j in range(np.uintp(runs[r, 2])):
                    bf[t + j] = operand_value(df, s + j, bf16, subnormal)
            for j in range(np.uintp(jn), np.uintp(_tail_columns(jn))):
                bf[d + j] = np.float32(0.0)
