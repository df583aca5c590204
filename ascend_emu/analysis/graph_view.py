"""The op graph of an NPU dump, drawn as inline SVG for the comparison report, coloured by error.

:func:`graph_section` returns the HTML of the report's ``graph`` section: one SVG node per
computing op of the NPU dump (constants and what is folded from them only are left out: they
are listed in an op's inputs), an edge from producer to consumer for every data input between
two such ops, ops fused by the NPU drawn with an expandable group of the ops they replaced (their
edges from the bench dump), inserted Casts (with dashed edges to the ops that read them) and AI CPU
ops marked, coloured by the Result of the comparison rows (or by cosine, max relative error or
overflow), with the first divergent op (and its path to the output) and the first overflowing op
marked. A click shows the op's rows in a side panel; an overview map shows where the view is.

The layout is computed in Python (:mod:`.graph_layout`: layered, top to bottom). Above
:data:`FOLD_ABOVE` computing ops, name scopes (Keras layers and repeated blocks: the longest name
prefix that leaves at most ``FOLD_TARGET`` items) fold into groups, each expandable to its own
layout. Pan and zoom come from a small inline script; no external file, no URL.

Markup other tools may read: each op node is ``<g class="node" data-op=NAME data-status=S>``
(S one of :data:`STATUSES`), ``data-first="true"`` on the first divergent op and
``data-first-overflow="true"`` on the first overflowing op; each data edge is
``<path class="edge" data-from=PRODUCER data-to=CONSUMER>`` (a Cast's drawn edge to its reader has
``data-cast-from`` / ``data-cast-to`` instead, an edge inside a fused op's group ``data-fused-from`` /
``data-fused-to``: neither is a data input of the dump).

No TensorFlow here.
"""
from __future__ import annotations

import html
import json
import math

from ..graph.core import split_tensor_name
from .compare import CAST_MARK
from .graph_layout import FOLD_TARGET, Item, fold_scopes, layout, path_d
from .metrics import ERROR, NAN, PASS, WARNING, format_metric

#: the values of ``data-status``
STATUSES = ("pass", "warning", "error", "overflow", "na")
#: computing ops above which name scopes fold into expandable groups
FOLD_ABOVE = 300
STATUS_COLORS = {"pass": "#a5d6a7", "warning": "#ffcc80", "error": "#ef5350", "overflow": "#ab47bc", "na": "#e0e0e0"}
#: the ring around the first divergent op (used for nothing else)
FIRST_COLOR = "#ff00d4"
#: the ring around the first overflowing op
OVERFLOW_RING = "#2962ff"
_NA_FILL = "#e0e0e0"
_W, _H, _CAST_W, _CAST_H = 168, 38, 120, 26
_CONST_TYPES = {"Const", "HostConst"}
#: the dtype an inserted rounding's compute dtype feeds (HF32 values are float32 tensors)
_HF32 = {"hfloat32": "float32"}

_ROW_FIELDS = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
               "Cosine", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio", "Overflow Status", "Result",
               "Err_message"]
METRICS = ("status", "cosine", "relerr", "overflow")
_METRIC_NAMES = {"status": "comparison Result", "cosine": "cosine", "relerr": "max relative error",
                 "overflow": "overflow"}


def _e(x) -> str:
    # a carriage return as a character reference: an HTML parser turns a raw one into a newline, and the name
    # in the attribute would no longer be the JSON data's key (clicks and recolouring failed on it)
    return html.escape("" if x is None else str(x), quote=True).replace("\r", "&#13;")


# --------------------------------------------------------------------------- the graph model

def constant_ops(dump) -> set[str]:
    """Names of the ops that are constants or folded from constants on the host (engine ``HOST``, every
    input such an op): the graph view leaves them out (they show in a consumer's inputs). An AI Core op fed
    by constants only (a random op, a Fill) still computes, so it stays."""
    const: set[str] = set()
    for op in dump.ops:
        ins = [r for r in op.get("inputs", []) if not r.startswith("^")]
        if op.get("tf_type") in _CONST_TYPES or (
                op.get("engine") == "HOST" and ins and all(split_tensor_name(r)[0] in const for r in ins)):
            const.add(op["name"])
    return const


def graph_edges(dump, nodes: set[str]) -> list[tuple[str, str]]:
    """The data edges (producer, consumer) between ops of ``nodes``, in the consumers' execution order,
    one per distinct pair."""
    out, seen = [], set()
    for op in dump.ops:
        if op["name"] not in nodes:
            continue
        for ref in op.get("inputs", []):
            if ref.startswith("^"):
                continue
            src = split_tensor_name(ref)[0]
            if src in nodes and (src, op["name"]) not in seen and src != op["name"]:
                seen.add((src, op["name"]))
                out.append((src, op["name"]))
    return out


