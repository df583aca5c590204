"""CANN's composite kernels, instruction by instruction (NUMERICS.md section 2, "Sourced kernels").

Softmax, LayerNorm and inference BatchNorm as CANN's published kernels compute them: the
input widened exactly to float32, every vector instruction one float32 step (rounded, and
saturated under saturation, by the vector unit's own float32 ops), reductions in a float32
accumulator in the order of :func:`ascend_emu.numerics.reduction.reduce`, and one cast back to
the compute dtype at the end. ``ctx.op_model`` picks the kernel family: ``tbe_v100`` /
``tbe_v220`` (the TBE kernels Ascend910 / Ascend910B run) or ``ascendc`` (ops-nn's Ascend C
kernels); the ops call these only when it is not ``exact``.
"""
from __future__ import annotations

import numpy as np

from ..kernels import cast as _kcast
from ..kernels import composite as _kc
from ..numerics.policy import bfloat16
from ..numerics.reduction import reduce
from ..numerics.vector import cast
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


def shifted(ctx: OpContext, x: np.ndarray, axis):
    """The float32 context and ``x - max(x)`` over ``axis`` as Softmax and LogSoftmax compute it: TBE subtracts in
    the input dtype (a 16-bit difference rounded to it), then widens; Ascend C (``op_model`` ascendc) widens first
    and subtracts in float32."""
    c32 = _f32ctx(ctx)
    w = to_f32(x)
    with np.errstate(invalid="ignore"):
        # exact in any dtype; NaN propagates
        m = _max(x, w, axis) if x.dtype in HALF else np.max(x, axis=axis, keepdims=True)
    if ctx.op_model == "ascendc":
        return c32, vec(c32, "sub", w, to_f32(m))
    return c32, to_f32(vec(ctx, "sub", x, m))


def softmax(ctx: OpContext, x, axis=-1) -> np.ndarray:
    """exp(x - max) / sum(exp(x - max)) over ``axis``.

    TBE softmax_v2 subtracts the maximum in the input dtype and casts the difference to
    float32; the Ascend C kernel widens first and subtracts in float32. Then vexp, a float32
    ReduceSum and vdiv in float32, and the cast back with CAST_RINT.
    """
    x = np.asarray(x)
    y = _softmax_rows_f16(ctx, x, axis)
    if y is not None:
        return y
    y = _softmax_rows(ctx, x, axis)
    if y is not None:
        return finish(ctx, y)
    c32, d = shifted(ctx, x, axis)
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
    x = np.asarray(x)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    cof = np.float32(np.float32(1.0) / np.float32(n)) if ctx.op_model == "ascendc" else np.float32(1.0 / n)
    explog = ctx.op_model == "tbe_v100" or (ctx.op_model == "tbe_v220" and ctx.impl_mode == "high_performance")
    y = _layer_norm_rows_f16(ctx, x, gamma, beta, epsilon, axes, cof, explog)
    if y is not None:
        return y
    x32 = to_f32(x)
    y = _layer_norm_rows(ctx, x32, gamma, beta, epsilon, axes, cof, explog)
    if y is not None:
        return _layer_norm_out(ctx, y)
    mean = _sum(c32, vec(c32, "mul", x32, cof), axes)
    d = vec(c32, "sub", x32, mean)
    var = _sum(c32, vec(c32, "mul", vec(c32, "mul", d, d), cof), axes)
    ve = vec(c32, "add", var, np.float32(epsilon))
    if explog:
        rstd = vec(c32, "exp", vec(c32, "mul", vec(c32, "log", ve), np.float32(-0.5)))
    else:
        rstd = vec(c32, "realdiv", np.float32(1.0), vec(c32, "sqrt", ve))
    y = vec(c32, "mul", d, rstd)
    if gamma is not None:
        y = vec(c32, "mul", y, to_f32(gamma))
    if beta is not None:
        y = vec(c32, "add", y, to_f32(beta))
    ctx.record(c32.status)
    return _layer_norm_out(ctx, y)


