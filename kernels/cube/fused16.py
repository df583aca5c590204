"""The default cube model (block 16, tree) on 16-bit operands in one parallel region: matmul_tree16 whose work
items widen their own rows of A and round their own outputs.

:func:`.tree16.matmul_tree16` reads A as float32 operand values and writes the float32 accumulator, so a cube
node on fp16 activations ran three passes, each a parallel region of its own: the widening of A
(:func:`.operands.widen_operands`), the product and the Fixpipe's rounding (:func:`.fixpipe.finish_to_16`). Here a
work item widens the MC x Kp rows of A it multiplies into its thread's buffer (again only when the thread's
previous item had other rows: once per row block where a product has one column tile), runs the same
micro-kernel over them, and rounds its tile into the 16-bit output as it stores it. The same values in the same
order per element: the widening is widen_operands' (exact; subnormals to signed zero under flush), the K
padding is +0 operands as in the padded copy, the rounding is finish_to_16's (RINT, the fixpipe's status).
A is read through its strides (a transposed view: no copy first).
"""
from __future__ import annotations

import numpy as np
from numba import get_thread_id, njit, prange

from ..cast import f16_bits_to_f32
from ..codes import SATURATION
from .fixpipe import _fast16, _fixpipe_f32, to16
from .operands import _normal16_f32bits
from .tree16 import LANES, MC, NC, SLABS, TILE, _passes, _tail_columns, _tile_init, _tile_store

#: columns of A widened at a time (a multiple of 16): a work item's MC rows of them (128 KiB) stay in L2 while
#: the micro-kernel passes over them; all of K at once (512 KiB for K = 1024) ran the product ~7% slower
KPANEL = 256


@njit(cache=True)
def _widen_row(src, dst, K, Kp, bf16, flush):
    """dst[k] = float32 bits of the 16-bit src[k] (widen_operands' values) for k < K, +0 for K <= k < Kp (the
    padded products)."""
    nbad = 0  # pass 1 (vectorised where src is contiguous): normal numbers and zeros
    for k in range(np.uintp(0), np.uintp(K)):   # unsigned: no wraparound test, so it vectorises
        b = np.uint32(src[k])
        if bf16:
            e = b & np.uint32(0x7F80)
            sub = e == 0 and (b & np.uint32(0x7F)) != 0
            dst[k] = (b & np.uint32(0x8000)) << np.uint32(16) if (sub and flush) else b << np.uint32(16)
        else:
            e = b & np.uint32(0x7C00)
            sgn = (b & np.uint32(0x8000)) << np.uint32(16)
            dst[k] = _normal16_f32bits(b, False) if e != 0 else sgn
            special = e == np.uint32(0x7C00) or (e == 0 and (b & np.uint32(0x3FF)) != 0 and not flush)
            nbad += 1 if special else 0
    if nbad > 0:  # pass 2: fp16 Inf/NaN and kept subnormals, exactly
        for k in range(K):
            b = np.uint32(src[k])
            e = b & np.uint32(0x7C00)
            if e == np.uint32(0x7C00) or (e == 0 and (b & np.uint32(0x3FF)) != 0 and not flush):
                dst[k] = np.float32(f16_bits_to_f32(b)).view(np.uint32)
    for k in range(K, Kp):
        dst[k] = np.uint32(0)


