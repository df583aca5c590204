"""Every registered op against TensorFlow's own kernel (tf.raw_ops) on the same inputs.

One case per op type, in one visible table; a test fails if an op in the registry has
no case here. In float32 compute the op must match TensorFlow to float32 rounding; in
float16 compute its output must be float16 and within the tolerance of the op's
documented model (NUMERICS.md) of TensorFlow's float32 result.
"""
import numpy as np
import pytest

from ascend_emu.ops import OPS, OpContext, run_op

from opdata import assert_float32_outputs, fp16_exact, i32  # tests/ is on the path (pyproject's pythonpath)

rng = np.random.default_rng(1234)
f = fp16_exact(rng)


X4 = f(2, 6, 6, 3)
X5 = f(2, 4, 5, 5, 3).round(1)    # rounded: ties in the 3D pool windows
# distinct fp16-exact values: MaxPool3DGrad's first tie (the TBE kernel) and TF's every tie agree only without ties
X5U = ((np.random.default_rng(5).permutation(600).reshape(2, 4, 5, 5, 3) - 256) / 64).astype(np.float32)
POOL3 = {"ksize": [1, 2, 3, 3, 1], "strides": [1, 2, 2, 2, 1], "padding": "SAME"}
# op type -> (inputs in TF argument order, attrs, options)
CASES = {
    "Const": None,  # host op: tested in test_const_and_placeholder
    # TensorList ops take and give TF variants: tested as sequences against TensorFlow in test_list_ops.py
    **{op: None for op in ("TensorListReserve", "EmptyTensorList", "TensorListFromTensor", "TensorListGetItem",
                           "TensorListSetItem", "TensorListPushBack", "TensorListPopBack", "TensorListLength", "TensorListStack",
                           "TensorListElementShape")},
    # CANN op types TensorFlow has no kernel for (the ONNX door's AveragePool with ceil_mode, LSTM, GRU): tested
    # bit for bit against oracles from CANN's kernels and against onnxruntime in tests/frontend/test_onnx_ai_core_more.py
    **{op: None for op in ("AvgPoolV2", "DynamicRNN", "DynamicGRUV2")},
    "Identity": ({"input": f(3, 4)}, {}, {}),
    "StopGradient": ({"input": f(3, 4)}, {}, {}),
    "Snapshot": ({"input": f(3, 4)}, {}, {}),
    "PreventGradient": ({"input": f(3, 4)}, {}, {}),
    "EnsureShape": ({"input": f(3, 4)}, {"shape": [3, 4]}, {}),
    "CheckNumerics": ({"tensor": f(3, 4)}, {"message": "x"}, {}),
    "IdentityN": ({"input": [f(2), f(3)]}, {}, {"list_input": True}),
    "Reshape": ({"tensor": f(2, 6), "shape": i32(3, -1)}, {}, {}),
    "Squeeze": ({"input": f(1, 3, 1)}, {"axis": [2]}, {"ours": {"squeeze_dims": [2]}}),
    "ExpandDims": ({"input": f(3, 4), "axis": i32(1)}, {}, {}),
    "Transpose": ({"x": f(2, 3, 4), "perm": i32(2, 0, 1)}, {}, {}),
    "ConcatV2": ({"values": [f(2, 3), f(2, 2)], "axis": np.int32(1)}, {}, {"list_input": True}),
    "Pack": ({"values": [f(2, 3), f(2, 3)]}, {"axis": 1}, {"list_input": True}),
    "Unpack": ({"value": f(3, 2)}, {"num": 3, "axis": 0}, {}),
    "Split": ({"axis": np.int32(1), "value": f(2, 6)}, {"num_split": 3}, {}),
    "SplitV": ({"value": f(2, 6), "size_splits": i32(1, -1, 2), "axis": np.int32(1)}, {"num_split": 3}, {}),
    "StridedSlice": ({"input": f(4, 5, 6), "begin": i32(1, 0, 0), "end": i32(3, 0, 5), "strides": i32(1, 1, 2)},
                     {"begin_mask": 2, "end_mask": 2, "shrink_axis_mask": 0}, {}),
    "Slice": ({"input": f(4, 5), "begin": i32(1, 2), "size": i32(2, -1)}, {}, {}),
    "Pad": ({"input": f(2, 3), "paddings": i32(1, 2, 0, 1).reshape(2, 2)}, {}, {}),
    "PadV2": ({"input": f(2, 3), "paddings": i32(1, 0, 0, 1).reshape(2, 2), "constant_values": np.float32(1.5)},
              {}, {}),
    "MirrorPad": ({"input": f(3, 4), "paddings": i32(1, 1, 2, 0).reshape(2, 2)}, {"mode": "REFLECT"}, {}),
    "ReverseV2": ({"tensor": f(2, 3, 4), "axis": i32(1, -1)}, {}, {}),
    "Tile": ({"input": f(2, 3), "multiples": i32(2, 1)}, {}, {}),
    "BroadcastTo": ({"input": f(1, 3), "shape": i32(4, 3)}, {}, {}),
    "GatherV2": ({"params": f(5, 3), "indices": i32(4, 0, 2), "axis": np.int32(0)}, {}, {}),
    "GatherNd": ({"params": f(5, 3), "indices": i32(4, 1, 0, 2, 2, 0).reshape(3, 2)}, {}, {}),
    "Shape": ({"input": f(2, 3, 4)}, {}, {}),
    "Size": ({"input": f(2, 3, 4)}, {}, {}),
    "Rank": ({"input": f(2, 3, 4)}, {}, {}),
    "Fill": ({"dims": i32(2, 3), "value": np.float32(0.75)}, {}, {}),
    "ZerosLike": ({"x": f(2, 3)}, {}, {}),
    "OnesLike": ({"x": f(2, 3)}, {}, {}),
    "Range": ({"start": np.int32(1), "limit": np.int32(9), "delta": np.int32(3)}, {}, {}),
    "Cast": ({"x": f(3, 4, hi=100)}, {"DstT": "int32"}, {"tf_attrs": {"DstT": "int32"}}),
    "AddV2": ({"x": f(3, 4), "y": f(4)}, {}, {}),
    "Add": ({"x": f(3, 4), "y": f(3, 4)}, {}, {}),
    "Sub": ({"x": f(3, 4), "y": f(3, 1)}, {}, {}),
    "Mul": ({"x": f(3, 4), "y": f(3, 4)}, {}, {}),
    "RealDiv": ({"x": f(3, 4), "y": f(3, 4, lo=0.5)}, {}, {}),
    "Div": ({"x": f(3, 4), "y": f(3, 4, lo=0.5)}, {}, {}),
    "Maximum": ({"x": f(3, 4), "y": f(3, 4)}, {}, {}),
    "Minimum": ({"x": f(3, 4), "y": f(3, 4)}, {}, {}),
    "SquaredDifference": ({"x": f(3, 4), "y": f(3, 4)}, {}, {}),
    "Pow": ({"x": f(3, 4, lo=0.1), "y": f(3, 4)}, {}, {}),
    "Neg": ({"x": f(3, 4)}, {}, {}),
    "Abs": ({"x": f(3, 4)}, {}, {}),
    "Square": ({"x": f(3, 4)}, {}, {}),
    "Sqrt": ({"x": f(3, 4, lo=0.01)}, {}, {}),
    "Rsqrt": ({"x": f(3, 4, lo=0.01)}, {}, {}),
    "Reciprocal": ({"x": f(3, 4, lo=0.1)}, {}, {}),
    "Inv": ({"x": f(3, 4, lo=0.1)}, {}, {}),
    "Exp": ({"x": f(3, 4)}, {}, {}),
    "Log": ({"x": f(3, 4, lo=0.01)}, {}, {}),
    "Tanh": ({"x": f(3, 4)}, {}, {}),
    "Sigmoid": ({"x": f(3, 4)}, {}, {}),
    "Relu": ({"features": f(3, 4)}, {}, {}),
    "Relu6": ({"features": f(3, 4, lo=-3, hi=9)}, {}, {}),
    "Erf": ({"x": f(3, 4)}, {}, {}),
    "Erfc": ({"x": f(3, 4)}, {}, {}),
    "Log1p": ({"x": f(3, 4, lo=-0.5)}, {}, {}),
    "Expm1": ({"x": f(3, 4)}, {}, {}),
    "LeakyRelu": ({"features": f(3, 4)}, {"alpha": 0.1}, {}),
    "Softplus": ({"features": f(3, 4)}, {}, {}),
    "Softsign": ({"features": f(3, 4)}, {}, {}),
    "FloorDiv": ({"x": i32(7, -7, 9), "y": i32(2, 2, -4)}, {}, {}),
    "SelectV2": ({"condition": f(3, 4) > 0, "t": f(3, 4), "e": f(3, 4)}, {}, {}),
    "Select": ({"condition": f(3, 4) > 0, "x": f(3, 4), "y": f(3, 4)}, {}, {}),
    "BiasAdd": ({"value": f(2, 3, 4), "bias": f(4)}, {}, {}),
    "AddN": ({"inputs": [f(3, 4), f(3, 4), f(3, 4)]}, {}, {"list_input": True}),
    "Equal": ({"x": f(3, 4), "y": f(3, 4).round()}, {}, {}),
    "NotEqual": ({"x": f(3, 4), "y": f(3, 4).round()}, {}, {}),
    "Less": ({"x": f(3, 4), "y": f(3, 4)}, {}, {}),
    "LessEqual": ({"x": f(3, 4), "y": f(3, 4)}, {}, {}),
    "Greater": ({"x": f(3, 4), "y": f(3, 4)}, {}, {}),
    "GreaterEqual": ({"x": f(3, 4), "y": f(3, 4)}, {}, {}),
    "LogicalAnd": ({"x": f(3, 4) > 0, "y": f(3, 4) > 0}, {}, {}),
    "LogicalOr": ({"x": f(3, 4) > 0, "y": f(3, 4) > 0}, {}, {}),
    "LogicalNot": ({"x": f(3, 4) > 0}, {}, {}),
    "Sum": ({"input": f(3, 4, 5), "axis": i32(1, 2)}, {"keep_dims": False}, {}),
    "Mean": ({"input": f(3, 4, 5), "axis": i32(-1)}, {"keep_dims": True}, {}),
    "Max": ({"input": f(3, 4, 5), "axis": i32(0)}, {"keep_dims": False}, {}),
    "Min": ({"input": f(3, 4, 5), "axis": i32(2)}, {"keep_dims": False}, {}),
    "Prod": ({"input": f(3, 4, 5, lo=0.5, hi=1.5), "axis": i32(1)}, {"keep_dims": False}, {}),
    "MatMul": ({"a": f(5, 7), "b": f(6, 7)}, {"transpose_a": False, "transpose_b": True}, {"cube": True}),
    "BatchMatMulV2": ({"x": f(2, 3, 5, 7), "y": f(3, 7, 4)}, {"adj_x": False, "adj_y": False}, {"cube": True}),
    "BatchMatMul": ({"x": f(3, 7, 5), "y": f(3, 7, 4)}, {"adj_x": True, "adj_y": False}, {"cube": True}),
    "BatchMatMulV3": ({"x": f(3, 5, 7), "y": f(3, 4, 7)}, {"adj_x": False, "adj_y": True, "Tout": "float32"},
                      {"cube": True, "tf_attrs": {"Tout": "float32"}}),
    "Einsum": ({"inputs": [f(2, 5, 3, 4), f(2, 6, 3, 4)]}, {"equation": "BTNH,BSNH->BNTS"},
               {"cube": True, "list_input": True}),
    "Conv2D": ({"input": X4, "filter": f(3, 3, 3, 5)},
               {"strides": [1, 2, 2, 1], "padding": "SAME", "dilations": [1, 1, 1, 1]}, {"cube": True}),
    "DepthwiseConv2dNative": ({"input": X4, "filter": f(3, 3, 3, 2)},
                              {"strides": [1, 1, 1, 1], "padding": "VALID", "dilations": [1, 1, 1, 1]},
                              {"cube": True}),
    "MaxPool": ({"input": X4}, {"ksize": [1, 3, 3, 1], "strides": [1, 2, 2, 1], "padding": "SAME"}, {}),
    "AvgPool": ({"value": X4}, {"ksize": [1, 3, 3, 1], "strides": [1, 2, 2, 1], "padding": "SAME"}, {}),
    "Softmax": ({"logits": f(3, 7, lo=-8, hi=8)}, {}, {}),
    "LogSoftmax": ({"logits": f(3, 7, lo=-8, hi=8)}, {}, {}),
    "FusedBatchNormV3": ({"x": X4, "scale": f(3, lo=0.5), "offset": f(3), "mean": f(3), "variance": f(3, lo=0.5)},
                         {"epsilon": 1e-3, "is_training": False}, {"n_out": 1}),
    "FusedBatchNormV2": ({"x": X4, "scale": f(3, lo=0.5), "offset": f(3), "mean": f(3), "variance": f(3, lo=0.5)},
                         {"epsilon": 1e-3, "is_training": False}, {"n_out": 1}),
    "FusedBatchNorm": ({"x": X4, "scale": f(3, lo=0.5), "offset": f(3), "mean": f(3), "variance": f(3, lo=0.5)},
                       {"epsilon": 1e-3, "is_training": False}, {"n_out": 1}),
    # issue 36's AI Core ops (their attribute variants and fp16 oracles: tests/ops/test_index_volume_ops.py)
    "TopKV2": ({"input": f(3, 9).round(1), "k": np.int32(4)}, {"sorted": True}, {}),
    "Cumsum": ({"x": f(3, 7), "axis": np.int32(1)}, {"exclusive": True, "reverse": True}, {}),
    "SegmentSum": ({"data": f(6, 3), "segment_ids": i32(0, 0, 2, 2, 2, 3)}, {}, {}),
    "ScatterNd": ({"indices": i32(1, 3, 1).reshape(3, 1), "updates": f(3, 4), "shape": i32(5, 4)}, {}, {}),
    "TensorScatterAdd": ({"tensor": f(5, 4), "indices": i32(1, 3, 1).reshape(3, 1), "updates": f(3, 4)}, {}, {}),
    "TensorScatterUpdate": ({"tensor": f(5, 4), "indices": i32(0, 2, 4, 1).reshape(2, 2), "updates": f(2)}, {}, {}),
    "ResizeBilinear": ({"images": X4, "size": i32(9, 4)}, {"align_corners": False, "half_pixel_centers": True}, {}),
    "ResizeNearestNeighbor": ({"images": X4, "size": i32(9, 4)},
                              {"align_corners": False, "half_pixel_centers": True}, {}),
    "ResizeBilinearGrad": ({"grads": f(2, 9, 4, 3), "original_image": X4},
                           {"align_corners": False, "half_pixel_centers": True}, {}),
    "ResizeNearestNeighborGrad": ({"grads": f(2, 9, 4, 3), "size": i32(6, 6)},
                                  {"align_corners": False, "half_pixel_centers": True}, {}),
    "Conv3D": ({"input": f(2, 4, 5, 5, 3), "filter": f(2, 3, 3, 3, 4)},
               {"strides": [1, 1, 2, 2, 1], "padding": "SAME", "dilations": [1, 1, 1, 1, 1]}, {"cube": True}),
    "Conv3DBackpropInputV2": ({"input_sizes": i32(2, 4, 5, 5, 3), "filter": f(2, 3, 3, 3, 4), "out_backprop": f(2, 4, 3, 3, 4)},
                              {"strides": [1, 1, 2, 2, 1], "padding": "SAME", "dilations": [1, 1, 1, 1, 1]},
                              {"cube": True}),
    "Conv3DBackpropFilterV2": ({"input": f(2, 4, 5, 5, 3), "filter_sizes": i32(2, 3, 3, 3, 4),
                                "out_backprop": f(2, 4, 3, 3, 4)},
                               {"strides": [1, 1, 2, 2, 1], "padding": "SAME", "dilations": [1, 1, 1, 1, 1]},
                               {"cube": True}),
    "MaxPool3DGrad": ({"orig_input": X5U, "orig_output": run_op("MaxPool3D", X5U, **POOL3)[0],
                       "grad": f(2, 2, 3, 3, 3)}, POOL3, {}),
    "AvgPool3DGrad": ({"orig_input_shape": i32(2, 4, 5, 5, 3), "grad": f(2, 2, 3, 3, 3)}, POOL3, {}),
    "MaxPool3D": ({"input": f(2, 4, 5, 5, 3)}, {"ksize": [1, 2, 3, 3, 1], "strides": [1, 2, 2, 2, 1], "padding": "SAME"},
                  {}),
    "AvgPool3D": ({"input": f(2, 4, 5, 5, 3)}, {"ksize": [1, 2, 3, 3, 1], "strides": [1, 2, 2, 2, 1], "padding": "SAME"},
                  {}),
    # issue 42 (the ops of LLM blocks). Sin over several periods (its range reduction); Cos within [-2, 2]: its TBE
    # Taylor series to x^14 is off by up to 4e-6 near |x'| = pi (NUMERICS.md section 2), beyond this test's rtol
    "Sin": ({"x": f(3, 4, lo=-8.0, hi=8.0)}, {}, {}),
    "Cos": ({"x": f(3, 4)}, {}, {}),
    "OneHot": ({"indices": i32(0, 2, 5, -1, 1, 3).reshape(2, 3), "depth": np.int32(4), "on_value": np.float32(1.5),
                "off_value": np.float32(-0.25)}, {"axis": 1}, {}),
    "MatrixBandPart": ({"input": f(2, 5, 6), "num_lower": np.int64(2), "num_upper": np.int64(0)}, {}, {}),
    "All": ({"input": np.array([[True, False, True], [True, True, True]]), "axis": i32(1)}, {"keep_dims": True}, {}),
    "Any": ({"input": np.array([[False, False, True], [False, False, False]]), "axis": i32(0, 1)}, {}, {}),
    "ArgMax": ({"input": f(3, 9).round(0), "dimension": np.int32(1)}, {}, {}),     # rounded: ties (first index)
    "ArgMin": ({"input": f(4, 3).round(0), "dimension": np.int32(0)}, {}, {}),
    "IsFinite": ({"x": np.float32([1.0, np.inf, -np.inf, np.nan, -0.0, 65504.0, 6.0e4, 1e-40])}, {}, {}),
}

