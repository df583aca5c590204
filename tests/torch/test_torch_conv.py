"""Transposed 2-D and 3-D convolutions on the emulated cube (NUMERICS.md section 16; aten_conv.py): aclnnConvolution's
Conv2DTranspose and Conv3DV2, and their gradients (Conv2D / Conv2DBackpropFilter, Conv3DBackpropInputV2 /
FilterV2), against torch float32 on real modules, bit for bit on exactly representable data, with the bias where
each SoC adds it."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import ascend_emu as ae  # noqa: E402
from ascend_emu.frontend.torch.pt2.loader import load_pt2  # noqa: E402
from ascend_emu.npu.device import Device  # noqa: E402


class Generator(torch.nn.Module):
    """A DCGAN-style generator: a latent map upsampled by strided transposed convolutions (no bias before the batch
    norm, as DCGAN's; output padding; a dilated one), batch norm and ReLU, tanh at the end."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.ConvTranspose2d(8, 16, 4, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1), torch.nn.ReLU(),
            torch.nn.ConvTranspose2d(8, 3, 3, padding=2, dilation=2), torch.nn.Tanh())

    def forward(self, z):
        return self.net(z)


class Video(torch.nn.Module):
    """A small C3D-style clip classifier: 3-D convolutions (a strided and a dilated one), ReLU, a linear head."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv3d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv3d(8, 12, (3, 3, 3), stride=(1, 2, 2), padding=(1, 1, 1))
        self.c3 = torch.nn.Conv3d(12, 12, (1, 3, 3), padding=(0, 2, 2), dilation=(1, 2, 2))
        self.fc = torch.nn.Linear(12, 5)

    def forward(self, x):
        x = F.relu(self.c3(F.relu(self.c2(F.relu(self.c1(x))))))
        return self.fc(x.mean(dim=(2, 3, 4)))


def _train_step(model, x, y):
    model.zero_grad()
    loss = F.mse_loss(model(x), y) if y.dim() > 1 else F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("which", ["generator", "video"])
def test_float32_training_step_is_torch_float32_on_the_cube(which):
    """HF32 off (float32 operands on the 910B's cube): the loss and every gradient are torch float32's within
    float32 rounding; every convolution, forward and backward, ran on the AI Core as its CANN op."""
    torch.manual_seed(11)
    if which == "generator":
        model, x, y = Generator(), torch.randn(2, 8, 4, 4), torch.rand(2, 3, 16, 16) * 2 - 1
        fwd, back = ["Conv2DTranspose"], ["Conv2D", "Conv2DBackpropFilter", "BiasAddGrad"]
    else:
        model, x, y = Video(), torch.randn(2, 3, 4, 8, 8), torch.tensor([1, 3])
        fwd, back = ["Conv3D"], ["Conv3DBackpropInputV2", "Conv3DBackpropFilterV2", "BiasAddGrad"]
    with ae.torch.emulate("Ascend910B", allow_hf32_conv=False) as run:
        loss, grads = _train_step(model, x, y)
    ref_loss, ref = _train_step(model, x, y)
    assert abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
    for name, g in grads.items():
        scale = float(ref[name].abs().max()) or 1.0
        assert float((g - ref[name]).abs().max()) <= 2e-5 * scale, name
    convs = [r for r in run.records if "convolution" in r.aten]
    assert {r.engine for r in convs} == {"AICORE"}
    first_layer_back = [r for r in convs if r.phase == "backward"][-1]   # the first layer: no input gradient
    assert [r.op_types for r in convs if r.phase == "forward"][0] == fwd
    assert [r.op_types for r in convs if r.phase == "backward"][0] == back
    assert back[0] not in first_layer_back.op_types


def _integers(shape, lo, hi, seed):
    """Small integers: every product and sum below is exact in fp16 operands and a float32 accumulator."""
    return torch.from_numpy(np.random.default_rng(seed).integers(lo, hi, shape).astype(np.float32))


def test_fp16_transposed_and_3d_convolutions_index_as_torch_bit_for_bit():
    """With small integers every product and partial sum is exact, so the emulated fp16 result must equal torch's
    float64 result bit for bit: the geometry (stride, padding, output padding, dilation, the filter's layout) of the
    forward and both gradients is torch's, whatever the summation order."""
    x = _integers((2, 3, 5, 6), -3, 4, 1)
    w = _integers((3, 4, 3, 2), -2, 3, 2)
    x5 = _integers((1, 2, 4, 5, 6), -3, 4, 3)
    w5 = _integers((3, 2, 2, 3, 2), -2, 3, 4)
    geo = dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), dilation=(1, 2))
    geo5 = dict(stride=(1, 2, 1), padding=(1, 1, 0), dilation=(1, 1, 2))
    with ae.torch.emulate("Ascend910B"):
        xh, wh, x5h, w5h = (t.half().requires_grad_() for t in (x, w, x5, w5))
        y = F.conv_transpose2d(xh, wh, **geo)
        gx, gw = torch.autograd.grad(y, (xh, wh), y.detach() * 0 + 1)
        y5 = F.conv3d(x5h, w5h, **geo5)
        gx5, gw5 = torch.autograd.grad(y5, (x5h, w5h), y5.detach().sign())
    xd, wd, x5d, w5d = (t.double().requires_grad_() for t in (x, w, x5, w5))
    ry = F.conv_transpose2d(xd, wd, **geo)
    rx, rw = torch.autograd.grad(ry, (xd, wd), torch.ones_like(ry))
    ry5 = F.conv3d(x5d, w5d, **geo5)
    rx5, rw5 = torch.autograd.grad(ry5, (x5d, w5d), ry5.detach().sign())
    for got, want in ((y, ry), (gx, rx), (gw, rw), (y5, ry5), (gx5, rx5), (gw5, rw5)):
        assert got.dtype == torch.float16 and got.shape == want.shape
        assert torch.equal(got.double(), want.detach())


