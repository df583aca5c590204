"""ONNX ops onto the op registry, with ONNX's semantics.

One converter per ONNX op type: ``fn(b, n)`` with the :class:`.build.Builder` ``b`` and the
node ``n`` (:class:`Onnx`: its unique graph name, its ONNX inputs and outputs, decoded attributes,
the model's opset); it emits registry nodes (the last of them named ``n.name``, so the dump's op
is the ONNX node) and returns the graph tensors of the node's outputs. A converter that cannot
express a node (a layout or attribute the registry's op does not take, a shape not known when the
model loads) raises :class:`.build.Fallback`: the node then runs as itself on the emulated
AI CPU (onnxruntime, float32).

Layouts: Conv, ConvTranspose, BatchNormalization, MaxPool and AveragePool take NCHW in ONNX and
NHWC in the registry: explicit ``Transpose`` nodes go in and out (``<name>/to_nhwc``, and the
node ``<name>`` itself transposing back); a chain of such ops reads the NHWC tensor directly.
GlobalAveragePool is a ``Mean`` over axes 2 and 3 of the NCHW tensor (no transpose).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .build import FLOATS, ONNX_DTYPES, TO_NCHW, Builder, Fallback


@dataclass
class Onnx:
    name: str
    op: str
    inputs: list
    outputs: list
    attrs: dict
    opset: int

    def a(self, key, default=None):
        return self.attrs.get(key, default)

    def inp(self, i):
        """ONNX input ``i``, or "" when absent (ONNX's optional inputs)."""
        return self.inputs[i] if i < len(self.inputs) else ""


CONVERTERS: dict = {}


def converter(*ops):
    def deco(fn):
        for op in ops:
            CONVERTERS[op] = fn
        return fn
    return deco


def _one(b: Builder, n: Onnx, op: str, inputs, attrs=None, num_outputs=1, T=True) -> list:
    attrs = dict(attrs or {})
    if T:
        t = b.dtype(n.inputs[0]) if n.inputs else None
        if t in FLOATS:
            attrs.setdefault("T", t)
    out = b.emit(n.name, op, inputs, attrs, num_outputs, exact=True)
    return [f"{n.name}:{i}" for i in range(num_outputs)] if num_outputs > 1 else [out]


# -- elementwise ---------------------------------------------------------------------------------
_BINARY = {"Add": "AddV2", "Sub": "Sub", "Mul": "Mul", "Pow": "Pow", "Equal": "Equal", "Less": "Less",
           "Greater": "Greater", "LessOrEqual": "LessEqual", "GreaterOrEqual": "GreaterEqual",
           "And": "LogicalAnd", "Or": "LogicalOr"}
_UNARY = {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Erf": "Erf", "Sqrt": "Sqrt", "Exp": "Exp",
          "Log": "Log", "Neg": "Neg", "Abs": "Abs", "Reciprocal": "Reciprocal", "Softplus": "Softplus",
          "Not": "LogicalNot", "Sign": "Sign", "Identity": "Identity"}


@converter(*_BINARY)
def _binary(b, n):
    return _one(b, n, _BINARY[n.op], [b.ref(n.inputs[0]), b.ref(n.inputs[1])])


@converter("Div")
def _div(b, n):
    # integers: the registry's Div truncates toward zero, as ONNX's does
    op = "RealDiv" if b.dtype(n.inputs[0]) in FLOATS else "Div"
    return _one(b, n, op, [b.ref(n.inputs[0]), b.ref(n.inputs[1])])


@converter(*_UNARY)
def _unary(b, n):
    return _one(b, n, _UNARY[n.op], [b.ref(n.inputs[0])])


@converter("Max", "Min")
def _max_min(b, n):
    op = "Maximum" if n.op == "Max" else "Minimum"
    refs = [b.ref(i) for i in n.inputs]
    if len(refs) == 1:
        return _one(b, n, "Identity", refs)
    acc = refs[0]
    for k, r in enumerate(refs[1:-1]):
        acc = b.emit(f"{n.name}/{op}_{k}", op, [acc, r])
    return _one(b, n, op, [acc, refs[-1]])


@converter("LeakyRelu")
def _leaky(b, n):
    return _one(b, n, "LeakyRelu", [b.ref(n.inputs[0])], {"alpha": float(n.a("alpha", 0.01))})


@converter("Elu")
def _elu(b, n):
    if float(n.a("alpha", 1.0)) != 1.0:
        raise Fallback("Elu alpha != 1")
    return _one(b, n, "Elu", [b.ref(n.inputs[0])])


@converter("Gelu")
def _gelu(b, n):
    return _one(b, n, "_Gelu", [b.ref(n.inputs[0])], {"approximate": n.a("approximate", "none")})


def _clip_bounds(b, n):
    if n.opset < 11:
        return n.a("min"), n.a("max")
    lo = None if not n.inp(1) else float(np.asarray(b.need(n.inp(1), "Clip's min")))
    hi = None if not n.inp(2) else float(np.asarray(b.need(n.inp(2), "Clip's max")))
    return lo, hi


@converter("Clip")
def _clip(b, n):
    lo, hi = _clip_bounds(b, n)
    x = b.ref(n.inputs[0])
    t = b.dtype(n.inputs[0]) or "float32"
    if lo == 0 and hi == 6:
        return _one(b, n, "Relu6", [x])
    if lo == 0 and hi is None:
        return _one(b, n, "Relu", [x])
    if lo is None and hi is None:
        return _one(b, n, "Identity", [x])
    if lo is not None and hi is not None:
        x = b.emit(f"{n.name}/Maximum", "Maximum", [x, b.const(lo, f"{n.name}/min", t)])
        return _one(b, n, "Minimum", [x, b.const(hi, f"{n.name}/max", t)])
    if lo is not None:
        return _one(b, n, "Maximum", [x, b.const(lo, f"{n.name}/min", t)])
    return _one(b, n, "Minimum", [x, b.const(hi, f"{n.name}/max", t)])


@converter("HardSigmoid", "HardSwish")
def _hard(b, n):
    # onnxruntime's forms: HardSigmoid = max(0, min(1, alpha x + beta)); HardSwish = x HardSigmoid(x; 1/6, 1/2)
    alpha, beta = (1 / 6, 0.5) if n.op == "HardSwish" else (float(n.a("alpha", 0.2)), float(n.a("beta", 0.5)))
    t = b.dtype(n.inputs[0]) or "float32"
    x = b.ref(n.inputs[0])
    y = b.emit(f"{n.name}/mul", "Mul", [x, b.const(alpha, f"{n.name}/alpha", t)])
    y = b.emit(f"{n.name}/add", "AddV2", [y, b.const(beta, f"{n.name}/beta", t)])
    y = b.emit(f"{n.name}/max", "Maximum", [y, b.const(0, f"{n.name}/zero", t)])
    if n.op == "HardSigmoid":
        return _one(b, n, "Minimum", [y, b.const(1, f"{n.name}/one", t)])
    y = b.emit(f"{n.name}/min", "Minimum", [y, b.const(1, f"{n.name}/one", t)])
    return _one(b, n, "Mul", [x, y])


@converter("IsNaN")
def _isnan(b, n):
    # x != x is true exactly for NaN: a comparison on the AI Core
    x = b.ref(n.inputs[0])
    return _one(b, n, "NotEqual", [x, x], T=False)


@converter("Where")
def _where(b, n):
    return _one(b, n, "SelectV2", [b.ref(i) for i in n.inputs], T=False)


@converter("Cast")
def _cast(b, n):
    to = ONNX_DTYPES.get(int(n.a("to")))
    if to is None:
        raise Fallback(f"Cast to ONNX type {n.a('to')}")
    return _one(b, n, "Cast", [b.ref(n.inputs[0])], {"DstT": to, "SrcT": b.dtype(n.inputs[0]) or "float32"},
                T=False)


@converter("Dropout")
def _dropout(b, n):
    if len(n.outputs) > 1 and n.outputs[1]:
        raise Fallback("Dropout's mask output")
    return _one(b, n, "Identity", [b.ref(n.inputs[0])])


# -- cube ----------------------------------------------------------------------------------------
@converter("MatMul")
def _matmul(b, n):
    ra, rb = b.rank(n.inputs[0]), b.rank(n.inputs[1])
    if ra < 2 or rb < 2:
        raise Fallback("MatMul of a vector")
    op = "MatMul" if ra == rb == 2 else "BatchMatMulV2"
    return _one(b, n, op, [b.ref(n.inputs[0]), b.ref(n.inputs[1])])


@converter("Gemm")
def _gemm(b, n):
    alpha, beta = float(n.a("alpha", 1.0)), float(n.a("beta", 1.0))
    t = b.dtype(n.inputs[0]) or "float32"
    attrs = {"transpose_a": bool(n.a("transA", 0)), "transpose_b": bool(n.a("transB", 0)), "T": t}
    ab = [b.ref(n.inputs[0]), b.ref(n.inputs[1])]
    c = n.inp(2)
    if not c and alpha == 1.0:
        return _one(b, n, "MatMul", ab, attrs)
    y = b.emit(f"{n.name}/MatMul", "MatMul", ab, attrs)
    if alpha != 1.0:
        y = b.emit(f"{n.name}/alpha", "Mul", [y, b.const(alpha, f"{n.name}/alpha_value", t)]) if c else None
        if not c:
            return _one(b, n, "Mul", [f"{n.name}/MatMul:0", b.const(alpha, f"{n.name}/alpha_value", t)])
    cref = b.ref(c)
    if beta != 1.0:
        cref = b.emit(f"{n.name}/beta", "Mul", [cref, b.const(beta, f"{n.name}/beta_value", t)])
    if len(b.shape(c) or [None, None]) == 1:
        return _one(b, n, "BiasAdd", [y, cref], {"T": t})
    return _one(b, n, "AddV2", [y, cref], {"T": t})


@converter("Einsum")
def _einsum(b, n):
    return _one(b, n, "Einsum", [b.ref(i) for i in n.inputs], {"equation": n.a("equation")})


def _hw(v, k=2, default=1):
    v = list(v) if v is not None else [default] * k
    if len(v) != k:
        raise Fallback("not a 2-D window")
    return v


def _pads(n, k=2):
    auto = n.a("auto_pad", "NOTSET")
    if auto == "VALID":
        return "VALID", None
    if auto == "SAME_UPPER":
        return "SAME", None
    if auto == "SAME_LOWER":
        raise Fallback("auto_pad SAME_LOWER")
    p = list(n.a("pads") or [0] * (2 * k))
    if not any(p):
        return "VALID", None
    return "EXPLICIT", [0, 0, p[0], p[2], p[1], p[3], 0, 0]


@converter("Conv")
def _conv(b, n):
    r = b.rank(n.inputs[0])
    if r not in (3, 4):
        raise Fallback("Conv of rank other than 3 or 4")
    w = b.need(n.inputs[1], "Conv's weight")
    t = b.dtype(n.inputs[0]) or "float32"
    if r == 3:
        # Conv1d as TensorFlow's conv1d (Keras Conv1D) runs it: ExpandDims to a height of 1, Conv2D, Squeeze
        if n.a("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            raise Fallback("1-D Conv with auto_pad SAME")
        (s,), (d,) = _hw(n.a("strides"), 1), _hw(n.a("dilations"), 1)
        p = list(n.a("pads") or [0, 0])
        strides, dil = [1, s], [1, d]
        padding, explicit = ("VALID", None) if not any(p) else ("EXPLICIT", [0, 0, 0, 0, p[0], p[1], 0, 0])
        w = w[:, :, None, :]
        x = b.emit(f"{n.name}/ExpandDims", "ExpandDims", [b.ref(n.inputs[0]), b.const(np.int32(2), f"{n.name}/dim")])
    else:
        strides, dil = _hw(n.a("strides")), _hw(n.a("dilations"))
        padding, explicit = _pads(n)
        x = b.ref(n.inputs[0])
    hwio = b.const(np.ascontiguousarray(np.transpose(w, (2, 3, 1, 0))), f"{n.name}/filter_hwio")
    x = b.to_nhwc(x, 4, n.name)
    attrs = {"strides": [1, *strides, 1], "dilations": [1, *dil, 1], "padding": padding,
             "explicit_paddings": explicit or [], "data_format": "NHWC", "T": t}
    y = b.emit(f"{n.name}/Conv2D", "Conv2D", [x, hwio], attrs)
    if n.inp(2):
        y = b.emit(f"{n.name}/BiasAdd", "BiasAdd", [y, b.ref(n.inp(2))], {"T": t, "data_format": "NHWC"})
    if r == 3:
        y = b.emit(f"{n.name}/to_nchw", "Transpose", [y, b.ints(TO_NCHW[4], f"{n.name}/perm_nchw")])
        return _one(b, n, "Squeeze", [y], {"squeeze_dims": [2]}, T=False)
    return [b.to_nchw(y, 4, n.name)]


@converter("ConvTranspose")
def _conv_transpose(b, n):
    if b.rank(n.inputs[0]) != 4 or int(n.a("group", 1)) != 1 or any(d != 1 for d in _hw(n.a("dilations"))):
        raise Fallback("ConvTranspose: only 2-D, one group, no dilation")
    if n.a("output_shape") is not None or n.a("auto_pad", "NOTSET") != "NOTSET":
        raise Fallback("ConvTranspose with output_shape or auto_pad")
    w = b.need(n.inputs[1], "ConvTranspose's weight")          # (Cin, Cout, kh, kw)
    N, C, H, W = b.static_shape(n.inputs[0])
    s = _hw(n.a("strides"))
    p = list(n.a("pads") or [0, 0, 0, 0])
    op_ = _hw(n.a("output_padding"), default=0)
    kh, kw = w.shape[2:]
    oh = (H - 1) * s[0] + kh - p[0] - p[2] + op_[0]
    ow = (W - 1) * s[1] + kw - p[1] - p[3] + op_[1]
    # the convolution it is the gradient of: its bottom/right padding shrinks by output_padding
    pb, pr = p[2] - op_[0], p[3] - op_[1]
    if pb < 0 or pr < 0:
        raise Fallback("ConvTranspose output_padding over its padding")
    t = b.dtype(n.inputs[0]) or "float32"
    filt = b.const(np.ascontiguousarray(np.transpose(w, (2, 3, 1, 0))), f"{n.name}/filter_hwoi")
    x = b.to_nhwc(b.ref(n.inputs[0]), 4, n.name)
    sizes = b.const(np.asarray([N, oh, ow, w.shape[1]], np.int32), f"{n.name}/input_sizes")
    attrs = {"strides": [1, *s, 1], "dilations": [1, 1, 1, 1], "data_format": "NHWC", "T": t,
             "padding": "EXPLICIT", "explicit_paddings": [0, 0, p[0], pb, p[1], pr, 0, 0]}
    y = b.emit(f"{n.name}/Conv2DBackpropInput", "Conv2DBackpropInput", [sizes, filt, x], attrs)
    if n.inp(2):
        y = b.emit(f"{n.name}/BiasAdd", "BiasAdd", [y, b.ref(n.inp(2))], {"T": t, "data_format": "NHWC"})
    return [b.to_nchw(y, 4, n.name)]


# -- normalisation, softmax ------------------------------------------------------------------------
@converter("BatchNormalization")
def _batch_norm(b, n):
    if len([o for o in n.outputs if o]) > 1 or int(n.a("training_mode", 0)):
        raise Fallback("BatchNormalization in training mode")
    r = b.rank(n.inputs[0])
    t = b.dtype(n.inputs[0]) or "float32"
    x = b.ref(n.inputs[0])
    if r > 2:
        if r not in (3, 4, 5):
            raise Fallback("BatchNormalization of rank > 5")
        x = b.to_nhwc(x, r, n.name)
    params = [b.ref(i) for i in n.inputs[1:5]]
    attrs = {"epsilon": float(n.a("epsilon", 1e-5)), "is_training": False, "data_format": "NHWC", "T": t,
             "U": "float32"}
    if r == 2:
        return [b.emit(n.name, "FusedBatchNormV3", [x, *params], attrs, 6, exact=True)]
    y = b.emit(f"{n.name}/FusedBatchNormV3", "FusedBatchNormV3", [x, *params], attrs, 6)
    return [b.to_nchw(y, r, n.name)]


@converter("LayerNormalization")
def _layer_norm(b, n):
    if any(o for o in n.outputs[1:]):
        raise Fallback("LayerNormalization's mean / inverse deviation outputs")
    r = b.rank(n.inputs[0])
    axis = int(n.a("axis", -1)) % r
    ins = [b.ref(n.inputs[0]), b.ref(n.inputs[1])] + ([b.ref(n.inp(2))] if n.inp(2) else [])
    return _one(b, n, "_LayerNorm", ins, {"epsilon": float(n.a("epsilon", 1e-5)), "axis": list(range(axis, r)),
                                          "has_gamma": True, "has_beta": bool(n.inp(2))})


@converter("Softmax", "LogSoftmax")
def _softmax(b, n):
    r = b.rank(n.inputs[0])
    axis = int(n.a("axis", -1 if n.opset >= 13 else 1)) % r
    if axis == r - 1:
        return _one(b, n, n.op, [b.ref(n.inputs[0])])
    if n.opset < 13:
        raise Fallback(f"{n.op} of opset < 13 (over the flattened axes from axis on)")
    # over another axis as TensorFlow's softmax(axis=k) runs it: swap the axis with the last, softmax, swap back
    perm = list(range(r))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    y = b.emit(f"{n.name}/swap_in", "Transpose", [b.ref(n.inputs[0]), b.ints(perm, f"{n.name}/perm")])
    t = b.dtype(n.inputs[0])
    y = b.emit(f"{n.name}/{n.op}", n.op, [y], {"T": t} if t in FLOATS else {})
    return _one(b, n, "Transpose", [y, b.ints(perm, f"{n.name}/perm")], T=False)


# -- pooling -------------------------------------------------------------------------------------
@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(b, n):
    r = b.rank(n.inputs[0])
    op = "Mean" if n.op == "GlobalAveragePool" else "Max"
    return _one(b, n, op, [b.ref(n.inputs[0]), b.ints(list(range(2, r)), f"{n.name}/axes")], {"keep_dims": True})


@converter("MaxPool", "AveragePool")
def _pool(b, n):
    ceil = bool(int(n.a("ceil_mode", 0)))
    if b.rank(n.inputs[0]) != 4 or any(d != 1 for d in _hw(n.a("dilations"))):
        raise Fallback(f"{n.op}: only 2-D, no dilation")
    if ceil and n.a("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise Fallback(f"{n.op} with ceil_mode: only with explicit pads")
    if len([o for o in n.outputs if o]) > 1:
        raise Fallback("MaxPool's indices")
    k = _hw(n.a("kernel_shape"))
    s = _hw(n.a("strides"))
    padding, explicit = _pads(n)
    t = b.dtype(n.inputs[0]) or "float32"
    x = b.to_nhwc(b.ref(n.inputs[0]), 4, n.name)
    if ceil:
        # ceil mode: ONNX's output size ceil((size + pads - k) / s) + 1, a window that would start in the end
        # padding dropped (as torch's ceil_mode); the extra rows/columns are more -inf padding at the end
        H, W = (b.shape(n.inputs[0]) or [None] * 4)[2:4]
        if H is None or W is None:
            raise Fallback(f"{n.op} ceil_mode on an unknown height or width")
        p = (explicit or [0] * 8)[2:6]
        extra = []
        for size, kk, ss, (pb, pe) in ((H, k[0], s[0], p[0:2]), (W, k[1], s[1], p[2:4])):
            out = -(-(size + pb + pe - kk) // ss) + 1
            if (out - 1) * ss >= size + pb:
                out -= 1
            extra.append(max((out - 1) * ss + kk - (size + pb + pe), 0))
        if n.op == "AveragePool":
            return _avg_pool_ceil(b, n, x, k, s, p, extra, H, W)
        if any(extra):
            padding, explicit = "EXPLICIT", [0, 0, p[0], p[1] + extra[0], p[2], p[3] + extra[1], 0, 0]
    if padding == "EXPLICIT":
        H, W = (b.shape(n.inputs[0]) or [None] * 4)[2:4]
        if H is None or W is None:
            raise Fallback("MaxPool/AveragePool pads on an unknown height or width")
        pads = explicit[2:6]
        same = []
        for size, kk, ss in ((H, k[0], s[0]), (W, k[1], s[1])):
            out = -(-size // ss)
            tot = max((out - 1) * ss + kk - size, 0)
            same += [tot // 2, tot - tot // 2]
        if pads == same and not ceil:
            padding = "SAME"    # TensorFlow's SAME: the count of a window leaves the padding out
        elif n.op == "MaxPool" or int(n.a("count_include_pad", 0)):
            # max pooling never selects the padding: -inf, held in float16 so that no cast to fp16 overflows
            fill = b.const(-np.inf, f"{n.name}/pad_value", "float16") if n.op == "MaxPool" else \
                b.const(0.0, f"{n.name}/pad_value", t)
            x = b.emit(f"{n.name}/pad", "PadV2", [x, b.const(np.asarray([[0, 0], pads[0:2], pads[2:4], [0, 0]], np.int64),
                                                                 f"{n.name}/pads"), fill], {"T": t})
            padding = "VALID"
        else:
            return _avg_pool_v2(b, n, x, k, s, pads, ceil=False)
    op = "MaxPool" if n.op == "MaxPool" else "AvgPool"
    y = b.emit(f"{n.name}/{op}", op, [x], {"ksize": [1, *k, 1], "strides": [1, *s, 1], "padding": padding,
                                            "data_format": "NHWC", "T": t})
    return [b.to_nchw(y, 4, n.name)]


def _same_pads(size, k, s):
    out = -(-size // s)
    tot = max((out - 1) * s + k - size, 0)
    return out, [tot // 2, tot - tot // 2]


def _avg_pool_v2(b, n, x, k, s, p, ceil):
    """AveragePool as CANN's AvgPoolV2 (explicit pads, ceil_mode, exclusive = not count_include_pad) on the NHWC
    ``x``, where TensorFlow's AvgPool cannot express it."""
    t = b.dtype(n.inputs[0]) or "float32"
    y = b.emit(f"{n.name}/AvgPoolV2", "AvgPoolV2", [x], {
        "ksize": [1, *k, 1], "strides": [1, *s, 1], "pads": [int(v) for v in p], "ceil_mode": bool(ceil),
        "exclusive": not int(n.a("count_include_pad", 0)), "padding_mode": "CALCULATED", "data_format": "NHWC",
        "T": t})
    return [b.to_nchw(y, 4, n.name)]


def _avg_pool_ceil(b, n, x, k, s, p, extra, H, W):
    """AveragePool with ceil_mode. onnxruntime (as torch) divides by the window's elements inside the input and
    its explicit pads (count_include_pad) or inside the input alone: the ceil mode's extra end rows/columns are
    never counted. That is TensorFlow's SAME AvgPool (padding left out of the count) wherever the padding left
    out is SAME's own split and the output size SAME's: count_include_pad's pads become zeros of a PadV2 first
    (counted), the rest is SAME's. ResNet-D's AvgPool2d(2, 2, ceil_mode=True) is one such; the others are CANN's
    AvgPoolV2 (:func:`_avg_pool_v2`)."""
    include = int(n.a("count_include_pad", 0)) and any(p)
    if include:
        size_h, size_w, left_out = H + p[0] + p[1], W + p[2] + p[3], [0, extra[0], 0, extra[1]]
    else:
        size_h, size_w, left_out = H, W, [p[0], p[1] + extra[0], p[2], p[3] + extra[1]]
    padding = "SAME" if any(left_out) else "VALID"
    if padding == "SAME":
        for size, kk, ss, pads in ((size_h, k[0], s[0], left_out[0:2]), (size_w, k[1], s[1], left_out[2:4])):
            out, same = _same_pads(size, kk, ss)
            if same != pads or (out - 1) * ss + kk != size + sum(pads):
                return _avg_pool_v2(b, n, x, k, s, p, ceil=True)
    t = b.dtype(n.inputs[0]) or "float32"
    if include:
        pads = b.const(np.asarray([[0, 0], p[0:2], p[2:4], [0, 0]], np.int64), f"{n.name}/pads")
        x = b.emit(f"{n.name}/pad", "PadV2", [x, pads, b.const(0.0, f"{n.name}/pad_value", t)], {"T": t})
    y = b.emit(f"{n.name}/AvgPool", "AvgPool", [x], {"ksize": [1, *k, 1], "strides": [1, *s, 1], "padding": padding,
                                                   "data_format": "NHWC", "T": t})
    return [b.to_nchw(y, 4, n.name)]


# -- reductions ----------------------------------------------------------------------------------
_REDUCE = {"ReduceMean": "Mean", "ReduceSum": "Sum", "ReduceMax": "Max", "ReduceMin": "Min", "ReduceProd": "Prod"}


@converter(*_REDUCE)
def _reduce(b, n):
    axes_as_input = n.opset >= (13 if n.op == "ReduceSum" else 18)
    if axes_as_input:
        axes = None if not n.inp(1) else [int(a) for a in np.asarray(b.need(n.inp(1), "the axes")).reshape(-1)]
    else:
        axes = n.a("axes")
    r = b.rank(n.inputs[0])
    if not axes:
        if int(n.a("noop_with_empty_axes", 0)):
            return _one(b, n, "Identity", [b.ref(n.inputs[0])])
        axes = list(range(r))
    axes = [int(a) % r for a in axes]
    return _one(b, n, _REDUCE[n.op], [b.ref(n.inputs[0]), b.ints(axes, f"{n.name}/axes")],
                {"keep_dims": bool(n.a("keepdims", 1))})
