"""Run one ONNX node through onnxruntime: the emulated AI CPU of ONNX models.

A node the registry cannot express (or whose registry op refuses its inputs) runs as itself: its NodeProto
alone in a one-node model whose inputs have the fed arrays' dtypes and shapes, run by onnxruntime on the
CPU with graph optimizations off. The replay hands it float32 (it widens fp16 inputs first), as Ascend's AI
CPU runs such ops in their original dtype. Each (node, input dtypes and shapes) builds its session once.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ...errors import AscendEmuError
from ...graph.core import Node
from .build import ONNX_DTYPES, all_tensors

#: how many per-node sessions to keep
CACHE_SIZE = 256
_cache: "OrderedDict[tuple, tuple]" = OrderedDict()
_TO_ONNX = {v: k for k, v in ONNX_DTYPES.items()}


def session_options():
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 4     # errors reach the user as one line of ours, not as its log
    return so


def _build(node: Node, arrays):
    import onnx
    from onnx import helper

    if "onnx_node" not in node.meta:
        return _build_form(node, arrays)
    nd = onnx.NodeProto.FromString(node.meta["onnx_node"])
    feeds, k = [], 0
    inputs = []
    for i, name in enumerate(nd.input):
        if not name:
            continue
        a = arrays[k]
        k += 1
        feed = f"aicpu_input_{i}"
        nd.input[i] = feed
        if a.dtype.name not in _TO_ONNX:
            raise AscendEmuError(f"op {node.name} ({node.op}) on the AI CPU: onnxruntime takes no {a.dtype.name}")
        inputs.append(helper.make_tensor_value_info(feed, _TO_ONNX[a.dtype.name], list(a.shape)))
        feeds.append(feed)
    # the tensors of the enclosing graph an If/Loop body reads by name (loader.outer_names): graph inputs under
    # their own names, after the node's inputs
    for name, a in zip(node.meta.get("onnx_outer", ()), arrays[k:]):
        if a.dtype.name not in _TO_ONNX:
            raise AscendEmuError(f"op {node.name} ({node.op}) on the AI CPU: onnxruntime takes no {a.dtype.name}")
        inputs.append(helper.make_tensor_value_info(name, _TO_ONNX[a.dtype.name], list(a.shape)))
        feeds.append(name)
    outs = []
    for i, name in enumerate(nd.output):
        if name:
            nd.output[i] = f"aicpu_output_{i}"
            outs.append((i, nd.output[i]))
    graph = helper.make_graph([nd], "aicpu", inputs, [onnx.ValueInfoProto(name=o) for _, o in outs])
    imports = [helper.make_opsetid("", int(node.meta.get("onnx_opset", 17)))]
    if nd.domain not in ("", "ai.onnx"):    # a contrib op (com.microsoft, ...): its domain's version 1
        imports.append(helper.make_opsetid(nd.domain, 1))
    # only a node with a subgraph (Loop, Scan, If) can run without end: it alone needs run_session's watch
    nested = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in nd.attribute)
    return _session(node, nd.op_type, graph, imports), feeds, outs, nested


def _build_form(node: Node, arrays):
    """A registry op the ONNX front end emitted (a Conv's Conv2D): its ONNX form (:mod:`.form`)."""
    import onnx
    from onnx import helper

    from .form import onnx_form

    inputs = []
    for i, a in enumerate(arrays):
        if a.dtype.name not in _TO_ONNX:
            raise AscendEmuError(f"op {node.name} ({node.op}) on the AI CPU: onnxruntime takes no {a.dtype.name}")
        inputs.append(helper.make_tensor_value_info(f"aicpu_input_{i}", _TO_ONNX[a.dtype.name], list(a.shape)))
    nodes = onnx_form(node, arrays)
    outs = [(i, f"aicpu_output_{i}") for i in range(max(node.num_outputs, 1))]
    graph = helper.make_graph(nodes, "aicpu", inputs, [onnx.ValueInfoProto(name=o) for _, o in outs])
    imports = [helper.make_opsetid("", int(node.meta.get("onnx_opset", 17)))]
    return _session(node, node.op, graph, imports), [f"aicpu_input_{i}" for i in range(len(arrays))], outs, False


def _session(node: Node, op_type: str, graph, imports):
    import onnx
    import onnxruntime as ort
    from onnx import helper

    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = min(model.ir_version, 10)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(model)):
        # the loader inlines every tensor; onnxruntime would resolve what is left against the current directory
        raise AscendEmuError(f"op {node.name} ({op_type}) still names an external data file; load the model "
                             "with load_onnx from its .onnx path")
    try:
        return ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    except Exception as e:
        raise AscendEmuError(f"onnxruntime cannot build op {node.name} ({op_type}): {_line(e)}") from None


def run_session(sess, names, feeds) -> list:
    """``sess.run(names, feeds)`` that Ctrl-C stops: onnxruntime runs in a helper thread while this one waits in
    short joins (which a signal interrupts); on KeyboardInterrupt the run is told to terminate (an endless ONNX
    Loop ignored Ctrl-C: the signal waited for sess.run to return) and the interrupt goes on up."""
    import threading

    import onnxruntime as ort

    opts = ort.RunOptions()
    box: dict = {}
    done = threading.Event()    # (not Thread.join: a join Ctrl-C interrupts can leave the thread "alive" for good)

    def work():
        try:
            box["out"] = sess.run(names, feeds, opts)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            box["err"] = e
        finally:
            done.set()

    threading.Thread(target=work, name="onnxruntime", daemon=True).start()
    try:
        while not done.wait(0.25):
            pass
    except KeyboardInterrupt:
        opts.terminate = True   # onnxruntime stops between nodes (and Loop iterations)
        done.wait(10)
        raise
    if "err" in box:
        raise box["err"]
    return box["out"]


def _line(e) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]


def run_onnx_node(node: Node, input_arrays) -> list[np.ndarray]:
    """Execute ONNX node ``node`` (``meta["onnx_node"]``; else a registry op the ONNX front end emitted, as its
    ONNX form) in onnxruntime on ``input_arrays`` (one per present input, in order); returns
    ``node.num_outputs`` arrays (an output the node leaves unnamed: empty)."""
    arrays = [np.asarray(a) for a in input_arrays]
    form = node.meta.get("onnx_node") or (node.op, repr(sorted(node.attrs.items())))
    key = (node.name, form, tuple((a.dtype.str, a.shape) for a in arrays))
    hit = _cache.get(key)
    if hit is None:
        hit = _cache[key] = _build(node, arrays)
        if len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    else:
        _cache.move_to_end(key)
    sess, feeds, outs, nested = hit
    try:
        if nested:
            got = run_session(sess, [o for _, o in outs], dict(zip(feeds, arrays)))
        else:
            # one op without a subgraph ends on its own: run here, not in a helper thread (starting and joining
            # one cost ~1 ms a call on the shared cores, a third of a LLaMA block's replay with 6 such ops)
            got = sess.run([o for _, o in outs], dict(zip(feeds, arrays)))
    except Exception as e:
        raise AscendEmuError(f"onnxruntime failed on op {node.name} ({node.op}): {_line(e)}") from None
    result = [np.zeros(0, np.float32)] * node.num_outputs
    for (i, _), v in zip(outs, got):
        result[i] = np.asarray(v)
    return result
