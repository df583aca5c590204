"""ONNX's data-movement ops onto the registry (shapes, slicing, gathering), with ONNX's semantics:
Reshape's 0 (copy the input's dim) and -1, Flatten, Slice's starts/ends/axes/steps inputs, the opset 13
move of Split/Squeeze/Unsqueeze's axes from attributes to inputs (and Split's ``num_outputs`` of opset
18), Expand's two-way broadcast, Pad's ``pads`` input, Resize (nearest by whole factors as data movement,
nearest by other factors as ResizeNearestNeighbor, linear as ResizeBilinear, where ONNX's coordinates are TF's).

Values the registry op needs as constants (a shape, axes, begins) must be known when the model loads
(an initializer, a ``Constant``, or arithmetic on static shapes that :mod:`.onnx_loader` folds);
otherwise the node runs on the AI CPU (:class:`.build.Fallback`).
"""
from __future__ import annotations

import numpy as np

from .build import TO_NCHW, TO_NHWC, Fallback
from .ops import _one, converter

_INT_MAX = 2 ** 62


def _axes(b, n, attr_until: int, input_index: int):
    """An op's axes: the attribute before opset ``attr_until``, the input from it; None if absent."""
    if n.opset < attr_until:
        v = n.a("axes")
        return None if v is None else [int(a) for a in v]
    if not n.inp(input_index):
        return None
    return [int(a) for a in np.asarray(b.need(n.inp(input_index), "the axes")).reshape(-1)]


@converter("Constant")
def _constant(b, n):
    v = b.values[n.outputs[0]]
    return [b.emit(n.name, "Const", [], {"value": v, "dtype": v.dtype.name}, exact=True)]


@converter("Reshape")
def _reshape(b, n):
    if b.value(n.inputs[1]) is None:
        return _reshape_runtime(b, n)
    shape = [int(d) for d in np.asarray(b.need(n.inputs[1], "Reshape's shape")).reshape(-1)]
    if 0 in shape and not int(n.a("allowzero", 0)):
        src = b.shape(n.inputs[0]) or []
        if any(d == 0 and (i >= len(src) or src[i] is None) for i, d in enumerate(shape)):
            return _reshape_runtime(b, n)      # a 0 copying a dim known only when the model runs
        shape = [src[i] if d == 0 else d for i, d in enumerate(shape)]
    return _one(b, n, "Reshape", [b.ref(n.inputs[0]), b.ints(shape, f"{n.name}/shape")], T=False)


def _reshape_runtime(b, n):
    """Reshape to a shape computed when the model runs (PyTorch's Shape/Gather/Concat of a dynamic batch):
    ONNX's 0 ("copy the input's dim") becomes, with integer ops, the input's dim at that index:
    SelectV2(shape == 0, Shape(x)[:len(shape)], shape) (the input's shape padded with ones: a 0 past the
    input's rank, which ONNX forbids, yields 1)."""
    x, shp = b.ref(n.inputs[0]), b.ref(n.inputs[1])
    length = (b.shape(n.inputs[1]) or [None])[0]
    if int(n.a("allowzero", 0)):
        return _one(b, n, "Reshape", [x, shp], T=False)
    if length is None:
        raise Fallback("Reshape to a shape of unknown length")
    sx = b.emit(f"{n.name}/input_shape", "Shape", [x], {"out_type": "int64"})
    padded = b.emit(f"{n.name}/padded_shape", "ConcatV2", [sx, b.ints([1] * length, f"{n.name}/ones"),
                                                          b.const(np.int32(0), f"{n.name}/axis0")])
    head = b.emit(f"{n.name}/head", "StridedSlice", [padded, b.ints([0], f"{n.name}/begin"),
                                                     b.ints([length], f"{n.name}/end"), b.ints([1], f"{n.name}/step")])
    zero = b.emit(f"{n.name}/is_zero", "Equal", [shp, b.ints([0], f"{n.name}/zero")])
    shape = b.emit(f"{n.name}/shape", "SelectV2", [zero, head, shp])
    return _one(b, n, "Reshape", [x, shape], T=False)


