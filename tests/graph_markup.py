"""Reading the report's op graph markup (issue 33), shared by the tests of the graph and of the workflow.

``check_graph(text, cmp)`` asserts that the markup's nodes and edges are the NPU dump's computing ops and
data edges, that each node's ``data-status`` comes from its comparison rows and that ``data-first`` marks
the first divergent op.
"""
from html.parser import HTMLParser

from ascend_emu.analysis.graph_view import STATUSES


class Markup(HTMLParser):
    """The graph's nodes, edges, fused-op groups and folded groups, as the report's markup says."""

    def __init__(self):
        super().__init__()
        self.nodes, self.edges, self.fused, self.groups, self.overlays = {}, [], {}, [], {}
        self._overlay = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "g" and "data-op" in a:
            assert a["data-op"] not in self.nodes, f"two nodes for {a['data-op']}"
            self.nodes[a["data-op"]] = a
        if tag == "path" and "data-from" in a:
            self.edges.append((a["data-from"], a["data-to"]))
        if tag == "g" and "data-fused-op" in a:
            self.fused.setdefault(self._overlay[-1], []).append(a["data-fused-op"])
        if tag == "g" and "data-scope" in a:
            self.groups.append(a)
        if tag == "g" and "overlay" in a.get("class", ""):
            self.overlays[a["id"]] = a
            self._overlay.append(a.get("data-fused-into") or a["id"])


def parse(text) -> Markup:
    m = Markup()
    m.feed(text)
    m.close()
    return m


def computing_ops(dump):
    """Ops that are neither constants nor folded from constants only on the host."""
    const = set()
    for op in dump.ops:
        ins = [split(r) for r in op["inputs"]]
        if op["tf_type"] == "Const" or (op["engine"] == "HOST" and ins and all(i in const for i in ins)):
            const.add(op["name"])
    return [op for op in dump.ops if op["name"] not in const]


def split(ref):
    return ref.rsplit(":", 1)[0]


def expected_status(cmp, name):
    rows = cmp.rows_of(name)
    if any(r["Overflow Status"] not in (None, "0x0") for r in rows):
        return "overflow"
    results = {r["Result"] for r in rows}
    return next((s for s in ("error", "warning", "pass") if s in results), "na")


def check_graph(text, cmp):
    """The markup's nodes and edges are the dump's computing ops and data edges, statuses from the rows."""
    m = parse(text)
    ops = computing_ops(cmp.npu)
    names = {op["name"] for op in ops}
    assert set(m.nodes) == names
    want_edges = {(split(r), op["name"]) for op in ops for r in op["inputs"] if split(r) in names}
    assert set(m.edges) == want_edges and len(m.edges) == len(want_edges)
    for name, a in m.nodes.items():
        assert a["data-status"] in STATUSES
        assert a["data-status"] == expected_status(cmp, name), name
    first = cmp.first_divergent()
    firsts = [n for n, a in m.nodes.items() if a.get("data-first") == "true"]
    assert firsts == ([first.name] if first else [])
    return m
