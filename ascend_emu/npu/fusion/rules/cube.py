"""Graph passes around the cube unit: a dilated convolution recovered, a bias or a batch norm folded into the cube op.

SpaceToBatchConv2dBatchToSpacePass: TensorFlow's SpaceToBatchND -> Conv2D -> BatchToSpaceND form of a
dilated convolution becomes one Conv2D with dilations on the cube. BiasaddConvFusionPass,
ConvBatchnormFusionPass, MatMulBiasAddFusionPass and MatMulReshapeBiasAddFusionPass: the bias enters the float32
accumulator (L0C) before the single rounding to the output dtype; the batch norm's scale is folded into the filter
on the host (NUMERICS.md section 6).
"""
from __future__ import annotations

import numpy as np

from ....graph.core import Node, tensor_name
from ..registry import GRAPH, fusion_rule
from ..rewriter import Rewriter
from .common import (BATCH_MATMUL_TYPES, BATCH_NORM_TYPES, BIAS_ADD_TYPES, CONV_TYPES, MATMUL_TYPES, _as_fused_cube,
                     _fused_node)

#: SpaceToBatchConv2dBatchToSpacePass leaves a pad, a dilation or a dilated kernel extent above this alone
DILATED_CONV_MAX = 255


def _int_const(rw: Rewriter, ref: str, shape: tuple) -> list | None:
    """The integer constant ``ref`` as a (nested) list when it has ``shape``, else None."""
    if not rw.is_const(ref):
        return None
    v = np.asarray(rw.value(ref))
    return v.astype(np.int64).tolist() if v.dtype.kind in "iu" and v.shape == shape else None


def _dilated_conv(rw: Rewriter, conv: Node):
    """(SpaceToBatchND, BatchToSpaceND, dilations, explicit paddings) around ``conv``, or None."""
    s2b = rw.node(conv.inputs[0])
    if s2b.op != "SpaceToBatchND" or len(s2b.inputs) != 3 or rw.sole_reader(s2b) is not conv:
        return None
    b2s = rw.sole_reader(conv)
    if b2s is None or b2s.op != "BatchToSpaceND" or len(b2s.inputs) != 3 or not rw.is_float(b2s):
        return None
    if conv.attrs.get("data_format", "NHWC") != "NHWC" or list(conv.attrs.get("dilations", [1] * 4)) != [1] * 4 \
            or list(conv.attrs.get("strides", [1] * 4)) != [1] * 4:
        return None
    pads = conv.attrs.get("padding", "VALID")
    if not (pads == "VALID" or pads == "EXPLICIT" and not any(conv.attrs.get("explicit_paddings", ()))):
        return None
    block, paddings = _int_const(rw, s2b.inputs[1], (2,)), _int_const(rw, s2b.inputs[2], (2, 2))
    crops = _int_const(rw, b2s.inputs[2], (2, 2))
    if block is None or paddings is None or crops is None or _int_const(rw, b2s.inputs[1], (2,)) != block:
        return None
    w = np.shape(rw.value(conv.inputs[1])) if rw.is_const(conv.inputs[1]) else ()
    if len(w) != 4 or any(c != 0 for row in crops for c in row) or any(p < 0 for row in paddings for p in row):
        return None
    if any(b < 1 or b > DILATED_CONV_MAX or (k - 1) * b + 1 > DILATED_CONV_MAX for b, k in zip(block, w[:2])) \
            or any(p > DILATED_CONV_MAX for row in paddings for p in row):
        return None
    return s2b, b2s, [1, *block, 1], [0, 0, *paddings[0], *paddings[1], 0, 0]


@fusion_rule(
    "SpaceToBatchConv2dBatchToSpacePass", GRAPH,
    pattern="SpaceToBatchND (constant block_shape [bh, bw], paddings >= 0) -> Conv2D (NHWC, stride 1, no padding, "
            "no dilation, constant filter) -> BatchToSpaceND (the same block_shape, crops all 0), each the sole "
            "reader of the previous: TensorFlow's form of a dilated Conv2D (Keras Conv2D(dilation_rate>1))",
    numerics="none: one Conv2D with dilations [1, bh, bw, 1] and the SpaceToBatchND paddings as its pads computes "
             "the same products in the same order; the two data-movement ops leave the graph (here: the AI CPU)")
