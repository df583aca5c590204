"""The cube's implicit GEMMs: tree16's product (:mod:`.tree16`: the same tiles, work items and micro-kernel code) with
the operands read in place rather than from an im2col matrix and packed slabs. :func:`matmul_tree16_tab` reads B's
16 rows of each K block at offsets from a table (a convolution's patches in a planar input: conv2d with the pixels
as columns, conv2d_backprop_input's pixel classes); :func:`matmul_tree16_gather` reads A's rows and B's column
groups at offsets from tables (the filter gradient's taps, a patch read in place). Split from :mod:`.tree16`, whose
tiling constants and LLVM emitter (``_IR``) they share.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import get_thread_id, literally, njit, prange, types
from numba.extending import intrinsic

from .tree16 import LANES, MC, NC, SLABS, TILE, VEC, _IR, _copy16, _tail_columns, _tile_init, _tile_store, _tile_store_t


def _tree16_2x2_at_codegen(fused):
    """LLVM code of _tree16_2x2 with B's 16 rows at 16 addresses given as values (column half 1 ``d`` bytes on)."""
    def codegen(context, builder, signature, args):
        m = _IR(builder)
        cp, xp, yp = (m.ptr(v) for v in args[:3])
        d, rows = args[3], args[4:20]
        m.block_2x2(cp, xp, yp, lambda l, h: m.ptr(rows[l] if h == 0 else builder.add(rows[l], d)), fused)
        return context.get_dummy_value()
    return codegen


@intrinsic(prefer_literal=True)
def _tree16_2x2_at(typingctx, c_addr, x_addr, y_addr, d, r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12,
                   r13, r14, r15, fused):
    """_tree16_2x2 with B's row l of column half 0 at address r_l and of half 1 at r_l + d (``fused`` a literal):
    the rows' addresses as values, so a loop over row pairs keeps them rather than loading a table on every
    block, so B can be read in place from rows anywhere (a planar input)."""
    if not isinstance(fused, types.BooleanLiteral):
        return None
    u = types.uintp
    return types.void(*([u] * 20), fused), _tree16_2x2_at_codegen(fused.literal_value)


@njit(cache=True)
def _k_loop_tab(fused, args):
    """One work item's K loop of matmul_tree16_tab (``fused`` a literal)."""
    literally(fused)
    c_addr, a_addr, a_row, b_addr, tab, g0, g1, i0, i1, nkb, npair, ng = args
    # column group outermost: its 16 x 32 B block of a K block (read from scattered rows) stays in L1 while
    # the row pairs pass over it; each accumulator still takes the K blocks in increasing order. The block's
    # 16 row addresses are worked out once per (group, K block), not per row pair: read from the table inside the
    # micro-kernel they were reloaded on every block, as its stores to the tile may alias the table for LLVM (the
    # CNN's tab products 6-10% faster, the same bits: benchmarks/RESULTS.md session 19)
    four = np.uintp(4)
    for g in range(ng):
        b0 = b_addr + four * g0[g]
        d = four * g1[g] - four * g0[g]   # (modulo 2**64: half 1 may lie before half 0)
        cg = c_addr + np.uintp(g * 4 * LANES * 4)
        for q in range(nkb):
            r0, r1, r2, r3 = b0 + four * tab[q, 0], b0 + four * tab[q, 1], b0 + four * tab[q, 2], b0 + four * tab[q, 3]
            r4, r5, r6, r7 = b0 + four * tab[q, 4], b0 + four * tab[q, 5], b0 + four * tab[q, 6], b0 + four * tab[q, 7]
            r8, r9, r10, r11 = (b0 + four * tab[q, 8], b0 + four * tab[q, 9], b0 + four * tab[q, 10],
                                b0 + four * tab[q, 11])
            r12, r13, r14, r15 = (b0 + four * tab[q, 12], b0 + four * tab[q, 13], b0 + four * tab[q, 14],
                                  b0 + four * tab[q, 15])
            for p in range(npair):
                i = i0 + 2 * p
                x = a_addr + np.uintp(i * a_row + 64 * q)
                y = a_addr + np.uintp(min(i + 1, i1 - 1) * a_row + 64 * q)
                _tree16_2x2_at(cg + np.uintp(p * ng * 4 * LANES * 4), x, y, d, r0, r1, r2, r3, r4, r5, r6, r7,
                               r8, r9, r10, r11, r12, r13, r14, r15, fused)


