"""The default cube model (block 16, tree) at speed: B packed into slabs, an LLVM micro-kernel.

Each output element is the bias, then per K block of 16 ``acc = fl32(acc + tree16(...))``,
the 16 products summed by a balanced tree of fp32 adders (:func:`tree16`). The
micro-kernel computes that tree for 2 rows of A and 32 columns of B at once as explicit
LLVM vector code; the tiling, the packing of B and the kernel depend on each other's
constants and stay together here.
"""
from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import binding as _llvm
from llvmlite import ir
from numba import get_thread_id, literally, njit, prange, types
from numba.extending import intrinsic

from .. import alloc

# Work item of the tree16 kernel: MC output rows x NC output columns, accumulated in the thread's
# tile (aligned to 64 bytes) laid out so a 2-row x 32-column block's four 16-lane vectors are
# contiguous. B is packed once into slabs of 16 rows of W floats, W one of SLABS (the smallest
# holding min(N, NC) columns, +16 so the 16 rows do not share cache sets as rows 4 KiB apart
# would); W is a compile-time constant of the micro-kernel, so the 16 row offsets are immediates. The micro-kernel (_tree16_2x2_*) is written as explicit LLVM vector
# code: for 2 rows of A and 32 columns of B it loads each B vector once for both rows and each
# broadcast A value once for both column halves (LLVM's loop vectoriser would not register-block
# this: its runtime alias checks between the tile and the slab fail the check budget); on an
# AVX2-only host it is emitted in 8-lane vectors one row at a time instead (VEC, _IR.row_8). MC and NC
# were chosen by measurement on the 2-core Zen 5 it was tuned on (benchmarks/RESULTS.md): MC 128
# keeps a column tile's B stream from L3 down to M/128 passes; the slab (33 KiB) stays in the 48
# KiB L1 while the row pairs pass over it.
MC = 128
NC = 512
SLABS = (48, 80, 144, 272, 528)  # 32 * 2**k + 16 floats per slab row; the last is NC + 16
LANES = 16  # floats per vector of the tile layout (one AVX-512 register; the emitted width is VEC)
# floats of accumulator tile per thread: MC/2 row pairs x NC/32 column groups x 4 vectors
TILE = (MC // 2) * (NC // (2 * LANES)) * 4 * LANES


@njit(cache=True)
def tree16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,
           b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15):
    """(((a0b0 + a1b1) + (a2b2 + a3b3)) + (...)) + (...): the 16-leaf fp32 adder tree."""
    return ((((a0 * b0 + a1 * b1) + (a2 * b2 + a3 * b3)) + ((a4 * b4 + a5 * b5) + (a6 * b6 + a7 * b7)))
            + (((a8 * b8 + a9 * b9) + (a10 * b10 + a11 * b11)) + ((a12 * b12 + a13 * b13) + (a14 * b14 + a15 * b15))))


def _narrow_vectors() -> bool:
    """Whether the micro-kernel is emitted as 8-lane sub-blocks (:data:`VEC`): on an x86 host without
    AVX-512F, decided once at import from LLVM's host CPU features."""
    # a 16-lane vector is two ymm registers on AVX2: the 2x2 block's 32 B vectors and 32 broadcasts
    # spilled ~230 times per call; as 8-lane sub-blocks of one row x 32 columns with the tree summed
    # as a binary counter over the K pairs it needs at most 14 of the 16 ymm registers. A portable
    # build (NUMBA_CPU_NAME set) keeps the 16-lane code: correct on every target, as is this one.
    if numba.config.CPU_NAME not in (None, "host") or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    f = _llvm.get_host_cpu_features()
    return bool(f.get("avx2", False)) and not f.get("avx512f", False)


#: floats per vector of the emitted micro-kernel: LANES (AVX-512 and others), 8 on an AVX2-only x86 host.
#: The tile layout, slabs and tables are LANES-based either way; the same adds in the same order per element.
VEC = 8 if _narrow_vectors() else LANES


