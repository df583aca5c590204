"""Applying fusion rules: a mutable, indexed view of a graph's nodes, and the pass driver.

:class:`Rewriter` keeps the nodes in execution order, who reads each tensor, which tensors
are constants (and their float32 values), and the ops swallowed so far; the rules in
:mod:`.rules` match and replace through it. :func:`apply_fusion` runs every enabled rule
in registry order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...graph.core import Graph, Node, split_tensor_name, tensor_name
from ...numerics.memo import freeze
from .config import FusionConfig
from .registry import RULES

_FLOAT = ("float16", "bfloat16", "float32")


class Rewriter:
    """Mutable view of a graph's node list for fusion passes.

    Keeps the nodes in execution order, who reads each tensor, which tensors are
    constants (and their float32 values), and the ops swallowed so far.
    """

    def __init__(self, graph: Graph, lists=None, skip=None):
        from ..precision import MixLists

        self.graph = graph
        #: nodes no rule may start from (``skip(node)`` true: ops the graph engine places on the AI CPU)
        self.skip = skip
        #: the device's mixed-precision lists (only gray elementwise ops join a chain)
        self.lists = lists if lists is not None else MixLists.default()
        self._nodes: list[Node] = list(graph.nodes)
        self.fused_away: list[dict] = []
        self._outputs = {tensor_name(t) for t in graph.outputs}
        self._values: dict = {}
        self._reindex()

    def nodes(self) -> list[Node]:
        return list(self._nodes)

    def candidates(self, ops=None):
        """The float nodes a rule may start from: a snapshot of today's nodes, each yielded only while it is
        still alive (an earlier match of the same rule may have fused it away), restricted to ``ops`` (a
        type name or a collection of them) when given."""
        if isinstance(ops, str):
            ops = (ops,)
        skip = self.skip
        for node in list(self._nodes):
            if (self.alive(node) and (ops is None or node.op in ops) and self.is_float(node)
                    and (skip is None or not skip(node))):
                yield node

    def matches(self, ops, find):
        """``(node, match)`` for the :meth:`candidates` of type ``ops`` where ``find(rewriter, node)``
        recognises a pattern (returns anything but None)."""
        for node in self.candidates(ops):
            m = find(self, node)
            if m is not None:
                yield node, m

    def consumers(self) -> dict:
        out: dict = {}
        for n in self._nodes:
            for ref in n.inputs:
                out.setdefault(tensor_name(ref), []).append(n)
        return out

    # -- indexes -----------------------------------------------------------------------------
    def _reindex(self) -> None:
        self._by_name = {n.name: n for n in self._nodes}
        self._pos = {n.name: i for i, n in enumerate(self._nodes)}
        self._readers: dict = {}
        for n in self._nodes:
            for slot, ref in enumerate(n.inputs):
                self._readers.setdefault(tensor_name(ref), []).append((n, slot))
        self._const: dict = {}

    def alive(self, node: Node) -> bool:
        return self._by_name.get(node.name) is node

    def node(self, ref: str) -> Node:
        """The node producing tensor ``ref``."""
        return self._by_name[split_tensor_name(ref)[0]]

    def readers(self, node: Node) -> list[Node]:
        """Nodes reading any output of ``node`` (one entry per edge)."""
        return [r for t in node.outputs() for r, _ in self._readers.get(t, [])]

    def is_output(self, node: Node) -> bool:
        return any(t in self._outputs for t in node.outputs())

    def is_used(self, ref: str) -> bool:
        """True if tensor ``ref`` is read by a node or is a model output."""
        ref = tensor_name(ref)
        return bool(self._readers.get(ref)) or ref in self._outputs

    def sole_reader(self, node: Node) -> Node | None:
        """The node reading ``node``'s output 0 through a single edge, when that is the only use
        of any of ``node``'s outputs and none is a model output; else None."""
        if self.is_output(node):
            return None
        edges = self.readers(node)
        if len(edges) != 1 or self._readers.get(f"{node.name}:0", []) == []:
            return None
        return edges[0]

    def is_float(self, node: Node) -> bool:
        t = node.attrs.get("T", node.attrs.get("dtype"))
        return t in _FLOAT

    # -- constants ---------------------------------------------------------------------------
    def is_const(self, ref: str) -> bool:
        """True if ``ref`` is computed from Const nodes only (the graph engine folds it)."""
        from ...ops import OPS

        name, _ = split_tensor_name(ref)
        if name in self._const:
            return self._const[name]
        n = self._by_name[name]
        if n.op == "Const":
            ok = True
        elif n.op == "Placeholder" or n.op.startswith("_") or not n.inputs or n.op not in OPS:
            ok = False
        else:
            ok = all(self.is_const(r) for r in n.inputs)
        self._const[name] = ok
        return ok

    def value(self, ref: str) -> np.ndarray:
        """The value of constant tensor ``ref``, its chain evaluated with the op registry in float32 (host
        arithmetic, so the exact op model, not an AI Core kernel)."""
        from ...ops import OpContext, run_op

        ref = tensor_name(ref)
        if ref in self._values:
            return self._values[ref]
        name, idx = split_tensor_name(ref)
        n = self._by_name[name]
        if n.op == "Const":
            outs = (np.asarray(n.attrs["value"]),)
        else:
            with np.errstate(all="ignore"):
                outs = run_op(n.op, *[self.value(r) for r in n.inputs], ctx=OpContext(dtype="float32", op_model="exact"),
                              **n.attrs)
        self._values[ref] = outs[idx]
        return outs[idx]

    def scalar(self, ref: str) -> float | None:
        """The value of a one-element float constant, else None."""
        if not self.is_const(ref):
            return None
        v = np.asarray(self.value(ref))
        if v.size != 1 or v.dtype.kind != "f":
            return None
        return float(v.reshape(()))

    def const_chain(self, refs, inside: set) -> list[Node]:
        """Non-Const nodes of the constant chains behind ``refs`` that nothing outside ``inside``
        (node names, grown as nodes are taken) reads: they fold into the fused op."""
        closure: dict = {}
        stack = [split_tensor_name(r)[0] for r in refs if self.is_const(r)]
        while stack:
            name = stack.pop()
            n = self._by_name[name]
            if n.op == "Const" or name in closure or name in inside:
                continue
            closure[name] = n
            stack.extend(split_tensor_name(r)[0] for r in n.inputs)
        taken: list[Node] = []
        changed = True
        while changed:   # a chain node may be read by another chain node taken later
            changed = False
            for name, n in closure.items():
                if name in inside or self.is_output(n):
                    continue
                if all(r.name in inside for r in self.readers(n)):
                    inside.add(name)
                    taken.append(n)
                    changed = True
        return taken

    # -- matching helpers --------------------------------------------------------------------
    def other(self, node: Node, ref: str) -> str | None:
        """For a two-input ``node`` reading tensor ``ref`` once, its other input."""
        ins = [tensor_name(r) for r in node.inputs]
        ref = tensor_name(ref)
        if len(ins) != 2 or ins.count(ref) != 1:
            return None
        return ins[1] if ins[0] == ref else ins[0]

    def closed(self, internal: list[Node], last: Node) -> bool:
        """No output of a pattern node but ``last`` is read outside the pattern or is a model output."""
        names = {n.name for n in internal}
        for n in internal:
            if n is last:
                continue
            if self.is_output(n) or any(r.name not in names for r in self.readers(n)):
                return False
        return True

    @staticmethod
    def orig_type(node: Node) -> str:
        f = node.meta.get("fusion")
        return f["tf_type"] if f else node.op

    # -- rewriting ---------------------------------------------------------------------------
    def fuse(self, rule: str, absorbed: list[Node], new: Node, new_consts=()) -> Node:
        """Replace ``absorbed`` by ``new`` (named after the last absorbed op, placed where it was).

        ``new_consts`` are new Const nodes (folded parameters) placed just before it.
        """
        for c in new_consts:   # folded parameters the rule computed belong to the fused graph alone:
            # read-only, so their casts and cube layouts may be computed once (numerics/memo.py)
            v = c.attrs.get("value")
            if isinstance(v, np.ndarray) and v.base is None:
                freeze(v)
        absorbed = sorted({n.name: n for n in absorbed}.values(), key=lambda n: self._pos[n.name])
        last = absorbed[-1]
        if new.name != last.name:
            raise RuntimeError(f"{rule}: fused node {new.name} must take the name of the last op {last.name}")
        names = {n.name for n in absorbed}
        replaces: list[str] = []
        rules: list[str] = []
        owners: list[str] = []      # the ONNX nodes the replaced ops were part of (--keep-dtype names them)
        for n in absorbed:
            f = n.meta.get("fusion")
            if f:
                replaces.extend(f["replaces"])
                rules.extend(r for r in f["rules"] if r not in rules)
                owners.extend(o for o in f.get("owners", ()) if o not in owners)
            else:
                replaces.append(n.name)
            o = n.meta.get("onnx_name")
            if o and o not in owners:
                owners.append(o)
        if rule not in rules:
            rules.append(rule)
        new.meta["fusion"] = {"rule": rule, "rules": rules, "replaces": replaces, "tf_type": self.orig_type(last)}
        if owners:
            new.meta["fusion"]["owners"] = owners
        for entry in self.fused_away:
            if entry["into"] in names:
                entry["into"] = new.name
        for n in absorbed[:-1]:
            self.fused_away.append({"name": n.name, "tf_type": self.orig_type(n), "rule": rule, "into": new.name})
        for k in [k for k in self._values if split_tensor_name(k)[0] in names]:
            del self._values[k]
        at = self._pos[last.name]
        kept = [n for n in self._nodes[:at] if n.name not in names]
        rest = [n for n in self._nodes[at + 1:] if n.name not in names]
        self._nodes = kept + list(new_consts) + [new] + rest
        self._update_index(absorbed, list(new_consts) + [new])
        return new

    def _update_index(self, removed: list[Node], added: list[Node]) -> None:
        """The indexes of _reindex after ``removed`` left and ``added`` joined ``_nodes`` (a full
        reindex per fusion was O(N^2): 0.34 s of ResNet50's 1.1 s of fusion)."""
        self._pos = {n.name: i for i, n in enumerate(self._nodes)}
        touched = set()
        for n in removed:
            del self._by_name[n.name]
            for ref in n.inputs:
                t = tensor_name(ref)
                self._readers[t] = [(r, slot) for r, slot in self._readers.get(t, []) if r is not n]
                touched.add(t)
        for n in added:
            self._by_name[n.name] = n
            for slot, ref in enumerate(n.inputs):
                t = tensor_name(ref)
                self._readers.setdefault(t, []).append((n, slot))
                touched.add(t)
        for t in touched:  # reader lists stay in execution order, as _reindex builds them
            if self._readers[t]:
                self._readers[t].sort(key=lambda e: (self._pos[e[0].name], e[1]))
            else:
                del self._readers[t]
        self._const = {}


@dataclass
class Fused:
    nodes: list
    fused_away: list
    counts: dict


def apply_fusion(graph, config: FusionConfig, lists=None, skip=None) -> Fused:
    """Rewrite ``graph.nodes`` with every enabled rule, in registry order.

    ``lists`` are the device's mixed-precision lists (default: the built-in ones); ``skip(node)``, if given,
    names the nodes no rule may start from (cube ops the graph engine places on the AI CPU).
    """
    rw = Rewriter(graph, lists, skip)
    counts = {}
    for name, rule in RULES.items():
        if config.enabled(name):
            n = rule.apply(rw)
            if n:
                counts[name] = n
    nodes = rw.nodes()
    # a fused node takes the name and outputs of the last op it replaced, so it keeps that op's
    # inferred output signature and the device still checks what it produces
    orig = {n.name: n for n in graph.nodes}
    for n in nodes:
        o = orig.get(n.name)
        if n.output_shapes is None and o is not None and o.num_outputs == n.num_outputs:
            n.output_shapes, n.output_dtypes = o.output_shapes, o.output_dtypes
    return Fused(nodes, rw.fused_away, counts)
