"""npu_bridge.estimator.npu.npu_loss_scale_manager (stand-in): the emulator's managers, which keep the adapter's
rules and defaults (decr_every_n_nan_or_inf=2, incr_ratio=2, decr_ratio=0.8; ascend_emu.npu.loss_scale)."""
from ascend_emu.frontend.tf.shim.runtime import runtime

FixedLossScaleManager = runtime().FixedLossScaleManager
ExponentialUpdateLossScaleManager = runtime().ExponentialUpdateLossScaleManager
