"""Loader and inputs: every model format, decoded attributes, order, refusals, user errors."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ascend_emu.frontend.tf import models
from ascend_emu.errors import AscendEmuError
from ascend_emu.graph import Graph, split_tensor_name
from ascend_emu.frontend.inputs import inputs_sha256, make_inputs
from ascend_emu.frontend.tf.loader import import_tf, load_graph
from fp32mode import FP32, fp32  # noqa: F401  (the tests' fp32 mode)

tf = import_tf()


# --------------------------------------------------------------------------- helpers

def assert_well_formed(g: Graph):
    """Topological, unique names, no control inputs/NoOp/Identity-of-Const, outputs exist."""
    seen = {}
    for n in g.nodes:
        assert n.name not in seen, n.name
        for ref in n.inputs:
            assert not ref.startswith("^")
            src, idx = split_tensor_name(ref)
            assert src in seen, f"{n.name} reads {ref} before it is produced"
            assert idx < seen[src].num_outputs
            if n.op == "Identity":
                assert seen[src].op != "Const", f"{n.name} is an Identity of a Const"
        assert n.op != "NoOp"
        if n.op == "Const":  # runs on the host from attrs["value"]; no second copy of the weights
            assert n.node_def is None and isinstance(n.attrs["value"], np.ndarray)
        else:
            assert isinstance(n.node_def, bytes) and n.node_def
        seen[n.name] = n
    for t in g.outputs:
        src, idx = split_tensor_name(t)
        assert src in seen and idx < seen[src].num_outputs
    assert len(g.fingerprint) == 64
    placeholders = [n.name for n in g.nodes if n.op == "Placeholder"]
    assert sorted(placeholders) == sorted(s.name for s in g.inputs)
    # the stored GraphDef is the node list, one to one
    gd = tf.compat.v1.GraphDef.FromString(g.graph_def)
    assert [nd.name for nd in gd.node] == [n.name for n in g.nodes]


def op_types(g: Graph) -> set[str]:
    return {n.op for n in g.nodes}


@pytest.fixture(scope="module")
def multi():
    """A tf.function with multi-output ops, a Const and a dict of outputs."""
    @tf.function(input_signature=[tf.TensorSpec([None, 4, 4, 6], tf.float32, name="x")])
    def f(x):
        y, *_ = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=tf.ones([6]), offset=tf.zeros([6]), mean=tf.zeros([6]),
            variance=tf.ones([6]), is_training=False)
        a, b, c = tf.split(y, 3, axis=3)
        u = tf.unstack(a, num=4, axis=1)
        vals, idx = tf.math.top_k(tf.reshape(b, [-1, 32]), k=3)
        conv = tf.nn.conv2d(c, tf.constant(np.arange(2 * 2 * 2 * 3, dtype=np.float32).reshape(2, 2, 2, 3)),
                            strides=[1, 2, 1, 1], padding="SAME")
        return {"sum": u[0] + u[3], "vals": vals, "idx": idx, "conv": conv}
    return f


# --------------------------------------------------------------------------- structure and attributes

def test_num_outputs_and_attrs_decoded(multi):
    g = load_graph(multi)
    assert_well_formed(g)
    by_op = {}
    for n in g.nodes:
        by_op.setdefault(n.op, []).append(n)
    assert by_op["FusedBatchNormV3"][0].num_outputs == 6
    assert by_op["Split"][0].num_outputs == 3 and by_op["Split"][0].attrs["num_split"] == 3
    assert by_op["Unpack"][0].num_outputs == 4 and by_op["Unpack"][0].attrs["axis"] == 1
    assert by_op["TopKV2"][0].num_outputs == 2
    bn = by_op["FusedBatchNormV3"][0].attrs
    assert bn["T"] == "float32" and bn["U"] == "float32" and bn["is_training"] is False
    assert bn["data_format"] == "NHWC" and isinstance(bn["data_format"], str)
    assert bn["epsilon"] == pytest.approx(1e-4) and isinstance(bn["epsilon"], float)
    conv = by_op["Conv2D"][0].attrs
    assert conv["strides"] == [1, 2, 1, 1] and conv["padding"] == "SAME"
    assert conv["dilations"] == [1, 1, 1, 1]       # OpDef default filled in
    assert conv["explicit_paddings"] == []
    assert by_op["TopKV2"][0].attrs["index_type"] == "int32"
    consts = {n.name: n.attrs["value"] for n in by_op["Const"]}
    kernel = [v for v in consts.values() if v.shape == (2, 2, 2, 3)]
    assert len(kernel) == 1 and kernel[0].dtype == np.float32
    np.testing.assert_array_equal(kernel[0].ravel(), np.arange(24, dtype=np.float32))
    assert not any(k.startswith("_") for n in g.nodes for k in n.attrs)
    ph = g.node("x")
    assert ph.attrs == {"dtype": "float32", "shape": [None, 4, 4, 6]}
    assert g.inputs[0].name == "x" and g.inputs[0].shape == [None, 4, 4, 6]
    assert g.output_names == ["conv", "idx", "sum", "vals"]
    assert len(g.outputs) == 4


def test_order_is_stable_kahn_and_deterministic(multi):
    a, b = load_graph(multi), load_graph(multi)
    assert a.fingerprint == b.fingerprint
    assert [n.name for n in a.nodes] == [n.name for n in b.nodes]
    assert a.graph_def == b.graph_def


def test_identity_chains_of_constants_collapse_and_calls_inline(tmp_path):
    @tf.function
    def inner(x):
        return tf.nn.relu(x) * 2.0

    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32, name="inp")])
    def outer(x):
        return {"y": inner(x) + 1.0, "z": tf.math.cumsum(x, axis=1)}

    gd = outer.get_concrete_function().graph.as_graph_def()
    assert any(n.op == "PartitionedCall" for n in gd.node)
    tf.io.write_graph(gd, str(tmp_path), "calls.pb", as_text=False)
    for src in (str(tmp_path / "calls.pb"), outer):
        g = load_graph(src)
        assert_well_formed(g)
        assert not op_types(g) & {"PartitionedCall", "StatefulPartitionedCall", "NoOp"}
        assert {"Relu", "Mul", "AddV2", "Cumsum"} <= op_types(g)
        x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
        from ascend_emu.frontend.tf.reference import reference
        r = reference(g, {"inp": x}, progress=False)
        got = dict(zip(g.output_names or ["y", "z"], r.output_list))
        np.testing.assert_array_equal(got["y"], np.maximum(x, 0) * 2 + 1)
        np.testing.assert_array_equal(got["z"], np.cumsum(x, axis=1))


def test_functional_control_flow_loads_and_lowered_runs_as_tf1(tmp_path):
    """Functional While/If load with their functions; the same function frozen with its control flow
    lowered to TF1 Switch/Merge/Enter/Exit/NextIteration loads with its control edges and runs."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    from ascend_emu import Device

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def loop(x):
        _, y = tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2.0), [tf.constant(0), x])
        return tf.cond(tf.reduce_sum(y) > 0, lambda: y, lambda: -y)

    g = load_graph(loop)
    assert {"StatelessIf", "StatelessWhile"} <= op_types(g)
    assert len(g.functions) == 4                       # cond, body, then, else
    for f in g.functions.values():
        assert f.inputs and f.outputs and all(n.op != "PartitionedCall" for n in f.nodes)
    gd = convert_variables_to_constants_v2(loop.get_concrete_function(),
                                           lower_control_flow=True).graph.as_graph_def()
    assert {"Switch", "Merge", "Enter", "Exit", "NextIteration", "LoopCond"} <= {nd.op for nd in gd.node}
    tf.io.write_graph(gd, str(tmp_path), "cf.pbtxt", as_text=True)
    lowered = load_graph(str(tmp_path / "cf.pbtxt"))
    assert any(n.control_inputs for n in lowered.nodes)          # the control edges that carry deadness
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 5.0
    res = Device(**FP32).replay(lowered, {lowered.inputs[0].name: x}, progress=False)
    want = loop(x).numpy()
    outs = [np.asarray(v) for v in res.outputs.values() if np.shape(v) == (2, 4)]
    assert outs and all(np.array_equal(o, want) for o in outs)
    assert any("/body/2/" in r.name for r in res.records) and not any("/body/3/" in r.name for r in res.records)


