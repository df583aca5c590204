"""The ONNX frontend (the ATC path): models built here with onnx.helper, replayed in fp32 mode against
onnxruntime node by node, in ATC's default force_fp16, and through the CLI.

Each model is small (seeded weights, shapes of a few hundred elements) so each test runs in seconds.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest

from ascend_emu import Device
from ascend_emu.analysis.compare import compare
from ascend_emu.cli.main import main
from ascend_emu.errors import AscendEmuError
from ascend_emu.frontend.onnx.loader import load_onnx
from ascend_emu.frontend.tf.reference import reference

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import onnx_models as M  # noqa: E402
from fp32mode import FP32, FP32_ARGS  # noqa: E402

CNN_SHAPES = {"x": [2, 3, 16, 16]}
BERT_SHAPES = {"ids": [2, 8], "mask": [2, 8]}


def bert_inputs():
    """Token ids of the embedding table and an attention mask of zeros and ones (the random inputs' 0..9 would
    make the mask's -1e4 bias overflow fp16)."""
    rng = np.random.default_rng(0)
    return {"ids": rng.integers(0, 50, (2, 8)), "mask": (rng.random((2, 8)) < 0.8).astype(np.int64)}


def _save(tmp_path, model, name="m.onnx"):
    p = tmp_path / name
    onnx.save(model, str(p))
    return p


def _replay_and_compare(tmp_path, path, shapes, inputs=None, **device):
    ref = reference(path, inputs, tmp_path / "bench", shapes=shapes, progress=False)
    res = Device(**device).replay(path, ref.inputs, tmp_path / "npu", shapes=shapes, progress=False)
    return ref, res, compare(tmp_path / "npu", tmp_path / "bench")


def _matched(c):
    """(name, cosine) of every row compared on both sides with a cosine."""
    return {r["NPU Name"]: r["Cosine"] for r in c.rows
            if isinstance(r.get("Cosine"), float) and r.get("Bench Name") == r.get("NPU Name")}


def _onnx_nodes(model):
    return {nd.name for nd in model.graph.node}


@pytest.mark.parametrize("build,shapes,fallback", [
    (M.resnet_cnn, CNN_SHAPES, set()),
    (M.bert_block, BERT_SHAPES, set()),
    (M.resize_einsum, None, set()),
], ids=["resnet_cnn", "bert_block", "resize_einsum"])
def test_fp32_mode_matches_onnxruntime_node_by_node(tmp_path, build, shapes, fallback):
    model = build()
    path = _save(tmp_path, model)
    ref, res, c = _replay_and_compare(tmp_path, path, shapes, bert_inputs() if shapes is BERT_SHAPES else None, **FP32)
    cos = _matched(c)
    # every ONNX node is an op of the bench dump under its own name; each is compared with the NPU's op of the
    # same name, or was fused away on the NPU (compared where the fusion's result lands)
    names = _onnx_nodes(model)
    bench = {r["Bench Name"].rpartition(":")[0]: r for r in c.rows if r.get("Bench Name")}
    assert names <= set(bench)
    for nm in names:
        r = bench[nm]
        # (or the transpose back to NCHW between two NHWC ops, which the NPU graph leaves out)
        assert r.get("NPU Name") or "fused away" in (r.get("Err_message") or "") or nm in res.graph.onnx.extra, r
    assert len([nm for nm in names if bench[nm].get("NPU Name")]) >= 0.6 * len(names)
    bad = {k: v for k, v in cos.items() if v < 0.99999}
    assert not bad, bad
    # the model's outputs agree with onnxruntime's (to 1e-3: the fused Gelu is CANN's tanh-form kernel)
    for t in res.graph.outputs:
        np.testing.assert_allclose(res.outputs[t], ref.outputs[t], rtol=1e-3, atol=5e-4)
    # the nodes without a mapping ran on the AI CPU (onnxruntime), recorded as such
    aicpu = {r.name for r in res.records if r.engine == "AICPU"}
    assert aicpu == fallback


def test_loader_keeps_names_and_maps_layouts():
    g = load_onnx(M.resnet_cnn(), input_shapes=CNN_SHAPES)
    by = {n.name: n for n in g.nodes}
    # the ONNX node's name carries its NCHW result; the registry's NHWC conv sits between two transposes
    assert by["dwconv"].op == "Transpose" and by["conv1/Conv2D"].op == "Conv2D"
    # conv1's transpose back to NCHW is read by nothing (bn1 reads the NHWC result): left to the reference
    assert "conv1" not in by and g.onnx.extra["conv1"].op == "Transpose"
    assert by["conv1/Conv2D"].attrs["padding"] == "EXPLICIT"
    assert by["conv1/Conv2D"].attrs["explicit_paddings"] == [0, 0, 1, 1, 1, 1, 0, 0]
    # a chain of NHWC ops reads the NHWC tensor, not a transpose of a transpose
    assert by["bn1/FusedBatchNormV3"].inputs[0] == "conv1/BiasAdd:0"
    assert by["gap"].op == "Mean" and by["relu6"].op == "Relu6" and by["fc"].op == "BiasAdd"
    assert by["fc/MatMul"].attrs["transpose_b"] is True
    assert g.inputs[0].shape == [2, 3, 16, 16] and g.output_names == ["probs"] and g.outputs == ["softmax:0"]


@pytest.mark.parametrize("opset", [11, 13, 18, 21])
def test_data_movement_across_opsets_matches_onnxruntime(tmp_path, opset):
    path = _save(tmp_path, M.array_ops(opset))
    ref = reference(path, None, None, progress=False)
    res = Device(**FP32).replay(path, ref.inputs, progress=False)
    assert not [r.name for r in res.records if r.engine == "AICPU"]
    # (data movement is exact; ReduceSum's float32 order may differ in the last bit)
    assert res.outputs["squeeze:0"].shape == ref.outputs["squeeze:0"].shape == (2, 14 if opset < 13 else 17)
    np.testing.assert_allclose(res.outputs["squeeze:0"], ref.outputs["squeeze:0"], rtol=1e-6, atol=1e-6)


def test_activations_match_onnxruntime(tmp_path):
    path = _save(tmp_path, M.activations())
    ref, res, c = _replay_and_compare(tmp_path, path, None, **FP32)
    cos = _matched(c)
    assert {"gelu_exact:0", "gelu_tanh:0", "scale:0"} <= set(cos)
    assert min(cos.values()) >= 0.99999, cos
    # an integer output is compared exact or not, without a cosine
    row = next(r for r in c.rows if r["NPU Name"] == "int_div:0")
    assert row["Result"] == "pass" and row["Cosine"] == "N/A" and "exact" in row["Err_message"]
    # ONNX's Div truncates integers: 7/2, -7/2, 9/-4 = 3, -3, -2
    np.testing.assert_array_equal(res.tensor("int_div:0"), [3, -3, -2])
    assert not [r.name for r in res.records if r.engine == "AICPU"]


def test_opset_13_cnn_loads_as_opset_17():
    ops = lambda g: [(n.name, n.op, n.inputs) for n in g.nodes]  # noqa: E731
    assert ops(load_onnx(M.resnet_cnn(opset=13), input_shapes=CNN_SHAPES)) == \
        ops(load_onnx(M.resnet_cnn(opset=17), input_shapes=CNN_SHAPES))


def test_opset_17_and_18_forms_load_the_same(tmp_path):
    a = load_onnx(M.bert_block(opset=17), input_shapes=BERT_SHAPES)
    b = load_onnx(M.bert_block(opset=18), input_shapes=BERT_SHAPES)
    ops = lambda g: [(n.name, n.op) for n in g.nodes if n.op != "Const"]  # noqa: E731
    assert ops(a) == ops(b)
    mean = {n.name: n for n in b.nodes}["ln1_mean"]
    assert mean.op == "Mean" and mean.attrs["keep_dims"] is True


def test_gemm_alpha_beta_and_reshape_zero(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "c"),
             numpy_helper.from_array(np.asarray([0, 2, -1], np.int64), "shape")]
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["g"], name="gemm", transA=1, transB=1, alpha=0.5, beta=2.0),
             helper.make_node("Reshape", ["g", "shape"], ["y"], name="reshape")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2, 2])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    path = _save(tmp_path, m)
    ref, res, c = _replay_and_compare(tmp_path, path, None, **FP32)
    np.testing.assert_allclose(res.outputs["reshape:0"], ref.outputs["reshape:0"], rtol=1e-5, atol=1e-6)
    assert res.outputs["reshape:0"].shape == (3, 2, 2)


