"""The eager door's backward kernels on the AI Core (NUMERICS.md section 16): silu, log_softmax, nll_loss and
LayerNorm backward run the registry's _SiluGrad, _LogSoftmaxGrad, _NLLLossGrad and _LayerNormGradV3 (the CANN
kernels, step by step: tests/ops/test_aclnn_grad_ops.py), recorded as AI Core calls; in fp32 mode the gradients are
torch float32's within float32 rounding."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import ascend_emu as ae  # noqa: E402
from ascend_emu.ops import OpContext, run_op  # noqa: E402

BACKWARD = {"aten.silu_backward.default": "_SiluGrad", "aten._log_softmax_backward_data.default": "_LogSoftmaxGrad",
            "aten.nll_loss_backward.default": "_NLLLossGrad",
            "aten.native_layer_norm_backward.default": "_LayerNormGradV3"}


class Block(torch.nn.Module):
    """LayerNorm, a SiLU MLP and a cross-entropy head: every backward kernel of this file."""

    def __init__(self, d=48, c=7):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 64)
        self.fc2 = torch.nn.Linear(64, c)

    def forward(self, x):
        return self.fc2(F.silu(self.fc1(self.ln(x))))


def _grads(run_ctx, m, x, y):
    m.zero_grad()
    with run_ctx as run:
        loss = F.cross_entropy(m(x), y)
        loss.backward()
    return run, {n: p.grad.clone() for n, p in m.named_parameters()}


def test_backward_ops_on_the_ai_core_match_torch_float32():
    torch.manual_seed(0)
    m = Block()
    x, y = torch.randn(16, 48) * 2 + 0.5, torch.randint(0, 7, (16,))
    run, got = _grads(ae.torch.emulate("Ascend910B"), m, x, y)
    m.zero_grad()
    F.cross_entropy(m(x), y).backward()
    for n, p in m.named_parameters():
        assert torch.allclose(got[n], p.grad, rtol=1e-4, atol=1e-6), n
    recs = {r.aten: r for r in run.records if r.phase == "backward"}
    for aten, op in BACKWARD.items():
        assert recs[aten].engine == "AICORE" and recs[aten].op_types == [op], aten
        assert recs[aten].name.endswith(".backward")


def test_fp16_silu_and_log_softmax_backward_are_the_kernels():
    """In fp16 the recorded gradients are the kernels' own bits (the registry op on the same inputs)."""
    torch.manual_seed(1)
    x = (torch.randn(8, 40) * 3).half().requires_grad_()
    g = torch.randn(8, 40).half()
    with ae.torch.emulate("Ascend910B"):
        y = F.silu(x)
        (dx,) = torch.autograd.grad(y, x, g)
        z = F.log_softmax(x, -1)
        (dz,) = torch.autograd.grad(z, x, g)
    ctx = OpContext(dtype="float16", op_model="ascendc")
    (want,) = run_op("_SiluGrad", g.numpy(), x.detach().numpy(), ctx=ctx)
    assert np.array_equal(dx.numpy().view(np.uint16), want.view(np.uint16))
    (want,) = run_op("_LogSoftmaxGrad", g.numpy(), z.detach().numpy(), ctx=OpContext(dtype="float16"))
    assert np.array_equal(dz.numpy().view(np.uint16), want.view(np.uint16))


def test_layer_norm_backward_stays_on_the_aicpu_on_the_910():
    torch.manual_seed(2)
    m = torch.nn.LayerNorm(16)
    x = torch.randn(4, 16, requires_grad=True)
    with ae.torch.emulate("Ascend910") as run:
        m(x).sum().backward()
    rec = next(r for r in run.records if r.aten == "aten.native_layer_norm_backward.default")
    assert rec.engine == "AICPU" and "910B" in rec.reason


def test_sum_with_dtype_casts_then_reduces():
    """sum(x, dtype=float32) of fp16 (autocast's fp32_set_opt_dtype sum): Cast then Sum on the AI Core, the same bits
    as summing the widened input (13.4 item 7), not the AI CPU."""
    torch.manual_seed(3)
    x = (torch.randn(4, 300) * 50).half()
    with ae.torch.emulate("Ascend910B") as run:
        y = torch.sum(x, dim=1, dtype=torch.float32)
        z = torch.sum(x.float(), dim=1)
    assert y.dtype == torch.float32 and torch.equal(y, z)
    rec = next(r for r in run.records if r.aten == "aten.sum.dim_IntList")
    assert rec.engine == "AICORE" and rec.op_types == ["Cast", "Sum"]


