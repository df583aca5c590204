"""npu_bridge.estimator.npu.npu_estimator (stand-in): NPUEstimator needs tf.estimator."""
from ascend_emu.frontend.tf.shim.adapter import refuse_estimator


class NPUEstimator:
    def __init__(self, model_fn=None, model_dir=None, config=None, params=None, job_start_file="",
                 warm_start_from=None):
        refuse_estimator("NPUEstimator")


class NPUEstimatorSpec:
    def __init__(self, *args, **kwargs):
        refuse_estimator("NPUEstimatorSpec")
