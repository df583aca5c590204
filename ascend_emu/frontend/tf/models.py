"""Seeded Keras models for tests, benchmarks and the demo. Nothing is downloaded.

Every builder seeds Keras (``keras.utils.set_random_seed``) and numpy
(``np.random.default_rng(seed)``) so the same seed gives the same weights, bit
for bit. Batch-normalisation statistics are randomised (they are zero/one
after construction, which would make batch norm an identity): moving mean
N(0, 0.1^2), moving variance U(0.5, 2), gamma U(0.5, 1.5), beta N(0, 0.1^2).

Building a model costs seconds (ResNet50 several), so builders return a cached
instance per argument set; pass ``fresh=True`` for a new, unshared one. Do not
modify a cached model.
"""
from __future__ import annotations

import numpy as np

from .tf import import_tf

_CACHE: dict = {}

MODELS = ("resnet50", "mobilenet_v2", "transformer_encoder", "demo_model",
          "planted_overflow_model", "float32_overflow_model", "application", "rnn_classifier", "hub_backbone",
          "tf1_control_flow_graph")


def _keras(seed: int):
    import_tf()
    import keras
    # fresh name counters: layer and op names (which name every dumped tensor) then do not depend on
    # what else this process built before
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    return keras


def _seeded(seed: int):
    """Keras (fresh session, seeded), its layers module and a numpy generator of the same seed."""
    keras = _keras(seed)
    return keras, keras.layers, np.random.default_rng(seed)


def _cached(key, build, fresh: bool):
    if fresh:
        return build()
    if key not in _CACHE:
        _CACHE[key] = build()
    return _CACHE[key]


def randomize_batchnorm(model, rng: np.random.Generator) -> None:
    """Give every BatchNormalization layer non-trivial, seeded statistics (module docstring)."""
    import keras
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            n = int(layer.moving_mean.shape[0])
            f32 = np.float32
            layer.moving_mean.assign(rng.normal(0.0, 0.1, n).astype(f32))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, n).astype(f32))
            if layer.gamma is not None:
                layer.gamma.assign(rng.uniform(0.5, 1.5, n).astype(f32))
            if layer.beta is not None:
                layer.beta.assign(rng.normal(0.0, 0.1, n).astype(f32))


def _image_application(constructor: str, name: str, input_shape, seed: int, fresh: bool):
    """keras.applications ``constructor`` (1000 classes) on a named image input, random weights and BN statistics."""
    def build():
        keras = _keras(seed)
        # name the input: Keras' automatic names depend on what was built before
        image = keras.Input(tuple(input_shape), name="image")
        app = getattr(keras.applications, constructor)(weights=None, input_tensor=image)
        # re-wrap so the model takes a plain tensor (input_tensor= makes its input a list)
        m = keras.Model(image, app.output, name=name)
        randomize_batchnorm(m, np.random.default_rng(seed))
        return m
    return _cached((name, tuple(input_shape), seed), build, fresh)


def resnet50(input_shape=(64, 64, 3), seed: int = 0, *, fresh: bool = False):
    """keras.applications ResNet50 (1000 classes, softmax), random weights, random BN statistics.

    Parameters
    ----------
    input_shape : tuple
        (height, width, channels); at least 32x32. The batch dimension is left
        unknown (None).
    seed : int
        Seeds the weights and the batch-norm statistics.
    fresh : bool
        Build a new model instead of returning the cached one.
    """
    return _image_application("ResNet50", "resnet50", input_shape, seed, fresh)


def mobilenet_v2(input_shape=(64, 64, 3), seed: int = 0, *, fresh: bool = False):
    """keras.applications MobileNetV2 (alpha 1.0, 1000 classes), random weights and BN statistics.

    Exercises DepthwiseConv2dNative, Relu6 and the inverted-residual adds. See
    :func:`resnet50` for the parameters.
    """
    return _image_application("MobileNetV2", "mobilenet_v2", input_shape, seed, fresh)


#: the smallest input each keras.applications family accepts (32x32 unless listed)
SMALLEST_INPUT = {"InceptionV3": 75, "InceptionResNetV2": 75, "Xception": 71}


def applications() -> list[str]:
    """The keras.applications constructors of the installed Keras, sorted."""
    import_tf()
    import keras
    return sorted(n for n in dir(keras.applications) if n[:1].isupper() and callable(getattr(keras.applications, n)))


