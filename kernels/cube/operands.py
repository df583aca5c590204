"""Cube operands: values rounded to the operand dtype (fp16 or bf16) as float32, or widened from it (and packed
into the fast kernel's slabs straight from a strided 16-bit view: :func:`pack_b16`).

The cube multiplies operands held in the 16-bit format; the kernels take them as float32
arrays holding those values exactly. Rounding is RINT under the cast's overflow and
subnormal codes, one rounding from float32 or from float64.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..cast import HW_HALF, bf16_bits_to_f32, f16_bits_to_f32, f32_to_16_bits, f64_to_16_bits, span_f16_to_f32_hw
from ..codes import FLUSH, KEEP, RINT
from ..parallel import or_all
from .fixpipe import _CHUNK, _fast16
from .tree16 import _slab_item, _tail_columns


@njit(cache=True)
def _widen16(b, bf16):
    """float32 value of the 16-bit pattern b (exact)."""
    return bf16_bits_to_f32(b) if bf16 else f16_bits_to_f32(b)


@njit(cache=True)
def _normal16_f32bits(b, bf16):
    """float32 bit pattern of the normal finite fp16/bf16 pattern b (exact)."""
    b = np.uint32(b)
    if bf16:
        return b << np.uint32(16)
    return ((((b & np.uint32(0x7FFF)) << np.uint32(13)) + np.uint32(0x38000000))
            | ((b & np.uint32(0x8000)) << np.uint32(16)))


@njit(cache=True, parallel=True)
def widen_operands(bits, out, bf16, flush, hw=HW_HALF):
    """out[i] = float32 bits of the 16-bit pattern bits[i] (exact; subnormals -> signed zero under flush).
    ``hw``: fp16 by the CPU's conversion (cast.HW_HALF hosts), Inf and NaN patterns then exactly as without."""
    # the format chosen once, outside the parallel loop, each loop body written out in it: chosen per block
    # inside (or the block a function call), pass 1 did not vectorise (a fp16 512 x 512 weight 192 us, this
    # way 129 us, one thread)
    n = bits.size
    nch = (n + _CHUNK - 1) // _CHUNK
    keep = np.uint32(0 if flush else 1)
    if bf16:
        for c in prange(nch):
            for i in range(np.uintp(c * _CHUNK), np.uintp(min(n, (c + 1) * _CHUNK))):
                b = np.uint32(bits[i])
                sub = (b & np.uint32(0x7F80)) == 0 and (b & np.uint32(0x7F)) != 0
                out[i] = (b & np.uint32(0x8000)) << np.uint32(16) if (sub and flush) else b << np.uint32(16)
        return
    if hw:
        # cast's span by the CPU's conversion, per chunk: exact for every finite fp16 pattern, subnormals too (a
        # 512 x 512 weight 129 -> 31 us, one thread); Inf and NaN (a signalling NaN's quiet bit) by the exact
        # widening
        sub = FLUSH if flush else KEEP
        for c in prange(nch):
            lo, hi = c * _CHUNK, min(n, (c + 1) * _CHUNK)
            span_f16_to_f32_hw(bits[lo:hi], out[lo:hi], sub)
        return
    for c in prange(nch):
        for b0 in range(c * _CHUNK, min(n, (c + 1) * _CHUNK), 256):
            b1 = min(n, b0 + 256)
            nbad = np.uint32(0)  # pass 1 (vectorised): normal numbers and zeros (and subnormals under flush)
            for i in range(np.uintp(b0), np.uintp(b1)):
                b = np.uint32(bits[i])
                e = b & np.uint32(0x7C00)
                sgn = (b & np.uint32(0x8000)) << np.uint32(16)
                out[i] = _normal16_f32bits(b, False) if e != 0 else sgn
                # Inf/NaN, or a kept subnormal: flags ORed without branches (short-circuit tests and a count
                # measured ~20% slower)
                nbad |= np.uint32(e == np.uint32(0x7C00)) | (np.uint32(e == 0) & np.uint32((b & np.uint32(0x3FF)) != 0)
                                                             & keep)
            if nbad != 0:  # pass 2: fp16 Inf/NaN and kept subnormals, exactly
                for i in range(b0, b1):
                    b = np.uint32(bits[i])
                    e = b & np.uint32(0x7C00)
                    if e == np.uint32(0x7C00) or (e == 0 and (b & np.uint32(0x3FF)) != 0 and not flush):
                        out[i] = np.float32(f16_bits_to_f32(b)).view(np.uint32)