def test_ascend310p3_uses_atc_default_force_fp16(tmp_path):
    path = _save(tmp_path, M.bert_block())
    ref, res, c = _replay_and_compare(tmp_path, path, BERT_SHAPES, bert_inputs(), soc="Ascend310P3")
    assert res.records and Device(soc="Ascend310P3").precision.mode == "force_fp16"
    computed = [r for r in res.records if r.engine == "AICORE" and r.tf_type != "Cast"]
    assert computed and all(r.compute_dtype == "float16" for r in computed if r.compute_dtype.startswith("float"))
    cos = _matched(c)
    # fp16 shows: LayerNorm's 1e-12 epsilon flushes to zero in fp16, the ops drift from float32 ...
    eps = [r for r in c.rows if (r.get("NPU Name") or "").startswith("eps/ascend_cast")]
    assert eps and eps[0]["Cosine"] == 0.0
    assert sum(v < 0.9999999 for v in cos.values()) >= 5
    # ... and the model's results stay close
    assert cos["ln2:0"] > 0.9999 and cos["pooler_tanh:0"] > 0.9999


def test_keep_dtype_file_keeps_float32(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("# ATC keep_dtype\nln0\nOpType::SoftmaxV2\n")
    res = Device(soc="Ascend310P3", keep_dtype=keep).replay(M.bert_block(), bert_inputs(), progress=False)
    rec = {r.name: r for r in res.records}
    assert rec["attn_softmax"].compute_dtype == "float32" and rec["ln0"].compute_dtype == "float32"
    assert rec["pv"].compute_dtype == "float16"


def test_cli_end_to_end(tmp_path, capsys):
    path = _save(tmp_path, M.resnet_cnn())
    shape = ["--shape", "x=2,3,16,16"]
    assert main(["-q", "reference", str(path), *shape, "--dump", str(tmp_path / "bench")]) == 0
    assert "onnxruntime" in capsys.readouterr().out
    assert main(["-q", "replay", str(path), *shape, *FP32_ARGS, "--dump", str(tmp_path / "npu")]) == 0
    assert main(["-q", "replay", str(path), *shape, "--soc", "Ascend310P3", "--dump", str(tmp_path / "fp16")]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "fp16"), str(tmp_path / "bench"), "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "compared" in out and "float16" in out
    assert main(["report", str(tmp_path / "npu"), str(tmp_path / "bench"), "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").stat().st_size > 1000


def test_external_data(tmp_path):
    m = M.resnet_cnn()
    p = tmp_path / "ext.onnx"
    onnx.save(m, str(p), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data",
              size_threshold=0)
    assert (tmp_path / "ext.data").exists()
    g = load_onnx(p, input_shapes=CNN_SHAPES)
    ref = reference(p, None, None, shapes=CNN_SHAPES, progress=False)
    res = Device(**FP32).replay(g, ref.inputs, progress=False)
    np.testing.assert_allclose(res.outputs["softmax:0"], ref.outputs["softmax:0"], rtol=1e-5, atol=1e-6)
    (tmp_path / "ext.data").unlink()
    with pytest.raises(AscendEmuError, match="external data"):
        load_onnx(p)


def _cli_error(args, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("ascend-emu: error:"), err
    return err


def test_errors_are_one_line(tmp_path, capsys):
    good = _save(tmp_path, M.resize_einsum())
    data = good.read_bytes()
    trunc = tmp_path / "trunc.onnx"
    trunc.write_bytes(data[:len(data) // 3])
    assert "not a valid ONNX model" in _cli_error(["replay", str(trunc)], capsys)
    assert "not a valid ONNX model" in _cli_error(["reference", str(trunc)], capsys)
    # an unknown op with the fallback off, named as ONNX's (a cubic Resize: the linear one is ResizeBilinear)
    cubic = M.resize_einsum()
    for a in next(nd for nd in cubic.graph.node if nd.name == "resize_linear").attribute:
        if a.name == "mode":
            a.s = b"cubic"
    err = _cli_error(["replay", str(_save(tmp_path, cubic, "cubic.onnx")), "--no-aicpu-fallback"], capsys)
    assert "OnnxResize" in err and "onnxruntime" in err
    np.save(tmp_path / "x.npy", np.zeros((1, 4, 4, 4), np.float32))
    assert "unknown input 'nope'" in _cli_error(["replay", str(good), "--input", f"nope={tmp_path / 'x.npy'}"],
                                                 capsys)
    # a malformed graph: a node reads a tensor nothing makes
    m = M.resize_einsum()
    m.graph.node[3].input[0] = "nowhere"
    bad = _save(tmp_path, m, "bad.onnx")
    assert "malformed" in _cli_error(["replay", str(bad)], capsys)
    # a corrupt pad of billions: refused when the model loads, before anything allocates it
    m = M.resize_einsum()
    pads = next(t for t in m.graph.initializer if t.name == "pads")
    pads.CopyFrom(onnx.numpy_helper.from_array(np.asarray([0, 0, 1, 1, 0, 0, 1, 3 << 40], np.int64), "pads"))
    huge = _save(tmp_path, m, "huge.onnx")
    assert "GiB" in _cli_error(["replay", str(huge)], capsys)


def test_fusion_passes_on_onnx_forms(capsys):
    """What `ascend-emu rules` says of ONNX models holds on the models here."""
    from ascend_emu.npu.fusion import RULES
    from ascend_emu.npu.fusion.onnx_forms import ONNX_FORMS

    assert set(ONNX_FORMS) == set(RULES)
    cnn = Device(soc="Ascend910B").replay(M.resnet_cnn(), shapes=CNN_SHAPES, progress=False).summary["fusion_counts"]
    bert = Device(soc="Ascend910B").replay(M.bert_block(), bert_inputs(), progress=False).summary["fusion_counts"]
    for rule in ("BiasaddConvFusionPass", "ConvBatchnormFusionPass", "MatMulBiasAddFusionPass"):
        assert ONNX_FORMS[rule].startswith("matches") and rule in {**cnn, **bert}, rule
    assert "GeluFusionPass" in bert and "LayerNormFusionPass" not in bert
    # the UB chain after a product fuses; after a Conv it goes through the Transpose back to NCHW (conv + BN + Relu,
    # conv + BN + Clip, the depthwise conv + its residual Add: NUMERICS.md section 9), as the rule's ONNX form says
    assert bert["TbeEltwiseFusionPass"] == 4 and cnn["TbeEltwiseFusionPass"] == 3
    assert ONNX_FORMS["TbeEltwiseFusionPass"].startswith("matches") and "Transpose back to NCHW" in ONNX_FORMS[
        "TbeEltwiseFusionPass"]
    assert ONNX_FORMS["LayerNormFusionPass"].startswith("TF graphs only")
    assert main(["rules"]) == 0
    assert "onnx:     TF graphs only" in capsys.readouterr().out


_NO_TBE = {"Switch": {"GraphFusion": {}, "UBFusion": {"TbeEltwiseFusionPass": "off"}}}


def _bits(a):
    a = np.asarray(a)
    return a.dtype, a.shape, a.tobytes()


def test_tbe_eltwise_goes_through_the_transpose_back_to_nchw():
    """After an ONNX Conv the UB chain continues through the loader's Transpose back to NCHW (ATC has none): conv +
    BN + Relu, conv + BN + Clip and the depthwise conv + its residual Add become one _FusedConv2D each, named after
    the chain's last op; the Relu and Clip chains give the fusion-off replay's NCHW values bit for bit (rounding
    commutes with them), the residual Add rounds once; without a dump the layout plan runs them in NHWC and cancels
    the transposes their readers had: the same output bits."""
    g = load_onnx(M.resnet_cnn(), input_shapes=CNN_SHAPES)
    feeds = {g.inputs[0].name: np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)}
    dev = Device(soc="Ascend910B")
    on = dev.replay(g, feeds, progress=False)
    off = Device(soc="Ascend910B", fusion_switch=_NO_TBE).replay(g, feeds, progress=False)
    fused = {r.name: r for r in on.records if r.fusion and "TbeEltwiseFusionPass" in r.fusion["rules"]}
    assert set(fused) == {"relu1", "relu6", "residual"} and {r.tf_type for r in fused.values()} == {"_FusedConv2D"}
    assert {"bn1", "relu1"} <= set(fused["relu1"].fusion["replaces"])   # the Transpose named after bn1 went in
    assert {"dwconv", "residual"} <= set(fused["residual"].fusion["replaces"])
    for name, shape in (("relu1:0", (2, 8, 8, 8)), ("relu6:0", (2, 8, 4, 4))):
        assert on.tensor(name).shape == shape and _bits(on.tensor(name)) == _bits(off.tensor(name)), name
    r_on, r_off = on.tensor("residual:0"), off.tensor("residual:0")
    assert r_on.shape == r_off.shape == (2, 8, 4, 4) and r_on.dtype == np.float16
    np.testing.assert_allclose(r_on.astype(np.float32), r_off.astype(np.float32), rtol=1e-3, atol=1e-3)
    quiet = dev.replay(g, feeds, progress=False, keep_tensors=False)
    assert _bits(quiet.outputs["softmax:0"]) == _bits(on.outputs["softmax:0"])


def _conv_then(ops, opset=17, out_shape=(1, 4, 8, 8)):
    """x -> Conv (bias) -> the elementwise ``ops`` ((op type, extra input or None), ...) -> y."""
    from onnx import TensorProto, helper

    g = M._G(5)
    y = g.n("Conv", ["x", g.w("w", (4, 3, 3, 3)), g.w("b", (4,))], ["c"], "conv", pads=[1, 1, 1, 1])
    for i, (op, other) in enumerate(ops):
        y = g.n(op, [y] + ([other(g, i)] if other else []), [f"y{i}"], f"op{i}")
    return g.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                   [helper.make_tensor_value_info(y, TensorProto.FLOAT, list(out_shape))], opset)


@pytest.mark.parametrize("ops", [
    [("Mul", lambda g, i: g.w(f"s{i}", (1, 4, 1, 1), 1.0)), ("Relu", None)],         # a per-channel scale
    [("Relu", None), ("Add", lambda g, i: g.w(f"s{i}", (4, 1, 1), 1.0))],             # rank 3: numpy aligns it
    [("Mul", lambda g, i: g.c(f"s{i}", 0.5, np.float32)), ("Add", lambda g, i: g.c(f"t{i}", 0.25, np.float32)),
     ("Relu", None)],
    [("Add", lambda g, i: g.w(f"s{i}", (1, 4, 8, 8), 1.0)), ("Sigmoid", None)],       # a whole NCHW tensor
], ids=["channel_mul", "rank3_add", "scalars", "tensor_add"])
def test_tbe_eltwise_through_the_transpose_takes_the_chain(ops):
    """The chain through the Transpose to NCHW takes the ops and operands the NCHW graph has; the replay matches
    onnxruntime in float32 and its own fusion-off replay in force_fp16 within the one rounding less."""
    m = _conv_then(ops)
    g = load_onnx(m)
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    feeds = {g.inputs[0].name: x}
    rep = Device(soc="Ascend910B").replay(g, feeds, progress=False)
    recs = [r for r in rep.records if r.fusion and "TbeEltwiseFusionPass" in r.fusion["rules"]]
    names = [f"op{i}" for i in range(len(ops))]
    assert len(recs) == 1 and recs[0].name == names[-1]
    assert [o for o in recs[0].fusion["replaces"] if o.startswith("op")] == names
    assert "conv" in recs[0].fusion["replaces"]   # (conv: the Transpose back to NCHW)
    out = g.outputs[0]
    off = Device(soc="Ascend910B", fusion_switch=_NO_TBE).replay(g, feeds, progress=False)
    assert rep.outputs[out].shape == off.outputs[out].shape == (1, 4, 8, 8)
    np.testing.assert_allclose(rep.outputs[out].astype(np.float32), off.outputs[out].astype(np.float32), rtol=2e-3,
                               atol=2e-3)
    quiet = Device(soc="Ascend910B").replay(g, feeds, progress=False, keep_tensors=False)
    assert _bits(quiet.outputs[out]) == _bits(rep.outputs[out])
    ref = reference(m, feeds, None, progress=False)
    got = Device(**FP32).replay(g, feeds, progress=False)
    np.testing.assert_allclose(got.outputs[out], ref.outputs[out], rtol=1e-5, atol=1e-5)


def test_tbe_eltwise_through_the_transpose_declines_a_5d_constant():
    """A one-element constant of 5 dimensions broadcasts the NCHW result to 5: the chain ends before its op (the
    fused convolution could not transpose that), and the replay gives onnxruntime's 5-D result."""
    m = _conv_then([("Mul", lambda g, i: g.c(f"s{i}", np.full((1, 1, 1, 1, 1), 0.5), np.float32)),
                    ("Relu", None)], out_shape=(1, 1, 4, 8, 8))
    g = load_onnx(m)
    feeds = {g.inputs[0].name: np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    rep = Device(soc="Ascend910B").replay(g, feeds, progress=False)
    assert "TbeEltwiseFusionPass" not in rep.summary["fusion_counts"]
    out = g.outputs[0]
    ref = reference(m, feeds, None, progress=False)
    assert rep.outputs[out].shape == ref.outputs[out].shape == (1, 1, 4, 8, 8)
    got = Device(**FP32).replay(g, feeds, progress=False)
    np.testing.assert_allclose(got.outputs[out], ref.outputs[out], rtol=1e-5, atol=1e-5)


_ADD_RELU = [{"op": "AddV2", "args": [-1, 2], "attrs": {}, "name": "a"},
             {"op": "Relu", "args": [-1], "attrs": {}, "name": "r"}]
_MUL_SIGMOID = [{"op": "Mul", "args": [-1, 2], "attrs": {}, "name": "m"},
                {"op": "Sigmoid", "args": [-1], "attrs": {}, "name": "s"},
                {"op": "Maximum", "args": [-1, 2], "attrs": {}, "name": "x"}]


@pytest.mark.parametrize("xhw, shape, chain, mode", [
    (6, (1, 4, 6, 6), _ADD_RELU, "inf_nan"), (6, (4, 1, 1), _ADD_RELU, "inf_nan"),
    (6, (1, 4, 1, 1), _MUL_SIGMOID, "inf_nan"), (6, (), _ADD_RELU, "inf_nan"),
    (6, (2, 4, 6, 6), _ADD_RELU, "inf_nan"), (6, (6,), _MUL_SIGMOID, "inf_nan"),
    (1, (1, 4, 6, 6), _MUL_SIGMOID, "inf_nan"),     # squeeze-excitation: the operand widens the 1x1 result
    (6, (1, 4, 6, 6), _ADD_RELU, "saturation"), (6, (1, 4, 1, 1), _MUL_SIGMOID, "saturation"),
], ids=["nchw", "rank3", "channel_sigmoid", "scalar", "batch_broadcast", "width", "se_widens", "nchw_sat",
        "channel_sat"])
def test_fused_conv_through_the_transpose_is_the_nhwc_op_transposed(xhw, shape, chain, mode):
    """_FusedConv2D with ``transpose`` gives, bit for bit and with the same status, the same fused op computed in
    NHWC on the operands transposed by hand (numpy's NCHW broadcasting kept, also where the operand widens the
    result), then transposed to NCHW; ``transpose_out`` False leaves the NHWC result. Operands hold an Inf and a
    value that overflows fp16 (the one-pass epilogue declines, the step-by-step chain and the saturation apply).
    A 5-D operand: the chain on the NCHW accumulator (numpy's broadcasting to 5-D), or, left in NHWC, an error
    naming the pass, as another permutation is."""
    from ascend_emu.ops import OPS
    from ascend_emu.ops.registry import OpContext

    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, xhw, xhw, 3)).astype(np.float16)
    w = (rng.standard_normal((3, 3, 3, 4)) * 0.5).astype(np.float16)
    o = rng.standard_normal(shape).astype(np.float16)
    if o.size > 2:
        o.reshape(-1)[:2] = (np.inf, 60000)
    fn = OPS["_FusedConv2D"].fn
    kw = dict(bias=np.linspace(-1, 1, 4).astype(np.float32), chain=chain, padding="SAME")
    perm = np.array([0, 3, 1, 2])

    def ctx():
        return OpContext(dtype="float16", overflow_mode=mode)
    c1, c2, c3 = ctx(), ctx(), ctx()
    got = fn(x, w, o, perm, ctx=c1, transpose=3, **kw)
    o4 = o.reshape((1,) * (4 - o.ndim) + o.shape).transpose(0, 2, 3, 1)
    nhwc = fn(x, w, np.ascontiguousarray(o4), ctx=c2, **kw)
    assert _bits(got) == _bits(np.ascontiguousarray(nhwc.transpose(0, 3, 1, 2)))
    assert c1.status == c2.status
    assert _bits(fn(x, w, o, perm, ctx=c3, transpose=3, transpose_out=False, **kw)) == _bits(nhwc)
    assert c3.status == c2.status
    with pytest.raises(AscendEmuError, match="switch TbeEltwiseFusionPass off"):
        fn(x, w, o, np.array([0, 2, 3, 1]), ctx=ctx(), transpose=3, **kw)
    o5 = o.reshape((1,) * (5 - o.ndim) + o.shape)
    c4 = ctx()
    wide = fn(x, w, o5, perm, ctx=c4, transpose=3, **kw)    # (a leading 1 more: the same values, one axis more)
    assert _bits(wide) == _bits(np.ascontiguousarray(got)[None]) and c4.status == c1.status
    with pytest.raises(AscendEmuError, match="switch TbeEltwiseFusionPass off"):
        fn(x, w, o5, perm, ctx=ctx(), transpose=3, transpose_out=False, **kw)


def test_tbe_eltwise_through_the_transpose_with_a_5d_tensor_operand():
    """A computed 5-D operand (ONNX nodes carry no shapes, so the rule takes it): the fused op runs the chain on the
    NCHW accumulator, the layout plan leaves it whole; the dump replay, the no-dump replay and onnxruntime (fp32)
    agree on the 5-D result."""
    from onnx import TensorProto, helper

    g_ = M._G(6)
    y = g_.n("Conv", ["x", g_.w("w", (4, 3, 3, 3)), g_.w("b", (4,))], ["c"], "conv", pads=[1, 1, 1, 1])
    u = g_.n("Unsqueeze", ["z", g_.c("ax", [0])], ["u"], "unsq")
    y = g_.n("Add", [y, u], ["a"], "add")
    y = g_.n("Relu", [y], ["r"], "relu")
    # another branch whose transposes the plan cancels (conv + Relu -> MaxPool), so the plan is made
    p = g_.n("Conv", ["x", g_.w("w2", (4, 3, 3, 3))], ["c2"], "conv2", pads=[1, 1, 1, 1])
    p = g_.n("Relu", [p], ["r2"], "relu2")
    p = g_.n("MaxPool", [p], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2])
    m = g_.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                  helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 8, 8])],
                 [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 1, 4, 8, 8]),
                  helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 4, 4, 4])], 17)
    g = load_onnx(m)
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
             "z": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)}
    rep = Device(soc="Ascend910B").replay(g, feeds, progress=False)
    assert rep.summary["fusion_counts"].get("TbeEltwiseFusionPass") == 2
    quiet = Device(soc="Ascend910B").replay(g, feeds, progress=False, keep_tensors=False)
    assert sum(r.tf_type == "Transpose" for r in quiet.records) < sum(r.tf_type == "Transpose" for r in rep.records)
    assert rep.outputs[g.outputs[0]].shape == (1, 1, 4, 8, 8)
    ref = reference(m, feeds, None, progress=False)
    got = Device(**FP32).replay(g, feeds, progress=False)
    for out in g.outputs:
        assert _bits(quiet.outputs[out]) == _bits(rep.outputs[out]), out
        np.testing.assert_allclose(got.outputs[out], ref.outputs[out], rtol=1e-5, atol=1e-5)


