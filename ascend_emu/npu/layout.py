"""Layouts decided once per graph: transpose pairs cancelled around elementwise ops, for replays nobody watches.

The ONNX front end gives the registry's NHWC ops (convolutions, pools, batch norm) their NCHW operands through
explicit ``Transpose`` nodes: ``conv -> to NCHW -> Relu -> to NHWC -> conv``. The elementwise ops between such
a pair compute the same bits in either layout (one result per element, status bits ORed over all of them), so
when only the graph's outputs are observable (no dump, ``keep_tensors=False``) :func:`nhwc_plan` lets them read
the NHWC tensor itself and drops both transposes (and their perm constants): a region of the graph grown from
a transpose to NCHW through elementwise ops (unary, binary with a one-element constant, or binary on two
tensors of the region) whose every other reader is a transpose back to NHWC. A region read by anything else
(a reduction over NCHW axes, a reshape, a graph output) stays as it is. A fused convolution whose chain went
through such a transpose (TbeEltwiseFusionPass on an ONNX model: ``transpose``) counts as the convolution followed
by that transpose. The plan never mutates the graph's nodes: the ops it moves are copies.
"""
from __future__ import annotations

import numpy as np

from ..graph.core import Node, tensor_name
from ..ops import OPS, VECTOR

_TO_NCHW = (0, 3, 1, 2)
_TO_NHWC = (0, 2, 3, 1)
#: elementwise ops of the registry that do not care about layout: one result per element
UNARY = frozenset({"Relu", "Relu6", "Elu", "Selu", "Sigmoid", "Tanh", "Softplus", "Softsign", "Neg", "Abs", "Exp",
                   "Log", "Sqrt", "Rsqrt", "Square", "Reciprocal", "Erf", "LeakyRelu", "Floor", "Ceil", "Sign"})
BINARY = frozenset({"Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "Maximum", "Minimum", "Pow",
                    "SquaredDifference"})


def _const_values(nodes) -> dict:
    return {f"{n.name}:0": n.attrs.get("value") for n in nodes if n.op == "Const"}


def _perm(node: Node, consts: dict):
    if node.op != "Transpose" or len(node.inputs) != 2:
        return None
    v = consts.get(tensor_name(node.inputs[1]))
    if not isinstance(v, np.ndarray) or v.shape != (4,):
        return None
    return tuple(int(p) for p in v)


def _agnostic(node: Node) -> bool:
    opdef = OPS.get(node.op)
    if opdef is None or opdef.kind != VECTOR or opdef.eltwise is None or node.num_outputs != 1:
        return False
    if "data_format" in node.attrs:
        return False
    return (node.op in UNARY and len(node.inputs) == 1) or (node.op in BINARY and len(node.inputs) == 2)


def _concat_axis(node: Node, consts: dict) -> bool:
    """Whether ``node`` is a ConcatV2 along NCHW's channel axis (a constant 1 or -3)."""
    if node.op != "ConcatV2" or len(node.inputs) < 2:
        return False
    v = consts.get(tensor_name(node.inputs[-1]))
    return isinstance(v, np.ndarray) and v.ndim == 0 and int(v) in (1, -3)


def _follow(redirect: dict, t: str) -> str:
    """The tensor ``t``'s readers read instead: a transpose back to NHWC may read a cancelled transpose to NCHW
    directly (a fused convolution's, :func:`_split_transposed`), whose own input is then read."""
    while t in redirect:
        t = redirect[t]
    return t


def _four_d(ref: str, producer: dict, memo: dict, depth: int = 0) -> bool:
    """Whether tensor ``ref`` has at most 4 dimensions by how it is made: a constant's shape, a transpose by a
    4-element permutation, a fused convolution whose chain operands have (its result is NHWC's or NCHW's), or a
    layout-agnostic op of such tensors; anything else (or a derivation deeper than 200) is not known to."""
    ref = tensor_name(ref)
    if ref in memo:
        return memo[ref]
    n = producer.get(ref)
    if n is None or depth > 200:
        return False
    if n.op == "Const":
        ok = np.ndim(n.attrs.get("value")) <= 4
    elif n.op == "Transpose":
        perm = producer.get(tensor_name(n.inputs[1])) if len(n.inputs) == 2 else None
        ok = perm is not None and perm.op == "Const" and np.size(perm.attrs.get("value")) == 4
    elif n.op == "_FusedConv2D":
        ok = _four_d_operands(n, producer, memo, depth + 1)
    else:
        ok = _agnostic(n) and all(_four_d(i, producer, memo, depth + 1) for i in n.input_names())
    memo[ref] = ok
    return ok


def _four_d_operands(n: Node, producer: dict, memo: dict, depth: int = 0) -> bool:
    """Whether every chain operand of fused convolution ``n`` has at most 4 dimensions (:func:`_four_d`)."""
    used = {a for step in n.attrs.get("chain") or () for a in step["args"] if a >= 0}
    return all(_four_d(n.inputs[a], producer, memo, depth) for a in used)


