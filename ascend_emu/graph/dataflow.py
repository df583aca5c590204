"""TF1 dataflow control flow: ``Switch``/``Merge`` conds and ``Enter``/``Exit``/``NextIteration`` loops.

A ``tf.compat.v1`` graph built with ``tf.cond`` and ``tf.while_loop`` (control flow v1) has no
function bodies: its branches are selected by *dead tensors* and its loops are cycles through
``NextIteration``. This module runs such a graph the way TensorFlow's executor does, one op at
a time, without TensorFlow:

- ``Switch(data, pred)`` forwards ``data`` to output 1 if ``pred`` is true, else to output 0; the
  other output is *dead*. ``_SwitchN(data, index)`` forwards to output ``index`` (out of range: the
  last). An op with a dead data or control input does not run; its outputs are dead.
- ``Merge`` forwards its first live input (output 1: that input's index); dead if every input is.
- ``Enter`` moves a tensor into a loop *frame*; ``Exit`` moves one out; ``NextIteration`` carries a
  tensor to the next iteration, where the ``Merge`` that reads it forwards it. A frame's iteration
  k runs every op of the frame once (dead ops skipped); the loop ends after the first iteration
  in which no ``NextIteration`` is live (``LoopCond`` turned false, so the body's ``Switch``
  outputs were dead). Iteration 0 sees the values of the non-constant ``Enter`` ops; every later
  iteration sees only the ``NextIteration`` values (a constant ``Enter``, a loop invariant, is
  live in every iteration).

Each execution of an op in a loop gets a name of its own, in the same form as a functional
``While`` body (:mod:`.control_flow`): an op of loop scope ``<loop>`` (its frame name without
``/while_context``) runs at iteration k as ``<loop>/cond/<k>/<op>`` if it computes the loop
predicate (the ops from the ``Merge`` nodes to ``LoopCond``), else ``<loop>/body/<k>/<op>``, where
``<op>`` is its name relative to the loop scope; loops nest (``while/body/2/while/body/0/add``).
(``eval_node`` gets the node renamed so, with its own name in ``meta["executes"]``.)
An ``Enter`` runs once per entry into its loop, as ``<loop>/<op>``; an ``Exit`` belongs to the
enclosing frame and keeps its own name there, so the ops that read a loop's result find it.

The routing ops compute nothing: ``Switch``, ``Enter`` and ``NextIteration`` only forward a tensor
and are not reported; ``Merge`` (a cond's result), ``Exit`` (a loop's result) and ``LoopCond`` (each
iteration's predicate) are reported through ``on_control``. Every other live op goes to
``eval_node`` under its execution name.
"""
from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Callable

import numpy as np

from ..errors import AscendEmuError
from .core import Node, split_tensor_name, tensor_name

SWITCH = frozenset({"Switch", "RefSwitch"})
SWITCH_N = frozenset({"_SwitchN"})
MERGE = frozenset({"Merge", "RefMerge"})
ENTER = frozenset({"Enter", "RefEnter"})
EXIT = frozenset({"Exit", "RefExit"})
NEXT_ITERATION = frozenset({"NextIteration", "RefNextIteration"})
LOOP_COND = frozenset({"LoopCond"})
#: the TF1 control-flow ops this module runs
DATAFLOW_OPS = SWITCH | SWITCH_N | MERGE | ENTER | EXIT | NEXT_ITERATION | LOOP_COND
#: the routing ops reported through ``on_control`` (the others only forward a tensor)
REPORTED = MERGE | EXIT | LOOP_COND

#: iteration limit of a loop, against a predicate that never turns false
MAX_ITERATIONS = 1_000_000

_ROOT: tuple = ()


def has_dataflow_control_flow(nodes) -> bool:
    """True if any node is a TF1 control-flow op (the graph needs :func:`run_dataflow`)."""
    return any(n.op in DATAFLOW_OPS for n in nodes)


def back_edge(node: Node, producer_op: str) -> bool:
    """True for a loop's back edge: a ``Merge`` reading a ``NextIteration`` (the edge a topological
    order of a TF1 loop leaves out)."""
    return node.op in MERGE and producer_op in NEXT_ITERATION


def loop_scope(frame_name: str) -> str:
    """``while/while_context`` -> ``while``: the name scope of a ``tf.while_loop`` frame."""
    return frame_name[:-len("/while_context")] if frame_name.endswith("/while_context") else frame_name


def _truth(value) -> bool:
    v = np.asarray(value)
    if v.size != 1:
        raise AscendEmuError(f"a Switch or LoopCond predicate has shape {v.shape}; it must be a scalar")
    return bool(v.reshape(()))


