"""The ops of training graphs (ascend_emu/ops/grad_ops.py, activation_grad_ops.py) against TensorFlow's own kernels.

Same contract as tests/ops/test_ops.py: one case per op type in one visible table; in float32
compute the op matches tf.raw_ops to float32 rounding (the documented tolerance per family
below); in float16 compute its float outputs are real fp16 tensors within the op's model of
TF's float32 result. Behaviour checks follow: fp16 operands and fp32 accumulation of the
backprop convolutions, the batch-norm statistics of BNTrainingReduce/Update, the status bits.
"""
import numpy as np
import pytest

from ascend_emu.ops import OPS, OpContext, run_op

from opdata import assert_float32_outputs, fp16_exact, i32  # tests/ is on the path (pyproject's pythonpath)

rng = np.random.default_rng(4321)
f = fp16_exact(rng)


X = f(2, 7, 7, 3)
CONV = {"strides": [1, 2, 2, 1], "padding": "SAME", "dilations": [1, 1, 1, 1]}
CONV_V = {"strides": [1, 1, 1, 1], "padding": "VALID", "dilations": [1, 2, 2, 1]}
POOL = {"ksize": [1, 3, 3, 1], "strides": [1, 2, 2, 1], "padding": "SAME"}


def _maxpool(x, **kw):
    import tensorflow as tf

    return np.asarray(tf.raw_ops.MaxPool(input=x, **kw))


