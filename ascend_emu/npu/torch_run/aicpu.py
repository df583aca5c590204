"""The AI CPU (and host) of exported PyTorch programs: an ``Aten<Op>`` node runs in torch.

The ``.pt2`` counterpart of :mod:`ascend_emu.npu.aicpu_onnx`: :func:`run_aten_node` (in
:mod:`ascend_emu.frontend.torch.pt2.node`) runs the node's aten overload on its inputs.
"""
from __future__ import annotations

from ...frontend.torch.pt2.node import run_aten_node  # noqa: F401
