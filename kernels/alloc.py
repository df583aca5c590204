"""Output buffers for the parallel kernels.

A fresh large numpy array is mapped but not yet backed by memory: its first write faults
every page in. When the two threads of a parallel kernel do that at once the faults contend,
and on the 2-core VM this project is measured on they took 5-6x as long as the same faults
from one thread (widening 9.6M fp16 values into a fresh buffer: 26 ms, against 4.4 ms with the
pages touched first by the calling thread and 2.1 ms into a reused buffer). ``empty`` touches
one byte per page of large buffers in the calling thread before any kernel writes to them.
"""
from __future__ import annotations

import numpy as np

_PAGE = 4096
_PREFAULT_BYTES = 1 << 20


def empty(shape, dtype) -> np.ndarray:
    """``np.empty(shape, dtype)``, its pages faulted in by the calling thread when it holds 1 MiB or more."""
    a = np.empty(shape, dtype)
    if a.nbytes >= _PREFAULT_BYTES:
        a.reshape(-1).view(np.uint8)[::_PAGE] = 0
    return a
