"""Operand values that several cube ops of one replay derive from the same tensor, made once per replay.

A training step's convolutions read each activation twice: the forward Conv2D and the Conv2DBackpropFilter of the
same layer both widen x (fp16) into the same zero-padded float32 buffer and test it for NaN, and the two backprop
convolutions of a layer both test dy. The replay (``npu/replay.py``) opens a :class:`Store` for the cube ops it
runs (:func:`begin` / :func:`end`); :func:`shared` returns what an earlier op of the same replay derived from the
same array under the same key, else builds it. Outside a replay (no store open) every call builds.

Sound because a replay's tensors are never changed once made: every op returns new arrays (``ops/apply_ops.py``:
even the variable updates are pure), so the same array object holds the same bits for the whole replay. Entries are
keyed by the array's identity and die with it (a weak reference, as ``numerics/memo.py``'s): a tensor the replay
releases after its last reader takes its derived buffers with it, so an inference replay holds no more memory than
before, and a new array at the same address never meets an old entry. A store holds at most :data:`LIMIT_BYTES`
of derived arrays at once (a training step keeps each layer's x alive from its forward to its filter gradient);
beyond that, values are built and not kept. The values handed out are read by the kernels, never written.
"""
from __future__ import annotations

import contextvars
import weakref

import numpy as np

#: the most bytes of derived arrays one replay's store holds at once
LIMIT_BYTES = 64 << 20

#: the open store of the replay running on this thread; None: none open
_STORE: contextvars.ContextVar = contextvars.ContextVar("ascend_emu_shared_operands", default=None)


def _nbytes(value) -> int:
    return sum(v.nbytes for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, np.ndarray))


class Store:
    """One replay's derived values: id(array) -> (weak reference to the array, {key: value}), and their bytes."""

    __slots__ = ("entries", "nbytes", "__weakref__")

    def __init__(self):
        self.entries: dict = {}
        self.nbytes = 0

    def _drop(self, ident: int, ref) -> None:
        # the array died: its values go (run by the weak reference, on whichever thread dropped it)
        entry = self.entries.get(ident)
        if entry is not None and entry[0] is ref:
            del self.entries[ident]
            self.nbytes -= sum(_nbytes(v) for v in entry[1].values())


def begin(store: Store):
    """Open ``store`` for the ops that follow on this thread; returns the token for :func:`end`."""
    return _STORE.set(store)


def end(token) -> None:
    _STORE.reset(token)


def active() -> bool:
    return _STORE.get() is not None


def shared(a, key, build, usable=None):
    """``build()``, or the value an earlier call of this replay built for the same array ``a`` (alive since) and
    hashable ``key`` (and that ``usable(value)`` accepts, when given; a rebuilt value replaces it)."""
    store = _STORE.get()
    if store is None:
        return build()
    ident = id(a)
    entry = store.entries.get(ident)
    if entry is not None and entry[0]() is a:
        hit = entry[1].get(key)
        if hit is not None and (usable is None or usable(hit)):
            return hit
    else:
        entry = None
    value = build()
    n = _nbytes(value)
    old = entry[1].get(key) if entry is not None else None
    if store.nbytes + n - (0 if old is None else _nbytes(old)) > LIMIT_BYTES:
        return value
    if entry is None:
        try:
            ref = weakref.ref(a, _dropper(store, ident))
        except TypeError:   # (not weakly referenceable: nothing kept)
            return value
        entry = store.entries[ident] = (ref, {})
    if old is not None:
        store.nbytes -= _nbytes(old)
    entry[1][key] = value
    store.nbytes += n
    return value


def _dropper(store: Store, ident: int):
    # the callback holds the store weakly: a store that died first (its replay ended) has nothing to drop
    home = weakref.ref(store)

    def drop(ref, home=home, ident=ident):
        s = home()
        if s is not None:
            s._drop(ident, ref)
    return drop
