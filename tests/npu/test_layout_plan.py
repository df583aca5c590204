"""What a replay nobody watches plans once per graph (issue 46): the ONNX front end's transpose pairs cancelled around
elementwise ops (npu/layout.py), and the loaders' constants read-only so their casts are computed once
(numerics/memo.py). Each no-dump replay is compared bit for bit with the same replay keeping every tensor (no plan)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from ascend_emu import Device
from ascend_emu.frontend.onnx.loader import load_onnx
from ascend_emu.npu.layout import nhwc_plan
from ascend_emu.numerics.memo import frozen

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "frontend"))
import onnx_models as M  # noqa: E402

X = {"x": np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32) * 2}


def _transposes(res) -> set:
    return {r.name for r in res.records if r.tf_type == "Transpose"}


def _same(a, b) -> None:
    assert set(a.outputs) == set(b.outputs)
    for k in b.outputs:
        assert a.outputs[k].dtype == b.outputs[k].dtype and a.outputs[k].shape == b.outputs[k].shape
        assert a.outputs[k].tobytes() == b.outputs[k].tobytes(), k
    assert a.float_status.get() == b.float_status.get()


@pytest.mark.parametrize("device", [{"soc": "Ascend910B"}, {"precision_mode": "allow_mix_precision"},
                                    {"precision_mode": "must_keep_origin_dtype", "soc": "Ascend910B"}])
def test_no_dump_replay_cancels_transposes_with_the_same_bits(device):
    g = load_onnx(M.resnet_cnn())
    nodes = [(n.name, list(n.inputs)) for n in g.nodes]
    planned = Device(**device).replay(g, X, progress=False, keep_tensors=False)
    watched = Device(**device).replay(g, X, progress=False, keep_tensors=True)
    _same(planned, watched)
    # relu1 -> maxpool and relu6 -> dwconv lose their pairs (the Transpose to NCHW within the convolution that
    # TbeEltwiseFusionPass fused up to the Relu / Clip, and the reader's back to NHWC); the fused residual's sum, read
    # by the Sigmoid-Mul chain, has its Transpose to NCHW as a Transpose of its own; the pool's NCHW output, which the
    # residual reads, keeps its own
    assert _transposes(planned) == _transposes(watched) - {"pool1/to_nhwc", "dwconv/to_nhwc"} | {"residual"}
    assert [(n.name, list(n.inputs)) for n in g.nodes] == nodes      # the graph itself is not rewritten
    again = Device(**device).replay(g, X, progress=False, keep_tensors=False)   # (the plan from the cache)
    _same(again, watched)


def test_a_dump_sees_every_transpose(tmp_path):
    g = load_onnx(M.resnet_cnn())
    dumped = Device(soc="Ascend910B").replay(g, X, tmp_path / "d", progress=False, keep_tensors=False)
    watched = Device(soc="Ascend910B").replay(g, X, progress=False, keep_tensors=True)
    assert [r.name for r in dumped.records] == [r.name for r in watched.records]


def _conv_relu(output_relu: bool, mean_reader: bool):
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.linspace(-1, 1, 108).astype(np.float32))
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [4, 4, 1, 1], np.linspace(-1, 1, 16).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2")]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 16, 16])]
    if output_relu:
        outs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 4, 16, 16]))
    if mean_reader:
        nodes.append(helper.make_node("GlobalAveragePool", ["r"], ["m"], name="gap"))
        outs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 4, 1, 1]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])], outs,
                          [w, w2])
    return load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("output_relu,mean_reader,cancelled", [(False, False, 2), (True, False, 0), (False, True, 0)])
def test_a_region_read_in_nchw_keeps_its_transposes(output_relu, mean_reader, cancelled):
    g = _conv_relu(output_relu, mean_reader)
    plan = nhwc_plan(g.nodes, g.outputs)
    before = sum(n.op == "Transpose" for n in g.nodes)
    assert sum(n.op == "Transpose" for n in plan) == before - cancelled
    planned = Device(soc="Ascend910B").replay(g, X, progress=False, keep_tensors=False)
    _same(planned, Device(soc="Ascend910B").replay(g, X, progress=False, keep_tensors=True))
    if output_relu:
        assert planned.outputs["relu:0"].shape == (2, 4, 16, 16)     # the output stays NCHW


def test_loaded_constants_are_read_only():
    g = load_onnx(M.resnet_cnn())
    consts = [n.attrs["value"] for n in g.nodes if n.op == "Const"]
    assert consts and all(frozen(v) for v in consts)
    with pytest.raises(ValueError):
        consts[0][...] = 0


def _fire(axis: int):
    """Two convolutions' ReLUs concatenated along ``axis``, then a third convolution (SqueezeNet's Fire module)."""
    rng = np.random.default_rng(5)
    ws = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, s, rng.standard_normal(int(np.prod(s))).astype(np.float32))
          for i, s in enumerate([(4, 3, 1, 1), (4, 3, 3, 3), (2, 8 if axis == 1 else 4, 1, 1)])]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], name="e1"), helper.make_node("Relu", ["a"], ["ra"], name="r1"),
             helper.make_node("Conv", ["x", "w1"], ["b"], name="e3", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["b"], ["rb"], name="r3"),
             helper.make_node("Concat", ["ra", "rb"], ["c"], name="cat", axis=axis),
             helper.make_node("Conv", ["c", "w2"], ["y"], name="squeeze")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2, 16 * (3 - axis), 16])], ws)
    return load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("axis,cancelled", [(1, 3), (2, 0)])
def test_a_channel_concat_joins_two_regions(axis, cancelled):
    g = _fire(axis)
    before = sum(n.op == "Transpose" for n in g.nodes)
    # the two convolutions' transposes back to NCHW and the third's to NHWC; along H the concat stays NCHW
    assert sum(n.op == "Transpose" for n in nhwc_plan(g.nodes, g.outputs)) == before - cancelled
    _same(Device(soc="Ascend910B").replay(g, X, progress=False, keep_tensors=False),
          Device(soc="Ascend910B").replay(g, X, progress=False, keep_tensors=True))


@pytest.mark.parametrize("batch", [False, True])
def test_a_frozen_weights_transpose_is_made_once_with_the_same_bits(batch):
    import importlib

    cube = importlib.import_module("ascend_emu.numerics.cube")
    from ascend_emu.numerics.memo import freeze

    rng = np.random.default_rng(11)
    a = rng.standard_normal((2, 3, 40) if batch else (3, 40)).astype(np.float16)
    b = (rng.standard_normal((2, 24, 40) if batch else (24, 40)) * 0.2).astype(np.float16)
    fn = (lambda w: cube.batch_matmul(a, w, adj_y=True)) if batch else (lambda w: cube.matmul(a, w, transpose_b=True))
    want, st = fn(b.copy())
    w = freeze(b.copy())
    for _ in range(2):      # made, then from the memo
        got, st2 = fn(w)
        assert got.tobytes() == want.tobytes() and st2 == st
