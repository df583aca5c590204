"""Freezing and cleaning: a ConcreteFunction to a flat, deterministic GraphDef.

Freezing turns variables into constants and lets Grappler inline function calls (control
flow stays functional); cleaning inlines the calls it left (``call/<node>``), drops
control inputs and ``NoOp``, turns the frozen ``ReadVariableOp`` Identities into ``Const``,
removes what does not feed an output, orders the nodes topologically (Kahn, ties in the
frozen order) and fills attribute defaults. In a graph with TF1 control flow (Switch/Merge/Enter/Exit/
NextIteration) the control edges stay, since they carry deadness, and the loops' back edges are left out of
the order.
"""
from __future__ import annotations

import heapq
import re

from ...errors import AscendEmuError
from ...graph.core import split_tensor_name, tensor_name
from ...graph.dataflow import DATAFLOW_OPS, NEXT_ITERATION
from .tf import count_outputs, first_line, import_tf, lookup_op_def, node_attrs
from .sources import _func_name


#: TF1 dataflow control flow (Switch/Merge/Enter/Exit/NextIteration graphs): the loader keeps it (with
#: the control edges that carry deadness) for :mod:`ascend_emu.graph.dataflow`; stateful training
#: steps refuse it
CONTROL_FLOW_OPS = DATAFLOW_OPS | frozenset({"ControlTrigger"})
#: TF1 control flow that nothing here runs
UNSUPPORTED_CONTROL_FLOW = frozenset({"ControlTrigger"})
#: a control input from one of these op types carries a branch's or a loop's deadness (the pivots
#: tf.cond and tf.while_loop hang a branch's constants on): followed when pruning a TF1 graph
_PIVOT_OPS = DATAFLOW_OPS | frozenset({"Identity"})


#: function-call ops that must have been inlined by the freezing pass
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def _freeze(func):
    """ConcreteFunction -> (frozen GraphDef, input placeholder names, output tensor names)."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    try:
        frozen = convert_variables_to_constants_v2(func, lower_control_flow=False,
                                                   aggressive_inlining=True)
    except Exception as e:
        raise AscendEmuError(f"cannot freeze function {_func_name(func)!r}: {first_line(e)}") from None
    gd = frozen.graph.as_graph_def()
    inputs = [t.name.rpartition(":")[0] for t in frozen.inputs]
    outputs = [tensor_name(t.name) for t in frozen.outputs]
    return gd, inputs, outputs, _structure_names(func.structured_outputs, len(outputs))


def _structure_names(structure, n: int) -> list[str] | None:
    """Dict keys / nested paths of a function's outputs, in flattening order; None if unnamed."""
    import_tf()
    from tensorflow.python.util import nest
    try:
        paths = [p for p, _ in nest.flatten_with_joined_string_paths(structure)]
    except Exception:  # exotic structures: leave unnamed
        return None
    if len(paths) != n or not all(paths) or all(p.isdigit() for p in paths):
        return None
    return paths


def _sinks(gd) -> list[str]:
    """Outputs of a bare GraphDef: every output of nodes nobody reads."""
    read = set()
    for nd in gd.node:
        for ref in nd.input:
            read.add(split_tensor_name(ref.lstrip("^"))[0])
    outs = []
    in_loop = _in_loop(gd)
    for nd in gd.node:
        if nd.name in read or nd.name in in_loop or nd.op in ("NoOp", "Const", "Placeholder", "Assert", "SaveV2",
                                                                "RestoreV2", "VarHandleOp", "VariableV2"):
            continue
        op_def = lookup_op_def(nd.op, nd.name)
        n = count_outputs(op_def, node_attrs(nd, op_def))
        outs += [f"{nd.name}:{i}" for i in range(n)]
    return outs


def _control_flow_check(gd, what: str) -> None:
    counts: dict[str, int] = {}
    for nd in gd.node:
        if nd.op in CONTROL_FLOW_OPS:
            counts[nd.op] = counts.get(nd.op, 0) + 1
    if counts:
        listed = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items()))
        raise AscendEmuError(f"{what} contains TF1 control flow ({listed}), which ascend-emu cannot replay; "
                             f"export it with functional control flow (a TF2 tf.function, or "
                             f"tf.compat.v1.enable_control_flow_v2() before building the graph)")


