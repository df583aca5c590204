"""torch_npu's autocast and GradScaler rule on the emulated NPU (ASCEND-FACTS.md 13.2), GELU (13.8 item 5)."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import ascend_emu as ae  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402

from torch_models import cnn_batch, small_cnn  # noqa: E402


def _amp_training(soc, plant_step=1, steps=3):
    x, y = cnn_batch()
    m = small_cnn()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    weights = []
    with ae.torch.emulate(soc) as run:
        for step in range(steps):
            opt.zero_grad()
            with run.autocast():
                out = m(x)
                if step == plant_step:
                    # the planted overflow: the backward multiplies the logits' gradient by 1e4 (an fp16 Mul)
                    out.register_hook(lambda g: g * 1e4)
                loss = F.cross_entropy(out, y)
            before = [p.detach().clone() for p in m.parameters()]
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            weights.append((before, [p.detach().clone() for p in m.parameters()]))
    return run, weights, out, loss


@pytest.mark.parametrize("soc", ["Ascend910B", "Ascend910"])
def test_grad_scaler_skips_the_overflowing_step_and_names_the_op(soc):
    run, weights, out, loss = _amp_training(soc)
    assert out.dtype == torch.float16 and loss.dtype == torch.float32     # addmm in fp16, the loss in fp32
    conv = next(r for r in run.records if r.aten == "aten.convolution.default")
    assert conv.compute_dtype == "float16" and conv.dtypes["inputs"][:2] == ["float16", "float16"]
    s0, s1, s2 = run.steps
    assert not s0["skipped"] and s1["skipped"] and not s2["skipped"]
    assert s0["loss_scale"] == 2.0 ** 16 and s1["loss_scale"] == 2.0 ** 16 and s1["next_loss_scale"] == 2.0 ** 15
    assert s2["loss_scale"] == 2.0 ** 15
    before, after = weights[1]
    assert all(torch.equal(a, b) for a, b in zip(before, after))          # a skipped step leaves the weights
    assert not all(torch.equal(a, b) for a, b in zip(*weights[0]))
    first = s1["first_overflow"]
    assert first["phase"] == "backward" and first["aten"] == "aten.mul.Tensor" and first["name"].endswith(".backward")
    assert run.first_overflow["step"] == 1
    unscale = [r for r in run.records if r.op_types == ["ForeachNonFiniteCheckAndUnscale"]]
    assert len(unscale) == 3
    assert ("saturation" in unscale[1].reason) == (soc == "Ascend910")
    text = run.format_summary()
    assert "steps: 3 (skipped: 1)" in text and f"first overflow: {first['name']} (aten.mul.Tensor), backward, step 1" \
        in text


def test_910_saturates_and_the_status_register_decides():
    run, *_ = _amp_training("Ascend910", steps=2)
    mul = next(r for r in run.records if r.name == run.steps[1]["first_overflow"]["name"])
    assert mul.status and run.steps[1]["float_status"]
    assert run.device.overflow_mode == "saturation"


def test_bf16_autocast_refused_on_910():
    with ae.torch.emulate("Ascend910") as run:
        with pytest.raises(AscendEmuError) as e:
            with run.autocast(torch.bfloat16):
                pass
    assert "bf16 autocast is not supported on Ascend910" in str(e.value) and "\n" not in str(e.value)
    with ae.torch.emulate("Ascend910B") as run:
        with run.autocast(torch.bfloat16):
            y = F.linear(torch.randn(4, 8), torch.randn(3, 8))
    assert y.dtype == torch.bfloat16


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _gelu_erf(x):
    # 0.5 x (1 + erf(x / sqrt 2)) written as 0.5 x erfc(-x / sqrt 2): no cancellation for negative x
    return 0.5 * x * np.vectorize(math.erfc)(-x / math.sqrt(2))


def test_gelu_is_tanh_unless_compatible_impl():
    x = torch.linspace(-6, 6, 4001)
    with ae.torch.emulate() as run:
        y = F.gelu(x)
        run.options.set("compatible_impl", True, "TORCH_NPU_USE_COMPATIBLE_IMPL")
        ye = F.gelu(x)
    xd = x.double().numpy()
    tanh, erf = _gelu_tanh(xd), _gelu_erf(xd)
    assert np.abs(y.double().numpy() - tanh).max() < 1e-5                  # the kernel's float32 tanh form
    assert np.abs(y.double().numpy() - erf).max() > 1e-4                   # not the erf form asked for
    # compatible impl: the erf form, exact inside and rounded once to float32
    assert np.array_equal(ye.numpy(), erf.astype(np.float32))


def test_bf16_tensors_refused_on_910_in_one_line():
    x = torch.randn(4, 8).bfloat16()
    with pytest.raises(AscendEmuError) as e:
        with ae.torch.emulate("Ascend910"):
            x @ x.t()
    assert "bfloat16 is not supported on Ascend910" in str(e.value) and "Aten.mm.0.forward" in str(e.value)
    assert "\n" not in str(e.value)
