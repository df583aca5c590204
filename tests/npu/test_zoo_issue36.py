"""Issue 36's zoo additions, replayed in the tests' fp32 mode (tests/fp32mode.py) against TensorFlow's float32 run,
cosine >= 0.99999 on every op both runs dump: a Conv3D/MaxPool3D/AvgPool3D Keras model, a detection-style head
(a tf.function with bilinear resize, top_k, cumsum and batched gathers) and a SeparableConv1D + GroupNormalization
+ dilated Conv1D model. Issue 36's ops run on the emulated AI Core (not the AI CPU fallback); under
allow_mix_precision Conv3D (white list) runs its cube in fp16."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu import Device, reference
from ascend_emu.frontend.tf.loader import load_graph
from ascend_emu.ops.coverage import AICPU_MET

from fp32mode import FP32

COSINE = 0.99999
ISSUE36 = {"Conv3D", "MaxPool3D", "AvgPool3D", "TopKV2", "Cumsum", "GatherV2", "ResizeBilinear"}


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if np.array_equal(a, b):
        return 1.0        # zero tensors included (a zero-initialised bias)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def conv3d_model():
    import keras
    keras.utils.set_random_seed(36)
    return keras.Sequential([keras.Input((8, 10, 10, 2)),
                             keras.layers.Conv3D(6, 3, padding="same", activation="relu",
                                                 bias_initializer="random_normal"),
                             keras.layers.MaxPool3D(2),
                             keras.layers.Conv3D(4, (2, 3, 3), strides=(1, 2, 2)),
                             keras.layers.AveragePooling3D((1, 2, 2), padding="same"),
                             keras.layers.Flatten(), keras.layers.Dense(3)])


def detection_head():
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([2, 8, 8, 3], tf.float32), tf.TensorSpec([2, 5], tf.int32)])
    def head(img, idx):
        feat = tf.image.resize(img, (12, 10))                     # ResizeBilinear, half-pixel centers
        flat = tf.reshape(feat, [2, -1])
        scores, picks = tf.math.top_k(flat, k=6)
        return {"cum": tf.math.cumsum(scores, axis=1, exclusive=True),
                "picked": tf.gather(flat, picks, batch_dims=1) * 2.0,
                "pixels": tf.gather(tf.reshape(img, [2, -1, 3]), idx % 64, axis=1, batch_dims=1),
                "feat": feat}
    return head


def separable_group_dilated():
    import keras
    keras.utils.set_random_seed(36)
    return keras.Sequential([keras.Input((32, 4)),
                             keras.layers.SeparableConv1D(8, 3, padding="same", activation="relu"),
                             keras.layers.GroupNormalization(groups=4),
                             keras.layers.Conv1D(6, 3, dilation_rate=2, padding="same"),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])


MODELS = {"conv3d": (conv3d_model, {"Conv3D", "MaxPool3D", "AvgPool3D"}),
          "detection_head": (detection_head, {"TopKV2", "Cumsum", "GatherV2", "ResizeBilinear"}),
          # Keras's dilated Conv1D: SpaceToBatchND / BatchToSpaceND around the conv (Conv1D's form stays unfused,
          # its data movement on the AI CPU: tests/npu/test_dilated_conv.py)
          "separable_group_dilated": (separable_group_dilated, {"SpaceToBatchND", "DepthwiseConv2dNative"})}
AICPU_ALLOWED = set(AICPU_MET)   # the README coverage table's AI CPU rows


@pytest.mark.parametrize("name", list(MODELS))   # each about 2 s once TensorFlow is imported
def test_issue36_model_replays_like_tensorflow_on_the_ai_core(name):
    build, must_have = MODELS[name]
    g = load_graph(build())
    types = {n.op for n in g.nodes}
    assert must_have <= types, sorted(types)
    ref = reference(g, None, progress=False)
    res = Device(**FP32).replay(g, ref.inputs, progress=False)
    compared = [k for k in ref.tensors if k in res.tensors and np.asarray(ref.tensors[k]).dtype.kind == "f"]
    assert len(compared) >= 10
    worst = min((cosine(res.tensors[k], ref.tensors[k]), k) for k in compared)
    assert worst[0] >= COSINE, worst
    for out in g.outputs:
        assert np.asarray(res.outputs[out]).shape == ref.outputs[out].shape
        assert cosine(res.outputs[out], ref.outputs[out]) >= COSINE, out
    engines = {}
    for r in res.records:
        engines.setdefault(r.tf_type, set()).add(r.engine)
    for t in must_have & ISSUE36:
        assert engines[t] == {"AICORE"}, (t, engines[t])
    assert all("AICPU" not in e or t in AICPU_ALLOWED for t, e in engines.items()), engines
    if name == "detection_head":   # force_fp16: the head's ops compute in fp16 on the AI Core
        half = Device("force_fp16", soc="Ascend910B").replay(g, ref.inputs, progress=False, keep_tensors=False)
        ran = {(r.tf_type, r.engine, r.compute_dtype) for r in half.records if r.tf_type in must_have}
        assert ran == {(t, "AICORE", "float16") for t in must_have}, ran
        for out in g.outputs:
            assert cosine(half.outputs[out], ref.outputs[out]) >= 0.999
    if name == "conv3d":
        mix = Device("allow_mix_precision", soc="Ascend910B").replay(g, ref.inputs, progress=False,
                                                                     keep_tensors=False)
        conv = [r for r in mix.records if r.tf_type == "Conv3D"]
        assert conv and all(r.compute_dtype == "float16" and r.engine == "AICORE" for r in conv)
        for out in g.outputs:
            assert cosine(mix.outputs[out], ref.outputs[out]) >= 0.999


def _conv3d_trainable(keras, layers, rng):
    m = keras.Sequential([keras.Input((6, 8, 8, 2)), layers.Conv3D(4, 3, padding="same", activation="relu"),
                          layers.MaxPool3D(2), layers.Conv3D(4, 2, strides=(1, 2, 2), padding="same"),
                          layers.AveragePooling3D((1, 2, 2), padding="same"), layers.Flatten(), layers.Dense(3)])
    return m, rng.normal(size=(2, 6, 8, 8, 2)).astype("f4"), rng.integers(0, 3, 2).astype("i4")


def _upsampling_trainable(keras, layers, rng):
    m = keras.Sequential([keras.Input((6, 6, 3)), layers.Conv2D(4, 3, padding="same", activation="relu"),
                          layers.UpSampling2D(2, interpolation="bilinear"), layers.Conv2D(4, 3),
                          layers.UpSampling2D((2, 1), interpolation="nearest"), layers.GlobalAveragePooling2D(),
                          layers.Dense(3)])
    return m, rng.normal(size=(2, 6, 6, 3)).astype("f4"), rng.integers(0, 3, 2).astype("i4")


@pytest.mark.parametrize("build,expected", [
    (_conv3d_trainable, {"Conv3DBackpropInputV2", "Conv3DBackpropFilterV2", "MaxPool3DGrad", "AvgPool3DGrad"}),
    # Keras 3's nearest UpSampling2D repeats (no ResizeNearestNeighbor): its gradient is tested op by op
    (_upsampling_trainable, {"ResizeBilinearGrad"})], ids=["conv3d", "upsampling"])
def test_issue36_gradient_steps_run_on_the_ai_core(build, expected):
    """A Keras training step's forward and backward graph (tests/npu/test_training_graphs.py's tracing) with 3D
    convolutions and pools, or bilinear and nearest upsampling: every op on the AI Core, loss and gradients as
    TensorFlow's float32 run; under allow_mix_precision the Conv3D gradients (white) run their cube in fp16."""
    from test_training_graphs import gradient_step

    cf, feeds, ref = gradient_step(build)
    res = Device(**FP32).replay(cf, inputs=feeds, progress=False, keep_tensors=False)
    engines = {}
    for r in res.records:
        engines.setdefault(r.tf_type, set()).add(r.engine)
    assert expected <= set(engines), sorted(engines)
    assert not any("AICPU" in e for e in engines.values()), engines
    outs = list(res.outputs.values())
    np.testing.assert_allclose(outs[0], ref[0], rtol=1e-6)
    for o, r in zip(outs[1:], ref[1:]):
        assert o.shape == r.shape and cosine(o, r) >= COSINE
    if "Conv3DBackpropInputV2" in expected:
        mix = Device("allow_mix_precision", soc="Ascend910B").replay(cf, inputs=feeds, progress=False,
                                                                     keep_tensors=False)
        back = [r for r in mix.records if r.tf_type.startswith("Conv3DBackprop")]
        assert back and all(r.compute_dtype == "float16" for r in back)
