"""torch_npu's npu_fusion_attention as the torch op ``torch.ops.ascend_emu.npu_fusion_attention``: one op at the
dispatcher, torch_npu's signature and results, the inverted mask, CAST_ROUND (ties away) on P and the output
(ASCEND-FACTS.md 13.5; NUMERICS.md section 17); under ae.torch.emulate one FlashAttentionScore kernel."""
import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import ascend_emu as ae  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402
from ascend_emu.frontend.torch import npu_attention  # noqa: E402


def to_np(t):
    if t.dtype == torch.bfloat16:
        return t.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.detach().numpy()


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def rand(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def test_round_away_on_midpoints():
    """FlashAttention's CAST_ROUND: exact midpoints between two fp16 / bf16 values go away from zero."""
    lo = np.array([1.0, 2.0 ** -14, 1000.0, -3.5], np.float16)
    mid16 = (lo.astype(np.float64) + np.nextafter(lo, np.float16(np.inf * np.sign(lo))).astype(np.float64)) / 2
    r = to_np(npu_attention._round_away(torch.tensor(mid16, dtype=torch.float32), torch.float16))
    assert np.array_equal(r, np.nextafter(lo, np.float16(np.inf * np.sign(lo))))
    assert np.array_equal(to_np(torch.tensor(mid16, dtype=torch.float32).to(torch.float16))[[0]], lo[[0]])  # RNE: even
    b = np.array([1.0, -1.5], np.float32).view(np.uint32) + np.uint32(0x8000)   # exact bf16 midpoints
    r = to_np(npu_attention._round_away(torch.from_numpy(b.view(np.float32)), torch.bfloat16))
    assert np.array_equal(r.view(np.uint16), ((b + np.uint32(0x8000)) >> np.uint32(16)).astype(np.uint16))


def oracle_attention(q, k, v, mask, scale):
    """float64 softmax(scale * QK^T, masked) V, the masked positions those where mask is True (torch_npu's)."""
    s = np.einsum("bnsd,bntd->bnst", q.astype(np.float64), k.astype(np.float64)) * scale
    s = np.where(mask, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bnst,bntd->bnsd", p / p.sum(-1, keepdims=True), v.astype(np.float64))


@pytest.mark.parametrize("layout", ["BNSD", "BSH"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fusion_attention_inverted_mask(layout, dtype):
    b, n, s, d = 2, 2, 9, 16
    q, k, v = (rand((b, n, s, d), dtype, i) for i in (10, 11, 12))
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)      # True = masked out (torch_npu)
    to = (lambda t: t.transpose(1, 2).reshape(b, s, n * d)) if layout == "BSH" else (lambda t: t)
    out, smax, ssum, sout, seed, off, numels = npu_attention.fusion_attention(to(q), to(k), to(v), n, layout,
                                                                         atten_mask=causal, scale=d ** -0.5)
    assert out.dtype == dtype and smax.shape == ssum.shape == (b, n, s, 8) and smax.dtype == torch.float32
    assert (seed, off, numels) == (0, 0, 0) and sout.numel() == 0
    if layout == "BSH":
        out = out.reshape(b, s, n, d).transpose(1, 2)
    ref = oracle_attention(to_np(q), to_np(k), to_np(v), causal.numpy(), d ** -0.5)
    ulp = 2.0 ** -10 if dtype == torch.float16 else 2.0 ** -7
    assert np.max(np.abs(out.float().numpy() - ref)) <= 4 * ulp
    # SDPA's bool mask means the opposite (True = attend): the same result from the inverted mask
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=~causal,
                                                            scale=d ** -0.5)
    assert torch.max(torch.abs(sdpa - out.float())) <= 4 * ulp


def test_one_op_per_call_at_the_dispatcher():
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    q = rand((1, 2, 4, 8), torch.float16, 20)
    with Record():
        npu_attention.fusion_attention(q, q, q, 2, "BNSD", scale=0.3)
    assert seen == ["ascend_emu.npu_fusion_attention.default", "aten.new_empty.default"]   # + the empty softmax_out


def test_backward_and_refusals():
    q = rand((1, 2, 6, 8), torch.float16, 30).requires_grad_()
    out = npu_attention.fusion_attention(q, q, q, 2, "BNSD", scale=0.3)[0]
    out.float().sum().backward()
    assert q.grad.dtype == torch.float16 and torch.isfinite(q.grad).all()
    with pytest.raises(AscendEmuError, match="torch.int32 input is not supported"):
        npu_attention.fusion_attention(*(torch.ones(1, 1, 2, 2, dtype=torch.int32),) * 3, 1, "BNSD")
    with pytest.raises(AscendEmuError, match="keep_prob < 1 \\(dropout\\) is not emulated"):
        npu_attention.fusion_attention(q, q, q, 2, "BNSD", keep_prob=0.9)
    with pytest.raises(AscendEmuError, match="input_layout 'TND' is not supported"):
        npu_attention.fusion_attention(q, q, q, 2, "TND")


@pytest.mark.parametrize("layout", ["BNSD", "BSH"])
def test_one_flash_attention_kernel_under_emulate(layout):
    b, n, s, d = 1, 2, 8, 16
    q, k, v = (rand((b, n, s, d), torch.float16, i) for i in (40, 41, 42))
    to = (lambda t: t.transpose(1, 2).reshape(b, s, n * d)) if layout == "BSH" else (lambda t: t)
    qi = to(q).clone().requires_grad_()
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
    with ae.torch.emulate(soc="Ascend910B") as run:
        out, smax, ssum = npu_attention.fusion_attention(qi, to(k), to(v), n, layout, atten_mask=causal,
                                                         scale=d ** -0.5)[:3]
        out.float().sum().backward()
    [rec] = [r for r in run.records if "npu_fusion_attention" in r.name]
    assert rec.name == "NPU.npu_fusion_attention.0.forward" and rec.engine == "AICORE"
    assert "_FlashAttentionScore" in rec.op_types
    assert any(r.phase == "backward" for r in run.records) and torch.isfinite(qi.grad).all()
    if layout == "BSH":
        out = out.reshape(b, s, n, d).transpose(1, 2)
    ref = oracle_attention(to_np(q), to_np(k), to_np(v), causal.numpy(), d ** -0.5)
    assert np.max(np.abs(out.detach().float().numpy() - ref)) <= 4 * 2.0 ** -10
    # softmax_max / softmax_sum: the row max and the sum of exp(s - max), as the kernel outputs them
    s64 = np.einsum("bnsd,bntd->bnst", to_np(q).astype(np.float64), to_np(k).astype(np.float64)) * d ** -0.5
    s64 = np.where(causal.numpy(), -np.inf, s64)
    m = s64.max(-1)
    assert smax.shape == ssum.shape == (b, n, s, 8) and smax.dtype == ssum.dtype == torch.float32
    assert np.allclose(smax[..., 3].detach().numpy(), m, rtol=1e-5, atol=1e-5)
    assert np.allclose(ssum[..., 0].detach().numpy(), np.exp(s64 - m[..., None]).sum(-1), rtol=1e-4)
