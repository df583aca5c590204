"""``tf.compat.v1`` training graphs as the stateless :class:`~ascend_emu.frontend.tf.training.TrainStep`.

A TF1 graph with variables (``VariableV2`` or resource), a loss tensor and a train op
(``tf.compat.v1.train.GradientDescentOptimizer(...).minimize(loss)``, ``MomentumOptimizer``, ...),
Python-built or imported from a MetaGraph, goes through the same rewrite as a ``tf.function`` step
(:mod:`ascend_emu.frontend.tf.stateful` gives the rules and builds the step; NUMERICS.md section 10). This
module finds the graph's parts, reads the variables' starting values (checkpoint, session or the
graph's initializers) and runs TensorFlow's own step of the graph as the reference.
"""
from __future__ import annotations

import numpy as np

from ...errors import AscendEmuError
from ...graph.core import split_tensor_name, tensor_name
from .functionalize import VARIABLE_OPS, VariableSpec, functionalize, needed_nodes
from .stateful import _free, _make_step
from .tf import first_line, import_tf
from .training import TrainStep


def _graph_item(graph, ref, what: str, *, op: bool = False):
    """A tensor (or, with ``op``, an operation) of ``graph`` from a name or the object."""
    tf = import_tf()
    try:
        if isinstance(ref, str):
            if op:
                return graph.get_operation_by_name(ref.split(":")[0])
            return graph.get_tensor_by_name(ref if ":" in ref else f"{ref}:0")
        if op:
            return ref.op if isinstance(ref, tf.Tensor) else ref
        return ref
    except (KeyError, ValueError) as e:
        raise AscendEmuError(f"{what} {ref!r} is not in the graph ({first_line(e)})") from None


def _load_meta_graph(path: str):
    tf = import_tf()
    import os

    if not os.path.isfile(path):
        raise AscendEmuError(f"MetaGraph {path}: no such file; write it with tf.compat.v1.train.Saver().save(...) "
                             "or tf.compat.v1.train.export_meta_graph")
    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.compat.v1.train.import_meta_graph(path, clear_devices=True)
    except Exception as e:
        raise AscendEmuError(f"MetaGraph {path}: cannot import it ({first_line(e)})") from None
    return graph


def _tf1_initial_values(graph, gd, variables: list, session, checkpoint) -> dict:
    """State key -> value of each variable: from ``checkpoint``, ``session`` or the graph's initializers."""
    tf = import_tf()
    if checkpoint is not None:
        try:
            reader = tf.train.load_checkpoint(str(checkpoint))
        except Exception as e:
            raise AscendEmuError(f"checkpoint {checkpoint}: cannot read it ({first_line(e)})") from None
        missing = [v.node for v in variables if not reader.has_tensor(v.node)]
        if missing:
            raise AscendEmuError(f"checkpoint {checkpoint} has no value for variable(s) {', '.join(missing[:5])}")
        return {v.key: np.asarray(reader.get_tensor(v.node), dtype=v.dtype) for v in variables}
    reads = {}
    for nd in gd.node:      # a resource variable's value is fetched through a ReadVariableOp of it
        if nd.op == "ReadVariableOp" and not any(r.startswith("^") for r in nd.input):
            reads.setdefault(split_tensor_name(nd.input[0])[0], f"{nd.name}:0")
    if session is None:
        by_op = {v.op.name: v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                 + graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)}
        missing = [v.node for v in variables if v.node not in by_op]
        if missing:
            raise AscendEmuError(f"variable(s) {', '.join(missing[:5])} have no initializer in the graph's "
                                 "collections; "
                                 "pass session= (an initialized Session) or checkpoint=")
        session = tf.compat.v1.Session(graph=graph)
        try:
            session.run([by_op[v.node].initializer for v in variables])
            values = session.run([by_op[v.node] for v in variables])
        except Exception as e:
            raise AscendEmuError(f"cannot initialize the graph's variables: {first_line(e)}") from None
        finally:
            session.close()
    else:
        if session.graph is not graph:
            raise AscendEmuError("session= runs a different graph than the one given")
        fetches = []
        for v in variables:
            if v.resource and v.node not in reads:
                raise AscendEmuError(f"resource variable {v.node!r} has no ReadVariableOp in the graph to fetch its "
                                     "value with; pass checkpoint=")
            fetches.append(reads[v.node] if v.resource else f"{v.node}:0")
        try:
            values = session.run(fetches)
        except Exception as e:
            raise AscendEmuError(f"cannot read the variables from the session: {first_line(e)} "
                                 "(initialize them first)") from None
    return {v.key: np.array(val, dtype=v.dtype, copy=True) for v, val in zip(variables, values)}