def test_contrib_op_runs_on_the_ai_cpu():
    """An op of another domain (onnxruntime's com.microsoft FastGelu) has no mapping: the AI CPU runs it."""
    from onnx import TensorProto, helper

    n = helper.make_node("FastGelu", ["x"], ["y"], name="fast_gelu", domain="com.microsoft")
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    res = Device(soc="Ascend310P3").replay(m, progress=False)
    rec = res.record("fast_gelu")
    assert (rec.engine, rec.tf_type, rec.compute_dtype) == ("AICPU", "OnnxFastGelu", "float32")
    ref = reference(m, res.inputs, None, progress=False)
    np.testing.assert_allclose(res.outputs["fast_gelu:0"], ref.outputs["fast_gelu:0"], rtol=1e-6)


def test_dynamic_batch_without_shape_stays_on_the_ai_core():
    """The batch dim left dynamic (no --shape): padding and Flatten need only the static dims."""
    g = load_onnx(M.resnet_cnn())
    assert not [n.name for n in g.nodes if n.op.startswith("Onnx")]
    res = Device(**FP32).replay(g, progress=False)
    ref = reference(g, res.inputs, None, progress=False)
    np.testing.assert_allclose(res.outputs["softmax:0"], ref.outputs["softmax:0"], rtol=1e-5, atol=1e-6)