@converter("Flatten")
def _flatten(b, n):
    axis = int(n.a("axis", 1))
    shape = [1, -1]
    if axis != 0:
        s = b.shape(n.inputs[0])
        if s is None:
            raise Fallback("Flatten of unknown rank")
        axis = axis + len(s) if axis < 0 else axis
        lead, tail = s[:axis], s[axis:]
        if None not in lead:
            shape = [int(np.prod(lead)), -1]
        elif None not in tail and tail:
            shape = [-1, int(np.prod(tail))]      # a dynamic batch: the trailing dims are static
        else:
            raise Fallback("Flatten with unknown dims on both sides of its axis")
    return _one(b, n, "Reshape", [b.ref(n.inputs[0]), b.ints(shape, f"{n.name}/shape")], T=False)


@converter("Transpose")
def _transpose(b, n):
    perm = n.a("perm")
    if perm is None:
        perm = list(range(b.rank(n.inputs[0])))[::-1]
    return _one(b, n, "Transpose", [b.ref(n.inputs[0]), b.ints(perm, f"{n.name}/perm")], T=False)


@converter("Concat")
def _concat(b, n):
    refs = [b.ref(i) for i in n.inputs if i]
    r = b.rank(n.inputs[0])
    axis = int(n.a("axis")) % r
    return _one(b, n, "ConcatV2", refs + [b.const(np.int32(axis), f"{n.name}/axis")], T=False)