def _layer_norm_out(ctx: OpContext, y) -> np.ndarray:
    """LayerNorm's float32 result in the compute dtype (LayerNormV4 casts bfloat16 with CAST_ROUND)."""
    if ctx.op_model == "ascendc" and ctx.dtype_name == "bfloat16":
        out, st = cast(y, "bfloat16", "round", ctx.overflow_mode, ctx.subnormals)
        ctx.record(st)
        return out
    return finish(ctx, y)


# ------------------------------------------------------------------ one pass per row (kernels/composite.py)
#
# The steps above fused per row of the trailing reduced axes, with the same float32 operations in the
# same order; a call where some step gives Inf or NaN (whose status and saturation the steps decide),
# or that the kernels do not cover (subnormal flushing, other axes, a gamma varying along kept axes),
# returns None and runs the steps.

def _rows(x: np.ndarray, axes) -> int:
    """The number of rows when ``axes`` are x's trailing axes (and neither rows nor their length is
    empty), else 0."""
    k = len(axes)
    if k == 0 or x.size == 0 or tuple(sorted(int(a) % x.ndim for a in axes)) != tuple(range(x.ndim - k, x.ndim)):
        return 0
    return int(np.prod(x.shape[:x.ndim - k], dtype=np.int64))


_NO_TABLE = np.zeros(0, dtype=np.float32)
_EXP_TABLES: dict = {}


def _exp_table(bf16: bool, exp64: bool) -> np.ndarray:
    """The row kernel's exp of every 16-bit pattern (kernels/composite.softmax_exp_table), made once."""
    key = (bf16, exp64)
    t = _EXP_TABLES.get(key)
    if t is None:
        t = _kc.softmax_exp_table(bf16, exp64)
        t.flags.writeable = False
        _EXP_TABLES[key] = t
    return t


def _exp_table_nonfinite_nan(exp64: bool) -> np.ndarray:
    """The fp16 exp table (:func:`_exp_table`) with NaN at every Inf and NaN pattern (exp(-Inf) = 0 there
    otherwise): for kernels/composite.softmax_rows_f16, where an Inf or NaN x - max then makes the row's sum NaN,
    which the kernel checks, instead of a check of every difference. Made once."""
    key = ("nonfinite NaN", exp64)
    t = _EXP_TABLES.get(key)
    if t is None:
        t = _exp_table(False, exp64).copy()
        t[(np.arange(65536, dtype=np.uint32) & 0x7C00) == 0x7C00] = np.nan
        t.flags.writeable = False
        _EXP_TABLES[key] = t
    return t


def _softmax_rows(ctx: OpContext, x: np.ndarray, axis):
    """softmax's float32 result from the fused kernel, or None where the steps must run."""
    if ctx.subnormals != "keep" or x.ndim == 0 or x.dtype != ctx.dtype:
        return None
    rows = _rows(x, (axis,))
    if not rows:
        return None
    if ctx.op_model == "ascendc" or x.dtype == np.float32:
        sub = _kc.SUB_F32
    else:
        sub = _kc.SUB_BF16 if x.dtype == bfloat16 else (_kc.SUB_F16_HW if _kcast.HW_HALF else _kc.SUB_F16)
    x2 = np.ascontiguousarray(to_f32(x)).reshape(rows, -1)
    out = np.empty(x2.shape, dtype=np.float32)
    exp64 = ctx.impl_mode == "high_precision"
    tab = _NO_TABLE if sub == _kc.SUB_F32 else _exp_table(sub == _kc.SUB_BF16, exp64)
    if not _kc.softmax_rows(x2, out, sub, exp64, tab):
        return None
    return out.reshape(x.shape)


def _f16_rows(ctx: OpContext, x: np.ndarray, axes) -> int:
    """The rows of the fp16 one-pass kernels (fp16 in, fp16 out: the rounding of ``finish`` in the kernel,
    by the CPU's conversion), or 0 where they do not apply."""
    if not (_kcast.HW_HALF and x.dtype == np.float16 and ctx.dtype == np.float16 and ctx.subnormals == "keep"):
        return 0
    return _rows(x, axes)


