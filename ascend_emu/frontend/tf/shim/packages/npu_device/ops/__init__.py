"""npu_device.ops (stand-in)."""
from ascend_emu.frontend.tf.shim.adapter import note as _note
from ascend_emu.frontend.tf.tf import import_tf as _import_tf


def gelu(x):
    """The adapter's gelu: FastGelu in a graph (its formula unconfirmed), the exact GELU eagerly
    (H TF2/ops/train_ops.py::gelu). Here the exact GELU in both, noted in a graph."""
    tf = _import_tf()
    if not tf.executing_eagerly():
        _note("npu.ops.gelu in a graph: FastGelu on the device (formula unconfirmed); the exact GELU here")
    return tf.nn.gelu(x, approximate=False)
