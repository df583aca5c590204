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
from .registry import CUBE, VECTOR, Source, register


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


#: FlashAttentionScoreGrad's S1 and S2 block on the 910B (the arch22 template's BASE_BLOCK_LENGTH, S1_CUBESIZE and
#: S2_CUBESIZE): dQ sums its per-S2-block products, dK and dV their per-S1-block products, in float32 in that order
FAG_BLOCK = 128


@register("_FlashAttentionScoreGrad", kind=CUBE, source=Source(
    ("hicann/ops-transformer attention/flash_attention_score_grad/op_kernel/arch22/basic_modules/vec_op_fasg_arch22.h "
     "(SubGrapA, SubGrapB, CalcSoftMax)",
     "hicann/ops-transformer attention/flash_attention_score_grad/op_kernel/arch22/flash_attention_score_grad_post.h"),
    ("cube_block_sum", "cube_extra_bits", "cube_normalize"),
    "P recomputed in float32 from the forward's max and sum, P and dS cast CAST_ROUND before their products, dQ/dK "
    "float32 sums over 128-blocks times scale then CAST_ROUND; D = rowsum(dO O) in float32 (its order assumed)"))
def flash_attention_score_grad(q, k, v, dout, out, softmax_max, softmax_sum, *mask, ctx, scale_value=1.0,
                               has_mask=False):
    """FlashAttentionScoreGrad (BNSD; the 910B's arch22 kernel): S = Q K^T (cube, float32), S * scale, masked
    positions -FLT_MAX, P = exp(S - max) / sum in float32 (the forward's softmax_max and softmax_sum), P16 = P cast
    CAST_ROUND; dP = dO V^T (cube, float32); D = sum(dO * O) over the head dim (float32); dS = (dP - D) * P in
    float32, dS16 cast CAST_ROUND; dV = sum over S1 blocks of P16^T dO, dQ = sum over S2 blocks of dS16 K, dK = sum
    over S1 blocks of dS16^T Q, each block's product on the cube with a float32 result and the blocks added in float32;
    dQ and dK times scale in float32; the three cast CAST_ROUND to the input dtype. Returns (dQ, dK, dV)."""
    from ..numerics.cube import batch_matmul
    from ..numerics.vector import cast, vector

    dt = ctx.dtype_name
    f32 = np.float32
    cube = dict(operand_dtype=dt, out_dtype="float32", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals,
                model=ctx.cube_model)
    status = 0

    def mm(a, b, **kw):
        nonlocal status
        y, st = batch_matmul(a, b, **cube, **kw)
        status |= st
        return np.asarray(y, f32)

    def round_in(x):
        nonlocal status
        if dt == "float32":
            return np.asarray(x, f32)
        y, st = cast(np.asarray(x, f32), dt, rounding="round", overflow_mode=ctx.overflow_mode,
                     subnormals=ctx.subnormals)
        status |= st
        return y

    with np.errstate(all="ignore"):
        s = (mm(q, k, adj_y=True) * f32(scale_value)).astype(f32)
        if has_mask:
            s = np.where(np.asarray(mask[0]), f32(-np.finfo(f32).max), s).astype(f32)
        e, st = vector("exp", (s - np.asarray(softmax_max, f32)[..., None]).astype(f32), dtype="float32",
                       overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals, op_model=ctx.op_model,
                       impl_mode=ctx.impl_mode)
        status |= st
        p = (e / np.asarray(softmax_sum, f32)[..., None]).astype(f32)
        p16 = round_in(p)
        dp = mm(dout, v, adj_y=True)
        d_row = widen(ctx, dout) * widen(ctx, out)
        dsum = np.zeros(d_row.shape[:-1], f32)
        for j in range(d_row.shape[-1]):                  # sequential float32 (the order is assumed)
            dsum = (dsum + d_row[..., j]).astype(f32)
        ds16 = round_in(((dp - dsum[..., None]).astype(f32) * p).astype(f32))
        s1, s2 = q.shape[-2], k.shape[-2]
        dq = np.zeros(q.shape, f32)
        for j in range(0, s2, FAG_BLOCK):
            dq = (dq + mm(ds16[..., :, j:j + FAG_BLOCK], k[..., j:j + FAG_BLOCK, :])).astype(f32)
        dk = np.zeros(k.shape, f32)
        dv = np.zeros(v.shape, f32)
        for i in range(0, s1, FAG_BLOCK):
            dk = (dk + mm(ds16[..., i:i + FAG_BLOCK, :], q[..., i:i + FAG_BLOCK, :], adj_x=True)).astype(f32)
            dv = (dv + mm(p16[..., i:i + FAG_BLOCK, :], dout[..., i:i + FAG_BLOCK, :], adj_x=True)).astype(f32)
        dq = (dq * f32(scale_value)).astype(f32)
        dk = (dk * f32(scale_value)).astype(f32)
    outs = tuple(round_in(g) for g in (dq, dk, dv))
    ctx.record(status)
    return outs


#: GeluGrad's float32 constants (the TBE kernel's: 0.044715, sqrt(2/pi), 0.5 sqrt(2/pi) 3 0.044715, 0.5 sqrt(2/pi))
_GELU_CS, _GELU_SQ, _GELU_C4, _GELU_C5 = (np.float32(0.044715), np.float32(0.7978846), np.float32(0.0535161122),
                                          np.float32(0.3989422804))


@register("_GeluGrad", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/dynamic/gelu_grad.py (gelu_grad_compute, tanh_compute)",
     "hicann/ops-nn activation/gelu_grad"), ("op_model", "impl_mode"),
    "the tanh form's derivative, fp16 widened, the kernel's float32 steps and constants, one rounding"))
def gelu_grad(dy, x, y, *, ctx):
    """GeluGrad (the derivative of the tanh form, whatever the forward's ``approximate``; fp16 and float32): u =
    ((x x x) 0.044715 + x) sqrt(2/pi); t = tanh(u) as (u - e u) / ((e + 1) (|u| + 2^-126)) with e = exp(|u| * -2);
    g = (t + 1) 0.5 + ((x x) c4 + c5) ((-(t t) + 1) x); dx = dy g + y 0, each step float32 in the kernel's order,
    one rounding."""
    from ..numerics.vector import vector

    d, v, w = widen(ctx, dy), widen(ctx, x), widen(ctx, y)
    one = np.float32(1.0)
    with np.errstate(all="ignore"):
        u = ((((v * v) * v) * _GELU_CS + v) * _GELU_SQ).astype(np.float32)
        a = np.abs(u)
        e, st = vector("exp", (a * np.float32(-2.0)).astype(np.float32), dtype="float32",
                       overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals, op_model=ctx.op_model,
                       impl_mode=ctx.impl_mode)
        ctx.record(st)
        t = ((u - e * u) / ((e + one) * (a + np.float32(2.0 ** -126)))).astype(np.float32)
        r2 = ((v * v) * _GELU_C4 + _GELU_C5).astype(np.float32)
        r3 = (((t * t) * np.float32(-1.0) + one) * v).astype(np.float32)
        g = ((t + one) * np.float32(0.5) + r2 * r3).astype(np.float32)
        r = (d * g + w * np.float32(0.0)).astype(np.float32)
    return finish(ctx, r)
