"""Selection, scan, index and resize ops on the AI Core's vector unit (issue 36): TopKV2, Cumsum, SegmentSum,
ScatterNd / TensorScatterAdd / TensorScatterUpdate, ResizeBilinear and ResizeNearestNeighbor (and their
gradients).

Their arithmetic (NUMERICS.md section 2, "index and resize ops"): the ops that only pick or move values (TopKV2,
ResizeNearestNeighbor, TensorScatterUpdate) are exact in any dtype; the ones that add (Cumsum, the segment and
scatter sums, the bilinear weights) widen 16-bit inputs to float32, compute in float32 and round each output
once to the compute dtype (:func:`~ascend_emu.ops._util.finish`), as CANN's Ascend C Cumsum does (it casts
half/bf16 to float, accumulates in float registers and casts back with rint).
"""
from __future__ import annotations

import numpy as np

from ..errors import AscendEmuError
from ._util import as_int_list, contiguous, finish, is_float, widen
from .registry import MOVE, VECTOR, Source, register


#: the TBE kernels (canndev, read in the public mirror dengguojie/vue-element-admin) and the model's section
_TBE = "canndev ops/built-in/tbe/impl/"
_INDEX_MODEL = "NUMERICS.md section 2 (index, scan and resize ops)"


def _scalar(x) -> int:
    return int(np.asarray(x).reshape(-1)[0])


# ------------------------------------------------------------------------------------------- TopKV2

@register("TopKV2", kind=VECTOR,
          source=Source(exact="the k largest values are the input's own, their indices integers"))
def top_k_v2(x, k, *, ctx, sorted=True, index_type="int32"):
    """The ``k`` largest entries of the last axis, largest first; equal values keep their index order (TF's
    rule, and a stable sort's). Values are the input's own, so exact in any dtype; NaN counts as largest (TF)."""
    k = _scalar(k)
    x = np.asarray(x)
    if k < 0 or (x.ndim and k > x.shape[-1]):
        raise AscendEmuError(f"TopKV2: k={k} must be in [0, {x.shape[-1] if x.ndim else 0}]")
    if is_float(x):
        key = np.asarray(x, np.float64)   # exact for every float dtype
        nan = np.isnan(key)
        # largest first (-0.0 and +0.0 compare equal, so they keep their index order); NaNs above all
        order = (np.lexsort((-np.where(nan, 0, key), ~nan), axis=-1) if nan.any()
                 else np.argsort(-key, axis=-1, kind="stable"))
    else:
        order = np.argsort(~x, axis=-1, kind="stable")   # ~v decreases as v grows, without overflow
    idx = order[..., :k]
    vals = np.take_along_axis(x, idx, axis=-1)
    return contiguous(vals), idx.astype(np.dtype(index_type))


# ------------------------------------------------------------------------------------------- Cumsum

def _scan(x32, axis, exclusive, reverse):
    """The float32 running sum (one IEEE float32 add per step, in scan order) of float32 ``x32``."""
    y = np.flip(x32, axis) if reverse else x32
    with np.errstate(all="ignore"):
        s = np.cumsum(y, axis=axis, dtype=np.float32)   # numpy's cumsum is sequential
        if exclusive:
            s = np.concatenate([np.zeros_like(np.take(s, [0], axis=axis)), np.delete(s, -1, axis=axis)], axis=axis) \
                if s.shape[axis] else s
    return np.flip(s, axis) if reverse else s


@register("Cumsum", kind=VECTOR, source=Source(
    (_TBE + "dynamic/cumsum.py, dynamic/cum_computer.py (CumsumComputer._cal_data: vadd of the running sum in the "
     "input dtype; bf16 taken as float32)",
     "hicann/ops-math math/cumsum/op_kernel/arch35/cumsum_base/cumsum_core_sklansky.h (T promoted to PromtT float)",
     _INDEX_MODEL), ("op_model",),
    "TBE (910, 910B): fp16 added in fp16, each running sum rounded (and saturated) before the next add; float32 a "
    "float32 running sum, each output rounded once; bf16 the same as float32 (the kernel's bf16 path is assumed, no "
    "parameter); exclusive / reverse, which dynamic/cumsum.py's check_supported refuses (GE then takes the static "
    "cumsum_d.py or the AI CPU), are assumed to add as the inclusive form (no parameter); op_model ascendc / exact: "
    "float32 in scan order for every dtype (the Ascend C kernel's float32, not its Sklansky order)"))
