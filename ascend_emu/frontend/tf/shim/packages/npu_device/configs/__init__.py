"""npu_device.configs (stand-in)."""
from ascend_emu.frontend.tf.shim.adapter import NpuConfig, NpuDumpConfig, NpuProfilingConfig  # noqa: F401
