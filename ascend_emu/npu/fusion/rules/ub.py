"""UB fusion passes: chains of elementwise ops computed in one pass through the Unified Buffer.

TbeEltwiseFusionPass appends a chain to a cube op (applied to its float32 accumulator);
AutomaticUbFusion fuses chains of gray-list elementwise ops, at most ``UB_MAX_OPS`` a
piece. Every step runs in float32 and the chain rounds once (NUMERICS.md section 6).
"""
from __future__ import annotations

import numpy as np

from ....graph.core import Node, tensor_name
from ..registry import UB, fusion_rule
from ..rewriter import Rewriter
from .common import (CONV_TYPES, ELTWISE, FUSED_CUBE, UB_MAX_OPS, _as_fused_cube, _ascend_of, _attrs_of,
                     _fused_attrs, _fused_node, _gray_eltwise)

def _einsum_lowers(equation) -> bool:
    """The cube kernel lowers this two-operand Einsum to one batch matmul (else it runs on the AI CPU)."""
    from ....errors import AscendEmuError
    from ....ops.nn_ops import _einsum_plan

    if not isinstance(equation, str):
        return False
    if "..." in equation:
        return True   # resolved per call from the operands' ranks; the kernel checks it when it runs
    try:
        _einsum_plan(equation, (None, None))
    except (AscendEmuError, NotImplementedError):
        return False
    return True


def _eltwise(rw: Rewriter, node: Node) -> bool:
    if not _gray_eltwise(node, rw.lists) or not rw.is_float(node):
        return False
    if node.op == "BiasAdd" and node.attrs.get("data_format", "NHWC") not in ("NHWC", "N..C"):
        return False
    return True


def _step(node: Node, inputs: list, value_ref: str | None) -> dict:
    """One chain step: the op, its arguments (-1: the running value, k: the fused node's input k)."""
    args = []
    for ref in node.inputs:
        ref = tensor_name(ref)
        if ref == value_ref:
            args.append(-1)
        else:
            if ref not in inputs:
                inputs.append(ref)
            args.append(inputs.index(ref))
    return {"op": node.op, "args": args, "attrs": _attrs_of(node, ELTWISE[node.op]), "name": node.name}


def _chain_after(rw: Rewriter, start: Node, limit: int, ok=None) -> list[Node]:
    """The elementwise ops reading ``start`` one after another, each the sole reader of the last (and each passing
    ``ok``, where given)."""
    chain: list[Node] = []
    cur = start
    while len(chain) < limit:
        r = rw.sole_reader(cur)
        if r is None or not _eltwise(rw, r) or (ok is not None and not ok(r)):
            break
        chain.append(r)
        cur = r
    return chain


#: the ONNX loader's Transpose of a convolution's NHWC result back to ONNX's NCHW
_TO_NCHW = (0, 3, 1, 2)


def _to_nchw_after(rw: Rewriter, node: Node) -> Node | None:
    """The Transpose to NCHW that is the sole reader of convolution ``node`` (an ONNX model's layout change, which
    ATC, working in NCHW, does not have), or None."""
    if node.attrs.get("base", node.op) not in CONV_TYPES:
        return None
    t = rw.sole_reader(node)
    if t is None or t.op != "Transpose" or len(t.inputs) != 2 or tensor_name(t.inputs[0]) != f"{node.name}:0":
        return None
    if not rw.is_const(t.inputs[1]):
        return None
    try:
        perm = tuple(int(p) for p in rw.value(t.inputs[1]).reshape(-1))
    except (TypeError, ValueError):
        return None
    return t if perm == _TO_NCHW else None


def _through_ok(rw: Rewriter, node: Node) -> bool:
    """Whether chain op ``node`` may follow the Transpose to NCHW into the fused convolution, which computes in NHWC
    with its operands transposed alike (the same values, numpy's broadcasting kept): any elementwise op but a
    BiasAdd, which adds along its layout's last axis, and none reading a constant of more than 4 dimensions (it
    broadcasts the result past the layout's)."""
    if node.op == "BiasAdd":
        return False
    return not any(rw.is_const(r) and np.ndim(rw.value(r)) > 4 for r in node.inputs)