Y4 = f(2, 6, 6, 4, lo=0.05, hi=0.95)        # outputs of sigmoid-like functions
# op type -> (inputs in TF argument order, attrs, options)
CASES = {
    "Conv2DBackpropInput": ({"input_sizes": i32(2, 7, 7, 3), "filter": f(3, 3, 3, 5), "out_backprop": f(2, 4, 4, 5)},
                            CONV, {"cube": True}),
    "Conv2DBackpropFilter": ({"input": X, "filter_sizes": i32(3, 3, 3, 5), "out_backprop": f(2, 4, 4, 5)},
                             CONV, {"cube": True}),
    "DepthwiseConv2dNativeBackpropInput": ({"input_sizes": i32(2, 7, 7, 3), "filter": f(3, 3, 3, 2),
                                            "out_backprop": f(2, 4, 4, 6)}, CONV, {"cube": True}),
    "DepthwiseConv2dNativeBackpropFilter": ({"input": X, "filter_sizes": i32(3, 3, 3, 2),
                                             "out_backprop": f(2, 4, 4, 6)}, CONV, {"cube": True}),
    "ReluGrad": ({"gradients": f(3, 5), "features": f(3, 5)}, {}, {}),
    "Relu6Grad": ({"gradients": f(3, 5), "features": f(3, 5, lo=-3, hi=9)}, {}, {}),
    "LeakyReluGrad": ({"gradients": f(3, 5), "features": f(3, 5)}, {"alpha": 0.1}, {}),
    "EluGrad": ({"gradients": f(3, 5), "outputs": f(3, 5, lo=-0.9, hi=2)}, {}, {}),
    "SeluGrad": ({"gradients": f(3, 5), "outputs": f(3, 5, lo=-1.7, hi=2)}, {}, {}),
    "SigmoidGrad": ({"y": f(3, 5, lo=0.01, hi=0.99), "dy": f(3, 5)}, {}, {}),
    "TanhGrad": ({"y": f(3, 5, lo=-0.99, hi=0.99), "dy": f(3, 5)}, {}, {}),
    "RsqrtGrad": ({"y": f(3, 5, lo=0.1, hi=3), "dy": f(3, 5)}, {}, {}),
    "SqrtGrad": ({"y": f(3, 5, lo=0.1, hi=3), "dy": f(3, 5)}, {}, {}),
    "ReciprocalGrad": ({"y": f(3, 5, lo=0.1, hi=3), "dy": f(3, 5)}, {}, {}),
    "InvGrad": ({"y": f(3, 5, lo=0.1, hi=3), "dy": f(3, 5)}, {}, {}),
    "SoftplusGrad": ({"gradients": f(3, 5), "features": f(3, 5, lo=-6, hi=6)}, {}, {}),
    "Elu": ({"features": f(3, 5, lo=-4, hi=4)}, {}, {}),
    "Selu": ({"features": f(3, 5, lo=-4, hi=4)}, {}, {}),
    "Sign": ({"x": np.concatenate([f(8), np.float32([0, -0.0])])}, {}, {}),
    "DivNoNan": ({"x": f(3, 5), "y": f(3, 5, lo=0.25) * (rng.random((3, 5)) > 0.3)}, {}, {}),
    # finite x: the 910B's TBE MulNoNan is a plain vmul (Inf * 0 = NaN, test_grad_kernels.py), not TF's rule
    "MulNoNan": ({"x": f(3, 5), "y": f(3, 5) * (rng.random((3, 5)) > 0.3)}, {}, {}),
    "FloorMod": ({"x": i32(7, -7, 9, -9), "y": i32(2, 2, -4, -4)}, {}, {}),
    "BiasAddGrad": ({"out_backprop": f(2, 5, 5, 4)}, {}, {}),
    "UnsortedSegmentSum": ({"data": f(6, 3), "segment_ids": i32(2, 0, 2, -1, 1, 2), "num_segments": np.int32(4)},
                           {}, {}),
    "FusedBatchNormV3 (training)": None,   # tested in test_batch_norm_training_*
    "FusedBatchNormGradV3": ({"y_backprop": f(2, 5, 5, 3), "x": f(2, 5, 5, 3), "scale": f(3, lo=0.5),
                              "reserve_space_1": f(3, lo=-0.2, hi=0.2), "reserve_space_2": f(3, lo=0.5, hi=1.5),
                              "reserve_space_3": np.zeros(0, np.float32)},
                             {"epsilon": 1e-3, "is_training": True}, {"n_out": 3, "tol": 1e-5}),
    "FusedBatchNormGradV2": ({"y_backprop": f(2, 5, 5, 3), "x": f(2, 5, 5, 3), "scale": f(3, lo=0.5),
                              "reserve_space_1": f(3, lo=-0.2, hi=0.2), "reserve_space_2": f(3, lo=0.5, hi=1.5)},
                             {"epsilon": 1e-3, "is_training": False}, {"n_out": 3, "tol": 1e-5}),
    "FusedBatchNormGrad": ({"y_backprop": f(2, 5, 5, 3), "x": f(2, 5, 5, 3), "scale": f(3, lo=0.5),
                            "reserve_space_1": f(3, lo=-0.2, hi=0.2), "reserve_space_2": f(3, lo=0.5, hi=1.5)},
                           {"epsilon": 1e-3, "is_training": True}, {"n_out": 3, "tol": 1e-5}),
    "SoftmaxCrossEntropyWithLogits": ({"features": f(4, 7, lo=-8, hi=8),
                                       "labels": np.eye(7, dtype=np.float32)[[1, 3, 0, 6]] * 0.75 + 0.25 / 7}, {}, {}),
    "SparseSoftmaxCrossEntropyWithLogits": ({"features": f(4, 7, lo=-8, hi=8), "labels": i32(1, 3, 0, 6)}, {}, {}),
    "MaxPoolGrad": ({"orig_input": X, "orig_output": _maxpool(X, **POOL), "grad": f(2, 4, 4, 3)}, POOL, {}),
    "AvgPoolGrad": ({"orig_input_shape": i32(2, 7, 7, 3), "grad": f(2, 4, 4, 3)}, POOL, {}),
    "BroadcastGradientArgs": ({"s0": i32(2, 1, 3), "s1": i32(1, 1, 3)}, {}, {}),
    "ShapeN": ({"input": [f(2, 3), f(4)]}, {}, {"list_input": True}),
    "InvertPermutation": ({"x": i32(2, 0, 3, 1)}, {}, {}),
    "DynamicStitch": ({"indices": [i32(0, 4), i32(2, 1, 4)], "data": [f(2, 3), f(3, 3)]}, {},
                      {"list_input": True}),
    "ParallelDynamicStitch": ({"indices": [i32(0, 4), i32(2, 1, 3)], "data": [f(2, 3), f(3, 3)]}, {},
                              {"list_input": True}),
    "StridedSliceGrad": ({"shape": i32(4, 5, 6), "begin": i32(1, 0, 4), "end": i32(3, 0, 0),
                          "strides": i32(1, 1, -2), "dy": f(2, 5, 2)}, {"begin_mask": 2, "end_mask": 2}, {}),
    "NoOp": None,   # no outputs: tested in test_host_ops
    "Conv2DTranspose": None,   # CANN's, no TF op: test_conv2d_transpose_is_tf_backprop_input below
    # ref-variable updates: against TF's resource forms in test_optimizer_updates_match_tensorflow
    "ApplyGradientDescent": None, "ApplyMomentum": None, "ApplyKerasMomentum": None, "ApplyAdam": None,
    "ApplyRMSProp": None,
}

# results with no arithmetic rounding: equal to TF bit for bit in both dtypes
EXACT = {"ReluGrad", "Relu6Grad", "Sign", "FloorMod", "BroadcastGradientArgs", "ShapeN", "MulNoNan",
         "StridedSliceGrad", "DynamicStitch", "ParallelDynamicStitch"}
# the division by the window count and the order of overlapping contributions, or the batch-norm
# chain (CANN's order of float32 steps), differ from TF's float32 kernels by a few ulps
TOL32 = {"AvgPoolGrad": 1e-6, "MaxPoolGrad": 1e-6}


def _tf_ref(op, inputs, attrs, opts):
    import tensorflow as tf

    fn = getattr(tf.raw_ops, op)
    kw = {k: ([tf.constant(x) for x in v] if isinstance(v, list) else tf.constant(v)) for k, v in inputs.items()}
    out = fn(**kw, **attrs)
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [np.asarray(o) for o in outs]


def _ours(op, inputs, attrs, dtype):
    args = []
    for v in inputs.values():
        args.extend(v if isinstance(v, list) else [v])
    args = [a.astype(dtype) if a.dtype == np.float32 else a for a in args]
    return run_op(op, *args, ctx=OpContext(dtype=dtype), **attrs)