class _Tf1Reference:
    """TensorFlow's own step of the TF1 graph, in a private Session on a copy of it: the state is
    assigned to the variables, ``[loss, gradients..., train_op]`` run together, the variables read."""

    def __init__(self, gd, variables: list, x: str, y: str, loss: str, grads: list, train_op: str):
        tf = import_tf()
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.import_graph_def(gd, name="")
            self.phs, assigns, self.reads = [], [], []
            for v in variables:
                ref = self.graph.get_tensor_by_name(f"{v.node}:0")
                ph = tf.compat.v1.placeholder(tf.as_dtype(v.dtype), v.shape)
                self.phs.append(ph)
                if v.resource:
                    assigns.append(tf.raw_ops.AssignVariableOp(resource=ref, value=ph))
                    self.reads.append(tf.raw_ops.ReadVariableOp(resource=ref, dtype=tf.as_dtype(v.dtype)))
                else:
                    assigns.append(tf.compat.v1.assign(ref, ph).op)
                    self.reads.append(ref)
            self.assign = tf.group(*assigns)
        self.x, self.y = f"{x}:0", f"{y}:0"
        self.fetches = [loss] + list(grads)
        self.train_op = train_op
        self.session = tf.compat.v1.Session(graph=self.graph)

    def __call__(self, x, y, loss_scale, iteration, *state):
        if float(np.asarray(loss_scale)) != 1.0:
            raise AscendEmuError("the TF1 reference step runs unscaled (loss_scale 1)")
        self.session.run(self.assign, {ph: np.asarray(s) for ph, s in zip(self.phs, state)})
        outs = self.session.run(self.fetches + [self.train_op], {self.x: np.asarray(x), self.y: np.asarray(y)})
        return outs[:-1] + self.session.run(self.reads)


