"""The AI CPU fallback of ONNX models: an op without an AI Core kernel runs through onnxruntime.

The ONNX counterpart of :mod:`.aicpu` (TensorFlow's): :func:`run_onnx_node` (in
:mod:`ascend_emu.frontend.onnx.node`) runs the node's own NodeProto alone in onnxruntime, in float32.
"""
from __future__ import annotations

from ..frontend.onnx.node import CACHE_SIZE, _cache, run_onnx_node  # noqa: F401
