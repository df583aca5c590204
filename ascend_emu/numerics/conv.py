"""Convolutions on the cube unit: conv2d, depthwise conv2d and the two gradients of conv2d (NHWC).

Each is the pipeline of :mod:`.cube_core` over an im2col geometry: the K order of a patch is fixed by
``_k_offsets`` (NUMERICS.md section 3, ``conv_k_order``), padded pixels are +0, and the patches are packed
straight into the kernels' layouts (``kernels/cube/conv.py``).
"""
from __future__ import annotations

import functools

import numba
import numpy as np

from . import memo as _memo
from . import policy as config
from .cube_core import (Epilogue, _Policy, _accumulate, _batched, _bias_vector, _finish, _kp, _numeric,
                        _operand_values, _padded, _padded_input, _padded_input_flat, _policy, _tiles, _transposed)
from ..errors import AscendEmuError
from ..kernels import alloc as _alloc
from ..kernels import cube as _k
from ..kernels import multicore as _km

# im2col buffers are built in row chunks of at most this many bytes
_IM2COL_BYTES = 16 << 20
# the implicit GEMMs (patches read in place by matmul_tree16_gather / matmul_tree16_tab) where they apply;
# False: the packed products they replace (tests compare the two)
_IMPLICIT = True


def _hw(value, what: str):
    """(h, w) from an int, a 2-sequence or TF's 4-element NHWC list [1, h, w, 1]."""
    try:
        v = [int(t) for t in np.atleast_1d(np.asarray(value)).ravel()]
    except (TypeError, ValueError):
        raise AscendEmuError(f"{what} must be an int, (h, w) or [1, h, w, 1], got {value!r}") from None
    if len(v) == 1:
        v = v * 2
    elif len(v) == 4:
        if v[0] != 1 or v[3] != 1:
            raise AscendEmuError(f"{what} {value!r}: batch and channel entries must be 1 (NHWC)")
        v = v[1:3]
    if len(v) != 2 or min(v) < 1:
        raise AscendEmuError(f"{what} must be positive: an int, (h, w) or [1, h, w, 1], got {value!r}")
    return v[0], v[1]


def _pads(padding, H, W, KH, KW, sh, sw, dh, dw):
    """((top, bottom), (left, right)) for SAME / VALID / explicit padding, as TensorFlow computes them."""
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return (0, 0), (0, 0)
        if mode == "SAME":
            def same(n, k, s, d):
                total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
                return total // 2, total - total // 2  # the odd pixel goes to the bottom / right
            return same(H, KH, sh, dh), same(W, KW, sw, dw)
        raise AscendEmuError(f"unknown padding {padding!r}; choose one of: SAME, VALID, "
                             "or explicit [[top, bottom], [left, right]]")
    try:
        p = np.asarray(padding, dtype=np.int64)
    except (TypeError, ValueError):
        p = None
    if p is not None and p.size == 8:
        p = p.reshape(4, 2)
        if p[0].any() or p[3].any():
            raise AscendEmuError(f"explicit padding {padding!r}: batch and channel pads must be 0 (NHWC)")
        p = p[1:3]
    elif p is not None and p.size == 4:
        p = p.reshape(2, 2)
    else:
        p = None
    if p is None or (p < 0).any():
        raise AscendEmuError(f"padding {padding!r} must be SAME, VALID or non-negative explicit pads "
                             "[[top, bottom], [left, right]] (or TF's 4x2 NHWC form)")
    return (int(p[0, 0]), int(p[0, 1])), (int(p[1, 0]), int(p[1, 1]))


def _conv_geometry(op, x, w, strides, padding, dilations):
    if x.ndim != 4 or w.ndim != 4:
        raise AscendEmuError(f"{op} needs a 4-D NHWC input and a 4-D filter, got x of shape {x.shape} "
                             f"and w of shape {w.shape}")
    if w.shape[2] != x.shape[3]:
        raise AscendEmuError(f"{op}: filter in-channels differ from input channels: x of shape {x.shape} (NHWC) "
                             f"and w of shape {w.shape}")
    sh, sw = _hw(strides, "strides")
    dh, dw = _hw(dilations, "dilations")
    _, H, W, _ = x.shape
    KH, KW = w.shape[:2]
    (pt, pb), (pl, pr) = _pads(padding, H, W, KH, KW, sh, sw, dh, dw)
    OH = (H + pt + pb - (KH - 1) * dh - 1) // sh + 1
    OW = (W + pl + pr - (KW - 1) * dw - 1) // sw + 1
    if OH <= 0 or OW <= 0 or KH == 0 or KW == 0:
        raise AscendEmuError(f"{op}: the dilated filter of shape {w.shape} (dilations {(dh, dw)}) does not fit the "
                             f"padded input of shape {x.shape} (padding {padding!r})")
    return (sh, sw), (dh, dw), ((pt, pb), (pl, pr)), (OH, OW)


