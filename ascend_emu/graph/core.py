"""Plain graph objects: what the loader produces and the interpreter walks.

No TensorFlow here. Tensor names are ``"node:index"`` (``"node"`` alone means
``"node:0"``); control inputs are dropped by the loader.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import AscendEmuError



def tensor_name(ref: str) -> str:
    """Normalise ``"x"`` -> ``"x:0"``; ``"x:1"`` stays."""
    node, _, idx = ref.rpartition(":")
    if node and idx.isdigit():
        return ref
    return ref + ":0"


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """``np.dtype(dtype).name``, memoized: numpy computes a dtype's name in Python (1-10 us a call, several
    calls per op of a replay)."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
        return name
    except TypeError:   # an unhashable dtype-like
        return np.dtype(dtype).name


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
    #: TensorFlow's inferred output shapes (a list per output, None for an unknown dim; None for
    #: an unknown rank) and output dtypes (numpy names, or TF names such as "variant"); None if not known
    output_shapes: list | None = None
    output_dtypes: list | None = None
    #: names of the nodes this one has control inputs from: kept only in graphs with TF1 control flow,
    #: where they carry deadness (a cond branch's constants depend on its pivot); empty elsewhere
    control_inputs: list[str] = field(default_factory=list)

    def outputs(self) -> list[str]:
        return list(self.output_names())

    # The interpreter asks for these once per execution of every node; they are kept until the node's
    # name, inputs or output count change (rewrites assign new lists; nothing edits one in place).
    def input_names(self) -> tuple:
        """The input tensor names, normalised (``"x"`` -> ``"x:0"``)."""
        c = self.__dict__.get("_input_names")
        if c is None or c[0] is not self.inputs or c[1] != len(self.inputs):
            c = self.__dict__["_input_names"] = (self.inputs, len(self.inputs),
                                                 tuple(tensor_name(r) for r in self.inputs))
        return c[2]

    def output_names(self) -> tuple:
        """``("name:0", "name:1", ...)``."""
        c = self.__dict__.get("_output_names")
        if c is None or c[0] != self.name or c[1] != self.num_outputs:
            c = self.__dict__["_output_names"] = (self.name, self.num_outputs,
                                                  tuple(f"{self.name}:{i}" for i in range(self.num_outputs)))
        return c[2]


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
    #: the functions control-flow nodes call (While cond/body, If branches), by name, each a
    #: Graph whose inputs are the function's arguments (Placeholder nodes) and outputs its results
    functions: dict = field(default_factory=dict)
    #: a training step's placeholders that hold the run's state (variables, optimizer slots, the loss
    #: scale), as opposed to its batch and step number; recorded in its dumps
    state_inputs: list = field(default_factory=list)
    #: the ONNX model the graph was loaded from (``frontend.onnx.loader.OnnxSource``: the model, its tensor
    #: and node names), for the onnxruntime reference and AI CPU; None for TensorFlow models
    onnx: Any = None
    #: the torch.export program the graph was loaded from (``frontend.torch.pt2.loader.Pt2Source``), for the
    #: torch reference and its ``Aten<Op>`` nodes; None for other models
    pt2: Any = None

    def sources(self) -> dict:
        """Op name -> what the model's source says of the op (``scope``: the exporter's module scope;
        ``source_type``: the ONNX op type of an op named after an ONNX node; ``internal``: the source node whose
        lowering made this op, which is not a tensor of the model), for the dump."""
        out = {}
        extra = getattr(self.onnx, "extra", None) or {}      # ONNX nodes only the reference dumps
        for n in [*self.nodes, *extra.values()]:
            s = {k: n.meta[k] for k in ("scope", "source_type", "internal") if n.meta.get(k)}
            if s:
                out[n.name] = s
        return out

    def dump_model(self) -> dict:
        """The ``model`` entry of this graph's dumps: name, fingerprint and (a training step) state inputs."""
        out = {"name": self.name, "fingerprint": self.fingerprint}
        if self.state_inputs:
            out["state_inputs"] = list(self.state_inputs)
        return out

    def scoped(self, scope: str, names_from: "Graph | None" = None) -> list[Node]:
        """The nodes, renamed ``scope/<name>`` (inputs too): one execution of a function body.

        The directory all the body's ops share (a loop's own name scope, which TensorFlow repeats
        inside its body) is dropped, so ``lstm/while`` iteration 3 reads ``lstm/while/body/3/cell/MatMul``.
        ``names_from`` (the body before fusion) decides that directory, so a fused body's ops keep
        the names the unfused body's ops have (the TensorFlow reference's).
        """
        dirs = [n.name.split("/")[:-1] for n in (names_from or self).nodes if n.op != "Placeholder"]
        k = 0
        while dirs and k < min(len(d) for d in dirs) and len({d[k] for d in dirs}) == 1:
            k += 1
        common = "/".join(dirs[0][:k]) + "/" if k else ""
        short = {n.name: n.name[len(common):] if common and n.name.startswith(common) else n.name
                 for n in self.nodes}
        if len(set(short.values())) != len(short):
            short = {n.name: n.name for n in self.nodes}

        def ref(r):
            node, idx = split_tensor_name(r)
            return f"{scope}/{short[node]}:{idx}"
        return [replace(n, name=f"{scope}/{short[n.name]}", inputs=[ref(r) for r in n.inputs]) for n in self.nodes]

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