@pytest.mark.parametrize("soc,want", [("Ascend910B", 2050.0), ("Ascend950", 2048.0)])
def test_transposed_bias_in_the_accumulator_or_after(soc, want):
    """A 1x1 transposed convolution whose products sum to 2049 (no fp16) with a bias of 1: the 910B's
    Conv2DTranspose takes the bias into the float32 accumulator (2050, exact in fp16); the 950's aclnnConvolution
    adds it after the rounding (2048 + 1 = 2049 -> 2048, ties to even), a separate BiasAdd."""
    x = torch.tensor([2048.0, 1.0]).reshape(1, 2, 1, 1).half()
    w = torch.ones(2, 1, 1, 1).half()
    b = torch.ones(1).half()
    with ae.torch.emulate(soc) as run:
        y = F.conv_transpose2d(x, w, b)
    assert float(y) == want
    assert run.records[-1].op_types == (["Conv2DTranspose"] if soc == "Ascend910B" else ["Conv2DTranspose", "BiasAdd"])


def test_what_the_cube_does_not_take_runs_on_the_ai_cpu():
    """A grouped transposed convolution and a transposed 3-D one fall back to the AI CPU (torch float32), named."""
    torch.manual_seed(2)
    g = torch.nn.ConvTranspose2d(4, 6, 3, groups=2)
    t3 = torch.nn.ConvTranspose3d(2, 3, 2)
    g3 = torch.nn.Conv3d(4, 6, 2, groups=2)
    x, x3, x4 = torch.randn(1, 4, 5, 5), torch.randn(1, 2, 3, 3, 3), torch.randn(1, 4, 3, 3, 3)
    with ae.torch.emulate("Ascend910B", allow_hf32_conv=False) as run, torch.no_grad():
        y, y3, y4 = g(x), t3(x3), g3(x4)
    with torch.no_grad():
        assert torch.allclose(y, g(x), atol=1e-6) and torch.allclose(y3, t3(x3), atol=1e-6)
        assert torch.allclose(y4, g3(x4), atol=1e-6)
    assert [r.engine for r in run.records if "convolution" in r.aten] == ["AICPU", "AICPU", "AICPU"]


def test_hf32_rounds_the_transposed_operands_by_default(tmp_path):
    """On the 910B conv.allow_hf32 is on by default: Conv2DTranspose's two operands are rounded to HF32 first, as
    Conv2D's; and the exported program of the generator replays in float32 mode as torch float32 does."""
    torch.manual_seed(5)
    model = Generator().eval()
    z = torch.randn(1, 8, 4, 4)
    with ae.torch.emulate("Ascend910B") as run, torch.no_grad():
        model(z)
    first = next(r for r in run.records if "convolution" in r.aten)
    assert first.cube_math_type == "USE_HF32" and first.op_types == ["HF32", "Conv2DTranspose"]
    path = tmp_path / "gen.pt2"
    torch.export.save(torch.export.export(model, (z,)), str(path))
    g = load_pt2(path)
    assert sum(n.op == "Conv2DTranspose" for n in g.nodes) == 3
    res = Device(soc="Ascend910B", precision_mode="must_keep_origin_dtype", allow_hf32="",
                 fusion_switch="off").replay(g, {g.inputs[0].name: z.numpy()}, progress=False)
    with torch.no_grad():
        np.testing.assert_allclose(res.outputs[g.outputs[0]], model(z).numpy(), rtol=2e-5, atol=2e-6)


def test_explicit_3d_paddings_are_checked():
    """The registry's Conv3D takes aclnnConvolution's explicit pads; a malformed list is one line naming it."""
    from ascend_emu.errors import AscendEmuError
    from ascend_emu.ops import OpContext, run_op

    x, w = np.ones((1, 3, 3, 3, 1), np.float32), np.ones((2, 2, 2, 1, 1), np.float32)
    (y,) = run_op("Conv3D", x, w, ctx=OpContext(dtype="float32"), padding="EXPLICIT",
                  explicit_paddings=[0, 0, 1, 0, 0, 1, 0, 0, 0, 0])
    assert y.shape == (1, 3, 3, 2, 1)
    for bad in ([0, 0, 1, 1, 1, 1, 1, 1], [0, 0, -1, 0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]):
        with pytest.raises(AscendEmuError, match="explicit_paddings"):
            run_op("Conv3D", x, w, ctx=OpContext(dtype="float32"), padding="EXPLICIT", explicit_paddings=bad)


def test_conv2d_transpose_checks_its_geometry():
    """The registry's Conv2DTranspose: pads of another length, or an input_size the convolution would not map back
    onto x's size (it used to zero-fill the rest), are one line each."""
    from ascend_emu.errors import AscendEmuError
    from ascend_emu.ops import OpContext, run_op

    x, w = np.ones((1, 3, 3, 2), np.float32), np.ones((2, 2, 1, 2), np.float32)
    ctx = OpContext(dtype="float32")
    (y,) = run_op("Conv2DTranspose", np.int32([1, 4, 4, 1]), x, w, ctx=ctx, strides=[1, 1, 1, 1], pads=[0, 0, 0, 0])
    assert y.shape == (1, 4, 4, 1)
    with pytest.raises(AscendEmuError, match="four sizes"):
        run_op("Conv2DTranspose", np.int32([1, 4, 4, 1]), x, w, ctx=ctx, strides=[1, 1, 1, 1], pads=[0, 0])
    with pytest.raises(AscendEmuError, match="check input_size against x"):
        run_op("Conv2DTranspose", np.int32([1, 9, 9, 1]), x, w, ctx=ctx, strides=[1, 1, 1, 1], pads=[0, 0, 0, 0])
