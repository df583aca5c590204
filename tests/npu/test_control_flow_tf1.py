"""TF1 control flow: a ``tf.compat.v1`` model with ``tf.cond`` and ``tf.while_loop`` (control flow v1: Switch,
Merge, Enter, Exit, NextIteration, LoopCond), frozen to a .pb, replayed op by op: every iteration's ops on the
emulated units under ``<loop>/body/<k>/...``, the untaken branch not run, the float32 reference run the same
way in TensorFlow so the comparison lines every iteration up."""
import numpy as np
import pytest

from ascend_emu import Device, compare, reference
from ascend_emu.errors import AscendEmuError
from ascend_emu.frontend.tf import models
from ascend_emu.frontend.tf.loader import import_tf, load_graph
from fp32mode import FP32, fp32  # noqa: F401  (the tests' fp32 mode)

tf = import_tf()
tf1 = tf.compat.v1


def _frozen_model(path):
    """models.tf1_control_flow_graph written to ``path``; two inputs (positive and negative, taking the two
    branches of the final cond) and TensorFlow's outputs for them (the frozen graph in a Session)."""
    gd = models.tf1_control_flow_graph()
    tf.io.write_graph(gd, str(path.parent), path.name, as_text=False)
    inputs = [np.abs(np.random.default_rng(0).standard_normal((2, 3))).astype(np.float32),
              -np.abs(np.random.default_rng(1).standard_normal((2, 3))).astype(np.float32) * 5]
    g = tf.Graph()
    with g.as_default():
        tf1.import_graph_def(gd, name="")
        with tf1.Session(graph=g) as sess:
            want = [sess.run("out:0", {"x:0": xv}) for xv in inputs]
    return inputs, want


def test_tf1_frozen_cond_and_nested_while_match_tensorflow(tmp_path):
    inputs, want = _frozen_model(tmp_path / "tf1.pb")
    g = load_graph(tmp_path / "tf1.pb")
    ops = {n.op for n in g.nodes}
    assert {"Switch", "Merge", "Enter", "Exit", "NextIteration", "LoopCond"} <= ops
    assert g.outputs == ["out:0"]
    branches = set()
    for xv, out in zip(inputs, want):
        res = Device(**FP32).replay(g, {"x": xv}, progress=False)
        np.testing.assert_allclose(res.outputs["out:0"], out, rtol=1e-6, atol=1e-6)
        names = [r.name for r in res.records]
        types = {r.name: r.tf_type for r in res.records}
        # three outer iterations, each with two inner ones; the fourth predicate evaluation ends the loop
        # (fusion applies in loops: MatMul+BiasAdd+Relu is one _FusedMatMul named Relu, mul+sub one chain)
        for k in range(3):
            assert types[f"while/body/{k}/Relu"] == "_FusedMatMul"
            for j in range(2):
                assert types[f"while/body/{k}/while/body/{j}/sub"] == "_EltwiseChain"
            assert f"while/body/{k}/while/cond/2/LoopCond" in names
        # (an op that reads only loop invariants runs in the last iteration too, as in TensorFlow's executor)
        assert "while/cond/3/LoopCond" in names and "while/body/3/Relu" not in names
        # in each iteration one branch of the body's cond ran, never both
        for k in range(3):
            then = any(n.startswith(f"while/body/{k}/cond/mul") for n in names)
            other = any(n.startswith(f"while/body/{k}/cond/add") for n in names)
            assert then != other
        branches.add("cond/MatMul" in names)
        assert "cond/Merge" in names and "while/Exit_1" in names
    assert branches == {True, False}          # the two inputs take the two branches of the final cond


