"""The optimizer's update chains as one node each (npu/update_chain.py: ``_UpdateChain``, run by
numerics/chain.py ``chain_f32``; the update's repeated pure nodes dropped): real training runs give the same bits
with and without the rewrite.

Each case trains a small Keras model (a user's own ``train_on_batch`` under ``ae.emulate``, ``Device.train``, a
TF1 graph's ``Apply*`` ops) twice from the same seed: once as today (the step graph replayed as it is) and once
with the update chains, hashing every variable (weights, optimizer slots and iteration, metric totals, loss
scale) and every step's record (loss, scale, float status, skipped, first overflow, gradient zeros). Overflow
inside the update (a learning rate near the float32 limit) takes the op-by-op path inside the chain node.
"""
from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from bn_models import digest  # noqa: E402  (tests/ is on the path: pyproject's pythonpath)

import ascend_emu as ae  # noqa: E402
from ascend_emu.npu import training as T  # noqa: E402
from ascend_emu.npu.update_chain import update_chain_graph  # noqa: E402

RNG = np.random.default_rng(46)
X = RNG.standard_normal((48, 12)).astype(np.float32)
Y = RNG.integers(0, 4, 48)

OPTIMIZERS = {
    "adam": lambda lr: keras.optimizers.Adam(lr),
    "adamw": lambda lr: keras.optimizers.AdamW(lr, weight_decay=0.01),
    "adamw_huge": lambda lr: keras.optimizers.AdamW(1e38, weight_decay=100.0),
    "adam_amsgrad": lambda lr: keras.optimizers.Adam(lr, amsgrad=True),
    "sgd_momentum": lambda lr: keras.optimizers.SGD(lr, momentum=0.9),
    "sgd_nesterov": lambda lr: keras.optimizers.SGD(lr, momentum=0.9, nesterov=True),
    "sgd": lambda lr: keras.optimizers.SGD(lr),
    "rmsprop": lambda lr: keras.optimizers.RMSprop(lr, momentum=0.5, centered=True),
}


def _model(optimizer="adam", lr=1e-2):
    keras.backend.clear_session()
    keras.utils.set_random_seed(3)
    L = keras.layers
    m = keras.Sequential([keras.Input((12,)), L.Dense(16, activation="relu"), L.BatchNormalization(), L.Dense(4)],
                         name="chain_mlp")
    m.compile(optimizer=OPTIMIZERS[optimizer](lr),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def _today(monkeypatch):
    """Replay every step graph as it is (the path before the update chains)."""
    monkeypatch.setattr(T, "update_chain_graph", lambda device, graph: graph)


def _keras_run(optimizer, lr=1e-2, steps=3, **options):
    """(digest, the variables, how many _UpdateChain nodes each step replayed) of a few train_on_batch steps."""
    m = _model(optimizer, lr)
    chains = []
    replayed = T.update_chain_graph

    def counted(device, graph):
        out = replayed(device, graph)
        chains.append(sum(n.op == "_UpdateChain" for n in out.nodes))
        return out
    T.update_chain_graph = counted
    try:
        with ae.emulate("allow_mix_precision", loss_scale="dynamic", **options) as run:
            for i in range(steps):
                m.train_on_batch(X[16 * i:16 * i + 16], Y[16 * i:16 * i + 16])
    finally:
        T.update_chain_graph = replayed
    variables = [v.numpy() for v in m.variables + m.optimizer.variables]
    return digest(variables, run.steps), variables, chains


@pytest.mark.parametrize("optimizer", sorted(set(OPTIMIZERS) - {"adamw_huge"}))
def test_keras_train_on_batch_same_bits(optimizer, monkeypatch):
    new, _, chains = _keras_run(optimizer)
    # one chain per trainable variable (AMSGrad's Maximum, not a chain step, cuts each in two), and BatchNorm's
    # two moving averages
    assert chains == [6 * (2 if optimizer == "adam_amsgrad" else 1) + 2] * 3
    with monkeypatch.context() as mp:
        _today(mp)
        old, _, chains = _keras_run(optimizer)
    assert new == old and chains == [0] * 3


@pytest.mark.parametrize("overflow_mode", ["inf_nan", "saturation"])
def test_overflow_inside_the_update_same_bits(overflow_mode, monkeypatch):
    """AdamW whose learning rate times weight decay overflows float32: the variables' updates overflow (status
    bits on the update ops, which the overflow decision does not read); the chain nodes run their ops one by
    one."""
    new, variables, chains = _keras_run("adamw_huge", steps=2, overflow_mode=overflow_mode)
    kernel = variables[0]
    if overflow_mode == "inf_nan":
        assert not np.isfinite(kernel).all()
    else:
        assert np.isfinite(kernel).all() and np.abs(kernel).max() > 1e37
    with monkeypatch.context() as mp:
        _today(mp)
        old, _, _ = _keras_run("adamw_huge", steps=2, overflow_mode=overflow_mode)
    assert new == old and chains[0] == 8


def test_device_train_same_bits(monkeypatch):
    """``Device.train`` (the functional optimizers of ``ascend-emu train``), Adam with dynamic loss scaling."""
    def run():
        res = ae.Device("allow_mix_precision").train(_model("adam"), (X, Y), batch_size=16, steps=3,
                                                     loss_scale="dynamic", progress=False)
        return digest([w for _, w in sorted(res.weights().items())], res.steps)
    new = run()
    with monkeypatch.context() as mp:
        _today(mp)
        assert run() == new


def test_tf1_apply_ops_same_bits(monkeypatch):
    """A TF1 graph's ResourceApplyAdam, rewritten to its float32 chain by functionalize, as one node."""
    from ascend_emu.frontend.tf.tf import import_tf
    from ascend_emu.frontend.tf.tf1_step import train_step_from_tf1_graph

    tf = import_tf()
    v1 = tf.compat.v1

    def run():
        g = tf.Graph()
        with g.as_default():
            v1.set_random_seed(5)
            x = v1.placeholder(tf.float32, (None, 12), name="x")
            y = v1.placeholder(tf.int32, (None,), name="y")
            w0 = v1.get_variable("w0", (12, 16), use_resource=True)
            w1 = v1.get_variable("w1", (16, 4), use_resource=True)
            logits = tf.matmul(tf.nn.relu(tf.matmul(x, w0)), w1)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits),
                                  name="loss")
            v1.train.AdamOptimizer(0.01).minimize(loss, name="train")
            init = v1.global_variables_initializer()
        sess = v1.Session(graph=g)
        sess.run(init)
        ts = train_step_from_tf1_graph(g, x="x", y="y", loss="loss:0", train_op="train", session=sess)
        dev = ae.Device("allow_mix_precision")
        assert sum(n.op == "_UpdateChain" for n in update_chain_graph(dev, ts.graph).nodes) == 2
        res = dev.train(ts, (X, Y), batch_size=16, steps=3, loss_scale="dynamic", progress=False)
        return digest([w for _, w in sorted(res.weights().items())], res.steps)
    new = run()
    with monkeypatch.context() as mp:
        _today(mp)
        assert run() == new