def train_step_from_tf1_graph(graph, *, x, y, loss, train_op, session=None, checkpoint=None,
                              name: str | None = None) -> TrainStep:
    """A ``tf.compat.v1`` training graph as a :class:`TrainStep`.

    Parameters
    ----------
    graph : tf.Graph, or the path of a MetaGraph (``.meta``, as ``tf.compat.v1.train.Saver`` writes it).
    x, y : the input and target placeholders (names or tensors).
    loss : the loss tensor (a name such as ``"loss:0"`` or the tensor).
    train_op : the op one training step runs (``optimizer.minimize(loss)``; a name or the op).
    session : an initialized ``tf.compat.v1.Session`` on ``graph``: the variables start from its values.
    checkpoint : a checkpoint prefix (``model.ckpt``): the variables start from it (by variable name).
        With neither, the graph's own initializers run in a private session.
    name : the step's name in dumps (default: the train op's name).

    The variables (``VariableV2`` or resource) are those the loss and the train op depend on, the optimizer's
    slots and global step included; the gradients are the tensors the train op reads from ``tf.gradients``'
    name scope. The user's session and graph are never changed; the reference run (``function``) uses a
    private session on a copy of the graph.
    """
    tf = import_tf()
    if isinstance(graph, (str, bytes)) or hasattr(graph, "__fspath__"):
        import os

        graph = _load_meta_graph(os.fspath(graph))
    if not isinstance(graph, tf.Graph):
        raise AscendEmuError("train_step_from_tf1_graph needs a tf.Graph or a MetaGraph path, not "
                             f"{type(graph).__name__}")
    x_t, y_t = _graph_item(graph, x, "x"), _graph_item(graph, y, "y")
    loss_t = _graph_item(graph, loss, "loss")
    op = _graph_item(graph, train_op, "train_op", op=True)
    for role, t in (("x", x_t), ("y", y_t)):
        if t.op.type != "Placeholder":
            raise AscendEmuError(f"{role} {t.name!r} is a {t.op.type}, not a placeholder")
    if loss_t.shape.rank != 0 or not loss_t.dtype.is_floating:
        raise AscendEmuError(f"loss {loss_t.name!r} must be a scalar float tensor (shape {loss_t.shape}, "
                             f"{loss_t.dtype.name})")
    sname = name or op.name
    gd = graph.as_graph_def()
    from .loader import _control_flow_check

    names = {nd.name for nd in gd.node}
    needed = needed_nodes(gd, [loss_t.op.name, op.name])
    _control_flow_check(tf.compat.v1.GraphDef(node=[nd for nd in gd.node if nd.name in needed]), f"graph {sname!r}")
    variables = []
    for nd in gd.node:
        if nd.name in needed and nd.op in VARIABLE_OPS:
            v = VariableSpec(nd.name, f"variable/{nd.name}", np.dtype(tf.as_dtype(nd.attr["dtype"].type)
                                                                       .as_numpy_dtype).name,
                             [d.size for d in nd.attr["shape"].shape.dim], nd.name)
            v.resource = nd.op == "VarHandleOp"
            variables.append(v)
    if not variables:
        raise AscendEmuError(f"train op {op.name!r} updates no variable")
    initial = _tf1_initial_values(graph, gd, variables, session, checkpoint)

    scale, iteration = _free(names, "loss_scale"), _free(names, "iteration")
    gd2 = tf.compat.v1.GraphDef()
    gd2.CopyFrom(gd)
    it = gd2.node.add(name=iteration, op="Placeholder")
    it.attr["dtype"].type = tf.int64.as_datatype_enum
    it.attr["shape"].shape.CopyFrom(tf.TensorShape([]).as_proto())
    fn_out = functionalize(gd2, variables, [tensor_name(loss_t.name)], targets=[op.name],
                           extra_inputs=[x_t.op.name, y_t.op.name, scale, iteration], loss_scale=scale,
                           name=f"train op {op.name!r}")
    ref = _Tf1Reference(gd, variables, x_t.op.name, y_t.op.name, loss_t.name, fn_out.grad_sources, op.name)
    step = _make_step(ref, fn_out, name=sname, x=x_t.op.name, y=y_t.op.name, scale=scale, iteration=iteration,
                      variables=variables, initial=initial, n_grads=len(fn_out.grads),
                      description={"kind": "tf1_graph", "loss": loss_t.name, "train_op": op.name,
                                   "updates": fn_out.writes})
    step.handles = {v.key: v for v in variables}
    step.source_graph = graph
    return step


def _session_io(step: TrainStep, session) -> list:
    """Per variable of a TF1 step: (state key, fetch giving its value, initializer op, its initial-value tensor)
    (an initializer fed a value is how a value is written without adding ops to the user's graph)."""
    tf = import_tf()
    io = getattr(step, "_session_io", None)
    if io is not None:
        return io
    graph = session.graph
    if graph is not getattr(step, "source_graph", None):
        raise AscendEmuError("the session runs a different graph than the training step was built from")
    by_op = {v.op.name: v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
             + graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)}
    io = []
    for key, spec in step.handles.items():
        var = by_op.get(spec.node)
        if var is None:
            raise AscendEmuError(f"variable {spec.node!r} is in no variable collection of the graph; its emulated "
                                 "value cannot be written back into the session")
        init = var.initializer
        value = var if not spec.resource else None
        if spec.resource:
            reads = [o for o in graph.get_operations() if o.type == "ReadVariableOp" and o.inputs
                     and o.inputs[0].op.name == spec.node and not o.control_inputs]
            if not reads:
                raise AscendEmuError(f"resource variable {spec.node!r} has no ReadVariableOp in the graph to read "
                                     "it with")
            value = reads[0].outputs[0]
        io.append((key, value, init, init.inputs[1]))
    step._session_io = io
    return io


def read_session_variables(step: TrainStep, session) -> dict:
    """State key -> the current value in ``session`` of each variable of a :func:`train_step_from_tf1_graph` step."""
    io = _session_io(step, session)
    values = session.run([v for _, v, _, _ in io])
    return {k: np.array(val, dtype=step.handles[k].dtype, copy=True) for (k, _, _, _), val in zip(io, values)}


def load_session_variables(step: TrainStep, session, state: dict) -> None:
    """Write ``state`` into ``session``'s variables (each variable's initializer, fed the value)."""
    io = _session_io(step, session)
    session.run([init for _, _, init, _ in io], {iv: state[k] for k, _, _, iv in io})
