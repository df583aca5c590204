"""Run one graph node through TensorFlow itself.

The AI CPU fallback (:mod:`ascend_emu.npu.aicpu`: Ascend runs ops that have no AI Core
kernel on its AI CPU, in their original dtype) and the float32 reference of a graph with
TF1 control flow (:mod:`.reference`, op by op) both run single nodes: the node's own NodeDef
is placed in a tiny graph whose inputs are placeholders, and run in a Session.
The placeholders have the fed arrays' dtypes and shapes: TensorFlow runs the node's shape function
when the graph is built, and some refuse inputs of unknown rank or size (SpaceToBatchND's
``block_shape must have rank 1`` / ``must have known size``), as in the model's own graph they are known.
Each (node, input dtypes and shapes) builds its graph and Session once; later calls
only feed and fetch.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ...errors import AscendEmuError
from ...graph.core import Node
from .tf import first_line, import_tf, session_config  # noqa: F401

#: how many per-node Sessions to keep
CACHE_SIZE = 512
_cache: "OrderedDict[tuple, tuple]" = OrderedDict()
#: (node_def, outputs, dtypes) of the nodes TensorFlow builds only with their inputs' shapes
_needs_shapes: set = set()


def _build(node: Node, dtypes: tuple[str, ...], shapes: tuple[tuple[int, ...], ...] | None = None):
    """The node alone in a graph fed by placeholders of ``dtypes`` and ``shapes`` (None: unknown), and
    its Session."""
    tf = import_tf()
    nd = tf.compat.v1.NodeDef.FromString(node.node_def)
    gd = tf.compat.v1.GraphDef()
    feeds = []
    for i, dt in enumerate(dtypes):
        ph = gd.node.add(name=f"aicpu_input_{i}", op="Placeholder")
        ph.attr["dtype"].type = tf.as_dtype(np.dtype(dt)).as_datatype_enum
        if shapes is not None:
            ph.attr["shape"].shape.CopyFrom(tf.TensorShape(shapes[i]).as_proto())
        feeds.append(ph.name + ":0")
    op = gd.node.add()
    op.CopyFrom(nd)
    op.name = "aicpu_op"
    op.device = ""
    del op.input[:]
    op.input.extend(feeds)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(gd, name="")
    fetches = [f"aicpu_op:{i}" for i in range(node.num_outputs)]
    sess = tf.compat.v1.Session(graph=graph, config=session_config())
    return sess, feeds, fetches


def run_tf_node(node: Node, input_arrays) -> list[np.ndarray]:
    """Execute ``node`` through TensorFlow on ``input_arrays``, in their own dtypes.

    Parameters
    ----------
    node : Node
        A loader node (its ``node_def`` is used; the inputs are fed in order).
    input_arrays : sequence of numpy.ndarray
        One array per data input of the node.

    Returns
    -------
    list of numpy.ndarray
        The node's outputs (``node.num_outputs`` of them).

    Raises
    ------
    AscendEmuError
        If the node has no NodeDef, the wrong number of inputs, or TensorFlow
        rejects it.
    """
    if node.node_def is None:
        raise AscendEmuError(f"node {node.name!r} ({node.op}) has no NodeDef; load the model with "
                             f"load_graph to run it on the AI CPU")
    arrays = [np.asarray(a) for a in input_arrays]
    if len(arrays) != len(node.inputs):
        raise AscendEmuError(f"node {node.name!r} ({node.op}) takes {len(node.inputs)} inputs, "
                             f"got {len(arrays)}")
    # one Session per dtypes, fed placeholders of unknown shape; a node whose shape function needs its inputs'
    # shapes when the graph is built (SpaceToBatchND: "block_shape must have rank 1") gets one per shapes too
    key = (node.node_def, node.num_outputs, tuple(a.dtype.name for a in arrays))
    if key in _needs_shapes:
        key += (tuple(a.shape for a in arrays),)
    entry = _cache.get(key)
    if entry is None:
        try:
            try:
                entry = _build(node, key[2], key[3] if len(key) > 3 else None)
            except Exception:
                if len(key) > 3:
                    raise
                _needs_shapes.add(key)
                key += (tuple(a.shape for a in arrays),)
                entry = _build(node, key[2], key[3])
        except Exception as e:
            raise AscendEmuError(f"TensorFlow cannot build node {node.name!r} ({node.op}) on its own: "
                                 f"{first_line(e)}") from None
        _cache[key] = entry
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)[1][0].close()
    else:
        _cache.move_to_end(key)
    sess, feeds, fetches = entry
    try:
        outs = sess.run(fetches, dict(zip(feeds, arrays)))
    except Exception as e:
        raise AscendEmuError(f"TensorFlow failed to run node {node.name!r} ({node.op}): "
                             f"{first_line(e)}") from None
    return [np.asarray(o) for o in outs]


def clear_cache() -> None:
    """Close every cached Session."""
    while _cache:
        _cache.popitem()[1][0].close()
    _needs_shapes.clear()