def cast_edges(dump, casts: set[str]) -> list[tuple[str, str]]:
    """(inserted Cast, consumer) for the consumers that read what the Cast made: they list the Cast's source
    tensor as their input (the dump keeps the graph's own edges) and compute in the Cast's dtype."""
    by_source: dict[str, list[dict]] = {}
    for op in dump.ops:
        if op["name"] in casts and op.get("inputs"):
            by_source.setdefault(op["inputs"][0], []).append(op)
    out = []
    for op in dump.ops:
        if op["name"] in casts:
            continue
        for ref in dict.fromkeys(op.get("inputs", [])):
            for c in by_source.get(ref, ()):
                # an HF32 rounding (compute dtype hfloat32) feeds a float32 cube op
                dt = c.get("compute_dtype")
                if dt and _HF32.get(dt, dt) == op.get("compute_dtype"):
                    out.append((c["name"], op["name"]))
    return out


def op_status(cmp, name: str) -> str:
    """The ``data-status`` of op ``name`` from its comparison rows: ``overflow`` if a row has overflow
    status bits, else the worst Result (``error``, ``warning``, ``pass``), else ``na``."""
    rows = cmp.rows_of(name)
    if any(r.get("Overflow Status") not in (None, "", "0x0") for r in rows):
        return "overflow"
    return {ERROR: "error", WARNING: "warning", PASS: "pass"}.get(cmp.op_result(name), "na")


def _worst_metrics(rows) -> tuple:
    cos = rel = None
    for r in rows:
        c = r.get("Cosine")
        if c == NAN:
            cos = -1.0
        elif isinstance(c, float) and not math.isnan(c):
            cos = c if cos is None else min(cos, c)
        m = r.get("MaxRelativeErr")
        if isinstance(m, float) and not math.isnan(m):
            rel = m if rel is None else max(rel, m)
    return cos, rel


def _ramp(t: float) -> str:
    """Green (t=0) through yellow to red (t=1)."""
    t = min(1.0, max(0.0, t))
    stops = [(0.0, (102, 187, 106)), (0.5, (255, 235, 59)), (1.0, (229, 57, 53))]
    for (t0, c0), (t1, c1) in zip(stops, stops[1:]):
        if t <= t1:
            u = (t - t0) / (t1 - t0)
            return "#%02x%02x%02x" % tuple(round(a + (b - a) * u) for a, b in zip(c0, c1))
    return "#e53935"


def _cos_color(cos) -> str:
    if cos is None:
        return _NA_FILL
    if cos <= 0:
        return _ramp(1.0)
    # -log10(1 - cos): 7 or more decimal nines green, 1 red
    d = -math.log10(max(1.0 - cos, 1e-12))
    return _ramp((7.0 - d) / 6.0)


def _rel_color(rel) -> str:
    if rel is None:
        return _NA_FILL
    if not math.isfinite(rel):
        return _ramp(1.0)
    d = math.log10(max(rel, 1e-12))
    return _ramp((d + 5.0) / 5.0)   # 1e-5 green, 1 red


def _short(v) -> str:
    if isinstance(v, float):
        return format_metric(v, 4)
    return "" if v is None else str(v)


# --------------------------------------------------------------------------- rendering