def test_chains_formed_and_left_out(tmp_path):
    """One chain per variable for Adam; the graph as it is where a chain's dtype could change (ApplyAdam on the
    white list), with flushed subnormals, and for a step that is dumped."""
    m = _model("adam")
    dev = ae.Device("allow_mix_precision")
    step = T._prepare(m, (X, Y), loss=None, optimizer=None, learning_rate=None, optimizer_options=None,
                      batch_size=16, steps=1, epochs=None, loss_scale=None, shuffle=False, seed=0, dump_dir=None,
                      dump_steps=None, overwrite=False).step_graph
    g = update_chain_graph(dev, step.graph)
    chains = [n for n in g.nodes if n.op == "_UpdateChain"]
    assert len(chains) == len(m.trainable_variables)
    assert all(n.meta["phase"] == "update" and step.phase(n.name) == "update" for n in chains)
    assert len(g.nodes) < len(step.graph.nodes) and len(g.outputs) == len(step.graph.outputs)
    # each variable's bias corrections (beta^t) computed once for all: the repeats dropped
    assert sum(n.op == "Pow" for n in step.graph.nodes) == 12 and sum(n.op == "Pow" for n in g.nodes) == 2
    keep = ae.Device("allow_mix_precision", keep_dtype=[step.graph.nodes[0].name])
    assert sum(n.op == "Pow" for n in update_chain_graph(keep, step.graph).nodes) == 12   # (decisions by name)
    white = ae.Device("allow_mix_precision", modify_mixlist={"white-list": {"to-add": ["ApplyAdam"]}})
    assert update_chain_graph(white, step.graph) is step.graph
    assert update_chain_graph(ae.Device("allow_mix_precision", subnormals="flush"), step.graph) is step.graph
    # a dumped step has every op of the update
    from ascend_emu.analysis.dump import load_dump

    dev.train(m, (X, Y), batch_size=16, steps=1, dump_dir=str(tmp_path), progress=False)
    types = {op["tf_type"] for op in load_dump(str(tmp_path / "step-0")).ops}
    assert "_UpdateChain" not in types and {"Sqrt", "RealDiv", "Square"} <= types
