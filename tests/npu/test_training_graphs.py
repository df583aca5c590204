"""The gradient step of real Keras models, replayed op by op on the emulated NPU.

A training step's forward and backward pass is traced (Keras 3 ``stateless_call`` under a
GradientTape, weights as graph inputs) into one plain TF graph, which ``Device.replay`` runs.
Every op of these graphs has an AI Core (or host) kernel: none falls back to the AI CPU. In
must_keep_origin_dtype the loss and every gradient agree with TensorFlow's own float32 run of the
same graph; under allow_mix_precision the backprop matrix ops are white-listed (fp16) and the
black-listed gradient ops (BiasAddGrad, the cross-entropy loss) keep float32.
"""
import collections

import numpy as np
import pytest

from ascend_emu import Device
from fp32mode import FP32, fp32  # noqa: F401  (the tests' fp32 mode)


def _cnn(keras, layers, rng):
    m = keras.Sequential([
        keras.Input((12, 12, 3)), layers.Conv2D(8, 3, padding="same"), layers.BatchNormalization(), layers.ReLU(),
        layers.MaxPooling2D(), layers.Conv2D(8, 3, strides=2), layers.BatchNormalization(), layers.Activation("relu6"),
        layers.DepthwiseConv2D(3, padding="same"), layers.AveragePooling2D(2, padding="same"), layers.Flatten(),
        layers.Dense(16, activation="sigmoid"), layers.Dense(16, activation="tanh"), layers.Dense(10)])
    return m, rng.normal(size=(8, 12, 12, 3)).astype("f4"), rng.integers(0, 10, 8).astype("i4")


def _mobilenet_v2(keras, layers, rng):
    m = keras.applications.MobileNetV2(input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=10,
                                       classifier_activation=None)
    return m, rng.normal(size=(4, 96, 96, 3)).astype("f4"), rng.integers(0, 10, 4).astype("i4")


def _rnn(kind):
    def build(keras, layers, rng):
        inp = keras.Input((10, 6))
        cell = layers.LSTM if kind == "lstm" else layers.GRU
        # unrolled: a recurrent layer's loop (StatelessWhile) is control flow, which the loader rejects
        m = keras.Model(inp, layers.Dense(4)(cell(8, unroll=True)(inp)))
        return m, rng.normal(size=(4, 10, 6)).astype("f4"), rng.integers(0, 4, 4).astype("i4")
    return build


def _transformer(keras, layers, rng):
    inp = keras.Input((12,), dtype="int32")
    h = layers.Embedding(50, 16)(inp)
    h = layers.LayerNormalization()(h + layers.MultiHeadAttention(2, 8)(h, h))
    f = layers.Dense(32, activation="gelu")(h)
    h = layers.LayerNormalization()(h + layers.Dense(16)(f))
    m = keras.Model(inp, layers.Dense(5)(layers.GlobalAveragePooling1D()(h)))
    return m, rng.integers(0, 50, (4, 12)).astype("i4"), rng.integers(0, 5, 4).astype("i4")


def gradient_step(build):
    """(ConcreteFunction of loss and dense gradients, its feeds, TF's own outputs)."""
    import keras
    import tensorflow as tf
    from keras import layers

    keras.utils.set_random_seed(0)
    model, x, y = build(keras, layers, np.random.default_rng(0))
    model(x[:1])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    tv = [v.value.numpy() for v in model.trainable_variables]
    ntv = [v.value.numpy() for v in model.non_trainable_variables]
    values = tv + ntv + [x, y]
    nt, nn = len(tv), len(ntv)

    @tf.function(input_signature=[tf.TensorSpec(a.shape, a.dtype) for a in values])
    def step(*args):
        t, n = list(args[:nt]), list(args[nt:nt + nn])
        with tf.GradientTape() as tape:
            tape.watch(t)
            out, _ = model.stateless_call(t, n, args[-2], training=True)
            loss = loss_fn(args[-1], out)
        return [loss] + [tf.convert_to_tensor(g) for g in tape.gradient(loss, t)]

    cf = step.get_concrete_function()
    feeds = {t.name.split(":")[0]: a for t, a in zip(cf.inputs, values)}
    ref = [o.numpy() for o in cf(*[tf.constant(a) for a in values])]
    return cf, feeds, ref


_cache = {}
# training ops each graph must contain (so the test cannot pass on a graph without them)
EXPECTED = {
    "cnn": {"Conv2DBackpropInput", "Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropInput",
            "DepthwiseConv2dNativeBackpropFilter", "BiasAddGrad", "ReluGrad", "Relu6Grad", "SigmoidGrad", "TanhGrad",
            "RsqrtGrad", "MaxPoolGrad", "AvgPoolGrad", "SparseSoftmaxCrossEntropyWithLogits", "DivNoNan", "ShapeN"},
    "transformer": {"BroadcastGradientArgs", "BiasAddGrad", "RsqrtGrad", "UnsortedSegmentSum", "Einsum",
                    "SparseSoftmaxCrossEntropyWithLogits"},
    "lstm": {"SigmoidGrad", "TanhGrad", "MatMul", "BiasAddGrad"},
    "gru": {"SigmoidGrad", "TanhGrad", "MatMul", "BiasAddGrad", "StridedSliceGrad"},
}


