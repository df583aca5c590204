"""The plain graph an ONNX model becomes: node emission, names, constants, layouts.

:class:`Builder` holds what the converters of :mod:`.ops` need while they turn ONNX nodes
into registry ops: the map from ONNX tensor names to graph tensors (``"node:index"``), the values
known when the model loads (initializers, ``Constant`` nodes, shapes ONNX's shape inference fixes,
integer arithmetic on them), the static shapes and element types from that inference, and the
layout helpers (the registry's convolution, batch norm and pooling ops take TensorFlow's NHWC;
an ONNX NCHW tensor reaches them through an explicit ``Transpose`` node, and their NHWC result
goes back through another, which carries the ONNX node's name).

No onnxruntime here; the ``onnx`` package only through the protobufs handed in.
"""
from __future__ import annotations

import numpy as np

from ...graph.core import Node

#: ONNX TensorProto element type -> numpy dtype name
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}
FLOATS = ("float16", "float32", "bfloat16", "float64")
#: perm of an NCHW tensor to NHWC and back
TO_NHWC = {3: (0, 2, 1), 4: (0, 2, 3, 1), 5: (0, 2, 3, 4, 1)}
TO_NCHW = {3: (0, 2, 1), 4: (0, 3, 1, 2), 5: (0, 4, 1, 2, 3)}


class Fallback(Exception):
    """A converter cannot map this ONNX node onto the registry: it runs on the (emulated) AI CPU."""


class Builder:
    """Emits plain :class:`~ascend_emu.graph.core.Node` objects for one ONNX graph."""

    def __init__(self, shapes: dict, types: dict, opset: int):
        self.nodes: list[Node] = []
        self.names: set = set()
        self.reserved: set = set()
        self.tensors: dict = {}     # ONNX tensor name -> graph tensor "node:i"
        self.values: dict = {}      # ONNX tensor name -> numpy value known at load
        self.shapes = shapes        # ONNX tensor name -> list of dims (None: unknown) or None (unknown rank)
        self.types = types          # ONNX tensor name -> numpy dtype name
        self.opset = opset
        self.nhwc: dict = {}        # graph tensor (NCHW) -> the NHWC graph tensor it was transposed from
        self.consts: dict = {}      # (dtype, shape, bytes) -> graph tensor of a helper constant

    # -- names ---------------------------------------------------------------------------------
    def unique(self, name: str, node: bool = False) -> str:
        """``name`` (":" made "_"), or ``name_<k>`` if taken; the ONNX node names are ``reserved`` for the nodes
        (``node``), so an input or initializer of the same name yields to them."""
        name = name.replace(":", "_") or "node"
        if name not in self.names and (node or name not in self.reserved):
            self.names.add(name)
            return name
        i = 1
        while f"{name}_{i}" in self.names or f"{name}_{i}" in self.reserved:
            i += 1
        self.names.add(f"{name}_{i}")
        return f"{name}_{i}"

    # -- emission ------------------------------------------------------------------------------
    def emit(self, name: str, op: str, inputs: list, attrs: dict | None = None, num_outputs: int = 1,
             meta: dict | None = None, *, exact: bool = False) -> str:
        """Add a node; ``exact``: ``name`` was made unique by the caller. Returns its first output."""
        name = name if exact else self.unique(name)
        self.nodes.append(Node(name=name, op=op, inputs=list(inputs), attrs=dict(attrs or {}),
                               num_outputs=num_outputs, meta=dict(meta or {})))
        return f"{name}:0"

    def const(self, value, name: str, dtype=None) -> str:
        """A helper constant (one node per distinct value)."""
        v = np.asarray(value, dtype=dtype)
        key = (v.dtype.str, v.shape, v.tobytes())
        if key not in self.consts:
            self.consts[key] = self.emit(name, "Const", [], {"value": v, "dtype": v.dtype.name})
        return self.consts[key]

    def ints(self, values, name: str) -> str:
        return self.const(np.asarray(values, np.int64).reshape(-1), name)

    # -- what is known at load ------------------------------------------------------------------
    def ref(self, onnx_name: str) -> str:
        return self.tensors[onnx_name]

    def value(self, onnx_name: str):
        """The value of an ONNX tensor known at load (an initializer, a constant, a static shape), else None."""
        return self.values.get(onnx_name) if onnx_name else None

    def need(self, onnx_name: str, what: str):
        v = self.value(onnx_name)
        if v is None:
            raise Fallback(f"{what} is not known when the model loads")
        return v

    def shape(self, onnx_name: str) -> list | None:
        s = self.shapes.get(onnx_name)
        if s is None and self.value(onnx_name) is not None:
            return list(np.shape(self.values[onnx_name]))
        return s

    def rank(self, onnx_name: str) -> int:
        s = self.shapes.get(onnx_name)
        if s is None:
            v = self.value(onnx_name)
            if v is not None:
                return np.ndim(v)
            raise Fallback(f"the rank of {onnx_name!r} is unknown")
        return len(s)

    def static_shape(self, onnx_name: str) -> list:
        s = self.shapes.get(onnx_name)
        if s is None or any(d is None for d in s):
            v = self.value(onnx_name)
            if v is not None:
                return list(np.shape(v))
            raise Fallback(f"the shape of {onnx_name!r} is not static (give it with --shape)")
        return list(s)

    def dtype(self, onnx_name: str) -> str | None:
        return self.types.get(onnx_name)

    # -- layouts -------------------------------------------------------------------------------
    def to_nhwc(self, ref: str, rank: int, base: str) -> str:
        """The NHWC form of NCHW graph tensor ``ref``: the tensor it came from if one of these helpers
        transposed it, else a new ``Transpose``."""
        if ref in self.nhwc:
            return self.nhwc[ref]
        return self.emit(f"{base}/to_nhwc", "Transpose", [ref, self.ints(TO_NHWC[rank], f"{base}/perm_nhwc")])

    def to_nchw(self, ref: str, rank: int, name: str) -> str:
        """Transpose NHWC ``ref`` back to NCHW as node ``name`` (the ONNX node's own name)."""
        out = self.emit(name, "Transpose", [ref, self.ints(TO_NCHW[rank], f"{name}/perm_nchw")], exact=True)
        self.nhwc[out] = ref
        return out


def all_tensors(m):
    """Every TensorProto of ONNX model ``m``: initializers and sparse initializers, the tensors of node
    attributes (a ``Constant``'s value, a ``ConstantOfShape``'s), in every subgraph (Loop/If/Scan bodies)
    and every local function, at any depth."""
    todo = [m.graph, *m.functions]
    while todo:
        g = todo.pop()
        for t in getattr(g, "initializer", ()):
            yield t
        for s in getattr(g, "sparse_initializer", ()):
            yield s.values
            yield s.indices
        for nd in g.node:
            for a in nd.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
                for s in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors):
                    yield s.values
                    yield s.indices
                if a.HasField("g"):
                    todo.append(a.g)
                todo.extend(a.graphs)
