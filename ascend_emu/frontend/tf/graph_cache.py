"""Loaded graphs kept per model object, so replaying a Keras model or tf.function again does not trace and
freeze it again (:meth:`ascend_emu.npu.device.Device.replay` of an object it has seen).

A Keras model, a ``tf.function`` with an ``input_signature`` or a ConcreteFunction is loaded once per
(object, signature, input shapes); the entry holds a copy of every variable's value, and a later call uses
it only while the object has the same variables with the same bytes (a training step, ``set_weights`` or an
``assign`` loads it afresh). The entry dies with the object (weak keys). What the cache cannot see: a change
of the object's Python code or attributes that changes the traced graph without touching a variable (a
subclassed model's flag read in ``call``); :func:`clear` forgets every entry. Paths, GraphDefs and
Graphs are loaded as before.
"""
from __future__ import annotations

import os
import weakref

import numpy as np

from ...graph.core import Graph
from .loader import load_graph
from ..shapes import shape_items
from .sources import _is_keras_model
from .tf import import_tf

#: model object -> {(signature, input shapes): (Graph, variable ids, their values)}
_SEEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: (signature, shapes) entries kept per object
_PER_OBJECT = 4


def _variables(model) -> list | None:
    """The variables whose values the loaded graph freezes, or None for a source that is not cached."""
    if isinstance(model, (Graph, str, os.PathLike)):
        return None
    if _is_keras_model(model):
        return list(model.variables)
    tf = import_tf()
    if isinstance(model, tf.types.experimental.ConcreteFunction):
        return list(model.variables)
    if isinstance(model, tf.types.experimental.PolymorphicFunction) and model.input_signature is not None:
        return list(model.get_concrete_function().variables)   # traced once by TensorFlow, then cached
    return None


#: elements compared at a time by _same (its temporary boolean array stays this small)
_CHUNK = 1 << 18


def _current(v) -> np.ndarray:
    """v's value to compare with a kept copy, not copied again (TensorFlow's read already is a fresh tensor)."""
    return np.asarray(v.numpy() if hasattr(v, "numpy") else v)


def _value(v) -> np.ndarray:
    """A copy of v's value, kept in the cache entry."""
    return np.array(_current(v), copy=True)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit (a NaN weight equals itself, -0 differs from +0): the bytes compared as the widest unsigned
    integers that tile them, a chunk at a time, stopping at the first difference. Measured on ResNet50's 102 MB
    of weights: this comparison 23 ms; the whole check 114-122 ms, against 147-173 ms with a copied read and
    one uint8 comparison; the rest is TensorFlow's reading of the variables."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    b = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    word = next(w for w in (np.uint64, np.uint32, np.uint16, np.uint8) if a.size % np.dtype(w).itemsize == 0)
    a, b = a.view(word), b.view(word)
    return all(np.array_equal(a[i:i + _CHUNK], b[i:i + _CHUNK]) for i in range(0, a.size, _CHUNK))


def load_graph_cached(model, *, signature: str | None = None, input_shapes: dict | None = None) -> Graph:
    """:func:`ascend_emu.frontend.tf.loader.load_graph`, served from the cache for a model object seen before
    whose variables hold the same values (module docstring)."""
    from ..onnx.loader import is_onnx

    from ..shapes import is_pt2

    if is_onnx(model) or is_pt2(model):     # no TF variables (and no TensorFlow needed): loaded afresh
        return load_graph(model, signature=signature, input_shapes=input_shapes)
    variables = _variables(model)
    if variables is None:
        return load_graph(model, signature=signature, input_shapes=input_shapes)
    try:
        entries = _SEEN.setdefault(model, {})
    except TypeError:          # an object without weak references: not cached
        return load_graph(model, signature=signature, input_shapes=input_shapes)
    key = (signature, repr(sorted(shape_items(input_shapes))))
    ids = [id(v) for v in variables]
    entry = entries.get(key)
    if entry is not None and entry[1] == ids and all(_same(_current(v), old) for v, old in zip(variables, entry[2])):
        return entry[0]
    values = [_value(v) for v in variables]     # before loading: a value changed meanwhile reloads next time
    graph = load_graph(model, signature=signature, input_shapes=input_shapes)
    if key not in entries and len(entries) >= _PER_OBJECT:
        entries.pop(next(iter(entries)))
    entries[key] = (graph, ids, values)
    return graph


def clear() -> None:
    """Forget every cached graph."""
    _SEEN.clear()
