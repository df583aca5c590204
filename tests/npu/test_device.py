"""Replaying real Keras models on the emulated NPU (issue 3's proof).

ResNet50, MobileNetV2 (small inputs) and a Transformer encoder block, seeded random
weights, never downloaded. In must_keep_origin_dtype every op matches TensorFlow's own
float32 execution; in every precision mode the recorded compute dtypes are the ones the
mode implies and the fp16 tensors really are fp16.
"""
import json
import os

import numpy as np
import pytest

from ascend_emu import Device, load_dump, reference
from ascend_emu.errors import AscendEmuError, DumpError, UnsupportedOpError
from ascend_emu.graph import Graph, InputSpec, Node
from ascend_emu.frontend.tf.loader import load_graph
from ascend_emu.frontend.tf import models
from fp32mode import FP32, fp32  # noqa: F401  (the tests' fp32 mode)

MODELS = {
    "resnet50": lambda: models.resnet50(input_shape=(32, 32, 3)),
    "mobilenet_v2": lambda: models.mobilenet_v2(input_shape=(32, 32, 3)),
    "transformer": lambda: models.transformer_encoder(),
}
_cache = {}


def graph_and_ref(name):
    if name not in _cache:
        g = load_graph(MODELS[name]())
        _cache[name] = (g, reference(g, None, None, progress=False))
    return _cache[name]


def cosine(a, b):
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb))


@pytest.mark.models
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("fusion", [None, "off"])
def test_float32_replay_matches_tensorflow_on_every_op(name, fusion):
    g, ref = graph_and_ref(name)
    # the exact op model: the sourced Gelu is the tanh form, which TF's exact gelu is not
    # (tests/npu/test_fusion.py::test_sourced_gelu_is_the_tanh_form_in_float32_too)
    res = Device(**fp32(fusion_switch=fusion, op_model="exact")).replay(g, ref.inputs,
                                                                                          progress=False)
    compared = 0
    for rec in res.records:
        for i, t in enumerate([f"{rec.name}:{k}" for k in range(8)]):
            if t not in res.tensors or t not in ref.tensors:
                continue
            ours, theirs = res.tensors[t], ref.tensors[t]
            if theirs.dtype.kind != "f":
                np.testing.assert_array_equal(ours, theirs, err_msg=t)
                continue
            assert ours.dtype == theirs.dtype, t
            assert ours.shape == theirs.shape, t
            assert cosine(ours, theirs) >= 0.99999, t
            compared += 1
    assert compared > 20
    for t in g.outputs:
        o = np.asarray(res.outputs[t], np.float64)
        r = np.asarray(ref.outputs[t], np.float64)
        assert np.max(np.abs(o - r)) <= 1e-4 * np.max(np.abs(r)), t


# the compute dtype each mode implies for a cube op, a white-listed op, a black-listed op, a gray op
@pytest.mark.models
@pytest.mark.parametrize("mode, cube, cube_out, vector_f32_ok, red", [
    ("must_keep_origin_dtype", "float32", "float32", True, None),
    ("force_fp16", "float16", "float16", False, "float16"),
    ("force_fp32", "float16", "float32", True, "float16"),
    ("cube_fp16in_fp32out", "float16", "float32", True, "float16"),
    ("allow_fp32_to_fp16", "float16", "float16", True, "float16"),
    ("allow_fp32_to_bf16", "bfloat16", "bfloat16", True, "bfloat16"),
    ("allow_mix_precision", "float16", "float16", True, "float16"),
    ("allow_mix_precision_fp16", "float16", "float16", True, "float16"),
    ("allow_mix_precision_bf16", "bfloat16", "bfloat16", True, "bfloat16"),
])
def test_compute_dtypes_follow_the_precision_mode(mode, cube, cube_out, vector_f32_ok, red):
    g, ref = graph_and_ref("transformer")
    # on the Ascend910B, whose cube takes float32 (HF32 off) and whose vector unit has bf16: every mode runs
    res = Device(mode, soc="Ascend910B", allow_hf32="none", fusion_switch="off").replay(g, ref.inputs,
                                                                                       progress=False)
    cube_types = {"MatMul", "BatchMatMulV2", "Einsum"}
    seen_cube = 0
    for rec in res.records:
        if rec.engine != "AICORE" or rec.inserted:
            continue
        out = res.tensors.get(f"{rec.name}:0")
        if out is None or out.dtype.kind not in "fV":
            continue
        # the recorded compute dtype is the dtype of the tensor in memory: fp16 really is fp16
        assert out.dtype.name == rec.compute_dtype, (rec.name, out.dtype, rec.compute_dtype)
        if rec.tf_type in cube_types:
            seen_cube += 1
            assert rec.compute_dtype == cube_out, rec.name
            # the cube's float operands reach it in the operand dtype (inserted casts where needed)
            assert rec.precision["dtype"] == cube, rec.name
        elif rec.tf_type in ("Mean", "Sum") and mode.startswith("allow_mix"):
            assert rec.compute_dtype == "float32", rec.name          # ReduceMeanD is black-listed
            assert rec.precision["list"] == "black"
        elif rec.tf_type in ("Rsqrt", "SquaredDifference", "Softmax", "Erfc", "Mul"):
            if mode == "force_fp16":
                assert rec.compute_dtype == "float16", rec.name
            elif mode in ("must_keep_origin_dtype", "force_fp32", "cube_fp16in_fp32out",
                          "allow_fp32_to_fp16", "allow_fp32_to_bf16"):
                assert rec.compute_dtype == "float32", rec.name
            else:
                assert rec.precision["list"] == "gray"
                assert rec.compute_dtype in ("float32", red), rec.name
    assert seen_cube >= 6
    if red:
        # every cube op's operands are reduced-precision casts
        casts = [r for r in res.records if r.inserted and r.compute_dtype == red]
        assert casts and all(res.tensors[f"{r.name}:0"].dtype.name == red for r in casts)


