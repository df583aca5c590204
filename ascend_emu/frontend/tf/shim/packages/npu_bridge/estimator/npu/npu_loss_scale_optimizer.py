"""npu_bridge.estimator.npu.npu_loss_scale_optimizer (stand-in): ``NPULossScaleOptimizer(opt,
loss_scale_manager, is_distributed=False)``; the train op it returns is loss-scaled by the manager on the
emulated device, whose float status (saturation) or the gradients' Inf/NaN (INF/NaN mode) skips a step."""
from ascend_emu.frontend.tf.shim.runtime import runtime

NPULossScaleOptimizer = runtime().NPULossScaleOptimizer
