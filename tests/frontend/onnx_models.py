"""Small ONNX models built with onnx.helper for the ONNX frontend's tests (seeded weights, small shapes)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _G:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def w(self, name, shape, scale=0.3):
        self.inits.append(numpy_helper.from_array(
            (self.rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def c(self, name, value, dtype=np.int64):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def n(self, op, ins, outs, name, **attrs):
        self.nodes.append(helper.make_node(op, ins, outs, name=name, **attrs))
        return outs[0]

    def model(self, inputs, outputs, opset):
        g = helper.make_graph(self.nodes, "g", inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def resnet_cnn(opset: int = 17, batch="N") -> onnx.ModelProto:
    """conv/BN/relu, max pool, a residual block, global average pool, flatten, gemm."""
    g = _G(1)
    x = g.n("Conv", ["x", g.w("c1.w", (8, 3, 3, 3)), g.w("c1.b", (8,))], ["c1"], "conv1", pads=[1, 1, 1, 1],
            strides=[2, 2])
    x = g.n("BatchNormalization", [x, g.w("bn1.s", (8,)), g.w("bn1.b", (8,)), g.w("bn1.m", (8,)),
                                   g.c("bn1.v", np.linspace(0.5, 1.5, 8), np.float32)], ["bn1"], "bn1", epsilon=1e-5)
    x = g.n("Relu", [x], ["r1"], "relu1")
    x = g.n("MaxPool", [x], ["p1"], "pool1", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = g.n("Conv", [x, g.w("c2.w", (8, 8, 3, 3), 0.15)], ["c2"], "conv2", pads=[1, 1, 1, 1])
    y = g.n("BatchNormalization", [y, g.w("bn2.s", (8,)), g.w("bn2.b", (8,)), g.w("bn2.m", (8,)),
                                   g.c("bn2.v", np.linspace(0.8, 1.2, 8), np.float32)], ["bn2"], "bn2")
    y = g.n("Clip", [y, g.c("zero", 0.0, np.float32), g.c("six", 6.0, np.float32)], ["r2"], "relu6")
    y = g.n("Conv", [y, g.w("c3.w", (8, 1, 3, 3)), g.w("c3.b", (8,))], ["c3"], "dwconv", pads=[1, 1, 1, 1],
            group=8)
    y = g.n("Add", [x, y], ["res"], "residual")
    y = g.n("Sigmoid", [y], ["sg"], "sigmoid")
    y = g.n("Mul", [y, "res"], ["swish"], "swish")
    y = g.n("AveragePool", [y], ["ap"], "avgpool", kernel_shape=[2, 2], strides=[1, 1])
    y = g.n("GlobalAveragePool", [y], ["gap"], "gap")
    y = g.n("Flatten", [y], ["flat"], "flatten", axis=1)
    y = g.n("Gemm", [y, g.w("fc.w", (10, 8)), g.w("fc.b", (10,))], ["logits"], "fc", transB=1, alpha=1.0)
    g.n("Softmax", [y], ["probs"], "softmax", axis=-1)
    return g.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
                   [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 10])], opset)


def bert_block(opset: int = 17, seq: int = 8, hidden: int = 16, heads: int = 2) -> onnx.ModelProto:
    """Embedding gather, self-attention (MatMul-Softmax-MatMul), LayerNormalization, Erf-form Gelu, with the
    shape arithmetic PyTorch exports (Shape, Gather, Unsqueeze, Concat, Reshape) and opset 13's axes inputs."""
    g = _G(2)
    d = hidden // heads
    emb = g.n("Gather", [g.w("emb", (50, hidden), 1.0), "ids"], ["e"], "embeddings", axis=0)
    x = g.n("LayerNormalization", [emb, g.w("ln0.g", (hidden,)), g.w("ln0.b", (hidden,))], ["ln0"], "ln0",
            axis=-1, epsilon=1e-12)
    # batch and seq from the tensor's shape
    sh = g.n("Shape", [x], ["sh"], "shape")
    b0 = g.n("Gather", [sh, g.c("i0", 0)], ["b0"], "gather_b", axis=0)
    s0 = g.n("Gather", [sh, g.c("i1", 1)], ["s0"], "gather_s", axis=0)
    ub = g.n("Unsqueeze", [b0, g.c("ax0", [0])], ["ub"], "unsq_b")
    us = g.n("Unsqueeze", [s0, g.c("ax0b", [0])], ["us"], "unsq_s")
    shp = g.n("Concat", [ub, us, g.c("hd", [heads, d])], ["shp"], "concat_shape", axis=0)
    heads_out = []
    for nm in ("q", "k", "v"):
        t = g.n("MatMul", [x, g.w(f"{nm}.w", (hidden, hidden))], [f"{nm}0"], f"{nm}_proj")
        t = g.n("Add", [t, g.w(f"{nm}.b", (hidden,))], [f"{nm}1"], f"{nm}_bias")
        t = g.n("Reshape", [t, shp], [f"{nm}2"], f"{nm}_reshape")
        t = g.n("Transpose", [t], [f"{nm}3"], f"{nm}_transpose", perm=[0, 2, 3, 1] if nm == "k" else [0, 2, 1, 3])
        heads_out.append(t)
    q, k, v = heads_out
    s = g.n("MatMul", [q, k], ["scores"], "qk")
    s = g.n("Div", [s, g.c("sqrt_d", np.sqrt(d), np.float32)], ["scaled"], "scale")
    mask = g.n("Cast", ["mask"], ["maskf"], "mask_cast", to=TensorProto.FLOAT)
    mask = g.n("Sub", [g.c("one", 1.0, np.float32), mask], ["inv"], "mask_inv")
    mask = g.n("Mul", [mask, g.c("big", -1e4, np.float32)], ["bias"], "mask_bias")
    mask = g.n("Unsqueeze", [mask, g.c("ax12", [1, 2])], ["mask4"], "mask_unsq")
    s = g.n("Add", [s, mask], ["masked"], "mask_add")
    p = g.n("Softmax", [s], ["probs"], "attn_softmax", axis=-1)
    ctx = g.n("MatMul", [p, v], ["ctx"], "pv")
    ctx = g.n("Transpose", [ctx], ["ctx_t"], "ctx_transpose", perm=[0, 2, 1, 3])
    ctx = g.n("Reshape", [ctx, g.c("flat_shape", [0, 0, -1])], ["ctx_r"], "ctx_reshape")
    o = g.n("MatMul", [ctx, g.w("o.w", (hidden, hidden))], ["o0"], "o_proj")
    o = g.n("Add", [o, x], ["o1"], "residual1")
    # LayerNorm in its decomposed (ReduceMean) form, axes as an input from opset 18
    if opset >= 18:
        mu = g.n("ReduceMean", [o, g.c("axm", [-1])], ["mu"], "ln1_mean")
    else:
        mu = g.n("ReduceMean", [o], ["mu"], "ln1_mean", axes=[-1])
    dv = g.n("Sub", [o, mu], ["dv"], "ln1_sub")
    sq = g.n("Pow", [dv, g.c("two", 2.0, np.float32)], ["sq"], "ln1_pow")
    if opset >= 18:
        var = g.n("ReduceMean", [sq, g.c("axv", [-1])], ["var"], "ln1_var")
    else:
        var = g.n("ReduceMean", [sq], ["var"], "ln1_var", axes=[-1])
    var = g.n("Add", [var, g.c("eps", 1e-12, np.float32)], ["vare"], "ln1_eps")
    sd = g.n("Sqrt", [var], ["sd"], "ln1_sqrt")
    y = g.n("Div", [dv, sd], ["norm"], "ln1_div")
    y = g.n("Mul", [y, g.w("ln1.g", (hidden,))], ["ln1g"], "ln1_gamma")
    y = g.n("Add", [y, g.w("ln1.b", (hidden,))], ["ln1"], "ln1_beta")
    # feed-forward with the Erf form of Gelu
    f = g.n("MatMul", [y, g.w("f1.w", (hidden, 2 * hidden))], ["f1"], "ffn_in")
    e = g.n("Div", [f, g.c("sqrt2", np.sqrt(2.0), np.float32)], ["fe"], "gelu_div")
    e = g.n("Erf", [e], ["erf"], "gelu_erf")
    e = g.n("Add", [e, g.c("one_b", 1.0, np.float32)], ["erf1"], "gelu_add")
    e = g.n("Mul", [f, e], ["gm"], "gelu_mul")
    e = g.n("Mul", [e, g.c("half", 0.5, np.float32)], ["gelu"], "gelu_half")
    f = g.n("MatMul", [e, g.w("f2.w", (2 * hidden, hidden))], ["f2"], "ffn_out")
    f = g.n("Add", [f, y], ["f3"], "residual2")
    f = g.n("LayerNormalization", [f, g.w("ln2.g", (hidden,)), g.w("ln2.b", (hidden,))], ["out"], "ln2",
            axis=-1, epsilon=1e-12)
    pooled = g.n("Slice", [f, g.c("st", [0]), g.c("en", [1]), g.c("axs", [1])], ["cls"], "cls_slice")
    pooled = g.n("Squeeze", [pooled, g.c("axsq", [1])], ["cls2"], "cls_squeeze")
    pooled = g.n("Gemm", [pooled, g.w("pool.w", (hidden, hidden)), g.w("pool.b", (hidden,))], ["pool"], "pooler")
    g.n("Tanh", [pooled], ["pooled"], "pooler_tanh")
    return g.model([helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", seq]),
                    helper.make_tensor_value_info("mask", TensorProto.INT64, ["B", seq])],
                   [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", seq, hidden]),
                    helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["B", hidden])], opset)