def _in_loop(gd) -> set:
    """Names of the nodes whose outputs live inside a TF1 loop frame (a loop's Exit is outside it)."""
    if not any(nd.op in DATAFLOW_OPS for nd in gd.node):
        return set()
    nodes = {nd.name: nd for nd in gd.node}
    srcs = {}
    for nd in gd.node:
        ins = [split_tensor_name(r.lstrip("^"))[0] for r in nd.input]
        srcs[nd.name] = [i for i in ins if i in nodes
                         and not (nd.op in ("Merge", "RefMerge") and nodes[i].op in NEXT_ITERATION)]
    depth: dict = {}
    for n in stable_topological_order(list(nodes), srcs, {n: i for i, n in enumerate(nodes)}):
        d = max((depth[i] for i in srcs[n]), default=0)
        op = nodes[n].op
        depth[n] = d + 1 if op in ("Enter", "RefEnter") else max(d - 1, 0) if op in ("Exit", "RefExit") else d
    return {n for n, d in depth.items() if d > 0}


def _unsupported_control_flow_check(gd, what: str) -> None:
    ops = sorted({nd.op for nd in gd.node if nd.op in UNSUPPORTED_CONTROL_FLOW})
    if ops:
        raise AscendEmuError(f"{what} contains {', '.join(ops)}, a TF1 control-flow op ascend-emu cannot replay; "
                             f"export it with functional control flow (a TF2 tf.function)")


def _called_function(nd, library: dict):
    """The FunctionDef a node calls (a call op, or an op type that names a library function), or None."""
    if nd.op in CALL_OPS:
        name = nd.attr["f"].func.name
        if name not in library:
            raise AscendEmuError(f"node {nd.name!r} calls function {name!r}, which is not in the graph's "
                                 f"function library; the GraphDef is incomplete")
        return library[name]
    return library.get(nd.op)


def _output_arg_sizes(nd, library: dict) -> list[tuple[str, int]]:
    """(output arg name, number of tensors) of a node, in order: how ``node:arg:i`` refs flatten."""
    fdef = library.get(nd.op)
    if fdef is not None:
        return [(a.name, 1) for a in fdef.signature.output_arg]
    op_def = lookup_op_def(nd.op, nd.name)
    attrs = node_attrs(nd, op_def)
    sizes = []
    for arg in op_def.output_arg:
        if arg.number_attr:
            sizes.append((arg.name, int(attrs[arg.number_attr])))
        elif arg.type_list_attr:
            sizes.append((arg.name, len(attrs[arg.type_list_attr])))
        else:
            sizes.append((arg.name, 1))
    return sizes


def _function_body(fdef, library: dict, scope: str, args: list[str], emit, depth: int = 0) -> list[str]:
    """Emit the nodes of function ``fdef`` as GraphDef NodeDefs named ``scope/<node>``.

    ``args`` are the tensors bound to the function's inputs; nested calls are expanded
    the same way, at any depth. Control inputs are dropped. Returns the tensors of the
    function's outputs, in order.
    """
    tf = import_tf()
    if depth > 100:
        raise AscendEmuError(f"function calls nest deeper than 100 levels at {scope!r}; is the function recursive?")
    sig = fdef.signature
    if len(args) != len(sig.input_arg):
        raise AscendEmuError(f"call {scope!r} passes {len(args)} inputs to function {sig.name!r}, "
                             f"which takes {len(sig.input_arg)}")
    bound = {a.name: args[i] for i, a in enumerate(sig.input_arg)}
    pre = f"{scope}/" if scope else ""
    inner = {nd.name: nd for nd in fdef.node_def}
    sizes: dict[str, list] = {}

    def ref(r: str) -> str:
        """A function-body tensor ref (``arg`` or ``node:out_arg:i``) -> a graph tensor name."""
        parts = r.split(":")
        if len(parts) == 1:
            return bound[r] if r in bound else f"{pre}{r}:0"
        if len(parts) == 2:     # already flat (not produced by TensorFlow, but harmless)
            return f"{pre}{parts[0]}:{parts[1]}"
        node, arg, idx = parts
        if node not in sizes:
            if node not in inner:
                raise AscendEmuError(f"function {sig.name!r} reads {r!r}, which it does not define")
            sizes[node] = _output_arg_sizes(inner[node], library)
        offset = 0
        for name, n in sizes[node]:
            if name == arg:
                return f"{pre}{node}:{offset + int(idx)}"
            offset += n
        raise AscendEmuError(f"function {sig.name!r} reads {r!r}: node {node!r} has no output {arg!r}")

    for nd in fdef.node_def:
        for v in nd.attr.values():
            if v.WhichOneof("value") == "placeholder":
                raise AscendEmuError(f"function {sig.name!r} is polymorphic (attr placeholder in {nd.name!r}); "
                                     f"only concrete functions can be inlined")
        c = tf.compat.v1.NodeDef()
        c.CopyFrom(nd)
        c.name = f"{scope}/{nd.name}" if scope else nd.name
        del c.input[:]
        c.input.extend(ref(r) for r in nd.input if not r.startswith("^"))
        called = _called_function(c, library)
        if called is None:
            emit(c)
            continue
        outs = _function_body(called, library, c.name, list(c.input), emit, depth + 1)
        emit(("alias", c.name, outs))
    return [ref(fdef.ret[a.name]) for a in sig.output_arg]


