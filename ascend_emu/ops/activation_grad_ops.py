"""The elementwise gradients and activations of training graphs, as CANN's kernels compute them: ReluGrad and its
kin, SigmoidGrad, TanhGrad, RsqrtGrad, SqrtGrad, ReciprocalGrad / InvGrad, SoftplusGrad, Elu, Selu, DivNoNan, MulNoNan.

16-bit inputs are widened to float32, the kernel's vector instructions run as float32 steps in its order (each
saturated and flagged on its own where the kernel's steps are followed: ``_util.f32_steps``), and the result is
rounded once to the compute dtype; DivNoNan and MulNoNan run in the compute dtype as their TBE kernels do.
NUMERICS.md section 8 has the details, op by op.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ._util import f32_chain, f32_ring_steps, f32_steps, finish, is_float, to64
from .registry import VECTOR, Source, register

# SELU's constants as TF defines them (tensorflow/core/kernels/relu_op_functor.h), as float32 scalars
SELU_SCALE = 1.0507009873554804934193349852946
SELU_ALPHA = 1.6732632423543772848170429916717
_SCALE32, _SCALE_ALPHA32 = np.float32(SELU_SCALE), np.float32(SELU_SCALE * SELU_ALPHA)


# ------------------------------------------------------------------------------ vector: activation gradients

#: the elementwise gradients' model (float32 steps in the order given, one rounding) and their TBE kernels (canndev,
#: read in the public mirror dengguojie/vue-element-admin); a note says where a kernel's order differs
_TBE = "canndev ops/built-in/tbe/impl/dynamic/"
_GRAD_MODEL = "NUMERICS.md section 8 (elementwise gradients: float32 steps, one rounding)"


def _grad_source(kernel, note):
    return Source((_TBE + kernel, _GRAD_MODEL), (), note)


_GRAD_SOURCE = {
    "Relu6Grad": _grad_source("relu6_grad.py (relu6_grad_compute)", "dy times a 0/1 mask: the rounding is exact"),
    "EluGrad": _grad_source("elu_grad.py (elu_grad_compute: (min(y, 0) + 1) dy)", "the kernel's steps and order"),
    "SeluGrad": _grad_source("selu_grad.py (selu_grad_compute: vcmpsel of dy (y + scale alpha), dy scale)",
                             "the kernel's steps and order"),
    "SigmoidGrad": Source((_TBE + "sigmoid_grad.py (sigmoid_grad_compute)",
                           "hicann/ops-nn activation/sigmoid_grad/op_kernel/arch35/sigmoid_grad_f16.h", _GRAD_MODEL),
                          ("op_model",), "TBE (910, 910B): (y - y y) dy; Ascend C (op_model ascendc, the 950): "
                                         "(dy (1 - y)) y; float32 steps, one rounding"),
    "TanhGrad": _grad_source("tanh_grad.py (tanh_grad_compute: (1 - y y) dy)", "the kernel's steps and order"),
    "RsqrtGrad": _grad_source("rsqrt_grad.py (rsqrt_grad_compute: vmul, vmul, vmul, vmuls)",
                              "((y y) y) dy, times -0.5: the kernel's steps and order; the 950's arch35 "
                              "((dy y) (-0.5)) (y y) is not modelled"),
    "SqrtGrad": _grad_source("sqrt_grad.py (sqrt_grad_compute: vdiv(dy, y), vmuls 0.5)",
                             "0.5 dy / y in float32; the kernel divides in the input dtype, then halves (exact but "
                             "for subnormal results)"),
    "ReciprocalGrad": _grad_source("reciprocal_grad.py (reciprocal_grad_compute: vmuls -1, vmul, vmul)",
                                   "((y (-1)) y) dy: the kernel's steps and order"),
    "InvGrad": _grad_source("inv_grad.py (inv_grad_compute: vmuls -1, vmul, vmul)",
                            "((y (-1)) y) dy: the kernel's steps and order; the 950's arch35 ((y y) dy) (-1) "
                            "is not modelled"),
    "SoftplusGrad": Source((_TBE + "softplus_grad.py (softplus_grad_compute: vexp, vadds, vdiv, vmul)",
                            "hicann/ops-nn activation/softplus_grad/op_kernel/arch35/softplus_grad_dag.h",
                            _GRAD_MODEL), ("op_model", "impl_mode"),
                           "TBE: dy (e^x / (e^x + 1)) (NaN for x > 88.72, where e^x overflows, under inf_nan); "
                           "Ascend C (op_model ascendc): dy (1 / (e^-x + 1)); the vector unit's float32 exp"),
}


def _grad(tf_type, formula, doc):
    @register(tf_type, kind=VECTOR, source=_GRAD_SOURCE[tf_type])
    def op(a, b, *, ctx):
        return f32_chain(ctx, formula, a, b)
    op.__name__ = tf_type
    op.__doc__ = doc
    return op


_ONE, _HALF = np.float32(1.0), np.float32(0.5)
_NEG_ONE, _NEG_HALF, _ZERO = np.float32(-1.0), np.float32(-0.5), np.float32(0.0)


def _f32_exp(ctx, v):
    """The vector unit's float32 exp of float32 ``v`` (``impl_mode``), its status recorded."""
    from ..numerics.vector import vector

    e, status = vector("exp", v, dtype="float32", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals,
                       op_model=ctx.op_model, impl_mode=ctx.impl_mode)
    ctx.record(status)
    return e