def resize_einsum(opset: int = 18) -> onnx.ModelProto:
    """Resize (nearest x2 and a linear one, ResizeBilinear on the AI Core), Einsum, Pad, ConvTranspose, HardSwish,
    LeakyRelu, Split, Expand, Where, LogSoftmax, ReduceSum/Max."""
    g = _G(3)
    x = g.n("Resize", ["x", "", g.c("sc", [1, 1, 2, 2], np.float32)], ["up"], "upsample", mode="nearest")
    lin = g.n("Resize", ["x", "", g.c("sc2", [1, 1, 1.5, 1.5], np.float32)], ["lin"], "resize_linear",
              mode="linear")
    lin = g.n("ReduceMax", [lin, g.c("ax23", [2, 3])], ["linmax"], "lin_max", keepdims=1)
    x = g.n("Add", [x, lin], ["upl"], "add_lin")
    x = g.n("Pad", [x, g.c("pads", [0, 0, 1, 1, 0, 0, 1, 1])], ["pad"], "pad", mode="reflect")
    x = g.n("ConvTranspose", [x, g.w("ct.w", (4, 6, 3, 3)), g.w("ct.b", (6,))], ["ct"], "deconv",
            strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    x = g.n("HardSwish", [x], ["hs"], "hardswish")
    x = g.n("LeakyRelu", [x], ["lr"], "leaky", alpha=0.1)
    a, bb = g.n("Split", [x, g.c("split", [2, 4])], ["sa", "sb"], "split", axis=1), "sb"
    e = g.n("Einsum", [bb, g.w("ew", (4, 5))], ["ein"], "einsum", equation="nchw,cd->nhwd")
    m = g.n("ReduceSum", [a, g.c("ax1", [1])], ["rs"], "reduce_sum", keepdims=0)
    m = g.n("Expand", [g.n("Unsqueeze", [m, g.c("axu", [-1])], ["mu"], "unsq"), g.c("es", [1, 1, 1, 5])],
            ["mx"], "expand")
    cond = g.n("Greater", [m, g.c("zf", 0.0, np.float32)], ["cond"], "greater")
    w = g.n("Where", [cond, e, m], ["wh"], "where")
    g.n("LogSoftmax", [w], ["y"], "log_softmax", axis=-1)
    return g.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 20, 20, 5])], opset)


