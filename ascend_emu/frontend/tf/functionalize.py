"""The rewrite behind stateful training steps: a GraphDef that reads and writes variables becomes a pure one.

:func:`functionalize` turns every variable of one step into a state placeholder and every write into
tensor ops computing the new value (built by :mod:`.write_ops`), in the order the graph itself gives (the rules are in
:mod:`ascend_emu.frontend.tf.stateful`, which builds the training steps on it, and NUMERICS.md section 10).
Nothing here runs TensorFlow: it reads and writes GraphDef protobufs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ...errors import AscendEmuError
from ...graph.core import split_tensor_name, tensor_name
from .graphdef import stable_topological_order
from .tf import import_tf, lookup_op_def
from .write_ops import WRITE_OPS, Emitter, update_chain
from .training import UNSCALE_PREFIX

#: ops that hold a variable (a resource handle or a TF1 ref)
VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp"})
#: reads: the variable's current value
READ_OPS = frozenset({"ReadVariableOp"})
INITIALIZED_OPS = frozenset({"VarIsInitializedOp", "IsVariableInitialized"})
SUPPORTED_VARIABLE_OPS = sorted(VARIABLE_OPS | READ_OPS | set(WRITE_OPS) | INITIALIZED_OPS
                                | {"ResourceGather", "Identity"})
#: the seed tf.gradients creates for each ys (``<scope>/grad_ys_<i>``, ones like the loss)
_GRAD_YS = re.compile(r"(^|/)grad_ys_\d+$")


@dataclass
class VariableSpec:
    """One variable of a stateful step: the graph node holding it, its state key, dtype and shape."""

    node: str            # VariableV2 / VarHandleOp node, or the captured resource placeholder
    key: str             # state key, ``variable/<name>``
    dtype: str           # numpy dtype name
    shape: list
    placeholder: str = ""   # the state placeholder replacing it (preferred name before the rewrite)
    resource: bool = True   # a resource variable (else a TF1 ref variable)


@dataclass
class Functional:
    """What :func:`functionalize` returns."""

    graph_def: object
    inputs: list                                  # placeholder names, in order
    outputs: list                                 # fetch tensors (as rewritten), then the final values
    ascend_types: dict = field(default_factory=dict)   # node -> CANN op type of a rewritten write
    grads: list = field(default_factory=list)          # the gradient tensors (TF1 loss scaling)
    grad_sources: list = field(default_factory=list)   # the same gradients in the original graph
    writes: dict = field(default_factory=dict)         # write op type -> count


# --------------------------------------------------------------------------- the rewrite

def needed_nodes(gd, roots) -> set:
    """Names of the nodes ``roots`` depend on, through data and control edges (the roots included)."""
    nodes = {nd.name: nd for nd in gd.node}
    out = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in out:
            continue
        if n not in nodes:
            raise AscendEmuError(f"{n!r} is not a node of the step's graph")
        out.add(n)
        stack.extend(split_tensor_name(r.lstrip("^"))[0] for r in nodes[n].input)
    return out


def _decoded_dtype(nd, key="T"):
    tf = import_tf()
    return np.dtype(tf.as_dtype(nd.attr[key].type).as_numpy_dtype).name


@dataclass
class _Step:
    """The part of a GraphDef one step runs: nodes, their data and control inputs, a topological order."""

    nodes: dict
    data_in: dict
    ctrl_in: dict
    topo: list

    @classmethod
    def of(cls, gd, roots: list, extra: list, name: str) -> "_Step":
        nodes, order = {}, {}
        for i, nd in enumerate(gd.node):
            nodes[nd.name] = nd
            order[nd.name] = i
        data_in = {n: [r for r in nd.input if not r.startswith("^")] for n, nd in nodes.items()}
        ctrl_in = {n: [r[1:] for r in nd.input if r.startswith("^")] for n, nd in nodes.items()}
        needed = needed_nodes(gd, roots) | {n for n in extra if n in nodes}
        # Kahn over data and control edges, ties broken by the GraphDef's order
        topo = stable_topological_order(needed, {n: cls._sources(data_in[n], ctrl_in[n]) for n in needed}, order)
        if len(topo) != len(needed):
            raise AscendEmuError(f"{name}: the graph has a cycle")
        return cls(nodes, data_in, ctrl_in, topo)

    @staticmethod
    def _sources(data, ctrl) -> set:
        return {split_tensor_name(r)[0] for r in data} | set(ctrl)

    def sources(self, n: str) -> set:
        return self._sources(self.data_in[n], self.ctrl_in[n])


def _variable_tensors(step: _Step, var_by_node: dict) -> dict:
    """Tensor -> the variable it refers to: the variable node's output, and a resource ``Identity`` or a
    ``RefIdentity`` of it (which pass the variable on; an Identity of a TF1 ref reads it)."""
    tf = import_tf()
    refers: dict = {}
    for n in step.topo:
        nd = step.nodes[n]
        if n in var_by_node:
            refers[f"{n}:0"] = var_by_node[n]
        elif nd.op in ("Identity", "RefIdentity") and step.data_in[n]:
            src = refers.get(tensor_name(step.data_in[n][0]))
            if src is not None and (nd.op == "RefIdentity" or nd.attr["T"].type == tf.resource.as_datatype_enum):
                refers[f"{n}:0"] = src
    return refers


def _writes(step: _Step, refers: dict, name: str) -> dict:
    """Variable node -> the ops writing it; every other use of a variable than a read is refused, all at once."""
    writes: dict = {}
    unsupported: dict = {}
    for n in step.topo:
        nd = step.nodes[n]
        if f"{n}:0" in refers:
            continue
        var_inputs = [(i, refers[tensor_name(r)]) for i, r in enumerate(step.data_in[n]) if tensor_name(r) in refers]
        if not var_inputs:
            continue
        if nd.op in WRITE_OPS:
            idx = WRITE_OPS[nd.op]
            if {i for i, _ in var_inputs} != set(idx):
                unsupported.setdefault(nd.op, []).append(n)
                continue
            for i in idx:
                writes.setdefault(refers[tensor_name(step.data_in[n][i])].node, []).append(n)
            continue
        if nd.op in READ_OPS | INITIALIZED_OPS or nd.op == "ResourceGather":
            continue
        # a TF1 ref variable read as a value by an ordinary op (the Identity "w/read", or MatMul(x, w))
        args = _input_args(lookup_op_def(nd.op, n), nd)
        if all(step.nodes[v.node].op in ("VariableV2", "Variable") and not args[i].is_ref for i, v in var_inputs):
            continue
        unsupported.setdefault(nd.op, []).append(n)
    if unsupported:
        listed = "; ".join(f"{op} x{len(ns)} ({', '.join(ns[:3])}{', ...' if len(ns) > 3 else ''})"
                           for op, ns in sorted(unsupported.items()))
        raise AscendEmuError(f"{name} uses variables through ops ascend-emu cannot convert: {listed}; supported "
                             f"variable ops: {', '.join(SUPPORTED_VARIABLE_OPS)}")
    return writes


def _writes_before(step: _Step, writes: dict, var_by_node: dict) -> tuple[dict, dict]:
    """(node -> bitset of the writes among its ancestors, write -> its bit); each variable's writes sorted
    into the one order the graph gives them, or refused if two have none."""
    pos = {n: i for i, n in enumerate(step.topo)}
    bit = {w: 1 << k for k, w in enumerate(sorted({w for ws in writes.values() for w in ws}, key=pos.get))}
    before: dict = {}
    for n in step.topo:
        acc = 0
        for src in step.sources(n):
            acc |= before[src] | bit.get(src, 0)
        before[n] = acc
    for var, ws in writes.items():
        ws.sort(key=lambda w: bin(before[w]).count("1"))
        for a, b in zip(ws, ws[1:]):
            if not before[b] & bit[a]:
                raise AscendEmuError(f"variable {var_by_node[var].key.split('/', 1)[1]!r} is updated by {a!r} and "
                                     f"{b!r} with no order between them (add a control dependency)")
    return before, bit


def _tf1_gradients(step: _Step, refers: dict, name: str) -> tuple[list, str, dict]:
    """(the ``grad_ys`` seeds of ``tf.gradients``, their name scope, node -> its output tensors that leave
    the scope: the gradients the update reads)."""
    seeds = [n for n in step.topo
             if _GRAD_YS.search(n) and step.nodes[n].op in ("Fill", "OnesLike", "Const", "Identity")]
    if not seeds:
        raise AscendEmuError(f"{name}: cannot find the gradient seed of the loss (tf.gradients' grad_ys_0); "
                             "build the train op with optimizer.minimize(loss) or tf.gradients(loss, ...)")
    scopes = {s.rpartition("/")[0] for s in seeds}
    if len(scopes) != 1 or scopes == {""}:
        raise AscendEmuError(f"{name}: loss scaling needs the gradients of one tf.gradients call in one name scope, "
                             f"found seeds {', '.join(seeds[:5])}")
    scope = scopes.pop() + "/"
    boundary: dict = {}
    for n in step.topo:
        if n.startswith(scope):
            continue
        for r in step.data_in[n]:
            t = tensor_name(r)
            src, idx = split_tensor_name(t)
            if src.startswith(scope) and t not in refers and t not in boundary.get(src, ()) \
                    and _output_dtype(step.nodes[src], idx) is not None:
                boundary.setdefault(src, []).append(t)
    if not boundary:
        raise AscendEmuError(f"{name}: no gradient leaves the gradients' scope {scope!r}; nothing is updated")
    return seeds, scope, boundary


def functionalize(gd, variables: list, fetches: list, *, targets=(), captures=None, extra_inputs=(),
                  loss_scale: str | None = None, name: str = "step") -> Functional:
    """Rewrite ``gd`` (a GraphDef of one stateful step) into a pure one (see
    :mod:`ascend_emu.frontend.tf.stateful` for the rules).

    Parameters
    ----------
    gd : GraphDef holding the step.
    variables : list of :class:`VariableSpec` (``node`` names the variable or captured handle); each
        becomes a placeholder (its ``placeholder`` is set to the name given).
    fetches : tensors the step returns (loss, ...), in the original graph.
    targets : ops that must run (a TF1 train op; a function's control outputs).
    captures : dict placeholder name -> array: captured constants, become Const nodes.
    extra_inputs : placeholder names that stay inputs (x, y, ...), in order.
    loss_scale : None, or the name of a new float32 placeholder: the TF1 gradient seed ``grad_ys`` is
        multiplied by it and every tensor leaving the gradients' name scope by its inverse.

    Returns
    -------
    Functional
        Outputs: the fetches, the (unscaled) gradients when ``loss_scale`` is given, then each variable's
        value at the end of the step, in ``variables`` order.
    """
    tf = import_tf()
    captures = captures or {}
    var_by_node = {v.node: v for v in variables}
    step = _Step.of(gd, [split_tensor_name(t)[0] for t in fetches] + list(targets), list(extra_inputs), name)
    nodes, data_in = step.nodes, step.data_in
    for n in step.topo:
        nd = nodes[n]
        if n not in var_by_node and (nd.op in VARIABLE_OPS or (
                nd.op == "Placeholder" and nd.attr["dtype"].type == tf.resource.as_datatype_enum)):
            raise AscendEmuError(f"{name} uses variable {n!r} ({nd.op}) without an initial value for it")
    refers = _variable_tensors(step, var_by_node)
    writes = _writes(step, refers, name)
    before, bit = _writes_before(step, writes, var_by_node)
    seeds, scope, boundary = _tf1_gradients(step, refers, name) if loss_scale is not None else ([], None, {})

    def in_scope(n):
        return scope is not None and n.startswith(scope)

    em = Emitter(set(nodes) - set(var_by_node))
    value: dict = {}          # var node -> its placeholder tensor
    new_value: dict = {}      # (write op, var node) -> tensor
    alias: dict = {}          # original tensor -> rewritten tensor
    unscaled: dict = {}       # gradient tensor -> its value times 1/loss_scale (what the update reads)
    inputs = list(extra_inputs)
    for v in variables:
        v.placeholder = em.placeholder(v.placeholder or v.key.split("/", 1)[1], v.dtype, v.shape)
        inputs.append(v.placeholder)
        value[v.node] = f"{v.placeholder}:0"
    scale_inv = None
    if loss_scale is not None:
        if em.placeholder(loss_scale, "float32", []) != loss_scale:
            raise AscendEmuError(f"{name}: the graph already has a node named {loss_scale!r}")
        scale_inv = em.op("RealDiv", f"{UNSCALE_PREFIX}inv", em.const(f"{UNSCALE_PREFIX}one", 1.0, "float32"),
                          f"{loss_scale}:0", dtype="float32")

    def current(var: VariableSpec, at: str) -> str:
        """The variable's value as node ``at`` reads it: the last write among its ancestors, else the start."""
        for w in reversed(writes.get(var.node, ())):
            if before[at] & bit[w]:
                return new_value[(w, var.node)]
        return value[var.node]

    def rewired(n: str) -> list:
        out = []
        for r in data_in[n]:
            t = tensor_name(r)
            if t in refers:
                out.append(current(refers[t], n))
            elif t in unscaled and not in_scope(n):
                out.append(unscaled[t])
            else:
                out.append(alias.get(t, t))
        return out

    counts: dict = {}
    grads, grad_sources = [], []
    for n in step.topo:
        nd = nodes[n]
        if f"{n}:0" in refers or nd.op == "NoOp":
            continue
        if n in captures:
            em.constant(n, captures[n])
            continue
        ins = rewired(n)
        if n in bit:              # a write
            counts[nd.op] = counts.get(nd.op, 0) + 1
            idx = WRITE_OPS[nd.op]
            dtype = _decoded_dtype(nd, "dtype" if nd.op.endswith("VariableOp") else "T")
            nesterov = nd.attr["use_nesterov"].b if "use_nesterov" in nd.attr else False
            new = update_chain(em, nd.op, n, [ins[i] for i in idx], ins, nesterov, dtype)
            for i, t in zip(idx, new):
                new_value[(n, refers[tensor_name(data_in[n][i])].node)] = t
            if not nd.op.endswith("VariableOp") and not nd.op.startswith("Resource"):
                alias[f"{n}:0"] = new[0]     # TF1 ops output the updated ref
            continue
        if nd.op in READ_OPS:
            em.op("Identity", n, ins[0], dtype=_decoded_dtype(nd, "dtype"), exact_name=True)
        elif nd.op in INITIALIZED_OPS:
            em.constant(n, np.bool_(True))
        elif nd.op == "ResourceGather":
            g = tf.compat.v1.NodeDef(name=n, op="GatherV2")
            g.input.extend([ins[0], ins[1], em.const(f"{n}/axis", 0, "int32")])
            g.attr["Tparams"].type = nd.attr["dtype"].type
            g.attr["Tindices"].type = nd.attr["Tindices"].type
            g.attr["Taxis"].type = tf.int32.as_datatype_enum
            g.attr["batch_dims"].i = nd.attr["batch_dims"].i
            em.add(g)
        else:
            c = tf.compat.v1.NodeDef()
            c.CopyFrom(nd)
            del c.input[:]
            c.input.extend(ins)
            # TensorFlow's private attributes: colocation with a variable that is now a placeholder, and
            # per-process counters (``_gradient_op_type``) that would make each trace's fingerprint differ
            for k in [k for k in c.attr if k.startswith("_")]:
                del c.attr[k]
            em.add(c)
        if n in seeds:
            dt = _output_dtype(nd, 0) or "float32"
            s = f"{loss_scale}:0" if dt == "float32" else em.cast("loss_scale/cast", f"{loss_scale}:0", "float32", dt)
            alias[f"{n}:0"] = em.op("Mul", f"loss_scale/{n.rpartition('/')[2]}", f"{n}:0", s, dtype=dt)
        for t in boundary.get(n, ()):
            dt = _output_dtype(nd, split_tensor_name(t)[1])
            inv = scale_inv if dt == "float32" else em.cast(f"{UNSCALE_PREFIX}cast", scale_inv, "float32", dt)
            index = split_tensor_name(t)[1]
            unscaled[t] = em.op("Mul", f"{UNSCALE_PREFIX}{n}" + (f"_{index}" if index else ""), alias.get(t, t), inv,
                                dtype=dt)
            grads.append(unscaled[t])
            grad_sources.append(t)

    final = []
    for v in variables:
        ws = writes.get(v.node)
        final.append(new_value[(ws[-1], v.node)] if ws else value[v.node])

    def out(t):
        t = tensor_name(t)
        return value[refers[t].node] if t in refers else alias.get(t, t)

    gd_out = tf.compat.v1.GraphDef()
    gd_out.versions.CopyFrom(gd.versions)
    gd_out.library.CopyFrom(gd.library)
    for nd in em.nodes:
        gd_out.node.add().CopyFrom(nd)
    return Functional(gd_out, inputs, [out(t) for t in fetches] + grads + final, em.ascend, grads, grad_sources,
                      counts)


def _arg_sizes(args, nd) -> list:
    """(OpDef arg, how many tensors it stands for, their dtype enums or None) of ``nd`` for ``args``."""
    out = []
    for arg in args:
        if arg.number_attr:
            out.append((arg, nd.attr[arg.number_attr].i, None))
        elif arg.type_list_attr:
            types = list(nd.attr[arg.type_list_attr].list.type)
            out.append((arg, len(types), types))
        else:
            out.append((arg, 1, None))
    return out


def _output_dtype(nd, index: int):
    tf = import_tf()
    try:
        op_def = lookup_op_def(nd.op, nd.name)
    except AscendEmuError:
        return None
    k = 0
    for arg, n, types in _arg_sizes(op_def.output_arg, nd):
        if k <= index < k + n:
            enum = types[index - k] if types is not None else (arg.type or nd.attr[arg.type_attr].type)
            dt = tf.as_dtype(enum)
            if types is not None or dt.is_floating:
                return np.dtype(dt.as_numpy_dtype).name
            return None
        k += n
    return None


def _input_args(op_def, nd) -> list:
    """The OpDef input arg of each of ``nd``'s data inputs."""
    return [arg for arg, n, _ in _arg_sizes(op_def.input_arg, nd) for _ in range(n)]
