"""Batch norm's fp16 input gradient as one node (npu/bn_chain.py: ``_BnDxChain``, run by ``rewritten_runs._bn_dx``
with numerics/chain.py ``bn_dx_f16``): real training runs give the same bits with and without the rewrite.

A small Keras CNN (two Conv2D + BatchNormalization + ReLU blocks, as the benchmark CNN) trains a few
``train_on_batch`` steps under ``ae.emulate("allow_mix_precision")`` twice from the same seed: once as today (the
step graph replayed as it is) and once with the rewrite, hashing every variable and every step's record (loss,
scale, float status, skipped, first overflow, gradient zeros). A loss scale that overflows the fp16 gradients
makes the node run its four ops one by one (their casts, records and status: the same first overflow).
"""
from __future__ import annotations

import pytest

keras = pytest.importorskip("keras")

from bn_models import X, Y, model, run_rewrite  # noqa: E402  (tests/ is on the path: pyproject's pythonpath)

import ascend_emu as ae  # noqa: E402
from ascend_emu.npu import device as D  # noqa: E402
from ascend_emu.npu import training as T  # noqa: E402
from ascend_emu.npu.bn_chain import bn_dx_graph  # noqa: E402


def _run(monkeypatch, **kw):
    return run_rewrite(monkeypatch, "bn_dx_graph", "_BnDxChain", **kw)


def test_train_on_batch_same_bits(monkeypatch):
    new, steps, nodes, fast = _run(monkeypatch, rewrite=True)
    # both BN layers' input gradients; one pass from the second step on (the first runs the ops one by one and
    # checks their decisions)
    assert nodes == [2] * 4 and fast == [0, 2, 2, 2]
    old, old_steps, _, fast_old = _run(monkeypatch, rewrite=False)
    assert new == old and fast_old == [0] * 4 and not any(s["skipped"] for s in steps)


def test_overflow_runs_the_ops_one_by_one(monkeypatch):
    """A loss scale that overflows the fp16 gradients: every step skipped, the first overflow the same op."""
    new, steps, nodes, fast = _run(monkeypatch, rewrite=True, loss_scale="fixed:1099511627776", steps=2)
    assert all(s["skipped"] and s["first_overflow"] for s in steps) and nodes == [2, 2] and fast == [0, 0]
    old, old_steps, _, _ = _run(monkeypatch, rewrite=False, loss_scale="fixed:1099511627776", steps=2)
    assert new == old and [s["first_overflow"] for s in steps] == [s["first_overflow"] for s in old_steps]


def test_left_out(tmp_path):
    """The graph as it is with flushed subnormals, and every op of a dumped step."""
    m = model()
    step = T._prepare(m, (X, Y), loss=None, optimizer=None, learning_rate=None, optimizer_options=None,
                      batch_size=16, steps=1, epochs=None, loss_scale=None, shuffle=False, seed=0, dump_dir=None,
                      dump_steps=None, overwrite=False).step_graph
    dev = ae.Device("allow_mix_precision")
    g = bn_dx_graph(dev, step.graph)
    made = [n for n in g.nodes if n.op == "_BnDxChain"]
    assert len(made) == 2 and all(n.meta["phase"] == "backward" and step.phase(n.name) == "backward" for n in made)
    assert len(g.outputs) == len(step.graph.outputs) and bn_dx_graph(dev, step.graph) is g
    assert bn_dx_graph(ae.Device("allow_mix_precision", subnormals="flush"), step.graph) is step.graph
    from ascend_emu.analysis.dump import load_dump

    dev.train(m, (X, Y), batch_size=16, steps=1, dump_dir=str(tmp_path), progress=False)
    types = {op["tf_type"] for op in load_dump(str(tmp_path / "step-0")).ops}
    assert "_BnDxChain" not in types and {"AddN", "Sub", "_EltwiseChain"} <= types


def test_an_overflow_in_a_member_and_after_it_names_the_member(monkeypatch):
    """Review (session 20): A (``batchnorm/mul_1/Mul``) runs ~40 ops before D in the unrewritten graph; run one by one
    at D's place, A's record came after ``mul_1/Mul_1``'s and the step's first overflow named that op. Both overflow
    here (the second BN's scale and shift and the dense weights made large): every record with a status comes in the
    unrewritten graph's order, and the first overflow is A."""
    def big_model():
        m = model()
        conv2, bn2, dense = m.layers[3], m.layers[4], m.layers[-1]
        w, b = conv2.get_weights()
        conv2.set_weights([w, b + 150])
        g, beta, mm, mv = bn2.get_weights()
        bn2.set_weights([g * 116, beta - 232, mm, mv])
        dw, db = dense.get_weights()
        dense.set_weights([dw * 20, db])
        return m

    def run(rewrite):
        seen = []
        with monkeypatch.context() as mp:
            if not rewrite:
                mp.setattr(T, "bn_dx_graph", lambda device, graph: graph)
            replay = D.Device.replay

            def replayed(self, *a, **k):
                res = replay(self, *a, **k)
                seen.append([(r.name, r.status) for r in res.records if r.status])
                return res
            mp.setattr(D.Device, "replay", replayed)
            m = big_model()
            with ae.emulate("allow_mix_precision", loss_scale=f"fixed:{2 ** 14.5}") as run_:
                m.train_on_batch(X[:16], Y[:16])
                m.train_on_batch(X[:16], Y[:16])
        return run_.steps, seen

    steps, seen = run(True)
    old_steps, old_seen = run(False)
    assert [s["first_overflow"] for s in steps] == [s["first_overflow"] for s in old_steps]
    assert steps[0]["first_overflow"]["name"].endswith("batchnorm/mul_1/Mul")
    assert seen == old_seen and len(seen[0]) > 1


def test_flushed_subnormals_run_the_ops_one_by_one(monkeypatch):
    """Review (session 21): with the CCE compiler's flush-to-zero (``cce_ftz=True``) the one pass, which keeps
    fp16 subnormals, is never switched on: the four ops run one by one every step, the bits the unrewritten graph's."""
    new, steps, nodes, fast = _run(monkeypatch, rewrite=True, steps=3, cce_ftz=True)
    assert nodes == [2] * 3 and fast == [0] * 3
    old, _, _, _ = _run(monkeypatch, rewrite=False, steps=3, cce_ftz=True)
    assert new == old