@register("ReluGrad", kind=VECTOR, source=_grad_source(
    "relu_grad.py (relu_grad_compute: dy times a 0/1 mask of x > 0)", "the product by 0 or 1: the rounding is exact"))
def relu_grad(dy, x, *, ctx):
    """dx = dy * (x > 0)"""
    dy, x = np.asarray(dy), np.asarray(x)
    if (ctx.dtype != np.float32 and ctx.subnormals == "keep" and dy.dtype == x.dtype == ctx.dtype
            and dy.shape == x.shape):
        # a select on the 16-bit patterns: the same bits as the float32 product rounded, for finite dy
        from ..kernels import alloc
        from ..kernels import vector as kv

        out = alloc.empty(dy.shape, np.uint16)
        xb = np.ascontiguousarray(x).view(np.uint16).reshape(-1)
        block = _repeated_block(dy)
        if block is not None:
            # dy a broadcast view repeating its values over a block of axes (the global average pool's gradient,
            # a BroadcastTo divided by n): the select reads its distinct values, not a materialized copy
            dyc, mid, cols = block
            failed = kv.relu_grad16_bcast(dyc.view(np.uint16).reshape(-1), xb, out.reshape(-1), mid, cols,
                                          ctx.dtype != np.float16)
        else:
            failed = kv.relu_grad16(np.ascontiguousarray(dy).view(np.uint16).reshape(-1), xb, out.reshape(-1),
                                    ctx.dtype != np.float16)
        if not failed:
            return out.view(ctx.dtype)
    return f32_chain(ctx, lambda g, f: g * (f > 0).astype(np.float32), dy, x)


def _repeated_block(a):
    """(``a``'s distinct values, C-contiguous, mid, cols) when the non-empty ``a`` repeats its values (zero strides)
    over one block of consecutive axes, the other axes kept, at least ``_BCAST_COLS`` values after the block: ``a``
    viewed as (outer, mid, cols) has element (o, m, c) = distinct[o * cols + c]; else None."""
    if 0 not in a.strides or not a.size:
        return None
    rep = [s == 0 and n > 1 for s, n in zip(a.strides, a.shape)]
    if not any(rep):
        return None
    i0 = rep.index(True)
    i1 = len(rep) - rep[::-1].index(True)
    if any(not rep[i] and a.shape[i] != 1 for i in range(i0, i1)):
        return None     # a kept axis between repeated ones: two blocks
    cols = int(np.prod(a.shape[i1:]))
    if cols < _BCAST_COLS:
        return None     # (rows too short for the kernel's vectors: review, 2-3.6x slower than the copy for 1 column)
    from ..numerics.chain import distinct_view

    return np.ascontiguousarray(distinct_view(a)), int(np.prod(a.shape[i0:i1])), cols


#: the shortest kept row (the axes after the repeated block) relu_grad16_bcast takes
_BCAST_COLS = 16


_grad("Relu6Grad", lambda dy, x: dy * ((x > 0) & (x < 6)).astype(np.float32), "dx = dy * (0 < x < 6)")
_grad("EluGrad", lambda dy, y: np.where(y < 0, dy * (y + _ONE), dy), "dx = y < 0 ? dy * (y + 1) : dy")
_grad("SeluGrad", lambda dy, y: np.where(y < 0, dy * (y + _SCALE_ALPHA32), dy * _SCALE32),
      "dx = y < 0 ? dy * (y + scale*alpha) : dy * scale")