class _Svg:
    """Collects the SVG of the view: the main layer and the overlays of expandable groups."""

    def __init__(self, cmp, ov, first_name, details):
        self.cmp, self.ov, self.first_name, self.details = cmp, ov, first_name, details
        self.main: list[str] = []
        self.overlays: list[str] = []
        self.first_overflow = ov.first["name"] if ov is not None and ov.first else None
        self.cast_pairs: set = set()
        self.chain_pairs: set = set()

    def op_node(self, op, it, out: list[str]) -> None:
        name = op["name"]
        d = self.details[name]
        cast = d["cast"]
        status = d["status"]
        attrs = [f'class="node{" cast" if cast else ""}{" aicpu" if op.get("engine") == "AICPU" else ""}'
                 f'{" fused" if d.get("fusion") else ""}"', f'data-op="{_e(name)}"', f'data-status="{status}"',
                 f'data-i="{d["i"]}"']
        if name == self.first_name:
            attrs.append('data-first="true"')
        if name == self.first_overflow:
            attrs.append('data-first-overflow="true"')
        x0, y0 = it.x - it.w / 2, it.y
        out.append(f'<g {" ".join(attrs)} transform="translate({x0:.1f},{y0:.1f})">')
        out.append(f"<title>{_e(op.get('tf_type'))} {_e(name)} ({status})</title>")
        if name == self.first_name:
            out.append(f'<rect class="ring" x="-6" y="-6" width="{it.w + 12}" height="{it.h + 12}" rx="9" '
                       f'fill="none" stroke="{FIRST_COLOR}" stroke-width="5"/>')
        if name == self.first_overflow:
            out.append(f'<rect class="ring" x="-3" y="-3" width="{it.w + 6}" height="{it.h + 6}" rx="7" '
                       f'fill="none" stroke="{OVERFLOW_RING}" stroke-width="2.5" stroke-dasharray="6 3"/>')
        fill = STATUS_COLORS[status]
        if cast:
            out.append(f'<rect class="box" width="{it.w}" height="{it.h}" rx="{it.h / 2:.0f}" fill="{fill}" '
                       'stroke="#555" stroke-dasharray="4 2"/>')
            label = f"Cast \u2192 {(op.get('compute_dtype') or '?').replace('float', 'fp')}"
            out.append(f'<text x="{it.w / 2}" y="{it.h / 2 + 4}" text-anchor="middle" class="t1">{_e(label)}</text>')
        else:
            out.append(f'<rect class="box" width="{it.w}" height="{it.h}" rx="4" fill="{fill}" stroke="#444"/>')
            if d.get("fusion"):
                out.append(f'<rect width="{it.w - 6}" height="{it.h - 6}" x="3" y="3" rx="3" fill="none" '
                           'stroke="#444" stroke-width="0.8"/>')
            tag = op.get("tf_type") or "?"
            if op.get("engine") == "AICPU":
                out.append(f'<rect x="{it.w - 46}" y="0" width="46" height="13" rx="3" fill="#ff6f00"/>'
                           f'<text x="{it.w - 23}" y="10" text-anchor="middle" class="badge">AI CPU</text>')
            out.append(f'<text x="6" y="15" class="t1">{_e(_clip(tag, 20 if op.get("engine") == "AICPU" else 26))}'
                       "</text>")
            out.append(f'<text x="6" y="30" class="t2">{_e(_clip(_tail(name), 30))}</text>')
            if d.get("fusion"):
                gid = f"f{d['i']}"
                out.append(f'<g class="toggle" data-group="{gid}"><rect x="{it.w - 18}" y="{it.h - 17}" width="15" '
                           f'height="14" rx="3" fill="#fff" stroke="#444"/><text x="{it.w - 10.5}" y="{it.h - 6}" '
                           'text-anchor="middle" class="tg">+</text></g>')
        out.append("</g>")

    def group_status(self, members) -> str:
        sts = {self.details[m]["status"] for m in members}
        return next((s for s in ("overflow", "error", "warning", "pass") if s in sts), "na")

    def group_node(self, key, it, gid, members, out: list[str]) -> None:
        status = self.group_status(members)
        has_first = self.first_name is not None and self.first_name in members
        out.append(f'<g class="group-node" data-scope="{_e(key)}" data-status="{status}" data-group="{gid}" '
                   f'transform="translate({it.x - it.w / 2:.1f},{it.y:.1f})"><title>{_e(key)}: {len(members)} ops '
                   f"({status}); click to expand</title>")
        if has_first:
            out.append(f'<rect class="ring first" x="-6" y="-6" width="{it.w + 12}" height="{it.h + 12}" rx="9" '
                       f'fill="none" stroke="{FIRST_COLOR}" stroke-width="5"/>')
        if self.first_overflow in members:
            out.append(f'<rect class="ring overflow" x="-3" y="-3" width="{it.w + 6}" height="{it.h + 6}" rx="7" '
                       f'fill="none" stroke="{OVERFLOW_RING}" stroke-width="2.5" stroke-dasharray="6 3"/>')
        out.append(f'<rect class="box" width="{it.w}" height="{it.h}" rx="6" fill="{STATUS_COLORS[status]}" '
                   'stroke="#333" stroke-width="2"/><rect x="4" y="4" width="' + f'{it.w - 8}" height="{it.h - 8}" '
                   'rx="4" fill="none" stroke="#333" stroke-width="0.8"/>')
        parts = key.rstrip("/_").split("/")
        label = parts[-1] if len(parts[-1]) >= 8 or len(parts) == 1 else "/".join(parts[-2:])
        out.append(f'<text x="8" y="17" class="t1">{_e(_clip(label, 24))}</text>'
                   f'<text x="8" y="32" class="t2">{len(members)} ops \u2295</text></g>')

    def edge(self, s, d, pts, out: list[str], cls="edge") -> None:
        if (s, d) in self.cast_pairs:   # not a data edge of the dump: the Cast's output read by its consumer
            out.append(f'<path class="{cls} cast-edge" data-cast-from="{_e(s)}" data-cast-to="{_e(d)}" '
                       f'd="{path_d(pts)}"/>')
            return
        if (s, d) in self.chain_pairs:
            cls += " chain"
        out.append(f'<path class="{cls}" data-from="{_e(s)}" data-to="{_e(d)}" d="{path_d(pts)}"/>')


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n - 1] + "\u2026"


def _tail(name: str) -> str:
    parts = name.split("/")
    return "/".join(parts[-2:]) if len(parts) > 1 else name


def _op_item(op, d, order) -> Item:
    if d["cast"]:
        return Item(op["name"], "op", _CAST_W, _CAST_H, order)
    return Item(op["name"], "op", _W, _H, order)


def _detail(cmp, op, i, status, const) -> dict:
    rows = cmp.rows_of(op["name"])
    cos, rel = _worst_metrics(rows)
    prec = op.get("precision") or None
    cast = op.get("tf_type") == "Cast" and CAST_MARK in op["name"]      # an inserted Cast (or HF32 rounding)
    return {
        "i": i, "name": op["name"], "type": op.get("tf_type"), "ascend": op.get("ascend_type"),
        "engine": op.get("engine"), "compute": op.get("compute_dtype"), "index": op.get("index"),
        "phase": op.get("phase"),
        "status": status, "status_bits": op.get("status_names") or [], "precision": prec,
        "fusion": op.get("fusion"), "cast": cast,
        "fp32_check": None if not op.get("fp32_check") else {
            "overflow": bool(op["fp32_check"].get("overflow")), "max_abs": _short(op["fp32_check"].get("max_abs"))},
        "inputs": [{"t": r, "const": split_tensor_name(r)[0] in const} for r in op.get("inputs", [])],
        "rows": [{k: _short(r.get(k)) for k in _ROW_FIELDS} for r in rows],
        "c": [STATUS_COLORS[status], _cos_color(cos), _rel_color(rel),
              STATUS_COLORS["overflow"] if status == "overflow" or op.get("status") else "#f5f5f5"],
    }