# ops whose results are exact (no arithmetic rounding): must match TF bit for bit in both dtypes
EXACT = {"Identity", "StopGradient", "Snapshot", "PreventGradient", "EnsureShape", "CheckNumerics", "IdentityN",
         "Reshape", "Squeeze", "ExpandDims", "Transpose", "ConcatV2", "Pack", "Unpack", "Split", "SplitV",
         "StridedSlice", "Slice", "Pad", "PadV2", "MirrorPad", "ReverseV2", "Tile", "BroadcastTo", "GatherV2", "Shape", "Size",
         "Rank", "Fill", "ZerosLike", "OnesLike", "Range", "Cast", "FloorDiv", "Equal", "NotEqual", "Less",
         "LessEqual", "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr", "LogicalNot", "Maximum", "Minimum",
         "Neg", "Abs", "Relu", "Relu6", "MaxPool", "Max", "Min", "SelectV2", "Select",
         "TopKV2", "TensorScatterUpdate", "ResizeNearestNeighbor", "MaxPool3D",
         "OneHot", "MatrixBandPart", "All", "Any", "ArgMax", "ArgMin", "IsFinite"}


def _tf_ref(op, inputs, attrs, opts):
    import tensorflow as tf

    fn = getattr(tf.raw_ops, op)
    kw = {k: ([tf.constant(x) for x in v] if isinstance(v, list) else tf.constant(v)) for k, v in inputs.items()}
    a = dict(attrs)
    a.update(opts.get("tf_attrs", {}))
    if "DstT" in a:
        a["DstT"] = getattr(tf, a["DstT"])
    if "Tout" in a:
        a["Tout"] = getattr(tf, a["Tout"])
    out = fn(**kw, **a)
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [np.asarray(o) for o in outs]


