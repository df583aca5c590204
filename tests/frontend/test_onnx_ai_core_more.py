"""Issue 45 item 6, the rest: ONNX ops a real NPU runs on the AI Core mapped onto the registry (GatherND with
batch_dims, nearest Resize by any factor in the modes ResizeNearestNeighbor takes, AveragePool with ceil_mode,
LSTM/GRU), each against onnxruntime's float32 run of a model built here with onnx.helper; seconds each.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ascend_emu import Device

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from fp32mode import FP32  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _ort(model, feeds):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _on_ai_core(res):
    return not [(r.name, r.tf_type) for r in res.records if r.engine == "AICPU" or r.tf_type.startswith("Onnx")]


@pytest.mark.parametrize("batch_dims,data,idx", [(1, (3, 4, 5), (3, 2, 1)), (1, (2, 4, 5, 3), (2, 3, 2)),
                                                  (2, (2, 3, 4, 5), (2, 3, 6, 1))])
def test_gather_nd_with_batch_dims_runs_on_the_ai_core(batch_dims, data, idx):
    """GatherND with batch_dims (transformer exports' per-batch gathers) is GatherNd of the index prefixed by
    the batch coordinates, on the AI Core: equal to onnxruntime bit for bit, negative indices too."""
    out = list(idx[:-1]) + list(data[batch_dims + idx[-1]:])
    m = _model([helper.make_node("GatherND", ["x", "i"], ["y"], name="/GatherND", batch_dims=batch_dims)],
               [("x", TensorProto.FLOAT, list(data)), ("i", TensorProto.INT64, list(idx))],
               [("y", TensorProto.FLOAT, out)])
    rng = np.random.default_rng(30)
    x = rng.standard_normal(data).astype(np.float32)
    dims = data[batch_dims:batch_dims + idx[-1]]
    i = np.stack([rng.integers(-d, d, idx[:-1]) for d in dims], -1).astype(np.int64)
    res = Device(**FP32).replay(m, {"x": x, "i": i}, progress=False)
    assert _on_ai_core(res)
    assert {r.name: r.tf_type for r in res.records}["/GatherND"] == "GatherNd"
    np.testing.assert_array_equal(res.outputs["/GatherND:0"], _ort(m, {"x": x, "i": i})[0])


@pytest.mark.parametrize("coords,rounding,shape,out", [
    ("asymmetric", "floor", (6, 9), (4, 6)),                 # torch's interpolate(mode="nearest") export
    ("asymmetric", "floor", (4, 6), (6, 9)),
    ("half_pixel", "round_prefer_ceil", (8, 6), (4, 3)),
    ("pytorch_half_pixel", "round_prefer_ceil", (5, 7), (3, 4)),
    ("tf_half_pixel_for_nn", "floor", (6, 4), (9, 10)),
    ("align_corners", "round_prefer_ceil", (5, 7), (9, 4)),
])
def test_nearest_resize_runs_resize_nearest_neighbor(coords, rounding, shape, out):
    """A nearest Resize by factors that are not whole numbers, in the coordinate/rounding modes whose source
    index is ResizeNearestNeighbor's, runs it on the AI Core: a copy, equal to onnxruntime bit for bit."""
    sizes = numpy_helper.from_array(np.asarray([1, 2, *out], np.int64), "sizes")
    m = _model([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="/up/Resize", mode="nearest",
                                 coordinate_transformation_mode=coords, nearest_mode=rounding)],
               [("x", TensorProto.FLOAT, [1, 2, *shape])], [("y", TensorProto.FLOAT, [1, 2, *out])], [sizes])
    x = np.random.default_rng(31).standard_normal((1, 2, *shape)).astype(np.float32)
    res = Device(**FP32).replay(m, {"x": x}, progress=False)
    assert _on_ai_core(res)
    assert {r.name: r.tf_type for r in res.records}["/up/Resize/ResizeNearestNeighbor"] == "ResizeNearestNeighbor"
    np.testing.assert_array_equal(res.outputs["/up/Resize:0"], _ort(m, {"x": x})[0])


