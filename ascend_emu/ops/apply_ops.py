"""Optimizer updates: TensorFlow's TF1 ``Apply*`` ops, as CANN's ``Apply*`` operators (black list: float32).

TF's Apply* ops update their ref inputs in place and output the variable. Here they are pure: the
first output is the new variable (TF's output), the following ones the new values of the slot
inputs in their input order, which the training engine writes back to the slot variables. Each
update is a float32 chain in TensorFlow's functor order (training_ops.cc), every output rounded once
(NUMERICS.md section 8).
"""
from __future__ import annotations

import numpy as np

from ..numerics.chain import F32_UNARY, chain_f32
from ._util import finish, widen
from .registry import OPS, VECTOR, Source, register

#: the TBE Apply*D kernels (canndev, read in the public mirror dengguojie/vue-element-admin) and the model
_TBE = "canndev ops/built-in/tbe/impl/dynamic/"
_MODEL = "NUMERICS.md section 8 (optimizer updates)"


def _source(kernel, note):
    return Source((_TBE + kernel, _MODEL), (), note)


def _chain_outputs(ctx, fn, *xs):
    with np.errstate(all="ignore"):
        outs = fn(*[widen(ctx, x) for x in xs])
    return tuple(finish(ctx, np.asarray(o, np.float32)) for o in outs)


@register("ApplyGradientDescent", kind=VECTOR, source=_source(
    "apply_gradient_descent.py (var - delta alpha)", "the kernel's steps, float32 (black list), one rounding"))
def apply_gradient_descent(var, alpha, delta, *, ctx):
    """var - alpha * delta."""
    return _chain_outputs(ctx, lambda v, a, d: (v - a * d,), var, alpha, delta)


@register("ApplyMomentum", kind=VECTOR, source=_source(
    "apply_momentum_d.py (apply_momentum_compute_d: fp16 widened to float32)",
    "the kernel's steps and order (nesterov included), float32, one rounding"))
def apply_momentum(var, accum, lr, grad, momentum, *, ctx, use_nesterov=False):
    """accum = accum * momentum + grad; var -= lr * accum (nesterov: var -= grad * lr + accum * momentum * lr).
    Outputs (var, accum)."""
    def fn(v, a, lr_, g, mom):
        a = a * mom + g
        return (v - (g * lr_ + a * mom * lr_) if use_nesterov else v - lr_ * a), a
    return _chain_outputs(ctx, fn, var, accum, lr, grad, momentum)


@register("ApplyKerasMomentum", kind=VECTOR, source=_source(
    "apply_keras_momentum_d.py", "the kernel's steps, float32, one rounding; nesterov's var + (a m - g lr) is TF's "
                                 "order, the kernel's (var + a m) - g lr is not modelled"))
def apply_keras_momentum(var, accum, lr, grad, momentum, *, ctx, use_nesterov=False):
    """accum = accum * momentum - grad * lr; var += accum (nesterov: var += accum * momentum - grad * lr).
    Outputs (var, accum). (TF has only the resource form, ResourceApplyKerasMomentum.)"""
    def fn(v, a, lr_, g, mom):
        a = a * mom - g * lr_
        return (v + (a * mom - g * lr_) if use_nesterov else v + a), a
    return _chain_outputs(ctx, fn, var, accum, lr, grad, momentum)


@register("ApplyAdam", kind=VECTOR, source=_source(
    "apply_adam_d.py (m + (beta1 - 1)(m - g), lr_t, (lr_t m) / (sqrt(v) + eps))",
    "the kernel's steps (nesterov included), float32 (black list), one rounding"))
def apply_adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, *, ctx, use_nesterov=False):
    """lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t); m += (g - m) * (1 - beta1); v += (g*g - v) * (1 - beta2);
    var -= lr_t * m / (sqrt(v) + eps) (nesterov: m * beta1 + (1 - beta1) * g in place of m). Outputs (var, m, v)."""
    def fn(w, m_, v_, b1p, b2p, lr_, b1, b2, eps, g):
        one = np.float32(1.0)
        alpha = lr_ * np.sqrt(one - b2p) / (one - b1p)
        m_ = m_ + (g - m_) * (one - b1)
        v_ = v_ + (g * g - v_) * (one - b2)
        mm = (m_ * b1 + (one - b1) * g) if use_nesterov else m_
        return w - (mm * alpha) / (np.sqrt(v_) + eps), m_, v_
    return _chain_outputs(ctx, fn, var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad)


@register("ApplyRMSProp", kind=VECTOR, source=_source(
    "apply_rms_prop_d.py (apply_rms_prop_d_compute)", "the kernel's steps, float32 (black list), one rounding"))
def apply_rms_prop(var, ms, mom, lr, rho, momentum, epsilon, grad, *, ctx):
    """ms += (g*g - ms) * (1 - rho); mom = mom * momentum + lr * g / sqrt(ms + eps); var -= mom.
    Outputs (var, ms, mom)."""
    def fn(w, ms_, mom_, lr_, rho_, momentum_, eps, g):
        ms_ = ms_ + (g * g - ms_) * (np.float32(1.0) - rho_)
        mom_ = mom_ * momentum_ + lr_ * g / np.sqrt(ms_ + eps)
        return w - mom_, ms_, mom_
    return _chain_outputs(ctx, fn, var, ms, mom, lr, rho, momentum, epsilon, grad)


#: the steps of an update chain (``_UpdateChain``) and the registry op each stands for
UPDATE_STEPS = {"AddV2": "add", "Add": "add", "Sub": "sub", "Mul": "mul", "RealDiv": "realdiv", "Div": "realdiv",
                "Neg": "neg", "Square": "square", "Sqrt": "sqrt"}
_STEP_OPS = {"add": "AddV2", "sub": "Sub", "mul": "Mul", "realdiv": "RealDiv", "neg": "Neg", "square": "Square",
             "sqrt": "Sqrt"}


@register("_UpdateChain", kind=VECTOR, source=Source(
    ("NUMERICS.md section 8 (optimizer updates: one pass of the update's own ops)",
     "ops/math_ops.py ARITH (each step's own source)"), (),
    "the update's elementwise ops in their order, each one IEEE operation in the compute dtype: the ops' bits and "
    "status, one pass over the variable"))
def update_chain(*xs, ctx, steps, outputs, consts=()):
    """An optimizer's elementwise update ops run as one: ``steps`` are ``(name, a, b)`` (a name of
    :data:`numerics.chain.F32_STEP_CODES`) on values ``xs + consts`` then the steps' results; the values
    ``outputs`` come back. In float32 with subnormals kept, one pass (``numerics.chain.chain_f32``) while every
    value is finite; otherwise (and in any other case) the ops one by one, as the graph's own nodes would run."""
    vals = list(xs) + [np.asarray(c) for c in consts]
    if (ctx.dtype_name == "float32" and ctx.subnormals == "keep"
            and not (ctx.ftz and any(s[0] in ("realdiv", "sqrt") for s in steps))):
        # (the 950's cce_ftz flushes subnormals in division and square root: the ops' path)
        fast = chain_f32(vals, steps, outputs)
        if fast is not None:
            return tuple(fast)
    for name, a, b in steps:
        args = (vals[a],) if name in F32_UNARY else (vals[a], vals[b])
        vals.append(OPS[_STEP_OPS[name]](*args, ctx=ctx)[0])
    return tuple(vals[o] for o in outputs)