class _Inliner:
    """Collects the NodeDefs of a graph with its function calls expanded, and the call outputs'
    aliases (``call:i`` -> the tensor the function returns), then assembles the GraphDef."""

    def __init__(self, library: dict):
        self.library = library
        self.kept: list = []
        self.alias: dict[str, str] = {}

    def emit(self, item) -> None:
        if isinstance(item, tuple):
            _, call, outs = item
            for i, t in enumerate(outs):
                self.alias[f"{call}:{i}"] = t
        else:
            self.kept.append(item)

    def add(self, nd) -> None:
        """A node of the outer graph: kept, or expanded if it calls a function."""
        called = _called_function(nd, self.library)
        if called is None:
            self.emit(nd)
        else:
            ins = [tensor_name(r) for r in nd.input if not r.startswith("^")]
            self.emit(("alias", nd.name, _function_body(called, self.library, nd.name, ins, self.emit)))

    def resolve(self, r: str) -> str:
        r = tensor_name(r)
        seen = 0
        while r in self.alias:
            r = self.alias[r]
            seen += 1
            if seen > len(self.alias):
                raise AscendEmuError(f"function outputs alias each other in a cycle at {r!r}")
        return r

    def graph_def(self, versions, library):
        tf = import_tf()
        names = set()
        out = tf.compat.v1.GraphDef()
        out.versions.CopyFrom(versions)
        out.library.CopyFrom(library)
        for nd in self.kept:
            if nd.name in names:
                raise AscendEmuError(f"inlining a function call made two nodes named {nd.name!r}; "
                                     f"rename the node that clashes with the call's scope")
            names.add(nd.name)
            c = out.node.add()
            c.CopyFrom(nd)
            del c.input[:]
            c.input.extend(self.resolve(r) for r in nd.input if not r.startswith("^"))
        return out


def _inline_calls(gd, outputs: list[str]):
    """Inline every function call (``PartitionedCall``, ``StatefulPartitionedCall``, or an op
    named after a library function) at any depth; the graph's own inliner leaves some, e.g.
    the ``_noinline`` XLA functions Keras 3 uses for grouped convolutions.

    The body of call ``c`` becomes nodes ``c/<node>``; readers of ``c:i`` read the tensor
    the function returns as its i-th output. Returns (GraphDef, outputs).
    """
    library = {f.signature.name: f for f in gd.library.function}
    if not any(_called_function(nd, library) is not None for nd in gd.node):
        return gd, outputs
    inl = _Inliner(library)
    for nd in gd.node:
        inl.add(nd)
    return inl.graph_def(gd.versions, gd.library), [inl.resolve(o) for o in outputs]