#: the float dtypes the device may compute a float32 (or fp16/bf16) op in
_EMULATED_FLOATS = frozenset({"float16", "bfloat16", "float32"})


def feeding(nodes: list, outputs: list) -> list:
    """The nodes that feed ``outputs`` (tensor names), placeholders always, in their order: what a loader keeps
    of the nodes it made (the ONNX and torch.export doors)."""
    by_name = {n.name: n for n in nodes}
    live = set()
    todo = [o.rpartition(":")[0] for o in outputs]
    while todo:
        name = todo.pop()
        if name in live or name not in by_name:
            continue
        live.add(name)
        todo.extend(r.rpartition(":")[0] for r in by_name[name].inputs)
    return [n for n in nodes if n.name in live or n.op == "Placeholder"]


def _fmt_shape(shape) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def check_outputs(node: Node, outs) -> None:
    """Raise if ``outs`` do not have the count, shapes and dtypes TensorFlow infers for ``node``.

    Unknown dims and ranks match anything. A float output may come in any float dtype
    of fp16, bf16 and fp32 (the device computes in any of them by design); any other dtype must match exactly.
    """
    if len(outs) != node.num_outputs:
        raise AscendEmuError(f"op {node.name!r} ({node.op}) produced {len(outs)} outputs where the graph has "
                             f"{node.num_outputs}; this is a bug in ascend-emu's {node.op} kernel: please report it")
    for i, o in enumerate(outs):
        got = np.shape(o)
        want = node.output_shapes[i] if node.output_shapes is not None else None
        if want is not None and (len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got))):
            raise AscendEmuError(f"op {node.name!r} ({node.op}) produced output {i} of shape {_fmt_shape(got)} where "
                                 f"TensorFlow infers {_fmt_shape(want)}; this is a bug in ascend-emu's {node.op} "
                                 f"kernel: please report it with the model")
        wdt = node.output_dtypes[i] if node.output_dtypes is not None else None
        gdt = getattr(o, "dtype", None)
        if wdt is None or gdt is None or gdt == object:
            continue
        gdt = dtype_name(gdt)
        if gdt != wdt and not (gdt in _EMULATED_FLOATS and wdt in _EMULATED_FLOATS):
            raise AscendEmuError(f"op {node.name!r} ({node.op}) produced output {i} of dtype {gdt} where TensorFlow "
                                 f"gives {wdt}; this is a bug in ascend-emu's {node.op} kernel: please report it "
                                 f"with the model")