def _ours(op, inputs, attrs, opts, dtype):
    args = []
    for v in inputs.values():
        args.extend(v if isinstance(v, list) else [v])
    args = [a.astype(dtype) if a.dtype == np.float32 and op not in ("Cast",) else a for a in args]
    kw = dict(opts.get("ours", attrs))
    if "tf_attrs" in opts:
        kw = {k: v for k, v in kw.items() if k != "Tout"}
    return run_op(op, *args, ctx=OpContext(dtype=dtype), **kw)


def test_every_registered_op_has_a_case():
    import pathlib

    # the ops of training graphs (ops/grad_ops.py, activation_grad_ops.py): their table is in test_grad_ops.py
    grad_tests = (pathlib.Path(__file__).parent / "test_grad_ops.py").read_text()
    missing = sorted(t for t in OPS if t not in CASES and not t.startswith("_") and f'"{t}":' not in grad_tests)
    assert not missing, f"ops without a test case in tests/ops/test_ops.py or test_grad_ops.py: {missing}"
    # the fused ops (private types) are checked against their formula's oracle in tests/npu/test_fusion.py
    # (and the training graphs' fused ops in tests/npu/test_fusion_training.py)
    npu = pathlib.Path(__file__).parents[1] / "npu"
    fusion_tests = (npu / "test_fusion.py").read_text() + (npu / "test_fusion_training.py").read_text()
    # the aclnn kernels of the torch path that no graph fusion makes have their oracle beside this file
    fusion_tests += (pathlib.Path(__file__).parent / "test_flash_attention.py").read_text()
    fusion_tests += (pathlib.Path(__file__).parent / "test_aclnn_ops.py").read_text()
    fusion_tests += (pathlib.Path(__file__).parent / "test_aclnn_grad_ops.py").read_text()
    untested = sorted(t for t in OPS if t.startswith("_") and f'"{t}"' not in fusion_tests)
    assert not untested, f"fused ops without an oracle in tests/npu/test_fusion(_training).py: {untested}"


