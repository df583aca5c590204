"""3D convolution and pooling (NDHWC) on the AI Core (issue 36): Conv3D on the cube, MaxPool3D and AvgPool3D on
the vector unit.

Conv3D is one cube contraction per output voxel over K = KD*KH*KW*Cin terms: the patches are gathered (im2col)
in the K order of the cube model's ``conv_k_order`` extended by the depth tap (NUMERICS.md section 3: ``"hwc"``:
(kd, kh, kw, cin), TensorFlow's order; ``"c1hwc0"``: (kd, cin // 16, kh, kw, cin % 16), the FRACTAL_Z_3D filter
layout's, channels zero-padded to 16) and multiplied by the filter rows in the same order on the emulated cube
(:func:`ascend_emu.numerics.cube.matmul`: fp16 operands, float32 accumulation, the model's block sums).
"""
from __future__ import annotations

import numpy as np

from ..errors import AscendEmuError
from ._util import as_int_list, contiguous, finish, to64
from .nn_ops import CONV_K_SOURCE, CONV_SOURCE, _as_f32, _cube_kw, _record
from .registry import CUBE, VECTOR, Source, register


def _dhw(v, what):
    v = as_int_list(v)
    if len(v) == 5:
        if v[0] != 1 or v[4] != 1:
            raise AscendEmuError(f"{what} {v}: batch and channel entries must be 1 (NDHWC)")
        v = v[1:4]
    if len(v) == 1:
        v = v * 3
    if len(v) != 3 or min(v) < 1:
        raise AscendEmuError(f"{what} must be three positive sizes, got {v}")
    return tuple(v)


def _ndhwc(data_format):
    if data_format not in ("NDHWC", None):
        raise AscendEmuError(f"data_format {data_format!r} is not supported; export the model with NDHWC "
                             "(channels_last)")