def cumsum(x, axis, *, ctx, exclusive=False, reverse=False):
    """Running sum along ``axis``. TBE (``op_model`` tbe_*): an fp16 ``x`` is summed by fp16 vadds, each running
    sum rounded to fp16; other float dtypes (and every dtype under ``ascendc`` / ``exact``) by float32 adds in scan
    order, each output rounded once."""
    x = np.asarray(x)
    ax = _scalar(axis) % max(x.ndim, 1)
    if not is_float(x):
        y = np.flip(x, ax) if reverse else x
        s = np.cumsum(y, axis=ax, dtype=x.dtype)
        if exclusive:
            s = np.concatenate([np.zeros_like(np.take(s, [0], axis=ax)), np.delete(s, -1, axis=ax)], axis=ax)
        return contiguous(np.flip(s, ax) if reverse else s)
    if x.dtype == np.float16 and ctx.dtype_name == "float16" and ctx.op_model.startswith("tbe") and x.ndim:
        return _scan16(ctx, x, ax, bool(exclusive), bool(reverse))
    return finish(ctx, _scan(widen(ctx, x), ax, bool(exclusive), bool(reverse)))


def _scan16(ctx, x, axis, exclusive, reverse):
    """TBE's fp16 running sum: the first element copied, then one fp16 vadd per step (the exact sum rounded once,
    status and overflow mode per add); exclusive writes the sum before the step's add."""
    from .math_ops import vec

    y = np.moveaxis(np.flip(x, axis) if reverse else x, axis, 0)
    out = np.empty(y.shape, np.float16)
    if y.shape[0]:
        acc = np.array(y[0])
        if exclusive:
            out[0] = 0
        else:
            out[0] = acc
        for i in range(1, y.shape[0]):
            if exclusive:
                out[i] = acc
            acc = vec(ctx, "add", acc, y[i])
            if not exclusive:
                out[i] = acc
    out = np.moveaxis(out, 0, axis)
    return contiguous(np.flip(out, axis) if reverse else out)


# ------------------------------------------------------------------------------------ segment sums

@register("SegmentSum", kind=VECTOR, source=Source(
    (_TBE + "dynamic/segment_sum.py (float32: atomic adds; float16: unsorted_segment_sum_no_atomic.py)",
     _INDEX_MODEL), (),
    "float32 adds in row order, one rounding (the order assumed, no parameter); the fp16 no-atomic kernel's "
    "accumulator was not read"))
def segment_sum(data, segment_ids, *, ctx):
    """out[s] = the sum of the rows with (sorted) id s, in float32 in row order, rounded once; ids that no row
    has give zero rows (TF)."""
    ids = np.asarray(segment_ids).astype(np.int64).reshape(-1)
    if ids.size and (np.any(np.diff(ids) < 0) or ids[0] < 0):
        raise AscendEmuError("SegmentSum: segment ids must be sorted and non-negative; fix the segment ids")
    ns = int(ids[-1]) + 1 if ids.size else 0
    rows = np.asarray(data)
    if not is_float(rows):
        out = np.zeros((ns,) + rows.shape[1:], rows.dtype)
        np.add.at(out, ids, rows)
        return out
    acc = np.zeros((ns,) + rows.shape[1:], np.float32)
    with np.errstate(all="ignore"):
        np.add.at(acc, ids, widen(ctx, rows))   # unbuffered: one float32 add per row, in row order
    return finish(ctx, acc)


# ------------------------------------------------------------------------------------------- scatter

def _scatter_plan(indices, shape):
    """(flat slice numbers of every index row, slice shape) for TF's ScatterNd indexing of ``shape``."""
    ind = np.asarray(indices).astype(np.int64)
    depth = ind.shape[-1]
    lead = tuple(shape[:depth])
    flat = ind.reshape(-1, depth)
    if flat.size and (np.any(flat < 0) or np.any(flat >= np.asarray(lead, np.int64))):
        raise AscendEmuError(f"scatter: an index of {flat.tolist()} lies outside the shape {list(shape)}")
    return (np.ravel_multi_index(flat.T, lead) if depth else np.zeros(len(flat), np.int64)), tuple(shape[depth:])