@pytest.mark.parametrize("op", sorted(k for k, v in CASES.items() if v is not None))
def test_op_float32_matches_tensorflow(op):
    inputs, attrs, opts = CASES[op]
    ref = _tf_ref(op, inputs, attrs, opts)
    ours = _ours(op, inputs, attrs, opts, np.float32)
    # a cube op's float32 sums in TensorFlow's order (oneDNN's differs with the host's vector width: AVX2, AVX-512)
    # against the cube's: a sum that cancels to a small value differs by a few ulp of its terms, not of itself
    atol = 1e-6
    if opts.get("cube"):
        atol = max([atol] + [1e-6 * float(np.abs(r).max()) for r in ref if r.dtype == np.float32 and r.size])
    assert_float32_outputs(op, ours, ref, opts.get("n_out", len(ref)), op in EXACT,
                           rtol=2e-6 if not opts.get("cube") else 1e-5, atol=atol, bool_as_any=True)


@pytest.mark.parametrize("op", sorted(k for k, v in CASES.items()
                                      if v is not None and any(np.asarray(x).dtype == np.float32 for x in
                                                               (v[0].values() if not v[2].get("list_input") else
                                                                [y for z in v[0].values() for y in (z if isinstance(z, list) else [z])]))))
def test_op_float16_compute(op):
    """In fp16 the output is a real fp16 tensor, within fp16 rounding of TF's fp32 result."""
    inputs, attrs, opts = CASES[op]
    if op == "Cast":
        pytest.skip("Cast converts as asked")
    ref = _tf_ref(op, inputs, attrs, opts)
    ours = _ours(op, inputs, attrs, opts, np.float16)
    n = opts.get("n_out", len(ref))
    for o, r in zip(ours[:n], ref[:n]):
        assert o.shape == r.shape
        if r.dtype == np.float32:
            assert o.dtype == np.float16, (op, o.dtype)
            if op in EXACT:
                np.testing.assert_array_equal(o, r.astype(np.float16))
            else:
                # one fp16 rounding of the result (plus accumulation error for cube ops and reductions)
                # accumulations: the cube, reductions, and Cumsum (TBE rounds its fp16 running sum at every add)
                acc = opts.get("cube") or op in ("Sum", "Mean", "Prod", "AvgPool", "AddN", "Cumsum")
                tol = 2 ** -10 * (4 if acc else 1)
                np.testing.assert_allclose(o.astype(np.float32), r, rtol=tol, atol=tol)


