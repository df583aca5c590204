"""Convolutions on the cube unit: conv2d and depthwise conv2d (NHWC), and the geometry and operand layouts
the two gradients of conv2d share with them (those are :mod:`.conv_grad`).

Each is the pipeline of :mod:`.cube_core` over an im2col geometry: the K order of a patch is fixed by
``_k_offsets`` (NUMERICS.md section 3, ``conv_k_order``), padded pixels are +0, and the patches are packed
straight into the kernels' layouts (``kernels/cube/conv.py``).
"""
from __future__ import annotations

import functools
import math

import numba
import numpy as np

from . import memo as _memo
from . import policy as config
from . import shared as _shared
from .cube_core import (Epilogue, _Policy, _accumulate, _bias_vector, _finish, _kp, _numeric, _operand_values, _padded,
                        _padded_input, _padded_input_flat, _policy, _tiles, _transposed)
from ..errors import AscendEmuError
from ..kernels import alloc as _alloc
from ..kernels import cube as _k

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
    """``(sh, sw), (dh, dw), ((top, bottom), (left, right)), (OH, OW)`` of a convolution, checked: worked out once
    per (op, shapes, strides, padding, dilations) where these are hashable (a list is not: every call). Equal keys
    give the same geometry: _hw and _pads read the values as ints (1 == 1.0 == True alike, NaN never equal)."""
    args = (op, x.shape, w.shape, strides, padding, dilations)
    try:
        hash(args)
    except TypeError:
        return _geometry_of(*args)
    return _geometry_cached(*args)


def _geometry_of(op, xs, ws, strides, padding, dilations):
    if len(xs) != 4 or len(ws) != 4:
        raise AscendEmuError(f"{op} needs a 4-D NHWC input and a 4-D filter, got x of shape {xs} "
                             f"and w of shape {ws}")
    if ws[2] != xs[3]:
        raise AscendEmuError(f"{op}: filter in-channels differ from input channels: x of shape {xs} (NHWC) "
                             f"and w of shape {ws}")
    sh, sw = _hw(strides, "strides")
    dh, dw = _hw(dilations, "dilations")
    _, H, W, _ = xs
    KH, KW = ws[:2]
    (pt, pb), (pl, pr) = _pads(padding, H, W, KH, KW, sh, sw, dh, dw)
    OH = (H + pt + pb - (KH - 1) * dh - 1) // sh + 1
    OW = (W + pl + pr - (KW - 1) * dw - 1) // sw + 1
    if OH <= 0 or OW <= 0 or KH == 0 or KW == 0:
        raise AscendEmuError(f"{op}: the dilated filter of shape {ws} (dilations {(dh, dw)}) does not fit the "
                             f"padded input of shape {xs} (padding {padding!r})")
    return (sh, sw), (dh, dw), ((pt, pb), (pl, pr)), (OH, OW)


_geometry_cached = functools.lru_cache(maxsize=256)(_geometry_of)


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


@functools.lru_cache(maxsize=256)
def _k_table(KH, KW, C, Wp, dh, dw, order: str) -> tuple:
    """(_k_offsets, whether its K blocks are runs of 16: _runs16) of one geometry, worked out once: a small
    convolution paid ~70 us a call for them (numpy's meshgrid and the runs' check), a tenth of SqueezeNet's
    1x1 convolutions. The array is shared: the kernels only read it."""
    koff = _k_offsets(KH, KW, C, Wp, dh, dw, order)
    return koff, _runs16(koff)