def test_nearest_resize_in_other_modes_runs_on_the_ai_cpu():
    """half_pixel with ONNX's default round_prefer_floor picks the lower pixel at exact halves (TF's kernel the
    upper): it stays on the AI CPU and equals onnxruntime."""
    scales = numpy_helper.from_array(np.asarray([1, 1, 0.5, 0.5], np.float32), "scales")
    m = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], name="/down/Resize", mode="nearest")],
               [("x", TensorProto.FLOAT, [1, 2, 8, 6])], [("y", TensorProto.FLOAT, [1, 2, 4, 3])], [scales])
    x = np.random.default_rng(32).standard_normal((1, 2, 8, 6)).astype(np.float32)
    res = Device(**FP32).replay(m, {"x": x}, progress=False)
    assert [r.engine for r in res.records if r.name == "/down/Resize"] == ["AICPU"]
    np.testing.assert_array_equal(res.outputs["/down/Resize:0"], _ort(m, {"x": x})[0])


@pytest.mark.parametrize("shape,k,s,pads,include", [
    ((7, 9), 2, 2, [0, 0, 0, 0], 0),       # ResNet-D's AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False)
    ((7, 9), 2, 2, [0, 0, 0, 0], 1),       # the same with torch's default count_include_pad=True
    ((8, 6), 2, 2, [0, 0, 0, 0], 1),       # no extra row: VALID
    ((6, 6), 3, 2, [1, 1, 1, 1], 1),       # pads counted (zeros), the ceil's extra not
    ((5, 5), 3, 2, [1, 1, 1, 1], 0)])      # the pads and the extra left out: SAME
def test_average_pool_ceil_mode_runs_on_the_ai_core(shape, k, s, pads, include):
    """AveragePool with ceil_mode is TensorFlow's SAME AvgPool (after a zero Pad of the counted pads) where the
    uncounted padding is SAME's: on the AI Core, equal to onnxruntime in the fp32 mode (the registry's AvgPool
    rounds the exact mean once, onnxruntime sums in float32: within float32 rounding)."""
    m = _model([helper.make_node("AveragePool", ["x"], ["y"], name="/pool/AveragePool", kernel_shape=[k, k],
                                 strides=[s, s], pads=pads, ceil_mode=1, count_include_pad=include)],
               [("x", TensorProto.FLOAT, [1, 3, *shape])], [("y", TensorProto.FLOAT, [1, None, None, None])], opset=17)
    x = np.random.default_rng(33).standard_normal((1, 3, *shape)).astype(np.float32)
    res = Device(**FP32).replay(m, {"x": x}, progress=False)
    assert _on_ai_core(res)
    assert "AvgPool" in {r.tf_type for r in res.records}
    want = _ort(m, {"x": x})[0]
    got = res.outputs["/pool/AveragePool:0"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape,k,s,pads,include,ceil,v2", [
    ((7, 7), 3, 3, [0, 0, 0, 0], 0, 1, True),     # 2 extra rows at the end (SAME would put one in front)
    ((8, 8), 3, 2, [1, 1, 1, 1], 0, 1, True),     # pads and extra left out, not SAME's split
    ((6, 6), 3, 3, [1, 1, 0, 0], 1, 1, True),     # pads counted, 2 extra rows not: not SAME's split after them
    ((9, 6), 3, 2, [1, 0, 1, 2], 1, 1, False),    # pads counted (a zero Pad), then SAME's split: AvgPool
    ((8, 7), 3, 2, [1, 1, 0, 1], 0, 0, True)])    # no ceil: explicit pads left out of the count, not SAME's