def graph_section(cmp, ov=None, *, fold_above: int = FOLD_ABOVE, fold_target: int = FOLD_TARGET) -> str:
    """The HTML of the report's ``graph`` section for comparison ``cmp`` (and overflow report ``ov``)."""
    npu = cmp.npu
    first = cmp.first_divergent()
    first_name = first.name if first is not None else None
    # the first divergent op is drawn (and ringed) whatever it is: a Cast of a constant too
    const = constant_ops(npu) - {first_name}
    ops = [op for op in npu.ops if op["name"] not in const]
    names = {op["name"] for op in ops}
    details = {}
    for i, op in enumerate(ops):
        details[op["name"]] = _detail(cmp, op, i, op_status(cmp, op["name"]), const)
    data_edges = graph_edges(npu, names)
    cedges = [e for e in cast_edges(npu, {n for n, d in details.items() if d["cast"]}) if e[1] in names]
    edges = data_edges + cedges
    svg = _Svg(cmp, ov, first_name, details)
    svg.cast_pairs = set(cedges)
    # the path the first divergent op's error takes to the model output
    chain = first.chain if first is not None else []
    svg.chain_pairs = set(zip(chain, chain[1:])) & set(edges)
    order = {op["name"]: k for k, op in enumerate(ops)}
    opmap = {op["name"]: op for op in ops}
    fused_by_into: dict[str, list[dict]] = {}
    for f in npu.fused_away:
        fused_by_into.setdefault(f["into"], []).append(f)

    folded = {}
    if len(ops) > fold_above:
        # the exporter's module scopes (dynamo's pkg.torch.onnx.name_scopes, TorchScript's name paths) where the
        # dump records them: names such as node_Conv_292 say nothing of the module they belong to; under a scope
        # the name is one token and the scope splits at "/" only (in_proj is one module, not "in_")
        keys = {op["name"]: (f"{op['scope']}/{op['name'].replace('/', '.').replace('_', '.')}" if op.get("scope")
                             else op["name"]) for op in ops}
        paths = {keys[op["name"]] for op in ops if op.get("scope")}
        by_key = fold_scopes(list(keys.values()), fold_target, paths)
        folded = {n: by_key[k] for n, k in keys.items() if k in by_key}
    # top-level items
    items, gmembers = [], {}
    for op in ops:
        g = folded.get(op["name"])
        if g is None:
            items.append(_op_item(op, details[op["name"]], order[op["name"]]))
        elif g not in gmembers:
            gmembers[g] = [op["name"]]
            items.append(Item("\1" + g, "group", _W, _H + 6, order[op["name"]]))
        else:
            gmembers[g].append(op["name"])
    top = {n: ("\1" + folded[n] if n in folded else n) for n in names}
    top_edges, seen = [], set()
    for s, d in edges:
        a, b = top[s], top[d]
        if a != b and (a, b) not in seen:
            seen.add((a, b))
            top_edges.append((a, b))
    by, paths, width, height = layout(items, top_edges)
    route = {(a, b): pts for a, b, pts in paths}

    main = svg.main
    gids = {}
    for k, g in enumerate(gmembers):
        gids[g] = f"g{k}"
    # edges first (under the nodes); every op edge drawn, those between groups along the groups' route
    for s, d in edges:
        a, b = top[s], top[d]
        if a == b:
            continue
        svg.edge(s, d, route[(a, b)], main, "edge" + (" folded" if a != s or b != d else ""))
    for it in items:
        if it.kind == "group":
            g = it.key[1:]
            svg.group_node(g, it, gids[g], gmembers[g], main)
        else:
            svg.op_node(opmap[it.key], it, main)
    # expandable groups: each with its own layout, drawn over the view when opened
    for g, members in gmembers.items():
        mset = set(members)
        gitems = [_op_item(opmap[m], details[m], order[m]) for m in members]
        gedges = [(s, d) for s, d in edges if s in mset and d in mset]
        anchor = by["\1" + g]
        _overlay(svg, gids[g], g, gitems, gedges, anchor.x - anchor.w / 2, anchor.y, opmap)
    # fused ops: the ops they replaced
    for op in ops:
        if details[op["name"]].get("fusion"):
            _fusion_overlay(svg, op, details[op["name"]], fused_by_into.get(op["name"], []), cmp.bench,
                            by.get(op["name"]))

    # the overview map: every top-level box, the first divergent op (or its group) ringed
    mini = []
    for it in items:
        x, y = it.x - it.w / 2, it.y
        if it.kind == "group":
            fill, attr = STATUS_COLORS[svg.group_status(gmembers[it.key[1:]])], ""
            marked = first_name is not None and first_name in gmembers[it.key[1:]]
        else:
            fill, attr = details[it.key]["c"][0], f' data-n="{_e(it.key)}"'
            marked = it.key == first_name
        mini.append(f'<rect{attr} x="{x:.0f}" y="{y:.0f}" width="{it.w:.0f}" height="{it.h:.0f}" fill="{fill}"/>')
        if marked:
            mini.append(f'<rect x="{x - 6:.0f}" y="{y - 6:.0f}" width="{it.w + 12:.0f}" height="{it.h + 12:.0f}" '
                        f'fill="none" stroke="{FIRST_COLOR}" stroke-width="3" vector-effect="non-scaling-stroke"/>')
    legend = _legends()
    data = json.dumps({d["name"]: {k: v for k, v in d.items()} for d in details.values()},
                      separators=(",", ":"), allow_nan=False, default=str)
    # nothing in the JSON can end the script element or open a comment in it
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    counts = {s: sum(1 for d in details.values() if d["status"] == s) for s in STATUSES}
    note = (f"{len(ops)} ops ({len(npu.ops) - len(ops)} constants and ops folded from constants left out), "
            f"{len(data_edges)} edges; " + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])
            + (f"; name scopes folded into {len(gmembers)} groups (click one to open it)" if gmembers else ""))
    view_w, view_h = max(width, 200.0), max(height, 100.0)
    return (
        '<section id="graph"><h2>Op graph</h2>'
        '<p class="muted">Every computing op of the NPU dump, producer above consumer, coloured by the chosen '
        'metric. Magenta ring: the first divergent op (dark pink edges: its path to the model output); blue '
        'dashed ring: the first overflowing op; rounded dashed boxes: Casts inserted at precision boundaries '
        '(dashed edges: to the ops that read them); orange badge: AI CPU; double border: a fused op (+ shows the '
        'ops it replaced). Drag to pan, wheel to zoom, click an op for its rows.</p>'
        f'<p class="muted" id="graph-counts">{_e(note)}</p>'
        '<div class="gv-bar">colour by <select id="gv-metric">'
        + "".join(f'<option value="{k}">{_e(_METRIC_NAMES[m])}</option>' for k, m in enumerate(METRICS))
        + '</select> <button id="gv-fit" type="button">fit</button> <button id="gv-first" type="button">first '
        'divergent</button> <button id="gv-zin" type="button">+</button> <button id="gv-zout" type="button">'
        '\u2212</button> <span id="gv-legend">' + legend + "</span></div>"
        '<div class="gv-wrap"><div class="gv-view"><svg id="gv" class="gv" viewBox="0 0 '
        f'{view_w:.0f} {view_h:.0f}" data-width="{view_w:.0f}" data-height="{view_h:.0f}" role="img" '
        'aria-label="op graph"><g id="gv-main">' + "".join(main) + '</g><g id="gv-over">' + "".join(svg.overlays)
        + '</g></svg><svg id="gv-mini" class="gv-mini" viewBox="0 0 ' + f'{view_w:.0f} {view_h:.0f}" '
        'preserveAspectRatio="none" aria-label="overview">' + "".join(mini)
        + '<rect id="gv-mini-vp" fill="rgba(21,101,192,.12)" stroke="#1565c0" stroke-width="1.5" '
        'vector-effect="non-scaling-stroke"/></svg></div>'
        '<div id="gv-panel" class="gv-panel"><p class="muted">Click an op to see its rows.</p></div></div>'
        f'<script type="application/json" id="gv-data">{data}</script>'
        f"<script>{_SCRIPT}</script></section>")


