"""The torch_npu shim on its own (no emulated kernels): the npu device on CPU tensors, torch.npu's switches into
the run's NpuOptions with their torch_npu spellings as sources, autocast and GradScaler, refusals in one line."""
import importlib
import math
import sys

import pytest

torch = pytest.importorskip("torch")

from ascend_emu.errors import AscendEmuError  # noqa: E402
from ascend_emu.frontend.torch import npu_shim  # noqa: E402
from ascend_emu.frontend.torch.options import NpuOptions, activate  # noqa: E402


@pytest.fixture
def run():
    o = NpuOptions(soc="Ascend910B")
    with activate(o), npu_shim.installed():
        yield o


def test_torch_npu_importable_only_while_installed(run):
    import torch_npu

    assert torch_npu.__ascend_emu_shim__ and torch.npu is torch_npu.npu
    from torch_npu.npu.amp import GradScaler  # noqa: F401
    assert torch.npu.is_available() and torch.npu.device_count() == 1 and torch.npu.current_device() == 0


def test_not_importable_outside():
    with pytest.raises(ImportError):
        importlib.import_module("torch_npu")
    assert npu_shim.SHIM_DIR not in sys.path and not hasattr(torch.Tensor, "npu")


def test_npu_device_is_the_cpu(run):
    import torch_npu  # noqa: F401

    # CPU tensors underneath, reporting npu:0 as torch_npu's do (but for what .cpu() / .to("cpu") returned)
    x = torch.zeros(3, device="npu")
    assert x.is_cpu and x.device.type == "npu" and str(x.device) == "npu:0"
    for y in (x.npu(), x.to("npu"), x.to(torch.device("npu:0")), x.to("npu", torch.float16),
              torch.randn(2, device=torch.device("npu", 0)), torch.tensor([1.0], device="npu:0")):
        assert y.is_cpu and y.device.type == "npu"
    assert x.cpu().device.type == "cpu" and x.to("cpu").device.type == "cpu" and x.device.type == "npu"
    m = torch.nn.Linear(2, 3).npu().to("npu")
    assert m.weight.is_cpu and torch.nn.Linear(2, 3, device="npu").weight.device.type == "npu"
    assert torch.device("npu:0").type == "npu"
    with pytest.raises(AscendEmuError, match="npu:1 does not exist; the emulated NPU is one device"):
        torch.npu.set_device(1)
    torch.npu.set_device("npu:0")
    torch.npu.synchronize()
    assert {"call": "torch.npu.set_device", "args": {"device": 0}} in npu_shim.calls()


def test_switches_set_the_run_options_with_their_sources(run):
    import torch_npu

    assert torch.npu.conv.allow_hf32 is True and torch.npu.matmul.allow_hf32 is False   # torch_npu's defaults
    torch.npu.conv.allow_hf32 = False
    torch.npu.matmul.allow_hf32 = True
    torch.npu.matmul.cube_math_type = torch_npu.npu.CubeMathType.USE_FP16
    assert (run.allow_hf32_conv, run.allow_hf32_matmul, run.cube_math_type) == (False, True, 2)
    assert run.sources["allow_hf32_conv"] == "torch.npu.conv.allow_hf32"
    assert run.sources["cube_math_type"] == "torch.npu.matmul.cube_math_type"
    torch.npu.set_option({"ACL_PRECISION_MODE": "allow_fp32_to_fp16", "ACL_AICORE_NUM": 8, "MY_KEY": "x"})
    assert run.precision_mode == "allow_fp32_to_fp16"
    assert run.sources["precision_mode"] == "torch_npu.npu.set_option(ACL_PRECISION_MODE)"
    assert {"call": "torch_npu.npu.set_option", "args": {"ACL_AICORE_NUM": "8"}} in npu_shim.calls()
    for bad, msg in (({"ACL_PRECISION_MODE": "allow_mix_precision"}, "should be in allow_fp32_to_fp16, "
                                                                     "must_keep_origin_dtype, but got"),
                     ({"ACL_AICORE_NUM": "40"}, "should be in an integer from 1 to 32"),
                     ({"ACL_OP_SELECT_IMPL_MODE": "fast"}, "high_performance, high_precision")):
        with pytest.raises(ValueError, match=msg) as e:     # torch_npu raises ValueError too
            torch_npu.npu.set_option(bad)
        assert isinstance(e.value, AscendEmuError) and "\n" not in str(e.value)
    assert run.precision_mode == "allow_fp32_to_fp16"
    with pytest.raises(TypeError):
        torch_npu.npu.set_option("ACL_PRECISION_MODE")
    torch.use_deterministic_algorithms(True)
    try:
        assert run.deterministic and torch.are_deterministic_algorithms_enabled()
        assert run.sources["deterministic"] == "torch.use_deterministic_algorithms"
    finally:
        torch.use_deterministic_algorithms(False)
    torch_npu.npu.set_deterministic_level(2)
    assert run.effective_deterministic_level == 2
    torch_npu.npu.use_compatible_impl(True)
    assert run.compatible_impl and run.sources["compatible_impl"] == "torch_npu.npu.use_compatible_impl"
    with pytest.raises(AscendEmuError, match="not a torch_npu switch"):
        torch.npu.conv.allow_tf32 = True
    torch_npu.npu.set_compile_mode(jit_compile=False)
    torch_npu.npu.config.allow_internal_format = False
    assert {"call": "torch_npu.npu.set_compile_mode", "args": {"jit_compile": False}} in npu_shim.calls()
    assert {"call": "torch_npu.npu.config.allow_internal_format", "args": {"value": False}} in npu_shim.calls()