def test_average_pool_other_padding_runs_avg_pool_v2(shape, k, s, pads, include, ceil, v2):
    """The AveragePools TensorFlow's AvgPool cannot express are CANN's AvgPoolV2 (explicit pads, ceil_mode,
    exclusive) on the AI Core: equal to onnxruntime in the fp32 mode (the exact mean rounded once against
    onnxruntime's float32 sum)."""
    m = _model([helper.make_node("AveragePool", ["x"], ["y"], name="/pool/AveragePool", kernel_shape=[k, k],
                                 strides=[s, s], pads=pads, ceil_mode=ceil, count_include_pad=include)],
               [("x", TensorProto.FLOAT, [1, 2, *shape])], [("y", TensorProto.FLOAT, [1, None, None, None])], opset=17)
    x = np.random.default_rng(34).standard_normal((1, 2, *shape)).astype(np.float32)
    res = Device(**FP32).replay(m, {"x": x}, progress=False)
    assert _on_ai_core(res)
    assert ("AvgPoolV2" in {r.tf_type for r in res.records}) == v2
    want = _ort(m, {"x": x})[0]
    got = res.outputs["/pool/AveragePool:0"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_avg_pool_v2_fp16_is_the_exact_mean_rounded_once():
    """AvgPoolV2 in fp16: each window's exact mean over the counted elements (written here from the definition:
    the window clipped to the input, or to the input and its explicit pads), rounded once to fp16."""
    from ascend_emu.ops.registry import OpContext, run_op

    rng = np.random.default_rng(35)
    x = (rng.standard_normal((1, 7, 6, 2)) * 50).astype(np.float16)
    for include in (False, True):
        (got,) = [run_op("AvgPoolV2", x, ctx=OpContext(dtype="float16"), ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1],
                         pads=[1, 0, 1, 1], ceil_mode=True, exclusive=not include)]
        got = got[0] if isinstance(got, tuple) else got
        xs = x.astype(np.float64)
        oh, ow = got.shape[1:3]
        for i in range(oh):
            for j in range(ow):
                r0, c0 = i * 2 - 1, j * 2 - 1
                lo_r, hi_r = (max(r0, -1), min(r0 + 3, 7)) if include else (max(r0, 0), min(r0 + 3, 7))
                lo_c, hi_c = (max(c0, -1), min(c0 + 3, 7)) if include else (max(c0, 0), min(c0 + 3, 6))
                cnt = (hi_r - lo_r) * (hi_c - lo_c)
                tot = xs[0, max(r0, 0):min(r0 + 3, 7), max(c0, 0):min(c0 + 3, 6)].sum(axis=(0, 1))
                np.testing.assert_array_equal(got[0, i, j], (tot / cnt).astype(np.float16))


def _lstm_model(direction="forward", T=5, B=3, n_in=4, H=6, init=False, seed=40):
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    inits = [numpy_helper.from_array((rng.standard_normal((D, 4 * H, n_in)) * 0.5).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((D, 4 * H, H)) * 0.5).astype(np.float32), "R"),
             numpy_helper.from_array((rng.standard_normal((D, 8 * H)) * 0.5).astype(np.float32), "B")]
    ins = ["x", "W", "R", "B"]
    graph_in = [("x", TensorProto.FLOAT, [T, B, n_in])]
    if init:
        ins += ["", "h0", "c0"]
        graph_in += [("h0", TensorProto.FLOAT, [D, B, H]), ("c0", TensorProto.FLOAT, [D, B, H])]
    nd = helper.make_node("LSTM", ins, ["Y", "Y_h", "Y_c"], name="/lstm/LSTM", hidden_size=H, direction=direction)
    return _model([nd], graph_in, [("Y", TensorProto.FLOAT, [T, D, B, H]), ("Y_h", TensorProto.FLOAT, [D, B, H]),
                                   ("Y_c", TensorProto.FLOAT, [D, B, H])], inits, opset=14)


@pytest.mark.parametrize("direction,init", [("forward", False), ("reverse", True), ("bidirectional", True)])
def test_lstm_runs_as_dynamic_rnn(direction, init):
    """ONNX LSTM (torch.nn.LSTM's export) is CANN's DynamicRNN on the AI Core, one per direction: equal to
    onnxruntime in the fp32 mode (float32 gates; the TBE sigmoid/tanh forms against onnxruntime's: within a few
    float32 ulps); Y, Y_h and Y_c all."""
    m = _lstm_model(direction, init=init)
    D = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(41)
    feeds = {"x": rng.standard_normal((5, 3, 4)).astype(np.float32)}
    if init:
        feeds |= {"h0": rng.standard_normal((D, 3, 6)).astype(np.float32) * 0.5,
                  "c0": rng.standard_normal((D, 3, 6)).astype(np.float32) * 0.5}
    res = Device(**FP32).replay(m, feeds, progress=False)
    assert _on_ai_core(res)
    assert [r.engine for r in res.records if r.tf_type == "DynamicRNN"] == ["AICORE"] * D
    for k, want in enumerate(_ort(m, feeds)):
        np.testing.assert_allclose(res.outputs[f"/lstm/LSTM:{k}"], want, rtol=1e-5, atol=2e-6)