def test_vector_unit_table_and_registry_agree():
    """Every elementwise op of the vector unit (numerics.vector's table, which names every kernel code of
    kernels/vector.py) is run by a registered op, and every op that says it runs one names a real one."""
    import importlib

    from ascend_emu.kernels import vector as kv

    nv = importlib.import_module("ascend_emu.numerics.vector")   # the package exports a function of that name

    runs = {d.eltwise for d in OPS.values() if d.eltwise is not None}
    assert runs <= set(nv.VECTOR_OPS), sorted(runs - set(nv.VECTOR_OPS))
    assert set(nv.VECTOR_OPS) <= runs, f"vector ops no registered op runs: {sorted(set(nv.VECTOR_OPS) - runs)}"
    # every kernel code is reachable from the table (gelu's tanh form through approximate=True)
    unary = set(range(kv.NEG, kv.FIRST_STEPPED))   # the unary codes are numbered densely
    assert unary - set(nv._UNARY.values()) == {kv.GELU_TANH}
    stepped = set(range(kv.FIRST_STEPPED, kv.RSQRT_F32 + 1))
    assert stepped == set(nv._STEPPED.values())
    assert set(nv._BINARY.values()) == set(range(kv.ADD, kv.POW + 1))
    # an op registered for a vector op takes that op's attributes
    for t, d in OPS.items():
        if d.eltwise in nv._ATTRS:
            assert set(nv._ATTRS[d.eltwise]) <= d.params | {"approximate"}, t


