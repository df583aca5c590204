"""npu_device.train.optimizer (stand-in): ``NpuLossScaleOptimizer(inner_optimizer, dynamic=True,
initial_scale=None, dynamic_growth_steps=None)``, Keras' LossScaleOptimizer (which the adapter's subclasses)
whose overflow check on the emulated device reads the float status under saturation, and Keras' own
finiteness check under INF/NaN."""
from ascend_emu.frontend.tf.keras_hooks import keras_loss_scale_optimizer as NpuLossScaleOptimizer  # noqa: F401
