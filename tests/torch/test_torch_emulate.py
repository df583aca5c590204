"""ae.torch.emulate on real torch modules against torch's own float32 execution (ASCEND-FACTS.md 13.1, 13.3)."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import ascend_emu as ae  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402

from torch_models import LlamaBlock, cnn_batch, llama_batch, small_cnn  # noqa: E402


def hf32(a: np.ndarray, ties_away: bool = False) -> np.ndarray:
    """Oracle: float32 values rounded to HF32 as the 910B keeps it, 11 stored (12 significant) bits; nearest
    even (SetHF32 mode 0, the convolutions) or ties away (mode 1, MatMulV3), in float64."""
    a = np.asarray(a, np.float64)
    m, e = np.frexp(a)                      # a = m 2^e, 0.5 <= |m| < 1
    q = np.sign(m) * np.floor(np.abs(m) * 2.0 ** 12 + 0.5) if ties_away else np.rint(m * 2.0 ** 12)
    return np.ldexp(q, e - 12)


def _train_step(model, opt, x, loss_fn):
    opt.zero_grad()
    loss = loss_fn(model(x))
    loss.backward()
    opt.step()
    return loss


def _close(a, b, rtol):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) <= rtol


def test_cnn_fp32_on_910b_is_torch_float32_once_conv_hf32_is_off():
    x, y = cnn_batch()
    m, ref = small_cnn(), small_cnn()
    opt, ropt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), torch.optim.SGD(ref.parameters(), lr=0.1,
                                                                                          momentum=0.9)
    with ae.torch.emulate("Ascend910B", allow_hf32_conv=False) as run:
        for _ in range(2):
            loss = _train_step(m, opt, x, lambda o: F.cross_entropy(o, y))
    for _ in range(2):
        rloss = _train_step(ref, ropt, x, lambda o: F.cross_entropy(o, y))
    assert abs(loss.item() - rloss.item()) <= 1e-5 * abs(rloss.item())
    for p, q in zip(m.parameters(), ref.parameters()):
        assert _close(p, q, 1e-5)
    phases = {r.phase for r in run.records}
    assert phases == {"forward", "backward", "update"} and len(run.steps) == 2
    names = [r.name for r in run.records if r.step == 0]
    assert "Aten.convolution.0.forward" in names and "Aten.convolution_backward.0.backward" in names
    conv = next(r for r in run.records if r.name == "Aten.convolution.0.forward")
    assert conv.engine == "AICORE" and conv.op_types == ["Conv2D"] and conv.cube_math_type == "KEEP_DTYPE"
    mm = next(r for r in run.records if r.name == "Aten.addmm.0.forward")
    assert mm.cube_math_type == "KEEP_DTYPE" and mm.compute_dtype == "float32"
    assert any(r.engine == "AICPU" for r in run.records)          # nll_loss: torch float32, as the AI CPU
    assert all(r.phase == "update" for r in run.records if r.aten == "aten.add_.Tensor" and r.step == 0
               and r.dtypes["inputs"] == ["float32", "float32"])


def test_conv_operands_are_hf32_on_910b_and_float32_once_switched_off():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 8, 9, 9, generator=g), torch.randn(16, 8, 3, 3, generator=g)
    with ae.torch.emulate("Ascend910B") as run:
        y = F.conv2d(x, w, padding=1)
    assert run.records[-1].cube_math_type == "USE_HF32" and run.records[-1].op_types == ["HF32", "Conv2D"]
    with ae.torch.emulate("Ascend910B", allow_hf32_conv=False):
        y32 = F.conv2d(x, w, padding=1)
    oracle_hf32 = F.conv2d(torch.from_numpy(hf32(x.numpy())), torch.from_numpy(hf32(w.numpy())), padding=1)
    oracle_f32 = F.conv2d(x.double(), w.double(), padding=1)
    scale = float(oracle_f32.abs().max())
    # float32 accumulation over K = 72 products: well below 1e-5 of the largest output; HF32 moves it ~1e-3
    assert float((y.double() - oracle_hf32).abs().max()) < 2e-6 * scale
    assert float((y.double() - oracle_f32).abs().max()) > 1e-4 * scale
    assert float((y32.double() - oracle_f32).abs().max()) < 2e-6 * scale


def test_matmul_allow_hf32_and_cube_math_type():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(16, 64, generator=g), torch.randn(64, 8, generator=g)
    with ae.torch.emulate() as run:
        keep = a @ b
        run.options.set("allow_hf32_matmul", True, "torch.npu.matmul.allow_hf32")
        h = a @ b
        run.options.set("cube_math_type", "USE_FP16", "torch.npu.matmul.cube_math_type")
        f16 = a @ b
    assert [r.cube_math_type for r in run.records if r.aten == "aten.mm.default"] == ["KEEP_DTYPE", "USE_HF32",
                                                                                       "USE_FP16"]
    exact = a.double() @ b.double()
    assert float((keep.double() - exact).abs().max()) < 1e-5
    assert float((h.double() - torch.from_numpy(hf32(a.numpy(), True) @ hf32(b.numpy(), True))).abs().max()) < 1e-5
    o16 = (a.half().double() @ b.half().double()).half().double()
    assert float((f16.double() - o16).abs().max() / o16.abs().max()) < 1e-3
    assert f16.dtype == torch.float32


def test_910_runs_float32_cube_ops_with_fp16_operands():
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(32, 48, generator=g), torch.randn(48, 24, generator=g)
    with ae.torch.emulate("Ascend910") as run:
        y = a @ b
    assert run.options.effective_precision_mode == "allow_fp32_to_fp16"
    rec = run.records[-1]
    assert rec.cube_math_type == "USE_FP16" and rec.compute_dtype == "float16" and y.dtype == torch.float32
    # oracle: fp16 operands, exact products and sums (float64), one rounding to fp16 (the output), widened
    o = torch.from_numpy((a.half().double() @ b.half().double()).numpy().astype(np.float16).astype(np.float32))
    ulp = (y - o).abs() / o.abs().clamp_min(2.0 ** -14) * 1024
    assert float(ulp.max()) <= 1.0 and float((y == o).double().mean()) > 0.97


def test_llama_block_fp32_train_step_matches_torch():
    x = llama_batch()
    m, ref = LlamaBlock(), LlamaBlock()
    p0 = [p.detach().clone() for p in m.parameters()]
    opt, ropt = torch.optim.AdamW(m.parameters(), lr=1e-3), torch.optim.AdamW(ref.parameters(), lr=1e-3)
    with ae.torch.emulate("Ascend910B") as run:
        loss = _train_step(m, opt, x, lambda o: o.square().mean())
    rloss = _train_step(ref, ropt, x, lambda o: o.square().mean())
    assert abs(loss.item() - rloss.item()) <= 1e-5 * abs(rloss.item())
    for p, q, z in zip(m.parameters(), ref.parameters(), p0):
        assert _close(p.grad, q.grad, 1e-5)
        # Adam's first step is lr * g / (|g| + eps): a gradient of a few eps moves by its last-bit differences
        assert float(((p - z) - (q - z)).detach().abs().max()) <= 1e-2 * 1e-3
    assert any(r.op_types == ["_FlashAttentionScore"] for r in run.records)
    upd = [r for r in run.records if r.phase == "update" and r.engine != "HOST"]
    assert upd and all(r.engine == "AICORE" for r in upd)


def test_aicpu_fallback_off_refuses_in_one_line():
    x = torch.randn(4)
    with pytest.raises(AscendEmuError) as e:
        with ae.torch.emulate(aicpu_fallback=False):
            x.cos()
    assert "aten.cos" in str(e.value) and "\n" not in str(e.value)
    with ae.torch.emulate() as run:
        c = x.cos()
    assert torch.equal(c, x.cos()) and run.records[-1].engine == "AICPU"


def test_bad_option_is_one_line():
    with pytest.raises(AscendEmuError, match="ACL_PRECISION_MODE"):
        ae.torch.emulate(precision_mode="force_fp16")
    with pytest.raises(AscendEmuError, match="unknown soc"):
        ae.torch.emulate("Ascend911")


def test_npu_fused_ops_run_as_one_kernel_each():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 8, 64, generator=g).half().requires_grad_()
    w = torch.randn(64, generator=g).half().requires_grad_()
    cos, sin = torch.randn(8, 64, generator=g), torch.randn(8, 64, generator=g)
    with ae.torch.emulate() as run:
        y, rstd = ae.torch.npu_rms_norm(x, w, 1e-6)
        z = ae.torch.npu_swiglu(torch.cat((y, y), -1))
        r = ae.torch.npu_rotary_mul(z, cos, sin)
        r.float().square().sum().backward()
    names = [rec.name for rec in run.records if rec.name.startswith("NPU.")]
    assert names == ["NPU.npu_rms_norm.0.forward", "NPU.npu_swiglu.0.forward", "NPU.npu_rotary_mul.0.forward"]
    rec = next(rec for rec in run.records if rec.name == "NPU.npu_rms_norm.0.forward")
    assert rec.op_types == ["_RmsNorm"] and rec.engine == "AICORE" and rstd.dtype == torch.float32
    from ascend_emu.ops import OpContext, run_op

    want, _ = run_op("_RmsNorm", x.detach().numpy(), w.detach().numpy(), ctx=OpContext(dtype="float16"),
                     epsilon=1e-6)
    assert np.array_equal(y.detach().numpy().view(np.uint16), want.view(np.uint16))
    assert x.grad is not None and w.grad is not None and bool(torch.isfinite(x.grad.float()).all())
    # outside a run: float32 inside, one rounding
    y0, _ = ae.torch.npu_rms_norm(x.detach(), w.detach(), 1e-6)
    assert float((y0.float() - y.detach().float()).abs().max()) <= 2 ** -9 * float(y0.float().abs().max())


def test_use_deterministic_algorithms_off_is_the_multicore_model():
    """torch's default use_deterministic_algorithms(False): a split-K matmul adds its cores' partial sums in an
    order drawn from run_seed (NUMERICS.md section 11); deterministic=True: one order whatever the seed."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 8192, generator=g).half(), torch.randn(8192, 16, generator=g).half()
    got = {}
    for det in (False, True):
        for seed in (1, 2):
            with ae.torch.emulate(deterministic=det, run_seed=seed) as run:
                got[det, seed] = a @ b
            assert run.options.effective_deterministic_level == (1 if det else 0)
    assert not torch.equal(got[False, 1], got[False, 2])
    assert torch.equal(got[True, 1], got[True, 2])
    # the orders move last bits only
    assert float((got[False, 1].float() - got[True, 1].float()).abs().max()) <= 2 ** -6 * float(
        got[True, 1].float().abs().max())


