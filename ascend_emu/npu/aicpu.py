"""The AI CPU fallback: an op without an AI Core kernel runs through TensorFlow itself.

Ascend runs ops that have no AI Core kernel on its AI CPU, in their original dtype. The
emulator does the same: :func:`run_tf_node` (in :mod:`ascend_emu.frontend.tf.tfnode`, which the
float32 reference shares) places the node's own NodeDef in a tiny graph whose inputs are
placeholders and runs it in a Session, built once per (node, input dtypes).
"""
from __future__ import annotations

from ..frontend.tf.tfnode import CACHE_SIZE, _build, _cache, clear_cache, run_tf_node  # noqa: F401
