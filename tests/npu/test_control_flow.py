"""Functional control flow (While, If, Case) replayed with its bodies as subgraphs: every op of every
iteration runs on the emulated units and is recorded under ``<while>/body/<k>/...``.

TensorFlow's reference runs each cond, body and branch call in TensorFlow under the same names
(ascend_emu.frontend.tf.loops), so the comparison lines every iteration's ops up with the emulated ones.
"""
import numpy as np
import pytest

from ascend_emu import Device, compare, reference
from ascend_emu.frontend.tf import models
from ascend_emu.frontend.tf.loader import import_tf, load_graph
from fp32mode import FP32, fp32  # noqa: F401  (the tests' fp32 mode)

tf = import_tf()


spec = tf.TensorSpec([None, 4], tf.float32)


@tf.function
def _half(v):
    return v * 0.5


@tf.function
def _minus_one(v):
    return v - 1.0


@tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
def loops(x):
    _, y = tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, tf.nn.relu(y * 2.0 - 0.5)), [tf.constant(0), x])
    z = tf.cond(tf.reduce_sum(y) > 0, lambda: y + 1.0, lambda: -y)
    # a raw Case (tf.switch_case marks its Case for lowering to TF1 _SwitchN/Merge when frozen)
    (w,) = tf.raw_ops.StatelessCase(branch_index=tf.cast(tf.reduce_max(z) > 3.0, tf.int32), input=[z],
                                    Tout=[tf.float32], branches=[_half.get_concrete_function(spec),
                                                                 _minus_one.get_concrete_function(spec)])
    # a loop inside a loop, and map_fn (a While over TensorLists)
    _, acc = tf.while_loop(lambda i, a: i < 2,
                           lambda i, a: (i + 1, tf.while_loop(lambda j, b: j < 2, lambda j, b: (j + 1, b * 1.5),
                                                              [tf.constant(0), a])[1]),
                           [tf.constant(0), w])
    return {"rows": tf.map_fn(lambda r: tf.reduce_sum(r * r), acc), "acc": acc}


def check_float32(g, atol):
    ref = reference(g, None, progress=False)
    res = Device(**FP32).replay(g, ref.inputs, progress=False)
    for t in g.outputs:
        np.testing.assert_allclose(np.asarray(res.outputs[t], np.float64), ref.outputs[t], rtol=0, atol=atol,
                                   err_msg=t)
    return ref, res


def test_while_cond_case_map_fn_nested_match_tensorflow(tmp_path):
    g = load_graph(loops)
    assert {"StatelessWhile", "StatelessIf", "StatelessCase"} <= {n.op for n in g.nodes}
    ref, res = check_float32(g, 1e-5)
    names = [r.name for r in res.records]
    loop = next(n.name for n in g.nodes if n.op == "StatelessWhile" and n.name == "while")
    # three body iterations and four cond evaluations, each op under its iteration index
    for k in range(3):
        assert any(n.startswith(f"{loop}/body/{k}/") and n.endswith("/Relu") for n in names)
    assert any(n.startswith(f"{loop}/cond/3/") for n in names) and not any(n.startswith(f"{loop}/body/3/") for n in names)
    assert any("/then/" in n for n in names) != any("/else/" in n for n in names)   # one branch ran
    assert any("/branch_" in n for n in names)
    assert any("/body/1/" in n and n.count("/body/") == 2 for n in names)            # the inner loop's iterations
    # the dumps compare: ops outside loops, the loop outputs and every iteration's ops (nested loops and
    # branches included) line up; variants are not compared
    ref = reference(g, ref.inputs, dump_dir=tmp_path / "bench", progress=False)
    Device(**FP32).replay(g, ref.inputs, dump_dir=tmp_path / "npu", progress=False)
    cmp = compare(tmp_path / "npu", tmp_path / "bench")
    rows = {r["NPU Name"]: r for r in cmp.rows}
    for t in g.outputs:
        assert rows[t]["Result"] == "pass", t
    assert rows[f"{loop}:1"]["Result"] == "pass"
    assert any(r["Result"] == "N/A" and "variant" in (r["Err_message"] or "") for r in cmp.rows)
    kinds = [cmp.info(i)["kind"] for i in range(len(cmp.rows))]
    assert not {"npu only", "bench only"} & set(kinds)
    for part in (f"{loop}/body/2/", f"{loop}/cond/3/", "/then/", "/branch_", "/body/1/while/body/1/"):
        hit = [r for r, k in zip(cmp.rows, kinds) if k == "matched" and part in r["NPU Name"]]
        assert hit and all(r["Result"] == "pass" for r in hit), part


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_keras_rnn_classifier_float32_matches_tensorflow(layer):
    g = load_graph(models.rnn_classifier(layer))
    assert any(n.op in ("While", "StatelessWhile") for n in g.nodes)
    ref, res = check_float32(g, 1e-6)
    loop = next(n.name for n in g.nodes if n.op in ("While", "StatelessWhile"))
    steps = {r.name.split("/body/")[1].split("/")[0] for r in res.records if r.name.startswith(loop + "/body/")}
    assert steps == {str(k) for k in range(20)}
    mm = [r for r in res.records if r.name.startswith(loop + "/body/") and r.tf_type in ("MatMul", "_FusedMatMul")]
    assert len(mm) >= 2 * 20 and all(r.compute_dtype == "float32" for r in mm)
    # allow_mix_precision: the cell's matmuls run on the cube in fp16, every step
    mix = Device("allow_mix_precision").replay(g, ref.inputs, progress=False)
    mm = [r for r in mix.records if r.name.startswith(loop + "/body/") and r.tf_type in ("MatMul", "_FusedMatMul")]
    assert len(mm) >= 2 * 20 and all(r.compute_dtype == "float16" for r in mm)
    out = np.asarray(mix.outputs[g.outputs[0]], np.float64)
    assert np.abs(out - ref.outputs[g.outputs[0]]).max() < 1e-2      # fp16 cells: close, not equal


