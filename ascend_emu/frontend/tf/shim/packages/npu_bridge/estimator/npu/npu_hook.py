"""npu_bridge.estimator.npu.npu_hook (stand-in): session hooks of one rank."""
from ascend_emu.frontend.tf.tf import import_tf

tf = import_tf()
_Hook = tf.compat.v1.train.SessionRunHook


class NPUBroadcastGlobalVariablesHook(_Hook):
    def __init__(self, root_rank=None, index=None):
        self.root_rank, self.index = root_rank, index


class NPUCheckpointSaverHook(tf.compat.v1.train.CheckpointSaverHook):
    pass


class NPUOutputTensorHook(tf.compat.v1.train.LoggingTensorHook):
    pass


class SetIterationsVarHook(_Hook):
    def __init__(self, iterations_per_loop=None):
        self.iterations_per_loop = iterations_per_loop


class TellMeStepOrLossHook(_Hook):
    def __init__(self, *args, **kwargs):
        pass