def test_every_training_op_has_a_case():
    from ascend_emu.ops import activation_grad_ops, grad_ops

    mods = {grad_ops.__name__, activation_grad_ops.__name__}
    mine = {t for t, d in OPS.items() if d.fn.__module__ in mods}
    missing = sorted(mine - set(CASES))
    assert not missing, f"ops of grad_ops.py / activation_grad_ops.py without a case in tests/ops/test_grad_ops.py: " \
                        f"{missing}"


@pytest.mark.parametrize("op", sorted(k for k, v in CASES.items() if v is not None))
def test_training_op_float32_matches_tensorflow(op):
    inputs, attrs, opts = CASES[op]
    ref = _tf_ref(op, inputs, attrs, opts)
    ours = _ours(op, inputs, attrs, np.float32)
    tol = opts.get("tol", TOL32.get(op, 1e-5 if opts.get("cube") else 2e-6))
    assert_float32_outputs(op, ours, ref, opts.get("n_out", len(ref)), op in EXACT, tol, tol)


def _float_inputs(v):
    vals = [y for z in v[0].values() for y in (z if isinstance(z, list) else [z])]
    return any(np.asarray(x).dtype == np.float32 for x in vals)


@pytest.mark.parametrize("op", sorted(k for k, v in CASES.items() if v is not None and _float_inputs(v)))
def test_training_op_float16_compute(op):
    """In fp16 the outputs in the compute dtype are real fp16 tensors, within the op's rounding of TF's
    float32 result (plus the accumulation error for the cube and the reductions)."""
    inputs, attrs, opts = CASES[op]
    ref = _tf_ref(op, inputs, attrs, opts)
    ours = _ours(op, inputs, attrs, np.float16)
    n = opts.get("n_out", len(ref))
    for k, (o, r) in enumerate(zip(ours[:n], ref[:n])):
        assert o.shape == r.shape
        if r.dtype != np.float32:
            continue
        if op.startswith("FusedBatchNormGrad") and k > 0:
            assert o.dtype == np.float32      # scale/offset gradients: BNTrainingUpdateGrad writes float32
            np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-5)
            continue
        assert o.dtype == np.float16, (op, o.dtype)
        if op in EXACT:
            np.testing.assert_array_equal(o, r.astype(np.float16))
        else:
            tol = 2 ** -10 * (4 if opts.get("cube") or op in ("BiasAddGrad", "UnsortedSegmentSum") else 1)
            np.testing.assert_allclose(o.astype(np.float32), r, rtol=tol, atol=tol)


# ---------------------------------------------------------------- cube: bit for bit against the slow oracle

import naive_cube as naive   # tests/ is on the path (pyproject's pythonpath)