class _IR:
    """The LLVM pieces both 2x2 micro-kernels are written with (one builder's types, the vector fma, loads)."""

    def __init__(self, builder):
        self.b = builder
        f32 = ir.FloatType()
        self.i32, self.i64 = ir.IntType(32), ir.IntType(64)
        self.vec = ir.VectorType(f32, VEC)
        self.vptr, self.fptr = self.vec.as_pointer(), f32.as_pointer()
        fma = builder.module.globals.get(f"llvm.fma.v{VEC}f32")
        if fma is None:
            fma = ir.Function(builder.module, ir.FunctionType(self.vec, [self.vec] * 3), f"llvm.fma.v{VEC}f32")
        self.fma = fma
        self.undef = ir.Constant(self.vec, ir.Undefined)
        self.splat = ir.Constant(ir.VectorType(self.i32, VEC), [0] * VEC)

    def ptr(self, addr):
        return self.b.inttoptr(addr, self.fptr)

    def at(self, p, off):
        return self.b.gep(p, [ir.Constant(self.i64, off)])

    def load(self, p, off):
        return self.b.load(self.b.bitcast(self.at(p, off), self.vptr), align=4)

    def broadcast(self, p, l):
        v = self.b.insert_element(self.undef, self.b.load(self.at(p, l), align=4), ir.Constant(self.i32, 0))
        return self.b.shuffle_vector(v, self.undef, self.splat)

    def pair(self, a0, b0, a1, b1, fused):
        """One first-level node fl(a0 b0 + a1 b1): fma(a0, b0, fl(a1 b1)) when ``fused`` (exact products)."""
        bd = self.b
        if fused:
            return bd.call(self.fma, [a0, b0, bd.fmul(a1, b1)])
        return bd.fadd(bd.fmul(a0, b0), bd.fmul(a1, b1))

    def tree(self, a, b, fused):
        """tree16 of 16 vectors a and b; the first level fl(a0 b0 + a1 b1) in one rounding when the products
        are exact (``fused``: fma(a0, b0, fl(a1 b1))), else two."""
        bd = self.b
        level = [self.pair(a[2 * m], b[2 * m], a[2 * m + 1], b[2 * m + 1], fused) for m in range(8)]
        while len(level) > 1:
            level = [bd.fadd(level[2 * m], level[2 * m + 1]) for m in range(len(level) // 2)]
        return level[0]

    def block_2x2(self, cp, xp, yp, brow, fused, halves=2):
        """C[16s : 16s+16] += tree16(row r of A, column half h of B) for s = 2h + r, r in {0, 1}, h < ``halves``
        (2; 1: the first half only, the 2 x 16 block of a product's last 16 columns); A's rows at xp and yp,
        row l of B's column half h at ``brow(l, h)`` (a float pointer). With VEC = LANES: both rows'
        broadcast A values and each half's 16 B vectors loaded once; with VEC = 8: :meth:`row_8`."""
        if VEC != LANES:
            for r, p in enumerate((xp, yp)):
                self.row_8(cp, r, p, brow, fused, halves)
            return
        bd = self.b
        rows = [[self.broadcast(p, l) for l in range(16)] for p in (xp, yp)]
        for h in range(halves):
            b = [bd.load(bd.bitcast(brow(l, h), self.vptr), align=4) for l in range(16)]
            for r in range(2):
                slot = bd.bitcast(self.at(cp, LANES * (2 * h + r)), self.vptr)
                acc = bd.load(slot, align=4)
                bd.store(bd.fadd(acc, self.tree(rows[r], b, fused)), slot, align=4)

    def row_8(self, cp, r, p, brow, fused, halves=2):
        """Row r of block_2x2 (A's row at p) in 8-lane vectors: its 4 column chunks (2 with ``halves`` 1) K pair by
        K pair, each tree summed as a binary counter (the same nodes with their operands in the same order as
        :meth:`tree`), so at most 3 partial sums per chunk are live; each B vector is loaded where it is used (a
        memory operand)."""
        # measured on the Zen 3 (AVX2) host, one thread, in cache: ~1.5x the 16-lane block; 2 rows x 16
        # columns sharing B vectors (fewer loads) or 2 rows x 8 columns spill more and measured no faster
        bd = self.b
        parts = [(h, VEC * j) for h in range(halves) for j in range(LANES // VEC)]
        stacks = [[] for _ in parts]   # per chunk: (level, partial sum), levels strictly decreasing
        for m in range(8):
            a0, a1 = self.broadcast(p, 2 * m), self.broadcast(p, 2 * m + 1)
            for c, (h, o) in enumerate(parts):
                v = self.pair(a0, self.load(brow(2 * m, h), o), a1, self.load(brow(2 * m + 1, h), o), fused)
                level, st = 0, stacks[c]
                while st and st[-1][0] == level:
                    v = bd.fadd(st.pop()[1], v)
                    level += 1
                st.append((level, v))
        for c, (h, o) in enumerate(parts):
            ptr = bd.bitcast(self.at(cp, LANES * (2 * h + r) + o), self.vptr)
            bd.store(bd.fadd(bd.load(ptr, align=4), stacks[c].pop()[1]), ptr, align=4)


def _tree16_2x2_codegen(fused, width):
    """LLVM code for C[16s : 16s+16] += tree16(row r of A, column half h of B), s = 2h + r, h, r in {0, 1},
    B's 16 rows ``width`` floats apart."""
    def codegen(context, builder, signature, args):
        m = _IR(builder)
        cp, bp, xp, yp = (m.ptr(v) for v in args[:4])
        m.block_2x2(cp, xp, yp, lambda l, h: m.at(bp, width * l + LANES * h), fused)
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
def _k_loop(width, fused, args):
    """One work item's K loop: for every K block q, row pair p and 32-column group g, the 2x2 block;
    args = (C, A, A's row stride, B, B's block stride (addresses and strides in bytes), i0, i1, nkb, npair, ng)."""
    # width and fused are compile-time constants (one compiled loop nest per slab width and
    # product kind: a run-time choice inside the loop measured ~25% slower)
    literally(width)
    literally(fused)
    c_addr, a_addr, a_row, b_addr, b_block, i0, i1, nkb, npair, ng = args
    for q in range(nkb):
        bq = b_addr + np.uintp(q * b_block)
        for p in range(npair):
            i = i0 + 2 * p
            x = a_addr + np.uintp(i * a_row + 64 * q)
            y = a_addr + np.uintp(min(i + 1, i1 - 1) * a_row + 64 * q)
            c = c_addr + np.uintp(p * ng * 4 * LANES * 4)
            for g in range(ng):
                _tree16_2x2(c + np.uintp(g * 4 * LANES * 4), bq + np.uintp(g * 2 * LANES * 4), x, y, width, fused)


@njit(cache=True)
def _passes(width, fused, args):
    """_k_loop for the slab width ``width`` (a literal) with ``fused`` made a literal too."""
    literally(width)
    if fused:
        _k_loop(width, True, args)
    else:
        _k_loop(width, False, args)


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
    return alloc.empty(shape, np.float32, align=True)


@njit(cache=True)
def _tail_columns(jn):
    """Columns a tile of jn real columns computes: jn rounded up to the 32 of a 2x2 block."""
    return min(NC, -(-jn // (2 * LANES)) * (2 * LANES))


@njit(cache=True, inline="always")
def _slab_item(w, njt, nkb, N):
    """Work item ``w`` of the packing kernels' loop over (stack, column tile, K block) of slabs (nb, njt, nkb, 16,
    NC): (stack t, tile jt, K block q, the tile's first column j0, its real columns jn of N)."""
    t = w // (njt * nkb)
    jt = (w // nkb) % njt
    j0 = jt * NC
    return t, jt, w % nkb, j0, min(N, j0 + NC) - j0


@njit(cache=True, parallel=True)
def pack_b(B, Bp):
    """Bp[t, jt, q, l, j] = B[t, 16q + l, jt*NC + j] (+0 from column N up to the 2x2 block edge)."""
    # Bp is allocated by the caller (empty_slabs: aligned; numpy asks the kernel for huge pages,
    # a fresh Numba array of this size costs a page fault per 4 KiB). Columns past that edge are never read.
    nb, Kp, N = B.shape
    nkb = Kp // 16
    njt = (N + NC - 1) // NC
    for w in prange(nb * njt * nkb):
        t, jt, q, j0, jn = _slab_item(w, njt, nkb, N)
        for l in range(16):
            Bp[t, jt, q, l, :jn] = B[t, 16 * q + l, j0:j0 + jn]
            Bp[t, jt, q, l, jn:_tail_columns(jn)] = np.float32(0.0)


@intrinsic
def _copy16(typingctx, dst, src):
    """16 floats from address ``src`` to address ``dst``: one vector load and store (LLVM does not vectorise
    a 16-float loop between two arrays it cannot tell apart: its alias checks cost more than the copy)."""
    def codegen(context, builder, signature, args):
        vt = ir.VectorType(ir.FloatType(), LANES).as_pointer()
        v = builder.load(builder.inttoptr(args[1], vt), align=4)
        builder.store(v, builder.inttoptr(args[0], vt), align=4)
        return context.get_dummy_value()
    return types.void(types.uintp, types.uintp), codegen


@njit(cache=True)
def _tile_init(C, bias, tc, bias_rows, i0, i1, j0, jn, npair, ng):
    """A work item's tile (npair, ng, 4, LANES) from the bias: row tc of ``bias``, one value per output row
    if ``bias_rows``, else per column j0 + j (j < jn)."""
    if bias_rows:   # one value per row: a fill
        for p in range(npair):
            for s in range(4):
                v = bias[tc, min(i0 + 2 * p + (s & 1), i1 - 1)]  # an odd last row is computed twice, stored once
                for g in range(ng):
                    for l in range(LANES):
                        C[p, g, s, l] = v
        return
    if npair == 0:
        return
    # per column: every row pair's (ng, 4, LANES) block is the same, made once and copied in one long loop
    # (the vectorised copy: 16 floats at a time per (p, s, g) measured 113 us for a 512 x 512 product's
    # tiles, this 27); the columns past the tile's last repeat its last one's bias (never stored)
    for s in range(4):
        for g in range(ng):
            jb = 2 * LANES * g + LANES * (s >> 1)
            for l in range(LANES):
                C[0, g, s, l] = bias[tc, j0 + min(jb + l, jn - 1)]
    flat = C.reshape(npair, ng * 4 * LANES)
    first = flat[0]
    for p in range(1, npair):
        row = flat[p]
        for x in range(ng * 4 * LANES):
            row[x] = first[x]


@njit(cache=True)
def _tile_store(C, out, i0, i1, j0, jn, npair, ng):
    """out[i, j0 + j] = the tile's element for rows i0 <= i < i1 and columns j < jn (2-D out)."""
    # whole 16-column vectors of a row with contiguous columns by _copy16 (130 -> 65 us for a 512 x 512
    # product), out's row in increasing columns; the rest element by element
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
            for v in range(2 * ng):
                g, h = v >> 1, v & 1
                if v < whole:
                    _copy16(ob + np.uintp(i * out.strides[0] + (j0 + LANES * v) * 4),
                            cb + np.uintp((((p * ng + g) * 4 + 2 * h + r) * LANES) * 4))
                else:
                    for l in range(max(0, min(LANES, jn - LANES * v))):
                        out[i, j0 + LANES * v + l] = C[p, g, 2 * h + r, l]


@njit(cache=True)
def _tile_store_t(C, outT, i0, i1, j0, jn, npair, ng):
    """_tile_store into the transposed output: outT[j0 + j, i] for rows i0 <= i < i1 and columns j < jn."""
    for g in range(ng):
        for h in range(2):
            jb = 2 * LANES * g + LANES * h
            for l in range(max(0, min(LANES, jn - jb))):
                j = j0 + jb + l
                for p in range(npair):
                    for r in range(2):
                        i = i0 + 2 * p + r
                        if i < i1:
                            outT[j, i] = C[p, g, 2 * h + r, l]


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
        _tile_init(C, bias, tc, bias_rows, i0, i1, j0, jn, npair, ng)
        args = (C.ctypes.data, At.ctypes.data, At.strides[0], Bt.ctypes.data, Bt.strides[0], i0, i1, nkb, npair, ng)
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
        _tile_store(C, out[t], i0, i1, j0, jn, npair, ng)


@intrinsic
def _fma32(typingctx, x, y, z):
    """fl(x * y + z) with one rounding (llvm.fma.f32), as the micro-kernel's fused first tree level."""
    if not (x == y == z == types.float32):
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = builder.module.globals.get("llvm.fma.f32")
        if fn is None:
            fn = ir.Function(builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32")
        return builder.call(fn, list(args))
    return types.float32(types.float32, types.float32, types.float32), codegen


@njit(cache=True)
def _tree16_at(a, b, fused):
    """tree16 of a[0:16] and b[0:16], the first level fma(a0, b0, a1 b1) when ``fused`` (as _tree16_2x2)."""
    if fused:
        l0 = _fma32(a[0], b[0], a[1] * b[1])
        l1 = _fma32(a[2], b[2], a[3] * b[3])
        l2 = _fma32(a[4], b[4], a[5] * b[5])
        l3 = _fma32(a[6], b[6], a[7] * b[7])
        l4 = _fma32(a[8], b[8], a[9] * b[9])
        l5 = _fma32(a[10], b[10], a[11] * b[11])
        l6 = _fma32(a[12], b[12], a[13] * b[13])
        l7 = _fma32(a[14], b[14], a[15] * b[15])
    else:
        l0 = a[0] * b[0] + a[1] * b[1]
        l1 = a[2] * b[2] + a[3] * b[3]
        l2 = a[4] * b[4] + a[5] * b[5]
        l3 = a[6] * b[6] + a[7] * b[7]
        l4 = a[8] * b[8] + a[9] * b[9]
        l5 = a[10] * b[10] + a[11] * b[11]
        l6 = a[12] * b[12] + a[13] * b[13]
        l7 = a[14] * b[14] + a[15] * b[15]
    return ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))


@njit(cache=True)
def matmul_tree16_small(A, B, bias, ia, ib, out, K, fma):
    """matmul_tree16's result for a small product, on one thread with no packing:
    out[t,i,j] = bias[t',j] (t' = t if bias has a row per product, else 0), then per K block q of 16
    ``acc = fl32(acc + tree16(A[ia[t],i,16q:16q+16], B[ib[t],16q:16q+16,j]))`` with the terms from K on
    +0 x +0 (matmul_tree16's zero padding), the tree's first level fused as matmul_tree16's when ``fma``
    (the same bits for exact products). ``A`` (BA, M, K), ``B`` (BB, K, N) float32. Returns whether a
    result is NaN: which NaN (its sign) the packed kernel's vector code gives depends on the operand order
    its instructions got, so the caller then runs matmul_tree16 itself."""
    nb, M, N = out.shape
    nkb = (K + 15) // 16
    a = np.zeros(16, dtype=np.float32)
    b = np.zeros((N, 16), dtype=np.float32)
    for t in range(nb):
        At = A[ia[t]]
        Bt = B[ib[t]]
        tc = t if bias.shape[0] > 1 else 0
        for i in range(M):
            for j in range(N):
                out[t, i, j] = bias[tc, j]
        for q in range(nkb):
            k0 = 16 * q
            kn = min(16, K - k0)
            for j in range(N):
                for l in range(kn):
                    b[j, l] = Bt[k0 + l, j]
                for l in range(kn, 16):
                    b[j, l] = np.float32(0.0)
            for i in range(M):
                for l in range(kn):
                    a[l] = At[i, k0 + l]
                for l in range(kn, 16):
                    a[l] = np.float32(0.0)
                for j in range(N):
                    out[t, i, j] = out[t, i, j] + _tree16_at(a, b[j], fma)
    nan = False
    for t in range(nb):
        for i in range(M):
            for j in range(N):
                nan |= out[t, i, j] != out[t, i, j]
    return nan