def application(name: str, seed: int = 0, classes: int = 10, *, fresh: bool = False):
    """keras.applications ``name`` at its smallest input (:data:`SMALLEST_INPUT`), ``classes`` outputs,
    random weights and BN statistics; the zoo of ``tests/npu/test_zoo.py`` and ``benchmarks/zoo.py``."""
    def build():
        keras = _keras(seed)
        size = SMALLEST_INPUT.get(name, 32)
        m = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=classes)
        randomize_batchnorm(m, np.random.default_rng(seed))
        return m
    return _cached(("application", name, seed, classes), build, fresh)


def rnn_classifier(layer: str = "LSTM", steps: int = 20, features: int = 8, units: int = 16, classes: int = 4,
                   seed: int = 0, *, fresh: bool = False):
    """A sequence classifier: Input(steps, features) -> keras.layers.<layer>(units) -> Dense softmax.

    ``layer`` is ``"LSTM"``, ``"GRU"`` or ``"SimpleRNN"`` (a While loop over TensorLists when frozen).
    """
    def build():
        keras = _keras(seed)
        inp = keras.Input((steps, features), name="seq")
        out = keras.layers.Dense(classes, activation="softmax")(getattr(keras.layers, layer)(units)(inp))
        return keras.Model(inp, out, name=f"{layer.lower()}_classifier")
    return _cached(("rnn", layer, steps, features, units, classes, seed), build, fresh)


#: keras_hub backbones in the zoo, each built from a tiny config (never from a preset: nothing downloaded)
HUB_BACKBONES = ("BertBackbone", "GPT2Backbone")
#: the tiny config: 2 layers, 2 heads, hidden 16, feed-forward 32, vocabulary 100, positions 16
HUB_CONFIG = {"vocabulary_size": 100, "num_layers": 2, "num_heads": 2, "hidden_dim": 16, "intermediate_dim": 32,
              "max_sequence_length": 16}


def hub_backbone(name: str, seq_len: int = 8, seed: int = 0, *, fresh: bool = False):
    """keras_hub backbone ``name`` (:data:`HUB_BACKBONES`) with :data:`HUB_CONFIG` and seeded random weights.

    Wrapped so that its one input is ``token_ids`` of shape (batch, ``seq_len``), int32 (the default
    random inputs, integers 0..9, are valid token ids); the padding mask is all ones and the segment
    ids (BERT) zeros. Outputs: the backbone's (BERT: ``pooled_output`` and ``sequence_output``; GPT-2
    the sequence output). Needs keras-hub (``pip install -e '.[hub]'``).
    """
    from ...errors import AscendEmuError

    if name not in HUB_BACKBONES:
        raise AscendEmuError(f"unknown keras_hub backbone {name!r}; the zoo has {', '.join(HUB_BACKBONES)}")

    def build():
        keras = _keras(seed)
        try:
            import keras_hub
        except ImportError:
            raise AscendEmuError("keras_hub is not installed; install it with pip install -e '.[hub]'") from None
        backbone = getattr(keras_hub.models, name)(**HUB_CONFIG)
        tok = keras.Input((seq_len,), dtype="int32", name="token_ids")
        args = {"token_ids": tok, "padding_mask": keras.ops.ones_like(tok)}
        if "segment_ids" in [t.name for t in backbone.inputs]:
            args["segment_ids"] = keras.ops.zeros_like(tok)
        return keras.Model(tok, backbone(args), name=name.lower())
    return _cached(("hub", name, seq_len, seed), build, fresh)


def tf1_control_flow_graph(seed: int = 0):
    """A ``tf.compat.v1`` model with TF1 control flow, frozen with its session: a GraphDef.

    ``x`` (2, 3) float32 -> ``tf.while_loop`` of 3 steps, each running an inner ``tf.while_loop`` of 2
    steps, a MatMul with a variable, Relu and a ``tf.cond`` on the step's maximum; then a ``tf.cond`` on
    the sign of ``sum(x)`` (a MatMul with a second variable, or a constant) -> ``out`` (2, 2). Built with
    control flow v1 (Switch/Merge/Enter/Exit/NextIteration; the process-wide switch is restored), the
    variables seeded, frozen by ``tf.compat.v1.graph_util.convert_variables_to_constants``.
    """
    from tensorflow.python.ops import control_flow_util

    tf = import_tf()
    tf1 = tf.compat.v1
    rng = np.random.default_rng(seed)
    old = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [2, 3], name="x")
            w = tf1.get_variable("w", initializer=rng.normal(0, 0.7, (3, 2)).astype(np.float32))
            v = tf1.get_variable("v", initializer=rng.normal(0, 0.5, (3, 3)).astype(np.float32))

            def body(i, h):
                inner = tf1.while_loop(lambda j, a: j < 2, lambda j, a: (j + 1, a * 1.5 - 0.25),
                                       [tf.constant(0), h])[1]
                h = tf.nn.relu(tf.matmul(inner, v) + 0.1)
                h = tf1.cond(tf.reduce_max(h) > 1.0, lambda: h * 0.5, lambda: h + tf.constant(0.2))
                return i + 1, h

            _, y = tf1.while_loop(lambda i, h: i < 3, body, [tf.constant(0), x])
            z = tf1.cond(tf.reduce_sum(x) > 0, lambda: tf.matmul(y, w), lambda: tf.constant(7.0, shape=[2, 2]))
            tf.identity(z, name="out")
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                return tf1.graph_util.convert_variables_to_constants(sess, g.as_graph_def(), ["out"])
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = old