class _Plan:
    """The static structure of a TF1 graph: each node's frame, each frame's ops in order."""

    def __init__(self, nodes: list[Node]):
        self.nodes = {n.name: n for n in nodes}
        self.index = {n.name: i for i, n in enumerate(nodes)}
        self.frame: dict[str, tuple] = {}          # node -> frame path (its outputs live there)
        for n in nodes:
            self.frame[n.name] = self._frame_of(n)
        # the frame an op runs in: an Exit runs in its input's frame (and writes to the enclosing one)
        self.runs_in = {n.name: self.frame[self._producer(n.inputs[0])] if n.op in EXIT else self.frame[n.name]
                        for n in nodes}
        self.scope = {}                             # frame path -> its loop scope name
        for n in nodes:
            if n.op in ENTER:
                self.scope[self.frame[n.name]] = loop_scope(str(n.attrs.get("frame_name", n.name)))
        self.cond_ops = self._cond_ops(nodes)
        self.items = self._items(nodes)

    def _producer(self, ref: str) -> str:
        node = split_tensor_name(ref)[0]
        if node not in self.nodes:
            raise AscendEmuError(f"a node reads {ref!r}, which is not in the graph")
        return node

    def _sources(self, n: Node) -> list[str]:
        """The nodes ``n`` reads (data and control), without a loop's back edge."""
        out = [self._producer(r) for r in n.inputs]
        out += [self._producer(c) for c in n.control_inputs]
        return [s for s in out if not back_edge(n, self.nodes[s].op)]

    def _frame_of(self, n: Node) -> tuple:
        srcs = self._sources(n)
        for s in srcs:
            if s not in self.frame:
                raise AscendEmuError(f"node {n.name!r} reads {s!r}, which comes later in the graph's order; "
                                     f"the graph is not in topological order")
        if n.op in ENTER:
            parent = self.frame[srcs[0]] if srcs else _ROOT
            return parent + (str(n.attrs.get("frame_name", n.name)),)
        if n.op in EXIT:
            inner = self.frame[srcs[0]]
            if not inner:
                raise AscendEmuError(f"Exit {n.name!r} is not inside a loop; the graph is malformed")
            return inner[:-1]
        # the deepest frame among the inputs: a constant without inputs lives in the root frame and
        # is visible from every frame
        return max((self.frame[s] for s in srcs), key=len, default=_ROOT)

    def _cond_ops(self, nodes) -> set:
        """The ops of each loop that compute its predicate: ``LoopCond`` back to the ``Merge`` nodes, and
        every loop ``Merge`` (a loop variable at the start of an iteration, as a functional cond's argument)."""
        out: set = {n.name for n in nodes if n.op in MERGE
                    and any(self.nodes[self._producer(r)].op in NEXT_ITERATION for r in n.inputs)}
        stack = [n.name for n in nodes if n.op in LOOP_COND]
        while stack:
            name = stack.pop()
            if name in out:
                continue
            out.add(name)
            n = self.nodes[name]
            stack.extend(s for s in self._sources(n)
                         if self.runs_in[s] == self.runs_in[name] and self.nodes[s].op not in ENTER)
        return out

    def _items(self, nodes) -> dict:
        """Frame path -> what it runs in order: node names, and ``("loop", child frame)`` for a loop
        inside it (run whole, between the ops it reads and the ops that read its Exits)."""
        def item_in(name: str, frame: tuple):
            """The item of ``frame`` that runs node ``name`` (itself, or the loop holding it), or None."""
            f = self.runs_in[name]
            if self.nodes[name].op in ENTER:
                f = self.frame[name]
            if f == frame:
                return name
            if len(f) > len(frame) and f[:len(frame)] == frame:
                return ("loop", f[:len(frame) + 1])
            return None

        members: dict = {}
        for n in nodes:
            f = self.frame[n.name] if n.op in ENTER else self.runs_in[n.name]
            for depth in range(len(f) + 1):
                key = n.name if depth == len(f) else ("loop", f[:depth + 1])
                members.setdefault(f[:depth], {}).setdefault(key, []).append(n.name)
        plans = {}
        for frame, groups in members.items():
            order = {k: min(self.index[m] for m in ms) for k, ms in groups.items()}
            deps = {k: set() for k in groups}
            users: dict = {k: [] for k in groups}
            for k, ms in groups.items():
                for m in ms:
                    for s in self._sources(self.nodes[m]):
                        d = item_in(s, frame)
                        if d is not None and d != k and d not in deps[k]:
                            deps[k].add(d)
                            users[d].append(k)
            # Kahn's order, ties broken by the first node's position in the graph
            indeg = {k: len(v) for k, v in deps.items()}
            heap = [(order[k], i, k) for i, k in enumerate(groups) if indeg[k] == 0]
            key_id = {k: i for i, k in enumerate(groups)}
            heapq.heapify(heap)
            seq = []
            while heap:
                _, _, k = heapq.heappop(heap)
                seq.append(k)
                for u in users[k]:
                    indeg[u] -= 1
                    if indeg[u] == 0:
                        heapq.heappush(heap, (order[u], key_id[u], u))
            if len(seq) != len(groups):
                stuck = sorted(str(k) for k in groups if k not in seq)[:5]
                raise AscendEmuError(f"the TF1 control flow has a cycle that is not a loop (through "
                                     f"{', '.join(stuck)}); the graph is malformed")
            plans[frame] = seq
        return plans