def test_out_overloads_views_and_inplace_on_views():
    g = torch.Generator().manual_seed(8)
    a, b = torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)
    out = torch.empty(8, 4)
    x = torch.randn(6, 5, generator=g)
    with ae.torch.emulate() as run:
        torch.mm(a, b, out=out)                  # aten.mm.out: the AI CPU (torch), same values in float32
        y = x.clone()
        y[1:3].add_(1.0)                         # an in-place add on a view: the AI Core's Add, copied into it
        z = a.t() @ a                            # a transposed operand
    assert run.records[0].aten == "aten.mm.out" and run.records[0].engine == "AICPU"
    assert torch.allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    want = x.clone()
    want[1:3] += 1.0
    assert torch.equal(y, want)
    assert torch.allclose(z, a.t() @ a, rtol=1e-5, atol=1e-5)


def test_activation_and_pool_backward_on_the_ai_core():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 3, 8, 8, generator=g, requires_grad=True)
    w = torch.randn(2, 3, 4, 4, generator=g)
    with ae.torch.emulate() as run:
        ((F.max_pool2d(x, 2) * w).sum() + (torch.sigmoid(x) + torch.tanh(x)).sum()).backward()
    x2 = x.detach().clone().requires_grad_()
    ((F.max_pool2d(x2, 2) * w).sum() + (torch.sigmoid(x2) + torch.tanh(x2)).sum()).backward()
    assert float((x.grad - x2.grad).abs().max()) < 1e-6
    back = {r.aten: r for r in run.records if r.phase == "backward"}
    assert back["aten.max_pool2d_with_indices_backward.default"].op_types == ["MaxPool", "MaxPoolGrad"]
    assert back["aten.sigmoid_backward.default"].engine == "AICORE"
    assert back["aten.tanh_backward.default"].op_types == ["TanhGrad"]