def test_control_trigger_is_refused(tmp_path):
    gd = tf.compat.v1.GraphDef()
    x = gd.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = tf.float32.as_datatype_enum
    gd.node.add(name="t", op="ControlTrigger", input=["^x"])
    y = gd.node.add(name="y", op="Neg", input=["x", "^t"])
    y.attr["T"].type = tf.float32.as_datatype_enum
    tf.io.write_graph(gd, str(tmp_path), "ct.pbtxt", as_text=True)
    with pytest.raises(AscendEmuError) as e:
        load_graph(str(tmp_path / "ct.pbtxt"))
    assert "ControlTrigger" in str(e.value) and "\n" not in str(e.value)


def test_input_shapes_fix_unknown_dims(multi):
    g = load_graph(multi, input_shapes={"x": (2, 4, 4, 6)})
    assert g.inputs[0].shape == [2, 4, 4, 6] and g.node("x").attrs["shape"] == [2, 4, 4, 6]
    g2 = load_graph(multi, input_shapes=["x=2,4,4,6"])
    assert g2.fingerprint == g.fingerprint != load_graph(multi).fingerprint
    with pytest.raises(AscendEmuError, match=r"--shape for input 'x' is \(2, 5, 4, 6\), which does not fit"):
        load_graph(multi, input_shapes={"x": (2, 5, 4, 6)})
    with pytest.raises(AscendEmuError, match=r"unknown input 'y'; the model's inputs are: x"):
        load_graph(multi, input_shapes={"y": (1,)})


