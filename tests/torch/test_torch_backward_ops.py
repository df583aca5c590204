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