_grad("TanhGrad", lambda y, dy: dy * (_ONE - y * y), "dx = dy * (1 - y*y)")
_grad("SqrtGrad", lambda y, dy: _HALF * dy / y, "dx = 0.5 * dy / y")


# ---- the TBE kernels' float32 steps (fp16 widened; each vector instruction one float32 step through ``st``, which
# records an Inf or NaN and saturates it under ``saturation``; one RINT back): NUMERICS.md section 8

@register("SigmoidGrad", kind=VECTOR, source=_GRAD_SOURCE["SigmoidGrad"])
def sigmoid_grad(y, dy, *, ctx):
    """TBE sigmoid_grad_compute: dx = (y - y*y) * dy; under ``op_model="ascendc"`` the arch35 kernel's
    (dy * (1 - y)) * y."""
    if ctx.op_model == "ascendc":
        return f32_ring_steps(ctx, lambda st, s, d: st(st(d * st(_ONE - s)) * s), y, dy)
    return f32_ring_steps(ctx, lambda st, s, d: st(st(s - st(s * s)) * d), y, dy)


@register("RsqrtGrad", kind=VECTOR, source=_GRAD_SOURCE["RsqrtGrad"])
def rsqrt_grad(y, dy, *, ctx):
    """TBE rsqrt_grad_compute: dx = (((y*y) * y) * dy) * -0.5."""
    return f32_ring_steps(ctx, lambda st, s, d: st(st(st(st(s * s) * s) * d) * _NEG_HALF), y, dy)


def _reciprocal_grad(y, dy, *, ctx):
    """TBE reciprocal_grad_compute / inv_grad_compute: dx = ((y * -1) * y) * dy."""
    return f32_ring_steps(ctx, lambda st, s, d: st(st(st(s * _NEG_ONE) * s) * d), y, dy)


register("ReciprocalGrad", kind=VECTOR, source=_GRAD_SOURCE["ReciprocalGrad"])(_reciprocal_grad)
register("InvGrad", kind=VECTOR, source=_GRAD_SOURCE["InvGrad"])(_reciprocal_grad)


@register("SoftplusGrad", kind=VECTOR, source=_GRAD_SOURCE["SoftplusGrad"])
def softplus_grad(dy, x, *, ctx):
    """TBE softplus_grad_compute: e = exp(x), dx = dy * (e / (e + 1)); under ``op_model="ascendc"`` the arch35
    kernel's dy * (1 / (exp(x * -1) + 1)). exp is the vector unit's float32 exp (``impl_mode``)."""
    def steps(st, d, v):
        if ctx.op_model == "ascendc":
            v = st(v * _NEG_ONE)
        e = _f32_exp(ctx, v)
        a = st(e + _ONE)
        if ctx.op_model == "ascendc":
            return st(d * st(_ONE / a))
        return st(d * st(e / a))
    return f32_steps(ctx, steps, dy, x)


@register("LeakyReluGrad", kind=VECTOR, source=_grad_source(
    "leaky_relu_grad.py (leaky_relu_grad_compute: dy times 1, or the float32 negative_slope)",
    "dy or dy alpha (alpha float32), one rounding"))
def leaky_relu_grad(dy, x, *, ctx, alpha=0.2):
    """dx = x > 0 ? dy : dy * alpha (alpha as a float32 scalar)."""
    return f32_chain(ctx, lambda g, f: np.where(f > 0, g, g * np.float32(alpha)), dy, x)


_ELU_NOTE = ("the kernel's float32 steps, exp(min(x, 0)) - 1 (no expm1: an fp16 x above -2^-24 gives 0), one "
             "rounding (a float32 input's vrelu path gives the same finite values; its NaN and signed zeros are not "
             "checked); op_model exact: float64 expm1, one rounding")


@register("Elu", kind=VECTOR, source=Source(
    (_TBE + "elu.py (elu_compute: vmins, vmaxs, vexp, vadds -1, vaxpy)", _GRAD_MODEL), ("op_model", "impl_mode"),
    _ELU_NOTE + "; the 950's arch35 elu_dag.h is not modelled"))
def elu(x, *, ctx):
    """TBE elu_compute (alpha 1, TF's Elu): y = (exp(min(x, 0)) + -1) + max(x, 0), float32 steps, one rounding."""
    if ctx.op_model == "exact":
        z = to64(x)
        with np.errstate(all="ignore"):
            return finish(ctx, np.where(z < 0, np.expm1(z), z))

    def steps(st, v):
        neg, pos = st(np.minimum(v, _ZERO)), st(np.maximum(v, _ZERO))
        return st(st(_f32_exp(ctx, neg) + _NEG_ONE) + pos)
    return f32_steps(ctx, steps, x)


