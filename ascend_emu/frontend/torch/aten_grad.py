"""The lowerings of the backward kernels torch_npu's autograd runs on the AI Core (aclnnSiluBackward,
aclnnLayerNormBackward, aclnnLogSoftmaxBackward, aclnnNLLLossBackward, aclnnGeluBackward, FlashAttentionScoreGrad):
entries of :data:`.aten.ATEN` like the others, kept apart by idea (their registry ops: ``ops/aclnn_grad_ops.py``;
NUMERICS.md section 16). Imported by the run (``npu/torch_run/run.py``), which registers them.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .aten import Fallback, _arg, _back, _cast_to, _cube_dtype, _emulated, _last, _out, aten, grad_kernel
from .aten_fused import _fa_stats, sdpa_mask_and_scale
from .convert import to_numpy


@aten("aten.silu_backward")
def silu_backward(k, dy, x):
    """aclnnSiluBackward: the SiluGrad kernel, float32 inside, one rounding (``_SiluGrad``)."""
    return grad_kernel(k, "_SiluGrad", dy, x)


@aten("aten.native_layer_norm_backward")
def native_layer_norm_backward(k, dy, x, shape, mean, rstd, weight, bias, output_mask):
    """aclnnLayerNormBackward: LayerNormGradV3 (the 910B's Ascend C kernel, ``_LayerNormGradV3``) on the rows of the
    normalised shape; pd_gamma and pd_beta float32, cast (rint) to the parameters' dtype."""
    if not _emulated(dy, x) or dy.dtype != x.dtype or k.aclnn_model() is None:
        raise Fallback("LayerNormGradV3 is the 910B's and later's kernel; the 910's TBE LayerNormGrad is not modelled")
    n = math.prod(shape)
    rows = x.numel() // max(n, 1)
    gamma = to_numpy(weight.reshape(-1)) if weight is not None else np.ones(n, np.float32)
    dx, dg, db = k.op("_LayerNormGradV3", to_numpy(dy.reshape(rows, n)), to_numpy(x.reshape(rows, n)),
                      to_numpy(rstd.float().reshape(rows)), to_numpy(mean.float().reshape(rows)), gamma)

    def param(g, p):
        if p is None:
            return None
        y = _cast_to(k, _out(g).reshape(p.shape), p.dtype) if p.dtype != torch.float32 else None
        return y if y is not None else _out(g).reshape(p.shape).to(p.dtype)
    return (_out(dx).reshape(x.shape) if output_mask[0] else None,
            param(dg, weight) if output_mask[1] else None,
            param(db, bias) if output_mask[2] else None)


@aten("aten._log_softmax_backward_data")
def log_softmax_backward(k, dy, y, dim, input_dtype):
    """aclnnLogSoftmaxBackward: the LogSoftmaxGrad kernel (fp16 and float32; ``_LogSoftmaxGrad``) on the last axis."""
    if not _emulated(dy, y) or dy.dtype != y.dtype or dy.dtype == torch.bfloat16:
        raise Fallback("LogSoftmaxGrad takes float16 and float32 of one dtype")
    g, d = _last(dy, dim)
    yy, _ = _last(y, dim)
    (dx,) = k.op("_LogSoftmaxGrad", g, yy)
    dx = _out(_back(dx, d))
    return dx if dx.dtype == input_dtype else _out(k.cast(to_numpy(dx), str(input_dtype)[6:]))


@aten("aten.nll_loss_backward")
def nll_loss_backward(k, dy, x, target, weight, reduction, ignore_index, total_weight):
    """aclnnNLLLossBackward: the NLLLossGrad kernel on (N, C) float32 scores (``_NLLLossGrad``); torch's reduction
    codes 0 none, 1 mean, 2 sum."""
    if x.dim() != 2 or x.dtype != torch.float32 or dy.dtype != torch.float32:
        raise Fallback("NLLLossGrad takes 2-D float32 scores")
    t = to_numpy(target)
    if ((t == ignore_index) & (t >= 0) & (t < x.shape[1])).any():
        raise Fallback("an ignored target inside the classes")
    w = to_numpy(weight.float()) if weight is not None else np.ones(x.shape[1], np.float32)
    red = {0: "none", 1: "mean", 2: "sum"}[int(reduction)]
    (dx,) = k.op("_NLLLossGrad", to_numpy(x), to_numpy(dy.reshape(-1)), t, w, to_numpy(total_weight.reshape(-1)),
                 reduction=red)
    return _out(dx)


@aten("aten.gelu_backward")
def gelu_backward(k, dy, x, approximate="none"):
    """aclnnGeluBackward: the GeluGrad kernel, the tanh form's derivative whatever ``approximate`` says (as the
    forward's aclnnGelu; ``_GeluGrad``); with the compatible-implementation switch the AI CPU's exact form."""
    if k.options.compatible_impl:
        raise Fallback("compatible impl: aclnnGeluBackwardV2's form as asked is not modelled")
    if not _emulated(dy, x) or dy.dtype != x.dtype or dy.dtype == torch.bfloat16:
        raise Fallback("GeluGrad takes float16 and float32 of one dtype")
    k.note(f"GeluGrad: the tanh form's derivative (approximate={approximate!r} is not read)")
    a = to_numpy(x)
    # the kernel's y enters only as y * 0; aten.gelu_backward does not give it: zeros
    (g,) = k.op("_GeluGrad", to_numpy(dy), a, np.zeros_like(a))
    return _out(g)


@aten("aten._scaled_dot_product_flash_attention_for_cpu_backward")
def sdpa_flash_backward(k, dout, q, key, v, out, lse, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """FlashAttentionScoreGrad (the 910B's arch22 kernel, ``_FlashAttentionScoreGrad``) on the forward's softmax max
    and sum; the mask as the forward's (13.5)."""
    saved = _fa_stats(k).get(lse)
    if saved is None:
        raise Fallback("the forward's softmax max and sum are not known (its FlashAttentionScore did not run here)")
    if dropout_p or q.dim() != 4 or not _emulated(dout, q, key, v) or not k.fa_available():
        raise Fallback("FlashAttentionScoreGrad covers 4-D BNSD inputs without dropout on the 910B")
    s, sq, skv, mask = sdpa_mask_and_scale(q, key, is_causal, attn_mask, scale)
    dt = _cube_dtype(dout, q, key, v)
    dq, dk, dv = k.op("_FlashAttentionScoreGrad", _arg(q, dt), _arg(key, dt), _arg(v, dt), _arg(dout, dt),
                      _arg(out, dt), saved[0], saved[1],
                      *(() if mask is None else (np.broadcast_to(mask, q.shape[:-2] + (sq, skv)),)),
                      family="matmul", scale_value=s, has_mask=mask is not None)
    return _out(dq), _out(dk), _out(dv)
