"""torch_npu's ``npu_fusion_attention`` as the torch op ``torch.ops.ascend_emu.npu_fusion_attention``: one op per call.

A dispatch-level hook (``ae.torch.emulate``) sees each call as one op, as the NPU runs one aclnn kernel
(aclnnFlashAttentionScore, ASCEND-FACTS.md 13.5), and runs it as the registry's ``_FlashAttentionScore``
(the aten table's entry). Outside a run (and in the float32 reference) the op computes the kernel's steps over the
whole row in one block: S = QK^T in float32, scaled after the product, masked positions (True = masked out) to
-FLT_MAX (-65504 for fp16), softmax in float32, P rounded ties away (CAST_ROUND) to the input dtype before P.V
(float32 accumulation), divided by the row sum at the end, the output rounded ties away. The backward is float32
autograd of the same formula, rounded once to each input's dtype (the FA grad kernel's own roundings are not
modelled). NUMERICS.md section 17.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch

from ...errors import AscendEmuError
from ...numerics.vector import cast as _ascend_cast

_LOW = (torch.float16, torch.bfloat16, torch.float32)
#: FlashAttentionScore's masked score: -FLT_MAX, or -65504 on the fp16 path ([TF] flash_attention_score_common.h)
_MASKED = {torch.float16: -65504.0}
_FLT_MAX = float(np.finfo(np.float32).max)
#: the layouts torch_npu's input_layout names that are transposes of BNSD
LAYOUTS = ("BNSD", "BSND", "BSH", "SBH")


def _check_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in _LOW:
        raise AscendEmuError(f"torch_npu.{name}: {t.dtype} input is not supported (float16, bfloat16 or float32)")


def _round_away(x32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 -> ``dtype`` with CAST_ROUND (nearest, ties away from zero), as the Ascend vector unit casts."""
    if dtype == torch.float32:
        return x32
    a = x32.detach().contiguous().numpy()
    y, _status = _ascend_cast(a, "float16" if dtype == torch.float16 else "bfloat16", rounding="round")
    y = np.ascontiguousarray(y)
    if dtype == torch.float16:
        return torch.from_numpy(y.view(np.float16))
    return torch.from_numpy(y.view(ml_dtypes.bfloat16).view(np.int16)).view(torch.bfloat16)


def _div32(a, b):
    """IEEE float32 division, correctly rounded: in float64, rounded once (exact for a division)."""
    return (a.double() / b.double()).float()