@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_backward_is_flash_attention_score_grad(causal):
    """SDPA's backward on the 910B: FlashAttentionScoreGrad on the forward's softmax max and sum (AI Core); in float32
    (KEEP_DTYPE: float32 cube operands) the gradients are torch float32's within float32 rounding; in fp16 they are
    the registry kernel's bits on the same inputs."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, 40, 16, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 2, 40, 16)
    with ae.torch.emulate("Ascend910B") as run:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        got = torch.autograd.grad(o, (q, k, v), do)
    import gc

    del o
    gc.collect()
    assert len(run._stash["flash_attention_stats"]) == 0      # the kernel's max and sum go with the graph
    rec = next(r for r in run.records if r.aten.startswith("aten._scaled_dot_product_flash_attention_for_cpu_backward"))
    assert rec.engine == "AICORE" and rec.op_types == ["_FlashAttentionScoreGrad"] and rec.phase == "backward"
    want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v), do)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-5)

    qh, kh, vh = (t.detach().half().requires_grad_() for t in (q, k, v))
    with ae.torch.emulate("Ascend910B"):
        oh = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
        gh = torch.autograd.grad(oh, (qh, kh, vh), do.half())
    ctx = OpContext(dtype="float16")
    mask = np.broadcast_to(np.triu(np.ones((40, 40), bool), 1), (1, 2, 40, 40)) if causal else None
    extra = () if mask is None else (mask,)
    o16, _, m, l = run_op("_FlashAttentionScore", qh.detach().numpy(), kh.detach().numpy(), vh.detach().numpy(),
                          *extra, ctx=ctx, scale_value=0.25, has_mask=causal, with_stats=True)
    assert np.array_equal(o16.view(np.uint16), oh.detach().numpy().view(np.uint16))
    want16 = run_op("_FlashAttentionScoreGrad", qh.detach().numpy(), kh.detach().numpy(), vh.detach().numpy(),
                    do.half().numpy(), o16, m, l, *extra, ctx=OpContext(dtype="float16"), scale_value=0.25,
                    has_mask=causal)
    for g, w in zip(gh, want16):
        assert np.array_equal(g.numpy().view(np.uint16), w.view(np.uint16))


def test_gelu_backward_is_the_tanh_forms_derivative():
    """F.gelu's backward on the AI Core: GeluGrad (the tanh form's derivative, as the forward), whatever approximate
    says; with the compatible switch the AI CPU's."""
    torch.manual_seed(5)
    x = (torch.randn(4096) * 3).requires_grad_()
    g = torch.randn(4096)
    with ae.torch.emulate("Ascend910B") as run:
        (dx,) = torch.autograd.grad(F.gelu(x), x, g)
    rec = next(r for r in run.records if r.aten == "aten.gelu_backward.default")
    assert rec.engine == "AICORE" and rec.op_types == ["_GeluGrad"] and "tanh form" in rec.reason
    (tanh_d,) = torch.autograd.grad(F.gelu(x, approximate="tanh"), x, g)
    (erf_d,) = torch.autograd.grad(F.gelu(x), x, g)
    assert (dx - tanh_d).abs().max() < 1e-5 * g.abs().max() * 10 and (dx - erf_d).abs().max() > 1e-4
    with ae.torch.emulate("Ascend910B", compatible_impl=True) as run:
        (dx2,) = torch.autograd.grad(F.gelu(x), x, g)
    assert next(r for r in run.records if r.aten == "aten.gelu_backward.default").engine == "AICPU"
    assert torch.allclose(dx2, erf_d, rtol=1e-6, atol=1e-6)


def test_conv1d_runs_as_conv2d_with_h_1():
    """aclnnConvolution runs a 1-D convolution as the 2-D one (View1dAs2d): on the AI Core, forward and backward; in
    float32 with conv.allow_hf32 off the results are torch float32's within float32 rounding."""
    torch.manual_seed(6)
    conv = torch.nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=1)
    x = torch.randn(2, 4, 17, requires_grad=True)
    with ae.torch.emulate("Ascend910B", allow_hf32_conv=False) as run:
        y = conv(x)
        gx, gw, gb = torch.autograd.grad(y.square().sum(), (x, conv.weight, conv.bias))
    ref = conv(x)
    rx, rw, rb = torch.autograd.grad(ref.square().sum(), (x, conv.weight, conv.bias))
    assert y.shape == ref.shape and torch.allclose(y, ref, rtol=1e-5, atol=1e-6)
    for g, r in ((gx, rx), (gw, rw), (gb, rb)):
        assert g.shape == r.shape and torch.allclose(g, r, rtol=1e-4, atol=1e-5)
    recs = [r for r in run.records if "convolution" in r.aten]
    assert recs and all(r.engine == "AICORE" for r in recs)


def test_view_gradients_run_on_the_host():
    """select_backward / slice_backward only place the gradient into zeros: exact, the host's (they ran on the AI
    CPU), the same values as torch's."""
    x = torch.randn(4, 6, requires_grad=True)
    with ae.torch.emulate("Ascend910B") as run:
        (g,) = torch.autograd.grad((x[1] * 2).sum() + (x[:, 2:5] * 3).sum(), x)
    engines = {r.aten.split(".")[1]: r.engine for r in run.records if r.phase == "backward"}
    assert engines["select_backward"] == "HOST" and engines["slice_backward"] == "HOST"
    want = torch.zeros(4, 6)
    want[1] += 2
    want[:, 2:5] += 3
    assert torch.equal(g, want)