def _pads3(padding, size, ksize, strides, dilations, explicit_paddings=()):
    """[(before, after)] per spatial axis and the output sizes, by TF's SAME / VALID rule, or ``EXPLICIT`` with
    ``explicit_paddings`` as Conv2D's (ten sizes, NDHWC order: the batch and channel pairs 0), as aclnnConvolution
    passes a torch convolution's pads."""
    pads, out = [], []
    if padding == "EXPLICIT":
        p = as_int_list(explicit_paddings)
        if len(p) != 10 or any(v < 0 for v in p) or p[:2] != [0, 0] or p[8:] != [0, 0]:
            raise AscendEmuError(f"explicit_paddings {p}: ten sizes >= 0 (NDHWC pairs, batch and channel 0)")
    for i, (n, k, s, d) in enumerate(zip(size, ksize, strides, dilations)):
        span = (k - 1) * d + 1
        if padding == "EXPLICIT":
            before, after = p[2 + 2 * i], p[3 + 2 * i]
            o = (n + before + after - span) // s + 1
            pads.append((before, after))
        elif padding == "SAME":
            o = -(-n // s)
            tot = max((o - 1) * s + span - n, 0)
            pads.append((tot // 2, tot - tot // 2))
        elif padding == "VALID":
            o = (n - span) // s + 1
            pads.append((0, 0))
        else:
            raise AscendEmuError(f"3D padding {padding!r} is not supported (SAME, VALID or EXPLICIT)")
        if o <= 0:
            raise AscendEmuError(f"the window {tuple(ksize)} (dilations {tuple(dilations)}) does not fit the input "
                                 f"of spatial shape {tuple(size)}")
        out.append(o)
    return pads, out


def conv3d_patches(x, ksize, strides, dilations, pads, out, order: str) -> np.ndarray:
    """The (N*OD*OH*OW, K) patch matrix of NDHWC ``x`` in the K order ``order`` (padded voxels +0)."""
    n, c = x.shape[0], x.shape[-1]
    xp = np.pad(x, [(0, 0), *pads, (0, 0)])
    taps = []
    for a in range(ksize[0]):
        for b in range(ksize[1]):
            for e in range(ksize[2]):
                o = (a * dilations[0], b * dilations[1], e * dilations[2])
                taps.append(xp[:, o[0]:o[0] + (out[0] - 1) * strides[0] + 1:strides[0],
                               o[1]:o[1] + (out[1] - 1) * strides[1] + 1:strides[1],
                               o[2]:o[2] + (out[2] - 1) * strides[2] + 1:strides[2]])
    p = np.stack(taps, axis=4)                        # (N, OD, OH, OW, KD*KH*KW, C)
    m = n * out[0] * out[1] * out[2]
    if order == "c1hwc0":
        cp = -(-c // 16) * 16
        p = np.pad(p, [(0, 0)] * 5 + [(0, cp - c)])
        p = p.reshape(m, ksize[0], ksize[1] * ksize[2], cp // 16, 16).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(p.reshape(m, -1))


def conv3d_filter_rows(w, order: str) -> np.ndarray:
    """The (KD, KH, KW, Cin, Cout) filter as (K, Cout) rows in the order of :func:`conv3d_patches`."""
    kd, kh, kw, c, co = w.shape
    if order == "c1hwc0":
        cp = -(-c // 16) * 16
        w = np.pad(w, [(0, 0)] * 3 + [(0, cp - c), (0, 0)])
        w = w.reshape(kd, kh * kw, cp // 16, 16, co).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(w.reshape(-1, co))


@register("Conv3D", kind=CUBE, source=CONV_K_SOURCE)
def conv3d(x, w, *, ctx, strides=(1, 1, 1, 1, 1), padding="VALID", dilations=(1, 1, 1, 1, 1), data_format="NDHWC",
           explicit_paddings=(), bias=None):
    """``bias`` (per output channel, float32) goes into the accumulator, as Conv2D's (aclnnConvolution's Conv3DV2
    takes it as an input: NUMERICS.md section 16)."""
    from ..numerics.cube import matmul

    _ndhwc(data_format)
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 5 or w.ndim != 5 or w.shape[3] != x.shape[4]:
        raise AscendEmuError(f"Conv3D needs an NDHWC input and a (KD, KH, KW, Cin, Cout) filter with Cin equal to the "
                             f"input's channels, got {x.shape} and {w.shape}")
    st, dl = _dhw(strides, "strides"), _dhw(dilations, "dilations")
    pads, out = _pads3(padding, x.shape[1:4], w.shape[:3], st, dl, explicit_paddings)
    order = ctx.cube_model.conv_k_order
    a = conv3d_patches(x, w.shape[:3], st, dl, pads, out, order)
    y = _record(ctx, matmul(a, conv3d_filter_rows(w, order), **_cube_kw(ctx, bias)))
    return y.reshape(x.shape[0], *out, w.shape[4])


def _pool_windows(x, ksize, strides, padding, fill):
    """(N, OD, OH, OW, C, kd, kh, kw) windows of NDHWC ``x`` padded with ``fill``, and the count of real
    voxels in each window."""
    pads, out = _pads3(padding, x.shape[1:4], ksize, strides, (1, 1, 1))
    xp = np.pad(x, [(0, 0), *pads, (0, 0)], constant_values=fill)
    ones = np.pad(np.ones((1, *x.shape[1:4], 1)), [(0, 0), *pads, (0, 0)])
    sl = (slice(None), slice(None, None, strides[0]), slice(None, None, strides[1]), slice(None, None, strides[2]))
    v = np.lib.stride_tricks.sliding_window_view(xp, ksize, axis=(1, 2, 3))[sl]
    cnt = np.lib.stride_tricks.sliding_window_view(ones, ksize, axis=(1, 2, 3))[sl].sum(axis=(-1, -2, -3))
    return v[:, :out[0], :out[1], :out[2]], cnt[:, :out[0], :out[1], :out[2]]


@register("MaxPool3D", kind=VECTOR, source=Source(exact="the window's largest value: a selection"))
def max_pool3d(x, *, ctx, ksize, strides, padding, data_format="NDHWC"):
    """The window maximum (padding never selected): exact in any dtype."""
    _ndhwc(data_format)
    v, _ = _pool_windows(_as_f32(np.asarray(x)), _dhw(ksize, "ksize"), _dhw(strides, "strides"), padding, -np.inf)
    return finish(ctx, contiguous(v.max(axis=(-1, -2, -3))))


@register("AvgPool3D", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/dynamic/avg_pool3d.py (a Conv3D on the cube, mad_dtype float32)",
     "NUMERICS.md section 2 (3D pooling)"), (),
    "the mean of the window's real voxels in float64, one rounding (assumed, no parameter); the kernel's cube "
    "convolution by 1/count weights is not modelled"))
def avg_pool3d(x, *, ctx, ksize, strides, padding, data_format="NDHWC"):
    """The window mean over its real voxels (SAME padding not counted), as AvgPool: computed exactly (float64)
    and rounded once to the compute dtype."""
    _ndhwc(data_format)
    v, cnt = _pool_windows(to64(x), _dhw(ksize, "ksize"), _dhw(strides, "strides"), padding, 0.0)
    return finish(ctx, v.sum(axis=(-1, -2, -3)) / cnt)


# ------------------------------------------------------------------------------ the gradients of Conv3D

def _geometry(strides, dilations, padding, in_shape, ksize, explicit_paddings=()):
    st, dl = _dhw(strides, "strides"), _dhw(dilations, "dilations")
    pads, out = _pads3(padding, in_shape, ksize, st, dl, explicit_paddings)
    return st, dl, pads, out


@register("Conv3DBackpropInputV2", kind=CUBE, source=CONV_SOURCE)
def conv3d_backprop_input_v2(input_sizes, w, dy, *, ctx, strides, padding, dilations=(1, 1, 1, 1, 1),
                             data_format="NDHWC", explicit_paddings=()):
    """dx as Conv2DBackpropInput's model in 3D (NUMERICS.md section 8): the stride-1 VALID convolution (dilations
    kept) of dy with ``stride - 1`` zeros inserted between its voxels, padded by ``(K-1)*d - pad_before`` in front
    (negative: cropped), with the filter rotated by 180 degrees and its channels swapped; K = KD*KH*KW*Cout in
    the Conv3D order of ``conv_k_order``, the inserted zeros +0 products."""
    from ..numerics.cube import matmul

    _ndhwc(data_format)
    shape = as_int_list(input_sizes)
    w, dy = np.asarray(w), np.asarray(dy)
    st, dl, pads, out = _geometry(strides, dilations, padding, shape[1:4], w.shape[:3], explicit_paddings)
    if list(dy.shape) != [shape[0], *out, w.shape[4]]:
        raise AscendEmuError(f"Conv3DBackpropInputV2: out_backprop of shape {dy.shape} does not match the forward "
                             f"output {[shape[0], *out, w.shape[4]]}")
    z = np.zeros((dy.shape[0], *[(o - 1) * s + 1 for o, s in zip(out, st)], dy.shape[4]), dy.dtype)
    z[:, ::st[0], ::st[1], ::st[2]] = dy
    for ax in range(3):
        span = (w.shape[ax] - 1) * dl[ax]
        before = span - pads[ax][0]
        after = shape[1 + ax] + span - z.shape[1 + ax] - before
        widths = [(0, 0)] * 5
        widths[1 + ax] = (max(before, 0), max(after, 0))
        z = np.pad(z, widths)
        keep = [slice(None)] * 5
        keep[1 + ax] = slice(max(-before, 0), z.shape[1 + ax] - max(-after, 0))
        z = z[tuple(keep)]
    wr = np.ascontiguousarray(w[::-1, ::-1, ::-1].transpose(0, 1, 2, 4, 3))
    order = ctx.cube_model.conv_k_order
    a = conv3d_patches(z, wr.shape[:3], (1, 1, 1), dl, [(0, 0)] * 3, shape[1:4], order)
    y = _record(ctx, matmul(a, conv3d_filter_rows(wr, order), **_cube_kw(ctx)))
    return y.reshape(shape)


@register("Conv3DBackpropFilterV2", kind=CUBE, source=CONV_SOURCE)
def conv3d_backprop_filter_v2(x, filter_sizes, dy, *, ctx, strides, padding, dilations=(1, 1, 1, 1, 1),
                              data_format="NDHWC", explicit_paddings=()):
    """dw = im2col(x)^T @ dy as one matmul, K = N*OD*OH*OW in (n, od, oh, ow) order (Conv2DBackpropFilter's
    model, NUMERICS.md section 8)."""
    from ..numerics.cube import matmul

    _ndhwc(data_format)
    fs = as_int_list(filter_sizes)
    x, dy = np.asarray(x), np.asarray(dy)
    st, dl, pads, out = _geometry(strides, dilations, padding, x.shape[1:4], fs[:3], explicit_paddings)
    p = conv3d_patches(x, fs[:3], st, dl, pads, out, "hwc")
    y = _record(ctx, matmul(p, np.ascontiguousarray(dy.reshape(-1, fs[4])), transpose_a=True, **_cube_kw(ctx)))
    return y.reshape(fs)


# ------------------------------------------------------------------------------ the gradients of the 3D pools

def _windows_of(shape, ksize, strides, padding):
    """For every output voxel (od, oh, ow) in order, the clipped input ranges of its window."""
    pads, out = _pads3(padding, shape, ksize, strides, (1, 1, 1))
    for o in np.ndindex(*out):
        yield o, tuple(slice(max(i * s - p[0], 0), min(i * s - p[0] + k, n))
                       for i, s, p, k, n in zip(o, strides, pads, ksize, shape))


@register("MaxPool3DGrad", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/max_pool3d_grad.py (not_tiling_main: per output depth row, per tap, vcmpv_eq "
     "with the max, vand with the vnot of the earlier taps' vor, vsel of dy, float32 vadd into the map; float32 "
     "output)", "NUMERICS.md section 2 (3D pooling)"), (),
    "dy to the window's first maximum in tap order (the kernel's mask bookkeeping), float32 adds in the kernel's "
    "order (output depth row, then tap), one rounding"))
def max_pool3d_grad(orig_input, orig_output, grad, *, ctx, ksize, strides, padding, data_format="NDHWC"):
    """Each output gradient goes to the first voxel of its window (taps (kd, kh, kw) row-major, padding never)
    equal to the window's max (a NaN max matches none: the gradient is dropped); the gradients reaching a voxel are
    added in float32 in the kernel's order, by output depth row and then by winning tap; rounded once."""
    _ndhwc(data_format)
    x, y = _as_f32(np.asarray(orig_input)), _as_f32(np.asarray(orig_output))
    g = _as_f32(np.asarray(grad))
    ks, st = _dhw(ksize, "ksize"), _dhw(strides, "strides")
    pads, _ = _pads3(padding, x.shape[1:4], ks, st, (1, 1, 1))
    n_all, c_all = x.shape[0], x.shape[4]
    keys, tgt, vals = [], [], []
    with np.errstate(all="ignore"):
        for o, win in _windows_of(x.shape[1:4], ks, st, padding):
            sl = (slice(None), *win, slice(None))
            dims = tuple(w.stop - w.start for w in win)
            hit = (x[sl] == y[(slice(None), *o, slice(None))][:, None, None, None, :]).reshape(n_all, -1, c_all)
            n_i, c_i = np.nonzero(hit.any(axis=1))
            if not n_i.size:
                continue
            first = hit.argmax(axis=1)[n_i, c_i]              # the first tie, row-major in the window
            vox = [w.start + v for w, v in zip(win, np.unravel_index(first, dims))]
            rel = [v - (i * s - p[0]) for v, i, s, p in zip(vox, o, st, pads)]
            keys.append(o[0] * (ks[0] * ks[1] * ks[2]) + (rel[0] * ks[1] + rel[1]) * ks[2] + rel[2])
            tgt.append(np.stack([n_i, *vox, c_i]))
            vals.append(g[(n_i, *(np.full(n_i.size, i) for i in o), c_i)])
    acc = np.zeros(x.shape, np.float32)
    if keys:
        key = np.concatenate(keys)
        order = np.argsort(key, kind="stable")     # per (n, c): output depth row, then tap; one voxel per key
        t = np.concatenate(tgt, axis=1)[:, order]
        with np.errstate(all="ignore"):
            np.add.at(acc, tuple(t), np.concatenate(vals)[order])   # unbuffered: float32 adds in this order
    return finish(ctx, acc)


@register("AvgPool3DGrad", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/dynamic/avg_pool3d_grad.py (Conv3DBackpropInput by an fp16 mean_matrix)",
     "NUMERICS.md section 2 (3D pooling)"), (),
    "dy / count in float32 added in output order, one rounding (assumed, no parameter); the kernel's cube "
    "transposed convolution is not modelled"))
def avg_pool3d_grad(orig_input_shape, grad, *, ctx, ksize, strides, padding, data_format="NDHWC"):
    """Each output gradient divided (float32) by its window's count of real voxels and added to each of them in
    float32 in output order, rounded once (TF's CPU kernel's order)."""
    _ndhwc(data_format)
    shape = as_int_list(orig_input_shape)
    g = _as_f32(np.asarray(grad))
    acc = np.zeros(shape, np.float32)
    with np.errstate(all="ignore"):
        for o, win in _windows_of(shape[1:4], _dhw(ksize, "ksize"), _dhw(strides, "strides"), padding):
            cnt = np.float32(np.prod([s.stop - s.start for s in win]))
            acc[(slice(None), *win, slice(None))] += (g[(slice(None), *o, slice(None))] / cnt)[:, None, None, None, :]
    return finish(ctx, acc)