def _scatter_add(base, indices, updates, ctx):
    shape = base.shape
    pos, slc = _scatter_plan(indices, shape)
    n = int(np.prod(shape[:len(shape) - len(slc)], dtype=np.int64))
    upd = np.asarray(updates).reshape((len(pos),) + slc)
    if not is_float(base):
        out = base.reshape((n,) + slc).copy()
        np.add.at(out, pos, upd)
        return out.reshape(shape)
    acc = widen(ctx, base).reshape((n,) + slc)
    with np.errstate(all="ignore"):
        np.add.at(acc, pos, widen(ctx, upd))   # float32, one add per update row in index order
    return finish(ctx, acc.reshape(shape))


@register("ScatterNd", kind=VECTOR, source=Source(
    (_TBE + "dynamic/scatter_nd.py (atomic adds into the output)", _INDEX_MODEL), (),
    "float32 adds in index order, one rounding (the order assumed, no parameter); fp16 atomic adds in the output "
    "dtype, where the kernel uses them, are not modelled"))
def scatter_nd(indices, updates, shape, *, ctx):
    """A zero tensor of ``shape`` with ``updates`` added at ``indices`` (repeated indices add up): float32
    accumulation in index order, rounded once."""
    u = np.asarray(updates)
    return _scatter_add(np.zeros(as_int_list(shape), u.dtype), indices, u, ctx)


@register("TensorScatterAdd", kind=VECTOR, source=Source(
    ("canndev ops/built-in/fusion_pass/graph_fusion/ai_core/tensor_scatter_add_fusion_pass.cc (TensorMove + "
     "ScatterNdAdd)", _TBE + "dynamic/scatter_nd_add.py (vec_add of each update into var, in var's dtype)",
     _INDEX_MODEL), (),
    "each update row added into the tensor in its dtype in index order (fp16: rounded per add, status and overflow "
    "mode per add; float32 likewise in float32); bf16 (not in the kernel's dtype list) a float32 sum rounded once "
    "(assumed, no parameter)"))
def tensor_scatter_add(tensor, indices, updates, *, ctx):
    """ScatterNdAdd on a copy of ``tensor`` (GE's TensorScatterAddFusionPass): every update row added into its
    slice with one vadd in the tensor's dtype, in index order (a repeated index adds onto the rounded sum)."""
    t = np.asarray(tensor)
    if t.dtype != np.float16 or ctx.dtype_name != "float16":
        return _scatter_add(t, indices, updates, ctx)
    from .math_ops import vec

    pos, slc = _scatter_plan(indices, t.shape)
    n = int(np.prod(t.shape[:t.ndim - len(slc)], dtype=np.int64))
    out = t.reshape((n,) + slc).copy()
    upd = np.asarray(updates, np.float16).reshape((len(pos),) + slc)
    # the k-th occurrence of each slice in index order: within one occurrence number the slices are distinct, so
    # each round is one vadd over them, and a slice's rounds come in its index order
    order = np.argsort(pos, kind="stable")
    first = np.r_[0, np.flatnonzero(np.diff(pos[order])) + 1] if len(pos) else np.zeros(0, np.int64)
    occ = np.empty(len(pos), np.int64)
    occ[order] = np.arange(len(pos)) - np.repeat(first, np.diff(np.r_[first, len(pos)]))
    for r in range(int(occ.max()) + 1 if len(pos) else 0):
        rows = np.flatnonzero(occ == r)
        out[pos[rows]] = vec(ctx, "add", out[pos[rows]], upd[rows])
    return out.reshape(t.shape)


@register("TensorScatterUpdate", kind=MOVE)
def tensor_scatter_update(tensor, indices, updates, *, ctx):
    """``tensor`` with the slices at ``indices`` replaced (a repeated index: the last update wins, as TF's CPU
    kernel writes them in order)."""
    t = np.asarray(tensor)
    pos, slc = _scatter_plan(indices, t.shape)
    n = int(np.prod(t.shape[:t.ndim - len(slc)], dtype=np.int64))
    out = t.reshape((n,) + slc).copy()
    out[pos] = np.asarray(updates, t.dtype).reshape((len(pos),) + slc)
    return out.reshape(t.shape)


# ------------------------------------------------------------------------------------------- resize