@pytest.mark.models
def test_mixed_precision_gray_ops_follow_producers():
    g, ref = graph_and_ref("transformer")
    res = Device("allow_mix_precision", fusion_switch="off").replay(g, ref.inputs, progress=False)
    by_name = {r.name: r for r in res.records}
    soft = [r for r in res.records if r.tf_type == "Softmax"]
    assert soft and soft[0].compute_dtype == "float16"   # fed by an fp16 Einsum
    assert "fp16 producer" in soft[0].precision["reason"] or "float16 producer" in soft[0].precision["reason"]
    assert all(r.precision is not None for r in res.records if r.engine == "AICORE" and not r.inserted
               and r.compute_dtype in ("float16", "float32"))
    # the layer norm's mean (ReduceMeanD, black) runs in float32, and what follows it from an fp32 producer too
    means = [r for r in res.records if r.tf_type == "Mean"]
    assert means and all(r.compute_dtype == "float32" and r.precision["list"] == "black" for r in means)
    rsqrt = [r for r in res.records if r.tf_type == "Rsqrt"]
    assert rsqrt and all(r.compute_dtype == "float32" for r in rsqrt), [by_name[r.name].precision for r in rsqrt]


def test_replay_dump_manifest_records_decisions(tmp_path):
    g, ref = graph_and_ref("transformer")
    res = Device("allow_mix_precision").replay(g, ref.inputs, tmp_path / "npu", progress=False)
    d = load_dump(tmp_path / "npu")
    assert d.kind == "npu" and d.config["precision_mode"] == "allow_mix_precision"
    mm = [op for op in d.ops if op["tf_type"] in ("MatMul", "Einsum", "_FusedMatMul", "_FusedBatchMatMul")]
    assert mm and all(op["precision"]["list"] == "white" for op in mm)
    # fp16 outputs are stored as fp16
    fp16_ops = [op for op in d.ops if op["compute_dtype"] == "float16" and op["outputs"][0]["file"]]
    assert fp16_ops and d.tensor(fp16_ops[0]["name"]).dtype == np.float16
    assert d.summary["float_status"] == res.float_status.get()
    assert d.model["fingerprint"] == g.fingerprint


def test_replay_is_deterministic(tmp_path):
    g, ref = graph_and_ref("transformer")
    for k in ("a", "b"):
        Device("allow_mix_precision").replay(g, None, tmp_path / k, seed=3, progress=False)
    files = sorted(os.listdir(tmp_path / "a"))
    assert files == sorted(os.listdir(tmp_path / "b"))
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def _tiny_graph(op="Relu", extra=None):
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [2, 3]}),
             Node("y", op, ["x"], {"T": "float32", **(extra or {})})]
    return Graph(nodes, [InputSpec("x", "float32", [2, 3])], ["y:0"], name="tiny")


