"""The hand-over between a Keras script and the emulated step (frontend/tf/stateful.py ``read_variables`` /
``assign_variables``, keras_hooks ``_metrics_result``): what the script sees is what it saw when every variable
was copied out and written back and each metric's result was computed eagerly.

- the variables are read in one call as read-only views of the tensors read; TensorFlow's copy-on-write keeps
  a view's values when the variable is written afterwards;
- only the variables a step changed are written back (a variable the step leaves alone, every variable of a
  skipped step): what the script wrote stays;
- ``train_on_batch``'s logs, with compiled metrics, are Keras' own ``get_metrics_result`` of the emulated values.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import ascend_emu as ae  # noqa: E402
from ascend_emu.frontend.tf.stateful import assign_variables, read_variables, train_step_from_tf_function  # noqa: E402

RNG = np.random.default_rng(34)
X = RNG.standard_normal((32, 8)).astype(np.float32)
Y = RNG.integers(0, 3, 32)


def _model():
    keras.backend.clear_session()
    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    m.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(2)])
    return m


def _step(m):
    opt = m.optimizer

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = keras.losses.sparse_categorical_crossentropy(y, m(x, training=True), from_logits=True)
            loss = tf.reduce_mean(loss)
        opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
        return loss
    return train_step_from_tf_function(step, X[:8], Y[:8], optimizer=opt)


def test_reads_are_views_that_later_writes_do_not_change():
    m = _model()
    step = _step(m)
    state = read_variables(step)
    key = next(k for k in state if k.endswith("dense/kernel"))
    kernel = next(v for v in m.trainable_variables if v.path.endswith("dense/kernel"))
    before = np.array(state[key], copy=True)
    assert not state[key].flags.writeable
    kernel.assign(np.full(kernel.shape, 7.0, np.float32))
    kernel.assign_add(np.ones(kernel.shape, np.float32))
    np.testing.assert_array_equal(state[key], before)
    np.testing.assert_array_equal(read_variables(step)[key], np.full(kernel.shape, 8.0, np.float32))


def test_only_changed_variables_are_written():
    m = _model()
    step = _step(m)
    state = read_variables(step)
    before = dict(state)
    kernel_key = next(k for k in state if k.endswith("dense/kernel"))
    bias_key = next(k for k in state if k.endswith("dense/bias"))
    bias = next(v for v in m.trainable_variables if v.path.endswith("dense/bias"))
    bias.assign(np.full(bias.shape, 5.0, np.float32))     # a write after the read, not the step's
    state[kernel_key] = np.full(state[kernel_key].shape, 2.0, np.float32)
    assign_variables(step, state, before)
    after = read_variables(step)
    np.testing.assert_array_equal(after[kernel_key], state[kernel_key])
    np.testing.assert_array_equal(after[bias_key], np.full(bias.shape, 5.0, np.float32))   # left alone
    assign_variables(step, state)           # without ``before``: every variable
    np.testing.assert_array_equal(read_variables(step)[bias_key], before[bias_key])


def test_train_on_batch_logs_are_keras_metrics_of_the_emulated_values():
    m = _model()
    with ae.emulate("allow_mix_precision", loss_scale="dynamic") as run:
        for i in range(3):
            logs = m.train_on_batch(X[8 * i:8 * i + 8], Y[8 * i:8 * i + 8], return_dict=True)
            eager = {k: float(v) for k, v in m.get_metrics_result().items()}
            assert set(logs) == {"loss", "accuracy", "sparse_top_k_categorical_accuracy"}
            assert logs == eager
        step = next(iter(run._hooks.keras._train.values()))[0]
        assert any(then is not None for _, then in step._writers)     # (the logs were traced into the write)
        lr = m.optimizer.learning_rate
        m.optimizer.learning_rate.assign(0.5)     # the script's write between steps is what the next step uses
        m.train_on_batch(X[:8], Y[:8])
    assert float(lr.numpy()) == 0.5 and len(run.steps) == 4


class _CountingMean(keras.metrics.Mean):
    """A metric that resets itself its own way (a Python counter besides its variables)."""

    resets = 0

    def update_state(self, y_true, y_pred, sample_weight=None):
        return super().update_state(y_pred[:, 0], sample_weight)

    def reset_state(self):
        type(self).resets += 1
        super().reset_state()


def test_train_on_batch_resets_the_metrics_before_each_call():
    """Under emulate, Keras' ``reset_metrics`` runs as one traced call: every metric variable is zero after it, and
    each call's logs are that batch's alone (the loss is the step's own loss); a metric with a ``reset_state`` of its
    own is reset eagerly, its Python run on every call."""
    m = _model()
    with ae.emulate("allow_mix_precision", loss_scale="dynamic") as run:
        for i in range(3):
            logs = m.train_on_batch(X[8 * i:8 * i + 8], Y[8 * i:8 * i + 8], return_dict=True)
            assert logs["loss"] == pytest.approx(run.steps[-1]["loss"], rel=1e-6)
        assert any(float(np.abs(v.numpy()).max()) > 0 for v in m.metrics_variables)
        m.reset_metrics()
        assert all(float(np.abs(v.numpy()).max()) == 0 for v in m.metrics_variables)
        assert len(m.metrics_variables) >= 4
        assert run._hooks.keras._resets      # (the traced reset ran)
    counts = []
    for emulated in (False, True):
        m2 = _model()
        m2.compile(optimizer=keras.optimizers.Adam(1e-2),
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=[_CountingMean()])
        _CountingMean.resets = 0
        with ae.emulate("allow_mix_precision", loss_scale="dynamic") if emulated else contextlib.nullcontext():
            for i in range(3):
                m2.train_on_batch(X[8 * i:8 * i + 8], Y[8 * i:8 * i + 8])
        counts.append(_CountingMean.resets)
    # (Keras' compiled metrics are built by the first step: its first reset does not reach them)
    assert counts[1] == counts[0] >= 2
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    assert "reset_metrics" not in TensorFlowTrainer.__dict__      # Keras' own again after the context


def test_small_variables_are_written_together_and_large_ones_alone():
    """``assign_variables``: the variables under ``ALONE_BYTES`` go in one traced call (one packed array per dtype:
    the float32 weights and slots, the int64 iteration), the larger ones each by itself; every value lands exactly,
    a read taken before keeps its values, and a second write of the same set reuses the traced writer."""
    from ascend_emu.frontend.tf import stateful

    keras.backend.clear_session()
    keras.utils.set_random_seed(2)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(200), keras.layers.Dense(3)])   # 8x200: small
    m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    step = _step(m)
    big = next(v for v in m.trainable_variables if v.path.endswith("dense/kernel"))
    old = stateful.ALONE_BYTES
    try:
        stateful.ALONE_BYTES = big.numpy().nbytes      # the first kernel (and its slots) alone, the rest packed
        for round_ in range(2):
            state = read_variables(step)
            held = {k: np.array(v, copy=True) for k, v in state.items()}
            new = {k: (v + np.asarray(round_ + 1, v.dtype)).astype(v.dtype) for k, v in state.items()}
            views = dict(state)
            assign_variables(step, new, state)
            after = read_variables(step)
            for k in new:
                assert after[k].dtype == new[k].dtype and after[k].tobytes() == new[k].tobytes(), k
                assert views[k].tobytes() == held[k].tobytes(), k
        packed = [keys for keys, then in step._writers]
        assert len(packed) == 1 and len(packed[0]) >= 8
        assert any(step.handles[k][1].name == "int64" for k in packed[0])
        assert not any(k.endswith("dense/kernel") for k in packed[0])
    finally:
        stateful.ALONE_BYTES = old


def test_logs_that_cannot_be_traced_are_computed_eagerly_after_the_write(monkeypatch):
    """The logs are traced into the variables' write; logs that only run eagerly (here ``.numpy()``) are Keras' own
    ``get_metrics_result`` after the write instead."""
    from ascend_emu.frontend.tf.keras_hooks import KerasSteps

    fns = {}

    def eager_only(self, model):
        return fns.setdefault(id(model), lambda: {k: float(v.numpy()) for k, v in model.get_metrics_result().items()})
    monkeypatch.setattr(KerasSteps, "_logs_fn", eager_only)
    m = _model()
    with ae.emulate("allow_mix_precision", loss_scale="dynamic") as run:
        for i in range(2):
            logs = m.train_on_batch(X[8 * i:8 * i + 8], Y[8 * i:8 * i + 8], return_dict=True)
            assert logs == {k: float(v) for k, v in m.get_metrics_result().items()}
            assert logs["loss"] == pytest.approx(run.steps[-1]["loss"], rel=1e-6)
        step = next(iter(run._hooks.keras._train.values()))[0]
    assert any(w is None for w in step._writers.values())       # the traced write with the logs: refused


def test_fast_call_runs_the_function_directly_with_the_same_results(monkeypatch):
    """``fast_call`` runs a hand-over function through ``TFE_Py_Execute`` itself when executing eagerly: the same
    structured results as TensorFlow's call, the variables written as by it, TensorFlow's error for a failing op,
    and TensorFlow's own path where the direct one does not apply (tracing, a cancellation manager)."""
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import cancellation

    from ascend_emu.frontend.tf import stateful

    v = tf.Variable(np.zeros(3, np.float32))
    w = tf.Variable(np.arange(4, dtype=np.int64))

    def fn(x):
        v.assign(x * 2)
        return {"sum": tf.reduce_sum(v), "w": w.read_value(), "both": (x + 1, tf.cast(w, tf.float32))}

    cf = tf.function(fn, autograph=False).get_concrete_function(tf.TensorSpec((3,), tf.float32))
    calls = []
    real = pywrap_tfe.TFE_Py_Execute
    monkeypatch.setattr(pywrap_tfe, "TFE_Py_Execute", lambda *a: calls.append(a[2]) or real(*a))
    run = stateful.fast_call(cf)
    x = tf.constant([1.0, 2.0, 3.5])
    got = run(x)
    assert calls == [cf._inference_function.name.decode()]   # the direct path ran the function, once
    want = cf(x)
    assert set(got) == set(want) and type(got["both"]) is type(want["both"])
    for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(v.numpy(), [2.0, 4.0, 7.0])

    # a failing op: TensorFlow's own exception
    def bad(x):
        return tf.debugging.check_numerics(x, "not finite")

    run_bad = stateful.fast_call(tf.function(bad, autograph=False).get_concrete_function(
        tf.TensorSpec((3,), tf.float32)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="not finite"):
        run_bad(tf.constant([1.0, np.inf, 0.0]))

    # under a cancellation manager, and inside a trace: TensorFlow's path (the function not executed directly)
    name = cf._inference_function.name.decode()
    calls.clear()
    with cancellation.CancellationManagerContext(cancellation.CancellationManager()):
        np.testing.assert_array_equal(run(x)["w"].numpy(), np.arange(4))
    assert name not in calls

    @tf.function(autograph=False)
    def outer(x):
        return run(x)["sum"]

    assert float(outer(x)) == pytest.approx(13.0)
    assert name not in calls