def _resize_scale(n_in: int, n_out: int, align_corners: bool) -> np.float32:
    """TF's CalculateResizeScale, in float32."""
    if align_corners and n_out > 1:
        return np.float32(n_in - 1) / np.float32(n_out - 1)
    return np.float32(n_in) / np.float32(n_out)


def _source_coords(n_in, n_out, align_corners, half_pixel):
    """Every output index's float32 source coordinate: TF's HalfPixelScaler ((i + 0.5) * scale - 0.5) or
    LegacyScaler (i * scale)."""
    s = _resize_scale(n_in, n_out, align_corners)
    i = np.arange(n_out, dtype=np.float32)
    with np.errstate(all="ignore"):
        return (i + np.float32(0.5)) * s - np.float32(0.5) if half_pixel else i * s


def _lerp_weights(n_in, n_out, align_corners, half_pixel):
    """(lower index, upper index, float32 lerp) per output index, as TF's compute_interpolation_weights."""
    src = _source_coords(n_in, n_out, align_corners, half_pixel)
    fl = np.floor(src)
    lower = np.maximum(fl.astype(np.int64), 0)
    upper = np.minimum(np.ceil(src).astype(np.int64), n_in - 1)
    return lower, upper, (src - fl).astype(np.float32)


def _size(size):
    h, w = as_int_list(size)
    return h, w


@register("ResizeBilinear", kind=VECTOR, source=Source(
    (_TBE + "dynamic/resize_bilinear_v2.py (inner_dtype float32)", _INDEX_MODEL), (),
    "TF's float32 formula and coordinates, one rounding; that the kernel's float32 steps follow TF's order is "
    "assumed (no parameter)"))
def resize_bilinear(images, size, *, ctx, align_corners=False, half_pixel_centers=False):
    """TF's bilinear resize in float32 on the widened input: top = tl + (tr - tl) * xl, bottom likewise,
    top + (bottom - top) * yl, rounded once to the compute dtype."""
    x = widen(ctx, images) if is_float(images) else np.asarray(images, np.float32)
    n, h, w, c = x.shape
    oh, ow = _size(size)
    yl, yu, ly = _lerp_weights(h, oh, align_corners, half_pixel_centers)
    xl, xu, lx = _lerp_weights(w, ow, align_corners, half_pixel_centers)
    lx = lx[None, None, :, None]
    ly = ly[None, :, None, None]
    with np.errstate(all="ignore"):
        rows_t, rows_b = x[:, yl], x[:, yu]
        top = rows_t[:, :, xl] + (rows_t[:, :, xu] - rows_t[:, :, xl]) * lx
        bottom = rows_b[:, :, xl] + (rows_b[:, :, xu] - rows_b[:, :, xl]) * lx
        y = top + (bottom - top) * ly
    out = finish(ctx, y.astype(np.float32))
    return out if is_float(images) or ctx.dtype != np.float32 else out.astype(np.float32)


def _nearest_index(n_in, n_out, align_corners, half_pixel):
    s = _resize_scale(n_in, n_out, align_corners)
    i = np.arange(n_out, dtype=np.float32)
    src = (i + np.float32(0.5)) * s if half_pixel else i * s      # TF's HalfPixelScalerForNN / LegacyScaler
    # align_corners: roundf (halves away from zero); else floorf
    idx = np.floor(src + np.float32(0.5)) if align_corners else np.floor(src)
    idx = np.minimum(idx.astype(np.int64), n_in - 1)
    return np.maximum(idx, 0) if half_pixel else idx


@register("ResizeNearestNeighbor", kind=MOVE)
def resize_nearest_neighbor(images, size, *, ctx, align_corners=False, half_pixel_centers=False):
    """Each output pixel a copy of one input pixel (TF's index rule): exact in any dtype."""
    x = np.asarray(images)
    oh, ow = _size(size)
    iy = _nearest_index(x.shape[1], oh, align_corners, half_pixel_centers)
    ix = _nearest_index(x.shape[2], ow, align_corners, half_pixel_centers)
    return contiguous(x[:, iy][:, :, ix])


@register("ResizeBilinearGrad", kind=VECTOR, source=Source(
    (_TBE + "dynamic/resize_bilinear_v2_grad.py (float32 grads only)", _INDEX_MODEL), (),
    "float32 weights, adds in output order, one rounding (the order assumed, no parameter); the kernel takes "
    "float32 only, so an fp16 graph casts around it"))
