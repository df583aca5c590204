"""kernels/alloc.py: large output buffers are reused only once nothing refers to them."""
from __future__ import annotations

import gc

import numpy as np

from ascend_emu.kernels import alloc

MB = 1 << 20


def test_a_buffer_in_use_is_never_handed_out_again():
    a = alloc.empty((MB,), np.float32)
    b = alloc.empty((MB,), np.float32)
    view = b[10:20].reshape(2, 5)          # a view keeps its buffer in use
    del b
    c = alloc.empty((MB // 2, 2), np.float32)
    a[:] = 1.0
    view[:] = 2.0
    c[:] = 3.0
    assert (a == 1.0).all() and (view == 2.0).all() and (c == 3.0).all()
    assert not np.shares_memory(c, a) and not np.shares_memory(c, view)


def test_a_free_buffer_is_reused_and_arrays_are_plain():
    a = alloc.empty((3, MB), np.float32)
    addr = a.__array_interface__["data"][0]
    del a
    gc.collect()
    b = alloc.empty((MB, 3), np.float32)   # same byte count: the same pages
    assert b.__array_interface__["data"][0] == addr
    assert b.shape == (MB, 3) and b.dtype == np.float32 and b.flags.c_contiguous and b.flags.writeable
    c = alloc.empty(5 * MB, np.uint16)     # an int shape, a size no free buffer fits
    assert c.shape == (5 * MB,) and c.__array_interface__["data"][0] != addr
    small = alloc.empty((4,), np.float64)
    assert small.base is None               # below 1 MiB: plain numpy


def _free_bytes():
    return sum(b[i].size for b in alloc._buffers.values() for i in range(len(b)) if alloc._free(b[i]))


def test_free_buffers_beyond_the_limit_are_let_go(monkeypatch):
    monkeypatch.setattr(alloc, "_FREE_BYTES", 8 * MB)
    for k in range(12):                      # 12 sizes from 1 to 23 MiB, each freed at once
        alloc.empty(((1 + 2 * k) * MB,), np.uint8)
    alloc.empty((100 * MB,), np.uint8)       # 100 MiB made since the last look: another look
    assert _free_bytes() <= 8 * MB + 100 * MB
    held = alloc.empty((3 * MB,), np.uint8)  # a buffer in use is never let go
    alloc._trim(None)
    assert _free_bytes() <= 8 * MB
    assert any(b[i] is held.base for b in alloc._buffers.values() for i in range(len(b)))


def test_a_buffer_frozen_by_memo_is_writeable_when_reused():
    """numerics.memo freezes a result and the arrays it views, a pooled buffer among them; once the result
    is gone the buffer is handed out again, writeable (a kernel writing to it must not meet a read-only
    array: found in a float32 MobileNetV2 replay after a memoized conv filter died)."""
    from ascend_emu.numerics import memo

    nbytes = 3 << 20

    def root(x):
        while x.base is not None:
            x = x.base
        return x

    a = alloc.empty(nbytes // 4, np.float32)
    memo.freeze(a)
    assert not root(a).flags.writeable
    ident = id(root(a))
    del a
    b = alloc.empty(nbytes // 4, np.float32)
    assert id(root(b)) == ident               # the same buffer, handed out again
    assert b.flags.writeable
    b[:] = 1.0


def test_the_most_recently_handed_out_free_buffer_comes_first():
    """Of several free buffers that fit, the one handed out last (the likeliest still in the cache)."""
    def addr(x):
        return x.__array_interface__["data"][0]

    n = 7 * MB // 4                         # a size class no other test uses
    a = alloc.empty((n,), np.float32)
    b = alloc.empty((n,), np.float32)
    first, second = addr(a), addr(b)
    del a, b
    gc.collect()
    c = alloc.empty((n,), np.float32)
    assert addr(c) == second
    d = alloc.empty((n,), np.float32)       # c still in use: the other one
    assert addr(d) == first
    del c
    gc.collect()
    e = alloc.empty((n,), np.float32)       # d was handed out after c, but d is in use: c's
    assert addr(e) == second
    del d, e
    gc.collect()
    assert addr(alloc.empty((n,), np.float32)) == second   # e (c's buffer) was handed out last


def test_arrays_from_64_kib_on_start_on_a_64_byte_boundary():
    """TensorFlow adopts a 64-byte-aligned numpy array as a tensor without a copy (a training step's new weights
    written into the script's variables): every array of 64 KiB or more, pooled or not, new or reused."""
    for n in (1 << 14, 3 << 15, MB // 4, MB, 3 * MB + 7):
        a = alloc.empty((n,), np.float32)
        assert a.ctypes.data % 64 == 0 and a.shape == (n,) and a.flags.c_contiguous and a.flags.writeable
        del a
        gc.collect()
        b = alloc.empty((n,), np.float32)
        assert b.ctypes.data % 64 == 0


def test_a_reused_pooled_buffer_keeps_its_boundary_and_dtypes_are_kept_apart():
    """A pooled buffer's 64-byte boundary is worked out once, when it is made: every hand-out of it starts there.
    The dtypes ``empty`` is given are never confused (byte order, numpy scalars that compare equal, metadata)."""
    def root(x):
        while x.base is not None:
            x = x.base
        return x

    n = 5 * MB // 4 + 3                       # a size class no other test uses
    for _ in range(3):                        # made, then (usually) handed out again
        a = alloc.empty((n,), np.float32)
        at = a.__array_interface__["data"][0]
        r = root(a)
        assert at % 64 == 0 and alloc.pooled(r)
        assert at - r.__array_interface__["data"][0] == alloc._pooled[id(r)]
        del a, r
        gc.collect()
    meta = np.dtype("f4", metadata={"k": 1})
    for dt in ("float32", np.float32, np.dtype("<f4"), np.dtype(">f4"), ">f4", np.float16, [("x", "<f4")],
               np.float32(1), np.float64(1), np.float16(1), meta, np.dtype("f4"), float):
        want = np.dtype(dt)
        for shape in ((3, 2), (MB // 2,)):     # below and from 64 KiB on (aligned)
            c = alloc.empty(shape, dt)
            assert c.dtype == want and c.dtype.metadata == want.metadata and c.shape == shape
        assert c.__array_interface__["data"][0] % 64 == 0


def test_cube_slabs_start_on_a_64_byte_boundary_at_every_size():
    """kernels/cube/tree16.empty_slabs (alloc.empty with align=True): aligned below 64 KiB too."""
    import importlib

    tree16 = importlib.import_module("ascend_emu.kernels.cube.tree16")
    for shape in ((1, 1, 1, 16, 48), (1, 1, 2, 16, 528), (1, 1, 16, 16, 528), (2, 3, 32, 16, 528)):
        held = [tree16.empty_slabs(shape) for _ in range(3)]
        for s in held:
            assert s.shape == shape and s.dtype == np.float32 and s.flags.c_contiguous and s.flags.writeable
            assert s.__array_interface__["data"][0] % 64 == 0
        assert not np.shares_memory(held[0], held[1]) and not np.shares_memory(held[1], held[2])