def _dynamic_rnn_oracle(x, W, R, Bias, model, impl_mode):
    """DynamicRNN's steps in fp16 (canndev tbe/impl/dynamic_rnn.py, dynamic_rnn_core, fp16 bias), written from
    the kernel's description with the tests' own oracles: the cube (naive_cube.matmul: fp16 operands, float32
    accumulation), the float32 bias add, the TBE float32 sigmoid and tanh (naive.steps32), each gate and tanh(c)
    through fp16 (the kernel's gate outputs, always written and read back), c = c f + j i in float32 stored in fp16,
    h = tanh(c) o stored in fp16."""
    import naive
    import naive_cube

    H = R.shape[-1]
    order = [0, 3, 2, 1]                    # ONNX i, o, f, c -> i, j, f, o
    blk = lambda m: np.concatenate([m[k * H:(k + 1) * H] for k in order])  # noqa: E731
    w = np.concatenate([blk(W[0]).T, blk(R[0]).T]).astype(np.float16)
    bias = blk(Bias[0, :4 * H] + Bias[0, 4 * H:]).astype(np.float16).astype(np.float32)
    T, B, _ = x.shape
    h = np.zeros((B, H), np.float16)
    c = np.zeros((B, H), np.float32)
    ys = []
    f32 = np.float32
    for t in range(T):
        g, _ = naive_cube.matmul(np.concatenate([x[t].astype(np.float16), h], 1), w, operand_dtype="float16",
                                 out_dtype="float32", model=model)
        g = (g.astype(f32) + bias).astype(f32)
        gi, gj, gf, go = np.split(g, 4, axis=1)
        sig = lambda v: naive.steps32("sigmoid", v, impl_mode=impl_mode)[0]  # noqa: E731
        tanh = lambda v: naive.steps32("tanh_tbe", v, impl_mode=impl_mode)[0]  # noqa: E731
        # the gates and tanh(c) go through the kernel's fp16 gate outputs (is_gate_output = True)
        i, j, f, o = (v.astype(np.float16).astype(f32) for v in (sig(gi), tanh(gj), sig(gf), sig(go)))
        c = (c * f + j * i).astype(f32).astype(np.float16).astype(f32)
        h = (tanh(c).astype(np.float16).astype(f32) * o).astype(f32).astype(np.float16)
        ys.append(h)
    return np.stack(ys), h, c.astype(np.float16)


def test_lstm_fp16_is_dynamic_rnn_bit_for_bit():
    """In fp16 (force_fp16, the 910B) the LSTM's DynamicRNN equals the kernel's steps written independently, bit
    for bit: Y, Y_h and Y_c."""
    m = _lstm_model("forward", T=4, B=2, n_in=5, H=4, seed=42)
    W, R, Bias = (numpy_helper.to_array(t) for t in m.graph.initializer)
    x = np.random.default_rng(43).standard_normal((4, 2, 5)).astype(np.float32)
    dev = Device(soc="Ascend910B")
    res = dev.replay(m, {"x": x}, progress=False)
    assert [(r.engine, r.compute_dtype) for r in res.records if r.tf_type == "DynamicRNN"] == [("AICORE", "float16")]
    y, h, c = _dynamic_rnn_oracle(x, W, R, Bias, dev.numerics.cube_model, dev.impl_mode)
    got = [res.outputs[f"/lstm/LSTM:{k}"] for k in range(3)]
    np.testing.assert_array_equal(got[0], y[:, None])
    np.testing.assert_array_equal(got[1], h[None])
    np.testing.assert_array_equal(got[2], c[None])


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_float32_lstm_on_the_910_runs_on_onnxruntime(direction):
    """A float32 DynamicRNN under must_keep_origin_dtype on the 910 (a cube without float32) goes to the AI CPU,
    which for an ONNX model is onnxruntime running its ONNX form (an LSTM): the model equals onnxruntime."""
    m = _lstm_model(direction, init=True, seed=44)
    D = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(45)
    feeds = {"x": rng.standard_normal((5, 3, 4)).astype(np.float32),
             "h0": rng.standard_normal((D, 3, 6)).astype(np.float32),
             "c0": rng.standard_normal((D, 3, 6)).astype(np.float32)}
    res = Device(precision_mode="must_keep_origin_dtype").replay(m, feeds, progress=False)
    assert [(r.engine, r.compute_dtype) for r in res.records if r.tf_type == "DynamicRNN"] == [("AICPU", "float32")] * D
    for k, want in enumerate(_ort(m, feeds)):
        np.testing.assert_allclose(res.outputs[f"/lstm/LSTM:{k}"], want, rtol=1e-6, atol=1e-7)


