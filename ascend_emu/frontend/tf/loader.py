"""Load a TensorFlow model as a plain :class:`~ascend_emu.graph.Graph`.

The only module (with :mod:`ascend_emu.npu.aicpu` and :mod:`ascend_emu.frontend.tf.reference`)
that knows TensorFlow and protobufs. Every supported source becomes a
ConcreteFunction, which is frozen (variables to constants, function calls
inlined by Grappler's function optimizer, control flow left functional), then
cleaned into a flat GraphDef:

- function calls the freezing pass left (at any depth) inlined as ``call/<node>``;
- control inputs dropped, ``NoOp`` removed;
- ``Identity`` nodes that read a ``Const`` (the frozen ``ReadVariableOp``)
  become ``Const`` nodes of the same name, so each weight appears once;
- nodes that do not feed an output removed (placeholders always kept);
- nodes in a deterministic topological order (Kahn's algorithm, ties broken by
  the frozen GraphDef's order);
- missing attributes filled with their OpDef defaults;
- every node's output dtypes and shapes recorded from TensorFlow's shape inference
  (``Node.output_dtypes``/``output_shapes``), which the device checks each op against;
- the functions of functional control flow (While cond/body, If/Case branches) loaded
  the same way as subgraphs, ``Graph.functions``;
- TF1 control flow (Switch/Merge/Enter/Exit/NextIteration, frozen from ``tf.compat.v1`` ``tf.cond`` and
  ``tf.while_loop``) kept with its control edges (``Node.control_inputs``), which carry deadness, for
  :mod:`ascend_emu.graph.dataflow`; the loops' back edges are left out of the topological order.

Nothing else is rewritten: no constant folding, no fusion, so a Keras
BatchNormalization stays the Mul/Add/Rsqrt pattern (or ``FusedBatchNormV3``)
TensorFlow emits. The cleaned GraphDef is kept as ``Graph.graph_def`` (one
NodeDef per :class:`Node`, same names) and hashed for ``Graph.fingerprint``.

- :mod:`.sources`: the model sources, each to a ConcreteFunction (or a frozen GraphDef);
- :mod:`.graphdef`: freezing and cleaning to a flat GraphDef;
- here: :func:`load_graph`, the plain nodes and the control-flow functions.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ...errors import AscendEmuError
from ...graph.core import Graph, InputSpec, Node
from ...numerics.memo import freeze as read_only
from ..shapes import check_shape_fits, shape_items
from .tf import (_quiet_stderr, count_outputs, dtype_name, first_line, import_keras, import_tf,  # noqa: F401
                 lookup_op_def, node_attrs)
from .sources import SUFFIXES, SUPPORTED, _source  # noqa: F401
from .graphdef import (CALL_OPS, CONTROL_FLOW_OPS, _clean, _control_flow_check, _freeze,  # noqa: F401
                       _function_graph_def, _inline_calls, _sinks, _unsupported_control_flow_check,
                       _wrap_graph_def, lowering_artifact)

#: functional control flow (TF2): interpreted, with the functions it calls as subgraphs
FUNCTIONAL_CONTROL_FLOW = {"While": ("cond", "body"), "StatelessWhile": ("cond", "body"),
                           "If": ("then_branch", "else_branch"), "StatelessIf": ("then_branch", "else_branch"),
                           "Case": ("branches",), "StatelessCase": ("branches",)}


def _apply_input_shapes(gd, specs: list[InputSpec], input_shapes) -> None:
    if not input_shapes:
        return
    by_name = {}
    for s in specs:
        by_name[s.name] = by_name[s.name + ":0"] = s
        if s.key:
            by_name.setdefault(s.key, s)

    tf = import_tf()
    for key, shape in shape_items(input_shapes):
        spec = by_name.get(key)
        if spec is None:
            raise AscendEmuError(f"--shape names unknown input {key!r}; the model's inputs are: "
                                 + ", ".join(s.name for s in specs))
        shape = [None if d is None or int(d) < 0 else int(d) for d in shape]
        check_shape_fits(spec, shape)
        spec.shape = [s if s is not None else (spec.shape[i] if spec.shape else None)
                      for i, s in enumerate(shape)]
        for nd in gd.node:
            if nd.name == spec.name:
                nd.attr["shape"].shape.CopyFrom(
                    tf.TensorShape(spec.shape).as_proto())


def _output_signatures(gd) -> dict:
    """Node name -> (output dtypes, output shapes) from TensorFlow's shape inference on ``gd``.

    Large float constants are replaced by placeholders of their shape first: shape
    inference needs only their shapes, and copying the weights would dominate the time.
    """
    tf = import_tf()
    light = tf.compat.v1.GraphDef()
    light.versions.CopyFrom(gd.versions)
    light.library.CopyFrom(gd.library)
    for nd in gd.node:
        c = light.node.add()
        t = nd.attr["value"].tensor if nd.op == "Const" else None
        if t is not None and t.dtype in (tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum,
                                         tf.float32.as_datatype_enum, tf.float64.as_datatype_enum) \
                and len(t.tensor_content) > 4096:
            c.name, c.op = nd.name, "Placeholder"
            c.attr["dtype"].type = t.dtype
            c.attr["shape"].shape.CopyFrom(t.tensor_shape)
        else:
            c.CopyFrom(nd)
    g = tf.Graph()
    try:
        with g.as_default():
            tf.graph_util.import_graph_def(light, name="")
    except Exception as e:
        raise AscendEmuError(f"TensorFlow cannot infer the shapes of the graph: {first_line(e)}") from None
    sigs = {}
    for op in g.get_operations():
        sigs[op.name] = ([dtype_name(t.dtype) for t in op.outputs],
                         [None if t.shape.rank is None else t.shape.as_list() for t in op.outputs])
    return sigs


def load_graph(model, *, signature: str | None = None, input_shapes: dict | None = None) -> Graph:
    """Load a TensorFlow model as a frozen, flat :class:`~ascend_emu.graph.Graph`.

    Parameters
    ----------
    model : keras.Model, str, os.PathLike, tf.function, ConcreteFunction, GraphDef or Graph
        A Keras model object (run with ``training=False``), a ``.keras`` file, a
        SavedModel directory, a frozen GraphDef (``.pb`` binary or ``.pbtxt``
        text), a ``tf.function`` with an ``input_signature``, or a
        ConcreteFunction. A :class:`Graph` is returned unchanged.
    signature : str, optional
        SavedModel signature key; default ``"serving_default"``.
    input_shapes : dict, optional
        Input name (placeholder name or signature key) -> shape, fixing dims
        the signature leaves unknown. The shape must fit the signature.

    Returns
    -------
    Graph
        Nodes in topological order with decoded attributes, inputs as
        :class:`InputSpec`, output tensor names and their user-facing names,
        the cleaned GraphDef and its sha256 fingerprint.

    Raises
    ------
    AscendEmuError
        For a missing or unreadable file, a directory that is not a SavedModel,
        an unknown signature, an unsupported object, or a graph with a
        ``ControlTrigger`` (the one TF1 control-flow op not supported).
    """
    if isinstance(model, Graph):
        return model
    from ..onnx.loader import is_onnx
    from ..shapes import is_pt2
    if is_onnx(model):
        if signature is not None:
            raise AscendEmuError(f"--signature {signature!r} applies to SavedModel directories only; drop it "
                                 "for an ONNX model")
        from ..onnx.loader import load_onnx
        return load_onnx(model, input_shapes=input_shapes)
    if is_pt2(model):
        if signature is not None:
            raise AscendEmuError(f"--signature {signature!r} applies to SavedModel directories only; drop it "
                                 "for an exported PyTorch program")
        from ..torch.pt2.loader import load_pt2
        return load_pt2(model, input_shapes=input_shapes)
    src = _source(model, signature)
    struct_names = None
    if src.func is not None:
        gd, input_names, outputs, struct_names = _freeze(src.func)
    else:
        gd = src.graph_def
        _unsupported_control_flow_check(gd, f"GraphDef {src.name!r}")
        if any(nd.op in CALL_OPS for nd in gd.node):
            gd, input_names, outputs, _ = _freeze(_wrap_graph_def(gd))
        else:
            data_in = {nd.name: [r for r in nd.input if not r.startswith("^")] for nd in gd.node}
            input_names = [nd.name for nd in gd.node if nd.op == "Placeholder" and not lowering_artifact(nd, data_in)]
            outputs = _sinks(gd)
        if not outputs:
            raise AscendEmuError(f"GraphDef {src.name!r} has no output (every node is consumed "
                                 f"or is a Const/Placeholder/NoOp)")
    # named structures (dicts) come straight from the traced function; else Keras' names
    return graph_from_graph_def(gd, input_names, outputs, name=str(src.name), input_keys=src.input_keys,
                                output_names=struct_names or src.output_names, input_shapes=input_shapes)


def graph_from_graph_def(gd, input_names: list[str], outputs: list[str], *, name: str,
                         input_keys: dict | None = None, output_names: list | None = None,
                         input_shapes: dict | None = None) -> Graph:
    """A flat :class:`Graph` from a GraphDef without variables: calls inlined, cleaned (control inputs
    dropped, unused nodes removed, topological order), TensorFlow's output signatures recorded.

    ``input_names`` orders the placeholders (any other placeholder follows in graph order);
    ``outputs`` are the tensors the graph computes, in order.
    """
    input_keys = input_keys or {}
    gd, outputs = _inline_calls(gd, outputs)
    gd = _clean(gd, input_names, outputs)

    specs = {}
    for nd in gd.node:
        if nd.op == "Placeholder":
            attrs = node_attrs(nd, lookup_op_def(nd.op, nd.name))
            specs[nd.name] = InputSpec(nd.name, attrs["dtype"], attrs.get("shape"),
                                       key=input_keys.get(nd.name, nd.name))
    # signature order first, then any other placeholder in graph order
    ordered = [specs.pop(n) for n in input_names if n in specs] + list(specs.values())
    _apply_input_shapes(gd, ordered, input_shapes)

    nodes = _nodes(gd)
    raw = gd.SerializeToString(deterministic=True)
    out_names = output_names
    if out_names is not None and len(out_names) != len(outputs):
        out_names = None
    return Graph(nodes=nodes, inputs=ordered, outputs=outputs, name=str(name),
                 fingerprint=hashlib.sha256(raw).hexdigest(), graph_def=raw,
                 output_names=out_names, functions=_functions(gd, nodes))


def _nodes(gd) -> list[Node]:
    """Plain nodes of a cleaned GraphDef, each with TensorFlow's inferred output signature."""
    sigs = _output_signatures(gd)
    nodes = []
    for nd in gd.node:
        op_def = lookup_op_def(nd.op, nd.name)
        attrs = node_attrs(nd, op_def)
        out_dtypes, out_shapes = sigs.get(nd.name, (None, None))
        if nd.op == "Const" and isinstance(attrs.get("value"), np.ndarray):
            # the loader made this array and nothing else holds it: read-only, so a replay casts a weight
            # to fp16 (and lays out a cube filter) once per loaded graph, not once per replay (numerics/memo.py);
            # a model whose variables change is loaded again (graph_cache), with new arrays
            read_only(attrs["value"])
        # the NodeDef is kept for the AI CPU fallback; a Const always runs on the host from its
        # decoded value, and its NodeDef would hold a second copy of every weight (~100 MB on ResNet50)
        nodes.append(Node(name=nd.name, op=nd.op, inputs=[r for r in nd.input if not r.startswith("^")],
                          attrs=attrs, control_inputs=[r[1:] for r in nd.input if r.startswith("^")],
                          num_outputs=count_outputs(op_def, attrs),
                          node_def=None if nd.op == "Const" else nd.SerializeToString(deterministic=True),
                          output_shapes=out_shapes, output_dtypes=out_dtypes))
    return nodes


