"""``train_on_batch`` under ``ae.emulate`` resets the model's metrics right before its train function: the emulator runs
that reset in front of the train function's first read of the variables, in the same traced call
(frontend/tf/keras_hooks.py ``defer_reset``, frontend/tf/stateful.py ``read_variables(step, first)``). The logs, the
weights, the metric variables and the step records are those of the reset run on its own; a ``reset_metrics()`` the
script calls itself resets at once; a reset whose train function never reads (a step traced first) still runs."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import ascend_emu as ae  # noqa: E402
from ascend_emu.frontend.tf import keras_hooks  # noqa: E402

RNG = np.random.default_rng(21)
X = RNG.standard_normal((64, 12)).astype(np.float32)
Y = RNG.integers(0, 3, 64)


def _model():
    keras.backend.clear_session()
    keras.utils.set_random_seed(7)
    L = keras.layers
    m = keras.Sequential([keras.Input((12,)), L.Dense(8, activation="relu"), L.Dense(3)], name="reset_mlp")
    m.compile(optimizer=keras.optimizers.Adam(1e-2),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return m


def _run(monkeypatch, defer: bool):
    calls = []
    real = keras_hooks.KerasSteps._reset_fn

    def counted(self, model, reset):
        calls.append(1)
        return real(self, model, reset)

    monkeypatch.setattr(keras_hooks.KerasSteps, "_reset_fn", counted)
    if not defer:     # the reset on its own, as before: a traced call of its own
        monkeypatch.setattr(keras_hooks.KerasSteps, "defer_reset",
                            lambda self, model, reset: self.reset_metrics(model, reset))
    m = _model()
    logs, metric_values = [], []
    with ae.emulate("allow_mix_precision", loss_scale="dynamic") as run:
        for i in range(4):
            logs.append(m.train_on_batch(X[i * 16:(i + 1) * 16], Y[i * 16:(i + 1) * 16], return_dict=True))
            metric_values.append([np.asarray(v.numpy()) for v in m.metrics_variables])
        m.reset_metrics()       # the script's own: at once
        after_reset = [np.asarray(v.numpy()) for v in m.metrics_variables]
        hist = m.fit(X, Y, batch_size=16, epochs=1, verbose=0, shuffle=False).history
    monkeypatch.undo()
    weights = [np.asarray(v.numpy()) for v in m.weights + m.optimizer.variables]
    steps = [{k: v for k, v in s.items() if k != "function"} for s in run.steps]
    return logs, metric_values, after_reset, hist, weights, steps, len(calls)


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (np.ndarray, np.generic, float)):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return a == b


def test_the_deferred_reset_gives_the_logs_weights_and_metrics_of_the_reset_on_its_own(monkeypatch):
    deferred = _run(monkeypatch, True)
    alone = _run(monkeypatch, False)
    # the first call traces the step (its reset runs on its own first); the next three read after the reset
    assert deferred[-1] == 3 and alone[-1] == 0
    for d, a in zip(deferred[:-1], alone[:-1]):
        assert _same(d, a)
    logs, metric_values, after_reset = deferred[:3]
    # each train_on_batch's logs are its own batch's (reset before it): the loss tracker and the accuracy counted the
    # batch's 16 samples, not the ones before
    for vals in metric_values:
        assert sum(v.shape == () and float(v) == 16.0 for v in vals) == 2, vals
    assert all(not np.any(v) for v in after_reset)


def test_a_deferred_reset_that_nothing_reads_still_runs(monkeypatch):
    """train_on_batch's train function fails before it reads the variables: the reset runs anyway."""
    m = _model()
    with ae.emulate("allow_mix_precision", loss_scale="dynamic"):
        m.train_on_batch(X[:16], Y[:16])
        m.train_on_batch(X[16:32], Y[16:32])
        assert any(np.any(np.asarray(v.numpy())) for v in m.metrics_variables)

        def failing(*a, **k):
            raise RuntimeError("before any read")

        monkeypatch.setattr(keras_hooks, "read_variables", failing)
        with pytest.raises(RuntimeError, match="before any read"):
            m.train_on_batch(X[32:48], Y[32:48])
        monkeypatch.undo()
        assert all(not np.any(np.asarray(v.numpy())) for v in m.metrics_variables)


def test_a_train_function_of_the_models_own_still_resets():
    """Review (session 21): a class whose own make_train_function makes the train function (not the emulator's): the
    reset train_on_batch asks for runs at once (deferred, nothing would run it: the metrics counted evaluate's samples
    and the batch's)."""
    class Own(keras.Sequential):
        def make_train_function(self, force=False):
            def f(it):
                x, y, sw = next(it)
                return self.train_step((tf.constant(x), tf.constant(y)))
            self.train_function = f
            return f

    keras.backend.clear_session()
    keras.utils.set_random_seed(7)
    L = keras.layers
    m = Own([keras.Input((12,)), L.Dense(8, activation="relu"), L.Dense(3)], name="own_train")
    m.compile(optimizer=keras.optimizers.SGD(1e-2), metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with ae.emulate("force_fp32"):
        m.evaluate(X[:32], Y[:32], verbose=0)       # the model is now one of the emulator's
        for i in range(2):
            m.train_on_batch(X[16 * i:16 * i + 16], Y[16 * i:16 * i + 16])
            counts = [float(v.numpy()) for v in m.metrics_variables if v.shape == () and "count" in v.path]
            assert counts and all(c == 16.0 for c in counts), counts