def _split_transposed(nodes: list) -> list:
    """``nodes`` with each fused convolution whose result is transposed to NCHW (``transpose``: TbeEltwiseFusionPass
    through an ONNX model's Transpose, :mod:`ascend_emu.npu.fusion.rules.ub`) as two nodes: the convolution with
    its chain in NHWC (``transpose_out`` False) under a new name, then a Transpose under the fused op's name, which
    the plan cancels like the loader's own (the same values: the transpose moves them). Only where every chain
    operand has at most 4 dimensions (:func:`_four_d_operands`): a wider one makes the result wider, which the fused
    op computes itself."""
    names = None
    out = []
    producer, memo = None, {}
    for n in nodes:
        k = n.attrs.get("transpose") if n.op == "_FusedConv2D" else None
        if k is None or n.attrs.get("transpose_out") is False:
            out.append(n)
            continue
        if producer is None:
            producer = {f"{m.name}:0": m for m in nodes}
        if not _four_d_operands(n, producer, memo):
            out.append(n)   # (an operand of unknown rank may broadcast the result past NHWC's 4 dimensions)
            continue
        if names is None:
            names = {m.name for m in nodes}
        name = f"{n.name}/nhwc"
        while name in names:
            name += "_"
        names.add(name)
        out.append(Node(name=name, op=n.op, inputs=list(n.inputs), attrs={**n.attrs, "transpose_out": False},
                        num_outputs=n.num_outputs, node_def=n.node_def, meta=n.meta, output_shapes=None,
                        output_dtypes=n.output_dtypes, control_inputs=n.control_inputs))
        out.append(Node(name=n.name, op="Transpose", inputs=[f"{name}:0", n.inputs[k]],
                        attrs={"T": n.attrs["T"]} if "T" in n.attrs else {},
                        output_shapes=n.output_shapes, output_dtypes=n.output_dtypes))
    return out


def nhwc_plan(nodes: list, keep) -> list:
    """``nodes`` with the transpose pairs around layout-agnostic elementwise regions cancelled (see the module);
    ``keep``: the tensors that must stay as they are (the graph's outputs). Returns ``nodes`` itself when
    nothing cancels."""
    given, nodes = nodes, _split_transposed(nodes)
    consts = _const_values(nodes)
    keep = {tensor_name(k) for k in keep}
    readers: dict = {}
    producer: dict = {}
    for n in nodes:
        producer[f"{n.name}:0"] = n
        for t in n.input_names():
            readers.setdefault(t, []).append(n)

    def scalar(t):
        v = consts.get(t)
        return isinstance(v, np.ndarray) and v.size == 1 and v.ndim <= 4

    moved: dict = {}        # id(node) -> node, the ops computing in NHWC
    dropped: set = set()    # id of every transpose cancelled
    redirect: dict = {}     # tensor -> the tensor its readers read instead

    def to_nchw(n) -> bool:
        return n is not None and id(n) not in dropped and _perm(n, consts) == _TO_NCHW

    for q in nodes:
        if not to_nchw(q):
            continue
        # the region: the transposes to NCHW it starts from (a binary op or a concat joins several), the ops
        # it moves, the transposes back to NHWC where it ends
        qs, region, ops, backs, todo, ok = {id(q): q}, {f"{q.name}:0"}, {}, {}, [f"{q.name}:0"], True
        while todo and ok:
            t = todo.pop()
            if t in keep:
                ok = False
                break
            for r in readers.get(t, ()):
                if id(r) in ops or id(r) in backs:
                    continue
                if _perm(r, consts) == _TO_NHWC and tensor_name(r.inputs[0]) == t:
                    if f"{r.name}:0" in keep or id(r) in dropped:
                        ok = False
                        break
                    backs[id(r)] = r
                elif (_agnostic(r) or _concat_axis(r, consts)) and id(r) not in moved:
                    ops[id(r)] = r
                    out = f"{r.name}:0"
                    region.add(out)
                    todo.append(out)
                    # upstream of its other inputs, another transpose to NCHW (through elementwise ops) joins
                    up = list(r.input_names()[:-1] if r.op == "ConcatV2" else r.input_names())
                    while up:
                        i = up.pop()
                        p = producer.get(i)
                        if i in region or p is None or i != f"{p.name}:0":
                            continue
                        if to_nchw(p):
                            qs[id(p)] = p
                        elif (_agnostic(p) or _concat_axis(p, consts)) and id(p) not in moved:
                            ops[id(p)] = p
                            up.extend(p.input_names()[:-1] if p.op == "ConcatV2" else p.input_names())
                        else:
                            continue
                        region.add(i)
                        todo.append(i)
                else:
                    ok = False
                    break
        # every input of a moved op: a tensor of the region or a one-element constant; a concat's: the region's
        if ok and all(all(i in region for i in r.input_names()[:-1]) if r.op == "ConcatV2"
                      else all(i in region or scalar(i) for i in r.input_names()) for r in ops.values()):
            moved.update(ops)
            dropped.update(qs)
            dropped.update(backs)
            for n in (*qs.values(), *backs.values()):
                redirect[f"{n.name}:0"] = tensor_name(n.inputs[0])
    if not dropped:
        return given
    names = {n.name for n in nodes}
    out, perms = [], set()
    for n in nodes:
        if id(n) in dropped:
            perms.add(tensor_name(n.inputs[1]))
            continue
        ins = [_follow(redirect, i) for i in n.input_names()]
        if id(n) in moved and n.op == "ConcatV2":
            # NCHW's channel axis is NHWC's last
            axis = f"{n.name}/axis_nhwc"
            while axis in names:
                axis += "_"
            names.add(axis)
            old = consts[tensor_name(n.inputs[-1])]
            out.append(Node(name=axis, op="Const", attrs={"value": np.asarray(3, old.dtype), "dtype": old.dtype.name}))
            ins[-1] = f"{axis}:0"
        if id(n) in moved or ins != list(n.input_names()):
            n = Node(name=n.name, op=n.op, inputs=ins, attrs=n.attrs, num_outputs=n.num_outputs, node_def=n.node_def,
                     meta=n.meta, output_shapes=None if id(n) in moved else n.output_shapes,
                     output_dtypes=n.output_dtypes, control_inputs=n.control_inputs)
        out.append(n)
    # the perm constants only the cancelled transposes read
    read = {t for n in out for t in n.input_names()} | keep
    return [n for n in out if not (n.op == "Const" and f"{n.name}:0" in perms and f"{n.name}:0" not in read)]