@njit(cache=True)
def _tile_store_rows(C, out, rows, i0, i1, j0, jn, npair, ng):
    """_tile_store_t with the columns' rows of ``out`` from a table: out[rows[j0 + j], i] for rows i0 <= i < i1 and
    columns j < jn (the same elements as _tile_store_t, each written where the table puts its column)."""
    for g in range(ng):
        for h in range(2):
            jb = 2 * LANES * g + LANES * h
            for l in range(max(0, min(LANES, jn - jb))):
                o = rows[j0 + jb + l]
                for p in range(npair):
                    for r in range(2):
                        i = i0 + 2 * p + r
                        if i < i1:
                            out[o, i] = C[p, g, 2 * h + r, l]


@njit(cache=True, parallel=True)
def matmul_tree16_tab(A, b, tab, g0, g1, bias, bias_rows, out, tiles, fma=False, mc=MC, store_t=False,
                      out_rows=None):
    """matmul_tree16's product of A (1, M, Kp) and a B read in place: out[i, j] = bias[0, j] (bias[0, i] if
    ``bias_rows``), then for every K block q ``out[i, j] += tree16(A[0, i, 16q:16q+16], B[16q:16q+16, j])`` as
    matmul_tree16 sums it, where B[16q + l, 32g + 16h + m] = b[g_h[g] + tab[q, l] + m] (b flat float32, tab
    (Kp/16, 16) and g0 / g1 (one entry per 32-column group) uintp): each 16 columns of B are 16 consecutive
    floats, its rows anywhere. The caller makes every read fall inside b (columns past N included: computed,
    never stored) and the K padding read +0. ``store_t``: ``out`` is (N, M), written transposed (out[j, i]).
    ``out_rows`` (uintp, one entry per column, with ``store_t``): out is (any rows, M) and column j goes to its row
    out_rows[j] (out[out_rows[j], i]; N = out_rows.size): a pixel class written straight into the whole output."""
    if out_rows is not None:
        N, M = out_rows.size, out.shape[1]
        if not store_t:
            raise ValueError("matmul_tree16_tab: out_rows needs store_t")
        for v in out_rows:
            if v >= out.shape[0]:
                raise ValueError("matmul_tree16_tab: an out_rows entry is past out's rows")
    elif store_t:
        N, M = out.shape
    else:
        M, N = out.shape
    nkb = A.shape[2] // 16
    if not 1 <= mc <= MC:
        raise ValueError("matmul_tree16_tab: mc (rows per work item) must be in 1..MC")
    if tiles.shape[1] < TILE or tiles.strides[1] != 4:
        raise ValueError("matmul_tree16_tab: tiles must be (threads, TILE) float32, one row per Numba thread")
    njt = (N + NC - 1) // NC
    ngt = -(-N // (2 * LANES))
    if (A.shape[1] < M or A.strides[2] != 4 or tab.shape[0] != nkb or tab.shape[1] != 16 or g0.size < ngt
            or g1.size < ngt or not tab.flags.c_contiguous or not b.flags.c_contiguous):
        raise ValueError("matmul_tree16_tab: operands and offset tables do not match the product's shape")
    if nkb > 0 and M > 0 and N > 0:
        t = np.uintp(0)
        for v in tab.reshape(-1):
            t = max(t, v)
        g = np.uintp(0)
        for k in range(ngt):
            g = max(g, max(g0[k], g1[k]))
        if t + g + 16 > b.size:
            raise ValueError("matmul_tree16_tab: an offset reads past b")
    nch = (M + mc - 1) // mc
    b_addr = b.ctypes.data
    At = A[0]
    for w in prange(nch * njt):
        i0 = (w // njt) * mc
        i1 = min(M, i0 + mc)
        jt = w % njt
        j0 = jt * NC
        jn = min(N, j0 + NC) - j0
        ng = _tail_columns(jn) // (2 * LANES)
        npair = (i1 - i0 + 1) // 2
        C = tiles[get_thread_id(), :npair * ng * 4 * LANES].reshape(npair, ng, 4, LANES)
        _tile_init(C, bias, 0, bias_rows, i0, i1, j0, jn, npair, ng)
        gs = j0 // (2 * LANES)
        args = (C.ctypes.data, At.ctypes.data, At.strides[0], b_addr, tab, g0[gs:], g1[gs:], i0, i1, nkb,
                npair, ng)
        if fma:
            _k_loop_tab(True, args)
        else:
            _k_loop_tab(False, args)
        if out_rows is not None:
            _tile_store_rows(C, out, out_rows, i0, i1, j0, jn, npair, ng)
        elif store_t:
            _tile_store_t(C, out, i0, i1, j0, jn, npair, ng)
        else:
            _tile_store(C, out, i0, i1, j0, jn, npair, ng)


def _tree16_2x2_halves_codegen(fused, width, halves):
    """LLVM code of _tree16_2x2 with each column half's B at its own address (row l of half h at b_h + 4 * width * l
    bytes) for the first ``halves`` halves."""
    def codegen(context, builder, signature, args):
        m = _IR(builder)
        cp, b0, b1, xp, yp = (m.ptr(v) for v in args[:5])
        m.block_2x2(cp, xp, yp, lambda l, h: m.at((b0, b1)[h], width * l), fused, halves)
        return context.get_dummy_value()
    return codegen


@intrinsic(prefer_literal=True)
def _tree16_2x2_halves(typingctx, c_addr, b0_addr, b1_addr, x_addr, y_addr, width, fused, halves):
    """_tree16_2x2 with the two column halves' B at two addresses (``width``, ``fused`` and ``halves`` literals):
    ``halves`` 1 computes the first half only (a 32-column group whose second half no stored column needs)."""
    if not all(isinstance(v, types.IntegerLiteral) for v in (width, halves)) \
            or not isinstance(fused, types.BooleanLiteral) or halves.literal_value not in (1, 2):
        return None
    u = types.uintp
    sig = types.void(u, u, u, u, u, width, fused, halves)
    return sig, _tree16_2x2_halves_codegen(fused.literal_value, width.literal_value, halves.literal_value)


def _tree16_8x1_codegen(fused, width):
    """LLVM code of _tree16_2x2_halves with ``halves`` 1 for four row pairs at once: for row pair p < 4 (A's rows at
    x[2p] and x[2p + 1]) C_p[16r : 16r+16] += tree16(row r of the pair, B), C_p at c + p * ``pair`` bytes, B's 16 rows
    ``width`` floats apart from b. Each element's nodes and operand order are block_2x2's (:meth:`_IR.tree`, then the
    accumulator plus the tree); only the B vectors are loaded once for eight rows rather than two."""
    def codegen(context, builder, signature, args):
        m = _IR(builder)
        c, pair, bp = args[0], args[1], m.ptr(args[2])
        xs = [m.ptr(v) for v in args[3:11]]
        cs = [m.ptr(builder.add(c, builder.mul(pair, ir.Constant(ir.IntType(64), p)))) for p in range(4)]
        if VEC != LANES:   # (the 8-lane emission: row_8 row by row, as block_2x2 does)
            for k in range(8):
                m.row_8(cs[k // 2], k % 2, xs[k], lambda l, h: m.at(bp, width * l), fused, 1)
            return context.get_dummy_value()
        b = [builder.load(builder.bitcast(m.at(bp, width * l), m.vptr), align=4) for l in range(16)]
        for k in range(8):
            a = [m.broadcast(xs[k], l) for l in range(16)]
            slot = builder.bitcast(m.at(cs[k // 2], LANES * (k % 2)), m.vptr)
            builder.store(builder.fadd(builder.load(slot, align=4), m.tree(a, b, fused)), slot, align=4)
        return context.get_dummy_value()
    return codegen


@intrinsic(prefer_literal=True)
def _tree16_8x1(typingctx, c_addr, pair, b_addr, x0, x1, x2, x3, x4, x5, x6, x7, width, fused):
    """_tree16_2x2_halves(.., halves=1) of the row pairs (x0, x1), .. (x6, x7) into the tile blocks c_addr + p * pair
    (p < 4), the 16 B vectors loaded once (``width``, ``fused`` literals): a product of at most 16 columns (the CNN's
    input gradient with 16 in-channels, its first filter gradient with 16 out-channels) computes eight rows a block
    (benchmarks/RESULTS.md session 22: 12-25% less time than a row pair a block)."""
    if not isinstance(width, types.IntegerLiteral) or not isinstance(fused, types.BooleanLiteral):
        return None
    u = types.uintp
    return types.void(*([u] * 11), width, fused), _tree16_8x1_codegen(fused.literal_value, width.literal_value)


# the slab widths matmul_tree16_gather takes besides SLABS: a weight gradient's B read in place, 16 pixels
# of one output row ``stride * channels`` floats apart (16 and 32: strides 1 and 2 over 16 channels)
GATHER_WIDTHS = SLABS + (16, 32, 64)


@njit(cache=True)
def _k_loop_gather(width, fused, args):
    """_k_loop with the operands read where offset tables say (floats from a_addr / b_addr):
    row i of A's K block q at a_rows[i] + a_q[q], B's K block q, column group g's first 16-column half at
    b_q[q] + b_g[g], its second at b_q[q] + b_g1[g] (each half's 16 rows ``width`` floats apart)."""
    literally(width)
    literally(fused)
    c_addr, a_addr, a_rows, a_q, b_addr, b_q, b_g, b_g1, i0, i1, nkb, npair, ng, half = args
    # the last group's second half only where some stored column needs it (``half``: it computes its first
    # 16 columns alone: a 16-column product does half the work)
    nf = ng - 1 if half else ng
    # at most 16 columns (one group's first half): four row pairs a block (_tree16_8x1), the last 0-3 pairs one by one
    octs = npair // 4 if half and nf == 0 else 0
    pair = np.uintp(ng * 4 * LANES * 4)   # bytes from one row pair's tile block to the next
    four = np.uintp(4)
    for q in range(nkb):
        aq = a_addr + four * a_q[q]
        bq = b_addr + four * b_q[q]
        if octs:
            b0 = bq + four * b_g[0]
            for o in range(octs):
                i = i0 + 8 * o
                _tree16_8x1(c_addr + np.uintp(4 * o) * pair, pair, b0, aq + four * a_rows[i],
                            aq + four * a_rows[i + 1], aq + four * a_rows[i + 2], aq + four * a_rows[i + 3],
                            aq + four * a_rows[i + 4], aq + four * a_rows[i + 5], aq + four * a_rows[i + 6],
                            aq + four * a_rows[min(i + 7, i1 - 1)], width, fused)
        for p in range(4 * octs, npair):   # (the row pairs the blocks of four left, or all of them)
            i = i0 + 2 * p
            x = aq + four * a_rows[i]
            y = aq + four * a_rows[min(i + 1, i1 - 1)]
            c = c_addr + np.uintp(p) * pair
            for g in range(nf):
                _tree16_2x2_halves(c + np.uintp(g * 4 * LANES * 4), bq + four * b_g[g], bq + four * b_g1[g], x, y,
                                   width, fused, 2)
            if half:
                _tree16_2x2_halves(c + np.uintp(nf * 4 * LANES * 4), bq + four * b_g[nf], bq + four * b_g1[nf], x,
                                   y, width, fused, 1)


@njit(cache=True)
def _passes_gather(width, fused, args):
    """_k_loop_gather for the width ``width`` (a literal) with ``fused`` made a literal too."""
    literally(width)
    if fused:
        _k_loop_gather(width, True, args)
    else:
        _k_loop_gather(width, False, args)


@njit(cache=True)
def _max_offset(rows, blocks):
    """The largest rows[i] + blocks[q] (0 for an empty table)."""
    m = np.uintp(0)
    for v in rows:
        m = max(m, v)
    n = np.uintp(0)
    for v in blocks:
        n = max(n, v)
    return m + n if rows.size and blocks.size else np.uintp(0)


@njit(cache=True)
def _tile_store_at(C, out, rows, i0, i1, j0, jn, npair, ng):
    """_tile_store with the rows of ``out`` from a table: out[rows[i], j0 + j] for rows i0 <= i < i1 and columns
    j < jn (the same elements, each row where the table puts it)."""
    contiguous = out.strides[1] == 4 and C.strides[3] == 4 and C.strides[2] == 4 * LANES and C.strides[1] == 16 * LANES \
        and C.strides[0] == 16 * LANES * ng
    whole = jn // LANES if contiguous else 0
    cb = C.ctypes.data
    ob = out.ctypes.data
    for p in range(npair):
        for r in range(2):
            i = i0 + 2 * p + r
            if i >= i1:
                break
            o = rows[i]
            for v in range(2 * ng):
                g, h = v >> 1, v & 1
                if v < whole:
                    _copy16(ob + np.uintp(o * out.strides[0] + (j0 + LANES * v) * 4),
                            cb + np.uintp((((p * ng + g) * 4 + 2 * h + r) * LANES) * 4))
                else:
                    for l in range(max(0, min(LANES, jn - LANES * v))):
                        out[o, j0 + LANES * v + l] = C[p, g, 2 * h + r, l]


@njit(cache=True, parallel=True)
def matmul_tree16_gather(a, a_rows, a_q, b, b_q, b_g, width, bias, bias_rows, out, tiles, fma=False, mc=MC,
                         b_g1=None, out_rows=None):
    """matmul_tree16's product with A and B read in place rather than from an im2col matrix and packed
    slabs (an implicit GEMM): out[i, j] = bias[0, j] (bias[0, i] if ``bias_rows``), then for every K block q
    ``out[i, j] += tree16(A[i, 16q:16q+16], B[16q:16q+16, j])`` as matmul_tree16 sums it, where
    A[i, 16q + l] = a.flat[a_rows[i] + a_q[q] + l] and B[16q + l, 32g + 16h + m] = b.flat[b_q[q] + b_g[g]
    + width*l + 16h + m] (``a``, ``b`` float32; offset tables uintp; ``width`` one of GATHER_WIDTHS); with
    ``b_g1``, a column group's second half at b.flat[b_q[q] + b_g1[g] + width*l + m] instead.
    The caller makes every one of those reads fall inside a and b, the K padding included (+0 products
    there), for every column group up to the 2x2 block edge (columns past N are computed, never stored); a
    last group's second half that holds no column below N is not computed, yet its offset must still pass the
    up-front bounds check (a read that would fall outside raises ValueError). ``out_rows`` (uintp, one entry per
    row): out is (any rows, N) and row i goes to out[out_rows[i]] (M = out_rows.size): a pixel class written
    straight into the whole output."""
    if out_rows is not None:
        M, N = out_rows.size, out.shape[1]
        for v in out_rows:
            if v >= out.shape[0]:
                raise ValueError("matmul_tree16_gather: an out_rows entry is past out's rows")
    else:
        M, N = out.shape
    nkb = a_q.size
    if not 1 <= mc <= MC:
        raise ValueError("matmul_tree16_gather: mc (rows per work item) must be in 1..MC")
    if tiles.shape[1] < TILE or tiles.strides[1] != 4:
        raise ValueError("matmul_tree16_gather: tiles must be (threads, TILE) float32, one row per Numba thread")
    njt = (N + NC - 1) // NC
    ngt = -(-N // (2 * LANES))
    if b_g1 is None:
        g1 = b_g + np.uintp(LANES)
    else:
        g1 = b_g1
    if (b_q.size != nkb or a_rows.size < M or b_g.size < ngt or g1.size < ngt or not a.flags.c_contiguous
            or not b.flags.c_contiguous):
        raise ValueError("matmul_tree16_gather: offset tables do not match the product's shape")
    if nkb > 0 and M > 0 and N > 0 and (_max_offset(a_rows[:M], a_q) + 16 > a.size or
                                        _max_offset(b_g[:ngt], b_q) + width * 15 + LANES > b.size or
                                        _max_offset(g1[:ngt], b_q) + width * 15 + LANES > b.size):
        raise ValueError("matmul_tree16_gather: an offset reads past the operand arrays")
    if width not in GATHER_WIDTHS:
        raise ValueError("matmul_tree16_gather: width must be one of GATHER_WIDTHS")
    nch = (M + mc - 1) // mc
    af = a.reshape(-1)
    bf = b.reshape(-1)
    a_addr = af.ctypes.data
    b_addr = bf.ctypes.data
    for w in prange(nch * njt):
        i0 = (w // njt) * mc
        i1 = min(M, i0 + mc)
        jt = w % njt
        j0 = jt * NC
        jn = min(N, j0 + NC) - j0
        ng = _tail_columns(jn) // (2 * LANES)
        npair = (i1 - i0 + 1) // 2
        C = tiles[get_thread_id(), :npair * ng * 4 * LANES].reshape(npair, ng, 4, LANES)
        _tile_init(C, bias, 0, bias_rows, i0, i1, j0, jn, npair, ng)
        gs = j0 // (2 * LANES)
        args = (C.ctypes.data, a_addr, a_rows, a_q, b_addr, b_q, b_g[gs:], g1[gs:], i0, i1, nkb, npair, ng,
                jn - 2 * LANES * (ng - 1) <= LANES)
        if width == SLABS[4]:
            _passes_gather(SLABS[4], fma, args)
        elif width == SLABS[3]:
            _passes_gather(SLABS[3], fma, args)
        elif width == SLABS[2]:
            _passes_gather(SLABS[2], fma, args)
        elif width == SLABS[1]:
            _passes_gather(SLABS[1], fma, args)
        elif width == SLABS[0]:
            _passes_gather(SLABS[0], fma, args)
        elif width == 32:
            _passes_gather(32, fma, args)
        elif width == 16:
            _passes_gather(16, fma, args)
        else:
            _passes_gather(64, fma, args)
        if out_rows is not None:
            _tile_store_at(C, out, out_rows, i0, i1, j0, jn, npair, ng)
        else:
            _tile_store(C, out, i0, i1, j0, jn, npair, ng)