# --------------------------------------------------------------------------- user errors

def test_missing_path():
    with pytest.raises(AscendEmuError, match=r"model path '/nonexistent/m.keras' does not exist; pass a Keras"):
        load_graph("/nonexistent/m.keras")


def test_directory_not_saved_model(tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(AscendEmuError, match=r"is not a SavedModel \(no saved_model.pb\)"):
        load_graph(tmp_path)


def test_malformed_pb_and_pbtxt(tmp_path):
    (tmp_path / "bad.pb").write_bytes(b"\xff\xfe not a protobuf \x00\x01" * 10)
    with pytest.raises(AscendEmuError, match=r"is not a valid binary \(\.pb\) GraphDef"):
        load_graph(tmp_path / "bad.pb")
    (tmp_path / "bad.pbtxt").write_text("node { name: 'a' op: \n")
    with pytest.raises(AscendEmuError, match=r"is not a valid text \(\.pbtxt\) GraphDef"):
        load_graph(tmp_path / "bad.pbtxt")
    (tmp_path / "empty.pbtxt").write_text("")
    with pytest.raises(AscendEmuError, match=r"holds no GraphDef nodes"):
        load_graph(tmp_path / "empty.pbtxt")
    (tmp_path / "m.tflite").write_bytes(b"x")
    with pytest.raises(AscendEmuError, match=r"cannot tell the format of .*m.tflite.*\.keras .*\.pb .*\.pbtxt.*\.onnx"):
        load_graph(tmp_path / "m.tflite")
    # (.onnx files are ONNX models now: a bad one is named as such)
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(AscendEmuError, match=r"is not a valid ONNX model"):
        load_graph(tmp_path / "m.onnx")


def test_corrupt_keras_file(tmp_path):
    (tmp_path / "m.keras").write_bytes(b"not a zip")
    # a file that is no zip is named as such (Keras itself said "File not found" for it)
    with pytest.raises(AscendEmuError, match=r"model file .*m.keras.* is not a \.keras archive.*save the model again"):
        load_graph(tmp_path / "m.keras")


def test_unknown_signature_lists_available(tmp_path):
    m = models.planted_overflow_model()
    m.export(str(tmp_path / "sm"), verbose=False)
    with pytest.raises(AscendEmuError, match=r"has no signature 'nope'; available: serve, serving_default"):
        load_graph(tmp_path / "sm", signature="nope")
    g = load_graph(tmp_path / "sm", signature="serve")
    assert g.inputs[0].key == "features"


def test_wrong_python_objects():
    for obj in (42, np.zeros(3), {"a": 1}):
        with pytest.raises(AscendEmuError, match=r"cannot load a .*; pass a Keras model, a \.keras file"):
            load_graph(obj)

    @tf.function
    def nosig(x):
        return x + 1

    with pytest.raises(AscendEmuError, match=r"tf.function 'nosig' has no input_signature"):
        load_graph(nosig)


def test_keras_model_without_inputs():
    import keras

    class Sub(keras.Model):
        def call(self, x):
            return x * 2

    with pytest.raises(AscendEmuError, match=r"Keras model '.*' has no defined inputs; build it with keras.Input"):
        load_graph(Sub())


@pytest.mark.parametrize("name", ['d"q', "d<lt", "d&amp", "d\nnl"])
def test_keras_names_tf_cannot_trace_are_one_line(tmp_path, name, capsys):
    """T1 (issue 45): layer names Keras accepts but TF name scopes refuse were a traceback in replay and
    reference; a model name too."""
    from ascend_emu.cli.main import main

    inp = tf.keras.Input((4,), name="inp")
    out = tf.keras.layers.ReLU(name="relu")(tf.keras.layers.Dense(3, name=name)(inp))
    path = str(tmp_path / "m.keras")
    tf.keras.Model(inp, out).save(path)
    for cmd in ("replay", "reference"):
        assert main([cmd, path, "-q"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"Keras layer {name!r} has a name TensorFlow cannot trace" in err[0], err
    with pytest.raises(AscendEmuError, match="Keras model '_m' has a name"):
        load_graph(tf.keras.Model(inp, tf.keras.layers.ReLU(name="r2")(inp), name="_m"))


def test_graph_passes_through(multi):
    g = load_graph(multi)
    assert load_graph(g) is g


# --------------------------------------------------------------------------- formats

def _check_formats(model, tmp_path, expect_ops=None):
    srcs = models.save_all_formats(model, tmp_path)
    graphs = {fmt: load_graph(src) for fmt, src in srcs.items()}
    base = op_types(graphs["keras"])
    if expect_ops:
        assert expect_ops <= base
    x = make_inputs(graphs["keras"], seed=3)
    x = next(iter(x.values()))
    want = np.asarray(model(x, training=False))
    from ascend_emu.frontend.tf.reference import reference
    # same freezing route, same graph: the .pb/.pbtxt files and the tf.function agree to the bit
    assert graphs["pb"].fingerprint == graphs["pbtxt"].fingerprint == graphs["tf_function"].fingerprint \
        == graphs["concrete_function"].fingerprint
    assert graphs["keras"].fingerprint == graphs["keras_file"].fingerprint
    run = set()
    for fmt, g in graphs.items():
        assert_well_formed(g)
        # the SavedModel adds only the Identity nodes of its signature wrapper
        assert op_types(g) == base, fmt
        assert g.inputs[0].shape == [None] + list(model.inputs[0].shape[1:]), fmt
        if g.fingerprint in run:
            continue          # a graph equal to the bit to one already run gives the same outputs
        run.add(g.fingerprint)
        got = reference(g, [x], progress=False).output_list[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max(), err_msg=fmt)
    assert graphs["saved_model"].output_names == ["output_0"]
    return graphs


def test_every_format_small_model(tmp_path):
    graphs = _check_formats(models.planted_overflow_model(), tmp_path, {"MatMul", "BiasAdd", "Relu"})
    assert graphs["keras"].output_names == ["head"]
    assert graphs["keras"].inputs[0].name == "features"


@pytest.mark.models
@pytest.mark.parametrize("name,expect", [
    ("transformer_encoder", {"Einsum", "BatchMatMulV2", "Softmax", "Erfc", "SquaredDifference", "Rsqrt"}),
    ("mobilenet_v2", {"DepthwiseConv2dNative", "Relu6", "Conv2D", "Pad", "Mean"}),
    ("resnet50", {"Conv2D", "MaxPool", "Rsqrt", "Relu", "Softmax", "MatMul"}),
])
def test_every_format_real_models(tmp_path, name, expect):
    _check_formats(getattr(models, name)(), tmp_path, expect)


@pytest.mark.models
def test_fingerprint_is_stable_across_processes():
    code = ("from ascend_emu import models; from ascend_emu.frontend.tf.loader import load_graph; "
            "print(load_graph(models.mobilenet_v2()).fingerprint)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.strip().splitlines()[-1] == load_graph(models.mobilenet_v2()).fingerprint


# --------------------------------------------------------------------------- inputs

@pytest.fixture(scope="module")
def two_inputs():
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="a"),
                                  tf.TensorSpec([2, None], tf.int32, name="b"),
                                  tf.TensorSpec([4], tf.bool, name="c")])
    def f(a, b, c):
        return tf.reduce_sum(a) + tf.cast(tf.reduce_sum(b), tf.float32) + tf.cast(tf.reduce_sum(tf.cast(c, tf.int32)), tf.float32)
    return load_graph(f)


def test_random_inputs_distribution_and_determinism(two_inputs):
    g = two_inputs
    x = make_inputs(g, shapes={"b": (2, 5)}, seed=7)
    assert list(x) == ["a", "b", "c"]
    assert x["a"].shape == (1, 3) and x["a"].dtype == np.float32       # leading None -> batch 1
    assert x["b"].shape == (2, 5) and x["b"].dtype == np.int32
    assert x["c"].dtype == np.bool_
    rng = np.random.default_rng(7)
    np.testing.assert_array_equal(x["a"], rng.standard_normal((1, 3)).astype(np.float32))
    np.testing.assert_array_equal(x["b"], rng.integers(0, 10, (2, 5)).astype(np.int32))
    np.testing.assert_array_equal(x["c"], rng.random(4) < 0.5)
    y = make_inputs(g, shapes=["b=2,5"], seed=7)
    assert inputs_sha256(x) == inputs_sha256(y)
    z = make_inputs(g, shapes=["b=2,5"], seed=8)
    assert inputs_sha256(x) != inputs_sha256(z)
    big = make_inputs(g, shapes={"a": (20000, 3), "b": (2, 20000)})
    assert abs(big["a"].mean()) < 0.02 and abs(big["a"].std() - 1) < 0.02
    assert set(np.unique(big["b"])) == set(range(10))


def test_unknown_dim_needs_shape(two_inputs):
    with pytest.raises(AscendEmuError, match=r"input 'b' has unknown dimensions \(2, \?\); give them with "
                                             r"--shape b=2,N"):
        make_inputs(two_inputs)


def test_given_inputs_checked(two_inputs, tmp_path):
    g = two_inputs
    a = np.ones((5, 3), np.float32)
    b = np.ones((2, 7), np.int32)
    c = np.ones(4, bool)
    x = make_inputs(g, {"a": a, "b": b, "c": c})
    assert x["a"] is not None and x["b"].shape == (2, 7)
    with pytest.raises(AscendEmuError, match=r"input 'a' has dtype float64, expected float32; convert it with "
                                             r"\.astype\(np\.float32\)"):
        make_inputs(g, {"a": a.astype(np.float64), "b": b, "c": c})
    with pytest.raises(AscendEmuError, match=r"input 'a' has shape \(5, 4\), expected \(\?, 3\)"):
        make_inputs(g, {"a": np.ones((5, 4), np.float32), "b": b, "c": c})
    with pytest.raises(AscendEmuError, match=r"unknown input 'q'; the model's inputs are: a, b, c"):
        make_inputs(g, {"q": a})
    with pytest.raises(AscendEmuError, match=r"no value for input\(s\) b, c"):
        make_inputs(g, {"a": a})
    # CLI strings: name=file.npy and file.npz
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "bc.npz", b=b, c=c)
    y = make_inputs(g, [f"a={tmp_path / 'a.npy'}", str(tmp_path / "bc.npz")])
    assert inputs_sha256(y) == inputs_sha256(x)
    with pytest.raises(AscendEmuError, match=r"--input a=.*missing.npy: file .* does not exist"):
        make_inputs(g, [f"a={tmp_path / 'missing.npy'}", str(tmp_path / "bc.npz")])
    (tmp_path / "junk.npy").write_bytes(b"junk")
    with pytest.raises(AscendEmuError, match=r"cannot read .*junk.npy.* as a numpy file"):
        make_inputs(g, [f"a={tmp_path / 'junk.npy'}", str(tmp_path / "bc.npz")])
    with pytest.raises(AscendEmuError, match=r"--shape names unknown input 'zz'"):
        make_inputs(g, shapes=["zz=1,2"])
    with pytest.raises(AscendEmuError, match=r"--shape 'b' must look like NAME=1,224,224,3"):
        make_inputs(g, shapes=["b"])