#: selu.py's own constants (SCALE_ALPHA_PRODUCT, SCALE), taken as float32 by its vmuls
_SELU_SA_TBE, _SELU_S_TBE = np.float32(1.75809934085), np.float32(1.05070098736)


@register("Selu", kind=VECTOR, source=Source(
    (_TBE + "selu.py (selu_compute: vmuls 0, vmin, vmax, vexp, vadds -1, vmuls, vmuls, vadd)", _GRAD_MODEL),
    ("op_model", "impl_mode"),
    "the kernel's float32 steps with its constants 1.75809934085 and 1.05070098736, exp(min(x, x 0)) - 1 (an "
    "infinite x gives NaN: x 0), one rounding; op_model exact: TF's constants, float64 expm1; the 950's arch35 "
    "selu.h (alpha, a min with 0, then scale) is not modelled"))
def selu(x, *, ctx):
    """TBE selu_compute: z = x * 0; y = (exp(min(x, z)) + -1) * 1.75809934085 + max(x, z) * 1.05070098736, float32
    steps, one rounding."""
    if ctx.op_model == "exact":
        z = to64(x)
        with np.errstate(all="ignore"):
            return finish(ctx, np.where(z < 0, (SELU_SCALE * SELU_ALPHA) * np.expm1(z), SELU_SCALE * z))

    def steps(st, v):
        zero = st(v * _ZERO)
        neg, pos = st(np.minimum(v, zero)), st(np.maximum(v, zero))
        return st(st(st(_f32_exp(ctx, neg) + _NEG_ONE) * _SELU_SA_TBE) + st(pos * _SELU_S_TBE))
    return f32_steps(ctx, steps, x)


@register("Sign", kind=VECTOR, source=Source(exact="-1, 0 or 1 (NaN stays NaN)"))
def sign(x, *, ctx):
    """-1, 0 or 1 (NaN stays NaN): exact in every dtype."""
    if not is_float(x):
        return np.sign(x)
    return f32_chain(ctx, np.sign, x)


#: div_no_nan.py's index constants by dtype: help_min, help_rec_one, help_rec_sec (applied twice but for fp16)
_DIV_NO_NAN_HELP = {"float16": (2.0 ** -24, 2.0 ** 12, 2.0 ** 12, 1), "float32": (2.0 ** -126, 2.0 ** 38, 2.0 ** 44, 2)}


#: DivNoNan's operands of at most this many elements take _div_no_nan_small_f32 (the loss's sum / count scalars: its
#: nine vec calls of numpy scalars, which miss vec's float32 fast path, took ~250 us a node in the Keras step)
SMALL_DIV_NO_NAN = 4096
_F32 = np.dtype(np.float32)


def _div_no_nan_small_f32(ctx, x, y, tiny, r1, r2):
    """The TBE kernel's float32 instructions below (div_no_nan) in numpy on small float32 operands, or None. Taken
    where every operand and every instruction's result is finite: each is then one IEEE float32 operation (or an
    exact selection: abs, minimum) with no status and no saturation, numpy's own result; anything else (an Inf/NaN
    anywhere, flushed subnormals, cce_ftz's division) runs the instructions one by one."""
    if ctx.dtype != _F32 or ctx.subnormals != "keep" or ctx.ftz:
        return None
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype != _F32 or y.dtype != _F32 or x.size > SMALL_DIV_NO_NAN or y.size > SMALL_DIV_NO_NAN:
        return None
    f = np.float32
    with np.errstate(all="ignore"):
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            return None
        idx = np.multiply(np.multiply(np.multiply(np.minimum(np.abs(y), f(tiny)), f(r1)), f(r2)), f(r2))
        divisor = np.add(y, np.add(idx, f(-1)))
        q = np.divide(x, divisor)
        out = np.multiply(q, idx)
        # idx and divisor are finite for a finite y (idx <= 1); the quotient and the product are checked
        if not (np.isfinite(q).all() and np.isfinite(out).all()):
            return None
    return np.asarray(out, dtype=_F32)


