"""Keras models the emulator's step tracing met half-made (review of session 21, both on main before): a Sequential
made without ``keras.Input`` (its layers, compiled loss and metrics, optimizer built from the first batch, as Keras'
own ``fit`` does: the optimizer had been built on the unbuilt model's no variables, "Unknown variable"), and a model
compiled again (new metrics, loss, optimizer: the step traced before updated the old metrics, "Cannot get result()
since the metric has not yet been built"). In the tests' fp32 mode (tests/fp32mode.py) their logs and weights are
TensorFlow's own up to float32 rounding (test_emulate.py's tolerance)."""
from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import ascend_emu as ae  # noqa: E402
from fp32mode import fp32  # noqa: E402  (tests/ is on the path: pyproject's pythonpath)

FP32_TOL = 5e-7

RNG = np.random.default_rng(21)
X = RNG.standard_normal((64, 10)).astype(np.float32)
Y = (RNG.random(64) > 0.5).astype(np.float32)[:, None]


def _lazy():
    keras.backend.clear_session()
    keras.utils.set_random_seed(5)
    m = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1, activation="sigmoid")],
                         name="lazy")
    m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=["accuracy"])
    return m


def _run(build, script, emulated: bool):
    import contextlib

    m = build()
    logs = []
    with ae.emulate(**fp32()) if emulated else contextlib.nullcontext():
        script(m, logs)
    return logs, [np.asarray(w) for w in m.weights]


def _same(script, build):
    ours, w_ours = _run(build, script, True)
    tf_logs, w_tf = _run(build, script, False)
    assert len(ours) == len(tf_logs)
    for a, b in zip(ours, tf_logs):
        assert sorted(a) == sorted(b)
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=0, atol=FP32_TOL, err_msg=k)
    for a, b in zip(w_ours, w_tf):
        np.testing.assert_allclose(a, b, rtol=0, atol=FP32_TOL)


def test_a_sequential_without_input_trains_as_keras_does():
    def script(m, logs):
        for i in range(3):
            logs.append(m.train_on_batch(X[16 * i:16 * i + 16], Y[16 * i:16 * i + 16], return_dict=True))
        logs.append(m.evaluate(X[:32], Y[:32], verbose=0, return_dict=True))
    _same(script, _lazy)


def test_a_recompiled_model_trains_with_its_new_metrics_as_keras_does():
    def build():
        keras.backend.clear_session()
        keras.utils.set_random_seed(6)
        m = keras.Sequential([keras.Input((10,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")], name="recompiled")
        m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=["mae"])
        return m

    def script(m, logs):
        for i in range(2):
            logs.append(m.train_on_batch(X[16 * i:16 * i + 16], Y[16 * i:16 * i + 16], return_dict=True))
        for r in range(2):      # the same optimizer, new loss and metrics objects each time
            m.compile(optimizer=m.optimizer, loss="binary_crossentropy",
                      metrics=[keras.metrics.AUC(name="auc"), "accuracy"])
            for i in range(2):
                logs.append(m.train_on_batch(X[16 * i:16 * i + 16], Y[16 * i:16 * i + 16], return_dict=True))
            logs.append(m.evaluate(X[:32], Y[:32], verbose=0, return_dict=True))
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")      # another optimizer
        logs.append(m.train_on_batch(X[:16], Y[:16], return_dict=True))
    _same(script, build)