def spacetobatch_conv2d_batchtospace(rw: Rewriter) -> int:
    n = 0
    for conv in rw.candidates("Conv2D"):
        m = _dilated_conv(rw, conv)
        if m is None:
            continue
        s2b, b2s, dilations, pads = m
        attrs = dict(conv.attrs, dilations=dilations, padding="EXPLICIT", explicit_paddings=pads)
        taken = rw.const_chain([*s2b.inputs[1:], *b2s.inputs[1:]], {s2b.name, conv.name, b2s.name})
        fused = _fused_node(b2s.name, "Conv2D", [s2b.inputs[0], conv.inputs[1]], attrs,
                            conv.meta.get("ascend_type") or "Conv2D")
        rw.fuse("SpaceToBatchConv2dBatchToSpacePass", [s2b, conv, b2s, *taken], fused)
        n += 1
    return n

def _conv_channels(rw: Rewriter, conv: Node) -> int | None:
    w = conv.inputs[1]
    if not rw.is_const(w):
        return None
    shape = np.shape(rw.value(w))
    if len(shape) != 4:
        return None
    base = conv.attrs.get("base", conv.op)
    return int(shape[2] * shape[3]) if base == "DepthwiseConv2dNative" else int(shape[3])


def _channel_vector(v, c: int | None) -> np.ndarray | None:
    """``v`` as a float32 vector over the last (channel) axis of size ``c``, if it is one."""
    v = np.asarray(v)
    if v.dtype.kind != "f" or v.ndim == 0 or any(d != 1 for d in v.shape[:-1]):
        return None
    if c is not None and v.shape[-1] != c:
        return None
    return v.reshape(-1).astype(np.float32)


def _bias_of(rw: Rewriter, add: Node, x_ref: str, c: int | None) -> tuple[np.ndarray, str] | None:
    """(bias vector, its tensor) when ``add`` adds a constant channel vector to ``x_ref``."""
    if add.op not in BIAS_ADD_TYPES or not rw.is_float(add):
        return None
    if add.op == "BiasAdd":
        if tensor_name(add.inputs[0]) != tensor_name(x_ref) \
                or add.attrs.get("data_format", "NHWC") not in ("NHWC", "N..C"):
            return None
        b = tensor_name(add.inputs[1])
    else:
        b = rw.other(add, x_ref)
    if b is None or not rw.is_const(b):
        return None
    vec = _channel_vector(rw.value(b), c)
    return None if vec is None else (vec, b)


@fusion_rule(
    "BiasaddConvFusionPass", GRAPH,
    pattern="Conv2D | DepthwiseConv2dNative -> BiasAdd | Add | AddV2 (constant per-output-channel vector)",
    numerics="the bias is added to the float32 accumulator (L0C) before the single rounding to the output "
             "dtype; unfused, the conv output is rounded, then the bias add rounds again in the vector unit")
def biasadd_conv(rw: Rewriter) -> int:
    n = 0
    for conv in rw.candidates(CONV_TYPES):
        n += _fuse_bias(rw, "BiasaddConvFusionPass", conv, _conv_channels(rw, conv))
    return n


def _fuse_bias(rw: Rewriter, rule: str, cube: Node, channels: int) -> int:
    """Fuse ``cube`` with its sole reader when that adds a constant per-channel bias; 1 if fused."""
    add = rw.sole_reader(cube)
    found = add is not None and _bias_of(rw, add, cube.name + ":0", channels)
    if not found:
        return 0
    bias, bref = found
    # (the cube op is not "inside": a chain node it reads stays, as the fused op reads it too)
    taken = rw.const_chain([bref], {add.name})
    rw.fuse(rule, [cube, add, *taken], _as_fused_cube(cube, add.name, bias=bias))
    return 1


