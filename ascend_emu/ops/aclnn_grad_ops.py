"""The backward kernels torch_npu's autograd calls on the AI Core (aclnnSiluBackward, aclnnLayerNormBackward,
aclnnLogSoftmaxBackward, aclnnNLLLossBackward), step
by step as their public CANN sources compute them (NUMERICS.md section 16; ASCEND-FACTS.md 13.4).

Private op types (a leading underscore: no TF graph holds them); the torch path's lowerings
(``frontend/torch/aten.py``) run them. Oracles: ``tests/ops/test_aclnn_grad_ops.py``.
"""
from __future__ import annotations

import numpy as np

from ._util import finish, widen
from .fused_ops import _half_interval_sum
from .registry import VECTOR, Source, register


@register("_SiluGrad", kind=VECTOR, source=Source(
    ("hicann/ops-nn activation/silu_grad/op_api/aclnn_silu_backward.cpp",
     "canndev ops/built-in/tbe/impl/dynamic/silu_grad.py (silu_grad_compute)"), ("op_model", "impl_mode"),
    "fp16/bf16 widened, sigmoid as 1 / (vexp(-x) + 1), dy (s (1 + x (1 - s))) in float32, one rounding"))
def silu_grad(dy, x, *, ctx):
    """SiluGrad (the TBE kernel aclnnSiluBackward runs before the Ascend950): dy and x widened to float32;
    s = 1 / (exp(x * -1) + 1) (the vector unit's float32 exp); dx = dy * (s * (1 + (1 - s) * x)), each step one
    float32 operation in the kernel's order; one rounding to the compute dtype."""
    from ..numerics.vector import vector

    d, v = widen(ctx, dy), widen(ctx, x)
    one = np.float32(1.0)
    with np.errstate(all="ignore"):
        e, st = vector("exp", (v * np.float32(-1.0)).astype(np.float32), dtype="float32",
                       overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals, op_model=ctx.op_model,
                       impl_mode=ctx.impl_mode)
        ctx.record(st)          # exp(-x) overflowing for x < -88 raises the status bit, as the kernel's vexp does
        s = (one / (e + one)).astype(np.float32)
        t = ((one - s) * v).astype(np.float32)
        r = (d * (s * (one + t))).astype(np.float32)
    return finish(ctx, r)


def _round_pdx(ctx, y: np.ndarray) -> np.ndarray:
    """LayerNormGradV3's cast of pd_x: CAST_ROUND (ties away) for bf16, CAST_NONE (rint) for fp16."""
    if ctx.dtype_name == "bfloat16":
        from ..numerics.vector import cast

        out, st = cast(y, "bfloat16", rounding="round", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals)
        ctx.record(st)
        return out
    return finish(ctx, y)


@register("_LayerNormGradV3", kind=VECTOR, source=Source(
    ("hicann/ops-nn norm/layer_norm_grad_v3/op_kernel/layer_norm_grad_v3_transpose.h (ProcessBasicBlock, DoReduce)",
     "hicann/ops-nn norm/layer_norm_grad_v3/op_host/op_api/aclnn_layer_norm_backward.cpp"), (),
    "float32 steps in the kernel's order, row sums by halving (the tail past a power of two folded on), pd_x cast "
    "CAST_ROUND for bf16; rows longer than 64 (the other templates, not public) assumed the same; dgamma/dbeta "
    "summed over rows as the registry's float32 ReduceSum (order assumed)"))
