"""npu_bridge.estimator.npu.npu_callbacks (stand-in): broadcasting variables from rank 0 to one rank does
nothing."""
import keras

from ascend_emu.frontend.tf.shim.adapter import note


class NPUBroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    def __init__(self, root_rank, *args, **kwargs):
        super().__init__()
        self.root_rank = root_rank
        note("NPUBroadcastGlobalVariablesCallback: one rank, nothing to broadcast")
