"""The TensorFlow reference (benchmark dumps) and the AI CPU fallback."""
from __future__ import annotations

import os

import numpy as np
import pytest

from ascend_emu.frontend.tf import models
from ascend_emu.npu.aicpu import _cache, run_tf_node
from ascend_emu.analysis.dump import load_dump
from ascend_emu.errors import AscendEmuError, DumpError
from ascend_emu.graph import tensor_name
from ascend_emu.frontend.tf.loader import import_tf, load_graph
from ascend_emu.frontend.tf.reference import reference

tf = import_tf()


def check_dump_matches(res, dump_path):
    """Every node is in the dump, in order, with its tensors, engine and dtype."""
    d = load_dump(dump_path)
    assert d.kind == "bench"
    assert [op["name"] for op in d.ops] == [n.name for n in res.graph.nodes]
    assert d.model == {"name": res.graph.name, "fingerprint": res.graph.fingerprint}
    from ascend_emu.frontend.inputs import inputs_sha256
    assert d.inputs_sha256 == inputs_sha256(res.inputs)
    for node, op in zip(res.graph.nodes, d.ops):
        assert op["tf_type"] == node.op
        assert op["engine"] == ("HOST" if node.op in ("Const", "Placeholder") else "TF")
        assert op["inputs"] == [tensor_name(r) for r in node.inputs]
        assert len(op["outputs"]) == node.num_outputs
        assert op["compute_dtype"] == res.tensor(node.name).dtype.name
        for i in range(node.num_outputs):
            want = res.tensor(f"{node.name}:{i}")
            got = d.tensor(node.name, i)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
    return d


# --------------------------------------------------------------------------- reference on real models

@pytest.mark.models
@pytest.mark.parametrize("name", ["transformer_encoder", "mobilenet_v2", "resnet50"])
def test_reference_matches_keras(tmp_path, name):
    m = getattr(models, name)()
    res = reference(m, None, tmp_path / "bench", seed=1, progress=False)
    x = res.inputs[res.graph.inputs[0].name]
    want = np.asarray(m(x, training=False))
    got = res.output_list[0]
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    d = check_dump_matches(res, tmp_path / "bench")
    assert d.summary["ops"] == len(res.graph.nodes)
    assert d.summary["nonfinite_ops"] == 0


@pytest.mark.models
def test_reference_batch_and_intermediates_match_keras_layers(tmp_path):
    """Intermediate tensors are TensorFlow's own: a mid-network Keras layer output appears in the run."""
    import keras
    m = models.mobilenet_v2()
    res = reference(m, None, shapes={"image": (2, 64, 64, 3)}, progress=False)
    x = res.inputs["image"]
    assert x.shape == (2, 64, 64, 3)
    layer = m.get_layer("block_3_project_BN")
    want = np.asarray(keras.Model(m.inputs[0], layer.output)(x, training=False))
    hits = [k for k, v in res.tensors.items() if v.shape == want.shape
            and np.max(np.abs(v - want)) <= 1e-5 * np.max(np.abs(want))]
    assert any("block_3_project_BN" in k for k in hits)


# --------------------------------------------------------------------------- small models: dump protocol

def test_reference_small_model_dump_and_result(tmp_path):
    m = models.planted_overflow_model()
    res = reference(m, None, tmp_path / "b", progress=False)
    x = res.inputs["features"]
    np.testing.assert_allclose(res.output_list[0], np.asarray(m(x, training=False)), rtol=1e-6, atol=1e-6)
    assert list(res.outputs) == res.graph.outputs == ["Identity:0"]
    assert res.tensor("Identity") is res.outputs["Identity:0"]
    np.testing.assert_array_equal(res.tensor("features"), x)
    assert res.dump == os.fspath(tmp_path / "b")
    check_dump_matches(res, tmp_path / "b")
    with pytest.raises(KeyError, match="does not exist"):
        res.tensor("nope")


def test_reference_is_deterministic_to_the_byte(tmp_path):
    m = models.demo_model()
    reference(m, None, tmp_path / "a", progress=False)
    reference(m, None, tmp_path / "b", progress=False)
    for f in sorted(os.listdir(tmp_path / "a")):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_existing_dump_refused_then_overwritten(tmp_path):
    m = models.planted_overflow_model()
    reference(m, None, tmp_path / "b", progress=False)
    before = (tmp_path / "b" / "manifest.json").read_bytes()
    with pytest.raises(AscendEmuError, match=r"dump directory .*b is not empty; pass --overwrite"):
        reference(m, None, tmp_path / "b", progress=False)
    assert (tmp_path / "b" / "manifest.json").read_bytes() == before
    res = reference(m, None, tmp_path / "b", seed=5, overwrite=True, progress=False)
    load_dump(res.dump)
    assert (tmp_path / "b" / "manifest.json").read_bytes() != before


def test_stats_only_and_select(tmp_path):
    m = models.planted_overflow_model()
    reference(m, None, tmp_path / "s", stats_only=True, progress=False)
    d = load_dump(tmp_path / "s")
    assert all(o["file"] is None for op in d.ops for o in op["outputs"])
    assert not [f for f in os.listdir(tmp_path / "s") if f.endswith(".npy")]
    reference(m, None, tmp_path / "sel", select=lambda name, t: t == "MatMul", progress=False)
    d = load_dump(tmp_path / "sel")
    kept = {op["tf_type"] for op in d.ops if op["outputs"][0]["file"]}
    assert kept == {"MatMul"}
    with pytest.raises(DumpError, match="statistics only"):
        d.tensor("Identity")