def transformer_encoder(seq_len: int = 16, d_model: int = 64, num_heads: int = 4, ff_dim: int = 128,
                        seed: int = 0, *, fresh: bool = False):
    """One post-norm Transformer encoder block (Keras functional).

    ``x -> MultiHeadAttention(x, x) -> x + attn -> LayerNormalization -> Dense(ff_dim, gelu exact,
    i.e. via Erf) -> Dense(d_model) -> residual add -> LayerNormalization``. Input
    ``tokens`` of shape (batch, seq_len, d_model), batch unknown. The attention
    projections are Einsum ops, the attention scores a Softmax.
    """
    def build():
        keras = _keras(seed)
        L = keras.layers
        x = keras.Input((seq_len, d_model), name="tokens")
        attn = L.MultiHeadAttention(num_heads=num_heads, key_dim=d_model // num_heads,
                                    name="attention")(x, x)
        h = L.LayerNormalization(epsilon=1e-6, name="norm1")(L.Add(name="residual1")([x, attn]))
        f = L.Dense(ff_dim, activation="gelu", name="ffn1")(h)  # keras gelu: approximate=False
        f = L.Dense(d_model, name="ffn2")(f)
        out = L.LayerNormalization(epsilon=1e-6, name="norm2")(L.Add(name="residual2")([h, f]))
        return keras.Model(x, out, name="transformer_encoder")
    return _cached(("transformer_encoder", seq_len, d_model, num_heads, ff_dim, seed), build, fresh)


def demo_model(seed: int = 0, *, fresh: bool = False):
    """A small CNN that replays in seconds and shows both fp16 failure modes.

    ``image (batch, 32, 32, 3) -> Conv2D(16, 3x3, relu) -> Conv2D(16, 3x3, stride 2, relu)
    -> GlobalAveragePooling2D -> Dense(64, "wide") -> LayerNormalization -> Dense(10, "logits")
    -> Softmax``.

    - Overflow: the kernel columns 0-3 of ``wide`` are |N(0, 1)| * 8e4 (clipped to
      6e4, so the weights themselves are fp16-representable and only the matmul
      overflows): those outputs exceed 65504, the fp16 maximum, while float32 holds them;
      the LayerNormalization brings the values back to O(1), so only an fp16
      matmul changes the result (inf/NaN in inf_nan mode, saturation to 65504
      otherwise).
    - Accuracy loss: the ``logits`` bias is 300, so the logits are 300 +- a few;
      fp16 spaces numbers there 0.25 apart, and the softmax turns that rounding
      of the logits (up to 0.125) into relative errors of up to ~13% in the
      probabilities, while float32 is exact to 1e-5.
    """
    def build():
        keras, L, rng = _seeded(seed)
        x = keras.Input((32, 32, 3), name="image")
        h = L.Conv2D(16, 3, padding="same", activation="relu", name="conv1")(x)
        h = L.Conv2D(16, 3, strides=2, padding="same", activation="relu", name="conv2")(h)
        h = L.GlobalAveragePooling2D(name="pool")(h)
        wide = L.Dense(64, name="wide")
        h = wide(h)
        h = L.LayerNormalization(name="norm")(h)
        logits = L.Dense(10, name="logits")
        h = logits(h)
        out = L.Softmax(name="probabilities")(h)
        m = keras.Model(x, out, name="demo_model")
        k = rng.normal(0.0, 1.0, (16, 64)).astype(np.float32)
        k[:, :4] = np.minimum(np.abs(k[:, :4]) * 8e4, 6e4)
        # fp16-exact weights: the cast of the weights is exact, the matmul is what overflows
        wide.kernel.assign(k.astype(np.float16).astype(np.float32))
        logits.kernel.assign(rng.normal(0.0, 0.15, (64, 10)).astype(np.float32))
        logits.bias.assign(np.full(10, 300.0, np.float32))
        return m
    return _cached(("demo_model", seed), build, fresh)