def _softmax_rows_f16(ctx: OpContext, x: np.ndarray, axis):
    """_softmax_rows and ``finish`` in one pass for fp16 data: the fp16 result, or None where the other
    paths must run (some step or the final rounding overflowed: their status and saturation decide)."""
    rows = _f16_rows(ctx, x, (axis,)) if x.ndim else 0
    if not rows:
        return None
    sub = _kc.SUB_F32 if ctx.op_model == "ascendc" else _kc.SUB_F16_HW
    exp64 = ctx.impl_mode == "high_precision"
    tab = _NO_TABLE if sub == _kc.SUB_F32 else _exp_table_nonfinite_nan(exp64)
    xb = np.ascontiguousarray(x).reshape(rows, -1).view(np.uint16)
    out = np.empty(xb.shape, dtype=np.uint16)
    if not _kc.softmax_rows_f16(xb, out, sub, exp64, tab):
        return None
    return out.view(np.float16).reshape(x.shape)


def _layer_norm_rows_f16(ctx: OpContext, x, gamma, beta, epsilon, axes, cof, explog):
    """_layer_norm_rows and ``finish`` in one pass for fp16 data: the fp16 result, or None where the other
    paths must run."""
    rows = _f16_rows(ctx, x, axes)
    if not rows:
        return None
    params = _norm_params(ctx, x, gamma, beta, axes, explog)
    if params is None:
        return None
    g, b, mode = params
    xb = np.ascontiguousarray(x).reshape(rows, -1).view(np.uint16)
    out = np.empty(xb.shape, dtype=np.uint16)
    if not _kc.layer_norm_rows_f16(xb, g, b, out, cof, np.float32(epsilon), mode):
        return None
    return out.view(np.float16).reshape(x.shape)


def _norm_params(ctx: OpContext, x, gamma, beta, axes, explog):
    """The row kernels' gamma and beta rows and rstd mode for ``x`` normalised over its trailing ``axes``, or None
    when gamma or beta varies along a kept axis (the steps then run)."""
    trailing = tuple(x.shape[x.ndim - len(axes):])
    g, b = _row_param(gamma, trailing), _row_param(beta, trailing)
    if g is None or b is None:
        return None
    mode = (_kc.RSTD_EXPLOG64 if ctx.impl_mode == "high_precision" else _kc.RSTD_EXPLOG32) if explog else _kc.RSTD_DIV
    return g, b, mode


def _row_param(p, trailing):
    """gamma or beta as one float32 row of the trailing shape (empty for None), or None when it varies
    along a kept axis."""
    if p is None:
        return np.zeros(0, dtype=np.float32)
    p = to_f32(p)
    shape = p.shape
    while shape and shape[0] == 1 and len(shape) > len(trailing):
        shape = shape[1:]
    if len(shape) > len(trailing):
        return None
    try:
        if np.broadcast_shapes(shape, trailing) != trailing:
            return None
    except ValueError:
        return None
    return np.ascontiguousarray(np.broadcast_to(p.reshape(shape), trailing)).reshape(-1)


def _layer_norm_rows(ctx: OpContext, x32, gamma, beta, epsilon, axes, cof, explog):
    """layer_norm's float32 result from the fused kernel, or None where the steps must run."""
    if ctx.subnormals != "keep":
        return None
    rows = _rows(x32, axes)
    if not rows:
        return None
    params = _norm_params(ctx, x32, gamma, beta, axes, explog)
    if params is None:
        return None
    g, b, mode = params
    x2 = np.ascontiguousarray(x32).reshape(rows, -1)
    out = np.empty(x2.shape, dtype=np.float32)
    if not _kc.layer_norm_rows(x2, g, b, out, cof, np.float32(epsilon), mode):
        return None
    return out.reshape(x32.shape)


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