def test_unsupported_ops_fail_together_without_fallback():
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec((4, 3), tf.float32)])
    def f(x):
        return tf.math.atan(tf.math.cumprod(x, axis=1)) + 1.0

    with pytest.raises(UnsupportedOpError, match="Atan, Cumprod"):
        Device("force_fp16", aicpu_fallback=False).replay(f, progress=False)
    res = Device("force_fp16").replay(f, progress=False)
    engines = {r.tf_type: r.engine for r in res.records}
    assert engines["Atan"] == "AICPU" and engines["Cumprod"] == "AICPU"
    x = res.inputs[next(iter(res.inputs))]
    out = next(iter(res.outputs.values()))
    np.testing.assert_allclose(out.astype(np.float32), np.arctan(np.cumprod(x, 1)) + 1, rtol=2e-3, atol=2e-3)


def test_bad_device_config():
    with pytest.raises(AscendEmuError, match="unknown soc"):
        Device(soc="Ascend310")
    with pytest.raises(AscendEmuError, match="overflow_mode"):
        Device(overflow_mode="wrap")
    with pytest.raises(AscendEmuError, match="precision_mode"):
        Device("fp8_everything")
    assert Device(soc="Ascend910").overflow_mode == "saturation"
    assert Device(soc="Ascend910B").overflow_mode == "inf_nan"


def test_failed_replay_leaves_an_incomplete_dump(tmp_path, monkeypatch):
    g = _tiny_graph()
    from ascend_emu.ops import OPS

    def boom(*a, **k):
        raise RuntimeError("kernel crashed")

    monkeypatch.setattr(OPS["Relu"], "fn", boom)
    with pytest.raises(AscendEmuError, match=r"op y \(Relu\) failed in the emulator.*kernel crashed"):
        Device().replay(g, None, tmp_path / "d", progress=False)
    assert (tmp_path / "d" / "INCOMPLETE").exists()
    with pytest.raises(DumpError, match="incomplete"):
        load_dump(tmp_path / "d")


def test_existing_dump_needs_overwrite(tmp_path):
    g = _tiny_graph()
    Device().replay(g, None, tmp_path / "d", progress=False)
    with pytest.raises(AscendEmuError, match="overwrite"):
        Device().replay(g, None, tmp_path / "d", progress=False)
    Device().replay(g, None, tmp_path / "d", overwrite=True, progress=False)
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["kind"] == "npu"


def test_stats_only_and_select(tmp_path):
    g, ref = graph_and_ref("transformer")
    Device().replay(g, ref.inputs, tmp_path / "s", stats_only=True, progress=False)
    d = load_dump(tmp_path / "s")
    assert all(o["file"] is None for op in d.ops for o in op["outputs"])
    assert all(o["max"] is not None for op in d.ops for o in op["outputs"] if o["shape"] and np.prod(o["shape"]))
    Device().replay(g, ref.inputs, tmp_path / "t", select=lambda name, t: t == "Softmax", progress=False)
    d = load_dump(tmp_path / "t")
    saved = {op["tf_type"] for op in d.ops if any(o["file"] for o in op["outputs"])}
    assert saved == {"Softmax"}


def test_input_errors():
    g = _tiny_graph()
    with pytest.raises(AscendEmuError, match="x"):
        Device().replay(g, {"x": np.zeros((5, 5), np.float32)}, progress=False)
    with pytest.raises(AscendEmuError, match="nope"):
        Device().replay(g, {"nope": np.zeros((2, 3), np.float32)}, progress=False)


@pytest.mark.parametrize("overflow_mode", ["saturation", "inf_nan"])
def test_saturation_vs_inf_nan_visible_in_outputs(overflow_mode):
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [4]}),
             Node("y", "Mul", ["x", "c"], {"T": "float32"}),
             Node("c", "Const", [], {"dtype": "float32", "value": np.float32(1000.0)})]
    nodes = [nodes[0], nodes[2], nodes[1]]
    g = Graph(nodes, [InputSpec("x", "float32", [4])], ["y:0"])
    x = np.array([1.0, 60.0, 70.0, -80.0], np.float32)
    res = Device("force_fp16", overflow_mode=overflow_mode).replay(g, {"x": x}, progress=False)
    y = res.outputs["y:0"]
    assert y.dtype == np.float16
    if overflow_mode == "saturation":
        assert list(y[2:]) == [65504, -65504]
    else:
        assert np.isposinf(y[2]) and np.isneginf(y[3])
    assert res.float_status.get() & 0x20
    rec = res.record("y")
    assert rec.fp32_check == {"overflow": False, "max_abs": 80000.0, "status": 0}


