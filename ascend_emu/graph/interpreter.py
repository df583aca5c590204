"""A small graph interpreter: an environment of tensors and one loop over nodes.

It knows nothing of numerics: ``eval_node(node, inputs) -> tuple of outputs`` does the
work (the device decides dtypes and casts; the ops compute). Hooks see every node.
"""
from __future__ import annotations

from typing import Callable, Iterable

from .core import Node, tensor_name


def interpret(nodes: Iterable[Node], env: dict, eval_node: Callable, *, stop_at: str | None = None,
              on_node: Callable | None = None, release: dict | None = None,
              on_release: Callable | None = None, plan: list | None = None) -> dict:
    """Evaluate ``nodes`` in order, reading inputs from and writing outputs to ``env``.

    ``release`` maps a tensor name to the index of the last node that reads it; when
    given, tensors are dropped from ``env`` after their last use (to bound memory) and
    ``on_release(tensor_name)`` is called for each. ``plan``, from :func:`schedule`, replaces
    ``nodes`` and ``release`` with the same walk worked out once (a graph replayed many times).
    """
    if plan is None:
        plan = schedule(nodes, release=release if release is not None else {})
    for node, ins, names, dead in plan:
        args = [env[t] for t in ins]
        outs = eval_node(node, args)
        for name, value in zip(names, outs):
            env[name] = value
        if on_node is not None:
            on_node(node, args, outs)
        for t in dead:
            if t in env:
                del env[t]
                if on_release is not None:
                    on_release(t)
        if stop_at is not None and node.name == stop_at:
            break
    return env


def schedule(nodes: Iterable[Node], release: dict | None = None, keep: Iterable[str] | None = None) -> list:
    """:func:`interpret`'s walk over ``nodes``: per node ``(node, input tensor names, output tensor names,
    the inputs read for the last time there)``. The last uses come from ``release`` (tensor -> index of
    its last reader), else from :func:`last_uses` of ``nodes`` and ``keep`` (None: nothing is released)."""
    nodes = list(nodes)
    if release is None:
        release = last_uses(nodes, keep) if keep is not None else {}
    plan = []
    for i, node in enumerate(nodes):
        ins = node.input_names()
        dead = tuple(dict.fromkeys(t for t in ins if release.get(t) == i))
        plan.append((node, ins, node.output_names(), dead))
    return plan


def last_uses(nodes: list[Node], keep: Iterable[str] = ()) -> dict:
    """tensor name -> index of the last node that reads it (``keep`` tensors never released)."""
    last = {}
    for i, node in enumerate(nodes):
        for t in node.input_names():
            last[t] = i
    for k in keep:
        last.pop(tensor_name(k), None)
    return last
