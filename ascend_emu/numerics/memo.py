"""Results derived from immutable arrays, computed once per array and reused.

A replay recomputes the same things from the same constants every time: the fp16 cast of each
weight, the widened, padded and packed filter the cube kernels read. :func:`memo` keeps such a
result with the array it came from, under a key naming everything else it depends on (the
operand dtype, overflow and subnormal modes, the cube model, the layout), and returns it again
for the same array and key.

Only for *frozen* arrays (:func:`frozen`): read-only, and every array they view read-only too, so
no numpy operation can change their bits without first flipping a flag back on purpose. A
writeable array is never memoized (its result is computed every time, as before): a cache that
returned the result of a constant since changed in place would be wrong bits. Entries are keyed
by the identity of the array that owns the memory (the end of the view's ``base`` chain; for the kernels'
pooled buffers, which are handed out again, the view of one hand-out), with the
view's byte offset into it, dtype, shape and strides in the key, and die with it (a weak reference),
so a new array at the same address never meets an old entry. A frozen view's bits are those of its
owner's frozen memory at that offset and layout, so a new view made the same way (a replay's Reshape
of a weight, made afresh every replay) meets the entries of the one before it. The library freezes
what it owns and nobody else holds: the constants the fusion passes fold and the memoized results
themselves. What this cannot see: an array made writeable, changed and frozen again between two calls
keeps its old entries (the library never does that to the arrays it freezes; a memo call that finds
the owner writeable drops them).
"""
from __future__ import annotations

import weakref

import numpy as np

from ..kernels import alloc as _alloc

# id(array) -> (weak reference to it, {key: result}). No lock: single dict operations are atomic under
# the GIL, and a weak reference's callback (run whenever an array dies, possibly inside this module)
# must not wait for one; two threads building the same entry at once only compute it twice.
_ENTRIES: dict = {}


def frozen(a) -> bool:
    """True when ``a`` is a read-only ndarray whose every base array is read-only as well."""
    if not isinstance(a, np.ndarray):
        return False
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    # the memory's owner is not an ndarray: bytes and other immutable buffers are fine, a
    # writable buffer (bytearray, mmap, another library's array) could change under us
    return a is None or isinstance(a, bytes)


def freeze(a: np.ndarray) -> np.ndarray:
    """Make ``a`` and the arrays it views read-only (for arrays the library owns); returns ``a``."""
    b = a
    while isinstance(b, np.ndarray):
        b.flags.writeable = False
        b = b.base
    return a


def _forget(ident: int, ref, entries=_ENTRIES) -> None:
    # the dict is bound at definition: at interpreter exit the module's globals are cleared (set to None)
    # before the last arrays die, and a callback reading the global printed "Exception ignored" then
    entry = entries.get(ident)
    if entry is not None and entry[0] is ref:
        entries.pop(ident, None)


def _owner(a):
    """The last ndarray of ``a``'s base chain: the array whose memory ``a`` views (``a`` itself if it owns it); for
    memory of the kernels' buffer pool (``kernels.alloc``), which is handed out again once its arrays die, the view
    of this hand-out instead (it dies with them, and its entries with it)."""
    while isinstance(a.base, np.ndarray):
        if _alloc.pooled(a.base):
            return a
        a = a.base
    return a


def memo(a: np.ndarray, key, build):
    """``build()``, computed once per frozen array ``a`` and hashable ``key``; every time otherwise.

    ``key`` must name everything besides ``a``'s bits that the result depends on. Results that are
    arrays are frozen, so no consumer can change a cached result in place."""
    root = _owner(a) if isinstance(a, np.ndarray) else a
    if not frozen(a):
        if isinstance(root, np.ndarray) and root.flags.writeable:
            entry = _ENTRIES.get(id(root))
            if entry is not None and entry[0]() is root:
                _ENTRIES.pop(id(root), None)   # it may change now: its old results must not come back
        return build()
    # the view's place in its owner's memory and the attributes numpy lets one set in place
    offset = 0 if root is a else a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    key = (key, a.dtype, a.shape, a.strides, offset)
    ident = id(root)
    entry = _ENTRIES.get(ident)
    if entry is not None and entry[0]() is root:
        hit = entry[1].get(key)
        if hit is not None:
            return hit
    value = build()
    for v in value if isinstance(value, tuple) else (value,):
        if isinstance(v, np.ndarray):
            freeze(v)
    entry = _ENTRIES.get(ident)
    if entry is None or entry[0]() is not root:
        entry = (weakref.ref(root, lambda r, i=ident, forget=_forget: forget(i, r)), {})
        _ENTRIES[ident] = entry
    entry[1][key] = value
    return value


def clear() -> None:
    """Drop every memoized result."""
    _ENTRIES.clear()
