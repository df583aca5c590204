"""Plain graph objects: what the loader produces and the interpreter walks.

No TensorFlow here. Tensor names are ``"node:index"`` (``"node"`` alone means
``"node:0"``); control inputs are dropped by the loader.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any



def tensor_name(ref: str) -> str:
    """Normalise ``"x"`` -> ``"x:0"``; ``"x:1"`` stays."""
    node, _, idx = ref.rpartition(":")
    if node and idx.isdigit():
        return ref
    return ref + ":0"


def split_tensor_name(ref: str) -> tuple[str, int]:
    node, _, idx = tensor_name(ref).rpartition(":")
    return node, int(idx)


@dataclass
class Node:
    """One op of the graph.

    ``attrs`` are decoded to Python values: dtypes as numpy dtype names
    (``"float32"``), shapes as lists (``None`` for unknown dims), tensors as numpy
    arrays (``Const``'s ``value``), strings as ``str``, lists as lists.
    """

    name: str
    op: str
    inputs: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    num_outputs: int = 1
    #: the original NodeDef, serialised, for the AI CPU fallback (opaque here; None for Const)
    node_def: bytes | None = None
    #: the emulator's own bookkeeping, kept apart from TensorFlow's attributes: ``"fusion"`` (the
    #: rule(s) and the ops a fused node replaces), ``"ascend_type"`` (the CANN op type deciding its
    #: precision); never passed to an op
    meta: dict[str, Any] = field(default_factory=dict)

    def outputs(self) -> list[str]:
        return [f"{self.name}:{i}" for i in range(self.num_outputs)]


@dataclass
class InputSpec:
    name: str            # placeholder node name
    dtype: str           # numpy dtype name
    shape: list | None   # dims, None where unknown; None for unknown rank
    #: the user-facing name (SavedModel signature key, Keras input name); inputs are
    #: accepted under either name
    key: str | None = None


@dataclass
class Graph:
    """A frozen graph in execution (topological) order."""

    nodes: list[Node]
    inputs: list[InputSpec]
    outputs: list[str]                   # tensor names of the model's outputs
    name: str = "model"
    #: sha256 of the frozen GraphDef, identifying the model in dumps
    fingerprint: str = ""
    #: the frozen GraphDef serialised (for the TensorFlow reference and AI CPU ops)
    graph_def: bytes | None = None
    #: user-facing names of the outputs (signature keys), parallel to ``outputs``
    output_names: list[str] | None = None

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def consumers(self) -> dict[str, list[Node]]:
        """tensor name -> nodes that read it."""
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for ref in n.inputs:
                out.setdefault(tensor_name(ref), []).append(n)
        return out