def k_order_acts(KH: int, KW: int, C: int) -> bool:
    """Whether ``CubeModel.conv_k_order`` can change a forward Conv2D's bits for a (KH, KW, C, Cout) filter.

    It cannot where C is a whole number of C0 = 16 blocks and the filter is 1x1 or C is one block: "c1hwc0"'s
    order (cin // 16, kh, kw, cin % 16) is then "hwc"'s (kh, kw, cin) term for term (_k_offsets, _filter_rows and
    _planar_tab permute nothing) and no channel is padded (Cp == C), so both orders run the same code on the same
    operands. ``fit`` reruns such a convolution once for the two orders."""
    return not (C % 16 == 0 and (KH * KW == 1 or C == 16))


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
    return pol.fast and w.shape[3] % (2 * _k.LANES) == 0 and not _filter_nan(w)


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
    planar = (_IMPLICIT and transposed and pol.fast and sw == 1 and OW % 16 == 0 and not _filter_nan(w)
              and not _any_nan(x))
    if planar:
        xp, sx = _planar_shared(x, pol, pads, Cp + 1)   # channels C.. Cp: +0, the K padding's plane
    elif bits16:
        xp, sx = np.ascontiguousarray(x).view(np.uint16), 0
    elif _shared.active() and Cp == C and any(map(any, pads)):
        # the padded input the layer's Conv2DBackpropFilter reads too (numerics/shared.py)
        flat, shape, sx = _padded_shared(x, pol, ((0, 0), pads[0], pads[1], (0, 0)), 0)
        xp = flat[:math.prod(shape)].reshape(shape)
    else:
        xp, sx = _padded_input(x, pol, ((0, 0), pads[0], pads[1], (0, Cp - C)))
    wide = (pol.operand == "bfloat16", pol.subnormal)   # how im2col widens 16-bit bits
    runs16 = False
    if not planar:
        koff, runs16 = _k_table(KH, KW, Cp, xp.shape[2], dh, dw, order)
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
    if _IMPLICIT and not transposed and pol.fast and not bits16 and runs16 and not _filter_nan(w):
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


#: the +0 floats a padded input made for a replay's store (numerics/shared.py) carries past its end: more than
#: conv2d_backprop_filter's gather reads there (at most 15 floats, within one column group of 2 * LANES), so the forward
#: convolution's buffer serves it
_SHARED_SLACK = 2 * _k.LANES


def _pads_key(pads) -> tuple:
    return tuple(tuple(int(v) for v in p) for p in pads)


def _padded_shared(x: np.ndarray, pol: _Policy, pads, slack: int):
    """_padded_input_flat(x, pol, pads, slack): (flat, shape, status), made once per replay for the cube ops that
    read the same x with the same padding (numerics/shared.py: the forward Conv2D and its Conv2DBackpropFilter),
    then with _SHARED_SLACK +0 floats past its end (a kernel reads at most ``slack`` of them)."""
    if not _shared.active() or slack > _SHARED_SLACK:
        return _padded_input_flat(x, pol, pads, slack)
    return _shared.shared(x, ("padded", _pads_key(pads), pol.operand, pol.overflow, pol.subnormal),
                          lambda: _padded_input_flat(x, pol, pads, _SHARED_SLACK))


def _planar_shared(x: np.ndarray, pol: _Policy, pads, channels: int, exact: bool = True):
    """_planar_operands(x, pol, pads, channels), made once per replay for the cube ops that read the same x with
    the same padding (numerics/shared.py). ``exact``: exactly ``channels`` planes per sample (the caller's layout),
    else at least that many (the planes past x's channels are +0, the caller reads the count from the shape)."""
    if not _shared.active():
        return _planar_operands(x, pol, pads, channels)
    return _shared.shared(x, ("planar", _pads_key(pads), pol.operand, pol.overflow, pol.subnormal),
                          lambda: _planar_operands(x, pol, pads, channels),
                          (lambda v: v[0].shape[1] == channels) if exact else (lambda v: v[0].shape[1] >= channels))


def _filter_nan(w: np.ndarray) -> bool:
    """_any_nan of a filter, once per frozen constant (numerics/memo.py: a replay's weights; ResNet50's 53
    filters took 74 ms a replay as a float32 copy tested with isnan)."""
    return _memo.memo(w, ("any nan",), lambda: _any_nan(w))


def _any_nan(a: np.ndarray) -> bool:
    """Whether the operand array holds a NaN (16-bit floats tested on their bits); once per replay for an array
    several cube ops read (numerics/shared.py: a layer's x and dy)."""
    return _shared.shared(a, ("any nan",), lambda: _has_nan(a))


def _has_nan(a: np.ndarray) -> bool:
    if a.dtype == np.float16 or a.dtype == config.bfloat16:
        # (the kernel tests up to 2M elements on this thread: a filter or an activation makes no parallel launch)
        bits = np.ascontiguousarray(a).reshape(-1).view(np.uint16)
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
