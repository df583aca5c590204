"""Operand values that several cube ops of one replay derive from the same tensor, made once per replay.

A training step's convolutions read each activation twice: the forward Conv2D and the Conv2DBackpropFilter of the
same layer both widen x (fp16) into the same zero-padded float32 buffer and test it for NaN, and the two backprop
convolutions of a layer both test dy. The replay (``npu/replay.py``) opens a store for the cube ops it runs
(:func:`begin` / :func:`end`); :func:`shared` returns what an earlier op of the same replay derived from the same
array under the same key, else builds it. Outside a replay (no store open) every call builds.

Sound because a replay's tensors are never changed once made: every op returns new arrays (``ops/apply_ops.py``:
even the variable updates are pure), so the same array object holds the same bits for the whole replay. The store
holds each array it keys (an id is never reused while its entry lives) and dies with the replay. The values handed
out are read by the kernels, never written.
"""
from __future__ import annotations

import contextvars

#: the open store of the replay running on this thread: (id(array), key) -> (array, value); None: none open
_STORE: contextvars.ContextVar = contextvars.ContextVar("ascend_emu_shared_operands", default=None)


def begin(store: dict):
    """Open ``store`` (a replay's dict) for the ops that follow on this thread; returns the token for :func:`end`."""
    return _STORE.set(store)


def end(token) -> None:
    _STORE.reset(token)


def active() -> bool:
    return _STORE.get() is not None


def shared(a, key, build, usable=None):
    """``build()``, or the value an earlier call of this replay built for the same array ``a`` and hashable ``key``
    (and that ``usable(value)`` accepts, when given; a rebuilt value replaces it)."""
    store = _STORE.get()
    if store is None:
        return build()
    k = (id(a), key)
    hit = store.get(k)
    if hit is not None and hit[0] is a and (usable is None or usable(hit[1])):
        return hit[1]
    value = build()
    store[k] = (a, value)
    return value
