"""Helpers shared by op implementations: dtype tests, the final rounding of ops that
compute internally at higher precision, and the float32 chains of the vector unit."""
from __future__ import annotations

import numpy as np

from ..numerics.policy import OVERFLOW_MODES, STATUS_CONVERSION_OVERFLOW, STATUS_FP_OVERFLOW, bfloat16

FLOAT_DTYPES = (np.dtype(np.float16), bfloat16, np.dtype(np.float32), np.dtype(np.float64))
_FLOAT_SET = frozenset(np.dtype(d) for d in FLOAT_DTYPES)   # a hash lookup, not four dtype comparisons


def is_float(x) -> bool:
    if type(x) is np.ndarray:   # (no np.asarray call: called for every input of every op of a replay)
        return x.dtype in _FLOAT_SET
    return np.asarray(x).dtype in _FLOAT_SET


def contiguous(a) -> np.ndarray:
    """``a`` as a C-contiguous array of the same shape.

    ``np.ascontiguousarray`` returns at least 1-d, so a 0-d result (a StridedSlice that
    shrinks every axis, an Unpack of a vector) would come out with shape (1,).
    """
    return np.asarray(a, order="C")


def as_int_list(x) -> list[int]:
    a = np.asarray(x)
    if a.dtype.kind in "iu":    # (an integer array's own list of Python ints: ~1 us less than int() of each)
        return a.reshape(-1).tolist()
    return [int(v) for v in a.reshape(-1)]


def finish(ctx, y) -> np.ndarray:
    """Round an op's internal (float32/float64) result once to the compute dtype.

    Used by ops modelled as "computed at higher precision inside the Unified Buffer,
    rounded once on the way out" (NUMERICS.md section 2). A result that is not
    finite, or that overflows the compute dtype, raises status 0x20 (a compute
    overflow of this op, not a separate conversion), then ``overflow_mode`` applies.
    """
    from ..numerics.vector import cast, flush_f32_subnormals

    y = np.asarray(y)
    if ctx.dtype == np.float32:
        with np.errstate(over="ignore", invalid="ignore"):
            out = step32(ctx, y.astype(np.float32))   # a float32 result is one more step's rounding and status
        if ctx.subnormals == "flush":  # as every other float32 result under flush: subnormals -> signed zero
            flush_f32_subnormals(out)
        return out
    if y.dtype not in (np.float32, np.float64):
        y = y.astype(np.float64)
    out, st = cast(y, ctx.dtype_name, overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals)
    if st:
        ctx.record(STATUS_FP_OVERFLOW | (st & ~STATUS_CONVERSION_OVERFLOW))
    return out


def to64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)




#: the 16-bit float dtypes
HALF = (np.dtype(np.float16), np.dtype(bfloat16))


def to_f32(x, copy: bool = False) -> np.ndarray:
    """``x`` as float32, exactly for fp16/bf16 (the kernels' CAST_NONE): 16-bit floats through the cast
    kernel, which gives numpy's bits (NaN payloads included) without numpy's software fp16 conversion (always
    a new array); other dtypes by numpy (a float32 array itself unless ``copy``)."""
    from ..numerics.vector import cast

    x = np.asarray(x)
    if x.dtype in HALF:
        y = cast(x, "float32")[0]
        return y if y.flags.writeable else np.array(y)   # the cast of a broadcast view is one: copied out
    return np.array(x, dtype=np.float32) if copy else np.asarray(x, dtype=np.float32)


def widen(ctx, x) -> np.ndarray:
    """``x`` as the float32 the vector unit computes on (a new array): fp16/bf16 widen exactly; under
    ``subnormals="flush"`` subnormal inputs read as signed zeros."""
    from ..numerics.vector import flush_f32_subnormals

    w = to_f32(x, copy=True)
    if ctx.subnormals == "flush":
        flush_f32_subnormals(w)
    return w


def f32_chain(ctx, fn, *xs):
    """``fn`` on the float32 widening of ``xs`` (numpy float32: every step one IEEE float32
    operation), then one rounding to the compute dtype (status and overflow mode by ``finish``)."""
    with np.errstate(all="ignore"):
        y = fn(*[widen(ctx, x) if is_float(x) else x for x in xs])
    return finish(ctx, np.asarray(y, dtype=np.float32))


def step32(ctx, v) -> np.ndarray:
    """One float32 vector instruction's result (NUMERICS.md section 2, "Model of a step"): an Inf or NaN sets
    status 0x20 (the register sees every instruction) and under ``saturation`` becomes +-FLT_MAX or +0, which
    the kernel's next instruction reads."""
    v = np.asarray(v, dtype=np.float32)
    bad = ~np.isfinite(v)
    if bad.any():
        ctx.record(STATUS_FP_OVERFLOW)
        if ctx.overflow_mode == "saturation":
            fmax = np.finfo(np.float32).max
            v = np.where(np.isnan(v), np.float32(0), np.clip(v, -fmax, fmax)).astype(np.float32)
    return v


def f32_steps(ctx, fn, *xs):
    """A kernel's float32 steps: ``fn(step, *xs)`` on the float32 widening of ``xs``, where ``fn`` passes each
    vector instruction's result through ``step`` (:func:`step32`); then one rounding to the compute dtype."""
    with np.errstate(all="ignore"):
        y = fn(lambda v: step32(ctx, v), *[widen(ctx, x) if is_float(x) else x for x in xs])
    return finish(ctx, np.asarray(y, dtype=np.float32))


def _as32(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float32)


def f32_ring_steps(ctx, fn, *xs):
    """:func:`f32_steps` for a ``fn`` whose steps are only +, - and * of its inputs and float32 constants, on float32
    arrays in a float32 context with subnormals kept: ``fn`` once with a step that only makes each result float32
    (as step32 does), the result returned where it is finite. An Inf or NaN in any step would make the result one
    (x + y, x - y and x * y of an Inf or NaN x are Inf or NaN for every float32 y, 0 included), so a finite result
    means every step was finite: step32 changed nothing and recorded nothing in either overflow mode, and finish's
    float32 rounding of a float32 value is itself. That needs a non-empty result: a step on an input broadcast
    against an empty one (a 0-d y with an empty dy) has values that reach no result value, so its Inf would be
    lost (step32 records it); with a non-empty result every dimension is at least 1, broadcasting only repeats
    values, and each step value reaches at least one result value. Otherwise, or for other inputs, :func:`f32_steps`
    from the start.
    (BN's RsqrtGrad on 16-32 floats: two widening copies, five step32 and finish cost ~25 us for ~2 us of numpy.)"""
    if ctx.dtype == np.float32 and ctx.subnormals == "keep" and all(
            type(x) is np.ndarray and x.dtype == np.float32 for x in xs):
        with np.errstate(all="ignore"):
            y = _as32(fn(_as32, *xs))
        if y.size and np.isfinite(y).all():
            return y
    return f32_steps(ctx, fn, *xs)


def sum_f32(ctx, x, axes) -> np.ndarray:
    """Sequential float32 sum of float32 ``x`` over ``axes`` (the vector unit's ReduceSum in
    float32, NUMERICS.md section 2), split over cores under ``ctx.multicore`` (section 11); its
    status goes into ``ctx``."""
    from ..numerics.reduction import reduce

    y, st = reduce("sum", x, axis=axes, dtype="float32", accumulate="float32", overflow_mode=ctx.overflow_mode,
                   subnormals=ctx.subnormals, multicore=ctx.multicore)
    ctx.record(st)
    return y


assert set(OVERFLOW_MODES) == {"inf_nan", "saturation"}