def _function_graph_def(fdef, gd):
    """A function of ``gd``'s library as a GraphDef of its own: one Placeholder per argument (named
    as the argument, shaped by the function's recorded argument shapes), its body with calls
    inlined; returns (GraphDef, argument names, output tensors)."""
    tf = import_tf()
    library = {f.signature.name: f for f in gd.library.function}
    inl = _Inliner(library)
    args = []
    for i, a in enumerate(fdef.signature.input_arg):
        if a.type_attr or a.number_attr or a.type_list_attr:
            raise AscendEmuError(f"function {fdef.signature.name!r} is polymorphic in argument {a.name!r}; "
                                 f"only concrete functions can be replayed")
        ph = tf.compat.v1.NodeDef(name=a.name, op="Placeholder")
        ph.attr["dtype"].type = a.type
        recorded = fdef.arg_attr[i].attr["_output_shapes"].list.shape if i in fdef.arg_attr else []
        if len(recorded) == 1:
            ph.attr["shape"].shape.CopyFrom(recorded[0])
        inl.emit(ph)
        args.append(f"{a.name}:0")
    outs = _function_body(fdef, library, "", args, inl.emit)
    return inl.graph_def(gd.versions, gd.library), [a.name for a in fdef.signature.input_arg], \
        [inl.resolve(o) for o in outs]


def stable_topological_order(names, sources: dict, order: dict) -> list:
    """Kahn's order of ``names`` (``sources[n]``: the names ``n`` reads, repeats allowed), ties broken by
    ``order[n]``: the same graph always gives the same order. Nodes on a cycle are left out."""
    indeg = {n: 0 for n in names}
    users: dict = {n: [] for n in names}
    for n in names:
        for src in sources[n]:
            indeg[n] += 1
            users[src].append(n)
    heap = [(order[n], n) for n in names if indeg[n] == 0]
    heapq.heapify(heap)
    topo = []
    while heap:
        _, n = heapq.heappop(heap)
        topo.append(n)
        for u in users[n]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (order[u], u))
    return topo


def _clean(gd, input_names: list[str], outputs: list[str]):
    """Frozen GraphDef -> cleaned GraphDef in topological order (see module docstring)."""
    tf = import_tf()
    nodes = {}
    order = {}
    for i, nd in enumerate(gd.node):
        if nd.name in nodes:
            raise AscendEmuError(f"GraphDef has two nodes named {nd.name!r}; it is malformed")
        nodes[nd.name] = nd
        order[nd.name] = i
    # data inputs only (drop ^control edges); NoOps then have no data consumers
    data_in = {n: [r for r in nd.input if not r.startswith("^")] for n, nd in nodes.items()}
    # TF1 control flow: control edges carry deadness into a branch's constants, so they stay
    # (a NoOp's stand for the NoOp's own inputs)
    tf1 = any(nd.op in DATAFLOW_OPS for nd in nodes.values())
    ctrl_in = {n: [] for n in nodes}
    for ref in outputs:
        if split_tensor_name(ref)[0] not in nodes:
            raise AscendEmuError(f"output {ref!r} is not a node of the graph")
    for name in input_names:
        if name not in nodes:
            raise AscendEmuError(f"input {name!r} is not a node of the graph")
    for n, ins in data_in.items():
        for r in ins:
            if split_tensor_name(r)[0] not in nodes:
                raise AscendEmuError(f"node {n!r} reads {r!r}, which is not in the graph; "
                                     f"the GraphDef is incomplete")

    if tf1:
        for n, nd in nodes.items():
            for r in nd.input:
                if r.startswith("^") and r[1:] not in nodes:
                    raise AscendEmuError(f"node {n!r} has a control input from {r[1:]!r}, which is not in the graph; "
                                         f"the GraphDef is incomplete")
        ctrl_in = {n: _control_sources(nodes, n) for n in nodes}

    # Identity(Const) -> Const of the same name (the frozen ReadVariableOp, and the
    # Identity chains function inlining leaves); repeat to collapse whole chains
    changed = True
    while changed:
        changed = False
        for n, nd in nodes.items():
            if nd.op == "Identity" and len(data_in[n]) == 1:
                src, idx = split_tensor_name(data_in[n][0])
                if idx == 0 and nodes[src].op == "Const":
                    new = tf.compat.v1.NodeDef(name=n, op="Const", device=nd.device)
                    new.attr["dtype"].CopyFrom(nodes[src].attr["dtype"])
                    new.attr["value"].CopyFrom(nodes[src].attr["value"])
                    nodes[n] = new
                    data_in[n] = []
                    changed = True

    # keep what the outputs need, plus every placeholder
    keep = set(input_names)
    stack = [split_tensor_name(r)[0] for r in outputs]
    while stack:
        n = stack.pop()
        if n in keep and n not in input_names:
            continue
        keep.add(n)
        stack.extend(split_tensor_name(r)[0] for r in data_in[n])
        stack.extend(c for c in ctrl_in[n] if nodes[c].op in _PIVOT_OPS)
    keep.update(n for n, nd in nodes.items() if nd.op == "Placeholder" and not lowering_artifact(nd, data_in))
    keep = {n for n in keep if nodes[n].op != "NoOp"}
    ctrl_in = {n: [c for c in ctrl_in[n] if c in keep] for n in keep}

    _unsupported_control_flow_check(tf.compat.v1.GraphDef(node=[nodes[n] for n in keep]), "the model")
    calls = sorted({nodes[n].op for n in keep if nodes[n].op in CALL_OPS})
    if calls:
        raise AscendEmuError(f"function calls ({', '.join(calls)}) could not be inlined; "
                             f"export the model as a frozen graph without nested functions")

    # placeholders in signature order (their GraphDef order is not stable from one trace to the next),
    # so the same model gives the same cleaned graph and fingerprint
    first = {n: k for k, n in enumerate(input_names)}
    order = {n: (0, first[n]) if n in first else (1, i) for n, i in order.items()}
    # a loop's back edges (NextIteration -> Merge) are left out of the order
    sources = {n: [split_tensor_name(r)[0] for r in data_in[n]
                   if not (nodes[n].op in ("Merge", "RefMerge")
                           and nodes[split_tensor_name(r)[0]].op in NEXT_ITERATION)] + ctrl_in[n] for n in keep}
    topo = stable_topological_order(keep, sources, order)
    if len(topo) != len(keep):
        stuck = sorted(set(keep) - set(topo))[:5]
        raise AscendEmuError(f"the graph has a cycle (through {', '.join(stuck)}); "
                             f"cyclic graphs need control flow support")

    out = tf.compat.v1.GraphDef()
    out.versions.CopyFrom(gd.versions)
    for n in topo:
        nd = out.node.add()
        nd.CopyFrom(nodes[n])
        del nd.input[:]
        nd.input.extend(data_in[n] + ["^" + c for c in ctrl_in[n]])
    used_funcs = _referenced_functions(out)
    if used_funcs:
        out.library.CopyFrom(gd.library)
    return out