def test_inputs_by_signature_key(tmp_path):
    m = models.planted_overflow_model()
    m.export(str(tmp_path / "sm"), verbose=False)
    g = load_graph(tmp_path / "sm")
    spec = g.inputs[0]
    assert spec.key == "features"
    x = np.zeros((3, 64), np.float32)
    assert make_inputs(g, {spec.key: x})[spec.name] is not None
    assert make_inputs(g, x)[spec.name].shape == (3, 64)


def test_inputs_sha256_covers_dtype_shape_and_name():
    a = np.arange(6, dtype=np.float32)
    h = inputs_sha256({"x": a})
    assert h == inputs_sha256({"x": a.copy()})
    assert h != inputs_sha256({"x": a.reshape(2, 3)})
    assert h != inputs_sha256({"y": a})
    assert h != inputs_sha256({"x": a.view(np.int32)})
    assert inputs_sha256({"x": a, "y": a}) == inputs_sha256({"y": a, "x": a})


def test_multi_input_keras_models_map_names():
    import keras
    from ascend_emu.frontend.tf.reference import reference
    a = keras.Input((3,), name="zeta")
    b = keras.Input((3,), name="alpha")
    m = keras.Model({"zeta": a, "alpha": b},
                    {"s": keras.layers.Add(name="s")([a, keras.layers.Dense(3, name="d")(b)]),
                     "p": keras.layers.Multiply(name="p")([a, b])})
    g = load_graph(m)
    assert sorted(s.name for s in g.inputs) == ["alpha", "zeta"]
    assert g.output_names == ["p", "s"]
    xa = np.full((2, 3), 2.0, np.float32)
    xb = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = reference(g, {"zeta": xa, "alpha": xb}, progress=False)
    want = m({"zeta": xa, "alpha": xb})
    for key, tname in zip(g.output_names, g.outputs):
        np.testing.assert_allclose(r.outputs[tname], np.asarray(want[key]), rtol=1e-6)
    m2 = keras.Model([a, b], keras.layers.Subtract(name="sub")([a, b]))
    g2 = load_graph(m2)
    assert [s.name for s in g2.inputs] == ["zeta", "alpha"] and g2.output_names == ["sub"]
    np.testing.assert_array_equal(reference(g2, [xa, xb], progress=False).output_list[0], xa - xb)