def _overlay(svg: _Svg, gid, title, gitems, gedges, x0, y0, opmap) -> None:
    """A folded group's own layout, hidden until its node is clicked, drawn over the view at (x0, y0)."""
    by, paths, w, h = layout(gitems, gedges)
    out = [f'<g class="overlay" id="{gid}" data-title="{_e(title)}" style="display:none" '
           f'transform="translate({x0:.1f},{y0:.1f})">',
           _overlay_head(gid, f"{_clip(title, 60)} ({len(gitems)} ops)", w, h)]
    for s, d, pts in paths:
        svg.edge(s, d, pts, out)
    for it in gitems:
        svg.op_node(opmap[it.key], by[it.key], out)
    out.append("</g>")
    svg.overlays.append("".join(out))


def _overlay_head(gid, title, w, h) -> str:
    return (f'<rect class="ov-bg" x="0" y="-22" width="{w:.1f}" height="{h + 22:.1f}" rx="6"/>'
            f'<text x="8" y="-7" class="t1">{_e(title)}</text>'
            f'<g class="toggle" data-group="{gid}"><rect x="{w - 20:.1f}" y="-19" width="16" height="15" rx="3" '
            f'fill="#fff" stroke="#444"/><text x="{w - 12:.1f}" y="-8" text-anchor="middle" class="tg">\u2212</text>'
            "</g>")


