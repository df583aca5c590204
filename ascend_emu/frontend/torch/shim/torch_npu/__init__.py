"""``torch_npu`` as a script sees it under ``ascend-emu torch-run``: the emulated NPU's (not Huawei's package).

This directory is on ``sys.path`` only while :func:`ascend_emu.frontend.torch.npu_shim.installed` is active;
everything here is built in :mod:`ascend_emu.frontend.torch.npu_shim`.
"""
import sys

import torch  # noqa: F401  (torch_npu is imported after torch and extends it)

from ascend_emu.frontend.torch import npu_shim as _shim

__ascend_emu_shim__ = True
__version__ = "2.13.0+ascend-emu"

npu = _shim.npu
sys.modules["torch_npu.npu"] = _shim.npu
sys.modules["torch_npu.npu.amp"] = _shim.amp
globals().update(_shim.TOP_LEVEL)