@njit(cache=True, parallel=True)
def round_f32_operands(src, out, bf16, overflow, subnormal):
    """out[i] = float32(fp16/bf16 rint(src[i])) under the cast's overflow/subnormal codes; returns the OR of status."""
    n = src.size
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int32)
    sbits = src.view(np.uint32)
    obits = out.view(np.uint32)
    for c in prange(nch):
        s = np.int32(0)
        for b0 in range(c * _CHUNK, min(n, (c + 1) * _CHUNK), 256):
            b1 = min(n, b0 + 256)
            nbad = 0  # pass 1 (vectorised): values rounding to a normal 16-bit number, as in finish_to_16
            for i in range(np.uintp(b0), np.uintp(b1)):
                b, ok = _fast16(sbits[i], bf16)
                obits[i] = _normal16_f32bits(b, bf16)
                nbad += 0 if ok else 1
            if nbad > 0:  # pass 2: the rest through the cast kernel
                for i in range(b0, b1):
                    b, ok = _fast16(sbits[i], bf16)
                    if not ok:
                        b, s1 = f32_to_16_bits(src[i], bf16, RINT, overflow, subnormal)
                        out[i] = _widen16(b, bf16)
                        s |= s1
        st[c] = s
    return or_all(st)


@njit(cache=True, parallel=True)
def round_f64_operands(src, out, bf16, overflow, subnormal):
    """out[i] = float32(fp16-or-bf16 rint(src[i])), one rounding from float64; returns the OR of statuses."""
    n = src.size
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int32)
    for c in prange(nch):
        s = np.int32(0)
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            b, s1 = f64_to_16_bits(src[i], bf16, RINT, overflow, subnormal)
            out[i] = _widen16(b, bf16)
            s |= s1
        st[c] = s
    return or_all(st)


@njit(cache=True)
def _widen_row(src, dst, n, m, bf16, flush):
    """dst[k] = float32 bits of the 16-bit src[k] (widen_operands' values) for k < n, +0 for n <= k < m; returns
    whether a NaN was among them."""
    nbad = 0  # pass 1 (vectorised where src is contiguous): normal numbers and zeros
    if bf16:   # (the format's choice outside the loops: inside, it kept them from vectorising)
        for k in range(np.uintp(0), np.uintp(n)):   # unsigned: no wraparound test
            b = np.uint32(src[k])
            sub = (b & np.uint32(0x7F80)) == 0 and (b & np.uint32(0x7F)) != 0
            dst[k] = (b & np.uint32(0x8000)) << np.uint32(16) if (sub and flush) else b << np.uint32(16)
            nbad += 1 if (b & np.uint32(0x7FFF)) > np.uint32(0x7F80) else 0   # a NaN
    else:
        for k in range(np.uintp(0), np.uintp(n)):
            b = np.uint32(src[k])
            e = b & np.uint32(0x7C00)
            sgn = (b & np.uint32(0x8000)) << np.uint32(16)
            dst[k] = _normal16_f32bits(b, False) if e != 0 else sgn
            special = e == np.uint32(0x7C00) or (e == 0 and (b & np.uint32(0x3FF)) != 0 and not flush)
            nbad += 1 if special else 0
    nan = False
    if nbad > 0:  # pass 2: fp16 Inf/NaN and kept subnormals, exactly; is one a NaN?
        for k in range(n):
            b = np.uint32(src[k])
            nan |= (b & np.uint32(0x7FFF)) > (np.uint32(0x7F80) if bf16 else np.uint32(0x7C00))
            e = b & np.uint32(0x7C00)
            if not bf16 and (e == np.uint32(0x7C00) or (e == 0 and (b & np.uint32(0x3FF)) != 0 and not flush)):
                dst[k] = np.float32(f16_bits_to_f32(b)).view(np.uint32)
    for k in range(n, m):
        dst[k] = np.uint32(0)
    return nan


