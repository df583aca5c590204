"""What a new user hits with real ONNX exports (issue 45, items 1-9): float32-keeping modes on SoCs whose cube
lacks float32, --keep-dtype with ONNX names, the loader's own constants in overflow verdicts, and more.

Models are built with onnx.helper (tests/frontend/onnx_models.py) and checked against onnxruntime's own float32
run; each test runs in seconds.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest

from ascend_emu import Device
from ascend_emu.cli.main import main
from ascend_emu.frontend.tf.reference import reference

sys.path.insert(0, os.path.dirname(__file__))
import onnx_models as M  # noqa: E402

CNN_SHAPES = {"x": [2, 3, 16, 16]}


def _save(tmp_path, model, name="m.onnx"):
    p = tmp_path / name
    onnx.save(model, str(p))
    return p


def _ort(model, feeds):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("device", [
    {"precision_mode": "must_keep_origin_dtype"},                      # the default SoC, the 910
    {"soc": "Ascend310P3", "precision_mode_v2": "origin"},
], ids=["910_must_keep_origin_dtype", "310P3_origin"])
@pytest.mark.parametrize("build,shapes", [(M.resnet_cnn, CNN_SHAPES), (M.resize_einsum, None)],
                         ids=["conv_gemm", "convtranspose_einsum"])
def test_float32_cube_ops_of_onnx_models_run_on_onnxruntime(build, shapes, device):
    """Item 1: a float32 cube op on a cube without float32 goes to the AI CPU, which for an ONNX model is
    onnxruntime running the mapped op's ONNX form; the whole model then equals onnxruntime's float32 run."""
    model = build()
    rng = np.random.default_rng(0)
    shape = shapes["x"] if shapes else [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = rng.standard_normal(shape).astype(np.float32)
    res = Device(**device).replay(model, {"x": x}, shapes=shapes, progress=False)
    cube = [r for r in res.records if r.tf_type in ("Conv2D", "MatMul", "Conv2DBackpropInput", "Einsum")]
    assert cube and all(r.engine == "AICPU" and r.compute_dtype == "float32" for r in cube), cube
    want = _ort(model, {"x": x})[0]
    got = res.outputs[next(iter(res.outputs))]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_keep_dtype_conv2d_and_gemm_on_310p(tmp_path):
    """Item 2: the README's ATC example, --keep-dtype OpType::Conv2D and a Gemm's node name on the 310P."""
    keep = tmp_path / "keep.txt"
    keep.write_text("OpType::Conv2D\nfc\n")
    rng = np.random.default_rng(1)
    x = rng.standard_normal(CNN_SHAPES["x"]).astype(np.float32)
    res = Device(soc="Ascend310P3", keep_dtype=keep).replay(M.resnet_cnn(), {"x": x}, shapes=CNN_SHAPES,
                                                           progress=False)
    rec = {r.name: r for r in res.records}
    assert rec["conv1/Conv2D"].engine == "AICPU" and rec["conv1/Conv2D"].compute_dtype == "float32"
    assert rec["fc/MatMul"].engine == "AICPU" and rec["fc/MatMul"].compute_dtype == "float32"


@pytest.mark.parametrize("build,names", [
    (M.resnet_cnn, ["conv2", "bn1", "pool1"]),
    (M.resize_einsum, ["deconv"]),
], ids=["conv_bn_maxpool", "convtranspose"])
def test_keep_dtype_with_an_onnx_node_name_keeps_all_its_ops(tmp_path, build, names):
    """Item 3: an ONNX node's name keeps every plain op the node became (its Conv2D, BiasAdd, the pad and pool,
    the transposes), not only its transpose back to NCHW; on the 910B, whose cube has float32."""
    keep = tmp_path / "keep.txt"
    keep.write_text("\n".join(names) + "\n")
    model = build()
    shapes = CNN_SHAPES if build is M.resnet_cnn else None
    res = Device(soc="Ascend910B", keep_dtype=keep).replay(model, shapes=shapes, progress=False)
    base = Device(soc="Ascend910B").replay(model, shapes=shapes, progress=False)
    part = [r for r in res.records if r.engine == "AICORE" and r.tf_type not in ("Cast", "Const")
            and any(r.name == n or r.name.startswith(n + "/") for n in names)]
    assert {r.tf_type for r in part} >= ({"Transpose", "MaxPool", "PadV2"} if "pool1" in names else {"Transpose"})
    assert part and all(r.compute_dtype == "float32" for r in part), [(r.name, r.compute_dtype) for r in part]
    # the cube op of the named node (or the fused op that took it in: conv2's and bn1's, named after the Relu and
    # Clip their UB chains end in) computes in float32; without the list, fp16
    cube = [r for r in res.records if r.tf_type in ("Conv2D", "Conv2DBackpropInput", "_FusedConv2D")
            and (any(n in r.name for n in names) or set(names) & set((r.fusion or {}).get("owners", ())))]
    assert cube and all(r.compute_dtype == "float32" for r in cube)
    by_name = {r.name: r for r in base.records}
    assert all(by_name[r.name].compute_dtype == "float16" for r in cube)


def _pool_gemm(scale: float):
    """A padded MaxPool (the loader pads with a -inf constant) before a Gemm whose weights are ``scale``."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = (np.abs(rng.standard_normal((10, 3 * 4 * 4))) * scale).astype(np.float32)
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], name="/MaxPool", kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 0, 0]),
             helper.make_node("Flatten", ["p"], ["f"], name="/Flatten"),
             helper.make_node("Gemm", ["f", "w"], ["y"], name="/fc/Gemm", transB=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("scale,first", [(1.0, None), (2000.0, "/fc/Gemm")], ids=["no_overflow", "gemm"])
def test_loader_pad_constant_is_not_the_first_overflow(tmp_path, capsys, scale, first):
    """Item 4: the -inf MaxPool pad constant the loader makes is no overflow: with none, no first overflowing
    op (not an 'unknown' verdict); with a Gemm overflowing fp16, the Gemm is named, verdict abnormal."""
    from ascend_emu.analysis.overflow import overflow_report

    x = np.abs(np.random.default_rng(8).standard_normal((1, 3, 8, 8))).astype(np.float32) + 1
    Device().replay(_pool_gemm(scale), {"x": x}, tmp_path / "npu", progress=False)
    ov = overflow_report(tmp_path / "npu")
    assert (ov.first or {}).get("name") == first
    if first:
        assert ov.first["verdict"]["verdict"] == "abnormal"
    capsys.readouterr()
    main(["overflow", str(tmp_path / "npu")])
    out = capsys.readouterr().out
    assert "pad_value" not in out and "re-run" not in out and (first is None or first in out)


def _masked_attention(cancel: bool):
    """An HF-style additive attention mask holding float32's minimum (it overflows fp16 in its inserted Cast);
    with ``cancel``, then p + 30000 - 30000 on the softmax, whose fp16 cancellation makes an error larger than
    its inputs'."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    mask = np.zeros((1, 6), np.float32)
    mask[0, 4:] = np.finfo(np.float32).min
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"], name="/attn/MatMul"),
             helper.make_node("Mul", ["s", "scale"], ["ss"], name="/attn/Mul"),
             helper.make_node("Add", ["ss", "mask"], ["sm"], name="/attn/Add"),
             helper.make_node("Softmax", ["sm"], ["p"], name="/attn/Softmax", axis=-1),
             helper.make_node("MatMul", ["p" if not cancel else "pc", "v"], ["y"], name="/attn/MatMul_1")]
    inits = [numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w"),
             numpy_helper.from_array(mask, "mask"), numpy_helper.from_array(np.float32(0.5), "scale"),
             numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "v")]
    if cancel:
        inits.append(numpy_helper.from_array(np.float32(30000.0), "big"))
        inits.append(numpy_helper.from_array(np.asarray([2, 6], np.int64), "shape"))
        # (the Reshape keeps the Add and the Sub two ops: fused, the chain would run in float32)
        nodes[4:4] = [helper.make_node("Add", ["p", "big"], ["z"], name="/cancel/Add"),
                      helper.make_node("Reshape", ["z", "shape"], ["zr"], name="/cancel/Reshape"),
                      helper.make_node("Sub", ["zr", "big"], ["pc"], name="/cancel/Sub")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("cancel,exceeds", [(False, None), (True, "/cancel/Sub")], ids=["mask", "mask_cancel"])
def test_first_divergent_inserted_cast_is_drawn_and_explained(tmp_path, cancel, exceeds):
    """Item 5: the first divergent op is the mask's inserted Cast (float32 min overflows fp16). compare says its
    error is fp16's own rounding and names the first op whose error exceeds its inputs', its chain goes on
    through the Cast's readers (not "it is a model output"), and the report's graph draws and rings it."""
    from ascend_emu.analysis.compare import compare
    from ascend_emu.analysis.graph_view import graph_section

    path = _save(tmp_path, _masked_attention(cancel))
    ref = reference(path, None, tmp_path / "bench", progress=False)
    Device().replay(path, ref.inputs, tmp_path / "npu", progress=False)
    c = compare(tmp_path / "npu", tmp_path / "bench")
    fd = c.first_divergent()
    assert fd.name == "mask/ascend_cast_0_to_fp16"
    assert fd.rounding == "float16" and fd.exceeds == exceeds
    text = fd.format_text()
    assert "(it is a model output)" not in text and "/attn/Add" in fd.chain and fd.chain[-1] == "/attn/MatMul_1"
    assert "rounded to float16" in text and (exceeds or "no later op") in text
    html = graph_section(c)
    assert 'data-op="mask/ascend_cast_0_to_fp16"' in html
    at = html.index('data-op="mask/ascend_cast_0_to_fp16"')
    node = html[at - 200:at + 200]
    assert 'data-first="true"' in node


def test_small_things_a_new_onnx_user_reads(tmp_path, capsys, monkeypatch):
    """Item 8: replay --help names .onnx; the unknown-dims error is a command line (no Python dict syntax);
    fusion-bisect and mixlist-search on an ONNX model name onnxruntime as the float32 reference."""
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    assert ".onnx" in capsys.readouterr().out
    dyn = M.resnet_cnn()
    dyn.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    dyn_path = _save(tmp_path, dyn, "dyn.onnx")
    assert main(["-q", "replay", str(dyn_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--shape x=1,3,N,16" in err and "{" not in err and len(err.splitlines()) == 1, err
    small = _save(tmp_path, _pool_gemm(1.0), "small.onnx")
    monkeypatch.chdir(tmp_path)     # (mixlist-search writes ops_info.json here)
    assert main(["-q", "fusion-bisect", str(small), "--scheduler", "none"]) in (0, 1)
    out = capsys.readouterr().out
    assert "onnxruntime float32 reference" in out and "TensorFlow" not in out
    assert main(["-q", "mixlist-search", str(small), "--scheduler", "none"]) in (0, 1)
    out = capsys.readouterr().out
    assert "onnxruntime float32 reference" in out and "TensorFlow" not in out


def _ai_core_model():
    """Conv1d (padded, strided, with bias), Softmax over axis 1, IsNaN and ConstantOfShape feeding a Where."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array((rng.standard_normal((6, 4, 3)) * 0.4).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b1"),
             numpy_helper.from_array(np.asarray([2, 6, 5], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], name="/conv1d/Conv", pads=[1, 2], strides=[2]),
             helper.make_node("Softmax", ["c"], ["s"], name="/Softmax", axis=1),
             helper.make_node("IsNaN", ["s"], ["nan"], name="/IsNaN"),
             helper.make_node("ConstantOfShape", ["shape"], ["zeros"], name="/ConstantOfShape",
                              value=numpy_helper.from_array(np.asarray([0.25], np.float32))),
             helper.make_node("Where", ["nan", "zeros", "s"], ["y"], name="/Where")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 9])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def test_conv1d_softmax_axis_isnan_constantofshape_on_the_ai_core():
    """Item 6: ops a real NPU runs on the AI Core are mapped (none runs as itself on the AI CPU) and equal
    onnxruntime's float32 run in the fp32 mode; a NaN input reaches IsNaN through the conv (in inf_nan mode:
    saturation mode zeroes the cube's NaN, as the NPU does)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from fp32mode import fp32

    model = _ai_core_model()
    x = np.random.default_rng(12).standard_normal((2, 4, 9)).astype(np.float32)
    x[1, 2, 3] = np.nan
    res = Device(**fp32(overflow_mode="inf_nan")).replay(model, {"x": x}, progress=False)
    assert not [r.name for r in res.records if r.engine == "AICPU" or r.tf_type.startswith("Onnx")]
    types = {r.name: r.tf_type for r in res.records}
    assert "Conv2D" in str(types) and types["/IsNaN"] == "NotEqual", types
    want = _ort(model, {"x": x})[0]
    got = res.outputs["/Where:0"]
    assert (got == np.float32(0.25)).any()      # the NaN reached IsNaN and the ConstantOfShape's value
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def _dynamo_like(blocks: int = 40):
    """``blocks`` modules of 8 elementwise ops named as the dynamo exporter names them (node_Add_12, ...), each
    node carrying its module scope in ``pkg.torch.onnx.name_scopes``."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, k, x = [], 0, "x"
    for blk in range(blocks):
        for op in ("Add", "Mul", "Relu", "Sigmoid", "Mul", "Tanh", "Add", "Neg"):
            ins = [x, "c"] if op in ("Add", "Mul") else [x]
            out = f"t{k}"
            nd = helper.make_node(op, ins, [out], name=f"node_{op}_{k}")
            scopes = ["", f"layers.{blk}", f"layers.{blk}.act", f"{op.lower()}_{k}"]
            nd.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=repr(scopes))
            nodes.append(nd)
            x, k = out, k + 1
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, 3])],
                          [numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_report_folds_by_the_exporters_module_scopes_and_compare_shows_onnx_types(tmp_path):
    """Item 7: over 300 ops, the report's graph folds a dynamo export by its module scopes (layers.K), not by
    the node_<Type>_ prefix of its names. Item 8: compare rows of ONNX Conv/MaxPool/BatchNormalization nodes show
    their ONNX type, not the Transpose back to NCHW they end in."""
    from ascend_emu.analysis.compare import compare
    from ascend_emu.analysis.graph_view import graph_section

    path = _save(tmp_path, _dynamo_like())
    ref = reference(path, None, tmp_path / "bench", progress=False)
    # (fusion off: the UB fusion would chain the elementwise ops into a few)
    Device(fusion_switch="off").replay(path, ref.inputs, tmp_path / "npu", progress=False)
    html = graph_section(compare(tmp_path / "npu", tmp_path / "bench"))
    import re

    scopes = set(re.findall(r'class="group-node" data-scope="([^"]*)"', html))
    assert scopes and all(s.startswith("layers") for s in scopes), sorted(scopes)[:5]
    assert not any("node_" in s for s in scopes)

    cnn = _save(tmp_path, M.resnet_cnn(), "cnn.onnx")
    ref = reference(cnn, None, tmp_path / "bench2", shapes=CNN_SHAPES, progress=False)
    Device().replay(cnn, ref.inputs, tmp_path / "npu2", shapes=CNN_SHAPES, progress=False)
    types = {r["NPU Name"] or r["Bench Name"]: r["Op Type"]
             for r in compare(tmp_path / "npu2", tmp_path / "bench2").rows}
    assert (types["conv1:0"], types["dwconv:0"], types["pool1:0"], types["bn2:0"]) == (
        "Conv", "Conv", "MaxPool", "BatchNormalization"), types


@pytest.mark.parametrize("coords,scale,sizes", [
    ("half_pixel", 2.0, None), ("half_pixel", 0.5, None), ("align_corners", None, [7, 5]),
    ("asymmetric", 1.5, None)])
def test_linear_resize_runs_resize_bilinear(coords, scale, sizes):
    """Item 6: a bilinear Resize (torch's interpolate(mode="bilinear") exports) runs as ResizeBilinear on the AI
    Core and equals onnxruntime in the fp32 mode, for each coordinate mode ResizeBilinear takes."""
    from onnx import TensorProto, helper, numpy_helper

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from fp32mode import FP32

    inits = [numpy_helper.from_array(np.asarray([1, 1, scale, scale] if scale else [], np.float32), "scales")]
    ins = ["x", "", "scales"]
    if sizes:
        inits.append(numpy_helper.from_array(np.asarray([2, 3, *sizes], np.int64), "sizes"))
        ins = ["x", "", "", "sizes"]
    nd = helper.make_node("Resize", ins, ["y"], name="/up/Resize", mode="linear",
                          coordinate_transformation_mode=coords)
    g = helper.make_graph([nd], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, None, None])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    x = np.random.default_rng(13).standard_normal((2, 3, 6, 4)).astype(np.float32)
    res = Device(**FP32).replay(m, {"x": x}, progress=False)
    rec = {r.name: r for r in res.records}
    assert rec["/up/Resize/ResizeBilinear"].engine == "AICORE"
    want = _ort(m, {"x": x})[0]
    np.testing.assert_allclose(res.outputs["/up/Resize:0"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,k,s,pads", [((7, 9), 3, 2, [0, 0, 0, 0]), ((8, 8), 3, 2, [1, 1, 1, 1]),
                                             ((6, 5), 2, 2, [0, 1, 0, 0]), ((10, 7), 3, 3, [1, 0, 1, 1]),
                                             ((5, 5), 3, 3, [1, 1, 1, 1])])