def test_softplus_has_one_implementation():
    """Under op_model="exact" the TF Softplus op is the vector unit's softplus in its high_precision model, bit
    for bit and status for status, over every fp16 and bf16 input, whatever impl_mode (NUMERICS.md section 2,
    composite ops); the kernel's steps (the default) are tests/ops/test_loss_kernels.py's."""
    import ml_dtypes

    from ascend_emu.numerics import vector

    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    for dtype, x in (("float16", bits.view(np.float16)), ("bfloat16", bits.view(ml_dtypes.bfloat16))):
        for impl in ("high_precision", "high_performance"):
            for ov, sub in (("inf_nan", "keep"), ("saturation", "flush")):
                ctx = OpContext(dtype=dtype, impl_mode=impl, overflow_mode=ov, subnormals=sub, op_model="exact")
                (got,) = run_op("Softplus", x, ctx=ctx)
                want, st = vector("softplus", x, dtype=dtype, impl_mode="high_precision", overflow_mode=ov,
                                  subnormals=sub)
                np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
                assert ctx.status == st == 0x20


def test_const_and_placeholder():
    v = f(2, 3)
    (out,) = run_op("Const", value=v)
    np.testing.assert_array_equal(out, v)


def test_unknown_op_lists_supported():
    from ascend_emu.errors import AscendEmuError

    with pytest.raises(AscendEmuError, match="supported: .*Conv2D"):
        run_op("NoSuchOp", f(2))


def test_float32_composite_results_obey_subnormal_flush():
    """Ops rounded once from float64 (Softmax here) flush float32 subnormal results under subnormals='flush'."""
    from ascend_emu.ops import OpContext, run_op

    x = np.array([[0.0, -100.0]], np.float32)  # softmax[1] = e^-100 ~ 3.7e-44, a float32 subnormal
    (keep,) = run_op("Softmax", x, ctx=OpContext(dtype="float32"))
    (flush,) = run_op("Softmax", x, ctx=OpContext(dtype="float32", subnormals="flush"))
    assert 0 < keep[0, 1] < np.finfo(np.float32).tiny
    assert flush[0, 1] == 0 and not np.signbit(flush[0, 1]) and flush[0, 0] == keep[0, 0]


# --------------------------------------------------------------------------- CANN's composite kernels

def _finish16(y32, dtype):
    import naive

    if dtype == np.float32:
        return y32
    bits, _ = naive.cast_bits(y32.astype(np.float32), "float16")
    return bits.view(np.float16)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("model", ["tbe_v100", "tbe_v220", "ascendc"])
def test_sourced_softmax_layernorm_batchnorm(model, dtype):
    """Softmax, the fused LayerNorm and inference BatchNorm follow CANN's kernels step by step (tests/naive.py),
    bit for bit, in both impl modes; the exact model stays available and differs from them."""
    import naive

    rng = np.random.default_rng(21)
    x = (rng.standard_normal((5, 7, 48)) * 6).astype(dtype)
    g, b = (rng.standard_normal(48) * 0.5 + 1).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    mean, var = rng.standard_normal(48).astype(np.float32), rng.uniform(0.1, 3, 48).astype(np.float32)
    fmt = "float16" if dtype == np.float16 else "float32"
    for impl in ("high_precision", "high_performance"):
        ctx = OpContext(dtype=dtype, op_model=model, impl_mode=impl)
        (sm,) = run_op("Softmax", x, ctx=ctx)
        want = _finish16(naive.softmax_steps(x, fmt, model, impl), dtype)
        np.testing.assert_array_equal(sm.view(np.uint16 if dtype == np.float16 else np.uint32),
                                      want.view(np.uint16 if dtype == np.float16 else np.uint32))
        for axis in ([-1], [1, 2]):
            (ln,) = run_op("_LayerNorm", x, g[None, None, :] if axis == [-1] else g, b, ctx=ctx, epsilon=1e-5,
                           axis=axis)
            want = _finish16(naive.layer_norm_steps(x, g, b, 1e-5, tuple(a % 3 for a in axis), model, impl), dtype)
            np.testing.assert_array_equal(ln, want)
        y = run_op("FusedBatchNormV3", x, g, b, mean, var, ctx=ctx, epsilon=1e-3)[0]
        np.testing.assert_array_equal(y, _finish16(naive.batch_norm_steps(x, g, b, mean, var, 1e-3, model), dtype))
    if dtype == np.float16:
        return   # one fp16 rounding hides most float32-step differences
    exact = OpContext(dtype=dtype, op_model="exact")
    assert not np.array_equal(run_op("Softmax", x, ctx=exact)[0], sm)
    assert not np.array_equal(run_op("FusedBatchNormV3", x, g, b, mean, var, ctx=exact, epsilon=1e-3)[0], y)