def _fusion_overlay(svg: _Svg, op, d, fused_away: list[dict], bench, anchor) -> None:
    """The ops a fused op replaced (its ``fusion.replaces`` and the dump's ``fused_away`` entries into it),
    laid out with their edges from the bench dump, hidden until the op's + is clicked; beside the op's node
    (``anchor``), or, inside a folded group, placed there by the script when opened (class ``follow``)."""
    name = op["name"]
    rule = (d["fusion"] or {}).get("rule")
    replaced = list((d["fusion"] or {}).get("replaces") or [])
    ftypes = {f["name"]: f for f in fused_away}
    replaced += [n for n in ftypes if n not in replaced] + ([name] if name not in replaced and name not in ftypes
                                                            else [])
    rank = {n: (bench.op(n)["index"] if n in bench else 1 << 30, k) for k, n in enumerate(replaced)}
    replaced.sort(key=lambda n: rank[n])
    rset = set(replaced)
    redges = []
    for n in replaced:
        for ref in (bench.op(n).get("inputs", []) if n in bench else []):
            src = None if ref.startswith("^") else split_tensor_name(ref)[0]
            if src in rset and src != n:
                redges.append((src, n))
    lay, paths, w, h = layout([Item(n, "op", _W, _H, k) for k, n in enumerate(replaced)], redges)
    gid = f"f{d['i']}"
    x0, y0 = (anchor.x + anchor.w / 2 + 14, anchor.y) if anchor is not None else (0.0, 0.0)
    out = [f'<g class="overlay fusion{"" if anchor is not None else " follow"}" id="{gid}" '
           f'data-fused-into="{_e(name)}" style="display:none" transform="translate({x0:.1f},{y0:.1f})">',
           _overlay_head(gid, f"{_clip(str(rule), 40)}: {len(replaced)} ops", w, h)]
    for s, t, pts in paths:
        out.append(f'<path class="edge fused-edge" data-fused-from="{_e(s)}" data-fused-to="{_e(t)}" '
                   f'd="{path_d(pts)}"/>')
    for n in replaced:
        it = lay[n]
        f = ftypes.get(n)
        tf_type = f.get("tf_type") if f else (bench.op(n).get("tf_type") if n in bench else op.get("tf_type"))
        out.append(f'<g class="fused-op" data-fused-op="{_e(n)}" transform="translate({it.x - it.w / 2:.1f},'
                   f'{it.y:.1f})"><title>{_e(tf_type)} {_e(n)}: fused by {_e(f["rule"] if f else rule)}</title>'
                   f'<rect width="{it.w}" height="{it.h}" rx="4" fill="#f3f3f3" stroke="#777" stroke-dasharray="3 2"/>'
                   f'<text x="6" y="15" class="t1">{_e(_clip(str(tf_type), 26))}</text>'
                   f'<text x="6" y="30" class="t2">{_e(_clip(_tail(n), 30))}</text></g>')
    out.append("</g>")
    svg.overlays.append("".join(out))


def _legends() -> str:
    parts = []
    status = "".join(f'<span class="sw" style="background:{STATUS_COLORS[s]}"></span>{s} ' for s in STATUSES)
    parts.append(f'<span class="lg" data-m="0">{status}</span>')
    cos = "".join(f'<span class="sw" style="background:{_cos_color(1 - 10 ** -k)}"></span>{label} '
                  for k, label in ((1, "\u2264 0.9"), (3, "0.999"), (5, "0.99999"), (7, "\u2265 0.9999999")))
    parts.append(f'<span class="lg" data-m="1" style="display:none">cosine {cos}'
                 f'<span class="sw" style="background:{_NA_FILL}"></span>n/a</span>')
    rel = "".join(f'<span class="sw" style="background:{_rel_color(10.0 ** -k)}"></span>{label} '
                  for k, label in ((0, "\u2265 1"), (2, "1e-2"), (4, "1e-4"), (5, "\u2264 1e-5")))
    parts.append(f'<span class="lg" data-m="2" style="display:none">max rel. error {rel}'
                 f'<span class="sw" style="background:{_NA_FILL}"></span>n/a</span>')
    parts.append(f'<span class="lg" data-m="3" style="display:none"><span class="sw" style="background:'
                 f'{STATUS_COLORS["overflow"]}"></span>overflow status bits <span class="sw" style="background:'
                 '#f5f5f5"></span>none</span>')
    parts.append(' <span class="sw ring1"></span>first divergent <span class="sw ring3"></span>its path to the output '
                 '<span class="sw ring2"></span>first overflow')
    return "".join(parts)


