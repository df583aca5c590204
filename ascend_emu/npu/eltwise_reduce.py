"""An fp16 elementwise node read only by a float32 reduction as one node, for replays without a dump.

Batch norm under a mixed-precision policy makes, per layer of a training step, two full-size fp16 tensors that a
reduction over N, H, W alone reads (each a pass over the tensor to write it and one to read it back):

    forward:   E = SquaredDifference(x, mean)  ->  R = Mean(E, [0, 1, 2])   (moments/variance)
    backward:  E = Mul(x, dy)                  ->  R = Sum(E, [0, 1, 2])    (batchnorm/mul_1)

(the gradient tape's ``Shape`` nodes also read the forward ``E``: they need its shape, not its values).
:func:`eltwise_reduce_graph` puts each such pair (found in the graph the device's fusion passes make, neither member
fused) into one ``_EltReduce`` node named after ``R`` in ``R``'s phase, with two outputs: ``R``'s, and a read-only
zero-stride fp16 array of ``E``'s shape that the shape-only readers read instead of ``E``. The replay
(``rewritten_runs._elt_reduce``) runs it in one pass (``numerics/eltwise_reduce.eltwise_reduce_f16``: the elementwise
op's arithmetic and rounding, its inserted cast, the reduction's float32 steps in order) when every value is finite
and the two ops computed as the pass does the first time the node ran (E in fp16, R in float32 reading fp16, the
same bits); otherwise it runs the two nodes one by one, with their casts, records and status, and gives ``E``'s own
output to the shape readers: the same bits and status as before.

What differs is the record: the replay records the pair as one op ``R`` (its status 0: the pass runs only when
every cast, element and result is finite, where the ops' status is 0 too). A dumped step replays the graph as it is
(the dump has every op); so does a device that flushes subnormals, a graph with control inputs, and a pair whose
rewrite the fusion passes would treat otherwise (nothing is then changed).
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np

from ..graph.core import Graph, Node, split_tensor_name, tensor_name
from .bn_chain import rewritten, same_fusion

#: (the elementwise op, the reduction) pairs, and the numerics names of their ops
PAIRS = {("SquaredDifference", "Mean"): ("squared_difference", "mean"), ("Mul", "Sum"): ("mul", "sum")}
#: readers that need a tensor's shape alone
_SHAPE_READERS = frozenset(("Shape",))

#: the least known elements of E's output (the batch dim unknown: BN's 16 K a sample at 32x32x16, 8 K at 16x16x32)
_MIN_ELEMENTS = 256

_CACHE: dict = {}     # id(graph) -> (graph, precision, fusion, numerics, the graph to replay)


def _large(e) -> bool:
    """Whether E's known output dims make a tensor of at least ``_MIN_ELEMENTS`` (a small pair: the one pass saves
    nothing, and a node the pass declines runs its ops outside the replay's kept node plans)."""
    shape = (e.output_shapes or [None])[0]
    if shape is None:
        return False
    known = [d for d in shape if d is not None]
    return int(np.prod(known)) >= _MIN_ELEMENTS if known else False


def _pairs(fused_nodes: list) -> list:
    """(E, R, the shape readers of E) of the fused graph's nodes."""
    by_name = {n.name: n for n in fused_nodes}
    readers: dict = {}
    for n in fused_nodes:
        for r in n.input_names():
            readers.setdefault(r, []).append(n)
    out = []
    for r in fused_nodes:
        if r.op not in ("Mean", "Sum") or len(r.inputs) != 2 or r.meta.get("fusion") or r.control_inputs:
            continue
        name, port = split_tensor_name(r.input_names()[0])
        e = by_name.get(name)
        if (e is None or port != 0 or (e.op, r.op) not in PAIRS or e.num_outputs != 1 or len(e.inputs) != 2
                or e.meta.get("fusion") or e.control_inputs or e.meta.get("phase") != r.meta.get("phase")
                or r.meta.get("phase") not in ("forward", "backward")
                or not _large(e)):
            continue
        rd = readers.get(f"{e.name}:0", [])
        others = [n for n in rd if n is not r]
        if (len(rd) - len(others) != 1 or any(n.op not in _SHAPE_READERS or len(n.inputs) != 1 for n in others)
                or r.input_names()[1] == f"{e.name}:0"):
            continue
        out.append((e, r, others))
    return out


def _rewrite(device, graph: Graph):
    """(the rewritten graph, the fused graph's nodes expected of it) or None."""
    fused = device._fused(graph)
    pairs = _pairs(fused.nodes)
    if not pairs:
        return None
    pre = {n.name: n for n in graph.nodes}
    consumers = graph.consumers()
    outputs = {tensor_name(t) for t in graph.outputs}
    gone, new_nodes, moved, fused_gone = set(), {}, {}, set()
    for e, r, shapes in pairs:
        if not (e.name in pre and r.name in pre and all(s.name in pre for s in shapes)):
            continue
        # nothing but R and the shape readers reads E (before the fusion passes too), E is no graph output
        allowed = {r.name} | {s.name for s in shapes}
        if (any(c.name not in allowed for c in consumers.get(f"{e.name}:0", ())) or f"{e.name}:0" in outputs
                or pre[e.name].op != e.op or pre[r.name].op != r.op):
            continue
        node = Node(name=r.name, op="_EltReduce", inputs=[*e.inputs, r.inputs[1]], attrs={}, num_outputs=2,
                    meta={"ascend_type": r.meta.get("ascend_type"), "phase": r.meta.get("phase"),
                          "elt_reduce": (e, r)},
                    output_shapes=[(r.output_shapes or [None])[0], (e.output_shapes or [None])[0]],
                    output_dtypes=[(r.output_dtypes or [None])[0], (e.output_dtypes or [None])[0]])
        gone.add(e.name)
        new_nodes[r.name] = node
        for s in shapes:
            moved[s.name] = f"{r.name}:1"
        fused_gone.add(e.name)
    if not new_nodes:
        return None
    # where each E's records go when its pair runs op by op (the node run before it, as bn_chain._anchors); a
    # _BnDxChain's member placed after an E falls back to the node before that E when E made no record
    before, last = {}, None
    for n in fused.nodes:
        if n.name in fused_gone:
            before[n.name] = last
        else:
            last = n.name
    for node in new_nodes.values():
        node.meta["elt_reduce_after"] = ((before.get(node.meta["elt_reduce"][0].name),),)

    def later(cands):
        while cands[-1] in before:
            cands = cands + (before[cands[-1]],)
        return cands

    def redo(n):
        if n.name in new_nodes:
            return new_nodes[n.name]
        if n.name in moved:
            return replace(n, inputs=[moved[n.name]])
        if n.op == "_BnDxChain" and any(c[-1] in before for c in n.meta.get("bn_dx_after", ())):
            return replace(n, meta={**n.meta, "bn_dx_after": tuple(later(c) for c in n.meta["bn_dx_after"])})
        return n
    new = replace(graph, nodes=[redo(n) for n in graph.nodes if n.name not in gone])
    expect = [redo(n) for n in fused.nodes if n.name not in fused_gone]
    return new, expect, fused


def eltwise_reduce_graph(device, graph: Graph) -> Graph:
    """``graph`` (a training step's) with each fp16 elementwise node read only by a reduction (and shape readers)
    as an ``_EltReduce`` node for replays on ``device`` without a dump; ``graph`` itself when there is none or the
    rewrite could change anything but the records (see the module's docstring). Worked out once per graph and
    device policy."""
    return rewritten(_CACHE, device, graph, _rewrite, partial(same_fusion, "_EltReduce"))
