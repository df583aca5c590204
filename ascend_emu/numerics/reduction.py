"""Reductions with Ascend rounding, overflow and status: the vector unit's ReduceSum/Mean/Max/Min/Prod.

Thin wrappers, as :mod:`ascend_emu.numerics.vector`'s: validate arguments, translate policy strings through
:mod:`ascend_emu.numerics.policy`, allocate outputs and call the Numba kernels in ``ascend_emu.kernels.reduce``
and ``reduce_lead``. Every function returns ``(array, status)`` (NUMERICS.md section 4).
"""
from __future__ import annotations

import math

import numpy as np

from . import policy as config
from ..errors import AscendEmuError
from ..kernels import alloc as _alloc
from ..kernels import cast as _kc
from ..kernels import multicore as _km
from ..kernels import reduce as _kr
from ..kernels import reduce_lead as _krl
from .vector import _KEEP, _choice, _to_compute

_REDUCE = {"sum": _kr.SUM, "mean": _kr.MEAN, "max": _kr.MAX, "min": _kr.MIN, "prod": _kr.PROD}
#: names of the reductions :func:`reduce` runs
REDUCE_OPS = tuple(_REDUCE)


def _axes(axis, ndim: int) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    items = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in items:
        if not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
            raise AscendEmuError(f"reduce axis {a!r} is out of range for an array of {ndim} dimension(s)")
        a = int(a) % ndim if ndim else 0
        if a in out:
            raise AscendEmuError(f"reduce axis {a} is repeated in axis={axis!r}")
        out.append(a)
    return tuple(sorted(out))