def test_reference_dumps_every_step_of_a_keras_lstm(tmp_path):
    """The float32 reference runs the LSTM's body once per step in TensorFlow: each of the 20 steps' ops
    are rows of the comparison, matched with the emulated ones and passing."""
    g = load_graph(models.rnn_classifier("LSTM"))
    loop = next(n.name for n in g.nodes if n.op in ("While", "StatelessWhile"))
    ref = reference(g, None, dump_dir=tmp_path / "bench", progress=False)
    assert any(t.startswith(f"{loop}/body/19/") for t in ref.tensors)
    Device(**FP32).replay(g, ref.inputs, dump_dir=tmp_path / "npu", progress=False)
    cmp = compare(tmp_path / "npu", tmp_path / "bench")
    kinds = [cmp.info(i)["kind"] for i in range(len(cmp.rows))]
    assert not {"npu only", "bench only"} & set(kinds)
    steps: dict = {}
    for r, k in zip(cmp.rows, kinds):
        if k == "matched" and r["NPU Name"].startswith(loop + "/body/"):
            steps.setdefault(r["NPU Name"].split("/body/")[1].split("/")[0], []).append(r["Result"])
    assert sorted(steps, key=int) == [str(k) for k in range(20)]
    assert all(len(v) == len(steps["0"]) >= 10 and set(v) == {"pass"} for v in steps.values())
    # every fused-away op of every step is accounted for, under that step's name
    assert sum(k == "fused" and f"{loop}/body/7/" in (cmp.info(i)["bench_op"] or "")
               for i, k in enumerate(kinds)) >= 1


def test_text_model_embedding_conv1d_bidirectional_lstm():
    """Embedding (GatherV2), Conv1D, Bidirectional LSTM (a forward and a reversed While): all on AI Core ops."""
    keras = models._keras(0)
    tok = keras.Input((12,), dtype="int32", name="tokens")
    x = keras.layers.Conv1D(8, 3, padding="same", activation="relu")(keras.layers.Embedding(50, 8)(tok))
    out = keras.layers.Dense(3, activation="softmax")(keras.layers.Bidirectional(keras.layers.LSTM(6))(x))
    g = load_graph(keras.Model(tok, out))
    assert sum(n.op in ("While", "StatelessWhile") for n in g.nodes) == 2
    ids = {"tokens": np.random.default_rng(0).integers(0, 50, (1, 12)).astype(np.int32)}
    ref = reference(g, ids, progress=False)
    res = Device(**FP32).replay(g, ids, progress=False)
    np.testing.assert_allclose(res.outputs[g.outputs[0]], ref.outputs[g.outputs[0]], rtol=0, atol=1e-6)
    assert not [r.name for r in res.records if r.engine == "AICPU"]