def planted_overflow_model(seed: int = 0, *, fresh: bool = False):
    """An MLP with one matmul planted to overflow fp16 but not float32.

    ``features (batch, 64) -> Dense(32, relu, "dense_in") -> Dense(32, "planted_overflow")
    -> LayerNormalization -> Dense(4, "head")``. The ``planted_overflow``
    kernel is |N(0, 1)| * 2e4 clipped to 6e4 (every weight fp16-representable, so
    no weight cast overflows; all positive, so the relu inputs add up): its MatMul outputs are ~1e5 for
    N(0, 1) inputs: above 65504 (fp16 overflow), far below float32's limit. The
    LayerNormalization returns the values to O(1). It is the only op that
    overflows in fp16 (the other matmuls stay below 100).
    """
    def build():
        keras, L, rng = _seeded(seed)
        x = keras.Input((64,), name="features")
        h = L.Dense(32, activation="relu", name="dense_in")(x)
        planted = L.Dense(32, name="planted_overflow")
        h = planted(h)
        h = L.LayerNormalization(name="norm")(h)
        out = L.Dense(4, name="head")(h)
        m = keras.Model(x, out, name="planted_overflow_model")
        k = np.minimum(np.abs(rng.normal(0.0, 1.0, (32, 32))) * 2e4, 6e4)
        # fp16-exact weights: their cast to fp16 is exact, so the matmul is the first op to go wrong
        planted.kernel.assign(k.astype(np.float16).astype(np.float32))
        return m
    return _cached(("planted_overflow_model", seed), build, fresh)


def float32_overflow_model(seed: int = 0, *, fresh: bool = False):
    """An MLP that overflows even in float32.

    ``features (batch, 16) -> Dense(16, "huge1") -> Dense(16, "huge2")``, both
    kernels N(0, 1) scaled by 1e30: ``huge1`` gives ~1e30 (overflows fp16, fine
    in float32 and bfloat16), ``huge2`` ~1e60, which is inf in float32 too, so
    the float32 reference itself overflows there: inf where the host's GEMM
    fuses multiply and add (the accumulator saturates), NaN where it rounds
    each product to +-inf first and then adds them.
    """
    def build():
        keras, L, rng = _seeded(seed)
        x = keras.Input((16,), name="features")
        d1, d2 = L.Dense(16, name="huge1"), L.Dense(16, name="huge2")
        out = d2(d1(x))
        m = keras.Model(x, out, name="float32_overflow_model")
        d1.kernel.assign((rng.normal(0.0, 1.0, (16, 16)) * 1e30).astype(np.float32))
        d2.kernel.assign((rng.normal(0.0, 1.0, (16, 16)) * 1e30).astype(np.float32))
        return m
    return _cached(("float32_overflow_model", seed), build, fresh)


def train_demo_model(seed: int = 0, *, fresh: bool = False):
    """A small compiled CNN whose backward pass overflows fp16 at Keras' initial loss scale (2^15).

    ``image (batch, 16, 16, 3) -> Conv2D(8, 3x3, relu) -> BatchNormalization -> GlobalAveragePooling2D
    -> Dense(32, relu, "hidden") -> Dense(32, "planted") -> Dense(10, "logits")``, compiled with
    Adam(1e-3) and sparse categorical cross-entropy from logits.

    The ``planted`` kernel is |N(0, 1)| * 300 (fp16-exact), the ``logits`` kernel is Keras' initial one
    scaled by 0.005: the forward values stay small (the loss starts near ln 10), but on the way back the
    gradient, multiplied by the loss scale, is multiplied again by the planted weights, and the backward
    values (matmul products, and the gradients cast to fp16 for the ops below them) exceed 65504 in fp16
    while float32 holds them. Under a dynamic loss scale the first such step
    is skipped and the scale halves; Adam's normalised steps keep the training itself stable, so the
    loss follows the float32 reference.
    """
    def build():
        keras, L, rng = _seeded(seed)
        x = keras.Input((16, 16, 3), name="image")
        h = L.Conv2D(8, 3, padding="same", activation="relu", name="conv")(x)
        h = L.BatchNormalization(name="bn")(h)
        h = L.GlobalAveragePooling2D(name="pool")(h)
        h = L.Dense(32, activation="relu", name="hidden")(h)
        planted = L.Dense(32, name="planted")
        logits = L.Dense(10, name="logits")
        out = logits(planted(h))
        m = keras.Model(x, out, name="train_demo_model")
        w = np.abs(rng.normal(0.0, 1.0, (32, 32))) * 300.0
        planted.kernel.assign(w.astype(np.float16).astype(np.float32))
        logits.kernel.assign(np.asarray(logits.kernel) * np.float32(0.005))
        m.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m
    return _cached(("train_demo_model", seed), build, fresh)