def reduce(op: str, x, axis=None, keepdims: bool = False, dtype="float16", accumulate="float32",
           overflow_mode: str = "inf_nan", subnormals: str = "keep", op_model: str = "tbe_v220", multicore=None):
    """Reduce ``x`` over ``axis`` as the vector unit's ReduceSum/Mean/Max/Min/Prod.

    Parameters
    ----------
    op : {"sum", "mean", "max", "min", "prod"}
    x : array_like
        Cast to the compute dtype first (``rint``) if it has another float dtype.
    axis : None, int or tuple of int
        Axes to reduce (None: all).
    keepdims : bool
        Keep the reduced axes with length 1.
    dtype : {"float16", "bfloat16", "float32"}
        The compute and output dtype.
    accumulate : str
        ``"float32"`` (default): each output is accumulated in float32, in row-major
        order over the reduced axes, and rounded once to ``dtype``. The compute dtype
        itself (e.g. ``"float16"``): every step is rounded to it, the precision loss
        of an fp16 ReduceSum.
    overflow_mode, subnormals
        As for :func:`vector`.
    op_model : {"tbe_v100", "tbe_v220", "ascendc", "exact"}
        How ``mean`` scales: the TBE kernels multiply every element by ``cof = 1/n``
        (a float32 constant; in the 16-bit format when it is the accumulator) and sum
        the products; the Ascend C kernel multiplies the sum by ``cof``; ``exact``
        divides the sum by n. The other reductions do not depend on it.
    multicore : :class:`ascend_emu.numerics.multicore.Launch` or None
        A non-deterministic launch (NUMERICS.md section 11): a sum or mean whose rows cannot fill
        the cores splits its reduced axis into chunks, one per core, each reduced in order in the
        accumulator; the partials are added to +0 in an order drawn per row. None (the default,
        and always for max, min, prod): every row in order, as above.

    Returns
    -------
    (numpy.ndarray, int)
        The reduction in ``dtype`` and the status bits (0x20 if a result or an
        accumulation step was Inf or NaN, ORed with the input cast's status).
    """
    if op not in _REDUCE:
        raise AscendEmuError(f"unknown reduce op {op!r}; choose one of: {', '.join(REDUCE_OPS)}")
    cdt = config.compute_dtype(dtype)
    # (numpy's dtype.name costs ~6 us a call: the float32 reductions of a training step's small tensors pay it)
    name = "float32" if cdt == config.float32 else ("bfloat16" if cdt == config.bfloat16 else cdt.name)
    try:
        acc_name = config.dtype_name(accumulate)
    except AscendEmuError:
        acc_name = None
    if acc_name not in ("float32", name):
        raise AscendEmuError(f"unsupported accumulate {accumulate!r} for dtype {name}; "
                             f"choose one of: {', '.join(dict.fromkeys(('float32', name)))}")
    oc = config.overflow_code(overflow_mode)
    sc = config.subnormal_code(subnormals)
    if (cdt == config.float32 and type(x) is np.ndarray and x.dtype == config.float32 and 0 < x.size <= SMALL
            and sc == _KEEP and op in ("sum", "mean")):
        y = _small_sum32(op, x, axis, keepdims, op_model, multicore)
        if y is not None:
            return y, 0
    if cdt == config.float32 and _kc.HW_HALF and type(x) is np.ndarray and x.dtype == config.float16:
        # fp16 data reduced in float32 over its leading axes: the kernel widens each element as it reads
        # it (exactly, as the cast would, which raises no status), so no widened copy is made
        axes = _axes(axis, x.ndim)
        rows = int(math.prod([x.shape[d] for d in range(x.ndim) if d not in axes]))
        y = _reduce_block16(op, x, axes, rows, keepdims, oc, sc, op_model, multicore)
        if y is not None:
            return y
        if (rows > 1 and axes == tuple(range(len(axes))) and x.size
                and (multicore is None or op not in ("sum", "mean")
                     or multicore.reduce_bounds(rows, x.size // rows) is None)):
            return _reduce_lead16(op, x, axes, rows, keepdims, oc, sc, op_model)
    a, status = _to_compute(x, cdt, "reduce input", overflow_mode, subnormals)
    axes = _axes(axis, a.ndim)
    kept = tuple(d for d in range(a.ndim) if d not in axes)
    rows = int(math.prod([a.shape[d] for d in kept]))
    inner = int(math.prod([a.shape[d] for d in axes]))
    if op in ("max", "min") and inner == 0:
        raise AscendEmuError(f"reduce {op!r} over an empty axis has no identity; reduce a non-empty array")
    code = _REDUCE[op]
    if op == "mean":
        code = _mean_code(op_model)
    bounds = multicore.reduce_bounds(rows, inner) if multicore is not None and op in ("sum", "mean") else None
    # reduced axes leading (a sum over N, H, W of NHWC): the row kernel's steps down a's columns, no copy
    lead = bounds is None and cdt == config.float32 and rows > 1 and axes == tuple(range(len(axes)))
    x2 = None if lead else np.ascontiguousarray(np.transpose(a, kept + axes)).reshape(rows, inner)
    if lead:
        out = _alloc.empty(rows, np.float32)
        st = _krl.reduce_lead_f32(code, np.ascontiguousarray(a).reshape(inner, rows), out, oc, sc)
    elif bounds is not None:
        perm = multicore.row_orders(rows, len(bounds) - 1)
        if cdt == config.float32:
            out = _alloc.empty(rows, np.float32)
            st = _km.reduce_split_f32(code, x2, out, bounds, perm, oc, sc)
        else:
            out = _alloc.empty(rows, np.uint16)
            st = _km.reduce_split16(code, x2.view(np.uint16), out, bounds, perm, cdt == config.bfloat16,
                                    acc_name != "float32", oc, sc)
    elif cdt == config.float32:
        out = _alloc.empty(rows, np.float32)
        st = _kr.reduce_f32(code, x2, out, oc, sc)
    else:
        out = _alloc.empty(rows, np.uint16)
        st = _kr.reduce16(code, x2.view(np.uint16), out, cdt == config.bfloat16, acc_name != "float32", oc, sc)
    if st:
        status |= config.STATUS_FP_OVERFLOW
    shape = tuple(1 if d in axes else a.shape[d] for d in range(a.ndim)) if keepdims else tuple(a.shape[d] for d in kept)
    return out.view(cdt).reshape(shape), status


#: float32 sums and means of at most this many elements take :func:`_small_sum32` (numpy's own float32 additions)
SMALL = 4096


def _small_sum32(op, x, axis, keepdims, op_model, multicore):
    """:func:`reduce`'s sum or mean of a small float32 ``x`` (subnormals kept) in numpy, or None where it might
    differ: a result that is Inf or NaN (the overflow mode and status are the kernel's), a split launch.

    The row kernel's steps are IEEE float32 operations in a fixed order, which numpy computes alike: each output's
    elements in row-major order over the reduced axes (``x`` transposed, the kept axes first), times the float32
    ``1/n`` first for TBE's mean, then ``np.add.accumulate``, a running sum from the first element, one float32
    addition per further element, in order (not numpy's pairwise ``sum``), then Ascend C's ``* 1/n`` or the exact
    ``/ n``. The loss's and the dense layers' reductions of a training step (a scalar, 32 values, a (32, 10) bias
    gradient) paid ~40 us of argument handling, a transposed copy and a kernel launch for a few additions."""
    axes = _axes(axis, x.ndim)
    kept = tuple(d for d in range(x.ndim) if d not in axes)
    rows = int(math.prod([x.shape[d] for d in kept]))
    inner = x.size // rows
    if multicore is not None and multicore.reduce_bounds(rows, inner) is not None:
        return None
    code = _mean_code(op_model) if op == "mean" else _kr.SUM
    x2 = (x if not kept or not axes else np.transpose(x, kept + axes)).reshape(rows, inner)
    with np.errstate(all="ignore"):
        if code == _kr.MEAN_SCALE_FIRST:
            x2 = np.multiply(x2, np.float32(1.0) / np.float32(inner), dtype=np.float32)
        y = np.add.accumulate(x2, axis=1, dtype=np.float32)[:, -1]
        if code == _kr.MEAN:
            y = np.divide(y, np.float32(inner), dtype=np.float32)
        elif code == _kr.MEAN_SCALE_LAST:
            y = np.multiply(y, np.float32(1.0) / np.float32(inner), dtype=np.float32)
    if not np.isfinite(y).all():
        return None
    shape = tuple(1 if d in axes else x.shape[d] for d in range(x.ndim)) if keepdims else \
        tuple(x.shape[d] for d in kept)
    return np.ascontiguousarray(y).reshape(shape)   # a fresh array, as the kernel's (not a view of the sums)


def _mean_code(op_model):
    return {"exact": _kr.MEAN, "ascendc": _kr.MEAN_SCALE_LAST}.get(
        _choice("op_model", op_model, config.OP_MODELS), _kr.MEAN_SCALE_FIRST)


def _reduce_lead16(op, x, axes, rows, keepdims, oc, sc, op_model):
    """:func:`reduce` in float32 of fp16 ``x`` over its leading ``axes`` (``rows`` outputs) by the kernel
    that widens as it reads: the bits and status of widening ``x`` first."""
    code = _mean_code(op_model) if op == "mean" else _REDUCE[op]
    out = _alloc.empty(rows, np.float32)
    st = _krl.reduce_lead_f16(code, np.ascontiguousarray(x).view(np.uint16).reshape(x.size // rows, rows), out, oc, sc)
    shape = tuple(1 if d in axes else x.shape[d] for d in range(x.ndim)) if keepdims else x.shape[len(axes):]
    return out.reshape(shape), config.STATUS_FP_OVERFLOW if st else 0


_HW_REDUCE = {"sum": _kr.SUM, "prod": _kr.PROD}


def _reduce_block16(op, x, axes, rows, keepdims, oc, sc, op_model, multicore):
    """:func:`reduce` in float32 of fp16 ``x`` over a block of consecutive ``axes`` followed by kept axes
    (the leading axes of NHWC, or H and W of a global average pool), widened by the CPU as the kernel reads
    (``kernels/reduce_lead.py``'s ``reduce_lead_f16_hw``), or None where that kernel does not stand for the
    widening cast and the row kernel: another op, flushed subnormals, an empty array, a split launch, or a NaN
    result (an element may have been a signalling NaN, which the CPU's widening quietens)."""
    code = _mean_code(op_model) if op == "mean" else _HW_REDUCE.get(op)
    if code is None or sc != _KEEP or not x.size or not axes or axes != tuple(range(axes[0], axes[-1] + 1)):
        return None
    cols = int(math.prod(x.shape[axes[-1] + 1:]))
    if cols < 2 or (multicore is not None and op in ("sum", "mean")
                    and multicore.reduce_bounds(rows, x.size // rows) is not None):
        return None   # one column: the reduced elements are contiguous, the row kernel's own case
    outer = rows // cols
    out = _alloc.empty(rows, np.float32)
    st = _krl.reduce_lead_f16_hw(code, np.ascontiguousarray(x).view(np.uint16).reshape(-1), outer,
                                 x.size // rows, cols, out, oc)
    if st < 0:
        return None
    shape = tuple(1 if d in axes else x.shape[d] for d in range(x.ndim)) if keepdims else \
        tuple(x.shape[d] for d in range(x.ndim) if d not in axes)
    return out.reshape(shape), config.STATUS_FP_OVERFLOW if st else 0
