"""npu_bridge.estimator.npu_unary_ops (stand-in): the op library object ``npu_unary_ops`` (also reached as
``npu_aicore_ops`` and ``gen_npu_ops``): Gelu and the float-status ops."""
import types

from ascend_emu.frontend.tf.shim.adapter import note
from ascend_emu.frontend.tf.shim.runtime import runtime
from ascend_emu.frontend.tf.tf import import_tf

tf = import_tf()


def gelu(x, name=None):
    """The Gelu op: its host kernel's tanh form 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
    (H tf_adapter/kernels/aicore/npu_unary_ops.cc::GeluOp)."""
    return tf.nn.gelu(x, approximate=True, name=name)


def _last_status():
    import numpy as np

    em = runtime().segments[-1]["emulation"] if runtime().segments else None
    bits = em.steps[-1]["float_status"] if em is not None and em.steps else 0
    return np.array([bits, 0, 0, 0, 0, 0, 0, 0], np.int32)


def npu_get_float_status_v2(name=None):
    """int32[8]: the float status of the last emulated step in element 0 (0 everywhere: no overflow). The
    emulated step reads and clears its own register, so this is what the register held after that step."""
    out = tf.py_function(_last_status, [], tf.int32, name=name)
    out.set_shape([8])
    return out


def npu_clear_float_status_v2(name=None):
    """Each emulated step starts with a clear register: nothing to clear."""
    note("npu_clear_float_status_v2: each emulated step starts with a clear float status")
    return tf.no_op(name=name)


def npu_alloc_float_status(name=None):
    return tf.zeros([8], tf.float32, name=name)


def npu_get_float_status(x, name=None):
    """Legacy form: float32[8], the last emulated step's status in element 0."""
    return tf.cast(npu_get_float_status_v2(name=name), tf.float32)


def npu_clear_float_status(x, name=None):
    note("npu_clear_float_status: each emulated step starts with a clear float status")
    return tf.zeros_like(x, name=name)


npu_unary_ops = types.SimpleNamespace(
    gelu=gelu, npu_get_float_status_v2=npu_get_float_status_v2, npu_clear_float_status_v2=npu_clear_float_status_v2,
    npu_alloc_float_status=npu_alloc_float_status, npu_get_float_status=npu_get_float_status,
    npu_clear_float_status=npu_clear_float_status)
