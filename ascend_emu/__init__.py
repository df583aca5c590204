"""ascend-emu: emulate the numerics of Huawei's Ascend NPU on a CPU.

The public API is imported lazily so that comparison and reporting never pull in
TensorFlow or compile kernels they do not use.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    # numerics core
    "cast": "ascend_emu.numerics",
    "vector": "ascend_emu.numerics",
    "reduce": "ascend_emu.numerics",
    "VECTOR_OPS": "ascend_emu.numerics",
    "matmul": "ascend_emu.cube",
    "batch_matmul": "ascend_emu.cube",
    "conv2d": "ascend_emu.cube",
    "depthwise_conv2d": "ascend_emu.cube",
    "CubeModel": "ascend_emu.config",
    "FloatStatus": "ascend_emu.status",
    "decode_status": "ascend_emu.status",
    "FixedLossScaleManager": "ascend_emu.loss_scale",
    "ExponentialUpdateLossScaleManager": "ascend_emu.loss_scale",
    "AscendEmuError": "ascend_emu.errors",
    # graphs
    "load_graph": "ascend_emu.loader",
    "reference": "ascend_emu.tf_reference",
    "Device": "ascend_emu.device",
    # dumps and analysis
    "load_dump": "ascend_emu.dump",
    "compare": "ascend_emu.comparison",
    "overflow_report": "ascend_emu.overflow",
    "write_report": "ascend_emu.report",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name):
    mod = _API.get(name)
    if mod is None:
        raise AttributeError(f"module 'ascend_emu' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