CSS = """
.gv-bar{font-size:12px;margin:6px 0;display:flex;gap:6px;align-items:center;flex-wrap:wrap}
.gv-bar .sw{display:inline-block;width:12px;height:12px;border:1px solid #888;vertical-align:middle;margin:0 3px 0 6px}
.gv-bar .ring1{border:3px solid #ff00d4;background:#fff}.gv-bar .ring2{border:2px dashed #2962ff;background:#fff}
.gv-bar .ring3{height:0;border:0;border-top:3px solid #c2185b}
.gv-wrap{position:relative;display:flex;gap:8px}.gv-view{position:relative;flex:1;display:flex}
.gv-mini{position:absolute;top:6px;right:6px;background:rgba(255,255,255,.9);border:1px solid #999;cursor:crosshair}
svg.gv{flex:1;height:70vh;min-height:420px;border:1px solid #ccc;background:#fafbfc;cursor:grab;user-select:none}
svg.gv text{font:11px Menlo,Consolas,monospace;fill:#111;pointer-events:none}
svg.gv .t1{font-weight:600}svg.gv .t2{fill:#333;font-size:10px}svg.gv .badge{fill:#fff;font-size:9px;font-weight:700}
svg.gv .tg{font-size:13px;font-weight:700}svg.gv.far text{display:none}
svg.gv .edge{fill:none;stroke:#8a8f98;stroke-width:1.2}svg.gv .cast-edge{stroke-dasharray:5 3}
svg.gv .edge.chain{stroke:#c2185b;stroke-width:2.4}svg.gv .edge.hl{stroke:#d50000;stroke-width:2.5}
svg.gv .node,svg.gv .group-node,svg.gv .toggle{cursor:pointer}svg.gv .node.sel .box{stroke:#000;stroke-width:3}
svg.gv .ov-bg{fill:#fff;stroke:#333;stroke-width:1.5;filter:drop-shadow(2px 3px 4px rgba(0,0,0,.3))}
.gv-panel td{word-break:break-all}.gv-panel td:first-child{word-break:normal}.gv-panel{width:330px;height:70vh;min-height:420px;overflow:auto;border:1px solid #ccc;padding:6px 8px;font-size:12px;
box-sizing:border-box;background:#fff}.gv-panel table{font-size:11px}.gv-panel h3{font-size:13px;margin:4px 0;word-break:break-all}
"""