def test_maxpool_ceil_mode_runs_on_the_ai_core(shape, k, s, pads):
    """Item 6: MaxPool with ceil_mode (torch's MaxPool2d(ceil_mode=True), as in SqueezeNet and GoogLeNet) is a
    -inf pad and a VALID MaxPool on the AI Core; equal to onnxruntime, the dropped last window included."""
    from onnx import TensorProto, helper

    nd = helper.make_node("MaxPool", ["x"], ["y"], name="/pool/MaxPool", kernel_shape=[k, k], strides=[s, s],
                          pads=pads, ceil_mode=1)
    g = helper.make_graph([nd], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, *shape])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, None, None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = np.random.default_rng(14).standard_normal((1, 2, *shape)).astype(np.float32)
    res = Device(soc="Ascend910B").replay(m, {"x": x}, progress=False)
    assert {r.tf_type for r in res.records if r.engine == "AICPU"} == set()
    want = _ort(m, {"x": x})[0]
    got = res.outputs["/pool/MaxPool:0"]
    assert got.shape == want.shape
    # max pooling selects one input, so fp16's result is the input's fp16 rounding
    np.testing.assert_array_equal(got, want.astype(np.float16).astype(got.dtype))


def test_gather_nd_runs_on_the_ai_core():
    """Item 6: ONNX GatherND (batch_dims 0; indices given at run time, negative ones too) is GatherNd on the AI
    Core, exact: equal to onnxruntime bit for bit in the fp32 mode."""
    from onnx import TensorProto, helper

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from fp32mode import FP32

    nd = helper.make_node("GatherND", ["x", "i"], ["y"], name="/GatherND")
    g = helper.make_graph([nd], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5]),
                                      helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    rng = np.random.default_rng(15)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    i = np.stack([rng.integers(-3, 3, (2, 3)), rng.integers(-4, 4, (2, 3))], -1).astype(np.int64)
    res = Device(**FP32).replay(m, {"x": x, "i": i}, progress=False)
    assert {r.name: (r.tf_type, r.engine) for r in res.records}["/GatherND"] == ("GatherNd", "AICORE")
    np.testing.assert_array_equal(res.outputs["/GatherND:0"], _ort(m, {"x": x, "i": i})[0])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_runs_on_the_ai_core(axis):
    """Item 6: ONNX GatherElements is GatherNd of its indices at ``axis`` and the positions' own coordinates,
    on the AI Core: equal to onnxruntime bit for bit (negative indices too)."""
    from onnx import TensorProto, helper

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from fp32mode import FP32

    nd = helper.make_node("GatherElements", ["x", "i"], ["y"], name="/GatherElements", axis=axis)
    g = helper.make_graph([nd], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5]),
                                      helper.make_tensor_value_info("i", TensorProto.INT32, [2, 4, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    rng = np.random.default_rng(16)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    n = x.shape[axis]
    i = rng.integers(-n, n, (2, 4, 3)).astype(np.int32)
    res = Device(**FP32).replay(m, {"x": x, "i": i}, progress=False)
    assert not [r.name for r in res.records if r.engine == "AICPU"]
    np.testing.assert_array_equal(res.outputs["/GatherElements:0"], _ort(m, {"x": x, "i": i})[0])
