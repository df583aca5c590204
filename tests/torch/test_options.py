"""torch_npu's options object: defaults per SoC, validation in one line, sources recorded."""
import pytest

torch = pytest.importorskip("torch")

from ascend_emu.errors import AscendEmuError  # noqa: E402
from ascend_emu.frontend.torch import options as opts  # noqa: E402


def test_defaults_follow_torch_npu():
    o = opts.NpuOptions()
    assert (o.soc, o.precision_mode, o.allow_hf32_matmul, o.allow_hf32_conv, o.cube_math_type) == \
        ("Ascend910B", None, False, True, None)
    assert o.autocast_dtype is torch.float16 and not o.autocast_enabled and not o.compatible_impl
    assert o.effective_precision_mode == "must_keep_origin_dtype"
    assert opts.NpuOptions(soc="Ascend910").effective_precision_mode == "allow_fp32_to_fp16"
    assert set(o.sources.values()) == {"default"}
    assert o.effective_deterministic_level == 0


def test_set_records_source_and_validates():
    o = opts.NpuOptions()
    o.set("allow_hf32_conv", False, "torch.npu.conv.allow_hf32")
    assert o.allow_hf32_conv is False and o.sources["allow_hf32_conv"] == "torch.npu.conv.allow_hf32"
    o.set("cube_math_type", "USE_HF32", "torch.npu.matmul.cube_math_type")
    assert o.cube_math_type == 3
    o.set("precision_mode", "allow_fp32_to_fp16", "set_option")
    assert o.effective_precision_mode == "allow_fp32_to_fp16"
    o.deterministic = True
    assert o.sources["deterministic"] == "attribute" and o.effective_deterministic_level == 1
    for name, bad in (("precision_mode", "force_fp16"), ("allow_hf32_matmul", 1), ("cube_math_type", 7),
                      ("soc", "Ascend911"), ("deterministic_level", 5), ("autocast_dtype", torch.float32),
                      ("nonsense", 1)):
        with pytest.raises(AscendEmuError) as e:
            o.set(name, bad, "test")
        assert "\n" not in str(e.value)
    assert o.precision_mode == "allow_fp32_to_fp16"  # a refused value changes nothing


def test_bf16_autocast_refused_on_910():
    o = opts.NpuOptions(soc="Ascend910")
    o.set("autocast_dtype", torch.bfloat16, "test")  # the dtype alone is fine: autocast is off
    with pytest.raises(AscendEmuError, match="bf16 autocast is not supported on Ascend910"):
        o.set("autocast_enabled", True, "torch.autocast")
    with pytest.raises(AscendEmuError, match="Ascend310P3"):
        opts.NpuOptions(soc="Ascend310P", autocast_enabled=True, autocast_dtype=torch.bfloat16)
    ok = opts.NpuOptions(autocast_enabled=True, autocast_dtype="bf16")
    assert ok.autocast_dtype is torch.bfloat16


def test_current_and_override():
    assert opts.current() is None
    o = opts.NpuOptions()
    with opts.activate(o):
        assert opts.current() is o
        with o.overridden("torch.autocast", autocast_enabled=True):
            assert o.autocast_enabled and o.sources["autocast_enabled"] == "torch.autocast"
        assert not o.autocast_enabled and o.sources["autocast_enabled"] == "default"
    assert opts.current() is None
    assert opts.NpuOptions().as_dict()["autocast_dtype"] == "float16"