_SCRIPT = r"""
(function(){
var svg=document.getElementById('gv');if(!svg)return;
var data=JSON.parse(document.getElementById('gv-data').textContent);
var W=+svg.dataset.width,H=+svg.dataset.height,vb=[0,0,W,H];
function size(){var r=svg.getBoundingClientRect();return [r.width||800,r.height||500];}
var frame=0,mini=document.getElementById('gv-mini'),mvp=document.getElementById('gv-mini-vp');
function apply(){if(frame)return;frame=requestAnimationFrame(function(){frame=0;  // once a frame while panning
 svg.setAttribute('viewBox',vb.join(' '));svg.classList.toggle('far',size()[0]/vb[2]<0.35);
 mvp.setAttribute('x',vb[0]);mvp.setAttribute('y',vb[1]);mvp.setAttribute('width',vb[2]);mvp.setAttribute('height',vb[3]);});}
function minisize(){var s=size(),k=Math.min(130/W,0.5*s[1]/H);mini.style.width=Math.max(W*k,24)+'px';
 mini.style.height=Math.max(H*k,24)+'px';mini.style.display=Math.min(s[0]/W,s[1]/H)>=0.45?'none':'';}
var mdrag=false;function minigo(e){var r=mini.getBoundingClientRect();
 var x=(e.clientX-r.left)/r.width*W,y=(e.clientY-r.top)/r.height*H;vb[0]=x-vb[2]/2;vb[1]=y-vb[3]/2;apply();}
mini.addEventListener('pointerdown',function(e){mdrag=true;minigo(e);e.stopPropagation();});
window.addEventListener('pointermove',function(e){if(mdrag)minigo(e);});
window.addEventListener('pointerup',function(){mdrag=false;});
function fit(){var s=size(),k=Math.max(W/s[0],H/s[1],1/1.2);vb=[W/2-s[0]*k/2,H/2-s[1]*k/2,s[0]*k,s[1]*k];apply();}
function centre(el,scale){var b=el.getBBox(),m=el.getCTM(),s=size(),root=svg.getCTM();
 var x=b.x+b.width/2,y=b.y+b.height/2;if(m&&root){var p=svg.createSVGPoint();p.x=x;p.y=y;
 p=p.matrixTransform(root.inverse().multiply(m));x=p.x;y=p.y;}
 var k=1/(scale||1);vb=[x-s[0]*k/2,y-s[1]*k/2,s[0]*k,s[1]*k];apply();}
function zoom(f,cx,cy){var nw=vb[2]*f,nh=vb[3]*f;if(cx===undefined){cx=vb[0]+vb[2]/2;cy=vb[1]+vb[3]/2;}
 vb=[cx-(cx-vb[0])*f,cy-(cy-vb[1])*f,nw,nh];apply();}
function toSvg(e){var r=svg.getBoundingClientRect();return [vb[0]+(e.clientX-r.left)/r.width*vb[2],
 vb[1]+(e.clientY-r.top)/r.height*vb[3]];}
svg.addEventListener('wheel',function(e){e.preventDefault();var p=toSvg(e);
 zoom(Math.pow(1.0015,e.deltaY),p[0],p[1]);},{passive:false});
var drag=null,moved=false;
svg.addEventListener('pointerdown',function(e){drag=[e.clientX,e.clientY,vb[0],vb[1]];moved=false;});
window.addEventListener('pointermove',function(e){if(!drag)return;var r=svg.getBoundingClientRect();
 var dx=(e.clientX-drag[0])/r.width*vb[2],dy=(e.clientY-drag[1])/r.height*vb[3];
 if(Math.abs(e.clientX-drag[0])+Math.abs(e.clientY-drag[1])>3)moved=true;
 vb[0]=drag[2]-dx;vb[1]=drag[3]-dy;apply();});
window.addEventListener('pointerup',function(){drag=null;});
function esc(s){return String(s==null?'':s).replace(/[&<>"]/g,function(c){return {'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c];});}
var panel=document.getElementById('gv-panel'),sel=null;
function show(name){var d=data[name];if(!d)return;
 var h='<h3>'+esc(d.type)+' '+esc(d.name)+'</h3><table>';
 function kv(k,v){h+='<tr><td><b>'+esc(k)+'</b></td><td>'+esc(v)+'</td></tr>';}
 kv('status',d.status);kv('index',d.index);kv('Ascend type',d.ascend);kv('engine',d.engine==='AICPU'?'AI CPU':d.engine);
 kv('compute dtype',d.compute);if(d.phase)kv('phase',d.phase);
 if(d.precision){kv('precision list',d.precision.list||'-');kv('precision dtype',d.precision.dtype||'-');
  kv('why',d.precision.reason||'-');}
 if(d.fusion){kv('fusion rule',(d.fusion.rules||[d.fusion.rule]).join(', '));kv('replaces',(d.fusion.replaces||[]).join(', '));}
 kv('status bits',d.status_bits.length?d.status_bits.join('; '):'none');
 if(d.fp32_check)kv('float32 rerun',(d.fp32_check.overflow?'overflows':'finite')+', max |x| '+d.fp32_check.max_abs);
 kv('inputs',d.inputs.map(function(i){return i.t+(i.const?' (const)':'');}).join(', ')||'-');
 h+='</table>';
 d.rows.forEach(function(r){h+='<table>';for(var k in r){if(r[k]!=='')h+='<tr><td>'+esc(k)+'</td><td>'+esc(r[k])+'</td></tr>';}h+='</table>';});
 panel.innerHTML=h;
 if(sel)sel.classList.remove('sel');document.querySelectorAll('#gv .edge.hl').forEach(function(p){p.classList.remove('hl');});
 sel=document.querySelector('#gv .node[data-i="'+d.i+'"]');if(sel)sel.classList.add('sel');
 document.querySelectorAll('#gv .edge').forEach(function(p){var d=p.dataset;
  if(d.from===name||d.to===name||d.castFrom===name||d.castTo===name)p.classList.add('hl');});}
function toggle(id,el){var g=document.getElementById(id);if(!g)return;var open=g.style.display==='none';
 g.style.display=open?'':'none';
 if(open&&g.classList.contains('follow')){var n=document.querySelector('#gv .node[data-op="'+CSS.escape(g.dataset.fusedInto)+'"]');
  if(n){var b=n.getBBox(),m=svg.getCTM().inverse().multiply(n.getCTM());var p=svg.createSVGPoint();p.x=b.x+b.width+14;p.y=b.y;
  p=p.matrixTransform(m);g.setAttribute('transform','translate('+p.x+','+p.y+')');}}
 if(open)g.parentNode.appendChild(g);}
svg.addEventListener('click',function(e){if(moved)return;var t=e.target.closest('.toggle,.group-node,.node');if(!t)return;
 if(t.classList.contains('toggle')||t.classList.contains('group-node')){toggle(t.dataset.group,t);e.stopPropagation();return;}
 show(t.dataset.op);});
var metric=document.getElementById('gv-metric');
metric.addEventListener('change',function(){var m=+metric.value;
 document.querySelectorAll('#gv .node').forEach(function(n){var d=data[n.dataset.op];n.querySelector('.box').setAttribute('fill',d.c[m]);});
 document.querySelectorAll('#gv-mini rect[data-n]').forEach(function(r){r.setAttribute('fill',data[r.dataset.n].c[m]);});
 document.querySelectorAll('#gv-legend .lg').forEach(function(l){l.style.display=(+l.dataset.m===m)?'':'none';});});
var first=document.querySelector('#gv-main .node[data-first="true"]')||document.querySelector('#gv-main .group-node .ring.first')
 ||document.querySelector('#gv-main .node[data-first-overflow="true"]')||document.querySelector('#gv-main .group-node .ring.overflow');
if(first)first=first.closest('g');
document.getElementById('gv-fit').onclick=fit;
document.getElementById('gv-zin').onclick=function(){zoom(1/1.4);};
document.getElementById('gv-zout').onclick=function(){zoom(1.4);};
var fb=document.getElementById('gv-first');fb.onclick=function(){if(first)centre(first,1);};
if(!first)fb.disabled=true;else if(!first.matches('[data-first="true"]')&&!first.querySelector('.ring.first'))fb.textContent='first overflow';
minisize();window.addEventListener('resize',minisize);
var s=size();if(Math.min(s[0]/W,s[1]/H)>=0.45)fit();else if(first)centre(first,1);
else{vb=[W/2-s[0]/2,0,s[0],s[1]];apply();}
if(first&&first.dataset.op)show(first.dataset.op);
})();
"""
