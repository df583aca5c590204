"""The float32 reference inside loops and branches: every iteration's tensors, under the NPU dump's names.

TensorFlow runs a functional ``While`` (or ``If``, ``Case``) as one op, so a Session over the whole
graph cannot fetch what happens inside it. Here the reference runs the loop itself, with the same
driver the emulated device uses (:data:`ascend_emu.graph.control_flow.CONTROL_FLOW`), calling each
cond, body or branch function in TensorFlow once per iteration and fetching every op's output; the
ops are named as the device names them (``<while>/body/<k>/<op>``, by :meth:`Graph.scoped` of the
unfused function), so the comparison lines each iteration's ops up with the emulated ones.

Loop variables that are TensorFlow variants (the TensorLists of a Keras RNN or ``tf.map_fn``) have no
numpy value: they stay inside the Session as *session handles* (``GetSessionHandle``), fed to the
next call through ``GetSessionTensor``. The functions are imported once into one graph, so an
iteration is one ``Session.run`` of one body, with TensorFlow's kernels on the same inputs as in the
whole-graph run.

A graph with TF1 control flow (``Switch``/``Merge``/``Enter``/``Exit``/``NextIteration``) runs through
:func:`ascend_emu.graph.dataflow.run_dataflow`, each op in TensorFlow on its own
(:func:`.tfnode.run_tf_node`), so it too has every iteration's tensors under the device's names.
"""
from __future__ import annotations

import numpy as np

from ...errors import AscendEmuError
from ...graph.control_flow import CONTROL_FLOW
from ...graph.core import Graph, Node, tensor_name
from .tf import first_line, import_tf, session_config

def variant_placeholder() -> np.ndarray:
    """What a variant tensor (a TensorList) is recorded as: no numpy value, nothing to compare."""
    return np.empty((), dtype=object)


def _is_variant(dtype) -> bool:
    return dtype in ("variant", "resource")


class _Handle:
    """A variant tensor kept in the Session (a TensorFlow session handle)."""

    def __init__(self, handle):
        self.handle = handle


class FunctionRunner:
    """Runs the functions of a graph's functional control flow in TensorFlow, one call at a time.

    ``records`` receives ``(node, outputs)`` for every op of every call, in execution order, the
    node renamed to its execution name (nested control flow expanded before the op that holds it).
    """

    def __init__(self, graph: Graph):
        tf = import_tf()
        self.graph = graph
        self.tfg = tf.Graph()
        self.sess = tf.compat.v1.Session(graph=self.tfg, config=session_config())
        self.imported: dict = {}
        self.records: list = []

    def close(self) -> None:
        self.sess.close()

    # -- the graph's own tensors that enter control flow --------------------------------------
    def main_handles(self, refs: list[str], feeds: dict) -> dict:
        """Session handles of the main graph's variant tensors ``refs`` (run once, fed ``feeds``)."""
        if not refs:
            return {}
        tf = import_tf()
        gd = tf.compat.v1.GraphDef.FromString(self.graph.graph_def)
        with self.tfg.as_default():
            tf.graph_util.import_graph_def(gd, name="main")
            getters = [tf.compat.v1.get_session_handle(self.tfg.get_tensor_by_name(f"main/{r}")) for r in refs]
        values = self._run(getters, {f"main/{k}:0": v for k, v in feeds.items()}, self.graph.name)
        return {r: _Handle(v) for r, v in zip(refs, values)}

    # -- one call -----------------------------------------------------------------------------
    def _import(self, fname: str):
        entry = self.imported.get(fname)
        if entry is not None:
            return entry
        tf = import_tf()
        fg = self.graph.functions.get(fname)
        if fg is None or not fg.graph_def:
            raise AscendEmuError(f"the graph has no function {fname!r} with a GraphDef; load the model with load_graph")
        prefix = f"f{len(self.imported)}"
        gd = tf.compat.v1.GraphDef.FromString(fg.graph_def)
        with self.tfg.as_default():
            input_map, holders = {}, {}
            for spec in fg.inputs:
                if _is_variant(spec.dtype):
                    holder = tf.compat.v1.placeholder(tf.string, [], name=f"{prefix}_handle_{len(holders)}")
                    holders[spec.name] = holder
                    input_map[f"{spec.name}:0"] = tf.raw_ops.GetSessionTensor(handle=holder, dtype=tf.variant)
            tf.graph_util.import_graph_def(gd, input_map=input_map, name=prefix)
            # a variant is kept as a handle where it leaves the call: a result, or an input of nested control flow
            keep = {tensor_name(t) for t in fg.outputs}
            keep |= {tensor_name(r) for n in fg.nodes if n.op in CONTROL_FLOW for r in n.inputs}
            fetches, handles = {}, {}
            for n in fg.nodes:
                if n.op == "Placeholder":
                    continue
                for i, t in enumerate(n.outputs()):
                    dt = n.output_dtypes[i] if n.output_dtypes is not None else None
                    if _is_variant(dt):
                        if t in keep:
                            handles[t] = tf.compat.v1.get_session_handle(self.tfg.get_tensor_by_name(f"{prefix}/{t}"))
                    else:
                        fetches[t] = f"{prefix}/{t}"
        entry = self.imported[fname] = (fg, prefix, holders, fetches, handles)
        return entry

    def call(self, fname: str, args: tuple, scope: str) -> tuple:
        """Run function ``fname`` on ``args`` (arrays or handles); record its ops as ``scope/<op>``."""
        fg, prefix, holders, fetches, handles = self._import(fname)
        if len(args) != len(fg.inputs):
            raise AscendEmuError(f"function {fname!r} takes {len(fg.inputs)} arguments, got {len(args)}")
        feed = {}
        for spec, a in zip(fg.inputs, args):
            if spec.name in holders:
                if not isinstance(a, _Handle):
                    raise AscendEmuError(f"function {fname!r}: its TensorList argument {spec.name!r} comes from a "
                                         f"graph with TF1 control flow, whose reference cannot pass TensorLists; "
                                         f"export the model with one kind of control flow")
                feed[holders[spec.name]] = a.handle.handle
            else:
                feed[f"{prefix}/{spec.name}:0"] = a
        keys = list(fetches) + list(handles)
        values = self._run([fetches[k] for k in fetches] + [handles[k] for k in handles], feed, fname)
        got = {}
        for k, v in zip(keys, values):
            got[k] = _Handle(v) if k in handles else np.asarray(v)
        for spec, a in zip(fg.inputs, args):
            got[f"{spec.name}:0"] = a
        renamed = fg.scoped(scope)
        for node, named in zip(fg.nodes, renamed):
            if node.op == "Placeholder":
                continue
            outs = [got.get(t) for t in node.outputs()]
            if node.op in CONTROL_FLOW:
                # the nested loop's or branch's own ops first, as the device runs them
                CONTROL_FLOW[node.op](named, [got[tensor_name(r)] for r in node.inputs], self.call)
            self.records.append((named, [variant_placeholder() if o is None or isinstance(o, _Handle) else o
                                         for o in outs]))
        return tuple(got[tensor_name(t)] for t in fg.outputs)

    def _run(self, fetches, feed, what):
        try:
            return self.sess.run(fetches, feed)
        except Exception as e:
            raise AscendEmuError(f"TensorFlow failed to run {what!r} for the loop reference: {first_line(e)}") from None


