"""Cube unit (matrix engine) kernels: fp32 accumulation of dot products in K-blocks.

An output element is ``acc = bias[j]`` (L0C initialised with the bias, +0 without one)
followed by one accumulation step per K-block of ``block_size`` products
``p_k = fl32(a[i, k] * b[k, j])`` (exact for fp16 operands), in k order. The step is
chosen by the block model (codes mirror ``ascend_emu.numerics.policy.BLOCK_SUMS`` / ``NORMALIZE``):

- TREE: the block's products, padded with +0 to the next power of two, are summed by a
  balanced binary tree of fp32 RNE adders (level by level, adjacent pairs), then
  ``acc = fl32(acc + total)``.
- SEQUENTIAL: ``acc = fl32(acc + p_k)`` for every real k (no padding terms).
- ALIGNED: Khattak-Mikaitis block FMA over {acc, p_k}: align to the largest exponent,
  truncate each magnitude below ``2**(emax - 23 - extra_bits)``, add exactly, normalise to
  fp32 by truncation or RNE (see :func:`aligned_block`).

All operands reach the kernels as float32 arrays holding the (exactly converted) operand
values; A is (batch, M, Kp) and B is (batch, Kp, N) with K padded by zeros to a multiple of
16, so padded products are +0 (the default kernel takes B packed by :func:`pack_b`).
Vectorising across output columns j is legal: the order of additions is fixed per output
element, never across elements. Loops over j use unsigned indices: Numba's wraparound test
for negative signed indices otherwise stops LLVM from vectorising them.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import get_thread_id, literally, njit, prange, types
from numba.extending import intrinsic

from . import alloc
from .cast import (bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits, f64_to_bf16_bits,
                   f64_to_f16_bits)

from .codes import (ALIGNED, FLT_MAX, INF_NAN, NORM_RNE, NORM_TRUNCATE, RINT, SATURATION,  # noqa: F401
                    SEQUENTIAL, ST_CUBE_OVERFLOW, TREE)

# Work item of the tree16 kernel: MC output rows x NC output columns, accumulated in the thread's
# tile (aligned to 64 bytes) laid out so a 2-row x 32-column block's four 16-lane vectors are
# contiguous. B is packed once into slabs of 16 rows of W floats, W one of SLABS (the smallest
# holding min(N, NC) columns, +16 so the 16 rows do not share cache sets as rows 4 KiB apart
# would); W is a compile-time constant of the micro-kernel, so the 16 row offsets are immediates. The micro-kernel (_tree16_2x2_*) is written as explicit LLVM vector
# code: for 2 rows of A and 32 columns of B it loads each B vector once for both rows and each
# broadcast A value once for both column halves (LLVM's loop vectoriser would not register-block
# this: its runtime alias checks between the tile and the slab fail the check budget). MC and NC
# were chosen by measurement on the 2-core Zen 5 it was tuned on (benchmarks/RESULTS.md): MC 128
# keeps a column tile's B stream from L3 down to M/128 passes; the slab (33 KiB) stays in the 48
# KiB L1 while the row pairs pass over it.
MC = 128
NC = 512
SLABS = (48, 80, 144, 272, 528)  # 32 * 2**k + 16 floats per slab row; the last is NC + 16
LANES = 16  # floats per vector in the micro-kernel (one AVX-512 register; LLVM splits it elsewhere)
# Columns per work item of the generic (non-default model) kernels.
NCG = 256
_CHUNK = 1 << 15
_ALIGN = 64
# floats of accumulator tile per thread: MC/2 row pairs x NC/32 column groups x 4 vectors
TILE = (MC // 2) * (NC // (2 * LANES)) * 4 * LANES


# ---------------------------------------------------------------- default model: block 16, tree

@njit(cache=True)
def tree16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,
           b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15):
    """(((a0b0 + a1b1) + (a2b2 + a3b3)) + (...)) + (...): the 16-leaf fp32 adder tree."""
    return ((((a0 * b0 + a1 * b1) + (a2 * b2 + a3 * b3)) + ((a4 * b4 + a5 * b5) + (a6 * b6 + a7 * b7)))
            + (((a8 * b8 + a9 * b9) + (a10 * b10 + a11 * b11)) + ((a12 * b12 + a13 * b13) + (a14 * b14 + a15 * b15))))


def _tree16_2x2_codegen(fused, width):
    """LLVM code for C[16s : 16s+16] += tree16(row r of A, column half h of B), s = 2h + r, h, r in {0, 1},
    B's 16 rows ``width`` floats apart."""
    def codegen(context, builder, signature, args):
        c_addr, b_addr, x_addr, y_addr = args[:4]
        f32 = ir.FloatType()
        i32 = ir.IntType(32)
        i64 = ir.IntType(64)
        vec = ir.VectorType(f32, LANES)
        vptr = vec.as_pointer()
        fptr = f32.as_pointer()
        fma = builder.module.globals.get(f"llvm.fma.v{LANES}f32")
        if fma is None:
            fma = ir.Function(builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{LANES}f32")
        cp, bp, xp, yp = (builder.inttoptr(v, fptr) for v in (c_addr, b_addr, x_addr, y_addr))
        undef = ir.Constant(vec, ir.Undefined)
        splat = ir.Constant(ir.VectorType(i32, LANES), [0] * LANES)

        def at(p, off):
            return builder.gep(p, [ir.Constant(i64, off)])

        def broadcast(p, l):
            v = builder.insert_element(undef, builder.load(at(p, l), align=4), ir.Constant(i32, 0))
            return builder.shuffle_vector(v, undef, splat)

        def load(p, off):
            return builder.load(builder.bitcast(at(p, off), vptr), align=4)

        def tree(a, b):
            # the first level: fl(a0 b0 + a1 b1), one rounding when products are exact (fma), else two
            if fused:
                level = [builder.call(fma, [a[2 * m], b[2 * m], builder.fmul(a[2 * m + 1], b[2 * m + 1])])
                         for m in range(8)]
            else:
                level = [builder.fadd(builder.fmul(a[2 * m], b[2 * m]), builder.fmul(a[2 * m + 1], b[2 * m + 1]))
                         for m in range(8)]
            while len(level) > 1:
                level = [builder.fadd(level[2 * m], level[2 * m + 1]) for m in range(len(level) // 2)]
            return level[0]

        rows = [[broadcast(p, l) for l in range(16)] for p in (xp, yp)]
        for h in range(2):
            b = [load(bp, width * l + LANES * h) for l in range(16)]
            for r in range(2):
                slot = builder.bitcast(at(cp, LANES * (2 * h + r)), vptr)
                acc = builder.load(slot, align=4)
                builder.store(builder.fadd(acc, tree(rows[r], b)), slot, align=4)
        return context.get_dummy_value()
    return codegen


@intrinsic(prefer_literal=True)
def _tree16_2x2(typingctx, c_addr, b_addr, x_addr, y_addr, width, fused):
    """tree16 block for 2 rows x 32 columns of slab rows ``width`` floats long (a literal); ``fused``
    (a literal) computes the first level as fma(a0, b0, a1*b1), for exact products only: fp16 operands."""
    # fl(fl(a0b0) + fl(a1b1)) = fl(a0b0 + a1b1) = fma(a0, b0, fl(a1b1)) when both products are exact,
    # as they are for fp16 operands (22 significant bits, |ab| in [2**-48, 2**32)); Inf/NaN operands
    # give Inf/NaN either way (NaN payloads are not modelled)
    if not isinstance(width, types.IntegerLiteral) or not isinstance(fused, types.BooleanLiteral):
        return None
    sig = types.void(types.uintp, types.uintp, types.uintp, types.uintp, width, fused)
    return sig, _tree16_2x2_codegen(fused.literal_value, width.literal_value)


@njit(cache=True)
def _passes(width, fused, c_addr, a_addr, a_row, b_addr, b_block, i0, i1, nkb, npair, ng):
    """One work item's K loop: for every K block q, row pair p and 32-column group g, the 2x2 block."""
    # width and fused become compile-time constants (one compiled loop nest per slab width and
    # product kind: a run-time choice inside the loop measured ~25% slower)
    literally(width)
    literally(fused)
    for q in range(nkb):
        bq = b_addr + np.uintp(q * b_block)
        for p in range(npair):
            i = i0 + 2 * p
            x = a_addr + np.uintp(i * a_row + 64 * q)
            y = a_addr + np.uintp(min(i + 1, i1 - 1) * a_row + 64 * q)
            c = c_addr + np.uintp(p * ng * 4 * LANES * 4)
            for g in range(ng):
                _tree16_2x2(c + np.uintp(g * 4 * LANES * 4), bq + np.uintp(g * 2 * LANES * 4), x, y, width, fused)


def row_block(M, other_items, threads):
    """Rows per work item of matmul_tree16: MC, or fewer so that a product with few work items
    splits into a multiple of ``threads`` nearly equal row blocks (392 rows on 2 threads: 4 x 98,
    not 128, 128, 128, 8). ``other_items`` is the number of (batch, column tile) pairs."""
    if other_items >= 2 * threads:
        return MC
    k = -(-max(-(-M // MC), 1) // threads) * threads
    return max(1, min(MC, -(-M // k)))


def slab_width(N):
    """Floats per slab row for N columns: the smallest of SLABS holding min(N, NC) columns + 16."""
    return next(w for w in SLABS if w - 16 >= min(N, NC))


def slab_shape(nb, N, Kp):
    """Shape of the packed B of pack_b / im2col_packed: (nb, column tiles, K blocks, 16, slab_width(N))."""
    return (nb, (N + NC - 1) // NC, Kp // 16, 16, slab_width(N))


def empty_slabs(shape):
    """An uninitialised float32 array of this shape whose data starts on a 64-byte boundary."""
    # aligned slab rows keep the micro-kernel's 64-byte loads within one cache line (~25% faster)
    n = int(np.prod(shape))
    raw = alloc.empty(n + _ALIGN // 4, np.float32)
    skip = (-raw.ctypes.data % _ALIGN) // 4
    return raw[skip:skip + n].reshape(shape)


@njit(cache=True)
def _tail_columns(jn):
    """Columns a tile of jn real columns computes: jn rounded up to the 32 of a 2x2 block."""
    return min(NC, -(-jn // (2 * LANES)) * (2 * LANES))


@njit(cache=True, parallel=True)
def pack_b(B, Bp):
    """Bp[t, jt, q, l, j] = B[t, 16q + l, jt*NC + j] (+0 from column N up to the 2x2 block edge)."""
    # Bp is allocated by the caller (empty_slabs: aligned; numpy asks the kernel for huge pages,
    # a fresh Numba array of this size costs a page fault per 4 KiB). Columns past that edge are never read.
    nb, Kp, N = B.shape
    nkb = Kp // 16
    njt = (N + NC - 1) // NC
    for w in prange(nb * njt * nkb):
        t = w // (njt * nkb)
        jt = (w // nkb) % njt
        q = w % nkb
        j0 = jt * NC
        jn = min(N, j0 + NC) - j0
        for l in range(16):
            Bp[t, jt, q, l, :jn] = B[t, 16 * q + l, j0:j0 + jn]
            Bp[t, jt, q, l, jn:_tail_columns(jn)] = np.float32(0.0)


@njit(cache=True, parallel=True)
def matmul_tree16(A, Bp, bias, bias_rows, ia, ib, out, tiles, fma=False, mc=MC):
    """out[t,i,j] = bias[t',j] (bias[t',i] if bias_rows; t'=t|0) += tree16(A[ia[t],i,16q:+16], B[ib[t],16q:+16,j])."""
    # tiles: (NUMBA_NUM_THREADS, TILE) scratch, one row per thread id, 64-byte aligned (empty_slabs),
    # allocated by the caller: a tile malloc'ed per work item in here ran up to 2x slower depending on malloc's state.
    # fma=True (the same bits) only when every product is exact in fp32: fp16 operands. The tile C
    # holds, per row pair p and 32-column group g, four vectors: (row 2p, 2p+1) x (columns 0-15, 16-31)
    nb, M, N = out.shape
    nkb = A.shape[2] // 16
    if not 1 <= mc <= MC:
        raise ValueError("matmul_tree16: mc (rows per work item) must be in 1..MC")
    nch = (M + mc - 1) // mc
    njt = (N + NC - 1) // NC
    # the micro-kernel addresses A's rows and the slabs' rows by pointer arithmetic
    if tiles.shape[1] < TILE or tiles.strides[1] != 4:
        raise ValueError("matmul_tree16: tiles must be (threads, TILE) float32, one row per Numba thread")
    W = Bp.shape[4]
    if nkb > 0 and (A.strides[2] != 4 or Bp.strides[3] != 4 * W or Bp.strides[4] != 4 or Bp.shape[2] != nkb
                    or W - 16 < _tail_columns(min(N, NC)) or W not in SLABS):
        raise ValueError("matmul_tree16: A rows and the slabs of Bp must be contiguous float32 (see slab_shape)")
    for w in prange(nb * nch * njt):
        t = w // (nch * njt)
        i0 = ((w // njt) % nch) * mc
        i1 = min(M, i0 + mc)
        jt = w % njt
        j0 = jt * NC
        jn = min(N, j0 + NC) - j0
        ng = _tail_columns(jn) // (2 * LANES)
        npair = (i1 - i0 + 1) // 2
        At = A[ia[t]]
        Bt = Bp[ib[t], jt]
        tc = t if bias.shape[0] > 1 else 0
        C = tiles[get_thread_id(), :npair * ng * 4 * LANES].reshape(npair, ng, 4, LANES)
        for p in range(npair):
            for s in range(4):
                i = min(i0 + 2 * p + (s & 1), i1 - 1)  # an odd last row is computed twice, stored once
                for g in range(ng):
                    for l in range(LANES):
                        j = min(2 * LANES * g + LANES * (s >> 1) + l, jn - 1)
                        C[p, g, s, l] = bias[tc, i] if bias_rows else bias[tc, j0 + j]
        c, a, ar, b, bb = C.ctypes.data, At.ctypes.data, At.strides[0], Bt.ctypes.data, Bt.strides[0]
        if W == SLABS[4]:
            if fma:
                _passes(SLABS[4], True, c, a, ar, b, bb, i0, i1, nkb, npair, ng)
            else:
                _passes(SLABS[4], False, c, a, ar, b, bb, i0, i1, nkb, npair, ng)
        elif W == SLABS[3]:
            if fma:
                _passes(SLABS[3], True, c, a, ar, b, bb, i0, i1, nkb, npair, ng)
            else:
                _passes(SLABS[3], False, c, a, ar, b, bb, i0, i1, nkb, npair, ng)
        elif W == SLABS[2]:
            if fma:
                _passes(SLABS[2], True, c, a, ar, b, bb, i0, i1, nkb, npair, ng)
            else:
                _passes(SLABS[2], False, c, a, ar, b, bb, i0, i1, nkb, npair, ng)
        elif W == SLABS[1]:
            if fma:
                _passes(SLABS[1], True, c, a, ar, b, bb, i0, i1, nkb, npair, ng)
            else:
                _passes(SLABS[1], False, c, a, ar, b, bb, i0, i1, nkb, npair, ng)
        elif fma:
            _passes(SLABS[0], True, c, a, ar, b, bb, i0, i1, nkb, npair, ng)
        else:
            _passes(SLABS[0], False, c, a, ar, b, bb, i0, i1, nkb, npair, ng)
        for p in range(npair):
            for s in range(4):
                i = i0 + 2 * p + (s & 1)
                if i < i1:
                    for g in range(ng):
                        jb = 2 * LANES * g + LANES * (s >> 1)
                        for l in range(max(0, min(LANES, jn - jb))):
                            out[t, i, j0 + jb + l] = C[p, g, s, l]


# ---------------------------------------------------------------- every model, generic block step

@njit(cache=True)
def _f32_parts(x):
    """(m, e) with |x| = m * 2**e, m the integer significand of the finite float32 x (m = 0 for zeros)."""
    u = np.int64(np.float32(x).view(np.uint32))
    E = (u >> 23) & 0xFF
    F = u & 0x7FFFFF
    if E == 0:
        return F, np.int64(-149)
    return F | 0x800000, E - 150


@njit(cache=True)
def _bit_length(v):
    """number of bits of the non-negative int64 v."""
    n = 0
    while v > 0:
        v >>= 1
        n += 1
    return n


@njit(cache=True)
def aligned_block(acc, T, j, nterms, extra_bits, normalize):
    """fl32_norm(sum over t in {acc, T[0:nterms, j]} of sign(t) * trunc(|t| / 2**(emax-23-x)) * 2**(emax-23-x))."""
    nan = False
    pinf = False
    ninf = False
    emax = np.int64(-100000)
    for l in range(-1, nterms):
        t = acc if l < 0 else T[l, j]
        if np.isnan(t):
            nan = True
        elif np.isinf(t):
            if t > 0:
                pinf = True
            else:
                ninf = True
        elif t != 0:
            m, e = _f32_parts(t)
            lead = e + _bit_length(m) - 1
            if lead > emax:
                emax = lead
    if nan or (pinf and ninf):
        return np.float32(np.nan)
    if pinf:
        return np.float32(np.inf)
    if ninf:
        return np.float32(-np.inf)
    if emax == -100000:  # every term is zero
        return np.float32(0.0)
    lsb = emax - 23 - extra_bits
    S = np.int64(0)
    for l in range(-1, nterms):
        t = acc if l < 0 else T[l, j]
        if t == 0:
            continue
        m, e = _f32_parts(t)
        s = e - lsb
        if s >= 0:
            q = m << s
        elif s > -63:
            q = m >> (-s)
        else:
            q = np.int64(0)
        S += q if t > 0 else -q
    if S == 0:
        return np.float32(0.0)
    neg = S < 0
    mag = -S if neg else S
    L = _bit_length(mag)
    tgt = max(lsb + L - 24, np.int64(-149))  # exponent of the result's last significand bit
    r = tgt - lsb
    if r <= 0:
        v = math.ldexp(np.float64(mag), lsb)
    else:
        q = mag >> r
        if normalize == NORM_RNE:
            rem = mag & ((np.int64(1) << r) - 1)
            half = np.int64(1) << (r - 1)
            if rem > half or (rem == half and (q & 1) == 1):
                q += 1
        v = math.ldexp(np.float64(q), tgt)
    # exponent overflow is Inf under both normalisations (so it is seen and flagged)
    if v >= 2.0 ** 128:
        v = np.inf
    return np.float32(-v if neg else v)


@njit(cache=True)
def _block_step(T, nterms, P, acc, jn, block_sum, extra_bits, normalize):
    """acc[0:jn] = block_sum step of acc with the products T[0:nterms, 0:jn] (tree pads T to P rows with +0)."""
    if block_sum == TREE:
        for l in range(nterms, P):
            for j in range(jn):
                T[l, j] = np.float32(0.0)
        w = P
        while w > 1:
            h = w // 2
            for l in range(h):  # row l is written after rows 2l, 2l+1 >= l were read
                for j in range(np.uintp(jn)):
                    T[l, j] = T[2 * l, j] + T[2 * l + 1, j]
            w = h
        for j in range(np.uintp(jn)):
            acc[j] = acc[j] + T[0, j]
    elif block_sum == SEQUENTIAL:
        for l in range(nterms):
            for j in range(np.uintp(jn)):
                acc[j] = acc[j] + T[l, j]
    else:
        for j in range(jn):
            acc[j] = aligned_block(acc[j], T, j, nterms, extra_bits, normalize)


@njit(cache=True)
def tree_leaves(block_size, block_sum):
    """rows of the product buffer: next power of two >= block_size for the tree, else block_size."""
    if block_sum != TREE:
        return block_size
    P = 1
    while P < block_size:
        P *= 2
    return P


@njit(cache=True, parallel=True)
def matmul_blocked(A, B, bias, bias_rows, ia, ib, out, K, block_size, block_sum, extra_bits, normalize):
    """out[t,i,j] = bias[t',j] (bias[t',i] if bias_rows; t'=t or 0), then block steps of A[ia[t],i,k] * B[ib[t],k,j]."""
    nb, M, N = out.shape
    P = tree_leaves(block_size, block_sum)
    njt = (N + NCG - 1) // NCG
    nblk = (K + block_size - 1) // block_size
    for w in prange(nb * M * njt):
        t = w // (M * njt)
        r = w % (M * njt)
        i = r // njt
        j0 = (r % njt) * NCG
        j1 = min(N, j0 + NCG)
        jn = j1 - j0
        T = np.empty((P, NCG), dtype=np.float32)
        ta = ia[t]
        tb = ib[t]
        acc = out[t, i, j0:j1]
        tc = t if bias.shape[0] > 1 else 0
        for j in range(jn):
            acc[j] = bias[tc, i] if bias_rows else bias[tc, j0 + j]
        uj0 = np.uintp(j0)
        for q in range(nblk):
            k0 = q * block_size
            nterms = min(block_size, K - k0)
            for l in range(nterms):
                al = A[ta, i, k0 + l]
                for j in range(np.uintp(jn)):
                    T[l, j] = al * B[tb, k0 + l, uj0 + j]
            _block_step(T, nterms, P, acc, jn, block_sum, extra_bits, normalize)


@njit(cache=True, parallel=True)
def im2col(xp, koff, sh, sw, OH, OW, r0, out):
    """out[r - r0, k] = xp.flat[offset of pixel (n, oh*sh, ow*sw, 0) + koff[k]], r = (n*OH + oh)*OW + ow; rest 0."""
    # koff (column k -> flat offset of its tap and channel) fixes the K order: see ascend_emu.numerics.cube._k_offsets
    rows, Kp = out.shape
    K = koff.size
    po = pixel_offsets(xp, sh, sw, OH, OW, r0, rows)
    xf = xp.reshape(-1)
    for rr in prange(rows):
        base = po[rr]
        for k in range(K):
            out[rr, k] = xf[base + koff[k]]
        for k in range(K, Kp):  # K padding: +0 products in the last block
            out[rr, k] = np.float32(0.0)


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
def im2col_packed(xp, koff, sh, sw, OH, OW, r0, rows, Bp):
    """im2col_t(...) in pack_b's layout: Bp[0, jt, q, l, j] = column 16q + l of pixel r0 + jt*NC + j (+0 past K)."""
    _, njt, nkb, _, _ = Bp.shape
    K = koff.size
    po = pixel_offsets(xp, sh, sw, OH, OW, r0, rows)
    xf = xp.reshape(-1)
    for w in prange(njt * nkb):
        jt = w // nkb
        q = w % nkb
        j0 = jt * NC
        jn = min(rows, j0 + NC) - j0
        to = np.zeros(16, dtype=np.uintp)
        nl = min(16, K - 16 * q)  # real columns in this block; the rest are +0
        for l in range(nl):
            to[l] = koff[16 * q + l]
        # pixel-major: each pixel's 16 columns are (mostly) one cache line of xp
        for j in range(jn):
            base = po[j0 + j]
            for l in range(nl):
                Bp[0, jt, q, l, j] = xf[base + to[l]]
            for l in range(nl, 16):
                Bp[0, jt, q, l, j] = np.float32(0.0)
        for l in range(16):  # +0 up to the 2x2 block edge, as pack_b
            Bp[0, jt, q, l, jn:_tail_columns(jn)] = np.float32(0.0)


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
    # the matmul kernel. Flat offsets keep slicing (an atomic refcount per view) out of the loops.
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
                _dw_tree16(of, ob, xf, o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9], o[10], o[11],
                           o[12], o[13], o[14], o[15], wf, 16 * q, CM, mult)


# ---------------------------------------------------------------- operands: round to the operand dtype

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
def widen_operands(bits, out, bf16, flush):
    """out[i] = float32 bits of the 16-bit pattern bits[i] (exact; subnormals -> signed zero under flush)."""
    n = bits.size
    nch = (n + _CHUNK - 1) // _CHUNK
    for c in prange(nch):
        for b0 in range(c * _CHUNK, min(n, (c + 1) * _CHUNK), 256):
            b1 = min(n, b0 + 256)
            nbad = 0  # pass 1 (vectorised): normal numbers and zeros (and subnormals under flush)
            for i in range(np.uintp(b0), np.uintp(b1)):
                b = np.uint32(bits[i])
                if bf16:
                    e = b & np.uint32(0x7F80)
                    sub = e == 0 and (b & np.uint32(0x7F)) != 0
                    out[i] = (b & np.uint32(0x8000)) << np.uint32(16) if (sub and flush) else b << np.uint32(16)
                    nbad += 0
                else:
                    e = b & np.uint32(0x7C00)
                    sgn = (b & np.uint32(0x8000)) << np.uint32(16)
                    out[i] = _normal16_f32bits(b, False) if e != 0 else sgn
                    special = e == np.uint32(0x7C00) or (e == 0 and (b & np.uint32(0x3FF)) != 0 and not flush)
                    nbad += 1 if special else 0
            if nbad > 0:  # pass 2: fp16 Inf/NaN and kept subnormals, exactly
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
                        if bf16:
                            b, s1 = f32_to_bf16_bits(src[i], RINT, overflow, subnormal)
                        else:
                            b, s1 = f32_to_f16_bits(src[i], RINT, overflow, subnormal)
                        out[i] = _widen16(b, bf16)
                        s |= s1
        st[c] = s
    r = np.int32(0)
    for c in range(nch):
        r |= st[c]
    return r


@njit(cache=True, parallel=True)
def round_f64_operands(src, out, bf16, overflow, subnormal):
    """out[i] = float32(fp16-or-bf16 rint(src[i])), one rounding from float64; returns the OR of statuses."""
    n = src.size
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int32)
    for c in prange(nch):
        s = np.int32(0)
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            if bf16:
                b, s1 = f64_to_bf16_bits(src[i], RINT, overflow, subnormal)
            else:
                b, s1 = f64_to_f16_bits(src[i], RINT, overflow, subnormal)
            out[i] = _widen16(b, bf16)
            s |= s1
        st[c] = s
    r = np.int32(0)
    for c in range(nch):
        r |= st[c]
    return r


# ---------------------------------------------------------------- Fixpipe: accumulator -> output

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
    r = np.int32(0)
    for c in range(nch):
        r |= st[c]
    return r


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
    """(bits, status) = fp16 (or bf16) rint(float32 v): cast.f32_to_*_bits, with a shortcut for normal results."""
    b, ok = _fast16(np.uint32(np.float32(v).view(np.uint32)), bf16)
    if ok:
        return b, 0
    if bf16:
        return f32_to_bf16_bits(v, RINT, overflow, subnormal)
    return f32_to_f16_bits(v, RINT, overflow, subnormal)


@njit(cache=True, parallel=True)
def finish_to_16(acc, out, bf16, overflow, subnormal):
    """out[i] = fp16 (or bf16) bits of fixpipe(acc[i]) rounded RNE; returns the OR of statuses."""
    n = acc.size
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int32)
    sat = overflow == SATURATION
    bits = acc.view(np.uint32)
    for c in prange(nch):
        s = np.int32(0)
        for b0 in range(c * _CHUNK, min(n, (c + 1) * _CHUNK), 256):
            b1 = min(n, b0 + 256)
            # pass 1, branch-free so it vectorises: the normal-result shortcut everywhere
            nbad = 0
            for i in range(np.uintp(b0), np.uintp(b1)):  # unsigned: no wraparound test, so it vectorises
                b, ok = _fast16(bits[i], bf16)
                out[i] = b
                nbad += 0 if ok else 1
            if nbad > 0:  # pass 2: overflow, subnormal and non-finite results through Fixpipe and the cast
                for i in range(b0, b1):
                    b, ok = _fast16(bits[i], bf16)
                    if not ok:
                        v, s1 = _fixpipe_f32(acc[i], sat)
                        b, s2 = to16(v, bf16, overflow, subnormal)
                        out[i] = b
                        s |= s1 | s2
        st[c] = s
    r = np.int32(0)
    for c in range(nch):
        r |= st[c]
    return r