def _bnsd(t, layout, head_num):
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        b, s, h = t.shape
        return t.reshape(b, s, head_num, h // head_num).transpose(1, 2)
    if layout == "SBH":
        s, b, h = t.shape
        return t.reshape(s, b, head_num, h // head_num).permute(1, 2, 0, 3)
    raise AscendEmuError(f"torch_npu.npu_fusion_attention: input_layout {layout!r} is not supported here "
                         "(BNSD, BSND, BSH or SBH; TND needs actual_seq_qlen)")


def _from_bnsd(o, layout):
    if layout == "BNSD":
        return o
    if layout == "BSND":
        return o.transpose(1, 2).contiguous()
    if layout == "BSH":
        b, n, s, d = o.shape
        return o.transpose(1, 2).reshape(b, s, n * d)
    s = o.shape[2]
    return o.permute(2, 0, 1, 3).reshape(s, o.shape[0], -1)


def _attention32(q, k, v, mask, scale, dtype):
    """FlashAttentionScore's float32 body on BNSD tensors: S = QK^T in float32, scaled after the product, masked
    positions (mask True = masked out) to -FLT_MAX (-65504 on the fp16 path), softmax in float32, P rounded
    ties-away to the input dtype before P.V (float32 accumulation), O divided by the row sum at the end."""
    qf, kf, vf = q.float(), k.float(), v.float()
    if kf.shape[1] != qf.shape[1]:    # grouped-query attention: key/value heads shared
        rep = qf.shape[1] // kf.shape[1]
        kf, vf = kf.repeat_interleave(rep, dim=1), vf.repeat_interleave(rep, dim=1)
    s = torch.matmul(qf, kf.transpose(-1, -2)) * torch.tensor(scale, dtype=torch.float32)
    if mask is not None:
        s = s.masked_fill(mask.to(torch.bool), _MASKED.get(dtype, -_FLT_MAX))
    m = s.amax(-1, keepdim=True)
    p = torch.exp((s - m).double()).float()
    l_ = p.sum(-1, keepdim=True)
    p_low = _round_away(p, dtype).float()
    o = _div32(torch.matmul(p_low, vf), l_)
    return o, m, l_


# --------------------------------------------------------------------------- the op

@torch.library.custom_op("ascend_emu::npu_fusion_attention", mutates_args=())
def npu_fusion_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int,
                         input_layout: str, atten_mask: torch.Tensor | None = None, scale: float = 1.0
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aclnnFlashAttentionScore (13.5): attention_out (input dtype, ties-away), softmax_max and softmax_sum
    (float32, [B, N, Sq, 8])."""
    _check_dtype("npu_fusion_attention", query)
    q, k, v = (_bnsd(t, input_layout, head_num) for t in (query, key, value))
    mask = atten_mask
    o, m, l_ = _attention32(q, k, v, mask, scale, query.dtype)
    out = _from_bnsd(_round_away(o, query.dtype), input_layout)
    return out, m.expand(*m.shape[:-1], 8).contiguous(), l_.expand(*l_.shape[:-1], 8).contiguous()


@npu_fusion_attention.register_fake
def _(query, key, value, head_num, input_layout, atten_mask=None, scale=1.0):
    q = _bnsd(query, input_layout, head_num)
    st = q.new_empty(q.shape[:3] + (8,), dtype=torch.float32)
    return torch.empty_like(query), st, st.clone()


# --------------------------------------------------------------------------- backward: float32 autograd, one rounding

def _grads(fn, inputs, grads):
    """d(fn(inputs)) / d(inputs) in float32 for the given output gradients, each rounded once to its input's dtype."""
    with torch.enable_grad():
        xs = [t.detach().float().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
              for t in inputs]
        outs = fn(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        pairs = [(o, g.float()) for o, g in zip(outs, grads) if g is not None]
        diff = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
        got = torch.autograd.grad([o for o, _ in pairs], diff, [g for _, g in pairs], allow_unused=True)
    it = iter(got)
    out = []
    for t, x in zip(inputs, xs):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            g = next(it)
            out.append(None if g is None else g.to(t.dtype))
        else:
            out.append(None)
    return tuple(out)


def _fa_save(ctx, inputs, output):
    q, k, v, head_num, layout, mask, scale = inputs
    ctx.save_for_backward(q, k, v, *([mask] if mask is not None else []))
    ctx.others = [None, None, None, head_num, layout, None, scale]


def _fa_bwd_wrapped(ctx, go, gmax, gsum):
    saved = list(ctx.saved_tensors)
    q, k, v = saved[:3]
    mask = saved[3] if len(saved) > 3 else None
    _, _, _, head_num, layout, _, scale = ctx.others

    def f(qf, kf, vf):
        o, _, _ = _attention32(_bnsd(qf, layout, head_num), _bnsd(kf, layout, head_num),
                               _bnsd(vf, layout, head_num), mask, scale, torch.float32)
        return _from_bnsd(o, layout)
    return _grads(f, (q, k, v), (go,)) + (None,) * 4


npu_fusion_attention.register_autograd(_fa_bwd_wrapped, setup_context=_fa_save)


def fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                     scale=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0,
                     prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                     gen_mask_parallel=True, sync=False):
    """``torch_npu.npu_fusion_attention``'s Python signature and 7 results (attention_out, softmax_max,
    softmax_sum, softmax_out, seed, offset, numels) over :func:`npu_fusion_attention`. What is not emulated
    (pse, dropout, token windows, sparse modes, variable lengths) is refused in one line."""
    for what, bad in (("pse", pse is not None), ("padding_mask", padding_mask is not None),
                      ("keep_prob < 1 (dropout)", keep_prob != 1.0),
                      ("pre_tockens/next_tockens", pre_tockens != 2147483647 or next_tockens != 2147483647),
                      ("prefix", prefix is not None), ("actual_seq_qlen/kvlen", actual_seq_qlen is not None
                                                       or actual_seq_kvlen is not None),
                      ("sparse_mode != 0", sparse_mode != 0)):
        if bad:
            raise AscendEmuError(f"torch_npu.npu_fusion_attention: {what} is not emulated; call it without")
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise AscendEmuError(f"torch_npu.npu_fusion_attention: scale must be a finite number, got {scale!r}")
    out, smax, ssum = torch.ops.ascend_emu.npu_fusion_attention(query, key, value, int(head_num), str(input_layout),
                                                         atten_mask, float(scale))
    return out, smax, ssum, query.new_empty((0,)), 0, 0, 0
