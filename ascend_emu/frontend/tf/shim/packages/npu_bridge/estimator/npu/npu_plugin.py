"""npu_bridge.estimator.npu.npu_plugin (stand-in): the overflow mode of the emulated device."""
from ascend_emu.frontend.tf.shim.adapter import where
from ascend_emu.frontend.tf.shim.runtime import runtime


def set_device_sat_mode(mode):
    """0: saturation, 1: INF/NaN (the sessions made after it)."""
    runtime().set_sat_mode(mode, f"npu_plugin.set_device_sat_mode at {where()}")


def is_inf_nan_enabled():
    return runtime().emulation.device.overflow_mode == "inf_nan"