def resize_bilinear_grad(grads, original_image, *, ctx, align_corners=False, half_pixel_centers=False):
    """The gradient of :func:`resize_bilinear` with respect to its input: each output gradient spread over its
    four source pixels with the float32 weights (1 - yl)(1 - xl), ..., added in float32 in output order,
    rounded once."""
    g = widen(ctx, grads)
    n, oh, ow, c = g.shape
    h, w = np.shape(original_image)[1:3]
    yl, yu, ly = _lerp_weights(h, oh, align_corners, half_pixel_centers)
    xl, xu, lx = _lerp_weights(w, ow, align_corners, half_pixel_centers)
    acc = np.zeros((n, h, w, c), np.float32)
    one = np.float32(1)
    with np.errstate(all="ignore"):
        for oy in range(oh):
            t, b, dy = yl[oy], yu[oy], ly[oy]
            for ox in range(ow):
                le, r, dx = xl[ox], xu[ox], lx[ox]
                v = g[:, oy, ox]
                top, bot = v * (one - dy), v * dy
                acc[:, t, le] += top * (one - dx)
                acc[:, t, r] += top * dx
                acc[:, b, le] += bot * (one - dx)
                acc[:, b, r] += bot * dx
    return finish(ctx, acc)


@register("ResizeNearestNeighborGrad", kind=VECTOR, source=Source(
    (_TBE + "dynamic/resize_nearest_neighbor_v2_grad.py (float32 grads only)", _INDEX_MODEL), (),
    "float32 adds in output order, one rounding (the order assumed, no parameter); the kernel takes float32 only"))
def resize_nearest_neighbor_grad(grads, size, *, ctx, align_corners=False, half_pixel_centers=False):
    """The gradient of :func:`resize_nearest_neighbor`: each input pixel the float32 sum (in output order) of the
    gradients of the outputs that copied it, rounded once."""
    g = widen(ctx, grads)
    n, oh, ow, c = g.shape
    h, w = _size(size)
    iy = _nearest_index(h, oh, align_corners, half_pixel_centers)
    ix = _nearest_index(w, ow, align_corners, half_pixel_centers)
    acc = np.zeros((n, h * w, c), np.float32)
    pos = (iy[:, None] * w + ix[None, :]).reshape(-1)
    with np.errstate(all="ignore"):
        np.add.at(acc, (slice(None), pos), g.reshape(n, oh * ow, c))
    return finish(ctx, acc.reshape(n, h, w, c))


# ------------------------------------------------------------------------------------------- ArgMax / ArgMin

def _arg(x, dimension, output_type, largest):
    """The index of the largest (smallest) entry along ``dimension``: the first one among equal values (TBE
    arg_max_v2.py keeps the running index unless ``vcmpv_lt`` finds the new value strictly larger; the ops-math
    golden is np.argmax / np.argmin); a NaN counts as the extreme one (the golden's np.argmax: the first NaN).
    The values are compared as they are, so the result is exact in any dtype."""
    x = np.asarray(x)
    ax = _scalar(dimension) % max(x.ndim, 1)
    if is_float(x):
        x = np.asarray(x, np.float64)   # exact for every float dtype (numpy has no ordering of bfloat16's NaN)
    return (np.argmax if largest else np.argmin)(x, axis=ax).astype(np.dtype(output_type))


_ARG_SOURCE = Source(("canndev ops/built-in/tbe/impl/dynamic/arg_max_v2.py",
                      "hicann/ops-math math/arg_max_v2/tests/assets/golden.py"),
                     exact="an index of the input's own values (first index on ties; a NaN wins, assumed for TBE)")


@register("ArgMax", kind=VECTOR, source=_ARG_SOURCE)
def arg_max(x, dimension, *, ctx, output_type="int64"):
    """TF's ArgMax as CANN's ArgMaxV2 computes it (:func:`_arg`)."""
    return _arg(x, dimension, output_type, True)


@register("ArgMin", kind=VECTOR, source=_ARG_SOURCE)
def arg_min(x, dimension, *, ctx, output_type="int64"):
    """TF's ArgMin as CANN's ArgMin computes it (:func:`_arg`)."""
    return _arg(x, dimension, output_type, False)
