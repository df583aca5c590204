"""Batch norm's fp16 input gradient as one node, for replays without a dump.

Keras' batch normalization under a mixed-precision policy computes its input gradient (per BN layer of a
training step's backward phase) as four full-size fp16 vector ops, each a pass over the tensor and a dispatch:

    A = Mul(g, s)                    S = Sub(x, m)
    C = _EltwiseChain(b, n, k, S)    (AutomaticUbFusion's RealDiv(b, n), Mul(k, .), Mul(., S))
    D = AddN(A, t, C)

(``s, m, b, t`` per channel along the last axis, zero-stride views included; ``n, k`` single values).
:func:`bn_dx_graph` puts each such group (found in the graph the device's fusion passes make, so the chain is
the one AutomaticUbFusion forms) into one ``_BnDxChain`` node named after ``D``, in the backward phase, that
the replay (``rewritten_runs._bn_dx``) runs in one pass (``numerics/chain.bn_dx_f16``: each op's own arithmetic
and roundings, the inserted casts of the float32 operands to fp16) when every value is finite and the ops
computed in fp16 the first time the node ran; otherwise it runs the four ops one by one as the graph's own
(fused) nodes, with their casts, records and status: the same bits and status as before, each member's
records where the unrewritten graph makes them (``_anchors``: the same first overflowing op).

What differs is the record: the replay records the group as one op ``D`` (its status 0: the fast path runs
only when every cast, step and rounding is finite, where the ops' status is 0 too). A dumped step replays the
graph as it is (the dump has every op); so does a device that flushes subnormals, a graph with control inputs,
and a group whose rewrite the fusion passes would treat otherwise (nothing is then changed).
"""
from __future__ import annotations

from dataclasses import replace

from ..graph.core import Graph, Node, split_tensor_name, tensor_name

#: the mean gradient's chain as AutomaticUbFusion forms it (``fused_ops.eltwise_chain``'s ``chain`` attribute)
_CHAIN = (("RealDiv", (0, 1)), ("Mul", (2, -1)), ("Mul", (-1, 3)))

_CACHE: dict = {}     # id(graph) -> (graph, precision, fusion, numerics, the graph to replay)


def _chain_form(node) -> tuple:
    return tuple((s["op"], tuple(s["args"])) for s in node.attrs.get("chain", ()))


def _groups(fused_nodes: list) -> list:
    """(A, S, C, D) of the fused graph's nodes: the pattern, each of A, S, C read by its successor alone, all
    in the backward phase."""
    by_name = {n.name: n for n in fused_nodes}
    readers: dict = {}
    for n in fused_nodes:
        for r in n.inputs:
            readers.setdefault(tensor_name(r), []).append(n.name)

    def producer(ref, op):
        name, port = split_tensor_name(ref)
        p = by_name.get(name)
        if p is None or p.op != op or port != 0 or p.num_outputs != 1:
            return None
        return p

    out = []
    for d in fused_nodes:
        if (d.op != "AddN" or len(d.inputs) != 3 or d.meta.get("fusion") or d.control_inputs
                or d.meta.get("phase") != "backward"):
            continue
        refs = d.input_names()
        a, c = producer(refs[0], "Mul"), producer(refs[2], "_EltwiseChain")
        if a is None or c is None or a.meta.get("fusion") or _chain_form(c) != _CHAIN or len(c.inputs) != 4:
            continue
        s = producer(c.input_names()[3], "Sub")
        if s is None or s.meta.get("fusion"):
            continue
        members = (a, s, c, d)
        # (the fused chain holds no phase of its own: its members' is checked in _rewrite)
        if any((m is not c and m.meta.get("phase") != "backward") or m.control_inputs or len(m.inputs) != (2 if m.op in ("Mul", "Sub")
                                                                                          else len(m.inputs))
               for m in members):
            continue
        if (readers.get(f"{a.name}:0") != [d.name] or readers.get(f"{c.name}:0") != [d.name]
                or readers.get(f"{s.name}:0") != [c.name]):
            continue
        out.append(members)
    return out


def _anchors(fused_nodes: list, members: tuple, groups: list) -> tuple:
    """For each of ``members`` (A, S, C), the name of the node the fused graph runs last before it that the rewrite
    keeps (None: none): where the member's records go when the replay runs the group op by op, so that the records
    are in the order the unrewritten graph makes them (the step's ``first_overflow`` is the first record with a
    status)."""
    gone = {m.name for grp in groups for m in grp[:3]}
    last, out, want = None, {}, {m.name for m in members}
    for n in fused_nodes:
        if n.name in want:
            out[n.name] = last
        if n.name not in gone:
            last = n.name
    # each a tuple of candidates, nearest first (a later rewrite that removes the node adds the one before it)
    return tuple((out.get(m.name),) for m in members)


