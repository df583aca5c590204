"""The device's work kept per node between replays (npu/node_plan.py ``Prepared`` and ``Light``: a Const, a Placeholder,
a host op, shape arithmetic, Identity/Reshape-like moves worked out once) changes no bit: a replay that uses it makes
the records and outputs of the replay that worked it out, and Keras training under ``ae.emulate`` ends with the same
weights, logs and step records as with nothing kept (every node on the full path every step)."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import ascend_emu as ae  # noqa: E402
from ascend_emu.npu import replay as replay_mod  # noqa: E402
from ascend_emu.npu.node_plan import Light  # noqa: E402
from ascend_emu.npu.training import step_feeds  # noqa: E402

RNG = np.random.default_rng(15)
X = RNG.standard_normal((48, 8, 8, 3)).astype(np.float32)
Y = RNG.integers(0, 4, 48)


def _cnn():
    keras.backend.clear_session()
    keras.utils.set_random_seed(3)
    L = keras.layers
    m = keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(4, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
                          L.Reshape((64, 4)), L.Flatten(), L.Dense(4)], name="light_cnn")
    m.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def _mlp():
    keras.backend.clear_session()
    keras.utils.set_random_seed(4)
    L = keras.layers
    m = keras.Sequential([keras.Input((8, 8, 3)), L.Flatten(), L.Dense(16, activation="relu"), L.Dense(4)],
                         name="light_mlp")
    m.compile(optimizer=keras.optimizers.Adam(1e-2),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return m


def _train(build, keep_nodes: bool, monkeypatch):
    if not keep_nodes:     # nothing kept: every node takes the full path in every replay
        monkeypatch.setattr(replay_mod._Run, "_keep", lambda self, node, prep: None)
    m = build()
    logs = []
    with ae.emulate("allow_mix_precision", loss_scale="dynamic") as run:
        for i in range(3):
            logs.append(m.train_on_batch(X[i * 16:(i + 1) * 16], Y[i * 16:(i + 1) * 16], return_dict=True))
    monkeypatch.undo()
    weights = [np.asarray(v.numpy()) for v in m.weights + m.optimizer.variables]
    steps = [{k: v for k, v in s.items() if k != "function"} for s in run.steps]
    return weights, logs, steps


@pytest.mark.parametrize("build", [_cnn, _mlp], ids=["cnn_sgd_momentum", "mlp_adam"])
def test_keras_training_same_bits_with_nodes_kept_or_not(build, monkeypatch):
    w0, logs0, steps0 = _train(build, False, monkeypatch)
    w1, logs1, steps1 = _train(build, True, monkeypatch)
    assert len(w0) == len(w1)
    for a, b in zip(w0, w1):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert logs0 == logs1
    assert steps0 == steps1


def test_a_replay_with_light_nodes_records_what_the_full_path_did():
    m = _cnn()
    with ae.emulate("allow_mix_precision", loss_scale="dynamic") as run:
        m.train_on_batch(X[:16], Y[:16])
        step = next(iter(run._hooks.keras._train.values()))[0]
    from ascend_emu.frontend.tf.stateful import read_variables

    feeds = step_feeds(step, X[16:32], Y[16:32], 1, 1024.0, {k: np.array(v) for k, v in read_variables(step).items()})
    dev = ae.Device("allow_mix_precision")
    first = dev.replay(step.graph, feeds, progress=False, keep_tensors=False, phases=step.phase)
    ((_, _, _, (_, _, prepared, _)),) = dev._plan_cache.values()
    kinds = {p.kind for p in prepared.values() if type(p) is Light}
    assert {"const", "placeholder", "host", "int", "move"} <= kinds
    second = dev.replay(step.graph, feeds, progress=False, keep_tensors=False, phases=step.phase)
    assert first.records == second.records
    assert first.summary["float_status"] == second.summary["float_status"]
    assert first.outputs.keys() == second.outputs.keys()
    for k, v in first.outputs.items():
        assert np.asarray(v).tobytes() == np.asarray(second.outputs[k]).tobytes()