@fusion_rule(
    "TbeEltwiseFusionPass", UB,
    pattern="a cube op (Conv2D, DepthwiseConv2dNative, MatMul, BatchMatMul(V2), Einsum, or one fused by the "
            "graph passes) -> a chain of elementwise ops (Relu, Relu6, Add/AddV2 (also a residual tensor), "
            "Mul, Sub, ...; gray-list, each the sole reader of the previous), up to 28; after an ONNX model's "
            "convolution, through the loader's Transpose back to NCHW",
    numerics="the chain is applied to the float32 accumulator in the vector unit in float32, then one "
             "rounding to the cube op's output dtype; unfused, the cube output and every elementwise result "
             "are rounded to the compute dtype")
def tbe_eltwise(rw: Rewriter) -> int:
    n = 0
    cube = tuple(FUSED_CUBE) + ("_FusedConv2D", "_FusedMatMul", "_FusedBatchMatMul")
    for node in rw.candidates(cube):
        if (node.attrs.get("chain") or node.attrs.get("reshape") is not None
                or node.attrs.get("transpose") is not None):
            continue   # (a Reshape fused after the product, MatMulReshapeBiasAddFusionPass: the chain is not assumed
            # to reach across it; NUMERICS.md section 6)
        if node.op == "Einsum" and (len(node.inputs) != 2 or not _einsum_lowers(node.attrs.get("equation"))):
            continue   # the cube cannot run it: it stays a plain Einsum for the AI CPU fallback
        chain = _chain_after(rw, node, UB_MAX_OPS)
        through = None
        if not chain:
            # an ONNX convolution runs in NHWC and is transposed back to NCHW before its Relu: the chain continues
            # through that Transpose (ATC's graph has none): its ops computed in NHWC on the accumulator, their other
            # operands transposed alike, and the result transposed (NUMERICS.md section 9)
            through = _to_nchw_after(rw, node)
            if through is not None:
                chain = _chain_after(rw, through, UB_MAX_OPS, lambda op: _through_ok(rw, op))
        if not chain:
            continue
        inputs = [tensor_name(r) for r in node.inputs]
        steps, value = [], (through or node).name + ":0"
        for op in chain:
            steps.append(_step(op, inputs, value))
            value = op.name + ":0"
        changes = {"chain": steps}
        if through is not None:
            perm = tensor_name(through.inputs[1])
            if perm not in inputs:
                inputs.append(perm)
            changes["transpose"] = inputs.index(perm)
        fused = _as_fused_cube(node, chain[-1].name, **changes)
        fused.inputs = inputs
        rw.fuse("TbeEltwiseFusionPass", [node, *([through] if through is not None else []), *chain], fused)
        n += 1
    return n


def _chain_pred(rw: Rewriter, node: Node) -> Node | None:
    """The elementwise op whose only use is ``node``'s first such input (the chain continues through it)."""
    for ref in node.inputs:
        p = rw.node(ref)
        if _eltwise(rw, p) and rw.sole_reader(p) is node:
            return p
    return None


@fusion_rule(
    "AutomaticUbFusion", UB,
    pattern="a chain of 2 to 28 elementwise ops (gray-list Add, Mul, Sub, Relu, Exp, Tanh, ...), each the sole "
            "reader of the previous; other operands (constants or tensors) broadcast into the chain",
    numerics="computed in one pass in the Unified Buffer: every step in float32, one rounding to the compute "
             "dtype at the end; unfused, every op rounds to the compute dtype")
def automatic_ub(rw: Rewriter) -> int:
    n = 0
    for head in rw.nodes():
        if not rw.alive(head) or not _eltwise(rw, head) or _chain_pred(rw, head) is not None:
            continue
        chain = [head]
        while True:
            r = rw.sole_reader(chain[-1])
            if r is None or not _eltwise(rw, r) or _chain_pred(rw, r) is not chain[-1]:
                break
            chain.append(r)
        for i in range(0, len(chain), UB_MAX_OPS):
            piece = chain[i:i + UB_MAX_OPS]
            if len(piece) < 2:
                continue
            inputs: list = []
            steps, value = [], None
            for op in piece:
                steps.append(_step(op, inputs, value))
                value = op.name + ":0"
            fused = _fused_node(piece[-1].name, "_EltwiseChain", inputs, _fused_attrs(piece[-1], chain=steps),
                                _ascend_of(piece[0]))
            rw.fuse("AutomaticUbFusion", piece, fused)
            n += 1
    return n