def _step(name):
    if name not in _cache:
        builds = {"cnn": _cnn, "transformer": _transformer, "mobilenet_v2": _mobilenet_v2, "lstm": _rnn("lstm"),
                  "gru": _rnn("gru")}
        _cache[name] = gradient_step(builds[name])
    return _cache[name]


@pytest.mark.parametrize("name", ["cnn", "transformer", "lstm", "gru"])
def test_gradient_step_runs_on_the_ai_core_and_matches_tensorflow(name):
    cf, feeds, ref = _step(name)
    res = Device(**FP32).replay(cf, inputs=feeds, progress=False)
    engines = collections.Counter(r.engine for r in res.records)
    assert "AICPU" not in engines, [(r.name, r.tf_type) for r in res.records if r.engine == "AICPU"]
    assert EXPECTED[name] <= {r.tf_type for r in res.records}
    outs = list(res.outputs.values())
    assert len(outs) == len(ref)
    np.testing.assert_allclose(outs[0], ref[0], rtol=1e-6)          # the loss
    # each gradient to float32 accumulation-order noise, relative to its own largest entry; gradients that
    # are zero in exact arithmetic (a conv bias before batch norm, attention's key bias) are pure noise,
    # so the floor is relative to the largest gradient of the model
    top = max(float(np.abs(r).max()) for r in ref[1:])
    for o, r in zip(outs[1:], ref[1:]):
        assert o.dtype == np.float32 and o.shape == r.shape
        np.testing.assert_allclose(o, r, rtol=0, atol=2e-5 * max(float(np.abs(r).max()), 1e-3 * top))


def test_gradient_step_under_mixed_precision_uses_the_lists():
    cf, feeds, ref = _step("cnn")
    res = Device("allow_mix_precision").replay(cf, inputs=feeds, progress=False)
    by_type = collections.defaultdict(set)
    for r in res.records:
        if r.engine == "AICORE" and not r.inserted:
            by_type[r.tf_type].add(r.compute_dtype)
    for t in ("Conv2DBackpropInput", "Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropInput",
              "DepthwiseConv2dNativeBackpropFilter", "MatMul"):
        assert by_type[t] == {"float16"}, (t, by_type[t])
    for t in ("BiasAddGrad", "SparseSoftmaxCrossEntropyWithLogits"):
        assert by_type[t] == {"float32"}, (t, by_type[t])
    assert "AICPU" not in {r.engine for r in res.records}
    outs = list(res.outputs.values())
    # fp16 matrix ops: the loss moves by fp16 rounding, not more
    np.testing.assert_allclose(outs[0], ref[0], rtol=1e-3)


def test_backprop_convolution_operands_are_cast_to_the_cube_input_dtype():
    """Under force_fp32 (cube_fp16in_fp32out) the cube takes fp16 in and gives fp32 out: the out_backprop
    of a backprop convolution (its input 2) is cast to fp16 like any cube operand, not to the output dtype."""
    cf, feeds, _ = _step("cnn")
    res = Device("force_fp32").replay(cf, inputs=feeds, progress=False)
    recs = [r for r in res.records if r.tf_type in ("Conv2DBackpropInput", "Conv2DBackpropFilter")]
    assert recs and all(r.compute_dtype == "float32" for r in recs)
    to_fp16 = {c.inputs[0] for c in res.records if c.inserted and c.compute_dtype == "float16"}
    for r in recs:
        assert r.inputs[2] in to_fp16, (r.name, r.inputs[2])


@pytest.mark.models
def test_mobilenet_v2_gradient_step_runs_on_the_ai_core():
    """keras.applications MobileNetV2 (alpha 0.35, 96x96, random weights, batch 4): no AI CPU op; the loss
    agrees with TensorFlow to 1e-5. Its gradients are chaotic in the accumulation order (batch statistics of
    4 images over 3x3 maps): two emulated runs that differ only in the cube's fp32 summation order
    (tree vs sequential) already differ by up to ~16% in single entries, so each gradient is compared by
    its cosine similarity with TensorFlow's."""
    cf, feeds, ref = _step("mobilenet_v2")
    res = Device(**FP32).replay(cf, inputs=feeds, progress=False)
    assert "AICPU" not in {r.engine for r in res.records}
    assert {"DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter", "Relu6Grad",
            "Conv2DBackpropFilter"} <= {r.tf_type for r in res.records}
    outs = list(res.outputs.values())
    np.testing.assert_allclose(outs[0], ref[0], rtol=1e-5)
    top = max(float(np.abs(r).max()) for r in ref[1:])
    for o, r in zip(outs[1:], ref[1:]):
        if np.abs(r).max() < 1e-3 * top:
            continue          # gradients that vanish in exact arithmetic (conv biases before batch norm)
        a, b = np.asarray(o, np.float64).ravel(), np.asarray(r, np.float64).ravel()
        assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.999