@njit(cache=True)
def _widen_rows(A, st, ta, nb2, i0, i1, k0, kn, kpn, buf, bf16, flush):
    """buf[(i - i0) * kpn + k] = float32 bits of A's element (stack ta, row i, column k0 + k) for i0 <= i < i1 and
    k < kn, +0 up to kpn: A is the 16-bit memory as one run of elements, ``st`` its (stack, stack, row, column)
    strides in elements."""
    for i in range(i0, i1):
        base = (ta // nb2) * st[0] + (ta % nb2) * st[1] + i * st[2] + k0 * st[3]
        dst = buf[(i - i0) * kpn:(i - i0 + 1) * kpn]
        if st[3] == 1:   # a contiguous row: a C-layout slice, so the loop vectorises
            _widen_row(A[base:base + kn], dst, kn, kpn, bf16, flush)
        else:
            _widen_row(A[base:base + (kn - 1) * st[3] + 1:st[3]], dst, kn, kpn, bf16, flush)


@njit(cache=True)
def _round_vector(C, Cu, p, g, s, orow, col, n, bf16, overflow, sat, subnormal):
    """orow[col + l] = C[p, g, s, l] rounded as finish_to_16 rounds it, for l < n; returns the OR of the statuses
    (the fixpipe's 0x400, the conversion's)."""
    st = np.int64(0)
    nbad = 0  # pass 1, branch-free: the normal-result shortcut
    for l in range(np.uintp(0), np.uintp(n)):
        b, ok = _fast16(Cu[p, g, s, l], bf16)
        orow[col + l] = b
        nbad += 0 if ok else 1
    if nbad > 0:  # pass 2: overflow, subnormal and non-finite results through Fixpipe and the cast
        for l in range(n):
            b, ok = _fast16(Cu[p, g, s, l], bf16)
            if not ok:
                v, s1 = _fixpipe_f32(C[p, g, s, l], sat)
                b, s2 = to16(v, bf16, overflow, subnormal)
                orow[col + l] = b
                st |= s1 | s2
    return st


@njit(cache=True)
def _tile_store16(C, out, i0, i1, j0, jn, npair, ng, bf16, overflow, subnormal):
    """_tile_store's elements rounded as finish_to_16 rounds them: out[i, j0 + j] = the 16-bit bits; returns the
    OR of the statuses."""
    sat = overflow == SATURATION
    st = np.int64(0)
    Cu = C.view(np.uint32)
    for p in range(npair):
        for s in range(4):
            i = i0 + 2 * p + (s & 1)
            if i < i1:
                orow = out[i]
                for g in range(ng):
                    jb = 2 * LANES * g + LANES * (s >> 1)
                    if jb + LANES <= jn:   # a whole vector: a constant trip count, so it vectorises
                        st |= _round_vector(C, Cu, p, g, s, orow, j0 + jb, LANES, bf16, overflow, sat, subnormal)
                    elif jn > jb:
                        st |= _round_vector(C, Cu, p, g, s, orow, j0 + jb, jn - jb, bf16, overflow, sat, subnormal)
    return st


@njit(cache=True, parallel=True)
def matmul_tree16_f16(A, ast, nb2, K, Bp, bias, bias_rows, ia, ib, out32, out16, tiles, abuf, bf16, flush, fma, mc,
                      to_16, out_bf16, overflow, subnormal):
    """matmul_tree16 with A the 16-bit bits of (nb1, nb2, M, K) stacks as a 1-D uint16 run of memory and ``ast`` its
    four strides in elements (non-negative; a transposed view: no copy), stack ia[t] being [ia[t] // nb2, ia[t] % nb2], widened per work item, KPANEL columns at a time, into ``abuf`` (threads, mc * min(Kp, KPANEL)) float32 (64-byte aligned
    rows: empty_slabs) under ``flush`` (subnormal operands to signed zero); ``bf16``: A holds bf16. Out: with
    ``to_16``, out16[t] (nb, M, N) uint16 = the accumulator rounded to fp16 (bf16 if ``out_bf16``) as
    finish_to_16 does it, else out32[t] = the float32 accumulator. Returns the OR of the rounding's statuses."""
    M = ast[4]
    Kp = Bp.shape[2] * 16
    nb = out16.shape[0] if to_16 else out32.shape[0]
    N = out16.shape[2] if to_16 else out32.shape[2]
    if not 1 <= mc <= MC:
        raise ValueError("matmul_tree16_f16: mc (rows per work item) must be in 1..MC")
    if Kp < K or Kp - K >= 16 or abuf.shape[1] < mc * min(Kp, KPANEL) or abuf.strides[1] != 4:
        raise ValueError("matmul_tree16_f16: abuf must be (threads, mc * min(Kp, KPANEL)) float32, Kp = K padded to 16")
    if tiles.shape[1] < TILE or tiles.strides[1] != 4:
        raise ValueError("matmul_tree16_f16: tiles must be (threads, TILE) float32, one row per Numba thread")
    W = Bp.shape[4]
    nkb = Kp // 16
    if nkb > 0 and (Bp.strides[3] != 4 * W or Bp.strides[4] != 4 or W - 16 < _tail_columns(min(N, NC))
                    or W not in SLABS):
        raise ValueError("matmul_tree16_f16: the slabs of Bp must be contiguous float32 (see slab_shape)")
    nch = (M + mc - 1) // mc
    njt = (N + NC - 1) // NC
    nw = nb * nch * njt
    st = np.zeros(nw, dtype=np.int64)
    # per thread: the (stack of A, first row) its buffer holds, -1: none yet (this call)
    held = np.full((abuf.shape[0], 2), -1, dtype=np.int64)
    for w in prange(nw):
        t = w // (nch * njt)
        i0 = ((w // njt) % nch) * mc
        i1 = min(M, i0 + mc)
        jt = w % njt
        j0 = jt * NC
        jn = min(N, j0 + NC) - j0
        ng = _tail_columns(jn) // (2 * LANES)
        npair = (i1 - i0 + 1) // 2
        tid = get_thread_id()
        ta = ia[t]
        buf = abuf[tid]
        Bt = Bp[ib[t], jt]
        tc = t if bias.shape[0] > 1 else 0
        C = tiles[tid, :npair * ng * 4 * LANES].reshape(npair, ng, 4, LANES)
        _tile_init(C, bias, tc, bias_rows, i0, i1, j0, jn, npair, ng)
        for k0 in range(0, Kp, KPANEL):
            kpn = min(KPANEL, Kp - k0)
            # one panel: the thread's buffer may hold these rows already (its previous item's, another column tile)
            if Kp > KPANEL or held[tid, 0] != ta or held[tid, 1] != i0:
                _widen_rows(A, ast, ta, nb2, i0, i1, k0, min(K, k0 + kpn) - k0, kpn, buf.view(np.uint32), bf16,
                            flush)
                held[tid, 0] = ta
                held[tid, 1] = i0
            # the micro-kernel addresses row i at a_addr + i * row bytes: the buffer holds rows i0.. (unsigned wrap)
            a_row = kpn * 4
            a_addr = np.uintp(buf.ctypes.data) - np.uintp(i0 * a_row)
            args = (C.ctypes.data, a_addr, a_row, Bt.ctypes.data + np.uintp((k0 // 16) * Bt.strides[0]),
                    Bt.strides[0], i0, i1, kpn // 16, npair, ng)
            if W == SLABS[4]:
                _passes(SLABS[4], fma, args)
            elif W == SLABS[3]:
                _passes(SLABS[3], fma, args)
            elif W == SLABS[2]:
                _passes(SLABS[2], fma, args)
            elif W == SLABS[1]:
                _passes(SLABS[1], fma, args)
            else:
                _passes(SLABS[0], fma, args)
        if to_16:
            st[w] = _tile_store16(C, out16[t], i0, i1, j0, jn, npair, ng, out_bf16, overflow, subnormal)
        else:
            _tile_store(C, out32[t], i0, i1, j0, jn, npair, ng)
    r = np.int64(0)
    for w in range(nw):
        r |= st[w]
    return r