def test_bf16_layer_norm_rounds_as_layer_norm_v4_on_910b():
    """aclnnLayerNorm on the 910B is LayerNormV4 (Ascend C): float32 steps, the bf16 output cast once with
    CAST_ROUND (ties away; ASCEND-FACTS 13.4 item 2), bit for bit against the step oracle of tests/naive.py on
    outputs some of which lie exactly halfway between two bf16 values; on the 910 (TBE) nearest even."""
    import ml_dtypes
    import naive

    g = torch.Generator().manual_seed(42)
    x = (torch.randn(2048, 64, generator=g) * 3).to(torch.bfloat16)
    ln = torch.nn.LayerNorm(64, eps=1e-5)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(64, generator=g) * 0.5 + 1)
        ln.bias.copy_(torch.randn(64, generator=g))
    ln = ln.to(torch.bfloat16)
    xb = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    gb = ln.weight.detach().float().numpy()
    bb = ln.bias.detach().float().numpy()
    for soc, model, rounding in (("Ascend910B", "ascendc", "round"), ("Ascend910", "tbe_v100", "rint")):
        if soc == "Ascend910":
            x, ln = x.float().half(), ln.half()          # the 910 has no bf16: the same steps from fp16
            xb, gb, bb = x.numpy(), ln.weight.detach().float().numpy(), ln.bias.detach().float().numpy()
        with ae.torch.emulate(soc):
            y = ln(x)
        y32 = naive.layer_norm_steps(xb, gb, bb, 1e-5, (1,), model)
        want, _ = naive.cast_bits(y32, "bfloat16" if soc == "Ascend910B" else "float16", rounding)
        assert np.array_equal(y.detach().view(torch.int16).numpy().view(np.uint16), want), soc
        if soc == "Ascend910B":
            half = (y32.view(np.uint32) & 0xFFFF) == 0x8000
            assert half.any() and not np.array_equal(want[half], naive.cast_bits(y32, "bfloat16", "rint")[0][half])
