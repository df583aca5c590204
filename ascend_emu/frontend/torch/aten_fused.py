"""The lowerings of the fused kernels, entries of :data:`.aten.ATEN` kept apart by idea: scaled dot-product
attention and torch_npu's ``npu_fusion_attention`` as FlashAttentionScore (ASCEND-FACTS.md 13.5), and torch_npu's
``npu_rms_norm``, ``npu_swiglu``, ``npu_rotary_mul`` (the ``torch.ops.ascend_emu`` ops of :mod:`.npu_ops`; 13.4,
13.5). They register on import: the run (``npu/torch_run/run.py``) and the .pt2 loader import this module, and the
.pt2 tracer swaps this module's conversions as it swaps aten's (``pt2/trace.py``). NUMERICS.md sections 16, 17.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch.utils.weak import WeakIdKeyDictionary

from .aten import Fallback, _arg, _cube_dtype, _emulated, _out, aten
from .convert import from_numpy, to_numpy
from .npu_attention import _bnsd, _from_bnsd


# -- attention (Ascend910B: FlashAttentionScore; ASCEND-FACTS 13.5) ---------------------------------------------
def sdpa_mask_and_scale(q, key, is_causal, attn_mask, scale):
    """SDPA's arguments as FlashAttentionScore (and its grad) take them: (scale, S1, S2, the dropped-positions mask
    or None)."""
    s = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    sq, skv = q.shape[-2], key.shape[-2]
    mask = None
    if is_causal:
        # SDPA's causal mask keeps j <= i; FlashAttentionScore's atten_mask marks the dropped positions
        mask = np.triu(np.ones((sq, skv), bool), 1)
    elif attn_mask is not None:
        mask = ~to_numpy(attn_mask)
    return s, sq, skv, mask


@aten("aten._scaled_dot_product_flash_attention_for_cpu")
def sdpa_flash(k, q, key, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if dropout_p or q.dim() != 4 or not _emulated(q, key, v) or not k.fa_available():
        raise Fallback("FlashAttentionScore covers 4-D BNSD inputs without dropout on the 910B")
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise Fallback("a float attention mask")
    s, sq, skv, mask = sdpa_mask_and_scale(q, key, is_causal, attn_mask, scale)
    dt = _cube_dtype(q, key, v)
    stats = k.keeps_backward_stats
    o, lse, *m_l = k.op("_FlashAttentionScore", _arg(q, dt), _arg(key, dt), _arg(v, dt),
                        *(() if mask is None else (np.broadcast_to(mask, q.shape[:-2] + (sq, skv)),)),
                        family="matmul", scale_value=s, has_mask=mask is not None,
                        kv_block=k.numerics.fa_kv_block, with_stats=stats)
    # the CPU kernel's second output is the logsumexp (B, N, S) torch's backward reads; FlashAttentionScoreGrad
    # reads the kernel's softmax_max and softmax_sum instead: kept for the backward, keyed by that tensor
    lse = from_numpy(lse.astype(np.float32)).to(torch.float32)
    if stats:
        _fa_stats(k)[lse] = tuple(m_l)   # dropped with the tensor (autograd frees it after the backward)
    return _out(o), lse


def _fa_stats(k):
    """FlashAttentionScore's softmax max and sum per logsumexp tensor, weakly keyed (a forward without a backward
    leaves nothing behind)."""
    table = k.stash.get("flash_attention_stats")
    if table is None:
        table = k.stash["flash_attention_stats"] = WeakIdKeyDictionary()
    return table


@aten("ascend_emu.npu_fusion_attention")
def npu_fusion_attention(k, query, key, value, head_num, input_layout, atten_mask=None, scale=1.0):
    """torch_npu.npu_fusion_attention (frontend/torch/npu_attention.py): aclnnFlashAttentionScore on the BNSD form
    of its layout (exact transposes), atten_mask as it is (True = dropped, the kernel's own convention; 13.5).
    The registry's kernel gives the logsumexp, not the row max and sum the kernel also outputs: softmax_max is the
    row max of the scaled, masked float32 scores (recomputed), softmax_sum exp(logsumexp - max) in float32
    (NUMERICS.md section 17)."""
    if not _emulated(query, key, value) or not k.fa_available():
        raise Fallback("FlashAttentionScore runs 16-bit and float32 inputs on the 910B and later")
    q, kk, v = (_bnsd(t, input_layout, head_num) for t in (query, key, value))
    if kk.shape[1] != q.shape[1]:     # grouped-query attention: the key/value heads shared (an exact copy)
        rep = q.shape[1] // kk.shape[1]
        kk, v = kk.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    sq, skv = q.shape[-2], kk.shape[-2]
    mask = None if atten_mask is None else np.broadcast_to(to_numpy(atten_mask).astype(bool),
                                                            q.shape[:-2] + (sq, skv))
    dt = _cube_dtype(q, kk, v)
    o, lse = k.op("_FlashAttentionScore", _arg(q, dt), _arg(kk, dt), _arg(v, dt),
                  *(() if mask is None else (mask,)), family="matmul", scale_value=float(scale),
                  has_mask=mask is not None, kv_block=k.numerics.fa_kv_block)
    with np.errstate(all="ignore"):
        sc = np.matmul(_arg(q, dt).astype(np.float32), np.swapaxes(_arg(kk, dt).astype(np.float32), -1, -2))
        sc = (sc * np.float32(scale)).astype(np.float32)
        if mask is not None:
            sc = np.where(mask, np.float32(-np.finfo(np.float32).max), sc)
        m = sc.max(-1).astype(np.float32)
        total = np.exp(lse.astype(np.float64) - m).astype(np.float32)
    row = lambda a: from_numpy(np.ascontiguousarray(np.broadcast_to(a[..., None], a.shape + (8,))))  # noqa: E731
    return _from_bnsd(_out(o), input_layout), row(m), row(total)


# -- torch_npu's fused kernels (frontend/torch/npu_ops.py; ASCEND-FACTS 13.4, 13.5) ------------------------------
@aten("ascend_emu.npu_rms_norm")
def npu_rms_norm(k, x, gamma, epsilon=1e-6):
    if not _emulated(x):
        raise Fallback(f"{x.dtype} input")
    y, rstd = k.op("_RmsNorm", to_numpy(x), to_numpy(gamma), epsilon=float(epsilon))
    return _out(y), _out(rstd)


@aten("ascend_emu.npu_swiglu")
def npu_swiglu(k, x, dim=-1):
    if not _emulated(x):
        raise Fallback(f"{x.dtype} input")
    (y,) = k.op("_SwiGlu", to_numpy(x), dim=int(dim))
    return _out(y)


@aten("ascend_emu.npu_rotary_mul")
def npu_rotary_mul(k, x, cos, sin):
    """aclnnRotaryPositionEmbedding: cos and sin cast to x's dtype first (13.5, RotaryMulKernelNpuOpApi.cpp)."""
    if not _emulated(x):
        raise Fallback(f"{x.dtype} input")
    (y,) = k.op("_RotaryMul", to_numpy(x), _arg(cos, x.dtype), _arg(sin, x.dtype))
    return _out(y)
