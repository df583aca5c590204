"""The float32 reference of an ONNX model: onnxruntime on the CPU, every node's outputs dumped.

The model (as loaded, external data included) gets every node output as a graph output, and onnxruntime
runs it once on the CPU with graph optimizations off (so every node runs, none fused or folded away).
The dump has one op per graph node that stands for an ONNX node, input or initializer
(:class:`.loader.OnnxSource`), under the graph's names and output indices: the emulator's dump of
the same graph aligns op for op (the emulator's own helper nodes, such as the layout transposes, are
NPU-only rows in compare). Engines: ``HOST`` for Const and Placeholder, ``ORT`` for the rest.
"""
from __future__ import annotations

import numpy as np

from ...errors import AscendEmuError
from ...graph.core import Graph
from .build import all_tensors
from .node import _line, run_session, session_options


def run_onnx_model(graph: Graph, feeds: dict) -> dict:
    """ONNX tensor name -> value of every tensor of ``graph``'s ONNX model, run by onnxruntime in float32."""
    import onnx
    import onnxruntime as ort

    src = graph.onnx
    m = onnx.ModelProto.FromString(src.model)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(m)):
        # the loader inlines every tensor; onnxruntime would resolve what is left against the current directory
        raise AscendEmuError(f"ONNX model {graph.name!r} still names external data files; load it with "
                             "load_onnx from its .onnx path")
    have = {o.name for o in m.graph.output}
    for nd in m.graph.node:
        for o in nd.output:
            if o and o not in have:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
                have.add(o)
    try:
        sess = ort.InferenceSession(m.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    except Exception as e:
        raise AscendEmuError(f"onnxruntime cannot load model {graph.name!r}: {_line(e)}") from None
    by_key = {s.name: (s.key or s.name) for s in graph.inputs}
    onnx_feeds = {by_key[k]: v for k, v in feeds.items()}
    names = [o.name for o in sess.get_outputs()]
    try:
        got = run_session(sess, names, onnx_feeds)
    except Exception as e:
        raise AscendEmuError(f"onnxruntime failed to run model {graph.name!r}: {_line(e)}") from None
    values = dict(zip(names, (np.asarray(v) for v in got)))
    values.update(onnx_feeds)
    from onnx import numpy_helper

    from .loader import sparse_to_dense

    for t in m.graph.initializer:
        values[t.name] = numpy_helper.to_array(t)
    for s in m.graph.sparse_initializer:
        values[s.values.name] = sparse_to_dense(s)
    return values


def onnx_records(graph: Graph, feeds: dict) -> tuple[list, dict]:
    """``(node, outputs)`` for every graph node that stands for an ONNX node, input or initializer, in graph
    order, and the tensors by graph name (``"node:i"``), from one onnxruntime run."""
    values = run_onnx_model(graph, feeds)
    src = graph.onnx
    ran, tensors = [], {}
    for node in [*graph.nodes, *src.extra.values()]:
        names = src.nodes.get(node.name)
        if names is None:
            continue        # a node of the emulator's own (a layout transpose, a helper constant)
        outs = [values[o] if o in values else np.zeros(0, np.float32) for o in names]
        for i, v in enumerate(outs):
            tensors[f"{node.name}:{i}"] = v
        ran.append((node, outs))
    return ran, tensors


def version() -> str:
    import onnxruntime as ort

    return ort.__version__


def config(version: str) -> dict:
    return {"framework": "onnxruntime", "onnxruntime_version": version, "device": "CPU",
            "dtype": "original (float32 for float32 models)", "graph_optimization": "off"}