def _gru_model(T=5, B=3, n_in=4, H=6, init=False, linear_before_reset=1, seed=50, direction="forward"):
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    inits = [numpy_helper.from_array((rng.standard_normal((D, 3 * H, n_in)) * 0.5).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((D, 3 * H, H)) * 0.5).astype(np.float32), "R"),
             numpy_helper.from_array((rng.standard_normal((D, 6 * H)) * 0.5).astype(np.float32), "B")]
    ins, graph_in = ["x", "W", "R", "B"], [("x", TensorProto.FLOAT, [T, B, n_in])]
    if init:
        ins += ["", "h0"]
        graph_in.append(("h0", TensorProto.FLOAT, [D, B, H]))
    nd = helper.make_node("GRU", ins, ["Y", "Y_h"], name="/gru/GRU", hidden_size=H,
                          linear_before_reset=linear_before_reset, direction=direction)
    return _model([nd], graph_in, [("Y", TensorProto.FLOAT, [T, D, B, H]), ("Y_h", TensorProto.FLOAT, [D, B, H])],
                  inits, opset=14)


@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_reverse_and_bidirectional_gru_run_dynamic_gru_v2(direction):
    """A reverse GRU is DynamicGRUV2 over the sequence reversed in time (ReverseV2 in and out), a bidirectional one
    both: on the AI Core, equal to onnxruntime in the fp32 mode."""
    m = _gru_model(init=True, direction=direction, seed=54)
    D = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(55)
    feeds = {"x": rng.standard_normal((5, 3, 4)).astype(np.float32),
             "h0": rng.standard_normal((D, 3, 6)).astype(np.float32)}
    res = Device(**FP32).replay(m, feeds, progress=False)
    assert _on_ai_core(res) and len([r for r in res.records if r.tf_type == "DynamicGRUV2"]) == D
    for k, want in enumerate(_ort(m, feeds)):
        np.testing.assert_allclose(res.outputs[f"/gru/GRU:{k}"], want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("init", [False, True])
def test_gru_runs_as_dynamic_gru_v2(init):
    """ONNX GRU with linear_before_reset (torch.nn.GRU's export) is CANN's DynamicGRUV2 on the AI Core: equal to
    onnxruntime in the fp32 mode; on the 910 in must_keep_origin_dtype (no float32 cube) its ONNX form runs on
    onnxruntime; ONNX's default linear_before_reset 0 stays on the AI CPU."""
    m = _gru_model(init=init)
    rng = np.random.default_rng(51)
    feeds = {"x": rng.standard_normal((5, 3, 4)).astype(np.float32)}
    if init:
        feeds["h0"] = rng.standard_normal((1, 3, 6)).astype(np.float32)
    want = _ort(m, feeds)
    res = Device(**FP32).replay(m, feeds, progress=False)
    assert _on_ai_core(res) and [r.tf_type for r in res.records if r.tf_type == "DynamicGRUV2"]
    for k in range(2):
        np.testing.assert_allclose(res.outputs[f"/gru/GRU:{k}"], want[k], rtol=1e-5, atol=2e-6)
    res = Device(precision_mode="must_keep_origin_dtype").replay(m, feeds, progress=False)
    assert [r.engine for r in res.records if r.tf_type == "DynamicGRUV2"] == ["AICPU"]
    for k in range(2):
        np.testing.assert_allclose(res.outputs[f"/gru/GRU:{k}"], want[k], rtol=1e-6, atol=1e-7)
    m0 = _gru_model(init=init, linear_before_reset=0)
    res = Device(**FP32).replay(m0, feeds, progress=False)
    assert [r.engine for r in res.records if r.name == "/gru/GRU"] == ["AICPU"]


def test_gru_fp16_is_dynamic_gru_v2_bit_for_bit():
    """In fp16 (force_fp16, the 910B) the GRU's DynamicGRUV2 equals the kernel's steps written independently
    (canndev tbe/impl/dynamic_gru_v2.py, fp16 biases): two cube products (naive_cube.matmul), float32 bias adds,
    the TBE float32 sigmoid/tanh (naive.steps32), r, z, n, h = (h - n) z + n in float32, h stored in fp16."""
    import naive
    import naive_cube

    m = _gru_model(T=4, B=2, n_in=5, H=4, seed=52)
    W, R, Bias = (numpy_helper.to_array(t) for t in m.graph.initializer)
    x = np.random.default_rng(53).standard_normal((4, 2, 5)).astype(np.float32)
    dev = Device(soc="Ascend910B")
    res = dev.replay(m, {"x": x}, progress=False)
    assert [(r.engine, r.compute_dtype) for r in res.records if r.tf_type == "DynamicGRUV2"] == [("AICORE", "float16")]
    f32, H = np.float32, 4
    sig = lambda v: naive.steps32("sigmoid", v, impl_mode=dev.impl_mode)[0]  # noqa: E731
    tanh = lambda v: naive.steps32("tanh_tbe", v, impl_mode=dev.impl_mode)[0]  # noqa: E731
    bi = Bias[0, :3 * H].astype(np.float16).astype(f32)
    bh = Bias[0, 3 * H:].astype(np.float16).astype(f32)
    h = np.zeros((2, H), np.float16)
    hf = np.zeros((2, H), f32)
    ys = []
    for t in range(4):
        gx = naive_cube.matmul(x[t].astype(np.float16), W[0].T.astype(np.float16), out_dtype="float32",
                               model=dev.numerics.cube_model)[0].astype(f32) + bi
        gh = naive_cube.matmul(h, R[0].T.astype(np.float16), out_dtype="float32",
                               model=dev.numerics.cube_model)[0].astype(f32) + bh
        (xz, xr, xn), (hz, hr, hn) = np.split(gx.astype(f32), 3, 1), np.split(gh.astype(f32), 3, 1)
        r, z = sig((xr + hr).astype(f32)), sig((xz + hz).astype(f32))
        n = tanh((xn + (r * hn).astype(f32)).astype(f32))
        h = ((((hf - n).astype(f32) * z).astype(f32) + n).astype(f32)).astype(np.float16)
        hf = h.astype(f32)
        ys.append(h)
    np.testing.assert_array_equal(res.outputs["/gru/GRU:0"], np.stack(ys)[:, None])
    np.testing.assert_array_equal(res.outputs["/gru/GRU:1"], h[None])


@pytest.mark.parametrize("kind,cell,bidirectional", [("LSTM", "DynamicRNN", False), ("GRU", "DynamicGRUV2", False),
                                                      ("LSTM", "DynamicRNN", True), ("GRU", "DynamicGRUV2", True)])
def test_torch_rnn_exports_run_their_cell_ops(tmp_path, kind, cell, bidirectional):
    """A real torch.onnx.export (TorchScript, opset 17) of a 2-layer batch_first torch.nn.LSTM / GRU (one way and
    bidirectional) and a Linear: every layer and direction is its CANN cell op on the AI Core, and the fp32 mode
    equals torch's own float32 run."""
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, kind)(4, 6, batch_first=True, num_layers=2, bidirectional=bidirectional)
            self.fc = torch.nn.Linear(12 if bidirectional else 6, 3)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.fc(y[:, -1])

    torch.manual_seed(0)
    net, x = Net().eval(), torch.randn(2, 5, 4)
    path = tmp_path / f"{kind}.onnx"
    torch.onnx.export(net, (x,), str(path), dynamo=False, opset_version=17)
    res = Device(**FP32).replay(path, {"input": x.numpy()}, progress=False)
    assert _on_ai_core(res)
    assert [r.tf_type for r in res.records if r.tf_type == cell] == [cell] * (4 if bidirectional else 2)
    with torch.no_grad():
        want = net(x).numpy()
    np.testing.assert_allclose(next(iter(res.outputs.values())), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("out", [(12, 10), (9, 1)])
def test_linear_resize_pytorch_half_pixel(out):
    """Older torch exports name half_pixel pytorch_half_pixel: a bilinear Resize in it runs as ResizeBilinear on
    the AI Core (equal to onnxruntime in the fp32 mode), except to an output length of 1 (source coordinate 0 there,
    not half_pixel's), which stays on the AI CPU."""
    sizes = numpy_helper.from_array(np.asarray([1, 2, *out], np.int64), "sizes")
    m = _model([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="/up/Resize", mode="linear",
                                 coordinate_transformation_mode="pytorch_half_pixel")],
               [("x", TensorProto.FLOAT, [1, 2, 6, 5])], [("y", TensorProto.FLOAT, [1, 2, *out])], [sizes])
    x = np.random.default_rng(60).standard_normal((1, 2, 6, 5)).astype(np.float32)
    res = Device(**FP32).replay(m, {"x": x}, progress=False)
    engines = {r.name: r.engine for r in res.records}
    assert (engines.get("/up/Resize/ResizeBilinear") == "AICORE") == (min(out) > 1), engines
    np.testing.assert_allclose(res.outputs["/up/Resize:0"], _ort(m, {"x": x})[0], rtol=1e-5, atol=1e-6)
