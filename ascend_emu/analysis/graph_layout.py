"""The layout of the report's op graph (:mod:`.graph_view`): boxes placed top to bottom, edges as curves.

Longest-path layering (the items come in a topological order: a dump's execution order), dummy points on
edges that span layers, barycentre ordering sweeps, then coordinates by isotonic regression on the
neighbours' mean (order and separation kept). :func:`fold_scopes` groups ops by name scope for large graphs.
Pure geometry: no HTML, no dumps.
"""
from __future__ import annotations

import re

#: at most this many items (groups and single ops) at the top level once folded
FOLD_TARGET = 120
_XGAP, _YGAP, _DUMMY_W = 26, 46, 8
_PAD = 30
_SCOPE_TOKEN = re.compile(r"[^/_]+[/_]?")


class Item:
    """One box of a layout: an op, a folded group of ops, or a dummy point of a long edge."""

    __slots__ = ("key", "kind", "w", "h", "order", "layer", "pos", "x", "y", "members")

    def __init__(self, key, kind, w, h, order, members=()):
        self.key, self.kind, self.w, self.h, self.order = key, kind, w, h, order
        self.members = list(members)
        self.layer = self.pos = 0
        self.x = self.y = 0.0


def layout(items: list[Item], edges: list[tuple[str, str]]) -> tuple[dict, list, float, float]:
    """Place ``items`` (in a topological order; ``order`` is their rank) top to bottom.

    Returns ({key: item}, [(src, dst, [(x, y) points])] per edge, width, height)."""
    by = {it.key: it for it in items}
    succ: dict[str, list[str]] = {it.key: [] for it in items}
    pred: dict[str, list[str]] = {it.key: [] for it in items}
    ledges = []
    for s, d in edges:
        if s == d or s not in by or d not in by:
            continue
        a, b = (s, d) if by[s].order < by[d].order else (d, s)
        ledges.append((s, d, a, b))
        succ[a].append(b)
        pred[b].append(a)
    for it in sorted(items, key=lambda i: i.order):
        it.layer = max((by[p].layer + 1 for p in pred[it.key]), default=0)
    # pull sources down next to their first consumer (a constant-free input used deep in the graph)
    for it in sorted(items, key=lambda i: -i.order):
        if not pred[it.key] and succ[it.key]:
            it.layer = max(0, min(by[s].layer for s in succ[it.key]) - 1)
    nlayers = max((it.layer for it in items), default=0) + 1
    layers: list[list[Item]] = [[] for _ in range(nlayers)]
    for it in sorted(items, key=lambda i: i.order):
        layers[it.layer].append(it)
    # dummy points on edges spanning layers
    up: dict[int, list] = {}
    down: dict[int, list] = {}
    chains = []
    for s, d, a, b in ledges:
        chain = [by[a]]
        for lay in range(by[a].layer + 1, by[b].layer):
            dm = Item(f"\0{len(chains)}:{lay}", "dummy", _DUMMY_W, 0, by[a].order)
            dm.layer = lay
            layers[lay].append(dm)
            chain.append(dm)
        chain.append(by[b])
        for u, v in zip(chain, chain[1:]):
            down.setdefault(id(u), []).append(v)
            up.setdefault(id(v), []).append(u)
        chains.append((s, d, chain, a != s))
    for layer in layers:
        for k, it in enumerate(layer):
            it.pos = k

    def sweep(seq, nbrs):
        for layer in seq:
            def key(it):
                ns = nbrs.get(id(it))
                return sum(n.pos for n in ns) / len(ns) if ns else it.pos
            layer.sort(key=key)
            for k, it in enumerate(layer):
                it.pos = k

    for _ in range(4):
        sweep(layers[1:], up)
        sweep(layers[-2::-1], down)

    def place(layer, desired):
        # isotonic regression (pool adjacent violators): closest to desired, order and separation kept
        off, acc = [], 0.0
        for k, it in enumerate(layer):
            if k:
                acc += (layer[k - 1].w + it.w) / 2 + (_XGAP if layer[k - 1].kind != "dummy" or it.kind != "dummy"
                                                       else 4)
            off.append(acc)
        blocks = []   # [sum, count, value]
        for k in range(len(layer)):
            v = desired[k] - off[k]
            blocks.append([v, 1, v])
            while len(blocks) > 1 and blocks[-2][2] > blocks[-1][2]:
                s2, c2, _ = blocks.pop()
                blocks[-1][0] += s2
                blocks[-1][1] += c2
                blocks[-1][2] = blocks[-1][0] / blocks[-1][1]
        k = 0
        for s, c, v in blocks:
            for _ in range(c):
                layer[k].x = v + off[k]
                k += 1

    for layer in layers:
        place(layer, [0.0] * len(layer))
    for _ in range(6):
        for seq, nbrs in ((layers[1:], up), (layers[-2::-1], down)):
            for layer in seq:
                place(layer, [sum(n.x for n in nbrs[id(it)]) / len(nbrs[id(it)]) if nbrs.get(id(it)) else it.x
                              for it in layer])
    xmin = min((it.x - it.w / 2 for layer in layers for it in layer), default=0.0)
    y = _PAD
    for layer in layers:
        hmax = max((it.h for it in layer), default=0) or 10
        for it in layer:
            it.x += _PAD - xmin
            it.y = y + (hmax - it.h) / 2
        y += hmax + _YGAP
    width = max((it.x + it.w / 2 for it in items), default=0.0) + _PAD
    paths = []
    for s, d, chain, reverse in chains:
        pts = [(chain[0].x, chain[0].y + chain[0].h)] + [(c.x, c.y) for c in chain[1:-1]] + [(chain[-1].x, chain[-1].y)]
        paths.append((s, d, pts[::-1] if reverse else pts))
    return by, paths, width, y - _YGAP + _PAD


def path_d(pts) -> str:
    d = [f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        m = (y0 + y1) / 2
        d.append(f"C{x0:.1f},{m:.1f} {x1:.1f},{m:.1f} {x1:.1f},{y1:.1f}")
    return "".join(d)


_PATH_TOKEN = re.compile(r"[^/]+/?")


def _tokens(name: str, paths) -> list:
    return (_PATH_TOKEN if name in paths else _SCOPE_TOKEN).findall(name)


def _scope_prefix(name: str, depth: int, paths=frozenset()) -> str | None:
    toks = _tokens(name, paths)
    if len(toks) <= depth:
        return None
    return "".join(toks[:depth])


def fold_scopes(names: list[str], target: int = FOLD_TARGET, paths=frozenset()) -> dict[str, str]:
    """{op name: group prefix} folding ``names`` by their longest name-scope prefix (tokens split at
    ``/`` and ``_``, so Keras layers and numbered blocks such as ``conv2_block1_`` are scopes) that leaves
    at most ``target`` items at the top level; ops alone in their prefix stay unfolded. The names in ``paths``
    are module paths (an exporter's scopes: ``enc_blocks.0/in_proj/op``) split at ``/`` only: an underscore in
    a module's name is no scope of its own."""
    maxd = max((len(_tokens(n, paths)) for n in names), default=0)
    best: dict[str, str] = {}
    for depth in range(maxd - 1, 0, -1):
        groups: dict[str, list[str]] = {}
        loose = 0
        for n in names:
            p = _scope_prefix(n, depth, paths)
            if p is None:
                loose += 1
            else:
                groups.setdefault(p, []).append(n)
        count = loose + sum(1 if len(v) > 1 else 1 for v in groups.values())
        best = {n: p for p, v in groups.items() if len(v) > 1 for n in v}
        if count <= target:
            break
    return best
