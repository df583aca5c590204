"""A training step's optimizer update chains as one node each, for replays without a dump.

An optimizer's update is a chain of float32 elementwise ops per variable (a Keras optimizer's decomposed
update, the ``Apply*`` chains of :mod:`ascend_emu.frontend.tf.write_ops`, the functional optimizers of
``Device.train``), dozens of nodes each a pass over the variable and a dispatch of the device: most of a
small model's step. They run as the CANN ``Apply*`` operator, black-listed, so in float32 under every
precision mode that keeps the black list. :func:`update_chain_graph` puts each connected chain of such
nodes in the ``update`` phase into one ``_UpdateChain`` node (:mod:`ascend_emu.ops.apply_ops`) that runs
the same ops in the same order, in one pass while every value is finite and op by op otherwise: the same
bits and status as the nodes it replaces. The update's other pure nodes that repeat one another (a Keras
optimizer computes each variable's bias corrections anew from the iteration: casts, powers, their constants)
run once, their readers reading the first.

What differs is the record: the replay records the chain as one op (and a dropped repeat not at all) (named after its last node, in the
``update`` phase, so the overflow decision, which reads the forward and backward ops, is unchanged). A step
that is dumped replays the graph as it is (the dump has every op); so does a step on a device whose policy
could compute one of the chain's ops in another dtype, or whose fusion passes would treat the graph
differently once rewritten (nothing is then changed).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..graph.core import Graph, Node, split_tensor_name, tensor_name
from ..ops import OPS
from ..ops.apply_ops import UPDATE_STEPS
from .precision import ascend_type

#: ops that pass their input on (a read of a variable inside the chain)
_ALIASES = ("Identity",)

_CACHE: dict = {}     # id(graph) -> (graph, precision, fusion, numerics, the graph to replay)


def _float32_always(precision, kind: str, ascend_op: str) -> bool:
    """Whether an op of ``kind`` run as ``ascend_op`` on float32 data computes in float32 whatever feeds it."""
    red = precision.reduced
    return all(precision.decide(kind, ascend_op, "float32", p).dtype == "float32"
               for p in ([], ["float32"], [red], ["float16"], ["bfloat16"]))


def _candidates(graph: Graph, precision) -> dict:
    """name -> node of the update-phase float32 elementwise nodes (and variable reads) that always compute in
    float32 on this device."""
    out, seen = {}, {}
    for n in graph.nodes:
        if (n.meta.get("phase") != "update" or n.meta.get("fusion") or n.num_outputs != 1
                or (n.op not in UPDATE_STEPS and n.op not in _ALIASES) or n.output_dtypes != ["float32"]):
            continue
        t = n.meta.get("ascend_type") or ascend_type(n.op)
        kind = OPS[n.op].kind
        if (kind, t) not in seen:
            seen[(kind, t)] = _float32_always(precision, kind, t)
        if seen[(kind, t)]:
            out[n.name] = n
    return out


def _groups(graph: Graph, cand: dict) -> list:
    """The connected chains of candidate nodes of one CANN op type, in graph order."""
    parent = {name: name for name in cand}

    def root(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for n in cand.values():
        for r in n.inputs:
            p = split_tensor_name(r)[0]
            if p in cand and cand[p].meta.get("ascend_type") == n.meta.get("ascend_type"):
                parent[root(p)] = root(n.name)
    groups: dict = {}
    for n in graph.nodes:
        if n.name in cand:
            groups.setdefault(root(n.name), []).append(n)
    return list(groups.values())


def _node_consumers(graph: Graph) -> dict:
    """node name -> names of the nodes reading any of its outputs."""
    out: dict = {}
    for n in graph.nodes:
        for r in n.inputs:
            out.setdefault(split_tensor_name(r)[0], set()).add(n.name)
    return out


def _chain_node(members: list, consts: dict, needed: list, graph_nodes: dict):
    """The ``_UpdateChain`` node of ``members`` (graph order) and the map member tensor -> its replacement
    (an output of the new node), or None when the chain is too short to gain anything."""
    names = {m.name for m in members}
    inputs, const_vals, value = [], [], {}
    for m in members:
        for r in m.input_names():
            p = split_tensor_name(r)[0]
            if p in names or r in value:
                continue
            if p in consts:
                value[r] = ("const", len(const_vals))
                const_vals.append(consts[p])
            else:
                value[r] = ("input", len(inputs))
                inputs.append(r)
    k_in = len(inputs)

    def index(ref):
        kind, i = value[ref]
        return i if kind == "input" else (k_in + i if kind == "const" else k_in + len(const_vals) + i)

    steps = []
    for m in members:
        ins = m.input_names()
        out = f"{m.name}:0"
        if m.op in _ALIASES:
            value[out] = value[ins[0]]
            continue
        step = UPDATE_STEPS[m.op]
        a = index(ins[0])
        b = index(ins[1]) if len(ins) > 1 else -1
        value[out] = ("step", len(steps))
        steps.append((step, a, b))
    if len(steps) < 2:
        return None
    outputs = tuple(index(t) for t in needed)
    last = members[-1]
    shapes = [graph_nodes[split_tensor_name(t)[0]].output_shapes for t in needed]
    node = Node(name=last.name, op="_UpdateChain", inputs=list(inputs),
                attrs={"steps": tuple(steps), "outputs": outputs, "consts": tuple(const_vals), "T": "float32"},
                num_outputs=len(needed),
                meta={"ascend_type": last.meta.get("ascend_type"), "phase": "update",
                      "update_chain": [m.name for m in members]},
                output_shapes=None if any(s is None for s in shapes) else [s[0] for s in shapes],
                output_dtypes=["float32"] * len(needed))
    return node, {t: f"{node.name}:{i}" for i, t in enumerate(needed)}


#: pure ops whose repeats :func:`_shared` drops (the same inputs and attributes give the same outputs and status)
_PURE = frozenset(("Const", "Cast", "Identity", "AddV2", "Add", "Sub", "Mul", "RealDiv", "Pow", "Sqrt", "Square",
                   "Neg"))


def _attrs_key(attrs: dict) -> tuple:
    out = []
    for k in sorted(attrs):
        v = attrs[k]
        if isinstance(v, np.ndarray):
            v = (v.dtype.str, v.shape, v.tobytes())
        out.append((k, repr(v) if not isinstance(v, tuple) else v))
    return tuple(out)


def _shared(graph: Graph, cand: dict, precision):
    """``graph`` with the repeats of the update's other pure nodes dropped (a Keras optimizer computes each
    variable's bias corrections from the iteration anew: casts, powers, their constants), their readers reading
    the first; None if there are none. The chains' own nodes, and the constants they read, stay (one chain per
    variable). Not with ``keep_dtype`` names (a precision decision by node name)."""
    if precision.keep_names:
        return None
    consumers = graph.consumers()
    first, remap, dropped = {}, {}, set()
    for n in graph.nodes:
        if (n.meta.get("phase") != "update" or n.op not in _PURE or n.num_outputs != 1 or n.name in cand
                or n.meta.get("fusion")):
            continue
        if n.op == "Const" and any(c.name in cand for c in consumers.get(f"{n.name}:0", ())):
            continue
        key = (n.op, tuple(remap.get(t, t) for t in n.input_names()), _attrs_key(n.attrs),
               n.meta.get("ascend_type"), tuple(n.output_dtypes or ()))
        if key in first:
            remap[f"{n.name}:0"] = f"{first[key]}:0"
            dropped.add(n.name)
        else:
            first[key] = n.name
    if not dropped:
        return None
    nodes = [n if not any(tensor_name(r) in remap for r in n.inputs)
             else replace(n, inputs=[remap.get(tensor_name(r), r) for r in n.inputs])
             for n in graph.nodes if n.name not in dropped]
    return replace(graph, nodes=nodes, outputs=[remap.get(tensor_name(t), t) for t in graph.outputs])


def _rewrite(graph: Graph, precision):
    """The graph with its update chains as ``_UpdateChain`` nodes and the repeats of the update's other pure
    nodes dropped (None: nothing to change)."""
    cand = _candidates(graph, precision)
    if not cand:
        return None
    shared = _shared(graph, cand, precision)
    if shared is not None:
        cand = {n.name: n for n in shared.nodes if n.name in cand}
    chained = _chains(shared or graph, cand)
    return chained or shared


def _chains(graph: Graph, cand: dict):
    """The graph with its update chains (of ``cand``) as ``_UpdateChain`` nodes (None: none)."""
    by_name = {n.name: n for n in graph.nodes}
    consumers = graph.consumers()
    readers = _node_consumers(graph)
    outputs = {tensor_name(t) for t in graph.outputs}
    replaced, new_nodes, remap = set(), {}, {}
    for members in _groups(graph, cand):
        names = {m.name for m in members}
        # a path out of the chain and back into it: the chain cannot be one node
        stack = [c for m in names for c in readers.get(m, ()) if c not in names]
        seen, convex = set(), True
        while stack and convex:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            for d in readers.get(c, ()):
                if d in names:
                    convex = False
                    break
                stack.append(d)
        if not convex:
            continue
        # float32 constants read by the chain alone go into the node
        consts = {}
        for m in members:
            for r in m.input_names():
                p = by_name.get(split_tensor_name(r)[0])
                if (p is not None and p.op == "Const" and p.name not in names
                        and str(p.attrs.get("dtype")) == "float32"
                        and all(c.name in names for t in p.output_names() for c in consumers.get(t, ()))):
                    consts[p.name] = p.attrs["value"]
        needed = list(dict.fromkeys(t for m in members for t in m.output_names()
                                    if t in outputs or any(c.name not in names for c in consumers.get(t, ()))))
        made = _chain_node(members, consts, needed, by_name)
        if made is None:
            continue
        node, out_map = made
        replaced |= names | set(consts)
        new_nodes[members[0].name] = node
        remap.update(out_map)
    if not new_nodes:
        return None
    # the nodes in a topological order, each new node where its chain's first node was
    order = []
    for n in graph.nodes:
        if n.name in new_nodes:
            order.append(new_nodes[n.name])
        elif n.name not in replaced:
            order.append(replace(n, inputs=[remap.get(tensor_name(r), r) for r in n.inputs])
                         if any(tensor_name(r) in remap for r in n.inputs) else n)
    order = _toposort(order)
    if order is None:
        return None
    return replace(graph, nodes=order, outputs=[remap.get(tensor_name(t), t) for t in graph.outputs])


def _toposort(nodes: list) -> list:
    """``nodes`` in an order where every node follows its inputs' producers, as close to the given order as
    that allows (a stable topological sort); None if there is none (two chains each feeding the other through
    other nodes: then nothing is rewritten)."""
    import heapq

    pos = {n.name: i for i, n in enumerate(nodes)}
    deps = {n.name: {split_tensor_name(r)[0] for r in n.inputs} & pos.keys() for n in nodes}
    waiting = {name: len(d) for name, d in deps.items()}
    users: dict = {}
    for name, d in deps.items():
        for p in d:
            users.setdefault(p, []).append(name)
    ready = [pos[n] for n, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)
        out.append(nodes[i])
        for u in users.get(nodes[i].name, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, pos[u])
    return out if len(out) == len(nodes) else None


def _same_fusion(device, graph: Graph, new: Graph) -> bool:
    """Whether the device's fusion passes treat every node the rewrite keeps as they do in ``graph``."""
    a, b = device._fused(graph), device._fused(new)
    if a.fused_away != b.fused_away or dict(a.counts) != dict(b.counts):
        return False
    chained = {m for n in new.nodes if n.op == "_UpdateChain" for m in n.meta["update_chain"]}
    kept = {n.name: n for n in a.nodes}
    return all(m in kept and kept[m].op != "_UpdateChain" and not kept[m].meta.get("fusion") for m in chained)


def update_chain_graph(device, graph: Graph) -> Graph:
    """``graph`` (a training step's) with its optimizer update chains as ``_UpdateChain`` nodes for replays on
    ``device`` without a dump; ``graph`` itself when there is nothing to gain or the rewrite could change
    anything but the records (see the module's docstring). Worked out once per graph and device policy."""
    key = id(graph)
    hit = _CACHE.get(key)
    if (hit is not None and hit[0] is graph and hit[1] is device.precision and hit[2] is device.fusion
            and hit[3] is device.numerics):
        return hit[4]
    out = graph
    # (TF1 control flow runs nodes by their control inputs: left as it is)
    if device.numerics.subnormals == "keep" and not any(n.control_inputs for n in graph.nodes):
        new = _rewrite(graph, device.precision)
        if new is not None and _same_fusion(device, graph, new):
            out = new
    if len(_CACHE) >= 8:
        _CACHE.clear()
    _CACHE[key] = (graph, device.precision, device.fusion, device.numerics, out)
    return out
