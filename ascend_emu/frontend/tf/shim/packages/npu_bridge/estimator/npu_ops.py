"""npu_bridge.estimator.npu_ops (stand-in; H TF1/estimator/npu_ops.py)."""
from ascend_emu.frontend.tf.shim.adapter import note
from ascend_emu.frontend.tf.tf import import_tf

tf = import_tf()


def dropout(x, keep_prob, noise_shape=None, seed=None, name=None):
    """``tf.nn.dropout`` with keep probability ``keep_prob`` in (0, 1] (1.0: ``x``); graph mode only, as the
    adapter's (its DropOutGenMask / DropOutDoMask draw their own mask: the emulated run draws TensorFlow's)."""
    if tf.executing_eagerly():
        raise RuntimeError("npu_ops.dropout() is not supported in eager mode.")
    if isinstance(keep_prob, (int, float)):
        if not 0 < keep_prob <= 1:
            raise ValueError(f"keep_prob must be a scalar tensor or a float in the range (0, 1], got {keep_prob}")
        if keep_prob == 1:
            return x
    return tf.nn.dropout(x, rate=1 - keep_prob, noise_shape=noise_shape, seed=seed, name=name)


def initialize_system(name=None):
    """An op the script runs once at the start; nothing to initialise on the emulated device."""
    note("npu_ops.initialize_system: nothing to initialise")
    return tf.no_op(name=name)


def shutdown_system(name=None):
    note("npu_ops.shutdown_system: nothing to shut down")
    return tf.no_op(name=name)