def test_fused_layer_norm_bf16_output_rounds_as_its_kernel():
    """The fused LayerNorm's bf16 output: the float32 steps (tests/naive.py) cast once, ties away from zero under
    the Ascend C model (LayerNormV4's CAST_ROUND, ASCEND-FACTS 13.4 item 2), to nearest even under the TBE models
    (``cast_to``); bit for bit on 2^17 outputs, of which some float32 results lie exactly halfway between two
    bf16 values, where the two roundings differ."""
    import ml_dtypes
    import naive

    rng = np.random.default_rng(42)
    x = (rng.standard_normal((2048, 64)) * 3).astype(ml_dtypes.bfloat16)
    g = (rng.standard_normal(64) * 0.5 + 1).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    ties = 0
    for model, rounding in (("ascendc", "round"), ("tbe_v220", "rint")):
        (y,) = run_op("_LayerNorm", x, g, b, ctx=OpContext(dtype="bfloat16", op_model=model), epsilon=1e-5, axis=[-1])
        y32 = naive.layer_norm_steps(x, g, b, 1e-5, (1,), model)
        want, _ = naive.cast_bits(y32, "bfloat16", rounding)
        np.testing.assert_array_equal(y.view(np.uint16), want)
        half = (y32.view(np.uint32) & 0xFFFF) == 0x8000
        ties = max(ties, int(half.sum()))
        if rounding == "round":
            assert not np.array_equal(want[half], naive.cast_bits(y32, "bfloat16", "rint")[0][half])
    assert ties > 0


def test_softmax_row_max_of_16bit_input_is_numpys():
    """Softmax takes a 16-bit row's maximum from the input's float32 widening (fast) instead of numpy's
    software fp16 max: same output bits and status, NaN payloads (propagated under inf_nan), infinities and
    rows of signed zeros included."""
    import ml_dtypes

    from ascend_emu.numerics.vector import cast
    from ascend_emu.ops import sourced
    from ascend_emu.ops.math_ops import vec

    def numpy_max_way(ctx, x):
        c32 = sourced._f32ctx(ctx)
        with np.errstate(invalid="ignore"):
            m = np.max(x, axis=-1, keepdims=True)
        wide = lambda v: cast(v, "float32")[0]  # noqa: E731
        d = vec(c32, "sub", wide(x), wide(m)) if ctx.op_model == "ascendc" else wide(vec(ctx, "sub", x, m))
        e = vec(c32, "exp", d)
        y = vec(c32, "realdiv", e, sourced._sum(c32, e, -1))
        ctx.record(c32.status)
        return sourced.finish(ctx, y)

    rng = np.random.default_rng(8)
    for dt, specials in ((np.float16, [0, 0x8000, 0x7E00, 0x7C01, 0xFE00, 0x7D55, 0x7C00, 0xFC00]),
                         (ml_dtypes.bfloat16, [0, 0x8000, 0x7FC0, 0x7F81, 0xFFC0, 0x7F80, 0xFF80])):
        x = (rng.standard_normal((6, 4, 33)) * 20).astype(dt)
        bits = x.view(np.uint16).reshape(-1)
        k = rng.choice(x.size // 2, 40, replace=False)
        bits[k] = rng.choice(specials, 40)
        x[5] = 0
        x[5, :, ::3] = -0.0
        for mode in ("inf_nan", "saturation"):
            for model in ("tbe_v100", "ascendc"):
                a = OpContext(dtype=np.dtype(dt).name, op_model=model, overflow_mode=mode)
                b = OpContext(dtype=np.dtype(dt).name, op_model=model, overflow_mode=mode)
                with np.errstate(all="ignore"):
                    got, want = sourced.softmax(a, x), numpy_max_way(b, x)
                np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
                assert a.status == b.status


def test_widen_every_16bit_pattern_is_numpys():
    """ops._util.widen takes fp16/bf16 through the cast kernel: numpy's float32 bits for every pattern, NaN
    payloads included, in any shape."""
    import ml_dtypes

    from ascend_emu.ops._util import widen

    bits = np.arange(65536, dtype=np.uint16).reshape(256, 256)
    for dt in (np.float16, ml_dtypes.bfloat16):
        x = bits.view(dt)
        with np.errstate(invalid="ignore"):
            want = np.array(x, dtype=np.float32)
        got = widen(OpContext(dtype="float32"), x)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dtype,paddings,value", [
    (np.float16, [[0, 0], [0, 1], [0, 1], [0, 0]], None),       # MobileNetV2's ZeroPadding2D before a stride-2 conv
    (np.float32, [[1, 2], [3, 0], [0, 0], [2, 2]], 1.5),
    (np.int32, [[0, 0], [2, 2], [1, 1], [0, 3]], -7),
    (np.float16, [[0, 0], [0, 0], [0, 0], [0, 0]], None)])