def lowering_artifact(nd, data_in: dict) -> bool:
    """True for the unread ``unused_control_flow_input`` placeholders TensorFlow's lowering of
    functional control flow leaves in a frozen graph: no input of the model."""
    if nd.op != "Placeholder" or not re.fullmatch(r"unused_control_flow_input(_\d+)?", nd.name):
        return False
    return not any(split_tensor_name(r)[0] == nd.name for ins in data_in.values() for r in ins)


def _control_sources(nodes: dict, n: str) -> list[str]:
    """The control inputs of node ``n``, a NoOp's replaced by its own inputs (at any depth), each once."""
    out, seen = [], set()
    stack = [r[1:] for r in reversed(nodes[n].input) if r.startswith("^")]
    while stack:
        c = stack.pop()
        if c in seen or c == n:
            continue
        seen.add(c)
        if nodes[c].op == "NoOp":
            stack.extend(split_tensor_name(r.lstrip("^"))[0] for r in reversed(nodes[c].input))
        else:
            out.append(c)
    return out


def _referenced_functions(gd) -> set[str]:
    names = set()
    for nd in gd.node:
        for v in nd.attr.values():
            if v.WhichOneof("value") == "func":
                names.add(v.func.name)
            elif v.WhichOneof("value") == "list":
                names.update(f.name for f in v.list.func)
    return names


def _wrap_graph_def(gd):
    """A GraphDef with function calls -> ConcreteFunction, so the freezing pass inlines them."""
    tf = import_tf()
    inputs = [nd.name for nd in gd.node if nd.op == "Placeholder"]
    outputs = _sinks(gd)

    def imp():
        tf.compat.v1.import_graph_def(gd, name="")

    try:
        wrapped = tf.compat.v1.wrap_function(imp, [])
        g = wrapped.graph
        return wrapped.prune([g.get_tensor_by_name(n + ":0") for n in inputs],
                             [g.get_tensor_by_name(t) for t in outputs])
    except Exception as e:
        raise AscendEmuError(f"cannot import GraphDef: {first_line(e)}") from None
