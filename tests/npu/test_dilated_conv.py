"""Dilated convolutions (issue 36): Keras lowers Conv1D(dilation_rate=2) and a dilated Conv2D (and a dilated
DepthwiseConv2D) to SpaceToBatchND -> Conv2D -> BatchToSpaceND. Seeded random weights, built here; the
float32 replay matches TensorFlow's float32 run on every output.

SpaceToBatchConv2dBatchToSpacePass (CANN's pattern: a Conv2D between the two, crops all zero) turns the
Conv2D form into one dilated Conv2D on the AI Core; Conv1D's form (ExpandDims/Squeeze in between), the
depthwise one and a BatchToSpaceND that crops stay as they are, their data movement on the AI CPU."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu import Device, reference
from ascend_emu.frontend.tf.loader import load_graph

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
                             keras.layers.Conv1D(8, 3, dilation_rate=2, padding=padding, activation="relu",
                                                 bias_initializer="random_normal"),
                             keras.layers.Conv1D(4, 2, dilation_rate=3, padding=padding)])


def conv2d(padding):
    import keras
    keras.utils.set_random_seed(36)
    return keras.Sequential([keras.Input((16, 20, 3)),
                             keras.layers.Conv2D(8, 3, dilation_rate=2, padding=padding, activation="relu",
                                                 bias_initializer="random_normal"),
                             keras.layers.DepthwiseConv2D(3, dilation_rate=(2, 3), padding=padding),
                             keras.layers.Conv2D(4, (2, 3), dilation_rate=(3, 2), padding=padding,
                                                 bias_initializer="random_normal")])


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


def fused_convs(g) -> set:
    """The BatchToSpaceND nodes CANN's pattern takes: right after a Conv2D, crops all zero (read here from the
    loaded graph, independently of the rule)."""
    consts = {n.name: n.attrs.get("value") for n in g.nodes if n.op == "Const"}
    nodes = {n.name: n for n in g.nodes}
    return {n.name for n in g.nodes if n.op == "BatchToSpaceND" and nodes[n.inputs[0]].op == "Conv2D"
            and not np.any(consts[n.inputs[2]])}


@pytest.mark.parametrize("name", list(MODELS))
def test_dilated_conv2d_runs_as_one_dilated_conv_on_the_cube(name):
    g, ref = graph_and_ref(name)
    want = fused_convs(g)
    # 16x20 inputs: the first Conv2D (dilation 2) needs no crop, the last (dilations 3, 2) crops its height
    assert len(want) == (1 if name.startswith("conv2d") else 0)
    res = Device(**FP32).replay(g, ref.inputs, progress=False, keep_tensors=False)
    mix = Device("allow_mix_precision", soc="Ascend910B").replay(g, ref.inputs, progress=False, keep_tensors=False)
    for r in (res, mix):
        assert r.summary["fusion_counts"].get("SpaceToBatchConv2dBatchToSpacePass", 0) == len(want)
        for b2s in want:   # the dilated conv, then its bias and Relu fused into it: named after the Relu
            rec = next(x for x in r.records if x.fusion and b2s in x.fusion["replaces"])
            assert rec.name.endswith("/Relu") and rec.engine == "AICORE" and rec.tf_type == "_FusedConv2D"
            assert rec.fusion["rules"][0] == "SpaceToBatchConv2dBatchToSpacePass"
            assert any(t.endswith("SpaceToBatchND") for t in rec.fusion["replaces"])
            assert rec.compute_dtype == ("float32" if r is res else "float16")
        left = [x for x in r.records if x.tf_type in ("SpaceToBatchND", "BatchToSpaceND")]
        assert all(x.engine == "AICPU" for x in left) and not any(x.name in want for x in left)
        assert len(left) == 2 * (3 - len(want) if name.startswith("conv2d") else 2)
    for out in g.outputs:
        assert cosine(res.outputs[out], ref.outputs[out]) >= COSINE
        assert cosine(mix.outputs[out], ref.outputs[out]) >= 0.999


def test_the_pass_changes_no_bit_and_can_be_switched_off():
    """With the bias left out of L0C on both sides (BiasaddConvFusionPass off: with the pass on, the bias joins the
    dilated conv's accumulator, which moves a rounding), the dilated conv gives TensorFlow's composite bit for bit."""
    g, ref = graph_and_ref("conv2d-same")

    def replay(this):
        switch = {"GraphFusion": {"BiasaddConvFusionPass": "off", "SpaceToBatchConv2dBatchToSpacePass": this}}
        dev = Device(**FP32, fusion_switch={"Switch": switch})
        return dev.replay(g, ref.inputs, progress=False, keep_tensors=False)

    on, off = replay("on"), replay("off")
    assert on.summary["fusion_counts"]["SpaceToBatchConv2dBatchToSpacePass"] == 1
    assert "SpaceToBatchConv2dBatchToSpacePass" not in off.summary["fusion_counts"]
    assert sum(x.tf_type == "SpaceToBatchND" for x in on.records) == 2
    assert sum(x.tf_type == "SpaceToBatchND" for x in off.records) == 3
    for out in g.outputs:
        np.testing.assert_array_equal(on.outputs[out], off.outputs[out])