def embedding_classifier(vocab: int = 40, seq_len: int = 8, dim: int = 16, classes: int = 4, seed: int = 0, *,
                         fresh: bool = False):
    """A compiled token classifier with an Embedding and a BatchNormalization layer.

    ``tokens (batch, seq_len) int32 -> Embedding(vocab, dim) -> BatchNormalization -> GlobalAveragePooling1D
    -> Dense(classes)`` logits, Adam(1e-2), sparse categorical cross-entropy from logits. Its backward pass
    accumulates the embedding gradient with UnsortedSegmentSum (atomic adds on the NPU) and the batch
    norm's per-channel sums: the random-error detection's training model (NUMERICS.md section 11).
    """
    def build():
        keras = _keras(seed)
        L = keras.layers
        x = keras.Input((seq_len,), dtype="int32", name="tokens")
        h = L.Embedding(vocab, dim, name="embed")(x)
        h = L.BatchNormalization(name="bn")(h)
        h = L.GlobalAveragePooling1D(name="pool")(h)
        out = L.Dense(classes, name="logits")(h)
        m = keras.Model(x, out, name="embedding_classifier")
        m.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m
    return _cached(("embedding_classifier", vocab, seq_len, dim, classes, seed), build, fresh)


def embedding_data(n: int = 256, vocab: int = 40, seq_len: int = 8, classes: int = 4, seed: int = 0) -> dict:
    """Seeded data for :func:`embedding_classifier`: token ids (repeated within and across samples) and
    labels that depend on them (the class of the sample's most frequent token id, modulo classes)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab, (n, seq_len)).astype(np.int32)
    y = np.array([np.bincount(r, minlength=vocab).argmax() % classes for r in x], dtype=np.int64)
    return {"x": x, "y": y}


def train_demo_data(n: int = 256, seed: int = 0) -> dict:
    """Seeded training data for :func:`train_demo_model`: N(0, 1) images, labels 0..9."""
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, 16, 16, 3)).astype(np.float32), "y": rng.integers(0, 10, n).astype(np.int64)}


#: the model formats :func:`save_all_formats` produces (and load_graph accepts)
FORMATS = ("keras", "keras_file", "saved_model", "pb", "pbtxt", "tf_function", "concrete_function")


def save_all_formats(model, directory) -> dict:
    """Save a Keras model in every format :func:`ascend_emu.frontend.tf.loader.load_graph` reads.

    Returns a dict format -> what to pass to ``load_graph``: ``"keras"`` the
    model itself; ``"keras_file"`` ``directory/model.keras`` (``model.save``);
    ``"saved_model"`` ``directory/saved_model`` (``model.export``);
    ``"pb"``/``"pbtxt"`` ``directory/frozen.pb``/``.pbtxt``, frozen the usual
    way (``convert_variables_to_constants_v2`` on a tf.function of
    ``model(x, training=False)``, written with ``tf.io.write_graph``);
    ``"tf_function"`` that tf.function (with an input_signature) and
    ``"concrete_function"`` its ConcreteFunction.
    """
    import os
    tf = import_tf()
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    out = {"keras": model}
    out["keras_file"] = os.path.join(directory, "model.keras")
    model.save(out["keras_file"])
    out["saved_model"] = os.path.join(directory, "saved_model")
    model.export(out["saved_model"], verbose=False)
    specs = [tf.TensorSpec(t.shape, t.dtype, name=f"input_{i}") for i, t in enumerate(model.inputs)]
    single = len(specs) == 1
    fn = tf.function(lambda *xs: model(xs[0] if single else list(xs), training=False),
                     input_signature=specs)
    cf = fn.get_concrete_function()
    gd = convert_variables_to_constants_v2(cf).graph.as_graph_def()
    tf.io.write_graph(gd, directory, "frozen.pb", as_text=False)
    tf.io.write_graph(gd, directory, "frozen.pbtxt", as_text=True)
    out["pb"] = os.path.join(directory, "frozen.pb")
    out["pbtxt"] = os.path.join(directory, "frozen.pbtxt")
    out["tf_function"] = fn
    out["concrete_function"] = cf
    return out