@pytest.mark.models
@pytest.mark.parametrize("name", ["transformer", "mobilenet_v2"])
def test_replay_from_every_saved_format_matches_tensorflow(name, tmp_path):
    """The model saved in every supported format, replayed in float32, matches TF's own run."""
    paths = models.save_all_formats(MODELS[name](), tmp_path)
    formats = ["keras_file", "saved_model", "pb", "pbtxt", "tf_function", "concrete_function"]
    if name == "mobilenet_v2":
        formats = ["keras_file", "saved_model", "pb"]   # the text GraphDef of a CNN is slow to parse
    for fmt in formats:
        ref = reference(paths[fmt], None, None, progress=False)
        res = Device(**fp32(op_model="exact")).replay(ref.graph, ref.inputs, progress=False)
        worst = min(cosine(res.tensors[t], ref.tensors[t]) for t in ref.tensors
                    if t in res.tensors and ref.tensors[t].dtype.kind == "f")
        assert worst >= 0.99999, fmt
        for t in ref.graph.outputs:
            o, r = np.asarray(res.outputs[t], np.float64), np.asarray(ref.outputs[t], np.float64)
            assert np.max(np.abs(o - r)) <= 1e-4 * np.max(np.abs(r)), fmt


def test_a_wrong_shape_is_caught_at_the_op_that_made_it(monkeypatch):
    """The round-1 bug: StridedSlice(shrink_axis_mask=1) gave shape (1,), and Flatten's Pack failed two
    ops later. With the output check the error names the StridedSlice and the shape TensorFlow infers."""
    import keras

    from ascend_emu.ops import OPS

    keras.utils.set_random_seed(0)
    inp = keras.Input((4, 4, 2), name="img")
    m = keras.Model(inp, keras.layers.Dense(3)(keras.layers.Flatten()(keras.layers.Conv2D(2, 3)(inp))))
    g = load_graph(m)
    ok = Device(**FP32).replay(g, progress=False)
    np.testing.assert_allclose(ok.outputs[g.outputs[0]], reference(g, ok.inputs, progress=False).outputs[g.outputs[0]], rtol=1e-5, atol=1e-6)
    real = OPS["StridedSlice"].fn

    def rank_losing(*a, **k):
        return np.ascontiguousarray(real(*a, **k))   # promotes a 0-d result to shape (1,)

    monkeypatch.setattr(OPS["StridedSlice"], "fn", rank_losing)
    with pytest.raises(AscendEmuError, match=r"op '[^']*flatten[^']*strided_slice' \(StridedSlice\) produced "
                                             r"output 0 of shape \(1,\) where TensorFlow infers \(\)"):
        Device(**FP32).replay(g, progress=False)


def test_batch_norm_parameters_stay_float32_when_it_computes_in_fp16():
    """CANN's BatchNorm/BNInfer protos take scale, offset, mean and variance in float32 whatever x's
    dtype: under force_fp16 only x is cast, and y equals the op run on the float32 parameters."""
    from ascend_emu.ops import OPS

    rng = np.random.default_rng(7)
    c = 5
    # parameters that float16 cannot hold exactly (a cast would change them)
    params = {n: rng.uniform(0.5, 1.5, c).astype(np.float32) + np.float32(1e-4) for n in ("s", "o", "m", "v")}
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [2, 3, 3, c]})]
    nodes += [Node(n, "Const", [], {"dtype": "float32", "value": v}) for n, v in params.items()]
    nodes.append(Node("bn", "FusedBatchNormV3", ["x", "s", "o", "m", "v"],
                      {"T": "float32", "U": "float32", "epsilon": 1e-3, "is_training": False,
                       "data_format": "NHWC"}, num_outputs=6))
    g = Graph(nodes, [InputSpec("x", "float32", [2, 3, 3, c])], ["bn:0"], name="bn")
    x = rng.normal(size=(2, 3, 3, c)).astype(np.float32)
    dev = Device("force_fp16", fusion_switch="off")
    res = dev.replay(g, {"x": x}, progress=False)
    casts = [r for r in res.records if r.inserted]
    assert [r.inputs for r in casts] == [["x:0"]]          # only x reaches the op as float16
    bn = next(r for r in res.records if r.name == "bn")
    assert bn.compute_dtype == "float16"
    ctx = dev.context("float16")
    want = OPS["FusedBatchNormV3"](x.astype(np.float16), *params.values(), ctx=ctx, epsilon=1e-3)[0]
    np.testing.assert_array_equal(np.asarray(res.tensor("bn:0")).view(np.uint16), want.view(np.uint16))
    # with the parameters rounded to float16 first (what the device did before), y differs
    rounded = [p.astype(np.float16) for p in params.values()]
    before = OPS["FusedBatchNormV3"](x.astype(np.float16), *rounded, ctx=ctx, epsilon=1e-3)[0]
    assert not np.array_equal(before.view(np.uint16), want.view(np.uint16))
