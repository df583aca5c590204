"""What every interception of :mod:`ascend_emu.frontend.tf.hooks` shares: the pass-through switch (the
emulator's own TensorFlow calls and nested calls run unhooked) and the check of a step's arrays."""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from ...errors import AscendEmuError
from .tf import import_tf

_local = threading.local()


@contextlib.contextmanager
def passthrough():
    """While inside: TensorFlow and Keras run unhooked (the emulator's own TF calls, nested calls)."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def _bypassed() -> bool:
    return getattr(_local, "depth", 0) > 0


def _numpy(t, what: str) -> np.ndarray:
    tf = import_tf()
    if t is None:
        raise AscendEmuError(f"emulate: {what} is missing; an emulated step takes inputs and targets")
    if isinstance(t, (dict, list, tuple)):
        raise AscendEmuError(f"emulate: {what} is a {type(t).__name__}; an emulated step takes one array of "
                             "inputs and one of targets")
    if isinstance(t, (tf.RaggedTensor, tf.SparseTensor)):
        raise AscendEmuError(f"emulate: {what} is a {type(t).__name__}; dense arrays only")
    return np.asarray(t)