def _oracle_backprop_input(sizes, w, dy, strides, pads, dil, depthwise, operand, out):
    """dx as the cube computes it: each output one dot over (kh, kw, cout) (depthwise: (kh, kw, m)) of
    the zero-inserted, padded dy and the filter rotated by 180 degrees, written from the definition."""
    n, h, wd, c = sizes
    kh_, kw_, _, co = w.shape
    (sh, sw), (dh, dw), (pt, pl) = strides, dil, pads
    dyv, _ = naive.operand(dy, operand)
    wv, _ = naive.operand(w, operand)
    oh, ow = dy.shape[1:3]
    acc = np.zeros((n, h, wd, c))
    for b, y, x, ci in np.ndindex(acc.shape):
        av, bv = [], []
        for i, j, o in np.ndindex(kh_, kw_, co):   # K order (kh, kw, cout)
            # rotated tap (i, j) meets forward tap (KH-1-i, KW-1-j): dy pixel (y + pt - tap*d) / s
            ty, tx = y + pt - (kh_ - 1 - i) * dh, x + pl - (kw_ - 1 - j) * dw
            ok = ty % sh == 0 and tx % sw == 0 and 0 <= ty // sh < oh and 0 <= tx // sw < ow
            av.append(dyv[b, ty // sh, tx // sw, ci * co + o if depthwise else o] if ok else 0.0)
            bv.append(wv[kh_ - 1 - i, kw_ - 1 - j, ci, o])
        acc[b, y, x, ci] = naive.dot(av, bv, 0.0)
    return naive.finish(acc, out)[0]


def _oracle_backprop_filter(x, fsizes, dy, strides, pads, dil, depthwise, operand, out):
    """dw[kh, kw, c, o] = one dot over (n, oh, ow) of the padded input under tap (kh, kw) and dy."""
    kh_, kw_, c, co = fsizes
    (sh, sw), (dh, dw), (pt, pl) = strides, dil, pads
    xv, _ = naive.operand(x, operand)
    dyv, _ = naive.operand(dy, operand)
    n, h, wd, _ = x.shape
    oh, ow = dy.shape[1:3]
    acc = np.zeros((kh_, kw_, c, co))
    for i, j, ci, o in np.ndindex(acc.shape):
        av, bv = [], []
        for b, p, q in np.ndindex(n, oh, ow):   # K order (n, oh, ow)
            y, x_ = p * sh + i * dh - pt, q * sw + j * dw - pl
            av.append(xv[b, y, x_, ci] if 0 <= y < h and 0 <= x_ < wd else 0.0)
            bv.append(dyv[b, p, q, ci * co + o if depthwise else o])
        acc[i, j, ci, o] = naive.dot(av, bv, 0.0)
    return naive.finish(acc, out)[0]


BACKPROP = [  # (input shape, filter shape, strides, padding, dilations)
    ((1, 7, 6, 3), (3, 3, 3, 4), (2, 2), "SAME", (1, 1)),
    ((2, 6, 6, 2), (2, 3, 2, 3), (1, 2), "VALID", (1, 1)),
    ((1, 8, 7, 2), (3, 2, 2, 2), (1, 1), "SAME", (2, 2)),
]


@pytest.mark.parametrize("case", range(len(BACKPROP)))
@pytest.mark.parametrize("out", ["float16", "float32"])
@pytest.mark.parametrize("depthwise", [False, True])
def test_backprop_convolutions_match_cube_oracle(case, out, depthwise):
    """fp16 operands, fp32 accumulation in 16-term tree blocks, one Fixpipe rounding: bit for bit."""
    from ascend_emu.numerics.cube import _pads

    shape, fshape, st, pad, dil = BACKPROP[case]
    if depthwise:
        fshape = fshape[:3] + (2,)
    x = rng.normal(size=shape).astype(np.float32)
    w = rng.normal(size=fshape).astype(np.float32)
    (pt, _), (pl, _) = _pads(pad, shape[1], shape[2], fshape[0], fshape[1], *st, *dil)
    import tensorflow as tf

    attrs = {"strides": [1, *st, 1], "padding": pad, "dilations": [1, *dil, 1]}
    # dy's shape from TF's Conv2D: its pixels are the depthwise op's too (TF's CPU DepthwiseConv2dNative
    # refuses unequal strides and dilations on hosts where oneDNN does not take it, e.g. AVX2-only CPUs)
    ysh = tuple(tf.raw_ops.Conv2D(input=x, filter=w, **attrs).shape)
    if depthwise:
        ysh = ysh[:3] + (shape[3] * fshape[3],)
    dy = rng.normal(size=ysh).astype(np.float32)
    ctx = OpContext(dtype="float16", cube_out=out)
    pre = "DepthwiseConv2dNative" if depthwise else "Conv2D"
    (dx,) = run_op(f"{pre}BackpropInput", np.array(shape, np.int32), w, dy, ctx=ctx, **attrs)
    (dw,) = run_op(f"{pre}BackpropFilter", x, np.array(fshape, np.int32), dy, ctx=ctx, **attrs)
    assert dx.dtype == dw.dtype == np.dtype(out)
    ref_x = _oracle_backprop_input(shape, w, dy, st, (pt, pl), dil, depthwise, "float16", out)
    ref_w = _oracle_backprop_filter(x, fshape, dy, st, (pt, pl), dil, depthwise, "float16", out)
    np.testing.assert_array_equal(dx.view(np.uint16 if out == "float16" else np.uint32),
                                  ref_x.view(np.uint16 if out == "float16" else np.uint32))
    np.testing.assert_array_equal(dw.view(np.uint16 if out == "float16" else np.uint32),
                                  ref_w.view(np.uint16 if out == "float16" else np.uint32))


def test_depthwise_backprop_with_dilations_matches_tensorflow_gradient():
    """TF's CPU DepthwiseConv2dNativeBackprop* kernels ignore ``dilations`` (tf.nn.depthwise_conv2d
    dilates through space_to_batch instead, so its gradient is right); ours follow the forward op's
    definition, checked here against GradientTape of tf.nn.depthwise_conv2d."""
    import tensorflow as tf

    x = tf.constant(f(2, 9, 9, 3))
    w = tf.constant(f(3, 3, 3, 2))
    dy = f(2, 9, 9, 6)
    attrs = {"strides": [1, 1, 1, 1], "padding": "SAME", "dilations": [1, 2, 2, 1]}
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, w])
        loss = tf.reduce_sum(tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME", dilations=[2, 2]) * dy)
    gx, gw = tape.gradient(loss, [x, w])
    (dx,) = run_op("DepthwiseConv2dNativeBackpropInput", np.array(x.shape, np.int32), w.numpy(), dy, **attrs)
    (dw,) = run_op("DepthwiseConv2dNativeBackpropFilter", x.numpy(), np.array(w.shape, np.int32), dy, **attrs)
    np.testing.assert_allclose(dx, gx.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, gw.numpy(), rtol=1e-5, atol=1e-5)


def test_backprop_fp16_overflow_raises_status_and_saturates():
    """A product sum beyond 65504 overflows the fp16 Fixpipe output: status 0x100, 65504 under saturation."""
    w = np.full((1, 1, 16, 1), 64.0, np.float32)
    dy = np.full((1, 2, 2, 1), 128.0, np.float32)        # dx = 128 * 64 = 8192 per channel, fine
    x = np.full((1, 2, 2, 16), 200.0, np.float32)
    ctx = OpContext(dtype="float16", overflow_mode="saturation")
    (dw,) = run_op("Conv2DBackpropFilter", x, np.array(w.shape, np.int32), dy, ctx=ctx, strides=[1, 1, 1, 1],
                   padding="VALID")
    assert dw.dtype == np.float16 and (dw == np.float16(65504)).all()   # 4 * 200 * 128 = 102400
    assert ctx.status & 0x100
    ctx = OpContext(dtype="float16", overflow_mode="saturation")
    (dx,) = run_op("Conv2DBackpropInput", np.array(x.shape, np.int32), w, dy, ctx=ctx, strides=[1, 1, 1, 1],
                   padding="VALID")
    assert (dx == np.float16(8192)).all() and ctx.status == 0


# ---------------------------------------------------------------- elementwise gradients: the float32 chain

@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_relu_grad_16_bit_select_is_the_float32_chain(fmt):
    """The 16-bit select of ReluGrad against its float32 chain (dy * (x > 0), rounded once): every 16-bit
    pattern as x against random dy, every pattern as dy against random x (Inf/NaN dy: the chain itself),
    both overflow modes, bits and status."""
    from ascend_emu.ops._util import f32_chain
    from ascend_emu.numerics.policy import bfloat16

    dt = np.float16 if fmt == "float16" else bfloat16
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    r = np.random.default_rng(5).integers(0, 65536, 65536, dtype=np.uint32).astype(np.uint16)
    finite = lambda b: b[(b & 0x7FFF) < (0x7C00 if fmt == "float16" else 0x7F80)]   # noqa: E731
    cases = [(finite(r), every[:finite(r).size]), (finite(every), r[:finite(every).size]), (every, r)]
    for dyb, xb in cases:
        dy, x = dyb.view(dt), xb.view(dt)
        for ov in ("inf_nan", "saturation"):
            ctx, ref_ctx = OpContext(dtype=fmt, overflow_mode=ov), OpContext(dtype=fmt, overflow_mode=ov)
            (ours,) = run_op("ReluGrad", dy, x, ctx=ctx)
            ref = f32_chain(ref_ctx, lambda g, f: g * (f > 0).astype(np.float32), dy, x)
            assert ours.dtype == ref.dtype and ours.shape == ref.shape
            np.testing.assert_array_equal(ours.view(np.uint16), ref.view(np.uint16))
            assert ctx.status == ref_ctx.status


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_relu_grad_broadcast_dy_is_the_materialized_route(fmt, monkeypatch):
    """ReluGrad of a broadcast dy (zero strides over one block of axes: the global average pool's gradient) reads
    its distinct values (kernels/vector.py's relu_grad16_bcast): bits and status those of the same dy materialized
    (the select on the copy, or the float32 chain for an Inf/NaN dy) and of the float32 chain itself, on hostile
    values (every x pattern's class: signed zeros, subnormals, Inf, NaN; dy near 65504, subnormal, -0), blocks at
    the start and in the middle, size-1 axes, rows of 16 to 64, both overflow modes; and the new kernel ran."""
    from ascend_emu.kernels import vector as kv
    from ascend_emu.numerics.policy import bfloat16
    from ascend_emu.ops._util import f32_chain

    dt = np.float16 if fmt == "float16" else bfloat16
    rng = np.random.default_rng(46)
    special = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00, 0x0400],
                       np.uint16)
    inf_nan = np.array([0x7C00, 0xFC00, 0x7E00, 0x7C01] if fmt == "float16" else [0x7F80, 0xFF80, 0x7FC0, 0x7F81],
                       np.uint16)
    calls = []
    real = kv.relu_grad16_bcast
    monkeypatch.setattr(kv, "relu_grad16_bcast", lambda *a: calls.append(1) or real(*a))
    cases = [((4, 1, 1, 16), (4, 5, 3, 16)), ((1, 1, 17), (3, 2, 17)), ((3, 1, 4, 1, 4), (3, 2, 4, 1, 4)),
             ((2, 1, 1, 1, 33), (2, 4, 1, 5, 33))]
    for cshape, shape in cases:
        for bad in (False, True):
            cb = rng.integers(0, 65536, int(np.prod(cshape)), dtype=np.uint32).astype(np.uint16)
            lim = 0x7C00 if fmt == "float16" else 0x7F80
            cb = np.where((cb & 0x7FFF) < lim, cb, special[cb % special.size])
            cb[:special.size] = special[:cb.size] if cb.size < special.size else special
            if bad:
                cb[-1] = inf_nan[rng.integers(0, inf_nan.size)]
            xb = rng.integers(0, 65536, int(np.prod(shape)), dtype=np.uint32).astype(np.uint16)
            xb[:special.size] = special
            xb[special.size:special.size + inf_nan.size] = inf_nan
            dy = np.broadcast_to(cb.view(dt).reshape(cshape), shape)
            x = xb.view(dt).reshape(shape)
            for ov in ("inf_nan", "saturation"):
                ctx, mat_ctx, ref_ctx = (OpContext(dtype=fmt, overflow_mode=ov) for _ in range(3))
                n = len(calls)
                (ours,) = run_op("ReluGrad", dy, x, ctx=ctx)
                assert len(calls) == n + 1
                (mat,) = run_op("ReluGrad", np.ascontiguousarray(dy), x, ctx=mat_ctx)
                assert len(calls) == n + 1
                ref = f32_chain(ref_ctx, lambda g, f: g * (f > 0).astype(np.float32), np.ascontiguousarray(dy), x)
                for other, octx in ((mat, mat_ctx), (ref, ref_ctx)):
                    assert ours.dtype == other.dtype and ours.shape == other.shape
                    np.testing.assert_array_equal(ours.view(np.uint16), other.view(np.uint16))
                    assert ctx.status == octx.status


