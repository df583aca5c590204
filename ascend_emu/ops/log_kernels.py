"""CANN's LogSoftmax and Softplus kernels, instruction by instruction (NUMERICS.md section 2, "Sourced kernels").

Both take the log of a sum of exponentials; the kernels do it in float32 steps that the float64 composite model
(one rounding) smooths over. Every vector instruction is one float32 step of the vector unit (rounded, and
saturated and flagged under ``saturation``), exp and log its float32 transcendentals (``impl_mode``), sums the
float32 ReduceSum of :func:`ascend_emu.numerics.reduction.reduce`; the result is cast back once (RINT). The ops call
these unless ``ctx.op_model`` is ``exact``.
"""
from __future__ import annotations

import numpy as np

from ._util import finish, to_f32
from .math_ops import vec
from .registry import OpContext
from .sourced import _f32ctx, _sum, shifted

#: -ln 2 as the kernels' float32 constant (softplus.py NEG_LN_2, softplus_dag.h constNegLn2)
_NEG_LN2 = np.float32(-0.69314718055994530941723212145818)
_ZERO, _ONE, _NEG_ONE = np.float32(0.0), np.float32(1.0), np.float32(-1.0)


def log_softmax(ctx: OpContext, x, axis=-1) -> np.ndarray:
    """x - max - log(sum(exp(x - max))) over ``axis``.

    TBE log_softmax_v2_compute subtracts the maximum in the input dtype (an fp16 difference rounded to fp16),
    then casts to float32: vexp, reduce_sum, vlog, vsub. The Ascend C kernel (log_softmax_v2_ar_full_load.h)
    loads the input as float32 and subtracts there.
    """
    c32, d = shifted(ctx, np.asarray(x), axis)
    e = vec(c32, "exp", d)
    y = vec(c32, "sub", d, vec(c32, "log", _sum(c32, e, axis)))
    ctx.record(c32.status)
    return finish(ctx, y)


def softplus(ctx: OpContext, x) -> np.ndarray:
    """log(1 + e^x) as softplus.py (softplus_compute) and the 950's softplus_dag.h compute it, both the same
    steps: p = max(x, 0), n = min(x, 0); (log(exp(p * -1) + 1) + p) + log(exp(n) + 1), plus fl32(-ln 2)."""
    c32 = _f32ctx(ctx)
    w = to_f32(x)
    p = vec(c32, "maximum", w, _ZERO)
    n = vec(c32, "minimum", w, _ZERO)
    pos = vec(c32, "add", vec(c32, "log", vec(c32, "add", vec(c32, "exp", vec(c32, "mul", p, _NEG_ONE)), _ONE)), p)
    neg = vec(c32, "log", vec(c32, "add", vec(c32, "exp", n), _ONE))
    y = vec(c32, "add", vec(c32, "add", pos, neg), _NEG_LN2)
    ctx.record(c32.status)
    return finish(ctx, y)