class _Exec:
    """One run of a TF1 graph: the values and dead tensors by execution name."""

    def __init__(self, plan: _Plan, env: dict, eval_node: Callable, on_control, on_node):
        self.plan = plan
        self.env = env
        self.dead: set = set()
        self.ran: set = set()                       # execution names of the ops that ran
        self.eval_node = eval_node
        self.on_control = on_control
        self.on_node = on_node

    # -- names -------------------------------------------------------------------------------
    def display(self, name: str, iters: tuple) -> str:
        """The execution name of node ``name`` at iteration path ``iters`` (one index per enclosing loop)."""
        frame = self.plan.frame[name]
        n = self.plan.nodes[name]
        if n.op in ENTER:
            return self._in_loop(name, frame, iters, None)
        return self._in_frame(name, frame, iters)

    def _in_frame(self, name: str, frame: tuple, iters: tuple) -> str:
        if not frame:
            return name
        part = "cond" if name in self.plan.cond_ops else "body"
        return self._in_loop(name, frame, iters, f"{part}/{iters[len(frame) - 1]}")

    def _in_loop(self, name: str, frame: tuple, iters: tuple, middle) -> str:
        scope = self.plan.scope.get(frame, frame[-1])
        rel = name[len(scope) + 1:] if name.startswith(scope + "/") else name
        outer = self._in_frame(scope, frame[:-1], iters) if frame[:-1] else scope
        return f"{outer}/{middle}/{rel}" if middle is not None else f"{outer}/{rel}"

    def ref(self, consumer: Node, r: str, iters: tuple) -> str | None:
        """The execution name of the tensor ``r`` that ``consumer`` reads at ``iters``; None if it is
        dead by construction (a non-constant Enter after iteration 0, a back edge at iteration 0)."""
        node, idx = split_tensor_name(r)
        prod = self.plan.nodes[node]
        pframe = self.plan.frame[node]
        if back_edge(consumer, prod.op):
            k = iters[-1]
            if k == 0:
                return None
            iters = iters[:-1] + (k - 1,)
        elif prod.op in ENTER and not prod.attrs.get("is_constant", False) and iters[len(pframe) - 1] != 0:
            return None
        return f"{self.display(node, iters[:len(pframe)])}:{idx}"

    # -- running -----------------------------------------------------------------------------
    def run_frame(self, frame: tuple, iters: tuple) -> bool:
        """Run one iteration (or the root) of ``frame``; True if any NextIteration of it was live."""
        carried = False
        for item in self.plan.items[frame]:
            if isinstance(item, tuple):
                self.run_loop(item[1], iters)
                continue
            node = self.plan.nodes[item]
            if node.op in ENTER and self.plan.frame[item] == frame:
                continue     # entered by run_loop, once per entry
            live = self.run_node(node, iters)
            carried |= live and node.op in NEXT_ITERATION
        return carried

    def run_loop(self, frame: tuple, outer: tuple) -> None:
        """Enter the loop ``frame`` from its parent at iteration path ``outer`` and run it to its end."""
        for name in self.plan.items[frame]:
            if isinstance(name, str) and self.plan.nodes[name].op in ENTER and self.plan.frame[name] == frame:
                self.run_node(self.plan.nodes[name], outer + (0,))
        for k in range(MAX_ITERATIONS):
            if not self.run_frame(frame, outer + (k,)):
                return
        raise AscendEmuError(f"loop {self.plan.scope.get(frame, frame[-1])!r} ran {MAX_ITERATIONS} iterations "
                             f"without its predicate turning false")

    def run_node(self, node: Node, iters: tuple) -> bool:
        """Run ``node`` at ``iters`` unless an input is dead; True if it ran."""
        name = self.display(node.name, iters)
        refs = [self.ref(node, r, iters) for r in node.inputs]
        outputs = [f"{name}:{i}" for i in range(node.num_outputs)]
        live_in = [r is not None and r in self.env and r not in self.dead for r in refs]
        controls_live = all(self._ran(node, c, iters) for c in node.control_inputs)

        def kill(which=None):
            for i, t in enumerate(outputs):
                if which is None or i in which:
                    self.dead.add(t)

        if node.op in MERGE:
            first = next((i for i, ok in enumerate(live_in) if ok), None)
            if first is None or not controls_live:
                kill()
                return False
            return self._forward(node, name, refs, (self.env[refs[first]], np.int32(first)), outputs)
        if not all(live_in) or not controls_live:
            kill()
            return False
        args = [self.env[r] for r in refs]
        if node.op in SWITCH | SWITCH_N:
            count = node.num_outputs
            if node.op in SWITCH:
                taken = 1 if _truth(args[1]) else 0
            else:
                i = int(np.asarray(args[1]).reshape(()))
                taken = i if 0 <= i < count else count - 1
            self._forward(node, name, refs, (args[0],) * count, outputs)
            for i, t in enumerate(outputs):
                if i != taken:
                    self.env.pop(t, None)
            kill(set(range(count)) - {taken})
            return True
        if node.op in ENTER | EXIT | NEXT_ITERATION | LOOP_COND:
            return self._forward(node, name, refs, (args[0],), outputs)
        renamed = replace(node, name=name, inputs=refs, control_inputs=[], meta={**node.meta, "executes": node.name})
        outs = self.eval_node(renamed, args)
        self._set(name, outputs, outs)
        if self.on_node is not None:
            self.on_node(renamed, args, outs)
        return True

    def _ran(self, consumer: Node, control: str, iters: tuple) -> bool:
        """A control input is live if its node ran at the matching iteration."""
        r = self.ref(consumer, control + ":0", iters)
        return r is not None and r.rpartition(":")[0] in self.ran

    def _set(self, name: str, outputs, outs) -> None:
        self.ran.add(name)
        for t, v in zip(outputs, outs):
            self.env[t] = v
            self.dead.discard(t)     # an Exit is dead in every iteration but its loop's last

    def _forward(self, node: Node, name: str, refs, outs, outputs) -> bool:
        self._set(name, outputs, outs)
        if node.op in REPORTED and self.on_control is not None:
            self.on_control(replace(node, name=name, inputs=[r for r in refs if r is not None], control_inputs=[]),
                            outs)
        return True


