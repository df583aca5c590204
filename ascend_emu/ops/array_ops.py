"""Data-movement and host ops: exact in any dtype, so they never round."""
from __future__ import annotations

import numpy as np

from ..numerics.policy import bfloat16
from ._util import as_int_list, contiguous, is_float
from .registry import HOST, MOVE, Source, register

_NP_DTYPES = {"bfloat16": bfloat16}


def _np_dtype(name):
    return _NP_DTYPES.get(name) or np.dtype(name)


@register("Const", kind=HOST)
def const(*, ctx, value):
    return np.asarray(value)


@register("Identity", "StopGradient", "Snapshot", "PreventGradient", "EnsureShape", "CheckNumerics", kind=MOVE)
def identity(x, *, ctx):
    return x


@register("IdentityN", kind=MOVE)
def identity_n(*xs, ctx):
    return tuple(xs)


@register("Reshape", kind=MOVE)
def reshape(x, shape, *, ctx):
    return x.reshape(as_int_list(shape))


@register("Squeeze", kind=MOVE)
def squeeze(x, *, ctx, squeeze_dims=()):
    dims = tuple(int(d) for d in squeeze_dims) if squeeze_dims else None
    return np.squeeze(x, axis=dims) if dims is not None else np.squeeze(x)


@register("ExpandDims", kind=MOVE)
def expand_dims(x, dim, *, ctx):
    return np.expand_dims(x, int(np.asarray(dim).reshape(-1)[0]))


@register("Transpose", kind=MOVE)
def transpose(x, perm, *, ctx):
    return contiguous(np.transpose(x, as_int_list(perm)))


@register("ConcatV2", kind=MOVE)
def concat_v2(*args, ctx):
    *xs, axis = args
    return np.concatenate(xs, axis=int(axis))


@register("Pack", kind=MOVE)
def pack(*xs, ctx, axis=0):
    return np.stack(xs, axis=int(axis))


@register("Unpack", kind=MOVE)
def unpack(x, *, ctx, axis=0, num=None):
    return tuple(contiguous(t) for t in np.moveaxis(x, int(axis), 0))


@register("Split", kind=MOVE)
def split(axis, x, *, ctx, num_split):
    return tuple(np.split(x, int(num_split), axis=int(axis)))


@register("SplitV", kind=MOVE)
def split_v(x, size_splits, axis, *, ctx, num_split=None):
    sizes = as_int_list(size_splits)
    ax = int(axis) % x.ndim
    if -1 in sizes:
        i = sizes.index(-1)
        sizes[i] = x.shape[ax] - (sum(sizes) + 1)
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=ax))


@register("StridedSlice", kind=MOVE)
def strided_slice(x, begin, end, strides, *, ctx, begin_mask=0, end_mask=0, ellipsis_mask=0,
                  new_axis_mask=0, shrink_axis_mask=0):
    index = strided_index(begin, end, strides, begin_mask, end_mask, ellipsis_mask, new_axis_mask, shrink_axis_mask)
    return contiguous(np.asarray(x)[index])


def strided_index(begin, end, strides, begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0,
                  shrink_axis_mask=0) -> tuple:
    """The numpy index of a TF StridedSlice."""
    begin, end, strides = as_int_list(begin), as_int_list(end), as_int_list(strides)
    index = []
    for i in range(len(begin)):
        if ellipsis_mask >> i & 1:
            index.append(Ellipsis)
        elif new_axis_mask >> i & 1:
            index.append(None)
        elif shrink_axis_mask >> i & 1:
            index.append(begin[i])
        else:
            b = None if begin_mask >> i & 1 else begin[i]
            e = None if end_mask >> i & 1 else end[i]
            index.append(slice(b, e, strides[i]))
    return tuple(index)


@register("Slice", kind=MOVE)
def slice_(x, begin, size, *, ctx):
    b, s = as_int_list(begin), as_int_list(size)
    idx = tuple(slice(bi, None if si == -1 else bi + si) for bi, si in zip(b, s))
    return contiguous(x[idx])