def test_autocast_regions(run):
    import torch_npu

    with torch.autocast("npu"):
        assert run.autocast_enabled and run.autocast_dtype is torch.float16
        assert run.sources["autocast_enabled"] == "torch.autocast('npu')"
        with torch.autocast("npu", enabled=False):
            assert not run.autocast_enabled
        assert run.autocast_enabled
    assert not run.autocast_enabled and run.sources["autocast_enabled"] == "default"
    with torch_npu.npu.amp.autocast(dtype=torch.bfloat16):
        assert run.autocast_dtype is torch.bfloat16
        assert run.sources["autocast_dtype"] == "torch_npu.npu.amp.autocast"
    with torch.amp.autocast("npu", dtype=torch.float16):
        assert run.autocast_enabled

    @torch.autocast("npu")
    def f():
        return run.autocast_enabled
    assert f() and not run.autocast_enabled
    with torch.autocast("cpu", dtype=torch.bfloat16):      # other devices: torch's own autocast, options untouched
        assert not run.autocast_enabled and torch.is_autocast_enabled("cpu")


def test_bf16_autocast_refused_on_the_910():
    o = NpuOptions(soc="Ascend910")
    with activate(o), npu_shim.installed():
        import torch_npu

        with pytest.raises(AscendEmuError, match="bf16 autocast is not supported on Ascend910") as e:
            with torch_npu.npu.amp.autocast(dtype=torch.bfloat16):
                pass
        assert "\n" not in str(e.value) and not o.autocast_enabled
        assert torch.npu.get_amp_supported_dtype() == [torch.float16] and not torch.npu.is_bf16_supported()


def _step(scaler, grad_value):
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.5)
    loss = (w * grad_value).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return w.detach()


def test_grad_scaler_defaults_and_skipped_step(run):
    import torch_npu

    for s in (torch.amp.GradScaler("npu"), torch_npu.npu.amp.GradScaler()):
        assert (s.get_scale(), s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == \
            (2.0 ** 16, 2.0, 0.5, 2000)
        assert torch.equal(_step(s, 1.0), torch.full((3,), 0.5))     # a clean step runs, unscaled
        assert torch.equal(_step(s, math.inf), torch.ones(3))         # an overflowing one is skipped ...
        assert s.get_scale() == 2.0 ** 15                             # ... and the scale halves
    static = torch_npu.npu.amp.GradScaler(init_scale=4.0, dynamic=False)
    assert torch.equal(_step(static, 2.0), torch.zeros(3))            # grads * 1/scale, step runs
    w = _step(static, math.inf)                                       # no overflow check: the step runs
    assert not torch.isfinite(w).any() and static.get_scale() == 4.0
    assert any(c["call"] == "torch_npu.npu.amp.GradScaler" and c["args"]["dynamic"] is False
               for c in npu_shim.calls())


def test_switch_without_a_run_is_one_line():
    with npu_shim.installed():
        with pytest.raises(AscendEmuError, match="no emulated run is active; run the script with ascend-emu "
                                                 "torch-run") as e:
            torch.npu.conv.allow_hf32 = False
        assert "\n" not in str(e.value)



def test_after_uninstall():
    autocast, det = torch.autocast, torch.use_deterministic_algorithms
    with activate(NpuOptions()), npu_shim.installed():
        assert torch.autocast is not autocast
    assert torch.autocast is autocast and torch.amp.autocast is autocast
    assert torch.use_deterministic_algorithms is det
    assert not hasattr(torch.Tensor, "npu") and not hasattr(torch.nn.Module, "npu")
    assert not any(m == "torch_npu" or m.startswith("torch_npu.") for m in sys.modules)
    assert torch.zeros(1, device="cpu").device.type == "cpu"
