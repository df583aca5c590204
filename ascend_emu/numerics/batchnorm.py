"""Batch norm's training passes in one Numba pass each (``kernels/batchnorm.py``): the per-channel float32 sums
of BNTrainingReduce / BNTrainingUpdateGrad and the per-element chains of BNTrainingUpdate / BNTrainingReduceGrad,
on (N, H, W, C) arrays of any strides. The ops (``FusedBatchNormV3``, ``FusedBatchNormGradV3``) keep their numpy
formulation as the definition and for the cases these passes leave to it: a value that is Inf or NaN (its NaN
payloads follow numpy's order of operands), inputs of another rank."""
from __future__ import annotations

import numpy as np

from . import policy as config
from ..kernels import batchnorm as _kb

FORWARD, BACKWARD, SUM = _kb.FORWARD, _kb.BACKWARD, _kb.SUM
_NO_ORDER = np.zeros((0, 0), dtype=np.int64)


def snapshot(multicore):
    """A function that puts ``multicore``'s order generator back as it is now (None: nothing to restore), so
    that a pass which gives up leaves the numpy path the same draws."""
    if multicore is None:
        return lambda: None
    state = multicore.rng.bit_generator.state
    return lambda: setattr(multicore.rng.bit_generator, "state", state)


def sums(mode: int, x: np.ndarray, g, mu, rstd, *, overflow_mode: str, subnormals: str, multicore):
    """The two per-channel float32 sums of ``mode`` (``kernels/batchnorm.py`` ``bn_sums_f32``) of float32
    (N, H, W, C) ``x`` (and ``g``), split over the vector cores as ``numerics.reduction.reduce`` splits a Sum under
    ``multicore`` (one arrival order drawn per sum, in the order of the sums; SUM: one sum, one draw); None if a
    sum is not finite."""
    n, c = x.shape[0] * x.shape[1] * x.shape[2], x.shape[3]
    bounds = multicore.reduce_bounds(c, n) if multicore is not None else None
    if bounds is None:
        bounds, p1, p2 = np.asarray([0, n], dtype=np.int64), _NO_ORDER, _NO_ORDER
    else:
        p1 = multicore.row_orders(c, len(bounds) - 1)
        p2 = multicore.row_orders(c, len(bounds) - 1) if mode != SUM else p1
    out1, out2 = np.empty(c, np.float32), np.empty(c, np.float32)
    f32 = np.float32
    # channels adjacent in memory (NHWC): several channels' running sums side by side; else channel by channel
    rows = x.strides[3] == 4 and (g is None or g.strides[3] == 4)
    kernel = _kb.bn_sums_f32_rows if rows else _kb.bn_sums_f32
    ok = kernel(mode, x, x if g is None else g, np.asarray(mu, f32), np.asarray(rstd, f32), bounds,
                p1.reshape(c, -1) if p1.size else np.zeros((c, 0), np.int64),
                p2.reshape(c, -1) if p2.size else np.zeros((c, 0), np.int64), subnormals == "flush",
                config.overflow_code(overflow_mode), config.subnormal_code(subnormals), out1, out2)
    return (out1, out2) if ok else None


def apply(mode: int, x: np.ndarray, g, a, b, s, *, subnormals: str, flush_out: bool):
    """The per-element chain of ``mode`` (``bn_apply_f32``) as a float32 array in ``x``'s memory order; None if a
    result is not finite."""
    f32 = np.float32
    out = np.empty_like(x, dtype=f32)
    # channels adjacent in memory (NHWC): a row of channels at a time; else the channel-outer loop
    rows = x.strides[3] == 4 and out.strides[3] == 4 and (g is None or g.strides[3] == 4)
    kernel = _kb.bn_apply_f32_rows if rows else _kb.bn_apply_f32
    ok = kernel(mode, x, x if g is None else g, np.asarray(a, f32), np.asarray(b, f32),
                np.asarray(s, f32), subnormals == "flush", bool(flush_out), out)
    return out if ok else None


def as_f32(x) -> np.ndarray:
    """``x`` as float32 without a copy when it is float32 (any strides); 16-bit floats widened exactly by the cast
    kernel (as ``ops._util.widen`` widens them) in the memory order of ``x``, so that an NCHW tensor's NHWC view
    comes back as one without two transposing copies (also MaxPoolGrad's reader)."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return x
    if x.dtype.itemsize == 2 and x.dtype.kind in "fV":
        from .vector import cast

        order = sorted(range(x.ndim), key=lambda d: -x.strides[d])
        inverse = sorted(range(x.ndim), key=lambda d: order[d])
        return np.transpose(cast(np.transpose(x, order), "float32")[0], inverse)
    return np.asarray(x, np.float32)