def test_low_precision_inputs():
    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float16, name="h"),
                                  tf.TensorSpec([2, 3], tf.bfloat16, name="b")])
    def f(h, b):
        return tf.cast(h, tf.float32) + tf.cast(b, tf.float32)

    g = load_graph(f)
    assert [s.dtype for s in g.inputs] == ["float16", "bfloat16"]
    x = make_inputs(g, seed=2)
    assert x["h"].dtype == np.float16 and x["b"].dtype.name == "bfloat16"
    rng = np.random.default_rng(2)
    np.testing.assert_array_equal(x["h"], rng.standard_normal((2, 3)).astype(np.float16))
    from ascend_emu.frontend.tf.reference import reference
    r = reference(g, x, progress=False)
    np.testing.assert_array_equal(r.output_list[0], x["h"].astype(np.float32) + x["b"].astype(np.float32))


def test_empty_input_list_means_random(two_inputs):
    x = make_inputs(two_inputs, [], shapes=["b=2,3"], seed=4)
    assert inputs_sha256(x) == inputs_sha256(make_inputs(two_inputs, None, shapes={"b": (2, 3)}, seed=4))


def test_nested_calls_inline_at_any_depth_and_shapes_are_recorded():
    """Calls inside calls, three deep, the innermost an XLA function (``_noinline``, as Keras 3's
    grouped convolution): the graph's own inliner leaves it, ours inlines it."""
    from ascend_emu import Device, reference
    from ascend_emu.frontend.tf.loader import CALL_OPS, _freeze

    @tf.function(jit_compile=True)
    def leaf(x):
        return tf.nn.relu(x) * 3.0

    @tf.function
    def mid(x):
        return leaf(x) + leaf(x * 2.0)

    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32, name="inp")])
    def top(x):
        return {"a": mid(x) - 1.0, "b": tf.reshape(mid(-x), [-1])}

    frozen, *_ = _freeze(top.get_concrete_function())
    assert any(nd.op in CALL_OPS for nd in frozen.node)     # the case the loader must handle itself
    g = load_graph(top)
    assert_well_formed(g)
    assert not op_types(g) & CALL_OPS and op_types(g) >= {"Relu", "Mul", "AddV2", "Sub", "Reshape"}
    assert any(n.name.count("/") >= 2 and n.op == "Relu" for n in g.nodes)   # call/call/node
    assert not tf.compat.v1.GraphDef.FromString(g.graph_def).library.function  # nothing left to call
    x = np.array([[-1.0, 0.5, 2.0], [3.0, -0.25, 0.0]], np.float32)

    def mid_np(v):
        return np.maximum(v, 0) * 3 + np.maximum(2 * v, 0) * 3

    r = reference(g, {"inp": x}, progress=False)
    got = dict(zip(g.output_names, r.output_list))
    np.testing.assert_array_equal(got["a"], mid_np(x) - 1)
    np.testing.assert_array_equal(got["b"], mid_np(-x).reshape(-1))
    res = Device(**FP32).replay(g, {"inp": x}, progress=False)
    for t in g.outputs:
        np.testing.assert_array_equal(res.outputs[t], r.outputs[t])
    # every node carries TensorFlow's inferred output signature
    sig = {n.name: (n.output_dtypes, n.output_shapes) for n in g.nodes}
    reshape = next(n.name for n in g.nodes if n.op == "Reshape")
    assert sig[reshape] == (["float32"], [[6]])
    assert all(d is not None and len(d) == n.num_outputs for n in g.nodes for d in sig[n.name])