def _functions(gd, nodes: list[Node]) -> dict:
    """Every function the control-flow nodes call, at any nesting depth, as a Graph by name."""
    library = {f.signature.name: f for f in gd.library.function}
    out: dict = {}
    todo = [n for n in nodes if n.op in FUNCTIONAL_CONTROL_FLOW]
    while todo:
        node = todo.pop()
        for key in FUNCTIONAL_CONTROL_FLOW[node.op]:
            names = node.attrs.get(key)
            for fname in names if isinstance(names, list) else [names]:
                if fname in out:
                    continue
                if fname not in library:
                    raise AscendEmuError(f"{node.op} {node.name!r} calls function {fname!r}, which is not in "
                                         f"the graph's function library; the GraphDef is incomplete")
                fgd, args, outs = _function_graph_def(library[fname], gd)
                fgd = _clean(fgd, args, outs)
                fnodes = _nodes(fgd)
                specs = [InputSpec(n.name, n.attrs["dtype"], n.attrs.get("shape")) for n in fnodes
                         if n.op == "Placeholder"]
                by_name = {s.name: s for s in specs}
                # the GraphDef lets the reference run the function in TensorFlow, one call at a time
                out[fname] = Graph(nodes=fnodes, inputs=[by_name[a] for a in args], outputs=outs, name=fname,
                                   graph_def=fgd.SerializeToString(deterministic=True))
                todo.extend(n for n in fnodes if n.op in FUNCTIONAL_CONTROL_FLOW)
    return out