def _rewrite(device, graph: Graph):
    """(the rewritten graph, the fused graph's nodes expected of it) or None."""
    fused = device._fused(graph)
    groups = _groups(fused.nodes)
    if not groups:
        return None
    pre = {n.name: n for n in graph.nodes}
    consumers = graph.consumers()
    outputs = {tensor_name(t) for t in graph.outputs}
    gone, new_nodes, fused_gone = set(), {}, set()
    for a, s, c, d in groups:
        chain_members = list(c.meta["fusion"].get("replaces", ()))
        names = {a.name, s.name, d.name, *chain_members}
        if (not all(n in pre for n in names) or c.name not in chain_members
                or any(pre[n].meta.get("phase") != "backward" for n in names)):
            continue
        # nothing outside the group reads a member but D's readers
        if any(c2.name not in names for m in names - {d.name} for t in pre[m].output_names()
               for c2 in consumers.get(t, ())) or any(f"{m}:0" in outputs for m in names - {d.name}):
            continue
        g, sc = a.input_names()
        x, mean = s.input_names()
        b, n, k, _ = c.input_names()
        t = d.input_names()[1]
        node = Node(name=d.name, op="_BnDxChain", inputs=[g, sc, x, mean, b, n, k, t], attrs={}, num_outputs=1,
                    meta={"ascend_type": d.meta.get("ascend_type"), "phase": "backward",
                          "bn_dx": (a, s, c, d), "bn_dx_after": _anchors(fused.nodes, (a, s, c), groups)},
                    output_shapes=d.output_shapes, output_dtypes=list(d.output_dtypes))
        gone |= names
        new_nodes[d.name] = node
        fused_gone |= {a.name, s.name, c.name}
    if not new_nodes:
        return None
    order = [new_nodes[n.name] if n.name in new_nodes else n for n in graph.nodes
             if n.name in new_nodes or n.name not in gone]
    new = replace(graph, nodes=order)
    expect = [new_nodes.get(n.name, n) for n in fused.nodes if n.name not in fused_gone]
    return new, expect, fused


def same_fusion(op: str, device, new: Graph, expect: list, old_fused, kept_away=None) -> bool:
    """Whether the fusion passes make of ``new`` (a rewrite's graph, its nodes of ``op`` the rewrite's) the old fused
    graph ``expect`` with each group as its one node: the same nodes, each other node's fusion and inputs the same,
    and the same fused-away list (``kept_away``: the old one less what the rewrite took, when it took some)."""
    f = device._fused(new)
    if [(n.name, n.op) for n in f.nodes] != [(n.name, n.op) for n in expect]:
        return False
    if any(n.op != op and (n.meta.get("fusion") != e.meta.get("fusion") or n.inputs != e.inputs)
           for n, e in zip(f.nodes, expect)):
        return False
    return f.fused_away == (old_fused.fused_away if kept_away is None else kept_away)


def _same_fusion(device, new: Graph, expect: list, old_fused) -> bool:
    chains = {n.meta["bn_dx"][2].name for n in new.nodes if n.op == "_BnDxChain"}
    return same_fusion("_BnDxChain", device, new, expect, old_fused,
                       [x for x in old_fused.fused_away if x["into"] not in chains])


def rewritten(cache: dict, device, graph: Graph, rewrite, same) -> Graph:
    """The graph a no-dump replay of ``graph`` on ``device`` runs under a rewrite of this module's kind (here and
    :mod:`ascend_emu.npu.eltwise_reduce`): ``rewrite(device, graph)`` -> (new graph, the fused nodes expected of it,
    the old fused graph) or None, kept where ``same(device, *made)`` holds; ``graph`` itself otherwise, with
    flushed subnormals or control inputs. Worked out once per graph and device policy (``cache``: id(graph) -> ...,
    holding the graph and the policy's objects so that a reused id cannot hit)."""
    key = id(graph)
    hit = cache.get(key)
    if (hit is not None and hit[0] is graph and hit[1] is device.precision and hit[2] is device.fusion
            and hit[3] is device.numerics):
        return hit[4]
    out = graph
    if device.numerics.subnormals == "keep" and not any(n.control_inputs for n in graph.nodes):
        made = rewrite(device, graph)
        if made is not None and same(device, made[0], made[1], made[2]):
            out = made[0]
    if len(cache) >= 8:
        cache.clear()
    cache[key] = (graph, device.precision, device.fusion, device.numerics, out)
    return out


def bn_dx_graph(device, graph: Graph) -> Graph:
    """``graph`` (a training step's) with batch norm's fp16 input gradients as ``_BnDxChain`` nodes for replays on
    ``device`` without a dump; ``graph`` itself when there is none or the rewrite could change anything but the
    records (see the module's docstring). Worked out once per graph and device policy."""
    return rewritten(_CACHE, device, graph, _rewrite, _same_fusion)