def test_tf1_reference_lines_up_every_iteration_and_mixed_precision_replays(tmp_path):
    inputs, want = _frozen_model(tmp_path / "tf1.pb")
    g = load_graph(tmp_path / "tf1.pb")
    feeds = {"x": inputs[0]}
    ref = reference(g, feeds, dump_dir=tmp_path / "bench", progress=False)
    np.testing.assert_allclose(ref.outputs["out:0"], want[0], rtol=0, atol=0)   # TensorFlow op by op = Session
    assert "while/body/2/while/body/1/mul:0" in ref.tensors
    Device(**FP32).replay(g, feeds, dump_dir=tmp_path / "npu", progress=False)
    cmp = compare(tmp_path / "npu", tmp_path / "bench")
    kinds = [cmp.info(i)["kind"] for i in range(len(cmp.rows))]
    assert not {"npu only", "bench only"} & set(kinds)
    body = [r for r, k in zip(cmp.rows, kinds) if k == "matched" and "/body/" in r["NPU Name"]]
    assert len(body) > 30 and all(r["Result"] == "pass" for r in body)
    assert cmp.first_divergent() is None

    mix = Device("allow_mix_precision").replay(g, feeds, dump_dir=tmp_path / "mix", progress=False)
    mm = [r for r in mix.records if r.tf_type in ("MatMul", "_FusedMatMul") and "/body/" in r.name]
    assert len(mm) == 3 and all(r.compute_dtype == "float16" for r in mm)
    out = np.asarray(mix.outputs["out:0"], np.float64)
    assert np.abs(out - want[0]).max() <= 2e-2 * np.abs(want[0]).max()
    cmp = compare(tmp_path / "mix", tmp_path / "bench")
    assert sum(1 for i in range(len(cmp.rows)) if cmp.info(i)["kind"] == "matched"
               and "/body/" in cmp.rows[i]["NPU Name"]) == len(body)


def test_tf1_dead_output_is_an_error(tmp_path):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [3], name="x")
        sw = tf.raw_ops.Switch(data=x, pred=tf.reduce_sum(x) > 0)
        tf.identity(sw.output_true * 2.0, name="pos")
    tf.io.write_graph(g.as_graph_def(), str(tmp_path), "dead.pb", as_text=False)
    gr = load_graph(tmp_path / "dead.pb")
    res = Device(**FP32).replay(gr, {"x": np.ones(3, np.float32)}, progress=False)
    np.testing.assert_array_equal(res.outputs["pos:0"], np.full(3, 2, np.float32))
    with pytest.raises(AscendEmuError, match=r"output 'pos:0' of the graph is dead: it lies in a cond branch"):
        Device(**FP32).replay(gr, {"x": -np.ones(3, np.float32)}, progress=False)


def test_switch_case_frozen_to_switch_n_takes_each_branch(tmp_path):
    """tf.switch_case: the freezing pass lowers its Case to _SwitchN + Merge; out of range takes the last branch."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.float32), tf.TensorSpec([], tf.int32)])
    def f(x, i):
        return tf.switch_case(i, [lambda: x * 2.0, lambda: tf.nn.relu(x), lambda: x - 1.0])

    gd = convert_variables_to_constants_v2(f.get_concrete_function()).graph.as_graph_def()
    assert {"_SwitchN", "Merge"} <= {nd.op for nd in gd.node}
    tf.io.write_graph(gd, str(tmp_path), "case.pb", as_text=False)
    g = load_graph(tmp_path / "case.pb")
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 4
    for i in (0, 1, 2, 9):
        res = Device(**FP32).replay(g, {g.inputs[0].name: x, g.inputs[1].name: np.int32(i)},
                                                      progress=False)
        (out,) = res.outputs.values()
        np.testing.assert_array_equal(out, f(x, i).numpy())


def test_functional_while_inside_a_tf1_graph(tmp_path):
    """A Switch/Merge cond feeding a functional While: the replay and the op-by-op reference both run the loop
    per iteration under the same names."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [3], name="x")
        sw = tf.raw_ops.Switch(data=x, pred=tf.reduce_sum(x) > 0)
        m = tf.raw_ops.Merge(inputs=[sw.output_true * 2.0, -sw.output_false]).output
        _, y = tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 1.5), [tf.constant(0), m])
        tf.identity(y, name="out")
        with tf1.Session() as sess:
            feeds = {"x": np.array([1, -2, 3], np.float32)}
            want = sess.run("out:0", {"x:0": feeds["x"]})
    tf.io.write_graph(g.as_graph_def(), str(tmp_path), "mixed.pb", as_text=False)
    gr = load_graph(tmp_path / "mixed.pb")
    assert {"Switch", "Merge", "StatelessWhile"} <= {n.op for n in gr.nodes}
    res = Device(**FP32).replay(gr, feeds, progress=False)
    ref = reference(gr, feeds, progress=False)
    np.testing.assert_array_equal(res.outputs["out:0"], want)
    np.testing.assert_array_equal(ref.outputs["out:0"], want)
    body = {r.name for r in res.records if "/body/2/" in r.name}
    assert body and body <= {t.rpartition(":")[0] for t in ref.tensors}
