"""npu_device.compat (stand-in)."""


def enable_v1():
    """TF1 behaviour, as the adapter's (which also loads its TF1 op library)."""
    import tensorflow as tf

    tf.compat.v1.disable_v2_behavior()
