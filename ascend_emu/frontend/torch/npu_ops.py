"""torch_npu's fused LLM ops as ``torch.library`` custom ops in namespace ``npu``: one op per call.

``torch.ops.npu.npu_rms_norm``, ``npu_rotary_mul``, ``npu_swiglu`` and ``npu_fusion_attention`` (the names
torch_npu registers them under), so a dispatch-level hook (``ae.torch.emulate``) sees each call as one op,
as the NPU runs one aclnn kernel, not the dozen aten ops a Python reference decomposes it into. Their CPU
implementation is that kernel's sourced math: every input widened to float32, the body in float32, one
rounding of the result to the input dtype (ASCEND-FACTS.md 13.4, 13.5; NUMERICS.md "torch_npu's fused ops").
The backward is float32 autograd of the same formula, rounded once to each input's dtype (the FA grad
kernel's own roundings, 13.5, are not modelled here).

Rounding of the outputs: RINT (ties to even, torch's own ``.to``) for RmsNorm, SwiGLU and RoPE; CAST_ROUND
(ties away from zero, :func:`ascend_emu.numerics.vector.cast`) for FlashAttentionScore's P and output.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch

from ...errors import AscendEmuError
from ...numerics.vector import cast as _ascend_cast

#: the ops, torch_npu's names (``torch.ops.npu.<name>``)
OPS = ("npu_rms_norm", "npu_rotary_mul", "npu_swiglu", "npu_fusion_attention")
_LOW = (torch.float16, torch.bfloat16, torch.float32)
#: FlashAttentionScore's masked score: -FLT_MAX, or -65504 on the fp16 path ([TF] flash_attention_score_common.h)
_MASKED = {torch.float16: -65504.0}
_FLT_MAX = float(np.finfo(np.float32).max)


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


def _half_interval_sum(sq: torch.Tensor) -> torch.Tensor:
    """The sum over the last axis as RmsNorm's ``ReduceSumHalfInterval`` folds it ([NN] norm/rms_norm/op_kernel/
    reduce_common.h): the tail past the largest power of two added onto the head, then halves added down to
    64 lanes, in float32; the final 64 lanes (the hardware's WholeReduceSum, whose order is not published)
    are summed pairwise in the same halving order."""
    n = sq.shape[-1]
    p = 1 << (n.bit_length() - 1) if n else 0
    if p and p < n:
        head, tail = sq[..., :p].clone(), sq[..., p:]
        head[..., :n - p] += tail
        sq = head
    while sq.shape[-1] > 1:
        h = sq.shape[-1] // 2
        sq = sq[..., :h] + sq[..., h:]
    return sq[..., 0] if n else sq.sum(-1)


# --------------------------------------------------------------------------- the float32 bodies

# IEEE float32 sqrt and division, correctly rounded: computed in float64 and rounded once (exact for these two
# operations, 53 >= 2*24 + 2 bits), since torch's vectorised float32 sqrt on the CPU is not always correctly
# rounded (measured: 1 ulp off on random inputs, torch 2.13)
def _sqrt32(x):
    return torch.sqrt(x.double()).float()


def _div32(a, b):
    return (a.double() / b.double()).float()


def _rms_norm32(x, gamma, eps):
    nd = gamma.dim()
    shape = x.shape[:x.dim() - nd] + (-1,)
    xf = x.float()
    sq = (xf * xf).reshape(shape)
    n = sq.shape[-1]
    mean = _half_interval_sum(sq) * torch.tensor(1.0 / n, dtype=torch.float32)
    rstd = _div32(torch.ones((), dtype=torch.float32), _sqrt32(mean + torch.tensor(eps, dtype=torch.float32)))
    rstd = rstd.reshape(x.shape[:x.dim() - nd] + (1,) * nd)
    return xf * rstd * gamma.float(), rstd


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rotary32(x, cos, sin):
    xf = x.float()
    return xf * cos.to(x.dtype).float() + _rotate_half(xf) * sin.to(x.dtype).float()


def _swiglu32(x, dim):
    a, b = x.float().chunk(2, dim=dim)
    # exp in float64 rounded to float32: a correctly rounded float32 exp (the kernel's Exp: NUMERICS.md)
    e = torch.exp(-a.double()).float()
    return _div32(a, 1.0 + e) * b


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


# --------------------------------------------------------------------------- the custom ops

@torch.library.custom_op("npu::npu_rms_norm", mutates_args=())
def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """aclnnRmsNorm: y = x * rstd * gamma in float32, rstd = 1/sqrt(mean(x^2) + eps); y rounded once (RINT) to
    x's dtype, rstd float32 (ASCEND-FACTS.md 13.4 item 1)."""
    _check_dtype("npu_rms_norm", self)
    y, rstd = _rms_norm32(self, gamma, epsilon)
    return y.to(self.dtype), rstd


@npu_rms_norm.register_fake
def _(self, gamma, epsilon=1e-6):
    nd = gamma.dim()
    return torch.empty_like(self), self.new_empty(self.shape[:self.dim() - nd] + (1,) * nd, dtype=torch.float32)


@torch.library.custom_op("npu::npu_rotary_mul", mutates_args=())
def npu_rotary_mul(self: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half") -> torch.Tensor:
    """aclnnRotaryPositionEmbedding: cos (r1) and sin (r2) cast to x's dtype, then x*cos + rotate_half(x)*sin
    in float32, one RINT rounding (13.5)."""
    _check_dtype("npu_rotary_mul", self)
    if rotary_mode != "half":
        raise AscendEmuError(f"torch_npu.npu_rotary_mul: rotary_mode {rotary_mode!r} is not emulated (only 'half')")
    return _rotary32(self, r1, r2).to(self.dtype)


@npu_rotary_mul.register_fake
def _(self, r1, r2, rotary_mode="half"):
    return torch.empty_like(self)


@torch.library.custom_op("npu::npu_swiglu", mutates_args=())
def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """aclnnSwiGlu: a, b = the two halves along ``dim``; a / (1 + exp(-a)) * b in float32, one RINT rounding
    (13.4 item 3)."""
    _check_dtype("npu_swiglu", self)
    return _swiglu32(self, dim).to(self.dtype)


@npu_swiglu.register_fake
def _(self, dim=-1):
    shape = list(self.shape)
    shape[dim] //= 2
    return self.new_empty(shape)


@torch.library.custom_op("npu::npu_fusion_attention", mutates_args=())
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


def _setup_save(ctx, inputs, output):
    ctx.save_for_backward(*[t for t in inputs if isinstance(t, torch.Tensor)])
    ctx.others = [None if isinstance(t, torch.Tensor) else t for t in inputs]


def _restore(ctx):
    saved = iter(ctx.saved_tensors)
    return [next(saved) if o is None else o for o in ctx.others]


def _rms_bwd(ctx, gy, grstd):
    x, gamma, eps = _restore(ctx)
    return _grads(lambda a, b: _rms_norm32(a, b, eps)[0], (x, gamma), (gy,)) + (None,)


def _rope_bwd(ctx, gy):
    x, r1, r2, _mode = _restore(ctx)
    return _grads(_rotary32, (x, r1, r2), (gy,)) + (None,)


def _swiglu_bwd(ctx, gy):
    x, dim = _restore(ctx)
    return _grads(lambda a: _swiglu32(a, dim), (x,), (gy,)) + (None,)


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


npu_rms_norm.register_autograd(_rms_bwd, setup_context=_setup_save)
npu_rotary_mul.register_autograd(_rope_bwd, setup_context=_setup_save)
npu_swiglu.register_autograd(_swiglu_bwd, setup_context=_setup_save)
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
    out, smax, ssum = torch.ops.npu.npu_fusion_attention(query, key, value, int(head_num), str(input_layout),
                                                         atten_mask, float(scale))
    return out, smax, ssum, query.new_empty((0,)), 0, 0, 0
