"""Device.replay of a model object or tf.function seen before: its loaded graph again, while its variables hold
the same bytes; a changed variable loads it afresh (issue 34)."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from ascend_emu import Device
from ascend_emu.frontend.tf import graph_cache
from ascend_emu.frontend.tf.loader import load_graph


@pytest.fixture
def loads(monkeypatch):
    """Counts the loads the cache does (graph_cache.load_graph is the loader it calls)."""
    calls = []

    def counting(*a, **k):
        calls.append(type(a[0]).__name__)     # not the object: the cache must let it go
        return load_graph(*a, **k)
    monkeypatch.setattr(graph_cache, "load_graph", counting)
    graph_cache.clear()
    yield calls
    graph_cache.clear()


def _keras_model():
    import keras

    keras.utils.set_random_seed(3)
    inp = keras.Input((6, 6, 3), batch_size=2, name="x")
    y = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inp)
    y = keras.layers.Dense(5, name="dense")(keras.layers.Flatten()(y))
    return keras.Model(inp, y)


def _bits(res):
    return {k: np.asarray(v).tobytes() for k, v in res.outputs.items()}


def test_a_keras_model_is_loaded_once_while_its_weights_stay(loads):
    model = _keras_model()
    x = {"x": np.random.default_rng(0).standard_normal((2, 6, 6, 3)).astype(np.float32)}
    dev = Device("force_fp16")
    first = dev.replay(model, x, progress=False)
    again = dev.replay(model, x, progress=False)
    other = Device("allow_mix_precision").replay(model, x, progress=False)     # another device: the same graph
    assert len(loads) == 1 and again.graph is first.graph is other.graph
    assert _bits(again) == _bits(first)
    # new weights: loaded afresh, and the replay is that of a fresh load
    w = model.get_layer("dense").get_weights()
    model.get_layer("dense").set_weights([w[0] * 2, w[1]])
    changed = dev.replay(model, x, progress=False)
    assert len(loads) == 2 and changed.graph is not first.graph
    assert _bits(changed) != _bits(first)
    assert _bits(changed) == _bits(Device("force_fp16").replay(load_graph(model), x, progress=False))
    # an assign of the same bytes is no change
    model.get_layer("dense").set_weights([w[0] * 2, w[1]])
    dev.replay(model, x, progress=False)
    assert len(loads) == 2


def test_a_tf_function_follows_its_captured_variable(loads):
    import tensorflow as tf

    v = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))

    @tf.function(input_signature=[tf.TensorSpec((2, 4), tf.float32)])
    def f(t):
        return tf.matmul(t, v)
    x = np.ones((2, 4), np.float32)
    dev = Device("must_keep_origin_dtype", soc="Ascend910B")
    a = dev.replay(f, {"t": x}, progress=False)
    b = dev.replay(f, {"t": x}, progress=False)
    assert len(loads) == 1 and a.graph is b.graph
    v.assign(v * -1)
    c = dev.replay(f, {"t": x}, progress=False)
    assert len(loads) == 2
    np.testing.assert_array_equal(list(c.outputs.values())[0], -list(a.outputs.values())[0])


def test_shapes_are_part_of_the_key_and_entries_die_with_the_model(loads):
    import keras

    inp = keras.Input((None, 3), name="x")
    model = keras.Model(inp, keras.layers.Dense(2)(inp))
    dev = Device("force_fp16")
    for n in (4, 5, 4):
        dev.replay(model, {"x": np.ones((1, n, 3), np.float32)}, shapes={"x": (1, n, 3)}, progress=False)
    assert len(loads) == 2
    assert len(graph_cache._SEEN) == 1
    del model
    gc.collect()
    assert len(graph_cache._SEEN) == 0
    # paths and plain graphs are not cached
    g = load_graph(_keras_model())
    dev.replay(g, progress=False)
    assert len(loads) == 2


def test_shapes_given_as_cli_strings(loads):
    import keras

    inp = keras.Input((None, 3), name="x")
    model = keras.Model(inp, keras.layers.Dense(2)(inp))
    dev = Device("force_fp16")
    for _ in range(2):
        dev.replay(model, {"x": np.ones((1, 4, 3), np.float32)}, shapes=["x=1,4,3"], progress=False)
    assert len(loads) == 1


def test_same_compares_bits_chunk_by_chunk():
    from ascend_emu.frontend.tf import graph_cache as gc

    a = np.arange(3 * gc._CHUNK + 5, dtype=np.float32)
    b = a.copy()
    assert gc._same(a, b)
    b[-1] = np.nextafter(b[-1], np.float32(np.inf))      # a difference in the last, partial chunk
    assert not gc._same(a, b)
    z = np.zeros(7, np.float16)
    assert gc._same(z, z.copy()) and not gc._same(z, -z)   # -0 is another value to the frozen graph
    n = np.full(5, np.nan, np.float32)
    assert gc._same(n, n.copy())                           # a NaN weight equals itself
    assert not gc._same(a[:4], a[:4].astype(np.float64)) and not gc._same(a[:4], a[:4].reshape(2, 2))
    assert gc._same(np.zeros(0, np.float32), np.zeros(0, np.float32))