def test_relu_grad_broadcast_dy_two_blocks_and_flush_take_the_old_route(monkeypatch):
    """Two repeated blocks, flushed subnormals, rows shorter than 16 (a block at the end, a scalar dy: the copy's
    parallel select is faster, review): not the broadcast kernel, the same bits as the materialized dy."""
    from ascend_emu.kernels import vector as kv

    monkeypatch.setattr(kv, "relu_grad16_bcast", lambda *a: pytest.fail("broadcast kernel taken"))
    dy = np.broadcast_to(np.arange(6, dtype=np.float16).reshape(1, 3, 1, 2) - 2, (4, 3, 5, 2))
    x = np.random.default_rng(0).standard_normal((4, 3, 5, 2)).astype(np.float16)
    one_block = np.broadcast_to(np.float16([[[[-0.0, 2.0 ** -24]]]]), (4, 3, 5, 2))
    scalar = np.broadcast_to(np.float16(-7.0), (4, 3, 5, 2))
    at_end = np.broadcast_to(np.float16([-0.5, 2.0, 0.0, 1.0]).reshape(4, 1, 1, 1), (4, 3, 5, 2))
    for dy, sub in ((dy, "keep"), (dy, "flush"), (one_block, "flush"), (scalar, "keep"),
                    (at_end, "keep")):
        (a,) = run_op("ReluGrad", dy, x, ctx=OpContext(dtype="float16", subnormals=sub))
        (b,) = run_op("ReluGrad", np.ascontiguousarray(dy), x, ctx=OpContext(dtype="float16", subnormals=sub))
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