def array_ops(opset: int) -> onnx.ModelProto:
    """Data movement across the opset changes: Split (attribute split < 13, input from 13, num_outputs from
    18), Squeeze/Unsqueeze (axes attribute < 13, input from 13), ReduceSum (axes input from 13), ReduceMax
    (from 18), Slice with a negative step, Reshape's 0 and -1, Flatten, Concat, Pad (constant), Transpose."""
    g = _G(4)
    x = g.n("Transpose", ["x"], ["t"], "transpose", perm=[0, 2, 1])              # (2, 5, 6)
    if opset < 13:
        a, b2 = g.n("Split", [x], ["sa", "sb"], "split", axis=2, split=[2, 4]), "sb"
        u = g.n("Unsqueeze", [a], ["u"], "unsqueeze", axes=[1])
        r = g.n("ReduceSum", [b2], ["rs"], "reduce_sum", axes=[2], keepdims=1)
        r2 = g.n("ReduceMax", [u], ["rm"], "reduce_max", axes=[1], keepdims=0)
    else:
        if opset >= 18:
            a, b2 = g.n("Split", [x], ["sa", "sb"], "split", axis=2, num_outputs=2), "sb"
        else:
            a, b2 = g.n("Split", [x, g.c("sp", [3, 3])], ["sa", "sb"], "split", axis=2), "sb"
        u = g.n("Unsqueeze", [a, g.c("ax1", [1])], ["u"], "unsqueeze")
        r = g.n("ReduceSum", [b2, g.c("ax2", [2])], ["rs"], "reduce_sum", keepdims=1)
        if opset >= 18:
            r2 = g.n("ReduceMax", [u, g.c("ax1b", [1])], ["rm"], "reduce_max", keepdims=0)
        else:
            r2 = g.n("ReduceMax", [u], ["rm"], "reduce_max", axes=[1], keepdims=0)
    s = g.n("Slice", [r2, g.c("st", [-1]), g.c("en", [-100]), g.c("axs", [1]), g.c("stp", [-2])], ["sl"], "slice")
    s = g.n("Reshape", [s, g.c("shp", [0, -1])], ["rsh"], "reshape")
    c = g.n("Concat", [s, g.n("Flatten", [r], ["fl"], "flatten", axis=1)], ["cat"], "concat", axis=1)
    if opset < 11:
        p = g.n("Pad", [c], ["pd"], "pad", pads=[0, 1, 0, 2], value=0.5)
    else:
        p = g.n("Pad", [c, g.c("pads", [0, 1, 0, 2]), g.c("pv", 0.5, np.float32)], ["pd"], "pad")
    q = g.n("Squeeze", [g.n("Unsqueeze", [p, *([] if opset < 13 else [g.c("ax0", [0])])], ["pu"], "unsq0",
                              **({"axes": [0]} if opset < 13 else {}))],
            ["y"], "squeeze", **({"axes": [0]} if opset < 13 else {}))
    if opset >= 13:
        g.nodes[-1].input.append(g.c("ax0s", [0]))
    return g.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 5])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "W"])], opset)