def layer_norm_grad_v3(dy, x, rstd, mean, gamma, *, ctx):
    """LayerNormGradV3 over the last axis (N elements; ``rstd`` and ``mean`` float32 with the last axis kept as 1):
    xhat = (x - mean) * rstd, g = dy * gamma, pd_x = ((g - xhat * (sum(g * xhat) * (1/N))) - sum(g) * (1/N)) *
    rstd, every step float32 (inputs widened exactly), the sums over the row by halving; pd_x rounded once (bf16
    ties away); pd_gamma = sum over rows of xhat * dy and pd_beta = sum of dy, float32. Returns (pd_x, pd_gamma,
    pd_beta)."""
    from ._util import sum_f32

    d, v = widen(ctx, dy), widen(ctx, x)
    n = v.shape[-1]
    rs = np.asarray(rstd, np.float32).reshape(v.shape[:-1] + (1,))
    mu = np.asarray(mean, np.float32).reshape(v.shape[:-1] + (1,))
    g32 = widen(ctx, gamma).reshape(-1)
    coff = np.float32(1.0 / n)
    with np.errstate(all="ignore"):
        xhat = ((v - mu) * rs).astype(np.float32)
        mg = (d * g32).astype(np.float32)
        r3 = (_half_interval_sum((mg * xhat).astype(np.float32))[..., None] * coff).astype(np.float32)
        o = (mg - (xhat * r3).astype(np.float32)).astype(np.float32)
        r2 = (_half_interval_sum(mg)[..., None] * coff).astype(np.float32)
        o = ((o - r2).astype(np.float32) * rs).astype(np.float32)
        rows = tuple(range(v.ndim - 1))
        pd_gamma = sum_f32(ctx, (xhat * d).astype(np.float32), rows) if rows else (xhat * d).astype(np.float32)
        pd_beta = sum_f32(ctx, d, rows) if rows else d
    return _round_pdx(ctx, o), np.asarray(pd_gamma, np.float32), np.asarray(pd_beta, np.float32)


@register("_LogSoftmaxGrad", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/dynamic/log_softmax_grad.py (log_softmax_grad_compute)",
     "hicann/ops-nn activation/log_softmax_grad/op_api/aclnn_logsoftmax_backward.cpp"), ("op_model", "impl_mode"),
    "fp16 widened, dy - exp(y) sum(dy) in float32 (the vector unit's float32 exp), one rounding; the sum's order is "
    "the registry's float32 ReduceSum (assumed)"))
def log_softmax_grad(dy, y, *, ctx):
    """LogSoftmaxGrad over the last axis (``y`` the forward's output): dy and y widened to float32; e = exp(y) (the
    vector unit's float32 exp), s = sum(dy) over the row (float32), dx = dy - e * s; one rounding (fp16: RINT)."""
    from ._util import sum_f32
    from ..numerics.vector import vector

    d, v = widen(ctx, dy), widen(ctx, y)
    with np.errstate(all="ignore"):
        e, st = vector("exp", v, dtype="float32", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals,
                       op_model=ctx.op_model, impl_mode=ctx.impl_mode)
        ctx.record(st)
        s = np.asarray(sum_f32(ctx, d, (d.ndim - 1,)), np.float32)[..., None] if d.ndim else d
        r = (d - (e * s).astype(np.float32)).astype(np.float32)
    return finish(ctx, r)


@register("_NLLLossGrad", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/dynamic/nll_loss_grad.py (compute_valid_value, normal_two_dim_compute)",
     "hicann/ops-nn loss/nll_loss_grad/docs/aclnnNLLLossBackward.md"), (),
    "float32 only: ((weight[t] * y_grad) * -1) / total_weight at [i, t] (the kernel's normal tiling; its big-weight "
    "tiling's (weight / total_weight) y_grad (-1) order is not modelled), zero elsewhere"))
def nll_loss_grad(x, y_grad, target, weight, total_weight, *, ctx, reduction="mean"):
    """NLLLossGrad on (N, C) float32 scores: x_grad[i, target[i]] = ((weight[target[i]] * y_grad) * -1) /
    total_weight (``mean``; no division for ``sum``; y_grad per row for ``none``), every other element 0; a target
    outside [0, C) leaves its row 0."""
    x = np.asarray(x)
    n, c = x.shape
    t = np.asarray(target).astype(np.int64).reshape(-1)
    w = np.asarray(weight, np.float32).reshape(-1)
    g = np.asarray(y_grad, np.float32).reshape(-1)
    ok = (t >= 0) & (t < c)
    rows = np.flatnonzero(ok)
    with np.errstate(all="ignore"):
        v = w[t[rows]] * (g[rows] if reduction == "none" else g[0])
        v = (v.astype(np.float32) * np.float32(-1)).astype(np.float32)
        if reduction == "mean":
            v = (v / np.asarray(total_weight, np.float32).reshape(-1)[0]).astype(np.float32)
    out = np.zeros((n, c), np.float32)
    out[rows, t[rows]] = v
    return finish(ctx, out)