def test_gradient_overflow_sets_status():
    """An fp16 gradient beyond 65504 sets 0x20 and saturates (910) or becomes Inf (910B)."""
    dy = np.array([60000.0], np.float16)
    sat = OpContext(dtype="float16", overflow_mode="saturation")
    (a,) = run_op("TanhGrad", np.array([0.0], np.float16), np.array([65504], np.float16), ctx=sat)
    assert a[0] == 65504 and sat.status == 0           # 65504 * (1 - 0) is representable
    (c,) = run_op("SqrtGrad", np.array([2.0 ** -10], np.float16), dy, ctx=sat)   # 0.5 * 60000 * 1024
    assert c[0] == 65504 and sat.status & 0x20
    inf = OpContext(dtype="float16", overflow_mode="inf_nan")
    (d,) = run_op("SqrtGrad", np.array([2.0 ** -10], np.float16), dy, ctx=inf)
    assert np.isinf(d[0]) and inf.status & 0x20


def test_div_no_nan_raises_no_status_for_zero_divisors():
    ctx = OpContext(dtype="float16")
    (q,) = run_op("DivNoNan", np.array([1.0, 0.0, 3.0], np.float16), np.array([0.0, 0.0, 2.0], np.float16), ctx=ctx)
    np.testing.assert_array_equal(q, np.array([0.0, 0.0, 1.5], np.float16))
    assert q.dtype == np.float16 and ctx.status == 0


def test_mul_no_nan_zero_times_inf_is_zero():
    """TensorFlow's rule, the 950's kernel (op_model ascendc); the 910B's TBE vmul is test_grad_kernels.py's."""
    (p,) = run_op("MulNoNan", np.array([np.inf, np.nan, 2.0], np.float32), np.array([0.0, 0.0, 3.0], np.float32),
                  ctx=OpContext(op_model="ascendc"))
    np.testing.assert_array_equal(p, np.array([0.0, 0.0, 6.0], np.float32))


# ---------------------------------------------------------------- batch norm (training)

def _bn_tf(x, scale, offset, mean, var, factor):
    import tensorflow as tf

    out = tf.raw_ops.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=mean, variance=var, epsilon=1e-3,
                                      is_training=True, exponential_avg_factor=factor)
    return [np.asarray(o) for o in out]


@pytest.mark.parametrize("factor", [1.0, 0.1])
def test_batch_norm_training_float32_matches_tensorflow(factor):
    """y, running mean, running variance (Bessel-corrected), batch mean, biased batch variance."""
    x = f(4, 5, 5, 3)
    scale, offset = f(3, lo=0.5), f(3)
    mean, var = f(3), f(3, lo=0.5)
    mean_in = mean if factor != 1 else np.zeros(0, np.float32)
    var_in = var if factor != 1 else np.zeros(0, np.float32)
    ref = _bn_tf(x, scale, offset, mean_in, var_in, factor)
    ours = run_op("FusedBatchNormV3", x, scale, offset, mean_in, var_in, epsilon=1e-3, is_training=True,
                  exponential_avg_factor=factor)
    assert len(ours) == 6 and ours[5].size == 0
    for o, r in zip(ours[:5], ref[:5]):
        assert o.dtype == np.float32 and o.shape == r.shape
        np.testing.assert_allclose(o, r, rtol=2e-5, atol=2e-6)
    n = 4 * 5 * 5
    if factor == 1:
        np.testing.assert_allclose(ours[2], ours[4] * n / (n - 1), rtol=1e-6)


