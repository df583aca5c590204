"""npu_bridge.estimator.npu.keras_to_npu (stand-in): model_to_npu_estimator needs tf.estimator."""
from ascend_emu.frontend.tf.shim.adapter import refuse_estimator


def model_to_npu_estimator(*args, **kwargs):
    refuse_estimator("keras_to_npu.model_to_npu_estimator")