@converter("Split")
def _split(b, n):
    r = b.rank(n.inputs[0])
    axis = int(n.a("axis", 0)) % r
    count = len(n.outputs)
    sizes = n.a("split") if n.opset < 13 else (
        None if not n.inp(1) else [int(v) for v in np.asarray(b.need(n.inp(1), "Split's sizes")).reshape(-1)])
    if sizes is None:
        dim = b.static_shape(n.inputs[0])[axis]
        if n.opset >= 18 and n.a("num_outputs") is not None:
            count = int(n.a("num_outputs"))
        per = -(-dim // count)      # the last chunk is smaller when the dim does not divide
        sizes = [per] * (count - 1) + [dim - per * (count - 1)]
    return _one(b, n, "SplitV", [b.ref(n.inputs[0]), b.ints(sizes, f"{n.name}/sizes"),
                                 b.const(np.int32(axis), f"{n.name}/axis")], {"num_split": len(sizes)},
                num_outputs=len(sizes), T=False)


@converter("Slice")
def _slice(b, n):
    if n.opset < 10:
        starts, ends, axes, steps = n.a("starts"), n.a("ends"), n.a("axes"), None
    else:
        starts = b.need(n.inputs[1], "Slice's starts")
        ends = b.need(n.inputs[2], "Slice's ends")
        axes = b.need(n.inp(3), "Slice's axes") if n.inp(3) else None
        steps = b.need(n.inp(4), "Slice's steps") if n.inp(4) else None
    r = b.rank(n.inputs[0])
    starts = [int(v) for v in np.asarray(starts).reshape(-1)]
    ends = [int(v) for v in np.asarray(ends).reshape(-1)]
    axes = list(range(len(starts))) if axes is None else [int(a) % r for a in np.asarray(axes).reshape(-1)]
    steps = [1] * len(starts) if steps is None else [int(v) for v in np.asarray(steps).reshape(-1)]
    begin, end, stride = [0] * r, [0] * r, [1] * r
    mask = (1 << r) - 1
    for a, s, e, st in zip(axes, starts, ends, steps):
        # numpy's slice clamps as ONNX does; an end past either side means "to the border"
        begin[a] = max(min(s, _INT_MAX), -_INT_MAX)
        end[a] = max(min(e, _INT_MAX), -_INT_MAX)
        stride[a] = st
        mask &= ~(1 << a)
    ends_mask = mask
    for a, e, st in zip(axes, ends, steps):
        if st < 0 and e <= -_INT_MAX:
            ends_mask |= 1 << a        # to the start, which no (negative) index names
    return _one(b, n, "StridedSlice", [b.ref(n.inputs[0]), b.ints(begin, f"{n.name}/begin"),
                                       b.ints(end, f"{n.name}/end"), b.ints(stride, f"{n.name}/strides")],
                {"begin_mask": mask, "end_mask": ends_mask}, T=False)


@converter("Gather")
def _gather(b, n):
    r = b.rank(n.inputs[0])
    axis = int(n.a("axis", 0)) % r
    return _one(b, n, "GatherV2", [b.ref(n.inputs[0]), b.ref(n.inputs[1]),
                                   b.const(np.int32(axis), f"{n.name}/axis")], T=False)


@converter("GatherND")
def _gather_nd(b, n):
    """GatherNd; with ``batch_dims`` B, GatherNd of the full index: each index row prefixed by its position's
    first B coordinates (a constant grid over the indices' leading dims, joined by ConcatV2), which is ONNX's
    definition of the batched gather (data[b..., indices[b..., q...]]): data movement, exact."""
    bd = int(n.a("batch_dims", 0))
    if not bd:
        return _one(b, n, "GatherNd", [b.ref(n.inputs[0]), b.ref(n.inputs[1])], T=False)
    shape = b.static_shape(n.inputs[1])
    if bd >= len(shape) or int(np.prod(shape[:-1])) * bd > 1 << 22:
        raise Fallback("GatherND batch_dims not below the indices' rank, or over 4M index entries")
    rows = shape[:-1]
    grid = np.indices(rows, dtype=np.int64)[:bd]                # (bd, *rows): the batch coordinates
    grid = np.moveaxis(grid, 0, -1)                             # (*rows, bd)
    idx = b.ref(n.inputs[1])
    if b.dtype(n.inputs[1]) != "int64":
        idx = b.emit(f"{n.name}/indices_int64", "Cast", [idx], {"SrcT": b.dtype(n.inputs[1]) or "int32",
                                                                 "DstT": "int64"})
    full = b.emit(f"{n.name}/index", "ConcatV2", [b.const(np.ascontiguousarray(grid), f"{n.name}/batch_grid"), idx,
                                                   b.const(np.int32(-1), f"{n.name}/last")])
    return _one(b, n, "GatherNd", [b.ref(n.inputs[0]), full], T=False)


@converter("GatherElements")
def _gather_elements(b, n):
    """out[i0..] = data[i0.., indices[i0..] at axis, ..]: GatherNd on the full index (the position's own
    coordinates, a constant grid, with the indices at ``axis``) assembled by ConcatV2: data movement, exact."""
    shape = b.static_shape(n.inputs[1])
    r = len(shape)
    if r == 0 or r != b.rank(n.inputs[0]) or int(np.prod(shape)) * r > 1 << 22:
        raise Fallback("GatherElements of rank 0, ranks that differ, or over 4M index entries")
    axis = int(n.a("axis", 0)) % r
    grid = np.indices(shape, dtype=np.int64)
    idx = b.ref(n.inputs[1])
    if b.dtype(n.inputs[1]) != "int64":
        idx = b.emit(f"{n.name}/indices_int64", "Cast", [idx], {"SrcT": b.dtype(n.inputs[1]) or "int32",
                                                                 "DstT": "int64"})
    idx = b.emit(f"{n.name}/indices_last", "ExpandDims", [idx, b.const(np.int32(-1), f"{n.name}/last")])
    parts = [idx if k == axis else b.const(grid[k][..., None], f"{n.name}/grid_{k}") for k in range(r)]
    full = b.emit(f"{n.name}/index", "ConcatV2", [*parts, b.const(np.int32(-1), f"{n.name}/last")])
    return _one(b, n, "GatherNd", [b.ref(n.inputs[0]), full], T=False)


@converter("Unsqueeze")
def _unsqueeze(b, n):
    axes = _axes(b, n, 13, 1)
    if axes is None:
        raise Fallback("Unsqueeze without axes")
    out_rank = b.rank(n.inputs[0]) + len(axes)
    axes = sorted(a % out_rank for a in axes)
    x = b.ref(n.inputs[0])
    for k, a in enumerate(axes[:-1]):
        x = b.emit(f"{n.name}/ExpandDims_{k}", "ExpandDims", [x, b.const(np.int32(a), f"{n.name}/dim_{k}")])
    return _one(b, n, "ExpandDims", [x, b.const(np.int32(axes[-1]), f"{n.name}/dim")], T=False)


@converter("Squeeze")
def _squeeze(b, n):
    axes = _axes(b, n, 13, 1)
    attrs = {}
    if axes:
        r = b.rank(n.inputs[0])
        attrs["squeeze_dims"] = sorted(a % r for a in axes)
    return _one(b, n, "Squeeze", [b.ref(n.inputs[0])], attrs, T=False)


@converter("Shape")
def _shape(b, n):
    if n.a("start") not in (None, 0) or n.a("end") is not None:
        raise Fallback("Shape with start/end")
    return _one(b, n, "Shape", [b.ref(n.inputs[0])], {"out_type": "int64"}, T=False)


@converter("ConstantOfShape")
def _constant_of_shape(b, n):
    # its shape known at load: a Fill of constants, which the graph engine folds on the host
    shape = [int(d) for d in np.asarray(b.need(n.inputs[0], "ConstantOfShape's shape")).reshape(-1)]
    v = n.a("value")
    from onnx import numpy_helper

    value = np.zeros(1, np.float32) if v is None else numpy_helper.to_array(v)
    return _one(b, n, "Fill", [b.ints(shape, f"{n.name}/dims"), b.const(value.reshape(()), f"{n.name}/value")],
                T=False)


@converter("Expand")
def _expand(b, n):
    shape = [int(d) for d in np.asarray(b.need(n.inputs[1], "Expand's shape")).reshape(-1)]
    src = b.static_shape(n.inputs[0])
    out = list(np.broadcast_shapes(tuple(src), tuple(shape)))
    return _one(b, n, "BroadcastTo", [b.ref(n.inputs[0]), b.ints(out, f"{n.name}/shape")], T=False)


@converter("Pad")
def _pad(b, n):
    mode = n.a("mode", "constant")
    r = b.rank(n.inputs[0])
    pads = n.a("pads") if n.opset < 11 else [int(v) for v in np.asarray(b.need(n.inputs[1], "Pad's pads")).reshape(-1)]
    axes = _axes(b, n, 18, 3) if n.opset >= 18 else None
    axes = list(range(r)) if axes is None else [a % r for a in axes]
    k = len(axes)
    paddings = [[0, 0] for _ in range(r)]
    for i, a in enumerate(axes):
        paddings[a] = [int(pads[i]), int(pads[i + k])]
    if any(p < 0 for pp in paddings for p in pp):
        raise Fallback("negative pads")
    x = b.ref(n.inputs[0])
    pref = b.const(np.asarray(paddings, np.int64), f"{n.name}/paddings")
    if mode == "reflect":
        return _one(b, n, "MirrorPad", [x, pref], {"mode": "REFLECT"})
    if mode != "constant":
        raise Fallback(f"Pad mode {mode}")
    if n.opset < 11:
        value = float(n.a("value", 0.0))
    else:
        value = 0 if not n.inp(2) else np.asarray(b.need(n.inp(2), "Pad's value")).reshape(())
    return _one(b, n, "PadV2", [x, pref, b.const(value, f"{n.name}/value", b.dtype(n.inputs[0]))])


@converter("Resize", "Upsample")
def _resize(b, n):
    """Nearest-neighbour upsampling of the last two dims by whole factors, which every coordinate mode and
    nearest rounding of ONNX maps to ``out[i] = in[i // s]``: Reshape, BroadcastTo, Reshape (exact data
    movement); other factors :func:`_resize_nearest`, linear :func:`_resize_linear`; other modes on the AI CPU."""
    if n.a("mode", "nearest") == "linear":
        return _resize_linear(b, n)
    if n.a("mode", "nearest") != "nearest":
        raise Fallback(f"Resize mode {n.a('mode')}")
    if n.a("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        raise Fallback("Resize tf_crop_and_resize")
    src = b.static_shape(n.inputs[0])
    if n.op == "Upsample" or n.opset < 11:
        scales = n.a("scales") if n.opset < 9 else b.need(n.inputs[1], "the scales")
        sizes = None
    else:
        scales = b.value(n.inp(2)) if n.inp(2) else None
        sizes = b.value(n.inp(3)) if n.inp(3) else None
        if (scales is None or np.size(scales) == 0) and sizes is None:
            raise Fallback("Resize scales/sizes not known when the model loads")
    if sizes is not None and np.size(sizes):
        out = [int(v) for v in np.asarray(sizes).reshape(-1)]
        factors = [o // s if s and o % s == 0 else None for o, s in zip(out, src)]
    else:
        sc = [float(v) for v in np.asarray(scales).reshape(-1)]
        factors = [int(f) if f == int(f) and f >= 1 else None for f in sc]
    if len(factors) != len(src) or None in factors or any(f != 1 for f in factors[:-2]) or n.a("axes"):
        return _resize_nearest(b, n, src)
    *lead, H, W = src
    fh, fw = factors[-2:]
    x = b.emit(f"{n.name}/split", "Reshape", [b.ref(n.inputs[0]), b.ints([*lead, H, 1, W, 1], f"{n.name}/shape6")])
    x = b.emit(f"{n.name}/repeat", "BroadcastTo", [x, b.ints([*lead, H, fh, W, fw], f"{n.name}/shape_rep")])
    return _one(b, n, "Reshape", [x, b.ints([*lead, H * fh, W * fw], f"{n.name}/shape_out")], T=False)


#: ONNX coordinate_transformation_mode -> ResizeBilinear's (align_corners, half_pixel_centers)
_LINEAR_COORDS = {"half_pixel": (False, True), "align_corners": (True, False), "asymmetric": (False, False),
                  # older torch exports: half_pixel's coordinates wherever the output length is over 1
                  "pytorch_half_pixel": (False, True)}


def _resize_linear(b, n):
    """Bilinear Resize of an NCHW tensor's last two dims: TensorFlow's ResizeBilinear (CANN ResizeBilinearV2 on
    the AI Core) between NHWC transposes, where the two agree: its source coordinate uses in / out, so the
    output size must be exactly input x scale (or given as sizes); half_pixel, align_corners and asymmetric
    coordinates; no antialias, no axes. Others run on the AI CPU."""
    coords = _LINEAR_COORDS.get(n.a("coordinate_transformation_mode", "half_pixel"))
    if coords is None or n.opset < 11 or int(n.a("antialias", 0)) or n.a("axes") is not None:
        raise Fallback("linear Resize: a coordinate mode, antialias or axes ResizeBilinear does not take")
    src = b.static_shape(n.inputs[0])
    if len(src) != 4:
        raise Fallback("linear Resize of a tensor not 4-D")
    out = _resize_sizes(b, n, src)
    if n.a("coordinate_transformation_mode") == "pytorch_half_pixel" and min(out[2:]) == 1:
        raise Fallback("linear Resize with pytorch_half_pixel to a length of 1 (source coordinate 0)")
    align, half = coords
    x = b.emit(f"{n.name}/to_nhwc", "Transpose", [b.ref(n.inputs[0]), b.ints(TO_NHWC[4], f"{n.name}/perm_nhwc")])
    t = b.dtype(n.inputs[0]) or "float32"
    y = b.emit(f"{n.name}/ResizeBilinear", "ResizeBilinear",
               [x, b.const(np.asarray(out[2:], np.int32), f"{n.name}/size")],
               {"align_corners": align, "half_pixel_centers": half, "T": t})
    return _one(b, n, "Transpose", [y, b.ints(TO_NCHW[4], f"{n.name}/perm_nchw")], T=False)


#: ONNX (coordinate_transformation_mode, nearest_mode) -> ResizeNearestNeighbor's (align_corners,
#: half_pixel_centers), where ONNX's source index equals TF's: asymmetric + floor is floor(i / scale) (TF's
#: legacy floor(i in/out); torch's nearest export); tf_half_pixel_for_nn + floor, and half_pixel (or
#: pytorch_half_pixel) + round_prefer_ceil, are floor((i + 0.5) / scale) (TF's half_pixel_centers); align_corners
#: + round_prefer_ceil is round-half-up of i (in - 1) / (out - 1) (TF's align_corners: roundf)
_NEAREST_COORDS = {("asymmetric", "floor"): (False, False), ("tf_half_pixel_for_nn", "floor"): (False, True),
                   ("half_pixel", "round_prefer_ceil"): (False, True),
                   ("pytorch_half_pixel", "round_prefer_ceil"): (False, True),
                   ("align_corners", "round_prefer_ceil"): (True, False)}


def _resize_sizes(b, n, src):
    """The output size of a Resize (opset 11 on) when it is known at load and its scale is output / input (the
    scale ResizeBilinear and ResizeNearestNeighbor use), else Fallback."""
    scales = b.value(n.inp(2)) if n.inp(2) else None
    sizes = b.value(n.inp(3)) if n.inp(3) else None
    if sizes is not None and np.size(sizes):
        out = [int(v) for v in np.asarray(sizes).reshape(-1)]
    elif scales is not None and np.size(scales):
        sc = [float(v) for v in np.asarray(scales).reshape(-1)]
        out = [int(np.floor(s * f)) for s, f in zip(src, sc)]
        if len(sc) != len(src) or any(o != s * f for o, s, f in zip(out, src, sc)):
            raise Fallback(f"{n.a('mode', 'nearest')} Resize whose scale is not output / input")
    else:
        raise Fallback("Resize scales/sizes not known when the model loads")
    if len(out) != 4 or out[:2] != src[:2] or min(out) < 1:
        raise Fallback("Resize of the batch or channel dims, or of a tensor not 4-D")
    return out


def _resize_nearest(b, n, src):
    """Nearest Resize by other factors: TensorFlow's ResizeNearestNeighbor (CANN ResizeNearestNeighborV2 on the AI
    Core, whose align_corners / half_pixel_centers are TF's) between NHWC transposes, for the coordinate and
    rounding modes whose source index is TF's (``_NEAREST_COORDS``); exact (a copy). Others on the AI CPU."""
    key = (n.a("coordinate_transformation_mode", "half_pixel"), n.a("nearest_mode", "round_prefer_floor"))
    coords = _NEAREST_COORDS.get(key)
    if coords is None or n.op == "Upsample" or n.opset < 11 or n.a("axes") is not None:
        raise Fallback(f"nearest Resize with {key[0]} coordinates and {key[1]} rounding (not ResizeNearestNeighbor's)")
    if len(src) != 4:
        raise Fallback("nearest Resize of a tensor not 4-D by factors that are not whole numbers")
    out = _resize_sizes(b, n, src)
    align, half = coords
    x = b.emit(f"{n.name}/to_nhwc", "Transpose", [b.ref(n.inputs[0]), b.ints(TO_NHWC[4], f"{n.name}/perm_nhwc")])
    y = b.emit(f"{n.name}/ResizeNearestNeighbor", "ResizeNearestNeighbor",
               [x, b.const(np.asarray(out[2:], np.int32), f"{n.name}/size")],
               {"align_corners": align, "half_pixel_centers": half})
    return _one(b, n, "Transpose", [y, b.ints(TO_NCHW[4], f"{n.name}/perm_nchw")], T=False)