@njit(cache=True, parallel=True)
def pack_b16(Y, ys, nb2, K, N, Bp, bf16, flush):
    """tree16.pack_b of the widened 16-bit B, read through its strides: Bp[t, jt, q, l, j] = float32 of B[t, 16q + l,
    jt*NC + j] (widen_operands' values; +0 for the rows K..Kp and from column N up to the 2x2 block edge), where
    stack t of B is (t // nb2, t % nb2) of the memory run Y (uint16) with strides ``ys`` = (stack, stack, row,
    column) in elements: a transposed view (an Einsum's operand) packed without a contiguous copy first. Returns
    whether B holds a NaN (the orientation of the product depends on it: numerics/cube_core._nan_free)."""
    nb, njt, nkb = Bp.shape[0], Bp.shape[1], Bp.shape[2]
    nw = nb * njt * nkb
    found = np.zeros(nw, dtype=np.uint8)
    for w in prange(nw):
        t, jt, q, j0, jn = _slab_item(w, njt, nkb, N)
        tail = _tail_columns(jn)
        base = (t // nb2) * ys[0] + (t % nb2) * ys[1] + j0 * ys[3]
        nan = False
        for l in range(16):
            k = 16 * q + l
            dst = Bp[t, jt, q, l].view(np.uint32)
            if k >= K:   # the padded rows: +0 products
                _widen_row(Y[:0], dst, 0, tail, bf16, flush)
            elif ys[3] == 1:   # contiguous columns: a C-layout slice, so the row vectorises
                b0 = base + k * ys[2]
                nan |= _widen_row(Y[b0:b0 + jn], dst, jn, tail, bf16, flush)
            else:
                b0 = base + k * ys[2]
                nan |= _widen_row(Y[b0:b0 + (jn - 1) * ys[3] + 1:ys[3]], dst, jn, tail, bf16, flush)
        found[w] = 1 if nan else 0
    return found.any()


@njit(cache=True, parallel=True)
def pack_bt(W, K, Bp):
    """tree16.pack_b of B = W transposed, padded with +0 rows to Kp: Bp[t, jt, q, l, j] = W[t, jt*NC + j, 16q + l]
    for 16q + l < K, else +0 (and +0 from column N up to the 2x2 block edge). W (nb, N, K) float32, C-contiguous:
    a transposed operand's values in their own layout (a Dense layer's input gradient dY W^T reads W (N, K) so).
    Row by row (pack_b16 of the transposed fp16 view, or numpy's transposing copy: 611 us for 512 x 512 floats), a
    row of a 512-wide weight touches 512 cache lines a power of two apart (likely sharing a few of L1's sets); here
    each column's 16 rows are one 64-byte run of W, read in 16 x 16 blocks."""
    nb, N = W.shape[0], W.shape[1]
    njt, nkb = Bp.shape[1], Bp.shape[2]
    for w in prange(nb * njt * nkb):
        t, jt, q, j0, jn = _slab_item(w, njt, nkb, N)
        kn = min(16, K - 16 * q)
        if kn == 16:
            # 16 x 16 blocks: 16 lines read, then 16 full lines written (a column at a time, writing 16 lines
            # 2 KiB apart while reading: ~340 us for 512 x 512, this way ~230; the widening's 70 subtracted)
            blk = np.empty((16, 16), dtype=np.float32)
            for jb in range(0, jn - 15, 16):
                for j in range(16):
                    for l in range(16):
                        blk[l, j] = W[t, j0 + jb + j, 16 * q + l]
                for l in range(16):
                    for j in range(16):
                        Bp[t, jt, q, l, jb + j] = blk[l, j]
            for j in range(jn - jn % 16, jn):
                for l in range(16):
                    Bp[t, jt, q, l, j] = W[t, j0 + j, 16 * q + l]
        else:
            for j in range(jn):
                for l in range(kn):
                    Bp[t, jt, q, l, j] = W[t, j0 + j, 16 * q + l]
        for l in range(kn, 16):     # the padded rows: +0 products
            Bp[t, jt, q, l, :jn] = np.float32(0.0)
        for l in range(16):
            Bp[t, jt, q, l, jn:_tail_columns(jn)] = np.float32(0.0)


@njit(cache=True, parallel=True)
def widen_pack_f16(Y, Bp, flush):
    """pack_b of widen_operands(Y) (fp16, HW_HALF hosts) in one pass: Bp[t, jt, q, l, j] = float32 bits of the fp16
    pattern Y[t, 16q + l, jt*NC + j] by cast.span_f16_to_f32_hw, widen_operands' own per-element conversion (exact;
    subnormals -> signed zero under flush; Inf and NaN patterns exactly), +0 for the rows K..Kp and from column N up to
    the 2x2 block edge. Y (nb, K, N) uint16, C-contiguous: a contiguous fp16 B (a Dense layer's weight) is not widened
    into a float32 copy that pack_b then reads again."""
    nb, K, N = Y.shape
    njt, nkb = Bp.shape[1], Bp.shape[2]
    sub = FLUSH if flush else KEEP
    for w in prange(nb * njt * nkb):
        t, jt, q, j0, jn = _slab_item(w, njt, nkb, N)
        tc = _tail_columns(jn)
        for l in range(16):
            k = 16 * q + l
            if k < K:
                span_f16_to_f32_hw(Y[t, k, j0:j0 + jn], Bp[t, jt, q, l, :jn].view(np.uint32), sub)
                Bp[t, jt, q, l, jn:tc] = np.float32(0.0)
            else:   # the padded rows: +0 products
                Bp[t, jt, q, l, :tc] = np.float32(0.0)
