"""The device's work kept per node between replays of one graph (training steps replay the same fused graph every
step): what :class:`ascend_emu.npu.replay._Run` works out for a node from the dtypes of its inputs, once, in the
device's per-graph plan (``Device._plan``), and checks against each replay's inputs (``signature``)."""
from __future__ import annotations

import numpy as np

from ..ops.multicore import MULTICORE_OPS


class Prepared:
    """What the device worked out for a node that computes on the AI Core from the dtypes of its inputs: the
    same every time the node meets inputs of the same dtypes (``sig``) in the same graph on the same device
    (which inputs are constants or graph inputs is a property of the graph), so a graph replayed many times
    (training steps) works it out once per node. See ``_Run._eval_node``."""

    __slots__ = ("node", "sig", "opdef", "refs", "ascend_op", "fusion", "float_idx", "casts", "dec", "precision",
                 "compute", "cdt", "attrs", "ctx_key", "multicore")

    def __init__(self, node, sig, opdef, refs, ascend_op, fusion, float_idx, casts, dec, precision, compute):
        self.node, self.sig, self.opdef, self.refs, self.ascend_op = node, sig, opdef, refs, ascend_op
        self.fusion, self.float_idx, self.casts, self.dec = fusion, float_idx, casts, dec
        self.precision, self.compute = precision, compute
        # the dtype of its op context: MX operands are float32 values (scale x element, exact), HiFloat8 values are
        # exact in float16
        self.cdt = ("float32" if type(compute) is str and compute.startswith("mx_")
                    else "float16" if dec.dtype == "hifloat8" else dec.dtype)
        # the attributes its function takes (what OpDef.__call__ picks out on every call)
        self.attrs = op_attrs(opdef, node)
        # its op context: the run's one for (cdt, cube_out), copied; a launch of its own where determinism is off
        self.ctx_key = (self.cdt, dec.cube_out)
        self.multicore = node.op in MULTICORE_OPS


def op_attrs(opdef, node) -> dict:
    """The attributes of ``node`` that the function of ``opdef`` takes (``OpDef.__call__``'s choice)."""
    return dict(node.attrs) if opdef.takes_all_attrs else {k: v for k, v in node.attrs.items() if k in opdef.params}


class Light:
    """A node whose device work is not arithmetic (a Const, a Placeholder, a host op such as Shape, an integer op
    of shape arithmetic, a pure data movement such as Identity or Reshape that meets no cast), worked out once per
    node as :class:`Prepared` is: its op function with the attributes it takes, its input and output names and its
    record's fields, so a replay skips the op lookup, the precision preamble, and (for :data:`PURE_MOVES`, which
    touch neither numbers nor ``ctx``) the op context and the thread fit. The records are the ones the full path
    makes (``_Run._eval_light``). ``kind``: "const", "placeholder", "host", "int" or "move"."""

    __slots__ = ("node", "sig", "kind", "fn", "attrs", "refs", "outs", "ascend_op", "opdef", "compute",
                 "precision", "fusion", "fold")

    def __init__(self, node, sig, kind, *, opdef=None, refs=(), ascend_op="", compute=None,
                 precision=None, fusion=None):
        self.node, self.sig, self.kind, self.opdef = node, sig, kind, opdef
        self.fn = opdef.fn if opdef is not None else None
        self.attrs = {} if opdef is None else op_attrs(opdef, node)
        self.refs, self.outs, self.ascend_op = list(refs), tuple(node.output_names()), ascend_op
        self.compute, self.precision, self.fusion = compute, precision, fusion
        #: a "host" or "int" node's last (fold_key of its inputs, its outputs, fold_key of its outputs): GE computes
        #: shape arithmetic once, when it compiles the graph; a replay that meets the same input values hands the
        #: same outputs on (``_Run._fold``)
        self.fold = None


#: data movements that return their input's bits rearranged and read nothing of ``ctx``: with no cast in front of
#: them, a replay calls their function directly (:class:`Light` "move")
PURE_MOVES = frozenset(("Identity", "StopGradient", "Snapshot", "PreventGradient", "IdentityN", "Reshape", "Squeeze",
                        "ExpandDims"))


def signature(args) -> tuple:
    """The dtypes of a node's inputs (the types of its non-array inputs): what a kept node is valid for."""
    return tuple([a.dtype if type(a) is np.ndarray else type(a) for a in args])


#: the largest input and output (elements) of a "host" or "int" node whose outputs a replay keeps for the next one:
#: both are compared by value each replay (shape vectors, axes, a few indices: a few bytes each)
FOLD_ELEMENTS = 64

#: host ops whose outputs depend on their inputs' shapes alone (and their attributes), whatever the inputs' size
SHAPE_ONLY = frozenset(("Shape", "Size", "Rank", "ShapeN"))


def fold_key(op: str, args) -> tuple | None:
    """What the outputs of a "host" or "int" node (a registry function of its inputs and attributes: no registry op
    draws random numbers or keeps state) depend on: its inputs' shapes, dtypes and bytes (their shapes and dtypes
    alone for :data:`SHAPE_ONLY`). None: an input is not an array, or is larger than :data:`FOLD_ELEMENTS`
    (nothing kept: comparing it would cost what computing does)."""
    key = []
    shape_only = op in SHAPE_ONLY
    for a in args:
        if type(a) is not np.ndarray or a.dtype.hasobject:
            return None   # (objects' bytes are their addresses)
        if shape_only:
            key.append((a.shape, a.dtype))
        elif a.size <= FOLD_ELEMENTS:
            key.append((a.shape, a.dtype, a.tobytes()))
        else:
            return None
    return tuple(key)
