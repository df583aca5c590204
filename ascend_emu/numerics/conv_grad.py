"""The two gradients of conv2d on the cube unit (NHWC): conv2d_backprop_filter and conv2d_backprop_input.

The pipeline of :mod:`.cube_core` over the geometry and operand layouts of :mod:`.conv` (the K order of
``_k_offsets``, NUMERICS.md section 3), with the implicit GEMMs where they apply (``conv._IMPLICIT``: the
tests switch them off there to compare with the packed products).
"""
from __future__ import annotations

import functools

import numba
import numpy as np

from . import conv as _fwd
from . import policy as config
from .conv import (_IM2COL_BYTES, _any_nan, _class_runs, _filter_rows, _padded_shared, _planar_operands,
                   _planar_shared, conv2d)
from .cube_core import (_Policy, _batched, _bias_vector, _finish, _kp, _numeric, _operand_values, _padded,
                        _padded_input, _padded_input_flat, _policy, _tiles)
from ..kernels import alloc as _alloc
from ..kernels import cast as _kc
from ..kernels import cube as _k
from ..kernels import multicore as _km

# conv2d_backprop_input's implicit route: the pixel classes' products into one float32 output and one Fixpipe pass
# (False: a finish_grid_rows per class, as before; the tests compare the two)
_WHOLE_FIXPIPE = True
# ... and with 16 or 32 input channels, each class's pixels as the product's rows (matmul_tree16_gather: ~25% faster
# than the tab product for the CNN's 16-channel classes); False: the tab product (the tests compare the two)
_PIXEL_ROWS = True