@register("DivNoNan", kind=VECTOR, source=Source(
    (_TBE + "div_no_nan.py (div_no_nan_compute)", "hicann/ops-math math/div_no_nan/op_kernel/arch35/div_no_nan_dag.h",
     "NUMERICS.md section 8 (DivNoNan, MulNoNan)"), ("op_model",),
    "TBE, in the input dtype: idx = min(|y|, tiny) scaled to 1 (0 for y == 0), x / (y + (idx - 1)) * idx, so y == 0 "
    "gives -x * 0 (-0 for x > 0, NaN for an infinite x) and a float32 subnormal y a scaled quotient; Ascend C "
    "(op_model ascendc): select(y != 0, x / y, 0), the division's status kept; op_model exact: 0 where y == 0, no "
    "status"))
def div_no_nan(x, y, *, ctx):
    """TBE div_no_nan_compute, every instruction in the compute dtype (bf16 with float32's constants: assumed):
    idx = ((min(|y|, tiny) * r1) * r2 [* r2]); q = x / (y + (idx + -1)); x / y where y != 0, else x / -1 * 0.
    Under ``op_model="ascendc"`` the 950's select(y != 0, x / y, 0); under ``"exact"`` 0 where y == 0 by dividing
    by 1 there (no status)."""
    from .math_ops import vec

    if not is_float(x):
        raise NotImplementedError("integer DivNoNan")
    if ctx.op_model in ("exact", "ascendc"):
        zero = np.asarray(y) == 0
        d = y if ctx.op_model == "ascendc" else np.where(zero, np.ones((), np.asarray(y).dtype), y)
        q = vec(ctx, "realdiv", x, d)
        return vec(ctx, "select", np.broadcast_to(zero, q.shape), np.zeros((), q.dtype), q)
    tiny, r1, r2, twice = _DIV_NO_NAN_HELP["float16" if ctx.dtype_name == "float16" else "float32"]
    small = _div_no_nan_small_f32(ctx, x, y, tiny, r1, r2)
    if small is not None:
        return small
    dt = np.dtype(ctx.dtype)
    # fp16's help_min 2^-24 is itself subnormal: the kernel needs the vector unit to keep subnormals, so the index
    # steps keep them whatever ``subnormals`` says (|y| is read under it)
    keep = dataclasses.replace(ctx, subnormals="keep", status=0)
    idx = vec(keep, "mul", vec(keep, "mul", vec(keep, "minimum", vec(ctx, "abs", y), dt.type(tiny)), dt.type(r1)),
              dt.type(r2))
    if twice == 2:
        idx = vec(keep, "mul", idx, dt.type(r2))
    ctx.record(keep.status)
    divisor = vec(ctx, "add", y, vec(ctx, "add", idx, dt.type(-1)))
    return vec(ctx, "mul", vec(ctx, "realdiv", x, divisor), idx)


@register("MulNoNan", kind=VECTOR, source=Source(
    (_TBE + "mul_no_nan.py (mul_no_nan_compute: vmul)", "hicann/ops-math experimental/math/mul_no_nan/op_kernel/"
     "mul_no_nan_dag.h", "NUMERICS.md section 8 (DivNoNan, MulNoNan)"), ("op_model",),
    "TBE (the dynamic-shape kernel; the static impl/mul_no_nan.py's vcmpsel is TF's rule, and which one a static "
    "graph gets is assumed, no parameter): a plain vmul (x 0 is -0 for a negative x, NaN for an infinite or NaN x); "
    "Ascend C (op_model ascendc) and exact: select(y != 0, x y, 0), TensorFlow's rule"))
def mul_no_nan(x, y, *, ctx):
    """TBE mul_no_nan_compute: x * y (one vmul); under ``op_model`` ``ascendc`` (the 950's kernel) or ``exact``,
    x * y and 0 where y == 0 (even for x Inf or NaN)."""
    from .math_ops import vec

    if not is_float(x):
        raise NotImplementedError("integer MulNoNan")
    if ctx.op_model not in ("exact", "ascendc"):
        return vec(ctx, "mul", x, y)
    zero = np.asarray(y) == 0
    return vec(ctx, "mul", np.where(zero, np.zeros((), np.asarray(x).dtype), x), y)


@register("FloorMod", kind=VECTOR, source=Source(exact="integer modulo (a float FloorMod runs on the AI CPU)"))
def floor_mod(x, y, *, ctx):
    """Integer floor modulo (the sign of the divisor), exact; float FloorMod runs on the AI CPU."""
    if is_float(x):
        raise NotImplementedError("float FloorMod")
    return np.mod(x, y)
