"""An fp16 elementwise node read only by a float32 reduction as one node (npu/eltwise_reduce.py: ``_EltReduce``, run
by ``rewritten_runs._elt_reduce`` with numerics/eltwise_reduce.py ``eltwise_reduce_f16``): real training runs give the
same bits with and without the rewrite.

A small Keras CNN (two Conv2D + BatchNormalization + ReLU blocks, as the benchmark CNN) trains a few
``train_on_batch`` steps under ``ae.emulate("allow_mix_precision")`` twice from the same seed: once with the graph
replayed as it is and once with the rewrite (batch norm's ``moments/SquaredDifference -> variance`` and
``batchnorm/mul_1/Mul_1 -> Sum`` per layer; the gradient tape's ``Shape`` readers of the SquaredDifference read the
node's shape output), hashing every variable and every step's record. A loss scale that overflows the fp16 gradients
makes the backward nodes run their ops one by one (their casts, records and status: the same first overflow).
"""
from __future__ import annotations

import pytest

keras = pytest.importorskip("keras")

from bn_models import X, Y, model, run_rewrite  # noqa: E402  (tests/ is on the path: pyproject's pythonpath)

import ascend_emu as ae  # noqa: E402
from ascend_emu.npu import training as T  # noqa: E402
from ascend_emu.npu.eltwise_reduce import eltwise_reduce_graph  # noqa: E402


def _run(monkeypatch, **kw):
    return run_rewrite(monkeypatch, "eltwise_reduce_graph", "_EltReduce", **kw)


def test_train_on_batch_same_bits(monkeypatch):
    new, steps, nodes, fast = _run(monkeypatch, rewrite=True)
    # both BN layers' variance and scale gradient; one pass from the second step on (the first runs the ops one by
    # one and checks their decisions)
    assert nodes == [4] * 4 and fast == [0, 4, 4, 4]
    old, old_steps, _, fast_old = _run(monkeypatch, rewrite=False)
    assert new == old and fast_old == [0] * 4 and not any(s["skipped"] for s in steps)


def test_overflow_runs_the_ops_one_by_one(monkeypatch):
    """A loss scale that overflows the fp16 gradients to Inf (overflow_mode="inf_nan"): every step skipped, the first
    overflow the same op; the backward nodes (a product with an Inf gradient) run their ops one by one, the forward
    ones (no gradient) their one pass. (Under saturation the gradients stay finite: every node's one pass.)"""
    kw = dict(loss_scale="fixed:1099511627776", steps=3, overflow_mode="inf_nan")
    new, steps, nodes, fast = _run(monkeypatch, rewrite=True, **kw)
    assert all(s["skipped"] and s["first_overflow"] for s in steps) and nodes == [4] * 3 and fast == [0, 2, 2]
    old, old_steps, _, _ = _run(monkeypatch, rewrite=False, **kw)
    assert new == old and [s["first_overflow"] for s in steps] == [s["first_overflow"] for s in old_steps]


def test_left_out(tmp_path):
    """The graph as it is with flushed subnormals, and every op of a dumped step."""
    m = model()
    step = T._prepare(m, (X, Y), loss=None, optimizer=None, learning_rate=None, optimizer_options=None,
                      batch_size=16, steps=1, epochs=None, loss_scale=None, shuffle=False, seed=0, dump_dir=None,
                      dump_steps=None, overwrite=False).step_graph
    dev = ae.Device("allow_mix_precision")
    g = eltwise_reduce_graph(dev, step.graph)
    made = [n for n in g.nodes if n.op == "_EltReduce"]
    assert len(made) == 4 and sorted(n.meta["phase"] for n in made) == ["backward"] * 2 + ["forward"] * 2
    assert all(step.phase(n.name) == n.meta["phase"] for n in made)
    # the shape readers read the node's second output; nothing reads the elementwise nodes any more
    gone = {n.meta["elt_reduce"][0].name for n in made}
    assert not gone & {n.name for n in g.nodes}
    refs = [r for n in g.nodes for r in n.inputs]
    assert not any(r.split(":")[0] in gone for r in refs)
    shape_readers = [n for n in g.nodes if n.op == "Shape" and n.inputs[0].endswith(":1")
                     and n.inputs[0].split(":")[0] in {x.name for x in made}]
    assert len(shape_readers) == 4
    assert len(g.outputs) == len(step.graph.outputs) and eltwise_reduce_graph(dev, step.graph) is g
    assert eltwise_reduce_graph(ae.Device("allow_mix_precision", subnormals="flush"), step.graph) is step.graph
    from ascend_emu.analysis.dump import load_dump

    dev.train(m, (X, Y), batch_size=16, steps=1, dump_dir=str(tmp_path), progress=False)
    types = {op["tf_type"] for op in load_dump(str(tmp_path / "step-0")).ops}
    assert "_EltReduce" not in types and {"SquaredDifference", "Mean", "Mul", "Sum"} <= types