def _forward_geometry(op, x, w, strides, padding, dilations):
    """A forward convolution's operands as numeric arrays and its geometry: ``x, w, (sh, sw), (dh, dw),
    pads, (OH, OW)``."""
    x = _numeric(x, "x")
    w = _numeric(w, "w")
    return (x, w, *_conv_geometry(op, x, w, strides, padding, dilations))


def _k_offsets(KH, KW, C, Wp, dh, dw, order: str) -> np.ndarray:
    """For each K position of the model's order, the flat offset in the padded NHWC input of its
    (kh, kw, c) term from the output pixel's corner (n, oh*sh, ow*sw, 0)."""
    kh, kw, c = np.meshgrid(np.arange(KH), np.arange(KW), np.arange(C), indexing="ij")
    off = (kh * dh * Wp + kw * dw) * C + c
    if order == "c1hwc0":  # (cin // 16, kh, kw, cin % 16)
        off = off.reshape(KH, KW, C // 16, 16).transpose(2, 0, 1, 3)
    return np.ascontiguousarray(off.reshape(-1), dtype=np.uintp)


def _filter_rows(w: np.ndarray, order: str) -> np.ndarray:
    """The (KH, KW, C, Cout) filter as (K, Cout) rows in the same K order as _k_offsets."""
    KH, KW, C, CO = w.shape
    if order == "c1hwc0":
        w = w.reshape(KH, KW, C // 16, 16, CO).transpose(2, 0, 1, 3, 4)
    return np.ascontiguousarray(w.reshape(KH * KW * C, CO))


def _conv_filter(w, pol: _Policy, Cp: int, kp: int, transposed: bool):
    """(the filter as conv2d's kernels read it, the status of its rounding to the operand dtype):
    (1, CO, kp) rows when ``transposed``, else (1, kp, CO), packed into slabs for the fast kernel.
    Computed once per frozen filter array (a constant's cached cast: :mod:`.memo`)."""
    def build():
        KH, KW, C, CO = w.shape
        wv, st = _operand_values(w, pol)
        if Cp != C:
            wv = np.pad(wv, ((0, 0), (0, 0), (0, Cp - C), (0, 0)))
        wk = _filter_rows(wv, pol.model.conv_k_order)
        if transposed:
            return _padded(wk.T[None], 2, kp), st
        W = _padded(wk[None], 1, kp)
        if not pol.fast:
            return W, st
        Wp = _k.empty_slabs(_k.slab_shape(1, CO, kp))
        _k.pack_b(W, Wp)
        return Wp, st
    return _memo.memo(w, ("conv2d filter", pol, Cp, kp, transposed), build)


def _pixels_as_rows(pol: _Policy, w: np.ndarray) -> bool:
    """Whether the fast conv2d may compute its product with the pixels as rows even where _transposed
    would make them the columns: whole 32-column groups of output channels (the micro-kernel's width,
    so no lanes are wasted) give the same sums faster (im2col rows are contiguous channel runs, the
    Fixpipe reads no C^T). The same bits: every element is the same tree16 sums in the same order; only
    which NaN a NaN meeting another NaN gives depends on the orientation (the vector code's operand
    order), so a NaN operand (the filter's, checked here, or the input's, counted by im2col) keeps
    the pixels as columns."""
    return pol.fast and w.shape[3] % (2 * _k.LANES) == 0 and not np.isnan(np.asarray(w, dtype=np.float32)).any()


def conv2d(x, w, strides=(1, 1), padding="VALID", dilations=(1, 1), bias=None, operand_dtype="float16",
           out_dtype="float16", overflow_mode="inf_nan", subnormals="keep", model=None, epilogue=None):
    """2-D convolution on the emulated cube unit (TF Conv2D, NHWC input, HWIO filter).

    Each output is one dot product over K = KH*KW*Cin in the order (kh, kw, cin), as an
    im2col matrix times the filter reshaped to (K, Cout); padded pixels are +0. With
    ``model=CubeModel(conv_k_order="c1hwc0")`` the order is NC1HWC0's (cin // 16, kh, kw,
    cin % 16) over channels zero-padded to a multiple of 16.

    Parameters
    ----------
    x : array_like (N, H, W, Cin)
    w : array_like (KH, KW, Cin, Cout)
    strides, dilations : int, (h, w) or [1, h, w, 1]
    padding : "SAME", "VALID", [[top, bottom], [left, right]] or TF's [[0, 0], [t, b], [l, r], [0, 0]]
        SAME puts the odd padding pixel at the bottom / right, as TensorFlow does.
    """
    pol = _policy(operand_dtype, out_dtype, overflow_mode, subnormals, model)
    x, w, (sh, sw), (dh, dw), pads, (OH, OW) = _forward_geometry("conv2d", x, w, strides, padding, dilations)
    if _pixels_as_rows(pol, w):
        done = _conv2d(x, w, sh, sw, dh, dw, pads, OH, OW, bias, pol, epilogue, True)
        if done is not None:
            return done
    return _conv2d(x, w, sh, sw, dh, dw, pads, OH, OW, bias, pol, epilogue, False)


def _conv2d(x, w, sh, sw, dh, dw, pads, OH, OW, bias, pol: _Policy, epilogue, rows_ok: bool):
    """conv2d's pipeline; ``rows_ok``: pixels as the product's rows (_pixels_as_rows), returning None
    if the input read holds a NaN."""
    N = x.shape[0]
    KH, KW, C, CO = w.shape
    out_shape = (N, OH, OW, CO)
    biasv = _bias_vector(bias, CO, out_shape)
    order = pol.model.conv_k_order
    Cp = C if order == "hwc" else -(-C // 16) * 16  # NC1HWC0: channels zero-padded to C0 = 16
    # a 1x1 unpadded convolution of 16-bit operands reads each input value once: im2col widens the bits
    # itself (the values and status of _operand_values: a widening raises none), with no float32 copy
    bits16 = (KH * KW == 1 and pol.fast and Cp == C and not any(map(any, pads)) and pol.operand != "float32"
              and x.dtype == config.COMPUTE_DTYPES[pol.operand])
    K = KH * KW * Cp
    kp = _kp(K)
    R = N * OH * OW
    zero = np.zeros(1, dtype=np.int64)
    flip = rows_ok and _transposed(R, CO)   # pixels as rows where _transposed alone would not have them
    transposed = _transposed(R, CO) and not flip
    # the pixels-as-columns product read from planar x in place (matmul_tree16_tab): 16 consecutive output
    # pixels of a row are 16 consecutive floats of a plane at stride 1. Only without NaN operands: which of
    # two NaNs meeting in a sum comes out depends on the compiled code's operand order
    planar = (_IMPLICIT and transposed and pol.fast and sw == 1 and OW % 16 == 0 and not _any_nan(w)
              and not _any_nan(x))
    if planar:
        xp, sx = _planar_operands(x, pol, pads, Cp + 1)   # channels C.. Cp: +0, the K padding's plane
    elif bits16:
        xp, sx = np.ascontiguousarray(x).view(np.uint16), 0
    else:
        xp, sx = _padded_input(x, pol, ((0, 0), pads[0], pads[1], (0, Cp - C)))
    wide = (pol.operand == "bfloat16", pol.subnormal)   # how im2col widens 16-bit bits
    if not planar:
        koff = _k_offsets(KH, KW, Cp, xp.shape[2], dh, dw, order)
    step = _k.NC if transposed else _k.MC  # chunks of whole column tiles / row chunks
    chunk = max(step, (_IM2COL_BYTES // (4 * max(kp, 1))) // step * step)
    rows = min(chunk, R)
    wprep, sw_ = _conv_filter(w, pol, Cp, kp, transposed)
    # the transposed product stays (CO, R): the epilogue (a fused op's, else the plain Fixpipe's) reads it
    # column by column, in place of a transposed copy
    if transposed and not planar and pol.fast and epilogue is None and pol.subnormal == config.SUBNORMAL_MODES["keep"]:
        epilogue = Epilogue([], [], pol.out, fused=False)
    whole_t = transposed and not planar and pol.fast and epilogue is not None
    acc = None if whole_t else _alloc.empty((R, CO), np.float32)
    if transposed:
        WT = wprep
        if not planar:
            out_buf = _alloc.empty(CO * (R if whole_t else rows), np.float32)
    elif pol.fast:
        Wp = wprep   # packed once for every row chunk
        tiles = _tiles()
    else:
        W = wprep
    todo = R   # pixels left for the im2col chunks
    if planar:
        tiles = _tiles()
        # stored pixel by pixel (store_t): the Fixpipe reads rows, no C^T
        _, _, Hp, Wpl = xp.shape
        g0, g1 = _class_runs(N, OH, OW, (Cp + 1) * Hp * Wpl, sh * Wpl)   # pixel (n, oh, ow) at oh*sh*Wpl + ow
        mc = _k.row_block(CO, -(-R // _k.NC), numba.get_num_threads())
        _k.matmul_tree16_tab(WT, xp.reshape(-1), _planar_tab(KH, KW, Cp, Hp, Wpl, dh, dw, order), g0, g1, biasv,
                             True, acc, tiles, pol.exact_products, mc, True)
        todo = 0   # no im2col chunks left
    elif transposed and pol.fast:
        slabs = _k.empty_slabs(_k.slab_shape(1, rows, kp))
        tiles = _tiles()
    else:
        cols_buf = _alloc.empty(rows * kp, np.float32)
    if _IMPLICIT and not transposed and pol.fast and not bits16 and _runs16(koff) and not _any_nan(w):
        # an implicit GEMM: every K block is 16 consecutive floats of xp (one tap's 16 channels), so the
        # micro-kernel reads each pixel's patch where it lies, with no im2col matrix. Only without NaN
        # operands: which of two NaNs meeting in a sum comes out depends on the compiled code's operand order.
        # A NaN in the input keeps the pixels as columns, as a NaN that im2col reads would (_pixels_as_rows)
        if _any_nan(x):
            if flip:
                return None
        else:
            po = _pixel_rows(xp.shape, sh, sw, OH, OW)
            bq, bg = _slab_offsets(Wp.shape)
            mc = _k.row_block(R, Wp.shape[1], numba.get_num_threads())
            _k.matmul_tree16_gather(xp, po, np.ascontiguousarray(koff[::16]), Wp, bq, bg, Wp.shape[4], biasv, False,
                                    acc, tiles, pol.exact_products, mc)
            todo = 0   # no row chunks left
    for r0 in range(0, todo, chunk):
        n = min(R, r0 + chunk) - r0
        if transposed:  # im2col laid out (K, pixels): pixels are the kernel's columns
            outT = out_buf.reshape(1, CO, R)[:, :, r0:r0 + n] if whole_t else out_buf[:CO * n].reshape(1, CO, n)
            if pol.fast:  # built directly in the kernel's packed slab layout
                Bp = slabs[:, :-(-n // _k.NC)]
                _k.im2col_packed(xp, koff, sh, sw, OH, OW, r0, n, Bp, *wide)
                mc = _k.row_block(CO, Bp.shape[1], numba.get_num_threads())
                _k.matmul_tree16(WT, Bp, biasv, True, zero, zero, outT, tiles, pol.exact_products, mc)
                if whole_t:
                    continue
            else:
                colsT = cols_buf[:kp * n].reshape(1, kp, n)
                _k.im2col_t(xp, koff, sh, sw, OH, OW, r0, colsT[0])
                _accumulate(WT, colsT, zero, zero, biasv, True, outT, K, pol)
            acc[r0:r0 + n] = outT[0].T
        else:
            cols = cols_buf[:kp * n].reshape(1, n, kp)
            if _k.im2col(xp, koff, sh, sw, OH, OW, r0, cols[0], *wide) and flip:
                return None
            if pol.fast:   # _accumulate's fast branch with B packed once
                out = acc[None, r0:r0 + n]
                mc = _k.row_block(n, Wp.shape[1], numba.get_num_threads())
                _k.matmul_tree16(cols, Wp, biasv, False, zero, zero, out, tiles, pol.exact_products, mc)
            else:
                _accumulate(cols, W, zero, zero, biasv, False, acc[None, r0:r0 + n], K, pol)
    if whole_t:
        done = epilogue.apply(out_buf, pol, out_shape, transposed=True)
        if done is not None:
            return done[0], sx | sw_ | done[1]
        acc = np.ascontiguousarray(out_buf.reshape(CO, R).T)
        epilogue = None
    out, sf = _finish(acc, pol, epilogue, out_shape)
    return out.reshape(out_shape), sx | sw_ | sf


def _runs16(koff: np.ndarray) -> bool:
    """Whether every K block of 16 reads 16 consecutive floats (koff[16q + l] = koff[16q] + l): channels in
    whole runs of 16, where the fast kernels may read a patch in place (matmul_tree16_gather)."""
    if koff.size == 0 or koff.size % 16:
        return False
    k = koff.reshape(-1, 16).astype(np.int64)
    return bool((k - k[:, :1] == np.arange(16)).all())


def _planar_operands(x: np.ndarray, pol: _Policy, pads, channels: int):
    """(x's operand values as a planar float32 array (N, channels, H + pads, W + pads), zero-padded; status):
    16-bit x in the operand dtype widened on the way (no status), else rounded first (_operand_values)."""
    N, H, W, _ = x.shape
    out = _alloc.empty((N, channels, H + sum(pads[0]), W + sum(pads[1])), np.float32)
    if pol.operand != "float32" and x.dtype == config.COMPUTE_DTYPES[pol.operand]:
        _k.planar_widened(np.ascontiguousarray(x).view(np.uint16), out, pads[0][0], pads[1][0],
                          pol.operand == "bfloat16", pol.subnormal)
        return out, 0
    xv, st = _operand_values(x, pol)
    _k.planar_padded(xv, out, pads[0][0], pads[1][0])
    return out, st


def _any_nan(a: np.ndarray) -> bool:
    """Whether the operand array holds a NaN (16-bit floats tested on their bits)."""
    if a.dtype == np.float16 or a.dtype == config.bfloat16:
        bits = np.ascontiguousarray(a).reshape(-1).view(np.uint16)
        if bits.size < 1 << 16:   # (a filter: no parallel launch)
            return bool(((bits & 0x7FFF) > (0x7C00 if a.dtype == np.float16 else 0x7F80)).any())
        return bool(_k.has_nan(bits, 1 if a.dtype == np.float16 else 2))
    if a.dtype == np.float32:
        return bool(_k.has_nan(np.ascontiguousarray(a).reshape(-1)))
    return a.dtype.kind == "f" and bool(np.isnan(a).any())


@functools.lru_cache(maxsize=64)
def _pixel_rows(shape, sh, sw, OH, OW):
    """pixel_offsets of every output pixel of a padded NHWC input of ``shape`` (computed once per geometry)."""
    po = _k.pixel_offsets(np.empty(shape, dtype=np.float32), sh, sw, OH, OW, 0, shape[0] * OH * OW)
    po.flags.writeable = False
    return po


@functools.lru_cache(maxsize=64)
def _slab_offsets(shape):
    """matmul_tree16_gather's B offset tables (K blocks, column groups) for slabs of ``shape``
    (1, column tiles, K blocks, 16, width) as pack_b lays them out."""
    _, njt, nkb, _, W = shape
    bq = np.arange(nkb, dtype=np.uintp) * np.uintp(16 * W)
    g = np.arange(njt * (_k.NC // (2 * _k.LANES)), dtype=np.uintp)
    per = _k.NC // (2 * _k.LANES)
    bg = (g // per) * np.uintp(nkb * 16 * W) + (g % per) * np.uintp(2 * _k.LANES)
    for a in (bq, bg):
        a.flags.writeable = False
    return bq, bg


def depthwise_conv2d(x, w, strides=(1, 1), padding="VALID", dilations=(1, 1), bias=None, operand_dtype="float16",
                     out_dtype="float16", overflow_mode="inf_nan", subnormals="keep", model=None, epilogue=None):
    """Depthwise 2-D convolution on the emulated cube unit (TF DepthwiseConv2dNative).

    Output channel ``c * multiplier + m`` is the dot product over K = KH*KW taps, in the
    order (kh, kw), of input channel c with ``w[:, :, c, m]``; same block model as matmul.

    Parameters
    ----------
    x : array_like (N, H, W, Cin)
    w : array_like (KH, KW, Cin, multiplier)
    strides, dilations, padding : as :func:`conv2d`.
    """
    pol = _policy(operand_dtype, out_dtype, overflow_mode, subnormals, model)
    x, w, (sh, sw), (dh, dw), pads, (OH, OW) = _forward_geometry("depthwise_conv2d", x, w, strides, padding, dilations)
    N = x.shape[0]
    KH, KW, C, mult = w.shape
    out_shape = (N, OH, OW, C * mult)
    wv, sw_ = _operand_values(w, pol)
    biasv = _bias_vector(bias, C * mult, out_shape)
    K = KH * KW
    kp = _kp(K)
    CM = C * mult
    R = N * OH * OW
    if pol.fast:  # channels as the vector lanes; one extra bottom row of +0 pixels feeds the padding taps
        xp, sx = _padded_input(x, pol, ((0, 0), (pads[0][0], pads[0][1] + 1), pads[1], (0, 0)))
        wf = _padded(wv.reshape(K, CM), 0, kp)
        acc = _alloc.empty(out_shape, np.float32)
        _k.depthwise_tree16(xp, wf, mult, biasv, acc, sh, sw, dh, dw, KH, KW)
    else:  # one (1 x K) @ (K x pixels) product per output channel c*mult + m
        xp, sx = _padded_input(x, pol, ((0, 0), pads[0], pads[1], (0, 0)))
        WT = _padded(wv.reshape(K, CM).T.reshape(CM, 1, K), 2, kp)
        ia = np.arange(CM, dtype=np.int64)
        ib = ia // mult
        bias_t = np.ascontiguousarray(biasv.reshape(CM, 1))
        acc = _alloc.empty((R, CM), np.float32)
        chunk = max(_k.NC, (_IM2COL_BYTES // (4 * max(kp, 1) * max(C, 1))) // _k.NC * _k.NC)
        for r0 in range(0, R, chunk):
            n = min(R, r0 + chunk) - r0
            cols = _alloc.empty((C, kp, n), np.float32)
            _k.dw_im2col_t(xp, KH, KW, sh, sw, dh, dw, OH, OW, r0, cols)
            outT = _alloc.empty((CM, 1, n), np.float32)
            _accumulate(WT, cols, ia, ib, bias_t, True, outT, K, pol)
            acc[r0:r0 + n] = outT[:, 0, :].T
    out, sf = _finish(acc, pol, epilogue, out_shape)
    return out.reshape(out_shape), sx | sw_ | sf


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
    gather = _filter_grad_gather(KH, KW, C, sh, sw, dh, dw, OH, OW) if _IMPLICIT else None
    # else, with a few channels at stride 1 along rows: dw itself (taps x channels as rows, A read from planar
    # x in place; dy's rows as B, in place) where the pixels of a K block are 16 consecutive floats of a plane
    taps_rows = (_IMPLICIT and gather is None and sw == 1 and OW % 16 == 0 and C < 16 and CO in _k.GATHER_WIDTHS)
    if (gather or taps_rows) and (_any_nan(x) or _any_nan(dy)):
        gather, taps_rows = None, False
    if taps_rows:
        return _filter_grad_taps_rows(x, dy, KH, KW, sh, dh, dw, pads, OH, OW, pol, multicore)
    if gather:
        xflat, xshape, sx = _padded_input_flat(x, pol, ((0, 0), pads[0], pads[1], (0, 0)), gather[2])
        xp = xflat[:int(np.prod(xshape))].reshape(xshape)
        bg = (np.arange(KH, dtype=np.uintp)[:, None] * np.uintp(dh * xshape[2] * C)
              + np.arange(gather[1], dtype=np.uintp)[None, :] * np.uintp(2 * _k.LANES)).reshape(-1)
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
    koff = _k_offsets(KH, KW, C, xp.shape[2], dh, dw, "hwc")
    bounds = multicore.batch_bounds(N, OH * OW) if multicore is not None else None
    if bounds is None:
        bounds = np.array([0, R], dtype=np.int64)
    tiles = _tiles()
    zero = np.zeros(1, dtype=np.int64)
    Nc = Kc if not gather else len(bg) * 2 * _k.LANES   # the product's columns
    bias = np.zeros((1, Nc), dtype=np.float32)
    parts = np.empty((len(bounds) - 1, CO * Nc), dtype=np.float32)
    for c in range(len(bounds) - 1):  # dw^T = dy^T @ im2col(x): the taps x channels as the kernel's columns
        r0, r1 = int(bounds[c]), int(bounds[c + 1])
        kp = _kp(r1 - r0)
        a = _alloc.empty((1, CO, kp), np.float32)
        _k.rows_transposed(dys, r0, r1 - r0, a[0], *wide)
        out_c = parts[c].reshape(1, CO, Nc)
        if gather:
            # K block q: the 16 pixels r0 + 16q.. of one output row, sw*C floats apart in xp; column group g:
            # 32 consecutive floats of a tap row's run of (kw, c) (gather[1]); A's rows as rows_transposed wrote them
            bq = _pixel_bases(xp.shape, sh, sw, OH, OW, r0 // 16, kp // 16, 16)
            mc = _k.row_block(CO, 1, numba.get_num_threads())
            _k.matmul_tree16_gather(a, np.arange(CO, dtype=np.uintp) * np.uintp(kp),
                                    np.arange(kp // 16, dtype=np.uintp) * np.uintp(16), xflat, bq, bg, sw * C,
                                    bias, False, out_c[0], tiles, pol.exact_products, mc)
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
    xpl, sx = _planar_operands(x, pol, pads, C)
    if sx:   # the status is the patches' (the pixels some tap reads), not the whole input's
        ys, xs = (_covered(n_, k, s_, d, p[0], o) for n_, k, s_, d, p, o in
                  ((H, KH, sh, dh, pads[0], OH), (W, KW, 1, dw, pads[1], OW)))
        if len(ys) < H or len(xs) < W:
            sx = _operand_values(x[:, ys][:, :, xs], pol)[1]
    Hp, Wp = xpl.shape[2:]
    # dy's operand values, then 32 floats of +0 (a 16-column product's unused half reads past the last row)
    dyb = _alloc.empty(R * CO + 2 * _k.LANES, np.float32)
    dyb[R * CO:] = 0
    target = config.COMPUTE_DTYPES.get(pol.operand)
    if pol.operand != "float32" and dy.dtype == target:
        _k.widen_operands(np.ascontiguousarray(dy).reshape(-1).view(np.uint16), dyb[:R * CO].view(np.uint32),
                          pol.operand == "bfloat16", pol.subnormal == config.SUBNORMAL_MODES["flush"])
        sd = 0
    else:
        dv, sd = _operand_values(dy, pol)
        dyb[:R * CO] = dv.reshape(-1)
    kh, kw, c = np.meshgrid(np.arange(KH), np.arange(KW), np.arange(C), indexing="ij")
    a_rows = np.ascontiguousarray(((c * Hp + kh * dh) * Wp + kw * dw).reshape(-1), dtype=np.uintp)
    b_g = np.arange(-(-CO // (2 * _k.LANES)), dtype=np.uintp) * np.uintp(2 * _k.LANES)
    bounds = multicore.batch_bounds(N, OH * OW) if multicore is not None else None
    if bounds is None:
        bounds = np.array([0, R], dtype=np.int64)
    tiles = _tiles()
    bias = np.zeros((1, CO), dtype=np.float32)
    parts = np.empty((len(bounds) - 1, Kc * CO), dtype=np.float32)
    for part in range(len(bounds) - 1):
        r0, r1 = int(bounds[part]), int(bounds[part + 1])
        p = np.arange(r0, r1, 16, dtype=np.int64)   # each K block's first pixel (n, oh, ow)
        n, oh, ow = p // (OH * OW), (p // OW) % OH, p % OW
        a_q = np.ascontiguousarray((n * C * Hp + oh * sh) * Wp + ow, dtype=np.uintp)
        b_q = np.ascontiguousarray(p * CO, dtype=np.uintp)
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
def _filter_grad_gather(KH, KW, C, sh, sw, dh, dw, OH, OW):
    """How conv2d_backprop_filter's fast kernel may read its B operand (the patches: pixels as K, (kh, kw, c)
    as columns) in place from the padded input, or None: (the product column of each real column
    (kh, kw, c), the column groups' offsets from a pixel's corner, the floats read past the input's end).
    It needs 16 consecutive output pixels of one row (OW a multiple of 16, so K blocks never straddle rows)
    a fixed sw*C floats apart (a width the kernel is compiled for) and, within a tap row kh, the columns
    (kw, c) one contiguous run (dw = 1): the run is cut into groups of 32 floats, the last group's tail
    reading past the run (columns computed, never kept)."""
    if OW % 16 or dw != 1 or sw * C not in _k.GATHER_WIDTHS or KH * KW * C == 0:
        return None
    run = KW * C
    per = -(-run // (2 * _k.LANES))   # column groups per tap row
    if 2 * KH * per > 3 * -(-KH * KW * C // (2 * _k.LANES)):
        return None   # over half as many column groups again as packed patches need: those are cheaper
    cols = (np.arange(KH)[:, None] * per * 2 * _k.LANES + np.arange(run)[None, :]).reshape(-1)
    cols.flags.writeable = False
    return cols, per, per * 2 * _k.LANES - run


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
    WT = _padded(_filter_rows(np.pad(wv, ((0, 0), (0, 0), (0, Cp - CO), (0, 0))), order).T[None], 2, kp)
    # One product per class of pixels (y mod sh, x mod sw) (one class at stride 1). Without a bias and with a
    # finite filter, a class drops the K blocks that read only the zeros between dy's pixels. Exact: such a
    # block's products are signed zeros, their tree sum is a signed zero, and adding one changes no
    # accumulator: starting from +0 (no bias), an fp32 accumulator is never -0, and x + (+-0) = x otherwise.
    drop = bias is None and bool(np.isfinite(wv).all())
    plan = _backprop_input_plan(KH, KW, CO, Cp, order, dh, dw, sh, sw, t, lp, H, W, OH, OW, drop)
    (pt_, pb_), (pl_, pr_), classes = plan
    if pol.out == "float32":
        out = _alloc.empty(out_shape, np.float32)
    else:
        out = _alloc.empty(out_shape, np.uint16)
    tiles = _tiles()
    # an implicit GEMM where every kept K block is 16 channels of one tap and every class's grid rows are
    # runs of 16 pixels: the kernel reads dz's patches from planar dy in place (no packed slabs). Only without
    # NaN operands (the filter is finite here): which of two NaNs meeting in a sum comes out depends on the
    # compiled code's operand order
    if (_IMPLICIT and drop and order == "hwc" and CO % 16 == 0 and all(k.size % 16 == 0 and Wc % 16 == 0 and k.min(initial=0) >= 0
                                                          for (_, _, _, Wc, _, k) in classes) and not _any_nan(dy)):
        dyp, sd = _planar_operands(dy, pol, ((pt_, pb_), (pl_, pr_)), CO)
        Hp, Wp = dyp.shape[2:]
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


@functools.lru_cache(maxsize=64)
def _planar_tab(KH, KW, Cp, Hp, Wp, dh, dw, order):
    """matmul_tree16_tab's row table of conv2d's K positions (in the model's order, as _k_offsets) in a planar
    padded input (N, Cp + 1, Hp, Wp): tap (kh, kw) of channel c at c*Hp*Wp + kh*dh*Wp + kw*dw from the output
    pixel's corner; the K padding reads plane Cp (all +0)."""
    kh, kw, c = np.meshgrid(np.arange(KH), np.arange(KW), np.arange(Cp), indexing="ij")
    off = (c * Hp + kh * dh) * Wp + kw * dw
    if order == "c1hwc0":  # (cin // 16, kh, kw, cin % 16)
        off = off.reshape(KH, KW, Cp // 16, 16).transpose(2, 0, 1, 3)
    off = off.reshape(-1)
    tab = np.full(_kp(off.size), Cp * Hp * Wp, dtype=np.uintp)
    tab[:off.size] = off
    tab = tab.reshape(-1, 16)
    tab.flags.writeable = False
    return tab


@functools.lru_cache(maxsize=64)
def _class_runs(N, Hc, Wc, plane, Wp):
    """matmul_tree16_tab's column offsets for a grid of pixels in a planar input (a pixel class of an input
    gradient; conv2d's output pixels at stride 1 along rows), Wc a multiple of 16: for each group of 32 grid
    pixels, the planar offsets n*plane + i*Wp + m of its two runs of 16 (pixel (n*Hc + i)*Wc + m); a group's
    missing second run repeats its first (computed, never stored)."""
    R = N * Hc * Wc
    p = np.arange(0, R, 16, dtype=np.int64)
    g = p // Wc
    base = ((g // Hc) * plane + (g % Hc) * Wp + p % Wc).astype(np.uintp)
    g0 = np.ascontiguousarray(base[0::2])
    g1 = np.ascontiguousarray(base[1::2]) if len(base) % 2 == 0 else np.append(base[1::2], base[-1])
    for a in (g0, g1):
        a.flags.writeable = False
    return g0, g1


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