@register("Pad", "PadV2", "MirrorPad", kind=MOVE)
def pad(x, paddings, constant_values=None, *, ctx, mode="CONSTANT"):
    p = np.asarray(paddings).astype(np.int64).tolist()
    if mode.upper() == "REFLECT":
        return np.pad(x, p, mode="reflect")
    if mode.upper() == "SYMMETRIC":
        return np.pad(x, p, mode="symmetric")
    cv = 0 if constant_values is None else np.asarray(constant_values).reshape(()).astype(x.dtype)
    x = np.asarray(x)
    if len(p) != x.ndim or any(len(q) != 2 or q[0] < 0 or q[1] < 0 for q in p) or x.size < (1 << 16):
        return np.pad(x, p, mode="constant", constant_values=cv)   # small, or numpy's own error for bad paddings
    # a large tensor (a ZeroPadding2D before a strided convolution): the copy into a reused buffer
    # (kernels/alloc.py: no fresh pages to fault in), then only the borders written
    from ..kernels import alloc

    shape = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, p))
    out = alloc.empty(shape, x.dtype)
    out[tuple(slice(lo, lo + n) for n, (lo, _) in zip(x.shape, p))] = x
    for k, (lo, hi) in enumerate(p):
        before = (slice(None),) * k
        if lo:
            out[before + (slice(0, lo),)] = cv
        if hi:
            out[before + (slice(shape[k] - hi, shape[k]),)] = cv
    return out


@register("ReverseV2", kind=MOVE)
def reverse_v2(x, axis, *, ctx):
    axes = tuple(int(a) % max(np.ndim(x), 1) for a in np.asarray(axis).reshape(-1))
    return contiguous(np.flip(x, axis=axes)) if axes else x


@register("Tile", kind=MOVE)
def tile(x, multiples, *, ctx):
    return np.tile(x, as_int_list(multiples))


@register("BroadcastTo", kind=MOVE)
def broadcast_to(x, shape, *, ctx):
    """A float tensor that grows comes out as numpy's read-only zero-stride view, not copied out: the vector
    ops, casts and one-pass chains compute on its distinct values (numerics.vector, numerics.chain), every
    other consumer reads it as any array (a dump writes it in full)."""
    y = np.broadcast_to(x, as_int_list(shape))
    if y.ndim and is_float(y) and y.size > np.size(x):
        return y
    return contiguous(y)


@register("GatherNd", kind=MOVE)
def gather_nd(params, indices, *, ctx):
    """TF's GatherNd (ONNX's GatherND, batch_dims 0): the last axis of ``indices`` indexes the leading axes of
    ``params``; output shape indices.shape[:-1] + params.shape[depth:]. A negative index counts from the end, as
    ONNX's does (TensorFlow refuses it); one out of range is an error."""
    idx = np.asarray(indices).astype(np.int64)
    p = np.asarray(params)
    depth = idx.shape[-1] if idx.ndim else 0
    if not idx.ndim or depth > p.ndim:
        raise ValueError(f"GatherNd: indices of shape {idx.shape} for params of rank {p.ndim}")
    if depth == 0:      # every index selects all of params
        return contiguous(np.broadcast_to(p, idx.shape[:-1] + p.shape))
    dims = np.asarray(p.shape[:depth], np.int64)
    if idx.size and ((idx < -dims).any() or (idx >= dims).any()):
        raise ValueError(f"GatherNd: an index outside params' leading dims {tuple(dims)}")
    idx = np.where(idx < 0, idx + dims, idx)
    return contiguous(p[tuple(np.moveaxis(idx, -1, 0))])


@register("GatherV2", kind=MOVE)
def gather_v2(params, indices, axis, *, ctx, batch_dims=0):
    """TF's GatherV2; with ``batch_dims`` b the leading b axes of ``params`` and ``indices`` pair up (one gather
    per batch entry): the output's shape is params[:axis] + indices[b:] + params[axis + 1:]."""
    idx = np.asarray(indices).astype(np.int64)
    ax = int(np.asarray(axis).reshape(-1)[0]) % max(params.ndim, 1)
    bd = int(batch_dims) + (idx.ndim if int(batch_dims) < 0 else 0)
    if not bd:
        return np.take(params, idx, axis=ax)
    if bd > ax or params.shape[:bd] != idx.shape[:bd]:
        raise ValueError(f"GatherV2: batch_dims {bd} needs axis >= batch_dims and equal leading shapes, got params "
                         f"{params.shape}, indices {idx.shape}, axis {ax}")
    lead = params.shape[:bd]
    nb = int(np.prod(lead, dtype=np.int64))
    p = params.reshape((nb,) + params.shape[bd:])
    i = idx.reshape((nb,) + idx.shape[bd:])
    out = np.stack([np.take(p[b], i[b], axis=ax - bd) for b in range(nb)]) if nb else \
        np.empty((0,) + params.shape[bd:ax] + idx.shape[bd:] + params.shape[ax + 1:], params.dtype)
    return out.reshape(lead + out.shape[1:])


