"""CANN's composite kernels, instruction by instruction (NUMERICS.md section 2, "Sourced kernels").

Softmax, LayerNorm and inference BatchNorm as CANN's published kernels compute them: the
input widened exactly to float32, every vector instruction one float32 step (rounded, and
saturated under saturation, by the vector unit's own float32 ops), reductions in a float32
accumulator in the order of :func:`ascend_emu.numerics.vector.reduce`, and one cast back to
the compute dtype at the end. ``ctx.op_model`` picks the kernel family: ``tbe_v100`` /
``tbe_v220`` (the TBE kernels Ascend910 / Ascend910B run) or ``ascendc`` (ops-nn's Ascend C
kernels); the ops call these only when it is not ``exact``.
"""
from __future__ import annotations

import numpy as np

from ..numerics.vector import cast, reduce
from ._util import HALF, finish, to_f32
from .math_ops import vec
from .registry import OpContext


def _f32ctx(ctx: OpContext) -> OpContext:
    """A float32 context with ``ctx``'s policy and its own status (merged back by the caller)."""
    return OpContext(dtype="float32", cube_out="float32", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals,
                     cube_model=ctx.cube_model, impl_mode=ctx.impl_mode, reduce_accumulate=ctx.reduce_accumulate,
                     op_model=ctx.op_model)


def _max(x, w, axis) -> np.ndarray:
    """``np.max(x, axis, keepdims=True)`` of a 16-bit ``x`` from its float32 widening ``w``: the maximum is
    one of the values, so narrowing it back is exact, and float32's vector max is fast where numpy's fp16 max
    is software. Only rows holding a NaN (whose payload numpy's own max picks) take numpy's way; which zero
    a row of zeros returns can differ, and every caller only subtracts the maximum before an exp."""
    m = np.max(w, axis=axis, keepdims=True)
    if np.isnan(m).any():
        return np.max(x, axis=axis, keepdims=True)
    return m.astype(x.dtype)


def _sum(c32: OpContext, x, axes) -> np.ndarray:
    y, st = reduce("sum", x, axis=axes, keepdims=True, dtype="float32", overflow_mode=c32.overflow_mode,
                   subnormals=c32.subnormals)
    c32.record(st)
    return y


def softmax(ctx: OpContext, x, axis=-1) -> np.ndarray:
    """exp(x - max) / sum(exp(x - max)) over ``axis``.

    TBE softmax_v2 subtracts the maximum in the input dtype and casts the difference to
    float32; the Ascend C kernel widens first and subtracts in float32. Then vexp, a float32
    ReduceSum and vdiv in float32, and the cast back with CAST_RINT.
    """
    c32 = _f32ctx(ctx)
    x = np.asarray(x)
    w = to_f32(x)
    with np.errstate(invalid="ignore"):
        # exact in any dtype; NaN propagates
        m = _max(x, w, axis) if x.dtype in HALF else np.max(x, axis=axis, keepdims=True)
    if ctx.op_model == "ascendc":
        d = vec(c32, "sub", w, to_f32(m))
    else:
        d = to_f32(vec(ctx, "sub", x, m))
    e = vec(c32, "exp", d)
    y = vec(c32, "realdiv", e, _sum(c32, e, axis))
    ctx.record(c32.status)
    return finish(ctx, y)


def layer_norm(ctx: OpContext, x, gamma, beta, epsilon: float, axes) -> np.ndarray:
    """(x - mean) * rstd * gamma + beta over ``axes`` (gamma, beta may be None).

    Both families scale before they sum: mean = sum(x * cof), var = sum((x - mean)^2 * cof)
    with cof = 1/n in float32. TBE's rstd is exp(-0.5 * log(var + eps)) on a v100 SoC and
    under high_performance, else 1 / sqrt(var + eps); the Ascend C kernel (LayerNormV4) takes
    1 / sqrt(var + eps) and casts a bfloat16 result with CAST_ROUND.
    """
    c32 = _f32ctx(ctx)
    x32 = to_f32(x)
    n = int(np.prod([x32.shape[a] for a in axes], dtype=np.int64))
    cof = np.float32(np.float32(1.0) / np.float32(n)) if ctx.op_model == "ascendc" else np.float32(1.0 / n)
    mean = _sum(c32, vec(c32, "mul", x32, cof), axes)
    d = vec(c32, "sub", x32, mean)
    var = _sum(c32, vec(c32, "mul", vec(c32, "mul", d, d), cof), axes)
    ve = vec(c32, "add", var, np.float32(epsilon))
    if ctx.op_model == "tbe_v100" or (ctx.op_model == "tbe_v220" and ctx.impl_mode == "high_performance"):
        rstd = vec(c32, "exp", vec(c32, "mul", vec(c32, "log", ve), np.float32(-0.5)))
    else:
        rstd = vec(c32, "realdiv", np.float32(1.0), vec(c32, "sqrt", ve))
    y = vec(c32, "mul", d, rstd)
    if gamma is not None:
        y = vec(c32, "mul", y, to_f32(gamma))
    if beta is not None:
        y = vec(c32, "add", y, to_f32(beta))
    ctx.record(c32.status)
    if ctx.op_model == "ascendc" and ctx.dtype_name == "bfloat16":
        out, st = cast(y, "bfloat16", "round", ctx.overflow_mode, ctx.subnormals)
        ctx.record(st)
        return out
    return finish(ctx, y)


def batch_norm_inference(ctx: OpContext, x, scale, offset, mean, variance, epsilon: float) -> np.ndarray:
    """Inference batch norm over the last axis (NHWC).

    TBE bn_infer folds first: mult = scale / sqrt(var + eps), add = offset - mult * mean,
    y = mult * x + add. The Ascend C kernel normalises: y = ((x - mean) * scale) * rstd + offset,
    its rstd (a Newton-Raphson refinement of Div and Sqrt) modelled as the correctly rounded
    float32 1 / sqrt(var + eps).
    """
    c32 = _f32ctx(ctx)
    x32 = to_f32(x)
    s, o, m = to_f32(scale), to_f32(offset), to_f32(mean)
    ve = vec(c32, "add", to_f32(variance), np.float32(epsilon))
    if ctx.op_model == "ascendc":
        with np.errstate(divide="ignore", invalid="ignore"):
            rstd = (1.0 / np.sqrt(ve.astype(np.float64))).astype(np.float32)
        y = vec(c32, "add", vec(c32, "mul", vec(c32, "mul", vec(c32, "sub", x32, m), s), rstd), o)
    else:
        mult = vec(c32, "realdiv", s, vec(c32, "sqrt", ve))
        add = vec(c32, "sub", o, vec(c32, "mul", mult, m))
        y = vec(c32, "add", vec(c32, "mul", mult, x32), add)
    ctx.record(c32.status)
    return finish(ctx, y)