def run_dataflow(nodes: list[Node], env: dict, eval_node: Callable, *, on_control: Callable | None = None,
                 on_node: Callable | None = None, dead: set | None = None) -> dict:
    """Run a graph with TF1 control flow; ``env`` receives every live tensor by execution name.

    ``nodes`` are in topological order without the loops' back edges (``NextIteration`` ->
    ``Merge``), each with its ``control_inputs`` (they carry deadness into a branch's constants).
    ``eval_node(node, args)`` runs an op (renamed to its execution name); ``on_control(node, outs)``
    sees the reported routing ops (``Merge``, ``Exit``, ``LoopCond``); ``on_node(node, args, outs)``
    every op ``eval_node`` ran; ``dead``, if given, receives the dead tensors' names. Returns ``env``;
    the graph's own tensors outside loops keep their names. A graph output that is dead (it lies in a
    branch not taken) is an error.
    """
    plan = _Plan(list(nodes))
    ex = _Exec(plan, env, eval_node, on_control, on_node)
    ex.run_frame(_ROOT, ())
    if dead is not None:
        dead.update(ex.dead)
    return env


def sibling_name(executed: str, original: str, other: str) -> str:
    """The execution name node ``other`` has in the iteration where node ``original`` ran as ``executed``
    (``while/body/2/add``, ``while/add``, ``while/mul`` -> ``while/body/2/mul``): for an op a fusion
    swallowed into ``original``, which is in the same loop."""
    if executed == original:
        return other
    parts = original.split("/")
    for i in range(len(parts) - 1, 0, -1):
        head, tail = "/".join(parts[:i]), "/".join(parts[i:])
        if executed.endswith("/" + tail) and other.startswith(head + "/"):
            return executed[:-len(tail)] + other[len(head) + 1:]
    return other


def check_live(env: dict, outputs) -> None:
    """Raise if a graph output was not computed (it is dead: it lies in a branch that was not taken)."""
    missing = [t for t in map(tensor_name, outputs) if t not in env]
    if missing:
        raise AscendEmuError(f"output {missing[0]!r} of the graph is dead: it lies in a cond branch that was not "
                             f"taken, so it has no value; fetch the cond's Merge instead")