def activations(opset: int = 20) -> onnx.ModelProto:
    """The activations with attributes: Gelu (opset 20, both forms), HardSigmoid, HardSwish, LeakyRelu, Clip
    with one bound, Elu, Max/Min of three, Pow, Reciprocal, Sqrt of Abs, integer Div."""
    g = _G(6)
    x = "x"
    a = g.n("Gelu", [x], ["ge"], "gelu_exact")
    b = g.n("Gelu", [x], ["gt"], "gelu_tanh", approximate="tanh")
    c = g.n("HardSigmoid", [x], ["hs"], "hard_sigmoid", alpha=0.25, beta=0.4)
    d = g.n("Clip", [x, g.c("lo", -0.5, np.float32)], ["cl"], "clip_low")
    e = g.n("Elu", [x], ["el"], "elu")
    m = g.n("Max", [a, b, c], ["mx"], "max3")
    n = g.n("Min", [d, e, m], ["mn"], "min3")
    p = g.n("Pow", [g.n("Sqrt", [g.n("Abs", [n], ["ab"], "abs")], ["sq"], "sqrt"), g.c("three", 3.0, np.float32)],
            ["pw"], "pow")
    r = g.n("Reciprocal", [g.n("Add", [p, g.c("one", 1.0, np.float32)], ["p1"], "add1")], ["rc"], "reciprocal")
    k = g.n("Div", [g.c("seven", [7, -7, 9], np.int64), g.c("two", [2, 2, -4], np.int64)], ["kd"], "int_div")
    k = g.n("Cast", [k], ["kf"], "int_cast", to=TensorProto.FLOAT)
    g.n("Mul", [r, g.n("ReduceSum", [k], ["ks"], "ksum", keepdims=0)], ["y"], "scale")
    return g.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])], opset)
