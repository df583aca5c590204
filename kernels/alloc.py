"""Output buffers for the parallel kernels.

A fresh large numpy array is mapped but not yet backed by memory: its first write faults
every page in. When the two threads of a parallel kernel do that at once the faults contend,
and on the 2-core VM this project is measured on they took 5-6x as long as the same faults
from one thread (widening 9.6M fp16 values into a fresh buffer: 26 ms, against 4.4 ms with the
pages touched first by the calling thread and 2.1 ms into a reused buffer). ``empty`` touches
one byte per page of large buffers in the calling thread before any kernel writes to them.

Large buffers are also reused: ``empty`` keeps every large buffer it made, and hands one out
again once nothing but this module refers to it (every array made from it holds a reference to
it, numpy's ``base``), so a training step's tensors land in pages faulted in by an earlier step
instead of freshly mapped ones. Buffers nobody uses beyond ``_FREE_BYTES`` are let go, oldest first.
"""
from __future__ import annotations

import sys
import threading

import numpy as np

_PAGE = 4096
_PREFAULT_BYTES = 1 << 20
_FREE_BYTES = 256 << 20

_buffers: list = []   # uint8 arrays made by empty(), oldest first
_lock = threading.Lock()


def _free(i: int) -> bool:
    # referred to by the list and by getrefcount's argument only: no array of it is alive
    return sys.getrefcount(_buffers[i]) == 2


def _buffer(nbytes: int) -> np.ndarray:
    """A free buffer of nbytes to 2 * nbytes (the smallest), or a new one, prefaulted."""
    with _lock:
        best = -1
        for i in range(len(_buffers)):
            size = _buffers[i].size
            if nbytes <= size <= 2 * nbytes and (best < 0 or size < _buffers[best].size) and _free(i):
                best = i
        if best >= 0:
            buf = _buffers.pop(best)
            _buffers.append(buf)
            return buf
        buf = np.empty(nbytes, np.uint8)
        buf[::_PAGE] = 0
        _buffers.append(buf)
        free = sum(_buffers[i].size for i in range(len(_buffers)) if _free(i))
        i = 0
        while free > _FREE_BYTES and i < len(_buffers):
            if _buffers[i] is not buf and _free(i):
                free -= _buffers.pop(i).size
            else:
                i += 1
        return buf


def empty(shape, dtype) -> np.ndarray:
    """``np.empty(shape, dtype)``; when it holds 1 MiB or more, its pages already faulted in (by the
    calling thread, or by an earlier use of a reused buffer)."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if nbytes < _PREFAULT_BYTES:
        return np.empty(shape, dt)
    return _buffer(nbytes)[:nbytes].view(dt).reshape(shape)
