"""An fp16 elementwise op read only by a float32 reduction over the leading axes, in one pass.

Batch norm under a mixed-precision policy makes two full-size fp16 tensors per layer that only a float32 reduction
over N, H, W reads (and ``Shape`` nodes, which need no values): the variance's ``SquaredDifference(x, mean)`` ->
``Mean`` and the scale gradient's ``Mul(x, dy)`` -> ``Sum``. :func:`eltwise_reduce_f16` computes the reduction's
result as the two ops give it, one by one, without the fp16 tensor (``kernels/eltwise_reduce16.py``): each element as
the 16-bit op computes it (operands widened exactly, one float32 operation, nearest-even fp16; SquaredDifference:
``d = rn16(x - m16)``, ``rn16(d * d)``), then the reduce op's float32 column steps in its order (``reduction.reduce``'s
``_reduce_block16``: each column from its first row, one float32 step per further row; the mean's ``1/n`` per
element first (TBE), after (Ascend C) or the exact ``/ n``), or None wherever that might not hold.
"""
from __future__ import annotations

import math

import numpy as np

from ..kernels import alloc as _alloc
from ..kernels import cast as _kc
from ..kernels import eltwise_reduce16 as _ker
from ..kernels import reduce as _kr
from .reduction import _mean_code

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_MODES = {"squared_difference": _ker.SQDIFF, "mul": _ker.MUL}


def _full16(v, shape=None) -> bool:
    return (type(v) is np.ndarray and v.dtype == _F16 and v.ndim >= 1 and 0 not in v.strides
            and (shape is None or v.shape == shape))


def eltwise_reduce_f16(elt: str, red: str, a, b, axis, keepdims: bool = False, op_model="tbe_v220", multicore=None):
    """``reduce(red, elt(a, b), axis, dtype="float32")`` with ``elt(a, b)`` the fp16 vector op (``"squared_difference"``
    or ``"mul"``; a float32 operand cast to fp16 first, nearest-even, as the device inserts the cast) and ``red``
    ``"sum"`` or ``"mean"`` (``op_model``'s mean) over the leading axes ``axis`` of the fp16 result, in float32,
    subnormals kept: the float32 result with the two ops' bits and no status, or None wherever that might not hold
    (a host without hardware fp16 conversions, another form or dtype, a reduction over other axes or of one kept
    value, a multi-core split, an Inf or NaN anywhere: the caller runs the two ops).

    ``squared_difference``: one operand a full-size fp16 array, the other constant over the reduced axes (fp16 or
    float32, its values along the kept axes or one value); ``mul``: two full-size fp16 arrays of one shape."""
    mode = _MODES.get(elt)
    if mode is None or red not in ("sum", "mean") or not _kc.HW_HALF:
        return None
    if mode == _ker.SQDIFF and not _full16(a) and _full16(b):
        a, b = b, a                 # (x - m)^2 and (m - x)^2: the same bits (rn16 is odd, the square even)
    if not _full16(a) or (mode == _ker.MUL and not _full16(b, a.shape)):
        return None
    shape = a.shape
    try:
        axes = sorted({int(d) % a.ndim for d in np.asarray(axis).reshape(-1)})
    except (TypeError, ValueError):
        return None
    k = len(axes)
    if not axes or axes != list(range(k)) or k == a.ndim:
        return None
    n = int(math.prod(shape[:k]))
    cols = int(math.prod(shape[k:]))
    if n == 0 or cols < 2 or (multicore is not None and multicore.reduce_bounds(cols, n) is not None):
        return None
    if mode == _ker.SQDIFF:
        if type(b) is not np.ndarray:
            if not isinstance(b, np.generic):
                return None
            b = np.asarray(b)
        if (b.dtype != _F16 and b.dtype != _F32) or b.ndim > a.ndim:
            return None
        bs = (1,) * (a.ndim - b.ndim) + b.shape
        if any(bs[d] != 1 for d in range(k)) or any(bs[d] not in (1, shape[d]) for d in range(k, a.ndim)):
            return None
        with np.errstate(all="ignore"):
            row = np.broadcast_to(b.reshape(bs), shape)[(0,) * k].astype(_F16).astype(_F32).reshape(-1)
        if not np.isfinite(row).all():
            return None
        bb = _alloc.readonly(np.ascontiguousarray(a).reshape(-1).view(np.uint16))
    else:
        row = np.zeros(cols, _F32)          # (read, unused)
        bb = _alloc.readonly(np.ascontiguousarray(b).reshape(-1).view(np.uint16))
    code = _mean_code(op_model) if red == "mean" else _kr.SUM
    out = _alloc.empty(cols, _F32)
    st = _ker.eltwise_reduce_lead16(mode, code, _alloc.readonly(np.ascontiguousarray(a).reshape(-1).view(np.uint16)),
                                    bb, _alloc.readonly(np.ascontiguousarray(row)), 1, n, cols, out)
    if st:
        return None
    return out.reshape((1,) * k + shape[k:] if keepdims else shape[k:])
