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
from .nn_ops import _as_f32, _cube_kw, _record
from .registry import CUBE, VECTOR, register


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


def _pads3(padding, size, ksize, strides, dilations):
    """[(before, after)] per spatial axis and the output sizes, by TF's SAME / VALID rule."""
    pads, out = [], []
    for n, k, s, d in zip(size, ksize, strides, dilations):
        span = (k - 1) * d + 1
        if padding == "SAME":
            o = -(-n // s)
            tot = max((o - 1) * s + span - n, 0)
            pads.append((tot // 2, tot - tot // 2))
        elif padding == "VALID":
            o = (n - span) // s + 1
            pads.append((0, 0))
        else:
            raise AscendEmuError(f"3D padding {padding!r} is not supported (SAME or VALID)")
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


@register("Conv3D", kind=CUBE)
def conv3d(x, w, *, ctx, strides=(1, 1, 1, 1, 1), padding="VALID", dilations=(1, 1, 1, 1, 1), data_format="NDHWC"):
    from ..numerics.cube import matmul

    _ndhwc(data_format)
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 5 or w.ndim != 5 or w.shape[3] != x.shape[4]:
        raise AscendEmuError(f"Conv3D needs an NDHWC input and a (KD, KH, KW, Cin, Cout) filter with Cin equal to the "
                             f"input's channels, got {x.shape} and {w.shape}")
    st, dl = _dhw(strides, "strides"), _dhw(dilations, "dilations")
    pads, out = _pads3(padding, x.shape[1:4], w.shape[:3], st, dl)
    order = ctx.cube_model.conv_k_order
    a = conv3d_patches(x, w.shape[:3], st, dl, pads, out, order)
    y = _record(ctx, matmul(a, conv3d_filter_rows(w, order), **_cube_kw(ctx)))
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


@register("MaxPool3D", kind=VECTOR)
def max_pool3d(x, *, ctx, ksize, strides, padding, data_format="NDHWC"):
    """The window maximum (padding never selected): exact in any dtype."""
    _ndhwc(data_format)
    v, _ = _pool_windows(_as_f32(np.asarray(x)), _dhw(ksize, "ksize"), _dhw(strides, "strides"), padding, -np.inf)
    return finish(ctx, contiguous(v.max(axis=(-1, -2, -3))))


@register("AvgPool3D", kind=VECTOR)
def avg_pool3d(x, *, ctx, ksize, strides, padding, data_format="NDHWC"):
    """The window mean over its real voxels (SAME padding not counted), as AvgPool: computed exactly (float64)
    and rounded once to the compute dtype."""
    _ndhwc(data_format)
    v, cnt = _pool_windows(to64(x), _dhw(ksize, "ksize"), _dhw(strides, "strides"), padding, 0.0)
    return finish(ctx, v.sum(axis=(-1, -2, -3)) / cnt)