def test_batch_norm_training_variance_is_sum_of_squares_minus_squared_mean():
    """BNTrainingUpdate's variance sq/n - mean^2 in float32 (hicann/ops-nn bn_training_update golden):
    for a channel far from zero it cancels, where TensorFlow's two-pass variance does not."""
    x = (1000.0 + rng.normal(size=(8, 4, 4, 1)) * 0.05).astype(np.float32)
    ours = run_op("FusedBatchNormV3", x, np.ones(1, np.float32), np.zeros(1, np.float32), np.zeros(0, np.float32),
                  np.zeros(0, np.float32), epsilon=1e-3, is_training=True)
    s = sq = np.float32(0)
    for v in x.reshape(-1):                                # the float32 sums, sequentially
        s = np.float32(s + v)
        sq = np.float32(sq + np.float32(v * v))
    n = np.float32(x.size)
    mean = np.float32(s / n)
    var = np.float32(np.float32(sq / n) - np.float32(mean * mean))
    assert ours[3][0] == mean and ours[4][0] == var
    two_pass = np.var(x.astype(np.float64))
    assert abs(float(var) - two_pass) > 0.5 * two_pass     # the cancellation is visible


def test_batch_norm_training_fp16():
    """fp16 compute: y is an fp16 tensor within one fp16 rounding of TF's; the statistics stay float32."""
    x, scale, offset = f(2, 4, 4, 3), f(3, lo=0.5), f(3)
    empty = np.zeros(0, np.float32)
    ref = _bn_tf(x, scale, offset, empty, empty, 1.0)
    ours = run_op("FusedBatchNormV3", x.astype(np.float16), scale, offset, empty, empty,
                  ctx=OpContext(dtype="float16"), epsilon=1e-3, is_training=True)
    assert ours[0].dtype == np.float16 and all(o.dtype == np.float32 for o in ours[1:])
    np.testing.assert_allclose(ours[0].astype(np.float32), ref[0], rtol=2 ** -10, atol=2 ** -10)
    for o, r in zip(ours[1:5], ref[1:5]):
        np.testing.assert_allclose(o, r, rtol=2e-5, atol=2e-6)


# ---------------------------------------------------------------- host ops and errors

@pytest.mark.parametrize("s0,s1", [([2, 1, 3], [1, 1, 3]), ([1], [1]), ([4, 1], []), ([2, 3], [2, 3]),
                                   ([1, 1], [1, 1, 1]), ([5, 1, 7], [7]), ([3, 1], [1, 4])])
def test_broadcast_gradient_args_matches_tensorflow(s0, s1):
    import tensorflow as tf

    for dt in (np.int32, np.int64):
        ref = tf.raw_ops.BroadcastGradientArgs(s0=np.array(s0, dt), s1=np.array(s1, dt))
        ours = run_op("BroadcastGradientArgs", np.array(s0, dt), np.array(s1, dt))
        for o, r in zip(ours, ref):
            np.testing.assert_array_equal(o, np.asarray(r))
            assert o.dtype == dt


def test_host_ops():
    assert run_op("NoOp") == ()
    a, b = run_op("ShapeN", f(2, 3), f(5), out_type="int64")
    assert a.dtype == np.int64 and a.tolist() == [2, 3] and b.tolist() == [5]


def test_bad_labels_and_segments_raise_one_line():
    from ascend_emu.errors import AscendEmuError

    with pytest.raises(AscendEmuError, match="label 7 is outside"):
        run_op("SparseSoftmaxCrossEntropyWithLogits", f(2, 7), i32(1, 7))
    with pytest.raises(AscendEmuError, match="segment id 4 is not below"):
        run_op("UnsortedSegmentSum", f(3, 2), i32(0, 4, 1), np.int32(3))


# ---------------------------------------------------------------- optimizer updates