def test_pad_of_a_large_tensor_matches_tensorflow(dtype, paddings, value):
    """Large tensors take the copy into a reused buffer with only the borders written: the same as TF's Pad and
    numpy's pad, bit for bit, also when the buffer held other values before."""
    import tensorflow as tf

    from ascend_emu.kernels import alloc

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 30, 31, 40)) * 50).astype(dtype)
    assert x.size >= 1 << 16
    p = np.array(paddings, np.int32)
    shape = tuple(int(n + a + b) for n, (a, b) in zip(x.shape, paddings))
    alloc.empty(shape, dtype)[...] = 99    # a buffer the pad may reuse, full of another value
    attrs = {} if value is None else {"constant_values": np.array(value, dtype)}
    ours = run_op("Pad" if value is None else "PadV2", x, p, *attrs.values())[0]
    ref = (tf.raw_ops.Pad(input=x, paddings=p) if value is None else
           tf.raw_ops.PadV2(input=x, paddings=p, constant_values=attrs["constant_values"])).numpy()
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    assert np.array_equal(ours.view(np.uint8), ref.view(np.uint8))
    assert np.array_equal(ours, np.pad(x, paddings, constant_values=0 if value is None else value))


def test_llm_selection_ops_in_every_dtype():
    """Issue 42's selection ops are exact in fp16, bf16 and float32 (their float32 cases against tf.raw_ops are
    in CASES): OneHot (two axes, indices out of range) and MatrixBandPart (causal, sliding window, upper, full)
    bit for bit against element-by-element loops of TF's definitions; ArgMax / ArgMin take the first index among
    equal values (-0.0 equals +0.0), as TensorFlow's kernel and the ops-math golden (np.argmax) do, and the first
    NaN wins (the golden's rule; TensorFlow's CPU kernel skips NaN)."""
    import ml_dtypes

    rng = np.random.default_rng(5)
    idx = np.array([[0, 3, -1], [2, 7, 1]], np.int32)
    for dt in (np.float16, ml_dtypes.bfloat16, np.float32):
        ctx = OpContext(dtype=dt)
        on, off = np.asarray(1.5, dt), np.asarray(-0.25, dt)
        for axis in (-1, 0):
            (got,) = run_op("OneHot", idx, np.int32(4), on, off, ctx=ctx, axis=axis)
            want = np.full((2, 3, 4), off, dt)
            for i in range(2):
                for j in range(3):
                    if 0 <= idx[i, j] < 4:
                        want[i, j, idx[i, j]] = on
            want = want if axis == -1 else np.ascontiguousarray(np.moveaxis(want, -1, 0))
            assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8)), (dt, axis)
        x = rng.standard_normal((2, 6, 5)).astype(dt)
        for lo, up in ((-1, 0), (2, 0), (0, -1), (-1, -1), (0, 0)):
            (got,) = run_op("MatrixBandPart", x, np.int64(lo), np.int64(up), ctx=ctx)
            want = np.zeros_like(x)
            for m in range(6):
                for n in range(5):
                    if (lo < 0 or m - n <= lo) and (up < 0 or n - m <= up):
                        want[:, m, n] = x[:, m, n]
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (dt, lo, up)
        v = np.array([[1.0, 3.0, 3.0, -2.0], [-0.0, 0.0, -1.0, -1.0], [2.0, np.nan, 5.0, np.nan]]).astype(dt)
        np.testing.assert_array_equal(run_op("ArgMax", v, np.int32(1), ctx=ctx)[0], [1, 0, 1])
        (amin,) = run_op("ArgMin", v, np.int32(1), ctx=ctx, output_type="int32")
        assert amin.dtype == np.int32
        np.testing.assert_array_equal(amin, [3, 2, 1])


def test_is_finite_every_16bit_input():
    """IsFinite on all 65,536 fp16 and bf16 patterns: false exactly where the exponent field is all ones."""
    import ml_dtypes

    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    for dt, exp_mask in ((np.float16, 0x7C00), (ml_dtypes.bfloat16, 0x7F80)):
        (got,) = run_op("IsFinite", bits.view(dt), ctx=OpContext(dtype=dt))
        np.testing.assert_array_equal(got, (bits & exp_mask) != exp_mask)