def test_runtime_reshape_of_a_dynamic_batch(tmp_path):
    """Without --shape, BERT's reshapes take a shape computed at run time (Shape, Gather, Concat): still the
    AI Core's Reshape, ONNX's 0 resolved with integer ops; the block matches onnxruntime."""
    g = load_onnx(M.bert_block())
    assert not [n.name for n in g.nodes if n.op.startswith("Onnx")]
    assert {n.name: n.op for n in g.nodes}["q_reshape"] == "Reshape"
    res = Device(**FP32).replay(g, bert_inputs(), progress=False)
    ref = reference(g, res.inputs, None, progress=False)
    for t in g.outputs:
        np.testing.assert_allclose(res.outputs[t], ref.outputs[t], rtol=1e-3, atol=5e-4)


def test_the_maxpool_pad_constant_is_no_overflow(tmp_path):
    """Issue 45 item 4: the loader's own -inf pad value of a padded MaxPool was named the first overflowing op
    of every such model, hiding the real one; the real one (a Mul past fp16's range) is named now."""
    from onnx import helper

    from ascend_emu.analysis.overflow import overflow_report

    vi = helper.make_tensor_value_info
    big = onnx.numpy_helper.from_array(np.asarray(1e3, np.float32), "big")
    g = helper.make_graph([helper.make_node("MaxPool", ["x"], ["p"], name="/pool/MaxPool", kernel_shape=[3, 3],
                                            strides=[2, 2], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["p"], ["r"], name="/relu/Relu"),
                           helper.make_node("Mul", ["r", "big"], ["y"], name="/scale/Mul")], "g",
                          [vi("x", onnx.TensorProto.FLOAT, [1, 2, 8, 8])], [vi("y", onnx.TensorProto.FLOAT, [1, 2, 4, 4])],
                          initializer=[big])
    p = _save(tmp_path, helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    x = {"x": np.full((1, 2, 8, 8), 100.0, np.float32)}
    Device(**FP32).replay(p, x, tmp_path / "fp32", progress=False)
    assert overflow_report(str(tmp_path / "fp32")).first is None
    Device(soc="Ascend910B").replay(p, x, tmp_path / "fp16", progress=False)      # force_fp16: 1e5 overflows
    assert overflow_report(str(tmp_path / "fp16")).first["name"] == "/scale/Mul"


def test_texts_name_onnx_and_onnxruntime(tmp_path, capsys):
    """Issue 45 item 8: replay --help named no .onnx, fusion-bisect said "float32 TensorFlow reference" of an
    ONNX model, and the dynamic-dims error ended in Python syntax."""
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    assert "(.onnx)" in capsys.readouterr().out
    path = _save(tmp_path, M.resnet_cnn())
    assert main(["fusion-bisect", str(path), "-q", "--shape", "x=1,3,16,16"]) == 0
    assert "vs the onnxruntime float32 reference" in capsys.readouterr().out
    from onnx import helper

    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [vi("x", onnx.TensorProto.FLOAT, [2, "H"])], [vi("y", onnx.TensorProto.FLOAT, [2, "H"])])
    dyn = _save(tmp_path, helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), "dyn.onnx")
    assert main(["replay", str(dyn), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "give them with --shape x=2,N" in err and "{" not in err, err