ADAM = {"beta1_power": 0.9 ** 3, "beta2_power": 0.999 ** 3, "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7}
# (our op, TF's resource op, inputs in TF argument order: "var"/slot names are tensors, "grad"/"delta" the
# gradient, the rest float32 scalars; attrs)
UPDATES = [
    ("ApplyGradientDescent", "ResourceApplyGradientDescent", ["var", ("alpha", 0.1), "delta"], {}),
    ("ApplyMomentum", "ResourceApplyMomentum", ["var", "accum", ("lr", 0.05), "grad", ("momentum", 0.9)], {}),
    ("ApplyMomentum", "ResourceApplyMomentum", ["var", "accum", ("lr", 0.05), "grad", ("momentum", 0.9)],
     {"use_nesterov": True}),
    ("ApplyKerasMomentum", "ResourceApplyKerasMomentum", ["var", "accum", ("lr", 0.05), "grad", ("momentum", 0.9)],
     {}),
    ("ApplyKerasMomentum", "ResourceApplyKerasMomentum", ["var", "accum", ("lr", 0.05), "grad", ("momentum", 0.9)],
     {"use_nesterov": True}),
    ("ApplyAdam", "ResourceApplyAdam", ["var", "m", "v", *ADAM.items(), "grad"], {}),
    ("ApplyAdam", "ResourceApplyAdam", ["var", "m", "v", *ADAM.items(), "grad"], {"use_nesterov": True}),
    ("ApplyRMSProp", "ResourceApplyRMSProp",
     ["var", "ms", "mom", ("lr", 1e-3), ("rho", 0.9), ("momentum", 0.5), ("epsilon", 1e-7), "grad"], {}),
]


@pytest.mark.parametrize("case", range(len(UPDATES)))
def test_optimizer_updates_match_tensorflow(case):
    """The new variable and slots equal TF's in-place resource update of the same values (float32); in fp16
    compute the outputs are fp16 within one rounding of them."""
    import tensorflow as tf

    ours_op, tf_op, spec, attrs = UPDATES[case]
    values, tf_kw, states = [], {}, []
    for item in spec:
        if isinstance(item, tuple):
            name, v = item[0], np.float32(item[1])
            tf_kw[name] = tf.constant(v)
        elif item in ("grad", "delta"):
            name, v = item, f(4, 3)
            tf_kw[name] = tf.constant(v)
        else:   # the variable and its slots: positive for the second-moment slots
            name, v = item, f(4, 3, lo=0.01, hi=1.0) if item in ("v", "ms") else f(4, 3)
            states.append(tf.Variable(v))
            tf_kw[name] = states[-1].handle
        values.append(v)
    getattr(tf.raw_ops, tf_op)(**tf_kw, **attrs)
    ref = [t.numpy() for t in states]
    ours = run_op(ours_op, *values, **attrs)
    assert len(ours) == len(states)
    for o, r in zip(ours, ref):
        assert o.dtype == np.float32
        np.testing.assert_allclose(o, r, rtol=2e-6, atol=1e-7)
    ours16 = run_op(ours_op, *[v.astype(np.float16) if np.ndim(v) else v for v in values],
                    ctx=OpContext(dtype="float16"), **attrs)
    for o, r in zip(ours16, ref):
        assert o.dtype == np.float16
        np.testing.assert_allclose(o.astype(np.float32), r, rtol=2 ** -10, atol=2 ** -14)


def test_strided_slice_grad_shrink_and_new_axis():
    import tensorflow as tf

    kw = {"begin": i32(1, 0, 0), "end": i32(2, 0, 0), "strides": i32(1, 1, 1), "begin_mask": 6, "end_mask": 6,
          "new_axis_mask": 2, "shrink_axis_mask": 1}
    x = f(4, 3, 6)
    fwd = tf.raw_ops.StridedSlice(input=x, **kw).numpy()
    dy = f(*fwd.shape)
    ref = tf.raw_ops.StridedSliceGrad(shape=i32(4, 3, 6), dy=dy, **kw).numpy()
    (ours,) = run_op("StridedSliceGrad", i32(4, 3, 6), kw["begin"], kw["end"], kw["strides"], dy,
                     **{k: v for k, v in kw.items() if k.endswith("mask")})
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_max_pool_grad_ties_go_to_the_first_maximum(padding):
    """Inputs of 0, 1, 2 only: most windows have several maxima; the gradient goes to the first in
    row-major order, as TensorFlow's CPU kernel sends it; overlapping windows add in TF's order, so the
    bits are equal."""
    import tensorflow as tf

    x = np.round(rng.uniform(0, 2, size=(2, 7, 7, 3))).astype(np.float32)
    attrs = {"ksize": [1, 3, 3, 1], "strides": [1, 2, 2, 1], "padding": padding}
    y = tf.raw_ops.MaxPool(input=x, **attrs).numpy()
    dy = f(*y.shape)
    ref = tf.raw_ops.MaxPoolGrad(orig_input=x, orig_output=y, grad=dy, **attrs).numpy()
    (ours,) = run_op("MaxPoolGrad", x, y, dy, **attrs)
    np.testing.assert_array_equal(ours, ref)


def test_conv2d_transpose_is_tf_backprop_input():
    """CANN's Conv2DTranspose (the torch door's transposed convolution) is the input gradient of the convolution it
    transposes: TF's Conv2DBackpropInput with the same explicit pads, in float32; bias into the result."""
    import tensorflow as tf

    x, w, b = f(2, 4, 5, 5), f(3, 2, 3, 5), f(3)
    size = i32(2, 8, 9, 3)   # strides 2: (8 + 1 + 0 - 3) // 2 + 1 = 4, (9 + 1 + 1 - 2) // 2 + 1 = 5
    attrs = dict(strides=[1, 2, 2, 1], dilations=[1, 1, 1, 1])   # (TF's CPU kernel has no dilation here)
    want = np.asarray(tf.raw_ops.Conv2DBackpropInput(input_sizes=size, filter=w, out_backprop=x, padding="EXPLICIT",
                                                     explicit_paddings=[0, 0, 1, 0, 1, 1, 0, 0], **attrs))
    (got,) = run_op("Conv2DTranspose", size, x, w, ctx=OpContext(dtype="float32"), pads=[1, 0, 1, 1], bias=b, **attrs)
    np.testing.assert_allclose(got, want + b, rtol=1e-5, atol=1e-5)
