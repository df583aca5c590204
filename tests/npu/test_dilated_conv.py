"""Dilated convolutions (issue 36): Keras lowers Conv1D(dilation_rate=2) and a dilated Conv2D (and a dilated
DepthwiseConv2D) to SpaceToBatchND -> Conv2D -> BatchToSpaceND. Seeded random weights, built here; the
float32 replay matches TensorFlow's float32 run on every output."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu import Device, reference
from ascend_emu.frontend.loader import load_graph

#: must_keep_origin_dtype on a SoC whose cube takes float32, HF32 off (the brief's fp32 mode)
FP32 = {"precision_mode": "must_keep_origin_dtype", "soc": "Ascend910B", "allow_hf32": "none"}
COSINE = 0.99999


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def conv1d(padding):
    import keras
    keras.utils.set_random_seed(36)
    return keras.Sequential([keras.Input((24, 3)),
                             keras.layers.Conv1D(8, 3, dilation_rate=2, padding=padding, activation="relu"),
                             keras.layers.Conv1D(4, 2, dilation_rate=3, padding=padding)])


def conv2d(padding):
    import keras
    keras.utils.set_random_seed(36)
    return keras.Sequential([keras.Input((17, 20, 3)),
                             keras.layers.Conv2D(8, 3, dilation_rate=2, padding=padding, activation="relu"),
                             keras.layers.DepthwiseConv2D(3, dilation_rate=(2, 3), padding=padding),
                             keras.layers.Conv2D(4, (2, 3), dilation_rate=(3, 2), padding=padding)])


MODELS = {f"{k}-{p}": (lambda k=k, p=p: {"conv1d": conv1d, "conv2d": conv2d}[k](p))
          for k in ("conv1d", "conv2d") for p in ("same", "valid")}
_cache = {}


def graph_and_ref(name):
    if name not in _cache:
        g = load_graph(MODELS[name]())
        assert {"SpaceToBatchND", "BatchToSpaceND"} <= {n.op for n in g.nodes}
        _cache[name] = (g, reference(g, None, progress=False))
    return _cache[name]


@pytest.mark.parametrize("name", list(MODELS))
def test_dilated_conv_replays_like_tensorflow(name):
    g, ref = graph_and_ref(name)
    res = Device(**FP32).replay(g, ref.inputs, progress=False, keep_tensors=False)
    for out in g.outputs:
        ours, theirs = np.asarray(res.outputs[out]), ref.outputs[out]
        assert ours.shape == theirs.shape and ours.dtype == np.float32
        assert cosine(ours, theirs) >= COSINE, out