def conv2d_backprop_filter(x, dy, kernel_size, strides=(1, 1), pads=((0, 0), (0, 0)), dilations=(1, 1),
                           operand_dtype="float16", out_dtype="float16", overflow_mode="inf_nan", subnormals="keep",
                           model=None, multicore=None):
    """Weight gradient of a 2-D convolution on the emulated cube unit (TF Conv2DBackpropFilter, NHWC).

    ``dw = im2col(x)^T @ dy`` as one matmul: ``dw[kh, kw, c, co]`` is the dot product over K = N*OH*OW
    output pixels in (n, oh, ow) order of the input under tap (kh, kw) with ``dy[..., co]``; pixels of
    the padding are +0. ``multicore`` may split K over the cube cores by whole samples.

    Parameters
    ----------
    x : array_like (N, H, W, Cin)
    dy : array_like (N, OH, OW, Cout)
    kernel_size : (KH, KW)
    strides, dilations : (h, w)
    pads : ((top, bottom), (left, right)) as the forward convolution padded x
    """
    pol = _policy(operand_dtype, out_dtype, overflow_mode, subnormals, model)
    x = _numeric(x, "x")
    dy = _numeric(dy, "dy")
    KH, KW = (int(k) for k in kernel_size)
    (sh, sw), (dh, dw) = strides, dilations
    N, H, W, C = x.shape
    _, OH, OW, CO = dy.shape
    R, Kc = N * OH * OW, KH * KW * C
    out_shape = (KH, KW, C, CO)
    if not pol.fast:  # the generic matmul of the patches
        xp = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
        taps = [xp[:, i * dh:i * dh + (OH - 1) * sh + 1:sh, j * dw:j * dw + (OW - 1) * sw + 1:sw, :]
                for i in range(KH) for j in range(KW)]
        cols = np.stack(taps, axis=3).reshape(R, Kc)  # rows (n, oh, ow), columns (kh, kw, cin)
        zero = np.zeros(1, dtype=np.int64)
        return _batched(cols.T[None], dy.reshape(1, R, CO), zero, zero, None, pol, out_shape, multicore, N)
    # x widened (or rounded) once into its padded buffer: each value is read by several taps. dy in the
    # operand dtype reaches the kernel as its bits, widened on the way
    target = config.COMPUTE_DTYPES.get(pol.operand)
    wide = (pol.operand == "bfloat16", pol.subnormal)
    # an implicit GEMM where the patches allow it (_filter_grad_gather): B read from xp in place. Only without
    # NaN operands: which of two NaNs meeting in a sum comes out depends on the compiled code's operand order
    gather = _filter_grad_gather(KH, KW, C, sh, sw, dh, dw, OH, OW) if _fwd._IMPLICIT else None
    # else, with a few channels at stride 1 along rows: dw itself (taps x channels as rows, A read from planar
    # x in place; dy's rows as B, in place) where the pixels of a K block are 16 consecutive floats of a plane
    taps_rows = (_fwd._IMPLICIT and gather is None and sw == 1 and OW % 16 == 0 and C < 16 and CO in _k.GATHER_WIDTHS)
    if (gather or taps_rows) and (_any_nan(x) or _any_nan(dy)):
        gather, taps_rows = None, False
    if taps_rows:
        return _filter_grad_taps_rows(x, dy, KH, KW, sh, dh, dw, pads, OH, OW, pol, multicore)
    if gather:
        # (the forward convolution's padded x when it made one in this replay: numerics/shared.py)
        xflat, xshape, sx = _padded_shared(x, pol, ((0, 0), pads[0], pads[1], (0, 0)), gather[2])
        xp = xflat[:int(np.prod(xshape))].reshape(xshape)
        bg0, bg1 = _half_offsets(KH, gather[1], dh * xshape[2] * C)
    else:
        xp, sx = _padded_input(x, pol, ((0, 0), pads[0], pads[1], (0, 0)))
    if sx:
        # the status is the patches' (the pixels some tap reads), not the whole input's
        ys, xs = (_covered(n_, k, s_, d, p[0], o) for n_, k, s_, d, p, o in
                  ((H, KH, sh, dh, pads[0], OH), (W, KW, sw, dw, pads[1], OW)))
        if len(ys) < H or len(xs) < W:
            sx = _operand_values(x[:, ys][:, :, xs], pol)[1]
    if pol.operand != "float32" and dy.dtype == target:
        dys, sd = np.ascontiguousarray(dy).view(np.uint16).reshape(R, CO), 0
    else:
        dys, sd = _operand_values(dy.reshape(R, CO), pol)
    # (the packed route's patch offsets, worked out once per geometry: _k_table; the gather reads none)
    koff = None if gather else _fwd._k_table(KH, KW, C, xp.shape[2], dh, dw, "hwc")[0]
    bounds = multicore.batch_bounds(N, OH * OW) if multicore is not None else None
    if bounds is None:
        bounds = np.array([0, R], dtype=np.int64)
    tiles = _tiles()
    zero = np.zeros(1, dtype=np.int64)
    Nc = Kc if not gather else KH * gather[1] * _k.LANES   # the product's columns
    bias = np.zeros((1, Nc), dtype=np.float32)
    parts = np.empty((len(bounds) - 1, CO * Nc), dtype=np.float32)
    for c in range(len(bounds) - 1):  # dw^T = dy^T @ im2col(x): the taps x channels as the kernel's columns
        r0, r1 = int(bounds[c]), int(bounds[c + 1])
        kp = _kp(r1 - r0)
        a = _alloc.empty((1, CO, kp), np.float32)
        _k.rows_transposed(dys, r0, r1 - r0, a[0], *wide)
        out_c = parts[c].reshape(1, CO, Nc)
        if gather:
            # K block q: the 16 pixels r0 + 16q.. of one output row, sw*C floats apart in xp; column group g: two
            # halves of 16 consecutive floats of a tap row's run of (kw, c) (_half_offsets); A's rows as
            # rows_transposed wrote them
            a_rows, a_q, bq = _gather_blocks(xp.shape, sh, sw, OH, OW, r0, kp, CO)
            mc = _k.row_block(CO, 1, numba.get_num_threads())
            _k.matmul_tree16_gather(a, a_rows, a_q, xflat, bq, bg0, sw * C,
                                    bias, False, out_c[0], tiles, pol.exact_products, mc, bg1)
            continue
        bp = _k.empty_slabs(_k.slab_shape(1, Kc, kp))
        _k.patch_rows_packed(xp, koff, sh, sw, OH, OW, r0 // (OH * OW), r1 - r0, bp)
        mc = _k.row_block(CO, bp.shape[1], numba.get_num_threads())
        _k.matmul_tree16(a, bp, bias, False, zero, zero, out_c, tiles, pol.exact_products, mc)
    if len(bounds) > 2:  # the cores' fp32 partials, atomic-added in arrival order
        acc = np.empty(CO * Nc, dtype=np.float32)
        _km.combine_f32(parts, np.ascontiguousarray(multicore.order(len(bounds) - 1), dtype=np.int64), acc)
    else:
        acc = parts[0]
    if gather:   # the real columns (kh, kw, c), in that order
        acc = np.ascontiguousarray(acc.reshape(CO, Nc)[:, gather[0]]).reshape(-1)
    # the Fixpipe reads dw^T (CO, Kc) and writes dw (Kc, CO) directly
    out = _alloc.empty(out_shape, np.float32 if pol.out == "float32" else np.uint16)
    sf = _k.finish_grid(acc.reshape(CO, Kc), out, 0, Kc, 1, Kc, 1, Kc, 0, 0, 1, 1, pol.out == "bfloat16",
                        pol.overflow, pol.subnormal)
    if pol.out != "float32":
        out = out.view(config.COMPUTE_DTYPES[pol.out])
    return out, sx | sd | int(sf)


def _filter_grad_taps_rows(x, dy, KH, KW, sh, dh, dw, pads, OH, OW, pol: _Policy, multicore):
    """conv2d_backprop_filter as dw = im2col(x)^T @ dy with the taps x channels as the product's rows (few
    channels, stride 1 along rows, OW a multiple of 16, Cout a width of GATHER_WIDTHS): A[(kh, kw, c), pixel]
    read from planar padded x (16 pixels of a K block consecutive in a plane), B = dy's rows in place. The
    same K order (pixels in (n, oh, ow) order, blocks of 16), the same split over cube cores, so the same
    sums; the operands' roles are swapped, so the caller keeps NaN operands away."""
    N, H, W, C = x.shape
    CO = dy.shape[3]
    R, Kc = N * OH * OW, KH * KW * C
    # (the forward convolution's planar x when it made one in this replay, with its +0 plane: numerics/shared.py)
    xpl, sx = _planar_shared(x, pol, pads, C, exact=False)
    P = xpl.shape[1]   # planes per sample
    if sx:   # the status is the patches' (the pixels some tap reads), not the whole input's
        ys, xs = (_covered(n_, k, s_, d, p[0], o) for n_, k, s_, d, p, o in
                  ((H, KH, sh, dh, pads[0], OH), (W, KW, 1, dw, pads[1], OW)))
        if len(ys) < H or len(xs) < W:
            sx = _operand_values(x[:, ys][:, :, xs], pol)[1]
    Hp, Wp = xpl.shape[2:]
    # dy's operand values, then 32 floats of +0 (the gather's up-front bounds check counts a whole column group past
    # the last row; the half it does not compute is never read)
    dyb = _alloc.empty(R * CO + 2 * _k.LANES, np.float32)
    dyb[R * CO:] = 0
    target = config.COMPUTE_DTYPES.get(pol.operand)
    if pol.operand != "float32" and dy.dtype == target:
        _k.widen_operands(np.ascontiguousarray(dy).reshape(-1).view(np.uint16), dyb[:R * CO].view(np.uint32),
                          pol.operand == "bfloat16", pol.subnormal == config.SUBNORMAL_MODES["flush"], _kc.HW_HALF)
        sd = 0
    else:
        dv, sd = _operand_values(dy, pol)
        dyb[:R * CO] = dv.reshape(-1)
    a_rows = _taps_rows_a(KH, KW, C, Hp, Wp, dh, dw)
    b_g = np.arange(-(-CO // (2 * _k.LANES)), dtype=np.uintp) * np.uintp(2 * _k.LANES)
    bounds = multicore.batch_bounds(N, OH * OW) if multicore is not None else None
    if bounds is None:
        bounds = np.array([0, R], dtype=np.int64)
    tiles = _tiles()
    bias = np.zeros((1, CO), dtype=np.float32)
    parts = np.empty((len(bounds) - 1, Kc * CO), dtype=np.float32)
    for part in range(len(bounds) - 1):
        r0, r1 = int(bounds[part]), int(bounds[part + 1])
        a_q, b_q = _taps_rows_blocks(r0, r1, OH, OW, P, Hp, Wp, sh, CO)
        _k.matmul_tree16_gather(xpl, a_rows, a_q, dyb, b_q, b_g, CO, bias, False, parts[part].reshape(Kc, CO),
                                tiles, pol.exact_products, _k.row_block(Kc, 1, numba.get_num_threads()))
    if len(bounds) > 2:  # the cores' fp32 partials, atomic-added in arrival order
        acc = np.empty(Kc * CO, dtype=np.float32)
        _km.combine_f32(parts, np.ascontiguousarray(multicore.order(len(bounds) - 1), dtype=np.int64), acc)
    else:
        acc = parts[0]
    out = _alloc.empty((KH, KW, C, CO), np.float32 if pol.out == "float32" else np.uint16)
    sf = _k.finish_grid_rows(acc.reshape(Kc, CO), out, 1, Kc, 1, Kc, 0, 0, 1, 1, pol.out == "bfloat16",
                             pol.overflow, pol.subnormal)
    if pol.out != "float32":
        out = out.view(config.COMPUTE_DTYPES[pol.out])
    return out, sx | sd | int(sf)


@functools.lru_cache(maxsize=64)
def _taps_rows_a(KH, KW, C, Hp, Wp, dh, dw):
    """_filter_grad_taps_rows's A row table: tap (kh, kw) of channel c at (c*Hp + kh*dh)*Wp + kw*dw in a sample's
    planar x, rows in (kh, kw, c) order (uintp; once per geometry: numpy's meshgrid every call cost more than
    the kernel's launch; shared, the kernel only reads it)."""
    kh, kw, c = np.meshgrid(np.arange(KH), np.arange(KW), np.arange(C), indexing="ij")
    return np.ascontiguousarray(((c * Hp + kh * dh) * Wp + kw * dw).reshape(-1), dtype=np.uintp)


@functools.lru_cache(maxsize=64)
def _taps_rows_blocks(r0, r1, OH, OW, P, Hp, Wp, sh, CO):
    """_filter_grad_taps_rows's K block tables for the pixels r0..r1 (once per geometry, shared, read only by the
    kernel): each block's first pixel p = (n, oh, ow) as its offset in planar x (P planes of Hp x Wp a sample) and
    as its offset p*CO in dy's rows."""
    p = np.arange(r0, r1, 16, dtype=np.int64)   # each K block's first pixel (n, oh, ow)
    n, oh, ow = p // (OH * OW), (p // OW) % OH, p % OW
    a_q = np.ascontiguousarray((n * P * Hp + oh * sh) * Wp + ow, dtype=np.uintp)
    b_q = np.ascontiguousarray(p * CO, dtype=np.uintp)
    return a_q, b_q


@functools.lru_cache(maxsize=64)
def _filter_grad_gather(KH, KW, C, sh, sw, dh, dw, OH, OW):
    """How conv2d_backprop_filter's fast kernel may read its B operand (the patches: pixels as K, (kh, kw, c)
    as columns) in place from the padded input, or None: (the product column of each real column
    (kh, kw, c), the 16-column halves per tap row, the floats read past the input's end).
    It needs 16 consecutive output pixels of one row (OW a multiple of 16, so K blocks never straddle rows)
    a fixed sw*C floats apart (a width the kernel is compiled for) and, within a tap row kh, the columns
    (kw, c) one contiguous run (dw = 1): the run is cut into halves of 16 floats, the last half's tail
    reading past the run (columns computed, never kept), and the tap rows' halves paired into the kernel's
    32-column groups one after another (a group may hold the end of one tap row and the start of the next;
    an odd last half is computed alone: matmul_tree16_gather)."""
    if OW % 16 or dw != 1 or sw * C not in _k.GATHER_WIDTHS or KH * KW * C == 0:
        return None
    run = KW * C
    per = -(-run // _k.LANES)   # halves per tap row
    if KH * per > 3 * -(-KH * KW * C // (2 * _k.LANES)):
        return None   # over half as many columns again as packed patches need: those are cheaper
    cols = (np.arange(KH)[:, None] * per * _k.LANES + np.arange(run)[None, :]).reshape(-1)
    cols.flags.writeable = False
    return cols, per, per * _k.LANES - run


@functools.lru_cache(maxsize=64)
def _half_offsets(KH, per, row):
    """matmul_tree16_gather's column group tables (b_g, b_g1) for _filter_grad_gather's layout: half t = kh*per + s
    (``per`` halves per tap row, ``row`` floats between tap rows in the padded input) at kh*row + 16s from a
    pixel's corner, group g's halves 2g and 2g + 1 (an odd last half's partner repeats it: never computed)."""
    t = np.arange(KH * per)
    off = ((t // per) * row + (t % per) * _k.LANES).astype(np.uintp)
    g0 = np.ascontiguousarray(off[0::2])
    g1 = np.ascontiguousarray(off[1::2]) if off.size % 2 == 0 else np.append(off[1::2], off[-1])
    for a in (g0, g1):
        a.flags.writeable = False
    return g0, g1


@functools.lru_cache(maxsize=64)
def _gather_blocks(shape, sh, sw, OH, OW, r0, kp, CO):
    """conv2d_backprop_filter's gather tables for the pixels r0.. r0 + kp of padded x of NHWC ``shape``, once per
    geometry: A's row offsets (CO rows of kp), its K blocks' offsets (16 apart) and B's K block bases
    (_pixel_bases). Writable, as the kernel was compiled for them; only read."""
    return (np.arange(CO, dtype=np.uintp) * np.uintp(kp), np.arange(kp // 16, dtype=np.uintp) * np.uintp(16),
            _pixel_bases(shape, sh, sw, OH, OW, r0 // 16, kp // 16, 16))


def _pixel_bases(shape, sh, sw, OH, OW, p0, count, step):
    """The flat offsets in the padded NHWC input of ``shape`` of output pixels p0*step, (p0+1)*step, ...
    (count of them), pixel p = (n*OH + oh)*OW + ow at (n, oh*sh, ow*sw, 0)."""
    _, Hp, Wp, C = shape
    p = (np.arange(count, dtype=np.int64) + p0) * step
    n, oh, ow = p // (OH * OW), (p // OW) % OH, p % OW
    return np.ascontiguousarray(((n * Hp + oh * sh) * Wp + ow * sw) * C, dtype=np.uintp)


def _covered(n: int, k: int, s: int, d: int, before: int, o: int) -> np.ndarray:
    """The input rows (or columns) of length n that some tap of a convolution reads: o*s + k*d - before."""
    idx = (np.arange(o)[:, None] * s + np.arange(k)[None, :] * d - before).reshape(-1)
    return np.unique(idx[(idx >= 0) & (idx < n)])


def zero_inserted(dy, sh: int, sw: int, pads_h, pads_w) -> np.ndarray:
    """``dy`` (N, OH, OW, C) with ``s - 1`` zeros inserted between pixels and padded by
    ``pads`` (negative pads crop): the input of the transposed convolution."""
    n, oh, ow, c = dy.shape
    (t, b), (l, r) = pads_h, pads_w
    hz, wz = (oh - 1) * sh + 1, (ow - 1) * sw + 1
    big = np.zeros((n, max(t, 0) + hz + max(b, 0), max(l, 0) + wz + max(r, 0), c), dtype=dy.dtype)
    big[:, max(t, 0):max(t, 0) + hz:sh, max(l, 0):max(l, 0) + wz:sw, :] = dy
    return np.ascontiguousarray(big[:, max(-t, 0):big.shape[1] - max(-b, 0), max(-l, 0):big.shape[2] - max(-r, 0), :])


def conv2d_backprop_input(dy, w, strides=(1, 1), pads=((0, 0), (0, 0)), dilations=(1, 1), bias=None,
                          operand_dtype="float16", out_dtype="float16", overflow_mode="inf_nan", subnormals="keep",
                          model=None):
    """Input gradient of a 2-D convolution on the emulated cube unit (TF Conv2DBackpropInput, NHWC).

    ``dx`` is the VALID stride-1 :func:`conv2d` (dilations as the forward convolution's) of ``dz`` (``dy`` with
    ``stride - 1`` zeros between pixels, padded by ``pads``, negative pads cropping: :func:`zero_inserted`)
    with the filter rotated by 180 degrees, its in and out channels swapped; K = KH*KW*Cout in the
    CubeModel's conv order. The default model packs dz's patches from dy directly, never building dz.

    Parameters
    ----------
    dy : array_like (N, OH, OW, Cout)
    w : array_like (KH, KW, Cin, Cout), the forward filter
    strides, dilations : (h, w) of the forward convolution
    pads : ((top, bottom), (left, right)) of dz around the zero-inserted dy
    """
    pol = _policy(operand_dtype, out_dtype, overflow_mode, subnormals, model)
    dy = _numeric(dy, "dy")
    w = _numeric(w, "w")
    (sh, sw), (dh, dw) = strides, dilations
    w_rot = w[::-1, ::-1].transpose(0, 1, 3, 2)
    # dy's conversion status is the OR over all of dy, which equals dz's only when converting cannot
    # raise one (negative pads crop dy): else conv2d of the zero-inserted dy itself
    direct = pol.fast and (pol.operand == "float32" or dy.dtype == config.COMPUTE_DTYPES[pol.operand])
    if not direct:
        dz = zero_inserted(dy, sh, sw, pads[0], pads[1])
        return conv2d(dz, w_rot, strides=(1, 1), padding="VALID", dilations=(dh, dw), bias=bias,
                      operand_dtype=operand_dtype, out_dtype=out_dtype, overflow_mode=overflow_mode,
                      subnormals=subnormals, model=model)
    N, OH, OW, CO = dy.shape
    KH, KW, CI, _ = w.shape
    (t, b), (lp, rp) = pads
    H = t + (OH - 1) * sh + 1 + b - (KH - 1) * dh
    W = lp + (OW - 1) * sw + 1 + rp - (KW - 1) * dw
    out_shape = (N, H, W, CI)
    wv, sw_ = _operand_values(np.ascontiguousarray(w_rot), pol)
    biasv = _bias_vector(bias, CI, out_shape)
    order = pol.model.conv_k_order
    Cp = CO if order == "hwc" else -(-CO // 16) * 16  # NC1HWC0: channels zero-padded to C0 = 16
    K = KH * KW * Cp
    kp = _kp(K)
    wc = wv if Cp == CO else np.pad(wv, ((0, 0), (0, 0), (0, Cp - CO), (0, 0)))   # (np.pad copies even a no-op: 23 us)
    WT = _padded(_filter_rows(wc, order).T[None], 2, kp)
    # One product per class of pixels (y mod sh, x mod sw) (one class at stride 1). Without a bias and with a
    # finite filter, a class drops the K blocks that read only the zeros between dy's pixels. Exact: such a
    # block's products are signed zeros, their tree sum is a signed zero, and adding one changes no
    # accumulator: starting from +0 (no bias), an fp32 accumulator is never -0, and x + (+-0) = x otherwise.
    drop = bias is None and bool(np.isfinite(wv).all())
    plan_key = (KH, KW, CO, Cp, order, dh, dw, sh, sw, t, lp, H, W, OH, OW, drop)
    plan = _backprop_input_plan(*plan_key)
    (pt_, pb_), (pl_, pr_), classes = plan
    tiles = _tiles()
    # an implicit GEMM where every kept K block is 16 channels of one tap and every class's grid rows are
    # runs of 16 pixels: the kernel reads dz's patches from planar dy in place (no packed slabs). Only without
    # NaN operands (the filter is finite here): which of two NaNs meeting in a sum comes out depends on the
    # compiled code's operand order
    if (_fwd._IMPLICIT and drop and order == "hwc" and CO % 16 == 0 and _plan_runs16(plan_key)
            and not _any_nan(dy)):
        if _WHOLE_FIXPIPE and _PIXEL_ROWS and CI in (16, 32):
            return _backprop_input_pixel_rows(dy, WT, plan_key, ((pt_, pb_), (pl_, pr_)), out_shape, biasv, pol, sw_)
        dyp, sd = _planar_operands(dy, pol, ((pt_, pb_), (pl_, pr_)), CO)
        Hp, Wp = dyp.shape[2:]
        if _WHOLE_FIXPIPE and all(Hc * Wc for (_, _, Hc, Wc, _, _) in classes):
            # every class's product stored straight into its pixels' rows of one float32 output (out_rows), then
            # one Fixpipe pass over it (the classes cover every pixel once): the same values and statuses as a
            # class-by-class finish_grid_rows, without its per-pixel scatter and short conversion blocks
            acc = _alloc.empty((N * H * W, CI), np.float32)
            for (ry, rx, Hc, Wc, keep, koff) in classes:
                rows = _class_rows(N, Hc, Wc, H, W, ry, rx, sh, sw)
                WTc = WT if keep is None else np.ascontiguousarray(WT[:, :, keep])
                if WTc.shape[2] == 0:   # no tap reaches the class: +0, the accumulator's start (no bias here)
                    acc[rows] = 0
                    continue
                g0, g1 = _class_runs(N, Hc, Wc, CO * Hp * Wp, Wp)
                mc = _k.row_block(CI, -(-rows.size // _k.NC), numba.get_num_threads())
                _k.matmul_tree16_tab(WTc, dyp.reshape(-1), koff.astype(np.uintp).reshape(-1, 16), g0, g1, biasv,
                                     True, acc, tiles, pol.exact_products, mc, True, rows)
            res, sf = _finish(acc, pol)
            return res.reshape(out_shape), sd | sw_ | sf
        out = _alloc.empty(out_shape, np.float32 if pol.out == "float32" else np.uint16)
        sf = 0
        for (ry, rx, Hc, Wc, keep, koff) in classes:
            R = N * Hc * Wc
            WTc = WT if keep is None else np.ascontiguousarray(WT[:, :, keep])
            if WTc.shape[2] == 0:
                # a class that no tap reaches (the stride beyond the dilated kernel: a 1x1 convolution at
                # stride 2): its pixels are the accumulator's start, +0 (no bias here), as the packed path gives
                outc = np.zeros((R, CI), np.float32)
            else:
                g0, g1 = _class_runs(N, Hc, Wc, CO * Hp * Wp, Wp)
                outc = _alloc.empty((R, CI), np.float32)   # the product stored pixel by pixel (store_t)
                mc = _k.row_block(CI, -(-R // _k.NC), numba.get_num_threads())
                _k.matmul_tree16_tab(WTc, dyp.reshape(-1), koff.astype(np.uintp).reshape(-1, 16), g0, g1, biasv,
                                     True, outc, tiles, pol.exact_products, mc, True)
            sf |= int(_k.finish_grid_rows(outc, out, Hc, Wc, H, W, ry, rx, sh, sw, pol.out == "bfloat16",
                                          pol.overflow, pol.subnormal))
        if pol.out != "float32":
            out = out.view(config.COMPUTE_DTYPES[pol.out])
        return out, sd | sw_ | sf
    # dy planar and padded so that every tap of a class reads it at a fixed offset from the pixel: 16-bit
    # operands as their bits (widened by the packing kernel), float32 operands as their values
    if pol.operand != "float32":
        src, sd, wide = np.ascontiguousarray(dy).view(np.uint16), 0, (pol.operand == "bfloat16", pol.subnormal)
    else:
        src, sd = _operand_values(dy, pol)
        wide = (False, 0)
    out = _alloc.empty(out_shape, np.float32 if pol.out == "float32" else np.uint16)
    dyp = _alloc.empty((N, CO, pt_ + OH + pb_, pl_ + OW + pr_), src.dtype)
    _k.planar_padded(src, dyp, pt_, pl_)
    zero = np.zeros(1, dtype=np.int64)
    sf = 0
    for (ry, rx, Hc, Wc, keep, koff) in classes:
        R = N * Hc * Wc
        WTc = WT if keep is None else np.ascontiguousarray(WT[:, :, keep])
        kpc = WTc.shape[2]
        chunk = max(_k.NC, (_IM2COL_BYTES // (4 * max(kpc, 1))) // _k.NC * _k.NC)
        rows = min(chunk, R)
        slabs = _k.empty_slabs(_k.slab_shape(1, rows, kpc))
        outc = _alloc.empty((1, CI, rows), np.float32)
        for r0 in range(0, R, chunk):
            n = min(R, r0 + chunk) - r0
            Bp = slabs[:, :-(-n // _k.NC)]
            _k.dx_class_packed(dyp, koff, Hc, Wc, r0, n, Bp, *wide)
            mc = _k.row_block(CI, Bp.shape[1], numba.get_num_threads())
            _k.matmul_tree16(WTc, Bp, biasv, True, zero, zero, outc[:, :, :n], tiles, pol.exact_products, mc)
            # the Fixpipe writes the class's pixels of the NHWC output directly
            sf |= int(_k.finish_grid(outc[0], out, r0, n, Hc, Wc, H, W, ry, rx, sh, sw, pol.out == "bfloat16",
                                     pol.overflow, pol.subnormal))
    if pol.out != "float32":
        out = out.view(config.COMPUTE_DTYPES[pol.out])
    return out, sd | sw_ | sf


def _backprop_input_pixel_rows(dy, WT, plan_key, pads, out_shape, biasv, pol: _Policy, sw_):
    """conv2d_backprop_input's implicit route with each class's pixels as the product's rows (matmul_tree16_gather):
    A's K block q of pixel p is dz's 16 channels of one tap, read in place from padded NHWC dy (a fixed offset
    from the pixel's), B the class's kept filter rows (K, CI) at width CI, each row stored straight into its
    pixel's row of one float32 output (out_rows), then one Fixpipe pass. The same tree16 sums of the same
    products (a*b for b*a) in the same K order as the tab route's: the same bits, without NaN operands (the
    caller's condition). ``plan_key``: _backprop_input_plan's arguments; every table that depends only on it and
    the shapes comes from _pixel_rows_tables (once per geometry), and the classes' B operands from one take."""
    N, H, W, CI = out_shape
    flat, shape, sd = _padded_input_flat(dy, pol, ((0, 0), pads[0], pads[1], (0, 0)), 0)
    Hp, Wp = shape[1:3]
    tiles = _tiles()
    acc = _alloc.empty((N * H * W, CI), np.float32)
    tables, src = _pixel_rows_tables(plan_key, N, CI, WT.shape[2], Hp, Wp)
    # every class's B (its kept filter rows (K, CI), then 2 * LANES floats of +0: the bounds check counts a whole
    # column group) in one array: WT's values (and one +0 past them) at the cached positions
    b_all = np.concatenate((WT.reshape(-1), _ZERO_F32)).take(src) if src.size else None
    nthreads = numba.get_num_threads()
    for rows, t in tables:
        if t is None:   # no tap reaches the class: +0, the accumulator's start (no bias here)
            acc[rows] = 0
            continue
        a_rows, a_q, b0, b1, b_q = t
        mc = _k.row_block(rows.size, 1, nthreads)
        _k.matmul_tree16_gather(flat, a_rows, a_q, b_all[b0:b1], b_q, _ZERO_GROUP, CI, biasv, False, acc, tiles,
                                pol.exact_products, mc, None, rows)
    res, sf = _finish(acc, pol)
    return res.reshape(out_shape), sd | sw_ | sf


_ZERO_F32 = np.zeros(1, dtype=np.float32)


@functools.lru_cache(maxsize=64)
def _plan_runs16(plan_key) -> bool:
    """Whether every class of _backprop_input_plan(*plan_key) keeps whole runs of 16 K positions, none of them +0
    (koff -1), and has a multiple of 16 grid columns: the implicit routes' condition on the geometry."""
    return all(k.size % 16 == 0 and Wc % 16 == 0 and k.min(initial=0) >= 0
               for (_, _, _, Wc, _, k) in _backprop_input_plan(*plan_key)[2])


@functools.lru_cache(maxsize=64)
def _pixel_rows_tables(plan_key, N, CI, kp, Hp, Wp):
    """_backprop_input_pixel_rows's tables, a function of the geometry only (_backprop_input_plan's arguments,
    the batch, the in-channels, WT's padded K and padded dy's height and width): for each class ``(rows, None)``
    (no tap reaches it) or ``(rows, (a_rows, a_q, b0, b1, b_q))``, and ``src``: for each float of the classes' B
    operands laid end to end, its flat index in WT (1, CI, kp), or CI * kp (a +0 appended to WT): class B's
    element k * CI + ci is WT[0, ci, k-th kept K position], then 2 * LANES zeros; b_all[b0:b1] is the class's B,
    b_q its K blocks' offsets in it."""
    CO, sh, sw, H, W = plan_key[2], plan_key[7], plan_key[8], plan_key[11], plan_key[12]
    out, src, at = [], [], 0
    for (ry, rx, Hc, Wc, keep, koff) in _backprop_input_plan(*plan_key)[2]:
        rows = _class_rows(N, Hc, Wc, H, W, ry, rx, sh, sw)
        kept = np.arange(kp) if keep is None else np.flatnonzero(keep)
        if kept.size == 0:
            out.append((rows, None))
            continue
        a_rows, a_q = _class_pixel_offsets(N, Hc, Wc, Hp, Wp, CO, koff.tobytes())
        body = (np.arange(CI)[None, :] * kp + kept[:, None]).reshape(-1)
        src += [body, np.full(2 * _k.LANES, CI * kp)]
        b_q = np.arange(a_q.size, dtype=np.uintp) * np.uintp(16 * CI)   # (writable, as the kernel was compiled for)
        out.append((rows, (a_rows, a_q, at, at + body.size + 2 * _k.LANES, b_q)))
        at += body.size + 2 * _k.LANES
    src = np.concatenate(src).astype(np.intp) if src else np.zeros(0, dtype=np.intp)
    src.flags.writeable = False
    return tuple(out), src


_ZERO_GROUP = np.zeros(1, dtype=np.uintp)
_ZERO_GROUP.flags.writeable = False


@functools.lru_cache(maxsize=64)
def _class_pixel_offsets(N, Hc, Wc, Hp, Wp, CO, koff: bytes):
    """_backprop_input_pixel_rows's A tables: each grid pixel (n, i, m)'s offset in padded NHWC dy (N, Hp, Wp, CO),
    and each kept K block's offset from it (its tap's (row, column) and first channel), from the class's planar
    offsets ``koff`` of _backprop_input_plan (int64, as bytes: hashable)."""
    k0 = np.frombuffer(koff, dtype=np.int64)[::16]
    c0, rem = k0 // (Hp * Wp), k0 % (Hp * Wp)
    a_q = np.ascontiguousarray(rem * CO + c0, dtype=np.uintp)   # (row * Wp + col) * CO + c0
    n, i, m = np.meshgrid(np.arange(N), np.arange(Hc), np.arange(Wc), indexing="ij")
    a_rows = np.ascontiguousarray((((n * Hp + i) * Wp + m) * CO).reshape(-1), dtype=np.uintp)
    for t in (a_q, a_rows):
        t.flags.writeable = False
    return a_rows, a_q


@functools.lru_cache(maxsize=64)
def _class_rows(N, Hc, Wc, H, W, ry, rx, sh, sw):
    """The NHWC output's pixel row (n*H + ry + sh*i)*W + rx + sw*m of each grid pixel p = (n*Hc + i)*Wc + m of the
    class (ry, rx) (matmul_tree16_tab's out_rows), uintp."""
    n, i, m = np.meshgrid(np.arange(N), np.arange(Hc), np.arange(Wc), indexing="ij")
    rows = np.ascontiguousarray(((n * H + ry + sh * i) * W + rx + sw * m).reshape(-1), dtype=np.uintp)
    rows.flags.writeable = False
    return rows


@functools.lru_cache(maxsize=64)
def _backprop_input_plan(KH, KW, CO, Cp, order, dh, dw, sh, sw, t, lp, H, W, OH, OW, drop):
    """The geometry of conv2d_backprop_input's class products (indices only, computed once per geometry):
    ``((top, bottom), (left, right)) pads of planar dy, [(ry, rx, Hc, Wc, keep, koff), ...]``: for each
    class of output pixels (y = ry + sh*i, x = rx + sw*m; i < Hc, m < Wc) the kept K positions (None: all)
    and, for each, the offset of its dz value in the planar padded dy from pixel (n, i, m)'s
    ``n*plane + i*Wp + m``, or -1 where it is +0 (padded channels, taps between dy's pixels)."""
    kh, kw, c = np.meshgrid(np.arange(KH), np.arange(KW), np.arange(Cp), indexing="ij")
    if order == "c1hwc0":  # (c // 16, kh, kw, c % 16)
        kh, kw, c = (v.reshape(KH, KW, Cp // 16, 16).transpose(2, 0, 1, 3) for v in (kh, kw, c))
    kh, kw, c = (v.reshape(-1).astype(np.int64) for v in (kh, kw, c))
    K = KH * KW * Cp
    kp = _kp(K)
    grid = []
    rows_lo = cols_lo = 0
    rows_hi, cols_hi = OH - 1, OW - 1
    for ry in range(min(sh, H)):
        for rx in range(min(sw, W)):
            Hc, Wc = len(range(ry, H, sh)), len(range(rx, W, sw))
            # tap kh reads dz row ry + sh*i + kh*dh - t: dy row i + (ry + kh*dh - t) / sh when sh divides it
            ua, va = ry + kh * dh - t, rx + kw * dw - lp
            on = (ua % sh == 0) & (va % sw == 0) & (c < CO)
            oa, ob = ua // sh, va // sw
            if on.any():
                rows_lo, rows_hi = min(rows_lo, int(oa[on].min())), max(rows_hi, Hc - 1 + int(oa[on].max()))
                cols_lo, cols_hi = min(cols_lo, int(ob[on].min())), max(cols_hi, Wc - 1 + int(ob[on].max()))
            grid.append((ry, rx, Hc, Wc, on, oa, ob))
    pt, pl = -rows_lo, -cols_lo
    Hp, Wp = pt + rows_hi + 1, pl + cols_hi + 1
    classes = []
    for ry, rx, Hc, Wc, on, oa, ob in grid:
        koff = np.where(on, (c * Hp + oa + pt) * Wp + ob + pl, -1)
        koff = np.concatenate([koff, np.full(kp - K, -1, dtype=np.int64)])
        keep = None
        if drop and sh * sw > 1:
            keep = np.repeat((koff >= 0).reshape(-1, 16).any(axis=1), 16)
            koff = koff[keep]
        for a in (keep, koff):
            if a is not None:
                a.flags.writeable = False
        classes.append((ry, rx, Hc, Wc, keep, np.ascontiguousarray(koff, dtype=np.int64)))
    return (pt, rows_hi - (OH - 1)), (pl, cols_hi - (OW - 1)), tuple(classes)
