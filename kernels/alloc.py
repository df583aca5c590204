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

Arrays of ``_ALIGN_BYTES`` or more start on a 64-byte boundary: TensorFlow (Eigen's alignment) adopts such a numpy
array's buffer as a tensor without copying it, so a training step's new weights go into the script's variables
without a copy (an unaligned 1 MiB array took 120-200 us an assign against 45-60 us).
"""
from __future__ import annotations

import math
import sys
import threading

import numpy as np

_PAGE = 4096
_PREFAULT_BYTES = 1 << 20
_FREE_BYTES = 256 << 20
_ALIGN = 64
_ALIGN_BYTES = 1 << 16

_buffers: dict = {}   # bit_length of the size -> uint8 arrays made by empty(), least recently handed out first
_pooled: dict = {}    # id() of those buffers (pooled) -> the offset of its first 64-byte boundary
_dtypes: dict = {}    # what ``empty`` was given as a dtype -> numpy.dtype
_lock = threading.Lock()
_made = [0]           # bytes made since the last look for free buffers beyond _FREE_BYTES


def _free(buf) -> bool:
    # referred to by its bucket and by the two arguments (this one and getrefcount's) only: no array of
    # it is alive
    return sys.getrefcount(buf) == 3


def _trim(keep) -> None:
    """Let go of the oldest free buffers (not ``keep``) while the free ones hold more than _FREE_BYTES."""
    free = [bucket[i] for bucket in _buffers.values() for i in range(len(bucket))
            if bucket[i] is not keep and _free(bucket[i])]
    total = sum(b.size for b in free)
    for b in free:  # least recently handed out first within a bucket; buckets smallest first
        if total <= _FREE_BYTES:
            break
        bucket = _buffers[(b.size - _ALIGN).bit_length()]   # (filed under the size asked for)
        bucket.pop(next(i for i, x in enumerate(bucket) if x is b))
        _pooled.pop(id(b), None)
        total -= b.size


def _offset(buf: np.ndarray) -> int:
    """Where ``buf``'s first 64-byte boundary is, in bytes from its start."""
    # (the address through the array interface: ``ndarray.ctypes`` builds an object and cost 20-30 us a call
    # with the caches cold, as in a replay between kernels, against ~18 us; a pooled buffer's offset is kept)
    return -buf.__array_interface__["data"][0] % _ALIGN


def _aligned(buf: np.ndarray, nbytes: int) -> np.ndarray:
    """``nbytes`` of ``buf`` from its first 64-byte boundary (``buf`` holds ``_ALIGN`` bytes more than asked)."""
    at = _offset(buf)
    return buf[at:at + nbytes]


def _buffer(nbytes: int) -> np.ndarray:
    """nbytes from the first 64-byte boundary of a free buffer of nbytes to 2 * nbytes (the smallest), or of a new
    one, prefaulted.
    The view is made under the lock, so no other thread can take the buffer between the check and the use;
    a reused buffer is made writeable again (a read-only result of ``numerics.memo`` may have viewed it)."""
    with _lock:
        best = None
        k = nbytes.bit_length()
        for bucket in (_buffers.get(k, ()), _buffers.get(k + 1, ())):
            # the most recently handed out first: of the free ones, the likeliest to be still in the cache
            for i in range(len(bucket) - 1, -1, -1):
                size = bucket[i].size
                if nbytes + _ALIGN <= size <= 2 * nbytes and (best is None or size < best.size) and _free(bucket[i]):
                    best, home, at = bucket[i], bucket, i
        if best is not None:
            home.append(home.pop(at))   # buckets stay in the order of their last hand-out
            best.flags.writeable = True
            at = _pooled[id(best)]
            return best[at:at + nbytes]
        buf = np.empty(nbytes + _ALIGN, np.uint8)
        buf[::_PAGE] = 0
        _buffers.setdefault(k, []).append(buf)
        at = _pooled[id(buf)] = _offset(buf)
        _made[0] += nbytes
        if _made[0] > _FREE_BYTES // 4:
            _made[0] = 0
            _trim(buf)
        return buf[at:at + nbytes]


def pooled(a) -> bool:
    """Whether ``a`` is one of the buffers ``empty`` hands out again: its memory outlives every array made from it
    (``numerics.memo`` keys such an array's results by the hand-out's own view, never by the buffer)."""
    return id(a) in _pooled


def _dtype(dtype) -> np.dtype:
    """``np.dtype(dtype)``: a dtype as it is, a type or a name kept per type or name (never a dtype-like that
    compares equal to another one of a different dtype: a numpy scalar, a dtype with metadata)."""
    if isinstance(dtype, np.dtype):
        return dtype
    if type(dtype) is not type and type(dtype) is not str:
        return np.dtype(dtype)
    dt = _dtypes.get(dtype)
    if dt is None:
        dt = np.dtype(dtype)
        if len(_dtypes) < 64:
            _dtypes[dtype] = dt
    return dt


def empty(shape, dtype, align: bool = False) -> np.ndarray:
    """``np.empty(shape, dtype)``; when it holds 1 MiB or more, its pages already faulted in (by the
    calling thread, or by an earlier use of a reused buffer); from 64 KiB on (any size with ``align``),
    64-byte aligned."""
    dt = _dtype(dtype)
    nbytes = (int(shape) if isinstance(shape, (int, np.integer)) else int(math.prod(shape))) * dt.itemsize
    if nbytes < _PREFAULT_BYTES:
        if nbytes < _ALIGN_BYTES and not align:
            return np.empty(shape, dt)
        return _aligned(np.empty(nbytes + _ALIGN, np.uint8), nbytes).view(dt).reshape(shape)
    return _buffer(nbytes).view(dt).reshape(shape)


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (no copy). Arrays gathered into one tuple for a kernel must agree in
    writeability: Numba types a tuple of a writable and a read-only array as a heterogeneous tuple, which a
    kernel cannot index at run time."""
    v = a.view()
    v.flags.writeable = False
    return v
