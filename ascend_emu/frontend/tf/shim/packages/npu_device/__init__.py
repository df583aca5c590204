"""ascend-emu's stand-in for the Ascend TF adapter's ``npu_device`` (TF2; H tf_adapter_2.x/python/npu_device):
``import npu_device as npu``, ``npu.global_options()`` fields, then ``npu.open().as_default()``: the options set
the emulated NPU that the script's Keras training runs on."""
import contextlib

from ascend_emu.frontend.tf.shim import adapter as _adapter
from ascend_emu.frontend.tf.shim.adapter import keep_dtype_scope  # noqa: F401
from ascend_emu.frontend.tf.shim.runtime import runtime as _runtime

_runtime()      # ImportError with how to run the script, outside ascend-emu run

from npu_device import compat, configs, distribute, ops, train  # noqa: E402,F401

_options = []
_opened = []


def global_options():
    """The process's NpuConfig: set its fields before ``open()``."""
    if not _options:
        _options.append(_adapter.NpuConfig())
    return _options[0]


class NpuDeviceHandle:
    """What ``open()`` returns: one emulated device, rank 0 of 1."""

    workers_num = 1
    worker_id = 0

    def __init__(self, device_id):
        self.device_id = device_id

    def name(self):
        return f"/job:localhost/replica:0/task:0/device:NPU:{self.device_id}"

    def scope(self):
        return contextlib.nullcontext()

    def is_cluster_worker(self):
        return False

    def as_default(self):
        """The options of global_options() become the emulated device's (TensorFlow itself runs on the CPU)."""
        params = global_options().parameter_map()
        _runtime().configure(params, f"npu.global_options() at npu.open().as_default() ({_adapter.where()})")
        return self


def open(device_id=None):  # noqa: A001  (the adapter's name)
    """One device per process, as the adapter's."""
    import os

    if _opened:
        raise RuntimeError("npu_device: a device is already open in this process; only one device per process")
    if device_id is None:
        device_id = int(os.environ.get("ASCEND_DEVICE_ID", "0"))
    handle = NpuDeviceHandle(device_id)
    _opened.append(handle)
    return handle


def npu_compat_function(func=None, *args, **kwargs):
    import tensorflow as tf

    return tf.function(func, *args, **kwargs) if func is not None else tf.function(*args, **kwargs)


def set_npu_loop_size(loop_size):
    _adapter.note(f"set_npu_loop_size({loop_size}): one emulated step per call")


@contextlib.contextmanager
def npu_run_context(*args, **kwargs):
    yield


def set_device_sat_mode(mode):
    """0: saturation, 1: INF/NaN (the device opened after it)."""
    _runtime().set_sat_mode(mode, f"npu.set_device_sat_mode at {_adapter.where()}")


def is_inf_nan_enabled():
    return _runtime().emulation.device.overflow_mode == "inf_nan"


def npu_recompute_scope():
    return _adapter.noted_scope("npu_recompute_scope")


from npu_bridge.estimator.npu_unary_ops import npu_unary_ops as gen_npu_ops  # noqa: E402,F401