def expand_control_flow(graph: Graph, tensors: dict, feeds: dict, records: list) -> list:
    """``records`` (``(node, outputs)`` in graph order) with every functional control-flow op's
    per-iteration ops inserted before it, and their tensors added to ``tensors`` by execution name."""
    cf = [n for n in graph.nodes if n.op in CONTROL_FLOW]
    if not cf:
        return records
    runner = FunctionRunner(graph)
    try:
        variant = sorted({tensor_name(r) for n in cf for r in n.inputs
                          if getattr(tensors.get(tensor_name(r)), "dtype", None) == object})
        handles = runner.main_handles(variant, feeds)
        out = []
        for node, outs in records:
            if node.op in CONTROL_FLOW:
                runner.records = []
                args = [handles.get(tensor_name(r), tensors.get(tensor_name(r))) for r in node.inputs]
                CONTROL_FLOW[node.op](node, args, runner.call)
                for n, o in runner.records:
                    out.append((n, o))
                    tensors.update(zip(n.outputs(), o))
            out.append((node, outs))
        return out
    finally:
        runner.close()


def run_tf1_graph(graph: Graph, feeds: dict) -> tuple[dict, list]:
    """Run a graph with TF1 control flow op by op in TensorFlow; (tensors, records in execution order)."""
    from ...graph.dataflow import check_live, run_dataflow
    from .tfnode import run_tf_node

    records: list = []
    runner = None

    def evaluate(node: Node, args):
        nonlocal runner
        if node.op == "Placeholder":
            return (feeds[node.name],)
        if node.op == "Const":
            return (np.asarray(node.attrs["value"]),)
        if node.op in CONTROL_FLOW:
            # a functional loop or branch in a TF1 graph: its calls run as in expand_control_flow (a
            # TensorList argument has no handle here, and is refused by the call)
            runner = runner or FunctionRunner(graph)
            runner.records = []
            outs = CONTROL_FLOW[node.op](node, args, runner.call)
            records.extend(runner.records)
            return outs
        return tuple(run_tf_node(node, args))

    try:
        tensors = run_dataflow(graph.nodes, {}, evaluate, on_node=lambda n, a, o: records.append((n, list(o))),
                               on_control=lambda n, o: records.append((n, list(o))))
    finally:
        if runner is not None:
            runner.close()
    check_live(tensors, graph.outputs)
    for n, outs in records:
        tensors.update(zip(n.outputs(), outs))
    return tensors, records
