"""ascend-emu: emulate the numerics of Huawei's Ascend NPU on a CPU.

The public API is imported lazily so that comparison and reporting never pull in
TensorFlow or compile kernels they do not use. The package is layered (ARCHITECTURE.md):
``numerics`` and ``graph`` at the bottom, then ``ops`` and ``analysis``, ``frontend``
(TensorFlow), ``npu`` (the emulated device), ``tools`` and ``cli`` on top.
"""
from __future__ import annotations

import importlib
import os

from . import _compat

# The parallel kernels run on Numba's OpenMP pool. GNU OpenMP's default lets the worker threads spin
# between parallel regions; when the cores are shared with other processes (CI runners, shared servers) a
# spinning or descheduled worker stalls every following kernel: an fp16 add of 524k elements took 60 ms
# instead of 1 ms on two cores shared with seven jobs. Passive waiting (threads sleep at once) is read when
# OpenMP starts, i.e. at the first parallel kernel, after this import; a value the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from .version import __version__  # noqa: F401

_API = {
    # numerics core
    "cast": "ascend_emu.numerics.vector",
    "vector": "ascend_emu.numerics.vector",
    "to_hf32": "ascend_emu.numerics.hf32",
    "reduce": "ascend_emu.numerics.reduction",
    "VECTOR_OPS": "ascend_emu.numerics.vector",
    "matmul": "ascend_emu.numerics.cube",
    "matmul_lowfloat": "ascend_emu.numerics.lowfloat",
    "mx_matmul": "ascend_emu.numerics.lowfloat",
    "mx_values": "ascend_emu.numerics.lowfloat",
    "mx_quantize": "ascend_emu.numerics.lowfloat",
    "batch_matmul": "ascend_emu.numerics.cube",
    "conv2d": "ascend_emu.numerics.cube",
    "depthwise_conv2d": "ascend_emu.numerics.cube",
    "CubeModel": "ascend_emu.numerics.policy",
    "NumericsPolicy": "ascend_emu.numerics.policy",
    "SOCS": "ascend_emu.numerics.policy",
    "MultiCoreModel": "ascend_emu.numerics.multicore",
    "MULTICORE_OPS": "ascend_emu.ops.multicore",
    "FloatStatus": "ascend_emu.numerics.status",
    "decode_status": "ascend_emu.numerics.status",
    "FixedLossScaleManager": "ascend_emu.npu.loss_scale",
    "ExponentialUpdateLossScaleManager": "ascend_emu.npu.loss_scale",
    "AscendEmuError": "ascend_emu.errors",
    # graphs
    "load_graph": "ascend_emu.frontend.tf.loader",
    "reference": "ascend_emu.frontend.tf.reference",
    "Device": "ascend_emu.npu.device",
    # dumps and analysis
    "load_dump": "ascend_emu.analysis.dump",
    "op_selector": "ascend_emu.analysis.dump",
    "compare": "ascend_emu.analysis.compare",
    "overflow_report": "ascend_emu.analysis.overflow",
    "write_report": "ascend_emu.analysis.report",
    "export_msprobe": "ascend_emu.analysis.msprobe",
    "import_msprobe": "ascend_emu.analysis.msprobe",
    # jobs
    "fusion_bisect": "ascend_emu.tools.bisect",
    "check": "ascend_emu.tools.check",
    "write_check_report": "ascend_emu.analysis.check_report",
    "random_errors": "ascend_emu.tools.random_errors",
    "compare_runs": "ascend_emu.analysis.runs",
    "mixlist_search": "ascend_emu.tools.mixlist_search",
    "fit": "ascend_emu.tools.fit",
    "sensitivity": "ascend_emu.tools.sensitivity",
    "Sweep": "ascend_emu.tools.sweep",
    "ReplayTask": "ascend_emu.tools.sweep",
    "SweepContext": "ascend_emu.tools.sweep",
    "reference_train": "ascend_emu.npu.training",
    "first_step": "ascend_emu.npu.training",
    "train_step_from_tf_function": "ascend_emu.frontend.tf.stateful",
    "train_step_from_tf1_graph": "ascend_emu.frontend.tf.tf1_step",
    "write_train_report": "ascend_emu.analysis.train_report",
    # the user's own script
    "emulate": "ascend_emu.npu.emulate",
    "Emulation": "ascend_emu.npu.emulate",
    "SkippedStepsWarning": "ascend_emu.npu.emulate",
    "NpuLossScaleOptimizer": "ascend_emu.frontend.tf.keras_hooks",
}
#: submodules offered as attributes of the package (``ascend_emu.tf1.wrap(sess)``)
_SUBMODULES = {"tf1": "ascend_emu.npu.tf1",
               # PyTorch eager scripts (ae.torch.emulate); torch is imported only when this is used
               "torch": "ascend_emu.npu.torch_run"}

__all__ = sorted(_API) + sorted(_SUBMODULES) + ["__version__"]


def __getattr__(name):
    if name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
        globals()[name] = value
        return value
    mod = _API.get(name)
    if mod is None:
        raise AttributeError(f"module 'ascend_emu' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__


_compat.install({f"ascend_emu.{k}": v for k, v in _SUBMODULES.items()})   # `import ascend_emu.torch` too