def test_failing_model_leaves_no_complete_looking_dump(tmp_path):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="v")])
    def bad(v):
        return tf.reshape(v, [3, -1]) * 2.0

    g = load_graph(bad)
    with pytest.raises(AscendEmuError, match=r"TensorFlow failed to run graph"):
        reference(g, {"v": np.ones(4, np.float32)}, tmp_path / "d", progress=False)
    assert not (tmp_path / "d" / "manifest.json").exists()
    with pytest.raises(DumpError):
        load_dump(tmp_path / "d")
    # a failure while the dump is being written leaves it marked incomplete
    def boom(name, t):
        if t == "Mul":
            raise RuntimeError("disk full")
        return True

    with pytest.raises(RuntimeError, match="disk full"):
        reference(g, {"v": np.ones(6, np.float32)}, tmp_path / "e", select=boom, progress=False)
    assert not (tmp_path / "e" / "manifest.json").exists()
    with pytest.raises(DumpError, match="incomplete"):
        load_dump(tmp_path / "e")
    # bad inputs fail before anything is written
    with pytest.raises(AscendEmuError, match=r"input 'v' has dtype int64, expected float32"):
        reference(g, {"v": np.ones(6, np.int64)}, tmp_path / "f", progress=False)
    assert not (tmp_path / "f").exists()


def test_float32_overflow_is_recorded(tmp_path):
    res = reference(models.float32_overflow_model(), None, tmp_path / "o", progress=False)
    assert res.summary["nonfinite_ops"] >= 1
    assert "huge2" in res.summary["first_nonfinite"]
    d = load_dump(tmp_path / "o")
    op = d.op(res.summary["first_nonfinite"])
    assert op["outputs"][0]["inf"] + op["outputs"][0]["nan"] > 0    # inf or NaN: the host GEMM, FMA or not


def test_graph_without_graph_def_is_refused():
    g = load_graph(models.float32_overflow_model())
    g2 = type(g)(nodes=g.nodes, inputs=g.inputs, outputs=g.outputs, name="x")
    with pytest.raises(AscendEmuError, match=r"graph 'x' carries no GraphDef; build it with load_graph"):
        reference(g2, None, progress=False)


# --------------------------------------------------------------------------- AI CPU fallback

@pytest.fixture(scope="module")
def cpu_graph():
    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32, name="x"),
                                  tf.TensorSpec([None, 6], tf.float16, name="h")])
    def f(x, h):
        vals, idx = tf.math.top_k(x, k=2)
        return {"cumsum": tf.math.cumsum(x, axis=1, exclusive=True, reverse=True),
                "vals": vals, "idx": idx, "argmax": tf.math.argmax(x, axis=1),
                "h": tf.math.cumsum(h, axis=1)}
    return load_graph(f)


def _node(g, op):
    return next(n for n in g.nodes if n.op == op)


def test_aicpu_runs_single_nodes(cpu_graph):
    g = cpu_graph
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    cs = _node(g, "Cumsum")
    consts = {n.name: n.attrs["value"] for n in g.nodes if n.op == "Const"}
    axis = consts[cs.inputs[1]]
    (out,) = run_tf_node(cs, [x, axis])
    want = np.flip(np.cumsum(np.flip(x, 1), axis=1), 1) - x     # exclusive, reverse
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    tk = _node(g, "TopKV2")
    assert tk.num_outputs == 2
    vals, idx = run_tf_node(tk, [x, consts[tk.inputs[1]]])
    order = np.argsort(-x, axis=1, kind="stable")[:, :2]
    np.testing.assert_array_equal(idx, order.astype(np.int32))
    np.testing.assert_array_equal(vals, np.take_along_axis(x, order, 1))
    am = _node(g, "ArgMax")
    (a,) = run_tf_node(am, [x, consts[am.inputs[1]]])
    assert a.dtype == np.int64
    np.testing.assert_array_equal(a, x.argmax(1))


def test_aicpu_keeps_original_dtype_and_caches(cpu_graph):
    g = cpu_graph
    h_cs = [n for n in g.nodes if n.op == "Cumsum" and n.attrs["T"] == "float16"][0]
    consts = {n.name: n.attrs["value"] for n in g.nodes if n.op == "Const"}
    h = (np.arange(12).reshape(2, 6) * 0.1).astype(np.float16)
    n0 = len(_cache)
    (out,) = run_tf_node(h_cs, [h, consts[h_cs.inputs[1]]])
    assert out.dtype == np.float16
    # fp16 cumulative sum, rounded at every step as TensorFlow does it in fp16
    acc = np.zeros(2, np.float16)
    want = np.empty_like(h)
    for j in range(6):
        acc = (acc + h[:, j]).astype(np.float16)
        want[:, j] = acc
    np.testing.assert_array_equal(out, want)
    assert len(_cache) == n0 + 1
    sess = _cache[next(reversed(_cache))][0]
    run_tf_node(h_cs, [h * 2, consts[h_cs.inputs[1]]])
    assert len(_cache) == n0 + 1 and _cache[next(reversed(_cache))][0] is sess


def test_aicpu_errors(cpu_graph):
    cs = _node(cpu_graph, "Cumsum")
    with pytest.raises(AscendEmuError, match=r"takes 2 inputs, got 1"):
        run_tf_node(cs, [np.zeros((2, 6), np.float32)])
    with pytest.raises(AscendEmuError, match=r"TensorFlow failed to run node"):
        run_tf_node(cs, [np.zeros((2, 6), np.float32), np.int32(5)])
