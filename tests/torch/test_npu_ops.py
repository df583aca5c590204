"""torch_npu's fused LLM ops as torch.library custom ops (namespace npu): each is one op at the dispatcher, and its
CPU result is the kernel's float32 math rounded once, bit for bit against numpy oracles written from the cited
definitions (ASCEND-FACTS.md 13.4, 13.5), on fresh random inputs in float16, bfloat16 and float32."""
import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from ascend_emu.errors import AscendEmuError  # noqa: E402
from ascend_emu.frontend.torch import npu_ops  # noqa: E402

DTYPES = {torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16, torch.float32: np.float32}


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


# --------------------------------------------------------------------------- oracles (numpy, float32 steps)

def oracle_rms_norm(x, g, eps):
    """[NN] rms_norm.h: x -> fp32, x^2, ReduceSumHalfInterval (tail folded onto the largest power of two, then
    halves), * (1/N), rstd = 1/sqrt(. + eps), y = x * rstd * gamma in fp32, one RNE cast."""
    x32, g32 = x.astype(np.float32), g.astype(np.float32)
    sq = (x32 * x32).reshape(x.shape[:-1] + (-1,))
    n = sq.shape[-1]
    p = 1
    while p * 2 <= n:
        p *= 2
    acc = sq[..., :p].copy()
    acc[..., :n - p] = acc[..., :n - p] + sq[..., p:]
    while acc.shape[-1] > 1:
        h = acc.shape[-1] // 2
        acc = acc[..., :h] + acc[..., h:]
    mean = acc[..., 0] * np.float32(1.0 / n)
    rstd = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    y = (x32 * rstd[..., None]) * g32
    return y.astype(x.dtype), rstd[..., None]


def oracle_rope(x, c, s):
    x32 = x.astype(np.float32)
    c32, s32 = c.astype(x.dtype).astype(np.float32), s.astype(x.dtype).astype(np.float32)
    h = x.shape[-1] // 2
    rot = np.concatenate([-x32[..., h:], x32[..., :h]], axis=-1)
    return (x32 * c32 + rot * s32).astype(x.dtype)


def oracle_swiglu(x):
    a, b = np.split(x.astype(np.float32), 2, axis=-1)
    e = np.exp(-a.astype(np.float64)).astype(np.float32)
    return (a / (np.float32(1) + e) * b).astype(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [64, 96, 200])
def test_rms_norm_bit_exact(dtype, d):
    x, g = rand((3, 5, d), dtype, 1 + d), rand((d,), dtype, 2 + d, 0.5)
    y, rstd = torch.ops.npu.npu_rms_norm(x, g, 1e-6)
    oy, orstd = oracle_rms_norm(to_np(x), to_np(g), 1e-6)
    assert y.dtype == dtype and rstd.dtype == torch.float32 and rstd.shape == (3, 5, 1)
    assert np.array_equal(bits(to_np(y)), bits(oy)) and np.array_equal(bits(to_np(rstd)), bits(orstd))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_rotary_mul_and_swiglu_bit_exact(dtype):
    x = rand((2, 7, 3, 16), dtype, 3)
    c, s = rand((1, 7, 1, 16), torch.float32, 4), rand((1, 7, 1, 16), torch.float32, 5)
    y = torch.ops.npu.npu_rotary_mul(x, c, s)
    assert y.dtype == dtype and np.array_equal(bits(to_np(y)), bits(oracle_rope(to_np(x), to_np(c), to_np(s))))
    z = rand((4, 6, 32), dtype, 6, 3.0)
    w = torch.ops.npu.npu_swiglu(z, -1)
    assert w.shape == (4, 6, 16) and np.array_equal(bits(to_np(w)), bits(oracle_swiglu(to_np(z))))


def test_one_rounding_differs_from_the_decomposed_reference():
    """The HF LLaMA reference rounds to bf16 after each step; the kernel rounds once: they must differ somewhere."""
    x, g = rand((64, 128), torch.bfloat16, 7), rand((128,), torch.bfloat16, 8)
    y, _ = torch.ops.npu.npu_rms_norm(x, g)
    var = x.float().pow(2).mean(-1, keepdim=True)
    ref = g * (x.float() * torch.rsqrt(var + 1e-6)).to(torch.bfloat16)
    assert not torch.equal(y, ref)


def test_round_away_on_midpoints():
    """FlashAttention's CAST_ROUND: exact midpoints between two fp16 / bf16 values go away from zero."""
    lo = np.array([1.0, 2.0 ** -14, 1000.0, -3.5], np.float16)
    mid16 = (lo.astype(np.float64) + np.nextafter(lo, np.float16(np.inf * np.sign(lo))).astype(np.float64)) / 2
    r = to_np(npu_ops._round_away(torch.tensor(mid16, dtype=torch.float32), torch.float16))
    assert np.array_equal(r, np.nextafter(lo, np.float16(np.inf * np.sign(lo))))
    assert np.array_equal(to_np(torch.tensor(mid16, dtype=torch.float32).to(torch.float16))[[0]], lo[[0]])  # RNE: even
    b = np.array([1.0, -1.5], np.float32).view(np.uint32) + np.uint32(0x8000)   # exact bf16 midpoints
    r = to_np(npu_ops._round_away(torch.from_numpy(b.view(np.float32)), torch.bfloat16))
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
    out, smax, ssum, sout, seed, off, numels = npu_ops.fusion_attention(to(q), to(k), to(v), n, layout,
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

    x, g = rand((4, 32), torch.bfloat16, 20), rand((32,), torch.bfloat16, 21)
    with Record():
        torch.ops.npu.npu_rms_norm(x, g)
        torch.ops.npu.npu_swiglu(x)
    assert seen == ["npu.npu_rms_norm.default", "npu.npu_swiglu.default"]


def test_backward_runs_and_refusals():
    x = rand((3, 16), torch.float16, 30).requires_grad_()
    g = rand((16,), torch.float16, 31).requires_grad_()
    y, _ = torch.ops.npu.npu_rms_norm(x, g)
    y.float().sum().backward()
    assert x.grad.dtype == torch.float16 and g.grad.shape == (16,) and torch.isfinite(x.grad).all()
    with pytest.raises(AscendEmuError, match="torch.int32 input is not supported"):
        torch.ops.npu.npu_swiglu(torch.ones(4, 4, dtype=torch.int32))
    q = rand((1, 1, 4, 8), torch.float16, 32)
    with pytest.raises(AscendEmuError, match="keep_prob < 1 \\(dropout\\) is not emulated"):
        npu_ops.fusion_attention(q, q, q, 1, "BNSD", keep_prob=0.9)