def _bn_scale_shift(rw: Rewriter, conv: Node, c: int):
    """Match the batch norm after ``conv``: (nodes, const refs, scale, shift, last) or None."""
    first = rw.sole_reader(conv)
    if first is None or not rw.is_float(first):
        return None
    ref = conv.name + ":0"
    if first.op in BATCH_NORM_TYPES:
        if tensor_name(first.inputs[0]) != ref or first.attrs.get("is_training", False) \
                or first.attrs.get("data_format", "NHWC") != "NHWC" or len(first.inputs) != 5:
            return None
        params = [tensor_name(r) for r in first.inputs[1:]]
        if any(rw.is_used(t) for t in first.outputs()[1:]):
            return None   # the batch statistics outputs are used
        if not all(rw.is_const(p) for p in params):
            return None
        gamma, beta, mean, var = (_channel_vector(rw.value(p), c) for p in params)
        if any(v is None for v in (gamma, beta, mean, var)):
            return None
        eps = np.float32(first.attrs.get("epsilon", 1e-3))
        # the host op (ConvBnFilterHost/ConvBnBiasHost) computes in float32
        scale = (gamma / np.sqrt(var + eps)).astype(np.float32)
        shift = (beta - mean * scale).astype(np.float32)
        return [first], params, scale, shift, first
    # the Keras / tf.nn.batch_normalization form: x * scale + shift, scale and shift constant chains
    if first.op != "Mul":
        return None
    s_ref = rw.other(first, ref)
    if s_ref is None or not rw.is_const(s_ref):
        return None
    scale = _channel_vector(rw.value(s_ref), c)
    second = rw.sole_reader(first)
    if scale is None or second is None or second.op not in ("Add", "AddV2", "Sub") or not rw.is_float(second):
        return None
    t_ref = rw.other(second, first.name + ":0")
    if t_ref is None or not rw.is_const(t_ref):
        return None
    if second.op == "Sub" and tensor_name(second.inputs[0]) != first.name + ":0":
        return None
    shift = _channel_vector(rw.value(t_ref), c)
    if shift is None:
        return None
    if second.op == "Sub":
        shift = -shift
    return [first, second], [s_ref, t_ref], scale, shift, second


@fusion_rule(
    "ConvBatchnormFusionPass", GRAPH,
    pattern="Conv2D | DepthwiseConv2dNative (| the bias-fused conv of BiasaddConvFusionPass) -> batch norm with "
            "constant parameters: FusedBatchNormV3 (inference) or the Mul(scale) -> AddV2 | Sub(shift) form "
            "Keras 3 and tf.nn.batch_normalization emit",
    numerics="scale = gamma / sqrt(var + eps) and shift = beta - mean * scale are computed on the host in "
             "float32; the filter is folded (w * scale per output channel, float32) and cast to the cube dtype "
             "(fp16 folded weights can overflow or lose precision); the bias b * scale + shift is added in "
             "the float32 accumulator; one rounding of the output. Unfused: conv rounded, BN parameters "
             "computed in the vector dtype, Mul and Add each rounded")
def conv_batchnorm(rw: Rewriter) -> int:
    n = 0
    for conv in rw.candidates():
        if conv.op not in CONV_TYPES and not (conv.op == "_FusedConv2D" and not conv.attrs.get("chain")):
            continue
        c = _conv_channels(rw, conv)
        if c is None:
            continue
        m = _bn_scale_shift(rw, conv, c)
        if m is None:
            continue
        bn_nodes, params, scale, shift, last = m
        w = np.asarray(rw.value(conv.inputs[1]), dtype=np.float32)
        base = conv.attrs.get("base", conv.op)
        if base == "DepthwiseConv2dNative":
            w2 = w * scale.reshape(w.shape[2], w.shape[3])
        else:
            w2 = w * scale
        bias = conv.attrs.get("bias")
        bias2 = shift if bias is None else (np.asarray(bias, np.float32) * scale + shift).astype(np.float32)
        filt = Node(f"{last.name}/ConvBnFilterHost", "Const", [],
                    {"value": w2.astype(np.float32), "dtype": "float32"})
        inside = {conv.name, *(b.name for b in bn_nodes)}
        taken = rw.const_chain(params, inside)
        fused = _as_fused_cube(conv, last.name, bias=bias2.astype(np.float32))
        fused.inputs = [conv.inputs[0], filt.name + ":0"]
        rw.fuse("ConvBatchnormFusionPass", [conv, *bn_nodes, *taken], fused, new_consts=[filt])
        n += 1
    return n


def _einsum_bias_ok(equation: str, ndims) -> bool:
    """Einsum lowers to one batch matmul whose output ends with a label of the second operand only."""
    from ....errors import AscendEmuError
    from ....ops.nn_ops import _einsum_plan

    if not isinstance(equation, str) or "..." in equation:
        return False
    try:
        a, b, out, batch, free_a, free_b, contract = _einsum_plan(equation, ndims)
    except (AscendEmuError, NotImplementedError):
        # an equation the cube kernel does not lower stays unfused and takes the unsupported-op path
        return False
    return bool(out) and out[-1] in free_b


def _matmul_n(rw: Rewriter, mm: Node) -> int | None:
    """Output columns of a (batch) matmul, when its second operand is a constant."""
    b = mm.inputs[1] if len(mm.inputs) > 1 else None
    if b is None or not rw.is_const(b) or mm.op == "Einsum":
        return None
    shape = np.shape(rw.value(b))
    if mm.op == "MatMul":
        return int(shape[0] if mm.attrs.get("transpose_b") else shape[1])
    return int(shape[-2] if mm.attrs.get("adj_y") else shape[-1])