def test_text_graph_def_strings_decode_as_protobuf_decodes_them(tmp_path):
    """The .pbtxt reader decodes tensor_content strings itself (protobuf's Python tokenizer took 77 s for
    ResNet50's weights); every byte, and every escape it leaves to protobuf, gives protobuf's own message."""
    from google.protobuf import text_format
    from ascend_emu.frontend.tf.sources import _parse_text_graph_def

    gd = tf.compat.v1.GraphDef()
    every_byte = np.arange(256, dtype=np.uint8).tobytes() + b'\\"\\\\\\?x'
    for i, raw in enumerate([every_byte, every_byte[::-1], b"", b"plain"]):
        node = gd.node.add(name=f"c{i}", op="Const")
        node.attr["dtype"].type = tf.uint8.as_datatype_enum
        t = node.attr["value"].tensor
        t.dtype, t.tensor_content = tf.uint8.as_datatype_enum, raw
        t.tensor_shape.dim.add(size=len(raw))
    tf.io.write_graph(gd, str(tmp_path), "g.pbtxt", as_text=True)
    text = (tmp_path / "g.pbtxt").read_text()
    assert text.count('tensor_content: "') == 3
    # escapes protobuf reads otherwise than Python's bytes literals, and a string continued on the next line
    hand = [text,
            text.replace('tensor_content: "plain"', 'tensor_content: "\\x41\\x4\\?\\101"'),
            text.replace('tensor_content: "plain"', 'tensor_content: "pl"\n        "ain"'),
            text.replace('tensor_content: "plain"', 'tensor_content: "\\\\?\\\\x\\\\\\""')]
    assert all(v != text for v in hand[1:])
    for variant in hand:
        want, got = tf.compat.v1.GraphDef(), tf.compat.v1.GraphDef()
        text_format.Parse(variant, want)
        _parse_text_graph_def(variant, got)
        assert got == want and got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)
    assert got.node[0].attr["value"].tensor.tensor_content == every_byte
    assert got.node[3].attr["value"].tensor.tensor_content == b"\\?\\x\\\""