@register("Shape", kind=HOST)
def shape(x, *, ctx, out_type="int32"):
    return np.asarray(x.shape, dtype=_np_dtype(out_type))


@register("Size", kind=HOST)
def size(x, *, ctx, out_type="int32"):
    return np.asarray(x.size, dtype=_np_dtype(out_type))


@register("Rank", kind=HOST)
def rank(x, *, ctx):
    return np.asarray(x.ndim, dtype=np.int32)


@register("Fill", kind=MOVE)
def fill(dims, value, *, ctx):
    return np.full(as_int_list(dims), np.asarray(value).reshape(()), dtype=np.asarray(value).dtype)


@register("ZerosLike", kind=MOVE)
def zeros_like(x, *, ctx):
    return np.zeros_like(x)


@register("OnesLike", kind=MOVE)
def ones_like(x, *, ctx):
    return np.ones_like(x)


@register("Range", kind=HOST)
def range_(start, limit, delta, *, ctx, Tidx="int32"):
    return np.arange(np.asarray(start).item(), np.asarray(limit).item(), np.asarray(delta).item()).astype(_np_dtype(Tidx))


@register("Cast", kind=MOVE, source=Source(
    ("ASCEND-FACTS.md section 3 (Ascend C Cast RoundMode: CAST_RINT nearest even)",), (),
    "float narrowing rounds with CAST_RINT (NUMERICS.md section 1); to integers it truncates as TF does"))
def cast_op(x, *, ctx, DstT="float32", Truncate=False):
    """TF Cast: float<->float goes through the vector unit's rint cast; to ints it truncates like TF."""
    from ..numerics.vector import cast as vcast

    dst = _np_dtype(DstT)
    x = np.asarray(x)
    if x.dtype == dst:
        return x.copy()
    if dst in (np.dtype(np.float16), bfloat16) and (is_float(x) or x.dtype.kind in "biu"):
        src = x if x.dtype in (np.float32, np.float64) else x.astype(np.float64)
        y, st = vcast(src, dst.name, overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals)
        ctx.record(st)
        return y
    if is_float(x) and dst.kind in "iu":
        with np.errstate(invalid="ignore"):
            return np.trunc(x.astype(np.float64)).astype(dst)
    return x.astype(dst)


@register("OneHot", kind=MOVE)
def one_hot(indices, depth, on_value, off_value, *, ctx, axis=-1):
    """TF's OneHot: ``on_value`` where the index equals the position along the new ``axis``, else ``off_value``;
    an index outside [0, depth) gives a row of ``off_value``. The values are copied, so the result is exact in
    any dtype (hicann/ops-math ``math/one_hot``: its golden, ``tests/assets/golden.py``, is TensorFlow's
    one_hot itself)."""
    idx = np.asarray(indices).astype(np.int64)
    d = int(np.asarray(depth).reshape(-1)[0])
    on, off = np.asarray(on_value).reshape(()), np.asarray(off_value).reshape(())
    ax = int(axis)
    ax = idx.ndim if ax == -1 else ax
    hit = np.expand_dims(idx, ax) == np.arange(max(d, 0)).reshape([-1] + [1] * (idx.ndim - ax))
    return contiguous(np.where(hit, on, off).astype(np.result_type(on, off)))


@register("MatrixBandPart", kind=MOVE)
def matrix_band_part(x, num_lower, num_upper, *, ctx):
    """TF's MatrixBandPart: entry (m, n) of each innermost matrix kept where (num_lower < 0 or m - n <= num_lower)
    and (num_upper < 0 or n - m <= num_upper), else zero (the causal and sliding-window masks). A selection:
    exact in any dtype."""
    x = np.asarray(x)
    lo, up = int(np.asarray(num_lower).reshape(-1)[0]), int(np.asarray(num_upper).reshape(-1)[0])
    m = np.arange(x.shape[-2])[:, None]
    n = np.arange(x.shape[-1])[None, :]
    keep = ((lo < 0) | (m - n <= lo)) & ((up < 0) | (n - m <= up))
    return contiguous(np.where(keep, x, np.zeros((), x.dtype)))