@fusion_rule(
    "MatMulBiasAddFusionPass", GRAPH,
    pattern="MatMul | BatchMatMul(V2) | two-operand Einsum lowered to a batch matmul -> BiasAdd | Add | AddV2 "
            "(constant vector over the output columns)",
    numerics="the bias is added in the float32 accumulator before the single rounding to the output dtype; "
             "unfused, the matmul output is rounded and the add rounds again")
def matmul_biasadd(rw: Rewriter) -> int:
    n = 0
    for mm in rw.candidates(MATMUL_TYPES + BATCH_MATMUL_TYPES):
        if mm.op == "Einsum":
            if len(mm.inputs) != 2 or not _einsum_bias_ok(mm.attrs.get("equation", ""), (None, None)):
                continue
        n += _fuse_bias(rw, "MatMulBiasAddFusionPass", mm, _matmul_n(rw, mm))
    return n


def _last_dim(rw: Rewriter, reshape: Node) -> int | None:
    """The last dimension of ``reshape``'s output: TensorFlow's inferred shape, else its constant shape input; None
    where neither says (a -1 there, a shape computed in the graph of an ONNX model)."""
    shapes = reshape.output_shapes
    if shapes and shapes[0] and shapes[0][-1] is not None:
        return int(shapes[0][-1])
    ref = tensor_name(reshape.inputs[1])
    if rw.is_const(ref):
        target = np.asarray(rw.value(ref)).reshape(-1)
        if target.size == 0:
            return 0
        return int(target[-1]) if int(target[-1]) >= 0 else None   # (a -1: resolved when it runs)
    return None


@fusion_rule(
    "MatMulReshapeBiasAddFusionPass", GRAPH,
    pattern="MatMul (two operands, constant weights, no bias yet) -> Reshape keeping the last dimension -> BiasAdd "
            "(NHWC) | Add | AddV2 of a constant 1-D vector over the output columns, each the sole reader of the "
            "previous: TensorFlow's Tensordot, what Keras' Dense emits on a 3-D input",
    numerics="the bias is added in the float32 accumulator before the single rounding to the output dtype, as "
             "MatMulBiasAddFusionPass; the Reshape only renames the elements. Unfused, the product is rounded and "
             "the add rounds again")
def matmul_reshape_biasadd(rw: Rewriter) -> int:
    # CANN's pass (canndev ops/built-in/fusion_pass/graph_fusion/ai_core/matmul_reshape_biasadd_fusion_pass.cpp)
    # links the bias into the MatMul, hands the BiasAdd's readers the Reshape's output and deletes the BiasAdd; here
    # the three are one node named after the BiasAdd (its tensor is the one compared), the Reshape as the fused
    # op's last step (``reshape``: the index of its shape input). Left alone, as CANN leaves it: a MatMul with
    # other readers, a Reshape whose last dimension is not the product's columns (checked here where TensorFlow's
    # inferred shape or a constant shape input says it; else at run time, ops/fused_ops.fused_matmul), a bias
    # that is not a constant vector of that size. Also left alone here: a Reshape with other readers (CANN's rewiring
    # would hand them the biased product).
    n = 0
    for mm in rw.candidates(MATMUL_TYPES):
        if len(mm.inputs) != 2 or mm.attrs.get("bias") is not None:
            continue
        reshape = rw.sole_reader(mm)
        if reshape is None or reshape.op != "Reshape" or tensor_name(reshape.inputs[0]) != mm.name + ":0":
            continue
        add = rw.sole_reader(reshape)
        cols = _matmul_n(rw, mm)
        if add is None or cols is None:
            continue
        found = _bias_of(rw, add, reshape.name + ":0", cols)
        if not found or np.ndim(rw.value(found[1])) != 1:
            continue   # (CANN's check for Add: a 1-D bias; one of more dimensions may broadcast the output wider)
        last = _last_dim(rw, reshape)
        if last is not None and last != cols:
            continue
        bias, bref = found
        # (the MatMul is not "inside": a chain node it reads stays, as the fused op reads it too)
        taken = rw.const_chain([bref], {reshape.name, add.name})
        fused = _as_fused_cube(mm, add.name, bias=bias, reshape=2)
        fused.inputs = [*mm.inputs, reshape.inputs[1]]
        rw.fuse("MatMulReshapeBiasAddFusionPass", [mm, reshape, add, *taken], fused)
        n += 1
    return n
